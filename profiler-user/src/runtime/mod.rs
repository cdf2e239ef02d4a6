//! Language runtimes whose frames bpfprof reads beside the native stack: one interface, one
//! folder per runtime ([`cpython`] is the first), one list ([`RUNTIMES`]).
//!
//! The shape is the OpenTelemetry eBPF profiler's `interpreter/` (a loader recognises the
//! runtime in a process, per-process data, an instance that names its frames), cut to what
//! the recording pipeline calls:
//! - [`Runtime`] (one static value per runtime): recognises a process and attaches to it,
//!   handing the kernel program what its walker needs for that process ([`Runtime::attach`]);
//!   a process that runs the runtime in a form bpfprof cannot walk gets one sentence saying
//!   so (the "not supported: <reason>" the summary, `dump` and `top` show);
//! - [`Instance`] (one per attached process): keeps the kernel's view of the process up to
//!   date ([`Instance::refresh`]), queues the frames of the stacks the kernel recorded and
//!   names them while the process lives, within its owner's share ([`shares`]), and reports
//!   what its bounds left out and what naming cost;
//! - [`NamedFrames`]: an instance's names, which aggregation merges into native stacks.
//!
//! The pipeline carries a runtime's stacks as [`crate::profile::sample::Sample::runtime_frames`]
//! (packed as the runtime packs them) and its named frames as
//! [`FrameKind::Runtime`] with the runtime's [`RuntimeTag`]; the kernel side has the tag and
//! one walker per runtime. Adding a runtime: its folder here implementing these traits, its
//! entry in [`RUNTIMES`] and a [`RuntimeTag`], its kernel walker and maps (see
//! `docs/development.md`, "Adding a runtime").

pub mod cpython;
pub mod hotspot;
pub mod shares;
pub mod v8;

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::Duration,
};

pub use profiler_common::RuntimeTag;
use profiler_common::StackId;

use crate::{
    kernel::{KernelProgram, ScannedWait},
    process::target::Target,
    profile::CodeAddress,
    symbolize::{Frame, FrameKind},
};

use self::shares::{NamingShares, Owner};

/// Every runtime bpfprof knows, in the order a process is offered to them (the first that
/// attaches wins: a process runs one).
pub static RUNTIMES: &[&dyn Runtime] = &[&cpython::CPython, &hotspot::Hotspot, &v8::V8];

/// The runtime of `tag`.
pub fn by_tag(tag: RuntimeTag) -> Option<&'static dyn Runtime> {
    RUNTIMES.iter().copied().find(|r| r.tag() == tag)
}

/// A language runtime bpfprof can read the frames of (a loader, in the OpenTelemetry
/// profiler's words). Implementations are unit values listed in [`RUNTIMES`].
pub trait Runtime: Sync {
    /// Its tag, on its frames and in the kernel's per-process entries.
    fn tag(&self) -> RuntimeTag;

    /// Attaches to host pid `pid` when it runs this runtime in a form bpfprof can walk: gives
    /// `program` what its walker needs for the process and returns the instance that follows
    /// it. When the process runs the runtime in a form bpfprof cannot walk, `refused` gets
    /// the sentence that says so (logged as a warning the first time it changes); `None`
    /// then, and when the process does not run it. `mapped` is the process's executable
    /// mappings as the caller just read them (empty when it has none): a runtime known by
    /// the object it maps looks there first, and reads nothing more of a process that maps
    /// none of its objects.
    fn attach(
        &self,
        program: &mut KernelProgram,
        pid: u32,
        naming: &Naming,
        enabled: Enabled,
        refused: &mut Option<String>,
        mapped: &[procfs::process::MemoryMap],
    ) -> Option<Box<dyn Instance>>;

    /// The leaf-most `limit` frames of one of its kernel stacks (as the kernel packed it,
    /// innermost first), and whether any were cut (`--max-stack-length`).
    fn cut(&self, stack: &[u64], limit: usize) -> (Vec<u64>, bool);

    /// Which frames of a profile stack (root first, `None` for bpfprof's own frames) its view
    /// keeps (`--python-view`): the runtime's own machinery below and between its functions
    /// folded into them.
    fn view_keep(&self, frames: &[Option<&Frame>]) -> Vec<bool>;
}

/// Whose share of naming an instance's names are charged to.
pub struct Naming<'a> {
    /// The naming shares of the daemon (or the one recording).
    pub shares: &'a Arc<NamingShares>,
    /// The owner of the run.
    pub owner: Owner,
    /// What the runtimes found in the objects of processes taken in before.
    pub objects: &'a ObjectMemo,
}

