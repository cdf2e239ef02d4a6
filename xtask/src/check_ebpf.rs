//! `cargo xtask check-ebpf`: fails if the committed kernel object is not what the sources build.

use std::fs;

use anyhow::{bail, ensure, Context, Result};

use crate::build_ebpf::{build_ebpf, sha256_hex};
use crate::cmd::workspace_root;
use crate::consts::COMMITTED_OBJECT;

/// Options of `cargo xtask check-ebpf`.
#[derive(clap::Args)]
pub struct Options {
    /// Wipe the build directory's target/ first (a full rebuild).
    #[arg(long)]
    pub clean: bool,
}

/// Builds the kernel object and fails unless it is byte for byte the committed one.
pub fn check_ebpf(clean: bool) -> Result<()> {
    let committed_path = workspace_root().join(COMMITTED_OBJECT);
    let committed = match fs::read(&committed_path) {
        Ok(bytes) => Some(bytes),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e).with_context(|| format!("reading {}", committed_path.display())),
    };
    let built = build_ebpf(clean)?;
    let built_sha = sha256_hex(&built);
    let Some(committed) = committed else {
        bail!(
            "{COMMITTED_OBJECT} does not exist (the sources build sha256 {built_sha}): run \
             `cargo xtask build-ebpf` and commit {COMMITTED_OBJECT}"
        );
    };
    let committed_sha = sha256_hex(&committed);
    ensure!(
        built == committed,
        "{COMMITTED_OBJECT} is stale: committed sha256 {committed_sha} ({} bytes), the sources \
         build sha256 {built_sha} ({} bytes). Run `cargo xtask build-ebpf` and commit \
         {COMMITTED_OBJECT}",
        committed.len(),
        built.len()
    );
    println!(
        "==> {COMMITTED_OBJECT} is up to date: {} bytes, sha256 {committed_sha}",
        committed.len()
    );
    Ok(())
}
