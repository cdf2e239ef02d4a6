//! CFI unwinding: stacks of code built without frame pointers (`-O2 -fomit-frame-pointer`,
//! as distributions build) reach `main` with the right callers.
//!
//! The `nofp` workload calls one hot leaf, `burn`, from two parents with 3:1 work, and can
//! recurse 100 deep before burning. With `--unwind cfi` every stack must reach `main` through
//! the right parent; with `--unwind fp` the same stacks break at the leaf (which shows the
//! checks can fail).

use std::{path::Path, time::Duration};

use bpfprof_tests::{
    exit, needs_root, run_bpfprof, tempdir, write_random_text, Checks, Daemon, Profile, Share,
    Summary, Workload,
};

/// `parent_a` burns 3 units per round, `parent_b` 1: the leaf's samples split 75% / 25%.
const PARENT_A_SHARE: f64 = 0.75;
/// Allowed distance from that share: about three standard deviations at the ~1500 samples a
/// shared 2-core machine gives, or four where fewer samples make that wider
/// ([`Share::near_truth`]).
const SHARE_TOLERANCE: f64 = 0.04;

/// Profiles a running `nofp` workload for 5 s at 999 Hz with `--unwind mode`.
fn profile(mode: &str, workload_args: &[&str], out: &Path) -> Profile {
    profile_with(mode, workload_args, &[], out)
}

/// [`profile`] with more bpfprof arguments.
/// The checks need about 500 samples of the workload: 5 s give 5000 on a quiet machine, and a
/// machine loaded past its cores can leave the workload less than a tenth of a CPU, so a window
/// that gets too few is repeated three times as long rather than failed.
fn profile_with(mode: &str, workload_args: &[&str], extra: &[&str], out: &Path) -> Profile {
    let profile = profile_for("5s", mode, workload_args, extra, out);
    if profile.total() >= 700 {
        return profile;
    }
    eprintln!(
        "{} samples in 5 s: a loaded machine; again for 15 s",
        profile.total()
    );
    profile_for("15s", mode, workload_args, extra, out)
}

