//! The daemon's wire protocol (docs/protocol.md): one JSON object per line, shared by the
//! daemon and its clients so both sides agree by construction.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Protocol version spoken by this build.
pub const VERSION: u32 = 1;
/// Default socket path of the daemon.
pub const DEFAULT_SOCKET: &str = "/run/bpfprof/bpfprof.sock";
/// Environment variable that overrides the socket path for every client.
pub const SOCKET_ENV: &str = "BPFPROF_SOCKET";
/// Longest request line accepted, in bytes.
pub const MAX_REQUEST_BYTES: usize = 64 * 1024;
/// Most tags on one run.
pub const MAX_TAGS: usize = 32;
/// The longest run, by default: the daemon's `--max-duration`, the CLI's, a run without a
/// duration, and the longest `results` wait.
pub const MAX_RUN_DURATION: std::time::Duration = std::time::Duration::from_secs(600);
/// [`MAX_RUN_DURATION`] as the command line writes it (its flags' default).
pub const MAX_RUN_DURATION_ARG: &str = "10m";

/// The socket path to use: `explicit`, else `$BPFPROF_SOCKET`, else the default.
pub fn socket_path(explicit: Option<&std::path::Path>) -> std::path::PathBuf {
    explicit
        .map(std::path::Path::to_path_buf)
        .or_else(|| std::env::var_os(SOCKET_ENV).map(Into::into))
        .unwrap_or_else(|| DEFAULT_SOCKET.into())
}

/// A request line.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Request {
    /// Must be [`VERSION`].
    pub version: u32,
    /// What to do.
    #[serde(flatten)]
    pub op: Op,
}

impl Request {
    /// A request for `op` in this build's protocol version.
    pub fn new(op: Op) -> Request {
        Request {
            version: VERSION,
            op,
        }
    }
}

/// The operations.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
// One op is parsed per request and lives while it is answered: the run request's size does
// not matter, and boxing it would change the API every client uses.
#[allow(clippy::large_enum_variant)]
pub enum Op {
    /// Start profiling a process.
    Run(RunRequest),
    /// Where a run stands.
    Status {
        /// The run.
        run_id: u64,
    },
    /// End a run early; its results are still written.
    Stop {
        /// The run.
        run_id: u64,
    },
    /// A run's results, waiting up to `wait_ms` for it to end.
    Results {
        /// The run.
        run_id: u64,
        /// How long to wait for the run to end, in milliseconds.
        #[serde(default)]
        wait_ms: u64,
    },
    /// The caller's runs (a struct variant, so that unknown fields are refused as for every
    /// other op).
    List {},
    /// A chunk of one of an ended run's result files, so an owner can fetch results through
    /// the socket where the state directory is out of reach (a hardened unit, a container).
    Read {
        /// The run.
        run_id: u64,
        /// The result's format name, as in the `files` of a results reply.
        format: String,
        /// Where in the file the chunk starts.
        #[serde(default)]
        offset: u64,
    },
}

/// Largest chunk of a result file one `read` reply carries, before base64.
pub const READ_CHUNK_BYTES: usize = 1 << 20;

/// What a `run` asks for.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunRequest {
    /// Target pid, as seen in `pid_ns`.
    pub pid: u32,
    /// Inode of the target's pid namespace; `None` is the daemon's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid_ns: Option<u64>,
    /// `auto`, `cycles` or `cpu-clock`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<String>,
    /// Period in event units.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample_interval: Option<i64>,
    /// Samples per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frequency: Option<i64>,
    /// Length of the run in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// Bare tags.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sample_tags: Vec<String>,
    /// Key/value tags.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
    /// Deepest stack kept: 1 to 512 (default 127). Frame-pointer user stacks and kernel
    /// stacks stop at the kernel's `perf_event_max_stack` whatever is asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_stack_length: Option<i64>,
    /// Output formats to write (names as `--format` takes them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub formats: Option<Vec<String>>,
    /// Also profile the children the target forks during the run (and theirs).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub follow_children: bool,
    /// How user stacks are walked: `auto`, `fp` or `cfi` (as `--unwind`); `None` is `auto`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unwind: Option<String>,
    /// Python frames of CPython targets: `auto` or `off` (as `--python`); `None` is `auto`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub python: Option<String>,
    /// Most asyncio tasks shown above a sampled task (CPython 3.14+, as `--max-async-depth`);
    /// 0: no async stacks (`--python-async off`); `None`: the default, 64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub python_async: Option<u32>,
    /// What the profile measures: `cpu` or `wall` (as `--mode`); `None` is `cpu`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// Also record where the target's threads block, and for how long (as `--off-cpu`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub off_cpu: bool,
    /// Shortest time off the CPU recorded, in nanoseconds (as `--off-cpu-min`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub off_cpu_min_ns: Option<u64>,
}

/// A run's life-cycle state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum RunState {
    /// Resolving the target and attaching.
    Preparing,
    /// Sampling.
    Running,
    /// Sampling ended; symbolizing and writing results.
    Processing,
    /// Ended at its duration or when its target exited; results written.
    Success,
    /// Ended with an error (see the reason).
    Failed,
    /// Ended by a `stop` request; results written.
    Stopped,
}

impl RunState {
    /// Whether the run has ended for good.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            RunState::Success | RunState::Failed | RunState::Stopped
        )
    }
}

impl std::fmt::Display for RunState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = serde_json::to_value(self)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        f.write_str(&s)
    }
}

