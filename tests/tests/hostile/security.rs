//! End to end: attacks on the root daemon by real non-root users (issue: the daemon is safe to
//! run as root on a shared machine). Each test runs the attack as it was reported and checks
//! that it no longer works and that honest users lose nothing. Needs root.

use std::{
    os::unix::fs::{MetadataExt, PermissionsExt},
    path::{Path, PathBuf},
    process::Command,
    thread,
    time::Duration,
};

use bpfprof_tests::{
    hostile::{cli, run_id_of, shared_dir, start_as},
    *,
};

/// A root-owned file in a root-only folder, standing for `/etc/passwd`: the attack's target.
struct Victim {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

const VICTIM_TEXT: &str = "root:x:0:0:root:/root:/bin/bash\n";

impl Victim {
    fn new() -> Victim {
        let dir = tempdir();
        let path = dir.path().join("passwd");
        std::fs::write(&path, VICTIM_TEXT).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        Victim { _dir: dir, path }
    }

    #[track_caller]
    fn assert_untouched(&self) {
        let meta = std::fs::metadata(&self.path).unwrap();
        assert_eq!(meta.uid(), 0, "the victim changed owner");
        assert_eq!(meta.mode() & 0o7777, 0o644, "the victim changed mode");
        assert_eq!(std::fs::read_to_string(&self.path).unwrap(), VICTIM_TEXT);
    }
}

/// The reported critical attack: a user plants links in its run's folder, and the root daemon
/// writes its results (and its state) through them into a root-owned file and gives it away.
#[test]
fn a_user_cannot_make_the_daemon_write_or_chown_through_planted_links() {
    needs_root!();
    let mallory = test_user("bpfprof-t1");
    let daemon = Daemon::start(&[]);
    let victim = Victim::new();
    let (bin_dir, bin) = world_executable_bpfprof();
    let own = workload_as(&mallory, bin_dir.path(), "hotcold", &["60"]);

    let started = start_as(&mallory, &bin, &daemon, own.pid(), 60000, &[]);
    let id = run_id_of(&started).to_string();
    let run_dir = daemon.state().join("runs").join(&id);

    // The attack: links named like the files the daemon will write, a FIFO, a new file.
    for name in [
        "profile.svg",
        "profile.folded",
        "run.json.tmp",
        "summary.json",
    ] {
        let (ok, err) = shell_as(
            &mallory,
            &format!(
                "ln -s {} {}/{name}",
                victim.path.display(),
                run_dir.display()
            ),
        );
        assert!(!ok, "a user planted {name} in its run folder");
        assert!(err.contains("Permission denied"), "{err}");
    }
    let (ok, _) = shell_as(
        &mallory,
        &format!("mkfifo {}/profile.pb.gz", run_dir.display()),
    );
    assert!(!ok, "a user planted a FIFO in its run folder");
    // Nobody but the daemon may list runs or run folders.
    let (ok, _) = shell_as(
        &mallory,
        &format!("ls {}", daemon.state().join("runs").display()),
    );
    assert!(!ok, "a user listed the runs folder");

    let stopped = cli(&mallory, &bin, &daemon, &["stop", "--run-id", &id]);
    stopped.assert_code(0);
    let results = cli(
        &mallory,
        &bin,
        &daemon,
        &["results", "--run-id", &id, "--wait", "30s", "--json"],
    );
    results.assert_code(0);
    let reply: serde_json::Value = serde_json::from_str(&results.stdout).unwrap();
    assert_eq!(reply["state"], "STOPPED", "{reply:#}");
    victim.assert_untouched();

    // The owner reads its results by path and through the socket, and they are the same.
    let files = reply["files"].as_object().unwrap();
    assert!(files.len() >= 5, "{reply:#}");
    let svg = files["svg"].as_str().unwrap();
    let (ok, err) = shell_as(&mallory, &format!("head -c 5 {svg} > /dev/null"));
    assert!(ok, "the owner cannot read its own result: {err}");
    let copies = tempdir();
    std::fs::set_permissions(copies.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let copied = cli(
        &mallory,
        &bin,
        &daemon,
        &[
            "results",
            "--run-id",
            &id,
            "--copy-to",
            &copies.path().display().to_string(),
            "--json",
        ],
    );
    copied.assert_code(0);
    for (format, path) in files {
        let name = Path::new(path.as_str().unwrap()).file_name().unwrap();
        let through_socket = std::fs::read(copies.path().join(name)).unwrap();
        let on_disk = std::fs::read(path.as_str().unwrap()).unwrap();
        assert_eq!(
            through_socket, on_disk,
            "{format} differs through the socket"
        );
        assert!(!on_disk.is_empty(), "{format} is empty");
    }
    // The run folder and state stay the daemon's; the results are the owner's alone.
    let dir_meta = std::fs::symlink_metadata(&run_dir).unwrap();
    assert_eq!(dir_meta.uid(), 0);
    assert_eq!(
        dir_meta.mode() & 0o022,
        0,
        "run folder mode {:o}",
        dir_meta.mode()
    );
    let state = std::fs::symlink_metadata(run_dir.join("run.json")).unwrap();
    assert_eq!(state.uid(), 0);
    assert_eq!(state.mode() & 0o077, 0);

    // Another user can neither read the files nor fetch them through the socket.
    let eve = test_user("bpfprof-t2");
    let (ok, _) = shell_as(&eve, &format!("cat {svg} > /dev/null"));
    assert!(!ok, "another user read the results");
    let stolen = cli(
        &eve,
        &bin,
        &daemon,
        &["results", "--run-id", &id, "--copy-to", "/tmp"],
    );
    stolen.assert_code(9);
}

/// State left by an earlier version (run folders owned by their users) may hold a FIFO as
/// `run.json`, links as result files and forged ids and owners: the daemon still starts at
/// once, writes through nothing, and believes only what it controls.
#[test]
fn planted_state_neither_stalls_the_daemon_nor_spoofs_runs() {
    needs_root!();
    let mallory = test_user("bpfprof-t1");
    let alice = test_user("bpfprof-t2");
    let victim = Victim::new();
    let dir = tempdir();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let runs = dir.path().join("state").join("runs");
    std::fs::create_dir_all(&runs).unwrap();
    let plant = |id: &str, json: Option<String>, fifo: bool| {
        let run = runs.join(id);
        std::fs::create_dir(&run).unwrap();
        if let Some(json) = json {
            std::fs::write(run.join("run.json"), json).unwrap();
        }
        if fifo {
            let ok = Command::new("mkfifo")
                .arg(run.join("run.json"))
                .status()
                .unwrap();
            assert!(ok.success());
        }
        std::os::unix::fs::symlink(&victim.path, run.join("profile.svg")).unwrap();
        std::os::unix::fs::chown(&run, Some(mallory.uid), Some(mallory.gid)).unwrap();
    };
    let run_json = |id: u64, owner: u32, state: &str| {
        format!(
            r#"{{"run_id":{id},"state":"{state}","pid":1,"pid_ns":1,"owner_uid":{owner},
                "created_unix_ms":{now},"ended_unix_ms":{now},
                "top":[{{"name":"forged_top","self_samples":9,"total_samples":9}}]}}"#,
            now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis()
        )
    };
    plant("3", None, true);
    // Names run 5 and alice as owner, in mallory's folder: a forged id and a forged owner.
    plant("4", Some(run_json(5, alice.uid, "SUCCESS")), false);
    // A RUNNING state makes the daemon rewrite run.json at start, through run.json.tmp.
    plant("6", Some(run_json(6, mallory.uid, "RUNNING")), false);
    std::os::unix::fs::symlink(&victim.path, runs.join("6").join("run.json.tmp")).unwrap();

