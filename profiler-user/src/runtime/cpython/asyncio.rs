//! asyncio tasks (CPython 3.14 and later): which task a thread runs, and the tasks that await
//! it, read from the process's memory as `python -m asyncio pstree` reads them.
//!
//! CPython 3.14 keeps, in each thread's state, the task the thread runs
//! (`asyncio_running_task`) and the loop it runs (`asyncio_running_loop`), and describes its
//! `_asyncio` module's objects in `_Py_AsyncioModuleDebugOffsets`, a struct in the module's
//! `.AsyncioDebug` section (in `_asyncio.cpython-3XX-*.so`, or in the interpreter where the
//! module is built in, as Debian's 3.15 does): a task's name, coroutine, `awaited_by` (one
//! task, or a `set` of them), and the thread's list of tasks. The kernel program records the
//! running task of each Python sample ([`AsyncioLayout::kernel_fields`]); userspace reads the
//! chain of tasks that await it ([`TaskReader::chain`]) and puts it in place of the event
//! loop's frames ([`super::merge`]).
//!
//! What the process's memory says is its user's: every read is bounded, every chain ends on a
//! cycle or at its depth bound, and a task that cannot be read ends its chain there.

use std::collections::{HashMap, HashSet};

use anyhow::{anyhow, ensure};

use super::{code::read_str, layout::Layout, memory::ProcessMemory};
use anyhow::Result;

/// The section `_asyncio` describes its objects in.
pub const ASYNCIO_DEBUG_SECTION: &str = ".AsyncioDebug";
/// The first CPython whose thread states say which asyncio task they run.
pub const FIRST_ASYNC_MINOR: u8 = 14;
/// What the summary says of a Python process before 3.14 that runs asyncio.
pub const NEEDS_314: &str = "asyncio task stacks need CPython 3.14 or later (its thread \
     states say which task runs); its samples show the event loop's frames";

/// Default of `--max-async-depth`: tasks shown above a sampled task's own frames at most.
pub const DEFAULT_MAX_ASYNC_DEPTH: usize = 64;
/// Slots of an `awaited_by` set read at most (a real one holds a few waiters).
const MAX_SET_SLOTS: u64 = 1024;
/// Coroutines of one task's await chain `dump` reads at most.
const MAX_AWAITED_COROUTINES: usize = 256;
/// Tasks one thread's list gives `dump` at most.
pub const MAX_TASKS_LISTED: usize = 100_000;
/// Tasks of a thread `dump` reads while the process is stopped, at most: each costs a dozen
/// reads of its memory or more (its object, name, waiters and coroutines: 60-70 µs a task in
/// a debug build beside a busy core, 900 tasks 53-68 ms), and a process of more is not held
/// stopped that long (its tasks are read once it runs again).
pub const MAX_TASKS_IN_STOP: usize = 256;
/// Largest `TaskObj` read (3.14's is 168 bytes).
const MAX_TASK_SIZE: u64 = 4096;
/// Bytes of `_Py_AsyncioModuleDebugOffsets` read: its task (7 words), interpreter (2) and
/// thread (4) sections.
const ASYNCIO_DEBUG_BYTES: usize = 13 * 8;
/// `Py_TPFLAGS_LONG_SUBCLASS` and `Py_TPFLAGS_UNICODE_SUBCLASS`: what a task's name is (an
/// `int`, the task's number, until something asks for its name; a `str` once named).
const TPFLAGS_LONG: u64 = 1 << 24;
const TPFLAGS_UNICODE: u64 = 1 << 28;
/// `_PyStackRef`'s tag bits, cleared from a frame's `f_executable`.
const STACKREF_TAG_BITS: u64 = profiler_common::PYTHON_STACKREF_TAG_BITS;

mod dump;
mod tasks;

pub use dump::*;
pub use tasks::*;

