//! End to end: `bpfprof top` in a detached tmux terminal of 80x24, as a user over ssh sees it:
//! the screen is read with `capture-pane` until the hot function shows (never a fixed sleep),
//! keys are sent with `send-keys`, and after the view ends the pane's shell says how bpfprof
//! exited and whether the terminal came back (no alternate screen, canonical mode and echo
//! on). Needs root and tmux (`cargo xtask setup` installs it).

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use bpfprof_tests::*;

/// How long the view may take to show enough samples on a loaded machine.
const SHOW_TIMEOUT: Duration = Duration::from_secs(90);
/// How long bpfprof may take to end and give the terminal back after a key or the command's
/// exit (a launched command gets SIGTERM and is reaped first).
const EXIT_TIMEOUT: Duration = Duration::from_secs(30);
/// Samples since the start before the shares are judged: leaf_hot's 3/4 then has a standard
/// deviation of 0.025.
const MIN_SAMPLES: u64 = 300;
/// hotcold's split: leaf_hot burns 3 units for leaf_cold's 1.
const HOT_SHARE: f64 = 0.75;
/// How far the since-start self share may be from it: three standard deviations at
/// [`MIN_SAMPLES`], with room for the samples of start-up.
const SHARE_TOLERANCE: f64 = 0.08;

/// How long the launched hotcold would run: a length of its own, so that no other test's
/// hotcold has its command line.
const LAUNCHED_SECONDS: &str = "599";

fn tmux() -> Option<PathBuf> {
    let found = find_tool("tmux");
    assert!(
        found.is_some() || !ci(),
        "tmux is needed under CI (cargo xtask setup installs it)"
    );
    if found.is_none() {
        eprintln!("skipping: no tmux");
    }
    found
}

/// A detached tmux session of 80x24 running one shell command line; killed on drop.
struct Session {
    tmux: PathBuf,
    name: String,
}

impl Session {
    fn start(tmux: &Path, tag: &str, command: &str) -> Session {
        let name = format!("bpfprof-top-{tag}-{}", std::process::id());
        crate::tmux_session(tmux, &name, 80, 24, command);
        Session {
            tmux: tmux.to_path_buf(),
            name,
        }
    }

