//! `bpfprof agent --listen ADDR --listen-tls-cert --listen-tls-key`: the endpoint over TLS
//! (issue 41), scraped as a remote scraper does, with a self-signed certificate made by the
//! `openssl` command line for the test: the bearer token over TLS shows every process, a
//! wrong token is answered 401, plain HTTP on the TLS port gets no answer, and a key others
//! may read is refused at start.

use std::{os::unix::fs::PermissionsExt, path::Path, process::Command, time::Duration};

use bpfprof_tests::{
    agent::{free_port, go_pprof_bytes},
    bpfprof_bin, needs_root, poll_until, run_bpfprof, spawn_bpfprof_command, tempdir, Workload,
};

/// The token the agent is given.
const TOKEN: &str = "tls-test-token-0123456789abcdef";

/// What one `GET` got.
#[derive(Debug)]
struct Got {
    status: u16,
    body: Vec<u8>,
    error: String,
}

/// `GET path` on 127.0.0.1:`port` by Python's `http.client`, over TLS checked against `ca`
/// (`None`: plain HTTP), with `token` as the bearer token if given.
fn get(port: u16, ca: Option<&Path>, token: Option<&str>, path: &str) -> Got {
    let script = r#"
import sys, json, ssl, http.client
port, ca, token, path = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
meta = {"status": 0, "error": ""}
try:
    if ca:
        ctx = ssl.create_default_context(cafile=ca)
        c = http.client.HTTPSConnection("127.0.0.1", port, timeout=60, context=ctx)
    else:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("GET", path, headers={"Authorization": "Bearer " + token} if token else {})
    r = c.getresponse()
    sys.stdout.buffer.write(r.read())
    meta["status"] = r.status
except Exception as e:
    meta["error"] = repr(e)
sys.stderr.write("\n" + json.dumps(meta) + "\n")
"#;
    let ca = ca.map(|p| p.display().to_string()).unwrap_or_default();
    let out = Command::new("python3")
        .args([
            "-c",
            script,
            &port.to_string(),
            &ca,
            token.unwrap_or(""),
            path,
        ])
        .output()
        .expect("python3");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let meta: serde_json::Value = stderr
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("the fetch script said: {stderr}"));
    Got {
        status: meta["status"].as_u64().unwrap_or(0) as u16,
        body: out.stdout,
        error: meta["error"].as_str().unwrap_or_default().to_string(),
    }
}

/// A self-signed certificate for 127.0.0.1 and its key (mode 600), made by `openssl`.
fn self_signed(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let made = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
        ])
        .args(["-nodes", "-days", "1", "-subj", "/CN=bpfprof-test"])
        .args(["-addext", "subjectAltName=IP:127.0.0.1"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("openssl");
    assert!(
        made.status.success(),
        "openssl: {}",
        String::from_utf8_lossy(&made.stderr)
    );
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    (cert, key)
}

#[test]
fn agent_http_over_tls_serves_the_token_and_refuses_plain_http() {
    needs_root!();
    let dir = tempdir();
    let (cert, key) = self_signed(dir.path());
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, TOKEN).unwrap();
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let spinner = Workload::spawn("spinner", &["120"]);
    let port = free_port();
    let (cert_s, key_s, token_s) = (
        cert.display().to_string(),
        key.display().to_string(),
        token_file.display().to_string(),
    );
    let mut cmd = Command::new(bpfprof_bin());
    cmd.args(["agent", "--listen", &format!("127.0.0.1:{port}")])
        .args(["--listen-tls-cert", &cert_s, "--listen-tls-key", &key_s])
        .args(["--listen-token-file", &token_s])
        .args(["-F", "99", "--window", "1s"]);
    let agent = spawn_bpfprof_command(cmd);
    poll_until(Duration::from_secs(90), || {
        let got = get(port, Some(&cert), Some(TOKEN), "/metrics");
        String::from_utf8_lossy(&got.body)
            .lines()
            .any(|l| {
                l.strip_prefix("bpfprof_agent_windows_total ")
                    .and_then(|v| v.trim().parse::<f64>().ok())
                    .is_some_and(|n| n >= 2.0)
            })
            .then_some(())
    })
    .unwrap_or_else(|| panic!("no window over TLS:\n{}", agent.stderr_so_far()));

    // The token over TLS: every process, as a pprof.
    let got = get(
        port,
        Some(&cert),
        Some(TOKEN),
        "/debug/pprof/profile?seconds=2",
    );
    assert_eq!(got.status, 200, "{}", got.error);
    assert_eq!(&got.body[..2], &[0x1f, 0x8b], "not a gzipped pprof");
    if let Some(samples) = go_pprof_bytes(&got.body, dir.path(), "tls.pb") {
        let pid = spinner.pid().to_string();
        assert!(
            samples.iter().any(|s| s.labels.get("pid") == Some(&pid)),
            "the spinner ({pid}) is not in the profile served over TLS"
        );
    }
    // A wrong token over TLS: 401.
    let wrong = get(
        port,
        Some(&cert),
        Some("not-the-token-0123456789"),
        "/debug/pprof/profile?seconds=1",
    );
    assert_eq!(wrong.status, 401, "a wrong token: {wrong:?}");
    // Plain HTTP on the TLS port: no HTTP answer at all.
    let plain = get(port, None, Some(TOKEN), "/metrics");
    eprintln!(
        "TLS: {} bytes of pprof with the token; a wrong token {}; plain HTTP: status {} ({})",
        got.body.len(),
        wrong.status,
        plain.status,
        plain.error
    );
    assert_eq!(plain.status, 0, "plain HTTP was answered: {plain:?}");
    assert!(plain.body.is_empty(), "plain HTTP got bytes: {plain:?}");
    // The refused handshake is counted.
    let m = get(port, Some(&cert), Some(TOKEN), "/metrics");
    let m = String::from_utf8_lossy(&m.body);
    let handshakes = m
        .lines()
        .find_map(|l| {
            l.strip_prefix(
                "bpfprof_agent_http_connections_refused_total{reason=\"tls_handshake\"} ",
            )
        })
        .and_then(|v| v.trim().parse::<f64>().ok());
    assert!(
        handshakes.is_some_and(|n| n >= 1.0),
        "the refused handshake is not counted: {handshakes:?}\n{m}"
    );
    agent.signal(libc::SIGTERM);
    agent.wait_timeout(Duration::from_secs(60)).assert_code(0);

    // A key others may read is refused before anything is served.
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let refused = run_bpfprof(
        [
            "agent",
            "--listen",
            &format!("127.0.0.1:{}", free_port()),
            "--listen-tls-cert",
            &cert_s,
            "--listen-tls-key",
            &key_s,
        ],
        Duration::from_secs(60),
    );
    assert_ne!(refused.code(), 0, "the agent served with a readable key");
    refused.assert_stderr_mentions(&["--listen-tls-key", "chmod 600"]);
}
