//! One JVM in a recording ([`JvmTracking`], HotSpot's [`crate::runtime::Instance`]): the
//! kernel told where its code cache is and given the cache's unwind rows, rescanned on every
//! refresh; the frames the kernel recorded named while the process lives; the names merged
//! into the native stacks where the anonymous code cache frames are ([`JavaFrames`]).

use std::{
    collections::{HashMap, HashSet, VecDeque},
    hash::{Hash, Hasher},
    sync::Arc,
    time::{Duration, Instant},
};

use profiler_common::{RuntimeTag, StackId, HOTSPOT_INTERPRETED};

use super::{
    codecache::{self, BlobKind, Layout, NameCache, Scan},
    names, vmstructs,
};
use crate::{
    kernel::KernelProgram,
    profile::CodeAddress,
    runtime::{cpython::memory::ProcessMemory, FrameOptions, NamedFrames},
    symbolize::{Frame, FrameKind},
};

/// Frames of one process waiting to be named at most.
const MAX_QUEUED: usize = 1 << 18;
/// Distinct frames one process keeps names for at most.
const MAX_NAMES: usize = 1 << 20;
/// What a frame in JIT code whose code changed under it is called.
pub const REUSED: &str = "[JIT code reused]";

/// One JVM followed by a recording.
pub struct JvmTracking {
    pid: u32,
    memory: ProcessMemory,
    layout: Layout,
    blob_names: NameCache,
    scan: Scan,
    /// A hash of the blobs the kernel's rows were made from.
    rows_of: u64,
    frames: JavaFrames,
    /// Compiled pcs named so far, with the code (its start and compile id) that named them.
    compiled: HashMap<u64, (u64, i32)>,
    method_names: HashMap<u64, Option<String>>,
    named_stacks: HashSet<StackId>,
    queued: VecDeque<u64>,
    queued_set: HashSet<u64>,
    /// Frames left unnamed, by why.
    unnamed_reused: usize,
    unnamed_unknown: usize,
    queue_full: usize,
    scan_error: Option<String>,
    scan_cut: bool,
    naming_time: Duration,
    /// When the last scan of the code cache ended, and how long it took.
    scanned: Option<(Instant, Duration)>,
}

/// Scanning the code cache may take at most one part in this of one CPU: after a slow scan
/// ([`SLOW_SCAN`]), the next waits this many times its length. A process whose code heaps are full of
/// 16-byte blocks makes every scan read the 256 MiB bound; rescanned at every refresh and
/// for every pc not in a blob, that took 3.3 s of bpfprof's CPU in a 10 s run (a real JVM's
/// scan takes milliseconds, and may run again after a tenth of a second).
const SCAN_SPACING: u32 = 20;
/// A scan shorter than this runs whenever asked: a frame whose pc no blob held when it was
/// named stays unnamed, so a real JVM's (a few milliseconds) is never held back.
const SLOW_SCAN: Duration = Duration::from_millis(50);

/// A JVM's named frames, by the value the kernel recorded.
#[derive(Default)]
pub struct JavaFrames {
    names: HashMap<u64, JavaName>,
}

#[derive(Clone)]
struct JavaName {
    /// The frames one value stands for, outermost first: a compiled method's inlined
    /// callees follow it.
    frames: Vec<Frame>,
    named: bool,
}

impl JavaName {
    fn one(frame: Frame, named: bool) -> JavaName {
        JavaName {
            frames: vec![frame],
            named,
        }
    }
}

