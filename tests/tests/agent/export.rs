//! `bpfprof agent --otlp-endpoint`: each window leaves the machine as OTLP profiles, read by
//! a receiver built on the official generated stubs (PyPI `opentelemetry-proto`, `grpcio`:
//! `tests/receivers/otlp_receiver.py`), over gRPC and over HTTP/protobuf, and checked against
//! the agent's own pprof of the same windows.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use bpfprof_tests::{
    agent::{
        free_port, go_pprof_url, leaves, metrics, start_agent, start_agent_with_env, TestCgroup,
    },
    assert_hotcold_split,
    hostile::{cli, run_id_of},
    needs_root, poll_until, run_bpfprof, tempdir, test_user, workload_as, world_executable_bpfprof,
    Daemon, Workload,
};
use serde_json::Value;

/// The receiver, killed on drop.
struct Receiver {
    child: Child,
    port: u16,
    out: PathBuf,
}

impl Receiver {
    /// Starts `otlp_receiver.py PROTOCOL` on `port` (0: a free one) appending to a file in
    /// `dir`, answering `status`; waits until it listens.
    fn start(protocol: &str, dir: &Path, port: u16, status: u16) -> Receiver {
        Receiver::start_with(protocol, dir, port, status, None)
    }

    /// [`Receiver::start`] serving TLS with `tls`'s certificate chain and key.
    fn start_with(
        protocol: &str,
        dir: &Path,
        port: u16,
        status: u16,
        tls: Option<&Certificates>,
    ) -> Receiver {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("receivers/otlp_receiver.py");
        let port_file = dir.join(format!("{protocol}.port"));
        let _ = std::fs::remove_file(&port_file);
        let out = dir.join(format!("{protocol}.jsonl"));
        let mut command = Command::new("python3");
        command.arg(&script).args([
            protocol,
            &port.to_string(),
            port_file.to_str().unwrap(),
            out.to_str().unwrap(),
            &status.to_string(),
        ]);
        if let Some(tls) = tls {
            command.args([&tls.server_cert, &tls.server_key]);
        }
        let mut child = command.stdout(Stdio::null()).spawn().expect("python3");
        let port = poll_until(Duration::from_secs(30), || {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("the receiver exited: {status} (are opentelemetry-proto and grpcio installed? cargo xtask setup)");
            }
            std::fs::read_to_string(&port_file).ok()?.trim().parse().ok()
        })
        .expect("the receiver listens");
        Receiver { child, port, out }
    }

    /// The requests received so far, oldest first.
    fn requests(&self) -> Vec<Value> {
        read_requests(&self.out)
    }

    /// How many requests the `protocol` receivers of `dir` have recorded (after one was
    /// killed: what it got before).
    fn recorded(dir: &Path, protocol: &str) -> usize {
        read_requests(&dir.join(format!("{protocol}.jsonl"))).len()
    }
}

/// The requests recorded in `out`, oldest first.
fn read_requests(out: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(out).unwrap_or_default();
    // A line being written has no newline yet.
    let complete = text.rfind('\n').map_or("", |end| &text[..end]);
    complete
        .lines()
        .map(|l| serde_json::from_str(l).expect("the receiver's JSON"))
        .collect()
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The profiles of `pid` in `requests`: (resource attributes, profile), in order.
fn of_pid(requests: &[Value], pid: u32) -> Vec<(Value, Value)> {
    let mut out = Vec::new();
    for request in requests {
        for resource in request["resources"].as_array().unwrap() {
            if resource["attributes"]["process.pid"].as_u64() == Some(u64::from(pid)) {
                for profile in resource["profiles"].as_array().unwrap() {
                    out.push((resource["attributes"].clone(), profile.clone()));
                }
            }
        }
    }
    out
}

/// Samples of the profiles, by leaf function.
fn otlp_leaves(profiles: &[(Value, Value)]) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for (_, profile) in profiles {
        for sample in profile["samples"].as_array().unwrap() {
            let leaf = sample["stack"][0].as_str().unwrap_or_default().to_string();
            *out.entry(leaf).or_default() += sample["values"][0].as_u64().unwrap();
        }
    }
    out
}

