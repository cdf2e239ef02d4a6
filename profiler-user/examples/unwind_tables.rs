//! Measures unwind table builds: `cargo run --release -p profiler-user --example unwind_tables
//! -- [ELF...]` prints, per object, its size, the build time (best of 3), the rows, and bytes
//! per row as the kernel holds them. Without arguments it measures libc and the largest shared
//! library found in /usr/lib/x86_64-linux-gnu (libLLVM on a machine with the eBPF toolchain).
//! With `--cache DIR` first, it also files each table in the table cache there and prints
//! the time to find it again (hashing the object's CFI and reading the entry; best of 3).

use std::{path::PathBuf, time::Instant};

use bpfprof::unwind::{CfiInputs, TableCache, UnwindTable};

const LIBC: &str = "/lib/x86_64-linux-gnu/libc.so.6";
const LIB_DIR: &str = "/usr/lib/x86_64-linux-gnu";
const ROUNDS: usize = 3;

fn main() -> anyhow::Result<()> {
    let mut paths: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    let cache = match paths.first().and_then(|p| p.to_str()) {
        Some("--cache") if paths.len() > 1 => {
            let dir = paths.remove(1);
            paths.remove(0);
            Some(TableCache::open(&dir, 1 << 32)?)
        }
        _ => None,
    };
    if paths.is_empty() {
        paths.push(LIBC.into());
        if let Some(largest) = largest_library() {
            paths.push(largest);
        }
    }
    println!(
        "{:<60} {:>10} {:>10} {:>10} {:>12} {:>9} {:>10}",
        "object", "file MB", "build ms", "rows", "table KiB", "B/row", "cached ms"
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
        let mut cached = f64::NAN;
        if let Some(cache) = &cache {
            let data = std::fs::read(&path)?;
            let elf = object::File::parse(data.as_slice())?;
            cache.put(&cache.key(&CfiInputs::read(&elf)?), &table);
            for _ in 0..ROUNDS {
                let start = Instant::now();
                // As a build thread does: the file read by pread, the CFI hashed, the entry read.
                let file = std::fs::File::open(&path)?;
                let reader = bpfprof::process::target_file::ElfReader::new(file);
                let elf = object::File::parse(&reader)?;
                let found = cache.get(&cache.key(&CfiInputs::read(&elf)?));
                assert!(
                    found.as_ref() == Some(&table),
                    "the cache gave another table"
                );
                cached = cached.min(start.elapsed().as_secs_f64() * 1e3);
            }
        }
        println!(
            "{:<60} {:>10.1} {:>10.1} {:>10} {:>12.1} {:>9.1} {:>10.1}",
            path.display(),
            size as f64 / 1e6,
            best,
            table.rows.len(),
            table.bytes() as f64 / 1024.0,
            table.bytes() as f64 / table.rows.len().max(1) as f64,
            cached,
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
