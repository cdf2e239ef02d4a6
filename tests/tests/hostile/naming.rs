//! End to end: naming one user's Python frames cannot take another user's share of the root
//! daemon (issue 23, "fair shares": CPU and memory for naming). A user's Python processes
//! decide how costly their frames are to name (how many code objects, how long their names,
//! files and line tables); the daemon reads them out of the processes' memory.
//!
//! Run by real non-root users (the attacker `bpfprof-t1`, the [`Bystander`] `bpfprof-t2`)
//! against a real root daemon, on Debian's `/usr/bin/python3.11`, which any user may run.
//! Needs root.

use std::{os::unix::fs::PermissionsExt, time::Duration};

use bpfprof_tests::{
    hostile::{results_of, run_id_of, shared_dir, start_as, Bystander},
    *,
};

/// The interpreter the attacker runs: Debian's, readable and executable by every user.
const PYTHON: &str = "/usr/bin/python3.11";

/// How long the attacker's run samples: long enough for every one of its processes to spend
/// whatever naming may cost it many times over.
const ATTACK_MS: u64 = 12_000;

/// Processes the attacker's program forks (the run follows them): each a CPython process of
/// its own, with frames to name.
const ATTACK_CHILDREN: usize = 5;

/// Seconds the attacker's program waits before it forks, so that its run is sampling (and
/// follows the children) by then.
const FORK_DELAY_S: u64 = 3;

/// Characters in each of the attacker's function and file names (4 bytes each in its memory,
/// so a name costs 4 KiB to read and to keep).
const NAME_CHARS: usize = 1000;

/// The character the attacker's names are made of (see `pynaming.py`).
const WIDE: char = '\u{20000}';

/// The attacker's process makes every sampled Python frame a code object never named before,
/// with 4 KiB names and files, and forks five more such processes into its run: naming them
/// all as fast as they are sampled, each process up to what it may cost alone, took the
/// daemon's memory past its bound and its CPU away from the bystander. The bystander must lose
/// nothing; the attacker's own profile names what it could and says how many frames it left
/// unnamed.
#[test]
fn one_users_costly_python_naming_does_not_take_another_users_share() {
    needs_root!();
    let daemon = Daemon::start(&[]);
    let bystander = Bystander::start(&daemon, Duration::from_millis(ATTACK_MS + 4000));
    let attacker = test_user("bpfprof-t1");
    let dir = shared_dir();
    let script = dir.path().join("pynaming.py");
    std::fs::copy(
        workspace_root().join("tests/workloads/pynaming.py"),
        &script,
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut cmd = attacker.command(PYTHON);
    cmd.arg(&script).args([
        ATTACK_CHILDREN.to_string(),
        ((ATTACK_MS / 1000) + FORK_DELAY_S + 10).to_string(),
        FORK_DELAY_S.to_string(),
        NAME_CHARS.to_string(),
    ]);
    let attack = Workload::spawn_command(cmd);
    let started = start_as(
        &attacker,
        &bystander.bin,
        &daemon,
        attack.pid(),
        ATTACK_MS,
        &["--follow-children", "--formats", "folded"],
    );
    let attack_run = run_id_of(&started);
    let (attack_state, profile, summary) = results_of(&daemon, attack_run);
    let report = bystander.finish();

    let mut c = Checks::new();
    c.eq(
        "the attacker's run",
        attack_state,
        bpfprof::protocol::RunState::Success,
    );
    let wide: String = std::iter::repeat_n(WIDE, 8).collect();
    let named = profile.count_where(|frames| frames.iter().any(|f| f.contains(&wide)));
    let processes = profile.by_root().len();
    let limits: Vec<String> = summary
        .field("limits_hit")
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|l| l.as_str().map(str::to_string))
        .collect();
    eprintln!(
        "attacker: {} samples in {processes} processes, {named} with a named frame; cost {}; \
         limits: {limits:?}; bystander: {report:?}",
        profile.total(),
        summary.field("cost"),
    );
    c.check(processes > ATTACK_CHILDREN, || {
        format!("the attacker's run took in {processes} processes")
    });
    c.check(named > 0, || {
        format!(
            "none of the attacker's samples has a named Python frame:\n{}",
            short(&profile)
        )
    });
    c.check(limits.iter().any(|l| l.contains("unnamed")), || {
        format!("the attacker's summary does not say what was left unnamed: {limits:?}")
    });
    c.finish();
}

/// The profile's top stacks with the attacker's long names cut, for messages.
fn short(profile: &Profile) -> String {
    profile
        .top(10)
        .lines()
        .map(|l| l.chars().take(400).collect::<String>())
        .collect::<Vec<_>>()
        .join("\n")
}
