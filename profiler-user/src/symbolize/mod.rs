//! Symbolization: instruction pointers to function names with blazesym, each unique address
//! resolved once and cached for the rest of the process's life.

pub mod debug_file;
pub mod kernel;
pub mod plt;
pub mod stripped;

use std::{
    collections::{HashMap, HashSet},
    path::PathBuf,
    sync::{mpsc, Arc, Mutex},
};

/// The module of frames named from a JIT's perf map (`perf-PID.map`).
pub const JIT_MODULE: &str = "[jit]";

/// Most addresses a [`SymbolizerThread`]'s symbolizer keeps names for before it forgets them
/// all, with its open files ([`Symbolizer::bound`]): the daemon's symbolizer serves runs for
/// as long as it lives. About 60 MB of names; a run that samples more addresses than this
/// names those forgotten again at its end.
pub const MAX_CACHED_NAMES: usize = 250_000;

use blazesym::symbolize::{
    source::{Elf, Kernel, Source},
    CodeInfo, Input, Symbolized, Symbolizer as Blazesym,
};

use crate::{
    process::{
        maps::{FileId, Location, MappedFile, ProcessMaps},
        target_file::Stable,
    },
    symbolize::debug_file::DebugSymbols,
    symbolize::kernel::KernelSymbols,
    symbolize::plt::PltStubs,
    symbolize::stripped::FunctionStarts,
};

/// Where the symbolizer keeps what it made for later bpfprof processes (the unwind table
/// cache's folder is one): entries filed under a key, checked when read.
pub trait EntryStore: Send + Sync {
    /// The key of an entry made from `inputs` (with the store's own salt).
    fn key_of(&self, inputs: &[u8]) -> [u8; 32];
    /// The bytes filed under `key`, mapped read-only, if a sound entry holds them and `check`
    /// takes them (an entry it refuses is removed).
    fn get(
        &self,
        key: &[u8; 32],
        check: &dyn Fn(&[u8]) -> anyhow::Result<()>,
    ) -> Option<memmap2::Mmap>;
    /// Files `bytes` under `key`; a failure is logged and changes nothing else.
    fn put(&self, key: &[u8; 32], bytes: &[u8]);
}

/// Addresses a recording's targets ran at since the last tick, placed in their files: what
/// is symbolized while the run goes on, so that little is left to do when it ends.
#[derive(Debug, Default)]
pub struct Warm {
    /// User addresses as (file, file offset), as [`Symbolizer::prepare_located`] takes them.
    pub user: Vec<(Arc<MappedFile>, u64)>,
    /// Kernel addresses.
    pub kernel: Vec<u64>,
}

/// Where a recording sends its [`Warm`] addresses (a symbolizer on another thread).
pub type WarmSink = Box<dyn Fn(Warm) + Send + Sync>;

/// Which side of the user/kernel boundary a frame is on, or which runtime named it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FrameKind {
    /// User-space code.
    User,
    /// Kernel code.
    Kernel,
    /// A function of a language runtime, named from the frames the kernel read from its
    /// interpreter (`crate::runtime`).
    Runtime(profiler_common::RuntimeTag),
}

/// One resolved frame. Its strings are shared ([`Arc<str>`]): the frames of one file carry
/// one module name, build id and source path, and a function's name is one string however
/// many of its addresses were sampled (at 24k unique stacks, copies per address were a fifth
/// of a run's peak memory).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Frame {
    /// Demangled function name, or `module+0xOFFSET` when it has no symbol.
    pub name: Arc<str>,
    /// The binary or kernel module the code belongs to.
    pub module: Option<Arc<str>>,
    /// User or kernel.
    pub kind: FrameKind,
    /// Whether this frame was inlined into its caller (no real call happened).
    pub inlined: bool,
    /// Source file of the function, where debug info names one.
    pub file: Option<Arc<str>>,
    /// Source line of the sampled instruction in this frame, where debug info has it.
    pub line: Option<u32>,
    /// First source line of the function (the line of its entry point), which names the
    /// function apart from the sampled line; known for functions that were really called.
    pub start_line: Option<u32>,
    /// GNU build id (hex) of the binary the frame is in, where it has one.
    pub build_id: Option<Arc<str>>,
}

