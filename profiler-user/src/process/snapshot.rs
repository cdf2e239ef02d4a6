//! A consistent snapshot of a live process's threads, for `bpfprof dump`: each thread's name,
//! scheduler state and kernel stack (read from `/proc` before it is stopped, since a stopped
//! thread shows the ptrace stop instead), then every thread stopped at once with ptrace
//! (`PTRACE_SEIZE` + `PTRACE_INTERRUPT`, which neither sends a signal nor leaves a trace in the
//! program), its user registers and the used part of its stack copied, a caller's reads done
//! (the Python thread states) and every thread let go. Unwinding and naming happen after the
//! threads run again, on the copies: the target is stopped only for the copies, and
//! [`Snapshot::stopped`] says for how long.

use std::{
    collections::{BTreeMap, HashSet},
    time::{Duration, Instant},
};

use crate::error::{Error, Result};

/// Most bytes of a thread's stack copied above its stack pointer while it is stopped: deeper
/// frames are read from the live process afterwards (the frames that far out are the
/// outermost, which rarely change). 512 KiB holds a deep Python stack (about 100 bytes of C
/// stack per Python call in 3.11+, 500 in 3.10) and costs about 0.1 ms to copy.
pub const MAX_STACK_COPY: u64 = 512 << 10;

/// Most kernel frames kept per thread (the kernel's own `/proc/PID/stack` bound).
const MAX_KERNEL_FRAMES: usize = 64;

/// How many times the task list is read again for threads created while the others were
/// being stopped: a process that keeps creating threads gets the ones seen by then.
const MAX_SEIZE_ROUNDS: usize = 4;

/// What `/proc` says of a thread before it is stopped.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ThreadProc {
    /// The thread's id in bpfprof's pid namespace.
    pub tid: u32,
    /// Its name (`comm`, 15 bytes at most; `pthread_setname_np` sets it).
    pub name: String,
    /// The scheduler state letter of `/proc/PID/task/TID/stat`: R running, S sleeping, D
    /// uninterruptible (disk), T stopped, t traced, Z zombie, I idle.
    pub state: char,
    /// The kernel function a sleeping thread waits in (`wchan`), where the kernel says.
    pub wchan: Option<String>,
    /// The system call a blocked thread is in, by number (`/proc/PID/task/TID/syscall`).
    pub syscall: Option<u64>,
    /// The thread's kernel stack, innermost first, as function names (root only).
    pub kernel_stack: Vec<String>,
}

/// A thread's user registers when it was stopped: what an unwinder starts from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Registers {
    /// The instruction pointer.
    pub ip: u64,
    /// The stack pointer.
    pub sp: u64,
    /// The frame pointer register (rbp).
    pub bp: u64,
}

/// Bytes of a thread's stack copied while it was stopped, from its stack pointer upwards.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StackCopy {
    /// The address of the first byte.
    pub start: u64,
    /// The bytes.
    pub bytes: Vec<u8>,
}

impl StackCopy {
    /// The 8 bytes at `addr`, when the copy holds them.
    pub fn read_u64(&self, addr: u64) -> Option<u64> {
        let at = usize::try_from(addr.checked_sub(self.start)?).ok()?;
        let word = self.bytes.get(at..at.checked_add(8)?)?;
        Some(u64::from_le_bytes(word.try_into().ok()?))
    }
}

/// One thread as it was while stopped.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoppedThread {
    /// What `/proc` said of it just before.
    pub proc: ThreadProc,
    /// Its user registers; `None` when it could not be stopped (it exited meanwhile).
    pub registers: Option<Registers>,
    /// The used part of its stack.
    pub stack: StackCopy,
    /// How long this thread was stopped.
    pub stopped: Duration,
}

/// Every thread of a process at one moment.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// The threads by tid.
    pub threads: BTreeMap<u32, StoppedThread>,
    /// How long the process was stopped: from the first thread's stop to the last one's
    /// release.
    pub stopped: Duration,
    /// How long it took every thread to reach its stop after the first was asked to (part
    /// of [`Self::stopped`]): a thread that waits for a CPU (a loaded machine) stops only
    /// once it is scheduled, and the threads stopped before it wait with it.
    pub reaching_stop: Duration,
    /// How long the caller's reads took while the threads were stopped (part of
    /// [`Self::stopped`]).
    pub reads: Duration,
}

/// The thread ids of process `pid`.
pub fn thread_ids(pid: u32) -> Result<Vec<u32>> {
    let dir = format!("/proc/{pid}/task");
    let entries = std::fs::read_dir(&dir).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Error::NoSuchProcess(format!("pid {pid} does not exist")),
        std::io::ErrorKind::PermissionDenied => Error::PermissionDenied(format!(
            "cannot read {dir}: {e} (run bpfprof as root, or with CAP_SYS_PTRACE)"
        )),
        _ => Error::Other(anyhow::anyhow!("reading {dir}: {e}")),
    })?;
    let mut tids: Vec<u32> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    tids.sort_unstable();
    Ok(tids)
}