fn otlp_export_reaches_a_receiver(protocol: &str, flag: &str) {
    needs_root!();
    let dir = tempdir();
    let receiver = Receiver::start(protocol, dir.path(), 0, 200);
    // The agent records only hotcold's cgroup, and reads the container id from its path.
    let (cgroup, id) = container(protocol);
    let hotcold = Workload::spawn("hotcold", &["300"]);
    cgroup.add(hotcold.pid());
    let started = SystemTime::now();
    let port = free_port();
    let endpoint = format!("http://127.0.0.1:{}", receiver.port);
    let agent = start_agent(
        port,
        &[
            "--cgroup",
            &cgroup.relative,
            "-F",
            "99",
            "--window",
            "2s",
            "--otlp-endpoint",
            &endpoint,
            "--otlp-protocol",
            flag,
            "--otlp-header",
            "X-Test-Tenant=t1",
            "--state-dir",
            dir.path().join("state").to_str().unwrap(),
        ],
        1.0,
    );

    // Judged by samples taken: windows are waited for until hotcold has enough.
    let enough = poll_until(Duration::from_secs(120), || {
        let hot = otlp_leaves(&of_pid(&receiver.requests(), hotcold.pid()));
        let judged = hot.get("leaf_hot").unwrap_or(&0) + hot.get("leaf_cold").unwrap_or(&0);
        (judged >= 300).then_some(())
    });
    assert!(
        enough.is_some(),
        "too few samples of hotcold arrived: {:?}\n{}",
        otlp_leaves(&of_pid(&receiver.requests(), hotcold.pid())),
        agent.stderr_so_far()
    );

    // The agent's own pprof of the same windows: every window of its ring (the newest
    // `kept` of the `cut` so far), asked for while no window is cut (the counts the same
    // before and after).
    let counts = |m: &BTreeMap<String, f64>| {
        (
            m["bpfprof_agent_windows_total"] as usize,
            m["bpfprof_agent_windows_kept"] as usize,
        )
    };
    let ((cut, kept), pprof) = poll_until(Duration::from_secs(60), || {
        let before = counts(&metrics(port));
        let url = format!("http://127.0.0.1:{port}/debug/pprof/profile?seconds=3600");
        let samples = go_pprof_url(&url, dir.path())?;
        (before == counts(&metrics(port))).then_some((before, samples))
    })
    .expect("a pprof between two windows");
    // Every window is sent, in order: request i is window i.
    let requests = poll_until(Duration::from_secs(60), || {
        let r = receiver.requests();
        (r.len() >= cut).then_some(r)
    })
    .unwrap_or_else(|| {
        panic!(
            "{cut} windows cut, {} received\n{}",
            receiver.requests().len(),
            agent.stderr_so_far()
        )
    });
    let windows = kept;
    let requests = &requests[cut - kept..cut];
    let profiles = of_pid(requests, hotcold.pid());
    let otlp = otlp_leaves(&profiles);
    let pprof = leaves(&pprof, hotcold.pid());
    assert_eq!(
        otlp, pprof,
        "hotcold's samples over {windows} windows: OTLP (left) and the agent's pprof (right)"
    );

    // The known split: leaf_hot does three units of work for each of leaf_cold's.
    assert_hotcold_split(otlp["leaf_hot"], otlp["leaf_cold"], &otlp);
    assert_eq!(
        otlp.iter()
            .max_by_key(|(_, n)| **n)
            .map(|(f, _)| f.as_str()),
        Some("leaf_hot"),
        "{otlp:?}"
    );
    // Stacks are leaf first, through the dictionary.
    let hot_stack = profiles
        .iter()
        .flat_map(|(_, p)| p["samples"].as_array().unwrap().clone())
        .find(|s| s["stack"][0] == "leaf_hot")
        .unwrap();
    let stack: Vec<&str> = hot_stack["stack"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect();
    assert_eq!(&stack[..3], ["leaf_hot", "parent_hot", "main"], "{stack:?}");

    // The resource: the semantic conventions' attributes, the same in every window.
    let exe = std::fs::read_link(format!("/proc/{}/exe", hotcold.pid())).unwrap();
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    for (attributes, profile) in &profiles {
        assert_eq!(attributes["process.pid"], hotcold.pid(), "{attributes}");
        assert_eq!(
            attributes["process.executable.name"], "hotcold",
            "{attributes}"
        );
        assert_eq!(
            attributes["process.executable.path"],
            exe.to_str().unwrap(),
            "{attributes}"
        );
        assert_eq!(attributes["container.id"], id.as_str(), "{attributes}");
        assert_eq!(
            attributes["service.name"],
            format!("container/{}", &id[..12]),
            "{attributes}"
        );
        assert_eq!(attributes["host.name"], host.trim(), "{attributes}");
        assert_eq!(profile["scope"], "bpfprof");
        assert_eq!(
            profile["sample_type"],
            serde_json::json!(["samples", "count"])
        );
        assert_eq!(
            profile["period_type"],
            serde_json::json!(["cpu", "nanoseconds"])
        );
        let period = profile["period"].as_f64().unwrap();
        assert!(
            (period - 1e9 / 99.0).abs() < 1e9 / 99.0 * 0.02,
            "a sample at 99 Hz stands for 10.1 ms of CPU: {period}"
        );
        // The window's time: after the test started, no longer than a few windows (a window
        // cut late is followed by a shorter one: cuts keep to the --window schedule).
        let start = Duration::from_nanos(profile["time_unix_nano"].as_u64().unwrap());
        assert!(start + Duration::from_secs(1) >= started.duration_since(UNIX_EPOCH).unwrap());
        let length = profile["duration_nano"].as_f64().unwrap() / 1e9;
        assert!(
            length > 0.0 && length < 10.0,
            "a 2 s window lasted {length} s"
        );
    }
    // The windows follow one another, in order, without overlapping.
    for pair in profiles.windows(2) {
        let end = pair[0].1["time_unix_nano"].as_u64().unwrap()
            + pair[0].1["duration_nano"].as_u64().unwrap();
        assert!(
            end <= pair[1].1["time_unix_nano"].as_u64().unwrap(),
            "windows out of order: {} then {}",
            pair[0].1["time_unix_nano"],
            pair[1].1["time_unix_nano"]
        );
    }
    // Only the cgroup's processes, and the auth header on every request.
    for request in requests {
        for resource in request["resources"].as_array().unwrap() {
            assert_eq!(
                resource["attributes"]["container.id"],
                id.as_str(),
                "a process outside the cgroup: {resource}"
            );
        }
        assert_eq!(
            request["headers"]["x-test-tenant"], "t1",
            "{}",
            request["headers"]
        );
    }
    let m = metrics(port);
    assert!(
        m["bpfprof_agent_export_windows_total{backend=otlp,outcome=sent}"] >= cut as f64,
        "{m:?}"
    );
    assert_eq!(
        m["bpfprof_agent_export_windows_total{backend=otlp,outcome=retried}"], 0.0,
        "{m:?}"
    );
    assert_eq!(
        m["bpfprof_agent_export_windows_total{backend=otlp,outcome=dropped}"], 0.0,
        "{m:?}"
    );
    assert_eq!(
        m["bpfprof_agent_export_windows_total{backend=otlp,outcome=queue_full}"], 0.0,
        "{m:?}"
    );
    agent.signal(libc::SIGTERM);
    agent.wait_timeout(Duration::from_secs(30)).assert_code(0);
}

#[test]
fn otlp_over_grpc_reaches_the_official_stubs() {
    otlp_export_reaches_a_receiver("grpc", "grpc");
}

#[test]
fn otlp_over_http_reaches_the_official_stubs() {
    otlp_export_reaches_a_receiver("http", "http/protobuf");
}

/// hotcold in a cgroup of its own named as Docker names a container's (`docker-ID.scope`
/// under a parent named after the test); returns the cgroup and the id.
fn container(name: &str) -> (TestCgroup, String) {
    let id: String = format!("{:064x}", (u128::from(std::process::id()) << 64) | 0xcafe);
    let cgroup = TestCgroup::named(&format!(
        "bpfprof-export-test-{}-{name}/docker-{id}.scope",
        std::process::id()
    ));
    (cgroup, id)
}

/// Each request's window, (start, end) in Unix nanoseconds, from its profiles (all of one
/// request share it); `None` for a request without profiles.
fn window_times(requests: &[Value]) -> Vec<Option<(u64, u64)>> {
    requests
        .iter()
        .map(|r| {
            let profile = r["resources"].as_array()?.first()?["profiles"]
                .as_array()?
                .first()?;
            let start = profile["time_unix_nano"].as_u64()?;
            Some((start, start + profile["duration_nano"].as_u64()?))
        })
        .collect()
}

/// Checks that each window arrived once and in order, each starting where the one before
/// ended, and returns the windows' times (empty windows, which carry none, left out) and
/// how many were empty. `killed_after` is how many requests the receiver had recorded when
/// it was killed (0: never killed): the window it recorded last may have been cut off before
/// its answer went out, so the agent, never told, rightly sends it again; that one window,
/// and only there, may come twice.
fn windows_once_in_order(requests: &[Value], killed_after: usize) -> (Vec<(u64, u64)>, usize) {
    let mut times = window_times(requests);
    if killed_after > 0
        && times.get(killed_after).is_some()
        && times[killed_after - 1] == times[killed_after]
    {
        times.remove(killed_after);
    }
    let empty = times.iter().filter(|t| t.is_none()).count();
    let times: Vec<(u64, u64)> = times.into_iter().flatten().collect();
    for pair in times.windows(2) {
        assert!(
            pair[1].0 >= pair[0].1,
            "a window twice or out of order: {:?} then {:?} in {times:?} (the receiver was killed after {killed_after} requests)",
            pair[0],
            pair[1]
        );
    }
    (times, empty)
}

/// The agent's metric `name`.
fn metric(port: u16, name: &str) -> f64 {
    metrics(port).get(name).copied().unwrap_or(-1.0)
}

#[test]
fn windows_spooled_through_an_outage_and_a_kill_arrive_once_and_in_order() {
    needs_root!();
    let dir = tempdir();
    let state = dir.path().join("state");
    let receiver = Receiver::start("http", dir.path(), 0, 200);
    let receiver_port = receiver.port;
    let (cgroup, _) = container("spool");
    let hotcold = Workload::spawn("hotcold", &["300"]);
    cgroup.add(hotcold.pid());
    let endpoint = format!("http://127.0.0.1:{receiver_port}");
    let args = [
        "--cgroup",
        &cgroup.relative,
        "-F",
        "49",
        "--window",
        "1s",
        "--otlp-endpoint",
        &endpoint,
        "--state-dir",
        state.to_str().unwrap(),
    ];
    let port = free_port();
    let agent = start_agent(port, &args, 1.0);
    poll_until(Duration::from_secs(60), || {
        (receiver.requests().len() >= 2).then_some(())
    })
    .expect("windows arrive while the receiver is up");

    // The receiver goes away (killed, maybe in the middle of a request): windows pile up in
    // the spool, retried.
    drop(receiver);
    let killed_after = Receiver::recorded(dir.path(), "http");
    poll_until(Duration::from_secs(60), || {
        let m = metrics(port);
        (m["bpfprof_agent_spooled_windows{backend=otlp}"] >= 3.0
            && m["bpfprof_agent_export_windows_total{backend=otlp,outcome=retried}"] >= 1.0)
            .then_some(())
    })
    .unwrap_or_else(|| panic!("no window spooled: {:?}", metrics(port)));
    // The agent is killed with windows spooled; they are files.
    agent.signal(libc::SIGKILL);
    let _ = agent.wait_timeout(Duration::from_secs(30));
    let spooled_by_first = std::fs::read_dir(state.join("spool/otlp"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".pb"))
        })
        .count();
    assert!(spooled_by_first >= 3, "{spooled_by_first} windows spooled");

    // Started again, still without a receiver: it keeps the old windows and adds its own.
    let restarted = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let port = free_port();
    let agent = start_agent(port, &args, 1.0);
    poll_until(Duration::from_secs(60), || {
        (metric(port, "bpfprof_agent_spooled_windows{backend=otlp}")
            >= spooled_by_first as f64 + 2.0)
            .then_some(())
    })
    .unwrap_or_else(|| panic!("the restarted agent spools: {:?}", metrics(port)));

    // The receiver is back on its port: the spool drains.
    let receiver = Receiver::start("http", dir.path(), receiver_port, 200);
    poll_until(Duration::from_secs(120), || {
        let m = metrics(port);
        (m["bpfprof_agent_spooled_windows{backend=otlp}"] == 0.0
            && m["bpfprof_agent_export_windows_total{backend=otlp,outcome=sent}"]
                > spooled_by_first as f64)
            .then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "the spool did not drain: {:?}\n{}",
            metrics(port),
            agent.stderr_so_far()
        )
    });
    let m = metrics(port);
    assert_eq!(
        m["bpfprof_agent_export_windows_total{backend=otlp,outcome=dropped}"], 0.0,
        "{m:?}"
    );
    assert_eq!(
        m["bpfprof_agent_export_windows_total{backend=otlp,outcome=rejected}"], 0.0,
        "{m:?}"
    );
    agent.signal(libc::SIGTERM);
    agent.wait_timeout(Duration::from_secs(60)).assert_code(0);

    // Every window once, in order: each starts where the one before ended, but at the
    // restart (and after a window without samples, if the machine starved hotcold that long).
    let requests = receiver.requests();
    let (times, empty) = windows_once_in_order(&requests, killed_after);
    let gaps = times.windows(2).filter(|p| p[1].0 != p[0].1).count();
    assert!(
        gaps <= 1 + empty,
        "{gaps} gaps, {empty} empty windows: {times:?}"
    );
    // The first run's spooled windows arrived (before the restart's own).
    let before_restart = times
        .iter()
        .filter(|(start, _)| u128::from(*start) < restarted.as_nanos())
        .count();
    assert!(
        before_restart >= 2 + spooled_by_first,
        "{before_restart} windows of the first run arrived, {spooled_by_first} were spooled at its kill"
    );
}

