//! Plain `#[repr(C)]` types shared by the bpfprof kernel program and its userspace.
//!
//! Everything that crosses the kernel/user boundary is defined here once, so both sides
//! agree on layout by construction. Field order keeps every struct free of implicit padding:
//! BPF hash maps compare keys byte by byte, and padding bytes would make equal keys differ.
#![no_std]

// One module per concern; everything is re-exported at the root, where both sides use it.
mod counters;
mod programs;
mod python;
mod runtime;
mod samples;
mod targets;
mod timeline;
mod unwind;
mod v8;
mod waits;

pub use counters::*;
pub use programs::*;
pub use python::*;
pub use runtime::*;
pub use samples::*;
pub use targets::*;
pub use timeline::*;
pub use unwind::*;
pub use v8::*;
pub use waits::*;

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all of these are #[repr(C)] with integer fields only and no padding.
    unsafe impl aya::Pod for super::PidNamespace {}
    unsafe impl aya::Pod for super::TargetKey {}
    unsafe impl aya::Pod for super::TargetInfo {}
    unsafe impl aya::Pod for super::SampleKey {}
    unsafe impl aya::Pod for super::SampleValue {}
    unsafe impl aya::Pod for super::OffCpuPending {}
    unsafe impl aya::Pod for super::WaitScan {}
    unsafe impl aya::Pod for super::TimelineRecord {}
    unsafe impl aya::Pod for super::StackFrames {}
    unsafe impl aya::Pod for super::UnwindRow {}
    unsafe impl aya::Pod for super::HotspotProcess {}
    unsafe impl aya::Pod for super::ProcessMappings {}
    unsafe impl aya::Pod for super::PythonProcess {}
    unsafe impl aya::Pod for super::PythonThread {}
    unsafe impl aya::Pod for super::V8Process {}
}
