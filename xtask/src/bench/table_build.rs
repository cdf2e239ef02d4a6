//! Section 8: building unwind tables, on libc and on the generated 400 MB shared object.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;

use anyhow::{ensure, Result};

use super::plan::{Plan, LARGE_CHUNK_BYTES, LARGE_FUNCTIONS};
use super::records::Verdict;
use super::stats::{median, stat};
use super::Bench;

impl Bench {
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
        // PyTorch's own largest library, where `cargo xtask setup` installed it.
        let libtorch = PathBuf::from(crate::consts::TORCH_VENV)
            .join("lib/python3.11/site-packages/torch/lib/libtorch_cpu.so");
        let mut objects = vec![(libc, "libc.so.6"), (large, "generated large-cfi.so")];
        if libtorch.exists() {
            objects.push((libtorch, "PyTorch's libtorch_cpu.so"));
        }
        // The example files each table in a cache of its own and times finding it again.
        let cache = self.root.join("target/bench/table-cache");
        // (file MB, build ms, rows, table KiB, bytes/row, found in the cache ms) per object,
        // over rounds.
        let mut runs: BTreeMap<usize, Vec<[f64; 6]>> = BTreeMap::new();
        let rounds = plan.rounds.min(3);
        for _ in 0..rounds {
            let _ = std::fs::remove_dir_all(&cache);
            let out = self.timed({
                let mut c = Command::new(&example);
                c.arg("--cache").arg(&cache);
                c.args(objects.iter().map(|(path, _)| path));
                c
            })?;
            for (i, line) in out.lines.iter().skip(1).enumerate() {
                let v: Vec<f64> = line
                    .split_whitespace()
                    .skip(1)
                    .filter_map(|f| f.parse().ok())
                    .collect();
                ensure!(v.len() == 6, "unexpected unwind_tables line: {line}");
                println!("    {line}");
                runs.entry(i)
                    .or_default()
                    .push([v[0], v[1], v[2], v[3], v[4], v[5]]);
            }
        }
        let _ = std::fs::remove_dir_all(&cache);
        writeln!(md, "\n## 8. Unwind table build\n")?;
        writeln!(md, "Turning an object's `.eh_frame` into the table the kernel program searches, through bpfprof's own library (`bpfprof::unwind::UnwindTable::from_path`, run by `profiler-user/examples/unwind_tables.rs`, which takes the best of 3 builds per object), over {rounds} runs: median (min–max) of those bests. The large object is generated (`generate_large_asm` in `xtask/src/bench/unwind.rs`): {LARGE_FUNCTIONS} functions with 4 KiB bodies and the CFI gcc emits for them (frame-pointer and frameless prologues, pushes of callee-saved registers, epilogues; the frameless ones also push and pop every {LARGE_CHUNK_BYTES} bytes, as code does around calls), assembled and linked into a shared object of the size of PyTorch's libtorch_cpu.so (430 MB; generated and cached under `target/bench/` in about 15 s). Its rows per MB are a third of libc's: real code has more CFA changes per byte than these filler bodies, so a real 400 MB library would have more rows (time scales with rows; bytes per row do not change). Bytes are the table as the kernel holds it. PyTorch's libtorch_cpu.so (from the venv `cargo xtask setup` installs) is the real object of that size. *From the cache*: the same table found again in the on-disk table cache (`--unwind-cache`) as the next bpfprof process finds it: the object's CFI read and hashed (SHA-256), the entry read and checked; best of 3.\n")?;
        writeln!(md, "| object | file, MB | build, ms | from the cache, ms | rows | rows per file MB | table, KiB | bytes per row |\n|---|---|---|---|---|---|---|---|")?;
        for (i, (_, name)) in objects.iter().enumerate() {
            let Some(r) = runs.get(&i) else {
                writeln!(md, "| {name} | not measured | | | | | | |")?;
                continue;
            };
            let col = |k: usize| r.iter().map(|v| v[k]).collect::<Vec<f64>>();
            let density: Vec<f64> = r.iter().map(|v| v[2] / v[0].max(1e-9)).collect();
            writeln!(
                md,
                "| {name} | {} | {} | {} | {} | {} | {} | {} |",
                stat(&col(0), 1),
                stat(&col(1), 1),
                stat(&col(5), 1),
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
}
