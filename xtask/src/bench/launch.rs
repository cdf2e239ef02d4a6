//! Running the profilers: in launch mode (the profiler starts the workload), attached to a
//! running target and stopped, and through the daemon; each run's output read back.

use std::ffi::OsString;
use std::fs;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use serde_json::Value;

use super::plan::{Tool, ATTACH_SECS, LAUNCH_LIMIT, RUN_LIMIT};
use super::process::{
    bpftrace_prog_stats, mono_ns, proc_cpu_secs, signal, stop_target, tail, wait_for, wait_usage,
    BpfStatsGuard, Monitor,
};
use super::profiles::{
    bpfprof_stacks, bpftrace_stacks, drops, first_sample_ns, perf_stacks, perf_stats,
};
use super::records::{AttachOpts, Attached, Launched, Running, Stacks};
use super::report::join;
use super::Bench;

impl Bench {
    /// The argv of `tool` sampling at `hz` and launching `argv`; the second value says the
    /// workload must linger (bpftrace, see `bench/common.h`).
    fn launch_command(&self, tool: Option<Tool>, hz: u64, argv: &[OsString]) -> (Command, bool) {
        let out = self.dir.join("run");
        let hz_s = hz.to_string();
        match tool {
            None => {
                let mut c = Command::new(&argv[0]);
                c.args(&argv[1..]);
                (c, false)
            }
            Some(tool @ (Tool::Bpfprof | Tool::BpfprofFixed)) => {
                let mut c = Command::new(&self.bpfprof);
                c.args(["-q", "-F", &hz_s, "-o"])
                    .arg(out.with_extension("folded"))
                    .arg("--summary-json")
                    .arg(out.with_extension("json"));
                if tool == Tool::BpfprofFixed {
                    c.arg("--fixed-interval");
                }
                c.arg("--").args(argv);
                (c, false)
            }
            Some(Tool::Perf) => {
                let mut c = Command::new("perf");
                c.args(["record", "-q", "-e", "cpu-clock", "-g", "-F", &hz_s, "-o"])
                    .arg(out.with_extension("perf"))
                    .arg("--")
                    .args(argv);
                (c, false)
            }
            Some(Tool::Bpftrace) => {
                let mut c = Command::new("bpftrace");
                c.args(["-q", "-o"])
                    .arg(out.with_extension("bt"))
                    .arg("-e")
                    .arg(format!(
                        "profile:hz:{hz} /pid == cpid/ {{ @[ustack, kstack] = count(); }}"
                    ))
                    .arg("-c")
                    .arg(join(argv.iter().map(|a| a.to_string_lossy()), " "));
                (c, true)
            }
        }
    }

    /// Runs `argv` under `tool` (or alone) in launch mode: the profiler starts the workload,
    /// sampling from its first instruction, and ends when it ends. With `stacks`, the profile
    /// is read back.
    ///
    /// A run that fails is run once more, with a warning: bpftrace has been seen to hang,
    /// once in several full benches, after the SIGINT that ends it.
    pub(super) fn launch(
        &self,
        tool: Option<Tool>,
        hz: u64,
        argv: &[OsString],
        stacks: bool,
    ) -> Result<Launched> {
        self.launch_once(tool, hz, argv, stacks).or_else(|e| {
            println!("    warning: run failed, running it again: {e:#}");
            self.launch_once(tool, hz, argv, stacks)
        })
    }

    fn launch_once(
        &self,
        tool: Option<Tool>,
        hz: u64,
        argv: &[OsString],
        stacks: bool,
    ) -> Result<Launched> {
        let out = self.dir.join("run");
        for ext in ["folded", "json", "perf", "bt"] {
            let _ = fs::remove_file(out.with_extension(ext));
        }
        let (mut cmd, linger) = self.launch_command(tool, hz, argv);
        if linger {
            cmd.env("BENCH_LINGER", "1");
        }
        let stderr = self.dir.join("run.stderr");
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(File::create(&stderr)?);
        let spawned_ns = mono_ns();
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting {}", crate::cmd::describe(&cmd)))?;
        let monitor = Monitor::new(child.id() as i32, LAUNCH_LIMIT);
        // The workload's stdout comes through the profiler (its child inherits it).
        let mut lines = Vec::new();
        for line in BufReader::new(child.stdout.take().context("stdout")?).lines() {
            let line = line?;
            if line == "done" && linger {
                // bpftrace prints its map (resolving user stacks while the workload still
                // lives), then ends the workload.
                signal(&child, libc::SIGINT);
            }
            lines.push(line);
        }
        let (status, _) = wait_usage(&mut child, monitor)?;
        ensure!(
            status == 0,
            "`{}` exited with status {status}: {}",
            crate::cmd::describe(&cmd),
            tail(&stderr)
        );
        let stacks = match tool {
            Some(tool) if stacks => self.read_profile(tool, &out)?.0,
            Some(tool) if tool.is_bpfprof_like() => {
                // Not read for stacks, but bpfprof's drops are always counted.
                let summary = fs::read(out.with_extension("json"))?;
                self.note_losses(&serde_json::from_slice(&summary)?);
                Stacks::new()
            }
            _ => Stacks::new(),
        };
        Ok(Launched {
            lines,
            spawned_ns,
            stacks,
        })
    }

