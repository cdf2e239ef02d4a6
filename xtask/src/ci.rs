//! `cargo xtask ci`: every check CI runs, in order, stopping at the first failure, with a
//! summary of each step's outcome and time.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Result};

use crate::check_ebpf::check_ebpf;
use crate::cmd::{cargo, command, run, secs, workspace_root};
use crate::consts::{COMMITTED_OBJECT, EBPF_CRATE, FUZZ_SECONDS_PER_TARGET};
use crate::{fuzz, vm};

/// Options of `cargo xtask ci`.
#[derive(clap::Args)]
pub struct Options {
    /// Only print the steps.
    #[arg(long)]
    list: bool,
    /// Run only the named step(s) (see --list).
    #[arg(long, value_name = "STEP")]
    only: Vec<String>,
}

/// One CI step: its name for `--only`, what it runs, and how.
struct Step {
    name: &'static str,
    what: String,
    action: Box<dyn Fn() -> Result<()>>,
}

impl Step {
    fn new(
        name: &'static str,
        what: impl Into<String>,
        action: impl Fn() -> Result<()> + 'static,
    ) -> Self {
        Self {
            name,
            what: what.into(),
            action: Box::new(action),
        }
    }

    /// A step that runs the workspace's cargo with `args` in `dir` (relative to the root).
    fn cargo(name: &'static str, dir: &'static str, args: &'static [&'static str]) -> Self {
        let what = match dir {
            "" => format!("cargo {}", args.join(" ")),
            dir => format!("cargo {} (in {dir}/)", args.join(" ")),
        };
        Self::new(name, what, move || {
            let root = workspace_root();
            let dir = if dir.is_empty() { root } else { root.join(dir) };
            run(cargo().current_dir(dir).args(args))
        })
    }
}

/// The CI steps in the order they run.
fn ci_steps() -> Vec<Step> {
    let mut steps = vec![
        Step::cargo("fmt", "", &["fmt", "--all", "--", "--check"]),
        Step::cargo("fmt-ebpf", EBPF_CRATE, &["fmt", "--check"]),
        Step::cargo(
            "clippy",
            "",
            &[
                "clippy",
                "--workspace",
                "--all-targets",
                "--",
                "-D",
                "warnings",
            ],
        ),
        Step::new(
            "clippy-ebpf",
            format!(
                "cargo clippy in {EBPF_CRATE}/ for the host target (lints the kernel program's \
                 Rust; the bpf target has no clippy here), -D warnings"
            ),
            || {
                let mut cmd = cargo();
                cmd.current_dir(workspace_root().join(EBPF_CRATE))
                    .env("RUSTC_BOOTSTRAP", "1")
                    .args([
                        "clippy",
                        "--target",
                        "x86_64-unknown-linux-gnu",
                        "--release",
                        "--",
                        "-D",
                        "warnings",
                    ]);
                run(&mut cmd)
            },
        ),
        Step::new(
            "check-ebpf",
            format!("cargo xtask check-ebpf ({COMMITTED_OBJECT} matches the sources)"),
            || check_ebpf(false),
        ),
        Step::cargo("build", "", &["build", "--workspace", "--all-targets"]),
        Step::new(
            "test",
            "cargo test --workspace --no-fail-fast -- --test-threads=2 (with CI=true unless CI is set)",
            || {
                let mut cmd = cargo();
                cmd.args(["test", "--workspace", "--no-fail-fast", "--", "--test-threads=2"]);
                // CI makes the end-to-end tests run (as root) instead of skipping.
                if std::env::var_os("CI").is_none() {
                    cmd.env("CI", "true");
                }
                run(&mut cmd)
            },
        ),
    ];
    if workspace_root().join("python/tests").is_dir() {
        steps.push(Step::new(
            "pip-install",
            "pip install ./python into a fresh venv and import it",
            || {
                let venv = workspace_root().join("target/py-venv");
                let _ = std::fs::remove_dir_all(&venv);
                run(command("python3").args(["-m", "venv"]).arg(&venv))?;
                run(command(venv.join("bin/pip"))
                    .args(["install", "--quiet"])
                    .arg(workspace_root().join("python")))?;
                run(command(venv.join("bin/python")).args([
                    "-c",
                    "import bpfprof; print('bpfprof', bpfprof.__version__, 'imports')",
                ]))
            },
        ));
        steps.push(Step::new(
            "pytest",
            "python3 -m pytest python/tests (with CI=true unless CI is set)",
            || {
                let mut cmd = command("python3");
                cmd.current_dir(workspace_root()).args([
                    "-m",
                    "pytest",
                    "-p",
                    "no:cacheprovider",
                    "python/tests",
                ]);
                if std::env::var_os("CI").is_none() {
                    cmd.env("CI", "true");
                }
                run(&mut cmd)
            },
        ));
    }
    steps.push(Step::new(
        "fuzz",
        format!(
            "cargo xtask fuzz (every fuzz target of fuzz/ for {FUZZ_SECONDS_PER_TARGET} s from its \
             committed corpus)"
        ),
        || {
            fuzz::fuzz(fuzz::Options {
                seconds: FUZZ_SECONDS_PER_TARGET,
                targets: Vec::new(),
            })
        },
    ));
    // Last: the slowest step (about 5 minutes under TCG on 2 cores), and the others already
    // built what it packs into the guest.
    steps.push(Step::new(
        "vm-test",
        "cargo xtask vm-test --kernel all (the smoke suite on Debian's 6.1 and 6.12 kernels in QEMU)",
        || vm::vm_test("all"),
    ));
    steps
}

/// Runs (or with `--list` prints) the CI steps, all of them or those `--only` names.
pub fn ci(Options { list, only }: Options) -> Result<()> {
    let only = &only[..];
    let steps = ci_steps();
    let known: BTreeSet<&str> = steps.iter().map(|s| s.name).collect();
    for name in only {
        ensure!(
            known.contains(name.as_str()),
            "no CI step `{name}`; the steps are: {}",
            steps.iter().map(|s| s.name).collect::<Vec<_>>().join(", ")
        );
    }
    let steps: Vec<Step> = steps
        .into_iter()
        .filter(|s| only.is_empty() || only.iter().any(|o| o == s.name))
        .collect();
    if list {
        for (i, step) in steps.iter().enumerate() {
            println!("{:>2}. {:<11} {}", i + 1, step.name, step.what);
        }
        return Ok(());
    }

    let started = Instant::now();
    let mut results: Vec<(&Step, Result<Duration>)> = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        println!(
            "\n=== ci step {}/{}: {} — {}",
            i + 1,
            steps.len(),
            step.name,
            step.what
        );
        let t = Instant::now();
        let result = (step.action)().map(|()| t.elapsed());
        let failed = result.is_err();
        results.push((step, result));
        if failed {
            break;
        }
    }

    println!("\n=== ci summary");
    let mut failure = None;
    for step in &steps {
        let (status, time) = match results.iter().find(|(s, _)| s.name == step.name) {
            Some((_, Ok(d))) => ("ok", secs(*d)),
            Some((_, Err(e))) => {
                failure = Some((step.name, format!("{e:#}")));
                ("FAILED", String::new())
            }
            None => ("not run", String::new()),
        };
        println!("    {:<11} {:<8} {:>7}", step.name, status, time);
    }
    println!("    total {}", secs(started.elapsed()));
    match failure {
        Some((name, err)) => bail!("ci failed at step `{name}`: {err}"),
        None => {
            println!("ci: all {} steps passed", steps.len());
            Ok(())
        }
    }
}
