//! A task's chain of awaiters, read from the target's memory within its bounds.

use super::*;

/// One task as read from the process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskInfo {
    /// Its address.
    pub address: u64,
    /// Its name (`Task-3` for an unnamed one, as `Task.get_name()` says).
    pub name: String,
    /// The code object of its coroutine's own frame (0 when it has none to read).
    pub coro_code: u64,
    /// The tasks that await it, in the order its `awaited_by` gives them (a set's table
    /// order); futures that are not tasks are left out.
    pub awaited_by: Vec<u64>,
    /// Whether its set of waiters had more slots than are read.
    pub awaiters_cut: bool,
}

/// A sampled task and the tasks awaiting it, outermost first (the sampled task last).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TaskChain {
    /// Each task: its name, its coroutine's function (where it could be named), and how many
    /// tasks await it (shown under the first of them when more than one).
    pub tasks: Vec<ChainTask>,
    /// The sampled task's coroutine code object (0: unknown): its frame is the outermost of
    /// the task's own frames, below which the event loop's frames are replaced.
    pub coro_code: u64,
    /// The chain went on past the depth bound.
    pub cut: bool,
    /// The chain met a task twice (a cycle in `awaited_by`).
    pub cycle: bool,
}

/// One task of a [`TaskChain`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChainTask {
    /// Its name.
    pub name: String,
    /// Its coroutine's code object (0: unknown).
    pub coro_code: u64,
    /// That code's function name, where it could be read.
    pub coroutine: Option<String>,
    /// Tasks that await it: above 1, the chain shows it under the first.
    pub awaiters: usize,
}

impl ChainTask {
    /// The frame that stands for the task: `[task NAME] COROUTINE`, with `(awaited by N,
    /// shown under the first)` where several await it.
    pub fn frame_name(&self) -> String {
        let mut name = format!("[task {}]", self.name);
        if let Some(coroutine) = &self.coroutine {
            name.push(' ');
            name.push_str(coroutine);
        }
        if self.awaiters > 1 {
            name.push_str(&format!(
                " (awaited by {}, shown under the first)",
                self.awaiters
            ));
        }
        name
    }
}

/// Reads tasks from one process.
pub struct TaskReader<'a> {
    /// The process's memory.
    pub memory: &'a ProcessMemory,
    /// Its interpreter's layout.
    pub layout: &'a Layout,
    /// Its `_asyncio`'s.
    pub asyncio: &'a AsyncioLayout,
}

