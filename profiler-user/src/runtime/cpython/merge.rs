//! Python frames merged into native stacks: each `_PyEval_EvalFrameDefault` frame becomes the
//! Python frames its call ran ([`merge`]), the GIL's root frame (`--python-gil`), and the
//! Python view (`--python-view`, [`python_view_keep`]) that folds the interpreter's own C
//! frames into the Python function that ran them.

use std::collections::HashMap;

use profiler_common::PythonFrame;

use crate::{
    runtime::cpython::PythonFunction,
    symbolize::{Frame, FrameKind},
};

/// The kind of the frames this runtime names (Python functions, and the GIL's root frames).
pub const PYTHON_FRAME: FrameKind = FrameKind::Runtime(profiler_common::RuntimeTag::CPython);

/// The C function that runs Python frames: one call per group of frames the kernel marks as
/// an eval call's entry.
pub const EVAL_FUNCTION: &str = "_PyEval_EvalFrameDefault";

/// How CPython 3.12+'s perf map names a trampoline: `py::QUALNAME:FILE`.
const PERF_TRAMPOLINE_PREFIX: &str = "py::";

/// The C function that calls into a perf trampoline.
const PERF_TRAMPOLINE_EVALUATOR: &str = "py_trampoline_evaluator";

/// Names of recorded Python frames, by packed frame without its eval-entry flag (code object
/// and instruction).
pub type PythonSymbols = HashMap<u64, PythonFunction>;

/// The key of a packed frame in [`PythonSymbols`]: the frame without its eval-entry flag.
pub fn symbol_key(packed: u64) -> u64 {
    PythonFrame::without_eval_entry(packed)
}

/// The asyncio task a sample's thread ran (CPython 3.14+): its address and its coroutine's
/// identity bits, as the kernel recorded them.
pub type TaskKey = (u64, u8);

/// The chains of tasks awaiting each sampled task, by [`TaskKey`].
pub type TaskChains = HashMap<TaskKey, super::asyncio::TaskChain>;

/// What the kernel appends to a Python stack after its frames: the GIL entry, then the task
/// entry and the task's address.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Trailer {
    /// The GIL entry.
    pub gil: Option<u64>,
    /// The task the thread ran.
    pub task: Option<TaskKey>,
}

impl Trailer {
    /// The entries as the kernel packs them.
    fn entries(self) -> impl Iterator<Item = u64> {
        self.gil.into_iter().chain(
            self.task
                .into_iter()
                .flat_map(|(task, identity)| [PythonFrame::task_entry(identity), task]),
        )
    }
}

/// A kernel Python stack's frames (innermost first) and what follows them.
pub fn split_stack(stack: &[u64]) -> (&[u64], Trailer) {
    let mut trailer = Trailer::default();
    let mut frames = stack;
    if let [rest @ .., marker, task] = frames {
        if let Some(identity) = PythonFrame::task_entry_identity(*marker) {
            trailer.task = Some((*task, identity));
            frames = rest;
        }
    }
    if let Some((&last, rest)) = frames.split_last() {
        if PythonFrame::is_gil_entry(last) {
            trailer.gil = Some(last);
            frames = rest;
        }
    }
    (frames, trailer)
}

/// The leaf-most `limit` frames of a kernel Python stack (innermost first, the GIL and task
/// entries last, kept), and whether any were cut.
pub fn limit_python(stack: &[u64], limit: usize) -> (Vec<u64>, bool) {
    let (code, trailer) = split_stack(stack);
    if code.len() <= limit {
        return (stack.to_vec(), false);
    }
    let mut out = code[..limit].to_vec();
    out.extend(trailer.entries());
    (out, true)
}

/// Whether any frame of the Python stack `python` has no name in `symbols`: its code object
/// was never read (freed, or its process exited, before naming reached it), so it shows as
/// `[unknown Python code]`.
pub fn has_unnamed(python: &[u64], symbols: &PythonSymbols) -> bool {
    split_stack(python)
        .0
        .iter()
        .any(|&p| !symbols.contains_key(&symbol_key(p)))
}

