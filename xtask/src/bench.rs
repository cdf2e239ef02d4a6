//! `cargo xtask bench`: bpfprof side by side with `perf record -g` and `bpftrace` on the same
//! workloads, in the same run, as ratios; writes `BENCHMARKS.md` and `bench/overhead.svg`.
//!
//! Every figure is a median over rounds with its min–max spread; profilers alternate within a
//! round so that drifts of this noisy machine hit them all alike.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    fs,
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context, Result};

/// Bench options.
pub struct BenchArgs {
    /// One round and fewer frequencies: a smoke run.
    pub quick: bool,
}

const BURN_C: &str = r#"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
/* Fixed work: each thread spins ITER iterations; prints the wall time of the work. */
static unsigned long iters;
__attribute__((noinline)) void *burn(void *arg) {
    volatile unsigned long acc = 0;
    for (unsigned long i = 0; i < iters; i++) acc += i * i;
    return (void *)acc;
}
int main(int argc, char **argv) {
    iters = strtoul(argv[1], 0, 10);
    int threads = atoi(argv[2]);
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    pthread_t t[64];
    for (int i = 0; i < threads; i++) pthread_create(&t[i], 0, burn, 0);
    for (int i = 0; i < threads; i++) pthread_join(t[i], 0);
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("%.6f\n", (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9);
    return 0;
}
"#;

/// True split 75:25 by work (iteration counts), for a given number of seconds; prints its own
/// CPU time so that a profiler's cost can be told apart from its child's.
const SPLIT_C: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
volatile unsigned long sink;
__attribute__((noinline)) void leaf_hot(void) { for (unsigned long i = 0; i < 300000; i++) sink += i; }
__attribute__((noinline)) void leaf_cold(void) { for (unsigned long i = 0; i < 100000; i++) sink += i; }
int main(int argc, char **argv) {
    time_t end = time(0) + atoi(argv[1]);
    while (time(0) < end) { leaf_hot(); leaf_cold(); }
    printf("cpu %.6f\n", (double)clock() / CLOCKS_PER_SEC);
    return 0;
}
"#;

/// A 10 ms period, 7.5 ms in leaf_hot then 2.5 ms in leaf_cold: a multiple of a 100 Hz
/// sampling period, where fixed-interval sampling aliases.
const ALIAS_C: &str = r#"
#include <stdlib.h>
#include <time.h>
volatile unsigned long sink;
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }
__attribute__((noinline)) void leaf_hot(double d) { double e = now() + d; while (now() < e) sink++; }
__attribute__((noinline)) void leaf_cold(double d) { double e = now() + d; while (now() < e) sink++; }
int main(int argc, char **argv) {
    double end = now() + atoi(argv[1]);
    while (now() < end) { leaf_hot(0.0075); leaf_cold(0.0025); }
    return 0;
}
"#;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Profiler {
    None,
    Bpfprof,
    BpfprofFixed,
    Perf,
    Bpftrace,
}

impl Profiler {
    fn name(self) -> &'static str {
        match self {
            Profiler::None => "alone",
            Profiler::Bpfprof => "bpfprof",
            Profiler::BpfprofFixed => "bpfprof --fixed-interval",
            Profiler::Perf => "perf record -g",
            Profiler::Bpftrace => "bpftrace",
        }
    }
}

/// What one profiled command left behind.
struct Outcome {
    /// The workload's stdout.
    stdout: String,
    /// Leaf function -> samples.
    leaves: BTreeMap<String, u64>,
    /// The profiler's own CPU seconds and peak RSS (KiB), from wait4.
    cpu_secs: f64,
    max_rss_kib: i64,
    /// bpfprof's summary, when bpfprof ran.
    summary: Option<serde_json::Value>,
}

struct Bench {
    dir: PathBuf,
    bpfprof: PathBuf,
}