impl TaskReader<'_> {
    fn u64_at(&self, addr: u64, off: u32) -> Result<u64> {
        Ok(self.memory.read_u64(addr.wrapping_add(off as u64))?)
    }

    /// The code objects of the coroutines the task at `task` is suspended in, its own
    /// coroutine's first and then each that it awaits in turn, innermost last (`python -m
    /// asyncio pstree`'s coroutine stack): a coroutine suspended in an `await` holds the
    /// awaited object on top of its frame's value stack. Only an object of its awaiter's own
    /// type (a coroutine, not a future or task, which the task tree shows) is followed, at
    /// most [`MAX_AWAITED_COROUTINES`] deep; anything that does not read as one ends the
    /// chain where it is. A chain with a coroutine executing is none: the task runs, and its
    /// stack is the thread's (read with the process running, as `dump` reads more than
    /// [`MAX_TASKS_IN_STOP`] tasks, the task running may not be the one the thread ran when
    /// its list was read).
    pub fn awaited_coroutines(&self, task: u64) -> Vec<u64> {
        let a = self.asyncio;
        let l = self.layout;
        let code_of = |coro: u64| {
            self.u64_at(coro.wrapping_add(a.gen_iframe as u64), l.kernel.frame_code)
                .map(|c| c & !STACKREF_TAG_BITS)
                .ok()
                .filter(|&c| c != 0)
        };
        let Ok(mut coro) = self.u64_at(task, a.task_coro) else {
            return Vec::new();
        };
        let Ok(coro_type) = self.u64_at(coro, l.object_type) else {
            return Vec::new();
        };
        let mut codes = Vec::new();
        while let Some(code) = code_of(coro) {
            let state = self
                .memory
                .read_u8(coro.wrapping_add(a.gen_frame_state as u64))
                .map(|b| b as i8);
            if state.as_ref().ok() == Some(&a.executing) {
                return Vec::new();
            }
            codes.push(code);
            if codes.len() >= MAX_AWAITED_COROUTINES {
                break;
            }
            if state.ok() != Some(a.suspended_in_await) {
                break;
            }
            let frame = coro.wrapping_add(a.gen_iframe as u64);
            let Ok(top) = self.u64_at(frame, a.frame_stackpointer) else {
                break;
            };
            // The awaited object is the stack's top (3.14's `_PyFrame_StackPeek`); 3.15's
            // SEND keeps one more value above it: whichever of the two is a coroutine.
            let next = [8u64, 16].into_iter().find_map(|below| {
                let awaited =
                    self.memory.read_u64(top.wrapping_sub(below)).ok()? & !STACKREF_TAG_BITS;
                (awaited != 0
                    && awaited != coro
                    && self.u64_at(awaited, l.object_type).ok() == Some(coro_type))
                .then_some(awaited)
            });
            match next {
                Some(awaited) => coro = awaited,
                None => break,
            }
        }
        codes
    }

    /// Reads the task at `address`: `Err` when it cannot be read or is not a task.
    pub fn task(&self, address: u64) -> Result<TaskInfo> {
        let a = self.asyncio;
        ensure!(
            address != 0 && address.is_multiple_of(8),
            "task pointer {address:#x}"
        );
        let raw = self.memory.read_vec(address, a.task_size as usize)?;
        let w = |off: u32| {
            let off = off as usize;
            u64::from_ne_bytes(raw[off..off + 8].try_into().expect("within the task"))
        };
        ensure!(
            raw[a.task_is_task as usize] == 1,
            "{address:#x} is not a task"
        );
        let name = self
            .task_name(w(a.task_name))
            .unwrap_or_else(|e| format!("[unreadable name: {e}]"));
        let coro = w(a.task_coro);
        let coro_code = if coro == 0 {
            0
        } else {
            self.u64_at(
                coro.wrapping_add(a.gen_iframe as u64),
                self.layout.kernel.frame_code,
            )
            .map_or(0, |c| c & !STACKREF_TAG_BITS)
        };
        let awaited = w(a.task_awaited_by);
        let mut awaited_by = Vec::new();
        let mut awaiters_cut = false;
        if awaited != 0 {
            if raw[a.task_awaited_by_is_set as usize] != 0 {
                let (members, cut) = self.set_members(awaited)?;
                awaiters_cut = cut;
                awaited_by = members;
            } else {
                awaited_by.push(awaited);
            }
        }
        // Only tasks: a plain future awaiting (rare, by hand) has no task to show.
        awaited_by.retain(|&t| {
            self.memory
                .read_u8(t.wrapping_add(a.task_is_task as u64))
                .is_ok_and(|b| b == 1)
        });
        Ok(TaskInfo {
            address,
            name,
            coro_code,
            awaited_by,
            awaiters_cut,
        })
    }

    /// The members of the `set` at `set`, in table order, and whether its table was longer
    /// than [`MAX_SET_SLOTS`].
    fn set_members(&self, set: u64) -> Result<(Vec<u64>, bool)> {
        let a = self.asyncio;
        let mask = self.u64_at(set, a.set_mask)?;
        let table = self.u64_at(set, a.set_table)?;
        let slots = mask.saturating_add(1);
        let cut = slots > MAX_SET_SLOTS;
        let slots = slots.min(MAX_SET_SLOTS);
        let raw = self.memory.read_vec(table, (slots * 16) as usize)?;
        // A set holds each object once: a table that repeats one (a hostile process's fake
        // set of 1024 copies of one task) gives it once, else `dump` drew it 1024 times.
        let mut seen = HashSet::new();
        let members = raw
            .chunks_exact(16)
            .filter_map(|e| {
                let key = u64::from_ne_bytes(e[..8].try_into().expect("8 bytes"));
                let hash = i64::from_ne_bytes(e[8..].try_into().expect("8 bytes"));
                // A freed slot holds the dummy key with hash -1; no object hashes to -1.
                (key != 0 && hash != -1).then_some(key)
            })
            .filter(|&key| seen.insert(key))
            .collect();
        Ok((members, cut))
    }

    /// A task's name: its `str`, or `Task-N` where it is still the `int` N.
    fn task_name(&self, object: u64) -> Result<String> {
        let ty = self.u64_at(object, self.layout.object_type)?;
        let flags = self.u64_at(ty, self.asyncio.type_flags)?;
        if flags & TPFLAGS_UNICODE != 0 {
            return read_str(self.memory, self.layout, object);
        }
        ensure!(flags & TPFLAGS_LONG != 0, "neither str nor int");
        let tag = self.u64_at(object, self.asyncio.long_tag)?;
        // `lv_tag`: digits count << 3, sign in the low 2 bits (0 positive, 1 zero).
        let digits = (tag >> 3).min(3);
        let mut n: u128 = 0;
        for i in (0..digits).rev() {
            let d = self.memory.read_u32(
                object
                    .wrapping_add(self.asyncio.long_digits as u64)
                    .wrapping_add(4 * i),
            )?;
            n = (n << 30) | (d & 0x3fff_ffff) as u128;
        }
        let sign = if tag & 3 == 2 { "-" } else { "" };
        Ok(format!("Task-{sign}{n}"))
    }

    /// The chain of tasks awaiting `task` (outermost first, `task` last), through `cache`
    /// (tasks read before, by address), at most `max_depth` tasks: each step follows the first
    /// of a task's waiters; a task met twice ends it (a cycle), as does one that cannot be
    /// read.
    pub fn chain(
        &self,
        task: u64,
        max_depth: usize,
        cache: &mut HashMap<u64, TaskInfo>,
    ) -> Result<TaskChain> {
        let mut chain = TaskChain::default();
        let mut seen = HashSet::new();
        let mut at = task;
        let mut innermost_first = Vec::new();
        loop {
            if !seen.insert(at) {
                chain.cycle = true;
                break;
            }
            if innermost_first.len() >= max_depth.max(1) {
                chain.cut = true;
                break;
            }
            let info = match cache.get(&at) {
                Some(info) => info.clone(),
                None => match self.task(at) {
                    Ok(info) => {
                        cache.insert(at, info.clone());
                        info
                    }
                    // The sampled task itself: the chain is unknown.
                    Err(e) if innermost_first.is_empty() => return Err(e),
                    Err(_) => break,
                },
            };
            if innermost_first.is_empty() {
                chain.coro_code = info.coro_code;
            }
            innermost_first.push(ChainTask {
                name: info.name.clone(),
                coro_code: info.coro_code,
                // Named by the caller, which has the process's code objects.
                coroutine: None,
                awaiters: info.awaited_by.len(),
            });
            match info.awaited_by.first() {
                Some(&parent) => at = parent,
                None => break,
            }
        }
        innermost_first.reverse();
        chain.tasks = innermost_first;
        Ok(chain)
    }

    /// The tasks of the thread whose state is at `tstate` (its list, newest last), at most
    /// `limit`, its running loop (0: none) and whether the list was cut (longer than `limit`,
    /// or a node met twice, where it ends).
    pub fn thread_tasks(&self, tstate: u64, limit: usize) -> Result<(u64, Vec<u64>, bool)> {
        let a = self.asyncio;
        let running_loop = self.u64_at(tstate, a.tstate_running_loop)?;
        let head = tstate.wrapping_add(a.tstate_tasks_head as u64);
        let mut node = self.memory.read_u64(head)?;
        let mut seen = HashSet::new();
        let mut tasks = Vec::new();
        let mut cut = false;
        while node != head && node != 0 {
            if !seen.insert(node) || tasks.len() >= limit {
                cut = true;
                break;
            }
            tasks.push(node.wrapping_sub(a.task_node as u64));
            node = self.memory.read_u64(node)?;
        }
        Ok((running_loop, tasks, cut))
    }
}