#[test]
fn windows_the_backend_refuses_are_set_aside_and_counted() {
    needs_root!();
    let dir = tempdir();
    let state = dir.path().join("state");
    let receiver = Receiver::start("http", dir.path(), 0, 400);
    let (cgroup, _) = container("refused");
    let hotcold = Workload::spawn("hotcold", &["300"]);
    cgroup.add(hotcold.pid());
    let endpoint = format!("http://127.0.0.1:{}", receiver.port);
    let port = free_port();
    let agent = start_agent(
        port,
        &[
            "--cgroup",
            &cgroup.relative,
            "--window",
            "1s",
            "--otlp-endpoint",
            &endpoint,
            "--state-dir",
            state.to_str().unwrap(),
        ],
        1.0,
    );
    let m = poll_until(Duration::from_secs(60), || {
        let m = metrics(port);
        (m["bpfprof_agent_export_windows_total{backend=otlp,outcome=rejected}"] >= 3.0).then_some(m)
    })
    .unwrap_or_else(|| panic!("no window refused: {:?}", metrics(port)));
    // Each refused window reached the receiver once, was set aside, and the agent went on.
    assert_eq!(
        m["bpfprof_agent_export_windows_total{backend=otlp,outcome=sent}"], 0.0,
        "{m:?}"
    );
    assert_eq!(
        m["bpfprof_agent_export_windows_total{backend=otlp,outcome=retried}"], 0.0,
        "{m:?}"
    );
    let set_aside = std::fs::read_dir(state.join("spool/otlp/rejected"))
        .unwrap()
        .count();
    assert!(set_aside >= 3, "{set_aside} windows in rejected/");
    let windows = m["bpfprof_agent_windows_total"];
    poll_until(Duration::from_secs(30), || {
        (metric(port, "bpfprof_agent_windows_total") >= windows + 2.0).then_some(())
    })
    .expect("the agent goes on cutting windows");
    agent.signal(libc::SIGTERM);
    agent.wait_timeout(Duration::from_secs(60)).assert_code(0);
    let received = receiver.requests();
    assert!(
        received.iter().all(|r| r["answered"] == 400),
        "every request was answered 400"
    );
    assert!(
        received.len() >= 3,
        "{} refused windows reached the receiver",
        received.len()
    );
}

