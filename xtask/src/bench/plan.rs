//! What the bench measures and with what: the plan of a full or quick run (rounds,
//! frequencies, sizes), the profilers and overhead arms compared, and every constant that shapes
//! a workload or a run, sections 7 to 11's included.

use std::time::Duration;

/// Debian packages the bench runs or builds with (curl fetches the agent's pprof and metrics
/// in section 13).
pub(super) const TOOLS: &[&str] = &["linux-perf", "bpftrace", "gcc", "curl"];

/// Flags for every workload: frame pointers everywhere (all three profilers walk user stacks
/// by frame pointer; see `keep_frame` in `bench/common.h` for the leaves), no shrink-wrapping
/// (the frame must be set up before a leaf's loop, not only around its last call), no tail
/// calls (a `jmp` to a callee would drop the caller's frame), and no identical-code folding
/// (two functions with the same body must stay two symbols).
pub(super) const CFLAGS: &[&str] = &[
    "-O2",
    "-g",
    "-fno-omit-frame-pointer",
    "-mno-omit-leaf-frame-pointer",
    "-fno-shrink-wrap",
    "-fno-optimize-sibling-calls",
    "-fno-ipa-icf",
    "-pthread",
];

/// Flags for the generated large binary. -O0: at -O2, gcc takes over two minutes for its
/// thousands of functions on a 2-CPU machine, and the optimization level does not matter to
/// what the binary is for (symbolizing many frames of a big executable with debug info); -O0
/// also gives every function, leaves included, its frame.
pub(super) const BIG_CFLAGS: &[&str] = &["-O0", "-g", "-fno-omit-frame-pointer", "-pthread"];

/// Iterations per thread of the overhead workload: about 1.5 s on the machine this was
/// written on, long enough that start-up jitter is small against it.
pub(super) const BURN_ITERS: &str = "1100000000";
/// Chunks of the 75:25 accuracy workload: about 3 s.
pub(super) const SPLIT_CHUNKS: &str = "20000";
/// 10 ms periods of the aliasing workload: 3 s.
pub(super) const ALIAS_PERIODS: &str = "300";
/// How long the attached runs (sections 4 to 6) sample.
pub(super) const ATTACH_SECS: f64 = 3.0;
/// Section 12: the agent's rates: its default (19 Hz, the always-on rate of Parca Agent and the
/// OpenTelemetry profiler) and the 99 Hz a team may ask for.
pub(super) const AGENT_HZ: [u64; 2] = [19, 99];
/// Section 12: seconds a profiler starts up (program load, the walker's verification, the first
/// tables) before its always-on cost is measured.
pub(super) const AGENT_SETTLE_SECS: f64 = 5.0;
/// Section 13: services on the export bench's machine, each a `bench/duty.c` process: the
/// issue's machine of fifty processes.
pub(super) const EXPORT_PROCESSES: usize = 50;
/// Section 13: each service's work per wake-up (µs) and its period (ms): 2% of a core each,
/// one core for all fifty, so every process has samples in every window at 19 Hz.
pub(super) const EXPORT_BUSY_US: &str = "2000";
/// Section 13: see [`EXPORT_BUSY_US`].
pub(super) const EXPORT_PERIOD_MS: &str = "100";
/// Section 13: the agent's rate and window, its defaults.
pub(super) const EXPORT_HZ: u64 = 19;
/// Section 13: see [`EXPORT_HZ`].
pub(super) const EXPORT_WINDOW_SECS: u64 = 10;
/// Section 13: windows measured after the first (a minute of the agent).
pub(super) const EXPORT_WINDOWS: usize = 6;
/// Extra frames of `burn` for the deep-stack overhead runs.
pub(super) const DEEP_DEPTH: usize = 120;
/// Levels of the call tree of the generated large binary.
pub(super) const BIG_LEVELS: usize = 48;
/// Functions per level of the generated large binary.
pub(super) const BIG_PER_LEVEL: usize = 100;
/// Watchdog for any one profiler run: far above what a run takes, so only a hang trips it.
pub(super) const RUN_LIMIT: Duration = Duration::from_secs(300);
/// Longest a launch-mode run may take: their workloads run for seconds.
pub(super) const LAUNCH_LIMIT: Duration = Duration::from_secs(60);

