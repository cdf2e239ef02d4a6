//! Exit codes of the bpfprof CLI (its contract).

/// The run finished.
pub const OK: i32 = 0;
/// The command line was wrong.
pub const USAGE: i32 = 2;
/// No such process.
pub const NO_SUCH_TARGET: i32 = 3;
/// Not root, and without CAP_BPF and CAP_PERFMON.
pub const PERMISSION_DENIED: i32 = 4;
/// The sampling settings were invalid.
pub const INVALID_SAMPLING: i32 = 5;
/// An output could not be written (checked before sampling).
pub const OUTPUT_NOT_WRITABLE: i32 = 6;
/// The target exited before the `--duration` asked for ended (the profile is written).
pub const TARGET_EXITED_EARLY: i32 = 7;
/// The event is not supported on this machine.
pub const EVENT_NOT_SUPPORTED: i32 = 8;
/// A state, spool or cache folder (or one on its path) that another user could steer writes
/// in: refused at start.
pub const UNSAFE_DIRECTORY: i32 = 13;
/// The command after `--` exists but is not executable (as shells say).
pub const COMMAND_NOT_EXECUTABLE: i32 = 126;
/// The command after `--` was not found (as shells and `time` say).
pub const COMMAND_NOT_FOUND: i32 = 127;
/// Ctrl-C or SIGTERM ended the run (the profile is written).
pub const INTERRUPTED: i32 = 130;