/// A Pyroscope ingest endpoint (`tests/receivers/pyroscope_receiver.py`), killed on drop.
struct IngestReceiver {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl IngestReceiver {
    fn start(dir: &Path) -> IngestReceiver {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("receivers/pyroscope_receiver.py");
        let port_file = dir.join("pyroscope.port");
        let out = dir.join("ingested");
        std::fs::create_dir_all(&out).unwrap();
        let mut child = Command::new("python3")
            .arg(&script)
            .args([port_file.to_str().unwrap(), out.to_str().unwrap()])
            .spawn()
            .expect("python3");
        let port = poll_until(Duration::from_secs(30), || {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("the receiver exited: {status}");
            }
            std::fs::read_to_string(&port_file)
                .ok()?
                .trim()
                .parse()
                .ok()
        })
        .expect("the receiver listens");
        IngestReceiver {
            child,
            port,
            dir: out,
        }
    }

    /// The requests received so far, in order: each one's metadata and body's path.
    fn requests(&self) -> Vec<(Value, PathBuf)> {
        let mut names: Vec<String> = std::fs::read_dir(&self.dir)
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.ends_with(".json"))
            .collect();
        names.sort();
        names
            .into_iter()
            .map(|n| {
                let meta = std::fs::read_to_string(self.dir.join(&n)).unwrap();
                let body = self.dir.join(n.replace(".json", ".pb"));
                (serde_json::from_str(&meta).unwrap(), body)
            })
            .collect()
    }
}

impl Drop for IngestReceiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn pyroscope_ingest_gets_each_services_pprof_with_its_name_and_labels() {
    needs_root!();
    let dir = tempdir();
    let receiver = IngestReceiver::start(dir.path());
    let (cgroup, id) = container("pyroscope");
    let hotcold = Workload::spawn("hotcold", &["300"]);
    cgroup.add(hotcold.pid());
    let url = format!("http://127.0.0.1:{}/", receiver.port);
    let port = free_port();
    let agent = start_agent(
        port,
        &[
            "--cgroup",
            &cgroup.relative,
            "-F",
            "99",
            "--window",
            "2s",
            "--pyroscope-url",
            &url,
            "--pyroscope-tenant",
            "t1",
            "--pyroscope-user",
            "u:pw",
            "--state-dir",
            dir.path().join("state").to_str().unwrap(),
        ],
        1.0,
    );
    let pid = hotcold.pid().to_string();
    // Judged by samples taken: windows are waited for until hotcold has enough, each body
    // read by Go's pprof.
    let (requests, hot) = poll_until(Duration::from_secs(120), || {
        let requests = receiver.requests();
        let mut hot = BTreeMap::new();
        for (_, body) in &requests {
            let samples = go_pprof_url(body.to_str().unwrap(), dir.path()).unwrap();
            assert!(
                samples.iter().all(|s| s.labels.get("pid") == Some(&pid)),
                "only hotcold is in the cgroup: {samples:?}"
            );
            for (leaf, n) in leaves(&samples, hotcold.pid()) {
                *hot.entry(leaf).or_insert(0) += n;
            }
            let labels = &samples[0].labels;
            assert_eq!(labels["service_name"], format!("container/{}", &id[..12]));
            assert_eq!(labels["container_id"], id);
            assert_eq!(labels["comm"], "hotcold");
        }
        let judged = hot.get("leaf_hot").unwrap_or(&0) + hot.get("leaf_cold").unwrap_or(&0);
        (judged >= 300).then_some((requests, hot))
    })
    .unwrap_or_else(|| panic!("too few samples arrived\n{}", agent.stderr_so_far()));
    assert_hotcold_split(hot["leaf_hot"], hot["leaf_cold"], &hot);
    assert_eq!(
        hot.iter().max_by_key(|(_, n)| **n).map(|(f, _)| f.as_str()),
        Some("leaf_hot"),
        "{hot:?}"
    );

    // The query names the service and the window; the headers carry the tenant and auth.
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let mut last_from = 0;
    for (meta, _) in &requests {
        assert_eq!(meta["path"], "/ingest", "{meta}");
        let q = &meta["query"];
        assert_eq!(
            q["name"],
            format!("container/{}.cpu{{host={}}}", &id[..12], host.trim()),
            "{meta}"
        );
        assert_eq!(q["format"], "pprof", "{meta}");
        assert_eq!(q["sampleRate"], "99", "{meta}");
        let from: u64 = q["from"].as_str().unwrap().parse().unwrap();
        let until: u64 = q["until"].as_str().unwrap().parse().unwrap();
        assert!(from < until && until - from <= 10, "{meta}");
        assert!(from >= last_from, "windows in order: {meta}");
        last_from = from;
        assert_eq!(meta["headers"]["x-scope-orgid"], "t1", "{meta}");
        // "u:pw" in base64.
        assert_eq!(meta["headers"]["authorization"], "Basic dTpwdw==", "{meta}");
    }
    let m = metrics(port);
    assert!(
        m["bpfprof_agent_export_windows_total{backend=pyroscope,outcome=sent}"]
            >= requests.len() as f64,
        "{m:?}"
    );
    agent.signal(libc::SIGTERM);
    agent.wait_timeout(Duration::from_secs(30)).assert_code(0);
}

