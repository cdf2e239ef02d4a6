//! `bpfprof dump`: every thread's current stack, native and Python, with its name, its
//! scheduler state and which thread holds the GIL, as `py-spy dump` prints them.
//!
//! The data flows: what can be read without stopping the target first (its unwind tables,
//! memory maps and interpreter), then one stop of every thread at once
//! ([`snapshot::stop_and_copy`]: registers, the used part of each stack, and the Python
//! thread states, GIL holder and frames), then, with the target running again, the native
//! walks over the copies ([`ProcessTables::walk`]), symbols, the Python frames' names
//! (code objects do not change) and the merge of Python frames into the native stacks at
//! each `_PyEval_EvalFrameDefault` ([`crate::runtime::cpython::stacks::merge`]).

use std::{collections::HashMap, io::Write, time::Duration};

use serde::Serialize;

use crate::{
    cli::{args::DumpArgs, terminal::escape},
    error::{exit_code, Error, Result},
    process::{
        maps::ProcessMaps,
        snapshot::{self, StoppedThread},
        target::{Target, TargetSpec},
    },
    runtime::cpython::{
        asyncio::{render_tree, LoopTasks},
        stacks::{merge, symbol_key, MergeOptions, PythonSymbols},
        Probe, PythonFrame, PythonTarget,
    },
    symbolize::{lookup_addresses, Frame, FrameKind, Symbolizer},
    unwind::walk::{ProcessTables, StackEnd, WalkEnd},
};

/// The Python side of a dump, read while the threads were stopped.
#[derive(Default)]
struct PythonReads {
    /// Host tid -> its frames (innermost first).
    frames: HashMap<u32, Vec<PythonFrame>>,
    /// The host tid whose thread state holds the GIL.
    gil_holder: Option<u32>,
    /// What a free-threaded build's GIL is now (see `PythonTarget::free_threaded_gil`).
    gil_said: Option<&'static str>,
    /// Each Python thread: host tid and thread state.
    threads: Vec<(u32, u64)>,
    /// Why the Python threads could not be read, if they could not.
    error: Option<String>,
}

/// One frame of a dumped stack, as the JSON output writes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DumpFrame {
    /// `python`, `native` or `kernel`.
    pub kind: &'static str,
    /// The function (a Python function's qualified name on 3.11+).
    pub name: String,
    /// The object file of a native frame, the source file of a Python frame.
    pub module: Option<String>,
    /// The source file, where known.
    pub file: Option<String>,
    /// The line being run, where known.
    pub line: Option<u32>,
}

/// One thread of a dump.
#[derive(Clone, Debug, Serialize)]
pub struct DumpThread {
    /// Its id in bpfprof's pid namespace.
    pub tid: u32,
    /// Its name (`comm`).
    pub name: String,
    /// Its Python `threading` name (`MainThread`, `Thread(name=...)`), where the interpreter
    /// has one.
    pub python_name: Option<String>,
    /// The scheduler state letter (R, S, D, T, t, Z, I).
    pub state: String,
    /// The state in words.
    pub state_name: &'static str,
    /// The kernel function a sleeping thread waits in.
    pub wchan: Option<String>,
    /// Whether it runs Python (has a thread state in the interpreter).
    pub python: bool,
    /// Whether it holds the GIL (`null` in a process without Python).
    pub holds_gil: Option<bool>,
    /// How long it was stopped, in microseconds.
    pub stopped_us: u64,
    /// How its native walk ended: `complete`, `early` or `cut`.
    pub unwind: Option<WalkEnd>,
    /// Why its native walk ended, in detail (`reason`: `entry`, `no_object`, `no_unwind_row`,
    /// `read_failed`, `not_above` or `depth_limit`, with the address and object concerned).
    pub unwind_end: Option<StackEnd>,
    /// Its frames, innermost first: kernel, then user (native and Python merged).
    pub frames: Vec<DumpFrame>,
}

