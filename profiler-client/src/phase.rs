//! Profiling the named phases of a long program, one daemon run per phase, all tagged with
//! one session.
//!
//! ```no_run
//! use bpfprof_client::PhaseProfiler;
//!
//! let phases = PhaseProfiler::enable();
//! let data = phases.profile_phase("load", || vec![1u64; 1 << 20]);
//! let sum: u64 = phases.profile_phase("compute", || data.iter().sum());
//! phases.log_summary();
//! # let _ = sum;
//! ```
//!
//! Each run is tagged `session=<session>` and `phase=<name>`, so `bpfprof list` finds them.
//! Settings come from the environment (see [`PhaseConfig::from_env`]). A [`PhaseProfiler`] is
//! `Sync`: share one (for instance through a `static OnceLock`) across the program.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use regex::Regex;

use super::function::{FunctionProfiler, ProfileError, ProfileOptions};
use crate::protocol::RunState;

/// Regex selecting the phases to profile (searched in the phase name; unset or empty: all).
pub const PHASE_FILTER_ENV: &str = "BPFPROF_PHASE_FILTER";
/// Sampling period in event units.
pub const SAMPLE_INTERVAL_ENV: &str = "BPFPROF_SAMPLE_INTERVAL";
/// Deepest stack kept.
pub const MAX_STACK_LENGTH_ENV: &str = "BPFPROF_MAX_STACK_LENGTH";
/// Longest a phase's run lasts, in seconds (fractions allowed).
pub const MAX_PROFILE_TIME_ENV: &str = "BPFPROF_MAX_PROFILE_TIME";
/// How user stacks are walked: `auto`, `fp` or `cfi` (as `bpfprof --unwind`).
pub const UNWIND_ENV: &str = "BPFPROF_UNWIND";
/// `1`/`0` (`true`/`false`, `yes`/`no`): whether runs also profile the children the target
/// forks during the run (the protocol's `follow_children`).
pub const FOLLOW_CHILDREN_ENV: &str = "BPFPROF_FOLLOW_CHILDREN";
/// The unwind modes the daemon knows.
pub const UNWIND_MODES: [&str; 3] = ["auto", "fp", "cfi"];

/// Tag key naming the session.
pub const SESSION_TAG: &str = "session";
/// Tag key naming the phase.
pub const PHASE_TAG: &str = "phase";
/// Longest tag key or value the daemon accepts.
const MAX_TAG_CHARS: usize = 128;

thread_local! {
    /// Phases open on this thread; a phase inside another is not profiled on its own, as its
    /// samples already belong to the outer phase's run and one process has one run at a time.
    static DEPTH: Cell<usize> = const { Cell::new(0) };
}

/// Settings of a [`PhaseProfiler`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PhaseConfig {
    /// Options of every phase's run (`stop_at_error` is ignored: phases never fail the work).
    pub options: ProfileOptions,
    /// Regex selecting the phases to profile; `None` profiles all.
    pub filter: Option<String>,
}

impl PhaseConfig {
    /// Defaults overridden by `BPFPROF_SAMPLE_INTERVAL`, `BPFPROF_MAX_STACK_LENGTH`,
    /// `BPFPROF_MAX_PROFILE_TIME` (seconds), `BPFPROF_UNWIND`, `BPFPROF_FOLLOW_CHILDREN` and
    /// `BPFPROF_PHASE_FILTER`; invalid values are
    /// warned about and ignored. The socket comes from `BPFPROF_SOCKET` as for every client.
    pub fn from_env() -> PhaseConfig {
        PhaseConfig::from_lookup(|key| std::env::var(key).ok())
    }

