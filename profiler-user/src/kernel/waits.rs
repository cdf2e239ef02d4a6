//! Waits that began before a run ([`WaitScan`]): when a run that records off-CPU time takes a
//! process in, its threads already off the CPU get a pending wait from the scan's time, as if
//! they had left the CPU then, with the stacks they wait in; and at a run's end the waits
//! still going are counted up to the end ([`KernelProgram::end_off_cpu`]). So each thread's
//! wall time in the run is whole: a thread blocked throughout shows, with its blocking stack.
//!
//! The scan (`iter/task`) reads each listed thread's state, kernel stack and saved user
//! registers and makes its pending entry in the kernel, where its switch-in finds it as any
//! other; userspace then walks the user stack from those registers over the process's memory
//! (the thread is blocked, so its stack holds still) with the walker `bpfprof dump` uses, and
//! stores it under the id the entry holds. Python frames are walked by the caller (the
//! `python` module is above this one) and stored with [`KernelProgram::store_wait_stack`].

use std::{io::Read, sync::Arc};

use anyhow::{anyhow, Context};
use aya::programs::{Iter, ProgramError};
use profiler_common::{
    Config, SampleKey, SampleValue, StackId, WaitScan, MAX_WAIT_SCAN, WAIT_SCAN_PENDING,
    WAIT_SCAN_PROGRAM_NAME,
};

use super::{program::KernelProgram, walker::Walker};
use crate::{
    process::{
        snapshot::{read_memory, thread_ids, Registers, StackCopy},
        target::Target,
    },
    unwind::walk::ProcessTables,
};

/// Bytes of a waiting thread's stack copied at once from its stack pointer up (further reads
/// go to the process one word at a time).
const STACK_COPY_BYTES: usize = 64 * 1024;

/// A thread the scan found waiting whose Python frames the caller is to store.
#[derive(Clone, Copy, Debug)]
pub struct ScannedWait {
    /// Its process id in bpfprof's pid namespace.
    pub pid: u32,
    /// Its thread id in bpfprof's pid namespace.
    pub tid: u32,
    /// The id its Python stack goes under.
    pub python_stack: StackId,
    /// Its context switches when scanned: a thread that ran since is no longer where it
    /// waited, and its frames read now are not stored.
    switches: u64,
}

impl KernelProgram {
    /// Gives `run`'s off-CPU time the waits of `target`'s threads that are off the CPU now
    /// (call once the off-CPU program is attached and the target added, as soon as possible:
    /// a thread that wakes before the scan loses the part of its wait until then); returns
    /// them, for the caller to store their Python frames where the process runs Python (the
    /// ids are given to every wait: one left without frames has no Python stack). Best
    /// effort: a scan that cannot run is logged and the run goes on without those waits.
    pub fn scan_waits(&mut self, run: u32, target: &Target) -> Vec<ScannedWait> {
        if self.off_cpu_runs & (1 << run) == 0 || self.off_cpu_tracepoint.is_none() {
            return Vec::new();
        }
        let started = std::time::Instant::now();
        match self.scan_target(run, target) {
            Ok((waiting, scanned)) => {
                log::info!(
                    "pid {}: {waiting} threads waiting at the start, read in {} ms",
                    target.pid,
                    started.elapsed().as_millis()
                );
                scanned
            }
            Err(e) => {
                log::warn!(
                    "pid {}: the waits that began before the run are missing: {e:#}",
                    target.pid
                );
                Vec::new()
            }
        }
    }

    /// Stores the Python `frames` (packed, innermost first) of a scanned wait, unless the
    /// thread ran since it was scanned.
    pub fn store_wait_stack(&mut self, wait: &ScannedWait, frames: Vec<u64>) {
        if frames.is_empty() || switch_count(wait.pid, wait.tid) != Some(wait.switches) {
            return;
        }
        self.offloaded_stacks
            .insert(wait.python_stack, Arc::from(frames));
    }

