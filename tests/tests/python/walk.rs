//! End to end: Python frames read by the kernel program's CPython walk, with no trampoline and
//! no restart, on every CPython these machines have (pyenv's 3.10-3.13, built without frame
//! pointers, and Debian's 3.11): a 75:25 split between two Python functions (names, files,
//! lines, shares, next to py-spy on the same process), a 50-deep recursion, a thread pool, zlib
//! under its Python caller, attach and launch, a pid+mount namespace, and the Python client's
//! FunctionProfiler against the daemon. Each run has a counter-check: `--python off` has none
//! of the Python names. Needs root.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use bpfprof_tests::*;

const TIMEOUT: Duration = Duration::from_secs(90);
/// How long a workload runs before bpfprof attaches (interpreter start-up, imports).
const WARM_UP: Duration = Duration::from_millis(700);
/// The share of parent_hot among parent_hot + parent_cold by construction of pyhot.py (3 calls
/// to 1, the same work per call).
const HOT_SHARE: f64 = 0.75;
/// How far bpfprof's share may be from the workload's (the issue's ±3 points), or four
/// standard errors where fewer samples make that wider ([`Share::near_truth`]).
const SHARE_TOLERANCE: f64 = 0.03;
/// How far bpfprof's and py-spy's shares of the same run may differ. py-spy samples wall-clock
/// time, reading the running process (--nonblocking); within 2 points of bpfprof's on an idle
/// machine, it strayed to 0.799 (bpfprof 0.741, the workload's 0.75) on a loaded one.
const PY_SPY_TOLERANCE: f64 = 0.06;
/// pywalk.py's recursion depth and thread-pool size.
const DEPTH: usize = 50;
const WORKERS: usize = 3;
/// How long pywalk.py idles before its work when launched: bpfprof reads the new interpreter
/// (its unwind tables, its threads) and the kernel verifies the walker in the meantime, which
/// takes longer on a loaded machine (the verification alone 3-3.7 s at load 7); samples from
/// before that have no Python frames.
const LAUNCH_IDLE: &str = "4";
/// The length of the `--python off` counter-check runs.
const OFF_RUN: &str = "2s";

/// The CPythons under test: a label naming the version, and the interpreter.
fn pythons() -> Vec<(String, PathBuf)> {
    labelled_cpythons(true)
}

fn workload(name: &str) -> PathBuf {
    workspace_root().join("tests/workloads").join(name)
}

/// A frame's function: the name before ` (file:line)`.
fn function(frame: &str) -> &str {
    frame.split_once(" (").map_or(frame, |(name, _)| name)
}

/// Samples with a frame of `func` (with or without ` (file:line)`).
fn samples_in(profile: &Profile, func: &str) -> u64 {
    profile.count_where(|frames| frames.iter().any(|f| function(f) == func))
}

/// The CPU time pyhot.py (run with `PYHOT_TRUTH`) has spent in parent_hot and in
/// parent_cold so far, in ns.
fn measured_cpu(path: &Path) -> (u64, u64) {
    // Not written yet: the interpreter is still starting, and has done no work.
    let Ok(text) = std::fs::read_to_string(path) else {
        return (0, 0);
    };
    let mut fields = text.split_whitespace().map(|f| f.parse::<u64>().unwrap());
    (fields.next().unwrap(), fields.next().unwrap())
}

/// parent_hot's share of the CPU time pyhot.py spent in the two parents between two readings.
fn measured_share(before: (u64, u64), after: (u64, u64)) -> f64 {
    let hot = after.0 - before.0;
    let cold = after.1 - before.1;
    assert!(hot + cold > 0, "pyhot.py did no work while it was profiled");
    hot as f64 / (hot + cold) as f64
}

/// parent_hot's share of the samples under parent_hot or parent_cold.
fn hot_share(profile: &Profile) -> (f64, u64) {
    let hot = samples_in(profile, "parent_hot");
    let cold = samples_in(profile, "parent_cold");
    (hot as f64 / (hot + cold).max(1) as f64, hot + cold)
}

/// The line of `def func` in `script` and the lines its samples may have (the def and the
/// body), 1-based.
fn function_lines(script: &Path, func: &str) -> (u32, std::ops::RangeInclusive<u32>) {
    let text = std::fs::read_to_string(script).expect("read the workload");
    let lines: Vec<&str> = text.lines().collect();
    let def = lines
        .iter()
        .position(|l| l.starts_with(&format!("def {func}(")))
        .unwrap_or_else(|| panic!("no def {func} in {}", script.display()));
    let end = (def + 1..lines.len())
        .find(|&i| !lines[i].is_empty() && !lines[i].starts_with(' '))
        .unwrap_or(lines.len());
    // The def line counts: CPython gives a function's first instruction (RESUME) its line.
    (def as u32 + 1, def as u32 + 1..=end as u32)
}

/// The (file, first line, name) entries of a pstats file, read by Python's own pstats.
fn pstats_entries(path: &Path) -> BTreeSet<(String, u32, String)> {
    run_pstats(
        path,
        "import pstats, sys\nfor (f, l, n) in pstats.Stats(sys.argv[1]).stats: print(f, l, n, sep='\\t')",
    )
        .lines()
        .filter_map(|l| {
            let mut parts = l.split('\t');
            Some((
                parts.next()?.to_string(),
                parts.next()?.parse().ok()?,
                parts.next()?.to_string(),
            ))
        })
        .collect()
}

