//! End to end: the bpfprof daemon with real runs on real processes, its CLI and Rust client,
//! its security rules, hostile clients, concurrency and restarts. Needs root.

use std::{
    io::{Read, Write},
    os::unix::{fs::MetadataExt, net::UnixStream},
    path::Path,
    process::Command,
    thread,
    time::Duration,
};

use bpfprof::{
    client::{Client, FunctionProfiler, ProfileOptions},
    protocol::{RunRequest, RunState},
};
use bpfprof_tests::*;

const TIMEOUT: Duration = Duration::from_secs(60);
/// A uid the tests run unprivileged clients and targets as (nobody).
const USER: u32 = 65534;

fn run_request(pid: u32, tags: &[&str]) -> RunRequest {
    RunRequest {
        pid,
        frequency: Some(499),
        duration_ms: Some(60_000),
        sample_tags: tags.iter().map(|s| s.to_string()).collect(),
        ..RunRequest::default()
    }
}

fn folded_of(files: &std::collections::BTreeMap<String, String>) -> Profile {
    Profile::read(Path::new(files.get("folded").expect("a folded file")))
}

#[test]
fn cli_run_status_stop_results() {
    needs_root!();
    let daemon = Daemon::start(&[]);
    let target = Workload::spawn("hotcold", &["60"]);
    let pid = format!("{}:{}", pid_ns_inode(target.pid()), target.pid());
    let run = daemon.cli(&async_run_args(
        &pid,
        "60000",
        &["--sample-tags", "fwd,step7", "--tag", "phase=train"],
    ));
    run.assert_code(0);
    let id: u64 = run
        .stdout
        .trim()
        .strip_prefix("Run Id: ")
        .unwrap_or_else(|| panic!("expected `Run Id: N`, got {:?}", run.stdout))
        .parse()
        .unwrap();
    let status = daemon.cli(&["status", "--run-id", &id.to_string()]);
    status.assert_code(0);
    assert_eq!(status.stdout.trim(), "Profile run status: RUNNING");
    // Stopped once the target has run 1.5 s of CPU, not after 1.5 s of a loaded machine's
    // wall time, in which it may get a fifth of that.
    let cpu_at_start = target.cpu_time();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while target.cpu_time().saturating_sub(cpu_at_start) < Duration::from_millis(1500)
        && std::time::Instant::now() < deadline
    {
        thread::sleep(Duration::from_millis(50));
    }
    daemon
        .cli(&["stop", "--run-id", &id.to_string()])
        .assert_code(0);
    let results = daemon.cli(&[
        "results",
        "--run-id",
        &id.to_string(),
        "--wait",
        "30s",
        "--json",
    ]);
    results.assert_code(0);
    let reply: serde_json::Value = serde_json::from_str(&results.stdout).unwrap();
    assert_eq!(reply["state"], "STOPPED", "{reply:#}");
    let samples = reply["samples"].as_u64().unwrap();
    assert!(
        samples > 200,
        "only {samples} samples in 1.5 CPU-s at 499 Hz: {reply:#}"
    );
    for format in [
        "svg",
        "folded",
        "pprof",
        "speedscope",
        "pstats",
        "summary-json",
    ] {
        let path = reply["files"][format]
            .as_str()
            .unwrap_or_else(|| panic!("no {format}: {reply:#}"));
        assert!(
            std::fs::metadata(path).unwrap().len() > 0,
            "{path} is empty"
        );
    }
    let profile = Profile::read(Path::new(reply["files"]["folded"].as_str().unwrap()));
    assert!(
        profile.count_leaf("leaf_hot") > profile.count_leaf("leaf_cold"),
        "{}",
        profile.top(5)
    );
    assert!(
        profile.has_frame("[tag fwd]") && profile.has_frame("[phase=train]"),
        "{}",
        profile.top(3)
    );
    let tags = tag_pairs(&reply["summary"]["tags"]);
    assert_eq!(tags, ["tag=fwd", "tag=step7", "phase=train"]);
    let list = daemon.cli(&["list"]);
    assert!(
        list.stdout.contains("STOPPED") && list.stdout.contains("phase=train"),
        "{}",
        list.stdout
    );
    // The human form of results names the files and the top functions.
    let human = daemon.cli(&["results", "--run-id", &id.to_string()]);
    assert!(
        human.stdout.contains("Total samples:") && human.stdout.contains("leaf_hot"),
        "{}",
        human.stdout
    );
}

