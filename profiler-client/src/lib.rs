//! A blocking client of the `bpfprof daemon` (docs/protocol.md), and the profilers built on it
//! that let a program profile its own work. A crate of its own, so that a program embedding a
//! profiler pulls in no BPF loader, symbolizer or async runtime; `bpfprof::client` and
//! `bpfprof::protocol` re-export it.
//!
//! The client is synchronous on purpose: libraries call it from plain code without bringing
//! up an async runtime. [`Client`] speaks the protocol one request at a time;
//! [`FunctionProfiler`] profiles one closure of the calling process; [`PhaseProfiler`]
//! profiles the named phases of a long program under one session tag.
//!
//! ```no_run
//! use bpfprof_client::{FunctionProfiler, ProfileOptions};
//!
//! let mut profiler = FunctionProfiler::new(ProfileOptions::default());
//! // Profiling failures are logged, never returned, unless `stop_at_error` is set.
//! let value = profiler.profile(|| (0..10_000_000u64).sum::<u64>()).unwrap();
//! if let Some(reply) = profiler.last_result() {
//!     println!("run {:?} ended {:?} with files {:?}", reply.run_id, reply.state, reply.files);
//! }
//! # let _ = value;
//! ```

pub mod function;
pub mod phase;
pub mod protocol;

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::protocol::{ErrorCode, Op, Reply, Request, RunInfo, RunRequest};

pub use function::{FunctionProfiler, ProfileError, ProfileOptions};
pub use phase::{
    parse_switch, PhaseConfig, PhaseProfiler, PhaseRun, PhaseStats, FOLLOW_CHILDREN_ENV,
    MAX_STACK_LENGTH_ENV, UNWIND_ENV,
};

/// How long [`Client::connect`] waits for the daemon to accept the connection.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a request waits for its reply unless told otherwise.
pub const DEFAULT_IO_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest reply line read; a `list` or `results` reply carries summaries, so this is generous,
/// but bounded so a broken peer cannot make the client buffer without end.
const MAX_REPLY_BYTES: u64 = 64 * 1024 * 1024;
/// The protocol's cap on one `results` wait.
const MAX_RESULTS_WAIT: Duration = protocol::MAX_RUN_DURATION;

/// Why a request to the daemon did not get a successful reply.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No daemon could be reached: the socket is missing, refused or did not accept in time.
    #[error("bpfprof daemon unavailable at {}: {source}", path.display())]
    Unavailable {
        /// The socket tried.
        path: PathBuf,
        /// Why connecting failed.
        source: io::Error,
    },
    /// The daemon answered with `ok: false`.
    #[error("bpfprof daemon refused the request ({code:?}): {message}")]
    Refused {
        /// The daemon's error code.
        code: ErrorCode,
        /// The daemon's message.
        message: String,
    },
    /// The daemon's reply did not follow the protocol (or the connection is out of step).
    #[error("bpfprof daemon protocol error: {0}")]
    Protocol(String),
    /// Reading from or writing to the socket failed.
    #[error("I/O error talking to the bpfprof daemon: {0}")]
    Io(#[from] io::Error),
    /// No reply came within the timeout.
    #[error("timed out after {0:?} waiting for the bpfprof daemon")]
    Timeout(Duration),
}

/// One connection to the daemon; requests are answered in order.
#[derive(Debug)]
pub struct Client {
    reader: BufReader<UnixStream>,
    path: PathBuf,
    io_timeout: Duration,
    // After a timeout or a garbled reply, a late reply may still arrive and would be taken as
    // the answer to the next request, so the connection refuses further use.
    out_of_step: bool,
}

impl Client {
    /// Connects to the daemon at `socket`, else `$BPFPROF_SOCKET`, else the default socket.
    pub fn connect(socket: Option<&Path>) -> Result<Client, ClientError> {
        Client::connect_timeout(socket, DEFAULT_CONNECT_TIMEOUT)
    }

    /// Like [`Client::connect`], waiting at most `timeout` for the daemon to accept.
    pub fn connect_timeout(
        socket: Option<&Path>,
        timeout: Duration,
    ) -> Result<Client, ClientError> {
        let path = protocol::socket_path(socket);
        let stream = connect_unix(&path, timeout).map_err(|source| ClientError::Unavailable {
            path: path.clone(),
            source,
        })?;
        Ok(Client {
            reader: BufReader::new(stream),
            path,
            io_timeout: DEFAULT_IO_TIMEOUT,
            out_of_step: false,
        })
    }