pub fn run(args: BenchArgs) -> Result<()> {
    let root = crate::workspace_root();
    crate::setup_apt()?;
    let status = Command::new("cargo")
        .args(["build", "--release", "-p", "profiler-user"])
        .current_dir(&root)
        .status()?;
    ensure!(status.success(), "building bpfprof failed");
    let dir = root.join("target/bench");
    fs::create_dir_all(&dir)?;
    let bench = Bench {
        dir: dir.clone(),
        bpfprof: root.join("target/release/bpfprof"),
    };
    for (name, src) in [("burn", BURN_C), ("split", SPLIT_C), ("alias", ALIAS_C)] {
        bench.compile(name, src)?;
    }
    let rounds = if args.quick { 1 } else { 3 };
    let freqs: &[u64] = if args.quick { &[999] } else { &[99, 999, 4999] };
    let profilers = [Profiler::Bpfprof, Profiler::Perf, Profiler::Bpftrace];
    let mut md = String::new();
    writeln!(md, "# bpfprof benchmarks\n")?;
    writeln!(
        md,
        "Made by `cargo xtask bench{}` on {}.\n",
        if args.quick { " --quick" } else { "" },
        machine()?
    )?;

    // 1. Overhead: fixed work, two threads (one per core), alone vs under each profiler.
    let iters = "400000000";
    let mut overhead: BTreeMap<(Profiler, u64), Vec<f64>> = BTreeMap::new();
    bench.workload_secs(Profiler::None, 99, "burn", &[iters, "2"])?; // warm-up
    for &hz in freqs {
        for round in 0..rounds {
            // Each round runs alone and every profiler in a rotated order, and each ratio is
            // to the same round's run alone.
            let mut order = vec![Profiler::None];
            order.extend(profilers);
            let n = order.len();
            order.rotate_left(round % n);
            let mut times = BTreeMap::new();
            for p in order {
                times.insert(p, bench.workload_secs(p, hz, "burn", &[iters, "2"])?);
            }
            for &p in &profilers {
                overhead
                    .entry((p, hz))
                    .or_default()
                    .push(times[&p] / times[&Profiler::None]);
            }
        }
    }
    writeln!(md, "## 1. Overhead on the target\n")?;
    writeln!(md, "Fixed-work CPU-bound workload, 2 threads on 2 cores, profiler attached before it starts; slowdown = time under the profiler / time alone (median, min–max over {rounds} rounds).\n")?;
    table(&mut md, &profilers, freqs, |p, hz| {
        stat(&overhead[&(p, hz)], 3)
    })?;

    // 2. Accuracy on a known 75:25 split, and on the aliasing workload.
    let mut accuracy: BTreeMap<(Profiler, u64), Vec<f64>> = BTreeMap::new();
    let mut own: BTreeMap<Profiler, Vec<(f64, i64)>> = BTreeMap::new();
    for &hz in freqs {
        for _ in 0..rounds {
            for &p in &profilers {
                let out = bench.profile(p, hz, "split", &["3"])?;
                accuracy
                    .entry((p, hz))
                    .or_default()
                    .push(error_points(&out.leaves));
                own.entry(p)
                    .or_default()
                    .push((out.cpu_secs, out.max_rss_kib));
            }
        }
    }
    writeln!(md, "\n## 2. Accuracy\n")?;
    writeln!(md, "Error of leaf_hot's share (samples with leaf_hot on the stack, of those with leaf_hot or leaf_cold) against the true 75%, in percentage points (median, min–max). perf's stacks are folded with inferno's perf collapser; bpftrace's are its printed `ustack` maps.\n")?;
    table(&mut md, &profilers, freqs, |p, hz| {
        stat(&accuracy[&(p, hz)], 2)
    })?;
    let alias_profilers = [
        Profiler::Bpfprof,
        Profiler::BpfprofFixed,
        Profiler::Perf,
        Profiler::Bpftrace,
    ];
    let mut alias: BTreeMap<(Profiler, u64), Vec<f64>> = BTreeMap::new();
    let alias_freqs: &[u64] = if args.quick { &[100] } else { &[97, 100, 101] };
    for &hz in alias_freqs {
        for _ in 0..rounds {
            for &p in &alias_profilers {
                let out = bench.profile(p, hz, "alias", &["4"])?;
                alias
                    .entry((p, hz))
                    .or_default()
                    .push(error_points(&out.leaves));
            }
        }
    }
    writeln!(
        md,
        "\nAliasing workload (10 ms period: 7.5 ms hot, 2.5 ms cold; true 75%), error in points:\n"
    )?;
    table(&mut md, &alias_profilers, alias_freqs, |p, hz| {
        stat(&alias[&(p, hz)], 2)
    })?;

    // 3. Start-up latency: from the command's start to "sampling".
    writeln!(md, "\n## 3. Start-up latency\n")?;
    let mut startup: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for _ in 0..rounds.max(3) {
        startup
            .entry("bpfprof CLI (command start -> attached)")
            .or_default()
            .push(bench.bpfprof_startup()?);
        startup
            .entry("bpftrace (command start -> probes attached)")
            .or_default()
            .push(bench.bpftrace_startup()?);
    }
    startup.insert(
        "bpfprof daemon (`run` -> RUNNING, incl. client start)",
        bench.daemon_startup(rounds.max(3) * 3)?,
    );
    writeln!(md, "| what | ms (median, min–max) |\n|---|---|")?;
    for (what, v) in &startup {
        writeln!(md, "| {what} | {} |", stat(v, 1))?;
    }
    writeln!(
        md,
        "\n`perf record` has no ready signal to time; it is left out of this row."
    )?;

    // 5. Own cost over the accuracy runs.
    writeln!(md, "\n## 5. The profiler's own cost\n")?;
    writeln!(md, "Over the 3 s accuracy runs (all frequencies): CPU seconds of the profiler process (wait4, less the CPU its workload child reports) and its peak RSS. perf's figure is `perf record` only; turning its data into stacks (`perf script`) costs more on top.\n")?;
    writeln!(
        md,
        "| profiler | CPU s (median, min–max) | peak RSS MiB (median) |\n|---|---|---|"
    )?;
    for (p, v) in &own {
        let cpu: Vec<f64> = v.iter().map(|x| x.0).collect();
        let mut rss: Vec<f64> = v.iter().map(|x| x.1 as f64 / 1024.0).collect();
        rss.sort_by(f64::total_cmp);
        writeln!(
            md,
            "| {} | {} | {:.1} |",
            p.name(),
            stat(&cpu, 2),
            rss[rss.len() / 2]
        )?;
    }
    let stats_run =
        bench.profile_with(Profiler::Bpfprof, 999, "split", &["3"], &["--bpf-stats"])?;
    if let Some(ns) = stats_run
        .summary
        .as_ref()
        .and_then(|s| s["bpf_ns_per_run"].as_f64())
    {
        writeln!(md, "\nKernel program run time per invocation (BPF stats, 999 Hz, user + kernel stack walk on target samples, filter-only on others): {ns:.0} ns.")?;
    }

    // 6. Scale: drops as frequency rises.
    writeln!(md, "\n## 6. Scale\n")?;
    writeln!(
        md,
        "| Hz | samples/s recorded | lost (all reasons) |\n|---|---|---|"
    )?;
    for hz in [999u64, 4999, 9999] {
        let out = bench.profile(Profiler::Bpfprof, hz, "split", &["3"])?;
        let s = out.summary.context("bpfprof summary")?;
        let lost: u64 = s["lost"]
            .as_object()
            .map(|o| {
                o.iter()
                    .filter(|(k, _)| *k != "truncated")
                    .filter_map(|(_, v)| v.as_u64())
                    .sum()
            })
            .unwrap_or(0);
        writeln!(
            md,
            "| {hz} | {:.0} | {lost} |",
            s["effective_hz"].as_f64().unwrap_or(0.0)
        )?;
    }
    writeln!(md, "\nNot measured yet: end-of-run cost on a generated large binary (item 4) and memory as unique stacks grow.")?;

    fs::create_dir_all(root.join("bench"))?;
    plot(
        &root.join("bench/overhead.svg"),
        &profilers,
        freqs,
        &overhead,
    )?;
    writeln!(md, "\n![overhead vs frequency](bench/overhead.svg)")?;
    fs::write(root.join("BENCHMARKS.md"), &md)?;
    println!("{md}");
    Ok(())
}

