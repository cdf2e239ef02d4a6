//! Waits that began before a run ([`WaitScan`]): when a run that records off-CPU time takes a
//! process in, its threads already off the CPU get a pending wait from the scan's time, as if
//! they had left the CPU then, with the stacks they wait in; and at a run's end the waits
//! still going are counted up to the end ([`KernelProgram::end_off_cpu`]). So each thread's
//! wall time in the run is whole: a thread blocked throughout shows, with its blocking stack.
//!
//! The scan (`iter/task`) reads each listed thread's state, kernel stack and saved user
//! registers and makes its pending entry in the kernel, where its switch-in finds it as any
//! other; userspace then walks the user stack from those registers over the process's memory
//! (the thread is blocked, so its stack holds still) with the walker `bpfprof dump` uses.
//! Python frames are read by the caller (the `runtime` module is above this one), and both
//! are stored under the ids the entry holds by [`KernelProgram::keep_waits`].
//!
//! A run of targets scans each target as it is added. A system-wide run scans the machine
//! once at its start ([`KernelProgram::scan_machine_waits`]); the processes it finds later are
//! found by their samples, whose waits the switch-out program has seen whole, as it sees a
//! followed child's from its fork.

use std::{
    collections::BTreeMap,
    io::Read,
    sync::Arc,
    time::{Duration, Instant},
};

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
    unwind::walk::{ProcessTables, TableCache},
};

/// Bytes of a waiting thread's stack copied at once from its stack pointer up (further reads
/// go to the process one word at a time).
const STACK_COPY_BYTES: usize = 64 * 1024;

/// The most processes whose waiting threads' user stacks a system-wide run's start walks
/// ([`KernelProgram::scan_machine_waits`]): each walk reads the process's executable objects'
/// unwind tables (each file once for all of them), so a host with thousands of blocked
/// processes would hold the run's start for seconds. The waits of the others are counted all
/// the same, on their kernel stacks.
pub const MAX_MACHINE_WAIT_WALKS: usize = 512;

/// The most time a system-wide run's start spends walking waiting threads' user stacks (the
/// same trade as [`MAX_MACHINE_WAIT_WALKS`], for slow objects and a loaded machine).
pub const MACHINE_WAIT_WALK_BUDGET: Duration = Duration::from_secs(2);

/// A thread the scan found waiting: its stacks, read from userspace, are stored by
/// [`KernelProgram::keep_waits`] unless it ran since.
#[derive(Clone, Debug)]
pub struct ScannedWait {
    /// Its process id in bpfprof's pid namespace.
    pub pid: u32,
    /// Its thread id in bpfprof's pid namespace.
    pub tid: u32,
    /// Its context switches when scanned: a thread that ran since is no longer where it
    /// waited, and its frames read now are not stored.
    switches: u64,
    /// The id its user stack goes under (0: no user registers).
    user_stack: StackId,
    /// Its native user frames, innermost first, once walked.
    user_frames: Option<Vec<u64>>,
    /// The id its Python stack goes under.
    python_stack: StackId,
    /// Its Python frames (packed, innermost first), once read.
    python_frames: Option<Vec<u64>>,
}

impl ScannedWait {
    /// Gives it the Python frames (packed, innermost first) read for it.
    pub fn set_python_frames(&mut self, frames: Vec<u64>) {
        if !frames.is_empty() && self.python_stack != 0 {
            self.python_frames = Some(frames);
        }
    }
}

/// One thread listed for a scan: global tgid and tid, and its entry.
type Listed = (u32, u32, WaitScan);