/// What runtimes found in object files, kept by each file's identity for the next process
/// that maps it (a recording's, for its life): a host runs many processes of a few
/// interpreters, and each process's search of its interpreter's symbols cost as much as the
/// first's.
#[derive(Default)]
pub struct ObjectMemo {
    /// CPython's `_PyRuntime` search ([`cpython::detect::DetectMemo`]).
    pub cpython: cpython::detect::DetectMemo,
}

/// The runtime stacks the kernel recorded for one process (run slot `run`, `ns_pid` in its
/// namespace) that `seen` does not hold yet, each marked seen as it is read: the common start
/// of every [`Instance::queue_new_stacks`]. A stack the kernel map no longer holds is skipped
/// (marked seen all the same: it cannot come back under that id with other frames).
pub fn new_stacks<'a>(
    program: &'a KernelProgram,
    ids: &'a [(u64, u32, StackId)],
    run: u32,
    ns_pid: u32,
    seen: &'a mut HashSet<StackId>,
) -> impl Iterator<Item = Arc<[u64]>> + 'a {
    ids.iter()
        .filter(move |&&(runs, pid, _)| runs & (1 << run) != 0 && pid == ns_pid)
        .filter(move |(_, _, id)| seen.insert(*id))
        .filter_map(|(_, _, id)| program.stack(*id).ok())
}

/// One process a runtime attached to (its per-process data and instance).
pub trait Instance: Send + Sync {
    /// Its runtime's tag.
    fn tag(&self) -> RuntimeTag;

    /// What the run's summary says of the process beyond its frames (CPython before 3.14
    /// running asyncio: that async stacks need 3.14); empty when nothing.
    fn notes(&self) -> Vec<String> {
        Vec::new()
    }

    /// Brings the kernel's view of the process up to date (its threads), on every maps
    /// refresh.
    fn refresh(&mut self, program: &mut KernelProgram);

    /// Queues the frames of the stacks the kernel recorded for this process (run slot `run`,
    /// `ns_pid` in its namespace; `ids` as [`KernelProgram::runtime_stack_ids`] lists them)
    /// since the last call, to be named by [`Instance::name_queued`]: reads the kernel's maps
    /// only (under the programs' lock), no memory of the process.
    fn queue_new_stacks(
        &mut self,
        program: &KernelProgram,
        ids: &[(u64, u32, StackId)],
        run: u32,
        ns_pid: u32,
    );

    /// Whether frames wait to be named.
    fn has_queued(&self) -> bool;

    /// Names queued frames, reading the live process, until this thread has spent `cpu` on it
    /// (at least one frame when any waits); returns the CPU spent.
    fn name_queued(&mut self, cpu: Duration) -> Duration;

    /// Frames still queued will not be named (the run ended): counted as left unnamed.
    fn abandon_queued(&mut self);

    /// The names the program gave its threads, by host tid (Python's `threading` names); none
    /// where the runtime keeps no names bpfprof reads.
    fn thread_names(&mut self) -> HashMap<u32, String> {
        HashMap::new()
    }

    /// Whether thread `ns_tid` (in the process's pid namespace) was listed with the runtime's
    /// state (`Some(true)`), only without it (`Some(false)`), or never (`None`, also where the
    /// runtime lists no threads).
    fn thread_listed(&self, _ns_tid: u32) -> Option<bool> {
        None
    }

    /// Whether thread `ns_tid` (in the process's pid namespace) ran none of the runtime's
    /// code during the run, so that its samples miss no runtime frames (never known where the
    /// runtime lists no threads).
    fn runs_no_runtime_code(&self, _ns_tid: u32) -> bool {
        false
    }

    /// What the bounds on reading the process left out, in words; `None` when nothing was.
    fn limits_hit(&self) -> Option<String>;

    /// Code objects read from the process so far, and the time naming frames took.
    fn naming_cost(&self) -> (usize, Duration);

    /// The frames named so far.
    fn frames(&self) -> &dyn NamedFrames;

    /// Reads the runtime frames of the waits `scanned` of `target` (the threads already off
    /// the CPU when the run took it in, whose native stacks were walked from their saved
    /// registers) into them, for [`KernelProgram::keep_waits`]; by default they keep their
    /// native stacks only.
    fn read_wait_stacks(&mut self, _target: &Target, _scanned: &mut [ScannedWait]) {}

    /// Stops following the process: what the kernel holds for it goes.
    fn stop(&mut self, program: &mut KernelProgram);
}

