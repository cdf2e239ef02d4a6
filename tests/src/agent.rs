//! What the agent's tests share: a free port, the agent started and waited for, its
//! `/metrics` through the Prometheus project's parser, its pprof through `go tool pprof -raw`,
//! and a cgroup of the test's own.

use std::{collections::BTreeMap, path::Path, process::Command, time::Duration};

use crate::{bpfprof_bin, ci, poll_until, spawn_bpfprof_command, BpfprofProcess};

/// A free TCP port on loopback (the agent binds it right after).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The agent's metrics, parsed by `prometheus_client`'s OpenMetrics parser (the format the
/// agent serves): every sample as `name{labels}` -> value. Panics when the text does not parse.
pub fn metrics(port: u16) -> BTreeMap<String, f64> {
    let script = r#"
import sys, json, urllib.request
from prometheus_client.openmetrics.parser import text_string_to_metric_families
text = urllib.request.urlopen("http://127.0.0.1:%s/metrics" % sys.argv[1], timeout=30).read().decode()
out = {}
for family in text_string_to_metric_families(text):
    for s in family.samples:
        labels = ",".join("%s=%s" % kv for kv in sorted(s.labels.items()))
        out[s.name + ("{" + labels + "}" if labels else "")] = s.value
print(json.dumps(out))
"#;
    let out = crate::output_ok(
        Command::new("python3").args(["-c", script, &port.to_string()]),
        "/metrics through the OpenMetrics parser",
    );
    serde_json::from_slice(&out.stdout).expect("the parser's JSON")
}

/// A sample of `go tool pprof -raw`: its count, the function of its leaf location, its labels.
#[derive(Debug)]
pub struct RawSample {
    /// Its count (the first value).
    pub count: u64,
    /// Every value, in the order of the profile's sample types.
    pub values: Vec<u64>,
    /// The function of its leaf location.
    pub leaf: String,
    /// The function of each location, leaf first (a location's innermost line).
    pub frames: Vec<String>,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
}

