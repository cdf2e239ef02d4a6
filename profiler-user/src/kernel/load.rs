//! Loading the kernel program: the embedded object parsed (without the kernel's BTF), its maps
//! created, the sampling and tracepoint programs verified ([`KernelProgram::load`]), with the
//! privileges checked first and each step of the start timed ([`crate::clock::Steps`]).

use std::{collections::HashMap as StdHashMap, ops::DerefMut, os::fd::AsFd};

use anyhow::{anyhow, Context};
use aya::{
    maps::{Array, HashMap, MapData, PerCpuArray, ProgramArray},
    programs::{PerfEvent, Program, ProgramError, ProgramFd, TracePoint},
    EbpfError, EbpfLoader,
};
use profiler_common::{
    EXEC_PROGRAM_NAME, EXIT_PROGRAM_NAME, FORK_PROGRAM_NAMES, PROGRAM_NAME, TIMELINE_MAP,
    WALKER_PROGRAM_NAME,
};

use super::{
    program::{is_permission, kernel_err, KernelProgram, PythonMaps, RuntimeMaps, V8Maps},
    walker::{install_walker, start_walker, verify_walker, Walker, WalkerLoad, WalkerLoaded},
};
use crate::{
    clock::Steps,
    error::{Error, Result},
    kernel::helpers,
};

/// The eBPF object built from `profiler-ebpf` by `cargo xtask build-ebpf`.
static PROGRAM_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("CARGO_MANIFEST_DIR"), "/bpf/profiler.bpf.o"));

/// Hash maps that only userspace inserts into (the kernel program looks them up, and at most
/// changes an element in place): on kernels that allow it they are created with
/// `BPF_F_NO_PREALLOC`, so that creating them zeroes no memory for the entries a run never
/// uses. Their 10 MiB, zeroed at every load, was a share of a launched run's start (the
/// kernel's `htab_map_alloc` -> `clear_page_erms`). The maps the kernel program inserts into
/// from its perf event (a timer here, an NMI with a PMU) or tracepoints stay preallocated:
/// an insertion that must allocate may fail there (for 1 KiB stacks it did, in bursts).
const UNPREALLOCATED_MAPS: [&str; 6] = [
    "UNWIND_PROCESSES",
    "HOTSPOT_PROCESSES",
    "PYTHON_THREADS",
    "PYTHON_PROCESSES",
    "V8_PROCESSES",
    "TARGETS",
];

/// `BPF_F_NO_PREALLOC` (`include/uapi/linux/bpf.h`).
const BPF_F_NO_PREALLOC: u32 = 1;

/// The offset of `map_flags` in a legacy map definition (`struct bpf_map_def`: type, key
/// size, value size, max entries, flags, each a u32), which aya-ebpf writes to `maps`.
const MAP_DEF_FLAGS_OFFSET: usize = 16;

/// The kernel object, 8-byte aligned for the ELF parser.
struct AlignedObject(Vec<u64>, usize);

impl AlignedObject {
    fn as_bytes(&self) -> &[u8] {
        // SAFETY: the vector holds at least `self.1` initialized bytes, and u8 has no
        // alignment or validity requirement.
        unsafe { std::slice::from_raw_parts(self.0.as_ptr().cast::<u8>(), self.1) }
    }
}

/// Whether this kernel lets perf event programs use hash maps that are not preallocated:
/// 6.1 and later (commit 96da3f7d489d, "bpf: Remove tracing program restriction on map
/// types", once hash maps allocated from `bpf_mem_alloc`); earlier ones refuse to verify
/// such a program.
fn allows_unpreallocated_maps() -> bool {
    let Ok(release) = std::fs::read_to_string("/proc/sys/kernel/osrelease") else {
        return false;
    };
    let mut numbers = release
        .trim()
        .split(|c: char| !c.is_ascii_digit())
        .map(|n| n.parse::<u32>().unwrap_or(0));
    let (major, minor) = (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0));
    (major, minor) >= (6, 1)
}

