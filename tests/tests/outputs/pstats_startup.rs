//! End to end: a launched Python program's pstats file, sorted by cumulative time as a
//! cProfile user sorts it, leads with the program's own functions (`<module>`, `main`,
//! `middle`, `leaf`), as `python -m cProfile` on the same script does, not with the
//! interpreter's start-up frames (`_start`, `Py_BytesMain`, `pymain_run_file` ... about ten
//! of them, on every sample of the script). Needs root.

use std::{process::Command, time::Duration};

use bpfprof_tests::*;

const TIMEOUT: Duration = Duration::from_secs(120);

/// `leaf` computes under `middle` under `main` for about 1.5 s.
const SCRIPT: &str = r#"
import time
def leaf(n):
    s = 0
    for i in range(n):
        s += i * i
    return s
def middle():
    t = time.time()
    while time.time() - t < 1.5:
        leaf(20000)
def main():
    middle()
main()
"#;

/// The interpreter's start-up, which cProfile never shows.
const START_UP: [&str; 8] = [
    "_start",
    "__libc_start_main_impl",
    "Py_BytesMain",
    "pymain_main",
    "Py_RunMain",
    "pymain_run_file",
    "_PyRun_SimpleFileObject",
    "PyEval_EvalCode",
];

/// Entries sorted by cumulative time, most first (ties by name): (file, function).
const BY_CUMULATIVE: &str = "import pstats, sys\n\
    s = pstats.Stats(sys.argv[1])\n\
    for (f, l, n), (cc, nc, tt, ct, callers) in sorted(s.stats.items(), key=lambda e: (-e[1][3], e[0][2])):\n\
    \x20   print(f, n, sep='\\t')";

#[test]
fn pstats_leads_with_the_programs_own_functions_as_cprofile_does() {
    needs_root!();
    let dir = tempdir();
    let script = dir.path().join("prog.py");
    std::fs::write(&script, SCRIPT).unwrap();
    let pstats = dir.path().join("prog.pstats");
    let run = run_bpfprof(
        [
            "-F",
            "499",
            "-o",
            pstats.to_str().unwrap(),
            "--",
            "/usr/bin/python3",
            script.to_str().unwrap(),
        ],
        TIMEOUT,
    );
    run.assert_code(exit::OK);
    let entries: Vec<(String, String)> = run_pstats(&pstats, BY_CUMULATIVE)
        .lines()
        .filter_map(|l| {
            let (file, name) = l.split_once('\t')?;
            Some((file.to_string(), name.to_string()))
        })
        .collect();
    // The code entries: not the process's and threads' own (`~`).
    let code: Vec<&(String, String)> = entries.iter().filter(|(f, _)| f != "~").collect();
    eprintln!("by cumulative time: {:?}", &code[..code.len().min(8)]);
    // cProfile's view of the same script, for the comparison: its entries of the script's
    // file, by cumulative time.
    let profiled = dir.path().join("cprofile.pstats");
    let status = Command::new("/usr/bin/python3")
        .args(["-m", "cProfile", "-o"])
        .arg(&profiled)
        .arg(&script)
        .status()
        .expect("python3 -m cProfile");
    assert!(status.success());
    let theirs: Vec<String> = run_pstats(&profiled, BY_CUMULATIVE)
        .lines()
        .filter_map(|l| l.split_once('\t'))
        .filter(|(f, _)| f.ends_with("prog.py"))
        .map(|(_, n)| n.to_string())
        .take(4)
        .collect();
    eprintln!("cProfile's first entries of the script: {theirs:?}");
    let mut checks = Checks::new();
    let first_four: Vec<&str> = code.iter().take(4).map(|(_, n)| n.as_str()).collect();
    let mut ours = first_four.clone();
    ours.sort_unstable();
    let mut expected: Vec<&str> = theirs.iter().map(String::as_str).collect();
    expected.sort_unstable();
    checks.check(expected == ["<module>", "leaf", "main", "middle"], || {
        format!("cProfile's first entries of the script: {theirs:?}")
    });
    checks.check(ours == expected, || {
        format!(
            "the first code entries by cumulative time are {first_four:?}, cProfile's {theirs:?}"
        )
    });
    checks.check(
        code.first().is_some_and(|(f, _)| f.ends_with("prog.py")),
        || {
            format!(
                "the first code entry is {:?}, not the script's",
                code.first()
            )
        },
    );
    // The interpreter's start-up ranks below the program's functions: what remains of it is
    // the samples before the script ran (its initialisation, with no Python frame), which
    // cProfile does not see at all.
    for name in START_UP {
        let at = code.iter().position(|(_, n)| n == name);
        checks.check(at.is_none_or(|at| at >= 4), || {
            format!("the interpreter's start-up frame {name} ranks {at:?}, above the program's functions")
        });
    }
    checks.finish();
}
