//! `cargo xtask fuzz`: builds the fuzz targets (`fuzz/`, a cargo-fuzz crate) and runs each for
//! a bounded time from its committed corpus, failing on any crash, assertion, hang or memory
//! blow-up. The targets parse what a profiled process or a daemon client controls (issue 23);
//! `fuzz/seed.py` says where each corpus came from.

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use anyhow::{ensure, Context, Result};

use crate::cmd::{command, probe, run, secs, workspace_root};
use crate::consts::{
    FUZZ_DIR, FUZZ_MALLOC_LIMIT_MB, FUZZ_RSS_LIMIT_MB, FUZZ_SECONDS_PER_TARGET,
    FUZZ_TIMEOUT_SECONDS, FUZZ_TOOLCHAIN,
};

/// Options of `cargo xtask fuzz`.
#[derive(clap::Args)]
pub struct Options {
    /// Seconds each target runs.
    #[arg(long, default_value_t = FUZZ_SECONDS_PER_TARGET)]
    pub seconds: u64,
    /// The targets to run (default: every one `cargo fuzz list` names).
    #[arg(value_name = "TARGET")]
    pub targets: Vec<String>,
}

/// How the targets are built: cargo-fuzz's sanitizers (AddressSanitizer, which also enforces
/// the per-allocation limit) need a nightly toolchain; without one, a plain libFuzzer build
/// on the default toolchain still finds panics, hangs and RSS blow-ups.
struct Toolchain {
    /// `+nightly`, or nothing for the default toolchain.
    plus: Option<&'static str>,
    /// `address` or `none`.
    sanitizer: &'static str,
}

impl Toolchain {
    fn pick() -> Toolchain {
        let nightly = probe(command("rustup").args(["run", FUZZ_TOOLCHAIN, "rustc", "--version"]));
        match nightly {
            Some(version) => {
                println!(
                    "    {FUZZ_TOOLCHAIN}: {}, with AddressSanitizer",
                    version.trim()
                );
                Toolchain {
                    plus: Some(FUZZ_TOOLCHAIN),
                    sanitizer: "address",
                }
            }
            None => {
                println!(
                    "    no {FUZZ_TOOLCHAIN} toolchain (none can be fetched here): building on \
                     the default toolchain without a sanitizer (-malloc_limit_mb is not enforced)"
                );
                Toolchain {
                    plus: None,
                    sanitizer: "none",
                }
            }
        }
    }

    /// `cargo [+nightly] fuzz SUBCOMMAND`, run at the repository root.
    fn cargo_fuzz(&self, subcommand: &str) -> Command {
        let mut cmd = command("cargo");
        cmd.current_dir(workspace_root());
        if let Some(toolchain) = self.plus {
            cmd.arg(format!("+{toolchain}"));
        }
        cmd.args(["fuzz", subcommand]);
        cmd
    }
}

/// Builds every target, then runs each for `seconds` with the limits in `consts.rs`.
pub fn fuzz(Options { seconds, targets }: Options) -> Result<()> {
    ensure!(
        probe(command("cargo").args(["fuzz", "--version"])).is_some(),
        "cargo-fuzz is not installed: run `cargo xtask setup`"
    );
    let toolchain = Toolchain::pick();
    let listed = probe(&mut toolchain.cargo_fuzz("list")).context("`cargo fuzz list` failed")?;
    let listed: Vec<String> = listed.lines().map(str::to_string).collect();
    for target in &targets {
        ensure!(
            listed.contains(target),
            "no fuzz target `{target}`; the targets are: {}",
            listed.join(", ")
        );
    }
    let targets = if targets.is_empty() { listed } else { targets };

    let started = Instant::now();
    run(toolchain
        .cargo_fuzz("build")
        .args(["--sanitizer", toolchain.sanitizer]))?;
    println!("    built in {}", secs(started.elapsed()));

    let fuzz_dir = workspace_root().join(FUZZ_DIR);
    for target in &targets {
        println!("==> fuzz {target} for {seconds} s");
        // New inputs go to a scratch folder under fuzz/target (libFuzzer writes to its first
        // corpus folder), never into the committed corpus.
        let scratch: PathBuf = fuzz_dir.join("target/corpus").join(target);
        std::fs::create_dir_all(&scratch)
            .with_context(|| format!("creating {}", scratch.display()))?;
        let committed = fuzz_dir.join("corpus").join(target);
        let t = Instant::now();
        run(toolchain
            .cargo_fuzz("run")
            .args(["--sanitizer", toolchain.sanitizer, target])
            .arg(&scratch)
            .arg(&committed)
            .arg("--")
            .arg(format!("-max_total_time={seconds}"))
            .arg(format!("-timeout={FUZZ_TIMEOUT_SECONDS}"))
            .arg(format!("-rss_limit_mb={FUZZ_RSS_LIMIT_MB}"))
            .arg(format!("-malloc_limit_mb={FUZZ_MALLOC_LIMIT_MB}"))
            .arg("-print_final_stats=1"))
        .with_context(|| {
            format!(
                "fuzz target {target} failed: its reproducer is under {FUZZ_DIR}/artifacts/{target}/; \
                 rerun it with `cargo +{FUZZ_TOOLCHAIN} fuzz run {target} FILE`, fix the parser and \
                 add FILE to {FUZZ_DIR}/corpus/{target}/"
            )
        })?;
        println!("    {target}: no failure in {}", secs(t.elapsed()));
    }
    println!(
        "fuzz: {} targets ran {seconds} s each without a failure ({} in all)",
        targets.len(),
        secs(started.elapsed())
    );
    Ok(())
}
