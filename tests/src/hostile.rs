//! What every hostile-target test asserts throughout its attack (issue 23): a second, honest
//! non-root user works beside the attacker and must lose nothing.
//!
//! A [`Bystander`] is started before the attack and [`Bystander::finish`]ed after it. Meanwhile
//! it
//! * polls `list` on the daemon's socket continuously from an unprivileged Python client run
//!   as the bystander user, timing each answer;
//! * has a daemon run of its own on its own `hotcold` workload (started before the attack, so
//!   that the attack hits it in flight);
//! * samples the daemon's resident memory (`VmRSS`) and whether it is alive.
//!
//! `finish` then asserts: the daemon is still up, every `list` answered within
//! [`LIST_ANSWER_BOUND`] (or while the machine itself stalled as long, see [`CONTROL`]), the
//! daemon's RSS stayed under [`DAEMON_RSS_BOUND`], and the
//! bystander's run ended SUCCESS with whole stacks (`main` in nearly every stack).

use std::{
    ffi::OsStr,
    io::{BufRead, BufReader},
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread::{self, JoinHandle},
    time::Duration,
};

use crate::{
    copy_executable, poll_until, spawn_bpfprof_command, tempdir, test_user, workload_path,
    world_executable_bpfprof, Daemon, Profile, RunResult, Summary, TestUser, Workload,
    DAEMON_TIMEOUT,
};

/// The issue's bound on another user's `list` answer during an attack: about blocking (a
/// request waiting on the attacker's work), not speed.
pub const LIST_ANSWER_BOUND: Duration = Duration::from_millis(100);

/// The longest a `list` answer may take whatever the machine did meanwhile: past the
/// [`LIST_ANSWER_BOUND`], an answer must also be explained by a stall of the machine that the
/// control process saw (see [`CONTROL`]).
pub const LIST_ANSWER_HARD_BOUND: Duration = Duration::from_secs(2);

/// The issue's bound on the daemon's resident memory during an attack.
pub const DAEMON_RSS_BOUND: u64 = 200 << 20;

/// Share of the bystander's stacks that must reach `main`: its workload is `hotcold`, whose
/// every sample is under `main` (a few samples in the loader or at exit may not be).
const WHOLE_STACK_SHARE: f64 = 0.9;

/// How often the daemon's memory and liveness are sampled.
const SAMPLE_EVERY: Duration = Duration::from_millis(20);

/// The bystander's unprivileged client: one connection, `list` as fast as answers come (a 5 ms
/// pause between), each round trip printed after the time it was sent (CLOCK_MONOTONIC),
/// until its stdin closes. An answer that does not
/// come within 30 s (a frozen daemon) is printed as a timeout; a closed socket (a dead daemon)
/// as `closed`.
const CLIENT: &str = r#"
import json, select, socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.settimeout(30)
f = s.makefile("rwb", buffering=0)
while not select.select([sys.stdin], [], [], 0)[0]:
    sent = time.monotonic()
    try:
        f.write(b'{"version": 1, "op": "list"}\n')
        line = f.readline()
    except OSError:
        print("%.6f %.6f timeout" % (sent, time.monotonic() - sent), flush=True)
        break
    took = time.monotonic() - sent
    if not line:
        print("%.6f 0 closed" % sent, flush=True)
        break
    ok = json.loads(line).get("ok")
    print("%.6f %.6f %s" % (sent, took, "ok" if ok else line.decode().strip()), flush=True)
    time.sleep(0.005)
"#;

/// The bystander's control: a process as favoured as the client that only sleeps 2 ms at a
/// time, printing each wake-up that came over 20 ms late (`START LATE`, CLOCK_MONOTONIC), until
/// its stdin closes. A `list` answer over [`LIST_ANSWER_BOUND`] is the daemon's fault unless
/// the control was held up as long at the same time. In a CI run, with the other test thread
/// keeping both CPUs busy, one answer of thousands took 168 ms; the daemon answers `list` from
/// its table, whose lock no slow work holds. A daemon blocked on a lock or on a run's work
/// does not hold the control up.
const CONTROL: &str = r#"
import select, sys, time
while not select.select([sys.stdin], [], [], 0)[0]:
    start = time.monotonic()
    time.sleep(0.002)
    late = time.monotonic() - start - 0.002
    if late > 0.02:
        print("%.6f %.6f" % (start, late), flush=True)
