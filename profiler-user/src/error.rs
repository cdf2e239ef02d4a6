//! Errors a profiling run can end with, each mapped to its own process exit code.

use std::path::PathBuf;

/// Result type of the bpfprof library.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a profiling run could not start or finish.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A `--pid` argument that is not `PID` or `NS:PID`.
    #[error("invalid target {spec:?}: {reason}")]
    InvalidTarget {
        /// The target as given.
        spec: String,
        /// What is wrong with it.
        reason: String,
    },
    /// No process matches the target.
    #[error("no such process: {0}")]
    NoSuchProcess(String),
    /// The command after `--` could not be started.
    #[error("cannot run {program}: {source}")]
    CannotRun {
        /// The command as given.
        program: String,
        /// Why the exec failed.
        source: std::io::Error,
    },
    /// The caller lacks the privileges to load and attach BPF programs.
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    /// Sampling settings that the kernel cannot honour or that make no sense.
    #[error("invalid sampling settings: {0}")]
    InvalidSampling(String),
    /// The requested perf event does not exist on this machine.
    #[error("event not supported: {0}")]
    EventUnsupported(String),
    /// An output request that makes no sense (unknown format, conflicting paths).
    #[error("invalid output: {0}")]
    InvalidOutput(String),
    /// A command line that asks for something this program does not do.
    #[error("{0}")]
    Usage(String),
    /// A sample tag that is malformed.
    #[error("invalid tag: {0}")]
    InvalidTag(String),
    /// An output path that cannot be written.
    #[error("cannot write {path}: {source}")]
    Output {
        /// The path that failed.
        path: PathBuf,
        /// The underlying I/O error.
        source: std::io::Error,
    },
    /// A state, spool or cache folder another user could steer writes in: refused at start.
    #[error("refusing {path}: {reason}")]
    UnsafeDirectory {
        /// The component of its path that is refused.
        path: PathBuf,
        /// Why (its owner, its mode, a link).
        reason: String,
    },
    /// The daemon refused a request.
    #[error("the daemon refused: {message}")]
    Daemon {
        /// Its error code.
        code: crate::protocol::ErrorCode,
        /// Its message.
        message: String,
    },
    /// No daemon answers on the socket.
    #[error("the bpfprof daemon is not available: {0}")]
    DaemonUnavailable(String),
    /// Every run slot or program the profiler may hold is in use.
    #[error("busy: {0}")]
    Busy(String),
    /// The kernel refused to load or attach the program, or a map operation failed.
    #[error("kernel program: {0:#}")]
    Kernel(anyhow::Error),
    /// Anything else, with context.
    #[error(transparent)]
    Other(#[from] anyhow::Error),
}

impl From<bpfprof_client::ClientError> for Error {
    /// A daemon's refusal keeps its code (and so its exit code); an absent daemon says how to
    /// start one.
    fn from(e: bpfprof_client::ClientError) -> Error {
        use bpfprof_client::ClientError;
        match e {
            ClientError::Refused { code, message } => Error::Daemon { code, message },
            e @ ClientError::Unavailable { .. } => Error::DaemonUnavailable(format!(
                "{e} (start it with `sudo bpfprof daemon`, or point --socket/BPFPROF_SOCKET at it)"
            )),
            other => Error::Other(anyhow::Error::from(other)),
        }
    }
}

impl From<crate::trusted_dir::DirError> for Error {
    /// A refused folder has its own exit code; one that cannot be made is an unwritable
    /// output.
    fn from(e: crate::trusted_dir::DirError) -> Error {
        use crate::trusted_dir::DirError;
        match e {
            DirError::Untrusted { path, reason } => Error::UnsafeDirectory { path, reason },
            DirError::Io { path, source } => Error::Output { path, source },
        }
    }
}

/// Process exit codes of the `bpfprof` binary, one per way a run ends.
pub mod exit_code {
    /// The run completed as asked.
    pub const OK: i32 = 0;
    /// An unexpected failure.
    pub const FAILURE: i32 = 1;
    /// Command line usage error (clap's own code).
    pub const USAGE: i32 = 2;
    /// No process matches a target.
    pub const NO_SUCH_PROCESS: i32 = 3;
    /// Not root, or missing CAP_BPF/CAP_PERFMON.
    pub const PERMISSION_DENIED: i32 = 4;
    /// Interval or frequency out of bounds.
    pub const INVALID_SAMPLING: i32 = 5;
    /// An output path cannot be written.
    pub const OUTPUT_UNWRITABLE: i32 = 6;
    /// Every target exited before the requested `--duration` ended; the profile was written.
    pub const TARGET_EXITED: i32 = 7;
    /// The requested event (e.g. `cycles` without a PMU) does not exist here.
    pub const EVENT_UNSUPPORTED: i32 = 8;
    /// The daemon has no such run (or it is not the caller's).
    pub const NO_SUCH_RUN: i32 = 9;
    /// No daemon answers on the socket.
    pub const DAEMON_UNAVAILABLE: i32 = 10;
    /// The daemon's concurrent run limit is reached.
    pub const TOO_MANY_RUNS: i32 = 11;
    /// `bpfprof doctor` found a check that fails.
    pub const DOCTOR_FAILED: i32 = 12;
    /// A state or spool folder (or a folder on its path) belongs to another user, may be
    /// written by others, or is reached through another user's link.
    pub const UNSAFE_DIRECTORY: i32 = 13;
    /// The command after `--` exists but cannot be run (not executable), as shells say.
    pub const COMMAND_NOT_EXECUTABLE: i32 = 126;
    /// The command after `--` was not found, as shells and `time` say.
    pub const COMMAND_NOT_FOUND: i32 = 127;
    /// Interrupted by SIGINT or SIGTERM; the profile was written.
    pub const INTERRUPTED: i32 = 130;
}

impl Error {
    /// The exit code the `bpfprof` binary ends with for this error.
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::InvalidTarget { .. }
            | Error::InvalidOutput(_)
            | Error::InvalidTag(_)
            | Error::Usage(_) => exit_code::USAGE,
            Error::NoSuchProcess(_) => exit_code::NO_SUCH_PROCESS,
            Error::CannotRun { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                exit_code::COMMAND_NOT_FOUND
            }
            Error::CannotRun { .. } => exit_code::COMMAND_NOT_EXECUTABLE,
            Error::PermissionDenied(_) => exit_code::PERMISSION_DENIED,
            Error::InvalidSampling(_) => exit_code::INVALID_SAMPLING,
            Error::EventUnsupported(_) => exit_code::EVENT_UNSUPPORTED,
            Error::Output { .. } => exit_code::OUTPUT_UNWRITABLE,
            Error::UnsafeDirectory { .. } => exit_code::UNSAFE_DIRECTORY,
            Error::DaemonUnavailable(_) => exit_code::DAEMON_UNAVAILABLE,
            Error::Daemon { code, .. } => {
                use crate::protocol::ErrorCode as C;
                match code {
                    C::BadRequest => exit_code::INVALID_SAMPLING,
                    C::NotFound => exit_code::NO_SUCH_RUN,
                    C::PermissionDenied => exit_code::PERMISSION_DENIED,
                    C::NoSuchProcess => exit_code::NO_SUCH_PROCESS,
                    C::TooManyRuns => exit_code::TOO_MANY_RUNS,
                    C::Unsupported => exit_code::EVENT_UNSUPPORTED,
                    C::Internal => exit_code::FAILURE,
                }
            }
            Error::Busy(_) => exit_code::TOO_MANY_RUNS,
            Error::Kernel(_) | Error::Other(_) => exit_code::FAILURE,
        }
    }
}
