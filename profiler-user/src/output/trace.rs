//! The timeline as a Chrome trace event format file (`.trace.json`,
//! <https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU>): what
//! Perfetto UI and chrome://tracing open, and what torch.profiler's `export_chrome_trace`
//! writes.
//!
//! Choices, made for how the trace viewers show things:
//! - One track per thread (`pid`/`tid` as the target's pid namespace sees them), named by
//!   `process_name` and `thread_name` metadata events.
//! - Each sample stands for the time until the thread's next sample, or one sampling period
//!   when the next is more than ten periods away (the thread stopped running); consecutive
//!   samples that share the root end of their stacks share those frames' slices, so a function
//!   that ran through ten samples is one slice ten samples long, its callees nested below it
//!   (as speedscope's and py-spy's timelines draw samples).
//! - Slices are complete events (`ph: X`), parents before children, in whole microseconds of
//!   Unix time (`CLOCK_REALTIME`, as torch.profiler's traces count; the kernel's monotonic
//!   sample times are shifted by the offset between the clocks at the end of the run).
//! - The run's start and end are instant markers (`ph: i`, global scope) named by its tags
//!   (a daemon phase's `phase=NAME`), with the tags in their arguments.
//! - The process, thread and tag frames name tracks and markers, never slices.

use std::{
    collections::BTreeMap,
    io::{self, Write},
};

use serde::Serialize;
use serde_json::{json, Value};

use crate::{
    profile::{FrameId, Profile, ProfileFrame, TimedSample, Timeline},
    symbolize::FrameKind,
};

/// Samples more than this many periods apart belong to separate runs of the thread (it slept
/// or waited between): the first ends one period after it was taken instead of stretching to
/// the next. Closer samples are one run: periods are randomized up to 1.5 times the mean, and
/// a busy thread on a loaded machine is preempted for a few periods at a time (4 to 9 periods
/// between samples of a CPU-bound thread were common on a 2-core machine running builds).
const GAP_PERIODS: u64 = 10;

/// One trace event, as the format names its fields.
#[derive(Serialize)]
struct Event<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    cat: Option<&'static str>,
    ph: &'static str,
    /// Microseconds.
    ts: i64,
    /// Microseconds (complete events only).
    #[serde(skip_serializing_if = "Option::is_none")]
    dur: Option<i64>,
    pid: u32,
    tid: u32,
    /// An instant event's scope (`g`: global).
    #[serde(skip_serializing_if = "Option::is_none")]
    s: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    args: Option<Value>,
}

/// A slice before it is written: where it starts and ends (nanoseconds, monotonic), its
/// nesting depth (0 for a thread's root frame) and its frame.
struct Slice {
    start: u64,
    end: u64,
    depth: usize,
    frame: FrameId,
}

/// Writes the profile's timeline as a trace; a profile recorded without one gets a trace with
/// its tracks' names and markers only.
pub fn write(profile: &Profile, w: &mut impl Write) -> io::Result<()> {
    let empty = Timeline::default();
    let timeline = profile.timeline.as_ref().unwrap_or(&empty);
    let labels: Vec<String> = profile.frames.iter().map(ProfileFrame::label).collect();
    let to_us = |ns: u64| (ns as i64 + timeline.realtime_offset_ns).div_euclid(1000);
    let period = profile.meta.sample_nanos().max(1);

    // Each thread's samples, in time order (the timeline is sorted by time first).
    let mut threads: BTreeMap<(u32, u32), Vec<&TimedSample>> = BTreeMap::new();
    for sample in &timeline.samples {
        threads
            .entry((sample.pid, sample.tid))
            .or_default()
            .push(sample);
    }
    let mut events: Vec<Event<'_>> = Vec::new();
    let mut process_names: BTreeMap<u32, &str> = BTreeMap::new();
    let mut slices_by_thread = Vec::with_capacity(threads.len());
    for (&(pid, tid), samples) in &threads {
        if let Some(name) = samples.first().and_then(|s| process_name(profile, s.stack)) {
            process_names.entry(pid).or_insert(name);
        }
        slices_by_thread.push(((pid, tid), thread_slices(profile, samples, period)));
    }
    for (&pid, &name) in &process_names {
        events.push(metadata("process_name", pid, 0, name));
    }
    let thread_labels: Vec<((u32, u32), String)> = threads
        .keys()
        .map(|&(pid, tid)| {
            let label = match timeline.thread_names.get(&(pid, tid)) {
                Some(comm) => format!("{comm} (tid {tid})"),
                None => format!("tid {tid}"),
            };
            ((pid, tid), label)
        })
        .collect();
    for ((pid, tid), label) in &thread_labels {
        events.push(metadata("thread_name", *pid, *tid, label));
    }
    let marker_name = |what: &str| {
        let tags: Vec<&str> = profile.meta.tags.iter().map(|t| t.label.as_str()).collect();
        if tags.is_empty() {
            format!("bpfprof: sampling {what}")
        } else {
            format!("{} {what}", tags.join(" "))
        }
    };
    let markers = if timeline.end_ns > 0 {
        vec![
            (marker_name("started"), timeline.start_ns),
            (marker_name("ended"), timeline.end_ns),
        ]
    } else {
        Vec::new()
    };
    let tag_args: BTreeMap<&str, &str> = profile
        .meta
        .tags
        .iter()
        .map(|t| (t.key.as_str(), t.value.as_str()))
        .collect();
    for (name, at) in &markers {
        events.push(Event {
            name,
            cat: Some("bpfprof"),
            ph: "i",
            ts: to_us(*at),
            dur: None,
            pid: 0,
            tid: 0,
            s: Some("g"),
            args: Some(json!({ "tags": tag_args })),
        });
    }
    let mut slice_events: Vec<(i64, usize, Event<'_>)> = Vec::new();
    for ((pid, tid), slices) in &slices_by_thread {
        for slice in slices {
            let (start, end) = (to_us(slice.start), to_us(slice.end));
            slice_events.push((
                start,
                slice.depth,
                Event {
                    name: &labels[slice.frame],
                    cat: Some(category(&profile.frames[slice.frame])),
                    ph: "X",
                    ts: start,
                    dur: Some(end - start),
                    pid: *pid,
                    tid: *tid,
                    s: None,
                    args: None,
                },
            ));
        }
    }
    // Parents before their children where they start together: the viewers nest complete
    // events in the order they read them.
    slice_events.sort_by_key(|(ts, depth, e)| (*ts, e.pid, e.tid, *depth));
    events.extend(slice_events.into_iter().map(|(_, _, e)| e));

    let doc = json!({
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "exporter": format!("bpfprof {}", env!("CARGO_PKG_VERSION")),
            "title": super::svg::title(&profile.meta),
            "sampling": profile.meta.sampling.describe(),
            "samples": timeline.samples.len(),
            "clock": "CLOCK_REALTIME microseconds (sampled with CLOCK_MONOTONIC)",
            "losses": profile.meta.losses,
        },
    });
    serde_json::to_writer(&mut *w, &doc)?;
    writeln!(w)
}

