//! Language runtimes whose frames the kernel walks beside the native stack.

/// A language runtime whose frames the kernel program walks beside the native stack: the tag
/// userspace gives the frames it names from a runtime's stacks (each runtime has its own
/// walker, maps and frame encoding; a process runs one).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RuntimeTag {
    /// CPython 3.10 and later: [`PythonProcess`](crate::PythonProcess) per process, frames packed as [`PythonFrame`](crate::PythonFrame).
    CPython = 1,
    /// HotSpot (OpenJDK's JVM): [`HotspotProcess`] per process, frames packed as the CFI
    /// walk records them in its code cache ([`HOTSPOT_INTERPRETED`]).
    Hotspot = 2,
    /// V8 in Node.js: [`V8Process`](crate::V8Process) per process, frames packed as
    /// [`V8Frame`](crate::V8Frame).
    V8 = 3,
}

impl RuntimeTag {
    /// The runtime's name where outputs tag frames by their runtime (trace event categories,
    /// pprof function names without a file).
    pub const fn name(self) -> &'static str {
        match self {
            RuntimeTag::CPython => "python",
            RuntimeTag::Hotspot => "java",
            RuntimeTag::V8 => "js",
        }
    }

    /// The runtime's OpenTelemetry `profile.frame.type`.
    pub const fn otel_frame_type(self) -> &'static str {
        match self {
            RuntimeTag::CPython => "cpython",
            RuntimeTag::Hotspot => "jvm",
            RuntimeTag::V8 => "v8js",
        }
    }
}

/// A JVM whose code cache the CFI walk records frames in, by host tgid: every frame whose pc
/// lies in `[code_start, code_end)` is recorded in the sample's runtime stack (innermost
/// first), as its pc, or for an interpreter frame
/// ([`CfaRule::HotspotInterpreter`](crate::CfaRule::HotspotInterpreter)) as the `Method*` it
/// saved, tagged [`HOTSPOT_INTERPRETED`]. The offsets come from the JVM's own `VMStructs`
/// (`frame::interpreter_frame_*_offset`), in bytes from rbp.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct HotspotProcess {
    /// First address of the code cache.
    pub code_start: u64,
    /// One past its last address.
    pub code_end: u64,
    /// Where an interpreter frame keeps its `Method*`, from rbp.
    pub method_at: i64,
    /// Where it keeps its caller's stack pointer (the sender sp), from rbp.
    pub sender_sp_at: i64,
}

/// JVMs the kernel program records code cache frames of at once.
pub const MAX_HOTSPOT_PROCESSES: u32 = 1024;
/// Set on a HotSpot runtime frame that holds an interpreter frame's `Method*` rather than a pc.
pub const HOTSPOT_INTERPRETED: u64 = 1 << 63;
