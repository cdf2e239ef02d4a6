//! `bpfprof agent`: the always-on agent, read as its users read it: `go tool pprof` on its
//! `/debug/pprof/profile` URL, the Prometheus project's own parser on its `/metrics`, and its
//! memory while processes come and go.

use std::{collections::BTreeMap, process::Command, time::Duration};

use bpfprof_tests::{
    agent::{free_port, go_pprof_url, leaves, metrics, start_agent, RawSample, TestCgroup},
    poll_until, proc_status, require_root, tempdir, Daemon, Workload,
};

/// A process's resident memory in KiB, from `/proc/PID/status`.
fn vm_rss_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("it runs");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// The labels every sample of `pid` carries (they must agree).
fn labels_of(samples: &[RawSample], pid: u32) -> BTreeMap<String, String> {
    let mut of_pid = samples
        .iter()
        .filter(|s| s.labels.get("pid") == Some(&pid.to_string()));
    let first = of_pid
        .next()
        .unwrap_or_else(|| panic!("no sample of pid {pid}: {samples:?}"));
    for s in of_pid {
        assert_eq!(s.labels, first.labels, "pid {pid}'s samples disagree");
    }
    first.labels.clone()
}

#[test]
fn agent_serves_each_process_with_its_labels_and_split_over_pprof() {
    if !require_root() {
        return;
    }
    let dir = tempdir();
    let hotcold = Workload::spawn("hotcold", &["120"]);
    let spinner = Workload::spawn("spinner", &["120"]);
    // A daemon run on spinner, with tags: the agent asks the daemon for them.
    let daemon = Daemon::start(&[]);
    let run = daemon.cli(&[
        "run",
        "--async",
        "--pid",
        &spinner.pid().to_string(),
        "--tag",
        "phase=step7",
        "--sample-tags",
        "fwd",
        "--duration-ms",
        "120000",
    ]);
    run.assert_code(0);
    let rules = dir.path().join("services.toml");
    // The agent sees the whole machine, other hotcolds included: the rule names this one by
    // its executable's path as well as its name.
    let hotcold_exe = std::fs::read_link(format!("/proc/{}/exe", hotcold.pid())).unwrap();
    std::fs::write(
        &rules,
        format!(
            "[[rule]]\nservice = \"checkout\"\ncomm = \"^hotcold$\"\nexecutable = '^{}$'\n",
            regex::escape(&hotcold_exe.display().to_string())
        ),
    )
    .unwrap();
    let port = free_port();
    let socket = daemon.socket().display().to_string();
    let (hc, sp) = (hotcold.pid().to_string(), spinner.pid().to_string());
    // The whole machine, as an agent runs.
    let agent = start_agent(
        port,
        &[
            "-F",
            "99",
            "--window",
            "1s",
            "--service-rules",
            rules.to_str().unwrap(),
            "--socket",
            &socket,
        ],
        3.0,
    );

    // Judged by samples taken: a loaded machine gives hotcold fewer, so the request covers
    // more windows until there are enough.
    let mut seconds = 3;
    let samples = loop {
        let url = format!("http://127.0.0.1:{port}/debug/pprof/profile?seconds={seconds}");
        let Some(samples) = go_pprof_url(&url, dir.path()) else {
            return;
        };
        let hot = leaves(&samples, hotcold.pid());
        let judged = hot.get("leaf_hot").unwrap_or(&0) + hot.get("leaf_cold").unwrap_or(&0);
        if judged >= 200 || seconds >= 20 {
            break samples;
        }
        std::thread::sleep(Duration::from_secs(2));
        seconds += 4;
    };

    // The known split: leaf_hot does three units of work for each of leaf_cold's.
    let hot = leaves(&samples, hotcold.pid());
    let (h, c) = (
        *hot.get("leaf_hot").unwrap_or(&0) as f64,
        *hot.get("leaf_cold").unwrap_or(&0) as f64,
    );
    assert!(h + c >= 100.0, "too few hotcold samples: {hot:?}");
    let share = h / (h + c);
    assert!(
        (0.67..=0.83).contains(&share),
        "leaf_hot's share of hotcold's leaves is {share:.3}, not 0.75: {hot:?}"
    );
    let spin = leaves(&samples, spinner.pid());
    let spin_total: u64 = spin.values().sum();
    let other_spin = *spin.get("other_spin").unwrap_or(&0);
    assert!(
        spin_total >= 50 && other_spin as f64 >= 0.8 * spin_total as f64,
        "spinner's time is in other_spin: {spin:?}"
    );

    // The labels: the rule names hotcold's service; spinner's is its unit or executable;
    // executable, host, comm and pid from the process; the daemon run's tags on spinner only.
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let exe = |pid: u32| {
        std::fs::read_link(format!("/proc/{pid}/exe"))
            .unwrap()
            .display()
            .to_string()
    };
    let h_labels = labels_of(&samples, hotcold.pid());
    assert_eq!(h_labels["service_name"], "checkout", "{h_labels:?}");
    assert_eq!(h_labels["comm"], "hotcold");
    assert_eq!(h_labels["executable"], exe(hotcold.pid()));
    assert_eq!(h_labels["host"], host.trim());
    assert!(!h_labels.contains_key("phase"), "{h_labels:?}");
    let s_labels = labels_of(&samples, spinner.pid());
    let cgroup = std::fs::read_to_string(format!("/proc/{}/cgroup", spinner.pid())).unwrap();
    let unit = cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .and_then(|path| {
            path.rsplit('/')
                .find(|c| c.ends_with(".service") && !c.starts_with("user@"))
        });
    assert_eq!(
        s_labels["service_name"],
        unit.unwrap_or("spinner"),
        "{s_labels:?}"
    );
    assert_eq!(s_labels["executable"], exe(spinner.pid()));
    assert_eq!(s_labels["phase"], "step7", "{s_labels:?}");
    assert_eq!(s_labels["tag"], "fwd", "{s_labels:?}");
    // container_id where the cgroup path holds one, never otherwise.
    let container = regex::Regex::new(r"[0-9a-f]{64}").unwrap();
    for (pid, labels) in [(hotcold.pid(), &h_labels), (spinner.pid(), &s_labels)] {
        let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
        assert_eq!(
            labels.get("container_id").map(String::as_str),
            container.find(&cgroup).map(|m| m.as_str()),
            "{cgroup}"
        );
    }

    // The filters keep only what they name.
    let url =
        format!("http://127.0.0.1:{port}/debug/pprof/profile?seconds=3&service_name=checkout");
    let only = go_pprof_url(&url, dir.path()).unwrap();
    assert!(!only.is_empty());
    assert!(only.iter().all(|s| s.labels["pid"] == hc), "{only:?}");
    let url = format!("http://127.0.0.1:{port}/debug/pprof/profile?seconds=3&pid={sp}");
    let only = go_pprof_url(&url, dir.path()).unwrap();
    assert!(!only.is_empty());
    assert!(only.iter().all(|s| s.labels["pid"] == sp), "{only:?}");

    // /metrics parses as OpenMetrics text and counts what the agent did.
    let m = metrics(port);
    assert!(m["bpfprof_agent_windows_total"] >= 3.0, "{m:?}");
    assert!(m["bpfprof_agent_samples_total"] >= 150.0, "{m:?}");
    assert!(m["bpfprof_agent_processes_tracked"] >= 2.0, "{m:?}");
    assert!(m["bpfprof_agent_cpu_seconds_total"] > 0.0, "{m:?}");
    assert!(m["bpfprof_agent_resident_memory_bytes"] > 1e6, "{m:?}");
    assert!(
        m["bpfprof_agent_unwind_table_resident_bytes"] > 0.0,
        "{m:?}"
    );
    assert_eq!(m["bpfprof_agent_daemon_unreachable_total"], 0.0, "{m:?}");
    for cap in ["window_ring", "symbol_cache", "unwind_tables"] {
        assert!(m.contains_key(&format!("bpfprof_agent_cap_hits_total{{cap={cap}}}")));
    }
    assert!(m.contains_key("bpfprof_agent_samples_lost_total{reason=lost_in_transfer}"));

    // SIGTERM stops it cleanly.
    agent.signal(libc::SIGTERM);
    agent.wait_timeout(Duration::from_secs(30)).assert_code(0);
}

