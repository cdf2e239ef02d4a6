//! CPython frames read from outside the interpreter (bpfprof's `python` module), on the real
//! interpreters: pyenv's 3.10, 3.11, 3.12 and 3.13 (shared libpython, built with `-g`) and
//! Debian's 3.11 (a stripped static binary). For each, a workload with known stacks
//! (tests/workloads/pystack.py) is detected, its threads listed, each thread's frames walked by
//! the kernel program's rules and resolved to names, files and lines, all compared with the
//! script's text. The version tables are re-derived from the pyenv builds' DWARF (with gdb), and
//! 3.13's layout (read from `_Py_DebugOffsets` in the process) is compared with its DWARF too.
//! Each complete walk's eval-entry flags are checked against the native stacks gdb unwinds (one
//! entry frame per `_PyEval_EvalFrameDefault`), and Python frames merged into them. Also
//! processes in their own pid and mount namespaces. Those and the gdb checks need root.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use bpfprof::runtime::cpython::FRAME_OWNED_BY_CSTACK;
use bpfprof::runtime::cpython::{
    layout::GilLayout, PythonFrame, PythonFunction, PythonTarget, MAX_PYTHON_DEPTH,
};
use bpfprof::{
    runtime::cpython::stacks::{merge, symbol_key, MergeOptions, PythonSymbols},
    symbolize::{Frame, FrameKind},
};
use bpfprof_tests::*;

const READY_TIMEOUT: Duration = Duration::from_secs(30);

fn pyenv(version: &str) -> PathBuf {
    PathBuf::from(std::env::var("HOME").unwrap_or("/root".into()))
        .join(".pyenv/versions")
        .join(version)
}

/// The interpreter at `python`, or None (skip) when it is missing and not under CI.
fn require(python: &Path) -> bool {
    if python.exists() {
        return true;
    }
    assert!(!ci(), "{} is needed under CI", python.display());
    eprintln!("skipping: no {}", python.display());
    false
}

fn script() -> PathBuf {
    workspace_root().join("tests/workloads/pystack.py")
}

/// The 1-based line of the marker comment `# MARK name` in the workload.
fn mark(name: &str) -> u32 {
    mark_in(&script(), name)
}

/// The 1-based line of the marker comment `# MARK name` in `script`.
fn mark_in(script: &Path, name: &str) -> u32 {
    let text = std::fs::read_to_string(script).expect("read the workload");
    let needle = format!("# MARK {name}");
    let hits: Vec<u32> = text
        .lines()
        .enumerate()
        .filter(|(_, l)| l.trim_end().ends_with(&needle))
        .map(|(i, _)| i as u32 + 1)
        .collect();
    assert_eq!(
        hits.len(),
        1,
        "marker {needle:?} once in {}",
        script.display()
    );
    hits[0]
}

/// The 1-based line of the `def NAME(` in the workload.
fn def_line(name: &str) -> u32 {
    let text = std::fs::read_to_string(script()).expect("read pystack.py");
    let needle = format!("def {name}(");
    text.lines()
        .position(|l| l.trim_start().starts_with(&needle))
        .unwrap_or_else(|| panic!("no `def {name}` in pystack.py")) as u32
        + 1
}

/// A running pystack.py and the thread ids it reported (in its own pid namespace).
struct Running {
    _workload: Workload,
    /// The interpreter's process on the host (a child of `unshare` in the namespace test).
    pid: u32,
    main_ns_tid: u32,
    worker_ns_tid: u32,
    deep_ns_tid: u32,
    spinner_ns_tid: u32,
    _dir: tempfile::TempDir,
}

/// Starts pystack.py under `command`; with `spin`, its fourth thread holds the GIL.
fn start(command: &[&str], spin: bool) -> Running {
    start_script(command, &script(), spin)
}

/// Starts a workload script that reports its threads' ids (main thread first) in the file
/// named by its first argument.
fn start_script(command: &[&str], script: &Path, spin: bool) -> Running {
    let dir = tempdir();
    let report = dir.path().join("ready");
    let mut cmd = Command::new(command[0]);
    cmd.args(&command[1..]).arg(script).arg(&report);
    if spin {
        cmd.arg("spin");
    }
    let workload = Workload::spawn_command(cmd);
    let text = poll_until(READY_TIMEOUT, || std::fs::read_to_string(&report).ok())
        .unwrap_or_else(|| panic!("{command:?} did not report its threads"));
    let ids: Vec<u32> = text
        .split_whitespace()
        .map(|s| s.parse().expect("thread id"))
        .collect();
    // Under `unshare --fork`, the interpreter is unshare's only child.
    let pid = if command[0] == "unshare" {
        let children =
            std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", workload.pid()))
                .expect("unshare's children");
        children
            .split_whitespace()
            .next()
            .expect("unshare has a child")
            .parse()
            .expect("pid")
    } else {
        workload.pid()
    };
    let id = |i: usize| ids.get(i).copied().unwrap_or(0);
    Running {
        _workload: workload,
        pid,
        main_ns_tid: id(0),
        worker_ns_tid: id(1),
        deep_ns_tid: id(2),
        spinner_ns_tid: id(3),
        _dir: dir,
    }
}

