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

use bpfprof_tests::*;

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

/// Runs a shell command as `user`; returns whether it succeeded and its stderr.
fn shell_as(user: &TestUser, script: &str) -> (bool, String) {
    let out = user.command("sh").args(["-c", script]).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A workload run as `user`, from a copy any user can execute.
fn workload_as(user: &TestUser, bin_dir: &Path, name: &str, args: &[&str]) -> Workload {
    let copy = bin_dir.join(name);
    if !copy.exists() {
        copy_executable(&workload_path(name), &copy, &["0.001"]);
    }
    let mut cmd = user.command(&copy);
    cmd.args(args);
    let w = Workload::spawn_command(cmd);
    thread::sleep(Duration::from_millis(200));
    w
}

/// The CLI as `user` against `daemon`.
fn cli_as(user: &TestUser, bin: &Path, daemon: &Daemon, args: &[&str]) -> RunResult {
    let mut cmd = user.command(bin);
    cmd.args(args)
        .args(["--socket", &daemon.socket().display().to_string()]);
    spawn_bpfprof_command(cmd).wait_timeout(DAEMON_TIMEOUT)
}

fn run_id_of(result: &RunResult) -> String {
    result.assert_code(0);
    result
        .stdout
        .trim()
        .trim_start_matches("Run Id: ")
        .to_string()
}

/// The reported critical attack: a user plants links in its run's folder, and the root daemon
/// writes its results (and its state) through them into a root-owned file and gives it away.
#[test]
fn a_user_cannot_make_the_daemon_write_or_chown_through_planted_links() {
    if !require_root() {
        return;
    }
    let mallory = test_user("bpfprof-t1");
    let daemon = Daemon::start(&[]);
    let victim = Victim::new();
    let (bin_dir, bin) = world_executable_bpfprof();
    let own = workload_as(&mallory, bin_dir.path(), "hotcold", &["60"]);

    let started = cli_as(
        &mallory,
        &bin,
        &daemon,
        &[
            "run",
            "--async",
            "--pid",
            &own.pid().to_string(),
            "-F",
            "499",
            "--duration-ms",
            "60000",
        ],
    );
    let id = run_id_of(&started);
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

    let stopped = cli_as(&mallory, &bin, &daemon, &["stop", "--run-id", &id]);
    stopped.assert_code(0);
    let results = cli_as(
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
    let copied = cli_as(
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
    let stolen = cli_as(
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
    if !require_root() {
        return;
    }
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
    let listed = cli_as(&alice, &bin, &daemon, &["list", "--json"]);
    listed.assert_code(0);
    assert!(!listed.stdout.contains("forged_top"), "{}", listed.stdout);
    let listed = cli_as(&mallory, &bin, &daemon, &["list", "--json"]);
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