/// Error codes of failed replies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// Malformed or invalid request.
    BadRequest,
    /// No such run, or not the caller's.
    NotFound,
    /// The caller may not profile that process.
    PermissionDenied,
    /// The target process does not exist.
    NoSuchProcess,
    /// The concurrent run limit is reached.
    TooManyRuns,
    /// The machine cannot do what was asked (e.g. cycles without a PMU).
    Unsupported,
    /// Anything else.
    Internal,
}

/// The error part of a failed reply.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReplyError {
    /// Machine-readable code.
    pub code: ErrorCode,
    /// A message for people.
    pub message: String,
}

/// A top-functions entry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TopFunction {
    /// Function name.
    pub name: String,
    /// Samples with it at the leaf.
    pub self_samples: u64,
    /// Samples with it on the stack.
    pub total_samples: u64,
}

/// What the daemon knows about a run; also what it persists per run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunInfo {
    /// The run id.
    pub run_id: u64,
    /// Its state.
    pub state: RunState,
    /// Why it failed, if it did.
    #[serde(default)]
    pub reason: Option<String>,
    /// Samples so far (or in the end).
    #[serde(default)]
    pub samples: u64,
    /// Target pid as the request named it.
    pub pid: u32,
    /// Target pid namespace inode.
    pub pid_ns: u64,
    /// Target process name.
    #[serde(default)]
    pub comm: String,
    /// Uid of the client that started the run.
    pub owner_uid: u32,
    /// Bare tags.
    #[serde(default)]
    pub sample_tags: Vec<String>,
    /// Key/value tags.
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
    /// When the run was created, ms since the epoch.
    pub created_unix_ms: u64,
    /// When it ended, ms since the epoch.
    #[serde(default)]
    pub ended_unix_ms: Option<u64>,
    /// Result files by format name.
    #[serde(default)]
    pub files: BTreeMap<String, String>,
    /// Top functions by self samples.
    #[serde(default)]
    pub top: Vec<TopFunction>,
    /// The run's summary JSON.
    #[serde(default)]
    pub summary: Option<serde_json::Value>,
}

/// A reply line.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Reply {
    /// [`VERSION`].
    pub version: u32,
    /// Whether the request succeeded.
    pub ok: bool,
    /// Set when `ok` is false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ReplyError>,
    /// The run a reply is about (run, status, stop, results).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<u64>,
    /// Its state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<RunState>,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Samples so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub samples: Option<u64>,
    /// Result files (results).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files: Option<BTreeMap<String, String>>,
    /// Top functions (results).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top: Option<Vec<TopFunction>>,
    /// Summary JSON (results).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<serde_json::Value>,
    /// Runs (list).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runs: Option<Vec<RunInfo>>,
    /// A chunk of a result file, base64 (read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
    /// The result file's size in bytes (read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
}

impl Reply {
    /// An empty successful reply.
    pub fn ok() -> Reply {
        Reply {
            version: VERSION,
            ok: true,
            error: None,
            run_id: None,
            state: None,
            reason: None,
            samples: None,
            files: None,
            top: None,
            summary: None,
            runs: None,
            data: None,
            size: None,
        }
    }

    /// A failed reply.
    pub fn error(code: ErrorCode, message: impl Into<String>) -> Reply {
        Reply {
            ok: false,
            error: Some(ReplyError {
                code,
                message: message.into(),
            }),
            ..Reply::ok()
        }
    }

    /// A reply describing `run`; with `results`, its files, top functions and summary.
    pub fn for_run(run: &RunInfo, results: bool) -> Reply {
        let ended = run.state.is_final();
        Reply {
            run_id: Some(run.run_id),
            state: Some(run.state),
            reason: run.reason.clone(),
            samples: Some(run.samples),
            files: (results && ended).then(|| run.files.clone()),
            top: (results && ended).then(|| run.top.clone()),
            summary: if results && ended {
                run.summary.clone()
            } else {
                None
            },
            ..Reply::ok()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip_in_the_documented_shape() {
        let line = r#"{"version":1,"op":"run","pid":42,"sample_tags":["a"],"tags":{"k":"v"}}"#;
        let req: Request = serde_json::from_str(line).unwrap();
        match &req.op {
            Op::Run(r) => {
                assert_eq!(r.pid, 42);
                assert_eq!(r.sample_tags, vec!["a"]);
                assert_eq!(r.tags.get("k").map(String::as_str), Some("v"));
            }
            other => panic!("{other:?}"),
        }
        let back: Request = serde_json::from_str(&serde_json::to_string(&req).unwrap()).unwrap();
        assert_eq!(back, req);
        let status: Request =
            serde_json::from_str(r#"{"version":1,"op":"status","run_id":3}"#).unwrap();
        assert_eq!(status.op, Op::Status { run_id: 3 });
        let list: Request = serde_json::from_str(r#"{"version":1,"op":"list"}"#).unwrap();
        assert_eq!(list.op, Op::List {});
    }

    #[test]
    fn malformed_requests_are_rejected() {
        for bad in [
            "",
            "garbage",
            "{}",
            r#"{"version":1}"#,
            r#"{"version":1,"op":"explode"}"#,
            r#"{"version":1,"op":"status"}"#,
            r#"{"version":1,"op":"run","pid":-1}"#,
            r#"{"version":1,"op":"run","pid":1,"evil":true}"#,
        ] {
            assert!(serde_json::from_str::<Request>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn states_are_written_in_capitals() {
        assert_eq!(RunState::Running.to_string(), "RUNNING");
        assert_eq!(
            serde_json::to_string(&RunState::Success).unwrap(),
            "\"SUCCESS\""
        );
    }
}
