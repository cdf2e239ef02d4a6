//! End to end: asyncio task stacks (issue 44). On CPython 3.14 and 3.15 (sid's, in the chroot
//! at /srv/sid) a root task `gather`s three named tasks, one of which (`fetch-3`) `gather`s
//! a fourth (`deep`) and an unnamed fifth; each measures its own CPU with
//! `time.thread_time_ns`. Each sample of a task's work sits under its chain of awaiting tasks
//! (`[task main] main;[task fetch-3] fetch3;[task deep] work;...`) in place of the event
//! loop's frames, with shares within 3 points of each task's own CPU; `dump` shows the task
//! tree the program itself sees (`asyncio.capture_call_graph`); 3.11 says in the summary that
//! async stacks need 3.14. Needs root.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use bpfprof_tests::*;

const TIMEOUT: Duration = Duration::from_secs(120);
/// The root of the sid chroot (see ../shared/PYTHON.md and `cargo xtask setup`).
const SID: &str = "/srv/sid";
/// Most a task's share of the samples may differ from its share of the CPU the tasks
/// measured, or four standard errors where fewer samples make that wider ([`Share`]).
const TOLERANCE: f64 = 0.03;

/// The workload: `main` gathers `fetch-1` (3000 units a step), `fetch-2` (1000) and
/// `fetch-3`, which gathers `deep` (1500) and an unnamed task (1000, counted as `inner`); each
/// step's CPU is summed per name and written to `argv[1]` (`name=ns ...`) every tenth of a
/// second; `argv[3]` gets each task's awaiters as `asyncio.capture_call_graph` sees them
/// (`name: awaiter,awaiter`), once the tasks run. Runs `argv[2]` seconds.
const WORKLOAD: &str = r#"import asyncio, sys, time

cpu = {}
written = [0]
graph_done = [False]

def burn(n):
    x = 0
    for i in range(n):
        x += i
    return x

def write_graph(path):
    lines = []
    for t in asyncio.all_tasks():
        g = asyncio.capture_call_graph(t)
        waiters = [w.future.get_name() for w in g.awaited_by if isinstance(w.future, asyncio.Task)]
        lines.append(f"{t.get_name()}: {','.join(sorted(waiters))}")
    with open(path, "w") as f:
        f.write("\n".join(sorted(lines)) + "\n")

async def work(name, units, end, truth, graph):
    while time.monotonic() < end:
        t0 = time.thread_time_ns()
        burn(units)
        t1 = time.thread_time_ns()
        cpu[name] = cpu.get(name, 0) + t1 - t0
        if t1 - written[0] > 100_000_000:
            written[0] = t1
            with open(truth, "w") as f:
                f.write(" ".join(f"{k}={v}" for k, v in sorted(cpu.items())))
            if not graph_done[0] and len(cpu) == 4 and hasattr(asyncio, "capture_call_graph"):
                graph_done[0] = True
                write_graph(graph)
        await asyncio.sleep(0)

async def fetch3(end, truth, graph):
    deep = asyncio.create_task(work("deep", 1500, end, truth, graph), name="deep")
    await asyncio.gather(deep, work("inner", 1000, end, truth, graph))

async def main(truth, seconds, graph):
    asyncio.current_task().set_name("main")
    end = time.monotonic() + seconds
    await asyncio.gather(
        asyncio.create_task(work("fetch-1", 3000, end, truth, graph), name="fetch-1"),
        asyncio.create_task(work("fetch-2", 1000, end, truth, graph), name="fetch-2"),
        asyncio.create_task(fetch3(end, truth, graph), name="fetch-3"),
    )

asyncio.run(main(sys.argv[1], float(sys.argv[2]), sys.argv[3]))
"#;

/// Each measured name, and the task frames its work runs under, outermost first (the last
/// one a prefix: the unnamed task is `Task-N`).
const CHAINS: [(&str, &[&str]); 4] = [
    ("fetch-1", &["[task main] main", "[task fetch-1] work"]),
    ("fetch-2", &["[task main] main", "[task fetch-2] work"]),
    (
        "deep",
        &[
            "[task main] main",
            "[task fetch-3] fetch3",
            "[task deep] work",
        ],
    ),
    (
        "inner",
        &["[task main] main", "[task fetch-3] fetch3", "[task Task-"],
    ),
];