/// The embedded object, with [`UNPREALLOCATED_MAPS`] marked `BPF_F_NO_PREALLOC` where this
/// kernel allows it (see [`allows_unpreallocated_maps`]).
fn object_for_this_kernel() -> AlignedObject {
    object_with_unpreallocated(allows_unpreallocated_maps())
}

/// The embedded object, copied to aligned memory, with [`UNPREALLOCATED_MAPS`] marked
/// `BPF_F_NO_PREALLOC` when `unpreallocated`.
fn object_with_unpreallocated(unpreallocated: bool) -> AlignedObject {
    let len = PROGRAM_OBJECT.len();
    let mut words = vec![0u64; len.div_ceil(8)];
    // SAFETY: the words are initialized and span at least `len` bytes; u8 has no alignment
    // or validity requirement.
    let bytes = unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), len) };
    bytes.copy_from_slice(PROGRAM_OBJECT);
    if unpreallocated {
        for (at, name) in map_flag_offsets(PROGRAM_OBJECT) {
            if UNPREALLOCATED_MAPS.contains(&name.as_str()) {
                let flags = &mut bytes[at..at + 4];
                let old = u32::from_le_bytes([flags[0], flags[1], flags[2], flags[3]]);
                flags.copy_from_slice(&(old | BPF_F_NO_PREALLOC).to_le_bytes());
            }
        }
    }
    AlignedObject(words, len)
}

/// The file offset of each map definition's flags in `object`'s `maps` section, by map name.
fn map_flag_offsets(object: &[u8]) -> Vec<(usize, String)> {
    use object::{Object, ObjectSection, ObjectSymbol};
    let Ok(file) = object::File::parse(object) else {
        return Vec::new();
    };
    let Some(maps) = file.section_by_name("maps") else {
        return Vec::new();
    };
    let Some((section_start, section_len)) = maps.file_range() else {
        return Vec::new();
    };
    file.symbols()
        .filter(|sym| sym.section_index() == Some(maps.index()))
        .filter_map(|sym| {
            let within = sym.address().checked_sub(maps.address())?;
            let end = within.checked_add(MAP_DEF_FLAGS_OFFSET as u64 + 4)?;
            (end <= section_len && sym.size() >= end - within).then(|| {
                let at = (section_start + within) as usize + MAP_DEF_FLAGS_OFFSET;
                Some((at, sym.name().ok()?.to_string()))
            })?
        })
        .collect()
}

