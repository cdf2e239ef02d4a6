//! The agent's HTTP server (`--listen ADDR`), on axum: `GET /debug/pprof/profile?seconds=N`
//! (with `service_name=` and `pid=` filters) answers a gzipped pprof of the last N seconds'
//! windows, the contract `go tool pprof URL`, Parca, Alloy's `pyroscope.scrape` and the
//! OpenTelemetry Collector's pprof receiver read; `GET /metrics` the agent's metrics.
//!
//! It runs on its own task and reads only the window ring (a lock held to clone a few
//! `Arc`s) and atomics: no request waits for a tick, a window's symbolization or a table
//! build. Merging and encoding a profile runs on a blocking thread. What it serves is every
//! process's stacks, which only root may see: bind it to loopback or a private interface.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use axum::{
    extract::{rejection::QueryRejection, Query, State},
    http::{header, StatusCode},
    response::{IntoResponse, Response},
    routing::get,
    Router,
};

use crate::agent::{
    metrics::Metrics,
    windows::{merge, Filter, Ring},
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

/// Serves `shared` on `listener` until `stop` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    shared: Arc<Shared>,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/debug/pprof/profile", get(profile))
        .route("/metrics", get(metrics))
        .with_state(shared);
    axum::serve(listener, app)
        .with_graceful_shutdown(stop)
        .await
}

/// Binds `addr`, failing with a clear error before any sampling starts.
pub async fn bind(addr: SocketAddr) -> crate::error::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| crate::error::Error::InvalidTarget {
            spec: addr.to_string(),
            reason: format!("--listen: cannot listen there: {e}"),
        })
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
    State(shared): State<Arc<Shared>>,
    query: Result<Query<ProfileQuery>, QueryRejection>,
) -> Response {
    let query = match query {
        Ok(Query(query)) => query,
        Err(e) => return bad_request(e.body_text()),
    };
    let seconds = match query.seconds.as_deref().map(str::parse::<u64>) {
        None => DEFAULT_SECONDS,
        Some(Ok(n)) if n > 0 => n,
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
    let windows = shared.ring.last(Duration::from_secs(seconds));
    let built = tokio::task::spawn_blocking(move || {
        let profile = merge(&windows, &filter)?;
        let mut out = Vec::new();
        crate::output::pprof::write(&profile, &mut out).ok()?;
        Some(out)
    })
    .await;
    match built {
        Ok(Some(bytes)) => (
            [
                (header::CONTENT_TYPE, "application/octet-stream"),
                (
                    header::CONTENT_DISPOSITION,
                    "attachment; filename=\"profile\"",
                ),
            ],
            bytes,
        )
            .into_response(),
        _ => (StatusCode::INTERNAL_SERVER_ERROR, "no profile\n").into_response(),
    }
}

async fn metrics(State(shared): State<Arc<Shared>>) -> Response {
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