    /// Like [`PhaseConfig::from_env`], reading variables through `lookup`.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> PhaseConfig {
        let mut config = PhaseConfig::default();
        let get = |key: &str| {
            lookup(key)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        if let Some(v) = get(SAMPLE_INTERVAL_ENV) {
            match v.parse::<i64>() {
                Ok(n) if n > 0 => config.options.sample_interval = n,
                _ => log::warn!(
                    "bpfprof: ignoring {SAMPLE_INTERVAL_ENV}={v:?}: not a positive integer"
                ),
            }
        }
        if let Some(v) = get(MAX_STACK_LENGTH_ENV) {
            match v.parse::<i64>() {
                Ok(n) if n > 0 => config.options.max_stack_length = n,
                _ => log::warn!(
                    "bpfprof: ignoring {MAX_STACK_LENGTH_ENV}={v:?}: not a positive integer"
                ),
            }
        }
        if let Some(v) = get(MAX_PROFILE_TIME_ENV) {
            let secs = v.parse::<f64>().ok();
            match secs.and_then(|s| Duration::try_from_secs_f64(s).ok()) {
                Some(d) if !d.is_zero() => config.options.max_profile_duration = d,
                _ => log::warn!(
                    "bpfprof: ignoring {MAX_PROFILE_TIME_ENV}={v:?}: not a positive number of \
                     seconds"
                ),
            }
        }
        if let Some(v) = get(UNWIND_ENV) {
            if UNWIND_MODES.contains(&v.as_str()) {
                config.options.unwind = Some(v);
            } else {
                log::warn!("bpfprof: ignoring {UNWIND_ENV}={v:?}: expected auto, fp or cfi");
            }
        }
        if let Some(v) = get(FOLLOW_CHILDREN_ENV) {
            match parse_switch(&v) {
                Some(on) => config.options.follow_children = on,
                None => {
                    log::warn!("bpfprof: ignoring {FOLLOW_CHILDREN_ENV}={v:?}: expected 1 or 0")
                }
            }
        }
        config.filter = get(PHASE_FILTER_ENV);
        config
    }
}

/// An on/off environment value: `1`/`true`/`yes` or `0`/`false`/`no` (any case); `None` for
/// anything else.
pub fn parse_switch(value: &str) -> Option<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" => Some(true),
        "0" | "false" | "no" => Some(false),
        _ => None,
    }
}

/// Which phases are profiled.
#[derive(Debug)]
enum Filter {
    All,
    Matching(Regex),
    // An invalid filter was meant to restrict profiling; profiling everything instead could
    // cost far more than the user asked for, so it selects nothing (and says so).
    Nothing,
}

impl Filter {
    fn admits(&self, phase: &str) -> bool {
        match self {
            Filter::All => true,
            Filter::Matching(re) => re.is_match(phase),
            Filter::Nothing => false,
        }
    }
}

/// Counts of what happened to the phases of a [`PhaseProfiler`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PhaseStats {
    /// Phases profiled with results collected.
    pub successes: u64,
    /// Phases whose profiling failed (the work still ran), or whose work panicked.
    pub failures: u64,
    /// Phases not profiled because they ran inside another phase on the same thread.
    pub skipped_nested: u64,
    /// Phases not profiled because another profiling run of this process was in progress.
    pub skipped_busy: u64,
    /// Phases not profiled because the filter did not select them.
    pub filtered_out: u64,
}

#[derive(Debug, Default)]
struct Counters {
    successes: AtomicU64,
    failures: AtomicU64,
    skipped_nested: AtomicU64,
    skipped_busy: AtomicU64,
    filtered_out: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// What became of one profiled phase.
#[derive(Clone, Debug, PartialEq)]
pub struct PhaseRun {
    /// The phase name as given.
    pub phase: String,
    /// The daemon's run, if one was started.
    pub run_id: Option<u64>,
    /// The run's last known state.
    pub state: Option<RunState>,
    /// Samples the run took.
    pub samples: Option<u64>,
    /// Why profiling failed, if it did.
    pub error: Option<String>,
}

/// Profiles named phases of a program under one session tag.
#[derive(Debug)]
pub struct PhaseProfiler {
    session: String,
    options: ProfileOptions,
    filter: Filter,
    counters: Counters,
    runs: Mutex<Vec<PhaseRun>>,
}

impl PhaseProfiler {
    /// A phase profiler configured from the environment ([`PhaseConfig::from_env`]) with a new
    /// session tag.
    pub fn enable() -> PhaseProfiler {
        PhaseProfiler::new(PhaseConfig::from_env())
    }

    /// A phase profiler with `config` and a new session tag.
    pub fn new(config: PhaseConfig) -> PhaseProfiler {
        let filter = match config.filter.as_deref() {
            None => Filter::All,
            Some(src) => match Regex::new(src) {
                Ok(re) => Filter::Matching(re),
                Err(e) => {
                    log::warn!(
                        "bpfprof: invalid phase filter {src:?} ({e}); no phase will be profiled"
                    );
                    Filter::Nothing
                }
            },
        };
        let mut options = config.options;
        // profile_phase returns the work's value itself, so failures can only be logged.
        options.stop_at_error = false;
        let session = new_session_tag();
        log::info!(
            "bpfprof: phase profiling enabled, session {session}; the daemon keeps each phase's \
             results in its state directory (tags {SESSION_TAG}={session}, {PHASE_TAG}=NAME), \
             see `bpfprof list`"
        );
        PhaseProfiler {
            session,
            options,
            filter,
            counters: Counters::default(),
            runs: Mutex::new(Vec::new()),
        }
    }