impl KernelProgram {
    /// Loads the program and creates its maps, with an unwind row array of `table_rows` rows
    /// ([`crate::unwind::table_rows_for`]) filled by builds at `build_priority`, the walker
    /// verified as `walker_load` says; nothing is sampled until [`Self::attach`].
    pub fn load(
        table_rows: u32,
        build_priority: crate::unwind::BuildPriority,
        walker_load: WalkerLoad,
    ) -> Result<KernelProgram> {
        check_privileges()?;
        let mut steps = Steps::start("load");
        let mut loader = loader_without_kernel_btf();
        steps.done("aya's loader made");
        // The program reads no kernel structure, so it needs no BTF relocations; `Ebpf::load`
        // would parse the kernel's BTF once more to do them.
        let mut ebpf = loader
            .btf(None)
            .map_max_entries("UNWIND_ROWS", table_rows.max(1))
            .load(object_for_this_kernel().as_bytes())
            .map_err(|e| match &e {
                EbpfError::MapError(aya::maps::MapError::CreateError { io_error, .. })
                    if is_permission(io_error) =>
                {
                    Error::PermissionDenied(format!("the kernel refused to create BPF maps: {e}"))
                }
                _ => Error::Kernel(anyhow!(e).context("loading the eBPF object")),
            })?;
        steps.done("object parsed and maps created");
        // With `WalkerLoad::WithSampling` the walker verifies on a second thread meanwhile
        // (the kernel verifies programs of one object in parallel), and the load returns with
        // both: a run that waits for the walker anyway waits the longer of the two, not the sum.
        let (verified, walker_verified) = {
            let mut programs: StdHashMap<&str, &mut Program> = ebpf.programs_mut().collect();
            let walker_program = match walker_load {
                WalkerLoad::WithSampling => programs.remove(WALKER_PROGRAM_NAME),
                WalkerLoad::Background => None,
            };
            std::thread::scope(|scope| {
                let walker = walker_program.map(|p| scope.spawn(move || verify_walker(Some(p))));
                let verified = verify_sampling(&mut programs, &mut steps);
                let walker = walker.map(|thread| {
                    thread
                        .join()
                        .unwrap_or_else(|_| Err("the walker thread panicked".into()))
                });
                (verified, walker)
            })
        };
        let SamplingPrograms {
            sample_fd,
            program_id,
            fork_fds,
            exit_fd,
            exec_fd,
        } = verified?;

        let mut take = |name: &str| {
            ebpf.take_map(name)
                .ok_or_else(|| Error::Kernel(anyhow!("the eBPF object has no map {name}")))
        };
        let namespaces = Array::try_from(take("PID_NAMESPACES")?).map_err(kernel_err)?;
        let targets = HashMap::try_from(take("TARGETS")?).map_err(kernel_err)?;
        let samples = HashMap::try_from(take("SAMPLES")?).map_err(kernel_err)?;
        let stacks = HashMap::try_from(take("STACKS")?).map_err(kernel_err)?;
        let counters = PerCpuArray::try_from(take("COUNTERS")?).map_err(kernel_err)?;
        let followed = HashMap::try_from(take("FOLLOWED")?).map_err(kernel_err)?;
        let execed = HashMap::try_from(take("EXECED")?).map_err(kernel_err)?;
        let config_map = take("CONFIG")?;
        // A second handle on the same array for the runs' deadline threads, which write
        // `Config::StoppedRuns` without the program (see `RunStopper`).
        let stopped_runs = match &config_map {
            aya::maps::Map::Array(data) => data
                .fd()
                .as_fd()
                .try_clone_to_owned()
                .map_err(|e| kernel_err(anyhow!(e)))
                .and_then(|fd| MapData::from_fd(fd).map_err(kernel_err))
                .and_then(|data| {
                    Array::try_from(aya::maps::Map::Array(data)).map_err(kernel_err)
                })?,
            _ => return Err(kernel_err(anyhow!("CONFIG is not an array"))),
        };
        let config = Array::try_from(config_map).map_err(kernel_err)?;
        let new_processes =
            aya::maps::RingBuf::try_from(take("NEW_PROCESSES")?).map_err(kernel_err)?;
        let system_seen = HashMap::try_from(take("SYSTEM_SEEN")?).map_err(kernel_err)?;
        let timeline_map = match take(TIMELINE_MAP)? {
            aya::maps::Map::RingBuf(map) => map,
            _ => return Err(kernel_err(anyhow!("{TIMELINE_MAP} is not a ring buffer"))),
        };
        let off_cpu_pending = HashMap::try_from(take("OFF_CPU_PENDING")?).map_err(kernel_err)?;
        let wait_scan =
            HashMap::try_from(take(profiler_common::WAIT_SCAN_MAP)?).map_err(kernel_err)?;
        let unwind = crate::unwind::UnwindMaps::new(
            take("UNWIND_ROWS")?,
            take("UNWIND_PROCESSES")?,
            crate::unwind::UnwindMode::default(),
            build_priority,
        )
        .map_err(kernel_err)?;
        let runtimes = RuntimeMaps {
            cpython: PythonMaps {
                processes: HashMap::try_from(take("PYTHON_PROCESSES")?).map_err(kernel_err)?,
                threads: HashMap::try_from(take("PYTHON_THREADS")?).map_err(kernel_err)?,
            },
            hotspot: HashMap::try_from(take("HOTSPOT_PROCESSES")?).map_err(kernel_err)?,
            v8: V8Maps {
                processes: HashMap::try_from(take("V8_PROCESSES")?).map_err(kernel_err)?,
            },
        };
        let mut walkers = ProgramArray::try_from(take("WALKERS")?).map_err(kernel_err)?;
        let walker = match walker_verified {
            None => Walker::Loading(start_walker(ebpf, walkers)),
            Some(verified) => {
                let outcome = verified.and_then(|took| {
                    install_walker(&ebpf, &mut walkers)?;
                    log::info!(
                        "walker program (CFI, Python) verified in {} ms, with the sampling program",
                        took.as_millis()
                    );
                    Ok(took)
                });
                if let Err(e) = &outcome {
                    log::warn!(
                        "the CFI and Python walker did not load ({e}): user stacks use frame \
                         pointers and Python frames are not read"
                    );
                }
                Walker::Done(Box::new(WalkerLoaded {
                    ebpf,
                    _walkers: outcome.is_ok().then_some(walkers),
                    outcome,
                    off_cpu: None,
                }))
            }
        };
        Ok(KernelProgram {
            sample_fd,
            fork_fds,
            exit_fd,
            tracepoints: Vec::new(),
            exec_fd,
            exec_tracepoint: None,
            stop_at_exec_runs: 0,
            execed,
            new_processes,
            system_seen,
            timeline_map,
            timeline: None,
            timeline_runs: 0,
            timeline_times: StdHashMap::new(),
            walker,
            events: None,
            sampling: None,
            program_id,
            namespaces,
            namespace_slots: StdHashMap::new(),
            targets,
            followed,
            config,
            following_runs: 0,
            samples,
            off_cpu_fd: None,
            off_cpu_program_id: 0,
            off_cpu_stats_at_attach: None,
            off_cpu_error: None,
            off_cpu_tracepoint: None,
            off_cpu_runs: 0,
            off_cpu_pending,
            wait_scan,
            wait_scan_setup: None,
            targets_added_ns: StdHashMap::new(),
            waits_counted_at_end: StdHashMap::new(),
            off_cpu_attached: None,
            stopped_runs: std::sync::Arc::new(std::sync::Mutex::new(stopped_runs)),
            awaiting_exec: None,
            stacks,
            offloaded_stacks: StdHashMap::new(),
            fresh_frames: std::collections::HashSet::new(),
            offloaded_samples: Vec::new(),
            samples_at_last_move: 0,
            samples_at_last_offload: 0,
            last_offload: (std::time::Instant::now(), 0),
            counters,
            stats_at_attach: None,
            stats_fd: None,
            unwind,
            runtimes,
        })
    }
}

