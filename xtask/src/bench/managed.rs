//! Section 17 (issue 45): Java (HotSpot) and Node.js (V8) stacks: the kernel program's time per
//! sample for a 30-deep Java and Node.js stack beside a 30-deep native one, and the agent's own
//! cost on a machine running a JVM and a Node.js process.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{ensure, Context, Result};

use super::plan::{
    Plan, JDK17, MANAGED_AGENT_SECS, MANAGED_DEPTH, MANAGED_WARM_SECS, NODE18_ROOT, RUNTIME_ROUNDS,
    RUNTIME_SECS,
};
use super::process::stop_target;
use super::records::{Stacks, Verdict};
use super::stats::stat;
use super::unwind::share_with;
use super::Bench;

/// The Java workload: `descend` recurses `args[0]` levels, then `work` loops; forever.
const JAVA: &str = "public class Deep {
    static volatile long sink;
    static long work() {
        long x = 0;
        for (long i = 0; i < 200000; i++) { x = x * 31 + i; x ^= (x >>> 7); }
        return x;
    }
    static long descend(int n) {
        if (n > 0) return descend(n - 1) + 1;
        return work();
    }
    public static void main(String[] args) {
        int depth = Integer.parseInt(args[0]);
        while (true) { sink += descend(depth); }
    }
}
";

/// The Node.js workload, the same shape as [`JAVA`].
const NODE: &str = "let sink = 0;
function work() {
    let x = 0;
    for (let i = 0; i < 200000; i++) { x = (x * 31 + i) | 0; x ^= x >>> 7; }
    return x;
}
function descend(n) {
    if (n > 0) return descend(n - 1) + 1;
    return work();
}
const depth = Number(process.argv[2]);
for (;;) { sink += descend(depth); }
";

/// A workload of the section: its label, the frame that names its own code, and how to start
/// it (None: not installed, with why).
struct Workload {
    label: String,
    named: &'static str,
    command: std::result::Result<Command, String>,
}

/// Per round: ns per target sample, frames per stack, samples with the workload's frames named
/// (%), unnamed JIT frames per stack.
type Times = (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>);

/// Mean count per sample of frames in anonymous memory that bpfprof could not name.
fn anon_frames(stacks: &Stacks) -> f64 {
    let (mut anon, mut n) = (0u64, 0u64);
    for (stack, &count) in stacks {
        anon += stack.split(';').filter(|f| f.starts_with("[anon]")).count() as u64 * count;
        n += count;
    }
    anon as f64 / n.max(1) as f64
}

impl Bench {
    /// The JVM running `Deep`, compiled here with JDK 17's javac.
    fn java_command(&self) -> std::result::Result<Command, String> {
        let home = Path::new(JDK17);
        if !home.join("bin/javac").is_file() {
            return Err(format!("{JDK17} is not installed"));
        }
        let dir = self.dir.join("java");
        let compiled = (|| -> Result<()> {
            fs::create_dir_all(&dir)?;
            fs::write(dir.join("Deep.java"), JAVA)?;
            crate::cmd::run(
                Command::new(home.join("bin/javac"))
                    .arg("-d")
                    .arg(&dir)
                    .arg(dir.join("Deep.java")),
            )
        })();
        compiled.map_err(|e| format!("javac failed: {e:#}"))?;
        let mut c = Command::new(home.join("bin/java"));
        c.arg("-cp")
            .arg(&dir)
            .args(["Deep", &MANAGED_DEPTH.to_string()]);
        Ok(c)
    }

