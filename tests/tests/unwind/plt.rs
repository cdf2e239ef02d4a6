//! PLT stubs are named as perf names them (`strcmp@plt`), not after the symbol before the PLT
//! (`_init`): the names objdump gives every stub of a real workload, in the classic layout
//! (`.plt`, `.plt.got`) and in the IBT one (`.plt.sec`).
//!
//! No sampled check: a stub is one indirect jump, and on this machine (cpu-clock, no PMU) a
//! loop with 93% of its samples in `strlen`, called through one, got none of 3885 in the stub.

use std::{path::Path, process::Command, time::Duration};

use bpfprof::{process::maps::ProcessMaps, symbolize::Symbolizer};
use bpfprof_tests::{workload_path, Checks, Workload};

/// objdump's `<name@plt>` labels of `binary`, with their addresses in the file.
fn objdump_stubs(binary: &Path) -> Vec<(u64, String)> {
    let out = Command::new("objdump")
        .arg("-d")
        .arg(binary)
        .output()
        .expect("running objdump (binutils)");
    assert!(out.status.success(), "objdump failed: {out:?}");
    let label = regex::Regex::new(r"^([0-9a-f]+) <(\S+@plt)>:$").unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let c = label.captures(line)?;
            Some((u64::from_str_radix(&c[1], 16).ok()?, c[2].to_string()))
        })
        .collect()
}

/// Where `binary` (a PIE) is loaded in `pid`: the start of its mapping at file offset 0.
fn load_base(pid: u32, binary: &Path) -> u64 {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let binary = binary.canonicalize().unwrap();
    maps.lines()
        .find_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (range, offset, path) = (fields[0], fields[2], fields.get(5)?);
            (Path::new(path) == binary && u64::from_str_radix(offset, 16).ok()? == 0)
                .then(|| u64::from_str_radix(range.split('-').next().unwrap(), 16).unwrap())
        })
        .unwrap_or_else(|| panic!("{} is not mapped in pid {pid}:\n{maps}", binary.display()))
}

/// Every stub objdump labels in `workload`, at its first byte and inside it, symbolizes to
/// that label in a running process.
fn check_stub_names(workload: &str) {
    let binary = workload_path(workload);
    let stubs = objdump_stubs(&binary);
    // strcmp's stub is in .plt (.plt.sec with IBT); __cxa_finalize's in .plt.got.
    for expected in ["strcmp@plt", "__cxa_finalize@plt"] {
        assert!(
            stubs.iter().any(|(_, n)| n == expected),
            "objdump labels no {expected} in {workload}: {stubs:?}"
        );
    }
    let target = Workload::spawn(workload, &["parents", "30"]);
    std::thread::sleep(Duration::from_millis(100));
    let maps = ProcessMaps::capture(
        target.pid(),
        target.pid(),
        &bpfprof::process::copies::CopyBudget::mib(1024),
    )
    .unwrap();
    let base = load_base(target.pid(), &binary);
    let mut symbolizer = Symbolizer::new();
    // The first byte and one inside (the jump after endbr64, or the push after the jump).
    let addrs: Vec<(u64, &str)> = stubs
        .iter()
        .flat_map(|(vaddr, name)| [(base + vaddr, name.as_str()), (base + vaddr + 6, name)])
        .collect();
    symbolizer.prepare_user(&maps, addrs.iter().map(|(a, _)| *a));
    let mut c = Checks::new();
    for (addr, expected) in &addrs {
        let frames = symbolizer.user(&maps, *addr);
        c.check(&*frames[0].name == *expected, || {
            format!(
                "{workload}: {addr:#x} (file {:#x}) is {:?}, objdump says {expected}",
                addr - base,
                frames[0].name
            )
        });
    }
    c.finish();
}

#[test]
fn plt_stubs_are_named_after_the_function_they_call() {
    check_stub_names("nofp");
}

#[test]
fn ibt_plt_stubs_in_plt_sec_are_named_after_the_function_they_call() {
    let sections = Command::new("readelf")
        .args(["-SW"])
        .arg(workload_path("nofp_ibt"))
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&sections.stdout).contains(".plt.sec"),
        "nofp_ibt has no .plt.sec: the compiler did not build it for IBT"
    );
    check_stub_names("nofp_ibt");
}