"#;

/// Starts `script` in Python as `user`, favoured as [`favor`] does (under `nice` as root,
/// before setpriv drops to the user), with `args`; returns it and its stdout's lines, read
/// until it exits.
pub fn spawn_favored_python(
    user: &TestUser,
    script: &str,
    args: &[&OsStr],
) -> (Child, JoinHandle<Vec<String>>) {
    let mut cmd = Command::new("nice");
    cmd.args(["-n", "-10", "setpriv"])
        .arg(format!("--reuid={}", user.uid))
        .arg(format!("--regid={}", user.gid))
        .args(["--clear-groups", "--", "/usr/bin/python3", "-c", script])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut child = cmd.spawn().expect("starting a bystander's Python");
    let out = child.stdout.take().unwrap();
    let lines = thread::spawn(move || {
        BufReader::new(out)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<String>>()
    });
    (child, lines)
}

/// Makes every thread of process `pid` 10 nicer-values more favoured (threads it starts
/// later inherit the process's), keeping the process's own differences between its threads
/// (its table builds run nicer than the threads that answer clients). The bound on answers is
/// about blocking: on a machine that other builds keep busy, the daemon's and the client's
/// wake-ups must not wait for the CPU behind them. Nice changes no lock's behaviour.
pub fn favor(pid: u32) {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return;
    };
    for task in tasks.flatten() {
        if let Ok(tid) = task.file_name().to_string_lossy().parse::<libc::id_t>() {
            // The 19th field of /proc/PID/task/TID/stat (after the name's closing paren) is
            // the thread's nice value.
            let nice = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat"))
                .ok()
                .and_then(|stat| {
                    let rest = stat.rsplit_once(')')?.1.to_string();
                    rest.split_whitespace().nth(16)?.parse::<i32>().ok()
                })
                .unwrap_or(0);
            // SAFETY: plain syscall; a thread that ended meanwhile makes it fail harmlessly.
            unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, nice - 10) };
        }
    }
}

/// Resident memory of `pid` in bytes, or None once it is gone or a zombie (dead).
fn rss_of(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_string())
    };
    if field("State:")?.starts_with('Z') {
        return None;
    }
    let kb: u64 = field("VmRSS:")?
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb << 10)
}

/// Major page faults of `pid` so far (field 12 of `/proc/PID/stat`): a daemon whose code
/// was evicted by other work on the machine waits for the disk, which is no lock's doing.
fn major_faults(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let rest = stat[stat.rfind(')')? + 2..].to_string();
            rest.split_whitespace().nth(9)?.parse().ok()
        })
        .unwrap_or(0)
}

/// What the daemon's sampler saw.
#[derive(Debug, Default, Clone, Copy)]
struct Sampled {
    max_rss: u64,
    died: bool,
}

/// Another honest user working beside an attack; see the module's documentation.
pub struct Bystander {
    /// The bystander user (`bpfprof-t2`).
    pub user: TestUser,
    bin_dir: tempfile::TempDir,
    /// A copy of bpfprof the bystander (and an attacker) can run.
    pub bin: PathBuf,
    socket: PathBuf,
    daemon_pid: u32,
    /// Killed on drop.
    _workload: Workload,
    run_id: String,
    client: Child,
    client_lines: JoinHandle<Vec<String>>,
    control: Child,
    control_lines: JoinHandle<Vec<String>>,
    faults_at_start: u64,
    sampler: JoinHandle<Sampled>,
    stop: Arc<AtomicBool>,
}

