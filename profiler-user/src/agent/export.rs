//! Export of each window to an OpenTelemetry backend: OTLP profiles over gRPC (tonic) or
//! HTTP/protobuf (reqwest), `--otlp-endpoint`, `--otlp-protocol`, `--otlp-header`; and to
//! Grafana Pyroscope's ingest API ([`crate::agent::pyroscope`], `--pyroscope-url`). The daemon
//! exports each finished run through the same exporter, a run's profile as one window.
//!
//! The recording thread never waits on the network: it hands each window to each backend's
//! bounded queue ([`QUEUE_WINDOWS`]) and goes on; a full queue drops the window, counted. The exporter
//! encodes each window ([`crate::output::otlp`], [`crate::output::pyroscope`]) into the on-disk spool
//! ([`crate::agent::spool`]) and sends the spool's windows oldest first, each attempt bounded
//! by [`REQUEST_TIMEOUT`]: a window the backend could not take (unreachable, timed out, 5xx)
//! stays and is retried with exponential backoff and jitter ([`backoff`]), later windows
//! waiting behind it so that all arrive in order; one it refused for good (4xx) is set
//! aside. Every outcome is counted in `/metrics`.

use std::{sync::Arc, time::Duration};

use prost::Message;
use reqwest::header::{HeaderName, HeaderValue};

pub use crate::agent::send::REQUEST_TIMEOUT;
use crate::{
    agent::{
        metrics::Metrics,
        pyroscope::{self, PyroscopeConfig},
        send::{error_chain, grpc_outcome, http_outcome, Outcome, Prepared},
        spool::Spool,
        windows::Window,
    },
    error::{Error, Result},
    output::{otlp, pyroscope as pyroscope_requests},
};

/// Windows waiting for the exporter at most: a minute of the default 10 s windows, so a slow
/// send does not lose a window while the queue stays a few MB.
pub const QUEUE_WINDOWS: usize = 6;
/// The path of the profiles signal under an OTLP/HTTP endpoint (the collector's
/// `otlpreceiver`).
pub const HTTP_PATH: &str = "/v1development/profiles";

/// The OTLP transport, named as the OpenTelemetry SDKs name them
/// (`OTEL_EXPORTER_OTLP_PROTOCOL`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Protocol {
    /// gRPC (`ProfilesService/Export`).
    #[value(name = "grpc")]
    Grpc,
    /// Protobuf over HTTP (`POST {endpoint}/v1development/profiles`).
    #[value(name = "http/protobuf")]
    HttpProtobuf,
}

/// Where and how to send OTLP profiles, validated.
#[derive(Clone, Debug)]
pub struct OtlpConfig {
    /// The endpoint's base URL (`http://` or `https://`), or the profiles signal's whole URL
    /// where [`OtlpConfig::signal_url`] says so.
    pub endpoint: reqwest::Url,
    /// Whether `endpoint` is the signal's whole URL (`OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT`,
    /// as the SDKs take it): nothing is appended to it over HTTP.
    pub signal_url: bool,
    /// The transport.
    pub protocol: Protocol,
    /// Headers sent with every request (auth), as gRPC metadata over gRPC.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// The certificates (PEM) that alone are trusted for an `https://` endpoint, instead of
    /// the web's roots (`--otlp-ca-cert`, `OTEL_EXPORTER_OTLP_CERTIFICATE`).
    pub ca_pem: Option<Vec<u8>>,
}