    /// Reads the profile a run left in `out.*`: stacks, bpfprof's summary, bpftrace's `@n`.
    fn read_profile(&self, tool: Tool, out: &Path) -> Result<(Stacks, Option<Value>, Option<u64>)> {
        Ok(match tool {
            Tool::Bpfprof | Tool::BpfprofFixed => {
                let summary: Value = serde_json::from_slice(&fs::read(out.with_extension("json"))?)
                    .context("bpfprof's summary")?;
                self.note_losses(&summary);
                let folded = fs::read_to_string(out.with_extension("folded"))?;
                (bpfprof_stacks(&folded), Some(summary), None)
            }
            Tool::Perf => (perf_stacks(&out.with_extension("perf"))?.0, None, None),
            Tool::Bpftrace => {
                let (stacks, fired) =
                    bpftrace_stacks(&fs::read_to_string(out.with_extension("bt"))?);
                (stacks, None, fired)
            }
        })
    }

    /// Adds a bpfprof summary's losses to the bench's totals, reported under the targets table.
    pub(super) fn note_losses(&self, summary: &Value) {
        if let Some(lost) = summary["lost"].as_object() {
            let mut all = self.bpfprof_losses.borrow_mut();
            for (k, v) in lost {
                if k != "truncated" {
                    *all.entry(k.clone()).or_default() += v.as_u64().unwrap_or(0);
                }
            }
        }
    }

