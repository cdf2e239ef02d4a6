//! Real non-root users of this machine, created for the tests.

use std::ffi::OsStr;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::env::workload_path;
use crate::files::copy_executable;
use crate::process::{poll_until, Workload};

/// A real non-root user of this machine, created for the tests.
#[derive(Clone, Debug)]
pub struct TestUser {
    /// Login name.
    pub name: String,
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
}

fn id_of(name: &str, flag: &str) -> Option<u32> {
    let out = Command::new("id").args([flag, name]).output().ok()?;
    if !out.status.success() {
        return None;
    }
    String::from_utf8_lossy(&out.stdout).trim().parse().ok()
}

/// The test user `name` (e.g. `bpfprof-t1`), created with `useradd --system` on first use.
/// Test binaries run concurrently, so a `useradd` that loses the race for the password
/// file's lock is retried.
pub fn test_user(name: &str) -> TestUser {
    let found = poll_until(Duration::from_secs(30), || {
        if let (Some(uid), Some(gid)) = (id_of(name, "-u"), id_of(name, "-g")) {
            return Some((uid, gid));
        }
        let _ = Command::new("useradd")
            .args([
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                name,
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        None
    });
    let (uid, gid) = found.unwrap_or_else(|| panic!("cannot create test user {name}"));
    TestUser {
        name: name.to_string(),
        uid,
        gid,
    }
}

impl TestUser {
    /// A command that runs `program` as this user, with no supplementary groups and no
    /// capabilities.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut cmd = Command::new("setpriv");
        cmd.args([
            format!("--reuid={}", self.uid),
            format!("--regid={}", self.gid),
            "--clear-groups".into(),
            "--".into(),
        ])
        .arg(program);
        cmd
    }

    /// Copies `src` to `dest` as this user's own executable (mode 755). The copy is made as
    /// root, since the user may not read the checkout's build folder (a clone in a private
    /// folder such as `mktemp -d`'s).
    pub fn give(&self, src: &std::path::Path, dest: &std::path::Path) {
        std::fs::copy(src, dest)
            .unwrap_or_else(|e| panic!("copy {} to {}: {e}", src.display(), dest.display()));
        std::os::unix::fs::chown(dest, Some(self.uid), Some(self.gid)).unwrap();
        std::fs::set_permissions(dest, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
    }
}

/// Workload `name` run as `user` from a copy in `dir` (a folder any user can execute from),
/// made on first use; returned once it runs (see [`Workload::spawn_command`]).
pub fn workload_as(user: &TestUser, dir: &std::path::Path, name: &str, args: &[&str]) -> Workload {
    let copy = dir.join(name);
    if !copy.exists() {
        copy_executable(&workload_path(name), &copy, &["0.001"]);
    }
    let mut cmd = user.command(&copy);
    cmd.args(args);
    let w = Workload::spawn_command(cmd);
    std::thread::sleep(Duration::from_millis(200));
    w
}

/// Runs a shell script as `user`; returns whether it succeeded and its stderr.
pub fn shell_as(user: &TestUser, script: &str) -> (bool, String) {
    let out = user.command("sh").args(["-c", script]).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