/// The sampling and tracepoint programs, verified.
struct SamplingPrograms {
    sample_fd: ProgramFd,
    program_id: u32,
    fork_fds: Vec<ProgramFd>,
    exit_fd: ProgramFd,
    exec_fd: ProgramFd,
}

/// Verifies the sampling program and the tracepoint programs among `programs`.
fn verify_sampling(
    programs: &mut StdHashMap<&str, &mut Program>,
    steps: &mut Steps,
) -> Result<SamplingPrograms> {
    let program: &mut PerfEvent = programs
        .get_mut(PROGRAM_NAME)
        .ok_or_else(|| Error::Kernel(anyhow!("the eBPF object has no {PROGRAM_NAME}")))?
        .deref_mut()
        .try_into()
        .map_err(|e: ProgramError| Error::Kernel(e.into()))?;
    program
        .load()
        .map_err(|e| load_error(e, "the sampling program"))?;
    let program_id = program.info().map_err(|e| Error::Kernel(e.into()))?.id();
    let sample_fd = clone_fd(program.fd())?;
    steps.done("sampling program verified");
    log::info!("loaded program id {program_id}");
    // The tracepoint programs are small: verified now, so that attaching them later needs
    // only their fds.
    let mut tracepoint_fd = |name: &str| -> Result<ProgramFd> {
        let tp: &mut TracePoint = programs
            .get_mut(name)
            .ok_or_else(|| kernel_err(anyhow!("the eBPF object has no {name}")))?
            .deref_mut()
            .try_into()
            .map_err(|e: ProgramError| kernel_err(e))?;
        tp.load()
            .map_err(|e| kernel_err(anyhow!(e).context(format!("verifying {name}"))))?;
        clone_fd(tp.fd())
    };
    let fork_fds = FORK_PROGRAM_NAMES
        .iter()
        .map(|name| tracepoint_fd(name))
        .collect::<Result<Vec<_>>>()?;
    let exit_fd = tracepoint_fd(EXIT_PROGRAM_NAME)?;
    let exec_fd = tracepoint_fd(EXEC_PROGRAM_NAME)?;
    steps.done("tracepoint programs verified");
    Ok(SamplingPrograms {
        sample_fd,
        program_id,
        fork_fds,
        exit_fd,
        exec_fd,
    })
}