impl JvmTracking {
    /// Attaches to host pid `pid` when it runs a JVM whose `VMStructs` bpfprof can read.
    pub fn start(
        program: &mut KernelProgram,
        pid: u32,
        refused: &mut Option<String>,
    ) -> Option<JvmTracking> {
        let libjvm = match vmstructs::find_libjvm(pid) {
            Ok(Some(l)) => l,
            Ok(None) => return None,
            Err(e) => {
                log::debug!("pid {pid}: {e:#}");
                return None;
            }
        };
        let memory = ProcessMemory::new(pid);
        let layout =
            vmstructs::VmStructs::read(&libjvm, &memory).and_then(|vm| Layout::new(&vm, &memory));
        let layout = match layout {
            Ok(l) => l,
            Err(e) => {
                *refused = Some(format!(
                    "its JVM ({}) could not be read: {e:#}",
                    libjvm.path.display()
                ));
                return None;
            }
        };
        let mut tracking = JvmTracking {
            pid,
            memory,
            layout,
            blob_names: NameCache::default(),
            scan: Scan::default(),
            rows_of: 0,
            frames: JavaFrames::default(),
            compiled: HashMap::new(),
            method_names: HashMap::new(),
            named_stacks: HashSet::new(),
            queued: VecDeque::new(),
            queued_set: HashSet::new(),
            unnamed_reused: 0,
            unnamed_unknown: 0,
            queue_full: 0,
            scan_error: None,
            scan_cut: false,
            naming_time: Duration::ZERO,
            scanned: None,
        };
        if let Err(e) = tracking.rescan() {
            *refused = Some(format!("its JVM's code cache could not be read: {e:#}"));
            return None;
        }
        let kernel = tracking.scan.kernel_process(&tracking.layout);
        if let Err(e) = program.runtimes.hotspot.insert(pid, kernel, 0) {
            *refused = Some(format!("the kernel program took no JVM: {e}"));
            return None;
        }
        tracking.write_rows(program);
        log::info!(
            "pid {pid}: JVM code cache {:#x}-{:#x}, {} blobs",
            tracking.scan.bounds.0,
            tracking.scan.bounds.1,
            tracking.scan.blobs.len()
        );
        Some(tracking)
    }

    /// Reads the code cache again, and marks the compiled pcs whose code changed.
    fn rescan(&mut self) -> anyhow::Result<()> {
        if let Some((at, took)) = self.scanned {
            if took >= SLOW_SCAN && at.elapsed() < took * SCAN_SPACING {
                return Ok(());
            }
        }
        let started = Instant::now();
        let scan = codecache::scan(&self.memory, &self.layout, &mut self.blob_names);
        self.scanned = Some((Instant::now(), started.elapsed()));
        let scan = scan?;
        if scan.bounds != self.scan.bounds && !self.scan.blobs.is_empty() {
            anyhow::bail!("the code cache moved");
        }
        self.scan_cut |= scan.cut;
        self.scan = scan;
        let mut reused = Vec::new();
        for (&pc, &(begin, id)) in &self.compiled {
            if let Some(blob) = self.scan.blob_at(pc) {
                let now = match blob.kind {
                    BlobKind::Compiled { compile_id, .. } => (blob.code_begin, compile_id),
                    _ => (blob.code_begin, -1),
                };
                if now != (begin, id) {
                    reused.push(pc);
                }
            }
        }
        for pc in reused {
            self.compiled.remove(&pc);
            self.unnamed_reused += 1;
            self.frames.names.insert(
                pc,
                JavaName::one(java_frame(REUSED.into(), "[java]"), false),
            );
        }
        Ok(())
    }

    /// Gives the kernel the code cache's rows when its blobs changed.
    fn write_rows(&mut self, program: &mut KernelProgram) {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        self.scan.blobs.hash(&mut hasher);
        let hash = hasher.finish();
        if hash == self.rows_of {
            return;
        }
        self.rows_of = hash;
        let rows = self.scan.rows();
        if !program
            .unwind
            .set_jit_table(self.pid, self.scan.bounds, rows)
        {
            log::debug!("pid {}: no room for the code cache's rows", self.pid);
        }
    }

