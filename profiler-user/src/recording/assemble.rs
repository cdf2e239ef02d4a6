//! Assembling a profile from collected samples: grouping them by process, counting what was
//! lost and how stacks were walked, then symbolizing and aggregating them ([`aggregate`]).

use std::{collections::BTreeMap, time::Duration, time::Instant};

use profiler_common::{Counter, SampleKind};

use super::MAX_SYSTEM_PROCESSES;
use crate::{
    kernel::pool::Slot,
    kernel::Counters,
    process::maps::ProcessMaps,
    profile::sample::Sample,
    profile::{
        Losses, Profile, ProfileMeta, ProfiledTarget, RunCost, RunEnd, Throttled,
        UnavailableObject, UntabledObject, Unwound,
    },
    recording::aggregate::{aggregate, AggregateOptions, TargetSamples},
    recording::process::ProcessRecording,
    sampling::Sampling,
    symbolize::Symbolizer,
};

/// How a system-wide run shows a process that exited before it was taken in.
const EXITED_PROCESS: &str = "[exited process]";

/// What a profile says besides its processes' samples: of a whole recording, or of a window.
pub(super) struct Head {
    pub(super) sampling: Option<Sampling>,
    pub(super) program_id: u32,
    pub(super) duration: Duration,
    pub(super) counters: Counters,
    pub(super) bpf_run: Option<(u64, u64)>,
    /// The off-CPU program's run time and runs, where statistics were on.
    pub(super) off_cpu_bpf_run: Option<(u64, u64)>,
    pub(super) throttled: Option<Throttled>,
    pub(super) tables: TableCost,
    /// Whether the run could have more than one process (more than one target, children
    /// followed, system-wide): its processes' root frames carry their pids.
    pub(super) multi_process: bool,
    /// Whether it recorded every process.
    pub(super) system: bool,
    /// Processes a system-wide run did not take in (past [`MAX_SYSTEM_PROCESSES`]).
    pub(super) over_cap: usize,
    /// Off-CPU time recorded alongside the samples.
    pub(super) off_cpu: Option<crate::sampling::OffCpu>,
    /// The run's span and clocks, when it recorded a timeline.
    pub(super) timeline_clock: Option<TimelineClock>,
}

/// When a run that recorded a timeline started and ended, in the samples' clock
/// (`CLOCK_MONOTONIC`), and that clock's offset to Unix time.
#[derive(Clone, Copy, Debug)]
pub(super) struct TimelineClock {
    start_ns: u64,
    end_ns: u64,
    realtime_offset_ns: i64,
}

impl TimelineClock {
    /// The span of a run that started sampling at `started` and ends now.
    pub(super) fn ending(started: Instant) -> TimelineClock {
        use rustix::time::{clock_gettime, ClockId};
        let ns = |t: rustix::time::Timespec| t.tv_sec * 1_000_000_000 + t.tv_nsec;
        let end = ns(clock_gettime(ClockId::Monotonic));
        let realtime = ns(clock_gettime(ClockId::Realtime));
        let end_ns = end.max(0) as u64;
        TimelineClock {
            start_ns: end_ns.saturating_sub(started.elapsed().as_nanos() as u64),
            end_ns,
            realtime_offset_ns: realtime - end,
        }
    }
}

/// What the unwind tables of a recording's program cost, for the summary.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct TableCost {
    built: usize,
    /// Of `built`, read from the on-disk cache.
    cached: usize,
    rows: u64,
    build_secs: f64,
    resident_bytes: u64,
    array_bytes: u64,
}

impl TableCost {
    pub(super) fn of(unwind: &crate::unwind::UnwindMaps) -> TableCost {
        let (built, rows, took) = unwind.build_cost();
        TableCost {
            built,
            cached: unwind.tables_from_cache(),
            rows,
            build_secs: took.as_secs_f64(),
            resident_bytes: unwind.resident_bytes() as u64,
            array_bytes: unwind.capacity_bytes() as u64,
        }
    }
}

