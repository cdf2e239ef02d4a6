//! Push to Grafana Pyroscope (`--pyroscope-url`): each window, one request per service, as
//! Pyroscope's ingest API takes a pprof: `POST {url}/ingest?name=SERVICE.cpu{host=HOST}
//! &from=START&until=END&format=pprof&sampleRate=HZ` with the service's processes' pprof
//! (the same writer as every pprof bpfprof makes: `pid`, `comm`, `service_name`, ... as
//! sample labels), `--pyroscope-tenant` as `X-Scope-OrgID`, `--pyroscope-user` as basic auth.
//!
//! A request waits in the export spool as JSON (`query`, and the gzipped pprof in base64), so
//! that a spooled request is sent exactly as it was built.

use std::{collections::BTreeMap, time::UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::{
    agent::{
        export::{error_chain, http_outcome, Outcome, Prepared, REQUEST_TIMEOUT},
        windows::Window,
    },
    error::{Error, Result},
    output::pprof,
    profile::Profile,
};

/// The profile type Pyroscope files the samples under (`SERVICE.cpu`).
const PROFILE_SUFFIX: &str = ".cpu";
/// The service of processes without a `service_name` label.
const UNKNOWN_SERVICE: &str = "unknown";

/// Where and how to push, validated.
#[derive(Clone, Debug)]
pub struct PyroscopeConfig {
    /// The server's base URL.
    pub url: reqwest::Url,
    /// The tenant, sent as `X-Scope-OrgID`.
    pub tenant: Option<String>,
    /// Basic auth: user and password.
    pub basic_auth: Option<(String, String)>,
}

impl PyroscopeConfig {
    /// Validates the URL, the tenant and `USER:PASSWORD`.
    pub fn new(url: &str, tenant: Option<&str>, user: Option<&str>) -> Result<PyroscopeConfig> {
        let usage = |what: String| Error::Usage(what);
        let parsed =
            reqwest::Url::parse(url).map_err(|e| usage(format!("--pyroscope-url {url:?}: {e}")))?;
        if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
            return Err(usage(format!(
                "--pyroscope-url {url:?} is not an http:// or https:// URL with a host"
            )));
        }
        if let Some(t) = tenant {
            reqwest::header::HeaderValue::from_str(t)
                .map_err(|_| usage(format!("--pyroscope-tenant {t:?}: not a header value")))?;
        }
        let basic_auth = match user {
            None => None,
            Some(u) => {
                let (user, password) = u
                    .split_once(':')
                    .ok_or_else(|| usage("--pyroscope-user: expected USER:PASSWORD".to_string()))?;
                Some((user.to_string(), password.to_string()))
            }
        };
        Ok(PyroscopeConfig {
            url: parsed,
            tenant: tenant.map(str::to_string),
            basic_auth,
        })
    }
}

/// One ingest request: its query string and its body (a gzipped pprof).
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Request {
    /// `name=...&from=...&until=...&format=pprof&sampleRate=...`, encoded.
    pub query: String,
    /// The body, base64 in the spool.
    #[serde(with = "base64_bytes")]
    pub body: Vec<u8>,
}

mod base64_bytes {
    use base64::Engine;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(serde::de::Error::custom)
    }
}

