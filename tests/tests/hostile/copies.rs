//! End to end (issue 41): what an ordinary user controls cannot take the root agent's memory
//! through the sealed copies of their files, cannot write to root's terminal through the
//! names bpfprof prints, and cannot pass a tag for one of the labels bpfprof sets itself.
//! Run by a real non-root user against a real root agent and daemon. Needs root.

use std::{
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::{Child, Stdio},
    time::{Duration, Instant},
};

use bpfprof_tests::{
    agent::{free_port, metrics, start_agent},
    hostile::{cli, compile, run_id_of, shared_dir, start_as},
    *,
};

/// Processes of the attack, each executing its own copy of the program.
const OBJECTS: usize = 8;
/// Each copy's size: a sparse hole after the program makes it this large (on disk, a few KB).
const OBJECT_BYTES: u64 = 120 << 20;
/// The agent's default copy budget (`--copy-budget-mib`).
const BUDGET_BYTES: f64 = (128u64 << 20) as f64;
/// The shipped unit's `MemoryMax`.
const MEMORY_MAX: u64 = 512 << 20;
/// What the agent may take at its peak under the attack, copies included.
const PEAK_BOUND: u64 = 300 << 20;

/// A program that burns the CPU in its own code until killed.
const SPINNER: &str = r#"
volatile unsigned long sink;
__attribute__((noinline)) void burn_in_copy(void) {
    for (;;) {
        for (unsigned long i = 0; i < 1000000; i++) sink += i;
    }
}
int main(void) { burn_in_copy(); }
"#;

/// Children killed when the test ends, however it ends.
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A memory cgroup of the test's own with a `memory.max`: cgroup v2 where its memory
/// controller is, else v1's (a hybrid machine); removed on drop.
struct MemoryCgroup {
    path: PathBuf,
    v2: bool,
}

impl MemoryCgroup {
    fn new(name: &str, max: u64) -> MemoryCgroup {
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
        let mount = |kind: &str, option: Option<&str>| {
            mounts.lines().find_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.get(2) == Some(&kind)
                    && option.is_none_or(|o| {
                        f.get(3).is_some_and(|opts| opts.split(',').any(|x| x == o))
                    }))
                .then(|| PathBuf::from(f[1]))
            })
        };
        let v2_root = mount("cgroup2", None).filter(|root| {
            std::fs::read_to_string(root.join("cgroup.controllers"))
                .is_ok_and(|c| c.split_whitespace().any(|x| x == "memory"))
        });
        let (path, v2) = match v2_root {
            Some(root) => {
                let _ = std::fs::write(root.join("cgroup.subtree_control"), "+memory");
                (root.join(name), true)
            }
            None => (
                mount("cgroup", Some("memory"))
                    .expect("a memory cgroup controller")
                    .join(name),
                false,
            ),
        };
        std::fs::create_dir_all(&path).unwrap();
        let limit = if v2 {
            "memory.max"
        } else {
            "memory.limit_in_bytes"
        };
        std::fs::write(path.join(limit), max.to_string()).unwrap();
        MemoryCgroup { path, v2 }
    }

    fn add(&self, pid: u32) {
        std::fs::write(self.path.join("cgroup.procs"), pid.to_string()).unwrap();
    }

    fn read(&self, v2: &str, v1: &str) -> u64 {
        let file = if self.v2 { v2 } else { v1 };
        std::fs::read_to_string(self.path.join(file))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }

    /// The most memory its processes took since they joined.
    fn peak(&self) -> u64 {
        self.read("memory.peak", "memory.max_usage_in_bytes")
    }

    fn current(&self) -> u64 {
        self.read("memory.current", "memory.usage_in_bytes")
    }

    /// Times the kernel killed one of its processes for memory.
    fn oom_kills(&self) -> u64 {
        let file = if self.v2 {
            "memory.events"
        } else {
            "memory.oom_control"
        };
        std::fs::read_to_string(self.path.join(file))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        bpfprof_tests::agent::remove_cgroup(&self.path);
    }
}

/// Whether `pid` still runs (not gone, not a zombie).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit(')')
            .next()
            .is_some_and(|rest| !rest.trim_start().starts_with('Z'))
    })
}