/// A process's named runtime frames, as aggregation reads them.
pub trait NamedFrames: Sync {
    /// Whether any frame of `stack` (as the kernel packed it) has no name.
    fn has_unnamed(&self, stack: &[u64]) -> bool;

    /// Merges `stack`'s frames into a sample's native user frames (root first, each with
    /// its address) where the runtime ran them.
    fn merge(
        &self,
        native: Vec<(Frame, Option<CodeAddress>)>,
        stack: &[u64],
        options: FrameOptions,
    ) -> Vec<(Frame, Option<CodeAddress>)>;
}

/// Offers host pid `pid` to each runtime `enabled` lets in, in [`RUNTIMES`]' order: the
/// instance of the first that attaches (see [`Runtime::attach`] for `refused` and `mapped`).
pub fn attach(
    program: &mut KernelProgram,
    pid: u32,
    naming: &Naming,
    enabled: Enabled,
    refused: &mut Option<String>,
    mapped: &[procfs::process::MemoryMap],
) -> Option<Box<dyn Instance>> {
    RUNTIMES
        .iter()
        .filter(|r| enabled.contains(r.tag()))
        .find_map(|r| r.attach(program, pid, naming, enabled, refused, mapped))
}

/// Which frames of a profile stack (root first) the view of its runtime keeps: the runtime
/// of its first runtime frame decides; a stack without runtime frames is kept whole.
pub fn view_keep(frames: &[Option<&Frame>]) -> Vec<bool> {
    let runtime = frames.iter().flatten().find_map(|f| match f.kind {
        FrameKind::Runtime(tag) => by_tag(tag),
        _ => None,
    });
    match runtime {
        Some(runtime) => runtime.view_keep(frames),
        None => vec![true; frames.len()],
    }
}

/// Which runtimes a recording reads the frames of (`--python off` leaves CPython out), and
/// whether it reads the asyncio tasks awaiting each sampled task (`--python-async`, at most
/// `--max-async-depth` of them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Enabled {
    runtimes: u64,
    /// Tasks read above a sampled task at most; 0: no task is recorded.
    async_depth: u32,
}

impl Enabled {
    /// Every runtime, with async stacks to [`cpython::asyncio::DEFAULT_MAX_ASYNC_DEPTH`].
    pub const ALL: Enabled = Enabled {
        runtimes: u64::MAX,
        async_depth: cpython::asyncio::DEFAULT_MAX_ASYNC_DEPTH as u32,
    };
    /// None.
    pub const NONE: Enabled = Enabled {
        runtimes: 0,
        async_depth: 0,
    };

    /// Whether `tag`'s frames are read.
    pub fn contains(self, tag: RuntimeTag) -> bool {
        self.runtimes & Self::bit(tag) != 0
    }

    /// These, with `tag` on or off.
    pub fn with(self, tag: RuntimeTag, on: bool) -> Enabled {
        let runtimes = if on {
            self.runtimes | Self::bit(tag)
        } else {
            self.runtimes & !Self::bit(tag)
        };
        Enabled { runtimes, ..self }
    }

    /// These, with async stacks of at most `depth` tasks, or none.
    pub fn with_async(self, depth: Option<u32>) -> Enabled {
        Enabled {
            async_depth: depth.unwrap_or(0),
            ..self
        }
    }

    /// Tasks read above a sampled task at most; `None` when async stacks are off.
    pub fn async_depth(self) -> Option<usize> {
        (self.async_depth > 0).then_some(self.async_depth as usize)
    }

    fn bit(tag: RuntimeTag) -> u64 {
        1 << (tag as u32 % 64)
    }
}

impl Default for Enabled {
    fn default() -> Enabled {
        Enabled::ALL
    }
}

/// How runtime frames are shown (`--python-glue`, `--python-gil`, `--python-view`).
#[derive(Clone, Copy, Debug, Default)]
pub struct FrameOptions {
    /// Keep the interpreter's C frames between runtime frames (`--python-glue`).
    pub keep_glue: bool,
    /// Put the thread's runtime state at the root of each stack (CPython: `[GIL held]` or
    /// `[GIL not held]`, `--python-gil`).
    pub show_gil: bool,
    /// Which outputs show the runtime's view (`--python-view`).
    pub view: View,
}

/// Which outputs show the runtimes' view (`--python-view`): each sample attributed to its
/// innermost runtime function, the interpreter's own C frames below it folded into it
/// ([`Runtime::view_keep`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum View {
    /// pstats only (snakeviz and `pstats` list Python functions); every other output keeps
    /// the interpreter's frames.
    #[default]
    Pstats,
    /// Every output.
    All,
    /// None: pstats too keeps the interpreter's frames.
    Off,
}