/// [`profile_with`] for `duration`.
fn profile_for(
    duration: &str,
    mode: &str,
    workload_args: &[&str],
    extra: &[&str],
    out: &Path,
) -> Profile {
    let target = Workload::spawn("nofp", workload_args);
    std::thread::sleep(Duration::from_millis(200));
    let pid = target.pid().to_string();
    let mut args = vec![
        "--unwind",
        mode,
        "--pid",
        &pid,
        "-F",
        "999",
        "-d",
        duration,
        "-o",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let run = run_bpfprof(args, Duration::from_secs(60));
    run.assert_code(exit::OK);
    Profile::read(out)
}

/// Whether `frames` (root first) run `main` → `parent` → `burn`, with `burn` the user leaf.
fn reaches_main_through(frames: &[String], parent: &str) -> bool {
    let user: Vec<&String> = frames
        .iter()
        .skip(1)
        .filter(|f| !bpfprof_tests::is_kernel_frame(f))
        .collect();
    let n = user.len();
    n >= 3 && user[n - 1] == "burn" && user[n - 2] == parent && user[n - 3] == "main"
}

#[test]
fn cfi_finds_both_parents_of_a_leaf_without_frame_pointers() {
    needs_root!();
    let dir = tempdir();
    let out = dir.path().join("cfi.folded");
    let profile = profile("cfi", &["parents", "30"], &out);
    let mut c = Checks::new();
    let in_burn = profile.count_containing("burn");
    let under_a = profile.count_where(|f| reaches_main_through(f, "parent_a"));
    let under_b = profile.count_where(|f| reaches_main_through(f, "parent_b"));
    c.check(in_burn >= 500, || format!("only {in_burn} samples in burn"));
    c.check((under_a + under_b) as f64 >= 0.97 * in_burn as f64, || {
        format!(
            "{under_a} + {under_b} of {in_burn} samples in burn reach main through a parent:\n{}",
            profile.top(15)
        )
    });
    let share_a = under_a as f64 / (under_a + under_b).max(1) as f64;
    c.check(Share::new(under_a, under_a + under_b).near_truth(PARENT_A_SHARE, SHARE_TOLERANCE), || {
        format!("parent_a's share of the leaf is {share_a:.3}, expected {PARENT_A_SHARE} ± {SHARE_TOLERANCE}")
    });
    c.finish();
}

/// `recurse` 300 deep: 304 user frames (main, 301 recurse, burn, libc's start) and a few
/// kernel ones, beyond the default limit of 127 and the kernel's `perf_event_max_stack`.
const DEEP: usize = 300;

/// Samples in `burn` whose stack carries all DEEP + 1 recurse frames and main, and those
/// under a `[truncated]` root.
fn deep_recursion(profile: &Profile) -> (u64, u64, u64) {
    let in_burn = profile.count_containing("burn");
    let whole = profile.count_where(|f| {
        f.iter().filter(|x| *x == "recurse").count() == DEEP + 1
            && f.iter().any(|x| x == "main")
            && !f.iter().any(|x| x == "[truncated]")
    });
    let truncated = profile.count_where(|f| f.iter().any(|x| x == "[truncated]"));
    (in_burn, whole, truncated)
}

#[test]
fn cfi_keeps_a_300_deep_recursion_with_max_stack_length_512() {
    needs_root!();
    let dir = tempdir();
    let depth = DEEP.to_string();
    let out = dir.path().join("deep.folded");
    let deep = profile_with(
        "cfi",
        &["recurse", "30", &depth],
        &["--max-stack-length", "512"],
        &out,
    );
    let (in_burn, whole, truncated) = deep_recursion(&deep);
    let mut c = Checks::new();
    c.check(in_burn >= 500, || format!("only {in_burn} samples in burn"));
    c.check(
        whole as f64 >= 0.95 * in_burn as f64 && truncated == 0,
        || {
            format!(
            "--max-stack-length 512: {whole} of {in_burn} samples in burn carry all {} recurse \
             frames and main, {truncated} are [truncated]:\n{}",
            DEEP + 1,
            deep.top(3)
        )
        },
    );
    // The counter-check: the default limit cuts the same stacks.
    let out = dir.path().join("default.folded");
    let cut = profile_with("cfi", &["recurse", "30", &depth], &[], &out);
    let (in_burn, whole, truncated) = deep_recursion(&cut);
    c.check(
        in_burn >= 500 && whole == 0 && truncated as f64 >= 0.95 * in_burn as f64,
        || {
            format!(
                "default limit: {whole} of {in_burn} samples in burn are whole, {truncated} \
                 [truncated]:\n{}",
                cut.top(3)
            )
        },
    );
    c.finish();
}

#[test]
fn frame_pointers_alone_lose_the_parents() {
    needs_root!();
    let dir = tempdir();
    let out = dir.path().join("fp.folded");
    let profile = profile("fp", &["parents", "30"], &out);
    let in_burn = profile.count_containing("burn");
    let full = profile.count_where(|f| {
        reaches_main_through(f, "parent_a") || reaches_main_through(f, "parent_b")
    });
    assert!(in_burn >= 500, "only {in_burn} samples in burn");
    // Without frame pointers the kernel's walk reads garbage after the leaf: if this ever
    // passes, the workload no longer tests CFI.
    assert!(
        (full as f64) < 0.5 * in_burn as f64,
        "{full} of {in_burn} samples reached main by frame pointers: the workload has frame pointers"
    );
}

#[test]
fn cfi_keeps_a_100_deep_recursion_without_frame_pointers() {
    needs_root!();
    let dir = tempdir();
    let out = dir.path().join("recurse.folded");
    let profile = profile("cfi", &["recurse", "30"], &out);
    let in_burn = profile.count_containing("burn");
    let deep = profile.count_where(|f| {
        f.iter().filter(|x| *x == "recurse").count() == 101
            && f.iter().any(|x| x == "main")
            && f.iter().rev().find(|x| !bpfprof_tests::is_kernel_frame(x))
                == Some(&"burn".to_string())
    });
    assert!(in_burn >= 500, "only {in_burn} samples in burn");
    assert!(
        deep as f64 >= 0.97 * in_burn as f64,
        "{deep} of {in_burn} samples in burn carry all 101 recurse frames and main:\n{}",
        profile.top(5)
    );
}

/// The vDSO's `clock_gettime`, as perf names it.
const VDSO_CLOCK_GETTIME: &str = "__vdso_clock_gettime";

/// Samples in the vDSO the test needs before it judges their shares.
const VDSO_SAMPLES: u64 = 1000;

/// `clock_gettime` runs in the vDSO, which has no file: its table and its function names come
/// from the image in the process's memory. Every sample whose leaf is in the vDSO reaches `main` through the
/// right caller, in the workload's 3:1 shares: at least 99.5% (all of them in three runs
/// here; by frame pointer alone 98.4% to 99.0% did, the samples at the vDSO function's first
/// instructions losing their callers).
#[test]
fn vdso_samples_keep_their_callers() {
    needs_root!();
    let dir = tempdir();
    let out = dir.path().join("vdso.folded");
    let user_frames = |f: &[String]| -> Vec<String> {
        f.iter()
            .skip(1)
            .filter(|x| !bpfprof_tests::is_kernel_frame(x))
            .cloned()
            .collect()
    };
    // vDSO code is named by the function the vDSO exports there, else `[vdso]+0xOFFSET`.
    let in_vdso = |f: &[String]| {
        user_frames(f)
            .last()
            .is_some_and(|leaf| leaf == VDSO_CLOCK_GETTIME || leaf.starts_with("[vdso]"))
    };
    let through = |f: &[String], parent: &str| {
        let user = user_frames(f);
        in_vdso(f)
            && user
                .windows(3)
                .any(|w| w[0] == "main" && w[1] == parent && w[2] == "clock_loop")
    };
    // At least VDSO_SAMPLES in the vDSO, so that the 99.5% below means something: a loaded
    // machine gives the target less CPU, so the window grows until it has them.
    let mut window = 5;
    let (profile, leaf_in_vdso) = loop {
        let profile = profile_for(&format!("{window}s"), "cfi", &["vdso", "60"], &[], &out);
        let leaf_in_vdso = profile.count_where(in_vdso);
        if leaf_in_vdso >= VDSO_SAMPLES || window >= 40 {
            break (profile, leaf_in_vdso);
        }
        window *= 2;
    };
    let named = profile.count_user_leaf(VDSO_CLOCK_GETTIME);
    let under_a = profile.count_where(|f| through(f, "clock_a"));
    let under_b = profile.count_where(|f| through(f, "clock_b"));
    let mut c = Checks::new();
    c.check(leaf_in_vdso >= VDSO_SAMPLES, || {
        format!(
            "only {leaf_in_vdso} of {} samples in the vDSO:\n{}",
            profile.total(),
            profile.top(10)
        )
    });
    c.check(named as f64 >= 0.95 * leaf_in_vdso as f64, || {
        format!(
            "only {named} of {leaf_in_vdso} samples in the vDSO are named {VDSO_CLOCK_GETTIME}:\n{}",
            profile.top(10)
        )
    });
    c.check((under_a + under_b) as f64 >= 0.995 * leaf_in_vdso as f64, || {
        format!(
            "{under_a} + {under_b} of {leaf_in_vdso} samples in the vDSO reach main through clock_a or clock_b:\n{}",
            profile.top(15)
        )
    });
    let share_a = under_a as f64 / (under_a + under_b).max(1) as f64;
    c.check(
        Share::new(under_a, under_a + under_b).near_truth(PARENT_A_SHARE, SHARE_TOLERANCE),
        || {
            format!(
                "clock_a's share is {share_a:.3}, expected {PARENT_A_SHARE} ± {SHARE_TOLERANCE}"
            )
        },
    );
    c.finish();
}

/// The daemon walks each run's stacks as its `unwind` field says: two runs on one workload
/// without frame pointers at the same time, asked for through the Rust client's options,
/// `cfi` finding both parents in their 3:1 shares and `fp` losing them; an unknown mode is
/// refused as a bad request.
#[test]
fn daemon_runs_unwind_as_their_request_says() {
    needs_root!();
    use bpfprof::{
        client::{ClientError, ProfileOptions},
        protocol::{ErrorCode, RunState},
    };
    let daemon = Daemon::start(&[]);
    let target = Workload::spawn("nofp", &["parents", "30"]);
    std::thread::sleep(Duration::from_millis(200));
    let request = |unwind: Option<&str>| {
        ProfileOptions {
            frequency: Some(999),
            max_profile_duration: Duration::from_secs(5),
            unwind: unwind.map(str::to_string),
            ..ProfileOptions::default()
        }
        .run_request(target.pid(), None)
    };
    let mut client = daemon.client();
    let refused = client.run(request(Some("dwarf"))).unwrap_err();
    assert!(
        matches!(&refused, ClientError::Refused { code: ErrorCode::BadRequest, message }
            if message.contains("expected auto, fp or cfi")),
        "{refused:?}"
    );
    let cfi = client.run(request(Some("cfi"))).unwrap().run_id.unwrap();
    let fp = client.run(request(Some("fp"))).unwrap().run_id.unwrap();
    let mut profiles = Vec::new();
    for id in [cfi, fp] {
        let reply = client.results(id, Duration::from_secs(60)).unwrap();
        assert_eq!(reply.state, Some(RunState::Success), "{reply:?}");
        let files = reply.files.as_ref().unwrap();
        profiles.push(Profile::read(Path::new(&files["folded"])));
    }
    let (cfi, fp) = (&profiles[0], &profiles[1]);
    let mut c = Checks::new();
    for (name, profile) in [("cfi", cfi), ("fp", fp)] {
        let in_burn = profile.count_containing("burn");
        c.check(in_burn >= 500, || {
            format!("{name}: only {in_burn} samples in burn")
        });
    }
    let in_burn = cfi.count_containing("burn");
    let under_a = cfi.count_where(|f| reaches_main_through(f, "parent_a"));
    let under_b = cfi.count_where(|f| reaches_main_through(f, "parent_b"));
    c.check((under_a + under_b) as f64 >= 0.97 * in_burn as f64, || {
        format!(
            "unwind=cfi: {under_a} + {under_b} of {in_burn} samples in burn reach main through a parent:\n{}",
            cfi.top(15)
        )
    });
    let share_a = under_a as f64 / (under_a + under_b).max(1) as f64;
    c.check(Share::new(under_a, under_a + under_b).near_truth(PARENT_A_SHARE, SHARE_TOLERANCE), || {
        format!("unwind=cfi: parent_a's share of the leaf is {share_a:.3}, expected {PARENT_A_SHARE} ± {SHARE_TOLERANCE}")
    });
    let fp_in_burn = fp.count_containing("burn");
    let fp_full = fp.count_where(|f| {
        reaches_main_through(f, "parent_a") || reaches_main_through(f, "parent_b")
    });
    c.check((fp_full as f64) < 0.5 * fp_in_burn as f64, || {
        format!("unwind=fp: {fp_full} of {fp_in_burn} samples in burn reached main: the run did not use frame pointers only")
    });
    c.finish();
}

/// Debian's xz has no frame pointers (neither has liblzma): with CFI its stacks run from the
/// compressor's inner loops through `lzma_code` to the C runtime, as `perf --call-graph dwarf`
/// shows them; by frame pointers more than half of them end in garbage.
#[test]
fn a_distro_binary_without_frame_pointers_unwinds_to_its_entry() {
    needs_root!();
    let dir = tempdir();
    let input = dir.path().join("input.txt");
    // 40 MB of pseudo-random text: enough for xz -9 to compress for longer than the run.
    write_random_text(&input, 40_000_000);
    let mut cmd = std::process::Command::new("xz");
    cmd.args(["-9", "-T1", "-c"]).arg(&input);
    let target = Workload::spawn_command(cmd);
    std::thread::sleep(Duration::from_millis(300));
    let out = dir.path().join("xz.folded");
    let record = |duration: &str| {
        let run = run_bpfprof(
            [
                "--unwind",
                "cfi",
                "--pid",
                &target.pid().to_string(),
                "-F",
                "999",
                "-d",
                duration,
                "-o",
                out.to_str().unwrap(),
            ],
            Duration::from_secs(60),
        );
        run.assert_code(exit::OK);
    };
    record("3s");
    // A machine loaded past its cores slows xz (and lengthens its life) as much as it thins
    // the samples: too few for the bound, and the window is repeated three times as long.
    if Profile::read(&out).total() < 700 {
        record("10s");
    }
    let profile = Profile::read(&out);
    let in_lzma = profile.count_containing("lzma_code");
    let to_entry = profile.count_where(|f| {
        f.iter().any(|x| x == "lzma_code") && f.iter().any(|x| x == "__libc_start_call_main")
    });
    let total = profile.total();
    assert!(total >= 500, "only {total} samples");
    assert!(
        in_lzma as f64 >= 0.9 * total as f64 && to_entry as f64 >= 0.97 * in_lzma as f64,
        "{to_entry} of {in_lzma} samples under lzma_code reach __libc_start_call_main ({total} in all):\n{}",
        profile.top(5)
    );
    assert!(!profile
        .stacks
        .keys()
        .flatten()
        .any(|f| f.contains("[unmapped]")));
}

/// Samples in the realigned frame's leaf that its test needs.
const REALIGN_SAMPLES: u64 = 300;

/// gcc realigns the stack of a function that keeps AVX values across calls with a DRAP
/// register, and says so in CFI only as an expression (CFA = *(rbp - 8)), as in many of
/// PyTorch's vector kernels. The walk reads that rule: every stack through the realigned
/// `realigned_driver` reaches `main`. (Before the rule, none did: the frame-pointer fallback
/// put the CFA 8 bytes too low and lost every caller above the driver.)
#[test]
fn a_stack_realigned_frame_unwinds_to_main() {
    needs_root!();
    let dir = tempdir();
    let out = dir.path().join("realign.folded");
    let target = Workload::spawn("nofp_realign", &["90"]);
    std::thread::sleep(Duration::from_millis(200));
    // At least REALIGN_SAMPLES in burn, so that the 97% below means something: a loaded
    // machine gives the target less CPU, so the window grows until it has them.
    let mut window = 3;
    let profile = loop {
        run_bpfprof(
            [
                "--unwind",
                "cfi",
                "--pid",
                &target.pid().to_string(),
                "-F",
                "499",
                "-d",
                &format!("{window}s"),
                "-o",
                out.to_str().unwrap(),
            ],
            Duration::from_secs(120),
        )
        .assert_code(exit::OK);
        let profile = Profile::read(&out);
        if profile.count_containing("burn") >= REALIGN_SAMPLES || window >= 24 {
            break profile;
        }
        window *= 2;
    };
    let mut c = Checks::new();
    let in_burn = profile.count_containing("burn");
    let whole = profile.count_where(|frames| {
        let user = bpfprof_tests::user_frames(frames);
        user.ends_with(&["main", "realigned_driver", "vector_step", "burn"])
            && user.contains(&"__libc_start_call_main")
    });
    c.check(in_burn >= REALIGN_SAMPLES, || {
        format!("only {in_burn} samples in burn")
    });
    c.check(whole as f64 >= 0.97 * in_burn as f64, || {
        format!(
            "{whole} of {in_burn} samples in burn reach libc's start through the realigned \
             driver:\n{}",
            profile.top(10)
        )
    });
    c.finish();
}

/// Samples in a leaf with neither CFI nor a frame pointer whose stacks must reach `main`
/// through the leaf's caller, as a share of the leaf's samples: the leaf's first and last
/// instructions (its pushes and pops, a few of its 20-odd instructions outside the loop) are
/// the only places where the scan's return address is not yet or no longer where it looks.
const NO_CFI_LEAF_WHOLE_SHARE: f64 = 0.95;

/// The fewest samples in the leaf the share above is judged by (one standard error of 0.95
/// over 100 samples is 0.02); a loaded 2-core machine takes 70 a second of the 499 asked.
const NO_CFI_LEAF_MIN_SAMPLES: u64 = 100;

/// Profiles `nofp_jit MODE` for 5 s and checks that the stacks of its hot leaf (`leaf`
/// matches its frame) reach `main` through `caller` and libc's start, and that the summary
/// counts the scanned frames.
fn no_cfi_leaf_reaches_main(mode: &str, caller: &str, leaf: impl Fn(&str) -> bool) {
    let dir = tempdir();
    let out = dir.path().join(format!("{mode}.folded"));
    let summary = dir.path().join(format!("{mode}.summary.json"));
    let target = Workload::spawn("nofp_jit", &[mode, "30"]);
    std::thread::sleep(Duration::from_millis(200));
    run_bpfprof(
        [
            "--unwind",
            "cfi",
            "--pid",
            &target.pid().to_string(),
            "-F",
            "499",
            "-d",
            "5s",
            "-o",
            out.to_str().unwrap(),
            "-o",
            summary.to_str().unwrap(),
        ],
        Duration::from_secs(60),
    )
    .assert_code(exit::OK);
    let profile = Profile::read(&out);
    let summary = Summary::read(&summary);
    let mut c = Checks::new();
    let in_leaf = profile.count_where(|frames| {
        let user = bpfprof_tests::user_frames(frames);
        user.last().is_some_and(|f| leaf(f))
    });
    let whole = profile.count_where(|frames| {
        let user = bpfprof_tests::user_frames(frames);
        user.len() >= 3
            && leaf(user[user.len() - 1])
            && user[user.len() - 2] == caller
            && user[user.len() - 3] == "main"
            && user.contains(&"__libc_start_call_main")
    });
    let scanned = summary.0["unwind"]["scanned_frames_in_cfi_stacks"]
        .as_u64()
        .unwrap_or(0);
    eprintln!(
        "{mode}: {in_leaf} samples in the leaf, {whole} reach main, {scanned} frames scanned"
    );
    c.check(in_leaf >= NO_CFI_LEAF_MIN_SAMPLES, || {
        format!(
            "only {in_leaf} samples in the leaf (at least {NO_CFI_LEAF_MIN_SAMPLES}):\n{}",
            profile.top(10)
        )
    });
    c.check(
        whole as f64 >= NO_CFI_LEAF_WHOLE_SHARE * in_leaf as f64,
        || {
            format!(
                "{whole} of {in_leaf} samples in the leaf reach main through {caller} (at \
                 least {NO_CFI_LEAF_WHOLE_SHARE}):\n{}",
                profile.top(10)
            )
        },
    );
    // Scanned frames are counted, never silent: one per stack through the leaf's loop.
    c.check(scanned as f64 >= 0.9 * whole as f64, || {
        format!("{scanned} scanned frames counted for {whole} stacks found by scanning")
    });
    c.finish();
}

/// A hot leaf of hand-written assembly with no CFI, which keeps no frame pointer and counts
/// in rbp (as MKL's kernels in libtorch_cpu.so): the walk scans the stack above it for its
/// return address and reaches `main` through `asm_caller`. (Before the scan, rbp taken for a
/// frame pointer ended every such stack at the leaf.)
#[test]
fn an_assembly_leaf_without_cfi_or_frame_pointer_unwinds_to_main() {
    needs_root!();
    no_cfi_leaf_reaches_main("asm", "asm_caller", |f| f == "asm_burn");
}

/// The same leaf copied into anonymous executable memory and called there (as oneDNN's JIT
/// kernels in PyTorch, `[anon]` in profiles): its stacks reach `main` through `jit_caller`.
#[test]
fn a_jit_leaf_in_anonymous_memory_unwinds_to_main() {
    needs_root!();
    no_cfi_leaf_reaches_main("jit", "jit_caller", |f| f.starts_with("[anon]"));
}
