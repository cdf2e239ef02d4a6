//! End to end: Debian sid's stripped CPython 3.14 and 3.15 (in the chroot `cargo xtask setup`
//! makes at /srv/sid; `.gnu_debuglink` only, no debug file installed). Their eval loop has no
//! symbol: GCC split most of `_PyEval_EvalFrameDefault` into a part of its own past every
//! export's end, which bpfprof once named `_PyObject_DebugMallocStats+0x10bb7` (an export of
//! 414 bytes) and left in the stack, with the Python frames at the stack's root above
//! `_start`. Checked: every stack with Python frames has them under the interpreter's native
//! entry (`_start`, ..., `Py_RunMain`, then the Python frames), and no frame is named from an
//! export it lies past the end of. Needs root.

use std::{collections::HashMap, path::Path, process::Command, time::Duration};

use bpfprof_tests::*;

const TIMEOUT: Duration = Duration::from_secs(120);
/// The root of the sid chroot (see ../shared/PYTHON.md and `cargo xtask setup`).
const SID: &str = "/srv/sid";

/// Two Python functions called from `main`, called from `<module>`, for `argv[1]` seconds.
const WORKLOAD: &str = "import sys, time
def leaf_hot():
    x = 0
    for i in range(3000): x += i
def leaf_cold():
    x = 0
    for i in range(1000): x += i
def main(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        leaf_hot()
        leaf_cold()
main(float(sys.argv[1]))
";

/// The workload's Python functions: a stack holding one of them holds Python frames.
const PYTHON_FRAMES: [&str; 3] = ["<module>", "leaf_hot", "leaf_cold"];

/// The exported functions of the ELF file at `path` with their sizes, as `readelf` lists them.
fn export_sizes(path: &Path) -> HashMap<String, u64> {
    let out = Command::new("readelf")
        .args(["-W", "--dyn-syms"])
        .arg(path)
        .output()
        .expect("readelf");
    assert!(out.status.success(), "readelf {}", path.display());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            // Num: Value Size Type Bind Vis Ndx Name
            if f.len() < 8 || f[3] != "FUNC" || f[6] == "UND" {
                return None;
            }
            let size = f[2].parse().ok()?;
            let name = f[7].split('@').next()?.to_string();
            Some((name, size))
        })
        .collect()
}

/// `export+0xOFF` frames whose offset lies past the export's size.
fn named_past_their_export(profile: &Profile, exports: &HashMap<String, u64>) -> Vec<String> {
    let mut wrong: Vec<String> = Vec::new();
    for frames in profile.stacks.keys() {
        for frame in frames {
            let Some((name, offset)) = frame.rsplit_once("+0x") else {
                continue;
            };
            let (Some(&size), Ok(offset)) = (exports.get(name), u64::from_str_radix(offset, 16))
            else {
                continue;
            };
            if size > 0 && offset >= size && !wrong.contains(frame) {
                wrong.push(frame.clone());
            }
        }
    }
    wrong
}

#[test]
fn stripped_cpython_314_and_315_python_frames_under_the_native_entry() {
    needs_root!();
    let mut checks = Checks::new();
    for minor in [14, 15] {
        let inside = format!("/usr/bin/python3.{minor}");
        let binary = Path::new(SID).join(&inside[1..]);
        if !binary.exists() {
            assert!(
                !ci(),
                "{} is needed under CI (cargo xtask setup)",
                binary.display()
            );
            eprintln!("skipping: no {}", binary.display());
            return;
        }
        let mut exports = export_sizes(&binary);
        exports.extend(export_sizes(
            &Path::new(SID).join("lib/x86_64-linux-gnu/libc.so.6"),
        ));
        let dir = tempfile::Builder::new()
            .prefix("bpfprof-test-")
            .tempdir_in(Path::new(SID).join("tmp"))
            .expect("a directory in the chroot");
        std::fs::write(dir.path().join("w.py"), WORKLOAD).unwrap();
        let script = Path::new("/tmp")
            .join(dir.path().file_name().unwrap())
            .join("w.py");
        let mut cmd = Command::new("chroot");
        cmd.arg(SID).arg(&inside).arg(&script).arg("30");
        let target = Workload::spawn_command(cmd);
        // chroot has exec'd the interpreter (bpfprof looks for Python when it attaches).
        let exe = format!("/proc/{}/exe", target.pid());
        poll_until(Duration::from_secs(20), || {
            let path = std::fs::read_link(&exe).ok()?;
            path.ends_with(&inside[1..]).then_some(())
        })
        .expect("the interpreter runs");
        std::thread::sleep(Duration::from_millis(300));
        let out = dir.path().join("stacks.folded");
        run_bpfprof(
            [
                "-F",
                "499",
                "-d",
                "3s",
                "--pid",
                &target.pid().to_string(),
                "-o",
                out.to_str().unwrap(),
            ],
            TIMEOUT,
        )
        .assert_code(exit::OK);
        let profile = Profile::read(&out);
        let label = format!("3.{minor}");
        let with_python =
            profile.count_where(|f| f.iter().any(|x| PYTHON_FRAMES.contains(&x.as_str())));
        checks.check(
            with_python * 2 > profile.total() && with_python >= 100,
            || {
                format!(
                    "{label}: {with_python} of {} samples with Python frames:\n{}",
                    profile.total(),
                    profile.top(8)
                )
            },
        );
        // Root first: [process, _start, ..., Py_RunMain, ..., <module>, main, leaf].
        let misplaced = profile.count_where(|f| {
            let Some(first_python) = f.iter().position(|x| PYTHON_FRAMES.contains(&x.as_str()))
            else {
                return false;
            };
            let entry = f[..first_python].iter().position(|x| x == "Py_RunMain");
            !(f.get(1).is_some_and(|x| x == "_start")
                && entry.is_some()
                && f[first_python] == "<module>")
        });
        checks.check(misplaced == 0, || {
            format!(
                "{label}: {misplaced} stacks with Python frames not under _start ... Py_RunMain:\n{}",
                profile.top(8)
            )
        });
        // The eval loop's frames gave way to the Python frames they ran.
        let eval_left =
            profile.count_where(|f| f.iter().any(|x| x.starts_with("_PyEval_EvalFrameDefault")));
        checks.check(eval_left * 20 <= with_python, || {
            format!(
                "{label}: {eval_left} stacks keep an eval loop frame:\n{}",
                profile.top(8)
            )
        });
        let wrong = named_past_their_export(&profile, &exports);
        checks.check(wrong.is_empty(), || {
            format!("{label}: frames named from an export they lie past the end of: {wrong:?}")
        });
    }
    checks.finish();
}