/// Where CPython 3.14+ keeps what the task reader reads: `_Py_AsyncioModuleDebugOffsets`,
/// and the few `_Py_DebugOffsets` fields bpfprof's frame layout does not need (generator,
/// `set`, `int` and type flags).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AsyncioLayout {
    /// `sizeof(TaskObj)`.
    pub task_size: u32,
    /// `TaskObj.task_name`: a `str`, or the task's number (an `int`) until it is asked for.
    pub task_name: u32,
    /// `TaskObj.task_awaited_by`: the task awaiting it, or a `set` of them.
    pub task_awaited_by: u32,
    /// A `char`: 1 in a task, 0 in a plain future.
    pub task_is_task: u32,
    /// A `char`: `task_awaited_by` is a `set` (several waiters), not the waiter itself.
    pub task_awaited_by_is_set: u32,
    /// `TaskObj.task_coro`: its coroutine.
    pub task_coro: u32,
    /// The task's node in its thread's list of tasks (`struct llist_node`).
    pub task_node: u32,
    /// In the thread state (`_PyThreadStateImpl`): the loop it runs.
    pub tstate_running_loop: u32,
    /// The task it runs.
    pub tstate_running_task: u32,
    /// The head of its list of tasks (`struct llist_node`).
    pub tstate_tasks_head: u32,
    /// `PyGenObject.gi_iframe`: the coroutine's own frame, inside the object.
    pub gen_iframe: u32,
    /// `PyGenObject.gi_frame_state`: an `int8_t`, [`AsyncioLayout::suspended_in_await`]
    /// while the coroutine waits in an `await` (a `yield from`).
    pub gen_frame_state: u32,
    /// `_PyInterpreterFrame.stackpointer`: where the object a coroutine suspended in an
    /// `await` awaits lies, just below it.
    pub frame_stackpointer: u32,
    /// `FRAME_SUSPENDED_YIELD_FROM`: -1 in 3.14, 2 in 3.15 (which renumbered the states).
    pub suspended_in_await: i8,
    /// `FRAME_EXECUTING`: 0 in 3.14, 4 in 3.15.
    pub executing: i8,
    /// `PySetObject.used`.
    pub set_used: u32,
    /// `PySetObject.table`: 16-byte entries (key, hash).
    pub set_table: u32,
    /// `PySetObject.mask`: the table's slots less one.
    pub set_mask: u32,
    /// `PyLongObject.long_value.lv_tag`.
    pub long_tag: u32,
    /// `PyLongObject.long_value.ob_digit`: 30-bit digits in 32-bit words.
    pub long_digits: u32,
    /// `PyTypeObject.tp_flags`.
    pub type_flags: u32,
}

/// Word index in `_Py_DebugOffsets` of the size of the type, `set`, `int` and generator
/// sections, by shape (3.14's and 3.15's, from `pycore_debug_offsets.h` and checked against
/// sid's interpreters): the frame layout's `Shape` stops at the `str` section, and these
/// follow the sections it knows.
struct ExtraSections {
    /// The interpreter frame's section (the frame layout's, read again for `stackpointer`).
    frame_section: usize,
    type_section: usize,
    set_section: usize,
    long_section: usize,
    gen_section: usize,
}

const EXTRA_314: ExtraSections = ExtraSections {
    frame_section: 31,
    type_section: 52,
    set_section: 62,
    long_section: 71,
    gen_section: 83,
};
const EXTRA_315: ExtraSections = ExtraSections {
    frame_section: 39,
    type_section: 60,
    set_section: 74,
    long_section: 83,
    gen_section: 99,
};

/// Largest struct size a section may state (an interpreter state is about 220 KiB).
const MAX_STATED_SIZE: u64 = 1 << 20;

