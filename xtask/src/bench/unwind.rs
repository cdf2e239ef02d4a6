//! Sections 7 to 11 of `cargo xtask bench`: what issues 11 (CFI unwinding) and 12 (Python
//! frames) ask to measure: the kernel program's time per sample for CFI and frame-pointer
//! walks, the unwind-table build on libc and on a generated 400 MB binary, start-up with each
//! `--unwind` mode, overhead next to `perf record --call-graph dwarf`, and overhead on a
//! Python workload next to py-spy.
//!
//! Like the rest of the bench, nothing here fails on a number: each target is a verdict line.

use super::*;

/// Descent depths of the recursion workload for the kernel-time rows (issue 11: 12 and 120).
const KERNEL_DEPTHS: [usize; 2] = [12, 120];
/// Flags for the workloads built without frame pointers: gcc's default CFI, as distro binaries
/// are built; tail calls and identical-code folding stay off so that the call path is known.
const NOFP_CFLAGS: &[&str] = &[
    "-O2",
    "-g",
    "-fomit-frame-pointer",
    "-fno-optimize-sibling-calls",
    "-fno-ipa-icf",
    "-pthread",
];
/// Shape of the generated large object: functions and the filler bytes of each one's body.
/// 100,000 functions of 4 KiB make a 410 MB shared object (PyTorch's libtorch_cpu.so: 430 MB).
const LARGE_FUNCTIONS: usize = 100_000;
const LARGE_BODY_BYTES: usize = 4096;
/// Bytes between the pushes and pops of a frameless generated function (see
/// [`generate_large_asm`]).
const LARGE_CHUNK_BYTES: usize = 256;
/// Iterations of `burn` that take about 10 ms on one thread here (1.1e9 take ~1.5 s).
const SHORT_ITERS: &str = "7000000";
/// The CPython the Python rows use (a pyenv build, without frame pointers).
const PYTHON: &str = "/root/.pyenv/versions/3.12.1/bin/python3";
/// Depth of the Python recursion for the kernel-time row (issue 12: 30).
const PYTHON_DEPTH: usize = 30;
/// Python work: iterations of the hot loop, about 1.5 s alone here.
const PYTHON_ROUNDS: &str = "6000";
/// Shape of the many-functions Python program for the naming-cost row (issue 12: 10,000
/// distinct functions): call chains of `PYMANY_DEPTH` functions each.
const PYMANY_CHAINS: usize = 250;
const PYMANY_DEPTH: usize = 40;
/// Loop iterations of a chain's leaf: about 6 ms on CPython 3.12 here, six samples at 999 Hz,
/// so that every chain is sampled in each of the two passes.
const PYMANY_LEAF_ITERS: &str = "150000";
/// The frame bpfprof shows for a Python frame whose code object it could not resolve.
const UNNAMED_PYTHON: &str = "[unknown Python code]";

/// The Python workload: `leaf_hot` and `leaf_cold` 75:25 under `work`, optionally below a
/// recursion `DEPTH` deep; prints `secs S` like `burn`. With ROUNDS = 0 it runs until killed.
const PYWORK: &str = r#"import sys, time

def leaf_hot(n):
    x = 0
    for i in range(n):
        x += i * i
    return x

def leaf_cold(n):
    x = 0
    for i in range(n):
        x += i * i
    return x

def work(rounds):
    r = 0
    while rounds == 0 or r < rounds:
        leaf_hot(3000)
        leaf_cold(1000)
        r += 1

def descend(depth, rounds):
    if depth == 0:
        return work(rounds)
    return descend(depth - 1, rounds)

if __name__ == "__main__":
    rounds = int(sys.argv[1])
    depth = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    start = time.monotonic()
    descend(depth, rounds)
    print("secs %.6f" % (time.monotonic() - start), flush=True)
"#;