    /// The session tag of this profiler's runs.
    pub fn session(&self) -> &str {
        &self.session
    }

    /// The options of each phase's run (before the session and phase tags are added).
    pub fn options(&self) -> &ProfileOptions {
        &self.options
    }

    /// Runs `work` as phase `name`, profiled unless filtered out or nested in another phase,
    /// and returns its result; its panic unwinds unchanged, and profiling failures are only
    /// logged and counted.
    pub fn profile_phase<R>(&self, name: &str, work: impl FnOnce() -> R) -> R {
        if !self.filter.admits(name) {
            bump(&self.counters.filtered_out);
            log::debug!("bpfprof: phase {name:?} filtered out, not profiled");
            return work();
        }
        let depth = DepthGuard::enter();
        if depth.outer_phases > 0 {
            bump(&self.counters.skipped_nested);
            log::debug!("bpfprof: phase {name:?} is nested in another phase, not profiled");
            return work();
        }

        let mut options = self.options.clone();
        options
            .tags
            .insert(SESSION_TAG.into(), self.session.clone());
        options.tags.insert(PHASE_TAG.into(), sanitize_tag(name));
        let mut profiler = FunctionProfiler::new(options);
        let mut on_unwind = CountOnUnwind {
            counter: &self.counters.failures,
            armed: true,
        };
        let value = match profiler.profile(work) {
            Ok(value) => value,
            Err(_) => unreachable!("stop_at_error is off, so profile does not fail"),
        };
        on_unwind.armed = false;
        drop(depth);

        let result = profiler.last_result();
        let record = PhaseRun {
            phase: name.to_string(),
            run_id: profiler.last_run_id(),
            state: result.and_then(|r| r.state),
            samples: result.and_then(|r| r.samples),
            error: profiler.last_error().map(ToString::to_string),
        };
        match profiler.last_error() {
            None => {
                bump(&self.counters.successes);
                log::info!(
                    "bpfprof: phase {name:?} profiled: run {} {}, {} samples",
                    record.run_id.unwrap_or_default(),
                    record.state.map(|s| s.to_string()).unwrap_or_default(),
                    record.samples.unwrap_or_default()
                );
            }
            Some(ProfileError::Busy) => bump(&self.counters.skipped_busy),
            Some(_) => bump(&self.counters.failures),
        }
        self.runs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(record);
        value
    }

    /// What has happened to the phases so far.
    pub fn stats(&self) -> PhaseStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        PhaseStats {
            successes: get(&self.counters.successes),
            failures: get(&self.counters.failures),
            skipped_nested: get(&self.counters.skipped_nested),
            skipped_busy: get(&self.counters.skipped_busy),
            filtered_out: get(&self.counters.filtered_out),
        }
    }

    /// The phases that reached the profiler (not filtered, not nested), in order.
    pub fn runs(&self) -> Vec<PhaseRun> {
        self.runs.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Logs the counts of [`PhaseProfiler::stats`]; also done when the profiler is dropped.
    pub fn log_summary(&self) {
        let s = self.stats();
        log::info!(
            "bpfprof: session {}: {} phases profiled, {} failed, {} skipped as nested, {} \
             skipped while another run was in progress, {} filtered out",
            self.session,
            s.successes,
            s.failures,
            s.skipped_nested,
            s.skipped_busy,
            s.filtered_out
        );
    }
}

impl Drop for PhaseProfiler {
    fn drop(&mut self) {
        if self.stats() != PhaseStats::default() {
            self.log_summary();
        }
    }
}

/// One open phase on this thread, closed on drop (also when unwinding).
struct DepthGuard {
    /// Phases that were already open on this thread.
    outer_phases: usize,
}

impl DepthGuard {
    fn enter() -> DepthGuard {
        let outer_phases = DEPTH.with(|d| {
            let outer = d.get();
            d.set(outer + 1);
            outer
        });
        DepthGuard { outer_phases }
    }
}

impl Drop for DepthGuard {
    fn drop(&mut self) {
        DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
    }
}

/// Counts a failure if dropped while still armed, that is when the phase's work panicked.
struct CountOnUnwind<'a> {
    counter: &'a AtomicU64,
    armed: bool,
}