/// A process's named Python frames and the task chains of its sampled asyncio tasks.
#[derive(Debug, Default)]
pub struct PythonNames {
    /// Frames named so far.
    pub symbols: PythonSymbols,
    /// Task chains read so far.
    pub tasks: TaskChains,
}

/// Puts `chain`'s tasks (outermost first) in place of the frames below the sampled task's
/// own coroutine frames in `out` (root first; its Python frames are `python`'s, innermost
/// first): from the first Python frame up to the outermost frame of the task's coroutine,
/// the event loop's frames (`run`, `run_forever`, `_run_once`, `Handle._run` and the C
/// frames between them) go. Where the stack holds no frame of that coroutine (cut at
/// `--max-stack-length`, or a coroutine not written in Python), the tasks go at the root of
/// its Python frames and nothing is taken out.
fn put_tasks<A: Clone>(
    mut out: Vec<(Frame, A)>,
    python: &[u64],
    chain: &super::asyncio::TaskChain,
    python_address: &A,
) -> Vec<(Frame, A)> {
    let positions: Vec<usize> = out
        .iter()
        .enumerate()
        .filter(|(_, (f, _))| f.kind == PYTHON_FRAME)
        .map(|(i, _)| i)
        .collect();
    if positions.len() != python.len() || positions.is_empty() || chain.tasks.is_empty() {
        return out;
    }
    let coroutine = (chain.coro_code != 0)
        .then(|| {
            python
                .iter()
                .rposition(|&p| PythonFrame::unpack(p).code == chain.coro_code)
        })
        .flatten();
    let first = positions[0];
    let end = match coroutine {
        Some(k) => positions[python.len() - 1 - k],
        None => first,
    };
    let tasks = chain.tasks.iter().map(|t| {
        (
            Frame::named(t.frame_name(), None, PYTHON_FRAME),
            python_address.clone(),
        )
    });
    out.splice(first..end, tasks);
    out
}

/// The name of the task a profile stack (root first) ran in: its innermost task frame's,
/// without the coroutine (the pprof label `task`).
pub fn task_of<'a>(frames: impl DoubleEndedIterator<Item = &'a Frame>) -> Option<&'a str> {
    frames.rev().find_map(|f| {
        let name = f.name.strip_prefix(TASK_FRAME_PREFIX)?;
        (f.kind == PYTHON_FRAME).then(|| name.split_once(']').map_or(name, |(n, _)| n))
    })
}

/// How a task's frame starts: `[task NAME] COROUTINE`.
pub const TASK_FRAME_PREFIX: &str = "[task ";

/// A Python function as a profile frame.
fn python_frame(function: Option<&PythonFunction>) -> Frame {
    match function {
        Some(f) => Frame {
            name: f.name.as_str().into(),
            module: Some(f.file.as_str().into()),
            kind: PYTHON_FRAME,
            inlined: false,
            file: Some(f.file.as_str().into()),
            line: Some(f.line),
            start_line: Some(f.first_line),
            build_id: None,
        },
        None => Frame::named("[unknown Python code]", None, PYTHON_FRAME),
    }
}

/// How [`merge`] shows Python frames: the runtimes' options.
pub use crate::runtime::FrameOptions as MergeOptions;
/// Which outputs show the Python view (`--python-view`): the runtimes' view.
pub use crate::runtime::View as PythonView;

/// The root frame of a sample whose thread held the GIL (`--python-gil`).
const GIL_HELD_FRAME: &str = "[GIL held]";
/// The root frame of a sample whose thread did not hold the GIL (`--python-gil`).
const GIL_NOT_HELD_FRAME: &str = "[GIL not held]";
/// The root frame of a sample of a free-threaded build (`--python-gil`): there is no GIL,
/// said rather than guessed.
pub const NO_GIL_FRAME: &str = "[free-threaded: no GIL]";

/// The root frame that says whether a sample's thread held the GIL, from the kernel's GIL
/// entry `marker`.
fn gil_frame(marker: u64) -> Frame {
    let name = match marker {
        PythonFrame::GIL_HELD => GIL_HELD_FRAME,
        PythonFrame::NO_GIL => NO_GIL_FRAME,
        _ => GIL_NOT_HELD_FRAME,
    };
    Frame::named(name, None, PYTHON_FRAME)
}

