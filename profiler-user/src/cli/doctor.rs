//! `bpfprof doctor`: checks what a recording needs on this machine (kernel settings,
//! capabilities, the PMU, the kernel program's load and attach, the helpers it calls, the
//! daemon) and says what to do about each problem.
//!
//! Features are probed, never inferred from the kernel version: the kernel program is loaded
//! and attached exactly as a recording does, and helpers are probed by loading a program that
//! calls them.

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    time::Duration,
};

use serde::Serialize;

use crate::{
    client::{Client, ClientError},
    error::Error,
    kernel::{helpers::REQUIRED_HELPERS, KernelProgram},
    protocol,
    sampling::{EventChoice, KernelLimits, SamplingRequest},
};

/// Capability numbers from `linux/capability.h` that bpfprof cares about.
const CAPABILITIES: [(&str, u32); 4] = [
    ("CAP_SYS_ADMIN", 21),
    ("CAP_SYS_PTRACE", 19),
    ("CAP_PERFMON", 38),
    ("CAP_BPF", 39),
];
/// The deepest stack bpfprof asks for by default (`--max-stack-length`).
const DEFAULT_STACK_DEPTH: u64 = profiler_common::DEFAULT_STACK_DEPTH as u64;
/// Below this `perf_event_max_sample_rate`, the default sampling rate cannot be honoured.
const LOW_SAMPLE_RATE: u64 = 1000;
/// How long the daemon check waits for the socket to accept.
const DAEMON_TIMEOUT: Duration = Duration::from_secs(2);

/// The outcome of one check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Status {
    /// Fine as it is.
    Ok,
    /// Works, but something is missing or degraded.
    Warn,
    /// bpfprof cannot record here until this is fixed.
    Fail,
}

/// One check: what was looked at, what was found and what to do about it.
#[derive(Clone, Debug, Serialize)]
pub struct Check {
    /// Stable identifier, for tools (`capabilities`, `program_load`, ...).
    pub name: &'static str,
    /// The outcome.
    pub status: Status,
    /// What was found.
    pub found: String,
    /// What to do about it; empty when nothing needs doing.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub advice: String,
}

/// Every check of one `bpfprof doctor` run.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// The checks, in the order they ran.
    pub checks: Vec<Check>,
}

impl Report {
    /// Whether any check failed.
    pub fn failed(&self) -> bool {
        self.checks.iter().any(|c| c.status == Status::Fail)
    }

    /// The report as aligned text, one check a line, advice indented below it.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for check in &self.checks {
            let status = match check.status {
                Status::Ok => "OK",
                Status::Warn => "WARN",
                Status::Fail => "FAIL",
            };
            let _ = writeln!(out, "{status:<4}  {:<31} {}", check.name, check.found);
            if !check.advice.is_empty() {
                let _ = writeln!(out, "      -> {}", check.advice);
            }
        }
        out
    }
}

fn check(name: &'static str, status: Status, found: impl Into<String>, advice: &str) -> Check {
    Check {
        name,
        status,
        found: found.into(),
        advice: advice.to_string(),
    }
}

