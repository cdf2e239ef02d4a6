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
};
use runs::{Limits, Runs};
use store::Store;

/// Idle connections are closed after this long.
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// How the daemon is set up.
#[derive(Clone, Debug)]
pub struct DaemonConfig {
    /// Socket path.
    pub socket: PathBuf,
    /// State directory (runs and their results).
    pub state_dir: PathBuf,
    /// Most runs sampling at once.
    pub max_runs: usize,
    /// Longest run.
    pub max_duration: Duration,
    /// Most ended runs kept.
    pub keep_runs: usize,
    /// Ended runs older than this are deleted.
    pub keep_age: Duration,
}

/// Serves until SIGINT or SIGTERM, then stops every run (results are written) and exits.
pub async fn serve(config: DaemonConfig) -> Result<()> {
    crate::kernel::check_privileges()?;
    let store = Store::open(&config.state_dir, config.keep_runs, config.keep_age)?;
    let runs = Arc::new(Runs::new(
        store,
        Limits {
            max_runs: config.max_runs,
            max_duration: config.max_duration,
        },
    ));
    let listener = bind(&config.socket)?;
    log::info!(
        "listening on {} (state in {})",
        config.socket.display(),
        config.state_dir.display()
    );
    let mut sigterm = signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
    let mut sigint = signal(SignalKind::interrupt()).context("installing SIGINT handler")?;
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let runs = runs.clone();
                    tokio::spawn(async move { serve_connection(stream, runs).await });
                }
                Err(e) => log::warn!("accept: {e}"),
            },
            _ = sigterm.recv() => break,
            _ = sigint.recv() => break,
        }
    }
    log::info!("shutting down: stopping runs in flight");
    runs.stop_all(Duration::from_secs(30)).await;
    let _ = std::fs::remove_file(&config.socket);
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

async fn serve_connection(stream: UnixStream, runs: Arc<Runs>) {
    let uid = match stream.peer_cred() {
        Ok(cred) => cred.uid(),
        Err(e) => {
            log::warn!("no peer credentials: {e}");
            return;
        }
    };
    let mut lines = Framed::new(stream, LinesCodec::new_with_max_length(MAX_REQUEST_BYTES));
    loop {
        let line = match tokio::time::timeout(IDLE_TIMEOUT, lines.next()).await {
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
        let reply = handle(&line, uid, &runs).await;
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

async fn handle(line: &str, uid: u32, runs: &Arc<Runs>) -> Reply {
    let request: Request = match serde_json::from_str(line) {
        Ok(r) => r,
        Err(e) => return Reply::error(ErrorCode::BadRequest, format!("malformed request: {e}")),
    };
    if request.version != VERSION {
        return Reply::error(
            ErrorCode::BadRequest,
            format!(
                "protocol version {} is not spoken here (this daemon speaks {VERSION})",
                request.version
            ),
        );
    }
    let result = match request.op {
        Op::Run(run) => {
            let runs = runs.clone();
            // Attaching does blocking syscalls; keep the reactor free for other clients.
            tokio::task::spawn_blocking(move || runs.start(uid, run))
                .await
                .unwrap_or_else(|e| Err((ErrorCode::Internal, format!("run start panicked: {e}"))))
        }
        Op::Status { run_id } => runs.info(uid, run_id).map(|i| Reply::for_run(&i, false)),
        Op::Stop { run_id } => runs.stop(uid, run_id).map(|i| Reply::for_run(&i, false)),
        Op::Results { run_id, wait_ms } => runs
            .results(uid, run_id, Duration::from_millis(wait_ms.min(600_000)))
            .await
            .map(|i| Reply::for_run(&i, true)),
        Op::Read {
            run_id,
            format,
            offset,
        } => runs.read(uid, run_id, &format, offset),
        Op::List => Ok(Reply {
            runs: Some(runs.list(uid)),
            ..Reply::ok()
        }),
    };
    result.unwrap_or_else(|(code, message)| Reply::error(code, message))
}