/// Whether `frame` is one of the C runtime's libraries, which the interpreter calls for its
/// own work (`malloc`, `memcpy`, `__tls_get_addr` in the dynamic loader): below the
/// interpreter's frames it is the interpreter's cost, below an extension's the extension's.
fn is_c_runtime(frame: &Frame) -> bool {
    /// File name prefixes of glibc's libraries, the dynamic loader and the vDSO.
    const RUNTIME: [&str; 8] = [
        "libc.so",
        "libc-",
        "ld-linux",
        "libm.so",
        "libpthread",
        "libdl",
        "librt",
        "[vdso]",
    ];
    module_name_starts_with(frame, &RUNTIME)
}

/// Whether `frame` is user code of a module whose file name starts with one of `prefixes`.
fn module_name_starts_with(frame: &Frame, prefixes: &[&str]) -> bool {
    frame.kind == FrameKind::User
        && frame.module.as_deref().is_some_and(|m| {
            let name = std::path::Path::new(m)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            prefixes.iter().any(|p| name.starts_with(p))
        })
}

/// Which frames of a stack (root first) the Python view keeps: below the innermost Python
/// function, the interpreter's C frames (libpython or the python executable: the eval loop,
/// pymalloc, ...), the C runtime it calls and the kernel work they do are folded into that
/// function, up to the first frame of other native code (an extension: numpy, zlib,
/// libtorch), which stays with everything below it; between Python functions the
/// interpreter's frames go as they do without `--python-glue`. Above the outermost Python
/// function, the interpreter's start-up (`_start`, `Py_BytesMain` ... `PyEval_EvalCode`, or
/// a thread's `start_thread` ... `thread_run`) goes too, as cProfile shows none of it: its
/// cumulative view leads with the program's own functions, not with ten frames that every
/// sample shares (an embedding program's own frames stay). A stack without Python frames is
/// kept whole.
pub fn python_view_keep(frames: &[Option<&Frame>]) -> Vec<bool> {
    let is_python = |f: &Option<&Frame>| {
        f.is_some_and(|f| {
            f.kind == PYTHON_FRAME
                && *f.name != *GIL_HELD_FRAME
                && *f.name != *GIL_NOT_HELD_FRAME
                && *f.name != *NO_GIL_FRAME
        })
    };
    let mut keep = vec![true; frames.len()];
    let (Some(first), Some(last)) = (
        frames.iter().position(is_python),
        frames.iter().rposition(is_python),
    ) else {
        return keep;
    };
    for (i, frame) in frames.iter().enumerate().take(first) {
        if let Some(frame) = frame {
            keep[i] = !(is_interpreter(frame) || is_c_runtime(frame));
        }
    }
    for (i, frame) in frames.iter().enumerate().take(last).skip(first + 1) {
        if let Some(frame) = frame {
            keep[i] = !(is_interpreter(frame) || is_perf_trampoline(frame));
        }
    }
    for (i, frame) in frames.iter().enumerate().skip(last + 1) {
        match frame {
            Some(f) if is_interpreter(f) || is_c_runtime(f) || f.kind == FrameKind::Kernel => {
                keep[i] = false
            }
            _ => break,
        }
    }
    keep
}

/// Whether `frame` is C code of the interpreter itself (libpython or a static python
/// binary): the glue between Python frames.
fn is_interpreter(frame: &Frame) -> bool {
    module_name_starts_with(frame, &["libpython3", "python3"])
}

/// Whether `frame` is one of CPython 3.12+'s perf trampolines (`-X perf`): a `py::NAME:FILE`
/// frame named from the interpreter's perf map, or the C function that enters them. Where the
/// kernel walked the Python frames they only repeat them.
fn is_perf_trampoline(frame: &Frame) -> bool {
    frame.kind == FrameKind::User
        && (*frame.name == *PERF_TRAMPOLINE_EVALUATOR
            || (frame.name.starts_with(PERF_TRAMPOLINE_PREFIX)
                && frame.module.as_deref() == Some(crate::symbolize::JIT_MODULE)))
}