impl Bench {
    fn compile(&self, name: &str, src: &str) -> Result<()> {
        let c = self.dir.join(format!("{name}.c"));
        fs::write(&c, src)?;
        let status = Command::new("cc")
            .args(["-O0", "-g", "-fno-omit-frame-pointer", "-pthread", "-o"])
            .arg(self.dir.join(name))
            .arg(&c)
            .status()?;
        ensure!(status.success(), "compiling {name}");
        Ok(())
    }

    /// Runs `workload` under `profiler` and returns the work's own wall time.
    fn workload_secs(&self, p: Profiler, hz: u64, workload: &str, args: &[&str]) -> Result<f64> {
        let out = self.profile(p, hz, workload, args)?;
        out.stdout
            .trim()
            .parse()
            .with_context(|| format!("workload output {:?}", out.stdout))
    }

    fn profile(&self, p: Profiler, hz: u64, workload: &str, args: &[&str]) -> Result<Outcome> {
        self.profile_with(p, hz, workload, args, &[])
    }

    /// Runs `workload` with `profiler` attached before its first instruction.
    fn profile_with(
        &self,
        p: Profiler,
        hz: u64,
        workload: &str,
        args: &[&str],
        extra: &[&str],
    ) -> Result<Outcome> {
        let bin = self.dir.join(workload);
        let out = self.dir.join("out");
        let summary = self.dir.join("summary.json");
        let stdout_file = self.dir.join("workload.stdout");
        let hz_s = hz.to_string();
        // bpftrace resolves stacks when it prints, at exit: a `-c` child that has already
        // exited prints as bare addresses. For the runs whose stacks count, it attaches to a
        // live workload instead and stops itself first.
        let mut attached_workload: Option<Child> = None;
        let mut cmd = match p {
            Profiler::Bpftrace if workload != "burn" => {
                let secs: u64 = args.first().and_then(|a| a.parse().ok()).unwrap_or(3);
                let live = Command::new(&bin)
                    .arg((secs + 3).to_string())
                    .stdout(Stdio::null())
                    .spawn()?;
                let prog = format!(
                    "profile:hz:{hz} /pid == {}/ {{ @[ustack] = count(); }} interval:s:{secs} {{ exit(); }}",
                    live.id()
                );
                attached_workload = Some(live);
                let mut c = Command::new("bpftrace");
                c.args(["-q", "-o"])
                    .arg(out.with_extension("bt"))
                    .arg("-e")
                    .arg(prog);
                c
            }
            Profiler::None => Command::new(&bin),
            Profiler::Bpfprof | Profiler::BpfprofFixed => {
                let mut c = Command::new(&self.bpfprof);
                c.args(["-q", "-F", &hz_s, "-o"])
                    .arg(out.with_extension("folded"));
                c.arg("--summary-json").arg(&summary).args(extra);
                if p == Profiler::BpfprofFixed {
                    c.arg("--fixed-interval");
                }
                c.arg("--").arg(&bin);
                c
            }
            Profiler::Perf => {
                let mut c = Command::new("perf");
                c.args(["record", "-q", "-e", "cpu-clock", "-g", "-F", &hz_s, "-o"])
                    .arg(out.with_extension("perf"))
                    .arg("--")
                    .arg(&bin);
                c
            }
            Profiler::Bpftrace => {
                let mut c = Command::new("bpftrace");
                let prog = format!("profile:hz:{hz} /pid == cpid/ {{ @[ustack] = count(); }}");
                c.args(["-q", "-o"])
                    .arg(out.with_extension("bt"))
                    .arg("-e")
                    .arg(prog);
                c.arg("-c")
                    .arg(format!("{} {}", bin.display(), args.join(" ")));
                c
            }
        };
        if p != Profiler::Bpftrace {
            cmd.args(args);
        }
        // The workload's stdout (its timing) goes to a file: bpftrace -c shares it.
        let stdout = fs::File::create(&stdout_file)?;
        cmd.stdout(stdout)
            .stderr(Stdio::null())
            .stdin(Stdio::null());
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", p.name()))?;
        let (cpu_secs, max_rss_kib) = wait_rusage(child)?;
        if let Some(mut live) = attached_workload {
            live.kill().ok();
            live.wait().ok();
        }
        let text = fs::read_to_string(&stdout_file).unwrap_or_default();
        let stdout = text
            .lines()
            .rev()
            .find(|l| l.trim().parse::<f64>().is_ok())
            .unwrap_or("")
            .to_string();
        let workload_cpu: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("cpu "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0);
        // In launch mode the workload is the profiler's child: its CPU is in the rusage.
        let cpu_secs = (cpu_secs - workload_cpu).max(0.0);
        let (leaves, summary) = match p {
            Profiler::None => (BTreeMap::new(), None),
            Profiler::Bpfprof | Profiler::BpfprofFixed => {
                let folded = fs::read_to_string(out.with_extension("folded"))?;
                let s = serde_json::from_slice(&fs::read(&summary)?).ok();
                (leaves_of_folded(&folded), s)
            }
            Profiler::Perf => (perf_leaves(&out.with_extension("perf"))?, None),
            Profiler::Bpftrace => (
                bpftrace_leaves(&fs::read_to_string(out.with_extension("bt"))?),
                None,
            ),
        };
        Ok(Outcome {
            stdout,
            leaves,
            cpu_secs,
            max_rss_kib,
            summary,
        })
    }

