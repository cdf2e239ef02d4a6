//! CFI unwinding: tables built from each object's `.eh_frame`, shared across processes, and
//! loaded into the kernel program so that it can walk stacks without frame pointers.

pub mod loader;
pub mod table;

pub use loader::{FileKey, LoadReport, UnwindMaps};
pub use table::{CfiSource, UnwindTable};

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
pub enum UnwindMode {
    /// CFI tables where an object has them, frame pointers for the rest; a target whose
    /// tables cannot be loaded falls back to frame pointers with a warning.
    #[default]
    Auto,
    /// Frame pointers only (the kernel's own walk).
    Fp,
    /// Like auto, but failing to load a target's tables is an error.
    Cfi,
}