/// Symbolizes and aggregates `samples` of `processes` (processes known only by their samples'
/// pids are added to it, as gone) into a profile that ended as `end`; `after_naming` as
/// [`aggregate`] takes it.
pub(super) fn assemble_samples(
    processes: &mut BTreeMap<(u32, u32, u32), ProcessRecording>,
    samples: Vec<(u32, Vec<Sample>)>,
    head: Head,
    end: RunEnd,
    symbolizer: &mut Symbolizer,
    options: &AggregateOptions,
    after_naming: impl FnOnce(&mut Symbolizer),
) -> Profile {
    let Head {
        sampling,
        program_id,
        duration,
        counters,
        bpf_run,
        off_cpu_bpf_run,
        throttled,
        tables,
        multi_process,
        system,
        over_cap,
        off_cpu,
        timeline_clock,
    } = head;
    let mut options = options.clone();
    options.pid_roots |= multi_process;
    options.timeline = timeline_clock.is_some();
    let options = &options;
    // Samples of processes that came and went between two ticks: counted, not symbolized.
    let mut by_process: BTreeMap<(u32, u32, u32), Vec<Sample>> = BTreeMap::new();
    let mut not_profilable = 0;
    let mut known = |key: (u32, u32, u32)| {
        if processes.get(&key).is_some_and(|p| p.revoked) {
            return false;
        }
        processes.entry(key).or_insert_with(|| {
            let (program_id, run, pid) = key;
            let mut gone = ProcessRecording::gone(Slot { program_id, run }, pid);
            if system {
                // Not a child: a process that came and went between two looks.
                gone.target.comm = EXITED_PROCESS.into();
                gone.maps = ProcessMaps::gone_as(pid, EXITED_PROCESS);
            }
            gone
        });
        true
    };
    for (program_id, samples) in samples {
        let key_of = |s: &Sample| (program_id, s.run, s.pid);
        // One process's samples (a run of one target): moved whole rather than copied into
        // a second vector beside the first, which at 25k stacks was the end's largest piece.
        if let Some(key) = samples.first().map(key_of) {
            if samples.iter().all(|s| key_of(s) == key) && !by_process.contains_key(&key) {
                if known(key) {
                    by_process.insert(key, samples);
                } else {
                    // Never named, not even by address: its owner may not profile it.
                    not_profilable += samples.iter().map(|s| s.count).sum::<u64>();
                }
                continue;
            }
        }
        for sample in samples {
            let key = key_of(&sample);
            if known(key) {
                by_process.entry(key).or_default().push(sample);
            } else {
                not_profilable += sample.count;
            }
        }
    }
    let is_cpu = |s: &&Sample| s.kind == SampleKind::Cpu;
    let drained: u64 = by_process
        .values()
        .flatten()
        .filter(is_cpu)
        .map(|s| s.count)
        .sum::<u64>()
        + not_profilable;
    let drained_off_cpu: u64 = by_process
        .values()
        .flatten()
        .filter(|s| s.kind != SampleKind::Cpu)
        .map(|s| s.count)
        .sum();
    let untabled = untabled_objects(processes, &by_process);
    let tabled_late = late_tables(processes);
    // The kernel counted every sample of a CPython thread it had no thread state for as
    // missing its Python frames; those of threads that never run Python (OpenMP and other
    // native workers) miss nothing. (Samples taken before the walker program or the
    // interpreter's layout was loaded were not counted, hence the saturation.)
    let no_python: u64 = processes
        .iter()
        .filter_map(|(key, p)| {
            let runtime = p.runtime.as_ref()?;
            let samples = by_process.get(key)?;
            Some(
                samples
                    .iter()
                    .filter(is_cpu)
                    .filter(|s| s.runtime_frames.is_empty() && runtime.runs_no_runtime_code(s.tid))
                    .map(|s| s.count)
                    .sum::<u64>(),
            )
        })
        .sum();
    let losses = Losses {
        // Off-CPU intervals whose sample map insert failed were counted as map full too, and
        // those not counted as intervals at all: the two kinds are compared apart.
        lost_in_transfer: counters
            .get(Counter::Samples)
            .saturating_sub(drained + counters.get(Counter::SampleMapFull))
            + counters
                .get(Counter::OffCpuIntervals)
                .saturating_sub(drained_off_cpu),
        sample_map_full: counters.get(Counter::SampleMapFull),
        user_stack_map_full: counters.get(Counter::UserStackMapFull),
        user_stack_error: counters.get(Counter::UserStackError),
        kernel_stack_map_full: counters.get(Counter::KernelStackMapFull),
        kernel_stack_error: counters.get(Counter::KernelStackError),
        // Counted by aggregation, which cuts the stacks.
        truncated: 0,
        stack_ended_early: counters.get(Counter::StackEndedEarly),
        not_profilable,
        off_cpu_pending_full: counters.get(Counter::OffCpuPendingFull),
        // Only a run that records a timeline loses times: the kernel counts the others' too
        // when they share a process with one.
        timeline_lost: if timeline_clock.is_some() {
            counters.get(Counter::TimelineLost)
        } else {
            0
        },
    };
    let targets = processes
        .values()
        .filter(|p| p.direct || by_process.keys().any(|k| k.2 == p.sample_pid))
        .map(|p| ProfiledTarget {
            pid: p.target.pid,
            ns_pid: p.target.ns_pid,
            pid_ns: p.target.ns.ino,
            comm: if p.maps.comm().is_empty() {
                p.target.comm.clone()
            } else {
                p.maps.comm().to_string()
            },
        })
        .collect();
    let meta = ProfileMeta {
        targets,
        sampling: sampling.unwrap_or_else(placeholder_sampling),
        duration,
        samples_seen: counters.get(Counter::Samples),
        losses,
        end,
        program_id,
        tags: options.tags.clone(),
        max_stack_length: options.max_stack_length,
        cost: RunCost::default(),
        throttled,
        unwound: Unwound {
            cfi_stacks: counters.get(Counter::CfiStacks),
            frame_pointer_stacks: counters
                .get(Counter::Samples)
                .saturating_sub(counters.get(Counter::CfiStacks)),
            frame_pointer_frames_in_cfi_stacks: counters.get(Counter::FramePointerFrames),
            scanned_frames_in_cfi_stacks: counters.get(Counter::ScannedFrames),
            before_walker_ready: counters.get(Counter::CfiNotReady),
            python_stacks: counters.get(Counter::PythonStacks),
            python_stacks_missing: counters
                .get(Counter::PythonStackMissing)
                .saturating_sub(no_python),
            // Counted by aggregation, which names the frames.
            python_unnamed: 0,
            stacks_through_untabled: counters.get(Counter::UntabledStacks),
        },
        untabled,
        tabled_late,
        off_cpu,
        limits_hit: (over_cap > 0)
            .then(|| {
                format!(
                    "{over_cap} processes not taken in: a system-wide run takes in at most \
                     {MAX_SYSTEM_PROCESSES}; their samples are counted under [exited process]"
                )
            })
            .into_iter()
            .chain(processes.values().filter_map(|p| {
                let said: Vec<String> = p
                    .maps
                    .limits_hit()
                    .into_iter()
                    .chain(p.runtime.as_ref().and_then(|t| t.limits_hit()))
                    .collect();
                (!said.is_empty()).then(|| {
                    format!(
                        "pid {} ({}): {}",
                        p.target.pid,
                        p.target.comm,
                        said.join("; ")
                    )
                })
            }))
            .collect(),
        // Filled after symbolization, which reads the objects.
        unavailable: Vec::new(),
        python_unsupported: processes
            .values()
            .filter_map(|p| p.runtime_refused.clone())
            .chain(
                processes
                    .values()
                    .filter_map(|p| p.runtime.as_ref())
                    .flat_map(|r| r.notes()),
            )
            .collect(),
    };
    // The samples go to aggregation, which drops each once counted.
    let inputs: Vec<TargetSamples<'_>> = processes
        .iter()
        .map(|(key, p)| TargetSamples {
            target: &p.target,
            maps: &p.maps,
            sample_pid: p.sample_pid,
            samples: by_process.remove(key).unwrap_or_default(),
            cfi_walked: p.cfi_walked,
            runtime: p.runtime.as_deref(),
        })
        .collect();
    drop(by_process);
    let mut profile = aggregate(inputs, symbolizer, options, meta, after_naming);
    // Measured after symbolization, which is most of bpfprof's own work.
    let mut cost = own_cost();
    cost.bpf_run_time_ns = bpf_run.map(|(t, _)| t);
    cost.bpf_run_count = bpf_run.map(|(_, n)| n);
    cost.off_cpu_bpf_run_time_ns = off_cpu_bpf_run.map(|(t, _)| t);
    cost.off_cpu_bpf_run_count = off_cpu_bpf_run.map(|(_, n)| n);
    cost.unwind_tables_built = tables.built as u64;
    cost.unwind_tables_cached = tables.cached as u64;
    cost.unwind_rows_built = tables.rows;
    cost.unwind_build_secs = tables.build_secs;
    cost.unwind_resident_bytes = tables.resident_bytes;
    cost.unwind_array_bytes = tables.array_bytes;
    for (codes, naming) in processes
        .values()
        .filter_map(|p| p.runtime.as_ref().map(|t| t.naming_cost()))
    {
        cost.python_code_objects += codes as u64;
        cost.python_naming_secs += naming.as_secs_f64();
    }
    profile.meta.cost = cost;
    profile.meta.unavailable = unavailable_objects(processes);
    if let (Some(timeline), Some(clock)) = (&mut profile.timeline, timeline_clock) {
        timeline.start_ns = clock.start_ns;
        timeline.end_ns = clock.end_ns;
        timeline.realtime_offset_ns = clock.realtime_offset_ns;
    }
    profile
}