impl OtlpConfig {
    /// Validates the endpoint URL and the `k=v` headers.
    pub fn new(endpoint: &str, protocol: Protocol, headers: &[String]) -> Result<OtlpConfig> {
        let usage = |what: String| Error::Usage(format!("--otlp-endpoint: {what}"));
        let url = reqwest::Url::parse(endpoint).map_err(|e| usage(format!("{endpoint:?}: {e}")))?;
        if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
            return Err(usage(format!(
                "{endpoint:?} is not an http:// or https:// URL with a host"
            )));
        }
        let headers = headers
            .iter()
            .map(|h| parse_header(h))
            .collect::<Result<Vec<_>>>()?;
        Ok(OtlpConfig {
            endpoint: url,
            signal_url: false,
            protocol,
            headers,
            ca_pem: None,
        })
    }

    /// Marks the endpoint as the profiles signal's whole URL (over HTTP it is posted to as
    /// it is, as the SDKs do with `OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT`).
    pub fn with_signal_url(mut self) -> OtlpConfig {
        self.signal_url = true;
        self
    }

    /// Adds the headers of a list in the OpenTelemetry SDKs' format
    /// (`OTEL_EXPORTER_OTLP_HEADERS`: `k=v,k2=v2`, values percent-encoded).
    pub fn with_header_list(mut self, list: &str) -> Result<OtlpConfig> {
        self.headers.extend(parse_header_list(list)?);
        Ok(self)
    }

    /// Trusts only the certificates of the PEM file at `path` for an `https://` endpoint.
    pub fn with_ca_cert(mut self, path: &std::path::Path) -> Result<OtlpConfig> {
        let usage = |why: String| Error::Usage(format!("--otlp-ca-cert {}: {why}", path.display()));
        let pem = std::fs::read(path).map_err(|e| usage(e.to_string()))?;
        let certificates =
            reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| usage(error_chain(&e)))?;
        if certificates.is_empty() {
            return Err(usage("no PEM certificate in it".into()));
        }
        self.ca_pem = Some(pem);
        Ok(self)
    }

    /// The URL an OTLP/HTTP request is posted to.
    fn http_url(&self) -> std::result::Result<reqwest::Url, url::ParseError> {
        if self.signal_url {
            return Ok(self.endpoint.clone());
        }
        let base = self.endpoint.as_str().trim_end_matches('/');
        reqwest::Url::parse(&format!("{base}{HTTP_PATH}"))
    }
}

/// A `--otlp-header k=v`, checked as an HTTP header (and so as gRPC metadata).
fn parse_header(h: &str) -> Result<(HeaderName, HeaderValue)> {
    header(h, h, "--otlp-header")
}

/// `k=v` (`whole`'s value already decoded) as a header, refused as `what` says.
fn header(h: &str, whole: &str, what: &str) -> Result<(HeaderName, HeaderValue)> {
    let usage = |why: &str| Error::Usage(format!("{what} {whole:?}: {why}"));
    let (k, v) = h
        .split_once('=')
        .ok_or_else(|| usage("expected KEY=VALUE"))?;
    let name = HeaderName::from_bytes(k.trim().to_ascii_lowercase().as_bytes())
        .map_err(|_| usage("not a header name"))?;
    let value = HeaderValue::from_str(v.trim()).map_err(|_| usage("not a header value"))?;
    Ok((name, value))
}

/// The headers of `OTEL_EXPORTER_OTLP_HEADERS`: comma-separated `key=value` pairs, each value
/// percent-decoded (the W3C Baggage format the SDKs read); empty items are skipped.
pub fn parse_header_list(list: &str) -> Result<Vec<(HeaderName, HeaderValue)>> {
    const WHAT: &str = "OTEL_EXPORTER_OTLP_HEADERS (--otlp-headers)";
    let mut out = Vec::new();
    for item in list.split(',').filter(|i| !i.trim().is_empty()) {
        let Some((key, value)) = item.split_once('=') else {
            return Err(Error::Usage(format!("{WHAT} {item:?}: expected KEY=VALUE")));
        };
        let value = percent_encoding::percent_decode_str(value.trim())
            .decode_utf8()
            .map_err(|_| Error::Usage(format!("{WHAT} {item:?}: not UTF-8 once decoded")))?;
        out.push(header(&format!("{key}={value}"), item, WHAT)?);
    }
    Ok(out)
}

/// The client of one backend.
enum Transport {
    Http {
        client: reqwest::Client,
        url: reqwest::Url,
        headers: reqwest::header::HeaderMap,
    },
    Grpc {
        channel: tonic::transport::Channel,
        headers: tonic::metadata::MetadataMap,
    },
}