#[test]
fn concurrent_runs_on_two_processes_keep_their_own_samples_and_tags() {
    needs_root!();
    let daemon = Daemon::start(&[]);
    let hot = Workload::spawn("hotcold", &["60"]);
    let spin = Workload::spawn("spinner", &["60"]);
    let mut client = daemon.client();
    let a = client.run(run_request(hot.pid(), &["first"])).unwrap();
    let b = client.run(run_request(spin.pid(), &["second"])).unwrap();
    assert_eq!(a.state, Some(RunState::Running));
    assert_eq!(b.state, Some(RunState::Running));
    thread::sleep(Duration::from_millis(1500));
    let (a, b) = (a.run_id.unwrap(), b.run_id.unwrap());
    client.stop(a).unwrap();
    client.stop(b).unwrap();
    let ra = client.results(a, Duration::from_secs(30)).unwrap();
    let rb = client.results(b, Duration::from_secs(30)).unwrap();
    let (pa, pb) = (
        folded_of(ra.files.as_ref().unwrap()),
        folded_of(rb.files.as_ref().unwrap()),
    );
    assert!(
        pa.total() > 100 && pb.total() > 100,
        "{} / {}",
        pa.total(),
        pb.total()
    );
    assert_eq!(
        pa.count_containing("other_spin"),
        0,
        "spinner samples in hotcold's run:\n{}",
        pa.top(5)
    );
    assert_eq!(
        pb.count_containing("leaf_hot"),
        0,
        "hotcold samples in spinner's run:\n{}",
        pb.top(5)
    );
    assert!(pa.has_frame("[tag first]") && !pa.has_frame("[tag second]"));
    assert!(pb.has_frame("[tag second]") && !pb.has_frame("[tag first]"));
}

/// `bpfprof run --follow-children`: the children the target forks during the run are in its
/// profile; without it they are not.
#[test]
fn cli_run_follows_children_when_asked() {
    needs_root!();
    let daemon = Daemon::start(&[]);
    let shortlived = workload_path("shortlived");
    for follow in [true, false] {
        // The child starts after the run has attached, and the shell outlives the run.
        let mut cmd = std::process::Command::new("sh");
        cmd.args([
            "-c",
            &format!("sleep 1.5; {} 1; sleep 60", shortlived.display()),
        ]);
        let target = Workload::spawn_command(cmd);
        let pid = target.pid().to_string();
        let mut args = async_run_args(&pid, "5000", &[]);
        if follow {
            args.push("--follow-children");
        }
        let run = daemon.cli(&args);
        run.assert_code(0);
        let id: u64 = run
            .stdout
            .lines()
            .find_map(|l| l.strip_prefix("Run Id: "))
            .unwrap_or_else(|| panic!("no `Run Id: N` in {:?}", run.stdout))
            .trim()
            .parse()
            .unwrap();
        let reply = daemon
            .client()
            .results(id, Duration::from_secs(30))
            .unwrap();
        let profile = folded_of(reply.files.as_ref().unwrap());
        crate::check_children_followed(&profile, follow);
    }
}

#[test]
fn run_ends_with_success_when_its_target_exits() {
    needs_root!();
    let daemon = Daemon::start(&[]);
    let target = Workload::spawn("shortlived", &[]);
    let mut client = daemon.client();
    let id = client
        .run(run_request(target.pid(), &[]))
        .unwrap()
        .run_id
        .unwrap();
    let reply = client.results(id, Duration::from_secs(30)).unwrap();
    assert_eq!(reply.state, Some(RunState::Success), "{reply:?}");
    let profile = folded_of(reply.files.as_ref().unwrap());
    assert!(profile.has_frame("short_work"), "{}", profile.top(5));
}

