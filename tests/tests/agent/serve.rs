//! `bpfprof agent`: the always-on agent, read as its users read it: `go tool pprof` on its
//! `/debug/pprof/profile` URL, the Prometheus project's own parser on its `/metrics`, and its
//! memory while processes come and go.

use std::{collections::BTreeMap, process::Command, time::Duration};

use bpfprof_tests::{
    agent::{
        fetch_as, free_port, go_pprof_bytes, go_pprof_url, leaves, metrics, start_agent,
        start_agent_on, windows_cut, Endpoint, RawSample, TestCgroup,
    },
    assert_hotcold_split, needs_root, poll_until, proc_status, tempdir, test_user, workload_as,
    Daemon, TestUser, Workload,
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
    needs_root!();
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
        *hot.get("leaf_hot").unwrap_or(&0),
        *hot.get("leaf_cold").unwrap_or(&0),
    );
    assert!(h + c >= 100, "too few hotcold samples: {hot:?}");
    assert_hotcold_split(h, c, &hot);
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
    needs_root!();
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

/// Opens `n` connections to `port` as `user` (raising its open-file limit to the hard one),
/// sends nothing on them and holds them `hold_s` seconds; returns the client once it said
/// how many it opened.
fn hold_idle_connections(user: &TestUser, port: u16, n: usize, hold_s: u32) -> (Workload, usize) {
    let script = r#"
import socket, resource, sys, time
port, n, hold = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
n = min(n, hard - 64)
held = []
for i in range(n):
    s = socket.socket()
    s.setblocking(False)
    try:
        s.connect(("127.0.0.1", port))
    except BlockingIOError:
        pass
    except OSError as e:
        sys.stderr.write("connect %d: %s\n" % (i, e))
        s.close()
        break
    held.append(s)
with open(sys.argv[4], "w") as f:
    f.write(str(len(held)))
time.sleep(hold)
"#;
    let dir = tempfile::Builder::new()
        .prefix("bpfprof-idle-")
        .tempdir()
        .unwrap();
    std::os::unix::fs::chown(dir.path(), Some(user.uid), Some(user.gid)).unwrap();
    let said = dir.path().join("opened");
    let mut cmd = user.command("/usr/bin/python3");
    cmd.args([
        "-c",
        script,
        &port.to_string(),
        &n.to_string(),
        &hold_s.to_string(),
        said.to_str().unwrap(),
    ]);
    let client = Workload::spawn_command(cmd);
    let opened = poll_until(Duration::from_secs(120), || {
        std::fs::read_to_string(&said)
            .ok()?
            .trim()
            .parse::<usize>()
            .ok()
    })
    .expect("the client opened its connections");
    (client, opened)
}

/// The number of file descriptors `pid` holds.
fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