impl Frame {
    /// A called (not inlined) frame with a name and no source location or build id.
    pub fn named(name: impl Into<Arc<str>>, module: Option<Arc<str>>, kind: FrameKind) -> Frame {
        Frame {
            name: name.into(),
            module,
            kind,
            inlined: false,
            file: None,
            line: None,
            start_line: None,
            build_id: None,
        }
    }
}

/// One copy of each string of the cached frames (names, modules, files, build ids), shared
/// by every frame that carries it.
#[derive(Default)]
struct SharedStrings(HashSet<Arc<str>>);

impl SharedStrings {
    /// The shared copy of `s`.
    fn get(&mut self, s: &Arc<str>) -> Arc<str> {
        if let Some(shared) = self.0.get(s) {
            return shared.clone();
        }
        self.0.insert(s.clone());
        s.clone()
    }

    /// Forgets the strings no cached frame holds any more.
    fn prune(&mut self) {
        self.0.retain(|s| Arc::strong_count(s) > 1);
    }

    /// `frames` with their strings replaced by the shared copies.
    fn share(&mut self, frames: &[Frame]) -> Arc<[Frame]> {
        let mut shared = Vec::with_capacity(frames.len());
        for f in frames {
            let mut optional = |s: &Option<Arc<str>>| s.as_ref().map(|s| self.get(s));
            let (module, file, build_id) = (
                optional(&f.module),
                optional(&f.file),
                optional(&f.build_id),
            );
            shared.push(Frame {
                name: self.get(&f.name),
                module,
                file,
                build_id,
                ..f.clone()
            });
        }
        shared.into()
    }
}

/// Turns addresses into frames, caching every answer.
pub struct Symbolizer {
    blazesym: Blazesym,
    /// (file identity, file offset) -> frames, outermost first (inlined callees after callers).
    user: HashMap<(FileId, u64), Arc<[Frame]>>,
    kernel: HashMap<u64, Arc<[Frame]>>,
    /// The core kernel's function names, read on the first kernel address (`None` until then;
    /// `Some(None)` where they are not to be had: blazesym names every kernel address).
    kernel_symbols: Option<Option<KernelSymbols>>,
    /// Where the kernel's names are kept between processes.
    kernel_cache: Option<Arc<dyn EntryStore>>,
    /// Where each file's functions start, for code no symbol covers (read on first need).
    function_starts: HashMap<FileId, Option<FunctionStarts>>,
    /// Each file's PLT stubs, which no symbol covers (read on first sight of the file).
    plt: HashMap<FileId, Option<PltStubs>>,
    /// Each stripped file's separate debug file, named from its symbol table alone (see
    /// [`debug_file`]; looked for on first sight of the file, unless lines are wanted).
    debug_files: HashMap<FileId, Option<DebugSymbols>>,
    /// Whether user frames get their function's first line (one more lookup per function).
    start_lines: bool,
    /// The path blazesym opened each file by (`/proc/self/fd/N` of its [`MappedFile`]), so
    /// that [`Self::release`] can make it close what it keeps open, with what keeps that
    /// descriptor open (and a sealed copy counted against its budget) while blazesym maps it.
    opened: HashMap<FileId, (PathBuf, Arc<Stable>)>,
    /// The strings the cached frames share.
    strings: SharedStrings,
}

impl Default for Symbolizer {
    fn default() -> Self {
        Self::new()
    }
}

impl Symbolizer {
    /// A symbolizer with inlined-function expansion on; names are demangled by
    /// [`stripped::demangle`] (blazesym's own demangling reads any name without a language
    /// as C++, so that C's `a` and `b` became `signed char` and `bool`).
    pub fn new() -> Symbolizer {
        Symbolizer {
            blazesym: new_blazesym(),
            user: HashMap::new(),
            kernel: HashMap::new(),
            kernel_symbols: None,
            kernel_cache: None,
            function_starts: HashMap::new(),
            plt: HashMap::new(),
            debug_files: HashMap::new(),
            start_lines: false,
            opened: HashMap::new(),
            strings: SharedStrings::default(),
        }
    }

