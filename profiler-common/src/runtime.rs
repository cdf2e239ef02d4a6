//! Language runtimes whose frames the kernel walks beside the native stack.

/// A language runtime whose frames the kernel program walks beside the native stack: the tag
/// userspace gives the frames it names from a runtime's stacks (each runtime has its own
/// walker, maps and frame encoding; a process runs one).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RuntimeTag {
    /// CPython 3.10 and later: [`PythonProcess`](crate::PythonProcess) per process, frames packed as [`PythonFrame`](crate::PythonFrame).
    CPython = 1,
}

impl RuntimeTag {
    /// The runtime's name where outputs tag frames by their runtime (trace event categories,
    /// pprof function names without a file).
    pub const fn name(self) -> &'static str {
        match self {
            RuntimeTag::CPython => "python",
        }
    }

    /// The runtime's OpenTelemetry `profile.frame.type`.
    pub const fn otel_frame_type(self) -> &'static str {
        match self {
            RuntimeTag::CPython => "cpython",
        }
    }
}