/// sid's `python3.{minor}` as the chroot names it, when the chroot has it.
fn sid_python(minor: u8) -> Option<String> {
    let inside = format!("/usr/bin/python3.{minor}");
    if Path::new(SID).join(&inside[1..]).exists() {
        return Some(inside);
    }
    assert!(
        !ci(),
        "{SID}{inside} is needed under CI (cargo xtask setup makes the sid chroot)"
    );
    eprintln!("skipping: no {SID}{inside}");
    None
}

/// The workload running for `seconds` under `python` (a path inside the chroot when
/// `chroot`), with its directory (the host's path).
fn start(python: &str, chroot: bool, seconds: &str) -> (Workload, tempfile::TempDir) {
    let (dir, inside) = if chroot {
        let dir = tempfile::Builder::new()
            .prefix("bpfprof-test-")
            .tempdir_in(Path::new(SID).join("tmp"))
            .expect("a directory in the chroot");
        let inside = Path::new("/tmp").join(dir.path().file_name().unwrap());
        (dir, inside)
    } else {
        let dir = tempdir();
        let inside = dir.path().to_path_buf();
        (dir, inside)
    };
    std::fs::write(dir.path().join("tasks.py"), WORKLOAD).unwrap();
    let mut argv: Vec<String> = Vec::new();
    if chroot {
        argv.extend(["chroot".into(), SID.into()]);
    }
    argv.push(python.into());
    for name in ["tasks.py", "truth.txt"] {
        argv.push(inside.join(name).display().to_string());
    }
    argv.push(seconds.into());
    argv.push(inside.join("graph.txt").display().to_string());
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]);
    (Workload::spawn_command(cmd), dir)
}

/// Each name's CPU so far, once every task has some.
fn truth(dir: &Path) -> BTreeMap<String, u64> {
    let path = dir.join("truth.txt");
    poll_until(Duration::from_secs(30), || {
        let text = std::fs::read_to_string(&path).ok()?;
        let cpu: BTreeMap<String, u64> = text
            .split_whitespace()
            .filter_map(|kv| {
                let (k, v) = kv.split_once('=')?;
                Some((k.to_string(), v.parse().ok()?))
            })
            .collect();
        (cpu.len() == CHAINS.len()).then_some(cpu)
    })
    .expect("the workload writes each task's CPU")
}

/// The task frames of a stack (`[task ...]`), outermost first.
fn task_frames(frames: &[String]) -> Vec<&str> {
    frames
        .iter()
        .filter(|f| f.starts_with("[task "))
        .map(String::as_str)
        .collect()
}

/// Which measured name a stack's task frames say its work ran for, if they are one of
/// [`CHAINS`] whole.
fn chain_of(tasks: &[&str]) -> Option<&'static str> {
    CHAINS.iter().find_map(|(name, chain)| {
        let whole = tasks.len() == chain.len()
            && tasks
                .iter()
                .zip(chain.iter())
                .enumerate()
                .all(|(i, (t, c))| {
                    if i + 1 == chain.len() {
                        t.starts_with(c)
                    } else {
                        t == c
                    }
                });
        whole.then_some(*name)
    })
}