impl AsyncioLayout {
    /// The layout from `_Py_AsyncioModuleDebugOffsets` (`asyncio`, read from the process) and
    /// `_Py_DebugOffsets` (`debug`, the first bytes of `_PyRuntime`) of a CPython 3.`minor`,
    /// each offset checked to lie within the size its section states, aligned to its width.
    pub fn parse(asyncio: &[u8], debug: &[u8], minor: u8) -> Result<AsyncioLayout> {
        ensure!(
            minor >= FIRST_ASYNC_MINOR,
            "CPython 3.{minor} has no asyncio debug offsets"
        );
        ensure!(
            asyncio.len() >= ASYNCIO_DEBUG_BYTES,
            "_Py_AsyncioModuleDebugOffsets: {} bytes",
            asyncio.len()
        );
        let word = |raw: &[u8], i: usize| -> Result<u64> {
            raw.get(i * 8..i * 8 + 8)
                .map(|b| u64::from_ne_bytes(b.try_into().expect("8 bytes")))
                .ok_or_else(|| anyhow!("debug offsets end before word {i}"))
        };
        // Field `field` (1-based after the size) of the section whose size is word `size_at`.
        let field = |raw: &[u8], size_at: usize, field: usize, width: u64| -> Result<u32> {
            let size = word(raw, size_at)?;
            ensure!(
                size > 0 && size <= MAX_STATED_SIZE,
                "implausible struct size {size:#x} at word {size_at}"
            );
            let value = word(raw, size_at + field)?;
            ensure!(
                value.checked_add(width).is_some_and(|end| end <= size)
                    && value.is_multiple_of(width.min(8)),
                "offset {value:#x} at word {} is not a {width}-byte field within {size} bytes",
                size_at + field
            );
            Ok(value as u32)
        };
        let extra = if minor == 14 { &EXTRA_314 } else { &EXTRA_315 };
        let task_size = word(asyncio, 0)?;
        ensure!(
            task_size <= MAX_TASK_SIZE,
            "implausible TaskObj size {task_size}"
        );
        let layout = AsyncioLayout {
            task_size: task_size as u32,
            task_name: field(asyncio, 0, 1, 8)?,
            task_awaited_by: field(asyncio, 0, 2, 8)?,
            task_is_task: field(asyncio, 0, 3, 1)?,
            task_awaited_by_is_set: field(asyncio, 0, 4, 1)?,
            task_coro: field(asyncio, 0, 5, 8)?,
            task_node: field(asyncio, 0, 6, 8)?,
            tstate_running_loop: field(asyncio, 9, 1, 8)?,
            tstate_running_task: field(asyncio, 9, 2, 8)?,
            tstate_tasks_head: field(asyncio, 9, 3, 16)?,
            gen_iframe: field(debug, extra.gen_section, 2, 8)?,
            gen_frame_state: field(debug, extra.gen_section, 3, 1)?,
            frame_stackpointer: field(debug, extra.frame_section, 6, 8)?,
            suspended_in_await: if minor == 14 { -1 } else { 2 },
            executing: if minor == 14 { 0 } else { 4 },
            set_used: field(debug, extra.set_section, 1, 8)?,
            set_table: field(debug, extra.set_section, 2, 8)?,
            set_mask: field(debug, extra.set_section, 3, 8)?,
            long_tag: field(debug, extra.long_section, 1, 8)?,
            long_digits: field(debug, extra.long_section, 2, 4)?,
            type_flags: field(debug, extra.type_section, 3, 8)?,
        };
        // Every object starts with its header: a field inside it is not where the struct
        // said, and the module is not the one the offsets describe.
        ensure!(
            [
                layout.task_name,
                layout.task_awaited_by,
                layout.task_is_task,
                layout.task_coro,
                layout.task_node,
                layout.gen_iframe,
                layout.set_used,
                layout.long_tag,
            ]
            .iter()
            .all(|&off| off >= 16),
            "asyncio debug offsets inside an object's header"
        );
        Ok(layout)
    }

    /// What the kernel program records with each Python sample: the offset of the running task
    /// in the thread state, and of the task's coroutine (its identity word).
    pub fn kernel_fields(&self) -> (u32, u32) {
        (self.tstate_running_task, self.task_coro)
    }
}

