//! `bpfprof daemon`: a root service on a Unix socket that runs tagged profiling runs for
//! libraries and tools (docs/protocol.md). Connections are served concurrently; a malformed or
//! hostile request gets an error reply and never disturbs other clients.

pub mod runs;
pub mod store;

use std::{
    os::unix::fs::{DirBuilderExt, PermissionsExt},
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use anyhow::{bail, Context};
use futures_util::{SinkExt, StreamExt};
use tokio::{
    net::{UnixListener, UnixStream},
    signal::unix::{signal, SignalKind},
};
use tokio_util::codec::{Framed, LinesCodec, LinesCodecError};

use crate::{
    error::Result,
    protocol::{ErrorCode, Op, Reply, Request, MAX_REQUEST_BYTES, VERSION},
    trusted_dir::{DirError, TrustedDir},
};
use runs::{Limits, Peer, Runs};
use store::Store;

/// Most connections one non-root user may hold open at once.
const MAX_CONNECTIONS_PER_USER: usize = 64;
/// How long the accept loop pauses when the daemon is out of file descriptors, so that it
/// waits for connections to close instead of spinning.
const EMFILE_BACKOFF: Duration = Duration::from_millis(100);
/// The accept error is logged at most this often.
const ACCEPT_LOG_INTERVAL: Duration = Duration::from_secs(10);
/// Allocations from this size on get pages of their own, given back when freed. glibc's
/// default threshold grows up to the largest block freed (32 MiB at most), and with it the
/// free memory each thread's arena keeps on top of its heap (twice that): reading the memory
/// map of a process with 60,000 mappings frees 9 MB blocks on any of the daemon's blocking
/// threads, and each of their arenas then kept 8-19 MB (the daemon profiling it: 190-220 MB
/// of RSS, 58-60 MB with this fixed threshold).
const MMAP_THRESHOLD: libc::c_int = 1 << 20;

/// Open connections by user, with a cap per user and one in total, so that no client can
/// take the file descriptors that runs need.
struct Connections {
    by_uid: std::sync::Mutex<std::collections::HashMap<u32, usize>>,
    max_total: usize,
}

/// A counted connection; dropping it gives the slot back.
struct ConnectionSlot {
    connections: Arc<Connections>,
    uid: u32,
}

impl Connections {
    fn new(max_total: usize) -> Arc<Connections> {
        Arc::new(Connections {
            by_uid: Default::default(),
            max_total,
        })
    }

    /// Takes a slot for `uid`, or says why not.
    fn admit(self: &Arc<Self>, uid: u32) -> Result<ConnectionSlot, String> {
        let mut by_uid = self.by_uid.lock().unwrap_or_else(|p| p.into_inner());
        let total: usize = by_uid.values().sum();
        let own = by_uid.get(&uid).copied().unwrap_or(0);
        if uid != 0 && own >= MAX_CONNECTIONS_PER_USER {
            return Err(format!(
                "you have {own} connections open, the most one user may; close some"
            ));
        }
        if total >= self.max_total && uid != 0 {
            return Err("the daemon has as many connections as it may; try again".into());
        }
        *by_uid.entry(uid).or_default() += 1;
        Ok(ConnectionSlot {
            connections: self.clone(),
            uid,
        })
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        let mut by_uid = self
            .connections
            .by_uid
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(n) = by_uid.get_mut(&self.uid) {
            *n -= 1;
            if *n == 0 {
                by_uid.remove(&self.uid);
            }
        }
    }
}

/// Raises the soft limit on open files to the hard limit and returns it: each connection and
/// each attached program (one perf event per CPU, its maps) takes descriptors.
fn raise_nofile_limit() -> u64 {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let limit = getrlimit(Resource::Nofile);
    let raised = Rlimit {
        current: limit.maximum,
        maximum: limit.maximum,
    };
    if setrlimit(Resource::Nofile, raised).is_ok() {
        limit.maximum.unwrap_or(u64::MAX)
    } else {
        limit.current.unwrap_or(1024)
    }
}

/// How the daemon is set up.
#[derive(Clone, Debug)]
pub struct DaemonConfig {
    /// Socket path.
    pub socket: PathBuf,
    /// State directory (runs and their results).
    pub state_dir: PathBuf,
    /// Most runs sampling at once.
    pub max_runs: usize,
    /// Most runs one non-root user may have sampling at once.
    pub max_runs_per_user: usize,
    /// Most ended runs kept per user.
    pub keep_runs_per_user: usize,
    /// Idle connections (no request) are closed after this long.
    pub idle_timeout: Duration,
    /// Longest run.
    pub max_duration: Duration,
    /// The cap on a kernel program's unwind row array, in MiB (`--unwind-table-mib`).
    pub table_mib: u32,
    /// Where unwind tables are kept between runs and restarts (`--unwind-cache`: a folder or
    /// `off`).
    pub table_cache: String,
    /// The most memory one user's runs' sealed copies of targets' files take at once, in MiB
    /// (`--copy-budget-mib`; see [`crate::process::copies`]).
    pub copy_budget_mib: u64,
    /// Most ended runs kept.
    pub keep_runs: usize,
    /// Ended runs older than this are deleted.
    pub keep_age: Duration,
    /// Where each finished run's profile is exported (OTLP profiles, Pyroscope), if
    /// anywhere, and the spool that keeps it until the backend took it.
    pub export: Option<crate::agent::export::ExportConfig>,
}

/// Serves until SIGINT or SIGTERM, then stops every run (results are written) and exits.
pub async fn serve(config: DaemonConfig) -> Result<()> {
    crate::kernel::check_privileges()?;
    // SAFETY: mallopt takes plain integers; a fixed threshold also fixes the trim threshold
    // at its default (128 KiB), instead of letting both grow with the largest block freed.
    if unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD) } != 1 {
        log::warn!("could not fix malloc's mmap threshold: freed memory may stay resident");
    }
    // Refused at start rather than at every run.
    crate::unwind::table_rows_cap(config.table_mib)?;
    let store = Store::open(
        &config.state_dir,
        config.keep_runs,
        config.keep_runs_per_user,
        config.keep_age,
    )?;
    // The exporter runs on tasks of its own, fed through a bounded queue: no client's
    // `stop`, `results` or `list` waits on a backend, and a backend that is away costs the
    // spool's disk, not the daemon's memory.
    let (export, exporter) = match &config.export {
        Some(export) => {
            let host = crate::agent::labels::host_name();
            let metrics = Arc::new(crate::agent::metrics::Metrics::new());
            let (queue, task) = crate::agent::export::start(export, host.clone(), metrics)?;
            log::info!(
                "exporting each finished run's profile (spool in {})",
                export.spool_dir.display()
            );
            (Some(runs::Export { queue, host }), Some(task))
        }
        None => (None, None),
    };
    let runs = Arc::new(Runs::new(
        store,
        Limits {
            max_runs: config.max_runs,
            max_runs_per_user: config.max_runs_per_user,
            max_duration: config.max_duration,
            table_mib: config.table_mib,
            copy_budget_mib: config.copy_budget_mib,
        },
        export,
        crate::unwind::open_table_cache(&config.table_cache),
    ));
    let nofile = raise_nofile_limit();
    // Half of the descriptors for connections; the rest stay for runs and result files.
    let connections = Connections::new((nofile / 2).clamp(16, 65536) as usize);
    check_socket_dir(&config.socket)?;
    let listener = bind(&config.socket)?;
    log::info!(
        "listening on {} (state in {})",
        config.socket.display(),
        config.state_dir.display()
    );
    let mut sigterm = signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
    let mut sigint = signal(SignalKind::interrupt()).context("installing SIGINT handler")?;
    let idle_timeout = config.idle_timeout;
    let mut last_accept_log: Option<std::time::Instant> = None;
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let runs = runs.clone();
                    let connections = connections.clone();
                    tokio::spawn(async move {
                        serve_connection(stream, runs, connections, idle_timeout).await
                    });
                }
                Err(e) => {
                    if last_accept_log.is_none_or(|t| t.elapsed() >= ACCEPT_LOG_INTERVAL) {
                        log::warn!("accept: {e} (logged at most every {ACCEPT_LOG_INTERVAL:?})");
                        last_accept_log = Some(std::time::Instant::now());
                    }
                    // Out of descriptors (EMFILE/ENFILE) or memory: wait for some to free up.
                    tokio::time::sleep(EMFILE_BACKOFF).await;
                }
            },
            _ = sigterm.recv() => break,
            _ = sigint.recv() => break,
        }
    }
    log::info!("shutting down: stopping runs in flight");
    runs.stop_all(Duration::from_secs(30)).await;
    let _ = std::fs::remove_file(&config.socket);
    // The exporter spools what is queued and sends what it can; the rest stays spooled for
    // the next start.
    runs.close_export();
    if let Some(exporter) = exporter {
        let bound = crate::agent::export::REQUEST_TIMEOUT
            * (crate::agent::export::QUEUE_WINDOWS as u32 + 1);
        if tokio::time::timeout(bound, exporter).await.is_err() {
            log::warn!("the exporter did not finish sending within {bound:?}");
        }
    }
    Ok(())
}

