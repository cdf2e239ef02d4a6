//! Section 16 (issue 44): what recording the running asyncio task costs the kernel program per
//! sample: Debian sid's CPython 3.14 running gathered tasks with deep coroutine chains,
//! `--python-async auto` against `off`, side by side.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result};

use super::plan::{Plan, ASYNC_DEPTH, ASYNC_TASKS, RUNTIME_ROUNDS, RUNTIME_SECS};
use super::process::stop_target;
use super::python::SID_ROOT;
use super::records::Verdict;
use super::stats::{median, rotate, stat};
use super::unwind::share_with;
use super::Bench;

/// The workload: `argv[2]` tasks `gather`ed under `main`, each awaiting a chain of `argv[1]`
/// `deep` coroutines whose innermost burns ~1 ms of CPU and yields; runs until killed.
const ASYNC_WORKLOAD: &str = "import asyncio, sys

def burn(n):
    x = 0
    for i in range(n):
        x += i
    return x

async def deep(n):
    if n > 0:
        return await deep(n - 1) + 1
    burn(20000)
    await asyncio.sleep(0)
    return 0

async def serve():
    while True:
        await deep(int(sys.argv[1]))

async def main():
    await asyncio.gather(*(asyncio.create_task(serve(), name=f'worker-{i}')
                           for i in range(int(sys.argv[2]))))

asyncio.run(main())
";

/// The arms compared: the flag's value.
const ARMS: [&str; 2] = ["auto", "off"];

/// Per arm, per round: ns per target sample, frames per stack, samples with a task chain (%),
/// samples with Python frames (%).
#[derive(Default)]
struct Arm {
    ns: Vec<f64>,
    frames: Vec<f64>,
    tasks: Vec<f64>,
    python: Vec<f64>,
}

impl Bench {
    /// Section 16: kernel time per sample with and without the running task recorded. Issue 44
    /// sets no target for it, so it adds no verdict.
    pub(super) fn asyncio(
        &self,
        plan: &Plan,
        md: &mut String,
        _verdicts: &mut Vec<Verdict>,
    ) -> Result<()> {
        println!("==> 16. asyncio: the cost of recording the running task");
        let rounds = if plan.quick { 1 } else { RUNTIME_ROUNDS };
        let secs = if plan.quick { 1.0 } else { RUNTIME_SECS };
        writeln!(
            md,
            "\n## 16. asyncio tasks: the kernel's cost of recording the running task (issue 44)\n"
        )?;
        let sid = Path::new(SID_ROOT);
        if !sid.join("usr/bin/python3.14").is_file() {
            writeln!(md, "Not measured: Debian sid's CPython 3.14 is not installed in `{SID_ROOT}` (`cargo xtask setup` makes the chroot).")?;
            return Ok(());
        }
        let inside = "/tmp/bpfprof-bench-async.py";
        std::fs::write(sid.join(&inside[1..]), ASYNC_WORKLOAD)
            .context("writing the asyncio workload into the chroot")?;
        let mut target = Command::new("chroot")
            .args([SID_ROOT, "/usr/bin/python3.14", inside])
            .args([ASYNC_DEPTH.to_string(), ASYNC_TASKS.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .context("starting the asyncio workload")?;
        let mut idle = match Command::new("sleep").arg("3600").spawn() {
            Ok(idle) => idle,
            Err(e) => {
                stop_target(&mut target);
                return Err(e).context("starting sleep");
            }
        };
        let mut arms: BTreeMap<&str, Arm> = BTreeMap::new();
        let measured = (|| -> Result<()> {
            // The interpreter started and its tasks running.
            std::thread::sleep(Duration::from_millis(500));
            for round in 0..rounds {
                let mut order = ARMS;
                rotate(&mut order, round);
                for arm in order {
                    let flags = ["--python-async", arm];
                    // The reject cost with these flags, as in section 7.
                    let floor = self.kernel_run(idle.id() as i32, &flags, secs)?;
                    let r = floor.run_time_ns / floor.run_count.max(1.0);
                    let k = self.kernel_run(target.id() as i32, &flags, secs)?;
                    let (stacks, _) = self.bpfprof_result()?;
                    let other = (k.run_count - k.target_samples).max(0.0);
                    let ns = (k.run_time_ns - other * r) / k.target_samples.max(1.0);
                    let tasks = share_with(&stacks, "[task ");
                    println!(
                        "    round {round} --python-async {arm}: {ns:.0} ns per target sample ({} samples, {:.1} frames, task chain in {tasks:.1}%, Python frames in {:.1}%; reject {r:.0} ns)",
                        k.target_samples, k.frames, k.python_share
                    );
                    let a = arms.entry(arm).or_default();
                    a.ns.push(ns);
                    a.frames.push(k.frames);
                    a.tasks.push(tasks);
                    a.python.push(k.python_share);
                }
            }
            Ok(())
        })();
        stop_target(&mut target);
        stop_target(&mut idle);
        let _ = std::fs::remove_file(sid.join(&inside[1..]));
        measured?;

        writeln!(md, "Debian sid's CPython 3.14 (in `{SID_ROOT}`) running {ASYNC_TASKS} tasks `gather`ed under `main`, each awaiting a chain of {ASYNC_DEPTH} coroutines (`await deep(n - 1)`) whose innermost burns about 1 ms of CPU and yields (`asyncio.sleep(0)`): one thread, always busy. bpfprof attaches at 999 Hz for {secs} s with `--python-async auto` (the running task recorded in the kernel, its awaiting chain read in userspace) and with `--python-async off`, the two in alternating order; kernel program time per target sample measured as in section 7 (the reject cost r taken out, measured with the same flags while bpfprof watches an idle `sleep`). Median (min–max) of {rounds} round(s) per arm; task chain: share of the samples whose stack holds a `[task NAME]` frame.\n")?;
        writeln!(md, "| `--python-async` | ns per target sample | frames per stack | samples with a task chain, % | samples with Python frames, % |\n|---|---|---|---|---|")?;
        for arm in ARMS {
            if let Some(a) = arms.get(arm) {
                writeln!(
                    md,
                    "| {arm} | {} | {} | {} | {} |",
                    stat(&a.ns, 0),
                    stat(&a.frames, 1),
                    stat(&a.tasks, 1),
                    stat(&a.python, 1)
                )?;
            }
        }
        if let (Some(on), Some(off)) = (arms.get("auto"), arms.get("off")) {
            let added = median(&on.ns) - median(&off.ns);
            writeln!(md, "\nWith the running task recorded the kernel time per sample differs by {added:+.0} ns (difference of the medians; a difference within the spread of the rows is noise on this shared machine). The stacks are {:.1} frames shorter with it: the event loop's frames below the task give way to one `[task NAME]` frame per awaiting task.", median(&off.frames) - median(&on.frames))?;
        }
        Ok(())
    }
}