#[test]
fn a_full_spool_drops_its_oldest_windows_counted_and_keeps_the_newest() {
    needs_root!();
    let dir = tempdir();
    let state = dir.path().join("state");
    // An endpoint nothing listens on: every window stays spooled, until the 1 MiB spool is
    // full. The whole machine at 499 Hz makes windows large enough to fill it in seconds.
    let down = format!("http://127.0.0.1:{}", free_port());
    let port = free_port();
    let agent = start_agent(
        port,
        &[
            "-F",
            "499",
            "--window",
            "1s",
            "--otlp-endpoint",
            &down,
            "--spool-mib",
            "1",
            "--state-dir",
            state.to_str().unwrap(),
        ],
        1.0,
    );
    let dropped = "bpfprof_agent_export_windows_total{backend=otlp,outcome=dropped}";
    poll_until(Duration::from_secs(180), || {
        (metric(port, dropped) >= 3.0).then_some(())
    })
    .unwrap_or_else(|| panic!("the spool never filled: {:?}", metrics(port)));
    // Every window cut is spooled or dropped, counted exactly; the spool holds the newest
    // (a window's file is named by its number, from 0 in a fresh spool), within its limit.
    let (cut, spooled, files) = poll_until(Duration::from_secs(60), || {
        let m = metrics(port);
        let cut = m["bpfprof_agent_windows_total"] as u64;
        let spooled = m["bpfprof_agent_spooled_windows{backend=otlp}"] as u64;
        let mut files: Vec<(u64, u64)> = std::fs::read_dir(state.join("spool/otlp"))
            .unwrap()
            .filter_map(|e| {
                let e = e.ok()?;
                let seq = e.file_name().to_str()?.strip_suffix(".pb")?.parse().ok()?;
                Some((seq, e.metadata().ok()?.len()))
            })
            .collect();
        files.sort();
        let settled = cut == spooled + m[dropped] as u64
            && files.len() as u64 == spooled
            && metrics(port)["bpfprof_agent_windows_total"] as u64 == cut;
        settled.then_some((cut, spooled, files))
    })
    .unwrap_or_else(|| panic!("the spool's counts never agreed: {:?}", metrics(port)));
    let seqs: Vec<u64> = files.iter().map(|(seq, _)| *seq).collect();
    assert_eq!(
        seqs,
        (cut - spooled..cut).collect::<Vec<u64>>(),
        "the newest {spooled} of {cut} windows are kept"
    );
    let bytes: u64 = files.iter().map(|(_, len)| len).sum();
    assert!(
        bytes <= 1 << 20,
        "{bytes} bytes spooled past the 1 MiB limit"
    );
    agent.signal(libc::SIGTERM);
    agent.wait_timeout(Duration::from_secs(60)).assert_code(0);
}

#[test]
fn bad_export_settings_are_refused_with_a_clear_error() {
    needs_root!();
    let dir = tempdir();
    let state = dir.path().join("state");
    let state = state.to_str().unwrap();
    for (args, code, says) in [
        (
            vec!["--otlp-endpoint", "collector:4318"],
            2,
            "--otlp-endpoint",
        ),
        (
            vec![
                "--otlp-endpoint",
                "http://c:4318",
                "--otlp-header",
                "novalue",
            ],
            2,
            "--otlp-header",
        ),
        (vec!["--otlp-header", "k=v"], 2, "--otlp-endpoint"),
        (
            vec![
                "--otlp-endpoint",
                "http://c:4318",
                "--otlp-protocol",
                "http/json",
            ],
            2,
            "http/json",
        ),
        (vec!["--pyroscope-url", "ftp://p"], 2, "--pyroscope-url"),
        (
            vec![
                "--pyroscope-url",
                "http://p:4040",
                "--pyroscope-user",
                "nopassword",
            ],
            2,
            "USER:PASSWORD",
        ),
        (
            vec!["--otlp-endpoint", "http://c:4318", "--spool-mib", "0"],
            2,
            "--spool-mib",
        ),
        // A spool that cannot be made: the output-not-writable code.
        (
            vec![
                "--otlp-endpoint",
                "http://c:4318",
                "--state-dir",
                "/proc/bpfprof-spool",
            ],
            6,
            "/proc/bpfprof-spool",
        ),
    ] {
        let mut all = vec!["agent"];
        all.extend(&args);
        if !args.contains(&"--state-dir") {
            all.extend(["--state-dir", state]);
        }
        let run = run_bpfprof(&all, Duration::from_secs(60));
        run.assert_code(code);
        run.assert_stderr_mentions(&[says]);
    }
}

/// A private CA, a certificate it signed for `127.0.0.1` (the TLS receiver's), and another
/// CA that signed nothing here (the wrong one), made by `openssl`.
struct Certificates {
    ca: PathBuf,
    wrong_ca: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
}

impl Certificates {
    fn make(dir: &Path) -> Certificates {
        let path = |name: &str| dir.join(name);
        let openssl = |args: &[&str]| {
            bpfprof_tests::output_ok(
                Command::new("openssl").args(args).current_dir(dir),
                &format!("openssl {args:?} (cargo xtask setup installs it)"),
            );
        };
        for ca in ["ca", "wrong-ca"] {
            openssl(&[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-days",
                "2",
                "-subj",
                &format!("/CN=bpfprof test {ca}"),
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
                "-keyout",
                &format!("{ca}.key"),
                "-out",
                &format!("{ca}.pem"),
            ]);
        }
        openssl(&[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-subj",
            "/CN=127.0.0.1",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
        ]);
        std::fs::write(
            path("server.ext"),
            "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
        )
        .unwrap();
        openssl(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "server.ext",
            "-out",
            "server.pem",
        ]);
        Certificates {
            ca: path("ca.pem"),
            wrong_ca: path("wrong-ca.pem"),
            server_cert: path("server.pem"),
            server_key: path("server.key"),
        }
    }
}

/// The `.pb` files of a spool folder.
fn spooled_files(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |entries| {
        entries
            .filter(|e| {
                e.as_ref()
                    .is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".pb"))
            })
            .count()
    })
}

