//! End to end: a stripped program running in a chroot (the sid root `cargo xtask setup` makes
//! at /srv/sid) is named from the debug file installed in that root, as its own tools would
//! find it: by build id under `<root>/usr/lib/debug/.build-id/`, and by its
//! `.gnu_debuglink` under `<root>/usr/lib/debug/<its folder inside the root>` (bpfprof once
//! looked in the host's `/usr/lib/debug`, and under `/usr/lib/debug/srv/sid/...`). A symlink
//! planted in the root that points at a debug file outside it is not followed out of it.
//! Every file this test puts in /srv/sid is removed on every path. Needs root.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use bpfprof_tests::*;

const TIMEOUT: Duration = Duration::from_secs(60);
/// The root of the sid chroot (see ../shared/PYTHON.md and `cargo xtask setup`).
const SID: &str = "/srv/sid";

/// Files and folders this test made inside the chroot, removed when it ends however it ends
/// (newest first; a folder only if it is empty: another may have put something there since).
#[derive(Default)]
struct Planted(Vec<PathBuf>);

impl Planted {
    /// Makes the folders of `path` that are missing (noting them) and writes `path` there
    /// as a copy of `from` (or, with `link`, a symlink to `from`).
    fn put(&mut self, path: &Path, from: &Path, link: bool) {
        let mut missing = Vec::new();
        let mut dir = path.parent();
        while let Some(d) = dir.filter(|d| !d.exists()) {
            missing.push(d.to_path_buf());
            dir = d.parent();
        }
        for d in missing.into_iter().rev() {
            std::fs::create_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
            self.0.push(d);
        }
        self.0.push(path.to_path_buf());
        if link {
            std::os::unix::fs::symlink(from, path).unwrap();
        } else {
            std::fs::copy(from, path).unwrap();
        }
    }

    /// Removes what was put at `path` (a file or link) now.
    fn take(&mut self, path: &Path) {
        std::fs::remove_file(path).unwrap();
        self.0.retain(|p| p != path);
    }
}

impl Drop for Planted {
    fn drop(&mut self) {
        for path in self.0.iter().rev() {
            if std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir()) {
                let _ = std::fs::remove_dir(path);
            } else {
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

/// The GNU build id of the ELF file at `path`, as `readelf -n` prints it.
fn build_id(path: &Path) -> String {
    let out = Command::new("readelf")
        .arg("-n")
        .arg(path)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: ").map(str::to_string))
        .expect("a build id")
}

fn run(program: &str, args: &[&str]) {
    let status = Command::new(program).args(args).status().unwrap();
    assert!(status.success(), "{program} {args:?}");
}

/// A 1 s profile of `pid`.
fn profile(pid: u32) -> Profile {
    let dir = tempdir();
    let out = dir.path().join("p.folded");
    let run = run_bpfprof(
        [
            "--pid",
            &pid.to_string(),
            "-F",
            "499",
            "-d",
            "1s",
            "-o",
            out.to_str().unwrap(),
        ],
        TIMEOUT,
    );
    assert!(
        matches!(run.code(), 0 | 7),
        "bpfprof failed ({}):\n{}",
        run.code(),
        run.stderr
    );
    Profile::read(&out)
}

#[test]
fn a_chrooted_program_is_named_from_the_debug_files_of_its_root() {
    needs_root!();
    if !Path::new(SID).join("usr/bin").is_dir() {
        assert!(!ci(), "{SID} is needed under CI (cargo xtask setup)");
        eprintln!("skipping: no {SID}");
        return;
    }
    // The program, in a folder of its own in the chroot's /tmp; its debug file outside.
    let inside = tempfile::Builder::new()
        .prefix("bpfprof-test-")
        .tempdir_in(Path::new(SID).join("tmp"))
        .expect("a directory in the chroot");
    let name = inside.path().file_name().unwrap().to_str().unwrap();
    let host = tempdir();
    // Its name in the source makes its build id this run's own.
    let source = host.path().join("prog.c");
    std::fs::write(
        &source,
        format!(
            "volatile unsigned long sink; const char *tag = \"{name}\";\n\
             __attribute__((noinline)) void chroot_debug_work(void) \
             {{ for (unsigned long i = 0; i < 100000000UL; i++) sink += i; }}\n\
             int main(void) {{ for (;;) chroot_debug_work(); }}\n"
        ),
    )
    .unwrap();
    let bin = inside.path().join("prog");
    let debug = host.path().join("prog.debug");
    let (b, d) = (bin.to_str().unwrap(), debug.to_str().unwrap());
    run(
        "cc",
        &[
            "-O0",
            "-g",
            "-fno-omit-frame-pointer",
            "-o",
            b,
            source.to_str().unwrap(),
        ],
    );
    run("objcopy", &["--only-keep-debug", b, d]);
    run("strip", &["--strip-all", b]);
    run("objcopy", &[&format!("--add-gnu-debuglink={d}"), b]);
    let id = build_id(&bin);
    let nm = Command::new("nm").arg(&bin).output().unwrap();
    assert!(
        !String::from_utf8_lossy(&nm.stdout).contains("chroot_debug_work"),
        "the stripped binary still has its symbols"
    );

    let mut planted = Planted::default();
    let debug_root = Path::new(SID).join("usr/lib/debug");
    let by_build_id = debug_root
        .join(".build-id")
        .join(&id[..2])
        .join(format!("{}.debug", &id[2..]));
    // The object's folder inside the root is /tmp/NAME.
    let by_link = debug_root.join("tmp").join(name).join("prog.debug");

    let mut cmd = Command::new("chroot");
    cmd.arg(SID).arg(Path::new("/tmp").join(name).join("prog"));
    let target = Workload::spawn_command(cmd);
    let exe = format!("/proc/{}/exe", target.pid());
    poll_until(Duration::from_secs(10), || {
        let path = std::fs::read_link(&exe).ok()?;
        (path == bin).then_some(())
    })
    .expect("the program runs in the chroot");
    std::thread::sleep(Duration::from_millis(300));

    let mut checks = Checks::new();
    let named = |p: &Profile| p.count_user_leaf("chroot_debug_work");
    // 1. By build id, in the chroot's /usr/lib/debug/.build-id.
    planted.put(&by_build_id, &debug, false);
    let p = profile(target.pid());
    checks.check(named(&p) as f64 >= 0.9 * p.total() as f64, || {
        format!(
            "by build id ({}): {} of {}:\n{}",
            by_build_id.display(),
            named(&p),
            p.total(),
            p.top(5)
        )
    });
    planted.take(&by_build_id);

    // 2. By .gnu_debuglink, in <root>/usr/lib/debug/<folder inside the root>.
    planted.put(&by_link, &debug, false);
    let p = profile(target.pid());
    checks.check(named(&p) as f64 >= 0.9 * p.total() as f64, || {
        format!(
            "by .gnu_debuglink ({}): {} of {}:\n{}",
            by_link.display(),
            named(&p),
            p.total(),
            p.top(5)
        )
    });
    planted.take(&by_link);

    // 3. A symlink there to the host's copy (outside the root): resolved inside the root, it
    // names nothing, so the function is not named from a file out of the root.
    planted.put(&by_link, &debug, true);
    let p = profile(target.pid());
    checks.check(named(&p) == 0 && p.total() > 0, || {
        format!(
            "a link out of the root ({} -> {}) was followed: {} of {}:\n{}",
            by_link.display(),
            debug.display(),
            named(&p),
            p.total(),
            p.top(5)
        )
    });
    drop(target);
    drop(planted);
    checks.finish();
}