/// Eight processes of an ordinary user, each executing its own 120 MiB sparse copy of a
/// program (a few KB on disk), which bpfprof copies to read safely (its user could truncate
/// it): the agent held a copy of each, about 960 MB outside its RSS, and was OOM-killed under
/// the unit's `MemoryMax=512M`. Inside a cgroup with that limit it must live, peak under
/// 300 MB with its copies, show the copies within its budget in `/metrics`, and name each
/// object past the budget with the reason, once.
#[test]
fn sparse_objects_cannot_make_the_agent_copy_past_its_budget() {
    needs_root!();
    let user = test_user("bpfprof-t1");
    let dir = shared_dir();
    let program = compile(dir.path(), "spinner", "c", SPINNER, &["-O1"]);
    let port = free_port();
    let agent = start_agent(port, &["-F", "99", "--window", "2s"], 1.0);
    let cgroup = MemoryCgroup::new(
        &format!("bpfprof-test-copies-{}", std::process::id()),
        MEMORY_MAX,
    );
    cgroup.add(agent.pid());

    let mut children = Children(Vec::new());
    for i in 0..OBJECTS {
        let object = dir.path().join(format!("sparse-object-{i}"));
        user.give(&program, &object);
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&object)
            .unwrap();
        file.set_len(OBJECT_BYTES).unwrap();
        drop(file);
        std::fs::set_permissions(&object, std::fs::Permissions::from_mode(0o755)).unwrap();
        children.0.push(
            user.command(&object)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
    }

    // Windows are cut (and the objects named) every 2 s: 20 s of them.
    let until = Instant::now() + Duration::from_secs(20);
    let mut copies = Vec::new();
    while Instant::now() < until && alive(agent.pid()) {
        std::thread::sleep(Duration::from_secs(1));
        if let Ok(m) = std::panic::catch_unwind(|| metrics(port)) {
            copies.push(m.get("bpfprof_agent_target_copy_bytes").copied());
        }
    }
    let survived = alive(agent.pid());
    let (peak, current, kills) = (cgroup.peak(), cgroup.current(), cgroup.oom_kills());
    let stderr = agent.stderr_so_far();
    eprintln!(
        "agent alive {survived}; cgroup peak {} MiB, now {} MiB, OOM kills {kills}; copy gauge \
         {copies:?}",
        peak >> 20,
        current >> 20
    );
    assert!(survived && kills == 0, "the agent was killed:\n{stderr}");
    assert!(
        peak < PEAK_BOUND,
        "the agent took {} MiB at its peak (bound {} MiB)",
        peak >> 20,
        PEAK_BOUND >> 20
    );
    assert!(!copies.is_empty(), "no /metrics answered");
    for c in &copies {
        let c = c.expect("/metrics shows the copies' bytes");
        assert!(c <= BUDGET_BYTES, "copies of {c} bytes, past the budget");
    }
    // Each object past the budget is named with the reason, once.
    let mut refused = 0;
    for i in 0..OBJECTS {
        let said = stderr
            .lines()
            .filter(|l| {
                l.contains(&format!("sparse-object-{i} ")) && l.contains("copy budget exhausted")
            })
            .count();
        assert!(
            said <= 1,
            "sparse-object-{i} refused {said} times:\n{stderr}"
        );
        refused += said;
    }
    // One object's copy fits in the budget; every other sampled one is refused.
    assert!(
        refused >= OBJECTS - 3,
        "{refused} objects refused:\n{stderr}"
    );
    let m = metrics(port);
    assert!(
        m["bpfprof_agent_cap_hits_total{cap=copy_budget}"] >= refused as f64,
        "{m:?}"
    );
}

/// The program that names itself and its second thread with terminal escapes (an OSC title,
/// a CR, a clear-screen), then burns the CPU.
const ESCAPING: &str = r#"
#define _GNU_SOURCE
#include <pthread.h>
#include <sys/prctl.h>
volatile unsigned long sink;
static void *spin(void *arg) {
    (void)arg;
    pthread_setname_np(pthread_self(), "\x1b[2J\rthr");
    for (;;) sink++;
    return 0;
}
int main(void) {
    prctl(PR_SET_NAME, "\x1b]0;pwn\x07\rX", 0, 0, 0);
    pthread_t t;
    pthread_create(&t, 0, spin, 0);
    for (;;) sink++;
}
"#;