    /// The socket this client is connected to.
    pub fn socket_path(&self) -> &Path {
        &self.path
    }

    /// How long requests wait for their reply (a `results` wait comes on top).
    pub fn io_timeout(&self) -> Duration {
        self.io_timeout
    }

    /// Sets how long requests wait for their reply; `run` needs it as long as the daemon may
    /// take to reach `RUNNING`.
    pub fn set_io_timeout(&mut self, timeout: Duration) {
        self.io_timeout = timeout;
    }

    /// Sends `op` and returns the successful reply; `ok: false` becomes [`ClientError::Refused`].
    pub fn request(&mut self, op: Op) -> Result<Reply, ClientError> {
        let timeout = match &op {
            Op::Results { wait_ms, .. } => self
                .io_timeout
                .saturating_add(Duration::from_millis(*wait_ms)),
            _ => self.io_timeout,
        };
        self.exchange(&Request::new(op), timeout)
    }

    /// Starts profiling `request.pid`; the reply comes once the run is `RUNNING`.
    pub fn run(&mut self, request: RunRequest) -> Result<Reply, ClientError> {
        let reply = self.request(Op::Run(request))?;
        require_run(&reply)?;
        Ok(reply)
    }

    /// Where run `run_id` stands.
    pub fn status(&mut self, run_id: u64) -> Result<Reply, ClientError> {
        let reply = self.request(Op::Status { run_id })?;
        require_run(&reply)?;
        Ok(reply)
    }

    /// Ends run `run_id` early; the reply has the state after the stop was taken.
    pub fn stop(&mut self, run_id: u64) -> Result<Reply, ClientError> {
        let reply = self.request(Op::Stop { run_id })?;
        require_run(&reply)?;
        Ok(reply)
    }

    /// Run `run_id`'s results, waiting up to `wait` (capped at 600 s) for it to end; a run
    /// still going when the wait is over comes back with its current state and no files.
    pub fn results(&mut self, run_id: u64, wait: Duration) -> Result<Reply, ClientError> {
        let wait_ms = u64::try_from(wait.min(MAX_RESULTS_WAIT).as_millis()).unwrap_or(u64::MAX);
        let reply = self.request(Op::Results { run_id, wait_ms })?;
        require_run(&reply)?;
        Ok(reply)
    }

    /// The caller's runs (every run for root).
    pub fn list(&mut self) -> Result<Vec<RunInfo>, ClientError> {
        let reply = self.request(Op::List {})?;
        reply
            .runs
            .ok_or_else(|| ClientError::Protocol("list reply without runs".into()))
    }

    /// The whole of result file `format` (a format name of the results' `files`) of run
    /// `run_id`, read through the socket in chunks.
    pub fn read_result(&mut self, run_id: u64, format: &str) -> Result<Vec<u8>, ClientError> {
        use base64::Engine as _;
        let mut bytes = Vec::new();
        loop {
            let reply = self.request(Op::Read {
                run_id,
                format: format.to_string(),
                offset: bytes.len() as u64,
            })?;
            let (Some(data), Some(size)) = (reply.data, reply.size) else {
                return Err(ClientError::Protocol("read reply without data".into()));
            };
            let chunk = base64::engine::general_purpose::STANDARD
                .decode(data)
                .map_err(|e| ClientError::Protocol(format!("read reply: {e}")))?;
            if chunk.is_empty() || bytes.len() as u64 + chunk.len() as u64 >= size {
                bytes.extend_from_slice(&chunk);
                return Ok(bytes);
            }
            bytes.extend_from_slice(&chunk);
        }
    }

    fn exchange(&mut self, request: &Request, timeout: Duration) -> Result<Reply, ClientError> {
        if self.out_of_step {
            return Err(ClientError::Protocol(
                "connection unusable after an earlier failed request".into(),
            ));
        }
        let result = self.exchange_inner(request, timeout);
        if matches!(
            result,
            Err(ClientError::Io(_) | ClientError::Timeout(_) | ClientError::Protocol(_))
        ) {
            self.out_of_step = true;
        }
        result
    }