/// A whole dump, as `--json` writes it.
#[derive(Clone, Debug, Serialize)]
pub struct Dump {
    /// The process id (in bpfprof's pid namespace).
    pub pid: u32,
    /// Its name.
    pub comm: String,
    /// `3.12` when it runs CPython, else `null`.
    pub python_version: Option<String>,
    /// The tid holding the GIL, `null` when it is free or there is no Python (or no GIL).
    pub gil_holder: Option<u32>,
    /// `free-threaded: no GIL` for a free-threaded build (no thread holds a GIL: said, not
    /// guessed), `free-threaded: GIL enabled` for one running with its GIL enabled (then
    /// `gil_holder` and `holds_gil` as in a GIL build), else `null`.
    pub gil: Option<String>,
    /// How long the process was stopped, in microseconds (first stop to last release).
    pub stopped_us: u64,
    /// Of which waiting for every thread to reach its stop (a thread waiting for a CPU stops
    /// only once scheduled), in microseconds.
    pub reaching_stop_us: u64,
    /// Of which reading the Python thread states and frames, in microseconds.
    pub python_read_us: u64,
    /// Why the Python threads could not be read, when they could not.
    pub python_error: Option<String>,
    /// Every thread, by tid.
    pub threads: Vec<DumpThread>,
    /// The asyncio tasks of each thread that has an event loop or tasks (CPython 3.14+):
    /// names, coroutines and who awaits each, as `python -m asyncio ps` lists them; `null`
    /// before 3.14 or without asyncio.
    pub asyncio: Option<Vec<LoopTasks>>,
    /// Why the asyncio tasks could not be read, when they could not.
    pub asyncio_error: Option<String>,
}

/// Runs `bpfprof dump`.
pub fn run(args: DumpArgs) -> Result<i32> {
    let spec: TargetSpec = args.pid.parse()?;
    let target = Target::resolve(&spec)?;
    if target.pid == std::process::id() {
        return Err(Error::Usage(
            "bpfprof dump cannot stop its own threads: give another process".into(),
        ));
    }
    let dump = take(&target, args.python_only)?;
    let mut out = std::io::stdout().lock();
    let written = if args.json {
        serde_json::to_writer_pretty(&mut out, &dump)
            .map_err(std::io::Error::from)
            .and_then(|()| writeln!(out))
    } else {
        out.write_all(render_text(&dump).as_bytes())
    };
    written.map_err(|e| Error::Output {
        path: "-".into(),
        source: e,
    })?;
    Ok(exit_code::OK)
}