    let started = std::time::Instant::now();
    let daemon = Daemon::start_in(dir, &[]);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the daemon took {:?} to listen",
        started.elapsed()
    );
    victim.assert_untouched();
    for id in ["3", "4", "6"] {
        let meta = std::fs::symlink_metadata(runs.join(id)).unwrap();
        assert_eq!(meta.uid(), 0, "run folder {id} still belongs to its user");
        assert!(
            std::fs::symlink_metadata(runs.join(id).join("profile.svg")).is_err(),
            "the planted link in run {id} is still there"
        );
    }
    // Alice sees no run she did not start; mallory's forged run kept its folder's id.
    let (bin_dir, bin) = world_executable_bpfprof();
    let _ = bin_dir;
    let listed = cli(&alice, &bin, &daemon, &["list", "--json"]);
    listed.assert_code(0);
    assert!(!listed.stdout.contains("forged_top"), "{}", listed.stdout);
    let listed = cli(&mallory, &bin, &daemon, &["list", "--json"]);
    let listed: serde_json::Value = serde_json::from_str(&listed.stdout).unwrap();
    let ids: Vec<u64> = listed["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["run_id"].as_u64().unwrap())
        .collect();
    assert_eq!(ids, vec![4, 6], "{listed:#}");
    // New runs get fresh ids after every folder present, including the unreadable one.
    let mut client = daemon.client();
    let w = Workload::spawn("hotcold", &["30"]);
    let reply = client
        .run(bpfprof::protocol::RunRequest {
            pid: w.pid(),
            duration_ms: Some(300),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(reply.run_id, Some(7));
}

#[test]
fn setuid_and_undumpable_processes_are_not_the_invokers_to_profile() {
    needs_root!();
    let alice = test_user("bpfprof-t1");
    let daemon = Daemon::start(&[]);
    let (bin_dir, bin) = world_executable_bpfprof();
    let programs = shared_dir();

    // A setuid-root copy of a workload, started by alice: real uid alice, effective root.
    let setuid = programs.path().join("spinner-setuid");
    copy_executable(&workload_path("spinner"), &setuid, &["0.001"]);
    std::fs::set_permissions(&setuid, std::fs::Permissions::from_mode(0o4755)).unwrap();
    let mut cmd = alice.command(&setuid);
    cmd.arg("60");
    let elevated = Workload::spawn_command(cmd);
    thread::sleep(Duration::from_millis(200));
    let status = std::fs::read_to_string(format!("/proc/{}/status", elevated.pid())).unwrap();
    assert!(
        status.contains(&format!("Uid:\t{}\t0\t0\t0", alice.uid)),
        "the workload runs setuid for alice:\n{status}"
    );
    let refused = start_as(&alice, &bin, &daemon, elevated.pid(), 60_000, &[]);
    refused.assert_code(4);
    assert!(
        !refused.stderr.contains("uid 0") && !refused.stderr.contains("belongs to"),
        "the refusal tells whose the process is: {}",
        refused.stderr
    );

    // A process of alice's that made itself undumpable (as ssh-agent and gpg-agent do).
    let mut cmd = alice.command("/usr/bin/python3");
    cmd.args([
        "-c",
        "import ctypes,time; ctypes.CDLL(None).prctl(4, 0, 0, 0, 0); time.sleep(60)",
    ]);
    let undumpable = Workload::spawn_command(cmd);
    thread::sleep(Duration::from_millis(500));
    start_as(&alice, &bin, &daemon, undumpable.pid(), 60_000, &[]).assert_code(4);

    // Her ordinary process is still hers to profile (the refusals are not blanket).
    let own = workload_as(&alice, bin_dir.path(), "spinner", &["60"]);
    let ok = start_as(&alice, &bin, &daemon, own.pid(), 60_000, &[]);
    ok.assert_code(0);
}

#[test]
fn kernel_frames_follow_perf_event_paranoid_for_non_root_users() {
    needs_root!();
    let paranoid: i32 = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let alice = test_user("bpfprof-t1");
    let daemon = Daemon::start(&[]);
    let (bin_dir, bin) = world_executable_bpfprof();
    let own = workload_as(&alice, bin_dir.path(), "syscalls", &["60"]);
    let kernel_frames = |result: &RunResult| {
        let reply: serde_json::Value = serde_json::from_str(&result.stdout).unwrap();
        let folded = reply["files"]["folded"].as_str().unwrap().to_string();
        let profile = Profile::read(Path::new(&folded));
        assert!(profile.total() > 50, "{}", profile.top(5));
        profile.count_where(|frames| frames.iter().any(|f| is_kernel_frame(f)))
    };
    let as_alice = cli(
        &alice,
        &bin,
        &daemon,
        &[
            "run",
            "--pid",
            &own.pid().to_string(),
            "-F",
            "499",
            "--duration-ms",
            "1500",
            "--json",
        ],
    );
    as_alice.assert_code(0);
    let as_root = daemon.cli(&[
        "run",
        "--pid",
        &own.pid().to_string(),
        "-F",
        "499",
        "--duration-ms",
        "1500",
        "--json",
    ]);
    as_root.assert_code(0);
    assert!(kernel_frames(&as_root) > 0, "root sees no kernel frames");
    let alice_sees = kernel_frames(&as_alice);
    if paranoid >= 2 {
        assert_eq!(
            alice_sees, 0,
            "perf_event_paranoid {paranoid} hides the kernel"
        );
    } else {
        assert!(
            alice_sees > 0,
            "perf_event_paranoid {paranoid} shows the kernel"
        );
    }
}

#[test]
fn one_user_cannot_use_up_runs_ids_or_kept_results() {
    needs_root!();
    let alice = test_user("bpfprof-t1");
    let bob = test_user("bpfprof-t2");
    let daemon = Daemon::start(&["--max-runs-per-user", "2", "--keep-runs-per-user", "2"]);
    let (bin_dir, bin) = world_executable_bpfprof();
    let hers = workload_as(&alice, bin_dir.path(), "spinner", &["60"]);
    let his = workload_as(&bob, bin_dir.path(), "spinner", &["60"]);

    // Bob's one result, kept from before.
    let bobs = run_id_of(&start_as(&bob, &bin, &daemon, his.pid(), 60_000, &[])).to_string();
    cli(&bob, &bin, &daemon, &["stop", "--run-id", &bobs]).assert_code(0);

    // Alice: two runs at once, a third refused (and it reveals nothing of others).
    let a1 = run_id_of(&start_as(&alice, &bin, &daemon, hers.pid(), 60_000, &[])).to_string();
    let _a2 = run_id_of(&start_as(&alice, &bin, &daemon, hers.pid(), 60_000, &[])).to_string();
    let third = start_as(&alice, &bin, &daemon, hers.pid(), 60_000, &[]);
    third.assert_code(11);
    // Bob is not refused for her runs.
    let b2 = run_id_of(&start_as(&bob, &bin, &daemon, his.pid(), 60_000, &[])).to_string();
    // Refused requests (another user's process, too fast a rate) create no run, use no id.
    for _ in 0..20 {
        start_as(&alice, &bin, &daemon, his.pid(), 60_000, &[]).assert_code(4);
        let pid = hers.pid().to_string();
        let args = ["run", "--async", "--pid", &pid, "-F", "5000"];
        cli(&alice, &bin, &daemon, &args).assert_code(5);
    }
    cli(&bob, &bin, &daemon, &["stop", "--run-id", &b2]).assert_code(0);
    let b3 = run_id_of(&start_as(&bob, &bin, &daemon, his.pid(), 60_000, &[])).to_string();
    assert_eq!(
        b3.parse::<u64>().unwrap(),
        b2.parse::<u64>().unwrap() + 1,
        "refused requests consumed run ids"
    );
    cli(&bob, &bin, &daemon, &["stop", "--run-id", &b3]).assert_code(0);
    // Alice runs and ends many more; her oldest go, Bob's stay.
    cli(&alice, &bin, &daemon, &["stop", "--run-id", &a1]).assert_code(0);
    cli(
        &alice,
        &bin,
        &daemon,
        &["results", "--run-id", &a1, "--wait", "30s"],
    )
    .assert_code(0);
    for _ in 0..3 {
        let id = run_id_of(&start_as(&alice, &bin, &daemon, hers.pid(), 60_000, &[])).to_string();
        cli(&alice, &bin, &daemon, &["stop", "--run-id", &id]).assert_code(0);
        cli(
            &alice,
            &bin,
            &daemon,
            &["results", "--run-id", &id, "--wait", "30s"],
        )
        .assert_code(0);
    }
    let listed = cli(&bob, &bin, &daemon, &["list", "--json"]);
    listed.assert_code(0);
    let reply: serde_json::Value = serde_json::from_str(&listed.stdout).unwrap();
    let ids: Vec<u64> = reply["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["run_id"].as_u64().unwrap())
        .collect();
    // Bob keeps his newest two (his own cap), whatever alice did.
    let mut expected: Vec<u64> = vec![b2.parse().unwrap(), b3.parse().unwrap()];
    let mut ids = ids;
    ids.sort_unstable();
    expected.sort_unstable();
    assert_eq!(ids, expected, "bob's kept results");
    let _ = bobs;
    let hers = cli(&alice, &bin, &daemon, &["list", "--json"]);
    let reply: serde_json::Value = serde_json::from_str(&hers.stdout).unwrap();
    let ended = reply["runs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| ["SUCCESS", "STOPPED", "FAILED"].contains(&r["state"].as_str().unwrap()))
        .count();
    assert!(ended <= 2, "alice keeps {ended} ended runs");
}

#[test]
fn a_connection_flood_by_one_user_does_not_shut_others_out() {
    needs_root!();
    let mallory = test_user("bpfprof-t1");
    let daemon = Daemon::start(&["--client-idle-timeout", "2s"]);
    // Mallory opens 300 connections and holds them, writing a blank line to each now and
    // then (which used to keep them alive forever).
    let script = format!(
        "import socket,time,sys\n\
         socks=[]\n\
         refused=0\n\
         for i in range(300):\n\
         \x20   s=socket.socket(socket.AF_UNIX); s.connect('{}'); socks.append(s)\n\
         time.sleep(0.5)\n\
         for s in socks:\n\
         \x20   s.setblocking(False)\n\
         \x20   try:\n\
         \x20       d=s.recv(4096)\n\
         \x20       refused += b'connections open' in d\n\
         \x20   except BlockingIOError: pass\n\
         print(refused, flush=True)\n\
         end=time.time()+4\n\
         closed=0\n\
         while time.time()<end:\n\
         \x20   for s in socks[:10]:\n\
         \x20       try: s.send(b'\\n')\n\
         \x20       except OSError: pass\n\
         \x20   time.sleep(0.2)\n\
         for s in socks[:10]:\n\
         \x20   s.setblocking(False)\n\
         \x20   try: closed += s.recv(1)==b''\n\
         \x20   except BlockingIOError: pass\n\
         \x20   except OSError: closed += 1\n\
         print(closed, flush=True)\n",
        daemon.socket().display()
    );
    let before = process_cpu_time(daemon.pid()).unwrap();
    let mut flood = mallory.command("/usr/bin/python3");
    flood.args(["-c", &script]);
    let flood = flood
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    thread::sleep(Duration::from_millis(1500));
    // Meanwhile others are served at once.
    let started = std::time::Instant::now();
    daemon.cli(&["list"]).assert_code(0);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "list took {:?} during the flood",
        started.elapsed()
    );
    let out = flood.wait_with_output().unwrap();
    let lines: Vec<u64> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect();
    assert_eq!(
        lines.len(),
        2,
        "flood script output: {lines:?}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        lines[0] >= 300 - 64,
        "only {} of 300 connections were refused for one user",
        lines[0]
    );
    assert_eq!(
        lines[1], 10,
        "blank lines kept connections past the idle timeout"
    );
    let used = process_cpu_time(daemon.pid()).unwrap() - before;
    assert!(
        used < Duration::from_secs(2),
        "the flood cost the daemon {used:?} of CPU"
    );
}

#[test]
fn the_daemon_works_under_the_shipped_units_capabilities() {
    needs_root!();
    // The capabilities the unit grants, read from the unit itself so the two cannot drift.
    let unit = std::fs::read_to_string(workspace_root().join("contrib/bpfprof.service")).unwrap();
    let caps: Vec<String> = unit
        .lines()
        .find_map(|l| l.strip_prefix("CapabilityBoundingSet="))
        .expect("the unit sets CapabilityBoundingSet")
        .split_whitespace()
        .map(|c| format!("+{}", c.trim_start_matches("CAP_").to_lowercase()))
        .collect();
    assert!(
        !caps.iter().any(|c| c == "+dac_override" || c == "+fowner"),
        "the unit grants {caps:?}"
    );
    let bounding = format!("--bounding-set=-all,{}", caps.join(","));
    let dir = tempdir();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let socket = dir.path().join("bpfprof.sock");
    let state = dir.path().join("state");
    let mut cmd = Command::new("setpriv");
    cmd.args([&bounding, "--inh-caps=-all", "--"])
        .arg(bpfprof_bin())
        .args(["daemon", "--socket"])
        .arg(&socket)
        .arg("--state-dir")
        .arg(&state);
    let daemon_process = spawn_bpfprof_command(cmd);
    poll_until(Duration::from_secs(10), || {
        std::os::unix::net::UnixStream::connect(&socket).ok()
    })
    .unwrap_or_else(|| panic!("daemon did not listen:\n{}", daemon_process.stderr_so_far()));
    let status = std::fs::read_to_string(format!("/proc/{}/status", daemon_process.pid())).unwrap();
    assert!(
        status.contains("CapEff:\t") && !status.contains("CapEff:\t000001ffffffffff"),
        "the daemon kept every capability:\n{status}"
    );

    let alice = test_user("bpfprof-t1");
    let (bin_dir, bin) = world_executable_bpfprof();
    let own = workload_as(&alice, bin_dir.path(), "hotcold", &["60"]);
    let copies = tempdir();
    std::fs::set_permissions(copies.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let mut run = alice.command(&bin);
    run.args(["run", "--pid", &own.pid().to_string(), "-F", "499"])
        .args(["--duration-ms", "1500", "--json", "--socket"])
        .arg(&socket);
    let result = spawn_bpfprof_command(run).wait_timeout(DAEMON_TIMEOUT);
    result.assert_code(0);
    let reply: serde_json::Value = serde_json::from_str(&result.stdout).unwrap();
    assert_eq!(
        reply["state"],
        "SUCCESS",
        "{reply:#}\n{}",
        daemon_process.stderr_so_far()
    );
    let id = reply["run_id"].as_u64().unwrap().to_string();
    let mut copy = alice.command(&bin);
    copy.args(["results", "--run-id", &id, "--copy-to"])
        .arg(copies.path())
        .arg("--socket")
        .arg(&socket);
    spawn_bpfprof_command(copy)
        .wait_timeout(DAEMON_TIMEOUT)
        .assert_code(0);
    let folded = std::fs::read_to_string(copies.path().join("profile.folded")).unwrap();
    assert!(folded.contains("leaf_hot"), "{folded}");
    daemon_process.signal(libc::SIGTERM);
    let _ = daemon_process.wait_timeout(DAEMON_TIMEOUT);
}

#[test]
fn protocol_answers_follow_the_documented_contract() {
    needs_root!();
    let daemon = Daemon::start(&[]);
    let spin = Workload::spawn("spinner", &["60"]);
    let mut client = daemon.client();
    let id = client
        .run(bpfprof::protocol::RunRequest {
            pid: spin.pid(),
            frequency: Some(199),
            duration_ms: Some(60_000),
            ..Default::default()
        })
        .unwrap()
        .run_id
        .unwrap();
    let stopped = client.stop(id).unwrap();
    assert_eq!(
        stopped.state,
        Some(bpfprof::protocol::RunState::Processing),
        "stop answers PROCESSING (protocol.md)"
    );
    // `list` refuses unknown fields as `run` does.
    let mut stream = std::os::unix::net::UnixStream::connect(daemon.socket()).unwrap();
    use std::io::{BufRead, Write};
    stream
        .write_all(b"{\"version\":1,\"op\":\"list\",\"bogus\":1}\n")
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(&stream)
        .read_line(&mut line)
        .unwrap();
    let reply: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(reply["ok"], false, "{reply}");
    assert!(
        reply["error"]["message"]
            .as_str()
            .unwrap()
            .contains("bogus"),
        "{reply}"
    );
}

#[test]
fn the_cli_ends_quietly_on_a_closed_pipe_and_says_when_the_daemon_dies() {
    needs_root!();
    let mut daemon = Daemon::start(&[]);
    let spin = Workload::spawn("spinner", &["60"]);
    let pid = spin.pid().to_string();
    let id = run_id_of(&daemon.cli(&[
        "run",
        "--async",
        "--pid",
        &pid,
        "-F",
        "99",
        "--duration-ms",
        "60000",
    ]))
    .to_string();
    // A reader that is gone before bpfprof writes (as `| head -0`): no panic, no backtrace.
    let mut cmd = Command::new(bpfprof_bin());
    cmd.args(["list", "--socket"])
        .arg(daemon.socket())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("panicked") && out.status.code() != Some(101),
        "{:?}: {stderr}",
        out.status
    );
    // The daemon dies while a client waits for results: exit 10, daemon unavailable.
    let waiting = spawn_bpfprof([
        "results",
        "--run-id",
        &id,
        "--wait",
        "60s",
        "--socket",
        &daemon.socket().display().to_string(),
    ]);
    thread::sleep(Duration::from_millis(500));
    daemon.crash();
    let result = waiting.wait_timeout(DAEMON_TIMEOUT);
    result.assert_code(10);
}

#[test]
fn one_user_cannot_fill_the_kernel_programs_namespace_slots() {
    needs_root!();
    let alice = test_user("bpfprof-t1");
    let daemon = Daemon::start(&[]);
    let (bin_dir, bin) = world_executable_bpfprof();
    let spinner = bin_dir.path().join("spinner");
    copy_executable(&workload_path("spinner"), &spinner, &["0.001"]);
    // Three of alice's processes, each in a pid namespace of its own.
    let in_new_namespace = || {
        let mut cmd = Command::new("unshare");
        cmd.args(["--pid", "--fork", "--kill-child", "setpriv"])
            .arg(format!("--reuid={}", alice.uid))
            .arg(format!("--regid={}", alice.gid))
            .args(["--clear-groups", "--"])
            .arg(&spinner)
            .arg("60");
        let w = Workload::spawn_command(cmd);
        let unshare = w.pid();
        let pid = poll_until(Duration::from_secs(5), || {
            all_pids().into_iter().find(|p| {
                proc_status(*p).is_some_and(|s| s.name == "spinner" && s.nspid.len() == 2)
                    && is_descendant_of(*p, unshare)
            })
        })
        .expect("the spinner in its namespace");
        (w, pid)
    };
    let (_a, first) = in_new_namespace();
    let (_b, second) = in_new_namespace();
    let (_c, third) = in_new_namespace();
    start_as(&alice, &bin, &daemon, first, 60_000, &[]).assert_code(0);
    start_as(&alice, &bin, &daemon, second, 60_000, &[]).assert_code(0);
    let refused = start_as(&alice, &bin, &daemon, third, 60_000, &[]);
    refused.assert_code(11);
    refused.assert_stderr_mentions(&["pid namespaces"]);
    // Root is not bound by it.
    let pid = third.to_string();
    daemon
        .cli(&["run", "--async", "--pid", &pid, "-F", "99"])
        .assert_code(0);
}

#[test]
fn a_full_disk_fails_the_run_cleanly() {
    needs_root!();
    // A state folder on a tiny tmpfs: the run folder fits, the result files do not. Mode
    // 0755: a tmpfs's root is 1777 by default, a state folder every user could write in.
    let dir = tempdir();
    let state = dir.path().join("small");
    std::fs::create_dir(&state).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=48k,mode=0755", "tmpfs"])
        .arg(&state)
        .status()
        .unwrap();
    assert!(mounted.success(), "mounting a tmpfs");
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(state.clone());
    let socket = dir.path().join("bpfprof.sock");
    let daemon_process = spawn_bpfprof([
        "daemon".as_ref(),
        "--socket".as_ref(),
        socket.as_os_str(),
        "--state-dir".as_ref(),
        state.as_os_str(),
    ]);
    poll_until(Duration::from_secs(10), || {
        std::os::unix::net::UnixStream::connect(&socket).ok()
    })
    .unwrap_or_else(|| panic!("daemon did not listen:\n{}", daemon_process.stderr_so_far()));
    let many = Workload::spawn("manystacks", &["30"]);
    let mut client = bpfprof::client::Client::connect(Some(&socket)).unwrap();
    let id = client
        .run(bpfprof::protocol::RunRequest {
            pid: many.pid(),
            frequency: Some(999),
            duration_ms: Some(1500),
            ..Default::default()
        })
        .unwrap()
        .run_id
        .unwrap();
    let done = client.results(id, DAEMON_TIMEOUT).unwrap();
    assert_eq!(
        done.state,
        Some(bpfprof::protocol::RunState::Failed),
        "{done:?}\n{}",
        daemon_process.stderr_so_far()
    );
    let reason = done.reason.unwrap_or_default();
    assert!(reason.contains("No space left"), "reason: {reason}");
    // No empty or partial result files are left, and the run is not left RUNNING on disk.
    let run_dir = state.join("runs").join(id.to_string());
    let left: Vec<String> = std::fs::read_dir(&run_dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("profile."))
        .collect();
    assert!(left.is_empty(), "partial results left: {left:?}");
    let saved = std::fs::read_to_string(run_dir.join("run.json")).unwrap_or_default();
    assert!(!saved.contains("\"RUNNING\""), "run.json: {saved}");
    daemon_process.signal(libc::SIGTERM);
    let _ = daemon_process.wait_timeout(DAEMON_TIMEOUT);
}