/// An agent trusting a CA that did not sign the receiver's certificate sends nothing: each
/// window is refused at the handshake, retried and spooled, counted; the agent started again
/// with the right CA (`--otlp-ca-cert`, or the SDKs' `OTEL_EXPORTER_OTLP_CERTIFICATE`)
/// sends every spooled window, then its own, in order, over TLS.
fn otlp_over_tls_with_a_private_ca(protocol: &str, flag: &str, ca_from_env: bool) {
    needs_root!();
    let dir = tempdir();
    let certificates = Certificates::make(dir.path());
    let receiver = Receiver::start_with(protocol, dir.path(), 0, 200, Some(&certificates));
    let state = dir.path().join("state");
    let (cgroup, _) = container(&format!("tls-{protocol}"));
    let hotcold = Workload::spawn("hotcold", &["300"]);
    cgroup.add(hotcold.pid());
    let endpoint = format!("https://127.0.0.1:{}", receiver.port);
    let args = [
        "--cgroup",
        &cgroup.relative,
        "-F",
        "49",
        "--window",
        "1s",
        "--otlp-endpoint",
        &endpoint,
        "--otlp-protocol",
        flag,
        "--state-dir",
        state.to_str().unwrap(),
    ];
    let wrong = certificates.wrong_ca.to_str().unwrap();
    let port = free_port();
    let agent = start_agent(port, &[&args[..], &["--otlp-ca-cert", wrong]].concat(), 1.0);
    let m = poll_until(Duration::from_secs(60), || {
        let m = metrics(port);
        (m["bpfprof_agent_spooled_windows{backend=otlp}"] >= 3.0
            && m["bpfprof_agent_export_windows_total{backend=otlp,outcome=retried}"] >= 2.0)
            .then_some(m)
    })
    .unwrap_or_else(|| panic!("no window refused at the handshake: {:?}", metrics(port)));
    assert_eq!(
        m["bpfprof_agent_export_windows_total{backend=otlp,outcome=sent}"], 0.0,
        "{m:?}"
    );
    assert!(
        agent.stderr_so_far().contains("export failed"),
        "the refusal is logged:\n{}",
        agent.stderr_so_far()
    );
    assert!(
        receiver.requests().is_empty(),
        "a window reached the receiver through a CA that did not sign it"
    );
    agent.signal(libc::SIGTERM);
    agent.wait_timeout(Duration::from_secs(60)).assert_code(0);
    let spooled = spooled_files(&state.join("spool/otlp"));
    assert!(spooled >= 3, "{spooled} windows spooled");

    // The right CA: what was spooled arrives first, then the new windows.
    let right = certificates.ca.to_str().unwrap();
    let port = free_port();
    let agent = if ca_from_env {
        start_agent_with_env(
            port,
            &args,
            &[("OTEL_EXPORTER_OTLP_CERTIFICATE", right)],
            1.0,
        )
    } else {
        start_agent(port, &[&args[..], &["--otlp-ca-cert", right]].concat(), 1.0)
    };
    poll_until(Duration::from_secs(120), || {
        let m = metrics(port);
        (m["bpfprof_agent_spooled_windows{backend=otlp}"] == 0.0
            && m["bpfprof_agent_export_windows_total{backend=otlp,outcome=sent}"]
                >= spooled as f64 + 2.0)
            .then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "the spool did not drain over TLS: {:?}\n{}",
            metrics(port),
            agent.stderr_so_far()
        )
    });
    agent.signal(libc::SIGTERM);
    agent.wait_timeout(Duration::from_secs(60)).assert_code(0);
    let requests = receiver.requests();
    assert!(requests.len() >= spooled + 2, "{} received", requests.len());
    let times: Vec<(u64, u64)> = window_times(&requests).into_iter().flatten().collect();
    for pair in times.windows(2) {
        assert!(
            pair[1].0 >= pair[0].1,
            "a window twice or out of order: {:?} then {:?}",
            pair[0],
            pair[1]
        );
    }
    let hot = otlp_leaves(&of_pid(&requests, hotcold.pid()));
    assert!(
        hot.get("leaf_hot").unwrap_or(&0) > hot.get("leaf_cold").unwrap_or(&0),
        "hotcold's stacks arrived: {hot:?}"
    );
}

#[test]
fn otlp_over_grpc_with_tls_trusts_only_the_given_ca() {
    otlp_over_tls_with_a_private_ca("grpc", "grpc", false);
}

#[test]
fn otlp_over_https_trusts_only_the_ca_of_otel_exporter_otlp_certificate() {
    otlp_over_tls_with_a_private_ca("http", "http/protobuf", true);
}

/// The workload every daemon export test profiles: hotcold, started by a non-root user, and
/// the CLI that user runs.
struct UserRun {
    user: bpfprof_tests::TestUser,
    _bin_dir: tempfile::TempDir,
    bin: PathBuf,
    hotcold: Workload,
}

impl UserRun {
    fn start() -> UserRun {
        let user = test_user("bpfprof-t1");
        let (bin_dir, bin) = world_executable_bpfprof();
        let hotcold = workload_as(&user, bin_dir.path(), "hotcold", &["300"]);
        UserRun {
            user,
            _bin_dir: bin_dir,
            bin,
            hotcold,
        }
    }

    /// The CLI as the user against `daemon`.
    fn cli(&self, daemon: &Daemon, args: &[&str]) -> bpfprof_tests::RunResult {
        cli(&self.user, &self.bin, daemon, args)
    }

    /// Starts a tagged run on hotcold and waits until it has `samples` (judged by samples
    /// taken, however loaded the machine); returns its id.
    fn tagged_run(&self, daemon: &Daemon, samples: u64) -> u64 {
        let pid = self.hotcold.pid().to_string();
        let id = run_id_of(&self.cli(
            daemon,
            &bpfprof_tests::async_run_args(
                &pid,
                "600000",
                &["--sample-tags", "fwd,step7", "--tag", "model=cnn"],
            ),
        ));
        poll_until(Duration::from_secs(180), || {
            let reply = daemon.client().status(id).ok()?;
            (reply.samples? >= samples).then_some(())
        })
        .unwrap_or_else(|| panic!("run {id} took fewer than {samples} samples"));
        id
    }

    /// Stops run `id` and returns the samples its results count.
    fn stop_for_samples(&self, daemon: &Daemon, id: u64) -> u64 {
        let id_arg = id.to_string();
        self.cli(daemon, &["stop", "--run-id", &id_arg])
            .assert_code(0);
        let results = self.cli(
            daemon,
            &["results", "--run-id", &id_arg, "--wait", "60s", "--json"],
        );
        results.assert_code(0);
        let reply: Value = serde_json::from_str(&results.stdout).unwrap();
        reply["samples"].as_u64().unwrap()
    }
}