/// A metadata event naming a process (`process_name`) or a thread (`thread_name`).
fn metadata<'a>(kind: &'static str, pid: u32, tid: u32, name: &str) -> Event<'a> {
    Event {
        name: kind,
        cat: None,
        ph: "M",
        ts: 0,
        dur: None,
        pid,
        tid,
        s: None,
        args: Some(json!({ "name": name })),
    }
}

/// The name of the process a stack belongs to: its process frame's `comm`.
fn process_name(profile: &Profile, stack: usize) -> Option<&str> {
    profile
        .stacks
        .get(stack)?
        .frames
        .iter()
        .find_map(|&id| match &profile.frames[id] {
            ProfileFrame::Process { comm, .. } => Some(comm.as_str()),
            _ => None,
        })
}

/// The event category of a slice's frame: what kind of code it is.
fn category(frame: &ProfileFrame) -> &'static str {
    match frame {
        ProfileFrame::Code(f) => match f.kind {
            FrameKind::User => "native",
            FrameKind::Kernel => "kernel",
            FrameKind::Runtime(tag) => tag.name(),
        },
        _ => "bpfprof",
    }
}

/// The frames of a stack that become slices (root first): its code, `[truncated]` and
/// off-CPU frames, without the process, thread and tag frames that name tracks and markers.
fn slice_frames(profile: &Profile, stack: usize) -> Vec<FrameId> {
    profile
        .stacks
        .get(stack)
        .map(|s| {
            s.frames
                .iter()
                .copied()
                .filter(|&id| {
                    !matches!(
                        profile.frames[id],
                        ProfileFrame::Process { .. }
                            | ProfileFrame::Thread { .. }
                            | ProfileFrame::Tag(_)
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// One thread's samples (in time order) as nested slices: each sample covers the time until
/// the next one (at most [`GAP_PERIODS`] periods away, else one period), and a frame that
/// consecutive covering samples share at the same depth, with the same frames above it, is
/// one slice.
fn thread_slices(profile: &Profile, samples: &[&TimedSample], period: u64) -> Vec<Slice> {
    let mut out = Vec::new();
    // The open slices, root first: frame and start.
    let mut open: Vec<(FrameId, u64)> = Vec::new();
    let mut open_until = 0u64;
    let close_from =
        |open: &mut Vec<(FrameId, u64)>, keep: usize, end: u64, out: &mut Vec<Slice>| {
            while open.len() > keep {
                let (frame, start) = open.pop().expect("an open slice");
                out.push(Slice {
                    start,
                    end,
                    depth: open.len(),
                    frame,
                });
            }
        };
    for (i, sample) in samples.iter().enumerate() {
        let start = sample.time_ns;
        let end = match samples.get(i + 1) {
            Some(next) if next.time_ns - start <= GAP_PERIODS * period => next.time_ns,
            _ => start + period,
        };
        let frames = slice_frames(profile, sample.stack);
        if start != open_until {
            // A gap (or the first sample): nothing carries over.
            close_from(&mut open, 0, open_until, &mut out);
        }
        let shared = open
            .iter()
            .zip(&frames)
            .take_while(|((open_frame, _), frame)| open_frame == *frame)
            .count();
        close_from(&mut open, shared, start, &mut out);
        open.extend(frames[shared..].iter().map(|&f| (f, start)));
        open_until = end;
    }
    close_from(&mut open, 0, open_until, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::fixture;

    /// The fixture's stacks in `order` on one thread, 1 ms apart (the fixture's period is
    /// 1.001 ms).
    fn timed(profile: &mut Profile, order: &[usize]) {
        let samples = order
            .iter()
            .enumerate()
            .map(|(i, &stack)| TimedSample {
                time_ns: 1_000_000_000 + i as u64 * 1_000_000,
                pid: 42,
                tid: 43,
                stack,
            })
            .collect();
        profile.timeline = Some(Timeline {
            samples,
            thread_names: [((42, 43), "worker".to_string())].into(),
            start_ns: 900_000_000,
            end_ns: 2_000_000_000,
            realtime_offset_ns: 0,
        });
    }

    fn slices(profile: &Profile) -> Vec<(String, i64, i64)> {
        let mut out = Vec::new();
        write(profile, &mut out).unwrap();
        let doc: Value = serde_json::from_slice(&out).unwrap();
        doc["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["ph"] == "X")
            .map(|e| {
                (
                    e["name"].as_str().unwrap().to_string(),
                    e["ts"].as_i64().unwrap(),
                    e["dur"].as_i64().unwrap(),
                )
            })
            .collect()
    }

    #[test]
    fn consecutive_samples_share_their_common_frames_as_one_slice() {
        let mut profile = fixture::profile();
        let frames = |s: usize| slice_frames(&profile, s);
        assert_eq!(
            frames(0)[0],
            frames(1)[0],
            "the fixture's stacks share a root"
        );
        assert_ne!(frames(0).last(), frames(1).last());
        timed(&mut profile, &[0, 0, 0, 1, 1]);
        let slices = slices(&profile);
        let root = &profile.frames[slice_frames(&profile, 0)[0]].label();
        // The shared root is one slice over all five samples; each leaf one over its own.
        let roots: Vec<_> = slices.iter().filter(|s| &s.0 == root).collect();
        assert_eq!(roots.len(), 1, "{slices:?}");
        // Four 1 ms intervals and the last sample's period.
        assert_eq!(roots[0].2, 5_001, "five samples: {slices:?}");
        let leaf = |s: usize| profile.frames[*slice_frames(&profile, s).last().unwrap()].label();
        let first: Vec<_> = slices.iter().filter(|s| s.0 == leaf(0)).collect();
        let second: Vec<_> = slices.iter().filter(|s| s.0 == leaf(1)).collect();
        assert_eq!((first.len(), first[0].2), (1, 3_000), "{slices:?}");
        assert_eq!((second.len(), second[0].2), (1, 2_001), "{slices:?}");
        assert!(first[0].1 < second[0].1);
        // Parents come before their children where they start together.
        let at_start: Vec<&str> = slices
            .iter()
            .filter(|s| s.1 == roots[0].1)
            .map(|s| s.0.as_str())
            .collect();
        assert_eq!(at_start.first(), Some(&root.as_str()));
    }

    #[test]
    fn a_gap_ends_every_slice_and_a_return_starts_new_ones() {
        let mut profile = fixture::profile();
        timed(&mut profile, &[0, 0]);
        if let Some(t) = &mut profile.timeline {
            // The second sample a second later: the thread was off the CPU between.
            t.samples[1].time_ns += 1_000_000_000;
        }
        let slices = slices(&profile);
        let root = profile.frames[slice_frames(&profile, 0)[0]].label();
        let roots: Vec<_> = slices.iter().filter(|s| s.0 == root).collect();
        assert_eq!(roots.len(), 2, "{slices:?}");
        let period_us = profile.meta.sample_nanos() as i64 / 1000;
        assert!(roots.iter().all(|s| s.2 == period_us), "{slices:?}");
    }

    #[test]
    fn tracks_are_named_and_tags_mark_the_run() {
        let mut profile = fixture::profile();
        timed(&mut profile, &[0, 1]);
        let mut out = Vec::new();
        write(&profile, &mut out).unwrap();
        let doc: Value = serde_json::from_slice(&out).unwrap();
        let events = doc["traceEvents"].as_array().unwrap();
        let meta = |kind: &str| {
            events
                .iter()
                .find(|e| e["ph"] == "M" && e["name"] == kind)
                .map(|e| e["args"]["name"].as_str().unwrap().to_string())
        };
        assert_eq!(meta("thread_name").as_deref(), Some("worker (tid 43)"));
        assert!(meta("process_name").is_some());
        let instants: Vec<&Value> = events.iter().filter(|e| e["ph"] == "i").collect();
        assert_eq!(instants.len(), 2);
        let tags = &profile.meta.tags;
        assert!(!tags.is_empty(), "the fixture has tags");
        assert!(instants[0]["name"]
            .as_str()
            .unwrap()
            .contains(tags[0].label.as_str()));
        assert_eq!(instants[0]["ts"], 900_000);
        assert_eq!(instants[0]["args"]["tags"][&tags[0].key], tags[0].value);
    }
}
