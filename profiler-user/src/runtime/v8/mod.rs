//! V8 in Node.js ([`V8`], registered in [`crate::runtime::RUNTIMES`]): JavaScript frames named
//! `function (file.js:LINE)` in a running `node`, with no flag and no restart.
//!
//! How, after the OpenTelemetry eBPF profiler's `interpreter/nodev8`: V8's generated code
//! keeps a frame pointer chain and has no CFI, so the CFI walk already unwinds it by frame
//! pointer; for a process registered here the kernel (`profiler-ebpf/src/v8.rs`) also tells
//! JavaScript frames apart on that chain and records each one's SharedFunctionInfo, code and
//! bytecode offset with its index in the native stack. Userspace names them:
//! - [`detect`]: the object exporting V8's postmortem constants (`v8dbg_*`: the `node`
//!   binary, or Debian's `libnode.so.N`), and the offsets and type tags read from it;
//! - [`heap`]: a SharedFunctionInfo's name, script and start line, read from the live
//!   process with bounded, type-checked reads;
//! - [`code`]: a frame's Code object: its kind, and the functions optimized code inlined;
//! - [`tracking`]: one followed process (the runtime's [`crate::runtime::Instance`]);
//! - [`merge`]: the named frames put in place of the native frames they were recorded at.
//!
//! Functions are keyed by their SharedFunctionInfo, not by code address: V8's interpreted
//! frames all run in one trampoline, and code that V8 moves, tiers up or frees keeps its
//! function's name.

pub mod code;
pub mod detect;
pub mod heap;
pub mod merge;
mod tracking;

pub use self::tracking::V8Tracking;

/// V8 as a [`crate::runtime::Runtime`].
pub struct V8;

impl crate::runtime::Runtime for V8 {
    fn tag(&self) -> profiler_common::RuntimeTag {
        profiler_common::RuntimeTag::V8
    }

    fn attach(
        &self,
        program: &mut crate::kernel::KernelProgram,
        pid: u32,
        naming: &crate::runtime::Naming,
        _enabled: crate::runtime::Enabled,
        refused: &mut Option<String>,
        mapped: &[procfs::process::MemoryMap],
    ) -> Option<Box<dyn crate::runtime::Instance>> {
        // The executable mappings just read (empty when the caller has none): a process that
        // maps nothing named like Node.js is not Node, and its maps need not be read again.
        if !mapped.is_empty() && !mapped.iter().any(detect::named_like_node) {
            return None;
        }
        let found = match detect::find(pid) {
            Ok(Ok(found)) => found,
            Ok(Err(reason)) => {
                // A process that maps a node binary but cannot be read is refused, in words;
                // one that maps none is not Node.
                if reason.starts_with("V8 in") {
                    let said = format!("JavaScript frames not named: {reason}");
                    if refused.as_ref() != Some(&said) {
                        log::warn!("pid {pid}: {said}");
                        *refused = Some(said);
                    }
                } else {
                    log::debug!("pid {pid}: no V8: {reason}");
                }
                return None;
            }
            Err(e) => {
                log::debug!("pid {pid}: no V8: {e:#}");
                return None;
            }
        };
        let tracking = V8Tracking::start(program, pid, found, naming.shares, naming.owner)?;
        Some(Box::new(tracking))
    }

    fn cut(&self, stack: &[u64], limit: usize) -> (Vec<u64>, bool) {
        // The native stack keeps its leaf-most `limit` frames: so do the JavaScript frames
        // recorded at them.
        let words = profiler_common::V8Frame::WORDS;
        let kept: Vec<u64> = stack
            .chunks_exact(words)
            .filter(|w| (w[0] as u16 as usize) < limit)
            .flatten()
            .copied()
            .collect();
        let cut = kept.len() < stack.len();
        (kept, cut)
    }

    fn view_keep(&self, frames: &[Option<&crate::symbolize::Frame>]) -> Vec<bool> {
        vec![true; frames.len()]
    }
}