/// Whether `profile` (a decoded OTLP profile) is run `id`'s.
fn of_run(profile: &Value, id: u64) -> bool {
    profile["attributes"]["run_id"].as_str() == Some(id.to_string().as_str())
}

#[test]
fn a_daemon_exports_each_finished_run_with_its_id_tags_and_owner() {
    needs_root!();
    let dir = tempdir();
    let receiver = Receiver::start("http", dir.path(), 0, 200);
    // The SDKs' environment: the signal's own URL (posted to as it is: nothing is appended)
    // and a header list with percent-encoded values.
    let signal = format!("http://127.0.0.1:{}/v1development/profiles", receiver.port);
    let daemon = Daemon::start_with_env(
        &[],
        &[
            ("OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT", signal.as_str()),
            (
                "OTEL_EXPORTER_OTLP_HEADERS",
                "x-test-tenant=t%201,authorization=Bearer%20tok%3D",
            ),
        ],
    );
    let run = UserRun::start();
    let id = run.tagged_run(&daemon, 600);
    let samples = run.stop_for_samples(&daemon, id);

    let requests = poll_until(Duration::from_secs(60), || {
        let r = receiver.requests();
        (!r.is_empty()).then_some(r)
    })
    .unwrap_or_else(|| panic!("run {id} was not exported"));
    let request = &requests[0];
    assert_eq!(
        request["headers"]["x-test-tenant"], "t 1",
        "{}",
        request["headers"]
    );
    assert_eq!(
        request["headers"]["authorization"], "Bearer tok=",
        "{}",
        request["headers"]
    );
    let profiles = of_pid(&requests, run.hotcold.pid());
    assert_eq!(profiles.len(), 1, "one profile for the run: {requests:?}");
    let (attributes, profile) = &profiles[0];
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert_eq!(attributes["host.name"], host.trim(), "{attributes}");
    assert_eq!(
        attributes["process.executable.name"], "hotcold",
        "{attributes}"
    );
    let attrs = &profile["attributes"];
    assert!(of_run(profile, id), "{attrs}");
    assert_eq!(attrs["owner_uid"], run.user.uid.to_string(), "{attrs}");
    assert_eq!(attrs["tag"], "fwd,step7", "{attrs}");
    assert_eq!(attrs["model"], "cnn", "{attrs}");
    // Every sample of the run's results, and the workload's split.
    let otlp = otlp_leaves(&profiles);
    assert_eq!(
        otlp.values().sum::<u64>(),
        samples,
        "the run's {samples} samples: {otlp:?}"
    );
    assert_hotcold_split(otlp["leaf_hot"], otlp["leaf_cold"], &otlp);
    // The run's time: as long as it sampled, ended before the results were read.
    let length = profile["duration_nano"].as_f64().unwrap() / 1e9;
    let end = Duration::from_nanos(
        profile["time_unix_nano"].as_u64().unwrap() + profile["duration_nano"].as_u64().unwrap(),
    );
    assert!(length > 0.5, "the run lasted {length} s");
    assert!(end <= SystemTime::now().duration_since(UNIX_EPOCH).unwrap());
    // Once: nothing more arrives, and the spool is empty.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(receiver.requests().len(), 1);
    assert_eq!(spooled_files(&daemon.state().join("spool/otlp")), 0);
}

#[test]
fn a_daemon_whose_backend_hangs_answers_at_once_and_sends_the_runs_when_it_is_back() {
    needs_root!();
    let dir = tempdir();
    // A backend that takes connections and never answers: each attempt lasts the exporter's
    // request timeout (10 s).
    let hung = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = hung.local_addr().unwrap().port();
    let endpoint = format!("http://127.0.0.1:{port}");
    let daemon = Daemon::start(&["--otlp-endpoint", &endpoint]);
    let run = UserRun::start();
    // Bounds on blocking: stop and list are answered from memory; results once the run's
    // files are written, however long a loaded machine takes for that, but a results that
    // waited for the hung send would take that and the send's 10 s on top.
    let quick = Duration::from_secs(2);
    let processed = Duration::from_secs(9);
    let mut ids = Vec::new();
    for _ in 0..2 {
        let id = run.tagged_run(&daemon, 300);
        let id_arg = id.to_string();
        let started = std::time::Instant::now();
        run.cli(&daemon, &["stop", "--run-id", &id_arg])
            .assert_code(0);
        let stop = started.elapsed();
        let results = run.cli(&daemon, &["results", "--run-id", &id_arg, "--wait", "60s"]);
        results.assert_code(0);
        let results_took = started.elapsed() - stop;
        let listed = std::time::Instant::now();
        run.cli(&daemon, &["list"]).assert_code(0);
        let list = listed.elapsed();
        eprintln!("run {id}: stop {stop:?}, results {results_took:?}, list {list:?}");
        assert!(stop < quick, "stop took {stop:?} with the backend hung");
        assert!(list < quick, "list took {list:?} with the backend hung");
        assert!(
            results_took < processed,
            "results took {results_took:?} with the backend hung"
        );
        ids.push(id);
    }
    // Both runs wait in the spool, on disk.
    let spool = daemon.state().join("spool/otlp");
    poll_until(Duration::from_secs(30), || {
        (spooled_files(&spool) == 2).then_some(())
    })
    .unwrap_or_else(|| panic!("{} runs spooled, not 2", spooled_files(&spool)));

    // The backend comes back on its port: both runs arrive, once, in order.
    drop(hung);
    let receiver = Receiver::start("http", dir.path(), port, 200);
    poll_until(Duration::from_secs(120), || {
        (spooled_files(&spool) == 0 && receiver.requests().len() >= 2).then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "the runs did not arrive: {} received, {} spooled",
            receiver.requests().len(),
            spooled_files(&spool)
        )
    });
    let requests = receiver.requests();
    let arrived: Vec<u64> = requests
        .iter()
        .filter_map(|r| {
            let profile = &r["resources"][0]["profiles"][0];
            ids.iter().copied().find(|&id| of_run(profile, id))
        })
        .collect();
    assert_eq!(arrived, ids, "each run once, in order");
    assert_eq!(requests.len(), 2);
    let hot = otlp_leaves(&of_pid(&requests, run.hotcold.pid()));
    assert!(
        hot.get("leaf_hot").unwrap_or(&0) > hot.get("leaf_cold").unwrap_or(&0),
        "hotcold's stacks arrived: {hot:?}"
    );
}