    /// The same symbolizer, keeping the kernel's names in `cache` between processes (see
    /// [`kernel`]).
    pub fn with_kernel_cache(mut self, cache: Option<Arc<dyn EntryStore>>) -> Symbolizer {
        self.kernel_cache = cache;
        self
    }

    /// Forgets every open file (blazesym's cached descriptors and mappings, each file's PLT
    /// stubs and function starts), keeping the names resolved: called when a run's frames are
    /// named, so that the daemon holds no target's file (a deleted one included) past the
    /// runs that sampled it. A later run opens what it needs again.
    pub fn release(&mut self) {
        for (_, (path, _)) in self.opened.drain() {
            evict(&mut self.blazesym, path);
        }
        for debug in self.debug_files.drain().filter_map(|(_, d)| d) {
            let evict = blazesym::symbolize::evict::Evict::Elf(
                blazesym::symbolize::evict::Elf::new(debug.path),
            );
            if let Err(e) = self.blazesym.evict(&evict) {
                log::debug!("releasing a debug file: {e}");
            }
        }
        self.plt.clear();
        self.function_starts.clear();
        // Those of frames forgotten since (with lines turned on) or only in finished profiles.
        self.strings.prune();
    }

    /// Forgets the open files that no process's maps hold any more (the processes that mapped
    /// them exited and were dropped), keeping the names resolved: a sealed copy of such a file
    /// is then freed and given back to its budget. The agent's symbolizer keeps its files from
    /// window to window, and held the copies of objects of processes long gone.
    pub fn release_unmapped(&mut self) {
        let unmapped: Vec<FileId> = self
            .opened
            .iter()
            .filter(|(_, (_, held))| {
                Arc::strong_count(held) == 1
                    && match held.as_ref() {
                        Stable::Own(_) => true,
                        Stable::Copy(copy) => Arc::strong_count(copy) == 1,
                    }
            })
            .map(|(id, _)| *id)
            .collect();
        for id in unmapped {
            if let Some((path, _)) = self.opened.remove(&id) {
                evict(&mut self.blazesym, path);
            }
            self.plt.remove(&id);
            self.function_starts.remove(&id);
            if let Some(Some(debug)) = self.debug_files.remove(&id) {
                evict(&mut self.blazesym, debug.path);
            }
        }
    }

    /// Drops everything the symbolizer parsed to name addresses (each file's debug info and
    /// symbols, the kernel's symbols), keeping the names resolved, and gives the freed memory
    /// back to the system: for a symbolizer that names nothing more (the command line's, once
    /// a run's addresses are named). At 20k unique stacks of a 2 MiB binary built with `-g`,
    /// that memory was a third of the run's peak, and the profile was built beside it.
    pub fn unload(&mut self) {
        self.release();
        self.blazesym = new_blazesym();
        self.kernel_symbols = None;
        // The parsed data was freed in many small pieces that malloc keeps for reuse; this
        // returns their pages (the profile is then built in fresh ones, as needed).
        // SAFETY: malloc_trim takes no pointer; it only returns free pages to the kernel.
        unsafe { libc::malloc_trim(0) };
    }

    /// Addresses whose names are cached, and files held open.
    pub fn cache_sizes(&self) -> (usize, usize) {
        (self.user.len() + self.kernel.len(), self.opened.len())
    }

    /// Forgets every resolved name as well as every open file ([`Self::release`]): bounds the
    /// memory of a symbolizer that lives for days (the agent's).
    pub fn forget(&mut self) {
        self.release();
        self.user = HashMap::new();
        self.kernel = HashMap::new();
        self.strings = SharedStrings::default();
    }

    /// Forgets everything ([`Self::forget`]) when more than [`MAX_CACHED_NAMES`] addresses
    /// are named: a bound on a long-lived symbolizer's memory.
    pub fn bound(&mut self) {
        let (names, files) = self.cache_sizes();
        if names > MAX_CACHED_NAMES {
            log::info!("symbol caches at {names} names and {files} files: emptied");
            self.forget();
        }
    }

    /// Whether user frames get [`Frame::start_line`] (for `--line-numbers`); turning it on
    /// forgets the frames resolved without it.
    pub fn set_start_lines(&mut self, on: bool) {
        if on && !self.start_lines {
            self.user.clear();
            self.strings.prune();
            // Lines come from DWARF, which debug files are otherwise not read for.
            self.debug_files.clear();
        }
        self.start_lines = on;
    }