/// A label value as Pyroscope's `name{k=v,...}` syntax can hold it: its separators
/// (`{`, `}`, `,`, `=`) and anything outside printable ASCII replaced by `_`.
fn name_part(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_graphic() && !matches!(c, '{' | '}' | ',' | '=' | '"') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The service each process of `profile` belongs to (its `service_name` label).
fn service_of(profile: &Profile, pid: u32) -> &str {
    profile
        .process_labels
        .get(&pid)
        .and_then(|labels| labels.iter().find(|(k, _)| k == "service_name"))
        .map_or(UNKNOWN_SERVICE, |(_, v)| v.as_str())
}

/// The ingest requests of a window: one per service, in service order.
pub fn requests(window: &Window, host: &str) -> std::io::Result<Vec<Request>> {
    let profile = &window.profile;
    let services: BTreeMap<&str, ()> = profile
        .stacks
        .iter()
        .filter_map(|s| profile.stack_pid(s))
        .map(|pid| (service_of(profile, pid), ()))
        .collect();
    let secs = |t: std::time::SystemTime| t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (from, until) = (
        secs(window.start),
        secs(window.end).max(secs(window.start) + 1),
    );
    let hz = profile.meta.sampling.nominal_hz.round().max(1.0) as u64;
    let mut out = Vec::with_capacity(services.len());
    for service in services.keys() {
        let Some(part) = Profile::merge(&[profile], |pid| service_of(profile, pid) == *service)
        else {
            continue;
        };
        let mut body = Vec::new();
        pprof::write(&part, &mut body)?;
        let name = format!(
            "{}{PROFILE_SUFFIX}{{host={}}}",
            name_part(service),
            name_part(host)
        );
        let query = url::form_urlencoded::Serializer::new(String::new())
            .append_pair("name", &name)
            .append_pair("from", &from.to_string())
            .append_pair("until", &until.to_string())
            .append_pair("format", "pprof")
            .append_pair("sampleRate", &hz.to_string())
            .append_pair("spyName", "bpfprof")
            .finish();
        out.push(Request { query, body });
    }
    Ok(out)
}

/// The client of one Pyroscope server.
pub struct Client {
    client: reqwest::Client,
    config: PyroscopeConfig,
}

impl Client {
    /// A client for `config`.
    pub fn new(config: &PyroscopeConfig) -> Result<Client> {
        let client = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .build()
            .map_err(|e| Error::Other(anyhow::anyhow!("Pyroscope client: {e}")))?;
        Ok(Client {
            client,
            config: config.clone(),
        })
    }

    /// Sends one request.
    pub async fn send(&self, request: Request) -> Outcome {
        let mut url = self.config.url.clone();
        let base = url.path().trim_end_matches('/').to_string();
        url.set_path(&format!("{base}/ingest"));
        url.set_query(Some(&request.query));
        let mut post = self
            .client
            .post(url)
            .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
            .body(request.body);
        if let Some(tenant) = &self.config.tenant {
            post = post.header("X-Scope-OrgID", tenant);
        }
        if let Some((user, password)) = &self.config.basic_auth {
            post = post.basic_auth(user, Some(password));
        }
        match post.send().await {
            Err(e) => Outcome::Retry(error_chain(&e)),
            Ok(r) => http_outcome(r.status()),
        }
    }
}

/// A spooled request read back (its JSON), ready to send.
pub fn prepare(entry: &[u8]) -> Prepared {
    match serde_json::from_slice(entry) {
        Ok(request) => Prepared::Pyroscope(request),
        Err(e) => Prepared::Broken(format!("unreadable spooled request: {e}")),
    }
}

/// A request as the spool keeps it.
pub fn to_entry(request: &Request) -> Vec<u8> {
    // Serializing plain strings cannot fail.
    serde_json::to_vec(request).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::fixture;
    use std::time::Duration;

    #[test]
    fn one_request_per_service_with_pyroscopes_query() {
        let mut profile = fixture::profile();
        profile
            .process_labels
            .insert(1234, vec![("service_name".into(), "shop{a=b}".into())]);
        let window = Window {
            start: UNIX_EPOCH + Duration::from_secs(1000),
            end: UNIX_EPOCH + Duration::from_secs(1010),
            profile,
            owners: Default::default(),
        };
        let requests = requests(&window, "box 1").unwrap();
        assert_eq!(requests.len(), 1);
        let query: BTreeMap<String, String> =
            url::form_urlencoded::parse(requests[0].query.as_bytes())
                .into_owned()
                .collect();
        assert_eq!(query["name"], "shop_a_b_.cpu{host=box_1}");
        assert_eq!(query["from"], "1000");
        assert_eq!(query["until"], "1010");
        assert_eq!(query["format"], "pprof");
        // A gzipped pprof, and the spool's JSON keeps it byte for byte.
        assert_eq!(&requests[0].body[..2], &[0x1f, 0x8b]);
        let entry = to_entry(&requests[0]);
        let back: Request = serde_json::from_slice(&entry).unwrap();
        assert_eq!(back, requests[0]);
    }

    #[test]
    fn settings_are_checked() {
        assert!(PyroscopeConfig::new("http://p:4040", Some("t1"), Some("u:p")).is_ok());
        for (url, tenant, user) in [
            ("p:4040", None, None),
            ("http://p:4040", Some("a\nb"), None),
            ("http://p:4040", None, Some("nopassword")),
        ] {
            assert!(matches!(
                PyroscopeConfig::new(url, tenant, user),
                Err(Error::Usage(_))
            ));
        }
    }
}