#[test]
fn task_chains_and_shares_on_314_and_315() {
    needs_root!();
    let mut checks = Checks::new();
    for minor in [14, 15] {
        let Some(python) = sid_python(minor) else {
            return;
        };
        let label = format!("3.{minor}");
        let (target, dir) = start(&python, true, "40");
        let before = truth(dir.path());
        let out = dir.path().join("run.folded");
        let summary = dir.path().join("run.json");
        let pid = target.pid().to_string();
        let args = ["-F", "999", "-d", "8s", "--pid", &pid, "-o"];
        let mut args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        args.push(out.display().to_string());
        args.push("--summary-json".into());
        args.push(summary.display().to_string());
        run_bpfprof(&args, TIMEOUT).assert_code(exit::OK);
        let after = truth(dir.path());
        drop(target);
        let profile = Profile::read(&out);
        let cpu: BTreeMap<&str, f64> = CHAINS
            .iter()
            .map(|(name, _)| (*name, (after[*name] - before[*name]) as f64))
            .collect();
        let cpu_total: f64 = cpu.values().sum();
        let mut counts: BTreeMap<&str, u64> = BTreeMap::new();
        let (mut work, mut placed, mut with_loop) = (0u64, 0u64, 0u64);
        let mut strays: BTreeMap<String, u64> = BTreeMap::new();
        for (frames, n) in &profile.stacks {
            if !frames.iter().any(|f| f == "burn") {
                continue;
            }
            work += n;
            let tasks = task_frames(frames);
            match chain_of(&tasks) {
                Some(name) => {
                    *counts.entry(name).or_default() += n;
                    placed += n;
                    // The event loop's frames gave way to the tasks.
                    if frames.iter().any(|f| f.ends_with("_run_once")) {
                        with_loop += n;
                    }
                }
                None => *strays.entry(tasks.join(";")).or_default() += n,
            }
        }
        eprintln!("{label}: {work} samples of the tasks' work, {placed} under a known chain; counts {counts:?}; cpu {cpu:?}; strays {strays:?}");
        // A loaded machine gives the workload little CPU: [`Share`] judges the shares at the
        // samples taken, and says when they are too few to judge.
        checks.check(work >= 100, || {
            format!(
                "{label}: {work} samples of burn: too few\n{}",
                profile.top(8)
            )
        });
        // Every sample of a task's work under its own chain, give or take sampling noise
        // (a wrong or missing chain is the defect: none at all).
        checks.result(
            &format!("{label}: samples of the work under their task's chain"),
            Share::new(placed, work).at_least(0.98, 0.0),
        );
        checks.eq(
            &format!("{label}: samples under a task chain that keep the event loop's frames"),
            with_loop,
            0,
        );
        for (name, _) in CHAINS {
            let truth = cpu[name] / cpu_total;
            let hits = counts.get(name).copied().unwrap_or(0);
            eprintln!(
                "{label}: {name}: {:.3} of the samples, {truth:.3} of the CPU",
                hits as f64 / placed.max(1) as f64
            );
            checks.result(
                &format!("{label}: {name}'s share against its own CPU {truth:.3}"),
                Share::new(hits, placed).near(truth, TOLERANCE, 0.0),
            );
        }
        let summary = Summary::read(&summary);
        let said = summary.field("python_unsupported").clone();
        checks.check(said.as_array().is_some_and(|a| a.is_empty()), || {
            format!("{label}: the summary says {said}")
        });
    }
    checks.finish();
}

/// `dump --json` and `dump` of `target`, which ends then.
fn dumps_of(target: Workload) -> (serde_json::Value, RunResult) {
    let pid = target.pid().to_string();
    let json = run_bpfprof(["dump", "--json", "--pid", &pid], TIMEOUT);
    json.assert_code(exit::OK);
    let text = run_bpfprof(["dump", "--pid", &pid], TIMEOUT);
    text.assert_code(exit::OK);
    drop(target);
    let dump = serde_json::from_str(&json.stdout).expect("dump --json is JSON");
    (dump, text)
}

