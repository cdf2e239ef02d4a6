//! Compiling the C workloads in `bench/` (and the generated ones), and starting a workload to
//! attach to.

use std::ffi::OsString;
use std::fs;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result};

use super::big::generate_big;
use super::plan::{BIG_CFLAGS, BIG_LEVELS, BIG_PER_LEVEL, CFLAGS};
use super::Bench;

impl Bench {
    /// Compiles the workloads in `bench/` and the generated large binary into the bench's directory.
    pub(super) fn compile_workloads(&self) -> Result<()> {
        println!("==> compiling the workloads into {}", self.dir.display());
        let src = self.root.join("bench");
        for name in ["burn", "split", "alias", "startup", "duty"] {
            self.cc(&src.join(format!("{name}.c")), name, CFLAGS)?;
        }
        // The generated program is rebuilt only when its source changes: even at -O0 it is
        // gcc's largest job here.
        let big = self.dir.join("big.c");
        let source = generate_big(BIG_LEVELS, BIG_PER_LEVEL, 0x5eed);
        let binary = self.dir.join("big");
        if fs::read_to_string(&big).ok().as_deref() != Some(source.as_str()) || !binary.exists() {
            fs::write(&big, &source)?;
            self.cc(&big, "big", BIG_CFLAGS)?;
        }
        let out = Command::new(self.dir.join("startup"))
            .arg("--calibrate")
            .output()?;
        let rate = String::from_utf8_lossy(&out.stdout)
            .lines()
            .find_map(|l| l.strip_prefix("tsc_per_ns "))
            .context("startup --calibrate printed no rate")?
            .trim()
            .to_string();
        let _ = self.tsc_per_ns.set(rate);
        Ok(())
    }

    /// `bench/startup.c`'s argv.
    pub(super) fn startup_argv(&self) -> Vec<OsString> {
        let rate = self.tsc_per_ns.get().map_or("1", String::as_str);
        self.workload("startup", &[rate])
    }

    /// Compiles one C source into the bench's directory as `name`.
    pub(super) fn cc(&self, source: &Path, name: &str, flags: &[&str]) -> Result<()> {
        crate::cmd::run(
            Command::new("gcc")
                .args(flags)
                .arg("-I")
                .arg(self.root.join("bench"))
                .arg("-o")
                .arg(self.dir.join(name))
                .arg(source),
        )
    }

    /// The argv of workload `name`.
    pub(super) fn workload(&self, name: &str, args: &[&str]) -> Vec<OsString> {
        let mut argv = vec![self.dir.join(name).into_os_string()];
        argv.extend(args.iter().map(OsString::from));
        argv
    }

    /// Starts a workload to attach to; it runs until [`stop_target`].
    pub(super) fn spawn_target(&self, name: &str, args: &[&str]) -> Result<Child> {
        let child = Command::new(self.dir.join(name))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        // Let it reach its steady state (threads started, libraries mapped).
        std::thread::sleep(Duration::from_millis(300));
        Ok(child)
    }
}