    /// Names value `value` the kernel recorded.
    fn name(&mut self, value: u64) -> JavaName {
        if value & HOTSPOT_INTERPRETED != 0 {
            let method = value & !HOTSPOT_INTERPRETED;
            return match self.method_name(method) {
                Some(name) => JavaName::one(java_frame(name, "[java interpreted]"), true),
                None => self.unknown("[unknown Java method]"),
            };
        }
        if self.scan.blob_at(value).is_none() {
            // Code compiled since the last scan.
            if let Err(e) = self.rescan() {
                self.scan_error = Some(format!("{e:#}"));
            }
        }
        let Some(blob) = self.scan.blob_at(value).cloned() else {
            return self.unknown("[unknown JIT code]");
        };
        match blob.kind {
            BlobKind::Compiled {
                method,
                compile_id,
                level,
                entry_bci,
            } => {
                let Some(name) = self.method_name(method) else {
                    return self.unknown("[unknown Java method]");
                };
                self.compiled.insert(value, (blob.code_begin, compile_id));
                let kind = match (level, entry_bci >= 0) {
                    (0, _) => "[java native wrapper]",
                    (4, false) => "[java compiled C2]",
                    (4, true) => "[java compiled C2 OSR]",
                    (_, false) => "[java compiled C1]",
                    (_, true) => "[java compiled C1 OSR]",
                };
                let mut frames = vec![java_frame(name, kind)];
                // The methods it inlined at this pc, each its own frame above it.
                let inlined = self.layout.inlining.as_ref().and_then(|inline| {
                    codecache::inlined_methods(&self.memory, inline, &blob, value)
                        .map_err(|e| log::debug!("pid {}: scopes at {value:#x}: {e:#}", self.pid))
                        .ok()
                        .flatten()
                });
                // Innermost first; the last is the compiled method itself.
                if let Some(methods) = inlined.filter(|m| m.last() == Some(&method)) {
                    for &inner in methods.iter().rev().skip(1) {
                        let name = self
                            .method_name(inner)
                            .unwrap_or_else(|| "[unknown Java method]".into());
                        let mut frame = java_frame(name, "[java inlined]");
                        frame.inlined = true;
                        frames.push(frame);
                    }
                }
                JavaName {
                    frames,
                    named: true,
                }
            }
            BlobKind::Interpreter => {
                JavaName::one(java_frame("[interpreter]".into(), "[java stub]"), true)
            }
            BlobKind::Stub(name) => {
                JavaName::one(java_frame(format!("[{name}]"), "[java stub]"), true)
            }
        }
    }

    fn unknown(&mut self, what: &str) -> JavaName {
        self.unnamed_unknown += 1;
        JavaName::one(java_frame(what.into(), "[java]"), false)
    }

    fn method_name(&mut self, method: u64) -> Option<String> {
        if let Some(name) = self.method_names.get(&method) {
            return name.clone();
        }
        let name = names::method_name(&self.memory, &self.layout.names, method)
            .map_err(|e| log::debug!("pid {}: Method* {method:#x}: {e:#}", self.pid))
            .ok();
        if self.method_names.len() < MAX_NAMES {
            self.method_names.insert(method, name.clone());
        }
        name
    }
}

/// A Java frame: `Class.method`, its kind (interpreted, compiled by C1 or C2) as its module.
fn java_frame(name: String, kind: &str) -> Frame {
    Frame::named(
        name,
        Some(kind.into()),
        FrameKind::Runtime(RuntimeTag::Hotspot),
    )
}

impl crate::runtime::Instance for JvmTracking {
    fn tag(&self) -> RuntimeTag {
        RuntimeTag::Hotspot
    }

    fn refresh(&mut self, program: &mut KernelProgram) {
        match self.rescan() {
            Ok(()) => self.write_rows(program),
            Err(e) => {
                log::debug!("pid {}: code cache: {e:#}", self.pid);
                self.scan_error = Some(format!("{e:#}"));
            }
        }
    }

    fn queue_new_stacks(
        &mut self,
        program: &KernelProgram,
        ids: &[(u64, u32, StackId)],
        run: u32,
        ns_pid: u32,
    ) {
        for values in crate::runtime::new_stacks(program, ids, run, ns_pid, &mut self.named_stacks)
        {
            for &value in values.iter() {
                if self.frames.names.contains_key(&value) || self.queued_set.contains(&value) {
                    continue;
                }
                if self.queued.len() >= MAX_QUEUED {
                    self.queue_full += 1;
                    continue;
                }
                self.queued_set.insert(value);
                self.queued.push_back(value);
            }
        }
    }