    /// Resolves every address of `addrs` not seen before, one batch per mapped file.
    pub fn prepare_user(&mut self, maps: &ProcessMaps, addrs: impl IntoIterator<Item = u64>) {
        self.prepare_located(
            addrs
                .into_iter()
                .filter_map(|addr| match maps.locate(addr) {
                    Location::File(file, offset) => Some((file, offset)),
                    _ => None,
                }),
        );
    }

    /// Resolves every (file, file offset) of `located` not seen before, one batch per file:
    /// what [`Self::prepare_user`] does once the addresses are placed in their files, and
    /// what a run does while it samples, so that its end finds the files' symbols loaded.
    pub fn prepare_located(&mut self, located: impl IntoIterator<Item = (Arc<MappedFile>, u64)>) {
        let mut by_file: HashMap<FileId, (Arc<MappedFile>, HashSet<u64>)> = HashMap::new();
        for (file, offset) in located {
            if !self.user.contains_key(&(file.id, offset)) {
                by_file
                    .entry(file.id)
                    .or_insert_with(|| (file.clone(), HashSet::new()))
                    .1
                    .insert(offset);
            }
        }
        for (id, (file, offsets)) in by_file {
            let offsets: Vec<u64> = offsets.into_iter().collect();
            let module = file.module_name();
            let Some((path, held)) = file.stable() else {
                for offset in offsets {
                    let frames = self
                        .strings
                        .share(&unknown(&module, offset, FrameKind::User));
                    self.user.insert((id, offset), frames);
                }
                continue;
            };
            self.opened.insert(id, (path.clone(), held));
            // A stripped system library with its debug file installed: that file's symbol
            // table, at the virtual addresses of the offsets (all of them or none).
            let start_lines = self.start_lines;
            let debug = self
                .debug_files
                .entry(id)
                .or_insert_with(|| {
                    (!start_lines)
                        .then(|| {
                            DebugSymbols::find(&path, &file.path, file.root()?, file.build_id())
                        })
                        .flatten()
                })
                .as_ref()
                .and_then(|debug| {
                    let virt: Option<Vec<u64>> =
                        offsets.iter().map(|o| debug.virt_offset(*o)).collect();
                    Some((debug.path.clone(), virt?))
                });
            let source = match &debug {
                Some((debug_path, _)) => {
                    let mut elf = Elf::new(debug_path.clone());
                    elf.debug_syms = false;
                    Source::Elf(elf)
                }
                None => Source::Elf(Elf::new(path.clone())),
            };
            let input = match &debug {
                Some((_, virt)) => Input::VirtOffset(virt.as_slice()),
                None => Input::FileOffset(offsets.as_slice()),
            };
            match self.blazesym.symbolize(&source, input) {
                Ok(results) => {
                    let build_id = file.build_id();
                    let start_lines = if self.start_lines {
                        self.function_start_lines(&source, &results)
                    } else {
                        HashMap::new()
                    };
                    let plt = self.plt.entry(id).or_insert_with(|| PltStubs::read(&path));
                    let stub_names: Vec<Option<String>> = offsets
                        .iter()
                        .map(|o| plt.as_ref().and_then(|p| p.name(*o)).map(str::to_string))
                        .collect();
                    for ((offset, result), stub) in offsets.iter().zip(results).zip(stub_names) {
                        let named_by_symbol = result.as_sym().filter(|_| stub.is_none());
                        let frames = if let Some(stub) = stub {
                            // A PLT stub: whatever symbol precedes it (`_init`) is not it.
                            renamed(&module, stub)
                        } else if named_by_symbol.is_some() {
                            to_frames(&result, &module, *offset, FrameKind::User)
                        } else {
                            // No symbol covers it (a stripped library): name its function
                            // by where it starts, so its samples share one frame.
                            let starts = self
                                .function_starts
                                .entry(id)
                                .or_insert_with(|| FunctionStarts::read(&path));
                            match starts.as_ref().and_then(|s| s.name(&module, *offset)) {
                                Some(name) => renamed(&module, name),
                                None => unknown(&module, *offset, FrameKind::User),
                            }
                        };
                        // Completed in one copy, then shared.
                        let mut frames = frames.to_vec();
                        if let Some(sym) = named_by_symbol {
                            if debug.is_some() {
                                // Of the library, not of the debug file blazesym read.
                                let library: Arc<str> = module.as_str().into();
                                for f in &mut frames {
                                    f.module = Some(library.clone());
                                }
                            }
                            if let Some(first) = frames.first_mut() {
                                first.start_line = start_lines.get(&sym.addr).copied();
                            }
                        }
                        if let Some(build_id) = build_id {
                            let build_id: Arc<str> = build_id.into();
                            for f in &mut frames {
                                f.build_id = Some(build_id.clone());
                            }
                        }
                        let frames = self.strings.share(&frames);
                        self.user.insert((id, *offset), frames);
                    }
                }
                Err(e) => {
                    log::debug!("symbolizing {}: {e}", file.path.display());
                    for offset in offsets {
                        let frames = self
                            .strings
                            .share(&unknown(&module, offset, FrameKind::User));
                        self.user.insert((id, offset), frames);
                    }
                }
            }
        }
    }