/// The profilers compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Tool {
    Bpfprof,
    /// bpfprof with its sampling-interval randomization turned off.
    BpfprofFixed,
    Perf,
    Bpftrace,
}

impl Tool {
    /// Whether this is bpfprof, randomized or not.
    pub(super) fn is_bpfprof_like(self) -> bool {
        matches!(self, Tool::Bpfprof | Tool::BpfprofFixed)
    }

    /// The profiler's name in the report.
    pub(super) fn name(self) -> &'static str {
        match self {
            Tool::Bpfprof => "bpfprof",
            Tool::BpfprofFixed => "bpfprof --fixed-interval",
            Tool::Perf => "perf record -g",
            Tool::Bpftrace => "bpftrace",
        }
    }
}

/// The three profilers every section compares.
pub(super) const TOOLS_COMPARED: [Tool; 3] = [Tool::Bpfprof, Tool::Perf, Tool::Bpftrace];

/// What a full or quick run measures.
pub(super) struct Plan {
    pub(super) quick: bool,
    pub(super) rounds: usize,
    pub(super) overhead_hz: Vec<u64>,
    pub(super) accuracy_hz: Vec<u64>,
    pub(super) alias_hz: Vec<u64>,
    pub(super) rate_hz: Vec<u64>,
    pub(super) own_cost_hz: Vec<u64>,
    /// Distinct call paths of the large binary for the memory ladder (0: unlimited).
    pub(super) path_limits: Vec<u64>,
}

impl Plan {
    /// The plan of a full run, or of a quick one.
    pub(super) fn new(quick: bool) -> Plan {
        if quick {
            Plan {
                quick,
                rounds: 1,
                overhead_hz: vec![999],
                accuracy_hz: vec![999],
                alias_hz: vec![100],
                rate_hz: vec![4999],
                own_cost_hz: vec![999],
                path_limits: vec![1000],
            }
        } else {
            Plan {
                quick,
                rounds: 5,
                overhead_hz: vec![99, 999, 4999],
                accuracy_hz: vec![99, 999, 4999],
                alias_hz: vec![97, 100, 101, 1000],
                rate_hz: vec![999, 4999, 9999, 19999],
                own_cost_hz: vec![999, 4999],
                path_limits: vec![100, 1000, 10000],
            }
        }
    }

    /// Overhead figures are the noisiest: they get more rounds.
    pub(super) fn overhead_rounds(&self) -> usize {
        if self.quick {
            1
        } else {
            9
        }
    }
}

/// One way of running the overhead workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Arm {
    Alone,
    /// bpfprof sampling an idle process meanwhile: the cost of the timers alone.
    Floor,
    /// `perf record -a -g`: perf with per-CPU events, as bpfprof and bpftrace use.
    PerfSystemWide,
    Under(Tool),
}

impl Arm {
    /// The arm's name in the report.
    pub(super) fn name(self) -> &'static str {
        match self {
            Arm::Alone => "alone",
            Arm::Floor => "timer floor (bpfprof watching an idle process)",
            Arm::PerfSystemWide => "perf record -a -g (per-CPU events, whole system)",
            Arm::Under(tool) => tool.name(),
        }
    }
}