impl Transport {
    fn new(config: &OtlpConfig) -> Result<Transport> {
        let other = |e: String| Error::Other(anyhow::anyhow!("OTLP client: {e}"));
        match config.protocol {
            Protocol::HttpProtobuf => {
                let mut client = reqwest::Client::builder().timeout(REQUEST_TIMEOUT);
                if let Some(pem) = &config.ca_pem {
                    client = client.tls_built_in_root_certs(false);
                    for certificate in reqwest::Certificate::from_pem_bundle(pem)
                        .map_err(|e| other(e.to_string()))?
                    {
                        client = client.add_root_certificate(certificate);
                    }
                }
                let client = client.build().map_err(|e| other(e.to_string()))?;
                let url = config.http_url().map_err(|e| other(e.to_string()))?;
                let mut headers = reqwest::header::HeaderMap::new();
                for (k, v) in &config.headers {
                    headers.append(k.clone(), v.clone());
                }
                Ok(Transport::Http {
                    client,
                    url,
                    headers,
                })
            }
            Protocol::Grpc => {
                let mut endpoint =
                    tonic::transport::Endpoint::from_shared(config.endpoint.to_string())
                        .map_err(|e| other(e.to_string()))?
                        .timeout(REQUEST_TIMEOUT)
                        .connect_timeout(REQUEST_TIMEOUT);
                if config.endpoint.scheme() == "https" {
                    let tls = tonic::transport::ClientTlsConfig::new();
                    let tls = match &config.ca_pem {
                        Some(pem) => {
                            tls.ca_certificate(tonic::transport::Certificate::from_pem(pem))
                        }
                        None => tls.with_webpki_roots(),
                    };
                    endpoint = endpoint.tls_config(tls).map_err(|e| other(e.to_string()))?;
                }
                let mut headers = tonic::metadata::MetadataMap::new();
                for (k, v) in &config.headers {
                    let key = tonic::metadata::MetadataKey::from_bytes(k.as_str().as_bytes())
                        .map_err(|e| other(e.to_string()))?;
                    let value = tonic::metadata::MetadataValue::try_from(v.as_bytes())
                        .map_err(|e| other(e.to_string()))?;
                    headers.append(key, value);
                }
                Ok(Transport::Grpc {
                    channel: endpoint.connect_lazy(),
                    headers,
                })
            }
        }
    }

    /// Makes an encoded `ExportProfilesServiceRequest` ready to send (gzipped for HTTP,
    /// decoded for gRPC's codec): work for a blocking thread, not the runtime's.
    fn prepare(&self, body: &[u8]) -> Prepared {
        use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
        match self {
            Transport::Http { .. } => match gzip(body) {
                Ok(gzipped) => Prepared::Otlp(gzipped),
                Err(e) => Prepared::Broken(format!("gzip: {e}")),
            },
            Transport::Grpc { .. } => match ExportProfilesServiceRequest::decode(body) {
                Ok(message) => Prepared::OtlpMessage(Box::new(message)),
                Err(e) => Prepared::Broken(format!("undecodable window: {e}")),
            },
        }
    }

    /// Sends one prepared request.
    async fn send(&self, prepared: Prepared) -> Outcome {
        match (self, prepared) {
            (
                Transport::Http {
                    client,
                    url,
                    headers,
                },
                Prepared::Otlp(gzipped),
            ) => {
                let response = client
                    .post(url.clone())
                    .headers(headers.clone())
                    .header(reqwest::header::CONTENT_TYPE, "application/x-protobuf")
                    .header(reqwest::header::CONTENT_ENCODING, "gzip")
                    .body(gzipped)
                    .send()
                    .await;
                match response {
                    Err(e) => Outcome::Retry(error_chain(&e)),
                    Ok(r) => http_outcome(r.status()),
                }
            }
            (Transport::Grpc { channel, headers }, Prepared::OtlpMessage(message)) => {
                use opentelemetry_proto::tonic::collector::profiles::v1development::profiles_service_client::ProfilesServiceClient;
                let mut client = ProfilesServiceClient::new(channel.clone())
                    .send_compressed(tonic::codec::CompressionEncoding::Gzip);
                let mut request = tonic::Request::new(*message);
                *request.metadata_mut() = headers.clone();
                request.set_timeout(REQUEST_TIMEOUT);
                match client.export(request).await {
                    Ok(_) => Outcome::Sent,
                    Err(status) => grpc_outcome(&status),
                }
            }
            (_, Prepared::Broken(why)) => Outcome::Rejected(why),
            (_, _) => Outcome::Rejected("a request prepared for another transport".into()),
        }
    }
}