/// Kernel-program time of one attached bpfprof run, from its summary.
#[derive(Clone, Copy, Debug)]
struct KernelRun {
    run_time_ns: f64,
    run_count: f64,
    /// Samples of the target (each walked and recorded).
    target_samples: f64,
    /// Mean frames per kept stack, to show the walk reached the depth asked for.
    frames: f64,
    /// Share of the target's samples with Python frames read by the kernel, in percent.
    python_share: f64,
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
fn share_with(stacks: &Stacks, needle: &str) -> f64 {
    let total: u64 = stacks.values().sum();
    let with: u64 = stacks
        .iter()
        .filter(|(s, _)| s.contains(needle))
        .map(|(_, n)| n)
        .sum();
    100.0 * with as f64 / total.max(1) as f64
}

/// Share of samples, in percent, with a Python frame of `leaf_hot` or `leaf_cold`: bpfprof
/// names them `py::leaf_hot:FILE` (perf trampolines) or `leaf_hot` (the kernel walk), py-spy
/// `leaf_hot (FILE:LINE)`.
fn python_leaf_share(stacks: &Stacks) -> f64 {
    let total: u64 = stacks.values().sum();
    let with: u64 = stacks
        .iter()
        .filter(|(s, _)| {
            s.split(';').any(|f| {
                let f = f.strip_prefix("py::").unwrap_or(f);
                ["leaf_hot", "leaf_cold"].iter().any(|name| {
                    f.strip_prefix(name).is_some_and(|rest| {
                        rest.is_empty() || rest.starts_with(':') || rest.starts_with(" (")
                    })
                })
            })
        })
        .map(|(_, n)| n)
        .sum();
    100.0 * with as f64 / total.max(1) as f64
}

/// Bytes of the files at `paths` (those that exist).
fn bytes_of(paths: &[PathBuf]) -> u64 {
    paths
        .iter()
        .filter_map(|p| fs::metadata(p).ok())
        .map(|m| m.len())
        .sum()
}

/// What one launched command left: its stdout lines, wall time, when it was spawned.
struct Timed {
    lines: Vec<String>,
    wall_secs: f64,
    spawned_ns: u64,
}

impl Timed {
    fn value(&self, key: &str) -> Result<f64> {
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
    fn compile_unwind_workloads(&self) -> Result<()> {
        let burn = self.root.join("bench/burn.c");
        self.cc(&burn, "burn-nofp", NOFP_CFLAGS)?;
        fs::write(self.dir.join("pywork.py"), PYWORK)?;
        Ok(())
    }

    /// Runs `cmd` to its end, timing it and keeping its stdout lines.
    fn timed(&self, mut cmd: Command) -> Result<Timed> {
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
    fn bpfprof_cmd(&self, args: &[&str]) -> Command {
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
    fn bpfprof_result(&self) -> Result<(Stacks, Value)> {
        let out = self.dir.join("u");
        let summary: Value = serde_json::from_slice(&fs::read(out.with_extension("json"))?)
            .context("bpfprof's summary")?;
        self.note_losses(&summary);
        let folded = fs::read_to_string(out.with_extension("folded"))?;
        Ok((bpfprof_stacks(&folded), summary))
    }

    /// Attaches bpfprof with `--bpf-stats` and `args` to `pid` for `secs` and reads its
    /// kernel-program time from the summary.
    fn kernel_run(&self, pid: i32, args: &[&str], secs: f64) -> Result<KernelRun> {
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

    /// Section 7: kernel program time per target sample, CFI against frame pointers.
    pub(super) fn kernel_unwind(
        &self,
        plan: &Plan,
        md: &mut String,
        verdicts: &mut Vec<Verdict>,
    ) -> Result<()> {
        println!("==> 7. kernel program time per sample, CFI vs frame pointers");
        self.compile_unwind_workloads()?;
        let secs = if plan.quick { 1.0 } else { ATTACH_SECS };
        // (row, workload, --unwind)
        let rows = [
            (
                "frame pointers: `--unwind fp`, built with frame pointers",
                "burn",
                "fp",
            ),
            (
                "CFI: `--unwind cfi`, built without frame pointers",
                "burn-nofp",
                "cfi",
            ),
            (
                "CFI on the frame-pointer build: `--unwind cfi`",
                "burn",
                "cfi",
            ),
        ];
        let mut per_sample: BTreeMap<(usize, usize), Vec<f64>> = BTreeMap::new();
        let mut frames: BTreeMap<(usize, usize), Vec<f64>> = BTreeMap::new();
        let mut reject: Vec<f64> = Vec::new();
        // Target samples as a share of the program's runs: how much the correction weighs.
        let mut share: Vec<f64> = Vec::new();
        let mut idle = Command::new("sleep")
            .arg("3600")
            .stdin(Stdio::null())
            .spawn()
            .context("starting sleep")?;
        let result = (|| -> Result<()> {
            for &depth in &KERNEL_DEPTHS {
                let depth_s = depth.to_string();
                let cpus = self.cpus.to_string();
                for round in 0..plan.rounds {
                    let mut order: Vec<usize> = (0..rows.len()).collect();
                    rotate(&mut order, round);
                    for i in order {
                        let (_, name, mode) = rows[i];
                        // Only the measured workload runs, so that its threads are on the
                        // CPUs as much as the machine's other work lets them.
                        let mut target = self.spawn_target(name, &["0", &cpus, &depth_s])?;
                        let run = (|| -> Result<()> {
                            // The reject cost, with this workload keeping the CPUs busy: the
                            // program runs on the same samples but none matches (the target is
                            // an idle process).
                            let floor =
                                self.kernel_run(idle.id() as i32, &["--unwind", mode], secs)?;
                            let r = floor.run_time_ns / floor.run_count.max(1.0);
                            reject.push(r);
                            let k =
                                self.kernel_run(target.id() as i32, &["--unwind", mode], secs)?;
                            let other = (k.run_count - k.target_samples).max(0.0);
                            let ns = (k.run_time_ns - other * r) / k.target_samples.max(1.0);
                            println!(
                                "    depth {depth} {name} --unwind {mode}: {ns:.0} ns per target sample ({} of {} runs on the target, {:.1} frames; reject {r:.0} ns)",
                                k.target_samples, k.run_count, k.frames
                            );
                            per_sample.entry((i, depth)).or_default().push(ns);
                            frames.entry((i, depth)).or_default().push(k.frames);
                            share.push(100.0 * k.target_samples / k.run_count.max(1.0));
                            Ok(())
                        })();
                        stop_target(&mut target);
                        run?;
                    }
                }
            }
            Ok(())
        })();
        stop_target(&mut idle);
        result?;

        writeln!(
            md,
            "\n## 7. Kernel program time per sample: CFI against frame pointers\n"
        )?;
        writeln!(md, "`bench/burn.c` recursing {} and {} levels deep (`descend`; the stacks hold about 5 more frames: the leaf, `keep_frame`'s caller chain, `worker`, `start_thread`, `clone3`), one thread per core, running until killed, built twice: with frame pointers (the bench's usual flags) and without (`{}`: gcc's default `.eh_frame` CFI, as distro binaries are built). bpfprof attaches for {secs} s at 999 Hz with `--bpf-stats`; `kernel.bpf_stats_enabled` gives the program's total run time T and run count N, and the summary the samples of the target S. The program also runs, and rejects, every sample of other processes (idle CPUs, the machine's other work), so each round first measures the reject cost r: bpfprof watching an idle `sleep` while the same workload keeps both CPUs busy (T/N of that run, every sample rejected). The cost per target sample is (T − (N − S)·r) / S. Each arm's workload runs alone (one at a time), and the reject run is taken with that workload running. On this shared machine the target's samples were {} % of the program's runs (median (min–max)): the rest are the other engineers' processes and idle CPUs. Median (min–max) over {} rounds, the three arms of a round in a rotated order; frames per stack (mean over samples) shows the walk reached the full depth. The reject cost row is over all arms.\n", KERNEL_DEPTHS[0], KERNEL_DEPTHS[1], NOFP_CFLAGS.join(" "), stat(&share, 0), plan.rounds)?;
        writeln!(md, "| walk | depth {0}: ns per target sample | depth {0}: frames | depth {1}: ns per target sample | depth {1}: frames |\n|---|---|---|---|---|", KERNEL_DEPTHS[0], KERNEL_DEPTHS[1])?;
        for (i, (row, _, _)) in rows.iter().enumerate() {
            let cell = |d: usize, digits| {
                per_sample
                    .get(&(i, d))
                    .map_or("n/a".into(), |v| stat(v, digits))
            };
            let fr = |d: usize| frames.get(&(i, d)).map_or("n/a".into(), |v| stat(v, 1));
            writeln!(
                md,
                "| {row} | {} | {} | {} | {} |",
                cell(KERNEL_DEPTHS[0], 0),
                fr(KERNEL_DEPTHS[0]),
                cell(KERNEL_DEPTHS[1], 0),
                fr(KERNEL_DEPTHS[1])
            )?;
        }
        writeln!(
            md,
            "| reject cost r (no target sample), ns per run | {} | | | |",
            stat(&reject, 0)
        )?;
        let med = |i: usize, d: usize| per_sample.get(&(i, d)).map_or(f64::NAN, |v| median(v));
        let (fp12, cfi12) = (med(0, KERNEL_DEPTHS[0]), med(1, KERNEL_DEPTHS[0]));
        let ratio = cfi12 / fp12;
        writeln!(
            md,
            "\nCFI / frame pointers, medians: depth {}: {:.2}; depth {}: {:.2}.",
            KERNEL_DEPTHS[0],
            ratio,
            KERNEL_DEPTHS[1],
            med(1, KERNEL_DEPTHS[1]) / med(0, KERNEL_DEPTHS[1])
        )?;
        // The cost of one more frame: the difference between the depths over the difference
        // in frames, which leaves out what a sample costs whatever its depth.
        let per_frame = |i: usize| {
            let f = |d: usize| frames.get(&(i, d)).map_or(f64::NAN, |v| median(v));
            (med(i, KERNEL_DEPTHS[1]) - med(i, KERNEL_DEPTHS[0]))
                / (f(KERNEL_DEPTHS[1]) - f(KERNEL_DEPTHS[0]))
        };
        writeln!(md, "\nOne more frame costs {:.0} ns by CFI and {:.0} ns by frame pointers (medians; the difference between the two depths over the difference in frames). A CFI frame is a binary search of the process's mappings and then of the object's table (in BPF maps, each step a bounds-checked map access), the CFA rule applied, and two user reads (return address and saved rbp); a frame-pointer frame is the kernel's own loop of one user read. At {} frames that is {:.1} µs against {:.1} µs.", per_frame(1), per_frame(0), KERNEL_DEPTHS[1], med(1, KERNEL_DEPTHS[1]) / 1e3, med(0, KERNEL_DEPTHS[1]) / 1e3)?;
        verdicts.push(Verdict {
            target: format!(
                "kernel CFI walk at most 2x the frame-pointer walk, {} frames deep",
                KERNEL_DEPTHS[0]
            ),
            measured: format!(
                "{ratio:.2}x ({cfi12:.0} ns against {fp12:.0} ns per target sample, medians)"
            ),
            met: ratio <= 2.0,
        });
        let cfi120 = med(1, KERNEL_DEPTHS[1]);
        verdicts.push(Verdict {
            target: format!(
                "kernel CFI walk under 10 µs per sample, {} frames deep",
                KERNEL_DEPTHS[1]
            ),
            measured: format!("{:.1} µs (median)", cfi120 / 1e3),
            met: cfi120 < 10_000.0,
        });
        Ok(())
    }

    /// The generated large shared object (about 410 MB, its CFI like a compiler's), built once
    /// and kept under `target/bench/` while its generator's parameters stay the same.
    fn large_object(&self) -> Result<PathBuf> {
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

    /// Section 8: building unwind tables, through bpfprof's own library (the `unwind_tables`
    /// example).
    pub(super) fn table_build(
        &self,
        plan: &Plan,
        md: &mut String,
        verdicts: &mut Vec<Verdict>,
    ) -> Result<()> {
        println!("==> 8. unwind table build");
        crate::cmd::run(crate::cmd::cargo().args([
            "build",
            "--release",
            "-p",
            "profiler-user",
            "--example",
            "unwind_tables",
        ]))?;
        let example = self.root.join("target/release/examples/unwind_tables");
        let large = self.large_object()?;
        let libc = PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6");
        // (file MB, build ms, rows, table KiB, bytes/row) per object, over rounds.
        let mut runs: BTreeMap<usize, Vec<[f64; 5]>> = BTreeMap::new();
        let rounds = plan.rounds.min(3);
        for _ in 0..rounds {
            let out = self.timed({
                let mut c = Command::new(&example);
                c.arg(&libc).arg(&large);
                c
            })?;
            for (i, line) in out.lines.iter().skip(1).enumerate() {
                let v: Vec<f64> = line
                    .split_whitespace()
                    .skip(1)
                    .filter_map(|f| f.parse().ok())
                    .collect();
                ensure!(v.len() == 5, "unexpected unwind_tables line: {line}");
                println!("    {line}");
                runs.entry(i)
                    .or_default()
                    .push([v[0], v[1], v[2], v[3], v[4]]);
            }
        }
        writeln!(md, "\n## 8. Unwind table build\n")?;
        writeln!(md, "Turning an object's `.eh_frame` into the table the kernel program searches, through bpfprof's own library (`bpfprof::unwind::UnwindTable::from_path`, run by `profiler-user/examples/unwind_tables.rs`, which takes the best of 3 builds per object), over {rounds} runs: median (min–max) of those bests. The large object is generated (`generate_large_asm` in `xtask/src/bench/unwind.rs`): {LARGE_FUNCTIONS} functions with 4 KiB bodies and the CFI gcc emits for them (frame-pointer and frameless prologues, pushes of callee-saved registers, epilogues; the frameless ones also push and pop every {LARGE_CHUNK_BYTES} bytes, as code does around calls), assembled and linked into a shared object of the size of PyTorch's libtorch_cpu.so (430 MB; generated and cached under `target/bench/` in about 15 s). Its rows per MB are a third of libc's: real code has more CFA changes per byte than these filler bodies, so a real 400 MB library would have more rows (time scales with rows; bytes per row do not change). Bytes are the table as the kernel holds it.\n")?;
        writeln!(md, "| object | file, MB | build, ms | rows | rows per file MB | table, KiB | bytes per row |\n|---|---|---|---|---|---|---|")?;
        let names = ["libc.so.6", "generated large-cfi.so"];
        for (i, name) in names.iter().enumerate() {
            let Some(r) = runs.get(&i) else {
                writeln!(md, "| {name} | not measured | | | | | |")?;
                continue;
            };
            let col = |k: usize| r.iter().map(|v| v[k]).collect::<Vec<f64>>();
            let density: Vec<f64> = r.iter().map(|v| v[2] / v[0].max(1e-9)).collect();
            writeln!(
                md,
                "| {name} | {} | {} | {} | {} | {} | {} |",
                stat(&col(0), 1),
                stat(&col(1), 1),
                stat(&col(2), 0),
                stat(&density, 0),
                stat(&col(3), 0),
                stat(&col(4), 1)
            )?;
        }
        if let Some(r) = runs.get(&1) {
            let ms = median(&r.iter().map(|v| v[1]).collect::<Vec<f64>>());
            let bpr = median(&r.iter().map(|v| v[4]).collect::<Vec<f64>>());
            verdicts.push(Verdict {
                target: "table build of a 400 MB binary under 2 s".into(),
                measured: format!("{:.2} s (median of bests)", ms / 1e3),
                met: ms < 2000.0,
            });
            verdicts.push(Verdict {
                target: "at most 12 bytes per table row (400 MB binary)".into(),
                measured: format!("{bpr:.1} bytes per row"),
                met: bpr <= 12.0,
            });
        }
        Ok(())
    }

    /// Section 9: start-up with each `--unwind` mode, and a 10 ms command under bpfprof.
    pub(super) fn unwind_startup(
        &self,
        plan: &Plan,
        md: &mut String,
        verdicts: &mut Vec<Verdict>,
    ) -> Result<()> {
        println!("==> 9. start-up by unwind mode");
        self.compile_unwind_workloads()?;
        let rounds = plan.rounds.max(if plan.quick { 1 } else { 3 });
        let modes = ["fp", "auto"];
        let mut first: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        let mut short: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        let short_argv = self.workload("burn-nofp", &[SHORT_ITERS, "1"]);
        for _ in 0..rounds {
            for mode in modes {
                let mut cmd = self.bpfprof_cmd(&["-F", "999", "--unwind", mode, "--"]);
                cmd.args(self.startup_argv());
                let run = self.timed(cmd)?;
                let (stacks, _) = self.bpfprof_result()?;
                let start = run.value("start")? as u64;
                let ms = first_sample_ns(&stacks, start)
                    .map_or(f64::NAN, |t| (t as f64 - run.spawned_ns as f64) / 1e6);
                println!("    --unwind {mode}: first sample after {ms:.1} ms");
                first.entry(mode).or_default().push(ms);
            }
            let mut bare = Command::new(&short_argv[0]);
            bare.args(&short_argv[1..]);
            let t = self.timed(bare)?.wall_secs * 1e3;
            println!("    10 ms command alone: {t:.1} ms");
            short.entry("alone").or_default().push(t);
            for mode in modes {
                let mut cmd = self.bpfprof_cmd(&["-F", "999", "--unwind", mode, "--"]);
                cmd.args(&short_argv);
                let t = self.timed(cmd)?.wall_secs * 1e3;
                println!("    10 ms command under --unwind {mode}: {t:.1} ms");
                short.entry(mode).or_default().push(t);
            }
        }
        writeln!(md, "\n## 9. Start-up by unwind mode\n")?;
        writeln!(md, "First sample: as in section 3 (`bench/startup.c` under `bpfprof -F 999 --unwind MODE -- CMD`, from spawning bpfprof to the first sampled `slot_k`). Short command: `burn-nofp {SHORT_ITERS} 1` (about 10 ms of work on one thread, built without frame pointers, so `auto` has CFI tables to load for it and libc) alone and under `bpfprof -F 999 --unwind MODE --`, wall time from spawn to exit with the profile written. Median (min–max) over {rounds} rounds, in ms.\n")?;
        writeln!(
            md,
            "| | to first sample, ms | 10 ms command, total wall ms |\n|---|---|---|"
        )?;
        writeln!(md, "| alone | | {} |", stat(&short["alone"], 1))?;
        for mode in modes {
            writeln!(
                md,
                "| bpfprof --unwind {mode} | {} | {} |",
                stat(&first[mode], 1),
                stat(&short[mode], 1)
            )?;
        }
        for mode in modes {
            let ms = median(&first[mode]);
            verdicts.push(Verdict {
                target: format!("first sample of a small process under 100 ms (`--unwind {mode}`)"),
                measured: format!(
                    "{ms:.1} ms (median); a 10 ms command takes {:.0} ms in all (alone {:.0} ms)",
                    median(&short[mode]),
                    median(&short["alone"])
                ),
                met: ms < 100.0,
            });
        }
        Ok(())
    }

    /// Section 10: overhead at 999 Hz on a workload without frame pointers, bpfprof's CFI walk
    /// next to `perf record --call-graph dwarf` (and perf's frame-pointer walk).
    pub(super) fn dwarf_overhead(
        &self,
        plan: &Plan,
        md: &mut String,
        verdicts: &mut Vec<Verdict>,
    ) -> Result<()> {
        println!("==> 10. overhead against perf --call-graph dwarf");
        self.compile_unwind_workloads()?;
        let hz = "999";
        let argv = self.workload("burn-nofp", &[BURN_ITERS, &self.cpus.to_string()]);
        let arms = [
            "alone",
            "bpfprof --unwind cfi",
            "perf record --call-graph dwarf",
            "perf record -g",
        ];
        let perf_data = self.dir.join("dwarf.perf");
        let bpf_out = [self.dir.join("u.folded"), self.dir.join("u.json")];
        let mut slowdown: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        let mut bytes: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        let mut full: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        // bpfprof's own CPU seconds over each run (its summary), and the workload's time alone.
        let mut own_cpu = Vec::new();
        let mut alone_secs = Vec::new();
        self.timed({
            let mut c = Command::new(&argv[0]);
            c.args(&argv[1..]);
            c
        })?; // warm-up
        for round in 0..plan.overhead_rounds() {
            let mut order: Vec<&str> = arms.to_vec();
            rotate(&mut order, round);
            let mut secs = BTreeMap::new();
            for arm in order {
                let _ = fs::remove_file(&perf_data);
                let cmd = match arm {
                    "alone" => {
                        let mut c = Command::new(&argv[0]);
                        c.args(&argv[1..]);
                        c
                    }
                    "bpfprof --unwind cfi" => {
                        let mut c = self.bpfprof_cmd(&["-F", hz, "--unwind", "cfi", "--"]);
                        c.args(&argv);
                        c
                    }
                    _ => {
                        let mut c = Command::new("perf");
                        c.args(["record", "-q", "-e", "cpu-clock", "-F", hz]);
                        if arm.contains("dwarf") {
                            c.args(["--call-graph", "dwarf"]);
                        } else {
                            c.arg("-g");
                        }
                        c.arg("-o").arg(&perf_data).arg("--").args(&argv);
                        c
                    }
                };
                let s = self.timed(cmd)?.value("secs")?;
                println!("    round {round}: {arm} {s:.3}s");
                secs.insert(arm, s);
                // Written bytes and the share of stacks that reach the thread's root
                // (`worker`, below `start_thread`): the stacks were walked right.
                let (written, stacks) = match arm {
                    "alone" => continue,
                    "bpfprof --unwind cfi" => {
                        let (stacks, summary) = self.bpfprof_result()?;
                        own_cpu.push(summary["cost"]["profiler_cpu_secs"].as_f64().unwrap_or(0.0));
                        (bytes_of(&bpf_out), stacks)
                    }
                    _ => (
                        bytes_of(std::slice::from_ref(&perf_data)),
                        perf_stacks(&perf_data)?.0,
                    ),
                };
                bytes.entry(arm).or_default().push(written as f64);
                let leaf = |s: &Stacks| {
                    s.iter()
                        .filter(|(k, _)| k.contains("burn_leaf"))
                        .map(|(_, n)| *n)
                        .sum::<u64>()
                };
                let whole: Stacks = stacks
                    .iter()
                    .filter(|(k, _)| k.contains("burn_leaf"))
                    .map(|(k, n)| (k.clone(), *n))
                    .collect();
                let pct = share_with(&whole, "worker");
                println!("        {written} bytes written, {pct:.1}% of {} burn_leaf samples reach `worker`", leaf(&stacks));
                full.entry(arm).or_default().push(pct);
            }
            let alone = secs["alone"];
            alone_secs.push(alone);
            for (arm, s) in secs {
                if arm != "alone" {
                    slowdown.entry(arm).or_default().push(s / alone);
                }
            }
        }
        writeln!(
            md,
            "\n## 10. Overhead against `perf record --call-graph dwarf`\n"
        )?;
        writeln!(md, "`bench/burn.c` built without frame pointers (`burn-nofp`: {BURN_ITERS} multiply-adds per thread, one thread per core, a dozen frames deep), launched under each profiler at {hz} Hz. `--call-graph dwarf` is the perf mode that gives the same stacks as bpfprof's CFI walk: it copies 8 KiB of user stack per sample into `perf.data` and unwinds after the run; `perf record -g` (frame pointers) is shown for its cost, not its stacks, which on this build are wrong. Slowdown = time under the profiler / time alone in the same round; bytes written: bpfprof's profile and summary, perf's `perf.data`; whole stacks: share of the samples in `burn_leaf` whose stack reaches the thread's function `worker` (for perf after `perf script`). Median (min–max) over {} rounds, arms in a rotated order.\n", plan.overhead_rounds())?;
        writeln!(md, "| profiler | slowdown | bytes written | `burn_leaf` samples with the whole stack, % |\n|---|---|---|---|")?;
        for arm in &arms[1..] {
            writeln!(
                md,
                "| {arm} | {} | {} | {} |",
                stat(&slowdown[arm], 3),
                stat(&bytes[arm], 0),
                stat(&full[arm], 1)
            )?;
        }
        let b = median(&slowdown["bpfprof --unwind cfi"]) - 1.0;
        let p = median(&slowdown["perf record --call-graph dwarf"]) - 1.0;
        // Where bpfprof's slowdown comes from: its own CPU, taken from a workload that keeps
        // every core busy, against the CPU the workload itself needs.
        let work_cpu = median(&alone_secs) * self.cpus as f64;
        writeln!(md, "\nbpfprof's own CPU over a run: {} s (median (min–max)), against {work_cpu:.2} CPU-s of work (every core busy for {:.2} s): {:.1}% of it, {} its added time ({:+.1}%). Of that, {} ms (`bpfprof doctor`'s measure at the start of this bench) is the kernel verifying the CFI/Python walker program once per bpfprof process (the daemon verifies it once for a series of runs), the rest its unwind tables, stack moves and symbolization at the end. perf copies stacks during the run and unwinds them after it (`perf report`, `perf script`), outside the timed work. The walker is verified while the command already runs: the samples taken meanwhile are frame-pointer stacks, which on this build stop short of `worker` (the whole-stack column).", stat(&own_cpu, 2), median(&alone_secs), 100.0 * median(&own_cpu) / work_cpu, if median(&own_cpu) / work_cpu >= 0.5 * b { "against" } else { "a part of" }, b * 100.0, self.walker_verify_ms)?;
        let (bb, pb) = (
            median(&bytes["bpfprof --unwind cfi"]),
            median(&bytes["perf record --call-graph dwarf"]),
        );
        verdicts.push(Verdict {
            target: "overhead below `perf --call-graph dwarf` at 999 Hz, no frame pointers".into(),
            measured: format!(
                "bpfprof {:+.1}%, perf dwarf {:+.1}%; bytes written {:.0} KiB against {:.0} KiB",
                b * 100.0,
                p * 100.0,
                bb / 1024.0,
                pb / 1024.0
            ),
            met: b < p && bb < pb,
        });
        Ok(())
    }

    /// Section 11: a Python workload, bpfprof next to py-spy; kernel time for a 30-deep
    /// Python stack where this build walks Python frames in the kernel.
    pub(super) fn python(
        &self,
        plan: &Plan,
        md: &mut String,
        verdicts: &mut Vec<Verdict>,
    ) -> Result<()> {
        println!("==> 11. Python");
        self.compile_unwind_workloads()?;
        writeln!(md, "\n## 11. Python\n")?;
        if !Path::new(PYTHON).exists() {
            writeln!(
                md,
                "Not measured: {PYTHON} is missing (a pyenv CPython 3.12)."
            )?;
            return Ok(());
        }
        let py_spy = crate::cmd::probe(Command::new("py-spy").arg("--version")).is_some();
        let help = crate::cmd::probe(Command::new(&self.bpfprof).arg("--help")).unwrap_or_default();
        let kernel_walk = help.contains("--python");
        let script = self.dir.join("pywork.py");
        let script_s = script.to_string_lossy().to_string();
        // (row, how bpfprof sees Python frames)
        // With the kernel walk, the trampoline arm turns it off, so that each arm shows one
        // way of seeing Python frames.
        let mut arms: Vec<&str> = vec![
            "alone",
            if kernel_walk {
                "bpfprof --python off -- python3 -X perf (perf trampolines)"
            } else {
                "bpfprof -- python3 -X perf (perf trampolines)"
            },
        ];
        arms.push(if kernel_walk {
            "bpfprof -- python3 (kernel Python walk)"
        } else {
            "bpfprof -- python3 (no -X perf: native frames only)"
        });
        if py_spy {
            arms.push("py-spy record");
        }
        let hzs: &[u64] = if plan.quick { &[999] } else { &[99, 999] };
        let mut slowdown: BTreeMap<(&str, u64), Vec<f64>> = BTreeMap::new();
        let mut pyshare: BTreeMap<(&str, u64), Vec<f64>> = BTreeMap::new();
        // Samples with Python frames bpfprof could not name (code objects not resolved).
        let mut unnamed: BTreeMap<(&str, u64), Vec<f64>> = BTreeMap::new();
        let out = self.dir.join("pyspy.txt");
        for &hz in hzs {
            let hz_s = hz.to_string();
            for round in 0..plan.overhead_rounds().min(5) {
                let mut order = arms.clone();
                rotate(&mut order, round);
                let mut secs = BTreeMap::new();
                for arm in order {
                    let _ = fs::remove_file(&out);
                    let cmd = if arm == "alone" {
                        let mut c = Command::new(PYTHON);
                        c.args([&script_s, PYTHON_ROUNDS]);
                        c
                    } else if arm.starts_with("bpfprof") {
                        let mut c = self.bpfprof_cmd(&["-F", &hz_s]);
                        if arm.contains("--python off") {
                            c.args(["--python", "off"]);
                        }
                        c.args(["--", PYTHON]);
                        if arm.contains("-X perf") {
                            c.args(["-X", "perf"]);
                        }
                        c.args([&script_s, PYTHON_ROUNDS]);
                        c
                    } else {
                        let mut c = Command::new("py-spy");
                        c.args(["record", "-r", &hz_s, "-f", "raw", "-o"])
                            .arg(&out)
                            .args(["--", PYTHON, &script_s, PYTHON_ROUNDS]);
                        c
                    };
                    let s = self.timed(cmd)?.value("secs")?;
                    let share = if arm == "alone" {
                        None
                    } else if arm.starts_with("bpfprof") {
                        let stacks = self.bpfprof_result()?.0;
                        unnamed
                            .entry((arm, hz))
                            .or_default()
                            .push(share_with(&stacks, UNNAMED_PYTHON));
                        Some(python_leaf_share(&stacks))
                    } else {
                        let text = fs::read_to_string(&out).unwrap_or_default();
                        Some(python_leaf_share(&fold_lines(text.lines(), false)))
                    };
                    println!("    {hz} Hz round {round}: {arm} {s:.3}s, Python frames in {share:?}% of samples");
                    if let Some(p) = share {
                        pyshare.entry((arm, hz)).or_default().push(p);
                    }
                    secs.insert(arm, s);
                }
                let alone = secs["alone"];
                for (arm, s) in secs {
                    if arm != "alone" {
                        slowdown.entry((arm, hz)).or_default().push(s / alone);
                    }
                }
            }
        }
        writeln!(md, "A pure-Python workload (`target/bench/pywork.py`, written by the bench: `leaf_hot` and `leaf_cold` 75:25 under `work`, {PYTHON_ROUNDS} rounds, timed by itself) on pyenv's CPython 3.12.1 (built without frame pointers), alone and launched under each profiler. bpfprof is run both ways: with `-X perf` (CPython's perf trampolines: bpfprof sees Python functions as native frames; with `--python off` where this build also walks Python frames in the kernel) and without it ({}). py-spy: `py-spy record -r HZ -f raw` with its defaults (it pauses the process to read its frames){}. Python frames: share of samples whose stack has the Python function `leaf_hot` or `leaf_cold` (bpfprof's `py::leaf_hot:FILE` with trampolines, `leaf_hot` from the kernel walk, py-spy's `leaf_hot (FILE:LINE)`; nearly all of the workload's time is in them). Slowdown = time under the profiler / time alone in the same round, median (min–max) over {} rounds.\n",
            if kernel_walk { "this build walks CPython's frames in the kernel, `--python auto` by default" } else { "this build has no kernel Python walk, so without `-X perf` it sees the interpreter's C frames only" },
            if py_spy { "" } else { "; **py-spy is not installed** (`cargo xtask setup` installs it), so its rows are missing" },
            plan.overhead_rounds().min(5))?;
        writeln!(
            md,
            "| profiler (mode) | {} |\n|---|{}",
            join(
                hzs.iter()
                    .map(|h| format!("{h} Hz: slowdown | {h} Hz: Python frames, %")),
                " | "
            ),
            "---|---|".repeat(hzs.len())
        )?;
        for arm in &arms[1..] {
            let cells = hzs.iter().map(|&h| {
                format!(
                    "{} | {}",
                    slowdown
                        .get(&(*arm, h))
                        .map_or("n/a".into(), |v| stat(v, 3)),
                    pyshare.get(&(*arm, h)).map_or("n/a".into(), |v| stat(v, 1))
                )
            });
            writeln!(md, "| {arm} | {} |", join(cells, " | "))?;
        }
        for ((arm, h), v) in &unnamed {
            if v.iter().any(|&x| x > 0.0) {
                writeln!(md, "\n{arm} at {h} Hz: samples with a Python frame shown as `{UNNAMED_PYTHON}` (walked but not named): {} %.", stat(v, 1))?;
            }
        }
        let hz = *hzs.last().context("no Python frequency")?;
        let python_arm = if kernel_walk { arms[2] } else { arms[1] };
        if py_spy {
            let b = median(&slowdown[&(python_arm, hz)]) - 1.0;
            let s = median(&slowdown[&("py-spy record", hz)]) - 1.0;
            verdicts.push(Verdict {
                target: format!("Python overhead at most half of py-spy's, {hz} Hz"),
                measured: format!(
                    "{python_arm}: {:+.1}%, py-spy {:+.1}%",
                    b * 100.0,
                    s * 100.0
                ),
                met: b <= 0.5 * s.max(0.0),
            });
        }

        self.python_naming(plan, md)?;

        // Kernel program time for a 30-deep Python stack.
        writeln!(md, "\nKernel program time per sample for a {PYTHON_DEPTH}-deep Python stack (`pywork.py 0 {PYTHON_DEPTH}`), measured as in section 7:\n")?;
        let measured = if kernel_walk {
            let mut t = Command::new(PYTHON)
                .args([&script_s, "0", &PYTHON_DEPTH.to_string()])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .spawn()
                .context("starting the Python workload")?;
            std::thread::sleep(Duration::from_millis(300));
            let secs = if plan.quick { 1.0 } else { ATTACH_SECS };
            let mut idle = Command::new("sleep").arg("3600").spawn()?;
            let r = (|| -> Result<(Vec<f64>, Vec<f64>, Vec<f64>)> {
                let (mut v, mut frames, mut share) = (Vec::new(), Vec::new(), Vec::new());
                for _ in 0..plan.rounds {
                    let floor = self.kernel_run(idle.id() as i32, &[], secs)?;
                    let r = floor.run_time_ns / floor.run_count.max(1.0);
                    let k = self.kernel_run(t.id() as i32, &[], secs)?;
                    let other = (k.run_count - k.target_samples).max(0.0);
                    let ns = (k.run_time_ns - other * r) / k.target_samples.max(1.0);
                    println!(
                        "    {PYTHON_DEPTH}-deep Python stack: {ns:.0} ns per target sample, {:.1}% of samples with Python frames, {:.1} frames",
                        k.python_share, k.frames
                    );
                    v.push(ns);
                    frames.push(k.frames);
                    share.push(k.python_share);
                }
                Ok((v, frames, share))
            })();
            stop_target(&mut t);
            stop_target(&mut idle);
            Some(r?)
        } else {
            None
        };
        match &measured {
            Some((v, frames, share)) => {
                writeln!(md, "| stack | ns per target sample | frames per stack | samples with Python frames, % |\n|---|---|---|---|\n| {PYTHON_DEPTH} Python frames deep | {} | {} | {} |", stat(v, 0), stat(frames, 1), stat(share, 1))?;
                verdicts.push(Verdict {
                    target: format!(
                        "kernel time per sample under 10 µs, {PYTHON_DEPTH}-deep Python stack"
                    ),
                    measured: format!("{:.1} µs (median)", median(v) / 1e3),
                    met: median(v) < 10_000.0,
                });
            }
            None => {
                writeln!(md, "| stack | ns per target sample |\n|---|---|\n| {PYTHON_DEPTH} Python frames deep | not measured: no kernel Python walk in this build |")?;
                verdicts.push(Verdict {
                    target: format!(
                        "kernel time per sample under 10 µs, {PYTHON_DEPTH}-deep Python stack"
                    ),
                    measured: "not measured: no kernel Python walk in this build".into(),
                    met: false,
                });
            }
        }
        Ok(())
    }
}

impl Bench {
    /// The userspace cost of naming Python frames: a launched program of
    /// `PYMANY_CHAINS * PYMANY_DEPTH` distinct functions, each sampled, so that bpfprof reads
    /// every one's code object (name, file, line table) from the process once.
    fn python_naming(&self, plan: &Plan, md: &mut String) -> Result<()> {
        let script = self.dir.join("pymany.py");
        fs::write(
            &script,
            generate_many_functions(PYMANY_CHAINS, PYMANY_DEPTH),
        )?;
        let script_s = script.to_string_lossy().to_string();
        let functions = PYMANY_CHAINS * PYMANY_DEPTH;
        let (mut codes, mut naming_ms, mut per_code_us, mut cpu, mut named) =
            (vec![], vec![], vec![], vec![], vec![]);
        for round in 0..plan.rounds {
            let mut cmd = self.bpfprof_cmd(&["-F", "999", "--", PYTHON]);
            cmd.args([&script_s, "2", PYMANY_LEAF_ITERS]);
            self.timed(cmd)?;
            let (stacks, summary) = self.bpfprof_result()?;
            let cost = &summary["cost"];
            let n = cost["python_code_objects"].as_f64().unwrap_or(0.0);
            let secs = cost["python_naming_secs"].as_f64().unwrap_or(0.0);
            // Generated functions (`fC_D`) that appear by name in the profile.
            let mut seen = std::collections::BTreeSet::new();
            for stack in stacks.keys() {
                for frame in stack.split(';') {
                    let name = frame.split(' ').next().unwrap_or(frame);
                    if name.len() > 1
                        && name.starts_with('f')
                        && name[1..].split('_').count() == 2
                        && name[1..].split('_').all(|p| p.parse::<u32>().is_ok())
                    {
                        seen.insert(name.to_string());
                    }
                }
            }
            println!(
                "    naming round {round}: {n} code objects in {:.0} ms, {} of {functions} functions in the profile",
                secs * 1e3,
                seen.len()
            );
            codes.push(n);
            naming_ms.push(secs * 1e3);
            per_code_us.push(secs * 1e6 / n.max(1.0));
            cpu.push(cost["profiler_cpu_secs"].as_f64().unwrap_or(0.0));
            named.push(seen.len() as f64);
        }
        writeln!(md, "\nNaming Python frames in userspace: a program of {functions} distinct functions (`target/bench/pymany.py`, written by the bench: {PYMANY_CHAINS} call chains {PYMANY_DEPTH} deep, each leaf ~6 ms, run through twice) launched under `bpfprof -F 999`. bpfprof reads each sampled code object (qualified name, file, line table) from the process once; the summary's `cost` gives how many and the time it took ({} rounds):\n", plan.rounds)?;
        writeln!(md, "| generated functions in the profile | code objects read | naming time, ms | µs per code object | bpfprof CPU for the whole run, s |\n|---|---|---|---|---|\n| {} | {} | {} | {} | {} |", stat(&named, 0), stat(&codes, 0), stat(&naming_ms, 0), stat(&per_code_us, 1), stat(&cpu, 2))?;
        Ok(())
    }
}

/// A Python program of `chains` call chains, each `depth` distinct functions deep, whose leaf
/// loops `argv[2]` times; it runs through every chain `argv[1]` times and prints `secs S`.
fn generate_many_functions(chains: usize, depth: usize) -> String {
    let mut s = String::from("import sys, time\n\n");
    for c in 0..chains {
        for d in 0..depth {
            if d + 1 < depth {
                let _ = writeln!(s, "def f{c}_{d}(n):\n    return f{c}_{}(n)\n", d + 1);
            } else {
                let _ = writeln!(
                    s,
                    "def f{c}_{d}(n):\n    x = 0\n    for i in range(n):\n        x += i\n    return x\n"
                );
            }
        }
    }
    let heads: Vec<String> = (0..chains).map(|c| format!("f{c}_0")).collect();
    let _ = writeln!(s, "CHAINS = [{}]\n", heads.join(", "));
    s.push_str("start = time.monotonic()\nfor _ in range(int(sys.argv[1])):\n    for chain in CHAINS:\n        chain(int(sys.argv[2]))\nprint(\"secs %.6f\" % (time.monotonic() - start), flush=True)\n");
    s
}

/// Assembly for a shared object of `functions` functions, each with `body` filler bytes and the
/// CFI directives gcc emits for its prologue and epilogue: four shapes in turn (frame pointer,
/// frameless with a stack allocation, callee-saved pushes, and a leaf without CFA changes), so
/// the table has the mix of rows a real binary has. The frameless shapes also push and pop
/// around every [`LARGE_CHUNK_BYTES`] of their body (as code does around calls), each a CFA
/// change and so a row: a row density near a real binary's, not one row per 4 KiB.
fn generate_large_asm(functions: usize, body: usize) -> String {
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