/// What `/proc` says of thread `tid` of `pid`; `None` once it has exited.
pub fn thread_proc(pid: u32, tid: u32) -> Option<ThreadProc> {
    let dir = format!("/proc/{pid}/task/{tid}");
    let stat = procfs::process::Process::new_with_root(dir.clone().into())
        .ok()?
        .stat()
        .ok()?;
    let read = |name: &str| std::fs::read_to_string(format!("{dir}/{name}")).ok();
    let wchan = read("wchan").filter(|w| !w.is_empty() && w != "0");
    // `/proc/.../syscall` is "NR arg1 ... sp pc" for a blocked thread, "running" or "-1 sp pc"
    // otherwise.
    let syscall = read("syscall").and_then(|s| {
        let nr = s.split_whitespace().next()?;
        nr.parse::<u64>().ok()
    });
    // "[<0>] do_nanosleep+0x6c/0x190": the function name without its offset.
    let kernel_stack = read("stack")
        .map(|s| {
            s.lines()
                .filter_map(|l| {
                    let f = l.split_once("] ").map_or(l, |(_, f)| f);
                    let f = f.split('+').next()?.trim();
                    (!f.is_empty()).then(|| f.to_string())
                })
                .take(MAX_KERNEL_FRAMES)
                .collect()
        })
        .unwrap_or_default();
    Some(ThreadProc {
        tid,
        name: stat.comm,
        state: stat.state,
        wchan,
        syscall,
        kernel_stack,
    })
}

/// One thread seized by ptrace: detached (and so let go) when dropped.
struct Seized {
    tid: u32,
    interrupted_at: Instant,
    /// A signal the thread was stopped for instead of the interrupt: delivered on detach.
    pending_signal: i32,
    stopped: bool,
}

impl Drop for Seized {
    fn drop(&mut self) {
        // Only a stopped tracee can be detached: one left running stays traced.
        if !self.stopped {
            wait_stopped(self);
        }
        // SAFETY: plain ptrace request on a thread this process seized.
        unsafe {
            libc::ptrace(
                libc::PTRACE_DETACH,
                self.tid as libc::pid_t,
                0usize,
                self.pending_signal as usize,
            )
        };
    }
}

/// Seizes thread `tid` and asks it to stop.
fn seize(pid: u32, tid: u32) -> Result<Option<Seized>> {
    // SAFETY: plain ptrace requests; no memory is passed.
    let seized = unsafe { libc::ptrace(libc::PTRACE_SEIZE, tid as libc::pid_t, 0usize, 0usize) };
    if seized != 0 {
        let e = std::io::Error::last_os_error();
        return match e.raw_os_error() {
            // The thread exited meanwhile.
            Some(libc::ESRCH) => Ok(None),
            Some(libc::EPERM) => Err(Error::PermissionDenied(format!(
                "cannot stop pid {pid} to read its threads ({e}): it is being traced \
                 already (a debugger, strace, py-spy), or you may not trace it (run bpfprof \
                 as root, or with CAP_SYS_PTRACE; see kernel.yama.ptrace_scope)"
            ))),
            _ => Err(Error::Other(anyhow::anyhow!(
                "ptrace(PTRACE_SEIZE) of thread {tid}: {e}"
            ))),
        };
    }
    let mut thread = Seized {
        tid,
        interrupted_at: Instant::now(),
        pending_signal: 0,
        stopped: false,
    };
    // SAFETY: as above.
    if unsafe { libc::ptrace(libc::PTRACE_INTERRUPT, tid as libc::pid_t, 0usize, 0usize) } != 0 {
        return Ok(None);
    }
    thread.interrupted_at = Instant::now();
    Ok(Some(thread))
}

/// Waits until `thread` is stopped; false when it exited instead.
fn wait_stopped(thread: &mut Seized) -> bool {
    let mut status = 0;
    // SAFETY: waits for one traced thread; `status` outlives the call.
    let got = unsafe { libc::waitpid(thread.tid as libc::pid_t, &mut status, libc::__WALL) };
    if got != thread.tid as libc::pid_t || !libc::WIFSTOPPED(status) {
        return false;
    }
    let signal = libc::WSTOPSIG(status);
    let event = (status >> 16) & 0xff;
    // The interrupt shows as PTRACE_EVENT_STOP; a signal that arrived first stops the thread
    // in its delivery instead, and must still be delivered when the thread is let go.
    if event != libc::PTRACE_EVENT_STOP && signal != libc::SIGTRAP {
        thread.pending_signal = signal;
    }
    thread.stopped = true;
    true
}

/// The user registers of a stopped thread.
fn registers(tid: u32) -> Option<Registers> {
    // SAFETY: a zeroed user_regs_struct is valid; the kernel fills it for a stopped tracee.
    let mut regs: libc::user_regs_struct = unsafe { std::mem::zeroed() };
    // SAFETY: as above; `regs` outlives the call.
    let ok = unsafe {
        libc::ptrace(
            libc::PTRACE_GETREGS,
            tid as libc::pid_t,
            0usize,
            &mut regs as *mut libc::user_regs_struct,
        )
    } == 0;
    ok.then_some(Registers {
        ip: regs.rip,
        sp: regs.rsp,
        bp: regs.rbp,
    })
}

