//! CFI unwinding: tables built from each object's `.eh_frame`, shared across processes, and
//! loaded into the kernel program so that it can walk stacks without frame pointers.

pub mod loader;
pub mod table;

pub use loader::{prebuild, would_track, FileKey, LoadReport, Prebuilt, UnwindMaps};
pub use table::{CfiSource, UnwindTable};

/// The mode [`UnwindMaps`] start with: `--unwind` for the CLI (set before the program
/// loads, so no table is built for a target that `fp` leaves to frame pointers); the daemon
/// keeps the default.
static DEFAULT_MODE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Sets the mode kernel programs loaded from now on start with.
pub fn set_default_mode(mode: UnwindMode) {
    DEFAULT_MODE.store(mode as u8, std::sync::atomic::Ordering::Relaxed);
}

/// The mode kernel programs loaded now start with.
pub fn default_mode() -> UnwindMode {
    match DEFAULT_MODE.load(std::sync::atomic::Ordering::Relaxed) {
        1 => UnwindMode::Fp,
        2 => UnwindMode::Cfi,
        _ => UnwindMode::Auto,
    }
}

/// Rows of the kernel's unwind table array for programs loaded from now on (8 bytes each).
static TABLE_ROWS: std::sync::atomic::AtomicU32 =
    std::sync::atomic::AtomicU32::new(profiler_common::MAX_UNWIND_ROWS);

/// Largest unwind table array `--unwind-table-mib` accepts, in MiB: the kernel preallocates it
/// per program, and one object's table must stay within the walk's bisection (4M rows).
pub const MAX_TABLE_MIB: u32 = 256;

/// Sets the size of the unwind table array of programs loaded from now on, in MiB (1 to
/// [`MAX_TABLE_MIB`]); `--unwind-table-mib` for the CLI and the daemon.
pub fn set_table_mib(mib: u32) -> crate::error::Result<()> {
    if !(1..=MAX_TABLE_MIB).contains(&mib) {
        return Err(crate::error::Error::Usage(format!(
            "--unwind-table-mib {mib}: expected 1 to {MAX_TABLE_MIB}"
        )));
    }
    let rows = (mib << 20) / std::mem::size_of::<profiler_common::UnwindRow>() as u32;
    TABLE_ROWS.store(rows, std::sync::atomic::Ordering::Relaxed);
    Ok(())
}

/// Rows of the unwind table array of programs loaded now.
pub fn table_rows() -> u32 {
    TABLE_ROWS.load(std::sync::atomic::Ordering::Relaxed)
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
