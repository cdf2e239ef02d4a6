//! TLS for the agent's TCP endpoint (`--listen-tls-cert`, `--listen-tls-key`), on rustls:
//! a scraper on another machine reads profiles (executable paths, function names, run
//! tags) and sends the `--listen-token-file` token; over plain TCP both cross the network in
//! the clear. TLS changes nothing of who sees what (the peer's uid or the token decides,
//! as without it); it keeps the token and the profiles from the wire and proves the agent
//! to the scraper. A connection that does not complete a TLS handshake within
//! [`crate::agent::http::HEADER_TIMEOUT`] is closed: plain HTTP is not served on a TLS port.

use std::{os::unix::fs::PermissionsExt, path::Path, sync::Arc};

use rustls::pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

use crate::error::{Error, Result};

/// The acceptor for the certificate chain in `cert` and the private key in `key` (both PEM);
/// the key must be readable by its owner alone, as a token file, and owned by the agent's
/// own user (a key another user could read or replace lets them pose as the agent).
pub fn acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor> {
    let refuse = |path: &Path, flag: &str, reason: String| Error::InvalidTarget {
        spec: path.display().to_string(),
        reason: format!("{flag}: {reason}"),
    };
    let meta =
        std::fs::metadata(key).map_err(|e| refuse(key, "--listen-tls-key", e.to_string()))?;
    let me = rustix::process::geteuid().as_raw();
    if std::os::unix::fs::MetadataExt::uid(&meta) != me {
        return Err(refuse(
            key,
            "--listen-tls-key",
            format!(
                "owned by uid {}, not by the agent's uid {me}",
                std::os::unix::fs::MetadataExt::uid(&meta)
            ),
        ));
    }
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(refuse(
            key,
            "--listen-tls-key",
            format!(
                "readable or writable by group or others (mode {:o}): chmod 600 it",
                meta.permissions().mode() & 0o777
            ),
        ));
    }
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect())
        .map_err(|e| refuse(cert, "--listen-tls-cert", e.to_string()))?;
    if chain.is_empty() {
        return Err(refuse(
            cert,
            "--listen-tls-cert",
            "no PEM certificate in it".into(),
        ));
    }
    let key_der = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| refuse(key, "--listen-tls-key", e.to_string()))?;
    // The process-wide default provider is not relied on: reqwest's (the exporter's) and
    // this one are the same crate, named here so that nothing else can change it.
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .and_then(|b| b.with_no_client_auth().with_single_cert(chain, key_der))
        .map_err(|e| {
            refuse(
                cert,
                "--listen-tls-cert/--listen-tls-key",
                format!("not a usable certificate and key: {e}"),
            )
        })?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_others_may_read_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
        std::fs::write(&cert, "").unwrap();
        std::fs::write(&key, "").unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = acceptor(&cert, &key).err().expect("refused").to_string();
        assert!(e.contains("chmod 600"), "{e}");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        let e = acceptor(&cert, &key).err().expect("refused").to_string();
        assert!(e.contains("no PEM certificate"), "{e}");
    }
}