    fn exchange_inner(
        &mut self,
        request: &Request,
        timeout: Duration,
    ) -> Result<Reply, ClientError> {
        let mut line = serde_json::to_string(request)
            .map_err(|e| ClientError::Protocol(format!("cannot encode request: {e}")))?;
        line.push('\n');
        // A zero timeout means "block forever" to the socket calls, the opposite of what a
        // caller asking for no wait means.
        let timeout = timeout.max(Duration::from_millis(1));
        let stream = self.reader.get_mut();
        stream.set_write_timeout(Some(timeout))?;
        stream.set_read_timeout(Some(timeout))?;
        stream
            .write_all(line.as_bytes())
            .map_err(|e| timeout_or_io(e, timeout))?;

        let mut buf = Vec::new();
        let n = (&mut self.reader)
            .take(MAX_REPLY_BYTES)
            .read_until(b'\n', &mut buf)
            .map_err(|e| timeout_or_io(e, timeout))?;
        if n == 0 {
            // The daemon went away (stopped or crashed) while we waited.
            return Err(ClientError::Unavailable {
                path: self.path.clone(),
                source: io::Error::new(
                    io::ErrorKind::ConnectionAborted,
                    "the daemon closed the connection without replying",
                ),
            });
        }
        if buf.last() != Some(&b'\n') {
            return Err(ClientError::Protocol(if n as u64 >= MAX_REPLY_BYTES {
                format!("reply longer than {MAX_REPLY_BYTES} bytes")
            } else {
                "reply cut short by the daemon closing the connection".into()
            }));
        }
        let reply: Reply = serde_json::from_slice(&buf)
            .map_err(|e| ClientError::Protocol(format!("malformed reply: {e}")))?;
        if reply.version != protocol::VERSION {
            return Err(ClientError::Protocol(format!(
                "daemon speaks protocol version {}, this client {}",
                reply.version,
                protocol::VERSION
            )));
        }
        if !reply.ok {
            return Err(match reply.error {
                Some(e) => ClientError::Refused {
                    code: e.code,
                    message: e.message,
                },
                None => ClientError::Protocol("failed reply without an error".into()),
            });
        }
        Ok(reply)
    }
}

/// Checks that a reply about a run names it and its state, so callers can rely on both.
fn require_run(reply: &Reply) -> Result<(), ClientError> {
    if reply.run_id.is_none() || reply.state.is_none() {
        return Err(ClientError::Protocol(
            "reply about a run without run_id or state".into(),
        ));
    }
    Ok(())
}

fn timeout_or_io(e: io::Error, timeout: Duration) -> ClientError {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => ClientError::Timeout(timeout),
        _ => ClientError::Io(e),
    }
}

/// The calling process as the daemon should find it: its pid and pid namespace inode.
///
/// `getpid()` is the pid in our own namespace (the last `NSpid` entry of /proc/self/status),
/// and sending our namespace's inode lets a daemon in another namespace resolve it.
pub fn self_target() -> (u32, Option<u64>) {
    use std::os::unix::fs::MetadataExt;
    let pid_ns = std::fs::metadata("/proc/self/ns/pid").ok().map(|m| m.ino());
    (std::process::id(), pid_ns)
}

/// Connects to a Unix stream socket, giving up after `timeout`.
///
/// `UnixStream::connect` blocks for as long as the listener's backlog is full, which a hung
/// daemon would make forever; a library must not hang its host that way, so this connects
/// non-blocking (Linux then reports a full backlog as `EAGAIN`) and retries until the deadline.
fn connect_unix(path: &Path, timeout: Duration) -> io::Result<UnixStream> {
    use std::os::unix::ffi::OsStrExt;

    let bytes = path.as_os_str().as_bytes();
    // SAFETY: sockaddr_un is plain old data; all zeroes is a valid (empty) value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    // One byte stays zero as the terminator.
    if bytes.is_empty() || bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "socket path empty, too long or containing NUL",
        ));
    }
    for (dst, src) in addr.sun_path.iter_mut().zip(bytes) {
        *dst = *src as libc::c_char;
    }
    let len =
        (std::mem::offset_of!(libc::sockaddr_un, sun_path) + bytes.len() + 1) as libc::socklen_t;

    // SAFETY: plain socket(2) call; the result is checked before use.
    let fd = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a freshly created descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let deadline = Instant::now() + timeout;
    loop {
        // SAFETY: addr is a valid sockaddr_un and len does not exceed its size.
        let rc = unsafe {
            libc::connect(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_un).cast::<libc::sockaddr>(),
                len,
            )
        };
        if rc == 0 {
            break;
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EINTR) => {}
            Some(libc::EAGAIN) => {
                let now = Instant::now();
                if now >= deadline {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("daemon did not accept within {timeout:?}"),
                    ));
                }
                std::thread::sleep((deadline - now).min(Duration::from_millis(10)));
            }
            _ => return Err(err),
        }
    }
    let stream = UnixStream::from(fd);
    stream.set_nonblocking(false)?;
    Ok(stream)
}

