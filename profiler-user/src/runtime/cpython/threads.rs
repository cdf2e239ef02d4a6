//! The threads of a CPython process: every interpreter's thread states, read from its
//! memory with bounds on what a hostile process can make bpfprof walk
//! ([`list_thread_states`]), and each one's host tid ([`PythonTarget::thread_listing`]).

use std::collections::{HashMap, HashSet};

use anyhow::{anyhow, Context};

use super::{layout::Layout, memory::ProcessMemory, PythonTarget};
use crate::Result;

/// Most interpreters listed (the list is linked in the target's memory, which may change while
/// it is read, so a walk of it must end even on a cycle).
pub const MAX_INTERPRETERS: usize = 256;
/// Most thread states listed over all interpreters: each costs a few reads of the target's
/// memory on every refresh, under the lock that serves every user. A fake interpreter whose
/// interpreters each had a thread list looping on itself made the daemon walk 4 million
/// states per refresh (98 s of CPU, 3 GB on 3.10); real programs run tens of threads.
pub const MAX_THREAD_STATES: usize = 4096;
/// Bytes of glibc's `struct pthread` searched for the thread id.
const PTHREAD_SEARCH_BYTES: usize = 1024;
/// `offsetof(struct pthread, tid)` in glibc 2.26 and later on x86-64 (Debian 12's 2.36 too);
/// preferred when the search finds several offsets that fit.
const GLIBC_PTHREAD_TID: usize = 0x2d0;

/// One read of a CPython process's threads.
#[derive(Debug, Default)]
pub struct ThreadListing {
    /// The threads that run Python: host tid and thread state address.
    pub python: Vec<(u32, u64)>,
    /// Every task of the process: tid in its pid namespace -> host tid.
    pub tasks: HashMap<u32, u32>,
}

/// One thread state as its interpreter's list gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThreadState {
    /// Its address in the target.
    pub address: u64,
    /// Its `thread_id` (the thread's `pthread_t`).
    pub thread_id: u64,
    /// Its `native_thread_id` (the tid in the process's pid namespace), where the layout has
    /// one (3.11 and later).
    pub native_id: Option<u32>,
}

/// The thread states of every interpreter of a CPython process, as read from its memory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ThreadStates {
    /// Each state once, in list order (interpreters newest first).
    pub states: Vec<ThreadState>,
    /// Whether a list met an interpreter or a thread state twice (a cycle), and ended there.
    pub cycle: bool,
    /// Whether the listing stopped at [`MAX_INTERPRETERS`] or [`MAX_THREAD_STATES`].
    pub cut: bool,
}

/// Lists the thread states of every interpreter from `_PyRuntime` at `runtime` in `memory`,
/// with `layout`'s offsets: what the target's memory says, which its user controls, so the
/// listing ends on any cycle (each interpreter and thread state is read once, whichever list
/// leads to it) and at [`MAX_INTERPRETERS`] and [`MAX_THREAD_STATES`]; a pointer that cannot be
/// read is an error.
pub fn list_thread_states(
    memory: &ProcessMemory,
    layout: &Layout,
    runtime: u64,
) -> Result<ThreadStates> {
    let l = layout;
    let mut out = ThreadStates::default();
    let mut interp = memory
        .read_u64(runtime.wrapping_add(l.runtime_interpreters_head as u64))
        .context("read _PyRuntime.interpreters.head")?;
    let mut seen = HashSet::new();
    let mut listed = HashSet::new();
    while interp != 0 {
        if !seen.insert(interp) {
            out.cycle = true;
            break;
        }
        if seen.len() > MAX_INTERPRETERS {
            out.cut = true;
            break;
        }
        let mut tstate = memory.read_u64(interp.wrapping_add(l.interp_threads_head as u64))?;
        while tstate != 0 {
            if !listed.insert(tstate) {
                out.cycle = true;
                break;
            }
            if listed.len() > MAX_THREAD_STATES {
                out.cut = true;
                break;
            }
            let thread_id = memory.read_u64(tstate.wrapping_add(l.tstate_thread_id as u64))?;
            let native_id = match l.tstate_native_thread_id {
                Some(off) => Some(memory.read_u64(tstate.wrapping_add(off as u64))? as u32),
                None => None,
            };
            out.states.push(ThreadState {
                address: tstate,
                thread_id,
                native_id,
            });
            tstate = memory.read_u64(tstate.wrapping_add(l.tstate_next as u64))?;
        }
        if out.cut {
            break;
        }
        interp = memory.read_u64(interp.wrapping_add(l.interp_next as u64))?;
    }
    Ok(out)
}

impl PythonTarget {
    /// Host tid -> PyThreadState address for every thread of every interpreter.
    ///
    /// One entry per thread: of a thread's states in several interpreters, the first with a
    /// frame, newest interpreter first (where a thread that entered a subinterpreter runs).
    pub fn threads(&mut self) -> Result<Vec<(u32, u64)>> {
        Ok(self.thread_listing()?.python)
    }