    fn scan_target(
        &mut self,
        run: u32,
        target: &Target,
    ) -> anyhow::Result<(usize, Vec<ScannedWait>)> {
        self.set_up_wait_scan()?;
        let tids = thread_ids(target.pid).map_err(|e| anyhow!("{e}"))?;
        let since_ns = self
            .targets_added_ns
            .remove(&(run, target.pid))
            .unwrap_or_default();
        let same_ns = target.pid == target.ns_pid;
        let mut listed = Vec::new();
        for tid in tids.into_iter().take(MAX_WAIT_SCAN as usize) {
            let ns_tid = if same_ns {
                Some(tid)
            } else {
                ns_thread_id(target.pid, tid)
            };
            let Some(ns_tid) = ns_tid else { continue };
            let entry = WaitScan {
                runs: 1 << run,
                pid: target.ns_pid,
                tid: ns_tid,
                python: 1,
                since_ns,
                ..Default::default()
            };
            self.wait_scan
                .insert(tid, entry, 0)
                .context("listing a thread")?;
            listed.push(tid);
        }
        let read = self.run_wait_scan();
        let mut found = Vec::new();
        for &tid in &listed {
            if let Ok(entry) = self.wait_scan.get(&tid, 0) {
                found.push((tid, entry));
            }
            let _ = self.wait_scan.remove(&tid);
        }
        read?;
        let waiting: Vec<(u32, WaitScan)> = found
            .into_iter()
            .filter(|(_, e)| e.outcome == WAIT_SCAN_PENDING)
            .collect();
        if waiting.iter().any(|(_, e)| e.user_stack != 0) {
            match ProcessTables::build(target.pid) {
                Ok(tables) => {
                    for (tid, entry) in &waiting {
                        self.store_user_walk(&tables, target.pid, *tid, entry);
                    }
                }
                Err(e) => log::info!("pid {}: no tables to walk its waits: {e:#}", target.pid),
            }
        }
        let scanned = waiting
            .iter()
            .filter(|(_, e)| e.python_stack != 0)
            .map(|(tid, e)| ScannedWait {
                pid: target.pid,
                tid: *tid,
                python_stack: e.python_stack,
                switches: e.switches,
            })
            .collect();
        Ok((waiting.len(), scanned))
    }

    /// Walks the user stack of a thread the scan found waiting and stores it under the id its
    /// pending entry holds, unless the thread ran meanwhile.
    fn store_user_walk(&mut self, tables: &ProcessTables, pid: u32, tid: u32, entry: &WaitScan) {
        let copy = StackCopy {
            start: entry.sp,
            bytes: read_memory(pid, entry.sp, STACK_COPY_BYTES),
        };
        let read = |addr: u64| {
            copy.read_u64(addr).or_else(|| {
                let live = read_memory(pid, addr, 8);
                Some(u64::from_le_bytes(live.try_into().ok()?))
            })
        };
        let regs = Registers {
            ip: entry.ip,
            sp: entry.sp,
            bp: entry.bp,
        };
        let (frames, end) = tables.walk(regs, read);
        if switch_count(pid, tid) != Some(entry.switches) {
            log::debug!("tid {tid} ran while its wait's stack was read: left without it");
            return;
        }
        log::debug!("tid {tid}: waits in {} user frames ({end:?})", frames.len());
        self.unwind.note_sampled(frames.iter().copied());
        self.fresh_frames
            .extend(crate::symbolize::lookup_addresses(&frames));
        self.offloaded_stacks
            .insert(entry.user_stack, Arc::from(frames));
    }

    /// Runs the scan program over every task once.
    fn run_wait_scan(&mut self) -> anyhow::Result<()> {
        let Walker::Done(loaded) = &mut self.walker else {
            return Err(anyhow!("the kernel object is still being verified"));
        };
        let program: &mut Iter = loaded
            .ebpf
            .program_mut(WAIT_SCAN_PROGRAM_NAME)
            .ok_or_else(|| anyhow!("the eBPF object has no {WAIT_SCAN_PROGRAM_NAME}"))?
            .try_into()?;
        let link = program.attach()?;
        let link = program.take_link(link)?;
        let mut file = link.into_file()?;
        // Reading runs the program over each task; it writes nothing to the file.
        let mut out = Vec::new();
        file.read_to_end(&mut out)
            .context("running the wait scan")?;
        Ok(())
    }