#[test]
fn unprivileged_clients_profile_only_their_own_processes() {
    needs_root!();
    let daemon = Daemon::start(&[]);
    let (bin_dir, bin) = world_executable_bpfprof();
    let hotcold = bin_dir.path().join("hotcold");
    copy_executable(&workload_path("hotcold"), &hotcold, &["0.001"]);
    let as_user = |program: &Path| {
        let mut cmd = Command::new("setpriv");
        cmd.args([
            format!("--reuid={USER}"),
            format!("--regid={USER}"),
            "--clear-groups".into(),
        ])
        .arg(program);
        cmd
    };
    let roots = Workload::spawn("hotcold", &["60"]);
    let mut own_cmd = as_user(&hotcold);
    own_cmd.arg("60");
    let own = Workload::spawn_command(own_cmd);
    thread::sleep(Duration::from_millis(200));
    let socket = daemon.socket().display().to_string();
    let cli = |args: &[&str]| {
        let mut cmd = as_user(&bin);
        cmd.args(args).args(["--socket", &socket]);
        spawn_bpfprof_command(cmd).wait_timeout(TIMEOUT)
    };
    // Someone else's process: refused with the permission exit code and a reason.
    let refused = cli(&[
        "run",
        "--async",
        "--pid",
        &roots.pid().to_string(),
        "--duration-ms",
        "5000",
    ]);
    refused.assert_code(4);
    refused.assert_stderr_mentions(&["uid", "own"]);
    // Its own process: allowed.
    let allowed = cli(&[
        "run",
        "--async",
        "--pid",
        &own.pid().to_string(),
        "-F",
        "499",
        // `bpfprof --duration`'s form: a run that ignored it would outlast the wait below.
        "--duration",
        "1500ms",
    ]);
    allowed.assert_code(0);
    let id = allowed
        .stdout
        .trim()
        .trim_start_matches("Run Id: ")
        .to_string();
    let results = cli(&["results", "--run-id", &id, "--wait", "30s", "--json"]);
    results.assert_code(0);
    let reply: serde_json::Value = serde_json::from_str(&results.stdout).unwrap();
    assert_eq!(reply["state"], "SUCCESS", "{reply:#}");
    // Result files belong to the run's owner and nobody else may read them.
    for path in reply["files"].as_object().unwrap().values() {
        let meta = std::fs::metadata(path.as_str().unwrap()).unwrap();
        assert_eq!(meta.uid(), USER, "{path} owner");
        assert_eq!(meta.mode() & 0o077, 0, "{path} mode {:o}", meta.mode());
    }
    // Root's runs are invisible to the user: status says no such run.
    let mut client = daemon.client();
    let root_run = client
        .run(run_request(roots.pid(), &[]))
        .unwrap()
        .run_id
        .unwrap();
    let hidden = cli(&["status", "--run-id", &root_run.to_string()]);
    hidden.assert_code(9);
    let listed = cli(&["list", "--json"]);
    let listed: serde_json::Value = serde_json::from_str(&listed.stdout).unwrap();
    assert!(
        listed["runs"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["owner_uid"] == USER),
        "{listed:#}"
    );
    client.stop(root_run).unwrap();
}

