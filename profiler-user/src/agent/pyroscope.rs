//! Push to Grafana Pyroscope (`--pyroscope-url`): each window, one request per service, as
//! Pyroscope's ingest API takes a pprof: `POST {url}/ingest?name=SERVICE.cpu{host=HOST}
//! &from=START&until=END&format=pprof&sampleRate=HZ` with the service's processes' pprof
//! (the same writer as every pprof bpfprof makes: `pid`, `comm`, `service_name`, ... as
//! sample labels), `--pyroscope-tenant` as `X-Scope-OrgID`, `--pyroscope-user` as basic auth.
//!
//! The requests are built beside the other formats ([`crate::output::pyroscope`]); this is
//! the client that sends them.

use crate::{
    agent::send::{error_chain, http_outcome, Outcome, Prepared, REQUEST_TIMEOUT},
    error::{Error, Result},
};

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
    pub async fn send(&self, request: crate::output::pyroscope::Request) -> Outcome {
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
    match crate::output::pyroscope::from_entry(entry) {
        Ok(request) => Prepared::Pyroscope(request),
        Err(e) => Prepared::Broken(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