impl Drop for CountOnUnwind<'_> {
    fn drop(&mut self) {
        if self.armed {
            bump(self.counter);
        }
    }
}

/// Replaces every character outside the daemon's tag charset `[A-Za-z0-9_.:/@+-]` with `_`
/// and cuts to 128 characters, so any phase name makes a tag the daemon accepts.
pub fn sanitize_tag(s: &str) -> String {
    let mut out: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "_.:/@+-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .take(MAX_TAG_CHARS)
        .collect();
    if out.is_empty() {
        out.push('_');
    }
    out
}

/// `<unix-seconds>-<pid>-<hostname>`, with `.N` added for the second and later sessions of one
/// process so two sessions started within a second still differ.
fn new_session_tag() -> String {
    static SESSIONS: AtomicU64 = AtomicU64::new(0);
    let seq = SESSIONS.fetch_add(1, Ordering::Relaxed);
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let suffix = if seq == 0 {
        String::new()
    } else {
        format!(".{seq}")
    };
    // The hostname goes last and is the part cut if the tag is too long.
    let head = format!("{secs}-{}-", std::process::id());
    let room = MAX_TAG_CHARS - head.len() - suffix.len();
    let host: String = sanitize_tag(&hostname()).chars().take(room).collect();
    format!("{head}{host}{suffix}")
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: buf is writable for its whole length, which is what we pass.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "unknown-host".into();
    }
    let len = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    match String::from_utf8_lossy(&buf[..len]).into_owned() {
        h if h.is_empty() => "unknown-host".into(),
        h => h,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::panic::{self, AssertUnwindSafe};

    use super::super::testutil::*;
    use super::*;
    use crate::protocol::{ErrorCode, Op, Reply};

    fn config(daemon: &FakeDaemon, filter: Option<&str>) -> PhaseConfig {
        let mut config = PhaseConfig {
            filter: filter.map(str::to_string),
            ..PhaseConfig::default()
        };
        config.options.socket = Some(daemon.path.clone());
        config.options.timeout_wait_for_running = Duration::from_secs(5);
        config.options.timeout_wait_for_finished = Duration::from_secs(5);
        config
    }

    fn run_tags(daemon: &FakeDaemon) -> Vec<(String, String)> {
        daemon
            .requests
            .lock()
            .unwrap()
            .iter()
            .filter_map(|op| match op {
                Op::Run(r) => Some((r.tags[SESSION_TAG].clone(), r.tags[PHASE_TAG].clone())),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn phases_are_tagged_with_session_and_phase() {
        let _serial = serial();
        let daemon = FakeDaemon::well_behaved(RunState::Stopped);
        let p = PhaseProfiler::new(config(&daemon, None));
        assert_eq!(p.profile_phase("load data", || 1), 1);
        assert_eq!(p.profile_phase("fwd", || "x"), "x");
        assert_eq!(
            run_tags(&daemon),
            [
                (p.session().to_string(), "load_data".to_string()),
                (p.session().to_string(), "fwd".to_string())
            ]
        );
        assert_eq!(
            p.stats(),
            PhaseStats {
                successes: 2,
                ..PhaseStats::default()
            }
        );
        let runs = p.runs();
        assert_eq!(runs.len(), 2);
        assert_eq!(runs[0].phase, "load data");
        assert_eq!(runs[0].run_id, Some(7));
        assert_eq!(runs[0].state, Some(RunState::Stopped));
        assert_eq!(runs[0].error, None);
    }

    #[test]
    fn nested_phases_are_skipped_and_counted() {
        let _serial = serial();
        let daemon = FakeDaemon::well_behaved(RunState::Stopped);
        let p = PhaseProfiler::new(config(&daemon, None));
        let v = p.profile_phase("outer", || {
            p.profile_phase("inner", || p.profile_phase("innermost", || 2)) + 1
        });
        assert_eq!(v, 3);
        // The depth is back to zero: the next phase is profiled.
        p.profile_phase("after", || ());
        let s = p.stats();
        assert_eq!((s.successes, s.skipped_nested), (2, 2));
        let phases: Vec<_> = run_tags(&daemon).into_iter().map(|(_, p)| p).collect();
        assert_eq!(phases, ["outer", "after"]);
    }

    #[test]
    fn filter_selects_phases() {
        let _serial = serial();
        let daemon = FakeDaemon::well_behaved(RunState::Stopped);
        let p = PhaseProfiler::new(config(&daemon, Some("^(fwd|bwd)$")));
        for name in ["load", "fwd", "bwd", "fwd2"] {
            assert_eq!(p.profile_phase(name, || name.len()), name.len());
        }
        let s = p.stats();
        assert_eq!((s.successes, s.filtered_out), (2, 2));
        let phases: Vec<_> = run_tags(&daemon).into_iter().map(|(_, p)| p).collect();
        assert_eq!(phases, ["fwd", "bwd"]);
    }

    #[test]
    fn invalid_filter_profiles_nothing() {
        let _serial = serial();
        let daemon = FakeDaemon::well_behaved(RunState::Stopped);
        let p = PhaseProfiler::new(config(&daemon, Some("(unclosed")));
        assert_eq!(p.profile_phase("a", || 4), 4);
        assert_eq!(p.stats().filtered_out, 1);
        assert!(daemon.ops().is_empty());
    }

    #[test]
    fn failures_are_counted_and_the_work_still_runs() {
        let _serial = serial();
        let daemon = FakeDaemon::start(|_| Some(Reply::error(ErrorCode::TooManyRuns, "full")));
        let p = PhaseProfiler::new(config(&daemon, None));
        assert_eq!(p.profile_phase("a", || 5), 5);
        assert_eq!(p.stats().failures, 1);
        let runs = p.runs();
        assert!(runs[0].error.as_deref().unwrap().contains("full"));
        assert_eq!(runs[0].run_id, None);
    }

    #[test]
    fn a_panicking_phase_unwinds_and_counts_as_failed() {
        let _serial = serial();
        let daemon = FakeDaemon::well_behaved(RunState::Stopped);
        let p = PhaseProfiler::new(config(&daemon, None));
        let payload = panic::catch_unwind(AssertUnwindSafe(|| {
            p.profile_phase("bad", || -> () { panic::panic_any("phase broke") })
        }))
        .unwrap_err();
        assert_eq!(payload.downcast_ref::<&str>(), Some(&"phase broke"));
        assert_eq!(p.stats().failures, 1);
        // The nesting depth was unwound too.
        p.profile_phase("good", || ());
        assert_eq!(p.stats().successes, 1);
    }

    #[test]
    fn config_reads_the_environment() {
        let env: HashMap<&str, &str> = [
            (SAMPLE_INTERVAL_ENV, "5000"),
            (MAX_STACK_LENGTH_ENV, " 64 "),
            (MAX_PROFILE_TIME_ENV, "1.5"),
            (UNWIND_ENV, "fp"),
            (FOLLOW_CHILDREN_ENV, "yes"),
            (PHASE_FILTER_ENV, "fwd"),
        ]
        .into();
        let c = PhaseConfig::from_lookup(|k| env.get(k).map(|v| v.to_string()));
        assert_eq!(c.options.sample_interval, 5000);
        assert_eq!(c.options.max_stack_length, 64);
        assert_eq!(c.options.max_profile_duration, Duration::from_millis(1500));
        assert_eq!(c.filter.as_deref(), Some("fwd"));
        assert_eq!(c.options.unwind.as_deref(), Some("fp"));
        assert!(c.options.follow_children);

        let bad: HashMap<&str, &str> = [
            (SAMPLE_INTERVAL_ENV, "-1"),
            (MAX_STACK_LENGTH_ENV, "lots"),
            (MAX_PROFILE_TIME_ENV, "0"),
            (UNWIND_ENV, "dwarf"),
            (FOLLOW_CHILDREN_ENV, "sometimes"),
            (PHASE_FILTER_ENV, ""),
        ]
        .into();
        let c = PhaseConfig::from_lookup(|k| bad.get(k).map(|v| v.to_string()));
        assert_eq!(c, PhaseConfig::default());
    }

    #[test]
    fn tags_are_sanitized() {
        assert_eq!(sanitize_tag("a b/c:d@e+f-g.h_i"), "a_b/c:d@e+f-g.h_i");
        assert_eq!(sanitize_tag("é!"), "__");
        assert_eq!(sanitize_tag(""), "_");
        assert_eq!(sanitize_tag(&"x".repeat(300)).len(), 128);
    }

    #[test]
    fn session_tags_are_valid_and_unique() {
        let a = new_session_tag();
        let b = new_session_tag();
        assert_ne!(a, b);
        for tag in [&a, &b] {
            assert!(tag.len() <= MAX_TAG_CHARS);
            assert_eq!(&sanitize_tag(tag), tag);
            assert!(tag.contains(&format!("-{}-", std::process::id())), "{tag}");
        }
    }
}