    /// Starts `tool` sampling process `pid` at `hz`.
    pub(super) fn attach_start(
        &self,
        tool: Tool,
        hz: u64,
        pid: i32,
        opts: AttachOpts,
    ) -> Result<Running> {
        // Not `run.*`: an attached profiler may be running while a launched one starts (the
        // timer floor of section 1), and bpfprof opens its outputs when it starts.
        let out = self.dir.join("attach");
        for ext in ["folded", "json", "perf", "bt"] {
            let _ = fs::remove_file(out.with_extension(ext));
        }
        let hz_s = hz.to_string();
        let mut stats_guard = None;
        let mut cmd = match tool {
            Tool::Bpfprof | Tool::BpfprofFixed => {
                let mut c = Command::new(&self.bpfprof);
                c.args(["-q", "-F", &hz_s, "--pid", &pid.to_string(), "-o"])
                    .arg(out.with_extension("folded"))
                    .arg("--summary-json")
                    .arg(out.with_extension("json"));
                if tool == Tool::BpfprofFixed {
                    c.arg("--fixed-interval");
                }
                if opts.bpf_stats {
                    c.arg("--bpf-stats");
                }
                c
            }
            Tool::Perf => {
                let mut c = Command::new("perf");
                c.args(["record", "-q", "-e", "cpu-clock", "-g", "-F", &hz_s, "-p"])
                    .arg(pid.to_string())
                    .arg("-o")
                    .arg(out.with_extension("perf"));
                c
            }
            Tool::Bpftrace => {
                let mut prog =
                    format!("profile:hz:{hz} /pid == {pid}/ {{ @s[ustack, kstack] = count();");
                if opts.count_fired {
                    prog += " @n = count();";
                }
                prog += " }";
                if let Some(secs) = opts.bpftrace_exit_after {
                    prog += &format!(" interval:s:{secs} {{ exit(); }}");
                }
                if opts.bpf_stats {
                    stats_guard = Some(BpfStatsGuard::enable()?);
                }
                let mut c = Command::new("bpftrace");
                c.args(["-q", "-o"])
                    .arg(out.with_extension("bt"))
                    .arg("-e")
                    .arg(prog);
                // Symbols cached per executable, as bpftrace does by default under `-c`.
                // Attached by pid, 0.17 defaults to reloading them for every stack it prints:
                // on section 4's 4096 stacks that took over four minutes in a trial (stopped
                // there), which would make the comparison about a setting.
                c.env("BPFTRACE_CACHE_USER_SYMBOLS", "1");
                c
            }
        };
        let stderr = self.dir.join("attach.stderr");
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&stderr)?);
        let target = (pid, proc_cpu_secs(pid), Instant::now());
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", crate::cmd::describe(&cmd)))?;
        Ok(Running {
            tool,
            monitor: Monitor::new(child.id() as i32, RUN_LIMIT),
            target,
            child,
            out,
            stderr,
            opts,
            stats_guard,
        })
    }

    /// Attaches `tool` to `pid` for [`ATTACH_SECS`], stops it and reads what it wrote.
    pub(super) fn attach_for(
        &self,
        tool: Tool,
        hz: u64,
        pid: i32,
        opts: AttachOpts,
    ) -> Result<Attached> {
        let running = self.attach_start(tool, hz, pid, opts)?;
        // bpftrace with an exit interval stops itself; the others are stopped by signal.
        std::thread::sleep(Duration::from_secs_f64(ATTACH_SECS));
        self.stop(running)
    }

    /// Stops a running profiler with SIGINT (unless it stops itself) and reads its profile.
    pub(super) fn stop(&self, mut r: Running) -> Result<Attached> {
        let bpf_stats = match (&r.stats_guard, r.tool) {
            (Some(_), Tool::Bpftrace) => bpftrace_prog_stats(r.child.id()),
            _ => None,
        };
        // Up to the stop, not after: perf's post-processing below competes with the target.
        let (target, cpu0, since) = r.target;
        let target_cpus = cpu0
            .zip(proc_cpu_secs(target))
            .map(|(c0, c1)| (c1 - c0) / since.elapsed().as_secs_f64());
        let self_exiting = r.tool == Tool::Bpftrace && r.opts.bpftrace_exit_after.is_some();
        let signalled = Instant::now();
        if !self_exiting {
            signal(&r.child, libc::SIGINT);
        }
        let (status, usage) = wait_usage(&mut r.child, r.monitor)?;
        let stop_secs = signalled.elapsed().as_secs_f64();
        drop(r.stats_guard.take());
        // bpfprof exits 130 when interrupted (its profile written); perf and bpftrace 0.
        ensure!(
            status == 0 || status == 130,
            "{} exited with status {status}: {}",
            r.tool.name(),
            tail(&r.stderr)
        );
        let mut attached = Attached {
            stacks: Stacks::new(),
            usage,
            stop_secs,
            post: None,
            summary: None,
            drops: None,
            fired: None,
            bpf_stats,
            span_secs: None,
            target_cpus,
        };
        match r.tool {
            Tool::Bpfprof | Tool::BpfprofFixed => {
                let (stacks, summary, _) = self.read_profile(r.tool, &r.out)?;
                attached.drops = summary.as_ref().map(drops);
                attached.stacks = stacks;
                attached.summary = summary;
            }
            Tool::Perf => {
                let data = r.out.with_extension("perf");
                let (stacks, post) = perf_stacks(&data)?;
                attached.stacks = stacks;
                attached.post = Some(post);
                let (lost, span) = perf_stats(&data);
                attached.drops = lost;
                attached.span_secs = span;
            }
            Tool::Bpftrace => {
                let text = fs::read_to_string(r.out.with_extension("bt"))?;
                let (stacks, fired) = bpftrace_stacks(&text);
                // Stacks bpftrace could not record print empty; they are drops too.
                let empty = stacks.get("").copied().unwrap_or(0);
                let kept: u64 = stacks.values().sum::<u64>() - empty;
                attached.drops = fired.map(|f| f.saturating_sub(kept) + empty.min(f));
                attached.fired = fired;
                attached.stacks = stacks;
                attached.stacks.remove("");
            }
        }
        Ok(attached)
    }

    /// Attach-mode start-up: the profiler starts against `bench/startup.c` already running;
    /// returns ms from the profiler's spawn to its first sample.
    pub(super) fn attach_startup(&self, tool: Tool, hz: u64) -> Result<Option<f64>> {
        let (mut workload, start, mut lines) = self.spawn_startup()?;
        // Some way into the slots, so the first sample lands in one whatever the latency.
        std::thread::sleep(Duration::from_millis(50));
        let t0 = mono_ns();
        let running = self.attach_start(tool, hz, workload.id() as i32, AttachOpts::default());
        let result = running.and_then(|running| {
            wait_for(&mut lines, "done")?;
            self.stop(running)
        });
        stop_target(&mut workload);
        Ok(first_sample_ns(&result?.stacks, start).map(|t| (t as f64 - t0 as f64) / 1e6))
    }

    /// Starts `bench/startup.c` lingering, returning it, its start time and its stdout.
    fn spawn_startup(&self) -> Result<(Child, u64, std::io::Lines<BufReader<ChildStdout>>)> {
        let argv = self.startup_argv();
        let mut child = Command::new(&argv[0])
            .args(&argv[1..])
            .env("BENCH_LINGER", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()?;
        let mut lines = BufReader::new(child.stdout.take().context("stdout")?).lines();
        let start = wait_for(&mut lines, "start ")?
            .strip_prefix("start ")
            .and_then(|s| s.parse().ok())
            .context("startup's start line")?;
        Ok((child, start, lines))
    }

    /// The daemon's start-up: a fresh daemon, then two runs against `bench/startup.c` (the
    /// first loads the kernel program, the next reuses it). Returns, per run, ms from `run`'s
    /// spawn to its exit (it exits once the run is RUNNING) and to the first sample.
    pub(super) fn daemon_startup(&self, hz: u64) -> Result<Vec<(f64, Option<f64>)>> {
        let sock = self.dir.join("daemon.sock");
        let state = self.dir.join("daemon-state");
        let _ = fs::remove_file(&sock);
        let _ = fs::remove_dir_all(&state);
        let mut daemon = Command::new(&self.bpfprof)
            .arg("daemon")
            .arg("--socket")
            .arg(&sock)
            .arg("--state-dir")
            .arg(&state)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(self.dir.join("daemon.stderr"))?)
            .spawn()?;
        let result = (|| -> Result<Vec<(f64, Option<f64>)>> {
            let deadline = Instant::now() + Duration::from_secs(10);
            while !sock.exists() {
                ensure!(
                    Instant::now() < deadline,
                    "the daemon did not create its socket: {}",
                    tail(&self.dir.join("daemon.stderr"))
                );
                std::thread::sleep(Duration::from_millis(10));
            }
            let mut out = Vec::new();
            for _ in 0..2 {
                let (mut workload, start, mut lines) = self.spawn_startup()?;
                std::thread::sleep(Duration::from_millis(50));
                let t0 = mono_ns();
                let reply = Command::new(&self.bpfprof)
                    .args([
                        "run",
                        "--async",
                        "--duration-ms",
                        "300",
                        "--formats",
                        "folded",
                    ])
                    .args(["-F", &hz.to_string(), "--pid", &workload.id().to_string()])
                    .arg("--socket")
                    .arg(&sock)
                    .output()?;
                let running_ms = (mono_ns() - t0) as f64 / 1e6;
                let stdout = String::from_utf8_lossy(&reply.stdout);
                ensure!(
                    reply.status.success(),
                    "bpfprof run: {}{}",
                    stdout,
                    String::from_utf8_lossy(&reply.stderr)
                );
                let id = stdout
                    .lines()
                    .find_map(|l| l.strip_prefix("Run Id: "))
                    .context("no `Run Id:` from bpfprof run")?
                    .trim()
                    .to_string();
                let results = Command::new(&self.bpfprof)
                    .args([
                        "results", "--run-id", &id, "--wait", "30s", "--json", "--socket",
                    ])
                    .arg(&sock)
                    .output()?;
                let _ = wait_for(&mut lines, "done");
                stop_target(&mut workload);
                let reply: Value =
                    serde_json::from_slice(&results.stdout).context("bpfprof results --json")?;
                let folded = reply["files"]["folded"]
                    .as_str()
                    .context("no folded file in the run's results")?;
                let summary = &reply["summary"];
                self.note_losses(summary);
                let stacks = bpfprof_stacks(&fs::read_to_string(folded)?);
                let first = first_sample_ns(&stacks, start).map(|t| (t as f64 - t0 as f64) / 1e6);
                out.push((running_ms, first));
            }
            Ok(out)
        })();
        signal(&daemon, libc::SIGTERM);
        let _ = daemon.wait();
        result
    }
}