    fn has_queued(&self) -> bool {
        !self.queued.is_empty()
    }

    fn name_queued(&mut self, cpu: Duration) -> Duration {
        let started = Instant::now();
        let cpu_before = crate::clock::thread_cpu_time();
        let spent = || crate::clock::thread_cpu_time().saturating_sub(cpu_before);
        while let Some(value) = self.queued.pop_front() {
            self.queued_set.remove(&value);
            if self.frames.names.contains_key(&value) {
                continue;
            }
            let name = self.name(value);
            if self.frames.names.len() < MAX_NAMES {
                self.frames.names.insert(value, name);
            }
            if spent() >= cpu {
                break;
            }
        }
        self.naming_time += started.elapsed();
        spent()
    }

    fn abandon_queued(&mut self) {
        self.unnamed_unknown += self.queued.len();
        self.queued.clear();
        self.queued_set.clear();
    }

    fn limits_hit(&self) -> Option<String> {
        let mut parts = Vec::new();
        if self.unnamed_reused > 0 {
            parts.push(format!(
                "{} of its JIT code addresses held other code later in the run (shown as {REUSED})",
                self.unnamed_reused
            ));
        }
        if self.unnamed_unknown > 0 {
            parts.push(format!(
                "{} of its Java frames could not be named (code or methods gone before they were read)",
                self.unnamed_unknown
            ));
        }
        if self.queue_full > 0 {
            parts.push(format!(
                "{} of its Java frames were past the naming queue",
                self.queue_full
            ));
        }
        if self.scan_cut {
            parts.push(format!(
                "its code cache was larger than bpfprof reads ({} MiB)",
                codecache::MAX_SCAN_BYTES >> 20
            ));
        }
        if let Some(e) = &self.scan_error {
            parts.push(format!("its code cache could not be read: {e}"));
        }
        (!parts.is_empty()).then(|| parts.join("; "))
    }

    fn naming_cost(&self) -> (usize, Duration) {
        (self.method_names.len(), self.naming_time)
    }

    fn frames(&self) -> &dyn NamedFrames {
        &self.frames
    }

    fn stop(&mut self, program: &mut KernelProgram) {
        let _ = program.runtimes.hotspot.remove(&self.pid);
    }
}

/// Whether `frame` is one of the native walk's frames in anonymous code (the code cache), as
/// the symbolizer names it: `[anon]+0x...`, or from a perf map.
fn is_code_cache_frame(frame: &Frame) -> bool {
    frame.kind == FrameKind::User
        && matches!(
            frame.module.as_deref(),
            Some("[anon]") | Some(crate::symbolize::JIT_MODULE)
        )
}

impl NamedFrames for JavaFrames {
    fn has_unnamed(&self, stack: &[u64]) -> bool {
        stack
            .iter()
            .any(|v| !self.names.get(v).is_some_and(|n| n.named))
    }

    fn merge(
        &self,
        native: Vec<(Frame, Option<CodeAddress>)>,
        stack: &[u64],
        _options: FrameOptions,
    ) -> Vec<(Frame, Option<CodeAddress>)> {
        // The kernel recorded one value per frame it walked in the code cache, innermost
        // first: they pair with the anonymous frames of the native stack from its leaf.
        let mut values = stack.iter();
        let mut merged = Vec::with_capacity(native.len() + stack.len());
        for (frame, address) in native.into_iter().rev() {
            let name = is_code_cache_frame(&frame)
                .then(|| values.next())
                .flatten()
                .and_then(|v| self.names.get(v));
            match name {
                Some(name) => merged.extend(name.frames.iter().rev().map(|f| (f.clone(), address))),
                None => merged.push((frame, address)),
            }
        }
        merged.reverse();
        merged
    }
}

#[allow(dead_code)]
fn _assert_sync(f: Arc<JavaFrames>) -> Arc<dyn NamedFrames> {
    f
}