/// The numbers a [`Bystander`] measured, for the test's log.
#[derive(Debug, Clone)]
pub struct BystanderReport {
    /// `list` answers received.
    pub answers: usize,
    /// The slowest `list` answer.
    pub slowest_list: Duration,
    /// `list` answers over [`LIST_ANSWER_BOUND`], each while the machine stalled as long.
    pub over_bound_in_stalls: usize,
    /// The control's wake-ups over 20 ms late.
    pub machine_stalls: usize,
    /// The daemon's largest resident memory seen, in bytes.
    pub max_rss: u64,
    /// Samples in the bystander's own run.
    pub samples: u64,
    /// Share of those samples whose stack reaches `main`.
    pub whole_share: f64,
    /// The daemon's major page faults while watched.
    pub major_faults: u64,
}

impl Bystander {
    /// Starts the bystander against `daemon`: its workload, its run of `run_for` (covering the
    /// attack: start the attack right after), its `list` poller and the daemon's sampler.
    pub fn start(daemon: &Daemon, run_for: Duration) -> Bystander {
        let user = test_user("bpfprof-t2");
        let (bin_dir, bin) = world_executable_bpfprof();
        let hotcold = bin_dir.path().join("hotcold");
        copy_executable(&workload_path("hotcold"), &hotcold, &["0.001"]);
        let mut cmd = user.command(&hotcold);
        cmd.arg("600");
        let workload = Workload::spawn_command(cmd);
        favor(daemon.pid());

        let run_id = {
            let result = cli(
                &user,
                &bin,
                daemon,
                &[
                    "run",
                    "--async",
                    "--pid",
                    &workload.pid().to_string(),
                    "-F",
                    "499",
                    "--duration-ms",
                    &run_for.as_millis().to_string(),
                ],
            );
            result.assert_code(0);
            result
                .stdout
                .trim()
                .trim_start_matches("Run Id: ")
                .to_string()
        };

        let (control, control_lines) = spawn_favored_python(&user, CONTROL, &[]);
        let socket = daemon.socket();
        let (client, client_lines) = spawn_favored_python(&user, CLIENT, &[socket.as_os_str()]);

        let stop = Arc::new(AtomicBool::new(false));
        let daemon_pid = daemon.pid();
        let stop_sampler = Arc::clone(&stop);
        let sampler = thread::spawn(move || {
            let mut seen = Sampled::default();
            while !stop_sampler.load(Ordering::Relaxed) {
                match rss_of(daemon_pid) {
                    Some(rss) => seen.max_rss = seen.max_rss.max(rss),
                    None => {
                        seen.died = true;
                        break;
                    }
                }
                // New daemon threads (a run's) inherit the favour; this catches any other.
                favor(daemon_pid);
                thread::sleep(SAMPLE_EVERY);
            }
            seen
        });

        Bystander {
            user,
            bin_dir,
            bin,
            socket: daemon.socket(),
            daemon_pid,
            _workload: workload,
            run_id,
            client,
            client_lines,
            control,
            control_lines,
            faults_at_start: major_faults(daemon_pid),
            sampler,
            stop,
        }
    }

    /// The folder of the bystander's copies of bpfprof and its workload: any user can execute
    /// from it.
    pub fn bin_dir(&self) -> &Path {
        self.bin_dir.path()
    }

