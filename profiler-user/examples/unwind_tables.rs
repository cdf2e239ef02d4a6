//! Measures unwind table builds: `cargo run --release -p profiler-user --example unwind_tables
//! -- [ELF...]` prints, per object, its size, the build time (best of 3), the rows, and bytes
//! per row as the kernel holds them. Without arguments it measures libc and the largest shared
//! library found in /usr/lib/x86_64-linux-gnu (libLLVM on a machine with the eBPF toolchain).

use std::{path::PathBuf, time::Instant};

use bpfprof::unwind::UnwindTable;

const LIBC: &str = "/lib/x86_64-linux-gnu/libc.so.6";
const LIB_DIR: &str = "/usr/lib/x86_64-linux-gnu";
const ROUNDS: usize = 3;

fn main() -> anyhow::Result<()> {
    let mut paths: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    if paths.is_empty() {
        paths.push(LIBC.into());
        if let Some(largest) = largest_library() {
            paths.push(largest);
        }
    }
    println!(
        "{:<60} {:>10} {:>10} {:>10} {:>12} {:>9}",
        "object", "file MB", "build ms", "rows", "table KiB", "B/row"
    );
    for path in paths {
        let size = std::fs::metadata(&path)?.len();
        let mut best = f64::INFINITY;
        let mut table = UnwindTable::default();
        for _ in 0..ROUNDS {
            let start = Instant::now();
            let (built, _) = UnwindTable::from_path(&path)?;
            best = best.min(start.elapsed().as_secs_f64() * 1e3);
            table = built;
        }
        println!(
            "{:<60} {:>10.1} {:>10.1} {:>10} {:>12.1} {:>9.1}",
            path.display(),
            size as f64 / 1e6,
            best,
            table.rows.len(),
            table.bytes() as f64 / 1024.0,
            table.bytes() as f64 / table.rows.len().max(1) as f64,
        );
    }
    Ok(())
}

fn largest_library() -> Option<PathBuf> {
    std::fs::read_dir(LIB_DIR)
        .ok()?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(".so"))
        .filter_map(|e| Some((e.metadata().ok()?.len(), e.path())))
        .filter(|(_, p)| !p.is_symlink())
        .max()
        .map(|(_, p)| p)
}