fn gzip(body: &[u8]) -> std::io::Result<Vec<u8>> {
    use std::io::Write;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(body)?;
    gz.finish()
}

/// Where and how windows are exported, and the spool that keeps them until they are.
#[derive(Clone, Debug)]
pub struct ExportConfig {
    /// The OTLP backend, if any.
    pub otlp: Option<OtlpConfig>,
    /// The Pyroscope server, if any.
    pub pyroscope: Option<PyroscopeConfig>,
    /// The spools' directory (`STATE_DIR/spool`): one folder per backend.
    pub spool_dir: std::path::PathBuf,
    /// Each backend's spool's size limit in bytes.
    pub spool_limit: u64,
}

/// One backend's client.
enum Backend {
    Otlp(Transport),
    Pyroscope(pyroscope::Client),
}

impl Backend {
    /// Its name: its spool's folder and its metrics' `backend` label.
    fn name(&self) -> &'static str {
        match self {
            Backend::Otlp(_) => "otlp",
            Backend::Pyroscope(_) => "pyroscope",
        }
    }

    /// What a window becomes in its spool: one OTLP request; one Pyroscope request per
    /// service.
    fn entries(&self, window: &Window, host: &str) -> std::io::Result<Vec<Vec<u8>>> {
        match self {
            Backend::Otlp(_) => Ok(vec![otlp::request(
                &window.profile,
                window.start,
                window.end,
                host,
            )
            .encode_to_vec()]),
            Backend::Pyroscope(_) => {
                Ok(
                    pyroscope_requests::requests(&window.profile, window.start, window.end, host)?
                        .iter()
                        .map(pyroscope_requests::to_entry)
                        .collect(),
                )
            }
        }
    }

    /// Makes a spooled entry ready to send (decoding, compressing): on a blocking thread.
    fn prepare(&self, entry: &[u8]) -> Prepared {
        match self {
            Backend::Otlp(transport) => transport.prepare(entry),
            Backend::Pyroscope(_) => pyroscope::prepare(entry),
        }
    }

    async fn send(&self, prepared: Prepared) -> Outcome {
        match (self, prepared) {
            (_, Prepared::Broken(why)) => Outcome::Rejected(why),
            (Backend::Otlp(transport), prepared) => transport.send(prepared).await,
            (Backend::Pyroscope(client), Prepared::Pyroscope(request)) => {
                client.send(request).await
            }
            (Backend::Pyroscope(_), _) => {
                Outcome::Rejected("a request prepared for another backend".into())
            }
        }
    }
}

/// The recording thread's end of the exporter: one queue per backend.
#[derive(Clone)]
pub struct Queue {
    backends: Vec<(&'static str, tokio::sync::mpsc::Sender<Arc<Window>>)>,
}

impl Queue {
    /// Hands a window to each backend's exporter without waiting; returns the backends
    /// whose queue was full (the window is not exported there).
    pub fn offer(&self, window: &Arc<Window>) -> Vec<&'static str> {
        self.backends
            .iter()
            .filter(|(_, tx)| tx.try_send(Arc::clone(window)).is_err())
            .map(|(name, _)| *name)
            .collect()
    }
}

