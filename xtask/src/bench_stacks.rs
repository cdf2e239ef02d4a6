//! Section 7 of `cargo xtask bench`: what the stack walkers cost. The kernel program's time
//! per sample with CFI tables against frame pointers, at 12 and 120 frames; building unwind
//! tables for libc and for a generated 400 MB library (PyTorch's libtorch_cpu.so is 430 MB);
//! the overhead of bpfprof's in-kernel CFI walk against `perf record --call-graph dwarf` (the
//! peer that gives the same stacks, by copying the stack and unwinding afterwards), workload
//! slowdown and bytes written; and the same for Python frames against py-spy.
//!
//! Kernel time comes from BPF run-time statistics (`--bpf-stats`): the program's total run
//! time over its runs. It also runs for every sample of every other process (rejected after
//! one lookup), so a run of bpfprof watching an idle process while the same workload runs
//! measures that floor, and the per-sample cost is `(total - (runs - samples) * floor) /
//! samples`. Benchmarks, not tests: nothing fails on a number.

use std::{
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use super::{median, stat, Bench, Plan, Verdict};

/// The burn workload's flags without frame pointers: as distributions build.
const NOFP_CFLAGS: &[&str] = &[
    "-O2",
    "-g",
    "-fomit-frame-pointer",
    "-fno-shrink-wrap",
    "-fno-optimize-sibling-calls",
    "-fno-ipa-icf",
    "-pthread",
];
/// `burn`'s recursion depth for about 12 and 120 frames per stack (its thread adds 4).
const DEPTHS: [(usize, &str); 2] = [(12, "8"), (120, "116")];
/// Functions of the generated library, and bytes of code each: 1M functions of 400 bytes
/// make a 400 MB text with about as many unwind rows as libtorch_cpu.so.
const BIG_LIB_FUNCTIONS: usize = 1_000_000;
const BIG_LIB_FUNCTION_BYTES: usize = 400;
/// Work per thread of the overhead runs (about 1.5 s alone here).
const BURN_ITERS: &str = "1100000000";
/// Depth of the Python stack in the Python rows.
const PYTHON_DEPTH: usize = 30;

/// One bpfprof run's kernel cost, from its summary.
struct KernelCost {
    run_ns: f64,
    runs: f64,
    samples: f64,
}

impl KernelCost {
    fn read(summary: &Path) -> Result<KernelCost> {
        let v: Value = serde_json::from_str(&fs::read_to_string(summary)?)?;
        let cost = &v["cost"];
        let num = |x: &Value, what: &str| {
            x.as_f64()
                .with_context(|| format!("{what} missing from {}", summary.display()))
        };
        Ok(KernelCost {
            run_ns: num(&cost["bpf_run_time_ns"], "bpf_run_time_ns")?,
            runs: num(&cost["bpf_run_count"], "bpf_run_count")?,
            samples: num(&v["samples_seen"], "samples_seen")?,
        })
    }

    /// Nanoseconds per target sample, with `floor` ns per rejected run taken out.
    fn per_sample(&self, floor: f64) -> f64 {
        (self.run_ns - (self.runs - self.samples).max(0.0) * floor) / self.samples.max(1.0)
    }
}

impl Bench {
    /// Section 7: the stack walkers' cost.
    pub(super) fn stacks(
        &self,
        plan: &Plan,
        md: &mut String,
        verdicts: &mut Vec<Verdict>,
    ) -> Result<()> {
        println!("==> 7. stacks without frame pointers, and Python frames");
        self.cc(&self.root.join("bench/burn.c"), "burn_nofp", NOFP_CFLAGS)?;
        writeln!(
            md,
            "\n## 7. Stacks without frame pointers, and Python frames\n"
        )?;
        self.kernel_time(plan, md, verdicts)?;
        self.table_build(md, verdicts)?;
        self.dwarf_overhead(plan, md, verdicts)?;
        self.python_cost(plan, md, verdicts)?;
        Ok(())
    }

    /// Kernel time per sample, CFI tables vs frame pointers, at 12 and 120 frames.
    fn kernel_time(&self, plan: &Plan, md: &mut String, verdicts: &mut Vec<Verdict>) -> Result<()> {
        let rounds = plan.rounds.min(3);
        let seconds = if plan.quick { "2s" } else { "4s" };
        let mut floors = Vec::new();
        let mut rows: Vec<(usize, &str, Vec<f64>, f64)> = Vec::new();
        for &(frames, depth) in &DEPTHS {
            for (binary, unwind) in [("burn", "fp"), ("burn_nofp", "cfi")] {
                let mut per_sample = Vec::new();
                let mut mean_frames = 0.0;
                for _ in 0..rounds {
                    let mut target = self.spawn_target(binary, &["0", "1", depth])?;
                    std::thread::sleep(Duration::from_millis(300));
                    // The floor, with the same workload on the CPU: bpfprof watching a sleep.
                    let mut idle = Command::new("sleep").arg("30").spawn()?;
                    let floor = self.bpf_cost(idle.id(), seconds, "fp", "floor")?;
                    let _ = idle.kill();
                    let _ = idle.wait();
                    floors.push(floor.run_ns / floor.runs.max(1.0));
                    let cost = self.bpf_cost(target.id(), seconds, unwind, "walk")?;
                    mean_frames = self.mean_user_frames("walk")?;
                    per_sample.push(cost.per_sample(median(&floors)));
                    let _ = target.kill();
                    let _ = target.wait();
                }
                rows.push((frames, unwind, per_sample, mean_frames));
            }
        }
        writeln!(
            md,
            "### Kernel program time per sample\n\n`bench/burn.c` on one thread, recursing to \
             about 12 and 120 frames, built with frame pointers (`--unwind fp`) and without \
             (`-fomit-frame-pointer`, `--unwind cfi`), profiled by `--pid` at 999 Hz with \
             `--bpf-stats` for {seconds}; per target sample, the floor of {} ns per rejected \
             sample taken out (see the module docs of `xtask/src/bench_stacks.rs`). Median \
             (min–max) over {rounds} rounds.\n",
            stat(&floors, 0)
        )?;
        writeln!(
            md,
            "| stack | walk | user frames per stack | ns per sample |\n|---|---|---|---|"
        )?;
        for (frames, unwind, per_sample, mean_frames) in &rows {
            writeln!(
                md,
                "| ~{frames} frames | {} | {mean_frames:.1} | {} |",
                if *unwind == "fp" {
                    "frame pointers"
                } else {
                    "CFI tables"
                },
                stat(per_sample, 0)
            )?;
        }
        let get = |frames: usize, unwind: &str| {
            rows.iter()
                .find(|r| r.0 == frames && r.1 == unwind)
                .map_or(f64::NAN, |r| median(&r.2))
        };
        let ratio = get(12, "cfi") / get(12, "fp");
        verdicts.push(Verdict {
            target: "CFI walk at most 2x the frame-pointer walk, 12 frames".into(),
            measured: format!(
                "{:.0} vs {:.0} ns per sample: {ratio:.2}x",
                get(12, "cfi"),
                get(12, "fp")
            ),
            met: ratio <= 2.0,
        });
        let deep = get(120, "cfi");
        verdicts.push(Verdict {
            target: "CFI walk under 10 µs per sample at 120 frames".into(),
            measured: format!("{:.1} µs", deep / 1000.0),
            met: deep < 10_000.0,
        });
        Ok(())
    }

    /// Runs bpfprof on `pid` with BPF statistics; its outputs are `<name>.json` and
    /// `<name>.folded` in the bench folder.
    fn bpf_cost(&self, pid: u32, seconds: &str, unwind: &str, name: &str) -> Result<KernelCost> {
        let summary = self.dir.join(format!("{name}.json"));
        let folded = self.dir.join(format!("{name}.folded"));
        let status = Command::new(&self.bpfprof)
            .args(["--pid", &pid.to_string(), "-F", "999", "-d", seconds])
            .args(["--unwind", unwind, "--bpf-stats", "-q"])
            .arg("--summary-json")
            .arg(&summary)
            .arg("-o")
            .arg(&folded)
            .status()?;
        if !status.success() {
            bail!("bpfprof --pid {pid} ({name}) failed: {status}");
        }
        KernelCost::read(&summary)
    }

    /// Mean user frames per sample of `<name>.folded` (kernel frames and the process left out).
    fn mean_user_frames(&self, name: &str) -> Result<f64> {
        let text = fs::read_to_string(self.dir.join(format!("{name}.folded")))?;
        let (mut frames, mut samples) = (0.0, 0.0);
        for line in text.lines() {
            let Some((stack, n)) = line.rsplit_once(' ') else {
                continue;
            };
            let n: f64 = n.parse().unwrap_or(0.0);
            let user = stack
                .split(';')
                .skip(1)
                .filter(|f| !f.ends_with("_[k]"))
                .count();
            frames += n * user as f64;
            samples += n;
        }
        Ok(frames / samples.max(1.0))
    }

    /// Unwind table build time and size for libc and a generated 400 MB library.
    fn table_build(&self, md: &mut String, verdicts: &mut Vec<Verdict>) -> Result<()> {
        let big = self.big_library()?;
        crate::run(crate::cargo().args([
            "build",
            "--release",
            "-p",
            "profiler-user",
            "--example",
            "unwind_tables",
        ]))?;
        let out = Command::new(self.root.join("target/release/examples/unwind_tables"))
            .arg("/lib/x86_64-linux-gnu/libc.so.6")
            .arg(&big)
            .output()?;
        if !out.status.success() {
            bail!(
                "unwind_tables failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        writeln!(
            md,
            "\n### Unwind tables\n\nBuilt from `.eh_frame` by bpfprof's table builder \
             (`cargo run --release -p profiler-user --example unwind_tables -- FILE...`: best \
             of 3 builds). The large library is generated: {BIG_LIB_FUNCTIONS} functions of \
             {BIG_LIB_FUNCTION_BYTES} bytes with ordinary prologue/epilogue CFI, assembled and \
             linked by gcc.\n\n```\n{}```",
            text
        )?;
        // The example prints: object, file MB, build ms, rows, table KiB, B/row.
        let big_row = text
            .lines()
            .find(|l| l.contains("big400"))
            .context("no row for the generated library")?;
        let cols: Vec<&str> = big_row.split_whitespace().collect();
        let n = cols.len();
        let ms: f64 = cols[n - 4].parse()?;
        let bytes_per_row: f64 = cols[n - 1].parse()?;
        verdicts.push(Verdict {
            target: "unwind table of a 400 MB library in under 2 s, at most 12 bytes per row"
                .into(),
            measured: format!("{:.2} s, {bytes_per_row} bytes per row", ms / 1000.0),
            met: ms < 2000.0 && bytes_per_row <= 12.0,
        });
        Ok(())
    }

    /// The generated 400 MB library, built once (cached by its parameters).
    fn big_library(&self) -> Result<PathBuf> {
        let so = self.dir.join(format!(
            "big400-{BIG_LIB_FUNCTIONS}x{BIG_LIB_FUNCTION_BYTES}.so"
        ));
        if so.exists() {
            return Ok(so);
        }
        println!("    generating a {BIG_LIB_FUNCTIONS}-function library (once)");
        let asm = self.dir.join("big400.s");
        let mut text = String::with_capacity(BIG_LIB_FUNCTIONS * 200);
        text.push_str(".text\n");
        for i in 0..BIG_LIB_FUNCTIONS {
            // Push, frame, body, pop: four CFA changes, as compiled code has.
            writeln!(
                text,
                "f{i}:\n.cfi_startproc\npush %rbx\n.cfi_def_cfa_offset 16\n.cfi_offset %rbx, -16\n\
                 sub $32, %rsp\n.cfi_def_cfa_offset 48\n.skip {}, 0x90\nadd $32, %rsp\n\
                 .cfi_def_cfa_offset 16\npop %rbx\n.cfi_def_cfa_offset 8\nret\n.cfi_endproc",
                BIG_LIB_FUNCTION_BYTES - 14
            )?;
        }
        fs::write(&asm, text)?;
        let started = Instant::now();
        crate::run(
            Command::new("gcc")
                .args(["-shared", "-nostdlib", "-Wl,--eh-frame-hdr", "-o"])
                .arg(&so)
                .arg(&asm),
        )?;
        let _ = fs::remove_file(&asm);
        println!("    built in {}", crate::secs(started.elapsed()));
        Ok(so)
    }

    /// Workload slowdown and bytes written: bpfprof's CFI walk vs perf's DWARF unwinding.
    fn dwarf_overhead(
        &self,
        plan: &Plan,
        md: &mut String,
        verdicts: &mut Vec<Verdict>,
    ) -> Result<()> {
        let rounds = plan.rounds.min(5);
        let threads = self.cpus.to_string();
        let burn = self.dir.join("burn_nofp");
        let bpf_out = self.dir.join("dwarf-bpfprof.pb.gz");
        let perf_data = self.dir.join("dwarf-perf.data");
        let perf_fp = self.dir.join("fp-perf.data");
        let mut alone = Vec::new();
        let mut arms: [(&str, Vec<f64>, Vec<f64>); 3] = [
            ("bpfprof --unwind cfi", Vec::new(), Vec::new()),
            ("perf record --call-graph dwarf", Vec::new(), Vec::new()),
            ("perf record -g (frame pointers)", Vec::new(), Vec::new()),
        ];
        for _ in 0..rounds {
            alone.push(workload_secs(
                Command::new(&burn).args([BURN_ITERS, &threads]),
            )?);
            let mut bpf = Command::new(&self.bpfprof);
            bpf.args(["-F", "999", "--unwind", "cfi", "-q", "-o"])
                .arg(&bpf_out)
                .arg("--")
                .arg(&burn)
                .args([BURN_ITERS, &threads]);
            arms[0].1.push(workload_secs(&mut bpf)?);
            arms[0].2.push(fs::metadata(&bpf_out)?.len() as f64);
            for (i, data, callgraph) in [(1, &perf_data, "dwarf"), (2, &perf_fp, "fp")] {
                let mut perf = Command::new("perf");
                perf.args(["record", "-q", "-F", "999", "-e", "cpu-clock"])
                    .args(["--call-graph", callgraph, "-o"])
                    .arg(data)
                    .arg("--")
                    .arg(&burn)
                    .args([BURN_ITERS, &threads]);
                arms[i].1.push(workload_secs(&mut perf)?);
                arms[i].2.push(fs::metadata(data)?.len() as f64);
            }
        }
        let base = median(&alone);
        writeln!(
            md,
            "\n### Against perf's DWARF unwinding\n\n`bench/burn.c` built without frame pointers, \
             {} threads of {BURN_ITERS} multiply-adds, launched under each profiler at 999 Hz \
             (cpu-clock); slowdown = the workload's own time / its time alone ({:.3} s, \
             median), and the bytes each profiler wrote (bpfprof: its pprof file; perf: \
             `perf.data`, before `perf script` unwinds it). Median (min–max) over {rounds} \
             rounds.\n\n| profiler | slowdown | bytes written |\n|---|---|---|",
            self.cpus, base
        )?;
        for (name, secs, bytes) in &arms {
            let slow: Vec<f64> = secs.iter().map(|s| s / base).collect();
            writeln!(
                md,
                "| {name} | {} | {} |",
                stat(&slow, 3),
                human_bytes(median(bytes))
            )?;
        }
        let bpf_added = median(&arms[0].1) / base - 1.0;
        let dwarf_added = median(&arms[1].1) / base - 1.0;
        verdicts.push(Verdict {
            target:
                "overhead and bytes far below perf --call-graph dwarf (999 Hz, no frame pointers)"
                    .into(),
            measured: format!(
                "added time {:+.1}% vs {:+.1}%; {} vs {}",
                bpf_added * 100.0,
                dwarf_added * 100.0,
                human_bytes(median(&arms[0].2)),
                human_bytes(median(&arms[1].2))
            ),
            met: bpf_added < dwarf_added && median(&arms[0].2) * 10.0 < median(&arms[1].2),
        });
        let _ = fs::remove_file(&perf_data);
        let _ = fs::remove_file(&perf_fp);
        Ok(())
    }

    /// Python: kernel time for a 30-deep Python stack, and overhead next to py-spy.
    fn python_cost(&self, plan: &Plan, md: &mut String, verdicts: &mut Vec<Verdict>) -> Result<()> {
        let Some(python) = pyenv_python("3.12") else {
            writeln!(
                md,
                "\n### Python\n\nNot measured: no pyenv CPython 3.12 here."
            )?;
            return Ok(());
        };
        let py_spy = py_spy()?;
        let script = self.dir.join("pydeep.py");
        fs::write(&script, python_workload())?;
        let rounds = plan.rounds.min(5);
        // Kernel time per sample with a 30-deep Python stack (the walker reads both the native
        // and the Python stack), the floor from a bpfprof watching an idle process.
        let mut target = Command::new(&python)
            .arg(&script)
            .arg("0")
            .stdout(Stdio::null())
            .spawn()?;
        std::thread::sleep(Duration::from_millis(500));
        let mut idle = Command::new("sleep").arg("30").spawn()?;
        let floor = self.bpf_cost(idle.id(), "3s", "fp", "pyfloor")?;
        let _ = idle.kill();
        let _ = idle.wait();
        let floor_ns = floor.run_ns / floor.runs.max(1.0);
        let deep = self.bpf_cost(target.id(), "4s", "auto", "pydeep")?;
        let per_sample = deep.per_sample(floor_ns);
        let frames = fs::read_to_string(self.dir.join("pydeep.folded"))?
            .lines()
            .map(|l| l.matches(";level").count())
            .max()
            .unwrap_or(0);
        let _ = target.kill();
        let _ = target.wait();
        // Overhead next to py-spy, at 99 and 999 Hz, both attached for the whole workload.
        let hz: &[u64] = if plan.quick { &[999] } else { &[99, 999] };
        let mut rows = Vec::new();
        for &rate in hz {
            let (mut alone, mut bpf, mut spy) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..rounds {
                alone.push(workload_secs(Command::new(&python).arg(&script).arg("1"))?);
                let mut b = Command::new(&self.bpfprof);
                b.args(["-F", &rate.to_string(), "-q", "-o"])
                    .arg(self.dir.join("py-bpfprof.folded"))
                    .arg("--")
                    .arg(&python)
                    .arg(&script)
                    .arg("1");
                bpf.push(workload_secs(&mut b)?);
                let mut s = Command::new(&py_spy);
                s.args(["record", "-r", &rate.to_string(), "--format", "raw", "-o"])
                    .arg(self.dir.join("py-spy.txt"))
                    .arg("--")
                    .arg(&python)
                    .arg(&script)
                    .arg("1");
                spy.push(workload_secs(&mut s)?);
            }
            let base = median(&alone);
            rows.push((rate, base, median(&bpf) / base, median(&spy) / base));
        }
        writeln!(
            md,
            "\n### Python\n\npyenv's CPython 3.12 (no frame pointers), a Python function {PYTHON_DEPTH} \
             calls deep that loops in Python (`target/bench/pydeep.py`). Kernel time per sample \
             (native CFI walk and Python walk; deepest stack {frames} Python levels): \
             **{per_sample:.0} ns** (floor {floor_ns:.0} ns per rejected sample). Overhead: the \
             workload's own time under `bpfprof -- python3 ...` and `py-spy record -r HZ -- \
             python3 ...` over its time alone, medians of {rounds} rounds.\n\n| rate | alone, s | \
             bpfprof | py-spy |\n|---|---|---|---|"
        )?;
        for (rate, base, b, s) in &rows {
            writeln!(md, "| {rate} Hz | {base:.3} | {b:.3} | {s:.3} |")?;
        }
        verdicts.push(Verdict {
            target: "kernel time for a 30-deep Python stack under 10 µs".into(),
            measured: format!("{:.1} µs", per_sample / 1000.0),
            met: per_sample < 10_000.0,
        });
        if let Some(&(_, _, b, s)) = rows.iter().find(|r| r.0 == 999) {
            verdicts.push(Verdict {
                target: "Python slowdown at most half of py-spy's, 999 Hz".into(),
                measured: format!(
                    "added time {:+.1}% vs py-spy's {:+.1}%",
                    (b - 1.0) * 100.0,
                    (s - 1.0) * 100.0
                ),
                met: (b - 1.0) <= 0.5 * (s - 1.0),
            });
        }
        Ok(())
    }
}

/// Runs a workload that prints `secs S` (its own time for the work) and returns S.
fn workload_secs(cmd: &mut Command) -> Result<f64> {
    let out = cmd.stderr(Stdio::null()).output()?;
    if !out.status.success() {
        bail!("{cmd:?} failed: {}", out.status);
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("secs ").and_then(|s| s.trim().parse().ok()))
        .with_context(|| format!("{cmd:?} printed no `secs`"))
}

fn human_bytes(b: f64) -> String {
    if b >= 1e6 {
        format!("{:.1} MB", b / 1e6)
    } else {
        format!("{:.0} KB", b / 1e3)
    }
}

/// pyenv's newest CPython `minor` (`3.12`), if installed.
fn pyenv_python(minor: &str) -> Option<PathBuf> {
    let home = PathBuf::from(std::env::var("HOME").unwrap_or("/root".into()));
    let mut found: Vec<PathBuf> = fs::read_dir(home.join(".pyenv/versions"))
        .ok()?
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(&format!("{minor}."))
        })
        .map(|e| e.path().join("bin/python3"))
        .filter(|p| p.exists())
        .collect();
    found.sort();
    found.pop()
}

