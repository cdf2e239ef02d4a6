//! End to end: `bpfprof dump --pid` against workloads whose threads are in known places: a C
//! program without frame pointers (a thread spinning in `spin_leaf`, one blocked in `read()`,
//! the main thread in `pthread_join`) and a Python program (its main thread spinning in
//! `spin_main` with the GIL, a thread named "worker-a" blocked on a lock) on every CPython
//! here (pyenv's 3.10-3.13, built without frame pointers, and Debian's 3.11). What a user
//! looks at is asserted: each thread's names (the OS's, and Python's `threading` names) and
//! state, the known functions in the right
//! threads in the right order, the GIL holder, the JSON parsing; that the target runs on
//! after the dump (a blocked call restarted, not failed); the errors' exit codes; and the text
//! as a terminal shows it, through tmux. Needs root (ptrace, kernel stacks).

use std::{path::Path, process::Command, time::Duration};

use bpfprof_tests::*;
use serde_json::Value;

/// How long bpfprof may take for one dump on a loaded machine (the tables of libpython are
/// built first).
const DUMP_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the threads may take to reach their known places on a loaded machine.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs `bpfprof dump --pid PID --json` plus `extra`; asserts it succeeded.
fn dump_json(pid: u32, extra: &[&str]) -> Value {
    let pid = pid.to_string();
    let mut args = vec!["dump", "--pid", &pid, "--json"];
    args.extend_from_slice(extra);
    let run = run_bpfprof(&args, DUMP_TIMEOUT);
    run.assert_code(exit::OK);
    serde_json::from_str(&run.stdout)
        .unwrap_or_else(|e| panic!("--json wrote no JSON ({e}):\n{}", run.stdout))
}

/// The thread of `dump` with id `tid`.
fn thread(dump: &Value, tid: u64) -> Option<&Value> {
    dump["threads"]
        .as_array()?
        .iter()
        .find(|t| t["tid"].as_u64() == Some(tid))
}

/// The thread of `dump` named `name`.
fn named<'a>(dump: &'a Value, name: &str) -> Option<&'a Value> {
    dump["threads"]
        .as_array()?
        .iter()
        .find(|t| t["name"].as_str() == Some(name))
}

