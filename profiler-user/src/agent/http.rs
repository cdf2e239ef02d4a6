//! The agent's HTTP server (`--listen ADDR` or `--listen unix:PATH`): `GET
//! /debug/pprof/profile?seconds=N` (with `service_name=` and `pid=` filters) answers a gzipped
//! pprof of the last N seconds' windows, the contract `go tool pprof URL`, Parca, Alloy's
//! `pyroscope.scrape` and the OpenTelemetry Collector's pprof receiver read; `GET /metrics`
//! the agent's metrics (counts of the whole agent, nothing of any one process).
//!
//! With `--listen-tls-cert` and `--listen-tls-key` the TCP endpoint speaks HTTPS only
//! ([`crate::agent::tls`]); who sees what is the same.
//!
//! Who sees what: root (uid 0), or any peer with the `--listen-token-file` token
//! (`Authorization: Bearer TOKEN`), sees every process. Another local user, known by the uid
//! owning its socket ([`crate::agent::peer`]), sees only the processes it owns, without the
//! tags of daemon runs other users started, and without kernel frames at
//! `perf_event_paranoid` 2 or more ([`View`]). A remote peer without the token is refused.
//!
//! What a client may cost the agent is bounded, so that the profiling (window cuts, the
//! export spool) never waits for it and never runs out of file descriptors or memory for
//! it: connections are counted per peer and in total, and the excess is closed as soon as
//! accepted (root's own are counted apart, so users cannot lock root out); a connection
//! must send its request's head within [`HEADER_TIMEOUT`] of opening or of its previous
//! answer (hyper's header timer restarts whenever the connection goes idle: it is the
//! keep-alive timeout as well); a response must be read at some pace ([`WRITE_STALL`]) and
//! within [`RESPONSE_DEADLINE`]; at most [`MAX_PROFILES`] profiles are built or sent at once
//! (one more for root), the rest answered 503 at once. A profile is merged and encoded on a
//! thread of its own at a low priority, holding only `Arc`s of windows (the ring's lock is
//! held to clone them); the memory it took is returned to the kernel once no profile is
//! built or sent ([`trim`]).

use std::{
    collections::HashMap,
    future::Future,
    io,
    path::PathBuf,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
    time::{Duration, Instant},
};

use axum::{
    extract::{rejection::QueryRejection, Query, State},
    http::{header, HeaderMap, StatusCode},
    response::{IntoResponse, Response},
    routing::get,
    Extension, Router,
};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    sync::{OwnedSemaphorePermit, Semaphore},
};

use crate::agent::{
    metrics::Metrics,
    peer::{Listen, Peer, SockDiag},
    windows::{merge, Filter, Ring, View, RING_WINDOWS},
};

/// What the server reads.
pub struct Shared {
    /// The recent windows.
    pub ring: Ring,
    /// The agent's metrics (shared with the exporter).
    pub metrics: Arc<Metrics>,
    /// The length of a window, for how long a request waits for the first.
    pub window: Duration,
    /// The budget of the recording's sealed copies of targets' files (their bytes are part
    /// of the memory reported).
    pub copies: crate::process::copies::CopyBudget,
}

/// `seconds` when a request names none: Go's `net/http/pprof` default.
const DEFAULT_SECONDS: u64 = 30;
/// How long a connection may take to send a request's head, from its opening or from the
/// end of its previous answer (then it is the keep-alive idle timeout).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an answer's bytes may wait for the client to read any of them.
pub const WRITE_STALL: Duration = Duration::from_secs(20);
/// How long a client may take to read a whole profile.
pub const RESPONSE_DEADLINE: Duration = Duration::from_secs(60);
/// Profiles built or being sent at once, besides one kept for root's view.
pub const MAX_PROFILES: usize = 2;
/// Most connections open at once, whatever the fd limit.
pub const MAX_CONNECTIONS: usize = 512;
/// Most connections of one peer (a local uid, a remote address): a scraper needs one.
pub const PER_PEER_CONNECTIONS: usize = 16;
/// File descriptors kept for the agent's own work whatever the endpoint holds: perf events
/// (a few per CPU), BPF maps and programs, the symbolizer's open files
/// ([`crate::agent::MAX_SYMBOL_FILES`]), the spool, the daemon's socket.
pub const RESERVED_FDS: u64 = 1024;
/// Bytes of a profile handed to the connection at a time (so that a profile is held once,
/// by its sender, until the client has read nearly all of it).
const CHUNK: usize = 64 * 1024;