#[test]
fn windows_spooled_through_a_minute_long_outage_arrive_once_and_in_order() {
    needs_root!();
    // The outage: the receiver away for 60 s, the agent cutting 1 s windows all along.
    const OUTAGE: Duration = Duration::from_secs(60);
    let dir = tempdir();
    let receiver = Receiver::start("http", dir.path(), 0, 200);
    let receiver_port = receiver.port;
    let (cgroup, _) = container("minute");
    let hotcold = Workload::spawn("hotcold", &["600"]);
    cgroup.add(hotcold.pid());
    let endpoint = format!("http://127.0.0.1:{receiver_port}");
    let port = free_port();
    let agent = start_agent(
        port,
        &[
            "--cgroup",
            &cgroup.relative,
            "-F",
            "49",
            "--window",
            "1s",
            "--otlp-endpoint",
            &endpoint,
            "--state-dir",
            dir.path().join("state").to_str().unwrap(),
        ],
        1.0,
    );
    poll_until(Duration::from_secs(60), || {
        (receiver.requests().len() >= 2).then_some(())
    })
    .expect("windows arrive while the receiver is up");
    drop(receiver);
    let killed_after = Receiver::recorded(dir.path(), "http");
    let down = std::time::Instant::now();
    let cut_before = metric(port, "bpfprof_agent_windows_total");
    std::thread::sleep(OUTAGE);
    let m = metrics(port);
    assert!(
        m["bpfprof_agent_windows_total"] >= cut_before + 30.0,
        "the agent went on cutting windows through the outage: {m:?}"
    );
    assert!(
        m["bpfprof_agent_spooled_windows{backend=otlp}"] >= 30.0,
        "{m:?}"
    );
    let receiver = Receiver::start("http", dir.path(), receiver_port, 200);
    eprintln!("receiver back after {:?}", down.elapsed());
    // Every window cut so far arrives (the backoff's longest wait is 45 s).
    let cut = poll_until(Duration::from_secs(180), || {
        let m = metrics(port);
        let cut = m["bpfprof_agent_windows_total"] as usize;
        (m["bpfprof_agent_spooled_windows{backend=otlp}"] == 0.0
            && receiver.requests().len() >= cut)
            .then_some(cut)
    })
    .unwrap_or_else(|| {
        panic!(
            "the spool did not drain: {:?}\n{}",
            metrics(port),
            agent.stderr_so_far()
        )
    });
    let m = metrics(port);
    for outcome in ["dropped", "rejected", "queue_full"] {
        assert_eq!(
            m[&format!("bpfprof_agent_export_windows_total{{backend=otlp,outcome={outcome}}}")],
            0.0,
            "{m:?}"
        );
    }
    agent.signal(libc::SIGTERM);
    agent.wait_timeout(Duration::from_secs(60)).assert_code(0);
    // Once and in order: the windows follow one another without a gap or an overlap, but
    // around windows without samples (which carry no time).
    let requests = receiver.requests();
    assert!(requests.len() >= cut, "{} of {cut} windows", requests.len());
    let (times, empty) = windows_once_in_order(&requests, killed_after);
    let gaps = times.windows(2).filter(|p| p[1].0 != p[0].1).count();
    assert!(
        gaps <= empty,
        "{gaps} gaps, {empty} empty windows: {times:?}"
    );
}

#[test]
fn bad_daemon_export_settings_are_refused_with_a_clear_error() {
    needs_root!();
    let dir = tempdir();
    let state = dir.path().join("state");
    let socket = dir.path().join("sock");
    for (args, code, says) in [
        (
            vec!["--otlp-endpoint", "collector:4318"],
            2,
            "--otlp-endpoint",
        ),
        (
            vec![
                "--otlp-endpoint",
                "http://c:4318",
                "--otlp-headers",
                "a=1,novalue",
            ],
            2,
            "OTEL_EXPORTER_OTLP_HEADERS",
        ),
        (
            vec![
                "--otlp-endpoint",
                "https://c:4318",
                "--otlp-ca-cert",
                "/nonexistent/ca.pem",
            ],
            2,
            "--otlp-ca-cert",
        ),
        (vec!["--pyroscope-url", "ftp://p"], 2, "--pyroscope-url"),
        (
            vec!["--otlp-endpoint", "http://c:4318", "--spool-mib", "0"],
            2,
            "--spool-mib",
        ),
    ] {
        let mut all = vec![
            "daemon",
            "--state-dir",
            state.to_str().unwrap(),
            "--socket",
            socket.to_str().unwrap(),
        ];
        all.extend(&args);
        let run = run_bpfprof(&all, Duration::from_secs(60));
        run.assert_code(code);
        run.assert_stderr_mentions(&[says]);
    }
}

#[test]
fn a_daemon_pushes_each_finished_run_to_pyroscope_with_its_id_and_owner_as_labels() {
    needs_root!();
    let dir = tempdir();
    let receiver = IngestReceiver::start(dir.path());
    let url = format!("http://127.0.0.1:{}", receiver.port);
    let daemon = Daemon::start(&["--pyroscope-url", &url, "--pyroscope-tenant", "t1"]);
    let run = UserRun::start();
    let id = run.tagged_run(&daemon, 600);
    let samples = run.stop_for_samples(&daemon, id);
    // One process, one service: one push, its body read by Go's pprof.
    let requests = poll_until(Duration::from_secs(60), || {
        let r = receiver.requests();
        (!r.is_empty()).then_some(r)
    })
    .unwrap_or_else(|| panic!("run {id} was not pushed"));
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(receiver.requests().len(), 1, "one push for the run");
    let (meta, body) = &requests[0];
    assert_eq!(meta["path"], "/ingest", "{meta}");
    assert_eq!(meta["headers"]["x-scope-orgid"], "t1", "{meta}");
    assert_eq!(meta["query"]["sampleRate"], "499", "{meta}");
    let pprof = go_pprof_url(body.to_str().unwrap(), dir.path()).unwrap();
    for s in &pprof {
        assert_eq!(s.labels["run_id"], id.to_string(), "{:?}", s.labels);
        assert_eq!(
            s.labels["owner_uid"],
            run.user.uid.to_string(),
            "{:?}",
            s.labels
        );
        assert_eq!(s.labels["model"], "cnn", "{:?}", s.labels);
    }
    let hot = leaves(&pprof, run.hotcold.pid());
    assert_eq!(hot.values().sum::<u64>(), samples, "{hot:?}");
    assert_hotcold_split(hot["leaf_hot"], hot["leaf_cold"], &hot);
}
