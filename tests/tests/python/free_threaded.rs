//! End to end: a free-threaded CPython (3.13t, built from Debian's source by `cargo xtask
//! setup` at /opt/py313t), walked in the kernel with the layout read from its own
//! `_Py_DebugOffsets`: two threads running at once in different functions, each with its own
//! known split, both threads' frames with their own shares (within 3 points of each thread's
//! own `thread_time` measurement); `--python-gil` and `dump` say there is no GIL; py-spy beside
//! it where it reads 3.13t; and the offsets read compared with what the interpreter reports of
//! its own objects (`ctypes`) and threads. Needs root.

use std::{
    collections::HashMap,
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use bpfprof::runtime::cpython::PythonTarget;
use bpfprof_tests::*;

const TIMEOUT: Duration = Duration::from_secs(120);
/// The free-threaded interpreter `cargo xtask setup` builds.
const PY313T: &str = "/opt/py313t/bin/python3.13t";
/// Most a thread's measured share may differ from its own measure.
const TOLERANCE: f64 = 0.03;

/// Two threads at once: `a` runs `a_hot` 3000 iterations for each 1000 of `a_cold` (3:1), `b`
/// runs `b_hot` 1000 for each 2000 of `b_cold` (1:2). Each thread's CPU time in each function
/// is summed, and all four written to `argv[1]` ("a_hot a_cold b_hot b_cold", nanoseconds)
/// every tenth of a second, for `argv[2]` seconds.
const WORKLOAD: &str = "import os, sys, threading, time
def a_hot():
    x = 0
    for i in range(3000): x += i
def a_cold():
    x = 0
    for i in range(1000): x += i
def b_hot():
    x = 0
    for i in range(1000): x += i
def b_cold():
    x = 0
    for i in range(2000): x += i
times = {'a': (0, 0), 'b': (0, 0)}
def worker(name, hot, cold, end):
    h = c = 0
    while time.monotonic() < end:
        t0 = time.thread_time_ns()
        hot()
        t1 = time.thread_time_ns()
        cold()
        t2 = time.thread_time_ns()
        h += t1 - t0
        c += t2 - t1
        times[name] = (h, c)
def write(truth):
    a, b = times['a'], times['b']
    with open(truth + '.tmp', 'w') as f:
        f.write(f'{a[0]} {a[1]} {b[0]} {b[1]}')
    os.replace(truth + '.tmp', truth)
def main(truth, seconds):
    end = time.monotonic() + seconds
    threads = [threading.Thread(target=worker, args=('a', a_hot, a_cold, end)),
               threading.Thread(target=worker, args=('b', b_hot, b_cold, end))]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        time.sleep(0.1)
        write(truth)
    write(truth)
assert not sys._is_gil_enabled(), 'a free-threaded build with its GIL off'
main(sys.argv[1], float(sys.argv[2]))
";

/// The free-threaded interpreter, when setup built it.
fn py313t() -> Option<&'static str> {
    if Path::new(PY313T).is_file() {
        return Some(PY313T);
    }
    assert!(
        !ci(),
        "{PY313T} is needed under CI (cargo xtask setup builds it)"
    );
    eprintln!("skipping: no {PY313T}");
    None
}

/// Each thread's CPU time so far in its two functions: `[a_hot, a_cold, b_hot, b_cold]`.
fn truth(path: &Path) -> [u64; 4] {
    poll_until(Duration::from_secs(20), || {
        let text = std::fs::read_to_string(path).ok()?;
        let v: Vec<u64> = text
            .split_whitespace()
            .filter_map(|n| n.parse().ok())
            .collect();
        (v.len() == 4 && v.iter().all(|&n| n > 0)).then(|| [v[0], v[1], v[2], v[3]])
    })
    .expect("the workload writes both threads' CPU times")
}

/// The share of the first function of the pair at `i` in the CPU time between two truths.
fn truth_share(t0: &[u64; 4], t1: &[u64; 4], i: usize) -> f64 {
    let hot = (t1[i] - t0[i]) as f64;
    let cold = (t1[i + 1] - t0[i + 1]) as f64;
    hot / (hot + cold)
}

/// How far a thread's sampled share may be from its own measure: [`TOLERANCE`], or three
/// standard errors of a share of `samples` samples where that is wider (on a loaded machine a
/// thread gets a few hundred samples in a run: 3 points is then under two standard errors).
fn share_bound(share: f64, samples: u64) -> f64 {
    TOLERANCE.max(3.0 * (share * (1.0 - share) / samples.max(1) as f64).sqrt())
}

/// Samples whose stack has the Python function `name` (`name` or `name (file:line)`).
fn count_function(profile: &Profile, name: &str) -> u64 {
    let prefix = format!("{name} (");
    profile.count_where(|f| f.iter().any(|x| x == name || x.starts_with(&prefix)))
}