/// Descent depths of the recursion workload for the kernel-time rows (issue 11: 12 and 120).
pub(super) const KERNEL_DEPTHS: [usize; 2] = [12, 120];
/// Flags for the workloads built without frame pointers: gcc's default CFI, as distro binaries
/// are built; tail calls and identical-code folding stay off so that the call path is known.
pub(super) const NOFP_CFLAGS: &[&str] = &[
    "-O2",
    "-g",
    "-fomit-frame-pointer",
    "-fno-optimize-sibling-calls",
    "-fno-ipa-icf",
    "-pthread",
];
/// Shape of the generated large object: functions and the filler bytes of each one's body.
/// 100,000 functions of 4 KiB make a 410 MB shared object (PyTorch's libtorch_cpu.so: 430 MB).
pub(super) const LARGE_FUNCTIONS: usize = 100_000;
/// See [`LARGE_FUNCTIONS`].
pub(super) const LARGE_BODY_BYTES: usize = 4096;
/// Bytes between the pushes and pops of a frameless generated function (see
/// `generate_large_asm` in `unwind.rs`).
pub(super) const LARGE_CHUNK_BYTES: usize = 256;
/// Iterations of `burn` that take about 10 ms on one thread here (1.1e9 take ~1.5 s).
pub(super) const SHORT_ITERS: &str = "7000000";
/// The CPython the Python rows use (a pyenv build, without frame pointers).
pub(super) const PYTHON: &str = "/root/.pyenv/versions/3.12.1/bin/python3";
/// Depth of the Python recursion for the kernel-time row (issue 12: 30).
pub(super) const PYTHON_DEPTH: usize = 30;
/// Python work: iterations of the hot loop, about 1.5 s alone here.
pub(super) const PYTHON_ROUNDS: &str = "6000";
/// Shape of the many-functions Python program for the naming-cost row (issue 12: 10,000
/// distinct functions): call chains of `PYMANY_DEPTH` functions each.
pub(super) const PYMANY_CHAINS: usize = 250;
/// See [`PYMANY_CHAINS`].
pub(super) const PYMANY_DEPTH: usize = 40;
/// Loop iterations of a chain's leaf: about 6 ms on CPython 3.12 here, six samples at 999 Hz,
/// so that every chain is sampled in each of the two passes.
pub(super) const PYMANY_LEAF_ITERS: &str = "150000";
/// The frame bpfprof shows for a Python frame whose code object it could not resolve.
pub(super) const UNNAMED_PYTHON: &str = "[unknown Python code]";

/// The sysctl that turns on BPF programs' run-time statistics (see `BpfStatsGuard`).
pub(super) const BPF_STATS: &str = "/proc/sys/kernel/bpf_stats_enabled";

/// Section 15: rounds of the agent on each host (the host started once; 20 s a round, four
/// hosts: about 8 minutes with the hosts' starts), fewer than the 9 so that the
/// section fits the bench's time.
pub(super) const COST_AGENT_ROUNDS: usize = 5;
/// Section 15: rounds of the launched runs (each a few seconds), more than the 9: two
/// profilers' costs a third of a point apart at 4999 Hz, with rounds spread over 3-5 points by
/// the machine's own noise, were not told apart by 9 (the paired difference's standard error
/// was about 0.5 points; 0.3 at 21 rounds).
pub(super) const COST_LAUNCH_ROUNDS: usize = 21;
/// Section 15: seconds each agent (and perf) run is measured, after it settled.
pub(super) const COST_SECS: f64 = 15.0;
/// Sections 16 and 17: rounds of each kernel-time arm (alternating), and how long each attached
/// run samples.
pub(super) const RUNTIME_ROUNDS: usize = 3;
/// See [`RUNTIME_ROUNDS`].
pub(super) const RUNTIME_SECS: f64 = 2.0;
/// Section 16: depth of each asyncio task's coroutine chain (`await deep(n - 1)`), and the
/// tasks `gather`ed.
pub(super) const ASYNC_DEPTH: usize = 20;
/// See [`ASYNC_DEPTH`].
pub(super) const ASYNC_TASKS: usize = 4;
/// Section 17: depth of the Java, Node.js and native recursions (issue 45: 30).
pub(super) const MANAGED_DEPTH: usize = 30;
/// Section 17: Debian 12's JDK 17.
pub(super) const JDK17: &str = "/usr/lib/jvm/java-17-openjdk-amd64";
/// Section 17: where `cargo xtask setup` unpacks Debian 12's Node 18 when the machine's `node`
/// is another (it runs with its libraries from there).
pub(super) const NODE18_ROOT: &str = "/opt/node18";
/// Section 17: seconds a JVM or Node runs before bpfprof attaches (start-up, the JIT's first
/// compilations), and how long the agent is measured beside them.
pub(super) const MANAGED_WARM_SECS: f64 = 3.0;
/// See [`MANAGED_WARM_SECS`].
pub(super) const MANAGED_AGENT_SECS: f64 = 20.0;