/// How many connections the endpoint holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// In total (root's own apart).
    pub connections: usize,
    /// Per peer (root's own included).
    pub per_peer: usize,
}

impl Limits {
    /// The limits for a process allowed `nofile` open files on `cpus` CPUs: at most half of
    /// what is left past [`RESERVED_FDS`] and a few per CPU, and at most [`MAX_CONNECTIONS`],
    /// so that the endpoint alone can never take the agent to its fd limit.
    pub fn for_fd_limit(nofile: u64, cpus: usize) -> Limits {
        let reserve = RESERVED_FDS + 16 * cpus as u64;
        let room = (nofile.saturating_sub(reserve) / 2) as usize;
        let connections = room.clamp(4, MAX_CONNECTIONS);
        Limits {
            connections,
            per_peer: PER_PEER_CONNECTIONS.min(connections / 4).max(1),
        }
    }
}

/// Where the server listens, bound.
pub enum Listener {
    /// A TCP socket.
    Tcp(tokio::net::TcpListener),
    /// A Unix socket, removed when the server stops if it is still the one bound (the
    /// device and inode of its path).
    Unix(tokio::net::UnixListener, PathBuf, (u64, u64)),
}

/// Binds `listen` (a Unix socket with `mode` and group `gid`), failing with a clear error
/// before any sampling starts.
pub async fn bind(listen: &Listen, mode: u32, gid: Option<u32>) -> crate::error::Result<Listener> {
    match listen {
        Listen::Tcp(addr) => tokio::net::TcpListener::bind(addr)
            .await
            .map(Listener::Tcp)
            .map_err(|e| crate::error::Error::InvalidTarget {
                spec: addr.to_string(),
                reason: format!("--listen: cannot listen there: {e}"),
            }),
        Listen::Unix(path) => {
            use std::os::unix::fs::MetadataExt;
            let listener = crate::agent::peer::bind_unix(path, mode, gid)?;
            let bound = std::fs::symlink_metadata(path).map_or((0, 0), |m| (m.dev(), m.ino()));
            Ok(Listener::Unix(listener, path.clone(), bound))
        }
    }
}

/// Counts connections per peer and in total.
struct Gate {
    limits: Limits,
    open: Mutex<GateCounts>,
    metrics: Arc<Metrics>,
}

#[derive(Default)]
struct GateCounts {
    /// Connections counted in the total (all but root's).
    total: usize,
    per_peer: HashMap<Peer, usize>,
}

/// One admitted connection: uncounted when dropped.
struct Slot {
    gate: Arc<Gate>,
    peer: Peer,
}

impl Gate {
    /// Admits one more connection of `peer`, or says why not.
    fn admit(self: &Arc<Gate>, peer: Peer) -> Result<Slot, &'static str> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let root = peer == Peer::Local(0);
        if open.per_peer.get(&peer).copied().unwrap_or(0) >= self.limits.per_peer {
            return Err("per_peer");
        }
        if !root && open.total >= self.limits.connections {
            return Err("total");
        }
        *open.per_peer.entry(peer).or_default() += 1;
        if !root {
            open.total += 1;
        }
        self.metrics.http_connections.inc();
        Ok(Slot {
            gate: Arc::clone(self),
            peer,
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.gate.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = open.per_peer.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                open.per_peer.remove(&self.peer);
            }
        }
        if self.peer != Peer::Local(0) {
            open.total -= 1;
        }
        self.gate.metrics.http_connections.dec();
    }
}

/// The profiles built or being sent.
struct Admission {
    /// Anyone's.
    shared: Arc<Semaphore>,
    /// Kept for root's view (root, or the token's holder) when the shared ones are taken.
    reserved: Arc<Semaphore>,
}