/// bpfprof's arguments for a recording to `out` (one or more `-o`).
fn record_args(outputs: &[&Path], extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = vec!["-F".into(), "999".into()];
    for out in outputs {
        args.push("-o".into());
        args.push(out.display().to_string());
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// The Python names of `names` that appear as frames of `profile`.
fn present(profile: &Profile, names: &[&str]) -> Vec<String> {
    names
        .iter()
        .filter(|n| samples_in(profile, n) > 0)
        .map(|n| n.to_string())
        .collect()
}

/// Attach (`--pid`) to pyhot.py on each CPython while py-spy records it too: the Python
/// functions with their file and lines, parent_hot's 3/4 within ±3 points, py-spy's share
/// within a few points of bpfprof's, the pstats entries keyed by the script's own lines; and
/// `--python off` on the same process has none of those names.
#[test]
fn split_by_pid_names_lines_and_shares_next_to_py_spy() {
    needs_root!();
    let py_spy = py_spy();
    assert!(
        py_spy.is_some() || !ci(),
        "py-spy is needed under CI (cargo xtask setup installs it)"
    );
    let script = workload("pyhot.py");
    let mut checks = Checks::new();
    for (label, python) in pythons() {
        let dir = tempdir();
        let truth_file = dir.path().join("truth.txt");
        let mut cmd = Command::new(&python);
        cmd.arg(&script).arg("30").env("PYHOT_TRUTH", &truth_file);
        let target = Workload::spawn_command(cmd);
        std::thread::sleep(WARM_UP);
        let pid = target.pid().to_string();
        let folded = dir.path().join("on.folded");
        let prof = dir.path().join("on.prof");
        let spy_out = dir.path().join("py-spy.txt");
        let spy = py_spy.as_ref().map(|bin| {
            let mut cmd = Command::new(bin);
            cmd.args(["record", "--format", "raw", "--nonblocking", "-r", "499"])
                .args(["-d", "4", "--pid", &pid, "-o"])
                .arg(&spy_out);
            cmd.stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped());
            cmd.spawn().expect("start py-spy")
        });
        let args = record_args(
            &[&folded, &prof],
            &["--line-numbers", "-d", "3s", "--pid", &pid],
        );
        let before = measured_cpu(&truth_file);
        run_bpfprof(&args, TIMEOUT).assert_code(exit::OK);
        let truth = measured_share(before, measured_cpu(&truth_file));
        let profile = Profile::read(&folded);
        let names = [
            "<module>",
            "work",
            "parent_hot",
            "leaf_hot",
            "parent_cold",
            "leaf_cold",
        ];
        let found = present(&profile, &names);
        checks.check(found.len() == names.len(), || {
            format!(
                "{label}: Python functions found {found:?} of {names:?}\n{}",
                profile.top(8)
            )
        });
        // Each hot function's frames name the script and lines inside its body.
        for func in ["parent_hot", "leaf_hot", "parent_cold", "leaf_cold"] {
            let (def, body) = function_lines(&script, func);
            let mut lines = BTreeSet::new();
            let mut files = BTreeSet::new();
            for frames in profile.stacks.keys() {
                for f in frames.iter().filter(|f| function(f) == func) {
                    let Some((file, line)) = f
                        .strip_prefix(&format!("{func} ("))
                        .and_then(|rest| rest.strip_suffix(')'))
                        .and_then(|loc| loc.rsplit_once(':'))
                    else {
                        files.insert(format!("no file:line in {f:?}"));
                        continue;
                    };
                    files.insert(file.to_string());
                    lines.insert(line.parse::<u32>().unwrap_or(0));
                }
            }
            checks.check(files.len() == 1 && files.contains("pyhot.py"), || {
                format!("{label}: {func}'s frames name files {files:?}, not pyhot.py")
            });
            checks.check(
                !lines.is_empty() && lines.iter().all(|l| body.contains(l)),
                || format!("{label}: {func}'s lines {lines:?} are not all in its body {body:?}"),
            );
            // pstats keys the function by its script and the line of its def, as cProfile.
            let entries = pstats_entries(&prof);
            let key = (script.display().to_string(), def, func.to_string());
            checks.check(entries.contains(&key), || {
                let near: Vec<_> = entries.iter().filter(|e| e.2 == func).collect();
                format!("{label}: pstats has no {key:?}; its {func} entries: {near:?}")
            });
        }
        let (share, n) = hot_share(&profile);
        eprintln!(
            "{label}: bpfprof parent_hot share {share:.3} of {n} samples; the workload measured \
             {truth:.3} over the run (by construction {HOT_SHARE})"
        );
        checks.check(
            Share::of(share, n).near_truth(truth, SHARE_TOLERANCE),
            || {
                format!(
                    "{label}: parent_hot has {share:.3} of {n} samples, the workload measured \
                 {truth:.3} of its CPU time in it over the run\n{}",
                    profile.top(8)
                )
            },
        );
        if let Some(spy) = spy {
            let out = spy.wait_with_output().expect("wait for py-spy");
            checks.check(out.status.success(), || {
                format!(
                    "{label}: py-spy failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                )
            });
            if out.status.success() {
                let theirs = Profile::read(&spy_out);
                let (spy_share, spy_n) = hot_share(&theirs);
                eprintln!("{label}: py-spy parent_hot share {spy_share:.3} of {spy_n} samples");
                // Where py-spy strays farther from the workload's own measurement than
                // bpfprof does, the disagreement is py-spy's (bpfprof's distance to that
                // measurement is checked above): seen on a loaded machine, py-spy 0.851 and
                // bpfprof 0.769 with the workload's 0.747.
                let spy_strays = (spy_share - truth).abs() > (share - truth).abs();
                checks.check(
                    spy_n > 0 && ((spy_share - share).abs() <= PY_SPY_TOLERANCE || spy_strays),
                    || {
                        format!(
                            "{label}: py-spy gives parent_hot {spy_share:.3} of {spy_n}, \
                             bpfprof {share:.3} of {n}, the workload measured {truth:.3}"
                        )
                    },
                );
            }
        }
        // The counter-check: the same process with the walk off has none of these names.
        let off = dir.path().join("off.folded");
        let args = record_args(&[&off], &["-d", OFF_RUN, "--python", "off", "--pid", &pid]);
        run_bpfprof(&args, TIMEOUT).assert_code(exit::OK);
        let off = Profile::read(&off);
        let found = present(&off, &names);
        checks.check(found.is_empty() && off.total() > 0, || {
            format!(
                "{label}: --python off still shows {found:?} ({} samples)",
                off.total()
            )
        });
    }
    checks.finish();
}

/// Samples of each thread (`--per-thread`'s `comm (tid N)` frame) that satisfy `pred`.
fn per_thread(profile: &Profile, mut pred: impl FnMut(&[String]) -> bool) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for (frames, n) in &profile.stacks {
        let Some(thread) = frames.get(1).filter(|f| f.contains("(tid ")) else {
            continue;
        };
        let entry = out.entry(thread.clone()).or_insert(0);
        if pred(frames) {
            *entry += n;
        }
    }
    out
}

/// Launch (`-- python3 pywalk.py`) on each CPython: a 50-deep recursion with every level, each
/// thread-pool worker's samples with pool_task under the executor's _worker, zlib's deflate
/// under its Python caller; `--python off` has none of the Python names.
#[test]
fn recursion_thread_pool_and_zlib_launched() {
    needs_root!();
    let script = workload("pywalk.py");
    let mut checks = Checks::new();
    for (label, python) in pythons() {
        let dir = tempdir();
        let record = |mode: &str| {
            let out = dir.path().join(format!("{mode}.folded"));
            let mut args = record_args(&[&out], &["--per-thread", "--python", mode, "--"]);
            args.push(python.display().to_string());
            args.push(script.display().to_string());
            args.push("3".into());
            args.push(LAUNCH_IDLE.into());
            run_bpfprof(&args, TIMEOUT).assert_code(exit::OK);
            Profile::read(&out)
        };
        let profile = record("auto");
        // Recursion: samples whose stack has exactly DEPTH recurse frames in a row, under main.
        let whole = profile.count_where(|f| {
            let Some(first) = f.iter().position(|x| x == "recurse") else {
                return false;
            };
            first > 0
                && f[first - 1] == "main"
                && f[first..].iter().take_while(|x| *x == "recurse").count() == DEPTH
                && f.get(first + DEPTH).is_some_and(|x| x == "compress_leaf")
        });
        let recursing = samples_in(&profile, "recurse");
        eprintln!("{label}: {whole} of {recursing} samples in recurse have all {DEPTH} levels");
        checks.check(recursing > 0 && whole as f64 >= 0.8 * recursing as f64, || {
            format!(
                "{label}: {whole} of {recursing} samples in recurse have main;recurse x{DEPTH};compress_leaf\n{}",
                profile.top(6)
            )
        });
        // zlib under its Python caller: compress_leaf, then zlib's C code.
        let native = profile.count_where(|f| {
            f.iter()
                .position(|x| x == "compress_leaf")
                .is_some_and(|i| {
                    f[i + 1..]
                        .iter()
                        .any(|x| x.starts_with("zlib_compress") || x.starts_with("deflate"))
                })
        });
        let leaf = samples_in(&profile, "compress_leaf");
        eprintln!("{label}: {native} of {leaf} samples in compress_leaf have zlib under it");
        checks.check(leaf > 0 && native as f64 >= 0.8 * leaf as f64, || {
            format!(
                "{label}: {native} of {leaf} samples in compress_leaf have zlib's C code under it"
            )
        });
        // Threads: each worker's samples carry pool_task under _worker. A new thread is
        // walked from the first tick after it starts (bpfprof reads the interpreter's thread
        // list every 200 ms); its samples before that have no Python frames (counted as
        // "not readable" in the summary), so they are bounded apart.
        let pool = per_thread(&profile, |f| {
            f.iter()
                .position(|x| x == "_worker")
                .is_some_and(|i| f[i..].iter().any(|x| x == "pool_task"))
        });
        let walked = per_thread(&profile, |f| f.iter().any(|x| x == "_worker"));
        let all = per_thread(&profile, |_| true);
        let workers: Vec<(&String, u64, u64, u64)> = pool
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(t, n)| (t, *n, walked[t], all[t]))
            .collect();
        eprintln!(
            "{label}: worker threads (thread, under _worker;pool_task, under _worker, all): \
             {workers:?}"
        );
        checks.check(workers.len() == WORKERS, || {
            format!("{label}: threads with pool_task samples: {workers:?} (all threads: {all:?})")
        });
        for (thread, n, walked, total) in &workers {
            checks.check(*n as f64 >= 0.95 * *walked as f64, || {
                format!("{label}: {thread}: {n} of {walked} samples under _worker have pool_task")
            });
            checks.check(*walked as f64 >= 0.6 * *total as f64, || {
                format!("{label}: {thread}: only {walked} of {total} samples have Python frames")
            });
        }
        // The counter-check: with the walk off none of the names, and the interpreter's frames.
        let off = record("off");
        let names = ["main", "recurse", "compress_leaf", "_worker", "pool_task"];
        let found = present(&off, &names);
        checks.check(found.is_empty() && off.total() > 0, || {
            format!("{label}: --python off still shows {found:?}")
        });
        checks.check(samples_in(&off, "_PyEval_EvalFrameDefault") > 0, || {
            format!(
                "{label}: --python off has no _PyEval_EvalFrameDefault frame\n{}",
                off.top(6)
            )
        });
    }
    checks.finish();
}