/// The sample types of pprof's `-raw` text (`samples/count cpu/nanoseconds ...`), in order,
/// without the `[dflt]` mark of the default one.
pub fn raw_sample_types(raw: &str) -> Vec<String> {
    raw.lines()
        .skip_while(|l| *l != "Samples:")
        .nth(1)
        .map(|l| {
            l.split_whitespace()
                .map(|t| t.trim_end_matches("[dflt]").to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// `go tool pprof -raw URL`, Go's own pprof fetching the profile over HTTP as it would from
/// any `net/http/pprof` server; `None` (outside CI) where Go is missing.
pub fn go_pprof_url(url: &str, home: &Path) -> Option<Vec<RawSample>> {
    go_pprof_url_typed(url, home).map(|(_, samples)| samples)
}

/// [`go_pprof_url`] with the sample types of the profile, for profiles with several values.
pub fn go_pprof_url_typed(url: &str, home: &Path) -> Option<(Vec<String>, Vec<RawSample>)> {
    let out = match Command::new("go")
        .args(["tool", "pprof", "-raw", url])
        .env("HOME", home)
        .output()
    {
        Ok(out) => out,
        Err(e) => {
            assert!(!ci(), "go is needed under CI (cargo xtask setup): {e}");
            eprintln!("skipping: go is missing: {e}");
            return None;
        }
    };
    let raw = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "go tool pprof {url} failed: {}\n{raw}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some((raw_sample_types(&raw), parse_raw(&raw)))
}

/// The samples of pprof's `-raw` text, leaf functions named from its `Locations`.
pub fn parse_raw(raw: &str) -> Vec<RawSample> {
    let location = regex::Regex::new(r"^\s+(\d+): (?:0x[0-9a-f]+ )?(?:M=\d+ )?(\S+)").unwrap();
    // Every value of the sample, then its locations, leaf first.
    let sample = regex::Regex::new(r"^\s+(\d+(?:\s+\d+)*): ([\d ]+)$").unwrap();
    // A value may hold `]` itself (`[exited process]`): it ends at `]` before a space or the end.
    let label = regex::Regex::new(r"(\w+):\[(.*?)\](?:\s|$)").unwrap();
    let mut functions = BTreeMap::new();
    for line in raw
        .lines()
        .skip_while(|l| *l != "Locations")
        .take_while(|l| *l != "Mappings")
    {
        if let Some(c) = location.captures(line) {
            functions.insert(c[1].to_string(), c[2].to_string());
        }
    }
    let mut samples: Vec<RawSample> = Vec::new();
    for line in raw
        .lines()
        .skip_while(|l| *l != "Samples:")
        .take_while(|l| *l != "Locations")
    {
        if let Some(c) = sample.captures(line) {
            let values: Vec<u64> = c[1]
                .split_whitespace()
                .map(|v| v.parse().unwrap())
                .collect();
            let frames: Vec<String> = c[2]
                .split_whitespace()
                .map(|id| functions.get(id).cloned().unwrap_or_default())
                .collect();
            samples.push(RawSample {
                count: values[0],
                values,
                leaf: frames.first().cloned().unwrap_or_default(),
                frames,
                labels: BTreeMap::new(),
            });
        } else if let Some(last) = samples.last_mut() {
            for c in label.captures_iter(line) {
                last.labels.insert(c[1].to_string(), c[2].to_string());
            }
        }
    }
    samples
}

/// Starts the agent on `port` with `args`, and waits until it has cut `windows` windows.
pub fn start_agent(port: u16, args: &[&str], windows: f64) -> BpfprofProcess {
    start_agent_with_env(port, args, &[], windows)
}

/// [`start_agent`] with `env` added to the agent's environment.
pub fn start_agent_with_env(
    port: u16,
    args: &[&str],
    env: &[(&str, &str)],
    windows: f64,
) -> BpfprofProcess {
    let listen = format!("127.0.0.1:{port}");
    let mut cmd = Command::new(bpfprof_bin());
    cmd.args(["agent", "--listen", &listen])
        .args(args)
        .envs(env.iter().copied());
    let agent = spawn_bpfprof_command(cmd);
    poll_until(Duration::from_secs(60), || {
        let up = std::net::TcpStream::connect(("127.0.0.1", port)).is_ok();
        (up && metrics(port)["bpfprof_agent_windows_total"] >= windows).then_some(())
    })
    .unwrap_or_else(|| panic!("the agent cut no window:\n{}", agent.stderr_so_far()));
    agent
}

/// Samples of `pid`, by leaf function.
pub fn leaves(samples: &[RawSample], pid: u32) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for s in samples
        .iter()
        .filter(|s| s.labels.get("pid") == Some(&pid.to_string()))
    {
        *out.entry(s.leaf.clone()).or_default() += s.count;
    }
    out
}

/// A cgroup v2 of its own, removed on drop (its processes killed first).
pub struct TestCgroup {
    path: std::path::PathBuf,
    root: std::path::PathBuf,
    /// The path `--cgroup` takes: relative to the cgroup2 mount.
    pub relative: String,
}

impl TestCgroup {
    /// A cgroup at `relative` under the cgroup2 mount (its parents made as needed, and
    /// removed on drop too).
    pub fn named(relative: &str) -> TestCgroup {
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
        let root = mounts
            .lines()
            .find_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.get(2) == Some(&"cgroup2")).then(|| f[1].to_string())
            })
            .expect("a cgroup2 mount");
        let path = Path::new(&root).join(relative);
        std::fs::create_dir_all(&path).unwrap();
        TestCgroup {
            path,
            root: root.into(),
            relative: relative.to_string(),
        }
    }

    /// Moves `pid` into it.
    pub fn add(&self, pid: u32) {
        std::fs::write(self.path.join("cgroup.procs"), pid.to_string()).unwrap();
    }
}