/// `bpfprof doctor --pid PID`: what bpfprof makes of one process's Python (its interpreter,
/// version, build, whether its layout passed bpfprof's checks and why not, and what a
/// recording of it will show), so that a profile without Python frames is never a mystery.
pub fn process(pid: u32) -> Report {
    use crate::runtime::cpython::{Probe, PythonTarget};
    let mut checks = Vec::new();
    let exe = std::fs::read_link(format!("/proc/{pid}/exe"));
    let Ok(exe) = exe else {
        checks.push(check(
            "process",
            Status::Fail,
            format!("pid {pid}: no such process (or not readable)"),
            "give the pid of a running process; bpfprof needs root (or CAP_SYS_PTRACE) to read it",
        ));
        return Report { checks };
    };
    checks.push(check(
        "process",
        Status::Ok,
        format!("pid {pid}: {}", exe.display()),
        "",
    ));
    let mut probe = match PythonTarget::probe(pid) {
        Ok(probe) => probe,
        Err(e) => {
            checks.push(check(
                "python",
                Status::Fail,
                format!("cannot read the process: {e:#}"),
                "run as root (or with CAP_SYS_PTRACE)",
            ));
            return Report { checks };
        }
    };
    let (interpreter, layout) = match &probe {
        Probe::NotPython(reason) => {
            checks.push(check(
                "python",
                Status::Ok,
                format!("no CPython in this process ({reason}): native frames only"),
                "",
            ));
            return Report { checks };
        }
        Probe::Walkable(target) => (
            target.interpreter().clone(),
            Ok(if target.version() >= (3, 13) {
                "read from the interpreter's own _Py_DebugOffsets, checked"
            } else {
                "bpfprof's table for this version"
            }),
        ),
        Probe::Unsupported(unsupported) => (
            unsupported.interpreter.clone(),
            Err(unsupported.reason.clone()),
        ),
    };
    let (major, minor) = interpreter.version;
    let version = match interpreter.version_hex {
        Some(hex) => format!("{major}.{minor}.{}", (hex >> 8) & 0xff),
        None => format!("{major}.{minor}"),
    };
    checks.push(check(
        "python",
        Status::Ok,
        format!(
            "CPython {version} in {}, _PyRuntime at {:#x}",
            interpreter.path.display(),
            interpreter.runtime
        ),
        "",
    ));
    // Free-threaded or not: the layout's flag (from `_Py_DebugOffsets`), never the name.
    let build = match &mut probe {
        Probe::Walkable(target) => Some(match target.free_threaded_gil() {
            Some(said) => said.to_string(),
            None => "with the GIL".to_string(),
        }),
        _ if interpreter.version < (3, 13) => Some("with the GIL".to_string()),
        // A layout refused: its `free_threaded` word, where its cookie holds.
        _ => crate::runtime::cpython::memory::ProcessMemory::new(pid)
            .read_vec(
                interpreter.runtime,
                crate::runtime::cpython::layout::DEBUG_OFFSETS_SIZE,
            )
            .ok()
            .and_then(|raw| crate::runtime::cpython::layout::stated_free_threaded(&raw))
            .map(|ft| if ft { "free-threaded" } else { "with the GIL" }.to_string()),
    };
    checks.push(python_build(pid, &interpreter, build));
    match &layout {
        Ok(source) => checks.push(check("python_layout", Status::Ok, *source, "")),
        Err(reason) => checks.push(check(
            "python_layout",
            Status::Fail,
            format!("refused: {reason}"),
            "a bpfprof that knows this version is needed for its Python frames",
        )),
    }
    checks.push(match &layout {
        Ok(_) => check(
            "python_frames",
            Status::Ok,
            "Python frames walked in the kernel and shown in place of the eval loop's \
             (--python auto)",
            "",
        ),
        Err(reason) => check(
            "python_frames",
            Status::Warn,
            format!(
                "Python frames not supported by this bpfprof: {reason}; native frames only \
                 (said in the run's summary, by dump and by top)"
            ),
            "",
        ),
    });
    Report { checks }
}