/// pywalk.py's recursion for the deep-stack test: beyond the default limit of 127 frames.
const DEEP: usize = 300;

#[test]
fn a_300_deep_recursion_keeps_its_python_frames_with_max_stack_length_512() {
    needs_root!();
    let script = workload("pywalk.py");
    let mut checks = Checks::new();
    for (label, python) in pythons() {
        let dir = tempdir();
        let record = |limit: &[&str]| {
            let out = dir.path().join("deep.folded");
            let mut args = record_args(&[&out], limit);
            args.push("--".into());
            args.push(python.display().to_string());
            args.push(script.display().to_string());
            args.push("3".into());
            args.push(LAUNCH_IDLE.into());
            args.push(DEEP.to_string());
            run_bpfprof(&args, TIMEOUT).assert_code(exit::OK);
            Profile::read(&out)
        };
        // Every level, from <module> through main down to compress_leaf.
        let whole_stack = |f: &[String]| {
            let Some(first) = f.iter().position(|x| x == "recurse") else {
                return false;
            };
            first > 0
                && f[first - 1] == "main"
                && f[..first].iter().any(|x| x == "<module>")
                && f[first..].iter().take_while(|x| *x == "recurse").count() == DEEP
                && f.get(first + DEEP).is_some_and(|x| x == "compress_leaf")
        };
        let whole = |profile: &Profile| profile.count_where(whole_stack);
        let deep = record(&["--max-stack-length", "512"]);
        let recursing = samples_in(&deep, "recurse");
        let all = whole(&deep);
        eprintln!("{label}: {all} of {recursing} samples in recurse have all {DEEP} levels");
        checks.check(
            recursing > 0 && all as f64 >= 0.8 * recursing as f64,
            || {
                format!(
                    "{label}: {all} of {recursing} samples in recurse have \
                 <module>;main;recurse x{DEEP};compress_leaf; the others:\n{}",
                    deep.shapes(5, |f| f.iter().any(|x| x == "recurse") && !whole_stack(f))
                )
            },
        );
        // The counter-check: the default limit of 127 cuts the Python frames too.
        let cut = record(&[]);
        let recursing = samples_in(&cut, "recurse");
        let all = whole(&cut);
        let truncated = cut.count_containing("[truncated]");
        eprintln!("{label}, default limit: {all} whole, {truncated} [truncated] of {recursing}");
        checks.check(
            recursing > 0 && all == 0 && truncated as f64 >= 0.8 * recursing as f64,
            || {
                format!(
                    "{label}, default limit: {all} of {recursing} samples in recurse are \
                     whole, {truncated} [truncated]\n{}",
                    cut.top(3)
                )
            },
        );
    }
    checks.finish();
}