/// Takes the dump of `target`.
pub fn take(target: &Target, python_only: bool) -> Result<Dump> {
    let pid = target.pid;
    // Everything that can be read with the target running, before it is stopped.
    let tables = ProcessTables::build(pid).map_err(|e| {
        if std::fs::metadata(format!("/proc/{pid}")).is_err() {
            Error::NoSuchProcess(format!("pid {pid} exited"))
        } else {
            Error::Other(e)
        }
    })?;
    for failed in &tables.failed {
        log::info!("no unwind table: {failed}");
    }
    // One process, named once: the command line's budget.
    let copies =
        crate::process::copies::CopyBudget::mib(crate::process::copies::DEFAULT_RECORD_COPY_MIB);
    let maps = ProcessMaps::capture(pid, target.ns_pid, &copies)?;
    // A CPython that cannot be walked is said (`python_error`), never left unsaid.
    let mut unsupported = None;
    let mut python = match PythonTarget::probe(pid) {
        Ok(Probe::Walkable(p)) => Some(*p),
        Ok(Probe::Unsupported(u)) => {
            log::warn!("{u}");
            unsupported = Some(u);
            None
        }
        Ok(Probe::NotPython(_)) => None,
        Err(e) => {
            log::warn!("pid {pid}: cannot read its interpreter: {e}");
            None
        }
    };
    // Where asyncio's tasks are, found before the stop (it searches the maps); the tasks are
    // read in the stop, with the stacks they belong to.
    let asyncio_layout = python.as_ref().map(|p| p.asyncio_layout());
    let (snapshot, (reads, asyncio_read)) = snapshot::stop_and_copy(pid, || {
        let Some(p) = python.as_mut() else {
            return (PythonReads::default(), None);
        };
        let reads = read_python(p);
        let tasks = match &asyncio_layout {
            Some(Ok(Some(layout))) => Some(p.read_asyncio_tasks(layout, &reads.threads, true)),
            _ => None,
        };
        (reads, tasks)
    })?;
    // The target runs again: unwind, name and merge from the copies.
    let mut walks: HashMap<u32, (Vec<u64>, StackEnd)> = HashMap::new();
    for (tid, thread) in &snapshot.threads {
        if let Some(regs) = thread.registers {
            let read = |addr: u64| {
                thread.stack.read_u64(addr).or_else(|| {
                    let live = snapshot::read_memory(pid, addr, 8);
                    Some(u64::from_le_bytes(live.try_into().ok()?))
                })
            };
            walks.insert(*tid, tables.walk_explained(regs, read));
        }
    }
    let mut symbolizer = Symbolizer::new();
    symbolizer.prepare_user(
        &maps,
        walks.values().flat_map(|(ips, _)| lookup_addresses(ips)),
    );
    let mut symbols = PythonSymbols::new();
    if let Some(p) = python.as_mut() {
        for frame in reads.frames.values().flatten() {
            let packed = PythonFrame::pack(frame.code, frame.instruction, frame.identity, false);
            if let std::collections::hash_map::Entry::Vacant(slot) =
                symbols.entry(symbol_key(packed))
            {
                match p.resolve(*frame) {
                    Ok(f) => {
                        slot.insert(f);
                    }
                    Err(e) => log::debug!("{e:#}"),
                }
            }
        }
    }
    // Thread names change rarely: read with the target running.
    let python_names = python
        .as_mut()
        .map(|p| p.threading_names(&reads.threads))
        .unwrap_or_default();
    // The task tree read in the stop (or now, where a thread had too many tasks), named now.
    let asyncio_read = match (&python, &asyncio_layout, asyncio_read) {
        (Some(p), Some(Ok(Some(layout))), Some(Ok(None))) => {
            Some(p.read_asyncio_tasks(layout, &reads.threads, false))
        }
        (_, _, read) => read,
    };
    let (asyncio, asyncio_error) = match (python.as_mut(), asyncio_layout, asyncio_read) {
        (Some(p), _, Some(Ok(Some(loops)))) => (Some(p.name_asyncio_tasks(loops)), None),
        (_, _, Some(Err(e))) | (_, Some(Err(e)), _) => (None, Some(format!("{e:#}"))),
        _ => (None, None),
    };
    let has_python = python.is_some() && reads.error.is_none();
    // A free-threaded build without its GIL: no thread can hold one. With it enabled at run
    // time, it is held as in a GIL build.
    let no_gil = reads.gil_said == Some(crate::runtime::cpython::FREE_THREADED_NO_GIL);
    let threads = snapshot
        .threads
        .values()
        .map(|thread| {
            let walk = walks.get(&thread.proc.tid);
            let native: Vec<(Frame, ())> = walk
                .map(|(ips, _)| {
                    let addrs: Vec<u64> = lookup_addresses(ips).collect();
                    addrs
                        .iter()
                        .rev()
                        .flat_map(|a| symbolizer.user(&maps, *a).to_vec())
                        .map(|f| (f, ()))
                        .collect()
                })
                .unwrap_or_default();
            let py = reads.frames.get(&thread.proc.tid);
            let packed: Vec<u64> = py
                .map(|frames| {
                    frames
                        .iter()
                        .map(|f| PythonFrame::pack(f.code, f.instruction, f.identity, f.eval_entry))
                        .collect()
                })
                .unwrap_or_default();
            let user = merge(
                native,
                &packed,
                &symbols,
                &Default::default(),
                MergeOptions::default(),
                (),
            );
            dump_thread(
                thread,
                python_names.get(&thread.proc.tid).cloned(),
                user.into_iter().map(|(f, ())| f).collect(),
                walk.map(|(_, end)| end.clone()),
                py.is_some(),
                (has_python && !no_gil).then_some(reads.gil_holder == Some(thread.proc.tid)),
                python_only,
            )
        })
        .collect();
    Ok(Dump {
        pid,
        comm: target.comm.clone(),
        python_version: python
            .as_ref()
            .map(|p| format!("{}.{}", p.version().0, p.version().1))
            .or_else(|| unsupported.as_ref().map(|u| u.version())),
        gil_holder: reads.gil_holder,
        gil: reads.gil_said.map(str::to_string),
        stopped_us: micros(snapshot.stopped),
        reaching_stop_us: micros(snapshot.reaching_stop),
        python_read_us: micros(snapshot.reads),
        python_error: reads
            .error
            .or_else(|| unsupported.as_ref().map(|u| u.to_string())),
        threads,
        asyncio,
        asyncio_error,
    })
}

