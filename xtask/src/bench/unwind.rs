//! What sections 7 to 11 share (issues 11, CFI unwinding, and 12, Python frames): timed
//! launches, bpfprof commands and their results, the kernel program's time per sample, the
//! generated 400 MB shared object, and small queries on stacks.
//!
//! Like the rest of the bench, nothing in these sections fails on a number: each target is a
//! verdict line.

use std::fmt::Write as _;
use std::fs;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use serde_json::Value;

use super::plan::{
    LARGE_BODY_BYTES, LARGE_CHUNK_BYTES, LARGE_FUNCTIONS, LAUNCH_LIMIT, NOFP_CFLAGS, RUN_LIMIT,
};
use super::process::{mono_ns, signal, tail, wait_usage, Monitor};
use super::profiles::bpfprof_stacks;
use super::python::PYWORK;
use super::records::Stacks;
use super::Bench;

/// Kernel-program time of one attached bpfprof run, from its summary.
#[derive(Clone, Copy, Debug)]
pub(super) struct KernelRun {
    pub(super) run_time_ns: f64,
    pub(super) run_count: f64,
    /// Samples of the target (each walked and recorded).
    pub(super) target_samples: f64,
    /// Mean frames per kept stack, to show the walk reached the depth asked for.
    pub(super) frames: f64,
    /// Share of the target's samples with Python frames read by the kernel, in percent.
    pub(super) python_share: f64,
}

/// The current 1-minute load average, for the notes on a shared machine.
pub(super) fn load_average() -> String {
    fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

/// The stacks' mean depth, weighted by samples.
fn mean_frames(stacks: &Stacks) -> f64 {
    let (mut frames, mut n) = (0u64, 0u64);
    for (stack, &count) in stacks {
        frames += stack.split(';').count() as u64 * count;
        n += count;
    }
    frames as f64 / n.max(1) as f64
}

/// Share of samples, in percent, whose stack has a frame containing `needle`.
pub(super) fn share_with(stacks: &Stacks, needle: &str) -> f64 {
    let total: u64 = stacks.values().sum();
    let with: u64 = stacks
        .iter()
        .filter(|(s, _)| s.contains(needle))
        .map(|(_, n)| n)
        .sum();
    100.0 * with as f64 / total.max(1) as f64
}

/// Bytes of the files at `paths` (those that exist).
pub(super) fn bytes_of(paths: &[PathBuf]) -> u64 {
    paths
        .iter()
        .filter_map(|p| fs::metadata(p).ok())
        .map(|m| m.len())
        .sum()
}

/// What one launched command left: its stdout lines, wall time, when it was spawned.
pub(super) struct Timed {
    pub(super) lines: Vec<String>,
    pub(super) wall_secs: f64,
    pub(super) spawned_ns: u64,
}

impl Timed {
    /// The value of the command's `KEY VALUE` line.
    pub(super) fn value(&self, key: &str) -> Result<f64> {
        self.lines
            .iter()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(' '))
            .with_context(|| format!("no `{key}` line in {:?}", self.lines))?
            .trim()
            .parse()
            .with_context(|| format!("the `{key}` line"))
    }
}

impl Bench {
    /// Builds the extra workloads these sections use (cached like the others).
    pub(super) fn compile_unwind_workloads(&self) -> Result<()> {
        let burn = self.root.join("bench/burn.c");
        self.cc(&burn, "burn-nofp", NOFP_CFLAGS)?;
        fs::write(self.dir.join("pywork.py"), PYWORK)?;
        Ok(())
    }

    /// Runs `cmd` to its end, timing it and keeping its stdout lines.
    pub(super) fn timed(&self, mut cmd: Command) -> Result<Timed> {
        let stderr = self.dir.join("unwind.stderr");
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(File::create(&stderr)?);
        let spawned_ns = mono_ns();
        let start = Instant::now();
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting {}", crate::cmd::describe(&cmd)))?;
        let monitor = Monitor::new(child.id() as i32, LAUNCH_LIMIT);
        let mut lines = Vec::new();
        for line in BufReader::new(child.stdout.take().context("stdout")?).lines() {
            lines.push(line?);
        }
        let (status, _) = wait_usage(&mut child, monitor)?;
        let wall_secs = start.elapsed().as_secs_f64();
        ensure!(
            status == 0,
            "`{}` exited with status {status}: {}",
            crate::cmd::describe(&cmd),
            tail(&stderr)
        );
        Ok(Timed {
            lines,
            wall_secs,
            spawned_ns,
        })
    }