#[test]
fn agent_http_root_scrapes_while_two_users_hold_20000_idle_connections() {
    needs_root!();
    // Windows are spooled for an OTLP endpoint that is not there: a spool write that meets
    // the fd limit says so on stderr ("Too many open files").
    let state = tempdir();
    let port = free_port();
    let endpoint = Endpoint::Tcp(port);
    let agent = start_agent_on(
        &endpoint,
        &[
            "-F",
            "49",
            "--window",
            "1s",
            "--otlp-endpoint",
            "http://127.0.0.1:9",
            "--state-dir",
            state.path().to_str().unwrap(),
        ],
        2.0,
    );
    let users = [test_user("bpfprof-t1"), test_user("bpfprof-t2")];
    let hold = 90;
    let clients: Vec<(Workload, usize)> = users
        .iter()
        .map(|u| hold_idle_connections(u, port, 10_000, hold))
        .collect();
    let opened: usize = clients.iter().map(|(_, n)| n).sum();
    eprintln!("the two users opened {opened} connections");
    assert!(
        opened >= 15_000,
        "the users opened only {opened} connections"
    );
    // Let the kernel hand the agent every connection it completed (SYNs dropped while its
    // queue was full come again within seconds).
    std::thread::sleep(Duration::from_secs(10));
    let started = std::time::Instant::now();
    let first = windows_cut(&fetch_as(None, &endpoint, "/metrics", 30.0).body);
    let mut slowest = 0.0f64;
    let mut most_fds = 0;
    for _ in 0..5 {
        let got = fetch_as(None, &endpoint, "/debug/pprof/profile?seconds=1", 30.0);
        assert_eq!(
            got.status,
            200,
            "root's scrape failed after {:.1} s: {} ({} of the users' connections open)\n{}",
            got.seconds,
            got.error,
            opened,
            agent.stderr_so_far()
        );
        slowest = slowest.max(got.seconds);
        most_fds = most_fds.max(open_fds(agent.pid()));
        std::thread::sleep(Duration::from_secs(3));
    }
    let m = fetch_as(None, &endpoint, "/metrics", 30.0);
    assert_eq!(m.status, 200, "root's /metrics: {}", m.error);
    let elapsed = started.elapsed().as_secs_f64();
    let cut = windows_cut(&m.body).unwrap() - first.expect("windows before");
    let text = String::from_utf8_lossy(&m.body);
    let refused: f64 = text
        .lines()
        .filter(|l| l.starts_with("bpfprof_agent_http_connections_refused_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    eprintln!(
        "root's slowest scrape {slowest:.2} s; {cut} windows cut in {elapsed:.1} s; the agent \
         held at most {most_fds} fds; {refused} connections refused"
    );
    // The users' connections are closed as soon as accepted: the agent stays far from
    // its fd limit.
    assert!(most_fds < 2_000, "the agent held {most_fds} fds");
    assert!(slowest < 10.0, "root's slowest scrape took {slowest:.1} s");
    // Windows of 1 s: at least half of them cut on a loaded machine.
    assert!(
        cut >= 0.5 * elapsed,
        "{cut} windows cut in {elapsed:.1} s while the users held their connections"
    );
    // Most of the users' connections are refused at accept, counted; the rest were taken
    // and then closed by the header timeout (10 s), which frees room for later ones: on a
    // loaded machine the users' 20,000 connects take long enough that a tenth or more of
    // them get in that way (17,889 of 20,000 refused in one CI run), so the bound is half.
    // The agent's own fd count above is what shows none of them is held.
    assert!(
        refused >= (opened as f64) * 0.5,
        "only {refused} of {opened} connections were refused: {text}"
    );
    let stderr = agent.stderr_so_far();
    assert!(
        !stderr.contains("Too many open files"),
        "the agent ran out of fds:\n{stderr}"
    );
    drop(clients);
    agent.signal(libc::SIGTERM);
    agent.wait_timeout(Duration::from_secs(60)).assert_code(0);
}

#[test]
fn agent_http_memory_is_given_back_after_500_concurrent_scrapes() {
    needs_root!();
    // Many distinct stacks make each window's profile, and a merge of the ring, big.
    let _stacks = Workload::spawn("manystacks", &["300"]);
    let port = free_port();
    let endpoint = Endpoint::Tcp(port);
    let agent = start_agent_on(&endpoint, &["-F", "99", "--window", "1s"], 2.0);
    // The ring fills (30 windows) before the idle figure is read.
    poll_until(Duration::from_secs(120), || {
        let m = fetch_as(None, &endpoint, "/metrics", 30.0);
        String::from_utf8_lossy(&m.body)
            .lines()
            .any(|l| l == "bpfprof_agent_windows_kept 30")
            .then_some(())
    })
    .expect("the ring filled");
    let _ = fetch_as(None, &endpoint, "/debug/pprof/profile?seconds=600", 60.0);
    std::thread::sleep(Duration::from_secs(5));
    let idle = vm_rss_kb(agent.pid());
    let first = windows_cut(&fetch_as(None, &endpoint, "/metrics", 30.0).body).unwrap();
    let started = std::time::Instant::now();
    let script = r#"
import sys, threading, http.client, json
port, n = int(sys.argv[1]), int(sys.argv[2])
statuses = {}
lock = threading.Lock()
barrier = threading.Barrier(n)
def scrape():
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        barrier.wait()
        c.request("GET", "/debug/pprof/profile?seconds=600")
        status = str(c.getresponse().status)
    except Exception as e:
        status = type(e).__name__
    with lock:
        statuses[status] = statuses.get(status, 0) + 1
threads = [threading.Thread(target=scrape) for _ in range(n)]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps(statuses))
"#;
    let mut peak = idle;
    let mut burst = Command::new("python3")
        .args(["-c", script, &port.to_string(), "500"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    while burst.try_wait().unwrap().is_none() {
        peak = peak.max(vm_rss_kb(agent.pid()));
        std::thread::sleep(Duration::from_millis(200));
    }
    let out = burst.wait_with_output().unwrap();
    let statuses = String::from_utf8_lossy(&out.stdout).into_owned();
    let burst_secs = started.elapsed().as_secs_f64();
    let back = poll_until(Duration::from_secs(30), || {
        let rss = vm_rss_kb(agent.pid());
        (rss <= idle + 50 * 1024).then_some(rss)
    });
    let m = fetch_as(None, &endpoint, "/metrics", 30.0);
    let elapsed = started.elapsed().as_secs_f64();
    let cut = windows_cut(&m.body).unwrap() - first;
    eprintln!(
        "500 scrapes: {statuses} in {burst_secs:.1} s; RSS idle {idle} KiB, peak {peak} KiB, \
         after {back:?} KiB; {cut} windows cut in {elapsed:.1} s"
    );
    assert!(
        statuses.contains("\"200\""),
        "no scrape was answered: {statuses}"
    );
    assert!(
        back.is_some(),
        "the agent's RSS stayed above {idle} KiB + 50 MiB 30 s after the burst (now {} KiB)",
        vm_rss_kb(agent.pid())
    );
    assert!(
        cut >= 0.5 * elapsed,
        "{cut} windows cut in {elapsed:.1} s during and after the burst"
    );
    agent.signal(libc::SIGTERM);
    agent.wait_timeout(Duration::from_secs(60)).assert_code(0);
}

/// The function names leafward of the workload's own code in `pid`'s samples: its kernel
/// frames. The workload issues its system calls from `raw_syscall3`, inlined into
/// `do_syscalls`: that location's innermost line, the frame a sample shows, is
/// `raw_syscall3`, so either name marks where the user's code begins.
fn kernel_functions(samples: &[RawSample], pid: u32) -> std::collections::BTreeSet<String> {
    let user = |f: &String| f == "do_syscalls" || f == "raw_syscall3";
    samples
        .iter()
        .filter(|s| s.labels.get("pid") == Some(&pid.to_string()))
        .filter(|s| s.frames.iter().any(user))
        .flat_map(|s| s.frames.iter().take_while(|f| !user(f)).cloned())
        .collect()
}

#[test]
fn agent_http_users_see_only_their_own_processes_over_loopback() {
    needs_root!();
    let dir = tempdir();
    let shared = bpfprof_tests::hostile::shared_dir();
    let user = test_user("bpfprof-t1");
    let mine = workload_as(&user, shared.path(), "syscalls", &["120"]);
    let roots = Workload::spawn("spinner", &["120"]);
    // A run root started on the user's process, with a tag the user must not see.
    let daemon = Daemon::start(&[]);
    daemon
        .cli(&[
            "run",
            "--async",
            "--pid",
            &mine.pid().to_string(),
            "--tag",
            "secret=roots-own",
            "--duration-ms",
            "120000",
        ])
        .assert_code(0);
    let port = free_port();
    let endpoint = Endpoint::Tcp(port);
    let socket = daemon.socket().display().to_string();
    let agent = start_agent_on(
        &endpoint,
        &["-F", "99", "--window", "1s", "--socket", &socket],
        3.0,
    );
    let (me, root_pid) = (mine.pid().to_string(), roots.pid().to_string());
    let waited = std::time::Instant::now();
    let root_view = loop {
        let got = fetch_as(None, &endpoint, "/debug/pprof/profile?seconds=5", 60.0);
        assert_eq!(got.status, 200, "{}", got.error);
        let Some(samples) = go_pprof_bytes(&got.body, dir.path(), "root.pb") else {
            return;
        };
        let both = [&me, &root_pid]
            .iter()
            .all(|p| samples.iter().any(|s| s.labels.get("pid") == Some(p)));
        let kernel = !kernel_functions(&samples, mine.pid()).is_empty();
        let tagged = samples
            .iter()
            .any(|s| s.labels.get("secret").map(String::as_str) == Some("roots-own"));
        if both && kernel && tagged {
            break samples;
        }
        assert!(
            waited.elapsed() < Duration::from_secs(120),
            "root's view lacks a process ({me}, {root_pid}), kernel frames or the run's tag: \
             {both} {kernel} {tagged}; pids {:?}\n{}",
            samples
                .iter()
                .filter_map(|s| s.labels.get("pid"))
                .collect::<std::collections::BTreeSet<_>>(),
            agent.stderr_so_far()
        );
        std::thread::sleep(Duration::from_secs(2));
    };
    let kernel = kernel_functions(&root_view, mine.pid());
    let got = fetch_as(
        Some(&user),
        &endpoint,
        "/debug/pprof/profile?seconds=5",
        60.0,
    );
    assert_eq!(got.status, 200, "the user's scrape: {}", got.error);
    let view = go_pprof_bytes(&got.body, dir.path(), "user.pb").unwrap();
    let pids: std::collections::BTreeSet<&str> = view
        .iter()
        .filter_map(|s| s.labels.get("pid").map(String::as_str))
        .collect();
    eprintln!(
        "root sees {} samples, the user {} of pids {pids:?}; kernel functions in root's view: \
         {kernel:?}",
        root_view.len(),
        view.len()
    );
    assert!(
        pids.contains(me.as_str()),
        "the user's own process is missing: {pids:?}"
    );
    assert!(
        !pids.contains(root_pid.as_str()),
        "root's process is shown to the user"
    );
    for pid in &pids {
        let owner = std::fs::metadata(format!("/proc/{pid}"))
            .map(|m| std::os::unix::fs::MetadataExt::uid(&m))
            .ok();
        assert!(
            owner.is_none() || owner == Some(user.uid),
            "pid {pid} (uid {owner:?}) is shown to uid {}",
            user.uid
        );
    }
    assert!(
        view.iter().all(|s| !s.labels.contains_key("secret")),
        "root's run tag is shown to the user"
    );
    let paranoid: i32 = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let shown: Vec<&String> = view
        .iter()
        .flat_map(|s| &s.frames)
        .filter(|f| kernel.contains(*f))
        .collect();
    if paranoid >= 2 {
        assert!(
            shown.is_empty(),
            "kernel frames shown to the user at paranoid {paranoid}: {shown:?}"
        );
    } else {
        assert!(
            !shown.is_empty(),
            "the user's own kernel frames are missing at paranoid {paranoid}"
        );
    }
    // /metrics stays readable (it shows nothing of any one process).
    let m = fetch_as(Some(&user), &endpoint, "/metrics", 30.0);
    assert_eq!(m.status, 200, "{}", m.error);
    assert!(windows_cut(&m.body).is_some());
    agent.signal(libc::SIGTERM);
    agent.wait_timeout(Duration::from_secs(60)).assert_code(0);
}

#[test]
fn agent_http_unix_socket_keeps_users_out_at_mode_600() {
    needs_root!();
    // A folder every user may enter: only the socket's own mode keeps them out.
    let dir = tempdir();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let path = dir.path().join("agent.sock");
    // A link planted where the socket goes is refused, and its target left alone.
    let target = dir.path().join("precious");
    std::fs::write(&target, "keep me").unwrap();
    std::os::unix::fs::symlink(&target, &path).unwrap();
    let refused = bpfprof_tests::run_bpfprof(
        ["agent", "--listen", &format!("unix:{}", path.display())],
        Duration::from_secs(60),
    );
    assert_ne!(refused.code(), 0, "the agent served over a planted link");
    refused.assert_stderr_mentions(&["symbolic link"]);
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep me");
    std::fs::remove_file(&path).unwrap();

    let endpoint = Endpoint::Unix(path.clone());
    let agent = start_agent_on(&endpoint, &["-F", "49", "--window", "1s"], 1.0);
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&path).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600, "the socket's mode is {mode:o}");
    let user = test_user("bpfprof-t1");
    let got = fetch_as(Some(&user), &endpoint, "/metrics", 30.0);
    assert_eq!(got.status, 0, "a user reached a 0600 socket: {got:?}");
    assert!(got.error.contains("Permission"), "{}", got.error);
    let root = fetch_as(None, &endpoint, "/debug/pprof/profile?seconds=1", 30.0);
    assert_eq!(root.status, 200, "{}", root.error);
    agent.signal(libc::SIGTERM);
    agent.wait_timeout(Duration::from_secs(60)).assert_code(0);
    assert!(!path.exists(), "the socket is removed when the agent stops");
}
