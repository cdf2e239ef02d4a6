//! Section 13: what exporting costs (issue 25): the bytes per window the agent sends as OTLP
//! profiles (gzipped as sent over HTTP, and decoded), beside the agent's own pprof of the same
//! windows (gzipped as served, and decoded), for a machine of [`EXPORT_PROCESSES`] small
//! services at the agent's default rate and window; and the agent's CPU with the export and
//! without it, over the same windows.
//!
//! The services are `bench/duty.c` processes in a cgroup of their own, which the agent records
//! alone (`--cgroup`), so the figures are those of that machine and not of whatever else the
//! shared machine runs. The OTLP receiver is the tests' (`tests/receivers/otlp_receiver.py`,
//! on the official generated stubs), which records each request's body size as it came and
//! decoded; the pprof of each window is fetched from the agent's own endpoint right after the
//! window is cut (`seconds=1`: the newest whole window).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use serde_json::Value;

use super::plan::{
    Plan, EXPORT_BUSY_US, EXPORT_HZ, EXPORT_PERIOD_MS, EXPORT_PROCESSES, EXPORT_WINDOWS,
    EXPORT_WINDOW_SECS,
};
use super::process::{proc_cpu_secs, signal, stop_target};
use super::stats::stat;
use super::Bench;

/// The name of the agent's recording thread (`profiler-user/src/agent/mod.rs`): every other
/// thread of the agent is its runtime's (the exporter, the HTTP server) or idle.
const RECORDING_THREAD: &str = "agent-recording";

/// One measured window.
struct WindowSize {
    processes: f64,
    samples: f64,
    otlp_gzip: f64,
    otlp_raw: f64,
    pprof_gzip: f64,
    pprof_raw: f64,
}

/// The agent's CPU over the measured windows, in seconds: all of it, and its threads other
/// than the recording thread.
struct AgentCpu {
    total: f64,
    runtime_threads: f64,
    secs: f64,
}

/// A cgroup v2 of the bench's own, its processes killed and itself removed on drop.
struct BenchCgroup {
    path: PathBuf,
    relative: String,
}

impl BenchCgroup {
    fn new() -> Result<BenchCgroup> {
        let mounts = std::fs::read_to_string("/proc/self/mounts")?;
        let root = mounts
            .lines()
            .find_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.get(2) == Some(&"cgroup2")).then(|| f[1].to_string())
            })
            .context("no cgroup2 mount")?;
        let relative = format!("bpfprof-bench-export-{}", std::process::id());
        let path = Path::new(&root).join(&relative);
        std::fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(BenchCgroup { path, relative })
    }

    fn add(&self, pid: u32) -> Result<()> {
        std::fs::write(self.path.join("cgroup.procs"), pid.to_string())
            .with_context(|| format!("moving {pid} into {}", self.path.display()))
    }
}

impl Drop for BenchCgroup {
    fn drop(&mut self) {
        let _ = std::fs::write(self.path.join("cgroup.kill"), "1");
        for _ in 0..100 {
            if std::fs::remove_dir(&self.path).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A child killed and reaped on drop.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        stop_target(&mut self.0);
    }
}

/// `curl -sf URL` into `out`, or its output.
fn curl(url: &str, out: Option<&Path>) -> Result<Vec<u8>> {
    let mut cmd = Command::new("curl");
    cmd.args(["-sf", "--max-time", "30", url]);
    if let Some(out) = out {
        cmd.arg("-o").arg(out);
    }
    let done = cmd.output().context("running curl")?;
    ensure!(done.status.success(), "curl {url}: {}", done.status);
    Ok(done.stdout)
}

/// The agent's `bpfprof_agent_windows_total`.
fn windows_cut(port: u16) -> Option<u64> {
    let text = curl(&format!("http://127.0.0.1:{port}/metrics"), None).ok()?;
    String::from_utf8_lossy(&text).lines().find_map(|l| {
        l.strip_prefix("bpfprof_agent_windows_total ")?
            .trim()
            .parse::<f64>()
            .ok()
            .map(|n| n as u64)
    })
}

/// Waits (up to three windows) until the agent has cut `n` windows.
fn wait_windows(port: u16, n: u64) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(EXPORT_WINDOW_SECS * 3 + 30);
    while Instant::now() < deadline {
        if windows_cut(port).is_some_and(|cut| cut >= n) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    bail!("the agent did not cut window {n}")
}

/// CPU seconds of `pid`'s threads other than [`RECORDING_THREAD`].
fn runtime_threads_cpu(pid: u32) -> f64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0.0;
    };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("stat")).ok())
        .filter_map(|stat| {
            let comm = &stat[stat.find('(')? + 1..stat.rfind(')')?];
            let fields: Vec<&str> = stat[stat.rfind(')')? + 2..].split_whitespace().collect();
            let ticks =
                fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
            (comm != RECORDING_THREAD).then_some(ticks / hz)
        })
        .sum()
}