/// The bpfprof binary, where the test user may run it.
fn user_bin(dir: &Path) -> PathBuf {
    let bin = dir.join("bpfprof");
    std::fs::copy(bpfprof_bin(), &bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    bin
}

/// A process and thread named with terminal escapes: `list` (a user's, and root's) and root's
/// `dump` print them escaped, never raw; a tag holding an escape is refused.
#[test]
fn names_with_terminal_escapes_are_printed_escaped() {
    needs_root!();
    let user = test_user("bpfprof-t1");
    let dir = shared_dir();
    let program = compile(dir.path(), "escaping", "c", ESCAPING, &["-O1", "-pthread"]);
    let bin = user_bin(dir.path());
    let daemon = Daemon::start(&[]);
    let child = user
        .command(&program)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let _children = Children(vec![child]);
    poll_until(Duration::from_secs(10), || {
        std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .ok()
            .filter(|c| c.starts_with('\x1b'))
    })
    .expect("the program named itself");

    let started = start_as(&user, &bin, &daemon, pid, 3000, &["--tag", "phase=escape"]);
    run_id_of(&started);
    let refused = start_as(
        &user,
        &bin,
        &daemon,
        pid,
        1000,
        &["--tag", "phase=\x1b]0;x\x07"],
    );
    assert_ne!(
        refused.code(),
        0,
        "a tag with an escape was taken: {}",
        refused.stdout
    );

    for list in [cli(&user, &bin, &daemon, &["list"]), daemon.cli(&["list"])] {
        list.assert_code(0);
        assert!(
            !list.stdout.contains('\x1b')
                && !list.stdout.contains('\r')
                && !list.stdout.contains('\x07'),
            "raw control characters in list: {:?}",
            list.stdout
        );
        assert!(
            list.stdout.contains("\\x1b]0;pwn\\x07\\rX"),
            "{:?}",
            list.stdout
        );
        assert!(list.stdout.contains("phase=escape"), "{:?}", list.stdout);
    }

    let dump = run_bpfprof(["dump", "--pid", &pid.to_string()], Duration::from_secs(60));
    dump.assert_code(0);
    assert!(
        !dump.stdout.contains('\x1b') && !dump.stdout.contains('\r'),
        "raw control characters in dump: {:?}",
        dump.stdout
    );
    assert!(
        dump.stdout.contains("\\x1b]0;pwn\\x07\\rX"),
        "{:?}",
        dump.stdout
    );
    assert!(dump.stdout.contains("\\x1b[2J\\rthr"), "{:?}", dump.stdout);
}

/// Tags under the labels bpfprof sets itself (the exporter's `run_id` and `owner_uid`, the
/// agent's `pid`, `service_name`, ...) are refused by the daemon with the reason: a user's
/// `owner_uid=0` would have stood beside the real owner in every exported profile.
#[test]
fn the_daemon_refuses_reserved_tag_names() {
    needs_root!();
    let user = test_user("bpfprof-t1");
    let dir = shared_dir();
    let bin = user_bin(dir.path());
    let daemon = Daemon::start(&[]);
    let program = compile(dir.path(), "spinner", "c", SPINNER, &["-O1"]);
    let child = user
        .command(&program)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let _children = Children(vec![child]);
    for tag in ["run_id=1", "owner_uid=0", "service_name=payments", "pid=1"] {
        let refused = start_as(&user, &bin, &daemon, pid, 1000, &["--tag", tag]);
        assert_ne!(
            refused.code(),
            0,
            "--tag {tag} was taken: {}",
            refused.stdout
        );
        assert!(
            refused.stderr.contains("reserved"),
            "--tag {tag}: {}",
            refused.stderr
        );
    }
    // An ordinary tag still is taken.
    run_id_of(&start_as(
        &user,
        &bin,
        &daemon,
        pid,
        1000,
        &["--tag", "phase=ok"],
    ));
}

/// An object past the daemon's copy budget of its user is not copied: the run's summary
/// (`.summary.json`, and the results' summary) names it `Unavailable` with the reason, and
/// its frames are `module+0xOFFSET`, not its function's name.
#[test]
fn an_object_past_the_daemons_copy_budget_is_named_unavailable_in_the_runs_summary() {
    needs_root!();
    let user = test_user("bpfprof-t1");
    let dir = shared_dir();
    let program = compile(dir.path(), "spinner", "c", SPINNER, &["-O1"]);
    let object = dir.path().join("sparse-daemon-object");
    user.give(&program, &object);
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&object)
        .unwrap();
    // Under the largest object bpfprof copies at all, over the budget given below.
    file.set_len(OBJECT_BYTES).unwrap();
    drop(file);
    std::fs::set_permissions(&object, std::fs::Permissions::from_mode(0o755)).unwrap();
    let child = user
        .command(&object)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let _children = Children(vec![child]);
    let daemon = Daemon::start(&["--copy-budget-mib", "16"]);
    let bin = user_bin(dir.path());
    let id = run_id_of(&start_as(
        &user,
        &bin,
        &daemon,
        pid,
        3000,
        &["--formats", "folded"],
    ));
    let (state, profile, summary) = hostile::results_of(&daemon, id);
    let unavailable = &summary.0["objects_unavailable"];
    eprintln!(
        "run {id}: {state:?}, {} samples; objects_unavailable {unavailable}\n{}",
        profile.total(),
        profile.top(5)
    );
    assert_eq!(state, bpfprof::protocol::RunState::Success);
    assert!(profile.total() > 0, "no samples");
    let named = unavailable.as_array().is_some_and(|objects| {
        objects.iter().any(|o| {
            o["name"].as_str() == Some(&object.display().to_string())
                && o["why"]
                    .as_str()
                    .is_some_and(|w| w.contains("copy budget exhausted"))
        })
    });
    assert!(
        named,
        "the summary does not name {} unavailable: {}",
        object.display(),
        summary.0
    );
    assert!(
        !profile.has_frame("burn_in_copy"),
        "the object was read past the budget:\n{}",
        profile.top(5)
    );
    assert!(
        profile.count_where(|frames| frames
            .iter()
            .any(|f| f.starts_with("sparse-daemon-object+0x")))
            > 0,
        "its frames are not named module+0xOFFSET:\n{}",
        profile.top(5)
    );
}
