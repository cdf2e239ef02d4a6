//! What one attempt to send an exported window comes to, for every backend ([`super::export`]
//! for OTLP, [`super::pyroscope`]): the entry made ready to send, the outcome, and the rules
//! of OTLP/HTTP and OTLP/gRPC that decide between a retry and a refusal for good.

use std::time::Duration;

/// Longest one export request may take, connection included (the OpenTelemetry SDKs'
/// default export timeout).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// What became of one attempt to send a window.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The backend took it.
    Sent,
    /// It may take it later (unreachable, timed out, 5xx, 429, gRPC UNAVAILABLE, ...).
    Retry(String),
    /// It refused it for good (4xx, gRPC INVALID_ARGUMENT, ...).
    Rejected(String),
}

/// A spooled entry made ready to send, on a blocking thread.
pub enum Prepared {
    /// An OTLP/HTTP body, gzipped.
    Otlp(Vec<u8>),
    /// An OTLP request for gRPC's codec.
    OtlpMessage(Box<opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest>),
    /// A Pyroscope ingest request.
    Pyroscope(crate::output::pyroscope::Request),
    /// An entry that cannot be sent (unreadable): refused for good.
    Broken(String),
}

/// An error with its causes (reqwest's own message says little: "error sending request").
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// OTLP/HTTP's rule: 2xx taken; 429, 502, 503, 504 (and any other 5xx) retried; other 4xx
/// refused for good.
pub fn http_outcome(status: reqwest::StatusCode) -> Outcome {
    if status.is_success() {
        Outcome::Sent
    } else if status.is_server_error() || status.as_u16() == 429 || status.as_u16() == 408 {
        Outcome::Retry(format!("HTTP {status}"))
    } else {
        Outcome::Rejected(format!("HTTP {status}"))
    }
}

/// OTLP/gRPC's rule: the codes the specification names retryable are retried, the others
/// refused for good.
pub fn grpc_outcome(status: &tonic::Status) -> Outcome {
    use tonic::Code;
    let what = format!("gRPC {:?}: {}", status.code(), status.message());
    match status.code() {
        Code::Ok => Outcome::Sent,
        Code::Cancelled
        | Code::DeadlineExceeded
        | Code::Aborted
        | Code::OutOfRange
        | Code::Unavailable
        | Code::DataLoss
        | Code::ResourceExhausted => Outcome::Retry(what),
        _ => Outcome::Rejected(what),
    }
}