/// Whether the shell `pid` of the loop below became its final `sleep`: the loop has ended.
fn loop_ended(pid: u32) -> bool {
    proc_status(pid).is_some_and(|s| s.name == "sleep")
}

#[test]
fn agent_memory_stays_bounded_while_300_processes_come_and_go() {
    if !require_root() {
        return;
    }
    // A shell starting 300 short-lived processes over two minutes (each a `shortlived` that
    // burns 0.1 s of CPU, and a `sleep`), in a cgroup of its own that the agent records.
    let cgroup = TestCgroup::named(&format!("bpfprof-agent-test-{}", std::process::id()));
    let shortlived = bpfprof_tests::workload_path("shortlived");
    let script = format!(
        "read go; for i in $(seq 300); do {} 0.1 & sleep 0.4; done; wait; exec sleep 60",
        shortlived.display()
    );
    let mut shell = Command::new("sh")
        .args(["-c", &script])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let shell_pid = shell.id();
    cgroup.add(shell_pid);
    let port = free_port();
    let agent = start_agent(
        port,
        &["--cgroup", &cgroup.relative, "-F", "99", "--window", "4s"],
        1.0,
    );
    // The loop starts once the shell is in the cgroup and the agent records it.
    let mut go = shell.stdin.take().unwrap();
    std::io::Write::write_all(&mut go, b"go\n").unwrap();
    drop(go);
    let rss = || vm_rss_kb(agent.pid());
    std::thread::sleep(Duration::from_secs(10));
    let rss_early = rss();
    // The loop ends when the shell's last child exits and it sleeps; a window later its
    // children are forgotten.
    poll_until(Duration::from_secs(400), || {
        loop_ended(shell_pid).then_some(())
    })
    .expect("the shell's loop ended");
    std::thread::sleep(Duration::from_secs(10));
    let rss_end = rss();
    let m = metrics(port);
    // Only the shell (now its final sleep) is left: the 600 that exited were dropped.
    assert!(m["bpfprof_agent_processes_tracked"] <= 1.0, "{m:?}");
    assert!(m["bpfprof_agent_processes_labelled"] <= 1.0, "{m:?}");
    // They were recorded: the ring (120 s) holds short_work's samples from dozens of
    // processes, and nothing from outside the cgroup.
    let dir = tempdir();
    let url = format!("http://127.0.0.1:{port}/debug/pprof/profile?seconds=120");
    if let Some(samples) = go_pprof_url(&url, dir.path()) {
        let mut pids = std::collections::BTreeSet::new();
        let mut unattributed = 0;
        for s in &samples {
            // A process that exited before the agent took it in keeps its samples, unnamed.
            let comm = s.labels["comm"].as_str();
            assert!(
                ["sh", "shortlived", "sleep", "[exited process]"].contains(&comm),
                "a sample from outside the cgroup: {s:?}"
            );
            if s.leaf == "short_work" {
                pids.insert(s.labels["pid"].clone());
            }
            if comm == "[exited process]" {
                unattributed += s.count;
            }
        }
        let total: u64 = samples.iter().map(|s| s.count).sum();
        eprintln!(
            "short_work in {} processes; {unattributed} of {total} samples of processes that \
             exited before they were taken in",
            pids.len()
        );
        assert!(pids.len() >= 50, "short_work in {} processes", pids.len());
    }
    assert!(
        rss_end <= rss_early + 10 * 1024,
        "the agent's RSS grew from {rss_early} KiB after 10 s to {rss_end} KiB"
    );
    drop(agent);
    let _ = shell.kill();
    let _ = shell.wait();
}