/// The interpreter's build: `build` says free-threaded or not, with its GIL's state now
/// where it was read (from its `_Py_DebugOffsets`' flag: a renamed interpreter is judged by
/// what it is; no build before 3.13 is free-threaded), and whether its object keeps a symbol
/// table or a debug file is installed for it (stripped code is named by function starts, the
/// eval loop's split-off part included).
fn python_build(
    pid: u32,
    interpreter: &crate::runtime::cpython::detect::Interpreter,
    build: Option<String>,
) -> Check {
    use object::Object;
    let mut found = vec![build.unwrap_or_else(|| {
        "free-threaded or not: unknown (its _Py_DebugOffsets cannot be read)".to_string()
    })];
    // The maps name a chrooted process's files as bpfprof sees them (/srv/sid/usr/bin/...),
    // a container's as the container does.
    let opened = crate::process::target_file::open_in_root(pid, &interpreter.path)
        .or_else(|_| crate::process::target_file::open_proc_link(&interpreter.path));
    let symbols = match opened {
        Ok((file, _)) => {
            let cache = object::read::ReadCache::new(&file);
            match object::File::parse(&cache) {
                Ok(elf) if elf.section_by_name(".symtab").is_some() => {
                    "symbol table: yes (not stripped)".to_string()
                }
                Ok(elf) => {
                    let reader = crate::process::target_file::ElfReader::new(
                        file.try_clone().expect("a descriptor"),
                    );
                    let build_id: Option<String> =
                        crate::process::target_file::gnu_build_id(&reader)
                            .map(|id| id.iter().map(|b| format!("{b:02x}")).collect());
                    use std::os::fd::AsRawFd;
                    let by_fd = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
                    let link = elf
                        .gnu_debuglink()
                        .ok()
                        .flatten()
                        .map(|(n, _)| String::from_utf8_lossy(n).into_owned());
                    let root = crate::process::target_file::ProcessRoot::of(pid).ok();
                    match root.and_then(|root| {
                        crate::symbolize::debug_file::DebugSymbols::find(
                            &by_fd,
                            &interpreter.path,
                            &root,
                            build_id.as_deref(),
                        )
                    }) {
                        Some(debug) => format!(
                            "stripped; debug file {} used for its symbols",
                            std::fs::read_link(&debug.path)
                                .unwrap_or(debug.path.clone())
                                .display()
                        ),
                        None => format!(
                            "stripped (exports only{}; no debug file installed): internal \
                             functions are named module+0xSTART",
                            link.map(|l| format!(", .gnu_debuglink {l}"))
                                .unwrap_or_default()
                        ),
                    }
                }
                Err(e) => format!("not read as ELF: {e}"),
            }
        }
        Err(e) => format!("its file cannot be opened: {e}"),
    };
    found.push(symbols);
    check("python_build", Status::Ok, found.join("; "), "")
}

/// Runs every check; `socket` is the daemon socket to try (else `BPFPROF_SOCKET` or the
/// default), `table_cache` the unwind table cache to report on.
pub fn run(socket: Option<&Path>, table_cache: &Path) -> Report {
    let mut checks = vec![
        kernel_version(),
        btf(),
        capabilities(),
        perf_event_paranoid(),
        sysctl_at_least(
            "perf_event_max_sample_rate",
            LOW_SAMPLE_RATE,
            "the kernel lowers this when sampling interrupts take too long; high --frequency \
             values are refused above it (sysctl -w kernel.perf_event_max_sample_rate=100000)",
        ),
        perf_cpu_time_max_percent(),
        sysctl_at_least(
            "perf_event_max_stack",
            DEFAULT_STACK_DEPTH,
            "stacks deeper than this are cut; raise it for deep programs \
             (sysctl -w kernel.perf_event_max_stack=127)",
        ),
        lockdown(),
        unprivileged_bpf(),
        hardware_pmu(),
    ];
    checks.extend(program_load_and_attach());
    checks.extend(helpers());
    checks.push(daemon(socket));
    checks.push(unwind_cache(table_cache));
    Report { checks }
}