    /// Loads the scan program and writes the task offsets it reads, the first time (0.1-0.6 s:
    /// the kernel's BTF is read twice): called when the off-CPU program is attached, so that
    /// the scans after it start at once.
    pub(super) fn set_up_wait_scan(&mut self) -> anyhow::Result<()> {
        if self.wait_scan_setup.is_none() {
            let setup = self.load_wait_scan().map_err(|e| format!("{e:#}"));
            self.wait_scan_setup = Some(setup);
        }
        match &self.wait_scan_setup {
            Some(Ok(())) => Ok(()),
            Some(Err(e)) => Err(anyhow!("{e}")),
            None => unreachable!("set above"),
        }
    }

    fn load_wait_scan(&mut self) -> anyhow::Result<()> {
        let started = std::time::Instant::now();
        let offsets = task_offsets()?;
        for (entry, offset) in offsets {
            self.config.set(entry as u32, offset, 0)?;
        }
        self.join_walker();
        let Walker::Done(loaded) = &mut self.walker else {
            return Err(anyhow!("the kernel object is not loaded"));
        };
        let btf = aya::Btf::from_sys_fs().context("reading the kernel's BTF")?;
        let program: &mut Iter = loaded
            .ebpf
            .program_mut(WAIT_SCAN_PROGRAM_NAME)
            .ok_or_else(|| anyhow!("the eBPF object has no {WAIT_SCAN_PROGRAM_NAME}"))?
            .try_into()
            .map_err(|e: ProgramError| anyhow!(e))?;
        program
            .load("task", &btf)
            .map_err(|e| anyhow!(super::load::load_error(e, "the wait scan program")))?;
        log::info!(
            "wait scan program loaded in {} ms",
            started.elapsed().as_millis()
        );
        Ok(())
    }

    /// Counts the waits of `run` still going (pending in the kernel) up to now, on the stacks
    /// they began with, into the run's moved sample counts. Call with the run's bit already
    /// cleared from [`Config::OffCpuRuns`], so that a switch-in from now on adds nothing to it.
    pub(super) fn count_unfinished_waits(
        &mut self,
        run: u32,
        pending: &[(u32, profiler_common::OffCpuPending)],
    ) {
        let now = crate::clock::monotonic_ns();
        let min_ns = self
            .config
            .get(&(Config::OffCpuMinNs as u32), 0)
            .unwrap_or(0);
        let mut counted = 0;
        for (_, p) in pending {
            if p.key.runs & (1 << run) == 0 {
                continue;
            }
            let ns = now.saturating_sub(p.since_ns);
            if ns < min_ns {
                continue;
            }
            let key = SampleKey {
                runs: 1 << run,
                ..p.key
            };
            self.offloaded_samples.push((
                key,
                SampleValue {
                    count: 1,
                    off_cpu_ns: ns,
                },
            ));
            counted += 1;
        }
        if counted > 0 {
            log::debug!("{counted} waits still going at the end counted up to it");
            super::stacks::merge_counts(&mut self.offloaded_samples);
        }
    }
}

/// Thread `tid`'s voluntary and involuntary context switches, as `/proc` counts them (the
/// task's `nvcsw + nivcsw`, which the scan read).
fn switch_count(pid: u32, tid: u32) -> Option<u64> {
    let status = procfs::process::Process::new(pid as i32)
        .ok()?
        .task_from_tid(tid as i32)
        .ok()?
        .status()
        .ok()?;
    Some(status.voluntary_ctxt_switches? + status.nonvoluntary_ctxt_switches?)
}

/// Thread `tid`'s id in its own (innermost) pid namespace.
fn ns_thread_id(pid: u32, tid: u32) -> Option<u32> {
    let status = procfs::process::Process::new(pid as i32)
        .ok()?
        .task_from_tid(tid as i32)
        .ok()?
        .status()
        .ok()?;
    status.nspid?.last().map(|&t| t as u32)
}