/// A thread's frames, innermost first, as (kind, name).
fn frames(thread: &Value) -> Vec<(String, String)> {
    thread["frames"]
        .as_array()
        .map(|fs| {
            fs.iter()
                .map(|f| {
                    (
                        f["kind"].as_str().unwrap_or("").to_string(),
                        f["name"].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Where the first frame named `name` is, innermost first.
fn position(thread: &Value, name: &str) -> Option<usize> {
    frames(thread).iter().position(|(_, n)| n == name)
}

/// Whether `inner` is a frame called (directly or not) by `outer`.
fn called_by(thread: &Value, inner: &str, outer: &str) -> bool {
    matches!((position(thread, inner), position(thread, outer)), (Some(i), Some(o)) if i < o)
}

/// The scheduler state letter of thread `tid` of `pid` now.
fn state_now(pid: u32, tid: u64) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).ok()?;
    stat.rsplit_once(") ")?.1.chars().next()
}

#[test]
fn a_c_program_without_frame_pointers_shows_each_thread_where_it_is() {
    needs_root!();
    let target = Workload::spawn("nofp_dump", &[]);
    let pid = target.pid();
    // Until both threads are named and the reader blocks in read().
    let dump = poll_until(SETTLE_TIMEOUT, || {
        let dump = dump_json(pid, &[]);
        let reader = named(&dump, "reader")?;
        let spinner = named(&dump, "spinner")?;
        (reader["state"] == "S"
            && position(reader, "wait_for_input").is_some()
            && position(spinner, "spin_leaf").is_some())
        .then_some(dump)
    })
    .expect("the reader blocked in wait_for_input and the spinner in spin_leaf");
    let mut checks = Checks::new();
    checks.eq("pid", dump["pid"].as_u64(), Some(u64::from(pid)));
    checks.eq("python_version", &dump["python_version"], &Value::Null);
    checks.eq("threads", dump["threads"].as_array().map(Vec::len), Some(3));
    let spinner = named(&dump, "spinner").unwrap();
    let reader = named(&dump, "reader").unwrap();
    let main = thread(&dump, u64::from(pid)).expect("the main thread");
    // The spinner: its leaf, and the caller that a frame-pointer walk would lose.
    checks.check(called_by(spinner, "spin_leaf", "spin_loop"), || {
        format!("spinner: spin_leaf under spin_loop: {:?}", frames(spinner))
    });
    checks.eq(
        "spinner's innermost frame",
        frames(spinner).first().map(|f| f.1.as_str()),
        Some("spin_leaf"),
    );
    checks.eq("spinner's state", spinner["state"].as_str(), Some("R"));
    checks.eq("no GIL in C", &spinner["holds_gil"], &Value::Null);
    checks.eq(
        "no threading names in C",
        &spinner["python_name"],
        &Value::Null,
    );
    // The reader: blocked in read() called by wait_for_input, in the kernel's pipe read.
    let reader_frames = frames(reader);
    let read_at = reader_frames
        .iter()
        .position(|(k, n)| k == "native" && n.contains("read"));
    checks.check(
        read_at.is_some_and(|r| position(reader, "wait_for_input").is_some_and(|w| r < w)),
        || format!("reader: read under wait_for_input: {reader_frames:?}"),
    );
    checks.check(
        reader_frames
            .iter()
            .any(|(k, n)| k == "kernel" && n.contains("pipe_read")),
        || format!("reader: the kernel's pipe read: {reader_frames:?}"),
    );
    checks.check(reader["wchan"].as_str().is_some(), || {
        format!("reader's wchan: {}", reader["wchan"])
    });
    // The main thread in pthread_join, called by main.
    let main_frames = frames(main);
    checks.check(
        main_frames.iter().any(|(_, n)| n.contains("join")) && position(main, "main").is_some(),
        || format!("main thread: pthread_join under main: {main_frames:?}"),
    );
    // Every stack is whole: it ends at the thread's entry.
    for t in dump["threads"].as_array().unwrap() {
        let fs = frames(t);
        checks.eq(
            &format!("thread {} unwind", t["name"]),
            t["unwind"].as_str(),
            Some("complete"),
        );
        checks.check(
            fs.last().is_some_and(|(_, n)| n == "_start" || is_clone(n)),
            || format!("thread {}: outermost frame: {fs:?}", t["name"]),
        );
    }
    // The text: one header per thread with its name and state, the frames innermost first.
    let text = run_bpfprof(["dump", "--pid", &pid.to_string()], DUMP_TIMEOUT);
    text.assert_code(exit::OK);
    let spinner_tid = spinner["tid"].as_u64().unwrap();
    let header = format!("Thread {spinner_tid} \"spinner\" (running)");
    let lines: Vec<&str> = text.stdout.lines().collect();
    let at = lines.iter().position(|l| *l == header);
    checks.check(
        at.is_some_and(|i| {
            lines
                .get(i + 1)
                .is_some_and(|l| l.trim_start().starts_with("spin_leaf ("))
                && lines
                    .get(i + 2)
                    .is_some_and(|l| l.trim_start().starts_with("spin_loop ("))
        }),
        || {
            format!(
                "text: {header:?}, then spin_leaf, spin_loop:\n{}",
                text.stdout
            )
        },
    );
    checks.check(
        text.stdout.contains(&format!(
            "Thread {} \"reader\" (sleeping in ",
            reader["tid"].as_u64().unwrap()
        )),
        || format!("text: the reader sleeping:\n{}", text.stdout),
    );
    // Let go: every thread runs on (none left stopped or traced), and the reader's read()
    // was restarted, not failed (its thread would have ended).
    std::thread::sleep(Duration::from_millis(200));
    for t in dump["threads"].as_array().unwrap() {
        let tid = t["tid"].as_u64().unwrap();
        let now = state_now(pid, tid);
        checks.check(matches!(now, Some('R' | 'S')), || {
            format!("thread {tid} after the dump: state {now:?}")
        });
    }
    checks.finish();
}

/// pydump.py under `python`, for `seconds`.
fn pydump(python: &Path, seconds: &str) -> Workload {
    let mut cmd = Command::new(python);
    cmd.arg(workspace_root().join("tests/workloads/pydump.py"))
        .arg(seconds);
    Workload::spawn_command(cmd)
}

/// Dumps pydump until its worker blocks in `blocked_in_lock` and its main thread spins in
/// `spin_main`.
fn settled_python_dump(pid: u32, extra: &[&str]) -> Option<Value> {
    poll_until(SETTLE_TIMEOUT, || {
        let dump = dump_json(pid, extra);
        let main = thread(&dump, u64::from(pid))?;
        let worker = dump["threads"]
            .as_array()?
            .iter()
            .find(|t| t["tid"].as_u64() != Some(u64::from(pid)))?;
        (position(worker, "blocked_in_lock").is_some()
            && worker["state"] == "S"
            && position(main, "spin_main").is_some()
            && main["holds_gil"] == true)
            .then_some(dump)
    })
}

#[test]
fn python_threads_show_their_functions_their_states_and_the_gil_holder() {
    needs_root!();
    let mut checks = Checks::new();
    for python in cpythons() {
        let target = pydump(&python, "120");
        let pid = target.pid();
        let Some(dump) = settled_python_dump(pid, &[]) else {
            checks.check(false, || {
                format!(
                    "{}: the worker never showed blocked_in_lock with the main thread in \
                 spin_main holding the GIL; last dump:\n{}",
                    python.display(),
                    dump_json(pid, &[])
                )
            });
            continue;
        };
        let who = python.display().to_string();
        checks.check(dump["python_version"].as_str().is_some(), || {
            format!("{who}: python_version {}", dump["python_version"])
        });
        checks.eq(
            &format!("{who}: gil_holder"),
            dump["gil_holder"].as_u64(),
            Some(u64::from(pid)),
        );
        checks.eq(
            &format!("{who}: threads"),
            dump["threads"].as_array().map(Vec::len),
            Some(2),
        );
        let main = thread(&dump, u64::from(pid)).unwrap();
        let worker = dump["threads"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["tid"].as_u64() != Some(u64::from(pid)))
            .unwrap();
        checks.eq(
            &format!("{who}: worker holds the GIL"),
            &worker["holds_gil"],
            &Value::Bool(false),
        );
        // Python's own names of the threads.
        checks.eq(
            &format!("{who}: main's threading name"),
            main["python_name"].as_str(),
            Some("MainThread"),
        );
        checks.eq(
            &format!("{who}: worker's threading name"),
            worker["python_name"].as_str(),
            Some("worker-a"),
        );
        checks.eq(
            &format!("{who}: main runs Python"),
            &main["python"],
            &Value::Bool(true),
        );
        // Main: spin_main called by the module, as Python frames with their file and line.
        checks.check(called_by(main, "spin_main", "<module>"), || {
            format!("{who}: main: spin_main under <module>: {:?}", frames(main))
        });
        let spin = &main["frames"][position(main, "spin_main").unwrap()];
        checks.eq(
            &format!("{who}: spin_main's kind"),
            spin["kind"].as_str(),
            Some("python"),
        );
        checks.check(
            spin["file"]
                .as_str()
                .is_some_and(|f| f.ends_with("pydump.py"))
                && spin["line"]
                    .as_u64()
                    .is_some_and(|l| (22..=25).contains(&l)),
            || format!("{who}: spin_main's place: {spin}"),
        );
        // The worker: blocked_in_lock at its line, called by threading's Thread.run, with the
        // lock's native wait (the interpreter's C lock, the futex) inside it.
        checks.check(
            called_by(worker, "blocked_in_lock", "Thread.run")
                || called_by(worker, "blocked_in_lock", "run"),
            || {
                format!(
                    "{who}: worker: blocked_in_lock under Thread.run: {:?}",
                    frames(worker)
                )
            },
        );
        let blocked = &worker["frames"][position(worker, "blocked_in_lock").unwrap()];
        checks.eq(
            &format!("{who}: blocked_in_lock's line"),
            blocked["line"].as_u64(),
            Some(17),
        );
        let worker_frames = frames(worker);
        checks.check(
            worker_frames
                .iter()
                .take(position(worker, "blocked_in_lock").unwrap())
                .any(|(k, n)| k == "native" && n.contains("acquire_lock")),
            || format!("{who}: worker: the interpreter's lock wait inside blocked_in_lock: {worker_frames:?}"),
        );
        // Both native stacks are whole, to the thread's entry.
        for t in [main, worker] {
            let fs = frames(t);
            checks.check(
                fs.last().is_some_and(|(_, n)| n == "_start" || is_clone(n)),
                || format!("{who}: thread {}: outermost frame: {fs:?}", t["tid"]),
            );
        }
        // --python-only: the Python frames alone, as py-spy dump prints them.
        if let Some(only) = settled_python_dump(pid, &["--python-only"]) {
            for t in only["threads"].as_array().unwrap() {
                let fs = frames(t);
                checks.check(
                    !fs.is_empty() && fs.iter().all(|(k, _)| k == "python"),
                    || format!("{who}: --python-only thread {}: {fs:?}", t["tid"]),
                );
            }
        } else {
            checks.check(false, || format!("{who}: --python-only never settled"));
        }
    }
    checks.finish();
}

#[test]
fn dump_through_a_terminal_shows_the_gil_holder_and_the_blocked_thread() {
    needs_root!();
    let Some(tmux) = find_tool("tmux") else {
        assert!(
            !ci(),
            "tmux is needed under CI (cargo xtask setup installs it)"
        );
        eprintln!("skipping: no tmux");
        return;
    };
    let python = cpythons()
        .into_iter()
        .find(|p| p.to_string_lossy().contains("3.12"))
        .or_else(|| cpythons().into_iter().next())
        .expect("a CPython");
    let target = pydump(&python, "120");
    let pid = target.pid();
    settled_python_dump(pid, &[]).expect("pydump settles");
    let name = format!("bpfprof-dump-{}", std::process::id());
    let command = format!(
        "{} dump --pid {pid} --python-only; echo \"exit=$?\"; sleep 600",
        bpfprof_bin().display()
    );
    crate::tmux_session(&tmux, &name, 120, 40, &command);
    let kill = || {
        crate::tmux_kill(&tmux, &name);
    };
    let screen = poll_until(DUMP_TIMEOUT, || {
        let out = crate::tmux(&tmux, &name)
            .args(["capture-pane", "-p", "-t", &name])
            .output()
            .ok()?;
        let screen = String::from_utf8_lossy(&out.stdout).into_owned();
        screen.contains("exit=").then_some(screen)
    });
    kill();
    let screen = screen.expect("the dump ended in the terminal");
    let lines: Vec<&str> = screen.lines().collect();
    let mut checks = Checks::new();
    checks.check(screen.contains("exit=0"), || format!("exit 0:\n{screen}"));
    checks.check(
        lines
            .iter()
            .any(|l| l.starts_with(&format!("Process {pid} ")) && l.contains("CPython")),
        || format!("the process header:\n{screen}"),
    );
    // The main thread's line says it holds the GIL, its first frame is spin_main.
    let main_at = lines.iter().position(|l| {
        l.starts_with(&format!("Thread {pid} "))
            && l.contains(" [MainThread] ")
            && l.ends_with(", holds the GIL")
    });
    checks.check(
        main_at.is_some_and(|i| {
            lines
                .get(i + 1)
                .is_some_and(|l| l.trim_start().starts_with("spin_main ("))
        }),
        || format!("the main thread holding the GIL in spin_main:\n{screen}"),
    );
    // The worker sleeps in blocked_in_lock, at its line.
    let worker_at = lines.iter().position(|l| {
        l.starts_with("Thread ")
            && !l.starts_with(&format!("Thread {pid} "))
            && l.contains(" [worker-a] (sleeping")
    });
    checks.check(
        worker_at.is_some_and(|i| {
            lines.get(i + 1).is_some_and(|l| {
                l.trim_start().starts_with("blocked_in_lock (") && l.contains("pydump.py:17)")
            })
        }),
        || format!("the worker sleeping in blocked_in_lock:\n{screen}"),
    );
    checks.finish();
}

#[test]
fn bad_targets_get_clear_errors_and_distinct_exit_codes() {
    needs_root!();
    let run = run_bpfprof(["dump", "--pid", "999999999"], DUMP_TIMEOUT);
    run.assert_code(exit::NO_SUCH_TARGET);
    run.assert_stderr_mentions(&["no such process"]);
    let run = run_bpfprof(["dump", "--pid", "twelve"], DUMP_TIMEOUT);
    run.assert_code(exit::USAGE);
    run.assert_stderr_mentions(&["invalid target"]);
    // Another user's process, dumped by a user who may not trace it.
    let user = test_user("bpfprof-t1");
    let (_bin_dir, bin) = world_executable_bpfprof();
    let target = Workload::spawn("nofp_dump", &["60"]);
    let mut cmd = user.command(&bin);
    cmd.args(["dump", "--pid", &target.pid().to_string()]);
    let run = spawn_bpfprof_command(cmd).wait_timeout(DUMP_TIMEOUT);
    run.assert_code(exit::PERMISSION_DENIED);
    run.assert_stderr_mentions(&["permission denied"]);
    // A process traced already (here by this test, as a debugger would): refused, not stolen.
    let traced = Workload::spawn("nofp_dump", &["60"]);
    // SAFETY: plain ptrace request; the tracee is killed when `traced` drops.
    let seized = unsafe {
        libc::ptrace(
            libc::PTRACE_SEIZE,
            traced.pid() as libc::pid_t,
            0usize,
            0usize,
        )
    };
    assert_eq!(
        seized,
        0,
        "PTRACE_SEIZE: {}",
        std::io::Error::last_os_error()
    );
    let run = run_bpfprof(["dump", "--pid", &traced.pid().to_string()], DUMP_TIMEOUT);
    run.assert_code(exit::PERMISSION_DENIED);
    run.assert_stderr_mentions(&["traced already"]);
    // The process was not touched: no thread left stopped.
    for tid in std::fs::read_dir(format!("/proc/{}/task", target.pid())).unwrap() {
        let tid: u64 = tid.unwrap().file_name().to_string_lossy().parse().unwrap();
        let now = state_now(target.pid(), tid);
        assert!(matches!(now, Some('R' | 'S')), "thread {tid}: {now:?}");
    }
}

/// A user who is not root dumps their own C program: each thread's native frames reach its
/// outermost (`_start`, libc's thread entry). `/proc/PID/map_files` is refused to them
/// (EPERM), and bpfprof built no table past the first object: the walks ended at the first
/// frame; the path in the process's maps, checked against the mapped device and inode, opens
/// the same object.
#[test]
fn a_user_dumps_their_own_program_to_its_outermost_frames() {
    needs_root!();
    let user = test_user("bpfprof-t1");
    let dir = tempfile::Builder::new()
        .prefix("bpfprof-dump-user-")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let (_bin_dir, bin) = world_executable_bpfprof();
    let copy = dir.path().join("nofp_dump");
    user.give(&workload_path("nofp_dump"), &copy);
    let mut run_as_user = user.command(&copy);
    run_as_user.arg("60");
    let target = Workload::spawn_command(run_as_user);
    let pid = target.pid().to_string();
    let dump = poll_until(SETTLE_TIMEOUT, || {
        let mut cmd = user.command(&bin);
        cmd.args(["dump", "--pid", &pid, "--json"]);
        let run = spawn_bpfprof_command(cmd).wait_timeout(DUMP_TIMEOUT);
        run.assert_code(exit::OK);
        let dump: Value = serde_json::from_str(&run.stdout)
            .unwrap_or_else(|e| panic!("--json wrote no JSON ({e}):\n{}", run.stdout));
        let spinner = named(&dump, "spinner")?;
        position(spinner, "spin_leaf").is_some().then_some(dump)
    })
    .expect("the spinner in spin_leaf");
    let mut checks = Checks::new();
    for thread in dump["threads"].as_array().expect("threads") {
        let fs = frames(thread);
        checks.check(
            fs.last().is_some_and(|(_, n)| n == "_start" || is_clone(n)),
            || format!("thread {} ends at {:?}: {fs:?}", thread["tid"], fs.last()),
        );
    }
    let spinner = named(&dump, "spinner").unwrap();
    checks.check(called_by(spinner, "spin_leaf", "spin_loop"), || {
        format!("spinner: spin_leaf under spin_loop: {:?}", frames(spinner))
    });
    checks.finish();
}

/// Whether `name` is libc's thread entry: `clone3` by its DWARF, `__clone3` by its symbol
/// table (which bpfprof reads unless lines are asked for), `clone` on older libcs.
fn is_clone(name: &str) -> bool {
    name.trim_start_matches("__").starts_with("clone")
}