#[test]
fn dump_shows_the_task_tree_the_program_sees() {
    needs_root!();
    let mut checks = Checks::new();
    for minor in [14, 15] {
        let Some(python) = sid_python(minor) else {
            return;
        };
        let label = format!("3.{minor}");
        let (target, dir) = start(&python, true, "30");
        truth(dir.path());
        let graph_path = dir.path().join("graph.txt");
        let graph = poll_until(Duration::from_secs(20), || {
            std::fs::read_to_string(&graph_path).ok()
        })
        .expect("the workload writes its call graph");
        // name -> its awaiters' names, as the program sees them.
        let expected: BTreeMap<String, BTreeSet<String>> = graph
            .lines()
            .filter_map(|l| l.split_once(": "))
            .map(|(name, waiters)| {
                let waiters = waiters
                    .split(',')
                    .filter(|w| !w.is_empty())
                    .map(String::from)
                    .collect();
                (name.to_string(), waiters)
            })
            .collect();
        let (dump, text) = dumps_of(target);
        let loops = dump["asyncio"].as_array().cloned().unwrap_or_default();
        checks.eq(&format!("{label}: event loops"), loops.len(), 1);
        checks.eq(
            &format!("{label}: tasks read in the stop"),
            loops.first().map(|l| l["read_in_stop"].clone()),
            Some(serde_json::Value::Bool(true)),
        );
        let tasks = loops
            .first()
            .and_then(|l| l["tasks"].as_array().cloned())
            .unwrap_or_default();
        let names: BTreeMap<u64, String> = tasks
            .iter()
            .map(|t| {
                (
                    t["id"].as_u64().unwrap_or(0),
                    t["name"].as_str().unwrap_or("").to_string(),
                )
            })
            .collect();
        let seen: BTreeMap<String, BTreeSet<String>> = tasks
            .iter()
            .map(|t| {
                let waiters = t["awaited_by"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|id| names.get(&id.as_u64()?).cloned())
                    .collect();
                (t["name"].as_str().unwrap_or("").to_string(), waiters)
            })
            .collect();
        checks.eq(&format!("{label}: the task tree"), &seen, &expected);
        let coroutines: BTreeSet<String> = tasks
            .iter()
            .filter_map(|t| t["coroutine"].as_str().map(String::from))
            .collect();
        checks.eq(
            &format!("{label}: the tasks' coroutines"),
            coroutines,
            ["fetch3", "main", "work"].map(String::from).into(),
        );
        // Each task's coroutine stack, innermost first, as pstree draws it: a `work` task
        // waits in `await asyncio.sleep(0)` between steps (`sleep -> work`); `main` and
        // `fetch3` await a gather's future, which is no coroutine (the tree shows it); the
        // task running when the process was stopped has none (its stack is the thread's).
        // The tasks are read in the stop, so every one is as it was at that moment.
        let running = loops
            .first()
            .and_then(|l| l["running_task"].as_u64())
            .unwrap_or(0);
        let stacks: Vec<(String, bool, Vec<String>)> = tasks
            .iter()
            .map(|t| {
                let stack = t["coroutine_stack"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|c| c.as_str().map(String::from))
                    .collect();
                let coroutine = t["coroutine"].as_str().unwrap_or("").to_string();
                (coroutine, t["id"].as_u64() == Some(running), stack)
            })
            .collect();
        let right = |(coroutine, runs, stack): &(String, bool, Vec<String>)| {
            if *runs {
                stack.is_empty()
            } else if coroutine == "work" {
                stack == &["sleep", "work"]
            } else {
                stack.as_slice() == std::slice::from_ref(coroutine)
            }
        };
        checks.check(stacks.iter().all(right), || {
            format!("{label}: the tasks' coroutine stacks (coroutine, running, stack): {stacks:?}")
        });
        // The text draws the tree: fetch-3 under main, deep under fetch-3.
        let lines: Vec<&str> = text.stdout.lines().collect();
        let at = |needle: &str| lines.iter().position(|l| l.contains(needle));
        let indent = |i: usize| lines[i].find("(T)").unwrap_or(0);
        match (
            at("(T) main main"),
            at("(T) fetch-3 fetch3"),
            at("(T) deep "),
        ) {
            (Some(m), Some(f), Some(d)) => checks.check(
                m < f && f < d && indent(m) < indent(f) && indent(f) < indent(d),
                || format!("{label}: the tree's text:\n{}", text.stdout),
            ),
            _ => checks.check(false, || {
                format!("{label}: no task tree in the text:\n{}", text.stdout)
            }),
        }
    }
    checks.finish();
}