impl crate::runtime::NamedFrames for PythonNames {
    fn has_unnamed(&self, stack: &[u64]) -> bool {
        has_unnamed(stack, &self.symbols)
    }

    fn merge(
        &self,
        native: Vec<(Frame, Option<crate::profile::CodeAddress>)>,
        stack: &[u64],
        options: MergeOptions,
    ) -> Vec<(Frame, Option<crate::profile::CodeAddress>)> {
        merge(native, stack, &self.symbols, &self.tasks, options, None)
    }
}

/// Whether `frame` is one of the eval loop's: [`EVAL_FUNCTION`], or the part of it GCC split
/// off (`_PyEval_EvalFrameDefault.cold`, as a debug file or bpfprof's naming of a stripped
/// interpreter calls it: Debian's python3.14 runs most of its eval loop there).
fn is_eval_frame(frame: &Frame) -> bool {
    frame.kind == FrameKind::User
        && frame
            .name
            .strip_prefix(EVAL_FUNCTION)
            .is_some_and(|rest| rest.is_empty() || rest == ".cold")
}

/// Merges a sample's Python frames (`python`, packed, leaf first) into its native user frames
/// (`native`, root first, each with what the caller keeps beside it): each
/// `_PyEval_EvalFrameDefault` frame becomes the Python frames that call ran, matched from the
/// leaf (native stacks lose frames at the root, not the leaf). Python frames left over (a
/// native stack that ended early) go at the root. Unless `keep_glue`, the interpreter's own C
/// frames between two Python frames are dropped: they say how CPython called a function, not
/// what the program did; so are perf-trampoline frames, which repeat the Python frames.
///
/// Where the kernel recorded the asyncio task the thread ran and `tasks` has the chain of
/// tasks awaiting it, the chain replaces the event loop's frames below the task's own
/// frames ([`put_tasks`]).
pub fn merge<A: Clone>(
    native: Vec<(Frame, A)>,
    python: &[u64],
    symbols: &PythonSymbols,
    tasks: &TaskChains,
    options: MergeOptions,
    python_address: A,
) -> Vec<(Frame, A)> {
    // The kernel's GIL and task entries, outermost, are not frames.
    let (python, trailer) = split_stack(python);
    let mut out = merge_frames(native, python, symbols, options.keep_glue, &python_address);
    if let Some(chain) = trailer.task.and_then(|key| tasks.get(&key)) {
        out = put_tasks(out, python, chain, &python_address);
    }
    if let (true, Some(marker)) = (options.show_gil, trailer.gil) {
        out.insert(0, (gil_frame(marker), python_address));
    }
    out
}