    /// `bpfprof -q` with its profile and summary going to `target/bench/u.*`, plus `args`.
    pub(super) fn bpfprof_cmd(&self, args: &[&str]) -> Command {
        self.bpfprof_cmd_with(true, args)
    }

    /// As [`Bench::bpfprof_cmd`], without `-q`: bpfprof says on stderr when sampling starts.
    fn bpfprof_cmd_verbose(&self, args: &[&str]) -> Command {
        self.bpfprof_cmd_with(false, args)
    }

    fn bpfprof_cmd_with(&self, quiet: bool, args: &[&str]) -> Command {
        let out = self.dir.join("u");
        for ext in ["folded", "json"] {
            let _ = fs::remove_file(out.with_extension(ext));
        }
        let mut c = Command::new(&self.bpfprof);
        if quiet {
            c.arg("-q");
        }
        c.arg("-o")
            .arg(out.with_extension("folded"))
            .arg("--summary-json")
            .arg(out.with_extension("json"))
            .args(args);
        c
    }

    /// The stacks and summary the last [`Bench::bpfprof_cmd`] run wrote.
    pub(super) fn bpfprof_result(&self) -> Result<(Stacks, Value)> {
        let out = self.dir.join("u");
        let summary: Value = serde_json::from_slice(&fs::read(out.with_extension("json"))?)
            .context("bpfprof's summary")?;
        self.note_losses(&summary);
        let folded = fs::read_to_string(out.with_extension("folded"))?;
        Ok((bpfprof_stacks(&folded), summary))
    }

    /// Attaches bpfprof with `--bpf-stats` and `args` to `pid` for `secs` and reads its
    /// kernel-program time from the summary.
    pub(super) fn kernel_run(&self, pid: i32, args: &[&str], secs: f64) -> Result<KernelRun> {
        let pid_s = pid.to_string();
        let mut cmd = self.bpfprof_cmd_verbose(&["--bpf-stats", "-F", "999", "--pid", &pid_s]);
        cmd.args(args);
        let stderr = self.dir.join("unwind.stderr");
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&stderr)?);
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting {}", crate::cmd::describe(&cmd)))?;
        let monitor = Monitor::new(child.id() as i32, RUN_LIMIT);
        // Sample for `secs` from the moment sampling starts (bpfprof's start-up, program
        // load included, takes from a few hundred ms to over a second on a loaded machine).
        let waited = Instant::now();
        while !fs::read_to_string(&stderr)
            .unwrap_or_default()
            .contains("bpfprof: loaded program id")
        {
            ensure!(
                child.try_wait()?.is_none() && waited.elapsed() < LAUNCH_LIMIT,
                "bpfprof did not start sampling: {}",
                tail(&stderr)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_secs_f64(secs));
        signal(&child, libc::SIGINT);
        let (status, _) = wait_usage(&mut child, monitor)?;
        ensure!(
            status == 0 || status == 130,
            "bpfprof exited with status {status}: {}",
            tail(&stderr)
        );
        let (stacks, summary) = self.bpfprof_result()?;
        let cost = &summary["cost"];
        Ok(KernelRun {
            run_time_ns: cost["bpf_run_time_ns"]
                .as_f64()
                .context("no bpf_run_time_ns: are BPF statistics available?")?,
            run_count: cost["bpf_run_count"].as_f64().unwrap_or(0.0),
            target_samples: summary["samples_seen"].as_f64().unwrap_or(0.0),
            frames: mean_frames(&stacks),
            python_share: 100.0 * summary["unwind"]["python_stacks"].as_f64().unwrap_or(0.0)
                / summary["samples_seen"].as_f64().unwrap_or(0.0).max(1.0),
        })
    }

    /// The generated large shared object (about 410 MB, its CFI like a compiler's), built once
    /// and kept under `target/bench/` while its generator's parameters stay the same.
    pub(super) fn large_object(&self) -> Result<PathBuf> {
        let so = self.dir.join("large-cfi.so");
        let stamp = self.dir.join("large-cfi.stamp");
        let params = format!("{LARGE_FUNCTIONS} {LARGE_BODY_BYTES} {LARGE_CHUNK_BYTES} v2");
        if so.exists() && fs::read_to_string(&stamp).ok().as_deref() == Some(params.as_str()) {
            return Ok(so);
        }
        let started = Instant::now();
        let asm = self.dir.join("large-cfi.s");
        fs::write(&asm, generate_large_asm(LARGE_FUNCTIONS, LARGE_BODY_BYTES))?;
        crate::cmd::run(
            Command::new("gcc")
                .args(["-shared", "-nostdlib", "-Wl,--eh-frame-hdr", "-o"])
                .arg(&so)
                .arg(&asm),
        )?;
        let _ = fs::remove_file(&asm);
        fs::write(&stamp, params)?;
        println!(
            "    generated {} in {}",
            so.display(),
            crate::cmd::secs(started.elapsed())
        );
        Ok(so)
    }
}

