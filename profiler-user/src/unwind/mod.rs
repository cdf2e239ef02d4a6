//! CFI unwinding: tables built from each object's `.eh_frame`, shared across processes, and
//! loaded into the kernel program so that it can walk stacks without frame pointers.

pub mod table;

pub use table::{CfiSource, UnwindTable};