    /// Stops watching and asserts that the bystander lost nothing (see the module's
    /// documentation); returns what it measured.
    #[track_caller]
    pub fn finish(mut self) -> BystanderReport {
        // The run's results first (the poller and sampler keep watching while they are made).
        let results = {
            let mut cmd = self.user.command(&self.bin);
            cmd.args([
                "results",
                "--run-id",
                &self.run_id,
                "--wait",
                "120s",
                "--json",
            ])
            .args(["--socket", &self.socket.display().to_string()]);
            spawn_bpfprof_command(cmd).wait_timeout(Duration::from_secs(180))
        };
        drop(self.client.stdin.take());
        let _ = self.client.wait();
        let lines = std::mem::replace(&mut self.client_lines, thread::spawn(Vec::new))
            .join()
            .unwrap();
        drop(self.control.stdin.take());
        let _ = self.control.wait();
        // (start, late) of each of the control's late wake-ups.
        let stalls: Vec<(f64, f64)> =
            std::mem::replace(&mut self.control_lines, thread::spawn(Vec::new))
                .join()
                .unwrap()
                .iter()
                .filter_map(|l| {
                    let (start, late) = l.split_once(' ')?;
                    Some((start.parse().ok()?, late.parse().ok()?))
                })
                .collect();
        self.stop.store(true, Ordering::Relaxed);
        let sampled = std::mem::replace(&mut self.sampler, thread::spawn(Sampled::default))
            .join()
            .unwrap();

        let alive = !sampled.died && rss_of(self.daemon_pid).is_some();
        assert!(alive, "the daemon died during the attack");
        // (sent, took) of each answer.
        let mut answers: Vec<(f64, f64)> = Vec::new();
        for line in &lines {
            let fields: Vec<&str> = line.splitn(3, ' ').collect();
            let number = |i: usize| -> f64 {
                fields
                    .get(i)
                    .and_then(|t| t.parse().ok())
                    .unwrap_or_else(|| panic!("the bystander's list: {line}"))
            };
            assert_eq!(
                fields.get(2).copied(),
                Some("ok"),
                "the bystander's list got {line}"
            );
            answers.push((number(0), number(1)));
        }
        assert!(answers.len() > 10, "the bystander's list: {lines:?}");
        let first = answers[0].0;
        let faults = major_faults(self.daemon_pid) - self.faults_at_start;
        let mut slow: Vec<(f64, f64)> = answers.clone();
        slow.sort_by(|a, b| b.1.total_cmp(&a.1));
        slow.truncate(5);
        let slowest = Duration::from_secs_f64(slow[0].1);
        let bound = LIST_ANSWER_BOUND.as_secs_f64();
        // An answer over the bound by X is the machine's doing if the control's wake-up was X
        // late or more while the answer was awaited.
        let explained = |&(sent, took): &(f64, f64)| {
            stalls.iter().any(|&(start, late)| {
                let (from, to) = (start + 0.002, start + 0.002 + late);
                from < sent + took && to > sent && late >= took - bound
            })
        };
        let unexplained: Vec<&(f64, f64)> = answers
            .iter()
            .filter(|a| a.1 >= bound && !explained(a))
            .collect();
        assert!(
            unexplained.is_empty() && slowest < LIST_ANSWER_HARD_BOUND,
            "the bystander's list waited {slowest:?} (bound {LIST_ANSWER_BOUND:?}, unless the \
             machine stalled as long, and {LIST_ANSWER_HARD_BOUND:?}); over the bound with no \
             such stall (s after the first, s): {:?}; the slowest: {:?}; the control's stalls \
             (s after the first, s): {:?}; the daemon's major faults meanwhile: {faults}",
            unexplained
                .iter()
                .map(|(sent, took)| (sent - first, *took))
                .collect::<Vec<_>>(),
            slow.iter()
                .map(|(sent, took)| (sent - first, *took))
                .collect::<Vec<_>>(),
            stalls
                .iter()
                .map(|(start, late)| (start - first, *late))
                .collect::<Vec<_>>()
        );
        assert!(
            sampled.max_rss < DAEMON_RSS_BOUND,
            "the daemon's RSS reached {} MiB",
            sampled.max_rss >> 20
        );

        results.assert_code(0);
        let reply: serde_json::Value = serde_json::from_str(&results.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", results.stdout));
        assert_eq!(reply["state"], "SUCCESS", "the bystander's run: {reply:#}");
        let folded = reply["files"]["folded"].as_str().expect("a folded file");
        let profile = Profile::read(Path::new(folded));
        let whole_share = profile.share_containing("main");
        assert!(
            profile.total() >= 50 && whole_share >= WHOLE_STACK_SHARE,
            "the bystander's stacks are not whole ({whole_share:.2} reach main):\n{}",
            profile.top(10)
        );
        let report = BystanderReport {
            answers: answers.len(),
            slowest_list: slowest,
            over_bound_in_stalls: answers.iter().filter(|a| a.1 >= bound).count(),
            machine_stalls: stalls.len(),
            max_rss: sampled.max_rss,
            samples: profile.total(),
            whole_share,
            major_faults: faults,
        };
        eprintln!("bystander: {report:?}");
        report
    }
}

impl Drop for Bystander {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.client.kill();
        let _ = self.client.wait();
        let _ = self.control.kill();
        let _ = self.control.wait();
    }
}