/// Reads the Python threads, their frames and the GIL holder (while the target is stopped).
fn read_python(python: &mut PythonTarget) -> PythonReads {
    let mut out = PythonReads::default();
    let listing = match python.thread_listing() {
        Ok(l) => l,
        Err(e) => {
            out.error = Some(format!("{e:#}"));
            return out;
        }
    };
    out.gil_said = python.free_threaded_gil();
    // A thread state held by no live thread (3.12 before its GIL exists) holds nothing.
    let holder = python.gil_holder().ok().flatten();
    for &(tid, tstate) in &listing.python {
        if holder == Some(tstate) {
            out.gil_holder = Some(tid);
        }
        let frames = python.walk_thread(tstate).unwrap_or_default();
        out.frames.insert(tid, frames);
    }
    out.threads = listing.python;
    out
}

/// A thread of the dump from its snapshot and merged user frames (root first).
fn dump_thread(
    thread: &StoppedThread,
    python_name: Option<String>,
    user: Vec<Frame>,
    unwind_end: Option<StackEnd>,
    python: bool,
    holds_gil: Option<bool>,
    python_only: bool,
) -> DumpThread {
    let mut frames: Vec<DumpFrame> = Vec::new();
    let python_only = python_only && python;
    // A running thread's kernel stack is whatever it ran last (an interrupt's exit): only a
    // blocked thread's says what it waits in.
    if !python_only && thread.proc.state != 'R' {
        frames.extend(thread.proc.kernel_stack.iter().map(|name| DumpFrame {
            kind: "kernel",
            name: name.clone(),
            module: None,
            file: None,
            line: None,
        }));
    }
    for f in user.into_iter().rev() {
        if python_only && f.kind != crate::runtime::cpython::stacks::PYTHON_FRAME {
            continue;
        }
        frames.push(DumpFrame {
            kind: match f.kind {
                FrameKind::Runtime(tag) => tag.name(),
                FrameKind::Kernel => "kernel",
                FrameKind::User => "native",
            },
            name: f.name.to_string(),
            module: f.module.map(|m| m.to_string()),
            file: f.file.map(|f| f.to_string()),
            line: f.line,
        });
    }
    DumpThread {
        tid: thread.proc.tid,
        name: thread.proc.name.clone(),
        python_name,
        state: thread.proc.state.to_string(),
        state_name: state_name(thread.proc.state),
        wchan: thread.proc.wchan.clone(),
        python,
        holds_gil,
        stopped_us: micros(thread.stopped),
        unwind: unwind_end.as_ref().map(StackEnd::outcome),
        unwind_end,
        frames,
    }
}