    /// [`PythonTarget::threads`], and every task of the process read for it: tid in its own
    /// pid namespace -> host tid (the threads that run Python and those that do not).
    pub fn thread_listing(&mut self) -> Result<ThreadListing> {
        let listed = list_thread_states(&self.memory, &self.layout, self.interpreter.runtime)?;
        self.limits.cycles += u64::from(listed.cycle);
        self.limits.threads_cut += u64::from(listed.cut);
        let states: Vec<(u64, u64, Option<u32>)> = listed
            .states
            .iter()
            .map(|t| (t.address, t.thread_id, t.native_id))
            .collect();
        let to_host = self.namespace_tids()?;
        let ns_tids: Vec<u32> = if states.iter().all(|s| s.2.is_some()) {
            states.iter().map(|s| s.2.unwrap_or(0)).collect()
        } else {
            self.tids_from_pthreads(&states, &to_host)?
        };
        // A thread that entered other interpreters (subinterpreters) has a thread state in
        // each; the kernel's map holds one per thread: the first one with a frame, in list
        // order (newest interpreter first, where a thread that switched interpreters runs now).
        let mut out: Vec<(u32, u64)> = Vec::new();
        let mut chosen: HashMap<u32, (usize, bool)> = HashMap::new();
        for (&(tstate, _, _), ns_tid) in states.iter().zip(ns_tids) {
            // A thread state whose thread has exited (or not yet started) has no task.
            let Some(&host) = to_host.get(&ns_tid) else {
                continue;
            };
            let has_frame = self.current_frame(tstate).is_ok_and(|f| f != 0);
            match chosen.get(&host) {
                None => {
                    chosen.insert(host, (out.len(), has_frame));
                    out.push((host, tstate));
                }
                Some(&(at, false)) if has_frame => {
                    out[at] = (host, tstate);
                    chosen.insert(host, (at, true));
                }
                Some(_) => {}
            }
        }
        Ok(ThreadListing {
            python: out,
            tasks: to_host,
        })
    }

    /// The innermost frame of the thread state at `tstate` (0 when it runs no Python), read as
    /// the kernel reads it.
    pub(super) fn current_frame(&self, tstate: u64) -> Result<u64> {
        let k = self.layout.kernel;
        let mut frame = self
            .memory
            .read_u64(tstate.wrapping_add(k.tstate_frame as u64))
            .with_context(|| format!("pid {}: read thread state {tstate:#x}", self.pid))?;
        if self.layout.has_cframe() && frame != 0 {
            frame = self
                .memory
                .read_u64(frame.wrapping_add(k.cframe_current_frame as u64))
                .with_context(|| format!("pid {}: read _PyCFrame {frame:#x}", self.pid))?;
        }
        Ok(frame)
    }

    /// The process's threads: tid in its own pid namespace -> tid in bpfprof's (the kernel's
    /// thread map is keyed by the host's tid), from each task's `NSpid` line, which lists the
    /// ids from the reader's namespace inwards.
    fn namespace_tids(&self) -> Result<HashMap<u32, u32>> {
        let dir = format!("/proc/{}/task", self.pid);
        let mut map = HashMap::new();
        for entry in std::fs::read_dir(&dir).with_context(|| format!("read {dir}"))? {
            let entry = entry.with_context(|| format!("read {dir}"))?;
            let Some(host) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            // A thread may exit between the listing and this read.
            let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else {
                continue;
            };
            let inner = status
                .lines()
                .find_map(|l| l.strip_prefix("NSpid:"))
                .and_then(|ids| ids.split_whitespace().last()?.parse::<u32>().ok())
                .unwrap_or(host);
            map.insert(inner, host);
        }
        Ok(map)
    }