/// The process's CPU time (user and system, in clock ticks) so far.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or(vec![], |(_, rest)| rest.split_whitespace().collect());
    // utime and stime: fields 14 and 15 of stat, 12 and 13 after the command's `)`.
    fields
        .get(11)
        .and_then(|u| u.parse::<u64>().ok())
        .unwrap_or(0)
        + fields
            .get(12)
            .and_then(|s| s.parse::<u64>().ok())
            .unwrap_or(0)
}

#[test]
fn free_threaded_313t_two_threads_at_once_each_with_its_own_shares() {
    needs_root!();
    let Some(python) = py313t() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("ft.py");
    std::fs::write(&script, WORKLOAD).unwrap();
    let truth_path = dir.path().join("truth.txt");
    let mut cmd = Command::new(python);
    cmd.arg(&script).arg(&truth_path).arg("60");
    // The GIL stays off whatever the environment says (3.13t would take it again for an
    // extension that does not declare itself free-threading safe; this script imports none).
    cmd.env("PYTHON_GIL", "0");
    let target = Workload::spawn_command(cmd);
    let pid = target.pid();
    truth(&truth_path);
    let mut checks = Checks::new();

    let out = dir.path().join("run.folded");
    let pid_arg = pid.to_string();
    let (ticks0, wall0) = (cpu_ticks(pid), Instant::now());
    let t0 = truth(&truth_path);
    let run = run_bpfprof(
        [
            "-F",
            "999",
            "-d",
            "8s",
            "--pid",
            &pid_arg,
            "--python-gil",
            "-o",
            out.to_str().unwrap(),
        ],
        TIMEOUT,
    );
    let t1 = truth(&truth_path);
    let (ticks1, wall) = (cpu_ticks(pid), wall0.elapsed());
    run.assert_code(exit::OK);
    let profile = Profile::read(&out);
    // Threads truly running at once: on a machine with a CPU to spare for each, the process
    // runs more than one CPU's worth (said, not asserted: other work here takes CPUs too).
    let ticks_per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let cpus_busy = (ticks1 - ticks0) as f64 / ticks_per_second / wall.as_secs_f64();
    eprintln!("3.13t: the process ran {cpus_busy:.2} CPUs' worth during the profile");

    for (label, hot, cold, at) in [("a", "a_hot", "a_cold", 0), ("b", "b_hot", "b_cold", 2)] {
        let truth = truth_share(&t0, &t1, at);
        let (h, c) = (
            count_function(&profile, hot),
            count_function(&profile, cold),
        );
        let measured = h as f64 / (h + c).max(1) as f64;
        eprintln!(
            "thread {label}: {hot} {measured:.3} of {} samples, its own measure {truth:.3}",
            h + c
        );
        checks.check(h + c >= 150, || {
            format!(
                "thread {label}: {h} samples under {hot}, {c} under {cold}: too few Python \
                 frames\n{}",
                profile.top(8)
            )
        });
        let bound = share_bound(truth, h + c);
        checks.check((measured - truth).abs() <= bound, || {
            format!(
                "thread {label}: {hot}'s share {measured:.3}, its own measure {truth:.3} \
                 (bound {bound:.3})"
            )
        });
    }
    // `--python-gil`: no GIL to hold, said on every Python stack rather than guessed.
    let python_stacks = profile.count_where(|f| {
        f.iter()
            .any(|x| x.starts_with("a_") || x.starts_with("b_") || x.starts_with("worker"))
    });
    let said = profile.count_containing("[free-threaded: no GIL]");
    let guessed =
        profile.count_containing("[GIL held]") + profile.count_containing("[GIL not held]");
    checks.check(
        python_stacks > 0 && said >= python_stacks && guessed == 0,
        || {
            format!(
                "--python-gil: {said} stacks say there is no GIL, {guessed} guess a holder, of \
             {python_stacks} Python stacks\n{}",
                profile.top(5)
            )
        },
    );

    // `dump`: no GIL, and no thread said to hold one; both workers in their own functions.
    let dump = run_bpfprof(["dump", "--json", "--pid", &pid_arg], TIMEOUT);
    dump.assert_code(exit::OK);
    let json: serde_json::Value = serde_json::from_str(&dump.stdout).expect("dump's JSON");
    checks.check(json["gil"] == "free-threaded: no GIL", || {
        format!("dump's gil: {}", json["gil"])
    });
    checks.check(json["python_version"] == "3.13", || {
        format!("dump's python_version: {}", json["python_version"])
    });
    let threads = json["threads"].as_array().cloned().unwrap_or_default();
    checks.check(
        threads.iter().all(|t| t["holds_gil"].is_null()) && json["gil_holder"].is_null(),
        || format!("dump says a thread holds a GIL:\n{}", dump.stdout),
    );
    // Both workers' Python frames, each under `worker` (the thread may be stopped in `worker`
    // itself, between its calls, as well as in its leaves).
    let workers = threads
        .iter()
        .filter(|t| {
            t["frames"].as_array().is_some_and(|f| {
                f.iter()
                    .any(|f| f["kind"] == "python" && f["name"] == "worker")
            })
        })
        .count();
    checks.check(workers == 2, || {
        format!(
            "dump has {workers} threads in `worker`, not 2:\n{}",
            dump.stdout
        )
    });
    let text = run_bpfprof(["dump", "--pid", &pid_arg], TIMEOUT);
    checks.check(
        text.stdout
            .contains("(CPython 3.13, free-threaded: no GIL)")
            && !text.stdout.contains("holds the GIL"),
        || format!("dump's text:\n{}", text.stdout),
    );

    // py-spy beside it, where it reads 3.13t.
    if let Some(py_spy) = py_spy() {
        let raw = dir.path().join("py-spy.txt");
        let t0 = truth(&truth_path);
        let spy = Command::new(&py_spy)
            .args([
                "record",
                "--nonblocking",
                "--pid",
                &pid_arg,
                "-d",
                "4",
                "-r",
                "200",
                "-f",
                "raw",
                "-o",
            ])
            .arg(&raw)
            .output()
            .expect("py-spy runs");
        let t1 = truth(&truth_path);
        let text = std::fs::read_to_string(&raw).unwrap_or_default();
        // py-spy 0.4.3 lists 3.13t's threads but reads none of their frames: each sample is
        // an empty stack (" N").
        let framed = text
            .lines()
            .any(|l| l.contains("a_hot (") || l.contains("b_hot ("));
        if !spy.status.success() || !framed {
            eprintln!(
                "py-spy does not read 3.13t's frames ({}; its output: {:?}): {}",
                spy.status,
                text.chars().take(200).collect::<String>(),
                String::from_utf8_lossy(&spy.stderr).trim()
            );
        } else {
            for (hot, cold, at) in [("a_hot", "a_cold", 0), ("b_hot", "b_cold", 2)] {
                let (mut h, mut c) = (0u64, 0u64);
                for line in text.lines() {
                    let Some((stack, n)) = line.rsplit_once(' ') else {
                        continue;
                    };
                    let n: u64 = n.parse().unwrap_or(0);
                    if stack.contains(&format!("{hot} (")) {
                        h += n;
                    } else if stack.contains(&format!("{cold} (")) {
                        c += n;
                    }
                }
                let truth = truth_share(&t0, &t1, at);
                eprintln!(
                    "py-spy: {hot} {:.3} of {} samples, its thread's own measure {truth:.3}",
                    h as f64 / (h + c).max(1) as f64,
                    h + c
                );
            }
        }
    }
    drop(target);
    checks.finish();
}