/// Opens (creating, `0755`) the socket's folder, checked as the state directory is (see
/// [`crate::trusted_dir`]): the socket is removed, made and given its mode by path, which is
/// safe only in a folder nobody else can write.
fn check_socket_dir(socket: &Path) -> Result<()> {
    let Some(dir) = socket.parent() else {
        return Ok(());
    };
    match TrustedDir::open(dir, None) {
        Err(DirError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            TrustedDir::open(dir, Some(0o755))?;
        }
        opened => {
            opened?;
        }
    }
    Ok(())
}

/// Binds the socket, refusing to steal it from a daemon that still answers.
fn bind(path: &Path) -> anyhow::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(dir)
            .with_context(|| format!("creating {}", dir.display()))?;
    }
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            bail!("another daemon is serving {}", path.display());
        }
        std::fs::remove_file(path).with_context(|| format!("removing stale {}", path.display()))?;
    }
    let listener =
        UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))?;
    // Any local user may connect; every request is authorized by its peer credentials.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))?;
    Ok(listener)
}

async fn serve_connection(
    stream: UnixStream,
    runs: Arc<Runs>,
    connections: Arc<Connections>,
    idle_timeout: Duration,
) {
    let peer = match stream.peer_cred() {
        Ok(cred) => Peer {
            uid: cred.uid(),
            gid: cred.gid(),
        },
        Err(e) => {
            log::warn!("no peer credentials: {e}");
            return;
        }
    };
    let mut lines = Framed::new(stream, LinesCodec::new_with_max_length(MAX_REQUEST_BYTES));
    let _slot = match connections.admit(peer.uid) {
        Ok(slot) => slot,
        Err(message) => {
            let _ = send(&mut lines, &Reply::error(ErrorCode::TooManyRuns, message)).await;
            return;
        }
    };
    // Only a request resets the idle clock: blank lines keep no connection alive.
    let mut deadline = tokio::time::Instant::now() + idle_timeout;
    loop {
        let line = match tokio::time::timeout_at(deadline, lines.next()).await {
            Err(_) | Ok(None) => return,
            Ok(Some(Ok(line))) => line,
            Ok(Some(Err(LinesCodecError::MaxLineLengthExceeded))) => {
                let reply = Reply::error(
                    ErrorCode::BadRequest,
                    format!("request longer than {MAX_REQUEST_BYTES} bytes"),
                );
                let _ = send(&mut lines, &reply).await;
                return;
            }
            Ok(Some(Err(LinesCodecError::Io(e)))) => {
                let reply = Reply::error(ErrorCode::BadRequest, format!("unreadable request: {e}"));
                let _ = send(&mut lines, &reply).await;
                return;
            }
        };
        if line.trim().is_empty() {
            continue;
        }
        let reply = handle(&line, peer, &runs).await;
        deadline = tokio::time::Instant::now() + idle_timeout;
        if send(&mut lines, &reply).await.is_err() {
            return;
        }
    }
}