/// Finds and reads `_Py_AsyncioModuleDebugOffsets` in process `pid` of CPython 3.`minor`:
/// `Ok(None)` while no object with its section is mapped (the program has not imported
/// asyncio yet).
pub fn find_layout(
    pid: u32,
    memory: &ProcessMemory,
    runtime: u64,
    minor: u8,
) -> Result<Option<AsyncioLayout>> {
    let wanted = |name: &str| {
        name.starts_with("_asyncio") || name.starts_with("libpython") || name.starts_with("python")
    };
    let Some(at) = super::detect::section_address(pid, &wanted, ASYNCIO_DEBUG_SECTION)? else {
        return Ok(None);
    };
    let asyncio = memory.read_vec(at, ASYNCIO_DEBUG_BYTES)?;
    let debug = memory.read_vec(runtime, super::layout::DEBUG_OFFSETS_SIZE)?;
    AsyncioLayout::parse(&asyncio, &debug, minor).map(Some)
}

/// Whether process `pid` maps a separate `_asyncio` extension (a CPython before 3.14 that
/// imported asyncio).
pub fn maps_asyncio_extension(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/maps")).is_ok_and(|maps| {
        maps.lines()
            .filter_map(|l| l.rsplit('/').next())
            .any(|name| name.starts_with("_asyncio."))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(w: &[u64]) -> Vec<u8> {
        w.iter().flat_map(|x| x.to_ne_bytes()).collect()
    }

    /// sid's python3.14: its `_asyncio` module's `.AsyncioDebug` and the words of its
    /// `_Py_DebugOffsets` this reads.
    fn sid_314() -> (Vec<u8>, Vec<u8>) {
        let asyncio = words(&[
            0xa8, 0x88, 0x60, 0x6c, 0x6d, 0x80, 0x98, 0x37248, 0x2a80, 0x3a8, 0x360, 0x368, 0x370,
        ]);
        let mut debug = vec![0u64; 128];
        // The interpreter frame's section as sid's 3.14.10 has it (`.PyRuntime`, words
        // 31-38): size, previous, executable, instr_ptr, localsplus, owner, stackpointer,
        // tlbc_index.
        debug[31..39].copy_from_slice(&[0x58, 0x8, 0x0, 0x38, 0x50, 0x4a, 0x40, 0x0]);
        debug[52..56].copy_from_slice(&[0x1a0, 0x18, 0x58, 0xa8]);
        debug[62..66].copy_from_slice(&[0xc8, 0x18, 0x28, 0x20]);
        debug[71..74].copy_from_slice(&[0x20, 0x10, 0x18]);
        debug[83..87].copy_from_slice(&[0xa0, 0x18, 0x48, 0x43]);
        (asyncio, words(&debug))
    }

    #[test]
    fn sids_314_offsets_parse() {
        let (asyncio, debug) = sid_314();
        let l = AsyncioLayout::parse(&asyncio, &debug, 14).expect("parses");
        assert_eq!(
            (l.task_name, l.task_awaited_by, l.task_coro, l.task_node),
            (0x88, 0x60, 0x80, 0x98)
        );
        assert_eq!(
            (l.tstate_running_loop, l.tstate_running_task),
            (0x360, 0x368)
        );
        assert_eq!((l.gen_iframe, l.set_table, l.set_mask), (0x48, 0x28, 0x20));
        assert_eq!(
            (
                l.gen_frame_state,
                l.frame_stackpointer,
                l.suspended_in_await,
                l.executing
            ),
            (0x43, 0x40, -1, 0)
        );
        assert_eq!(
            (l.long_tag, l.long_digits, l.type_flags),
            (0x10, 0x18, 0xa8)
        );
        assert_eq!(l.kernel_fields(), (0x368, 0x80));
    }

    #[test]
    fn hostile_offsets_are_refused() {
        let (asyncio, debug) = sid_314();
        // An offset past the thread state's stated size.
        let mut bad = asyncio.clone();
        bad[11 * 8..12 * 8].copy_from_slice(&0x10_0000u64.to_ne_bytes());
        assert!(AsyncioLayout::parse(&bad, &debug, 14).is_err());
        // A misaligned one.
        let mut bad = asyncio.clone();
        bad[5 * 8..6 * 8].copy_from_slice(&0x81u64.to_ne_bytes());
        assert!(AsyncioLayout::parse(&bad, &debug, 14).is_err());
        // A huge task.
        let mut bad = asyncio.clone();
        bad[..8].copy_from_slice(&(1u64 << 40).to_ne_bytes());
        assert!(AsyncioLayout::parse(&bad, &debug, 14).is_err());
        // Short input, and a version without them.
        assert!(AsyncioLayout::parse(&asyncio[..40], &debug, 14).is_err());
        assert!(AsyncioLayout::parse(&asyncio, &debug, 13).is_err());
        assert!(AsyncioLayout::parse(&asyncio, &debug[..100], 14).is_err());
    }

    #[test]
    fn chain_frames_say_names_and_shared_waiters() {
        let t = ChainTask {
            name: "fetch-3".into(),
            coro_code: 0x1000,
            coroutine: Some("fetch".into()),
            awaiters: 1,
        };
        assert_eq!(t.frame_name(), "[task fetch-3] fetch");
        let shared = ChainTask {
            awaiters: 2,
            coroutine: None,
            ..t
        };
        assert_eq!(
            shared.frame_name(),
            "[task fetch-3] (awaited by 2, shown under the first)"
        );
    }

    #[test]
    fn the_tree_puts_each_task_under_its_waiters_and_ends_cycles() {
        let task = |id, name: &str, awaited_by: Vec<u64>| DumpTask {
            id,
            name: name.into(),
            coroutine: Some("work".into()),
            coroutine_stack: Vec::new(),
            awaited_by,
        };
        let tasks = [
            task(1, "main", vec![]),
            task(2, "fetch-1", vec![1]),
            task(3, "fetch-3", vec![1]),
            task(4, "deep", vec![3]),
            // A cycle no root reaches is drawn after the roots; one below a root ends.
            task(5, "a", vec![6]),
            task(6, "b", vec![5]),
        ];
        let lines = render_tree(&tasks);
        assert_eq!(
            lines,
            [
                "└── (T) main work",
                "    ├── (T) fetch-1 work",
                "    └── (T) fetch-3 work",
                "        └── (T) deep work",
                "└── (T) a work [awaited only within a cycle]",
                "    └── (T) b work",
                "        └── (T) a work [awaits itself: a cycle]",
            ]
        );
        // 40 layers of two tasks, each awaited by both of the next layer's: drawn under every
        // waiter that is 2**40 lines; what a task awaits is drawn once.
        let mut lattice = vec![task(1000, "leaf", vec![0, 1])];
        for layer in 0..40u64 {
            let above = if layer == 39 {
                vec![]
            } else {
                vec![2 * layer + 2, 2 * layer + 3]
            };
            lattice.push(task(2 * layer, "l", above.clone()));
            lattice.push(task(2 * layer + 1, "l", above));
        }
        let lines = render_tree(&lattice);
        assert!(lines.len() <= 3 * lattice.len(), "{} lines", lines.len());
        assert!(lines.iter().any(|l| l.contains("(T) leaf")), "{lines:?}");
        let looped = [task(1, "main", vec![]), task(2, "x", vec![1, 2])];
        let lines = render_tree(&looped);
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert!(lines[2].ends_with("a cycle]"), "{lines:?}");
    }

    /// Fake tasks in this process's own memory, read through the same reader: links that
    /// loop, that point anywhere, and chains past the depth bound end, bounded.
    mod hostile {
        use super::super::*;

        const OFFSETS: AsyncioLayout = AsyncioLayout {
            task_size: 64,
            task_name: 16,
            task_awaited_by: 24,
            task_is_task: 32,
            task_awaited_by_is_set: 33,
            task_coro: 40,
            task_node: 48,
            tstate_running_loop: 0,
            tstate_running_task: 8,
            tstate_tasks_head: 16,
            gen_iframe: 16,
            gen_frame_state: 24,
            frame_stackpointer: 56,
            suspended_in_await: -1,
            executing: 0,
            set_used: 16,
            set_table: 24,
            set_mask: 32,
            long_tag: 16,
            long_digits: 24,
            type_flags: 32,
        };

        /// An `int` type, a name (the `int` 7) and `n` tasks, each awaited by `parent(i)`.
        struct Fakes {
            _ty: Box<[u64; 8]>,
            _name: Box<[u64; 4]>,
            /// Never grown once filled: its elements keep their addresses.
            tasks: Vec<[u64; 8]>,
        }

        fn fakes(n: usize, parent: impl Fn(usize, &[u64]) -> u64) -> Fakes {
            let mut ty = Box::new([0u64; 8]);
            ty[4] = TPFLAGS_LONG;
            let mut name = Box::new([0u64; 4]);
            name[1] = ty.as_ptr() as u64;
            name[2] = 1 << 3;
            name[3] = 7;
            let mut tasks = vec![[0u64; 8]; n];
            let addresses: Vec<u64> = tasks.iter().map(|t| t.as_ptr() as u64).collect();
            for (i, t) in tasks.iter_mut().enumerate() {
                t[2] = name.as_ptr() as u64;
                t[3] = parent(i, &addresses);
                // is_task 1, awaited_by_is_set 0.
                t[4] = 1;
            }
            Fakes {
                _ty: ty,
                _name: name,
                tasks,
            }
        }

        fn read(f: &Fakes, depth: usize) -> Result<TaskChain> {
            let memory = ProcessMemory::new(std::process::id());
            let layout = crate::runtime::cpython::layout::table(12).expect("3.12");
            let reader = TaskReader {
                memory: &memory,
                layout: &layout,
                asyncio: &OFFSETS,
            };
            reader.chain(f.tasks[0].as_ptr() as u64, depth, &mut HashMap::new())
        }

        #[test]
        fn a_loop_of_waiters_ends_and_is_counted() {
            // 0 awaited by 1, 1 by 2, 2 by 0.
            let f = fakes(3, |i, a| a[(i + 1) % 3]);
            let chain = read(&f, 64).expect("read");
            assert!(chain.cycle && !chain.cut);
            assert_eq!(chain.tasks.len(), 3);
            assert!(chain.tasks.iter().all(|t| t.name == "Task-7"));
        }

        #[test]
        fn a_chain_past_the_depth_bound_is_cut() {
            let f = fakes(100, |i, a| a.get(i + 1).copied().unwrap_or(0));
            let chain = read(&f, 64).expect("read");
            assert!(chain.cut && !chain.cycle);
            assert_eq!(chain.tasks.len(), 64);
        }

        #[test]
        fn wild_pointers_end_the_chain_or_its_read() {
            // A waiter at an unmapped address is no task: the chain is the task alone.
            let f = fakes(1, |_, _| 0x10);
            let chain = read(&f, 64).expect("read");
            assert_eq!(chain.tasks.len(), 1);
            assert_eq!(chain.tasks[0].awaiters, 0);
            // A sampled task that is not readable is an error, not a chain.
            let memory = ProcessMemory::new(std::process::id());
            let layout = crate::runtime::cpython::layout::table(12).expect("3.12");
            let reader = TaskReader {
                memory: &memory,
                layout: &layout,
                asyncio: &OFFSETS,
            };
            assert!(reader.chain(0x1000, 64, &mut HashMap::new()).is_err());
            assert!(reader.chain(0x1003, 64, &mut HashMap::new()).is_err());
        }
    }
}
