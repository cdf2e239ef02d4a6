//! Section 11: Python frames: overhead and accuracy on a Python workload next to py-spy, and
//! the userspace cost of naming thousands of Python functions.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result};

use super::plan::{
    Plan, ATTACH_SECS, PYMANY_CHAINS, PYMANY_DEPTH, PYMANY_LEAF_ITERS, PYTHON, PYTHON_DEPTH,
    PYTHON_ROUNDS, UNNAMED_PYTHON,
};
use super::process::stop_target;
use super::profiles::fold_lines;
use super::records::{Stacks, Verdict};
use super::report::join;
use super::stats::{median, rotate, stat};
use super::unwind::share_with;
use super::Bench;

/// The Python workload: `leaf_hot` and `leaf_cold` 75:25 under `work`, optionally below a
/// recursion `DEPTH` deep; prints `secs S` like `burn`. With ROUNDS = 0 it runs until killed.
pub(super) const PYWORK: &str = r#"import sys, time

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

impl Bench {
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

        // Kernel program time for a 30-deep Python stack, on 3.12 (pyenv's, the verdicts'),
        // 3.14 (Debian sid's, in the chroot setup makes: its layout from `_Py_DebugOffsets`)
        // and the free-threaded 3.13t setup builds, side by side.
        writeln!(md, "\nKernel program time per sample for a {PYTHON_DEPTH}-deep Python stack (`pywork.py 0 {PYTHON_DEPTH}`), measured as in section 7, on pyenv's 3.12.1, Debian sid's 3.14 (in `{SID_ROOT}`; its layout read from its `_Py_DebugOffsets`) and the free-threaded 3.13t `cargo xtask setup` builds (`{PY313T}`; per-thread state, the longer object header, no GIL entry read):\n")?;
        let interpreters = python_interpreters(&script_s)?;
        let mut rows: Vec<(&str, Option<KernelTimes>)> = Vec::new();
        for (label, argv) in &interpreters {
            let measured = match argv {
                Some(argv) if kernel_walk => Some(self.python_kernel_time(plan, argv)?),
                _ => None,
            };
            rows.push((label, measured));
        }
        writeln!(md, "| interpreter | ns per target sample | frames per stack | samples with Python frames, % |\n|---|---|---|---|")?;
        for (label, measured) in &rows {
            match measured {
                Some((v, frames, share)) => writeln!(
                    md,
                    "| {label} | {} | {} | {} |",
                    stat(v, 0),
                    stat(frames, 1),
                    stat(share, 1)
                )?,
                None => writeln!(md, "| {label} | not measured | | |")?,
            }
        }
        let measured = rows.into_iter().next().and_then(|(_, m)| m);
        match &measured {
            Some((v, _, _)) => {
                verdicts.push(Verdict {
                    target: format!(
                        "kernel time per sample under 10 µs, {PYTHON_DEPTH}-deep Python stack"
                    ),
                    measured: format!("{:.1} µs (median)", median(v) / 1e3),
                    met: median(v) < 10_000.0,
                });
                verdicts.push(Verdict {
                    target: format!(
                        "kernel time per sample under 6 µs, {PYTHON_DEPTH}-deep Python stack \
                         (issue 28)"
                    ),
                    measured: format!("{:.1} µs (median)", median(v) / 1e3),
                    met: median(v) < 6_000.0,
                });
            }
            None => {
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

/// Per round: ns per target sample, frames per stack, samples with Python frames (%).
type KernelTimes = (Vec<f64>, Vec<f64>, Vec<f64>);
/// A row's label, and the command that runs the workload (None: not installed).
type Interpreter = (&'static str, Option<Vec<String>>);

/// The chroot with Debian sid's CPython 3.14 and 3.15, and the free-threaded 3.13t (both made
/// by `cargo xtask setup`).
pub(super) const SID_ROOT: &str = "/srv/sid";
const PY313T: &str = "/opt/py313t/bin/python3.13t";

/// The interpreters of the kernel-time rows: a label and the command that runs `script`
/// `0 PYTHON_DEPTH` (None where setup has not installed it). The 3.14 one runs in the
/// chroot, so the script is copied into it.
fn python_interpreters(script: &str) -> Result<Vec<Interpreter>> {
    let depth = PYTHON_DEPTH.to_string();
    let sid = std::path::Path::new(SID_ROOT);
    let sid314 = if sid.join("usr/bin/python3.14").is_file() {
        let inside = "/tmp/bpfprof-bench-pywork.py";
        std::fs::copy(script, sid.join(&inside[1..]))
            .context("copying pywork.py into the chroot")?;
        Some(vec![
            "chroot".into(),
            SID_ROOT.into(),
            "/usr/bin/python3.14".into(),
            inside.into(),
            "0".into(),
            depth.clone(),
        ])
    } else {
        None
    };
    let ft = std::path::Path::new(PY313T)
        .is_file()
        .then(|| vec![PY313T.into(), script.into(), "0".into(), depth.clone()]);
    Ok(vec![
        (
            "CPython 3.12 (pyenv)",
            Some(vec![
                PYTHON.into(),
                script.into(),
                "0".into(),
                depth.clone(),
            ]),
        ),
        ("CPython 3.14 (Debian sid)", sid314),
        ("CPython 3.13t (free-threaded)", ft),
    ])
}

impl Bench {
    /// Kernel program time per sample of the Python workload `argv` (its stack
    /// `PYTHON_DEPTH` deep), with the reject cost taken out as in section 7: per round, ns
    /// per target sample, frames per stack and the share of samples with Python frames.
    fn python_kernel_time(&self, plan: &Plan, argv: &[String]) -> Result<KernelTimes> {
        let mut t = Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .context("starting the Python workload")?;
        std::thread::sleep(Duration::from_millis(300));
        let secs = if plan.quick { 1.0 } else { ATTACH_SECS };
        let mut idle = Command::new("sleep").arg("3600").spawn()?;
        let r = (|| -> Result<KernelTimes> {
            let (mut v, mut frames, mut share) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..plan.rounds {
                let floor = self.kernel_run(idle.id() as i32, &[], secs)?;
                let r = floor.run_time_ns / floor.run_count.max(1.0);
                let k = self.kernel_run(t.id() as i32, &[], secs)?;
                let other = (k.run_count - k.target_samples).max(0.0);
                let ns = (k.run_time_ns - other * r) / k.target_samples.max(1.0);
                println!(
                    "    {PYTHON_DEPTH}-deep Python stack ({}): {ns:.0} ns per target sample, {:.1}% of samples with Python frames, {:.1} frames",
                    argv.join(" "),
                    k.python_share,
                    k.frames
                );
                v.push(ns);
                frames.push(k.frames);
                share.push(k.python_share);
            }
            Ok((v, frames, share))
        })();
        stop_target(&mut t);
        stop_target(&mut idle);
        r
    }
}
