//! A profile as Grafana Pyroscope's ingest API takes it: one request per service (the
//! `service_name` label of its processes), `POST {url}/ingest?name=SERVICE.cpu{host=HOST}
//! &from=START&until=END&format=pprof&sampleRate=HZ` with the service's processes' pprof (the
//! same writer as every pprof bpfprof makes: `pid`, `comm`, `service_name`, ... as sample
//! labels). The agent's exporter sends them (`crate::agent::pyroscope`).
//!
//! A request waits in the export spool as JSON (`query`, and the gzipped pprof in base64), so
//! that a spooled request is sent exactly as it was built.

use std::{
    collections::BTreeMap,
    time::{SystemTime, UNIX_EPOCH},
};

use serde::{Deserialize, Serialize};

use crate::profile::Profile;

/// The profile type Pyroscope files the samples under (`SERVICE.cpu`).
const PROFILE_SUFFIX: &str = ".cpu";
/// The service of processes without a `service_name` label.
const UNKNOWN_SERVICE: &str = "unknown";

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

/// The ingest requests of `profile`, recorded from `start` to `end` (an agent's window, a
/// daemon's run): one per service, in service order.
pub fn requests(
    profile: &Profile,
    start: SystemTime,
    end: SystemTime,
    host: &str,
) -> std::io::Result<Vec<Request>> {
    let services: BTreeMap<&str, ()> = profile
        .stacks
        .iter()
        .filter_map(|s| profile.stack_pid(s))
        .map(|pid| (service_of(profile, pid), ()))
        .collect();
    let secs = |t: std::time::SystemTime| t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (from, until) = (secs(start), secs(end).max(secs(start) + 1));
    let hz = profile.meta.sampling.nominal_hz.round().max(1.0) as u64;
    let mut out = Vec::with_capacity(services.len());
    for service in services.keys() {
        let Some(part) = Profile::merge(&[profile], |pid| service_of(profile, pid) == *service)
        else {
            continue;
        };
        let mut body = Vec::new();
        crate::output::pprof::write(&part, &mut body)?;
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

/// A request as the spool keeps it.
pub fn to_entry(request: &Request) -> Vec<u8> {
    // Serializing plain strings cannot fail.
    serde_json::to_vec(request).unwrap_or_default()
}

/// A request read back from the spool (its JSON).
pub fn from_entry(entry: &[u8]) -> Result<Request, String> {
    serde_json::from_slice(entry).map_err(|e| format!("unreadable spooled request: {e}"))
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
        let requests = requests(
            &profile,
            UNIX_EPOCH + Duration::from_secs(1000),
            UNIX_EPOCH + Duration::from_secs(1010),
            "box 1",
        )
        .unwrap();
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
}