/// Offsets and ids as the interpreter reports them of its own objects (through `ctypes`):
/// for each field, the offsets in the object where the value the interpreter gives for it
/// lies (a code object's name, file name, line table, first line; a `str`'s length and
/// characters; a `bytes`' size and contents; an object's type), and the native ids of the
/// main thread and of a worker. Written to `argv[1]` as `key offset offset ...` lines, then
/// the main thread parks in `Parked.park`.
const LAYOUT_SCRIPT: &str = "import ctypes, sys, threading, time
def words(obj, value, span=256):
    return [o for o in range(0, span, 8) if ctypes.c_uint64.from_address(id(obj) + o).value == value]
def ints(obj, value, span=256):
    return [o for o in range(0, span, 4) if ctypes.c_int32.from_address(id(obj) + o).value == value]
def data(obj, raw, span=256):
    return [o for o in range(0, span, 8) if ctypes.string_at(id(obj) + o, len(raw)) == raw]
class Parked:
    def park(self, out):
        ready = threading.Event()
        worker = threading.Thread(target=lambda: (ready.set(), time.sleep(1000)), daemon=True)
        worker.start()
        ready.wait()
        code = Parked.park.__code__
        name = 'parked-string-ft'
        blob = b'bytes-of-the-free-threaded-build'
        lines = {
            'object_type': words(code, id(type(code)), 64),
            'code_name': words(code, id(code.co_name)),
            'code_qualname': words(code, id(code.co_qualname)),
            'code_filename': words(code, id(code.co_filename)),
            'code_linetable': words(code, id(code.co_linetable)),
            'code_firstlineno': ints(code, code.co_firstlineno),
            'unicode_length': words(name, len(name), 64),
            'unicode_ascii_size': data(name, name.encode(), 96),
            'bytes_size': words(blob, len(blob), 64),
            'bytes_data': data(blob, blob, 96),
            'native_ids': [threading.get_native_id(), worker.native_id],
            'gil_enabled': [int(sys._is_gil_enabled())],
        }
        with open(out + '.tmp', 'w') as f:
            for key, values in lines.items():
                f.write(key + ' ' + ' '.join(map(str, values)) + '\\n')
        import os
        os.replace(out + '.tmp', out)
        time.sleep(1000)  # parked here