    fn tmux(&self, args: &[&str]) -> String {
        let out = crate::tmux(&self.tmux, &self.name)
            .args(args)
            .output()
            .expect("run tmux");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The visible screen, one string per line.
    fn screen(&self) -> Vec<String> {
        self.tmux(&["capture-pane", "-p", "-t", &self.name])
            .lines()
            .map(str::to_string)
            .collect()
    }

    fn keys(&self, keys: &str) {
        self.tmux(&["send-keys", "-t", &self.name, keys]);
    }

    fn alternate_screen(&self) -> bool {
        self.tmux(&["display-message", "-p", "-t", &self.name, "#{alternate_on}"])
            .trim()
            == "1"
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        crate::tmux_kill(&self.tmux, &self.name);
    }
}

/// What the view shows: samples since the start, and its rows (self share since the start,
/// function), first row first.
fn parse_view(screen: &[String]) -> Option<(u64, Vec<(f64, String)>)> {
    let samples = screen.iter().find_map(|l| {
        let rest = l.strip_prefix("samples: ")?;
        let (_, after) = rest.split_once("), ")?;
        after.split_whitespace().next()?.parse().ok()
    })?;
    let header = screen.iter().position(|l| l.starts_with("Self "))?;
    let rows = screen[header + 1..]
        .iter()
        .filter_map(|l| {
            let fields: Vec<&str> = l.split_whitespace().collect();
            let share = fields.get(2)?.strip_suffix('%')?.parse::<f64>().ok()? / 100.0;
            Some((share, fields[4..].join(" ")))
        })
        .collect();
    Some((samples, rows))
}

/// Polls the screen until the view has [`MIN_SAMPLES`] since the start; returns them with
/// the rows.
fn wait_for_samples(session: &Session) -> (u64, Vec<(f64, String)>) {
    poll_until(SHOW_TIMEOUT, || {
        parse_view(&session.screen()).filter(|(samples, _)| *samples >= MIN_SAMPLES)
    })
    .unwrap_or_else(|| {
        panic!(
            "the view did not reach {MIN_SAMPLES} samples:\n{}",
            session.screen().join("\n")
        )
    })
}

/// The file the pane's shell writes after bpfprof: its exit code, then `stty -a`.
fn wait_for_exit(session: &Session, after: &Path) -> (i32, String) {
    let text = poll_until(EXIT_TIMEOUT, || {
        std::fs::read_to_string(after)
            .ok()
            .filter(|t| t.contains("speed"))
    })
    .unwrap_or_else(|| {
        panic!(
            "bpfprof top did not end; the screen:\n{}",
            session.screen().join("\n")
        )
    });
    let (code, stty) = text.split_once('\n').expect("code and stty");
    (code.trim().parse().expect("exit code"), stty.to_string())
}

/// The shell command line a session runs: bpfprof top with `args`, then what it left.
fn command_line(args: &str, after: &Path) -> String {
    format!(
        "{} top {args}; echo $? > {after}.tmp; stty -a >> {after}.tmp; mv {after}.tmp {after}; sleep 600",
        bpfprof_bin().display(),
        after = after.display()
    )
}

/// The terminal is as a shell left it: no alternate screen, canonical input and echo.
fn assert_restored(session: &Session, stty: &str) {
    assert!(
        !session.alternate_screen(),
        "the alternate screen was left on"
    );
    let flags: Vec<&str> = stty
        .split(|c: char| c.is_whitespace() || c == ';')
        .collect();
    for flag in ["icanon", "echo", "isig"] {
        assert!(
            flags.contains(&flag),
            "the terminal was left without {flag}: {stty}"
        );
    }
}

/// `bpfprof top -- hotcold`: leaf_hot leads the view with its 3/4 since the start and
/// leaf_cold follows; `i` and `p` keep leaf_hot first (since-start sort; the Python view of a
/// native program is the program); `q` ends it with 0 and the terminal restored, and the
/// command it launched is gone.
#[test]
fn top_leads_with_the_hot_function_and_quits_on_q() {
    needs_root!();
    let Some(tmux) = tmux() else {
        return;
    };
    let dir = tempdir();
    let after = dir.path().join("after");
    let hotcold = workload_path("hotcold");
    let session = Session::start(
        &tmux,
        "q",
        &command_line(
            &format!("-- {} {LAUNCHED_SECONDS}", hotcold.display()),
            &after,
        ),
    );
    let (samples, rows) = wait_for_samples(&session);
    let screen = session.screen().join("\n");
    assert!(
        rows.len() >= 2 && rows[0].1 == "leaf_hot" && rows[1].1 == "leaf_cold",
        "leaf_hot then leaf_cold should lead:\n{screen}"
    );
    assert!(
        (rows[0].0 - HOT_SHARE).abs() <= SHARE_TOLERANCE,
        "leaf_hot's self share since the start is {} of {samples} samples, not {HOT_SHARE} \
         ± {SHARE_TOLERANCE}:\n{screen}",
        rows[0].0
    );
    assert!(
        session.screen().iter().all(|l| l.chars().count() <= 80),
        "the view is wider than 80 columns"
    );
    // The header: the event at the default rate, the samples' rate and the losses.
    assert!(
        screen.contains(" 99 Hz") && screen.contains("/s), ") && screen.contains("; lost "),
        "the header lacks the rate or the losses:\n{screen}"
    );
    session.keys("i");
    session.keys("p");
    let shown = poll_until(EXIT_TIMEOUT, || {
        let screen = session.screen();
        let header = screen.join("\n");
        (header.contains("(since start)") && header.contains("[Python view]"))
            .then(|| parse_view(&screen))
            .flatten()
    })
    .unwrap_or_else(|| {
        panic!(
            "the keys i and p changed nothing:\n{}",
            session.screen().join("\n")
        )
    });
    assert_eq!(shown.1.first().map(|r| r.1.as_str()), Some("leaf_hot"));
    session.keys("q");
    let (code, stty) = wait_for_exit(&session, &after);
    assert_eq!(code, 0, "bpfprof top exited {code} on q");
    assert_restored(&session, &stty);
    let running = all_pids().into_iter().any(|pid| {
        std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
            .is_ok_and(|c| c == format!("{}\0{LAUNCHED_SECONDS}\0", hotcold.display()))
    });
    assert!(!running, "the launched hotcold is still running after q");
}

/// `bpfprof top --pid` on a running hotcold ends on Ctrl-C with 0 and the terminal restored;
/// the target keeps running. Then `bpfprof top -- hotcold 2` ends by itself when the command
/// exits, with its status, the terminal restored.
#[test]
fn top_ends_on_ctrl_c_and_when_the_command_exits() {
    needs_root!();
    let Some(tmux) = tmux() else {
        return;
    };
    let dir = tempdir();
    let target = Workload::spawn("hotcold", &["600"]);
    let after = dir.path().join("after-pid");
    let session = Session::start(
        &tmux,
        "pid",
        &command_line(&format!("--pid {}", target.pid()), &after),
    );
    let (_, rows) = wait_for_samples(&session);
    assert_eq!(
        rows.first().map(|r| r.1.as_str()),
        Some("leaf_hot"),
        "{}",
        session.screen().join("\n")
    );
    session.keys("C-c");
    let (code, stty) = wait_for_exit(&session, &after);
    assert_eq!(code, 0, "bpfprof top exited {code} on Ctrl-C");
    assert_restored(&session, &stty);
    assert!(target.status().is_none(), "the target was stopped");
    drop(target);

    let after = dir.path().join("after-exit");
    let hotcold = workload_path("hotcold");
    let session = Session::start(
        &tmux,
        "exit",
        &command_line(&format!("-- {} 2", hotcold.display()), &after),
    );
    let (code, stty) = wait_for_exit(&session, &after);
    assert_eq!(
        code, 0,
        "bpfprof top exited {code} when the command exited 0"
    );
    assert_restored(&session, &stty);
    let screen = session.screen().join("\n");
    assert!(
        screen.contains("bpfprof top: the command ended (exit status: 0)"),
        "no word of the command's exit on the restored screen:\n{screen}"
    );
}

/// The self share since the start of `function` among `rows`, 0 when it has no row.
fn self_share(rows: &[(f64, String)], function: &str) -> f64 {
    rows.iter()
        .find(|(_, f)| f == function)
        .map_or(0.0, |(share, _)| *share)
}

/// `bpfprof top --python-view -- python3.12 pyview.py`: Python functions in the live view.
/// In the Python view the hot function, which spends its time in the interpreter's own C
/// code (allocating and freeing objects), leads with its samples; `p` switches to the native
/// view, where those samples belong to the interpreter's functions and the hot function's own
/// share is less than half of what it was.
#[test]
fn top_shows_python_functions_and_switches_the_python_view() {
    needs_root!();
    let Some(tmux) = tmux() else {
        return;
    };
    let pyenv = PathBuf::from(std::env::var("HOME").unwrap_or("/root".into()))
        .join(".pyenv/versions/3.12.1/bin/python3");
    if !pyenv.exists() {
        assert!(!ci(), "pyenv's CPython 3.12.1 is needed under CI");
        eprintln!("skipping: no {}", pyenv.display());
        return;
    }
    let dir = tempdir();
    let after = dir.path().join("after");
    let script = workspace_root().join("tests/workloads/pyview.py");
    let session = Session::start(
        &tmux,
        "py",
        &command_line(
            &format!(
                "--python-view -- {} {} 600",
                pyenv.display(),
                script.display()
            ),
            &after,
        ),
    );
    let (samples, rows) = wait_for_samples(&session);
    let screen = session.screen().join("\n");
    assert!(screen.contains("[Python view]"), "{screen}");
    assert_eq!(
        rows.first().map(|r| r.1.as_str()),
        Some("alloc_hot"),
        "alloc_hot should lead the Python view after {samples} samples:\n{screen}"
    );
    let in_view = self_share(&rows, "alloc_hot");
    session.keys("p");
    let native = poll_until(EXIT_TIMEOUT, || {
        let screen = session.screen();
        (!screen.join("\n").contains("[Python view]"))
            .then(|| parse_view(&screen))
            .flatten()
    })
    .unwrap_or_else(|| {
        panic!(
            "p did not switch the view:\n{}",
            session.screen().join("\n")
        )
    });
    let native_share = self_share(&native.1, "alloc_hot");
    assert!(
        native_share < in_view / 2.0,
        "without the Python view alloc_hot's own share should be a fraction of its {in_view} \
         (its samples end in the interpreter's code); it is {native_share}:\n{}",
        session.screen().join("\n")
    );
    session.keys("q");
    let (code, stty) = wait_for_exit(&session, &after);
    assert_eq!(code, 0, "bpfprof top exited {code} on q");
    assert_restored(&session, &stty);
}
