//! Measures the userspace cost of naming Python frames: `cargo run --release -p profiler-user
//! --example python_resolve -- [PYTHON...]` starts each interpreter on a program with 10,000
//! distinct functions, then times, through `bpfprof::python`, detecting it, listing its
//! threads, resolving each function's code object once (reads of the target's memory) and again
//! from the cache. Without arguments it measures pyenv's 3.10-3.13 and Debian's python3.11.

use std::{
    io::{BufRead, BufReader},
    process::{Command, Stdio},
    time::Instant,
};

use bpfprof::runtime::cpython::PythonTarget;
use profiler_common::PythonFrame;

const FUNCTIONS: usize = 10_000;

/// Defines FUNCTIONS functions (distinct code objects, names and lines) in a file of their own,
/// prints the address of each one's code object (`id()` is the address in CPython), then waits.
const PROGRAM: &str = r#"
import ctypes, sys, time
n = int(sys.argv[1])
src = "".join(f"def function_{i}(x):\n    y = x + {i}\n    return y * 2\n\n" for i in range(n))
ns = {}
exec(compile(src, "/generated/functions.py", "exec"), ns)
print(n, flush=True)
for i in range(n):
    code = ns[f"function_{i}"].__code__
    # With the word the kernel takes a frame's identity bits from: co_nfreevars and co_version
    # from 3.12, else the name's cached hash.
    if sys.version_info >= (3, 12):
        word = ctypes.c_uint64.from_address(id(code) + 88).value
    else:
        word = hash(code.co_name) % (1 << 64)
    print(id(code), word)
sys.stdout.flush()
time.sleep(3600)
"#;

fn main() -> anyhow::Result<()> {
    let mut pythons: Vec<String> = std::env::args().skip(1).collect();
    if pythons.is_empty() {
        let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
        for v in ["3.10.13", "3.11.7", "3.12.1", "3.13.0"] {
            pythons.push(format!("{home}/.pyenv/versions/{v}/bin/python3"));
        }
        pythons.push("/usr/bin/python3.11".into());
    }
    println!(
        "{:<48} {:>8} {:>11} {:>11} {:>14} {:>14}",
        "interpreter", "version", "detect ms", "threads µs", "cold µs/code", "cached ns/frame"
    );
    for python in pythons {
        let mut child = Command::new(&python)
            .args(["-c", PROGRAM, &FUNCTIONS.to_string()])
            .stdout(Stdio::piped())
            .spawn()?;
        let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
        let n: usize = lines.next().expect("count")?.trim().parse()?;
        let codes: Vec<(u64, u64)> = lines
            .take(n)
            .map(|l| {
                let l = l?;
                let (code, word) = l.trim().split_once(' ').expect("two numbers");
                Ok((code.parse::<u64>()?, word.parse::<u64>()?))
            })
            .collect::<anyhow::Result<_>>()?;
        let pid = child.id();

        let t = Instant::now();
        let mut target = PythonTarget::detect(pid)?.expect("a supported CPython");
        let detect_ms = t.elapsed().as_secs_f64() * 1e3;
        let t = Instant::now();
        let threads = target.threads()?;
        let threads_us = t.elapsed().as_secs_f64() * 1e6;
        assert_eq!(threads.len(), 1);

        let frames: Vec<PythonFrame> = codes
            .iter()
            .map(|&(code, word)| PythonFrame {
                code,
                instruction: 2,
                identity: PythonFrame::identity_of(word),
                eval_entry: false,
            })
            .collect();
        let t = Instant::now();
        for (i, &f) in frames.iter().enumerate() {
            let function = target.resolve(f)?;
            assert_eq!(function.name, format!("function_{i}"));
        }
        let cold = t.elapsed().as_secs_f64() * 1e6 / frames.len() as f64;
        let t = Instant::now();
        for &f in &frames {
            std::hint::black_box(target.resolve(f)?);
        }
        let cached = t.elapsed().as_secs_f64() * 1e9 / frames.len() as f64;
        let version = target.version();
        println!(
            "{:<48} {:>8} {:>11.2} {:>11.1} {:>14.2} {:>14.0}",
            python,
            format!("{}.{}", version.0, version.1),
            detect_ms,
            threads_us,
            cold,
            cached
        );
        child.kill()?;
        child.wait()?;
    }
    Ok(())
}
