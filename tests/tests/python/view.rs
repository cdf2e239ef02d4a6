//! End to end: the Python view (`--python-view`, and pstats by default) on pyenv's CPythons
//! 3.10-3.13 (built without frame pointers). pyview.py's hot function allocates and frees
//! small objects, so that without the view its samples end in the interpreter's C code
//! (pymalloc, the eval loop, `__tls_get_addr`) and those lead the top table; with it, the
//! samples are the function's own and it leads the `.txt` table and pstats, while zlib's code
//! stays below the Python function that calls it. Judged by the samples each run took. Needs
//! root.

use std::{path::Path, process::Command, time::Duration};

use bpfprof_tests::*;

const TIMEOUT: Duration = Duration::from_secs(90);
/// CPU time the workload has used before bpfprof attaches: the interpreter has started and
/// imported, and runs its loop.
const WARM_UP_CPU: Duration = Duration::from_millis(300);
/// The share of the hot function's samples that end in the interpreter's C code without the
/// view, at least: it allocates and frees objects on every line (0.9 and more in trials).
const INTERPRETER_LEAF_SHARE: f64 = 0.5;
/// The share of compress_leaf's samples with zlib's own code under it, at least: the
/// function's own bytecode is a single call (0.99 in trials).
const ZLIB_UNDER_CALLER_SHARE: f64 = 0.9;

/// pyenv's CPythons under test.
fn pythons() -> Vec<(String, std::path::PathBuf)> {
    labelled_cpythons(false)
}

/// The rows of a `.txt` top table's "by self samples" part: (self samples, total samples,
/// function).
fn self_rows(table: &str) -> Vec<(u64, u64, String)> {
    table
        .lines()
        .skip_while(|l| !l.starts_with("top functions by self samples"))
        .skip(2)
        .take_while(|l| !l.starts_with("top functions by total"))
        .filter_map(|l| {
            let fields: Vec<&str> = l.split_whitespace().collect();
            let name = l.split_once("] ")?.1.to_string();
            Some((
                fields.first()?.parse().ok()?,
                fields.get(2)?.parse().ok()?,
                name,
            ))
        })
        .collect()
}

/// pstats entries by self time, most first, as Python's own pstats reads them: (function,
/// self time as a share of the profile's total time).
fn pstats_by_self(path: &Path) -> Vec<(String, f64)> {
    run_pstats(
        path,
        "import pstats, sys\n\
         s = pstats.Stats(sys.argv[1])\n\
         for (f, l, n), (cc, nc, tt, ct, callers) in sorted(s.stats.items(), key=lambda e: -e[1][2]):\n\
         \x20   print(n, tt / s.total_tt, sep='\\t')",
    )
        .lines()
        .filter_map(|l| {
            let (name, share) = l.split_once('\t')?;
            Some((name.to_string(), share.parse().ok()?))
        })
        .collect()
}

/// Most of alloc_hot's samples in the view that may keep a frame below it (see its check).
const STRAY_BELOW_SHARE: f64 = 0.01;

/// Samples whose innermost Python function is `func`, and of those, the ones whose next
/// frame satisfies `below` (none when `func` is the leaf).
fn under(profile: &Profile, func: &str, below: impl Fn(Option<&str>) -> bool) -> (u64, u64) {
    let mut all = 0;
    let mut matching = 0;
    for (frames, count) in &profile.stacks {
        if let Some(i) = frames.iter().rposition(|f| f == func) {
            all += count;
            if below(frames.get(i + 1).map(String::as_str)) {
                matching += count;
            }
        }
    }
    (all, matching)
}