/// A scheduler state letter in words, as `ps` documents them.
pub fn state_name(state: char) -> &'static str {
    match state {
        'R' => "running",
        'S' => "sleeping",
        'D' => "uninterruptible sleep",
        'T' => "stopped",
        't' => "tracing stop",
        'Z' => "zombie",
        'X' => "dead",
        'I' => "idle",
        'P' => "parked",
        _ => "unknown",
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// The text output: a header, then each thread's line and its frames, innermost first.
pub fn render_text(dump: &Dump) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let python = dump
        .python_version
        .as_ref()
        .map(|v| match &dump.gil {
            Some(gil) => format!(" (CPython {v}, {gil})"),
            None => format!(" (CPython {v})"),
        })
        .unwrap_or_default();
    let _ = writeln!(
        s,
        "Process {} {}{python}: {} threads, stopped {:.3} ms",
        dump.pid,
        escape(&dump.comm),
        dump.threads.len(),
        dump.stopped_us as f64 / 1000.0
    );
    if let Some(e) = &dump.python_error {
        if e.contains("Python frames not supported by this bpfprof") {
            let _ = writeln!(s, "{}", escape(e));
        } else {
            let _ = writeln!(s, "Python threads not read: {}", escape(e));
        }
    }
    for t in &dump.threads {
        let _ = writeln!(s);
        let mut line = format!("Thread {} \"{}\"", t.tid, escape(&t.name));
        if let Some(name) = &t.python_name {
            let _ = write!(line, " [{}]", escape(name));
        }
        let _ = write!(line, " ({}", t.state_name);
        if let Some(w) = t.wchan.as_ref().filter(|_| t.state != "R") {
            let _ = write!(line, " in {}", escape(w));
        }
        line.push(')');
        if t.holds_gil == Some(true) {
            line.push_str(", holds the GIL");
        }
        let _ = writeln!(s, "{line}");
        for f in &t.frames {
            let place = match (f.kind, &f.file, f.line, &f.module) {
                ("kernel", ..) => "[kernel]".to_string(),
                (_, Some(file), Some(line), _) => format!("{file}:{line}"),
                (_, _, _, Some(module)) => module.clone(),
                _ => String::new(),
            };
            let _ = writeln!(s, "    {} ({})", escape(&f.name), escape(&place));
        }
        if let Some(end) = &t.unwind_end {
            let _ = writeln!(s, "    [stack ends: {}]", escape(&end.describe()));
        }
    }
    for l in dump.asyncio.iter().flatten() {
        let _ = writeln!(s);
        let running = l
            .tasks
            .iter()
            .find(|t| t.id == l.running_task && t.id != 0)
            .map(|t| format!(", running {}", escape(&t.name)))
            .unwrap_or_default();
        let _ = writeln!(
            s,
            "asyncio tasks of thread {} ({} tasks{running}){}{}:",
            l.tid,
            l.tasks.len(),
            if l.cut { ", list cut" } else { "" },
            if l.read_in_stop {
                ""
            } else {
                ", read with the process running"
            }
        );
        for line in render_tree(&l.tasks) {
            let _ = writeln!(s, "{}", escape(&line));
        }
    }
    if let Some(e) = &dump.asyncio_error {
        let _ = writeln!(s, "asyncio tasks not read: {}", escape(e));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_names_each_thread_its_state_and_the_gil_holder() {
        let frame = |kind, name: &str, file: Option<&str>, line| DumpFrame {
            kind,
            name: name.into(),
            module: Some("m".into()),
            file: file.map(Into::into),
            line,
        };
        let thread = |tid, name: &str, state: char, gil, frames| DumpThread {
            tid,
            name: name.into(),
            python_name: (tid == 7).then(|| "MainThread".to_string()),
            state: state.to_string(),
            state_name: state_name(state),
            wchan: Some("do_nanosleep".into()),
            python: true,
            holds_gil: Some(gil),
            stopped_us: 100,
            unwind: Some(WalkEnd::Complete),
            unwind_end: Some(StackEnd::Entry),
            frames,
        };
        let dump = Dump {
            pid: 7,
            comm: "python3".into(),
            python_version: Some("3.12".into()),
            gil_holder: Some(7),
            gil: None,
            stopped_us: 1500,
            reaching_stop_us: 1000,
            python_read_us: 50,
            python_error: None,
            asyncio: None,
            asyncio_error: None,
            threads: vec![
                thread(
                    7,
                    "python3",
                    'R',
                    true,
                    vec![frame("python", "spin", Some("w.py"), Some(3))],
                ),
                thread(
                    8,
                    "python3",
                    'S',
                    false,
                    vec![frame("native", "clock_nanosleep", None, None)],
                ),
            ],
        };
        let text = render_text(&dump);
        assert!(text.starts_with("Process 7 python3 (CPython 3.12): 2 threads, stopped 1.500 ms"));
        assert!(text.contains(
            "Thread 7 \"python3\" [MainThread] (running), holds the GIL\n    spin (w.py:3)"
        ));
        assert!(text
            .contains("Thread 8 \"python3\" (sleeping in do_nanosleep)\n    clock_nanosleep (m)"));
        // A free-threaded build: no GIL, said in the header, and no thread holds one.
        let mut free = dump.clone();
        free.python_version = Some("3.13".into());
        free.gil_holder = None;
        free.gil = Some(crate::runtime::cpython::FREE_THREADED_NO_GIL.into());
        for t in &mut free.threads {
            t.holds_gil = None;
        }
        let text = render_text(&free);
        assert!(
            text.starts_with("Process 7 python3 (CPython 3.13, free-threaded: no GIL): 2 threads"),
            "{text}"
        );
        assert!(!text.contains("holds the GIL"), "{text}");
    }
}