/// A program that failed to load, as the error a person can act on: permission, a helper this
/// kernel lacks (probed, not guessed from the version), or the verifier's own message.
pub(super) fn load_error(e: ProgramError, what: &str) -> Error {
    match &e {
        ProgramError::SyscallError(s) if is_permission(&s.io_error) => {
            Error::PermissionDenied(format!("the kernel refused to load {what}: {e}"))
        }
        _ => {
            let missing = helpers::missing_helpers();
            if missing.is_empty() {
                Error::Kernel(anyhow!(e).context(format!("verifying {what}")))
            } else {
                Error::EventUnsupported(format!(
                    "this kernel lacks what {what} needs: {}; bpfprof supports Linux 6.1 and \
                     later (`bpfprof doctor` checks a machine)",
                    missing.join(", ")
                ))
            }
        }
    }
}

/// Our own copy of a loaded program's fd, usable without the object.
pub(super) fn clone_fd(fd: std::result::Result<&ProgramFd, ProgramError>) -> Result<ProgramFd> {
    fd.map_err(kernel_err)?
        .try_clone()
        .map_err(|e| kernel_err(anyhow!(e).context("duplicating a program fd")))
}

/// An aya loader that did not read the kernel's BTF: aya 0.14's `EbpfLoader::new()` parses
/// `/sys/kernel/btf/vmlinux` (6 MB) whatever the caller then passes to `btf()`, and the profiler
/// needs no BTF relocation. That parse was 14 ms of CPU per run before the first sample and,
/// at about 9 MiB of heap, the peak RSS of a small profile. The constructor runs on a thread of
/// its own under a seccomp filter that fails its `open` calls with `ENOENT`, which the
/// constructor takes as "no kernel BTF" (as on a kernel built without it); the filter dies with
/// the thread. Where the filter cannot be installed (a seccomp policy that forbids it), the
/// loader is made as aya makes it and the parse is paid.
fn loader_without_kernel_btf() -> EbpfLoader<'static> {
    std::thread::Builder::new()
        .name("bpfprof-loader".into())
        .spawn(|| {
            if let Err(e) = refuse_opens_on_this_thread() {
                log::debug!("the kernel's BTF is parsed for aya's loader: {e}");
            }
            EbpfLoader::new()
        })
        .ok()
        .and_then(|thread| thread.join().ok())
        .unwrap_or_else(EbpfLoader::new)
}