/// On each CPython, attached to pyview.py twice: by default (full `.folded`, pstats in the
/// Python view) and with `--python-view` (`.txt` and `.folded`). Without the view most of
/// alloc_hot's samples end in interpreter frames; pstats gives alloc_hot, first, the share of
/// every sample it was on the stack for in the full profile of the same run; with the view the
/// `.txt` table leads with alloc_hot, all its samples its own, and its folded stacks end at it,
/// while compress_leaf's samples keep zlib_compress (zlib's extension module) under it.
#[test]
fn python_view_folds_the_interpreter_and_keeps_extensions() {
    needs_root!();
    let script = workspace_root().join("tests/workloads/pyview.py");
    let mut checks = Checks::new();
    for (label, python) in pythons() {
        let dir = tempdir();
        let mut cmd = Command::new(&python);
        cmd.arg(&script).arg("60");
        let target = Workload::spawn_command(cmd);
        poll_until(TIMEOUT, || (target.cpu_time() >= WARM_UP_CPU).then_some(()))
            .expect("pyview.py started");
        let pid = target.pid().to_string();
        let path = |name: &str| dir.path().join(name).display().to_string();

        // By default: the folded stacks keep the interpreter's frames, pstats has the view.
        let args = [
            "-F",
            "499",
            "-d",
            "3s",
            "-p",
            &pid,
            "-o",
            &path("full.folded"),
            "-o",
            &path("view.prof"),
        ];
        run_bpfprof(args, TIMEOUT).assert_code(exit::OK);
        let full = Profile::read(&dir.path().join("full.folded"));
        let (hot, interpreter_leaf) = under(&full, "alloc_hot", |next| next.is_some());
        checks.check(hot > 0, || {
            format!("{label}: no alloc_hot samples\n{}", full.top(10))
        });
        let share = interpreter_leaf as f64 / hot.max(1) as f64;
        checks.check(share >= INTERPRETER_LEAF_SHARE, || {
            format!(
                "{label}: without the view only {interpreter_leaf} of alloc_hot's {hot} samples \
                 end below it (the premise: pymalloc and the eval loop)\n{}",
                full.top(10)
            )
        });
        let pstats = pstats_by_self(&dir.path().join("view.prof"));
        let expected = full.share_containing("alloc_hot");
        checks.check(
            pstats.first().is_some_and(|(name, share)| {
                name == "alloc_hot" && (share - expected).abs() < 0.005
            }),
            || {
                format!(
                    "{label}: pstats should lead with alloc_hot at {expected:.3} of the time \
                     (its share of the samples, from the same run's folded stacks); by self \
                     time it has {:?}",
                    &pstats[..pstats.len().min(5)]
                )
            },
        );

        // --python-view: every output.
        let args = [
            "-F",
            "499",
            "-d",
            "3s",
            "-p",
            &pid,
            "--python-view",
            "-o",
            &path("view.txt"),
            "-o",
            &path("view.folded"),
        ];
        run_bpfprof(args, TIMEOUT).assert_code(exit::OK);
        let table = std::fs::read_to_string(dir.path().join("view.txt")).expect("read .txt");
        let view = Profile::read(&dir.path().join("view.folded"));
        let (hot, below) = under(&view, "alloc_hot", |next| next.is_some());
        let rows = self_rows(&table);
        // Nearly all: one CI run had 1 of 1091 samples with a frame below alloc_hot (which
        // one was not recorded; the check now names them). A likely cause: the walker's stack
        // scan (issue 21) can take a stale return address left on the stack (into zlib, which
        // compress_leaf ran a moment before) for a frame, and that is no interpreter frame.
        let stray: Vec<String> = view
            .stacks
            .iter()
            .filter_map(|(frames, n)| {
                let i = frames.iter().rposition(|f| f == "alloc_hot")?;
                (i + 1 < frames.len()).then(|| format!("{n} {}", frames[i + 1..].join(";")))
            })
            .collect();
        checks.check(
            rows.first().is_some_and(|(own, total, name)| {
                name == "alloc_hot" && *total == hot && own + below == hot
            }) && below as f64 <= STRAY_BELOW_SHARE * hot as f64,
            || {
                format!(
                    "{label}: the view's table should lead with alloc_hot, its {hot} samples \
                     its own but for at most {:.0}% ({below} have frames below it: \
                     {stray:?}); it leads with {:?}\n{table}",
                    STRAY_BELOW_SHARE * 100.0,
                    rows.first()
                )
            },
        );
        let (compress, zlib) = under(&view, "compress_leaf", |next| next == Some("zlib_compress"));
        checks.check(
            compress > 0 && zlib as f64 >= ZLIB_UNDER_CALLER_SHARE * compress as f64,
            || {
                format!(
                    "{label}: zlib_compress should stay under compress_leaf in the view: \
                     {zlib} of its {compress} samples\n{}",
                    view.top(10)
                )
            },
        );
    }
    checks.finish();
}