/// The CLI as `user` against `daemon`, waited for up to the daemons' test timeout.
pub fn cli(user: &TestUser, bin: &Path, daemon: &Daemon, args: &[&str]) -> crate::RunResult {
    let mut cmd = user.command(bin);
    cmd.args(args)
        .args(["--socket", &daemon.socket().display().to_string()]);
    spawn_bpfprof_command(cmd).wait_timeout(DAEMON_TIMEOUT)
}

/// Waits until process `pid`'s memory map names `needle` (a file it maps).
pub fn wait_for_mapping(pid: u32, needle: &str) {
    poll_until(Duration::from_secs(30), || {
        std::fs::read_to_string(format!("/proc/{pid}/maps"))
            .ok()
            .filter(|maps| maps.contains(needle))
            .map(|_| ())
    })
    .unwrap_or_else(|| panic!("pid {pid} never mapped {needle}"));
}

/// A folder every user can enter, for the programs the test users run.
pub fn shared_dir() -> tempfile::TempDir {
    let dir = tempdir();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

/// Compiles `source` (C or assembly, by `ext`) into `dir/name` with `args`, world-executable.
pub fn compile(dir: &Path, name: &str, ext: &str, source: &str, args: &[&str]) -> PathBuf {
    let src = dir.join(format!("{name}.{ext}"));
    std::fs::write(&src, source).unwrap();
    let out = dir.join(name);
    crate::output_ok(
        Command::new("gcc").args(args).arg("-o").arg(&out).arg(&src),
        &format!("gcc {name}"),
    );
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o755)).unwrap();
    out
}

/// Starts an `--async` run as `user` on `pid` at 499 Hz for `duration_ms`, with `extra`
/// arguments; the CLI's result (see [`run_id_of`]).
pub fn start_as(
    user: &TestUser,
    bin: &Path,
    daemon: &Daemon,
    pid: u32,
    duration_ms: u64,
    extra: &[&str],
) -> RunResult {
    let (pid, duration) = (pid.to_string(), duration_ms.to_string());
    cli(
        user,
        bin,
        daemon,
        &crate::async_run_args(&pid, &duration, extra),
    )
}

/// The run id an `--async` start printed.
#[track_caller]
pub fn run_id_of(result: &RunResult) -> u64 {
    result.assert_code(0);
    result
        .stdout
        .trim()
        .trim_start_matches("Run Id: ")
        .parse()
        .unwrap_or_else(|_| panic!("no run id in {:?}", result.stdout))
}

/// The state, folded stacks and summary of run `id`, read as root once it ended (the run
/// asked for the `folded` format).
pub fn results_of(daemon: &Daemon, id: u64) -> (bpfprof::protocol::RunState, Profile, Summary) {
    let reply = daemon
        .client()
        .results(id, DAEMON_TIMEOUT)
        .expect("results of the run");
    let state = reply.state.expect("a state");
    let files = reply.files.unwrap_or_default();
    let folded = files.get("folded").expect("a folded profile");
    let summary = files.get("summary-json").expect("a summary");
    (
        state,
        Profile::read(Path::new(folded)),
        Summary::read(Path::new(summary)),
    )
}

/// The folded profile a CLI's `--json` reply names.
#[track_caller]
pub fn folded_of(reply: &serde_json::Value) -> Profile {
    let path = reply["files"]["folded"]
        .as_str()
        .unwrap_or_else(|| panic!("no folded profile in {reply}"));
    Profile::read(Path::new(path))
}