/// The objects that could not be read to name their frames (read after symbolization, which
/// tries them), each once, by path.
fn unavailable_objects(
    processes: &BTreeMap<(u32, u32, u32), ProcessRecording>,
) -> Vec<UnavailableObject> {
    let mut objects: BTreeMap<String, String> = BTreeMap::new();
    for p in processes.values() {
        for (path, why) in p.maps.unavailable() {
            objects.entry(path.display().to_string()).or_insert(why);
        }
    }
    objects
        .into_iter()
        .map(|(name, why)| UnavailableObject { name, why })
        .collect()
}

/// The objects without an unwind table at the run's end that samples' user stacks ran
/// through (their frames there walked by frame pointer), with those samples, most first.
fn untabled_objects(
    processes: &BTreeMap<(u32, u32, u32), ProcessRecording>,
    samples: &BTreeMap<(u32, u32, u32), Vec<Sample>>,
) -> Vec<UntabledObject> {
    let mut objects: BTreeMap<String, UntabledObject> = BTreeMap::new();
    for (key, samples) in samples {
        let Some(untabled) = processes.get(key).map(|p| &p.untabled) else {
            continue;
        };
        if untabled.is_empty() {
            continue;
        }
        for sample in samples {
            for object in untabled {
                if sample
                    .user_frames
                    .iter()
                    .any(|ip| (object.start..object.end).contains(ip))
                {
                    objects
                        .entry(object.name.clone())
                        .or_insert_with(|| UntabledObject {
                            name: object.name.clone(),
                            why: object.state.describe(),
                            samples: 0,
                        })
                        .samples += sample.count;
                }
            }
        }
    }
    let mut objects: Vec<UntabledObject> = objects.into_values().collect();
    objects.sort_by(|a, b| b.samples.cmp(&a.samples).then_with(|| a.name.cmp(&b.name)));
    objects
}