#[cfg(test)]
pub(crate) mod testutil {
    //! A fake daemon for client-logic tests: a Unix listener in a temp dir answering each
    //! request line with whatever the test's handler says.

    use std::io::{BufRead, BufReader, Write};
    use std::os::unix::net::UnixListener;
    use std::path::PathBuf;
    use std::sync::{Arc, Mutex, MutexGuard};

    use crate::protocol::{Op, Reply, Request, RunState};

    /// Serializes the tests that take the process-wide one-run guard, which the test harness's
    /// parallel threads would otherwise contend for.
    pub(crate) fn serial() -> MutexGuard<'static, ()> {
        static LOCK: Mutex<()> = Mutex::new(());
        LOCK.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A running fake daemon.
    pub(crate) struct FakeDaemon {
        _dir: tempfile::TempDir,
        /// Its socket.
        pub(crate) path: PathBuf,
        /// Every request it received, in order.
        pub(crate) requests: Arc<Mutex<Vec<Op>>>,
    }

    impl FakeDaemon {
        /// Starts a daemon whose handler answers each request (None closes the connection).
        pub(crate) fn start(
            handler: impl Fn(&Op) -> Option<Reply> + Send + Sync + 'static,
        ) -> FakeDaemon {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("bpfprof.sock");
            let listener = UnixListener::bind(&path).unwrap();
            let requests = Arc::new(Mutex::new(Vec::new()));
            let handler = Arc::new(handler);
            let seen = requests.clone();
            std::thread::spawn(move || {
                for conn in listener.incoming() {
                    let Ok(conn) = conn else { return };
                    let handler = handler.clone();
                    let seen = seen.clone();
                    std::thread::spawn(move || {
                        let mut writer = conn.try_clone().unwrap();
                        for line in BufReader::new(conn).lines() {
                            let Ok(line) = line else { return };
                            let req: Request = serde_json::from_str(&line).unwrap();
                            seen.lock().unwrap().push(req.op.clone());
                            let Some(reply) = handler(&req.op) else {
                                return;
                            };
                            let mut out = serde_json::to_string(&reply).unwrap();
                            out.push('\n');
                            if writer.write_all(out.as_bytes()).is_err() {
                                return;
                            }
                        }
                    });
                }
            });
            FakeDaemon {
                _dir: dir,
                path,
                requests,
            }
        }

        /// A daemon that starts runs as run 7 and ends them with `end` when stopped.
        pub(crate) fn well_behaved(end: RunState) -> FakeDaemon {
            FakeDaemon::start(move |op| Some(standard_reply(op, end)))
        }