/// py-spy, installed from PyPI when missing.
fn py_spy() -> Result<PathBuf> {
    let ok = |p: &str| {
        Command::new(p)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !ok("py-spy") {
        crate::run(Command::new("python3").args(["-m", "pip", "install", "-q", "py-spy"]))?;
    }
    let found = Command::new("sh")
        .args(["-c", "command -v py-spy"])
        .output()?;
    let path = String::from_utf8_lossy(&found.stdout).trim().to_string();
    if path.is_empty() {
        bail!("py-spy is not on PATH after installing it");
    }
    Ok(PathBuf::from(path))
}

/// The Python workload: `level0` ... `level29` call each other, and the innermost loops in
/// Python. With argument 1 it does a fixed amount of work and prints `secs S`; with 0 it
/// loops until killed.
fn python_workload() -> String {
    let mut s = String::from("import sys, time\n\n");
    for i in 0..PYTHON_DEPTH {
        if i + 1 < PYTHON_DEPTH {
            s.push_str(&format!(
                "def level{i}(n):\n    return level{}(n)\n\n",
                i + 1
            ));
        } else {
            s.push_str(&format!(
                "def level{i}(n):\n    t = 0\n    for k in range(n):\n        t += k * k\n    return t\n\n"
            ));
        }
    }
    s.push_str(
        "forever = sys.argv[1] == '0'\nstart = time.monotonic()\nrounds = 0\n\
         while forever or rounds < 40:\n    level0(200000)\n    rounds += 1\n\
         print(f'secs {time.monotonic() - start:.6f}')\n",
    );
    s
}
