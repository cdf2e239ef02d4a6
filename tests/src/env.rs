//! The test environment: root or CI, the machine's PMU and tools, the workspace, the bpfprof
//! binary under test and the workload programs, and what the kernel holds.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// True when the environment variable `CI` is exactly `true`.
pub fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// Whether the tests may run. Returns false (after printing
/// "skipping: needs root") when not root and not under CI; panics under
/// `CI=true` when not root, so that a misconfigured CI cannot pass silently.
pub fn require_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    if euid == 0 {
        return true;
    }
    if ci() {
        panic!(
            "the bpfprof end-to-end tests need root (euid 0, with CAP_BPF and CAP_PERFMON), \
             but euid is {euid} and CI=true: run them as root in CI"
        );
    }
    eprintln!("skipping: needs root");
    false
}

/// Whether a hardware PMU is exposed (`/sys/bus/event_source/devices/cpu`).
/// Without one, `cycles` is unavailable and `--event auto` falls back to cpu-clock.
pub fn has_hardware_pmu() -> bool {
    Path::new("/sys/bus/event_source/devices/cpu").exists()
}

/// Reads a small integer from a procfs/sysfs file.
pub fn read_proc_u64(path: &str) -> u64 {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
    text.trim()
        .parse()
        .unwrap_or_else(|e| panic!("parsing {path} ({text:?}): {e}"))
}

/// The workspace root (the parent of this crate's manifest directory).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent directory")
        .to_path_buf()
}

/// Path of the `bpfprof` binary under test.
///
/// `BPFPROF_BIN` if set; otherwise `$CARGO_TARGET_DIR/debug/bpfprof` or
/// `<workspace>/target/debug/bpfprof`. If that file does not exist it is built
/// once per test process with `cargo build -p profiler-user --bin bpfprof`.
/// (An existing binary is used as is: rebuild it yourself after changes.)
pub fn bpfprof_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(bin) = std::env::var_os("BPFPROF_BIN") {
            let bin = PathBuf::from(bin);
            assert!(
                bin.is_file(),
                "BPFPROF_BIN={} does not exist or is not a file",
                bin.display()
            );
            return bin;
        }
        let root = workspace_root();
        let target_dir = std::env::var_os("CARGO_TARGET_DIR")
            .map(|d| {
                let d = PathBuf::from(d);
                if d.is_absolute() {
                    d
                } else {
                    root.join(d)
                }
            })
            .unwrap_or_else(|| root.join("target"));
        let bin = target_dir.join("debug").join("bpfprof");
        if !bin.is_file() {
            let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
            eprintln!("{} missing: building it", bin.display());
            let status = Command::new(&cargo)
                .args(["build", "-p", "profiler-user", "--bin", "bpfprof"])
                .current_dir(&root)
                .status()
                .unwrap_or_else(|e| panic!("running {cargo:?} build: {e}"));
            assert!(status.success(), "cargo build of bpfprof failed: {status}");
            assert!(
                bin.is_file(),
                "cargo build succeeded but {} still does not exist",
                bin.display()
            );
        }
        bin
    })
}

/// Path of a compiled workload program (see `tests/workloads/`).
pub fn workload_path(name: &str) -> PathBuf {
    let path = match name {
        "hotcold" => env!("WORKLOAD_HOTCOLD"),
        "offcpu" => env!("WORKLOAD_OFFCPU"),
        "phases" => env!("WORKLOAD_PHASES"),
        "spinner" => env!("WORKLOAD_SPINNER"),
        "syscalls" => env!("WORKLOAD_SYSCALLS"),
        "alias" => env!("WORKLOAD_ALIAS"),
        "multithread" => env!("WORKLOAD_MULTITHREAD"),
        "shortlived" => env!("WORKLOAD_SHORTLIVED"),
        "manystacks" => env!("WORKLOAD_MANYSTACKS"),
        "nofp" => env!("WORKLOAD_NOFP"),
        "nofp_signal" => env!("WORKLOAD_NOFP_SIGNAL"),
        "nofp_dlsym" => env!("WORKLOAD_NOFP_DLSYM"),
        "nofp_ibt" => env!("WORKLOAD_NOFP_IBT"),
        "nofp_dlopen" => env!("WORKLOAD_NOFP_DLOPEN"),
        "nofp_realign" => env!("WORKLOAD_NOFP_REALIGN"),
        "nofp_jit" => env!("WORKLOAD_NOFP_JIT"),
        "nofp_dump" => env!("WORKLOAD_NOFP_DUMP"),
        "libhot" => env!("WORKLOAD_LIBHOT"),
        "rustwork_nofp" => env!("WORKLOAD_RUSTWORK_NOFP"),
        "rustwork_fp" => env!("WORKLOAD_RUSTWORK_FP"),
        other => panic!("unknown workload {other:?}"),
    };
    PathBuf::from(path)
}

/// Whether an executable is on PATH (or in /usr/sbin, /sbin).
pub fn find_tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Whether a BPF program with this id currently exists in the kernel,
/// according to `bpftool prog show id N`.
pub fn bpf_prog_exists(bpftool: &Path, id: u32) -> bool {
    Command::new(bpftool)
        .args(["prog", "show", "id", &id.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("running bpftool")
        .success()
}

/// pyenv's CPythons, the newest installed 3.10, 3.11, 3.12 and 3.13 (built without frame
/// pointers); all four are required under CI.
pub fn pyenv_cpythons() -> Vec<std::path::PathBuf> {
    use std::path::PathBuf;
    let home = PathBuf::from(std::env::var("HOME").unwrap_or("/root".into()));
    let found: Vec<PathBuf> = ["3.10", "3.11", "3.12", "3.13"]
        .iter()
        .filter_map(|minor| {
            let mut v: Vec<PathBuf> = std::fs::read_dir(home.join(".pyenv/versions"))
                .ok()?
                .filter_map(|e| e.ok())
                .filter(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .starts_with(&format!("{minor}."))
                })
                .map(|e| e.path().join("bin/python3"))
                .filter(|p| p.exists())
                .collect();
            v.sort();
            v.pop()
        })
        .collect();
    assert!(
        found.len() == 4 || !ci(),
        "pyenv's CPython 3.10-3.13 are needed under CI (see cargo xtask setup); found {found:?}"
    );
    found
}

/// [`pyenv_cpythons`] and Debian's own CPython 3.11 where it is installed.
pub fn cpythons() -> Vec<std::path::PathBuf> {
    let mut found = pyenv_cpythons();
    let debian = std::path::PathBuf::from("/usr/bin/python3.11");
    if debian.exists() {
        found.push(debian);
    }
    found
}