/// The objects whose table came late in any process (see [`ProcessRecording::tabled_late`]),
/// each once (as the first process that has it says), earliest first.
fn late_tables(
    processes: &BTreeMap<(u32, u32, u32), ProcessRecording>,
) -> Vec<crate::profile::LateTable> {
    let mut tabled_late: Vec<crate::profile::LateTable> = Vec::new();
    for late in processes.values().flat_map(|p| &p.tabled_late) {
        if !tabled_late.iter().any(|t| t.name == late.name) {
            tabled_late.push(late.clone());
        }
    }
    tabled_late.sort_by(|a, b| a.after_secs.total_cmp(&b.after_secs));
    tabled_late
}

/// What a profile says of its sampling when nothing was ever attached (no target was added).
fn placeholder_sampling() -> Sampling {
    Sampling {
        event: crate::sampling::Event::CpuClock,
        rate: crate::sampling::Rate::Frequency(0),
        nominal_hz: 0.0,
        fallback: false,
        jitter: false,
    }
}

/// bpfprof's own CPU time and peak memory so far.
fn own_cost() -> RunCost {
    let usage = crate::clock::own_usage();
    RunCost {
        profiler_cpu_secs: usage.cpu_secs,
        profiler_peak_rss_bytes: usage.peak_rss_bytes,
        ..RunCost::default()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::profile::LateTable;
    use crate::unwind::{TableState, Untabled};

    fn process(pid: u32) -> ProcessRecording {
        ProcessRecording::gone(
            Slot {
                program_id: 1,
                run: 0,
            },
            pid,
        )
    }

    fn sample(pid: u32, user_frames: &[u64], count: u64) -> Sample {
        Sample {
            run: 0,
            pid,
            tid: pid,
            user_frames: user_frames.into(),
            kernel_frames: Arc::from([]),
            runtime_frames: Arc::from([]),
            truncated: false,
            count,
            kind: SampleKind::Cpu,
            off_cpu_ns: 0,
            times_ns: Vec::new(),
        }
    }

    fn untabled(name: &str, start: u64, end: u64) -> Untabled {
        Untabled {
            start,
            end,
            name: name.into(),
            state: TableState::Queued,
        }
    }

    /// Each object without a table counts the samples whose user stack ran through it (a
    /// sample through two counts for both), of the processes that map it; most first, then by
    /// name.
    #[test]
    fn untabled_objects_count_the_samples_that_ran_through_them() {
        let mut processes = BTreeMap::new();
        let mut a = process(10);
        a.untabled = vec![
            untabled("/lib/a.so", 0x1000, 0x2000),
            untabled("/lib/b.so", 0x3000, 0x4000),
        ];
        let mut b = process(11);
        b.untabled = vec![untabled("/lib/c.so", 0x1000, 0x2000)];
        // A process whose objects all have tables.
        let c = process(12);
        processes.insert((1, 0, 10), a);
        processes.insert((1, 0, 11), b);
        processes.insert((1, 0, 12), c);
        let mut samples = BTreeMap::new();
        samples.insert(
            (1, 0, 10),
            vec![
                sample(10, &[0x1500, 0x3500], 2),
                sample(10, &[0x3100], 5),
                sample(10, &[0x9000], 7),
            ],
        );
        samples.insert(
            (1, 0, 11),
            vec![sample(11, &[0x1fff], 7), sample(11, &[0x2000], 1)],
        );
        samples.insert((1, 0, 12), vec![sample(12, &[0x1500], 100)]);
        // Samples of a process the recording does not know are left out.
        samples.insert((1, 0, 13), vec![sample(13, &[0x1500], 100)]);
        let found: Vec<(String, u64)> = untabled_objects(&processes, &samples)
            .into_iter()
            .map(|o| (o.name, o.samples))
            .collect();
        assert_eq!(
            found,
            vec![
                ("/lib/b.so".to_string(), 7),
                ("/lib/c.so".to_string(), 7),
                ("/lib/a.so".to_string(), 2),
            ]
        );
    }

    /// A table that came late in several processes is listed once, as the first process (by
    /// key) has it, and the list goes by when they came.
    #[test]
    fn late_tables_are_listed_once_earliest_first() {
        let late = |name: &str, after_secs| LateTable {
            name: name.into(),
            after_secs,
        };
        let mut a = process(10);
        a.tabled_late = vec![late("/lib/x.so", 2.0), late("/lib/y.so", 0.5)];
        let mut b = process(11);
        b.tabled_late = vec![late("/lib/x.so", 0.1), late("/lib/z.so", 1.0)];
        let processes = BTreeMap::from([((1, 0, 10), a), ((1, 0, 11), b)]);
        let found: Vec<(String, f64)> = late_tables(&processes)
            .into_iter()
            .map(|t| (t.name, t.after_secs))
            .collect();
        assert_eq!(
            found,
            vec![
                ("/lib/y.so".to_string(), 0.5),
                ("/lib/z.so".to_string(), 1.0),
                ("/lib/x.so".to_string(), 2.0),
            ]
        );
    }

    /// A timeline's span ends now and starts when sampling started, in `CLOCK_MONOTONIC`; the
    /// offset takes it to Unix time.
    #[test]
    fn a_timeline_clock_spans_the_run_in_the_monotonic_clock() {
        let started = Instant::now();
        std::thread::sleep(Duration::from_millis(20));
        let before_ns = crate::clock::monotonic_ns();
        let clock = TimelineClock::ending(started);
        assert!(
            clock.end_ns >= before_ns,
            "{clock:?} ends before {before_ns}"
        );
        let span = clock.end_ns - clock.start_ns;
        assert!(
            span >= 20_000_000,
            "{clock:?} spans less than the 20 ms slept"
        );
        assert!(clock.start_ns <= before_ns - 20_000_000, "{clock:?}");
        let unix_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as i64;
        let end_unix = clock.end_ns as i64 + clock.realtime_offset_ns;
        // The end in Unix time is a moment ago: within a minute however loaded the machine.
        assert!(
            (0..60_000_000_000).contains(&(unix_ns - end_unix)),
            "{clock:?} ends at {end_unix}, now is {unix_ns}"
        );
    }
}