/// Copies `len` bytes at `addr` of process `pid`, as many as can be read.
pub fn read_memory(pid: u32, addr: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: len,
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: len,
    };
    // SAFETY: `buf` is `len` bytes long and outlives the call.
    let n = unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
    buf.truncate(n.max(0) as usize);
    buf
}

/// The end of the mapping that holds `addr` in process `pid`'s maps (`maps`: start, end).
fn mapping_end(maps: &[(u64, u64)], addr: u64) -> Option<u64> {
    maps.iter()
        .find(|(start, end)| *start <= addr && addr < *end)
        .map(|(_, end)| *end)
}

/// The address ranges process `pid` maps.
fn address_ranges(pid: u32) -> Vec<(u64, u64)> {
    procfs::process::Process::new(pid as i32)
        .and_then(|p| p.maps())
        .map(|maps| maps.iter().map(|m| m.address).collect())
        .unwrap_or_default()
}

/// Stops every thread of process `pid` at once, copies each one's registers and stack, runs
/// `reads` (reads of the process's memory that must see the same moment), and lets every
/// thread go, delivering any signal that arrived meanwhile. The threads are let go however
/// this returns (an error or a panic in `reads` included).
pub fn stop_and_copy<T>(pid: u32, reads: impl FnOnce() -> T) -> Result<(Snapshot, T)> {
    let mut procs: BTreeMap<u32, ThreadProc> = BTreeMap::new();
    for tid in thread_ids(pid)? {
        if let Some(p) = thread_proc(pid, tid) {
            procs.insert(tid, p);
        }
    }
    if procs.is_empty() {
        return Err(Error::NoSuchProcess(format!(
            "pid {pid} has no threads left"
        )));
    }
    let ranges = address_ranges(pid);
    let first_stop = Instant::now();
    let mut seized: Vec<Seized> = Vec::new();
    let mut seen: HashSet<u32> = HashSet::new();
    for _ in 0..MAX_SEIZE_ROUNDS {
        let new: Vec<u32> = thread_ids(pid)?
            .into_iter()
            .filter(|t| seen.insert(*t))
            .collect();
        if new.is_empty() {
            break;
        }
        for tid in new {
            if let Some(thread) = seize(pid, tid)? {
                seized.push(thread);
            }
        }
    }
    let mut threads = BTreeMap::new();
    let mut reaching_stop = Duration::ZERO;
    for thread in &mut seized {
        let proc = procs
            .remove(&thread.tid)
            .or_else(|| thread_proc(pid, thread.tid))
            .unwrap_or_else(|| ThreadProc {
                tid: thread.tid,
                ..ThreadProc::default()
            });
        let mut copy = StoppedThread {
            proc,
            ..StoppedThread::default()
        };
        if wait_stopped(thread) {
            reaching_stop = first_stop.elapsed();
            if let Some(regs) = registers(thread.tid) {
                let end = mapping_end(&ranges, regs.sp)
                    .unwrap_or(regs.sp + MAX_STACK_COPY)
                    .min(regs.sp.saturating_add(MAX_STACK_COPY));
                copy.stack = StackCopy {
                    start: regs.sp,
                    bytes: read_memory(pid, regs.sp, end.saturating_sub(regs.sp) as usize),
                };
                copy.registers = Some(regs);
            }
        }
        threads.insert(thread.tid, copy);
    }
    log::info!(
        "pid {pid}: {} threads stopped and copied in {:?}",
        threads.len(),
        first_stop.elapsed()
    );
    let reads_start = Instant::now();
    let out = reads();
    let reads = reads_start.elapsed();
    for thread in seized {
        let (tid, interrupted_at) = (thread.tid, thread.interrupted_at);
        // Let go by the detach in its drop: its stop ends when that returns.
        drop(thread);
        let stopped = interrupted_at.elapsed();
        if let Some(t) = threads.get_mut(&tid) {
            t.stopped = stopped;
        }
    }
    let stopped = first_stop.elapsed();
    Ok((
        Snapshot {
            threads,
            stopped,
            reaching_stop,
            reads,
        },
        out,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stack_copy_reads_only_the_words_it_holds() {
        let copy = StackCopy {
            start: 0x1000,
            bytes: (0u8..24).collect(),
        };
        assert_eq!(
            copy.read_u64(0x1008),
            Some(u64::from_le_bytes([8, 9, 10, 11, 12, 13, 14, 15]))
        );
        assert_eq!(copy.read_u64(0x1010).map(|w| w & 0xff), Some(16));
        // Past the end, straddling it, below the start.
        assert_eq!(copy.read_u64(0x1018), None);
        assert_eq!(copy.read_u64(0x1011), None);
        assert_eq!(copy.read_u64(0xff8), None);
    }

    #[test]
    fn this_process_is_listed_with_its_threads_named() {
        let pid = std::process::id();
        let tids = thread_ids(pid).unwrap();
        assert!(tids.contains(&pid));
        let me = thread_proc(pid, pid).unwrap();
        assert!(!me.name.is_empty());
        assert!(matches!(
            thread_ids(u32::MAX - 1),
            Err(Error::NoSuchProcess(_))
        ));
    }
}