    /// Node.js running the script: Debian 12's Node 18 where setup unpacked it, else the
    /// machine's `node`.
    fn node_command(&self) -> std::result::Result<(Command, String), String> {
        let script = self.dir.join("deep.js");
        fs::write(&script, NODE).map_err(|e| format!("writing deep.js: {e}"))?;
        let unpacked = PathBuf::from(NODE18_ROOT).join("usr/bin/node");
        let mut c = if unpacked.is_file() {
            let mut c = Command::new(&unpacked);
            c.env(
                "LD_LIBRARY_PATH",
                format!("{NODE18_ROOT}/usr/lib/x86_64-linux-gnu"),
            );
            c
        } else if Path::new("/usr/bin/node").is_file() {
            Command::new("/usr/bin/node")
        } else {
            return Err("no Node.js installed".into());
        };
        let version = c.get_program().to_owned().into_string().unwrap_or_default();
        let out = Command::new(c.get_program())
            .arg("--version")
            .envs(
                c.get_envs()
                    .filter_map(|(k, v)| Some((k.to_owned(), v?.to_owned()))),
            )
            .output()
            .map_err(|e| format!("{version} --version: {e}"))?;
        let label = format!(
            "{} ({version})",
            String::from_utf8_lossy(&out.stdout).trim()
        );
        c.arg(&script).arg(MANAGED_DEPTH.to_string());
        Ok((c, label))
    }

    /// Starts `command` quietly and lets it warm up.
    fn start_warm(mut command: Command) -> Result<Child> {
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", crate::cmd::describe(&command)))?;
        std::thread::sleep(Duration::from_secs_f64(MANAGED_WARM_SECS));
        Ok(child)
    }

    /// Kernel time per target sample of the running `target`, the reject cost taken out as in
    /// section 7, over `rounds` rounds.
    fn managed_kernel_time(
        &self,
        target: &mut Child,
        named: &str,
        rounds: usize,
        secs: f64,
    ) -> Result<Times> {
        let mut idle = Command::new("sleep").arg("3600").spawn()?;
        let r = (|| -> Result<Times> {
            ensure!(target.try_wait()?.is_none(), "the workload exited");
            let (mut ns, mut frames, mut named_share, mut unnamed) =
                (vec![], vec![], vec![], vec![]);
            for _ in 0..rounds {
                let floor = self.kernel_run(idle.id() as i32, &[], secs)?;
                let r = floor.run_time_ns / floor.run_count.max(1.0);
                let k = self.kernel_run(target.id() as i32, &[], secs)?;
                let (stacks, _) = self.bpfprof_result()?;
                let other = (k.run_count - k.target_samples).max(0.0);
                let v = (k.run_time_ns - other * r) / k.target_samples.max(1.0);
                let share = share_with(&stacks, named);
                let anon = anon_frames(&stacks);
                println!(
                    "    {v:.0} ns per target sample ({} samples, {:.1} frames, {anon:.1} unnamed, `{named}` in {share:.1}%; reject {r:.0} ns)",
                    k.target_samples, k.frames
                );
                unnamed.push(anon);
                ns.push(v);
                frames.push(k.frames);
                named_share.push(share);
            }
            Ok((ns, frames, named_share, unnamed))
        })();
        stop_target(&mut idle);
        r
    }