/// What the unwind table cache holds: never a failure (without it tables are built).
fn unwind_cache(dir: &Path) -> Check {
    match crate::unwind::cache::usage(dir) {
        Ok((files, bytes)) => check(
            "unwind_cache",
            Status::Ok,
            format!(
                "{files} entries (unwind tables, the kernel's names), {:.1} MiB in {} \
                 (bpfprof doctor --clean empties it)",
                bytes as f64 / (1024.0 * 1024.0),
                dir.display()
            ),
            "",
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => check(
            "unwind_cache",
            Status::Ok,
            format!("empty: {} is made by the first run", dir.display()),
            "",
        ),
        Err(e) => check(
            "unwind_cache",
            Status::Warn,
            format!("{}: {e}", dir.display()),
            "runs build every unwind table again; give --unwind-cache a folder of your own",
        ),
    }
}

fn read_trimmed(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

fn kernel_version() -> Check {
    match read_trimmed("/proc/sys/kernel/osrelease") {
        Some(release) => check("kernel", Status::Ok, release, ""),
        None => check(
            "kernel",
            Status::Warn,
            "/proc/sys/kernel/osrelease unreadable",
            "mount /proc",
        ),
    }
}

fn btf() -> Check {
    if Path::new("/sys/kernel/btf/vmlinux").exists() {
        check("btf", Status::Ok, "/sys/kernel/btf/vmlinux present", "")
    } else {
        check(
            "btf",
            Status::Warn,
            "no /sys/kernel/btf/vmlinux",
            "bpfprof's kernel program reads no kernel structure and loads without BTF; \
             bpftool and bpftrace want it: CONFIG_DEBUG_INFO_BTF=y (every Debian kernel \
             since 11 has it)",
        )
    }
}

/// The effective capability set of this process.
fn effective_capabilities() -> Option<u64> {
    procfs::process::Process::myself()
        .and_then(|p| p.status())
        .ok()
        .map(|s| s.capeff)
}

fn has_capability(effective: u64, name: &str) -> bool {
    CAPABILITIES
        .iter()
        .any(|(n, bit)| *n == name && effective & (1u64 << bit) != 0)
}

fn capabilities() -> Check {
    let Some(effective) = effective_capabilities() else {
        return check(
            "capabilities",
            Status::Fail,
            "/proc/self/status unreadable",
            "mount /proc",
        );
    };
    let held: Vec<&str> = CAPABILITIES
        .iter()
        .filter(|(name, _)| has_capability(effective, name))
        .map(|(name, _)| *name)
        .collect();
    let missing: Vec<&str> = CAPABILITIES
        .iter()
        .filter(|(name, _)| !has_capability(effective, name))
        .map(|(name, _)| *name)
        .collect();
    let found = format!(
        "held: {}; missing: {}",
        if held.is_empty() {
            "none".into()
        } else {
            held.join(" ")
        },
        if missing.is_empty() {
            "none".into()
        } else {
            missing.join(" ")
        },
    );
    let has = |name| has_capability(effective, name);
    if !(has("CAP_SYS_ADMIN") || (has("CAP_BPF") && has("CAP_PERFMON"))) {
        return check(
            "capabilities",
            Status::Fail,
            found,
            "loading the kernel program needs root, or CAP_BPF and CAP_PERFMON: run \
             `sudo bpfprof ...`, or `sudo setcap cap_bpf,cap_perfmon,cap_sys_ptrace+ep bpfprof`; \
             unprivileged users can profile their own processes through the daemon \
             (`bpfprof run --pid ...`)",
        );
    }
    if !(has("CAP_SYS_ADMIN") || has("CAP_SYS_PTRACE")) {
        return check(
            "capabilities",
            Status::Warn,
            found,
            "without CAP_SYS_PTRACE, other users' processes cannot be symbolized \
             (their /proc/PID/map_files is closed)",
        );
    }
    check("capabilities", Status::Ok, found, "")
}

fn privileged() -> bool {
    effective_capabilities()
        .is_some_and(|e| has_capability(e, "CAP_SYS_ADMIN") || has_capability(e, "CAP_PERFMON"))
}

fn perf_event_paranoid() -> Check {
    const NAME: &str = "perf_event_paranoid";
    let Some(value) = read_trimmed("/proc/sys/kernel/perf_event_paranoid") else {
        return check(
            NAME,
            Status::Fail,
            "no /proc/sys/kernel/perf_event_paranoid",
            "this kernel has no perf events (CONFIG_PERF_EVENTS): bpfprof cannot sample here",
        );
    };
    let level: i64 = value.parse().unwrap_or(i64::MAX);
    if level > 1 && !privileged() {
        return check(
            NAME,
            Status::Warn,
            value,
            "per-CPU sampling is closed to processes without CAP_PERFMON at this level: run \
             as root or with CAP_PERFMON (lowering it to -1 also works but opens perf to all users)",
        );
    }
    check(NAME, Status::Ok, value, "")
}

fn sysctl_at_least(name: &'static str, minimum: u64, advice: &str) -> Check {
    let path = format!("/proc/sys/kernel/{name}");
    match read_trimmed(&path).and_then(|v| v.parse::<u64>().ok()) {
        Some(v) if v >= minimum => check(name, Status::Ok, v.to_string(), ""),
        Some(v) => check(name, Status::Warn, format!("{v} (below {minimum})"), advice),
        None => check(
            name,
            Status::Warn,
            format!("{path} unreadable"),
            "this kernel may lack perf events",
        ),
    }
}

fn perf_cpu_time_max_percent() -> Check {
    const NAME: &str = "perf_cpu_time_max_percent";
    match read_trimmed("/proc/sys/kernel/perf_cpu_time_max_percent") {
        // 0 turns the limit off; otherwise the kernel lowers perf_event_max_sample_rate when
        // sample handling takes more than this share of CPU time.
        Some(v) if v == "0" => check(NAME, Status::Ok, "0 (no limit)", ""),
        Some(v) if v.parse::<u64>().is_ok_and(|p| p < 10) => check(
            NAME,
            Status::Warn,
            v,
            "the kernel throttles sampling when interrupts use more than this share of CPU; \
             the default is 25 (sysctl -w kernel.perf_cpu_time_max_percent=25)",
        ),
        Some(v) => check(NAME, Status::Ok, v, ""),
        None => check(
            NAME,
            Status::Warn,
            "unreadable",
            "this kernel may lack perf events",
        ),
    }
}

fn lockdown() -> Check {
    const NAME: &str = "lockdown";
    let Some(modes) = read_trimmed("/sys/kernel/security/lockdown") else {
        return check(
            NAME,
            Status::Ok,
            "no lockdown LSM (or securityfs not mounted)",
            "",
        );
    };
    // The active mode is the one in brackets: "none [integrity] confidentiality".
    let active = modes
        .split_whitespace()
        .find(|m| m.starts_with('['))
        .map(|m| m.trim_matches(|c| c == '[' || c == ']').to_string())
        .unwrap_or(modes);
    match active.as_str() {
        "confidentiality" => check(
            NAME,
            Status::Warn,
            active,
            "confidentiality lockdown forbids BPF programs from reading kernel memory; if the \
             program_load check fails, boot without lockdown=confidentiality (or turn off \
             Secure Boot's lockdown)",
        ),
        _ => check(NAME, Status::Ok, active, ""),
    }
}

fn unprivileged_bpf() -> Check {
    const NAME: &str = "unprivileged_bpf_disabled";
    match read_trimmed("/proc/sys/kernel/unprivileged_bpf_disabled") {
        Some(v) => {
            let meaning = match v.as_str() {
                "0" => "unprivileged BPF allowed",
                "1" => "unprivileged BPF off until reboot",
                "2" => "unprivileged BPF off",
                _ => "unknown setting",
            };
            // bpfprof needs CAP_BPF either way; unprivileged users go through the daemon.
            check(NAME, Status::Ok, format!("{v} ({meaning})"), "")
        }
        None => check(
            NAME,
            Status::Warn,
            "unreadable",
            "this kernel may lack the bpf() syscall (CONFIG_BPF_SYSCALL)",
        ),
    }
}

fn hardware_pmu() -> Check {
    const NAME: &str = "hardware_pmu";
    match crate::kernel::perf_events::probe_cycles() {
        Ok(()) => check(NAME, Status::Ok, "cycles event opens", ""),
        Err(e) if crate::kernel::perf_events::is_missing_event(&e) => check(
            NAME,
            Status::Warn,
            format!("no cycles event ({e})"),
            "no hardware PMU (common in VMs): bpfprof samples with the cpu-clock timer \
             (--event auto does this; --event cycles is refused)",
        ),
        Err(e) => check(
            NAME,
            Status::Warn,
            format!("cannot tell: {e}"),
            "run doctor as root to probe the PMU",
        ),
    }
}

/// Loads the kernel program as a recording does, then attaches it to cpu-clock on every CPU.
fn program_load_and_attach() -> Vec<Check> {
    let mut program = match KernelProgram::load(
        crate::unwind::table_rows_for(Some(std::process::id()), crate::unwind::DEFAULT_TABLE_ROWS),
        crate::unwind::BuildPriority::Foreground,
        // The walker on its own, so that its verification is timed alone (the bench reads it).
        crate::kernel::WalkerLoad::Background,
    ) {
        Ok(p) => p,
        Err(e) => {
            let advice = match &e {
                Error::PermissionDenied(_) => "run as root or with CAP_BPF and CAP_PERFMON",
                _ => {
                    "the verifier or the kernel rejected the program: report it with this \
                      output and the kernel version"
                }
            };
            return vec![
                check("program_load", Status::Fail, e.to_string(), advice),
                check(
                    "program_attach",
                    Status::Fail,
                    "not tried: the program did not load",
                    "fix program_load first",
                ),
            ];
        }
    };
    let load = check(
        "program_load",
        Status::Ok,
        format!("loaded and verified (program id {})", program.program_id()),
        "",
    );
    let walker = match program.wait_walker() {
        Ok(took) => check(
            "walker_load",
            Status::Ok,
            format!(
                "the CFI and Python walker verified in {} ms",
                took.as_millis()
            ),
            "",
        ),
        Err(e) => check(
            "walker_load",
            Status::Fail,
            e,
            "stacks fall back to frame pointers; report it with this output and the kernel \
             version",
        ),
    };
    let request = SamplingRequest {
        event: EventChoice::CpuClock,
        frequency: Some(99),
        ..SamplingRequest::default()
    };
    let attach = match request
        .plan(&KernelLimits::read())
        .and_then(|plan| program.attach(&plan))
    {
        Ok(sampling) => {
            let cpus = aya::util::online_cpus().map(|c| c.len()).unwrap_or(0);
            program.detach();
            check(
                "program_attach",
                Status::Ok,
                format!("attached to {} on {cpus} CPUs", sampling.describe()),
                "",
            )
        }
        Err(e) => check(
            "program_attach",
            Status::Fail,
            e.to_string(),
            "perf events could not carry the program: check perf_event_paranoid and \
             capabilities above",
        ),
    };
    vec![load, walker, attach]
}

fn helpers() -> Vec<Check> {
    REQUIRED_HELPERS
        .iter()
        .map(|helper| match helper.supported() {
            Ok(true) => check(
                helper.check_name,
                Status::Ok,
                "available to perf_event programs",
                "",
            ),
            Ok(false) => check(
                helper.check_name,
                Status::Fail,
                "missing",
                "the sampling program calls it: use Linux 6.1 or newer (the tested kernels)",
            ),
            Err(e) => check(
                helper.check_name,
                Status::Warn,
                format!("cannot probe: {e}"),
                "probing loads a BPF program: run doctor as root",
            ),
        })
        .collect()
}

fn daemon(socket: Option<&Path>) -> Check {
    const NAME: &str = "daemon";
    let path: PathBuf = protocol::socket_path(socket);
    let reached = Client::connect_timeout(Some(&path), DAEMON_TIMEOUT).and_then(|mut c| c.list());
    match reached {
        Ok(runs) => check(
            NAME,
            Status::Ok,
            format!(
                "answers at {} ({} runs visible)",
                path.display(),
                runs.len()
            ),
            "",
        ),
        Err(ClientError::Unavailable { source, .. }) => check(
            NAME,
            Status::Warn,
            format!("nothing answers at {}: {source}", path.display()),
            "only `bpfprof run/status/results` and the libraries need it: start it with \
             `sudo bpfprof daemon` (contrib/bpfprof.service), or set BPFPROF_SOCKET",
        ),
        Err(e) => check(
            NAME,
            Status::Fail,
            format!("{} answers but: {e}", path.display()),
            "the socket is not a working bpfprof daemon of this version: restart the daemon",
        ),
    }
}