/// 1500 tasks waiting an hour each, and `argv[1]` written once they all wait.
const MANY_TASKS: &str = r#"import asyncio, sys

async def idle():
    await asyncio.sleep(3600)

async def main():
    tasks = [asyncio.create_task(idle(), name=f"idle-{i}") for i in range(1500)]
    await asyncio.sleep(0.2)
    open(sys.argv[1], "w").write("ready")
    await asyncio.gather(*tasks)

asyncio.run(main())
"#;

/// A program of more tasks than `dump` reads while the process is stopped (256): they are
/// read once it runs again, every one of them, and the dump says so.
#[test]
fn dump_of_many_tasks_reads_them_once_the_process_runs() {
    needs_root!();
    let Some(python) = sid_python(14) else {
        return;
    };
    let dir = tempfile::Builder::new()
        .prefix("bpfprof-test-")
        .tempdir_in(Path::new(SID).join("tmp"))
        .expect("a directory in the chroot");
    let inside = Path::new("/tmp").join(dir.path().file_name().unwrap());
    let ready = dir.path().join("ready");
    std::fs::write(dir.path().join("many.py"), MANY_TASKS).unwrap();
    let mut cmd = Command::new("chroot");
    cmd.args([SID, &python])
        .arg(inside.join("many.py"))
        .arg(inside.join("ready"));
    let target = Workload::spawn_command(cmd);
    poll_until(Duration::from_secs(30), || ready.exists().then_some(()))
        .expect("the program starts its tasks");
    let (dump, text) = dumps_of(target);
    let loops = dump["asyncio"].as_array().cloned().unwrap_or_default();
    assert_eq!(loops.len(), 1, "{dump}");
    assert_eq!(loops[0]["read_in_stop"], serde_json::Value::Bool(false));
    let tasks = loops[0]["tasks"].as_array().cloned().unwrap_or_default();
    let idle = tasks
        .iter()
        .filter(|t| t["name"].as_str().is_some_and(|n| n.starts_with("idle-")))
        .count();
    assert_eq!(idle, 1500);
    assert!(
        text.stdout.contains("(1501 tasks")
            && text.stdout.contains("read with the process running"),
        "{}",
        text.stdout.lines().take(40).collect::<Vec<_>>().join("\n")
    );
}

#[test]
fn cpython_311_says_async_stacks_need_314() {
    needs_root!();
    let python = PathBuf::from(std::env::var("HOME").unwrap_or("/root".into()))
        .join(".pyenv/versions/3.11.7/bin/python3");
    if !python.exists() {
        assert!(!ci(), "{} is needed under CI", python.display());
        return;
    }
    // 3.11 has no asyncio.capture_call_graph: the graph is not written, the rest runs.
    let (target, dir) = start(python.to_str().unwrap(), false, "20");
    truth(dir.path());
    let out = dir.path().join("run.folded");
    let summary = dir.path().join("run.json");
    let pid = target.pid().to_string();
    let args = ["-F", "499", "-d", "2s", "--pid", &pid, "-o"];
    let mut args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    args.push(out.display().to_string());
    args.push("--summary-json".into());
    args.push(summary.display().to_string());
    let run = run_bpfprof(&args, TIMEOUT);
    run.assert_code(exit::OK);
    drop(target);
    let said = Summary::read(&summary).field("python_unsupported").clone();
    let says = said.as_array().is_some_and(|a| {
        a.iter().any(|s| {
            s.as_str()
                .is_some_and(|s| s.contains("asyncio task stacks need CPython 3.14"))
        })
    });
    assert!(says, "the summary JSON says {said}");
    run.assert_stderr_mentions(&["asyncio task stacks need CPython 3.14"]);
    let profile = Profile::read(&out);
    assert!(profile.count_containing("burn") > 0, "{}", profile.top(5));
    assert_eq!(
        profile.count_where(|f| f.iter().any(|x| x.starts_with("[task "))),
        0,
        "no task frames before 3.14"
    );
}