/// The size of a gzipped file decoded (`gzip -dc`).
fn gunzipped_len(path: &Path) -> Result<f64> {
    let out = Command::new("gzip")
        .arg("-dc")
        .arg(path)
        .output()
        .context("running gzip")?;
    ensure!(out.status.success(), "gzip -dc {}", path.display());
    Ok(out.stdout.len() as f64)
}

/// A free TCP port on loopback.
fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

impl Bench {
    /// Starts the OTLP receiver of the tests over HTTP; returns it and its port.
    fn otlp_receiver(&self, out: &Path) -> Result<(Reaped, u16)> {
        let script = self.root.join("tests/receivers/otlp_receiver.py");
        let port_file = self.dir.join("export-receiver.port");
        let _ = std::fs::remove_file(&port_file);
        let _ = std::fs::remove_file(out);
        let child = Command::new("python3")
            .arg(&script)
            .args(["http", "0"])
            .arg(&port_file)
            .arg(out)
            .stdout(Stdio::null())
            .spawn()
            .context("starting the OTLP receiver")?;
        let child = Reaped(child);
        for _ in 0..300 {
            if let Some(port) = std::fs::read_to_string(&port_file)
                .ok()
                .and_then(|p| p.trim().parse().ok())
            {
                return Ok((child, port));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        bail!("the OTLP receiver did not listen (are opentelemetry-proto and grpcio installed? cargo xtask setup)")
    }

    /// Runs the agent on the cgroup for [`EXPORT_WINDOWS`] windows after its first, exporting
    /// to a receiver or not; the sizes of the windows (with the export) and its CPU.
    fn export_run(
        &self,
        cgroup: &BenchCgroup,
        windows: usize,
        export: bool,
    ) -> Result<(Vec<WindowSize>, AgentCpu)> {
        let received = self.dir.join("export-received.jsonl");
        let receiver = if export {
            Some(self.otlp_receiver(&received)?)
        } else {
            None
        };
        let port = free_port()?;
        let state = self.dir.join("export-state");
        let _ = std::fs::remove_dir_all(&state);
        let listen = format!("127.0.0.1:{port}");
        let (hz, window) = (EXPORT_HZ.to_string(), format!("{EXPORT_WINDOW_SECS}s"));
        let mut args = vec![
            "agent",
            "-F",
            &hz,
            "--window",
            &window,
            "--cgroup",
            &cgroup.relative,
            "--listen",
            &listen,
            "--state-dir",
            state.to_str().context("a UTF-8 path")?,
        ];
        let endpoint = receiver
            .as_ref()
            .map(|(_, p)| format!("http://127.0.0.1:{p}"));
        if let Some(endpoint) = &endpoint {
            args.extend(["--otlp-endpoint", endpoint]);
        }
        let agent = Reaped(
            Command::new(&self.bpfprof)
                .args(&args)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("starting the agent")?,
        );
        let pid = agent.0.id();
        // The first window holds the start-up (program load, first tables): not measured.
        wait_windows(port, 1)?;
        let cpu_before = proc_cpu_secs(pid as i32).context("the agent exited")?;
        let runtime_before = runtime_threads_cpu(pid);
        let started = Instant::now();
        let mut pprof = Vec::new();
        for k in 2..2 + windows as u64 {
            wait_windows(port, k)?;
            let path = self.dir.join(format!("export-window-{k}.pb.gz"));
            curl(
                &format!("http://127.0.0.1:{port}/debug/pprof/profile?seconds=1"),
                Some(&path),
            )?;
            let gz = std::fs::metadata(&path)?.len() as f64;
            pprof.push((k, gz, gunzipped_len(&path)?));
            let _ = std::fs::remove_file(&path);
        }
        let cpu = AgentCpu {
            total: proc_cpu_secs(pid as i32).context("the agent exited")? - cpu_before,
            runtime_threads: runtime_threads_cpu(pid) - runtime_before,
            secs: started.elapsed().as_secs_f64(),
        };
        let mut sizes = Vec::new();
        if export {
            // Every window measured has reached the receiver (request k is window k).
            let deadline = Instant::now() + Duration::from_secs(60);
            let requests: Vec<Value> = loop {
                let text = std::fs::read_to_string(&received).unwrap_or_default();
                let complete = text.rfind('\n').map_or("", |end| &text[..end]);
                let requests: Vec<Value> = complete
                    .lines()
                    .filter_map(|l| serde_json::from_str(l).ok())
                    .collect();
                // The first window and the measured ones.
                if requests.len() > windows || Instant::now() > deadline {
                    break requests;
                }
                std::thread::sleep(Duration::from_millis(200));
            };
            for (k, pprof_gzip, pprof_raw) in pprof {
                let request = requests
                    .get(k as usize - 1)
                    .with_context(|| format!("window {k} never reached the receiver"))?;
                let resources = request["resources"].as_array().cloned().unwrap_or_default();
                let samples: u64 = resources
                    .iter()
                    .flat_map(|r| r["profiles"].as_array().cloned().unwrap_or_default())
                    .flat_map(|p| p["samples"].as_array().cloned().unwrap_or_default())
                    .filter_map(|s| s["values"][0].as_u64())
                    .sum();
                sizes.push(WindowSize {
                    processes: resources.len() as f64,
                    samples: samples as f64,
                    otlp_gzip: request["wire_bytes"].as_f64().unwrap_or(0.0),
                    otlp_raw: request["body_bytes"].as_f64().unwrap_or(0.0),
                    pprof_gzip,
                    pprof_raw,
                });
            }
        }
        signal(&agent.0, libc::SIGINT);
        drop(agent);
        drop(receiver);
        let _ = std::fs::remove_dir_all(&state);
        Ok((sizes, cpu))
    }

    /// Section 13: bytes per exported window and the agent's CPU spent exporting.
    pub(super) fn export_size(&self, plan: &Plan, md: &mut String) -> Result<()> {
        println!("==> 13. exported bytes per window");
        let windows = if plan.quick { 2 } else { EXPORT_WINDOWS };
        let cgroup = BenchCgroup::new()?;
        let mut services = Vec::new();
        for i in 0..EXPORT_PROCESSES {
            // Different depths: each service's stacks are its own.
            let depth = (2 + i % 10).to_string();
            let child = Command::new(self.dir.join("duty"))
                .args([EXPORT_BUSY_US, EXPORT_PERIOD_MS, &depth])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .spawn()
                .context("starting bench/duty")?;
            cgroup.add(child.id())?;
            services.push(Reaped(child));
        }
        let (sizes, with) = self.export_run(&cgroup, windows, true)?;
        let (_, without) = self.export_run(&cgroup, windows, false)?;
        drop(services);
        drop(cgroup);

        let column = |f: fn(&WindowSize) -> f64| -> Vec<f64> { sizes.iter().map(f).collect() };
        let per_process = |f: fn(&WindowSize) -> f64| -> Vec<f64> {
            sizes.iter().map(|w| f(w) / w.processes.max(1.0)).collect()
        };
        writeln!(md, "\n## 13. Exported bytes per window\n")?;
        writeln!(md, "`bpfprof agent -F {EXPORT_HZ} --window {EXPORT_WINDOW_SECS}s --cgroup CG --otlp-endpoint http://127.0.0.1:PORT` recording a cgroup of {EXPORT_PROCESSES} `bench/duty.c` services (each wakes every {EXPORT_PERIOD_MS} ms and works {EXPORT_BUSY_US} µs, 2-11 frames deep: one core's work among them), the OTLP/HTTP requests as the tests' receiver got them (gzipped, as sent; decoded), beside the agent's own pprof of the same window from `/debug/pprof/profile?seconds=1` (gzipped, as served; decoded); median (min–max) over {windows} windows after the first.\n")?;
        writeln!(
            md,
            "| per window | OTLP, gzipped | OTLP | pprof, gzipped | pprof |\n|---|---|---|---|---|"
        )?;
        writeln!(
            md,
            "| bytes | {} | {} | {} | {} |",
            stat(&column(|w| w.otlp_gzip), 0),
            stat(&column(|w| w.otlp_raw), 0),
            stat(&column(|w| w.pprof_gzip), 0),
            stat(&column(|w| w.pprof_raw), 0)
        )?;
        writeln!(
            md,
            "| bytes per process | {} | {} | {} | {} |",
            stat(&per_process(|w| w.otlp_gzip), 0),
            stat(&per_process(|w| w.otlp_raw), 0),
            stat(&per_process(|w| w.pprof_gzip), 0),
            stat(&per_process(|w| w.pprof_raw), 0)
        )?;
        writeln!(
            md,
            "\nProcesses per window {}, samples per window {}.\n",
            stat(&column(|w| w.processes), 0),
            stat(&column(|w| w.samples), 0)
        )?;
        let share = |cpu: &AgentCpu, secs: f64| 100.0 * secs / cpu.secs;
        writeln!(md, "The agent's CPU over the same {windows} windows (user + system, % of one core), once exporting and once not (the same recording, the same pprof fetches); its runtime threads are every thread but the recording one (the exporter's encoding, spooling and sending, and the HTTP server's answers):\n")?;
        writeln!(
            md,
            "| agent | CPU, % of one core | runtime threads, % of one core |\n|---|---|---|"
        )?;
        for (name, cpu) in [("exporting", &with), ("not exporting", &without)] {
            writeln!(
                md,
                "| {name} | {:.2} | {:.2} |",
                share(cpu, cpu.total),
                share(cpu, cpu.runtime_threads)
            )?;
        }
        Ok(())
    }
}