impl KernelProgram {
    /// Gives `run`'s off-CPU time the waits of `target`'s threads that are off the CPU now
    /// (call once the off-CPU program is attached and the target added, as soon as possible:
    /// a thread that wakes before the scan loses the part of its wait until then); returns
    /// them with their native user stacks walked, for the caller to add the Python frames
    /// where the process runs Python and hand them to [`Self::keep_waits`]. Best effort: a
    /// scan that cannot run is logged and the run goes on without those waits.
    pub fn scan_waits(&mut self, run: u32, target: &Target) -> Vec<ScannedWait> {
        // A launched command before its exec waits in bpfprof's own code, which is no wait of
        // its program.
        if !self.scans_waits(run) || self.awaits_exec(target.pid) {
            return Vec::new();
        }
        let started = Instant::now();
        match self.scan_target(run, target) {
            Ok(scanned) => {
                log::info!(
                    "pid {}: {} threads waiting at the start, read in {} ms",
                    target.pid,
                    scanned.len(),
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

    /// Whether `run` records off-CPU time, whose waits a scan gives.
    fn scans_waits(&self, run: u32) -> bool {
        self.off_cpu_runs & (1 << run) != 0 && self.off_cpu_tracepoint.is_some()
    }

    /// The scan of a system-wide run's start: the threads of `pids` (global ids; every process
    /// of the run's scope but bpfprof's) off the CPU now get their waits from `since_ns`, as
    /// [`Self::scan_waits`] gives a target's. One pass of the scan program per
    /// [`MAX_WAIT_SCAN`] threads; the user stacks of at most [`MAX_MACHINE_WAIT_WALKS`]
    /// processes are walked, within [`MACHINE_WAIT_WALK_BUDGET`] (each object's table built
    /// once for all). Returns the waits by process, for the caller to take those processes
    /// in (a process blocked throughout is never sampled, so nothing else would) and hand the
    /// waits to [`Self::keep_waits`].
    pub fn scan_machine_waits(
        &mut self,
        run: u32,
        pids: &[u32],
        since_ns: u64,
    ) -> BTreeMap<u32, Vec<ScannedWait>> {
        if !self.scans_waits(run) {
            return BTreeMap::new();
        }
        let started = Instant::now();
        let mut listed = Vec::new();
        for &pid in pids {
            let Ok(tids) = thread_ids(pid) else { continue };
            listed.extend(tids.into_iter().map(|tid| {
                let entry = WaitScan {
                    runs: 1 << run,
                    pid,
                    tid,
                    python: 1,
                    since_ns,
                    ..Default::default()
                };
                (pid, tid, entry)
            }));
        }
        let threads = listed.len();
        let waiting = match self.scan_listed(listed) {
            Ok(waiting) => waiting,
            Err(e) => {
                log::warn!("the waits that began before the run are missing: {e:#}");
                return BTreeMap::new();
            }
        };
        let mut by_pid: BTreeMap<u32, Vec<(u32, WaitScan)>> = BTreeMap::new();
        for (pid, tid, entry) in waiting {
            by_pid.entry(pid).or_default().push((tid, entry));
        }
        let scanned_in = started.elapsed();
        let mut cache = TableCache::new();
        let (mut walked, mut unwalked) = (0, 0);
        let out = by_pid
            .into_iter()
            .map(|(pid, entries)| {
                let walk = walked < MAX_MACHINE_WAIT_WALKS
                    && started.elapsed() < scanned_in + MACHINE_WAIT_WALK_BUDGET;
                if walk {
                    walked += 1;
                } else {
                    unwalked += 1;
                }
                let tables = walk.then_some(&mut cache);
                (pid, walk_waits(pid, &entries, tables))
            })
            .collect::<BTreeMap<_, _>>();
        let waits: usize = out.values().map(Vec::len).sum();
        log::info!(
            "{waits} threads of {} processes waiting at the start (of {threads} threads), read \
             in {} ms",
            out.len(),
            started.elapsed().as_millis()
        );
        if unwalked > 0 {
            log::info!(
                "the user stacks of {unwalked} waiting processes were not read (at most \
                 {MAX_MACHINE_WAIT_WALKS} within {} s): their waits show their kernel stacks",
                MACHINE_WAIT_WALK_BUDGET.as_secs()
            );
        }
        out
    }

    /// Stores the stacks read for the scanned waits `waits` (their native user frames, and
    /// the Python ones where given), unless their thread ran since it was scanned: one look
    /// at each thread's switch count, after every read.
    pub fn keep_waits(&mut self, waits: Vec<ScannedWait>) {
        for wait in waits {
            if wait.user_frames.is_none() && wait.python_frames.is_none() {
                continue;
            }
            if switch_count(wait.pid, wait.tid) != Some(wait.switches) {
                log::debug!(
                    "tid {} ran while its wait's stacks were read: left without them",
                    wait.tid
                );
                continue;
            }
            if let Some(frames) = wait.user_frames {
                self.unwind.note_sampled(frames.iter().copied());
                self.fresh_frames
                    .extend(crate::symbolize::lookup_addresses(&frames));
                self.offloaded_stacks
                    .insert(wait.user_stack, Arc::from(frames));
            }
            if let Some(frames) = wait.python_frames {
                self.offloaded_stacks
                    .insert(wait.python_stack, Arc::from(frames));
            }
        }
    }

    fn scan_target(&mut self, run: u32, target: &Target) -> anyhow::Result<Vec<ScannedWait>> {
        let tids = thread_ids(target.pid).map_err(|e| anyhow!("{e}"))?;
        let since_ns = self
            .targets_added_ns
            .remove(&(run, target.pid))
            .unwrap_or_default();
        let same_ns = target.pid == target.ns_pid;
        let mut listed = Vec::new();
        for tid in tids {
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
            listed.push((target.pid, tid, entry));
        }
        let waiting = self.scan_listed(listed)?;
        let entries: Vec<(u32, WaitScan)> = waiting.into_iter().map(|(_, t, e)| (t, e)).collect();
        Ok(walk_waits(
            target.pid,
            &entries,
            Some(&mut TableCache::new()),
        ))
    }

    /// Runs the scan over the threads `listed`, [`MAX_WAIT_SCAN`] at a time; returns those it
    /// found waiting (their pending entries made).
    fn scan_listed(&mut self, listed: Vec<Listed>) -> anyhow::Result<Vec<Listed>> {
        self.set_up_wait_scan()?;
        let mut waiting = Vec::new();
        for batch in listed.chunks(MAX_WAIT_SCAN as usize) {
            let mut inserted = Vec::new();
            let mut listing = Ok(());
            for &(_, tid, entry) in batch {
                if let Err(e) = self.wait_scan.insert(tid, entry, 0) {
                    listing = Err(anyhow!(e).context("listing a thread"));
                    break;
                }
                inserted.push(tid);
            }
            let read = listing.and_then(|()| self.run_wait_scan());
            for &(pid, tid, _) in batch {
                if let Ok(entry) = self.wait_scan.get(&tid, 0) {
                    if entry.outcome == WAIT_SCAN_PENDING {
                        waiting.push((pid, tid, entry));
                    }
                }
            }
            for tid in inserted {
                let _ = self.wait_scan.remove(&tid);
            }
            read?;
        }
        Ok(waiting)
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

    /// Sets the scan up ahead of the off-CPU program's attach (see [`Self::set_up_wait_scan`]),
    /// logging why it cannot be.
    pub fn prepare_wait_scan(&mut self) {
        if let Err(e) = self.set_up_wait_scan() {
            log::warn!("the waits that began before a run will be missing: {e:#}");
        }
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
        // Counted as the intervals the kernel finished are (`Counter::OffCpuIntervals`).
        *self.waits_counted_at_end.entry(run).or_default() += counted;
        if counted > 0 {
            log::debug!("{counted} waits still going at the end counted up to it");
            super::stacks::merge_counts(&mut self.offloaded_samples);
        }
    }
}

/// The scanned waits of the threads `entries` (global tid, scan entry) of process `pid`,
/// their native user stacks walked from the registers the scan read when `tables` is given
/// (the cache of object tables to build them with).
fn walk_waits(
    pid: u32,
    entries: &[(u32, WaitScan)],
    tables: Option<&mut TableCache>,
) -> Vec<ScannedWait> {
    let built = tables
        .filter(|_| entries.iter().any(|(_, e)| e.user_stack != 0))
        .and_then(|cache| match ProcessTables::build_with(pid, cache) {
            Ok(tables) => Some(tables),
            Err(e) => {
                log::info!("pid {pid}: no tables to walk its waits: {e:#}");
                None
            }
        });
    entries
        .iter()
        .map(|(tid, entry)| {
            let user_frames = built
                .as_ref()
                .filter(|_| entry.user_stack != 0)
                .map(|tables| walk_user(tables, pid, *tid, entry));
            ScannedWait {
                pid,
                tid: *tid,
                switches: entry.switches,
                user_stack: entry.user_stack,
                user_frames,
                python_stack: entry.python_stack,
                python_frames: None,
            }
        })
        .collect()
}

/// Walks the user stack of a thread the scan found waiting, from the registers it read (the
/// thread is blocked, so its stack holds still).
fn walk_user(tables: &ProcessTables, pid: u32, tid: u32, entry: &WaitScan) -> Vec<u64> {
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
    log::debug!("tid {tid}: waits in {} user frames ({end:?})", frames.len());
    frames
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