        /// The ops received, in order, by name.
        pub(crate) fn ops(&self) -> Vec<&'static str> {
            self.requests
                .lock()
                .unwrap()
                .iter()
                .map(|op| match op {
                    Op::Run(_) => "run",
                    Op::Status { .. } => "status",
                    Op::Stop { .. } => "stop",
                    Op::Results { .. } => "results",
                    Op::List {} => "list",
                    Op::Read { .. } => "read",
                })
                .collect()
        }
    }

    /// What a daemon that works says to `op`, with `end` as the final state.
    pub(crate) fn standard_reply(op: &Op, end: RunState) -> Reply {
        let run = |state| Reply {
            run_id: Some(7),
            state: Some(state),
            samples: Some(3),
            ..Reply::ok()
        };
        match op {
            Op::Run(_) | Op::Status { .. } => run(RunState::Running),
            Op::Stop { .. } => run(RunState::Processing),
            Op::Results { .. } => Reply {
                files: Some([("svg".to_string(), "/x/7/profile.svg".to_string())].into()),
                reason: (end == RunState::Failed).then(|| "boom".to_string()),
                top: Some(vec![]),
                ..run(end)
            },
            Op::List {} => Reply {
                runs: Some(vec![]),
                ..Reply::ok()
            },
            Op::Read { .. } => Reply {
                data: Some(String::new()),
                size: Some(0),
                ..Reply::ok()
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testutil::*;
    use super::*;
    use crate::protocol::RunState;

    #[test]
    fn client_runs_the_protocol_in_order() {
        let daemon = FakeDaemon::well_behaved(RunState::Stopped);
        let mut c = Client::connect(Some(&daemon.path)).unwrap();
        assert_eq!(c.socket_path(), daemon.path);
        let r = c
            .run(RunRequest {
                pid: 1,
                ..Default::default()
            })
            .unwrap();
        assert_eq!((r.run_id, r.state), (Some(7), Some(RunState::Running)));
        assert_eq!(c.status(7).unwrap().state, Some(RunState::Running));
        assert_eq!(c.stop(7).unwrap().state, Some(RunState::Processing));
        let res = c.results(7, Duration::from_secs(1)).unwrap();
        assert_eq!(res.state, Some(RunState::Stopped));
        assert!(res.files.unwrap().contains_key("svg"));
        assert!(c.list().unwrap().is_empty());
        assert_eq!(daemon.ops(), ["run", "status", "stop", "results", "list"]);
        let requests = daemon.requests.lock().unwrap();
        match &requests[3] {
            Op::Results { wait_ms, .. } => assert_eq!(*wait_ms, 1000),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn missing_socket_is_unavailable() {
        let dir = tempfile::tempdir().unwrap();
        let err = Client::connect(Some(&dir.path().join("nope.sock"))).unwrap_err();
        assert!(matches!(err, ClientError::Unavailable { .. }), "{err}");
    }

    #[test]
    fn refusals_carry_the_daemon_error() {
        let daemon = FakeDaemon::start(|_| Some(Reply::error(ErrorCode::NotFound, "no run 9")));
        let mut c = Client::connect(Some(&daemon.path)).unwrap();
        match c.status(9).unwrap_err() {
            ClientError::Refused { code, message } => {
                assert_eq!(code, ErrorCode::NotFound);
                assert_eq!(message, "no run 9");
            }
            other => panic!("{other}"),
        }
        // A refusal leaves the connection in step.
        assert!(matches!(c.status(9), Err(ClientError::Refused { .. })));
    }

    #[test]
    fn silence_times_out_and_poisons_the_connection() {
        let daemon = FakeDaemon::start(|_| {
            std::thread::sleep(Duration::from_millis(500));
            Some(Reply::ok())
        });
        let mut c = Client::connect(Some(&daemon.path)).unwrap();
        c.set_io_timeout(Duration::from_millis(50));
        assert!(matches!(c.status(1), Err(ClientError::Timeout(_))));
        assert!(matches!(c.status(1), Err(ClientError::Protocol(_))));
    }

    #[test]
    fn a_closed_connection_is_an_absent_daemon_and_garbage_a_protocol_error() {
        // The daemon went away between request and reply (stopped, crashed): callers treat it
        // as they treat a daemon that is not there.
        let daemon = FakeDaemon::start(|_| None);
        let mut c = Client::connect(Some(&daemon.path)).unwrap();
        assert!(matches!(c.list(), Err(ClientError::Unavailable { .. })));

        let daemon = FakeDaemon::start(|_| {
            Some(Reply {
                version: 99,
                ..Reply::ok()
            })
        });
        let mut c = Client::connect(Some(&daemon.path)).unwrap();
        let err = c.list().unwrap_err();
        assert!(err.to_string().contains("version 99"), "{err}");
    }

    #[test]
    fn self_target_is_this_process() {
        let (pid, ns) = self_target();
        assert_eq!(pid, std::process::id());
        assert!(ns.is_some());
    }
}