    fn bpfprof_startup(&self) -> Result<f64> {
        let start = Instant::now();
        let mut child = Command::new(&self.bpfprof)
            .args(["-F", "999", "-d", "200ms", "-o"])
            .arg(self.dir.join("startup.folded"))
            .arg("--")
            .arg(self.dir.join("split"))
            .arg("1")
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()?;
        let ms = wait_for_line(
            child.stderr.take().context("stderr")?,
            "sampling with",
            start,
        )?;
        child.kill().ok();
        child.wait().ok();
        Ok(ms)
    }

    fn bpftrace_startup(&self) -> Result<f64> {
        let start = Instant::now();
        let mut child = Command::new("bpftrace")
            .args(["-e", "profile:hz:999 { @ = count(); }"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let ms = wait_for_line(child.stdout.take().context("stdout")?, "Attaching", start)?;
        child.kill().ok();
        child.wait().ok();
        Ok(ms)
    }

    fn daemon_startup(&self, n: usize) -> Result<Vec<f64>> {
        let sock = self.dir.join("d.sock");
        let _ = fs::remove_file(&sock);
        let mut daemon = Command::new(&self.bpfprof)
            .arg("daemon")
            .arg("--socket")
            .arg(&sock)
            .arg("--state-dir")
            .arg(self.dir.join("dstate"))
            .stderr(Stdio::null())
            .spawn()?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while !sock.exists() {
            ensure!(Instant::now() < deadline, "daemon did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut target = Command::new(self.dir.join("split")).arg("60").spawn()?;
        let mut times = Vec::new();
        for i in 0..=n {
            let start = Instant::now();
            let out = Command::new(&self.bpfprof)
                .args(["run", "--async", "--duration-ms", "300", "--socket"])
                .arg(&sock)
                .args(["--pid", &target.id().to_string()])
                .output()?;
            let ms = start.elapsed().as_secs_f64() * 1e3;
            ensure!(
                out.status.success(),
                "daemon run: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            // The first run loads the kernel program; later ones reuse it.
            if i > 0 {
                times.push(ms);
            }
            std::thread::sleep(Duration::from_millis(400));
        }
        target.kill().ok();
        target.wait().ok();
        // SAFETY: signalling our own child.
        unsafe { libc::kill(daemon.id() as i32, libc::SIGTERM) };
        daemon.wait().ok();
        Ok(times)
    }
}

fn wait_for_line(pipe: impl std::io::Read, needle: &str, start: Instant) -> Result<f64> {
    for line in BufReader::new(pipe).lines() {
        if line?.contains(needle) {
            return Ok(start.elapsed().as_secs_f64() * 1e3);
        }
    }
    bail!("never printed {needle:?}")
}

/// Waits for `child`, returning its CPU seconds (user + system, children included) and peak
/// RSS in KiB.
fn wait_rusage(child: Child) -> Result<(f64, i64)> {
    let pid = child.id() as i32;
    let mut status = 0;
    // SAFETY: wait4 on our own child with valid out-pointers.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        let rc = libc::wait4(pid, &mut status, 0, &mut usage);
        ensure!(rc == pid, "wait4 failed");
        usage
    };
    std::mem::forget(child);
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Ok((secs(usage.ru_utime) + secs(usage.ru_stime), usage.ru_maxrss))
}

fn leaves_of_folded(text: &str) -> BTreeMap<String, u64> {
    let mut leaves = BTreeMap::new();
    for line in text.lines() {
        let Some((stack, count)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(count) = count.parse::<u64>() else {
            continue;
        };
        // The user leaf: the last frame that is not kernel.
        let leaf = stack
            .split(';')
            .rev()
            .find(|f| !f.ends_with("_[k]"))
            .unwrap_or("");
        *leaves.entry(leaf.to_string()).or_default() += count;
    }
    leaves
}

fn perf_leaves(data: &Path) -> Result<BTreeMap<String, u64>> {
    let script = Command::new("perf")
        .arg("script")
        .arg("-i")
        .arg(data)
        .stderr(Stdio::null())
        .output()?;
    let mut folded = Vec::new();
    let mut folder =
        inferno::collapse::perf::Folder::from(inferno::collapse::perf::Options::default());
    inferno::collapse::Collapse::collapse(&mut folder, &script.stdout[..], &mut folded)?;
    Ok(leaves_of_folded(&String::from_utf8_lossy(&folded)))
}

/// Parses bpftrace's printed map of `@[ustack]`: each entry is `@[`, one `frame+off` line per
/// frame, then `]: N`; counts the functions of interest found on each stack.
fn bpftrace_leaves(text: &str) -> BTreeMap<String, u64> {
    let mut leaves = BTreeMap::new();
    let mut frames: Vec<String> = Vec::new();
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with("@[") {
            frames.clear();
        } else if let Some(count) = t.strip_prefix("]: ") {
            if let Ok(n) = count.parse::<u64>() {
                for f in ["leaf_hot", "leaf_cold"] {
                    if frames.iter().any(|x| x == f) {
                        *leaves.entry(f.to_string()).or_default() += n;
                    }
                }
            }
        } else if !t.is_empty() {
            frames.push(t.split('+').next().unwrap_or(t).to_string());
        }
    }
    leaves
}

/// |share(leaf_hot) - 75%| in percentage points.
fn error_points(leaves: &BTreeMap<String, u64>) -> f64 {
    let hot = *leaves.get("leaf_hot").unwrap_or(&0) as f64;
    let cold = *leaves.get("leaf_cold").unwrap_or(&0) as f64;
    if hot + cold == 0.0 {
        return f64::NAN;
    }
    (100.0 * hot / (hot + cold) - 75.0).abs()
}

fn stat(v: &[f64], digits: usize) -> String {
    let mut v: Vec<f64> = v.to_vec();
    v.sort_by(f64::total_cmp);
    let med = v[v.len() / 2];
    format!(
        "{med:.digits$} ({:.digits$}–{:.digits$})",
        v[0],
        v[v.len() - 1]
    )
}

fn table(
    md: &mut String,
    profilers: &[Profiler],
    freqs: &[u64],
    cell: impl Fn(Profiler, u64) -> String,
) -> Result<()> {
    write!(md, "| profiler |")?;
    for hz in freqs {
        write!(md, " {hz} Hz |")?;
    }
    writeln!(md)?;
    writeln!(md, "|---|{}", "---|".repeat(freqs.len()))?;
    for &p in profilers {
        write!(md, "| {} |", p.name())?;
        for &hz in freqs {
            write!(md, " {} |", cell(p, hz))?;
        }
        writeln!(md)?;
    }
    Ok(())
}

fn machine() -> Result<String> {
    let out = |c: &str, a: &[&str]| {
        Command::new(c)
            .args(a)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    };
    let cpu = fs::read_to_string("/proc/cpuinfo")?
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .unwrap_or("?")
        .trim()
        .to_string();
    Ok(format!(
        "{} ({} cores, {}), kernel {}, {}, {}, bpfprof {} ({}); event cpu-clock (no hardware PMU on this machine)",
        out("date", &["-u", "+%Y-%m-%d"]),
        out("nproc", &[]),
        cpu,
        out("uname", &["-r"]),
        out("perf", &["--version"]),
        out("bpftrace", &["--version"]),
        env!("CARGO_PKG_VERSION"),
        out("git", &["rev-parse", "--short", "HEAD"]),
    ))
}

fn plot(
    path: &Path,
    profilers: &[Profiler],
    freqs: &[u64],
    overhead: &BTreeMap<(Profiler, u64), Vec<f64>>,
) -> Result<()> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (800, 500)).into_drawing_area();
    root.fill(&WHITE)?;
    let max = overhead.values().flatten().cloned().fold(1.0f64, f64::max) * 1.05;
    let min = overhead.values().flatten().cloned().fold(1.0f64, f64::min) * 0.95;
    let (lo, hi) = (
        *freqs.first().unwrap_or(&99) as f64 * 0.8,
        *freqs.last().unwrap_or(&4999) as f64 * 1.25,
    );
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Workload slowdown under each profiler (median, min–max)",
            ("sans-serif", 20),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((lo..hi).log_scale(), min..max)?;
    chart
        .configure_mesh()
        .x_desc("sampling frequency (Hz, log)")
        .y_desc("time / time alone")
        .draw()?;
    let colors = [RED, BLUE, GREEN, MAGENTA];
    for (i, &p) in profilers.iter().enumerate() {
        let color = colors[i % colors.len()];
        let points: Vec<(f64, f64, f64, f64)> = freqs
            .iter()
            .map(|&hz| {
                let mut v = overhead[&(p, hz)].clone();
                v.sort_by(f64::total_cmp);
                (hz as f64, v[v.len() / 2], v[0], v[v.len() - 1])
            })
            .collect();
        chart
            .draw_series(LineSeries::new(
                points.iter().map(|p| (p.0, p.1)),
                color.stroke_width(2),
            ))?
            .label(p.name())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        chart.draw_series(
            points
                .iter()
                .map(|p| PathElement::new(vec![(p.0, p.2), (p.0, p.3)], color)),
        )?;
        chart.draw_series(
            points
                .iter()
                .map(|p| Circle::new((p.0, p.1), 4, color.filled())),
        )?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
