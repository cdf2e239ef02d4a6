//! Issue 41, item 2: folders bpfprof writes in as root (the agent's and the daemon's state
//! and export spools, the unwind table cache) under a path an ordinary user can write. The
//! user plants links where root writes; root's files must stay as they were, and a driver
//! whose state could be steered refuses to start, naming the folder and why.

use std::{
    os::unix::fs::{chown, lchown, symlink, MetadataExt, PermissionsExt},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use bpfprof_tests::{
    agent::free_port, exit, needs_root, poll_until, run_bpfprof, spawn_bpfprof, tempdir, test_user,
    workload_path, BpfprofProcess, TestUser,
};

/// What root owns and the user must not be able to change through bpfprof.
const PRECIOUS: &[u8] = b"root's own file: bpfprof must never write here\n";

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Gives `path` (and everything under it) to `user`.
fn give_tree(path: &Path, user: &TestUser) {
    let status = Command::new("chown")
        .arg("-hR")
        .arg(format!("{}:{}", user.uid, user.gid))
        .arg(path)
        .status()
        .unwrap();
    assert!(status.success());
}

/// Root's victims: a private file the links point to, and a folder whose mode a followed
/// link would change.
struct Victims {
    file: PathBuf,
    folder: PathBuf,
}

impl Victims {
    fn make(base: &Path) -> Victims {
        let private = base.join("root-only");
        std::fs::create_dir(&private).unwrap();
        chmod(&private, 0o700);
        let file = private.join("precious");
        std::fs::write(&file, PRECIOUS).unwrap();
        chmod(&file, 0o600);
        let folder = private.join("folder");
        std::fs::create_dir(&folder).unwrap();
        chmod(&folder, 0o755);
        Victims { file, folder }
    }

    /// Asserts both are as they were made.
    #[track_caller]
    fn assert_untouched(&self, what: &str) {
        let now = std::fs::read(&self.file).unwrap();
        assert!(
            now == PRECIOUS,
            "{what}: root's file was overwritten through a planted link ({} bytes now: {:?})",
            now.len(),
            String::from_utf8_lossy(&now[..now.len().min(80)])
        );
        let mode = std::fs::metadata(&self.folder).unwrap().mode() & 0o7777;
        assert_eq!(
            mode, 0o755,
            "{what}: root's folder's mode was changed through a planted link"
        );
    }
}

/// A shell run as `user` that keeps planting links to `victims` in `spool` (a backend's
/// spool folder): at each name a window is written under, and `rejected` to root's folder.
/// Killed on drop.
struct Planter(Child);

impl Planter {
    fn start(user: &TestUser, spool: &Path, victims: &Victims) -> Planter {
        let names = (0..8)
            .map(|n| format!(".tmp-{n}"))
            .chain((0..4).map(|n| format!("{n:020}.pb")))
            .collect::<Vec<_>>()
            .join(" ");
        let script = format!(
            "cd '{}' || exit 1; while :; do for n in {names}; do ln -sfn '{}' \"$n\"; done; \
             ln -sfn '{}' rejected 2>/dev/null; sleep 0.005; done",
            spool.display(),
            victims.file.display(),
            victims.folder.display(),
        );
        let child = user
            .command("sh")
            .args(["-c", &script])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        Planter(child)
    }
}

impl Drop for Planter {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Whether process `pid` (a child not yet reaped) has exited.
fn exited(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| {
        s.rsplit_once(") ").is_some_and(|(_, r)| r.starts_with('Z'))
    })
}

/// Which driver runs as root over the planted state.
#[derive(Clone, Copy, Debug)]
enum Driver {
    Agent,
    Daemon,
}

impl Driver {
    /// Starts it with `state` as its state directory and an OTLP backend nobody listens on
    /// (every window, or run, stays in the spool).
    fn start(self, state: &Path, dir: &Path) -> BpfprofProcess {
        let endpoint = format!("http://127.0.0.1:{}", free_port());
        let state = state.to_str().unwrap();
        match self {
            Driver::Agent => spawn_bpfprof([
                "agent",
                "-F",
                "49",
                "--window",
                "1s",
                "--unwind-cache",
                "off",
                "--otlp-endpoint",
                &endpoint,
                "--state-dir",
                state,
            ]),
            Driver::Daemon => {
                let socket = dir.join("bpfprof.sock");
                spawn_bpfprof([
                    "daemon",
                    "--socket",
                    socket.to_str().unwrap(),
                    "--unwind-cache",
                    "off",
                    "--otlp-endpoint",
                    &endpoint,
                    "--state-dir",
                    state,
                ])
            }
        }
    }
}

/// Where the user's part of the state directory begins.
#[derive(Clone, Copy, Debug)]
enum Owned {
    /// The user owns the state directory itself (`--state-dir /tmp/S`, made by the user).
    State,
    /// Root owns the state directory; the user owns `spool/` in it.
    Spool,
}

/// Root runs `driver` over a state directory part of which `user` owns, while the user
/// keeps planting links in its `spool/otlp`: root's file and folder stay as they were, and
/// the driver refuses to start, naming the user's folder and its owner.
fn links_planted_in_a_users_state_directory(driver: Driver, owned: Owned) {
    needs_root!();
    let user = test_user("bpfprof-t1");
    let base = tempdir();
    chmod(base.path(), 0o755);
    let victims = Victims::make(base.path());
    let state = base.path().join("S");
    let otlp = state.join("spool/otlp");
    // `rejected/` is left to the user, who makes it a link to root's folder.
    std::fs::create_dir_all(&otlp).unwrap();
    chmod(&state, 0o755);
    let users = match owned {
        Owned::State => state.clone(),
        Owned::Spool => state.join("spool"),
    };
    give_tree(&users, &user);
    let planter = Planter::start(&user, &otlp, &victims);
    // The links are there before the driver looks.
    poll_until(Duration::from_secs(10), || {
        std::fs::symlink_metadata(otlp.join(".tmp-7")).ok()
    })
    .expect("the user plants links");
    let process = driver.start(&state, base.path());
    // Given time to write windows through the links (a window a second) if it runs.
    let started = Instant::now();
    while !exited(process.pid()) && started.elapsed() < Duration::from_secs(20) {
        if std::fs::read(&victims.file).unwrap() != PRECIOUS {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(planter);
    let running = !exited(process.pid());
    if running {
        process.signal(libc::SIGTERM);
    }
    let result = process.wait_timeout(Duration::from_secs(60));
    victims.assert_untouched(&format!("{driver:?} over a user's {owned:?}"));
    assert!(
        !running,
        "the {driver:?} ran on a state directory another user can write:\n{}",
        result.stderr
    );
    result.assert_code(exit::UNSAFE_DIRECTORY);
    result.assert_stderr_mentions(&[&format!("refusing {}", users.display())]);
    result.assert_stderr_mentions(&[&format!("belongs to uid {}", user.uid)]);
}

#[test]
fn the_agent_refuses_a_state_directory_a_user_owns_and_root_s_file_is_untouched() {
    links_planted_in_a_users_state_directory(Driver::Agent, Owned::State);
}

#[test]
fn the_agent_refuses_a_spool_folder_a_user_owns_and_root_s_file_is_untouched() {
    links_planted_in_a_users_state_directory(Driver::Agent, Owned::Spool);
}

#[test]
fn the_daemon_refuses_a_spool_folder_a_user_owns_and_root_s_file_is_untouched() {
    links_planted_in_a_users_state_directory(Driver::Daemon, Owned::Spool);
}

/// State directories (or folders on their way) that another user could write in, each
/// refused by the agent and the daemon with the folder named and the reason.
#[test]
fn state_directories_others_may_write_or_own_are_refused_with_the_reason() {
    needs_root!();
    let user = test_user("bpfprof-t1");
    let base = tempdir();
    chmod(base.path(), 0o755);
    let make = |name: &str, mode: u32| {
        let path = base.path().join(name);
        std::fs::create_dir(&path).unwrap();
        chmod(&path, mode);
        path
    };
    // (state directory, the folder refused, what the reason says)
    let mut cases: Vec<(PathBuf, PathBuf, String)> = Vec::new();
    let open = make("open", 0o777);
    cases.push((open.clone(), open.clone(), "every user may write".into()));
    let group = make("group", 0o775);
    cases.push((group.clone(), group.clone(), "its group may write".into()));
    // A folder on the way that every user may write (not sticky): the state below it is
    // made by root, but the user could rename it away and put a folder of theirs there.
    let on_the_way = make("on-the-way", 0o777);
    cases.push((
        on_the_way.join("state"),
        on_the_way.clone(),
        "every user may write".into(),
    ));
    // Sticky, but the user's: only root's sticky folders (/tmp) are trusted on the way.
    let users_sticky = make("users-sticky", 0o1777);
    chown(&users_sticky, Some(user.uid), Some(user.gid)).unwrap();
    cases.push((
        users_sticky.join("state"),
        users_sticky.clone(),
        format!("belongs to uid {}", user.uid),
    ));
    // Another user's own folder, private to them.
    let theirs = make("theirs", 0o700);
    chown(&theirs, Some(user.uid), Some(user.gid)).unwrap();
    cases.push((
        theirs.clone(),
        theirs.clone(),
        format!("belongs to uid {}", user.uid),
    ));
    // A link the user made (in root's folder: as if root had once let them write there).
    let real = make("real", 0o755);
    let link = base.path().join("link");
    symlink(&real, &link).unwrap();
    lchown(&link, Some(user.uid), Some(user.gid)).unwrap();
    cases.push((
        link.join("state"),
        link.clone(),
        "symbolic link made by uid".into(),
    ));
    for (state, refused, reason) in &cases {
        for driver in [Driver::Agent, Driver::Daemon] {
            let process = driver.start(state, base.path());
            let started = Instant::now();
            while !exited(process.pid()) && started.elapsed() < Duration::from_secs(20) {
                std::thread::sleep(Duration::from_millis(20));
            }
            if !exited(process.pid()) {
                process.signal(libc::SIGTERM);
            }
            let result = process.wait_timeout(Duration::from_secs(60));
            let case = format!("{driver:?} with --state-dir {}", state.display());
            assert_eq!(
                result.status.code(),
                Some(exit::UNSAFE_DIRECTORY),
                "{case}: {}\n{}",
                result.status,
                result.stderr
            );
            result.assert_stderr_mentions(&[&format!("refusing {}", refused.display())]);
            result.assert_stderr_mentions(&[reason]);
        }
        // Nothing was made below the refused folder.
        assert!(!real.join("state").exists());
    }
}

/// The unwind table cache under a folder the user owns: the user's link in it would send
/// root's cache writes (and its removal of stale temporary files) into a folder of root's.
/// The cache is refused (the run goes on without it, saying why) and root's folder is
/// untouched.
#[test]
fn a_link_planted_on_the_unwind_cache_s_path_does_not_redirect_its_writes() {
    needs_root!();
    let user = test_user("bpfprof-t1");
    let base = tempdir();
    chmod(base.path(), 0o755);
    // Root's folder, with a file the cache's trimming would take for its own stale write.
    let roots = base.path().join("roots");
    let roots_cache = roots.join("cache");
    std::fs::create_dir_all(&roots_cache).unwrap();
    chmod(&roots, 0o700);
    chmod(&roots_cache, 0o700);
    let stale = roots_cache.join("session.tmp");
    std::fs::write(&stale, PRECIOUS).unwrap();
    let hour_ago = std::time::SystemTime::now() - Duration::from_secs(3600);
    std::fs::File::options()
        .write(true)
        .open(&stale)
        .unwrap()
        .set_modified(hour_ago)
        .unwrap();
    // The user's folder, and their link in it to root's.
    let users = base.path().join("users");
    std::fs::create_dir(&users).unwrap();
    give_tree(&users, &user);
    let link = users.join("link");
    symlink(&roots, &link).unwrap();
    lchown(&link, Some(user.uid), Some(user.gid)).unwrap();
    let cache = link.join("cache");
    let folded = base.path().join("out.folded");
    let run = run_bpfprof(
        [
            "-F",
            "199",
            "--unwind",
            "cfi",
            "--unwind-cache",
            cache.to_str().unwrap(),
            "-o",
            folded.to_str().unwrap(),
            "--",
            workload_path("hotcold").to_str().unwrap(),
            "1",
        ],
        Duration::from_secs(120),
    );
    run.assert_code(exit::OK);
    let left: Vec<String> = std::fs::read_dir(&roots_cache)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        left,
        vec!["session.tmp".to_string()],
        "root's folder got the cache's writes through the user's link"
    );
    assert_eq!(std::fs::read(&stale).unwrap(), PRECIOUS);
    // Said once, with the folder and why.
    run.assert_stderr_mentions(&[&format!("refusing {}", users.display())]);
    run.assert_stderr_mentions(&[&format!("belongs to uid {}", user.uid)]);
    assert!(std::fs::metadata(&folded).unwrap().len() > 0);
}