/// Host tid of the task whose innermost NSpid is `ns_tid`.
fn host_tid(pid: u32, ns_tid: u32) -> u32 {
    for entry in std::fs::read_dir(format!("/proc/{pid}/task")).expect("tasks") {
        let entry = entry.expect("task");
        let status = std::fs::read_to_string(entry.path().join("status")).expect("status");
        let inner: u32 = status
            .lines()
            .find_map(|l| l.strip_prefix("NSpid:"))
            .and_then(|ids| ids.split_whitespace().last()?.parse().ok())
            .expect("NSpid");
        if inner == ns_tid {
            return entry.file_name().to_str().unwrap().parse().unwrap();
        }
    }
    panic!("pid {pid} has no task {ns_tid} in its namespace");
}

/// Offsets from gdb's reading of `lib`'s DWARF: one `print/d` per expression.
fn dwarf_values(lib: &Path, exprs: &[String]) -> Vec<u64> {
    let mut cmd = Command::new("gdb");
    cmd.args(["-batch", "-nx"]);
    for e in exprs {
        cmd.arg("-ex").arg(format!("print/d {e}"));
    }
    let out = cmd.arg(lib).output().expect("run gdb");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let values: Vec<u64> = stdout
        .lines()
        .filter_map(|l| {
            l.split_once(" = ")
                .map(|(_, v)| v.trim().parse().expect("gdb number"))
        })
        .collect();
    assert_eq!(
        values.len(),
        exprs.len(),
        "gdb answered every expression for {}: {stdout}\n{}",
        lib.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    values
}

/// Compares every offset of the target's layout with `lib`'s DWARF.
fn check_layout_against_dwarf(target: &PythonTarget, lib: &Path) {
    let minor = target.version().1;
    let l = target.layout();
    let k = l.kernel;
    let off = |ty: &str, field: &str| format!("(long)&(({ty} *)0)->{field}");
    let frame_ty = if minor == 10 {
        "PyFrameObject"
    } else {
        "struct _PyInterpreterFrame"
    };
    let mut checks: Vec<(&str, String, u64)> = vec![
        (
            "interpreters.head",
            off("_PyRuntimeState", "interpreters.head"),
            l.runtime_interpreters_head as u64,
        ),
        (
            "interp next",
            off("PyInterpreterState", "next"),
            l.interp_next as u64,
        ),
        (
            "interp threads",
            off(
                "PyInterpreterState",
                if minor == 10 {
                    "tstate_head"
                } else {
                    "threads.head"
                },
            ),
            l.interp_threads_head as u64,
        ),
        (
            "tstate next",
            off("PyThreadState", "next"),
            l.tstate_next as u64,
        ),
        (
            "tstate thread_id",
            off("PyThreadState", "thread_id"),
            l.tstate_thread_id as u64,
        ),
        (
            "tstate frame",
            off(
                "PyThreadState",
                match minor {
                    10 => "frame",
                    11 | 12 => "cframe",
                    _ => "current_frame",
                },
            ),
            k.tstate_frame as u64,
        ),
        (
            "frame previous",
            off(frame_ty, if minor == 10 { "f_back" } else { "previous" }),
            k.frame_previous as u64,
        ),
        (
            "frame code",
            off(
                frame_ty,
                if minor == 13 {
                    "f_executable"
                } else {
                    "f_code"
                },
            ),
            k.frame_code as u64,
        ),
        (
            "frame instr",
            off(
                frame_ty,
                match minor {
                    10 => "f_lasti",
                    11 | 12 => "prev_instr",
                    _ => "instr_ptr",
                },
            ),
            k.frame_instr as u64,
        ),
        (
            "co_filename",
            off("PyCodeObject", "co_filename"),
            l.code_filename as u64,
        ),
        (
            "co_name",
            off("PyCodeObject", "co_name"),
            l.code_name as u64,
        ),
        (
            "co_firstlineno",
            off("PyCodeObject", "co_firstlineno"),
            l.code_firstlineno as u64,
        ),
        (
            "co_linetable",
            off("PyCodeObject", "co_linetable"),
            l.code_linetable as u64,
        ),
        ("ob_type", off("PyObject", "ob_type"), l.object_type as u64),
        (
            "tp_name",
            off("PyTypeObject", "tp_name"),
            l.type_name as u64,
        ),
        (
            "str length",
            off("PyASCIIObject", "length"),
            l.unicode_length as u64,
        ),
        (
            "str state",
            off("PyASCIIObject", "state"),
            l.unicode_state as u64,
        ),
        (
            "sizeof PyASCIIObject",
            "sizeof(PyASCIIObject)".into(),
            l.unicode_ascii_size as u64,
        ),
        (
            "sizeof PyCompactUnicodeObject",
            "sizeof(PyCompactUnicodeObject)".into(),
            l.unicode_compact_size as u64,
        ),
        (
            "bytes size",
            off("PyVarObject", "ob_size"),
            l.bytes_size as u64,
        ),
        (
            "bytes data",
            off("PyBytesObject", "ob_sval"),
            l.bytes_data as u64,
        ),
    ];
    if minor >= 11 {
        checks.push((
            "native_thread_id",
            off("PyThreadState", "native_thread_id"),
            l.tstate_native_thread_id.expect("3.11+ has it") as u64,
        ));
        checks.push((
            "co_qualname",
            off("PyCodeObject", "co_qualname"),
            l.code_qualname.expect("3.11+ has it") as u64,
        ));
        checks.push((
            "co_code_adaptive",
            off("PyCodeObject", "co_code_adaptive"),
            k.code_instructions as u64,
        ));
        checks.push((
            "frame entry",
            off(frame_ty, if minor == 11 { "is_entry" } else { "owner" }),
            k.frame_entry as u64,
        ));
    }
    match l.gil {
        GilLayout::InRuntime {
            locked,
            last_holder,
        } => {
            checks.push((
                "gil locked",
                off("_PyRuntimeState", "ceval.gil.locked"),
                locked as u64,
            ));
            checks.push((
                "gil last_holder",
                off("_PyRuntimeState", "ceval.gil.last_holder"),
                last_holder as u64,
            ));
        }
        GilLayout::PerInterpreter {
            interp_gil,
            locked,
            last_holder,
        } => {
            checks.push((
                "interp ceval.gil",
                off("PyInterpreterState", "ceval.gil"),
                interp_gil as u64,
            ));
            checks.push((
                "gil locked",
                off("struct _gil_runtime_state", "locked"),
                locked as u64,
            ));
            checks.push((
                "gil last_holder",
                off("struct _gil_runtime_state", "last_holder"),
                last_holder as u64,
            ));
        }
        // pyenv's builds all have a GIL (free-threaded 3.13t: tests/tests/python_ft.rs).
        GilLayout::FreeThreaded { .. } => panic!("pyenv's CPython has a GIL"),
    }
    if minor == 11 || minor == 12 {
        checks.push((
            "cframe current_frame",
            off("_PyCFrame", "current_frame"),
            k.cframe_current_frame as u64,
        ));
    }
    if minor >= 12 {
        checks.push((
            "FRAME_OWNED_BY_CSTACK",
            "(int)FRAME_OWNED_BY_CSTACK".into(),
            FRAME_OWNED_BY_CSTACK as u64,
        ));
    }
    let exprs: Vec<String> = checks.iter().map(|c| c.1.clone()).collect();
    let values = dwarf_values(lib, &exprs);
    for ((what, expr, ours), dwarf) in checks.iter().zip(values) {
        assert_eq!(*ours, dwarf, "3.{minor} {what} ({expr}): ours vs DWARF");
    }
    eprintln!(
        "3.{minor}: {} offsets agree with {}",
        checks.len(),
        lib.display()
    );
}

/// One expected frame: name, file (None: threading.py of the interpreter's stdlib), line
/// (None: any line within the function), first line.
struct Expect {
    name: String,
    in_script: bool,
    line: Option<u32>,
    first_line: Option<u32>,
}

fn script_frame(name: &str, line: u32, first_line: u32) -> Expect {
    Expect {
        name: name.into(),
        in_script: true,
        line: Some(line),
        first_line: Some(first_line),
    }
}

fn threading_frame(name: &str) -> Expect {
    Expect {
        name: name.into(),
        in_script: false,
        line: None,
        first_line: None,
    }
}

fn check_stack(label: &str, got: &[PythonFunction], expected: &[Expect]) {
    let names: Vec<&str> = got.iter().map(|f| f.name.as_str()).collect();
    let want: Vec<&str> = expected.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(
        names, want,
        "{label}: function names, innermost first: {got:#?}"
    );
    let script = script().display().to_string();
    for (f, e) in got.iter().zip(expected) {
        if e.in_script {
            assert_eq!(f.file, script, "{label}: file of {}", e.name);
        } else {
            assert!(
                f.file.ends_with("/threading.py"),
                "{label}: {} in threading.py, got {}",
                e.name,
                f.file
            );
        }
        if let Some(line) = e.line {
            assert_eq!(f.line, line, "{label}: line of {}", e.name);
        } else {
            assert!(
                f.line > f.first_line,
                "{label}: {} at line {} inside its body (starts at {})",
                e.name,
                f.line,
                f.first_line
            );
        }
        if let Some(first) = e.first_line {
            assert_eq!(f.first_line, first, "{label}: first line of {}", e.name);
        }
    }
}

/// Detects, lists threads, walks and resolves both threads of a running pystack.py.
/// What [`check_process`] found: the target, its threads by host tid, and the main, worker,
/// deep and spinner threads' host tids.
struct Checked {
    target: PythonTarget,
    threads: HashMap<u32, u64>,
    tids: [u32; 4],
}

fn check_process(running: &Running, expect_version: (u8, u8), dwarf: Option<&Path>) -> Checked {
    let pid = running.pid;
    let mut target = PythonTarget::detect(pid)
        .expect("detect")
        .unwrap_or_else(|| panic!("pid {pid}: no CPython detected"));
    assert_eq!(target.version(), expect_version);
    assert_eq!(
        target.kernel_layout().version,
        0x0300 | expect_version.1 as u32
    );
    eprintln!(
        "pid {pid}: CPython {:?} in {}, _PyRuntime at {:#x}",
        target.version(),
        target.interpreter_path().display(),
        target.runtime_address()
    );
    if let Some(lib) = dwarf {
        check_layout_against_dwarf(&target, lib);
    }

    let threads: HashMap<u32, u64> = target.threads().expect("threads").into_iter().collect();
    let main_tid = host_tid(pid, running.main_ns_tid);
    let worker_tid = host_tid(pid, running.worker_ns_tid);
    let deep_tid = host_tid(pid, running.deep_ns_tid);
    let spinner_tid = host_tid(pid, running.spinner_ns_tid);
    assert_eq!(main_tid, pid, "the main thread's host tid is the pid");
    let mut tids: Vec<u32> = threads.keys().copied().collect();
    tids.sort();
    let mut want = vec![main_tid, worker_tid, deep_tid, spinner_tid];
    want.sort();
    assert_eq!(tids, want, "host tids of the Python threads");

    let minor = expect_version.1;
    let qual = |class: &str, name: &str| {
        if minor >= 11 {
            format!("{class}.{name}")
        } else {
            name.to_string()
        }
    };

    // The main thread: <module> -> outer -> middlé -> inner_日本 (blocked in time.sleep).
    let frames = target.walk_thread(threads[&main_tid]).expect("walk main");
    let resolved: Vec<PythonFunction> = frames
        .iter()
        .map(|&f| target.resolve(f).expect("resolve"))
        .collect();
    check_stack(
        "main thread",
        &resolved,
        &[
            script_frame("inner_日本", mark("main-leaf"), def_line("inner_日本")),
            script_frame("middlé", mark("middle-call"), def_line("middlé")),
            script_frame("outer", mark("outer-call"), def_line("outer")),
            script_frame("<module>", mark("module-call"), 1),
        ],
    );
    let entries: Vec<bool> = frames.iter().map(|f| f.eval_entry).collect();
    // 3.10 runs every frame in its own eval call; from 3.11 Python-to-Python calls stay in the
    // caller's eval call, so only <module> (run by PyEval_EvalCode) begins one.
    let want_entries = if minor == 10 {
        vec![true; 4]
    } else {
        vec![false, false, false, true]
    };
    assert_eq!(entries, want_entries, "main thread's eval-entry flags");

    // The worker: threading's bootstrap -> Thread.run -> Worker.run -> Worker.spin_𠀀.
    let frames = target
        .walk_thread(threads[&worker_tid])
        .expect("walk worker");
    let resolved: Vec<PythonFunction> = frames
        .iter()
        .map(|&f| target.resolve(f).expect("resolve"))
        .collect();
    check_stack(
        "worker thread",
        &resolved,
        &[
            script_frame(
                &qual("Worker", "spin_𠀀"),
                mark("worker-leaf"),
                def_line("spin_𠀀"),
            ),
            script_frame(&qual("Worker", "run"), mark("worker-call"), def_line("run")),
            threading_frame(&qual("Thread", "run")),
            threading_frame(&qual("Thread", "_bootstrap_inner")),
            threading_frame(&qual("Thread", "_bootstrap")),
        ],
    );
    let entries: Vec<bool> = frames.iter().map(|f| f.eval_entry).collect();
    if minor == 10 {
        assert!(
            entries.iter().all(|&e| e),
            "3.10: every frame is an eval call"
        );
    } else {
        // Python-to-Python calls (`self.spin_𠀀()`, `self.run()`, `self._bootstrap_inner()`)
        // stay in the caller's eval call; Thread.run calls its target through
        // CALL_FUNCTION_EX, which enters a new one on 3.11-3.13 (3.13.0's libpython has no
        // `_PyEvalFramePushAndInit_Ex`, with which 3.14 inlines it); the thread's first frame
        // is run from C.
        assert_eq!(
            entries,
            vec![false, true, false, false, true],
            "worker's eval-entry flags on 3.{minor}"
        );
    }
    // The deep thread: recurse() 601 times, then map() (C) calls leaf(). The walk keeps the
    // innermost MAX_PYTHON_DEPTH frames: leaf, then recurse frames.
    let frames = target.walk_thread(threads[&deep_tid]).expect("walk deep");
    assert_eq!(
        frames.len(),
        MAX_PYTHON_DEPTH,
        "a deep stack is cut at the kernel's bound"
    );
    let resolved: Vec<PythonFunction> = frames
        .iter()
        .map(|&f| target.resolve(f).expect("resolve"))
        .collect();
    let mut expected = vec![
        script_frame("leaf", mark("deep-leaf"), def_line("leaf")),
        script_frame("recurse", mark("deep-through-c"), def_line("recurse")),
    ];
    while expected.len() < MAX_PYTHON_DEPTH {
        expected.push(script_frame(
            "recurse",
            mark("deep-recurse"),
            def_line("recurse"),
        ));
    }
    check_stack("deep thread", &resolved, &expected);
    let entries: Vec<bool> = frames.iter().map(|f| f.eval_entry).collect();
    // leaf() is called from C (map), so it begins an eval call on every version; from 3.11 the
    // recursive calls stay in one eval call, whose first frame is past the bound.
    let mut want_entries = vec![minor == 10; MAX_PYTHON_DEPTH];
    want_entries[0] = true;
    assert_eq!(entries, want_entries, "deep thread's eval-entry flags");

    // Every frame's code object is cached after the first resolve: resolving again is the
    // same answer.
    assert_eq!(
        target.resolve(frames[0]).expect("resolve again"),
        resolved[0]
    );
    Checked {
        target,
        threads,
        tids: [main_tid, worker_tid, deep_tid, spinner_tid],
    }
}

/// Each thread's native stack (function names, innermost first) by host tid, from gdb, which
/// unwinds by the objects' CFI and names inlined frames too.
fn native_stacks(pid: u32) -> HashMap<u32, Vec<String>> {
    let out = Command::new("gdb")
        .args([
            "-batch",
            "-nx",
            "-p",
            &pid.to_string(),
            "-ex",
            "thread apply all bt",
        ])
        .output()
        .expect("run gdb");
    let text = String::from_utf8_lossy(&out.stdout);
    let thread_re = regex::Regex::new(r"^Thread \d+ .*\(LWP (\d+)\)").unwrap();
    let frame_re = regex::Regex::new(r"^#\d+\s+(?:0x[0-9a-f]+ in )?(\S+) \(").unwrap();
    let mut stacks: HashMap<u32, Vec<String>> = HashMap::new();
    let mut current = None;
    for line in text.lines() {
        if let Some(c) = thread_re.captures(line) {
            current = Some(c[1].parse().expect("tid"));
        } else if let (Some(tid), Some(c)) = (current, frame_re.captures(line)) {
            stacks.entry(tid).or_default().push(c[1].to_string());
        }
    }
    assert!(!stacks.is_empty(), "gdb backtraces of pid {pid}: {text}");
    stacks
}

const EVAL: &str = "_PyEval_EvalFrameDefault";

/// Reads of the GIL's holder while the spinner thread runs Python without a pause.
const GIL_READS: usize = 200;

/// The GIL's holder is the spinner in most reads (the other threads take it only for the
/// moments they wake from their sleeps), and never a thread state the interpreter does not list.
fn check_gil_holder(checked: &mut Checked) {
    let spinner = checked.threads[&checked.tids[3]];
    let known: Vec<u64> = checked.threads.values().copied().collect();
    let mut by_spinner = 0;
    for _ in 0..GIL_READS {
        if let Some(holder) = checked.target.gil_holder().expect("read the GIL") {
            assert!(
                known.contains(&holder),
                "holder {holder:#x} is a listed thread state"
            );
            by_spinner += (holder == spinner) as usize;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(
        by_spinner * 2 > GIL_READS,
        "the spinner held the GIL in {by_spinner} of {GIL_READS} reads"
    );
    eprintln!("the spinner held the GIL in {by_spinner} of {GIL_READS} reads");
}

/// A native frame named `name`, as the symbolizer would give it.
fn native_frame(name: &str) -> Frame {
    Frame::named(name, None, FrameKind::User)
}

/// The eval-entry flags against the real native stacks: a complete walk has one entry frame
/// per native `_PyEval_EvalFrameDefault` frame, and merging puts each eval call's Python frames
/// where the native stack has that call (leaf() under map_next, C code between its caller and
/// it).
fn check_against_native_stacks(checked: &mut Checked, pid: u32, debug_info: bool) {
    // gdb attaches with ptrace, which needs root here (the workload is not gdb's child).
    needs_root!();
    let natives = native_stacks(pid);
    let [main_tid, worker_tid, deep_tid, _] = checked.tids;
    for tid in [main_tid, worker_tid] {
        let frames = checked
            .target
            .walk_thread(checked.threads[&tid])
            .expect("walk");
        let entries = frames.iter().filter(|f| f.eval_entry).count();
        let native = &natives[&tid];
        let evals = native.iter().filter(|n| *n == EVAL).count();
        assert_eq!(
            entries, evals,
            "thread {tid}: eval-entry frames vs native {EVAL} frames: {native:?}"
        );
    }
    let frames = checked
        .target
        .walk_thread(checked.threads[&deep_tid])
        .expect("walk");
    // The profile's merge (root first), fed gdb's native frames and the walked Python frames
    // with their names; glue kept, so that map()'s C code stays visible.
    let native: Vec<(Frame, ())> = natives[&deep_tid]
        .iter()
        .rev()
        .map(|name| (native_frame(name), ()))
        .collect();
    let mut symbols = PythonSymbols::new();
    let packed: Vec<u64> = frames
        .iter()
        .map(|f| {
            let p = PythonFrame::pack(f.code, f.instruction, f.identity, f.eval_entry);
            let function = checked.target.resolve(*f).expect("resolve");
            symbols.insert(symbol_key(p), function);
            p
        })
        .collect();
    let options = MergeOptions {
        keep_glue: true,
        show_gil: false,
        view: bpfprof::runtime::cpython::stacks::PythonView::Off,
    };
    let merged = merge(native, &packed, &symbols, &Default::default(), options, ());
    // Leaf first again, as gdb lists frames.
    let names: Vec<String> = merged
        .iter()
        .rev()
        .map(|(f, _)| match f.kind {
            FrameKind::Runtime(_) => format!("py:{}", f.name),
            _ => f.name.to_string(),
        })
        .collect();
    let leaf = names
        .iter()
        .position(|n| n == "py:leaf")
        .expect("leaf in the merged stack");
    let recurse = names
        .iter()
        .position(|n| n == "py:recurse")
        .expect("recurse");
    assert!(
        leaf + 1 < recurse
            && names[leaf + 1..recurse]
                .iter()
                .all(|n| !n.starts_with("py:")),
        "leaf, then map()'s C code, then its caller: {names:?}"
    );
    // A stripped interpreter (Debian's) names only its exported functions.
    if debug_info {
        assert!(
            names[leaf..recurse].iter().any(|n| n == "map_next"),
            "map_next between leaf and recurse: {names:?}"
        );
    }
    // Under leaf: time.sleep's C code, or the GIL wait it ends in while the spinner holds it.
    assert!(leaf > 0, "C code under leaf: {names:?}");
    if debug_info {
        assert!(
            names[..leaf].iter().any(|n| n == "time_sleep"),
            "time.sleep's C function under leaf: {names:?}"
        );
    }
}

fn pyenv_case(version: &str, expect: (u8, u8)) {
    let home = pyenv(version);
    let python = home.join("bin/python3");
    if !require(&python) {
        return;
    }
    let lib = home.join(format!("lib/libpython{}.{}.so.1.0", expect.0, expect.1));
    let running = start(&[python.to_str().unwrap()], true);
    let mut checked = check_process(&running, expect, Some(&lib));
    check_against_native_stacks(&mut checked, running.pid, true);
    check_gil_holder(&mut checked);
}

#[test]
fn pyenv_cpython_3_10() {
    pyenv_case("3.10.13", (3, 10));
}

#[test]
fn pyenv_cpython_3_11() {
    pyenv_case("3.11.7", (3, 11));
}

#[test]
fn pyenv_cpython_3_12() {
    pyenv_case("3.12.1", (3, 12));
}

#[test]
fn pyenv_cpython_3_13() {
    pyenv_case("3.13.0", (3, 13));
}

/// Debian's python3.11: a stripped, statically linked interpreter (`_PyRuntime` only in its
/// dynamic symbols); the 3.11 table from pyenv's DWARF serves it too.
#[test]
fn debian_cpython_3_11() {
    let python = Path::new("/usr/bin/python3.11");
    if !require(python) {
        return;
    }
    let running = start(&["/usr/bin/python3.11"], true);
    let mut checked = check_process(&running, (3, 11), None);
    check_against_native_stacks(&mut checked, running.pid, false);
    check_gil_holder(&mut checked);
}

/// A CPython in its own pid and mount namespaces: the interpreter's file is read through
/// `/proc/PID/root`, and the tids it reports (1 for its main thread) are translated to the
/// host's. 3.10 (thread ids from glibc's `struct pthread`) and 3.12 (`native_thread_id`).
fn namespaced_case(version: &str, expect: (u8, u8)) {
    needs_root!();
    let python = pyenv(version).join("bin/python3");
    if !require(&python) {
        return;
    }
    let running = start(
        &[
            "unshare",
            "--pid",
            "--fork",
            "--mount-proc",
            "--kill-child",
            python.to_str().unwrap(),
        ],
        false,
    );
    assert_eq!(
        running.main_ns_tid, 1,
        "the interpreter is pid 1 in its namespace"
    );
    assert_ne!(running.pid, 1);
    check_process(&running, expect, None);
}

#[test]
fn cpython_3_10_in_another_pid_and_mount_namespace() {
    namespaced_case("3.10.13", (3, 10));
}

#[test]
fn cpython_3_12_in_another_pid_and_mount_namespace() {
    namespaced_case("3.12.1", (3, 12));
}

/// Debian's python3.11 run from a copy on a tmpfs mounted only in the process's own mount
/// namespace: bpfprof's namespace has no such file, so detection must read the interpreter
/// through `/proc/PID/root`.
#[test]
fn cpython_from_a_file_only_its_mount_namespace_has() {
    needs_root!();
    let python = Path::new("/usr/bin/python3.11");
    if !require(python) {
        return;
    }
    let private = tempdir();
    let dir = private.path().display().to_string();
    let inside = format!(
        "mount -t tmpfs bpfprof-test {dir} && cp {} {dir}/ && exec {dir}/python3.11 \"$@\"",
        python.display()
    );
    let running = start(
        &[
            "unshare",
            "--pid",
            "--fork",
            "--mount-proc",
            "--kill-child",
            "sh",
            "-c",
            &inside,
            "sh",
        ],
        false,
    );
    let copy = private.path().join("python3.11");
    assert!(
        !copy.exists(),
        "the copy is invisible outside the namespace"
    );
    check_process(&running, (3, 11), None);
    let target = PythonTarget::detect(running.pid)
        .expect("detect")
        .expect("CPython");
    assert_eq!(target.interpreter_path(), &copy);
}

/// An interpreter whose file was deleted after it started (as a package upgrade does): its
/// path no longer opens, so detection reads the mapped file through `/proc/PID/map_files`.
#[test]
fn cpython_whose_file_was_deleted() {
    needs_root!();
    let python = Path::new("/usr/bin/python3.11");
    if !require(python) {
        return;
    }
    let dir = tempdir();
    let copy = dir.path().join("python3.11");
    std::fs::copy(python, &copy).expect("copy python3.11");
    let running = start(&[copy.to_str().unwrap()], false);
    std::fs::remove_file(&copy).expect("delete the copy");
    let target = PythonTarget::detect(running.pid)
        .expect("detect")
        .expect("CPython");
    assert!(
        target
            .interpreter_path()
            .to_string_lossy()
            .ends_with("(deleted)"),
        "maps shows the file deleted: {}",
        target.interpreter_path().display()
    );
    check_process(&running, (3, 11), None);
}

/// A thread running code in a subinterpreter has a thread state in each interpreter; the one
/// listed for it is the subinterpreter's, where it runs now, and its walk is the
/// subinterpreter's code. 3.13 only: up to 3.12, `_xxsubinterpreters.run_string` runs the code
/// on the subinterpreter's first thread state, the one made for the thread that created it
/// (CPython gh-109860), so no thread state says which thread runs it.
fn subinterpreter_case(python: &Path, expect: (u8, u8)) {
    if !require(python) {
        return;
    }
    let workload = workspace_root().join("tests/workloads/pysubinterp.py");
    let running = start_script(&[python.to_str().unwrap()], &workload, false);
    let pid = running.pid;
    let mut target = PythonTarget::detect(pid).expect("detect").expect("CPython");
    assert_eq!(target.version(), expect);
    let threads: HashMap<u32, u64> = target.threads().expect("threads").into_iter().collect();
    let main_tid = host_tid(pid, running.main_ns_tid);
    let sub_tid = host_tid(pid, running.worker_ns_tid);
    let mut tids: Vec<u32> = threads.keys().copied().collect();
    tids.sort();
    let mut want = vec![main_tid, sub_tid];
    want.sort();
    assert_eq!(tids, want, "one entry per thread");
    let text = std::fs::read_to_string(&workload).expect("read the workload");
    // The subinterpreter's code starts on the line of `SUB = f"""`.
    let sub_start = text
        .lines()
        .position(|l| l.starts_with("SUB = "))
        .expect("SUB in the workload") as u32;
    let in_sub = |name: &str| mark_in(&workload, name) - sub_start;
    let mut walk = |tid: u32| -> Vec<PythonFunction> {
        let frames = target.walk_thread(threads[&tid]).expect("walk");
        frames
            .iter()
            .map(|&f| target.resolve(f).expect("resolve"))
            .collect()
    };
    let sub = walk(sub_tid);
    let got: Vec<(&str, &str, u32)> = sub
        .iter()
        .map(|f| (f.name.as_str(), f.file.as_str(), f.line))
        .collect();
    assert_eq!(
        got,
        vec![
            ("sub_leaf", "<string>", in_sub("sub-leaf")),
            ("<module>", "<string>", in_sub("sub-module")),
        ],
        "the sub thread runs the subinterpreter's code"
    );
    let main = walk(main_tid);
    let got: Vec<(&str, u32)> = main.iter().map(|f| (f.name.as_str(), f.line)).collect();
    assert_eq!(
        got,
        vec![
            ("main_wait", mark_in(&workload, "main-wait")),
            ("<module>", mark_in(&workload, "main-module")),
        ]
    );
}

#[test]
fn subinterpreter_3_13() {
    subinterpreter_case(&pyenv("3.13.0").join("bin/python3"), (3, 13));
}

#[test]
fn a_process_without_python_is_not_a_target() {
    let mut sleep = Command::new("sleep");
    sleep.arg("30");
    let workload = Workload::spawn_command(sleep);
    let target = PythonTarget::detect(workload.pid()).expect("detect");
    assert!(target.is_none(), "sleep is no CPython");
}

/// CPython 3.9 has none of the layouts: detected as no target, and named as a CPython that
/// cannot be walked, with the reason.
#[test]
fn an_unsupported_cpython_is_not_a_target() {
    let python = pyenv("3.9.18").join("bin/python3");
    if !require(&python) {
        return;
    }
    let mut cmd = Command::new(&python);
    cmd.args(["-c", "import time; time.sleep(30)"]);
    let workload = Workload::spawn_command(cmd);
    // Until the interpreter has mapped libpython, the process is not yet a CPython.
    poll_until(READY_TIMEOUT, || {
        std::fs::read_to_string(format!("/proc/{}/maps", workload.pid()))
            .ok()
            .filter(|m| m.contains("libpython3.9"))
    })
    .expect("python 3.9 maps its libpython");
    let target = PythonTarget::detect(workload.pid()).expect("detect");
    assert!(target.is_none(), "3.9 is not supported");
    // Recognised, and named with the reason: never a silent profile without Python frames.
    let pid = workload.pid();
    match PythonTarget::probe(pid).expect("probe") {
        bpfprof::runtime::cpython::Probe::Unsupported(u) => {
            let said = u.to_string();
            assert!(
                said.starts_with("libpython3.9")
                    && said.contains(&format!(
                        "(CPython 3.9, pid {pid}): Python frames not supported by this bpfprof: \
                         versions before 3.10"
                    ))
                    && said.ends_with("; native frames only"),
                "the reason names the object, the version and the pid: {said}"
            );
        }
        _ => panic!("3.9 is recognised as a CPython bpfprof cannot walk"),
    }
}

#[test]
fn a_missing_process_is_an_error() {
    let err = PythonTarget::detect(u32::MAX - 1)
        .err()
        .expect("no such pid");
    assert!(
        matches!(err, bpfprof::Error::NoSuchProcess(_)),
        "NoSuchProcess: {err}"
    );
}

/// CPython frees code objects (3.10 frees its start-up modules' code after their import) and
/// puts later ones at their addresses: a frame recorded at an address whose code object was
/// named before is named after the object there now, and a frame recorded before (its
/// identity bits are the old object's) is not named at all. The script puts function
/// `bravo`'s code object (its fixed fields) over `alpha`'s, as when `alpha`'s block is
/// reused; it picks bravo's name so that their identity bits differ, as 127 in 128 do.
#[test]
fn a_code_object_at_the_address_of_one_named_before_is_named_anew() {
    use std::io::{BufRead, BufReader, Write};
    use std::process::Stdio;
    const SCRIPT: &str = r#"
import ctypes, os, sys
SOURCE = "def {}():\n    x = 1\n    return x\n"
def make(name):
    ns = {}
    exec(SOURCE.format(name), ns)
    return ns[name].__code__
def bits(code):
    # PythonFrame::identity_of the word the kernel reads: co_nfreevars and co_version from
    # 3.12, else the name's cached hash.
    if sys.version_info >= (3, 12):
        word = ctypes.c_uint64.from_address(id(code) + 88).value
    else:
        word = hash(code.co_name) % (1 << 64)
    mask = (1 << 64) - 1
    word ^= word >> 33
    word = (word * 0xFF51AFD7ED558CCD) & mask
    word ^= word >> 33
    word = (word * 0xC4CEB9FE1A85EC53) & mask
    return ((word ^ (word >> 33)) >> 57) or 1
alpha = make("alpha")
bravo = next(c for c in (make("bravo%d" % i) for i in range(1000)) if bits(c) != bits(alpha))
print(id(alpha), bits(alpha), bits(bravo), bravo.co_name, flush=True)
sys.stdin.readline()
# Past the reference count and the type, up to the variable part (3.11+'s bytecode).
ctypes.memmove(id(alpha) + 16, id(bravo) + 16, type(alpha).__basicsize__ - 16)
print("moved", flush=True)
sys.stdin.readline()
os._exit(0)
"#;
    for python in cpythons() {
        let mut child = Command::new(&python)
            .args(["-c", SCRIPT])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("run python");
        let mut stdin = child.stdin.take().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut line = || lines.next().expect("a line").expect("read a line");
        let said = line();
        let said: Vec<&str> = said.split_whitespace().collect();
        let code: u64 = said[0].parse().expect("id(alpha)");
        let alpha_bits: u8 = said[1].parse().expect("alpha's bits");
        let bravo_bits: u8 = said[2].parse().expect("bravo's bits");
        let bravo = said[3];
        let mut target = PythonTarget::detect(child.id())
            .expect("detect")
            .expect("CPython");
        let at = |instruction, identity| PythonFrame {
            code,
            instruction,
            identity,
            eval_entry: false,
        };
        let before = target.resolve(at(0, alpha_bits)).expect("resolve alpha");
        // Bits the object there does not have: a frame of another code object.
        let stranger = target.resolve(at(0, bravo_bits));
        writeln!(stdin).unwrap();
        assert_eq!(line(), "moved");
        let stale = target.resolve(at(1, alpha_bits));
        let after = target
            .resolve(at(1, bravo_bits))
            .expect("resolve at the same address");
        writeln!(stdin).unwrap();
        child.wait().unwrap();
        eprintln!(
            "{}: {} then {} ({alpha_bits:#x} then {bravo_bits:#x}); alpha's frame after: {:?}",
            python.display(),
            before.name,
            after.name,
            stale.as_ref().map(|f| &f.name).map_err(|e| e.to_string())
        );
        assert_eq!(before.name, "alpha", "{}", python.display());
        assert_eq!(after.name, bravo, "{}", python.display());
        let stale = stale.expect_err("a frame recorded before the change is not named");
        assert!(stale.to_string().contains("replaced"), "{stale}");
        assert!(stranger.is_err(), "{stranger:?}");
    }
}