    /// Resolves what a run sampled so far (see [`Warm`]).
    pub fn warm(&mut self, warm: Warm) {
        self.prepare_located(warm.user);
        self.prepare_kernel(warm.kernel);
    }

    /// The source line of each symbol's entry point (by the symbol's address in its file), so
    /// that a function keeps one identity whichever of its lines was sampled.
    fn function_start_lines(
        &self,
        source: &Source<'_>,
        results: &[Symbolized<'_>],
    ) -> HashMap<u64, u32> {
        let mut starts: Vec<u64> = results
            .iter()
            .filter_map(|r| r.as_sym())
            .filter(|sym| sym.code_info.is_some())
            .map(|sym| sym.addr)
            .collect();
        starts.sort_unstable();
        starts.dedup();
        if starts.is_empty() {
            return HashMap::new();
        }
        match self.blazesym.symbolize(source, Input::VirtOffset(&starts)) {
            Ok(entries) => starts
                .iter()
                .zip(entries)
                .filter_map(|(addr, entry)| {
                    let line = entry.as_sym()?.code_info.as_ref()?.line?;
                    Some((*addr, line))
                })
                .collect(),
            Err(e) => {
                log::debug!("finding functions' first lines: {e}");
                HashMap::new()
            }
        }
    }

    /// The frames at user address `addr` of the process `maps` describes; never empty.
    pub fn user(&self, maps: &ProcessMaps, addr: u64) -> Arc<[Frame]> {
        let location = maps.locate(addr);
        if matches!(location, Location::Named(..) | Location::Unmapped) {
            if let Some(name) = maps.jit_symbol(addr) {
                return Arc::from([Frame::named(name, Some(JIT_MODULE.into()), FrameKind::User)]);
            }
        }
        match location {
            Location::File(file, offset) => self
                .user
                .get(&(file.id, offset))
                .cloned()
                .unwrap_or_else(|| unknown(&file.module_name(), offset, FrameKind::User)),
            Location::Named(name, offset) => match maps.vdso_symbol(offset) {
                Some(function) if name == crate::process::maps::VDSO => {
                    renamed(&name, function.to_string())
                }
                _ => unknown(&name, offset, FrameKind::User),
            },
            Location::Unmapped => unknown("[unmapped]", addr, FrameKind::User),
        }
    }

    /// Resolves every kernel address of `addrs` not seen before.
    pub fn prepare_kernel(&mut self, addrs: impl IntoIterator<Item = u64>) {
        let mut addrs: Vec<u64> = addrs
            .into_iter()
            .filter(|a| !self.kernel.contains_key(a))
            .collect();
        addrs.sort_unstable();
        addrs.dedup();
        if addrs.is_empty() {
            return;
        }
        // The core kernel text from the table kept for this boot, the rest (modules, BPF
        // programs) by blazesym, which reads /proc/kallsyms again.
        let table = self
            .kernel_symbols
            .get_or_insert_with(|| KernelSymbols::load(self.kernel_cache.as_ref()));
        if let Some(table) = table {
            addrs.retain(|addr| match table.lookup(*addr) {
                Some(name) => {
                    let frame = Frame::named(
                        stripped::demangle(name),
                        Some("[kernel]".into()),
                        FrameKind::Kernel,
                    );
                    let frames = self.strings.share(&[frame]);
                    self.kernel.insert(*addr, frames);
                    false
                }
                None => true,
            });
            table.forget_pages();
            if addrs.is_empty() {
                return;
            }
        }
        let source = Source::Kernel(Kernel::default());
        match self.blazesym.symbolize(&source, Input::AbsAddr(&addrs)) {
            Ok(results) => {
                for (addr, result) in addrs.iter().zip(results) {
                    let frames = to_frames(&result, "[kernel]", *addr, FrameKind::Kernel);
                    let frames = self.strings.share(&frames);
                    self.kernel.insert(*addr, frames);
                }
            }
            Err(e) => {
                log::warn!("kernel symbols unavailable: {e}");
                for addr in addrs {
                    self.kernel
                        .insert(addr, unknown("[kernel]", addr, FrameKind::Kernel));
                }
            }
        }
    }

    /// The frames at kernel address `addr`; never empty.
    pub fn kernel(&self, addr: u64) -> Arc<[Frame]> {
        self.kernel
            .get(&addr)
            .cloned()
            .unwrap_or_else(|| unknown("[kernel]", addr, FrameKind::Kernel))
    }
}

/// blazesym's symbolizer as bpfprof uses it: inlined functions and source lines on, names
/// demangled by bpfprof (see [`Symbolizer::new`]).
fn new_blazesym() -> Blazesym {
    Blazesym::builder()
        .enable_demangling(false)
        .enable_inlined_fns(true)
        .enable_code_info(true)
        .build()
}

type Job = Box<dyn FnOnce(&mut Symbolizer) + Send>;

/// One thread owns a symbolizer (blazesym's caches are not `Send`), so that its cache of
/// resolved addresses serves every run, and a run's sampled addresses are resolved while it
/// goes on (see [`Self::warm_sink`]); runs hand it their processing as jobs.
pub struct SymbolizerThread {
    jobs: Mutex<mpsc::Sender<Job>>,
}

impl SymbolizerThread {
    /// Starts the thread, with a symbolizer that has demangling and inlining on and keeps
    /// the kernel's names in `cache`.
    pub fn spawn(cache: Option<Arc<dyn EntryStore>>) -> std::io::Result<SymbolizerThread> {
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("symbolizer".into())
            .spawn(move || {
                let mut symbolizer = Symbolizer::new().with_kernel_cache(cache);
                for job in rx {
                    job(&mut symbolizer);
                }
            })?;
        Ok(SymbolizerThread {
            jobs: Mutex::new(tx),
        })
    }