/// Kills the processes of the test's own cgroup at `path` and removes it (once they are gone).
pub fn remove_cgroup(path: &Path) {
    let procs = std::fs::read_to_string(path.join("cgroup.procs")).unwrap_or_default();
    for pid in procs
        .split_whitespace()
        .filter_map(|p| p.parse::<i32>().ok())
    {
        // SAFETY: kill(2) of the test's own processes, in its own cgroup.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    let _ = poll_until(Duration::from_secs(10), || std::fs::remove_dir(path).ok());
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        remove_cgroup(&self.path);
        // And the parents made for it, innermost first.
        for dir in self.path.ancestors().skip(1) {
            if !dir.starts_with(&self.root) || dir == self.root {
                break;
            }
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// Where an agent serves HTTP: a TCP port on loopback, or a Unix socket.
#[derive(Clone, Debug)]
pub enum Endpoint {
    /// `--listen 127.0.0.1:PORT`.
    Tcp(u16),
    /// `--listen unix:PATH`.
    Unix(std::path::PathBuf),
}

impl Endpoint {
    /// Its `--listen` value.
    pub fn listen(&self) -> String {
        match self {
            Endpoint::Tcp(port) => format!("127.0.0.1:{port}"),
            Endpoint::Unix(path) => format!("unix:{}", path.display()),
        }
    }
}

/// What one `GET` got: its status (0 when no answer came), how long it took, its body.
#[derive(Debug)]
pub struct Fetched {
    /// The HTTP status, 0 when there was no answer.
    pub status: u16,
    /// Seconds from the connect to the end of the body.
    pub seconds: f64,
    /// The body.
    pub body: Vec<u8>,
    /// Why there was no answer.
    pub error: String,
}

/// One `GET path` on `endpoint` by Python's `http.client` (a Unix socket too), run as
/// `user` (root when `None`), given up after `timeout_s`.
pub fn fetch_as(
    user: Option<&crate::TestUser>,
    endpoint: &Endpoint,
    path: &str,
    timeout_s: f64,
) -> Fetched {
    let script = r#"
import sys, json, time, socket, http.client
mode, target, path, timeout = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
class UnixConnection(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(target)
start = time.monotonic()
meta = {"status": 0, "error": ""}
try:
    if mode == "unix":
        c = UnixConnection("localhost", timeout=timeout)
    else:
        c = http.client.HTTPConnection("127.0.0.1", int(target), timeout=timeout)
    c.request("GET", path)
    r = c.getresponse()
    body = r.read()
    sys.stdout.buffer.write(body)
    meta["status"] = r.status
except Exception as e:
    meta["error"] = repr(e)
meta["seconds"] = time.monotonic() - start
sys.stderr.write("\n" + json.dumps(meta) + "\n")
"#;
    let (mode, target) = match endpoint {
        Endpoint::Tcp(port) => ("tcp", port.to_string()),
        Endpoint::Unix(path) => ("unix", path.display().to_string()),
    };
    let mut cmd = match user {
        // The system Python: pyenv's shims are root's.
        Some(user) => user.command("/usr/bin/python3"),
        None => Command::new("python3"),
    };
    let out = cmd
        .args(["-c", script, mode, &target, path, &timeout_s.to_string()])
        .output()
        .expect("python3");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let meta: serde_json::Value = stderr
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("the fetch script said: {stderr}"));
    Fetched {
        status: meta["status"].as_u64().unwrap_or(0) as u16,
        seconds: meta["seconds"].as_f64().unwrap_or(f64::NAN),
        body: out.stdout,
        error: meta["error"].as_str().unwrap_or_default().to_string(),
    }
}

/// `bpfprof_agent_windows_total` from a `/metrics` body.
pub fn windows_cut(metrics: &[u8]) -> Option<f64> {
    String::from_utf8_lossy(metrics)
        .lines()
        .find_map(|l| l.strip_prefix("bpfprof_agent_windows_total "))
        .and_then(|v| v.trim().parse().ok())
}

/// Starts the agent serving on `endpoint` with `args`, and waits until it has cut `windows`
/// windows (read as root over the endpoint).
pub fn start_agent_on(endpoint: &Endpoint, args: &[&str], windows: f64) -> BpfprofProcess {
    let mut cmd = Command::new(bpfprof_bin());
    cmd.args(["agent", "--listen", &endpoint.listen()])
        .args(args);
    let agent = spawn_bpfprof_command(cmd);
    poll_until(Duration::from_secs(90), || {
        let got = fetch_as(None, endpoint, "/metrics", 10.0);
        (windows_cut(&got.body).unwrap_or(0.0) >= windows).then_some(())
    })
    .unwrap_or_else(|| panic!("the agent cut no window:\n{}", agent.stderr_so_far()));
    agent
}

/// The samples of a pprof's bytes, through `go tool pprof -raw` (written to `dir` first);
/// `None` (outside CI) where Go is missing.
pub fn go_pprof_bytes(bytes: &[u8], dir: &Path, name: &str) -> Option<Vec<RawSample>> {
    let file = dir.join(name);
    std::fs::write(&file, bytes).unwrap();
    go_pprof_url(file.to_str().unwrap(), dir)
}