/// `--pid NS:1` of pyhot.py as pid 1 of its own pid and mount namespace (`unshare --pid
/// --fork --mount-proc`) on each CPython: the Python functions and parent_hot's share.
#[test]
fn split_in_another_pid_and_mount_namespace() {
    needs_root!();
    let script = workload("pyhot.py");
    let mut checks = Checks::new();
    for (label, python) in pythons() {
        let dir = tempdir();
        let truth_file = dir.path().join("truth.txt");
        let mut cmd = Command::new("unshare");
        cmd.args(["--pid", "--fork", "--mount-proc", "--kill-child"])
            .arg(&python)
            .arg(&script)
            .arg("30")
            .env("PYHOT_TRUTH", &truth_file);
        let unshare = Workload::spawn_command(cmd);
        let child: u32 = poll_until(Duration::from_secs(5), || {
            std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", unshare.pid()))
                .ok()?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .expect("unshare's child");
        std::thread::sleep(WARM_UP);
        let target = format!("{}:1", pid_ns_inode(child));
        let out = dir.path().join("ns.folded");
        let args = record_args(&[&out], &["-d", "3s", "--pid", &target]);
        let before = measured_cpu(&truth_file);
        run_bpfprof(&args, TIMEOUT).assert_code(exit::OK);
        let truth = measured_share(before, measured_cpu(&truth_file));
        let profile = Profile::read(&out);
        let names = [
            "<module>",
            "work",
            "parent_hot",
            "leaf_hot",
            "parent_cold",
            "leaf_cold",
        ];
        let found = present(&profile, &names);
        checks.check(found.len() == names.len(), || {
            format!(
                "{label} in a namespace: found {found:?} of {names:?}\n{}",
                profile.top(8)
            )
        });
        let (share, n) = hot_share(&profile);
        eprintln!(
            "{label} in a namespace: parent_hot share {share:.3} of {n} samples; the workload \
             measured {truth:.3}"
        );
        checks.check(
            Share::of(share, n).near_truth(truth, SHARE_TOLERANCE),
            || {
                format!(
                    "{label} in a namespace: parent_hot has {share:.3} of {n} samples, the \
                 workload measured {truth:.3}\n{}",
                    profile.top(8)
                )
            },
        );
        let off = dir.path().join("off.folded");
        let args = record_args(
            &[&off],
            &["-d", OFF_RUN, "--python", "off", "--pid", &target],
        );
        run_bpfprof(&args, TIMEOUT).assert_code(exit::OK);
        let off = Profile::read(&off);
        let found = present(&off, &names);
        checks.check(found.is_empty() && off.total() > 0, || {
            format!("{label} in a namespace: --python off still shows {found:?}")
        });
    }
    checks.finish();
}

/// The Python client's FunctionProfiler against the real daemon on each CPython: the daemon's
/// profile has the kernel-walked Python frames parent_hot;leaf_hot (named as the walk names
/// them, not the `py::` names of 3.12+'s perf trampolines), about 3/4 of the split. On 3.10
/// and 3.11, which have no trampolines, the walk is the only source of these names.
#[test]
fn function_profiler_through_the_daemon() {
    needs_root!();
    let script = workload("pyhot.py");
    let daemon = Daemon::start(&[]);
    let mut checks = Checks::new();
    for (label, python) in pythons() {
        let dir = tempdir();
        let truth_file = dir.path().join("truth.txt");
        let out = Command::new(&python)
            .arg(&script)
            .args(["5", "client"])
            .arg(daemon.socket())
            .env("PYTHONPATH", workspace_root().join("python/src"))
            .env("PYHOT_TRUTH", &truth_file)
            .output()
            .expect("run the Python workload");
        if !out.status.success() {
            checks.check(false, || {
                format!(
                    "{label}: the client failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                )
            });
            continue;
        }
        let folded = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let profile = Profile::read(Path::new(&folded));
        let chain = profile.count_where(|f| {
            f.iter()
                .position(|x| x == "parent_hot")
                .is_some_and(|i| f[i + 1..].iter().any(|x| x == "leaf_hot"))
        });
        let (share, n) = hot_share(&profile);
        // The run covers the whole profiled call: the truth is all the work's.
        let truth = measured_share((0, 0), measured_cpu(&truth_file));
        eprintln!(
            "{label} through the daemon: parent_hot share {share:.3} of {n} samples; the \
             workload measured {truth:.3}"
        );
        checks.check(chain as f64 >= 0.5 * profile.total() as f64, || {
            format!(
                "{label}: {chain} of {} daemon samples under parent_hot;leaf_hot\n{}",
                profile.total(),
                profile.top(6)
            )
        });
        checks.check(
            Share::of(share, n).near_truth(truth, SHARE_TOLERANCE),
            || {
                format!(
                    "{label} through the daemon: parent_hot has {share:.3} of {n} samples, the \
                 workload measured {truth:.3}"
                )
            },
        );
    }
    checks.finish();
}

/// CPython 3.12+ with its perf trampolines on (`-X perf`, `PYTHONPERFSUPPORT=1`), attached: the walked
/// Python frames, and none of the trampolines' `py::` repeats of them; with `--python off` the
/// trampolines' frames are what names the Python functions.
#[test]
fn perf_trampolines_with_the_walk() {
    needs_root!();
    let script = workload("pyhot.py");
    let mut checks = Checks::new();
    for (label, python) in pythons() {
        let version = Command::new(&python)
            .args(["-c", "import sys; print(sys.version_info >= (3, 12))"])
            .output()
            .expect("run python");
        if String::from_utf8_lossy(&version.stdout).trim() != "True" {
            continue;
        }
        let dir = tempdir();
        for (how, mode) in [("-X perf", "auto"), ("PYTHONPERFSUPPORT=1", "off")] {
            let mut cmd = Command::new(&python);
            if how == "-X perf" {
                cmd.args(["-X", "perf"]);
            } else {
                cmd.env("PYTHONPERFSUPPORT", "1");
            }
            cmd.arg(&script).arg("30");
            let target = Workload::spawn_command(cmd);
            std::thread::sleep(WARM_UP);
            let pid = target.pid().to_string();
            let out = dir.path().join(format!("{mode}.folded"));
            let args = record_args(&[&out], &["-d", "2s", "--python", mode, "--pid", &pid]);
            run_bpfprof(&args, TIMEOUT).assert_code(exit::OK);
            let profile = Profile::read(&out);
            let trampolines = profile.count_where(|f| f.iter().any(|x| x.starts_with("py::")));
            // Samples with both: the trampolines repeating walked frames.
            let both = profile.count_where(|f| {
                f.iter().any(|x| x.starts_with("py::")) && f.iter().any(|x| x == "<module>")
            });
            let walked = profile.count_where(|f| {
                f.iter()
                    .position(|x| x == "parent_hot")
                    .is_some_and(|i| f[i + 1..].iter().any(|x| x == "leaf_hot"))
            });
            let total = profile.total();
            eprintln!(
                "{label} {how} --python {mode}: {walked} walked parent_hot;leaf_hot, \
                 {trampolines} with py:: frames ({both} also walked), of {total}"
            );
            if mode == "auto" {
                checks.check(
                    // Samples the kernel could not walk (a thread not yet known) keep theirs.
                    both == 0 && walked as f64 >= 0.5 * total as f64,
                    || {
                        format!(
                        "{label} {how}: {walked} of {total} samples under parent_hot;leaf_hot, \
                         {both} with walked and py:: frames\n{}",
                        profile.top(6)
                    )
                    },
                );
            } else {
                checks.check(
                    walked == 0 && trampolines as f64 >= 0.5 * total as f64,
                    || {
                        format!(
                        "{label} {how} --python off: {trampolines} of {total} samples with py:: \
                         frames, {walked} with walked ones\n{}",
                        profile.top(6)
                    )
                    },
                );
            }
        }
    }
    checks.finish();
}

/// pstats keys each Python function by its script and the line of its `def` in every run, as
/// cProfile does: without `--line-numbers` too (the daemon's runs, and so strobeclient's, have
/// none), where the other formats name functions without lines.
#[test]
fn pstats_keys_functions_by_their_def_line_without_line_numbers() {
    needs_root!();
    let script = workload("pyhot.py");
    let python = PathBuf::from("/usr/bin/python3.11");
    let mut cmd = Command::new(&python);
    cmd.arg(&script).arg("30");
    let target = Workload::spawn_command(cmd);
    std::thread::sleep(WARM_UP);
    let dir = tempdir();
    let prof = dir.path().join("cli.prof");
    let top = dir.path().join("cli.txt");
    let pid = target.pid().to_string();
    run_bpfprof(
        record_args(&[&prof, &top], &["-d", "2s", "--pid", &pid]),
        TIMEOUT,
    )
    .assert_code(exit::OK);
    let daemon = Daemon::start(&[]);
    let mut client = daemon.client();
    let id = client
        .run(bpfprof::protocol::RunRequest {
            pid: target.pid(),
            frequency: Some(999),
            duration_ms: Some(2000),
            ..Default::default()
        })
        .expect("daemon run")
        .run_id
        .unwrap();
    let reply = client.results(id, DAEMON_TIMEOUT).expect("daemon results");
    let daemon_prof = PathBuf::from(&reply.files.as_ref().unwrap()["pstats"]);
    let mut checks = Checks::new();
    for (run, path) in [("--pid", &prof), ("daemon", &daemon_prof)] {
        let entries = pstats_entries(path);
        for func in ["parent_hot", "leaf_hot", "parent_cold", "leaf_cold"] {
            let (def, _) = function_lines(&script, func);
            let key = (script.display().to_string(), def, func.to_string());
            checks.check(entries.contains(&key), || {
                let near: Vec<_> = entries.iter().filter(|e| e.2 == func).collect();
                format!("{run}: pstats has no {key:?}; its {func} entries: {near:?}")
            });
        }
    }
    // The top table still lists functions without lines when none were asked for.
    let table = std::fs::read_to_string(&top).unwrap();
    checks.check(
        table.contains("leaf_hot\n") && !table.contains("leaf_hot ("),
        || format!("the top table names leaf_hot with a line:\n{table}"),
    );
    checks.finish();
}

/// bpfprof's arguments to launch `python` on `pyshortcode.py` (ROUNDS functions after
/// [`LAUNCH_IDLE`], in `mode`), writing `outputs`.
fn pyshortcode_args(outputs: &[&Path], python: &Path, rounds: usize, mode: &str) -> Vec<String> {
    let mut args = record_args(outputs, &[]);
    args.push("--".into());
    args.push(python.display().to_string());
    args.push(workload("pyshortcode.py").display().to_string());
    args.push(rounds.to_string());
    args.push(LAUNCH_IDLE.into());
    args.push(mode.into());
    args
}

/// Functions compiled one after another, each freed once it ran (`pyshortcode.py ... drop`):
/// CPython puts each new code object where the last one was, so their frames differ only in
/// the identity bits the kernel records per frame. Each function gets its own name and no
/// more samples than its own CPU time earns (by the workload's own count); before the bits,
/// every one of them was named after the first. Functions whose address and bits are both
/// another's (1 in 128 pairs) cannot be told apart and are left out of the checks.
#[test]
fn functions_at_a_freed_functions_address_keep_their_own_names() {
    needs_root!();
    const ROUNDS: usize = 20;
    const HZ: f64 = 999.0;
    let mut checks = Checks::new();
    for (label, python) in pythons() {
        let dir = tempdir();
        let folded = dir.path().join("reused.folded");
        let args = pyshortcode_args(&[&folded], &python, ROUNDS, "drop");
        let run = run_bpfprof(&args, TIMEOUT);
        run.assert_code(exit::OK);
        // work_N ADDRESS BITS CPU_NS, from the workload.
        let functions: Vec<(String, u64, u64, f64)> = run
            .stdout
            .lines()
            .filter(|l| l.starts_with("work_"))
            .map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (
                    f[0].to_string(),
                    f[1].parse().expect("address"),
                    f[2].parse().expect("bits"),
                    f[3].parse::<f64>().expect("cpu ns") / 1e9,
                )
            })
            .collect();
        assert_eq!(functions.len(), ROUNDS, "{label}: {}", run.stdout);
        let profile = Profile::read(&folded);
        let reused = functions
            .iter()
            .enumerate()
            .filter(|(i, f)| functions[..*i].iter().any(|g| g.1 == f.1))
            .count();
        let alike = |f: &(String, u64, u64, f64)| {
            functions
                .iter()
                .filter(|g| g.1 == f.1 && g.2 == f.2)
                .count()
                > 1
        };
        let own: Vec<&(String, u64, u64, f64)> = functions.iter().filter(|f| !alike(f)).collect();
        let mut named = 0;
        let mut report = Vec::new();
        for (name, _, bits, cpu) in &own {
            let samples = samples_in(&profile, name) as f64;
            let earned = cpu * HZ;
            named += usize::from(samples > 0.0);
            report.push(format!(
                "{name} bits {bits}: {samples} samples, {earned:.0} earned"
            ));
            checks.check(samples <= earned * 1.25 + 3.0 * earned.sqrt() + 5.0, || {
                format!(
                    "{label}: {name} has {samples} samples for {cpu:.3} s of CPU ({earned:.0} \
                     at {HZ} Hz): another function's samples carry its name\n{}",
                    report.join("\n")
                )
            });
        }
        eprintln!(
            "{label}: {reused} of {ROUNDS} functions at an earlier one's address; {} with \
             address and bits of their own, {named} of them named; {} samples unnamed",
            own.len(),
            profile.count_containing("[unknown Python code]")
        );
        // The premise: CPython reused the addresses (it does so at once for a freed object).
        checks.check(reused >= ROUNDS / 2, || {
            format!("{label}: only {reused} functions reused an address: nothing was tested")
        });
        // Named while they live (0.15 s each): most are, on a loaded machine too.
        checks.check(named * 4 >= own.len() * 3, || {
            format!(
                "{label}: {named} of {} functions named\n{}\n{}",
                own.len(),
                report.join("\n"),
                profile.top(5)
            )
        });
    }
    checks.finish();
}

/// Functions whose names no one has hashed yet when they start (`pyshortcode.py ...
/// hash-late`: a new `str` as name, as Dynamo's generated code has), hashed 50 ms into their
/// 150 ms run, on the CPythons whose identity bits come from the name's cached hash (3.10,
/// 3.11): every function is named, and its frames recorded before the hash are too. With the
/// bits of the "not computed" hash recorded, those frames, named after the hash, read as
/// "replaced"; a torch.compile run lost 190 frames that way.
#[test]
fn frames_recorded_before_their_name_was_hashed_are_named() {
    needs_root!();
    const ROUNDS: usize = 20;
    let mut checks = Checks::new();
    let by_hash = pythons()
        .into_iter()
        .filter(|(label, _)| label.contains(" 3.10") || label.contains(" 3.11"));
    for (label, python) in by_hash {
        let dir = tempdir();
        let folded = dir.path().join("hash-late.folded");
        let args = pyshortcode_args(&[&folded], &python, ROUNDS, "hash-late");
        let run = run_bpfprof(&args, TIMEOUT);
        run.assert_code(exit::OK);
        // work_N UNHASHED, from the workload: the premise, each name unhashed at its start.
        let lines: Vec<&str> = run
            .stdout
            .lines()
            .filter(|l| l.starts_with("work_"))
            .collect();
        assert_eq!(lines.len(), ROUNDS, "{label}: {}", run.stdout);
        checks.check(lines.iter().all(|l| l.ends_with(" 1")), || {
            format!(
                "{label}: a name was hashed before its function ran:\n{}",
                run.stdout
            )
        });
        let profile = Profile::read(&folded);
        let unnamed: Vec<String> = (0..ROUNDS)
            .map(|n| format!("work_{n}"))
            .filter(|n| samples_in(&profile, n) == 0)
            .collect();
        let working = samples_in(&profile, "hash_late");
        let unknown_working = profile.count_where(|f| {
            f.iter().any(|x| x == "hash_late") && f.iter().any(|x| x == "[unknown Python code]")
        });
        eprintln!(
            "{label}: {} of {ROUNDS} functions named; {unknown_working} of {working} samples \
             under hash_late unnamed",
            ROUNDS - unnamed.len()
        );
        checks.check(unnamed.is_empty(), || {
            format!("{label}: not named: {unnamed:?}\n{}", profile.top(5))
        });
        // A third of each function's samples come before its hash: unnamed, they were far
        // more than this.
        checks.check(working > 0 && unknown_working * 20 <= working, || {
            format!(
                "{label}: {unknown_working} of {working} samples under hash_late have [unknown \
                 Python code] (at most 5%)\n{}",
                profile.top(5)
            )
        });
    }
    checks.finish();
}

/// New functions that run 150 ms each, the last one right before the process exits
/// (`pyshortcode.py`), on each CPython: each is named, and the summary counts exactly the
/// samples whose frames were not. Naming must keep up with the run: queued only at each maps
/// refresh (500 ms), the last 3 of 20 went unnamed (their process had exited), and the
/// summary said nothing of them.
#[test]
fn short_lived_functions_are_named_while_they_live() {
    needs_root!();
    const ROUNDS: usize = 20;
    let mut checks = Checks::new();
    for (label, python) in pythons() {
        let dir = tempdir();
        let folded = dir.path().join("short.folded");
        let summary = dir.path().join("short.summary.json");
        let args = pyshortcode_args(&[&folded, &summary], &python, ROUNDS, "keep");
        run_bpfprof(&args, TIMEOUT).assert_code(exit::OK);
        let profile = Profile::read(&folded);
        let names: Vec<String> = (0..ROUNDS).map(|n| format!("work_{n}")).collect();
        let named: Vec<&String> = names
            .iter()
            .filter(|n| samples_in(&profile, n) > 0)
            .collect();
        let unknown = profile.count_containing("[unknown Python code]");
        let counted = Summary::read(&summary).field("unwind")["python_unnamed"]
            .as_u64()
            .expect("unwind.python_unnamed");
        let unnamed: Vec<&String> = names.iter().filter(|n| !named.contains(n)).collect();
        eprintln!(
            "{label}: {} of {ROUNDS} functions named (not {unnamed:?}); {unknown} of {} \
             samples unnamed, the summary says {counted}",
            named.len(),
            profile.total()
        );
        // One function may lose its name to a tick delayed past its end on a loaded machine.
        checks.check(named.len() + 1 >= ROUNDS, || {
            format!(
                "{label}: {} of {ROUNDS} functions named: {named:?}\n{}",
                named.len(),
                profile.top(5)
            )
        });
        // Among the functions' samples (under `main`): start-up also runs code that lives
        // milliseconds (site.py executes each .pth file's lines), which no reader can name.
        // The one function the check above lets go unnamed takes its samples with it (a 20th
        // of them, half as many again for its spread).
        let working = samples_in(&profile, "main");
        let unknown_working = profile.count_where(|f| {
            f.iter().any(|x| x == "main") && f.iter().any(|x| x == "[unknown Python code]")
        });
        let lost_function = if named.len() < ROUNDS {
            working * 3 / (2 * ROUNDS as u64)
        } else {
            0
        };
        checks.check(
            working > 0
                && unknown_working.saturating_sub(lost_function) * 20 <= working
                && counted == unknown,
            || {
                format!(
                    "{label}: {unknown_working} of {working} samples under main have [unknown \
                     Python code] (at most 5%, and {lost_function} for the unnamed function); \
                     {unknown} of all {}, the summary counts {counted}",
                    profile.total()
                )
            },
        );
    }
    checks.finish();
}

/// Two threads named by `threading` (`cruncher-1`, `cruncher-2`) that spin, joined by the
/// main thread.
const NAMED_THREADS: &str = "\
import threading
def spin():
    while True:
        sum(i * i for i in range(1000))
threads = [threading.Thread(target=spin, name=f'cruncher-{n}', daemon=True) for n in (1, 2)]
for t in threads:
    t.start()
for t in threads:
    t.join()
";

/// `--per-thread` labels a Python program's threads by their `threading` names, as `bpfprof
/// dump` and py-spy do: each named thread's samples are under `cruncher-N (tid T)` (they were
/// all `python3 (tid T)`, told apart by tid alone), on each CPython.
#[test]
fn per_thread_labels_python_threads_by_their_threading_names() {
    needs_root!();
    let mut checks = Checks::new();
    for (label, python) in pythons() {
        let dir = tempdir();
        let out = dir.path().join("threads.folded");
        let mut args = record_args(&[&out], &["--per-thread", "-d", "3s", "--"]);
        args.push(python.display().to_string());
        args.push("-c".into());
        args.push(NAMED_THREADS.into());
        run_bpfprof(&args, TIMEOUT).assert_code(exit::OK);
        let profile = Profile::read(&out);
        let threads = per_thread(&profile, |f| f.iter().any(|x| x == "spin"));
        eprintln!("{label}: samples in spin by thread: {threads:?}");
        for name in ["cruncher-1", "cruncher-2"] {
            let prefix = format!("{name} (tid ");
            let spun: u64 = threads
                .iter()
                .filter(|(t, _)| t.starts_with(&prefix))
                .map(|(_, n)| n)
                .sum();
            checks.check(spun > 0, || {
                format!("{label}: no samples in spin under {prefix}...): {threads:?}")
            });
        }
    }
    checks.finish();
}