/// [`merge`] without the GIL entry.
fn merge_frames<A: Clone>(
    native: Vec<(Frame, A)>,
    python: &[u64],
    symbols: &PythonSymbols,
    keep_glue: bool,
    python_address: &A,
) -> Vec<(Frame, A)> {
    if python.is_empty() {
        return native;
    }
    // Groups of frames one eval call ran, root first, each root first.
    let mut groups: Vec<Vec<Frame>> = Vec::new();
    let mut current: Vec<Frame> = Vec::new();
    for packed in python.iter().rev() {
        let f = PythonFrame::unpack(*packed);
        if f.eval_entry && !current.is_empty() {
            groups.push(std::mem::take(&mut current));
        }
        current.push(python_frame(symbols.get(&symbol_key(*packed))));
    }
    if !current.is_empty() {
        groups.push(current);
    }
    let evals = native.iter().filter(|(f, _)| is_eval_frame(f)).count();
    // The innermost `evals` groups replace the eval frames; the rest go at the root.
    let leftover = groups.len().saturating_sub(evals);
    let mut groups = groups.into_iter();
    let mut out: Vec<(Frame, A)> = Vec::with_capacity(native.len() + python.len());
    for group in groups.by_ref().take(leftover) {
        out.extend(group.into_iter().map(|f| (f, python_address.clone())));
    }
    // Eval frames beyond the Python groups (more C calls than the kernel saw Python calls for)
    // stay as they are, at the root side.
    let mut unmatched_evals = evals.saturating_sub(evals.min(groups.len()));
    for (frame, address) in native {
        if is_eval_frame(&frame) {
            if unmatched_evals > 0 {
                unmatched_evals -= 1;
            } else if let Some(group) = groups.next() {
                out.extend(group.into_iter().map(|f| (f, python_address.clone())));
                continue;
            }
        }
        out.push((frame, address));
    }
    if keep_glue {
        return out;
    }
    // Drop interpreter frames that have a Python frame on both sides.
    let is_python = |f: &Frame| f.kind == PYTHON_FRAME;
    let Some(first) = out.iter().position(|(f, _)| is_python(f)) else {
        return out;
    };
    let last = out.iter().rposition(|(f, _)| is_python(f)).unwrap_or(first);
    out.into_iter()
        .enumerate()
        .filter(|(i, (f, _))| {
            !(is_perf_trampoline(f) || (*i > first && *i < last && is_interpreter(f)))
        })
        .map(|(_, x)| x)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn native(name: &str, module: &str) -> (Frame, u32) {
        (Frame::named(name, Some(module.into()), FrameKind::User), 1)
    }

    fn function(name: &str, line: u32) -> PythonFunction {
        PythonFunction {
            name: name.into(),
            file: "/app/work.py".into(),
            line,
            first_line: line - 1,
        }
    }

    const PY: &str = "/usr/lib/libpython3.12.so.1.0";

    /// Three Python frames in two eval calls (3.12 style: `<module>` calls `outer` through C,
    /// `outer` calls `leaf` inline), with the C callee `time_sleep` under `leaf`.
    #[test]
    fn python_groups_replace_eval_frames_from_the_leaf_and_glue_goes() {
        let mut symbols = PythonSymbols::new();
        let frames = [
            (0x1000u64, 10u32, false, "leaf", 5u32),
            (0x2000, 20, true, "outer", 9),
            (0x3000, 30, true, "<module>", 12),
        ];
        let python: Vec<u64> = frames
            .iter()
            .map(|(code, instr, entry, name, line)| {
                symbols.insert(
                    PythonFrame::pack(*code, *instr, 5, false),
                    function(name, *line),
                );
                PythonFrame::pack(*code, *instr, 5, *entry)
            })
            .collect();
        let stack = vec![
            native("main", "/usr/bin/python3.12"),
            native("Py_RunMain", PY),
            native(EVAL_FUNCTION, PY),
            native("_PyFunction_Vectorcall", PY),
            native("PyObject_Call", PY),
            native(EVAL_FUNCTION, PY),
            native("time_sleep", PY),
        ];
        let names = |v: &[(Frame, u32)]| {
            v.iter()
                .map(|(f, _)| f.name.to_string())
                .collect::<Vec<_>>()
        };
        let merged = merge(
            stack.clone(),
            &python,
            &symbols,
            &TaskChains::new(),
            MergeOptions::default(),
            0,
        );
        assert_eq!(
            names(&merged),
            [
                "main",
                "Py_RunMain",
                "<module>",
                "outer",
                "leaf",
                "time_sleep"
            ]
        );
        assert_eq!(merged[4].0.kind, PYTHON_FRAME);
        assert_eq!(merged[4].0.line, Some(5));
        assert_eq!(merged[4].1, 0, "Python frames get the Python address");
        let glue = MergeOptions {
            keep_glue: true,
            show_gil: false,
            view: PythonView::Off,
        };
        let kept = merge(stack, &python, &symbols, &TaskChains::new(), glue, 0);
        assert_eq!(
            names(&kept),
            [
                "main",
                "Py_RunMain",
                "<module>",
                "_PyFunction_Vectorcall",
                "PyObject_Call",
                "outer",
                "leaf",
                "time_sleep"
            ]
        );
    }

    /// Under `-X perf` each eval call sits under its perf trampoline (`py::NAME:FILE`, named
    /// from the perf map): the walked Python frames make them repeats, dropped unless glue is kept.
    #[test]
    fn python_frames_keep_the_leaf_most_and_the_gil_entry() {
        let gil = PythonFrame::GIL_HELD;
        assert_eq!(
            limit_python(&[1, 2, 3, gil], 3),
            (vec![1, 2, 3, gil], false)
        );
        assert_eq!(limit_python(&[1, 2, 3, gil], 2), (vec![1, 2, gil], true));
        assert_eq!(limit_python(&[1, 2, 3], 1), (vec![1], true));
        assert_eq!(limit_python(&[], 1), (vec![], false));
    }

    #[test]
    fn perf_trampolines_go_where_the_kernel_walked_the_frames() {
        let mut symbols = PythonSymbols::new();
        symbols.insert(PythonFrame::pack(0x10, 1, 5, false), function("leaf", 3));
        symbols.insert(
            PythonFrame::pack(0x20, 1, 5, false),
            function("<module>", 9),
        );
        let python = vec![
            PythonFrame::pack(0x10, 1, 5, true),
            PythonFrame::pack(0x20, 1, 5, true),
        ];
        let trampoline = |name: &str| native(name, crate::symbolize::JIT_MODULE);
        let stack = vec![
            native("Py_RunMain", PY),
            native(PERF_TRAMPOLINE_EVALUATOR, "/usr/bin/python3.12"),
            trampoline("py::<module>:/app/work.py"),
            native(EVAL_FUNCTION, PY),
            native(PERF_TRAMPOLINE_EVALUATOR, "/usr/bin/python3.12"),
            trampoline("py::leaf:/app/work.py"),
            native(EVAL_FUNCTION, PY),
            native("burn", "/x/ext.so"),
        ];
        let names = |v: &[(Frame, u32)]| {
            v.iter()
                .map(|(f, _)| f.name.to_string())
                .collect::<Vec<_>>()
        };
        let merged = merge(
            stack.clone(),
            &python,
            &symbols,
            &TaskChains::new(),
            MergeOptions::default(),
            0,
        );
        assert_eq!(names(&merged), ["Py_RunMain", "<module>", "leaf", "burn"]);
        // Glue kept: every frame, trampolines too.
        let glue = MergeOptions {
            keep_glue: true,
            show_gil: false,
            view: PythonView::Off,
        };
        let kept = merge(stack, &python, &symbols, &TaskChains::new(), glue, 0);
        assert_eq!(kept.len(), 8);
        // A `py::` frame that is no perf-map frame (a C function so named) stays.
        let own = merge(
            vec![native("py::mine", "/x/ext.so")],
            &python,
            &symbols,
            &TaskChains::new(),
            MergeOptions::default(),
            0,
        );
        assert!(names(&own).contains(&"py::mine".to_string()));
    }

    #[test]
    fn python_frames_without_eval_frames_go_at_the_root() {
        let mut symbols = PythonSymbols::new();
        symbols.insert(PythonFrame::pack(0x10, 1, 5, false), function("f", 3));
        let python = vec![PythonFrame::pack(0x10, 1, 5, true)];
        let merged = merge(
            vec![native("burn", "/x/ext.so")],
            &python,
            &symbols,
            &TaskChains::new(),
            MergeOptions::default(),
            0,
        );
        let names: Vec<&str> = merged.iter().map(|(f, _)| &*f.name).collect();
        assert_eq!(names, ["f", "burn"]);
        // An unnamed frame is still a frame.
        let merged = merge(
            Vec::new(),
            &[PythonFrame::pack(0x20, 0, 5, true)],
            &symbols,
            &TaskChains::new(),
            MergeOptions::default(),
            0,
        );
        assert_eq!(&*merged[0].0.name, "[unknown Python code]");
    }

    /// Below the innermost Python function the interpreter's frames, the C runtime they call
    /// and the kernel work they do fold into it; an extension's frames stay with what is
    /// below them; above the outermost one the interpreter's start-up goes, as in cProfile's
    /// view, and an embedding program's own callers stay.
    #[test]
    fn the_python_view_folds_the_interpreter_below_the_innermost_python_function() {
        let py = |name: &str| Frame::named(name, Some("/app/work.py".into()), PYTHON_FRAME);
        let c = |name: &str, module: &str| Frame::named(name, Some(module.into()), FrameKind::User);
        let kernel = Frame::named("asm_exc_page_fault", None, FrameKind::Kernel);
        let keep = |frames: &[Frame]| {
            let refs: Vec<Option<&Frame>> = frames.iter().map(Some).collect();
            frames
                .iter()
                .zip(python_view_keep(&refs))
                .filter(|(_, k)| *k)
                .map(|(f, _)| f.name.to_string())
                .collect::<Vec<_>>()
        };
        let alloc = [
            c("main", "/usr/bin/python3.12"),
            c("Py_RunMain", PY),
            py("<module>"),
            c("_PyFunction_Vectorcall", PY),
            py("alloc_hot"),
            c("PyList_Append", PY),
            c("pymalloc_alloc", PY),
            c("__tls_get_addr", "/lib64/ld-linux-x86-64.so.2"),
            c("malloc", "/lib/x86_64-linux-gnu/libc.so.6"),
            kernel.clone(),
        ];
        assert_eq!(keep(&alloc), ["<module>", "alloc_hot"]);
        let thread = [
            c("__clone3", "/lib/x86_64-linux-gnu/libc.so.6"),
            c("start_thread", "/lib/x86_64-linux-gnu/libc.so.6"),
            c("thread_run", PY),
            py("Thread._bootstrap"),
            py("worker"),
        ];
        assert_eq!(keep(&thread), ["Thread._bootstrap", "worker"]);
        let embedded = [
            c("main", "/opt/app/bin/server"),
            c("run_script", "/opt/app/bin/server"),
            c("PyRun_SimpleString", PY),
            py("<module>"),
        ];
        assert_eq!(keep(&embedded), ["main", "run_script", "<module>"]);
        let zlib = [
            py("<module>"),
            py("compress_leaf"),
            c("cfunction_vectorcall_O", PY),
            c(
                "zlib_compress",
                "/lib/python3.12/lib-dynload/zlib.cpython-312.so",
            ),
            c("deflate", "/lib/x86_64-linux-gnu/libz.so.1"),
            c("memcpy", "/lib/x86_64-linux-gnu/libc.so.6"),
            kernel,
        ];
        assert_eq!(
            keep(&zlib),
            [
                "<module>",
                "compress_leaf",
                "zlib_compress",
                "deflate",
                "memcpy",
                "asm_exc_page_fault"
            ]
        );
        // No Python frame: a native thread of the interpreter stays whole.
        let native = [c("start_thread", "/lib/libc.so.6"), c("pymalloc_alloc", PY)];
        assert_eq!(keep(&native), ["start_thread", "pymalloc_alloc"]);
        // The GIL's root frame is no Python function.
        let gil = [gil_frame(PythonFrame::GIL_HELD), c("pymalloc_alloc", PY)];
        assert_eq!(keep(&gil), ["[GIL held]", "pymalloc_alloc"]);
    }

    #[test]
    fn the_gil_entry_is_a_root_frame_only_when_asked_for() {
        let symbols = PythonSymbols::new();
        let python = vec![PythonFrame::pack(0x10, 1, 5, true), PythonFrame::GIL_HELD];
        let names = |show_gil| {
            let options = MergeOptions {
                keep_glue: false,
                show_gil,
                view: PythonView::Off,
            };
            merge(
                vec![native("main", "/x/a")],
                &python,
                &symbols,
                &TaskChains::new(),
                options,
                0,
            )
            .into_iter()
            .map(|(f, _)| f.name.to_string())
            .collect::<Vec<_>>()
        };
        assert_eq!(names(false), ["[unknown Python code]", "main"]);
        assert_eq!(names(true), ["[GIL held]", "[unknown Python code]", "main"]);
        // A free-threaded build's entry says so rather than guessing a holder.
        let python = vec![PythonFrame::pack(0x10, 1, 5, true), PythonFrame::NO_GIL];
        let options = MergeOptions {
            keep_glue: false,
            show_gil: true,
            view: PythonView::Off,
        };
        let named: Vec<_> = merge(
            vec![native("main", "/x/a")],
            &python,
            &symbols,
            &TaskChains::new(),
            options,
            0,
        )
        .into_iter()
        .map(|(f, _)| f.name.to_string())
        .collect();
        assert_eq!(
            named,
            ["[free-threaded: no GIL]", "[unknown Python code]", "main"]
        );
    }
}