/// The delay before the next attempt after `failures` failed ones in a row: doubling from
/// [`BACKOFF_FIRST`] to [`BACKOFF_MAX`], times a random factor in [0.5, 1.5) so that agents
/// that lost one backend together do not retry in step.
pub fn backoff(failures: u32) -> Duration {
    let base = BACKOFF_FIRST
        .saturating_mul(1 << failures.saturating_sub(1).min(16))
        .min(BACKOFF_MAX);
    base.mul_f64(0.5 + fastrand::f64())
}

/// The first retry's delay (before jitter).
pub const BACKOFF_FIRST: Duration = Duration::from_secs(1);
/// The longest delay between retries (before jitter): a backend back is found within it.
pub const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Opens each backend's spool and starts its exporter on the current runtime: a writer
/// task that encodes each queued window into the spool, and a sender task that sends the
/// spool's entries oldest first, retrying with [`backoff`]. The task returned ends once the
/// [`Queue`] is dropped and each spool is empty or its backend failed once more (what is left
/// stays spooled for the next start).
pub fn start(
    config: &ExportConfig,
    host: String,
    metrics: Arc<Metrics>,
) -> Result<(Queue, tokio::task::JoinHandle<()>)> {
    let mut backends = Vec::new();
    if let Some(otlp) = &config.otlp {
        backends.push(Backend::Otlp(Transport::new(otlp)?));
    }
    if let Some(pyroscope) = &config.pyroscope {
        backends.push(Backend::Pyroscope(pyroscope::Client::new(pyroscope)?));
    }
    let mut queue = Queue {
        backends: Vec::new(),
    };
    let mut tasks = Vec::new();
    for backend in backends {
        let name = backend.name();
        let dir = config.spool_dir.join(name);
        // A state directory another user could write in is refused (its own exit code).
        let spool = Spool::open(&dir, config.spool_limit).map_err(Error::from)?;
        let (entries, bytes) = spool.size();
        if entries > 0 {
            log::info!(
                "{name}: {entries} entries ({bytes} bytes) spooled by an earlier run: sending them first"
            );
        }
        metrics.spool_size(name, spool.size());
        let spool = Arc::new(spool);
        let (tx, rx) = tokio::sync::mpsc::channel::<Arc<Window>>(QUEUE_WINDOWS);
        let (closed_tx, closed_rx) = tokio::sync::watch::channel(false);
        let added = Arc::new(tokio::sync::Notify::new());
        let backend = Arc::new(backend);
        let writer = write_spool(
            rx,
            host.clone(),
            Arc::clone(&backend),
            Arc::clone(&spool),
            Arc::clone(&metrics),
            Arc::clone(&added),
            closed_tx,
        );
        let sender = send_spool(backend, spool, Arc::clone(&metrics), added, closed_rx);
        tasks.push(tokio::spawn(async move {
            tokio::join!(writer, sender);
        }));
        queue.backends.push((name, tx));
    }
    let task = tokio::spawn(async move {
        for task in tasks {
            let _ = task.await;
        }
    });
    Ok((queue, task))
}

/// Encodes each window from the queue into the spool (on a blocking thread: encoding and a
/// synced write), then says it closed once the queue is.
async fn write_spool(
    mut rx: tokio::sync::mpsc::Receiver<Arc<Window>>,
    host: String,
    backend: Arc<Backend>,
    spool: Arc<Spool>,
    metrics: Arc<Metrics>,
    added: Arc<tokio::sync::Notify>,
    closed: tokio::sync::watch::Sender<bool>,
) {
    let name = backend.name();
    while let Some(window) = rx.recv().await {
        let (host, into, backend) = (host.clone(), Arc::clone(&spool), Arc::clone(&backend));
        let written = tokio::task::spawn_blocking(move || {
            let mut dropped = 0;
            for entry in backend.entries(&window, &host)? {
                dropped += into.add(&entry)?.dropped;
            }
            Ok::<u64, std::io::Error>(dropped)
        })
        .await;
        match written {
            Ok(Ok(dropped)) => metrics.export_n(name, "dropped", dropped),
            Ok(Err(e)) => {
                log::warn!("{name}: spooling a window failed: {e}");
                metrics.export(name, "dropped");
            }
            Err(e) => {
                log::error!("{name}: encoding a window failed: {e}");
                metrics.export(name, "dropped");
            }
        }
        metrics.spool_size(name, spool.size());
        added.notify_one();
    }
    let _ = closed.send(true);
    added.notify_one();
}