/// Makes every `open`, `openat` and `openat2` of the calling thread (only) fail with `ENOENT`
/// from now on, until it exits.
fn refuse_opens_on_this_thread() -> std::result::Result<(), seccompiler::Error> {
    use seccompiler::{BpfProgram, SeccompAction, SeccompFilter, TargetArch};
    #[cfg(target_arch = "x86_64")]
    let calls = [libc::SYS_open, libc::SYS_openat, libc::SYS_openat2];
    #[cfg(not(target_arch = "x86_64"))]
    let calls = [libc::SYS_openat, libc::SYS_openat2];
    let arch = TargetArch::try_from(std::env::consts::ARCH)?;
    let filter = SeccompFilter::new(
        calls.iter().map(|&call| (call, Vec::new())).collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOENT as u32),
        arch,
    )?;
    let program = BpfProgram::try_from(filter)?;
    seccompiler::apply_filter(&program)
}

/// Fails early, with a message a person can act on, when the process cannot use BPF.
pub fn check_privileges() -> Result<()> {
    const CAP_SYS_ADMIN: u32 = 21;
    const CAP_PERFMON: u32 = 38;
    const CAP_BPF: u32 = 39;
    let status = procfs::process::Process::myself()
        .and_then(|p| p.status())
        .context("reading /proc/self/status")?;
    let effective = status.capeff;
    let has = |cap: u32| effective & (1u64 << cap) != 0;
    if has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON)) {
        return Ok(());
    }
    Err(Error::PermissionDenied(
        "bpfprof needs root, or the CAP_BPF and CAP_PERFMON capabilities, to load its kernel \
         program (try: sudo bpfprof ...)"
            .into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The flags of map `name` in `object`.
    fn flags_of(object: &[u8], name: &str) -> u32 {
        let (at, _) = map_flag_offsets(object)
            .into_iter()
            .find(|(_, n)| n == name)
            .unwrap_or_else(|| panic!("no map {name} in the object"));
        u32::from_le_bytes(object[at..at + 4].try_into().unwrap())
    }

    /// Only the maps userspace alone inserts into lose their preallocation, and only when
    /// asked; every other map keeps its flags.
    #[test]
    fn only_userspace_filled_maps_are_unpreallocated() {
        let names: Vec<String> = map_flag_offsets(PROGRAM_OBJECT)
            .into_iter()
            .map(|(_, n)| n)
            .collect();
        for name in UNPREALLOCATED_MAPS
            .iter()
            .chain(&["SAMPLES", "STACKS", "FOLLOWED"])
        {
            assert!(
                names.iter().any(|n| n == name),
                "{name} not found in {names:?}"
            );
        }
        let patched = object_with_unpreallocated(true);
        let plain = object_with_unpreallocated(false);
        assert_eq!(plain.as_bytes(), PROGRAM_OBJECT);
        for name in &names {
            let before = flags_of(PROGRAM_OBJECT, name);
            let after = flags_of(patched.as_bytes(), name);
            if UNPREALLOCATED_MAPS.contains(&name.as_str()) {
                assert_eq!(after, before | BPF_F_NO_PREALLOC, "{name}");
            } else {
                assert_eq!(after, before, "{name}");
            }
        }
        assert_eq!(patched.as_bytes().as_ptr() as usize % 8, 0);
    }

    /// The loader is made without reading the kernel's BTF, and the filter that keeps it from
    /// reading it stays on the loader's thread.
    #[test]
    fn loader_skips_the_kernel_btf_and_only_its_thread_is_filtered() {
        if !std::path::Path::new("/sys/kernel/btf/vmlinux").exists() {
            eprintln!("skipped: this kernel has no BTF to skip");
            return;
        }
        let loader = loader_without_kernel_btf();
        // aya's loader shows its fields only through Debug; BTF is the first.
        let shown = format!("{loader:?}");
        assert!(
            shown.starts_with("EbpfLoader { btf: None,"),
            "the loader holds the kernel's BTF: {}",
            &shown[..shown.len().min(200)]
        );
        // The calling thread, and a new one, still open files.
        std::fs::read("/sys/kernel/btf/vmlinux").expect("this thread opens files");
        std::thread::spawn(|| std::fs::read("/proc/self/status").expect("another thread opens"))
            .join()
            .expect("the thread ran");
    }
}