    /// 3.10: each thread's tid (in its namespace) from its `pthread_t`, which glibc makes the
    /// address of the thread's `struct pthread`. The offset of `tid` in that struct differs
    /// between glibc versions and libc's debug info is rarely installed, so it is found from the
    /// data: a 4-byte-aligned offset at which every thread's struct holds either a distinct id
    /// of one of the process's tasks or 0 (the kernel clears it when a thread exits), at least
    /// one being the process's own id (its main thread runs Python in all but embedded
    /// interpreters, for which that condition is dropped). Among several, glibc 2.26+'s offset
    /// on x86-64 wins, then the smallest. Found once per process.
    fn tids_from_pthreads(
        &mut self,
        states: &[(u64, u64, Option<u32>)],
        to_host: &HashMap<u32, u32>,
    ) -> Result<Vec<u32>> {
        let blocks: Vec<Option<Vec<u8>>> = states
            .iter()
            .map(|&(_, pthread, _)| self.memory.read_vec(pthread, PTHREAD_SEARCH_BYTES).ok())
            .collect();
        // One struct per thread, however many interpreters the thread has a state in.
        let mut unique_threads = HashSet::new();
        let unique: Vec<&Vec<u8>> = states
            .iter()
            .zip(&blocks)
            .filter(|((_, pthread, _), _)| unique_threads.insert(*pthread))
            .filter_map(|(_, block)| block.as_ref())
            .collect();
        let at = |block: &[u8], off: usize| -> u32 {
            u32::from_ne_bytes(block[off..off + 4].try_into().expect("4 bytes"))
        };
        if self.pthread_tid_offset.is_none() {
            let ns_pid = to_host
                .iter()
                .find(|&(_, &host)| host == self.pid)
                .map(|(&inner, _)| inner);
            let readable = &unique;
            let fits = |off: &usize, need_pid: bool| {
                let ids: Vec<u32> = readable.iter().map(|b| at(b, *off)).collect();
                let live: Vec<u32> = ids.iter().copied().filter(|&id| id != 0).collect();
                let distinct: HashSet<u32> = live.iter().copied().collect();
                !live.is_empty()
                    && distinct.len() == live.len()
                    && live.iter().all(|id| to_host.contains_key(id))
                    && (!need_pid || ns_pid.is_some_and(|pid| live.contains(&pid)))
            };
            let offsets = || (0..=PTHREAD_SEARCH_BYTES - 4).step_by(4);
            let mut candidates: Vec<usize> = offsets().filter(|o| fits(o, true)).collect();
            if candidates.is_empty() {
                candidates = offsets().filter(|o| fits(o, false)).collect();
            }
            let offset = candidates
                .iter()
                .copied()
                .find(|&o| o == GLIBC_PTHREAD_TID)
                .or(candidates.first().copied())
                .ok_or_else(|| {
                    anyhow!(
                        "pid {}: cannot find the tid in glibc's struct pthread of its {} Python threads",
                        self.pid,
                        readable.len()
                    )
                })?;
            log::debug!(
                "pid {}: struct pthread keeps the tid at {offset} (candidates {candidates:?})",
                self.pid
            );
            self.pthread_tid_offset = Some(offset as u64);
        }
        let offset = self.pthread_tid_offset.unwrap_or(0) as usize;
        Ok(blocks
            .iter()
            .map(|b| b.as_ref().map_or(0, |b| at(b, offset)))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::cpython::layout;

    /// A memory image in this process: `words` 8-byte words, written by `(word, value)`, with
    /// `at(word)` the address of a word.
    struct Image(Vec<u64>);

    impl Image {
        fn at(&self, word: usize) -> u64 {
            self.0.as_ptr() as u64 + 8 * word as u64
        }

        fn set(&mut self, field_at: u64, value: u64) {
            let word = (field_at - self.at(0)) as usize / 8;
            self.0[word] = value;
        }
    }

    #[test]
    fn thread_lists_that_loop_are_read_once_per_state_and_wild_pointers_are_errors() {
        let layout = layout::table(12).expect("3.12 is tabled");
        let mut image = Image(vec![0; 4096]);
        // _PyRuntime at word 0; interpreters at words 1000 and 2000; thread states at 3000
        // and 3500. Interpreter A's list: t1 -> t2 -> t1 (a loop); its next is B, whose list
        // leads to t2 again, and whose next is A (another loop).
        let (runtime, a, b, t1, t2) = (
            image.at(0),
            image.at(1000),
            image.at(2000),
            image.at(3000),
            image.at(3500),
        );
        image.set(runtime + u64::from(layout.runtime_interpreters_head), a);
        image.set(a + u64::from(layout.interp_threads_head), t1);
        image.set(a + u64::from(layout.interp_next), b);
        image.set(b + u64::from(layout.interp_threads_head), t2);
        image.set(b + u64::from(layout.interp_next), a);
        image.set(t1 + u64::from(layout.tstate_next), t2);
        image.set(t2 + u64::from(layout.tstate_next), t1);
        image.set(t1 + u64::from(layout.tstate_thread_id), 11);
        image.set(t2 + u64::from(layout.tstate_thread_id), 22);
        let memory = ProcessMemory::new(std::process::id());
        let listed = list_thread_states(&memory, &layout, runtime).unwrap();
        let addresses: Vec<u64> = listed.states.iter().map(|t| t.address).collect();
        assert_eq!(addresses, [t1, t2]);
        assert_eq!(listed.states[1].thread_id, 22);
        assert!(listed.cycle && !listed.cut);
        // A next pointer into unmapped memory ends the listing with an error.
        image.set(t2 + u64::from(layout.tstate_next), 0x10);
        assert!(list_thread_states(&memory, &layout, runtime).is_err());
    }
}