/// The offsets of the `task_struct` fields the scan reads, from the kernel's BTF (btfparse
/// resolves a member path through the anonymous structs and unions `task_struct` nests).
fn task_offsets() -> anyhow::Result<Vec<(Config, u64)>> {
    const VMLINUX: &str = "/sys/kernel/btf/vmlinux";
    let bytes = std::fs::read(VMLINUX).map_err(|e| anyhow!("reading {VMLINUX}: {e}"))?;
    let btf = btfparse::TypeInformation::new(&BtfBytes(bytes))
        .map_err(|e| anyhow!("parsing {VMLINUX}: {e:?}"))?;
    let task = btf
        .id_of("task_struct")
        .ok_or_else(|| anyhow!("no task_struct in the kernel's BTF"))?;
    [
        (Config::TaskPidOffset, "pid"),
        (Config::TaskStateOffset, "__state"),
        (Config::TaskOnCpuOffset, "on_cpu"),
        (Config::TaskNvcswOffset, "nvcsw"),
        (Config::TaskNivcswOffset, "nivcsw"),
    ]
    .into_iter()
    .map(|(entry, name)| match btf.offset_of(task, name) {
        Ok((_, btfparse::Offset::ByteOffset(bytes))) => Ok((entry, u64::from(bytes))),
        Ok((_, btfparse::Offset::BitOffsetAndSize(..))) => Err(anyhow!(
            "task_struct's {name} is a bit field in the kernel's BTF"
        )),
        Err(e) => Err(anyhow!(
            "task_struct has no {name} in the kernel's BTF: {e:?}"
        )),
    })
    .collect()
}

/// The kernel's BTF in memory, read by btfparse through its `Readable` trait.
struct BtfBytes(Vec<u8>);

impl btfparse::Readable for BtfBytes {
    fn read(&self, offset: u64, buffer: &mut [u8]) -> btfparse::Result<()> {
        let range = usize::try_from(offset)
            .ok()
            .and_then(|start| Some(start..start.checked_add(buffer.len())?));
        match range.and_then(|range| self.0.get(range)) {
            Some(bytes) => {
                buffer.copy_from_slice(bytes);
                Ok(())
            }
            None => Err(btfparse::Error::new(
                btfparse::ErrorKind::EOF,
                "read past the end of the kernel's BTF",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The offsets read through btfparse are the ones bpftool prints for the running kernel's
    /// `task_struct` (the five fields are its direct members on the kernels bpfprof supports).
    #[test]
    fn task_offsets_match_bpftool() {
        let Ok(out) = std::process::Command::new("bpftool")
            .args([
                "btf",
                "dump",
                "file",
                "/sys/kernel/btf/vmlinux",
                "format",
                "raw",
            ])
            .output()
        else {
            // `cargo xtask setup` installs it; under CI nothing skips.
            assert!(std::env::var_os("CI").is_none(), "bpftool is missing");
            eprintln!("bpftool not found: skipped");
            return;
        };
        let dump = String::from_utf8_lossy(&out.stdout);
        let block: Vec<&str> = dump
            .lines()
            .skip_while(|l| !l.contains("STRUCT 'task_struct'"))
            .skip(1)
            .take_while(|l| !l.starts_with('['))
            .collect();
        let bits_of = |name: &str| -> u64 {
            let line = block
                .iter()
                .find(|l| l.trim_start().starts_with(&format!("'{name}' ")))
                .unwrap_or_else(|| panic!("bpftool shows no task_struct.{name}"));
            let bits = line.split("bits_offset=").nth(1).unwrap();
            bits.split_whitespace().next().unwrap().parse().unwrap()
        };
        let offsets = task_offsets().unwrap();
        let names = ["pid", "__state", "on_cpu", "nvcsw", "nivcsw"];
        assert_eq!(offsets.len(), names.len());
        for ((_, offset), name) in offsets.iter().zip(names) {
            assert_eq!(*offset, bits_of(name) / 8, "task_struct.{name}");
        }
    }
}