    fn send(&self, job: Job) -> Result<(), String> {
        self.jobs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .send(job)
            .map_err(|_| "the symbolizer thread is gone".to_string())
    }

    /// Runs `f` on the symbolizer thread and waits for its result.
    pub async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Symbolizer) -> T + Send + 'static,
    ) -> Result<T, String> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.send(Box::new(move |s| {
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(s)));
            let _ = tx.send(result);
        }))?;
        match rx.await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(_)) => Err("processing panicked".into()),
            Err(_) => Err("the symbolizer thread is gone".into()),
        }
    }

    /// A sink for [`crate::recording::Recording::set_warm`]: each batch is resolved on this
    /// thread, in turn with the other jobs, and nobody waits for it.
    pub fn warm_sink(&self) -> WarmSink {
        let jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner()).clone();
        Box::new(move |warm| {
            // A gone thread fails the run's own processing, which says so.
            let _ = jobs.send(Box::new(move |s: &mut Symbolizer| {
                // A panic here would end the thread and every run's processing with it.
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    s.warm(warm);
                    s.bound();
                }));
            }));
        })
    }
}

/// The addresses to look up for a stack, leaf first: every frame but the leaf holds a return
/// address, which points after the call; one byte back lands inside the call instruction, so
/// the caller's line and inlining are right even when the call ends a function.
pub fn lookup_addresses(frames: &[u64]) -> impl Iterator<Item = u64> + '_ {
    frames
        .iter()
        .enumerate()
        .map(|(i, &ip)| if i == 0 { ip } else { ip.saturating_sub(1) })
}

