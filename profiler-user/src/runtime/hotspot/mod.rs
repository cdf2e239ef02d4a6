//! HotSpot (OpenJDK's JVM), bpfprof's second runtime ([`Hotspot`], registered in
//! [`crate::runtime::RUNTIMES`]): Java frames walked through the interpreter and JIT code and
//! named `Class.method`, in a running JVM, with no flag or agent in it.
//!
//! After the OpenTelemetry eBPF profiler's `interpreter/hotspot`, cut to what bpfprof's CFI
//! walk needs: the JVM describes its own structures ([`vmstructs`]); userspace reads its code
//! cache ([`codecache`]) and writes unwind rows for it into the same tables the kernel walks
//! native code with (a compiled frame is `rsp + frame size`, an interpreter frame is walked by
//! rbp, [`profiler_common::CfaRule::HotspotInterpreter`]); the kernel records, beside the
//! native stack, each frame it walked in the code cache: its pc, or an interpreter frame's
//! `Method*` ([`profiler_common::HotspotProcess`]). Userspace names a pc by the compiled
//! method that holds it, and a `Method*` by its class and name ([`names`]), and puts the names
//! in place of the anonymous code's frames ([`frames`]).
//!
//! Code the JIT frees and reuses while the run goes on: each scan of the code cache checks the
//! pcs named so far against the method that holds them now; a pc whose code changed is shown
//! as `[JIT code reused]` (and counted unnamed), never with a name that may be the other
//! method's.

pub mod codecache;
pub mod frames;
pub mod names;
pub mod vmstructs;

/// HotSpot as a [`crate::runtime::Runtime`]: recognised by the `gHotSpotVMStructs` its
/// `libjvm.so` exports, followed by [`frames::JvmTracking`].
pub struct Hotspot;

impl crate::runtime::Runtime for Hotspot {
    fn tag(&self) -> profiler_common::RuntimeTag {
        profiler_common::RuntimeTag::Hotspot
    }

    fn attach(
        &self,
        program: &mut crate::kernel::KernelProgram,
        pid: u32,
        _naming: &crate::runtime::Naming,
        _enabled: crate::runtime::Enabled,
        refused: &mut Option<String>,
        mapped: &[procfs::process::MemoryMap],
    ) -> Option<Box<dyn crate::runtime::Instance>> {
        // The executable mappings just read (empty when the caller has none): a process that
        // maps no libjvm is no JVM, and its maps need not be read again to say so.
        let maps_libjvm = |m: &procfs::process::MemoryMap| {
            matches!(&m.pathname, procfs::process::MMapPath::Path(p)
                if p.file_name().is_some_and(|n| n == "libjvm.so"))
        };
        if !mapped.is_empty() && !mapped.iter().any(maps_libjvm) {
            return None;
        }
        let tracking = frames::JvmTracking::start(program, pid, refused)?;
        Some(Box::new(tracking))
    }

    fn cut(&self, stack: &[u64], limit: usize) -> (Vec<u64>, bool) {
        // Innermost first, as the kernel records it: the leaf-most `limit` stay.
        let kept = stack.len().min(limit);
        (stack[..kept].to_vec(), kept < stack.len())
    }

    fn view_keep(&self, frames: &[Option<&crate::symbolize::Frame>]) -> Vec<bool> {
        vec![true; frames.len()]
    }
}
