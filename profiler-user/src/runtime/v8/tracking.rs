//! One Node.js process in a recording: its V8 constants given to the kernel, the
//! SharedFunctionInfos of the frames it recorded queued and named while the process lives
//! (within the owner's naming share), and what could not be named said in the summary.

use std::{
    collections::{HashSet, VecDeque},
    sync::Arc,
    time::Duration,
};

use profiler_common::{StackId, V8Process};

use super::{
    detect::FoundV8,
    heap::{Heap, JsFunction},
    merge::{frames, V8Symbols},
};
use crate::{
    kernel::KernelProgram,
    runtime::shares::{NamingShares, Owner},
};

/// Functions of one process waiting to be named at most (as for CPython's code objects).
const MAX_QUEUED: usize = 1 << 18;

/// One V8 process whose JavaScript frames the kernel records.
pub struct V8Tracking {
    pid: u32,
    heap: Heap,
    kernel: V8Process,
    named_stacks: HashSet<StackId>,
    queued: VecDeque<u64>,
    queued_keys: HashSet<u64>,
    queue_full: u64,
    shares: Arc<NamingShares>,
    owner: Owner,
    charged: u64,
    symbols: V8Symbols,
    /// SharedFunctionInfos that could not be read as one (moved or freed since the sample).
    unnamed: u64,
    over_budget: u64,
    over_time: u64,
    naming: Duration,
}

impl V8Tracking {
    /// Registers `found` (pid `pid`'s V8) with the kernel; `None` when the kernel's map
    /// refused it.
    pub fn start(
        program: &mut KernelProgram,
        pid: u32,
        found: FoundV8,
        shares: &Arc<NamingShares>,
        owner: Owner,
    ) -> Option<V8Tracking> {
        let (major, minor, build) = found.version;
        if let Err(e) = program.runtimes.v8.processes.insert(pid, found.kernel, 0) {
            log::warn!(
                "pid {pid}: cannot register V8 {major}.{minor}.{build} with the kernel: {e}"
            );
            return None;
        }
        log::info!(
            "pid {pid}: V8 {major}.{minor}.{build} ({}): JavaScript frames on",
            found.path.display()
        );
        Some(V8Tracking {
            pid,
            heap: Heap::new(
                crate::runtime::cpython::memory::ProcessMemory::new(pid),
                found.constants,
            ),
            kernel: found.kernel,
            named_stacks: HashSet::new(),
            queued: VecDeque::new(),
            queued_keys: HashSet::new(),
            queue_full: 0,
            shares: Arc::clone(shares),
            owner,
            charged: 0,
            symbols: V8Symbols::default(),
            unnamed: 0,
            over_budget: 0,
            over_time: 0,
            naming: Duration::ZERO,
        })
    }
}

impl crate::runtime::Instance for V8Tracking {
    fn tag(&self) -> profiler_common::RuntimeTag {
        profiler_common::RuntimeTag::V8
    }

    fn refresh(&mut self, program: &mut KernelProgram) {
        // Threads need nothing: the kernel finds V8's frames on any thread's stack. The entry
        // is written again in case the map lost it (a process re-registered after an exec).
        let _ = program
            .runtimes
            .v8
            .processes
            .insert(self.pid, self.kernel, 0);
    }

    fn queue_new_stacks(
        &mut self,
        program: &KernelProgram,
        ids: &[(u64, u32, StackId)],
        run: u32,
        ns_pid: u32,
    ) {
        for stack in crate::runtime::new_stacks(program, ids, run, ns_pid, &mut self.named_stacks) {
            for frame in frames(&stack) {
                let key = frame.shared;
                if self.symbols.0.contains_key(&key) || self.queued_keys.contains(&key) {
                    continue;
                }
                if self.queued.len() >= MAX_QUEUED {
                    self.queue_full += 1;
                    continue;
                }
                self.queued_keys.insert(key);
                self.queued.push_back(key);
            }
        }
    }

    fn has_queued(&self) -> bool {
        !self.queued.is_empty()
    }

    fn name_queued(&mut self, cpu: Duration) -> Duration {
        let started = std::time::Instant::now();
        let cpu_before = crate::clock::thread_cpu_time();
        let spent = || crate::clock::thread_cpu_time().saturating_sub(cpu_before);
        while let Some(key) = self.queued.pop_front() {
            self.queued_keys.remove(&key);
            if self.symbols.0.contains_key(&key) {
                continue;
            }
            if !self.shares.has_room(self.owner) {
                self.over_budget += 1;
                continue;
            }
            match self.heap.function(key) {
                Ok(function) => {
                    let kept = (function.name.len()
                        + function.file.as_ref().map_or(0, String::len)
                        + std::mem::size_of::<(u64, JsFunction)>())
                        as u64;
                    self.shares.charge(self.owner, kept);
                    self.charged += kept;
                    self.symbols.0.insert(key, function);
                }
                Err(e) => {
                    self.unnamed += 1;
                    log::debug!("pid {}: V8 function {key:#x}: {e:#}", self.pid);
                }
            }
            if spent() >= cpu {
                break;
            }
        }
        self.naming += started.elapsed();
        spent()
    }

    fn abandon_queued(&mut self) {
        self.over_time += self.queued.len() as u64;
        self.queued.clear();
        self.queued_keys.clear();
    }

    fn limits_hit(&self) -> Option<String> {
        let mut parts = Vec::new();
        if self.unnamed > 0 {
            parts.push(format!(
                "{} JavaScript functions could not be named (their SharedFunctionInfo was \
                 moved or freed before it was read)",
                self.unnamed
            ));
        }
        if self.over_budget > 0 {
            parts.push(format!(
                "{} JavaScript functions were left unnamed: its user's runs keep the {} MiB of \
                 names a user may keep",
                self.over_budget,
                crate::runtime::shares::NAMING_BYTES_PER_OWNER >> 20
            ));
        }
        if self.over_time + self.queue_full > 0 {
            parts.push(format!(
                "{} JavaScript functions were left unnamed: naming them needed more than its \
                 user's share of the daemon's CPU during the run",
                self.over_time + self.queue_full
            ));
        }
        (!parts.is_empty()).then(|| parts.join("; "))
    }

    fn naming_cost(&self) -> (usize, Duration) {
        (self.symbols.0.len(), self.naming)
    }

    fn frames(&self) -> &dyn crate::runtime::NamedFrames {
        &self.symbols
    }

    fn stop(&mut self, program: &mut KernelProgram) {
        let _ = program.runtimes.v8.processes.remove(&self.pid);
    }
}

impl Drop for V8Tracking {
    fn drop(&mut self) {
        self.shares.release(self.owner, self.charged);
    }
}