fn to_frames(result: &Symbolized<'_>, module: &str, offset: u64, kind: FrameKind) -> Arc<[Frame]> {
    // A symbol with an empty name (ELF allows one) is no name: every format needs one.
    let Some(sym) = result.as_sym().filter(|s| !s.name.is_empty()) else {
        return unknown(module, offset, kind);
    };
    let module = sym
        .module
        .as_ref()
        .and_then(|m| std::path::Path::new(m).file_name())
        .map(|m| m.to_string_lossy().into_owned())
        .filter(|m| !m.chars().all(|c| c.is_ascii_digit()))
        .unwrap_or_else(|| module.to_string());
    // The real function comes first, then the functions inlined into it, outermost first.
    let mut frames = Vec::with_capacity(1 + sym.inlined.len());
    let (file, line) = code_location(sym.code_info.as_deref());
    frames.push(Frame {
        name: stripped::demangle(&sym.name).into(),
        module: Some(module.as_str().into()),
        kind,
        inlined: false,
        file,
        line,
        start_line: None,
        build_id: None,
    });
    for inlined in sym.inlined.iter().filter(|i| !i.name.is_empty()) {
        let (file, line) = code_location(inlined.code_info.as_ref());
        frames.push(Frame {
            name: stripped::demangle(&inlined.name).into(),
            module: Some(module.as_str().into()),
            kind,
            inlined: true,
            file,
            line,
            start_line: None,
            build_id: None,
        });
    }
    frames.into()
}

fn code_location(info: Option<&CodeInfo<'_>>) -> (Option<Arc<str>>, Option<u32>) {
    match info {
        Some(info) => {
            let path = match &info.dir {
                Some(dir) => dir.join(&info.file),
                None => std::path::PathBuf::from(&info.file),
            };
            (Some(path.to_string_lossy().into()), info.line)
        }
        None => (None, None),
    }
}

/// A user frame of `module` with a name of its own (a PLT stub, a function of a
/// stripped library) and no source location.
fn renamed(module: &str, name: String) -> Arc<[Frame]> {
    Arc::from([Frame::named(name, Some(module.into()), FrameKind::User)])
}

/// Makes `blazesym` close (and unmap) the file it opened by `path`.
fn evict(blazesym: &mut Blazesym, path: PathBuf) {
    let evict = blazesym::symbolize::evict::Evict::Elf(blazesym::symbolize::evict::Elf::new(path));
    if let Err(e) = blazesym.evict(&evict) {
        log::debug!("releasing a symbolized file: {e}");
    }
}

fn unknown(module: &str, offset: u64, kind: FrameKind) -> Arc<[Frame]> {
    Arc::from([Frame::named(
        format!("{module}+{offset:#x}"),
        Some(module.into()),
        kind,
    )])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_share_one_copy_of_each_string_until_no_frame_holds_it() {
        let mut strings = SharedStrings::default();
        let frame = |name: &str| Frame {
            file: Some("/src/app.c".into()),
            build_id: Some("0123abcd".into()),
            ..Frame::named(name, Some("app".into()), FrameKind::User)
        };
        let a = strings.share(&[frame("main"), frame("work")]);
        let b = strings.share(&[frame("work")]);
        assert_eq!(*a[1].name, *"work");
        assert!(Arc::ptr_eq(&a[1].name, &b[0].name), "one copy of a name");
        for (x, y) in [
            (&a[0].module, &b[0].module),
            (&a[0].file, &b[0].file),
            (&a[0].build_id, &b[0].build_id),
        ] {
            assert!(Arc::ptr_eq(x.as_ref().unwrap(), y.as_ref().unwrap()));
        }
        // "main", "work", "app", the file and the build id.
        assert_eq!(strings.0.len(), 5);
        drop(a);
        strings.prune();
        assert_eq!(strings.0.len(), 4, "main is no frame's any more");
        drop(b);
        strings.prune();
        assert!(strings.0.is_empty());
    }
}
