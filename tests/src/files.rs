//! Files the tests make: temp directories, executable copies of bpfprof a non-root user can
//! run, and slow-to-compress input.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::env::bpfprof_bin;
use crate::process::poll_until;

/// Copies the bpfprof binary into a fresh 0755 temp directory as a 0755 file,
/// so that an unprivileged user can execute it (the workspace may live under
/// /root, which `nobody` cannot traverse). Returns the directory guard and
/// the binary path.
pub fn world_executable_bpfprof() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::Builder::new()
        .prefix("bpfprof-bin-")
        .tempdir()
        .expect("temp dir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
        .expect("chmod temp dir");
    let bin = dir.path().join("bpfprof");
    copy_executable(bpfprof_bin(), &bin, &["--version"]);
    (dir, bin)
}

/// Copies an executable (mode 0755) and waits until it runs with `probe_args`: another test
/// thread forking while the copy's write fd was open holds that fd until it execs, and exec
/// of the copy fails with ETXTBSY meanwhile.
pub fn copy_executable(src: &Path, dst: &Path, probe_args: &[&str]) {
    std::fs::copy(src, dst).unwrap_or_else(|e| panic!("copy {}: {e}", src.display()));
    std::fs::set_permissions(dst, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let ran = poll_until(Duration::from_secs(5), || {
        match Command::new(dst)
            .args(probe_args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
        {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) => None,
            other => Some(other),
        }
    });
    assert!(
        matches!(ran, Some(Ok(_))),
        "cannot run {}: {ran:?}",
        dst.display()
    );
}

/// Writes `bytes` of pseudo-random lowercase text to `path`: input that `xz -9` compresses
/// slowly, so that a compressor outlasts a short run.
pub fn write_random_text(path: &Path, bytes: usize) {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let text: Vec<u8> = (0..bytes)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            b'a' + (x % 26) as u8
        })
        .collect();
    std::fs::write(path, text).unwrap();
}

/// A temp directory for outputs.
pub fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("bpfprof-test-")
        .tempdir()
        .expect("temp dir")
}