/// Removes a spooled entry, or sets it aside (`reject`), on a blocking thread (file I/O).
async fn forget(spool: &Arc<Spool>, entry: crate::agent::spool::Entry, reject: bool) {
    let spool = Arc::clone(spool);
    let _ = tokio::task::spawn_blocking(move || {
        if reject {
            spool.reject(&entry);
        } else {
            spool.remove(&entry);
        }
    })
    .await;
}

/// Sends the spool's entries oldest first until the writer closed and the spool is empty,
/// or, once closed, an attempt fails.
async fn send_spool(
    backend: Arc<Backend>,
    spool: Arc<Spool>,
    metrics: Arc<Metrics>,
    added: Arc<tokio::sync::Notify>,
    mut closed: tokio::sync::watch::Receiver<bool>,
) {
    let name = backend.name();
    let mut failures = 0u32;
    loop {
        let (reading, preparing) = (Arc::clone(&spool), Arc::clone(&backend));
        let oldest = tokio::task::spawn_blocking(move || {
            let (entry, body) = reading.oldest()?;
            Some((entry, body.map(|b| (b.len(), preparing.prepare(&b)))))
        })
        .await;
        let Ok(oldest) = oldest else {
            return;
        };
        let Some((entry, body)) = oldest else {
            if *closed.borrow() {
                return;
            }
            added.notified().await;
            continue;
        };
        let (bytes, prepared) = match body {
            Ok(body) => body,
            Err(e) => {
                log::warn!("{name}: a spooled window is unreadable, dropped: {e}");
                forget(&spool, entry, false).await;
                metrics.export(name, "dropped");
                continue;
            }
        };
        match backend.send(prepared).await {
            Outcome::Sent => {
                forget(&spool, entry, false).await;
                failures = 0;
                metrics.export(name, "sent");
                metrics
                    .export_bytes
                    .get_or_create(&vec![("backend", name)])
                    .inc_by(bytes as u64);
            }
            Outcome::Rejected(why) => {
                log::warn!("{name}: the backend refused a window ({why}): set aside");
                forget(&spool, entry, true).await;
                metrics.export(name, "rejected");
            }
            Outcome::Retry(why) => {
                failures = failures.saturating_add(1);
                metrics.export(name, "retried");
                if *closed.borrow() {
                    log::warn!(
                        "{name}: export failed ({why}); the spooled windows wait for the next start"
                    );
                    return;
                }
                let delay = backoff(failures);
                log::warn!("{name}: export failed ({why}); retrying in {delay:.1?}");
                // Woken early only to end (the windows stay spooled).
                let _ = tokio::time::timeout(delay, closed.wait_for(|c| *c)).await;
            }
        }
        metrics.spool_size(name, spool.size());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_and_headers_are_checked() {
        let ok = OtlpConfig::new(
            "http://collector:4318",
            Protocol::HttpProtobuf,
            &[
                "Authorization=Bearer abc".into(),
                "x-scope-orgid = t1".into(),
            ],
        )
        .unwrap();
        assert_eq!(ok.headers[0].0.as_str(), "authorization");
        assert_eq!(ok.headers[0].1.to_str().unwrap(), "Bearer abc");
        assert_eq!(ok.headers[1].1.to_str().unwrap(), "t1");
        for bad in ["collector:4318", "ftp://x", "http://", "not a url"] {
            assert!(
                matches!(
                    OtlpConfig::new(bad, Protocol::Grpc, &[]),
                    Err(Error::Usage(_))
                ),
                "{bad}"
            );
        }
        for bad in ["novalue", "bad key=v", "k=line\nbreak"] {
            assert!(
                matches!(
                    OtlpConfig::new("http://c:1", Protocol::Grpc, &[bad.into()]),
                    Err(Error::Usage(_))
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn the_sdks_header_list_is_split_and_percent_decoded() {
        let headers =
            parse_header_list("Authorization=Bearer%20a%2Cb%3Dc, x-scope-orgid=t1,,").unwrap();
        let pairs: Vec<(&str, &str)> = headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.to_str().unwrap()))
            .collect();
        assert_eq!(
            pairs,
            vec![("authorization", "Bearer a,b=c"), ("x-scope-orgid", "t1")]
        );
        assert!(parse_header_list("").unwrap().is_empty());
        for bad in ["novalue", "a=b,bad key=v", "k=line%0Abreak", "k=%FF"] {
            assert!(
                matches!(parse_header_list(bad), Err(Error::Usage(_))),
                "{bad}"
            );
        }
        // Added to --otlp-header's.
        let config = OtlpConfig::new("http://c:1", Protocol::Grpc, &["a=1".into()])
            .unwrap()
            .with_header_list("b=2")
            .unwrap();
        assert_eq!(config.headers.len(), 2);
    }

    #[test]
    fn a_signal_endpoint_is_posted_to_as_it_is() {
        let base = OtlpConfig::new("http://c:4318/otlp/", Protocol::HttpProtobuf, &[]).unwrap();
        assert_eq!(
            base.http_url().unwrap().as_str(),
            "http://c:4318/otlp/v1development/profiles"
        );
        let signal = OtlpConfig::new("http://c:4318/custom/profiles", Protocol::HttpProtobuf, &[])
            .unwrap()
            .with_signal_url();
        assert_eq!(
            signal.http_url().unwrap().as_str(),
            "http://c:4318/custom/profiles"
        );
    }

    #[test]
    fn a_ca_file_must_hold_a_pem_certificate() {
        let dir = tempfile::tempdir().unwrap();
        let config = || OtlpConfig::new("https://c:4318", Protocol::HttpProtobuf, &[]).unwrap();
        let missing = dir.path().join("missing.pem");
        let text = dir.path().join("not-pem.txt");
        std::fs::write(&text, "not a certificate").unwrap();
        for bad in [&missing, &text] {
            assert!(
                matches!(config().with_ca_cert(bad), Err(Error::Usage(_))),
                "{}",
                bad.display()
            );
        }
    }

    #[test]
    fn retries_back_off_exponentially_with_jitter_up_to_a_cap() {
        for _ in 0..100 {
            let first = backoff(1);
            assert!(first >= BACKOFF_FIRST / 2 && first < BACKOFF_FIRST * 3 / 2);
            let third = backoff(3);
            assert!(third >= BACKOFF_FIRST * 2 && third < BACKOFF_FIRST * 6);
            let late = backoff(1000);
            assert!(late >= BACKOFF_MAX / 2 && late < BACKOFF_MAX * 3 / 2);
        }
    }

    #[test]
    fn failures_are_retried_or_refused_as_otlp_says() {
        use reqwest::StatusCode;
        assert_eq!(http_outcome(StatusCode::OK), Outcome::Sent);
        for retried in [429, 500, 502, 503, 504] {
            let status = StatusCode::from_u16(retried).unwrap();
            assert!(
                matches!(http_outcome(status), Outcome::Retry(_)),
                "{retried}"
            );
        }
        for refused in [400, 401, 403, 404, 413] {
            let status = StatusCode::from_u16(refused).unwrap();
            assert!(
                matches!(http_outcome(status), Outcome::Rejected(_)),
                "{refused}"
            );
        }
        assert!(matches!(
            grpc_outcome(&tonic::Status::unavailable("down")),
            Outcome::Retry(_)
        ));
        assert!(matches!(
            grpc_outcome(&tonic::Status::invalid_argument("bad")),
            Outcome::Rejected(_)
        ));
    }
}