/// Sends raw bytes on a fresh connection and returns whatever comes back before EOF or a
/// short timeout.
fn raw_exchange(socket: &Path, bytes: &[u8], close_write: bool) -> String {
    let mut stream = UnixStream::connect(socket).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let _ = stream.write_all(bytes);
    if close_write {
        let _ = stream.shutdown(std::net::Shutdown::Write);
    }
    let mut out = Vec::new();
    let _ = stream.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

#[test]
fn hostile_requests_get_errors_and_the_daemon_keeps_serving() {
    needs_root!();
    let daemon = Daemon::start(&[]);
    let socket = daemon.socket();
    let target = Workload::spawn("hotcold", &["60"]);
    let mut client = daemon.client();
    let id = client
        .run(run_request(target.pid(), &[]))
        .unwrap()
        .run_id
        .unwrap();

    let garbage = raw_exchange(&socket, b"\x00\xff\xfe garbage {{{\n", true);
    assert!(garbage.contains("bad_request"), "{garbage}");
    let huge = vec![b'x'; 200 * 1024];
    let too_long = raw_exchange(&socket, &huge, false);
    assert!(
        too_long.contains("bad_request") && too_long.contains("longer"),
        "{too_long}"
    );
    // Half a message, then the client disappears.
    let half = raw_exchange(&socket, br#"{"version":1,"op":"run","pid":"#, true);
    assert!(half.is_empty() || half.contains("bad_request"), "{half}");
    for (line, code) in [
        (
            r#"{"version":1,"op":"run","pid":1,"sample_tags":["bad tag!"]}"#,
            "bad_request",
        ),
        (
            r#"{"version":1,"op":"run","pid":1,"duration_ms":999999999}"#,
            "bad_request",
        ),
        (
            r#"{"version":1,"op":"run","pid":1,"frequency":100000000}"#,
            "bad_request",
        ),
        (
            r#"{"version":1,"op":"run","pid":1,"formats":["../../etc/passwd"]}"#,
            "bad_request",
        ),
        (
            r#"{"version":1,"op":"results","run_id":424242}"#,
            "not_found",
        ),
        (r#"{"version":9,"op":"list"}"#, "bad_request"),
    ] {
        let reply = raw_exchange(&socket, format!("{line}\n").as_bytes(), true);
        assert!(reply.contains(code), "{line} -> {reply}");
    }
    // Everyone else is still served, and the run is unharmed.
    let status = client.status(id).unwrap();
    assert_eq!(status.state, Some(RunState::Running));
    let mut fresh = daemon.client();
    assert!(fresh.list().unwrap().iter().any(|r| r.run_id == id));
    client.stop(id).unwrap();
    let done = client.results(id, Duration::from_secs(30)).unwrap();
    assert_eq!(done.state, Some(RunState::Stopped));
}

#[test]
fn a_hundred_clients_poll_status_while_runs_proceed() {
    needs_root!();
    let daemon = Daemon::start(&[]);
    let target = Workload::spawn("hotcold", &["60"]);
    let mut client = daemon.client();
    let mut request = run_request(target.pid(), &[]);
    request.duration_ms = Some(3000);
    let id = client.run(request).unwrap().run_id.unwrap();
    let socket = daemon.socket();
    let pollers: Vec<_> = (0..100)
        .map(|_| {
            let socket = socket.clone();
            thread::spawn(move || {
                let mut client = Client::connect(Some(&socket)).expect("connect");
                let mut states = Vec::new();
                for _ in 0..10 {
                    states.push(client.status(id).expect("status").state.unwrap());
                    thread::sleep(Duration::from_millis(20));
                }
                states
            })
        })
        .collect();
    for poller in pollers {
        let states = poller.join().expect("poller thread");
        assert!(
            states.iter().all(|s| matches!(
                s,
                RunState::Running | RunState::Processing | RunState::Success
            )),
            "{states:?}"
        );
    }
    let reply = client.results(id, Duration::from_secs(30)).unwrap();
    assert_eq!(reply.state, Some(RunState::Success), "{reply:?}");
    assert!(reply.samples.unwrap() > 300, "{reply:?}");
}

#[test]
fn too_many_runs_is_refused_clearly() {
    needs_root!();
    let daemon = Daemon::start(&["--max-runs", "1"]);
    let target = Workload::spawn("hotcold", &["60"]);
    let mut client = daemon.client();
    let id = client
        .run(run_request(target.pid(), &[]))
        .unwrap()
        .run_id
        .unwrap();
    let second = daemon.cli(&["run", "--async", "--pid", &target.pid().to_string()]);
    second.assert_code(11);
    second.assert_stderr_mentions(&["limit"]);
    client.stop(id).unwrap();
}

#[test]
fn results_survive_a_restart_and_runs_in_flight_come_back_failed() {
    needs_root!();
    let mut daemon = Daemon::start(&[]);
    let target = Workload::spawn("hotcold", &["60"]);
    let mut client = daemon.client();
    let mut short = run_request(target.pid(), &["kept"]);
    short.duration_ms = Some(800);
    let done = client.run(short).unwrap().run_id.unwrap();
    let done_reply = client.results(done, Duration::from_secs(30)).unwrap();
    assert_eq!(done_reply.state, Some(RunState::Success));
    let in_flight = client
        .run(run_request(target.pid(), &[]))
        .unwrap()
        .run_id
        .unwrap();
    drop(client);
    daemon.crash();
    daemon.spawn();
    let mut client = daemon.client();
    let lost = client.status(in_flight).unwrap();
    assert_eq!(lost.state, Some(RunState::Failed), "{lost:?}");
    assert!(lost.reason.unwrap_or_default().contains("daemon"));
    let kept = client.results(done, Duration::ZERO).unwrap();
    assert_eq!(kept.state, Some(RunState::Success));
    assert_eq!(kept.files, done_reply.files);
    assert!(folded_of(kept.files.as_ref().unwrap()).has_frame("[tag kept]"));
    // New runs get new ids.
    let next = client
        .run(run_request(target.pid(), &[]))
        .unwrap()
        .run_id
        .unwrap();
    assert!(next > in_flight);
    client.stop(next).unwrap();
}

/// The client libraries allow one profiling run per process at a time, and the tests of one
/// file share a process: the tests that profile this process take turns.
static SELF_PROFILING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Burns CPU in a function the profile can name. The clock is read only every million
/// iterations: std is built without frame pointers, so a sample inside a std leaf would lose
/// this function, its caller's caller being what the frame-pointer walk finds.
#[inline(never)]
fn busy_rust_work(ms: u64) -> u64 {
    let end = std::time::Instant::now() + Duration::from_millis(ms);
    let mut x = 0u64;
    while std::time::Instant::now() < end {
        for _ in 0..1_000_000 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
    }
    x
}

#[test]
fn function_profiler_profiles_the_calling_process() {
    needs_root!();
    let _turn = SELF_PROFILING.lock().unwrap_or_else(|e| e.into_inner());
    let daemon = Daemon::start(&[]);
    let mut profiler = FunctionProfiler::new(ProfileOptions {
        stop_at_error: true,
        frequency: Some(499),
        sample_tags: vec!["from-rust".into()],
        socket: Some(daemon.socket()),
        ..ProfileOptions::default()
    });
    let value = profiler
        .profile(|| busy_rust_work(1500))
        .expect("profiled run");
    assert_ne!(value, 0);
    let reply = profiler.last_result().expect("results").clone();
    assert_eq!(reply.state, Some(RunState::Stopped), "{reply:?}");
    let top = reply.top.unwrap_or_default();
    assert!(
        top.iter().any(|f| f.name.contains("busy_rust_work")),
        "{top:?}"
    );
    // Other tests run in this process at the same time, so the work is a large share, not all.
    let profile = folded_of(reply.files.as_ref().unwrap());
    assert!(
        profile.count_containing("daemon::runs::busy_rust_work") * 5 > profile.total(),
        "{}",
        profile.top(5)
    );
}

#[test]
fn phase_profiler_tags_each_phase_and_skips_nested_ones() {
    needs_root!();
    use bpfprof::client::{PhaseConfig, PhaseProfiler};
    let _turn = SELF_PROFILING.lock().unwrap_or_else(|e| e.into_inner());
    let daemon = Daemon::start(&[]);
    let socket = daemon.socket();
    let mut config = PhaseConfig::from_lookup(|_| None);
    config.options.socket = Some(socket);
    config.options.frequency = Some(499);
    let phases = PhaseProfiler::new(config);
    let value = phases.profile_phase("compute", || {
        let nested = phases.profile_phase("nested", || busy_rust_work(50));
        busy_rust_work(800) ^ nested
    });
    assert_ne!(value, 0);
    let stats = phases.stats();
    assert_eq!((stats.successes, stats.skipped_nested), (1, 1), "{stats:?}");
    let runs = phases.runs();
    assert_eq!(runs.len(), 1, "{runs:?}");
    let id = runs[0].run_id.expect("a run id");
    let reply = daemon
        .client()
        .results(id, Duration::from_secs(30))
        .unwrap();
    let profile = folded_of(reply.files.as_ref().unwrap());
    assert!(profile.has_frame("[phase=compute]"), "{}", profile.top(3));
    assert!(
        profile.has_frame(&format!("[session={}]", phases.session())),
        "{}",
        profile.top(3)
    );
}
