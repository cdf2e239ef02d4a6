//! CFI unwinding: tables built from each object's `.eh_frame`, shared across processes, and
//! loaded into the kernel program so that it can walk stacks without frame pointers, and
//! walked in userspace by the same rules for `bpfprof dump` ([`walk`]).

mod builder;
pub mod cache;
mod file_key;
pub mod loader;
pub mod table;
pub mod walk;

pub use builder::BuildPriority;
pub use cache::TableCache;
pub use loader::{FileKey, TableState, Untabled, UnwindMaps};
pub use table::{CfiInputs, CfiSource, UnwindTable};

/// Where the unwind tables of objects seen before are kept between bpfprof processes
/// (`--unwind-cache`; see [`cache`]).
pub const DEFAULT_TABLE_CACHE: &str = "/var/cache/bpfprof/unwind";

/// Most bytes the table cache keeps (least recently used entries go first): the tables of a
/// few PyTorch versions (libtorch_cpu.so's is 20 MiB; a CUDA build's objects about 80 MiB).
pub const TABLE_CACHE_BYTES: u64 = 1 << 30;

/// Opens the table cache that `--unwind-cache` names (a folder, or `off` for none) for a
/// pool's build threads; a cache that cannot be used is logged and the tables are built.
pub fn open_table_cache(arg: &str) -> Option<std::sync::Arc<TableCache>> {
    if arg == "off" {
        return None;
    }
    match TableCache::open(std::path::Path::new(arg), TABLE_CACHE_BYTES) {
        Ok(cache) => Some(std::sync::Arc::new(cache)),
        // The default folder is root's: a user with the BPF capabilities only is told with -v.
        Err(e) if arg == DEFAULT_TABLE_CACHE => {
            log::info!("no unwind table cache: {e:#}; every table is built");
            None
        }
        Err(e) => {
            log::warn!("no unwind table cache: {e:#}; every table is built");
            None
        }
    }
}

/// How long a new process's start waits for its unwind tables with `--unwind auto`: enough
/// for an executable and the usual libraries (libc: 2 ms), not for a 400 MB library
/// (0.5 s), whose frames unwind by frame pointer until its table arrives.
pub const TABLE_WAIT: std::time::Duration = std::time::Duration::from_millis(300);

/// How long it waits with `--unwind cfi`, which promises whole stacks from the first sample.
pub const CFI_TABLE_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// The default cap on the kernel's unwind row array, in MiB (`--unwind-table-mib`): the
/// tables of the objects a PyTorch training step runs in (libtorch_cpu.so alone is 20 MiB)
/// fit, and the kernel preallocates no more than the targets need (see [`table_rows_for`]).
pub const DEFAULT_TABLE_MIB: u32 = 64;

/// The smallest row array a program gets, in MiB: the executable and the usual libraries of
/// most processes, and room for a few libraries loaded later.
const MIN_TABLE_MIB: u32 = 16;

/// Largest unwind table array `--unwind-table-mib` accepts, in MiB: the kernel preallocates it
/// per program, and one object's table must stay within the walk's bisection (4M rows).
pub const MAX_TABLE_MIB: u32 = 256;

const fn mib_to_rows(mib: u32) -> u32 {
    (mib << 20) / std::mem::size_of::<profiler_common::UnwindRow>() as u32
}

/// The cap on a program's unwind table array, in rows, from `--unwind-table-mib` (1 to
/// [`MAX_TABLE_MIB`]).
pub fn table_rows_cap(mib: u32) -> crate::error::Result<u32> {
    if !(1..=MAX_TABLE_MIB).contains(&mib) {
        return Err(crate::error::Error::Usage(format!(
            "--unwind-table-mib {mib}: expected 1 to {MAX_TABLE_MIB}"
        )));
    }
    Ok(mib_to_rows(mib))
}

/// The row cap of the default `--unwind-table-mib`.
pub const DEFAULT_TABLE_ROWS: u32 = mib_to_rows(DEFAULT_TABLE_MIB);

/// Rows for the unwind table array of a program loaded for process `pid`: the tables of every
/// object it maps (estimated from their call frame information's size, a quarter more for
/// libraries loaded later), at least [`MIN_TABLE_MIB`] and at most the cap. The kernel
/// preallocates the array, so a small process does not pay for a large one; a process
/// whose tables exceed the cap (`cap` rows, see [`table_rows_cap`]) gets its sampled objects'
/// tables first. A command not launched yet (`None`, or still bpfprof's own image), whose
/// libraries are unknown, gets the cap.
pub fn table_rows_for(pid: Option<u32>, cap: u32) -> u32 {
    let Some(pid) = pid.filter(|pid| !loader::is_unexeced_child(*pid)) else {
        return cap;
    };
    let estimate = table::estimate_process_rows(pid);
    let wanted = estimate.saturating_add(estimate / 4);
    wanted.clamp(mib_to_rows(MIN_TABLE_MIB).min(cap), cap)
}

/// How user stacks are walked.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    clap::ValueEnum,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
#[repr(u8)]
pub enum UnwindMode {
    /// CFI tables where an object has them, frame pointers for the rest; a target whose
    /// tables cannot be loaded falls back to frame pointers with a warning.
    #[default]
    Auto = 0,
    /// Frame pointers only (the kernel's own walk).
    Fp = 1,
    /// Like auto, but failing to load a target's tables is an error.
    Cfi = 2,
}

impl UnwindMode {
    /// The name `--unwind` and the protocol's `unwind` field take.
    pub fn name(self) -> &'static str {
        match self {
            UnwindMode::Auto => "auto",
            UnwindMode::Fp => "fp",
            UnwindMode::Cfi => "cfi",
        }
    }
}

impl std::str::FromStr for UnwindMode {
    type Err = crate::error::Error;

    fn from_str(s: &str) -> crate::error::Result<UnwindMode> {
        [UnwindMode::Auto, UnwindMode::Fp, UnwindMode::Cfi]
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| {
                crate::error::Error::Usage(format!(
                    "unknown unwind mode {s:?}: expected auto, fp or cfi"
                ))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_by_their_names_and_unknown_ones_are_refused() {
        for mode in [UnwindMode::Auto, UnwindMode::Fp, UnwindMode::Cfi] {
            assert_eq!(mode.name().parse::<UnwindMode>().unwrap(), mode);
            // The protocol's name is the CLI's.
            assert_eq!(
                serde_json::to_value(mode).unwrap(),
                serde_json::json!(mode.name())
            );
        }
        let err = "dwarf".parse::<UnwindMode>().unwrap_err();
        assert!(
            err.to_string().contains("expected auto, fp or cfi"),
            "{err}"
        );
        assert_eq!(
            err.exit_code(),
            crate::error::Error::Usage(String::new()).exit_code()
        );
    }
}