impl Admission {
    fn admit(&self, view: View) -> Option<OwnedSemaphorePermit> {
        Arc::clone(&self.shared)
            .try_acquire_owned()
            .ok()
            .or_else(|| {
                (view == View::All)
                    .then(|| Arc::clone(&self.reserved).try_acquire_owned().ok())
                    .flatten()
            })
    }

    /// Whether no profile is built or being sent.
    fn idle(&self) -> bool {
        self.shared.available_permits() == MAX_PROFILES && self.reserved.available_permits() == 1
    }
}

/// The state of the routes.
#[derive(Clone)]
struct App {
    shared: Arc<Shared>,
    token: Option<Arc<[u8]>>,
    admission: Arc<Admission>,
}

/// Serves `shared` on `listener` until `stop` resolves, with `token` (if any) for root's
/// view and `limits` on connections.
pub async fn serve(
    listener: Listener,
    shared: Arc<Shared>,
    token: Option<Vec<u8>>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    limits: Limits,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let metrics = Arc::clone(&shared.metrics);
    let app = Router::new()
        .route("/debug/pprof/profile", get(profile))
        .route("/metrics", get(metrics_route))
        .with_state(App {
            shared,
            token: token.map(Arc::from),
            admission: Arc::new(Admission {
                shared: Arc::new(Semaphore::new(MAX_PROFILES)),
                reserved: Arc::new(Semaphore::new(1)),
            }),
        });
    let gate = Arc::new(Gate {
        limits,
        open: Mutex::default(),
        metrics: Arc::clone(&metrics),
    });
    // Without the kernel's socket table every TCP peer is remote: only the token's holder
    // is served.
    let mut diag = match &listener {
        Listener::Tcp(_) => SockDiag::open()
            .inspect_err(|e| {
                log::warn!(
                    "NETLINK_SOCK_DIAG is unavailable ({e}): TCP scrapers are served only with \
                     the --listen-token-file token"
                )
            })
            .ok(),
        Listener::Unix(..) => None,
    };
    let mut connections = tokio::task::JoinSet::new();
    tokio::pin!(stop);
    loop {
        let accepted = tokio::select! {
            () = &mut stop => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            accepted = accept(&listener, diag.as_mut()) => accepted,
        };
        let (io, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of descriptors (the limits keep the endpoint well under it, but the
                // machine's may be reached) or a connection reset before it was taken:
                // wait a little rather than spin.
                log::debug!("accepting a connection: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let slot = match gate.admit(peer) {
            Ok(slot) => slot,
            Err(reason) => {
                metrics
                    .http_refused
                    .get_or_create(&vec![("reason", reason)])
                    .inc();
                continue;
            }
        };
        let (app, tls, metrics) = (app.clone(), tls.clone(), Arc::clone(&metrics));
        connections.spawn(async move {
            match (io, tls) {
                (Stream::Tcp(io), Some(tls)) => {
                    // The handshake is bounded as a request's head is: a peer that sends
                    // nothing, or plain HTTP, holds its place no longer.
                    match tokio::time::timeout(HEADER_TIMEOUT, tls.accept(io)).await {
                        Ok(Ok(io)) => connection(io, peer, app).await,
                        Ok(Err(e)) => {
                            log::debug!("TLS handshake with {peer:?}: {e}");
                            metrics
                                .http_refused
                                .get_or_create(&vec![("reason", "tls_handshake")])
                                .inc();
                        }
                        Err(_) => {
                            metrics
                                .http_refused
                                .get_or_create(&vec![("reason", "tls_handshake")])
                                .inc();
                        }
                    }
                }
                (Stream::Tcp(io), None) => connection(io, peer, app).await,
                (Stream::Unix(io), _) => connection(io, peer, app).await,
            }
            drop(slot);
        });
    }
    connections.shutdown().await;
    if let Listener::Unix(_, path, bound) = &listener {
        remove_own_socket(path, *bound);
    }
    Ok(())
}

/// An accepted connection.
enum Stream {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}

/// Accepts one connection and tells who it is from.
async fn accept(listener: &Listener, diag: Option<&mut SockDiag>) -> io::Result<(Stream, Peer)> {
    match listener {
        Listener::Tcp(listener) => {
            let (io, from) = listener.accept().await?;
            let local = io.local_addr()?;
            let peer = match diag.and_then(|d| d.tcp_owner(from, local)) {
                Some(uid) => Peer::Local(uid),
                None => Peer::Remote(from.ip()),
            };
            Ok((Stream::Tcp(io), peer))
        }
        Listener::Unix(listener, ..) => {
            let (io, _) = listener.accept().await?;
            let uid = io.peer_cred()?.uid();
            Ok((Stream::Unix(io), Peer::Local(uid)))
        }
    }
}

/// Removes the socket at `path` if it is still the one bound there (`bound`: its device and
/// inode), not one another agent made there since.
fn remove_own_socket(path: &std::path::Path, bound: (u64, u64)) {
    use std::os::unix::fs::MetadataExt;
    if std::fs::symlink_metadata(path).is_ok_and(|m| (m.dev(), m.ino()) == bound) {
        let _ = std::fs::remove_file(path);
    }
}

/// Serves one connection: HTTP/1 with the header (and keep-alive) timeout, each request
/// told who sent it.
async fn connection<I>(io: I, peer: Peer, app: Router)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |mut request: hyper::Request<_>| {
        request.extensions_mut().insert(peer);
        tower::ServiceExt::oneshot(app.clone(), request)
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .max_buf_size(CHUNK * 2);
    let io = hyper_util::rt::TokioIo::new(Stalling::new(io));
    if let Err(e) = builder.serve_connection(io, service).await {
        log::debug!("HTTP connection from {peer:?}: {e}");
    }
}

/// A connection whose writes fail once they have waited [`WRITE_STALL`] for the client to
/// read: a client that stops reading is let go, and so is what it held.
struct Stalling<I> {
    io: I,
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<I> Stalling<I> {
    fn new(io: I) -> Stalling<I> {
        Stalling { io, stalled: None }
    }

    /// Passes `poll` on; a pending write starts (or checks) the stall timer.
    fn guard<T>(&mut self, cx: &mut Context<'_>, poll: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        if poll.is_ready() {
            self.stalled = None;
            return poll;
        }
        let timer = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(WRITE_STALL)));
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client read nothing of the answer",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Stalling<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Stalling<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.io).poll_write(cx, buf);
        self.guard(cx, poll)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let poll = Pin::new(&mut self.io).poll_flush(cx);
        self.guard(cx, poll)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.guard(cx, poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// A refused request: its status and what it is told.
type Refusal = (StatusCode, &'static str);

/// What `peer` may see, from its identity and its `Authorization` header; the refusal to
/// answer otherwise (counted).
fn authorize(app: &App, peer: Peer, headers: &HeaderMap) -> Result<View, Refusal> {
    use subtle::ConstantTimeEq;
    let refuse = |status: StatusCode, reason: &'static str, message: &'static str| {
        app.shared
            .metrics
            .http_requests_refused
            .get_or_create(&vec![("reason", reason)])
            .inc();
        Err((status, message))
    };
    if let Some(token) = &app.token {
        if let Some(given) = headers.get(header::AUTHORIZATION) {
            let given = given.as_bytes();
            let given = given.strip_prefix(b"Bearer ").unwrap_or(b"");
            return if bool::from(given.ct_eq(token)) {
                Ok(View::All)
            } else {
                refuse(
                    StatusCode::UNAUTHORIZED,
                    "unauthorized",
                    "wrong bearer token\n",
                )
            };
        }
    }
    match peer {
        Peer::Local(uid) => Ok(View::of_uid(uid)),
        Peer::Remote(_) => refuse(
            StatusCode::FORBIDDEN,
            "forbidden",
            "only local users are served without the endpoint's token \
             (--listen-token-file; Authorization: Bearer TOKEN)\n",
        ),
    }
}

/// The query of a profile request, every field as text so that a bad value gets a clear 400.
#[derive(serde::Deserialize)]
struct ProfileQuery {
    seconds: Option<String>,
    service_name: Option<String>,
    pid: Option<String>,
}

fn bad_request(message: String) -> Response {
    (StatusCode::BAD_REQUEST, message + "\n").into_response()
}

async fn profile(
    State(app): State<App>,
    Extension(peer): Extension<Peer>,
    headers: HeaderMap,
    query: Result<Query<ProfileQuery>, QueryRejection>,
) -> Response {
    let view = match authorize(&app, peer, &headers) {
        Ok(view) => view,
        Err(refused) => return refused.into_response(),
    };
    let query = match query {
        Ok(Query(query)) => query,
        Err(e) => return bad_request(e.body_text()),
    };
    let shared = &app.shared;
    // Past what the ring holds, more seconds change nothing: capped there.
    let most = shared.window.as_secs().max(1) * RING_WINDOWS as u64;
    let seconds = match query.seconds.as_deref().map(str::parse::<u64>) {
        None => DEFAULT_SECONDS,
        Some(Ok(n)) if n > 0 => n.min(most),
        Some(_) => return bad_request("seconds must be a whole number above 0".into()),
    };
    let pid = match query.pid.as_deref().map(str::parse::<u32>) {
        None => None,
        Some(Ok(pid)) => Some(pid),
        Some(Err(_)) => return bad_request("pid must be a process id".into()),
    };
    let filter = Filter {
        service_name: query.service_name,
        pid,
    };
    // Until the first window is cut there is nothing to answer with: wait for it.
    if !shared
        .ring
        .wait_first(shared.window * 2 + Duration::from_secs(5))
        .await
    {
        return (StatusCode::SERVICE_UNAVAILABLE, "no window recorded yet\n").into_response();
    }
    let busy = || {
        shared
            .metrics
            .http_requests_refused
            .get_or_create(&vec![("reason", "busy")])
            .inc();
        (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "1")],
            "too many profiles are being built or sent: try again\n",
        )
            .into_response()
    };
    let Some(permit) = app.admission.admit(view) else {
        return busy();
    };
    let release = Release {
        permit: Some(permit),
        admission: Arc::clone(&app.admission),
    };
    let windows = shared.ring.last(Duration::from_secs(seconds));
    let (built_tx, built) = tokio::sync::oneshot::channel();
    // A thread of its own (not the runtime's blocking pool, which the exporter's file work
    // shares) at a lower priority than the recording thread, which cuts the windows.
    let spawned = std::thread::Builder::new()
        .name("agent-http-profile".into())
        .spawn(move || {
            // Linux keeps a nice value per thread: this one only.
            let _ = rustix::process::setpriority_process(None, PROFILE_NICENESS);
            let out = merge(&windows, &filter, view).and_then(|profile| {
                let mut out = Vec::new();
                crate::output::pprof::write(&profile, &mut out).ok()?;
                Some(out)
            });
            let _ = built_tx.send(out);
        });
    if spawned.is_err() {
        return busy();
    }
    match built.await {
        Ok(Some(bytes)) => {
            let length = bytes.len();
            let sending = Sending {
                bytes,
                at: 0,
                deadline: Instant::now() + RESPONSE_DEADLINE,
                _release: release,
            };
            let body = futures_util::stream::unfold(sending, |mut s| async move {
                if s.at >= s.bytes.len() {
                    return None;
                }
                if Instant::now() > s.deadline {
                    s.at = s.bytes.len();
                    let late =
                        io::Error::new(io::ErrorKind::TimedOut, "the client read too slowly");
                    return Some((Err(late), s));
                }
                let end = (s.at + CHUNK).min(s.bytes.len());
                // A copy: the whole profile is freed with its sender, not with its last chunk.
                let chunk = bytes::Bytes::copy_from_slice(&s.bytes[s.at..end]);
                s.at = end;
                Some((Ok(chunk), s))
            });
            (
                [
                    (header::CONTENT_TYPE, "application/octet-stream".to_string()),
                    (
                        header::CONTENT_DISPOSITION,
                        "attachment; filename=\"profile\"".to_string(),
                    ),
                    (header::CONTENT_LENGTH, length.to_string()),
                ],
                axum::body::Body::from_stream(body),
            )
                .into_response()
        }
        _ => (StatusCode::INTERNAL_SERVER_ERROR, "no profile\n").into_response(),
    }
}

/// The nice value profiles are built at: the recording thread, at 0, cuts windows first.
const PROFILE_NICENESS: i32 = 10;

/// A profile being sent: freed, and its place given back, when sent or abandoned.
struct Sending {
    bytes: Vec<u8>,
    at: usize,
    deadline: Instant,
    // Dropped after `bytes` (fields drop in order): the trim sees the profile freed.
    _release: Release,
}

/// A place among the profiles built or sent at once.
struct Release {
    permit: Option<OwnedSemaphorePermit>,
    admission: Arc<Admission>,
}

impl Drop for Release {
    fn drop(&mut self) {
        drop(self.permit.take());
        if self.admission.idle() {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn_blocking(trim);
            }
        }
    }
}

/// Returns the memory freed by the last profiles to the kernel. Merging and encoding a
/// profile of the whole ring allocates tens of MB on its thread, and glibc keeps what a
/// thread's arena freed (only the top of an arena is given back, and arenas outlive their
/// threads): after a burst of scrapes the agent kept hundreds of MB. `malloc_trim(0)` gives
/// every arena's free pages back; it runs once no profile is in flight, so at most once per
/// burst, on a blocking thread.
fn trim() {
    // SAFETY: malloc_trim takes no pointer; it only returns free pages to the kernel.
    unsafe { libc::malloc_trim(0) };
}

async fn metrics_route(
    State(app): State<App>,
    Extension(peer): Extension<Peer>,
    headers: HeaderMap,
) -> Response {
    if let Err(refused) = authorize(&app, peer, &headers) {
        return refused.into_response();
    }
    let shared = &app.shared;
    shared.metrics.update_own_cost(shared.copies.used());
    shared.metrics.windows_kept.set(shared.ring.len() as i64);
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        shared.metrics.encode(),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_endpoint_keeps_well_under_the_fd_limit() {
        for (nofile, cpus) in [(1024, 2), (4096, 2), (20_000, 2), (1 << 20, 256), (0, 1)] {
            let limits = Limits::for_fd_limit(nofile, cpus);
            assert!(limits.connections >= 4 && limits.connections <= MAX_CONNECTIONS);
            assert!(limits.per_peer >= 1 && limits.per_peer <= PER_PEER_CONNECTIONS);
            if nofile > 4096 {
                // Users' and root's connections together leave the reserve untouched.
                let most = (limits.connections + limits.per_peer) as u64;
                assert!(most + RESERVED_FDS < nofile, "{nofile}: {limits:?}");
            }
        }
        assert_eq!(Limits::for_fd_limit(20_000, 2).connections, MAX_CONNECTIONS);
    }

    #[test]
    fn peers_are_counted_apart_and_root_past_the_total() {
        let gate = Arc::new(Gate {
            limits: Limits {
                connections: 3,
                per_peer: 2,
            },
            open: Mutex::default(),
            metrics: Arc::new(Metrics::new()),
        });
        let a = Peer::Local(1000);
        let b = Peer::Remote("10.0.0.1".parse().unwrap());
        let (a1, _a2) = (gate.admit(a).unwrap(), gate.admit(a).unwrap());
        assert_eq!(gate.admit(a).err(), Some("per_peer"));
        let _b1 = gate.admit(b).unwrap();
        assert_eq!(gate.admit(b).err(), Some("total"));
        // Root is let in while users hold every place.
        let _r = (
            gate.admit(Peer::Local(0)).unwrap(),
            gate.admit(Peer::Local(0)).unwrap(),
        );
        assert_eq!(gate.admit(Peer::Local(0)).err(), Some("per_peer"));
        drop(a1);
        assert!(gate.admit(b).is_ok(), "a closed connection frees its place");
    }
}