async fn send(lines: &mut Framed<UnixStream, LinesCodec>, reply: &Reply) -> anyhow::Result<()> {
    let json = serde_json::to_string(reply)?;
    lines.send(json).await?;
    Ok(())
}

/// Parses one request line as the daemon does before acting on it: JSON of this daemon's
/// protocol version, else the refusal to send back (public for the `protocol` fuzz target).
pub fn parse_request(line: &str) -> Result<Request, (ErrorCode, String)> {
    let request: Request = serde_json::from_str(line)
        .map_err(|e| (ErrorCode::BadRequest, format!("malformed request: {e}")))?;
    if request.version != VERSION {
        return Err((
            ErrorCode::BadRequest,
            format!(
                "protocol version {} is not spoken here (this daemon speaks {VERSION})",
                request.version
            ),
        ));
    }
    Ok(request)
}

async fn handle(line: &str, peer: Peer, runs: &Arc<Runs>) -> Reply {
    let uid = peer.uid;
    let request = match parse_request(line) {
        Ok(r) => r,
        Err((code, message)) => return Reply::error(code, message),
    };
    let result = match request.op {
        Op::Run(run) => {
            let runs = runs.clone();
            // Attaching does blocking syscalls; keep the reactor free for other clients.
            tokio::task::spawn_blocking(move || runs.start(peer, run))
                .await
                .unwrap_or_else(|e| Err((ErrorCode::Internal, format!("run start panicked: {e}"))))
        }
        Op::Status { run_id } => runs.info(uid, run_id).map(|i| Reply::for_run(&i, false)),
        Op::Stop { run_id } => runs.stop(uid, run_id).map(|i| Reply::for_run(&i, false)),
        Op::Results { run_id, wait_ms } => runs
            .results(
                uid,
                run_id,
                Duration::from_millis(wait_ms).min(crate::protocol::MAX_RUN_DURATION),
            )
            .await
            .map(|i| Reply::for_run(&i, true)),
        Op::Read {
            run_id,
            format,
            offset,
        } => {
            let runs = runs.clone();
            // Reads a file: on a blocking thread, not the one that answers clients.
            tokio::task::spawn_blocking(move || runs.read(uid, run_id, &format, offset))
                .await
                .unwrap_or_else(|e| Err((ErrorCode::Internal, format!("read panicked: {e}"))))
        }
        Op::List {} => Ok(Reply {
            runs: Some(runs.list(uid)),
            ..Reply::ok()
        }),
    };
    result.unwrap_or_else(|(code, message)| Reply::error(code, message))
}