/// Assembly for a shared object of `functions` functions, each with `body` filler bytes and the
/// CFI directives gcc emits for its prologue and epilogue: four shapes in turn (frame pointer,
/// frameless with a stack allocation, callee-saved pushes, and a leaf without CFA changes), so
/// the table has the mix of rows a real binary has. The frameless shapes also push and pop
/// around every [`LARGE_CHUNK_BYTES`] of their body (as code does around calls), each a CFA
/// change and so a row: a row density near a real binary's, not one row per 4 KiB.
pub(super) fn generate_large_asm(functions: usize, body: usize) -> String {
    let chunks = body / LARGE_CHUNK_BYTES;
    let mut frameless_body = String::new();
    for _ in 0..chunks {
        let _ = writeln!(
            frameless_body,
            "\tpushq %rax\n\t.cfi_adjust_cfa_offset 8\n\t.skip {}, 0x90\n\tpopq %rax\n\t.cfi_adjust_cfa_offset -8",
            LARGE_CHUNK_BYTES - 2
        );
    }
    let mut s = String::with_capacity(functions * 420);
    s.push_str("\t.text\n");
    for i in 0..functions {
        let _ = writeln!(
            s,
            "\t.globl f{i}\n\t.type f{i}, @function\n\t.p2align 4\nf{i}:\n\t.cfi_startproc"
        );
        match i % 4 {
            0 => {
                s.push_str("\tpushq %rbp\n\t.cfi_def_cfa_offset 16\n\t.cfi_offset %rbp, -16\n\tmovq %rsp, %rbp\n\t.cfi_def_cfa_register %rbp\n\tpushq %rbx\n\t.cfi_offset %rbx, -24\n");
                let _ = writeln!(s, "\t.skip {body}, 0x90");
                s.push_str("\tpopq %rbx\n\tpopq %rbp\n\t.cfi_def_cfa %rsp, 8\n\tret\n");
            }
            1 => {
                let frame = 24 + 16 * (i % 7);
                let _ = writeln!(
                    s,
                    "\tsubq ${frame}, %rsp\n\t.cfi_def_cfa_offset {}",
                    frame + 8
                );
                s.push_str(&frameless_body);
                let _ = writeln!(s, "\taddq ${frame}, %rsp\n\t.cfi_def_cfa_offset 8\n\tret");
            }
            2 => {
                s.push_str("\tpushq %r15\n\t.cfi_def_cfa_offset 16\n\t.cfi_offset %r15, -16\n\tpushq %r14\n\t.cfi_def_cfa_offset 24\n\t.cfi_offset %r14, -24\n\tpushq %rbx\n\t.cfi_def_cfa_offset 32\n\t.cfi_offset %rbx, -32\n");
                s.push_str(&frameless_body);
                s.push_str("\tpopq %rbx\n\t.cfi_def_cfa_offset 24\n\tpopq %r14\n\t.cfi_def_cfa_offset 16\n\tpopq %r15\n\t.cfi_def_cfa_offset 8\n\tret\n");
            }
            _ => {
                let _ = writeln!(s, "\t.skip {body}, 0x90\n\tret");
            }
        }
        let _ = writeln!(s, "\t.cfi_endproc\n\t.size f{i}, .-f{i}");
    }
    s.push_str("\t.section .note.GNU-stack,\"\",@progbits\n");
    s
}