    /// Section 17: Java and Node.js stacks' kernel time, and the agent beside a JVM and Node.
    /// Issue 45 sets no target for these figures, so it adds no verdict.
    pub(super) fn managed(
        &self,
        plan: &Plan,
        md: &mut String,
        _verdicts: &mut Vec<Verdict>,
    ) -> Result<()> {
        println!("==> 17. Java and Node.js: kernel time per sample, the agent beside them");
        let rounds = if plan.quick { 1 } else { RUNTIME_ROUNDS };
        let secs = if plan.quick { 1.0 } else { RUNTIME_SECS };
        let depth = MANAGED_DEPTH.to_string();
        let (node, node_label) = match self.node_command() {
            Ok((c, label)) => (Ok(c), label),
            Err(e) => (Err(e), "Node.js".to_string()),
        };
        let mut native = Command::new(self.dir.join("burn"));
        native.args(["0", "1", &depth]);
        let workloads = [
            Workload {
                label: "Java, OpenJDK 17 (HotSpot)".into(),
                named: "Deep.descend",
                command: self.java_command(),
            },
            Workload {
                label: format!("Node.js {node_label}"),
                named: "descend",
                command: node,
            },
            Workload {
                label: "native (`bench/burn.c`, frame pointers)".into(),
                named: "descend",
                command: Ok(native),
            },
        ];
        let mut rows: Vec<(String, &str, std::result::Result<Times, String>)> = Vec::new();
        let mut agent_commands = Vec::new();
        for w in workloads {
            let measured = match w.command {
                Err(why) => Err(why),
                Ok(command) => {
                    println!("    {}", w.label);
                    let program = command.get_program().to_owned();
                    let args: Vec<_> = command.get_args().map(|a| a.to_owned()).collect();
                    let envs: Vec<_> = command
                        .get_envs()
                        .filter_map(|(k, v)| Some((k.to_owned(), v?.to_owned())))
                        .collect();
                    if !w.label.starts_with("native") {
                        let mut again = Command::new(&program);
                        again.args(&args).envs(envs);
                        agent_commands.push(again);
                    }
                    let mut target = Self::start_warm(command)?;
                    let r = self.managed_kernel_time(&mut target, w.named, rounds, secs);
                    stop_target(&mut target);
                    Ok(r?)
                }
            };
            rows.push((w.label, w.named, measured));
        }

        writeln!(md, "\n## 17. Java and Node.js stacks (issue 45)\n")?;
        writeln!(md, "One thread recursing {MANAGED_DEPTH} levels (`descend`, then a loop of arithmetic in `work`), running until killed: Java (`target/bench/java/Deep.java`, written by the bench and compiled with JDK 17's javac, run on `{JDK17}`), Node.js (`target/bench/deep.js`) and native (`bench/burn.c` with one thread, depth {MANAGED_DEPTH}). Each runs alone, {MANAGED_WARM_SECS} s after its start (the JIT's first compilations) before bpfprof attaches at 999 Hz for {secs} s, with no flag in the target; kernel program time per target sample measured as in section 7 (the reject cost taken out, measured on an idle `sleep` each round). Median (min–max) of {rounds} round(s) per workload. Frames per stack: mean over samples, every frame of the stack (the runtime's own and the C library's included). Named: share of samples whose stack holds the workload's own frame by name (`Deep.descend`, `descend`, `descend`). Unnamed: mean count per stack of frames shown as `[anon]+0x...` (code in an anonymous mapping, the JIT's, that bpfprof walked but could not name).\n")?;
        writeln!(md, "| workload | ns per target sample | frames per stack | samples with the workload's frames named, % | unnamed `[anon]` frames per stack |\n|---|---|---|---|---|")?;
        for (label, _, measured) in &rows {
            match measured {
                Ok((ns, frames, named, anon)) => writeln!(
                    md,
                    "| {label} | {} | {} | {} | {} |",
                    stat(ns, 0),
                    stat(frames, 1),
                    stat(named, 1),
                    stat(anon, 1)
                )?,
                Err(why) => writeln!(md, "| {label} | not measured: {why} | | | |")?,
            }
        }

        // The agent at its always-on rate on the machine with the JVM and Node running.
        let mut running = Vec::new();
        let agent = (|| -> Result<super::agent::Cost> {
            ensure!(
                !agent_commands.is_empty(),
                "neither a JDK nor Node.js is installed"
            );
            for command in agent_commands.drain(..) {
                running.push(Self::start_warm(command)?);
            }
            let bpfprof = self.bpfprof.display().to_string();
            self.always_on_cost(&[&bpfprof, "agent", "-F", "19"], MANAGED_AGENT_SECS)
        })();
        for child in &mut running {
            stop_target(child);
        }
        match agent {
            Ok(cost) => {
                println!(
                    "    agent beside {} runtime(s): {:.2}% of a core, {:.1} MiB",
                    running.len(),
                    cost.percent_of_core,
                    cost.rss_mib
                );
                writeln!(md, "\nThe agent (`bpfprof agent -F 19`, system-wide, its defaults otherwise) on the machine with the Java and the Node.js workloads above running ({} process(es), each one busy thread), measured as in section 12 over {MANAGED_AGENT_SECS} s after {} s of start-up, one run: **{:.2}% of one core**, RSS {:.1} MiB (peak {:.1} MiB).", running.len(), super::plan::AGENT_SETTLE_SECS, cost.percent_of_core, cost.rss_mib, cost.peak_rss_mib)?;
            }
            Err(e) => writeln!(
                md,
                "\nThe agent beside a JVM and Node.js: not measured: {e:#}."
            )?,
        }
        Ok(())
    }
}