Parked().park(sys.argv[1])
";

#[test]
fn free_threaded_313t_layout_matches_what_the_interpreter_reports() {
    needs_root!();
    let Some(python) = py313t() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("layout.py");
    std::fs::write(&script, LAYOUT_SCRIPT).unwrap();
    let report = dir.path().join("report.txt");
    let mut cmd = Command::new(python);
    cmd.arg(&script).arg(&report).env("PYTHON_GIL", "0");
    let running = Workload::spawn_command(cmd);
    let reported: HashMap<String, Vec<u64>> = poll_until(Duration::from_secs(30), || {
        let text = std::fs::read_to_string(&report).ok()?;
        Some(
            text.lines()
                .filter_map(|l| {
                    let mut words = l.split_whitespace();
                    let key = words.next()?.to_string();
                    Some((key, words.filter_map(|w| w.parse().ok()).collect()))
                })
                .collect(),
        )
    })
    .expect("the interpreter reports its offsets");
    let pid = running.pid();
    let mut target = PythonTarget::detect(pid)
        .expect("detect")
        .unwrap_or_else(|| panic!("pid {pid}: no CPython detected"));
    assert_eq!(target.version(), (3, 13));
    assert!(target.free_threaded(), "3.13t is a free-threaded build");
    assert_eq!(reported["gil_enabled"], [0], "its GIL is off");
    let layout = target.layout().clone();
    eprintln!("3.13t layout: {layout:#?}");
    let mut checks = Checks::new();
    // The longer object header: `ob_type` at 24, not 8.
    checks.check(layout.object_type == 24, || {
        format!("ob_type at {}, not 24", layout.object_type)
    });
    let ours = [
        ("object_type", layout.object_type),
        ("code_name", layout.code_name),
        ("code_qualname", layout.code_qualname.unwrap_or(u32::MAX)),
        ("code_filename", layout.code_filename),
        ("code_linetable", layout.code_linetable),
        ("code_firstlineno", layout.code_firstlineno),
        ("unicode_length", layout.unicode_length),
        ("unicode_ascii_size", layout.unicode_ascii_size),
        ("bytes_size", layout.bytes_size),
        ("bytes_data", layout.bytes_data),
    ];
    for (key, offset) in ours {
        let found = &reported[key];
        checks.check(found.contains(&(offset as u64)), || {
            format!("{key}: bpfprof reads offset {offset}, the interpreter's value is at {found:?}")
        });
    }
    // Its threads, by the native ids the interpreter reports (the process is in our pid
    // namespace: they are the host tids).
    let mut tids: Vec<u32> = target
        .threads()
        .expect("threads")
        .into_iter()
        .map(|(tid, _)| tid)
        .collect();
    tids.sort();
    let mut want: Vec<u32> = reported["native_ids"].iter().map(|&t| t as u32).collect();
    want.sort();
    checks.check(tids == want, || {
        format!("threads {tids:?}, the interpreter's {want:?}")
    });
    // The main thread's frames by the kernel's rules: parked in `Parked.park`, on its line.
    let park_line = LAYOUT_SCRIPT
        .lines()
        .position(|l| l.contains("# parked here"))
        .unwrap() as u32
        + 1;
    let threads: HashMap<u32, u64> = target.threads().unwrap().into_iter().collect();
    let frames = target.walk_thread(threads[&pid]).expect("walk main");
    let names: Vec<(String, u32)> = frames
        .iter()
        .filter_map(|&f| target.resolve(f).ok())
        .map(|f| (f.name, f.line))
        .collect();
    checks.check(
        names.first() == Some(&("Parked.park".to_string(), park_line))
            && names.get(1).is_some_and(|(n, _)| n == "<module>"),
        || format!("main thread's frames {names:?}, not Parked.park:{park_line} <module>"),
    );
    // No GIL: none to find, said so.
    let gil = target.gil_holder();
    checks.check(
        gil.as_ref()
            .is_err_and(|e| e.to_string().contains("free-threaded: no GIL")),
        || format!("the GIL holder of a free-threaded build: {gil:?}"),
    );
    drop(running);
    checks.finish();
}
