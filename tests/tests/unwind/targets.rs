//! CFI unwinding on the kinds of targets real profiles meet: a Rust release build without
//! frame pointers, a library `dlopen`ed while the run goes on, a binary visible only inside
//! the target's own mount namespace, and Debian's `xz` compared with `perf record
//! --call-graph dwarf` on the same process at the same time.

use std::{
    collections::BTreeMap,
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use bpfprof_tests::{
    exit, needs_root, run_bpfprof, tempdir, user_frames, workload_path, write_random_text, Checks,
    Profile, Share, Workload,
};

/// The leaf's share under its 3-unit parent (the workloads split their work 3:1).
const PARENT_A_SHARE: f64 = 0.75;
/// Allowed distance from that share (about three standard deviations at ~1500 samples), or
/// four where fewer samples make that wider ([`Share::near_truth`]).
const SHARE_TOLERANCE: f64 = 0.04;
/// Share of the leaf's samples that must carry their whole call path.
const FULL_PATH_SHARE: f64 = 0.97;

/// Profiles process `pid` for `seconds` at 999 Hz with `--unwind mode` into `out`.
fn profile_pid(mode: &str, pid: u32, seconds: u32, out: &Path) -> Profile {
    let run = run_bpfprof(
        [
            "--unwind",
            mode,
            "--pid",
            &pid.to_string(),
            "-F",
            "999",
            "-d",
            &format!("{seconds}s"),
            "-o",
            out.to_str().unwrap(),
        ],
        Duration::from_secs(60),
    );
    run.assert_code(exit::OK);
    Profile::read(out)
}

/// The samples of `profile` containing `leaf`, by the user path from `main` down to `leaf`
/// (frames inlined into the leaf dropped); a stack that does not reach `main` is keyed by
/// what it has, from its outermost user frame.
fn paths_to(profile: &Profile, leaf: &str) -> BTreeMap<Vec<String>, u64> {
    let mut paths = BTreeMap::new();
    for (frames, count) in &profile.stacks {
        let user = user_frames(frames);
        let Some(end) = user.iter().position(|f| *f == leaf) else {
            continue;
        };
        let start = user[..end].iter().position(|f| *f == "main").unwrap_or(0);
        let path = user[start..=end].iter().map(|f| f.to_string()).collect();
        *paths.entry(path).or_insert(0) += count;
    }
    paths
}

/// Whether `path` (root first) runs from `main` through `chain`, in order and adjacent, to
/// its end.
fn runs_through(path: &[String], chain: &[&str]) -> bool {
    path.first().is_some_and(|f| f == "main")
        && path.ends_with(&chain.iter().map(|s| s.to_string()).collect::<Vec<_>>())
}

/// A Rust release build without frame pointers gets the same call paths, from `main` down
/// to the hot leaf, as the same program built with them; by frame pointers alone it keeps
/// none (which shows the check can fail).
#[test]
fn rust_release_build_without_frame_pointers_matches_the_frame_pointer_build() {
    needs_root!();
    let dir = tempdir();
    let mut runs = Vec::new();
    for (workload, mode) in [
        ("rustwork_fp", "auto"),
        ("rustwork_nofp", "auto"),
        ("rustwork_nofp", "fp"),
    ] {
        let target = Workload::spawn(workload, &["30"]);
        std::thread::sleep(Duration::from_millis(200));
        let out = dir.path().join(format!("{workload}-{mode}.folded"));
        let profile = profile_pid(mode, target.pid(), 4, &out);
        runs.push((workload, mode, profile));
    }
    let leaf = "rustwork::burn";
    let mut c = Checks::new();
    // The paths each build's leaf samples take, keeping those with at least 2% of them.
    let mut main_paths = Vec::new();
    for (workload, mode, profile) in &runs {
        let paths = paths_to(profile, leaf);
        let in_leaf: u64 = paths.values().sum();
        let through = |parent: &str| -> u64 {
            paths
                .iter()
                .filter(|(p, _)| runs_through(p, &["rustwork::main", parent, leaf]))
                .map(|(_, n)| n)
                .sum()
        };
        let (a, b) = (through("rustwork::parent_a"), through("rustwork::parent_b"));
        c.check(in_leaf >= 500, || {
            format!("{workload} --unwind {mode}: only {in_leaf} samples in {leaf}")
        });
        if *mode == "fp" {
            c.check(((a + b) as f64) < 0.5 * in_leaf as f64, || {
                format!("{workload} --unwind fp: {a} + {b} of {in_leaf} samples reached main: the build has frame pointers")
            });
            continue;
        }
        c.check((a + b) as f64 >= FULL_PATH_SHARE * in_leaf as f64, || {
            format!(
                "{workload} --unwind {mode}: {a} + {b} of {in_leaf} samples in {leaf} reach main through a parent:\n{}",
                profile.top(8)
            )
        });
        let share_a = a as f64 / (a + b).max(1) as f64;
        c.check(Share::new(a, a + b).near_truth(PARENT_A_SHARE, SHARE_TOLERANCE), || {
            format!("{workload}: parent_a's share is {share_a:.3}, expected {PARENT_A_SHARE} ± {SHARE_TOLERANCE}")
        });
        let common: Vec<Vec<String>> = paths
            .iter()
            .filter(|(_, n)| **n as f64 >= 0.02 * in_leaf as f64)
            .map(|(p, _)| p.clone())
            .collect();
        main_paths.push((workload, common));
    }
    if let [(_, with_fp), (_, without)] = &main_paths[..] {
        c.check(with_fp == without, || {
            format!("call paths differ:\nwith frame pointers: {with_fp:#?}\nwithout: {without:#?}")
        });
    }
    c.finish();
}

/// A library without frame pointers `dlopen`ed a second after the run started gets its table
/// while the run goes on: its hot leaf reaches `main` through the library's own caller and
/// the program's.
#[test]
fn a_library_dlopened_during_the_run_unwinds_to_main() {
    needs_root!();
    let dir = tempdir();
    let library = workload_path("libhot");
    let target = Workload::spawn("nofp_dlopen", &[library.to_str().unwrap(), "30"]);
    std::thread::sleep(Duration::from_millis(200));
    let out = dir.path().join("dlopen.folded");
    // The library is loaded 1 s into the run and busy from 2 s on.
    let profile = profile_pid("cfi", target.pid(), 5, &out);
    let in_leaf = profile.count_containing("lib_burn");
    let full = profile.count_where(|f| {
        let user = user_frames(f);
        user.ends_with(&["main", "call_lib", "lib_work", "lib_burn"])
    });
    let mut c = Checks::new();
    c.check(in_leaf >= 1000, || {
        format!("only {in_leaf} samples in lib_burn:\n{}", profile.top(5))
    });
    c.check(full as f64 >= FULL_PATH_SHARE * in_leaf as f64, || {
        format!(
            "{full} of {in_leaf} samples in lib_burn reach main through call_lib and lib_work:\n{}",
            profile.top(8)
        )
    });
    c.finish();
}

/// A process whose binary lives on a tmpfs mounted only in its own mount namespace (the path
/// it runs from shows an empty folder on the host) is unwound and named through
/// `/proc/PID/map_files` and `/proc/PID/root`.
#[test]
fn a_binary_only_visible_in_the_targets_mount_namespace() {
    needs_root!();
    let dir = tempdir();
    let private = dir.path().join("private");
    std::fs::create_dir(&private).unwrap();
    let nofp = workload_path("nofp");
    let script = format!(
        "mount -t tmpfs bpfprof-test {p} && cp {w} {p}/nofp && exec {p}/nofp parents 30",
        p = private.display(),
        w = nofp.display()
    );
    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "sh", "-c", &script]);
    cmd.stdout(Stdio::null());
    let target = Workload::spawn_command(cmd);
    let exe = bpfprof_tests::poll_until(Duration::from_secs(5), || {
        let exe = std::fs::read_link(format!("/proc/{}/exe", target.pid())).ok()?;
        (exe == private.join("nofp")).then_some(exe)
    })
    .expect("the workload did not start from its private tmpfs");
    assert!(
        !exe.exists(),
        "{} is visible on the host: the test needs it hidden",
        exe.display()
    );
    std::thread::sleep(Duration::from_millis(200));
    let out = dir.path().join("mntns.folded");
    let profile = profile_pid("cfi", target.pid(), 4, &out);
    let in_burn = profile.count_containing("burn");
    let through =
        |parent: &str| profile.count_where(|f| user_frames(f).ends_with(&["main", parent, "burn"]));
    let (a, b) = (through("parent_a"), through("parent_b"));
    let mut c = Checks::new();
    c.check(in_burn >= 500, || {
        format!("only {in_burn} samples named burn:\n{}", profile.top(5))
    });
    c.check((a + b) as f64 >= FULL_PATH_SHARE * in_burn as f64, || {
        format!(
            "{a} + {b} of {in_burn} samples in burn reach main through a parent:\n{}",
            profile.top(8)
        )
    });
    c.finish();
}

/// Debian's `xz -9` (no frame pointers, nor has its liblzma) recorded by bpfprof and by
/// `perf record --call-graph dwarf` at the same time: for each of the five hottest leaf
/// functions, the caller chain (three frames above the leaf) most of its samples have is the
/// same in both. perf names liblzma's internal functions `[unknown]`, so both tools' stacks
/// are named by bpfprof's symbolizer: perf's from the addresses `perf script` prints. What is
/// compared is the unwinding: bpfprof's walk in the kernel against perf's DWARF unwinding of
/// copied stacks after the fact.
#[test]
fn xz_stacks_match_perf_dwarf_unwinding_of_the_same_run() {
    use bpfprof::{
        process::maps::ProcessMaps,
        symbolize::{lookup_addresses, Symbolizer},
    };
    needs_root!();
    let dir = tempdir();
    let input = dir.path().join("input.txt");
    // 20 MB of pseudo-random text: xz -9 compresses it for longer than the runs.
    write_random_text(&input, 20_000_000);
    // Both profilers over one xz for a window; on a loaded machine xz runs less of each
    // second, so the window doubles (with a fresh xz) until both took enough samples.
    let record = |secs: u32| {
        let mut cmd = Command::new("xz");
        cmd.args(["-9", "-T1", "-c"])
            .arg(&input)
            .stdout(Stdio::null());
        let target = Workload::spawn_command(cmd);
        std::thread::sleep(Duration::from_millis(300));
        let pid = target.pid();
        let perf_data = dir.path().join("perf.data");
        let mut perf = Command::new("perf")
            .args([
                "record",
                "-q",
                "-e",
                "cpu-clock",
                "-F",
                "999",
                "--call-graph",
                "dwarf",
            ])
            .args(["-p", &pid.to_string(), "-o"])
            .arg(&perf_data)
            .args(["--", "sleep", &secs.to_string()])
            .stdout(Stdio::null())
            .spawn()
            .expect("running perf (linux-perf)");
        let bpfprof = profile_pid("cfi", pid, secs, &dir.path().join("xz.folded"));
        assert!(perf.wait().unwrap().success(), "perf record failed");
        let script = Command::new("perf")
            .args(["script", "-F", "comm,ip,dso", "--no-inline", "-i"])
            .arg(&perf_data)
            .stderr(Stdio::null())
            .output()
            .expect("running perf script");
        assert!(script.status.success(), "perf script failed");

        // perf's stacks: leaf first, as (DSO path, file offset), user frames only.
        let mut perf_stacks: Vec<Vec<(String, u64)>> = Vec::new();
        for sample in String::from_utf8_lossy(&script.stdout).split("\n\n") {
            let frames: Vec<(String, u64)> = sample
                .lines()
                .filter(|l| l.starts_with('\t'))
                .filter_map(|l| {
                    // `\t    15b76 (/usr/lib/x86_64-linux-gnu/liblzma.so.5.4.1)`; kernel
                    // frames name no file.
                    let (addr, dso) = l.trim().split_once(' ')?;
                    let dso = dso.trim_start_matches('(').trim_end_matches(')');
                    let offset = u64::from_str_radix(addr, 16).ok()?;
                    dso.starts_with('/').then(|| (dso.to_string(), offset))
                })
                .collect();
            if !frames.is_empty() {
                perf_stacks.push(frames);
            }
        }
        (target, bpfprof, perf_stacks)
    };
    let mut secs = 3;
    let (target, bpfprof, perf_stacks) = loop {
        let (target, bpfprof, perf_stacks) = record(secs);
        let enough = bpfprof.total() >= 1000 && perf_stacks.len() >= 1000;
        if enough || secs >= 12 {
            break (target, bpfprof, perf_stacks);
        }
        eprintln!(
            "{secs} s gave bpfprof {} and perf {} samples (a loaded machine): again, longer",
            bpfprof.total(),
            perf_stacks.len()
        );
        secs *= 2;
    };
    let pid = target.pid();
    // Runtime addresses, from the mappings of the DSOs perf names.
    let maps_text = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let runtime = |dso: &str, offset: u64| -> Option<u64> {
        maps_text.lines().find_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (range, map_offset, path) = (f[0], f[2], f.get(5)?);
            let (start, end) = range.split_once('-')?;
            let (start, end) = (
                u64::from_str_radix(start, 16).ok()?,
                u64::from_str_radix(end, 16).ok()?,
            );
            let map_offset = u64::from_str_radix(map_offset, 16).ok()?;
            (*path == dso && offset >= map_offset && offset < map_offset + (end - start))
                .then(|| start + offset - map_offset)
        })
    };
    let maps =
        ProcessMaps::capture(pid, pid, &bpfprof::process::copies::CopyBudget::mib(1024)).unwrap();
    let mut symbolizer = Symbolizer::new();
    let addr_stacks: Vec<Vec<u64>> = perf_stacks
        .iter()
        .map(|s| {
            s.iter()
                .filter_map(|(dso, off)| runtime(dso, *off))
                .collect()
        })
        .collect();
    symbolizer.prepare_user(
        &maps,
        addr_stacks
            .iter()
            .flat_map(|s| lookup_addresses(s).collect::<Vec<_>>()),
    );
    // Root first, each address expanded into its inlined frames as the folded output does.
    let perf_folded: Vec<Vec<String>> = addr_stacks
        .iter()
        .map(|s| {
            let leaf_first: Vec<u64> = lookup_addresses(s).collect();
            leaf_first
                .iter()
                .rev()
                .flat_map(|a| {
                    symbolizer
                        .user(&maps, *a)
                        .iter()
                        .map(|f| f.name.to_string())
                        .collect::<Vec<_>>()
                })
                .collect()
        })
        .collect();

    // For each leaf function: how many samples, and by which 3-frame caller chain.
    type Chains = BTreeMap<String, BTreeMap<Vec<String>, u64>>;
    let add = |chains: &mut Chains, user: &[&str], count: u64| {
        if let Some((leaf, callers)) = user.split_last() {
            let chain = callers[callers.len().saturating_sub(3)..]
                .iter()
                .map(|s| s.to_string())
                .collect();
            *chains
                .entry(leaf.to_string())
                .or_default()
                .entry(chain)
                .or_insert(0) += count;
        }
    };
    let mut ours = Chains::new();
    for (frames, count) in &bpfprof.stacks {
        add(&mut ours, &user_frames(frames), *count);
    }
    let mut theirs = Chains::new();
    for frames in &perf_folded {
        let user: Vec<&str> = frames.iter().map(String::as_str).collect();
        add(&mut theirs, &user, 1);
    }
    let total = |c: &BTreeMap<Vec<String>, u64>| c.values().sum::<u64>();
    let dominant = |c: &BTreeMap<Vec<String>, u64>| {
        c.iter()
            .max_by_key(|(_, n)| **n)
            .map(|(chain, n)| (chain.clone(), *n))
    };
    let mut leaves: Vec<(&String, u64)> = ours.iter().map(|(l, c)| (l, total(c))).collect();
    leaves.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
    let mut c = Checks::new();
    c.check(bpfprof.total() >= 1000 && perf_folded.len() >= 1000, || {
        format!(
            "too few samples: bpfprof {}, perf {}",
            bpfprof.total(),
            perf_folded.len()
        )
    });
    for (leaf, count) in leaves.iter().take(5) {
        let (our_chain, our_n) = dominant(&ours[*leaf]).unwrap();
        let Some(their) = theirs.get(*leaf) else {
            c.check(false, || {
                format!("{leaf} ({count} bpfprof samples) has no perf sample")
            });
            continue;
        };
        let (their_chain, their_n) = dominant(their).unwrap();
        eprintln!(
            "{leaf}: bpfprof {our_n}/{count} under {our_chain:?}; perf {their_n}/{} under {their_chain:?}",
            total(their)
        );
        c.check(our_chain == their_chain, || {
            format!(
                "{leaf}: bpfprof's dominant callers {our_chain:?} ({our_n} of {count}), perf's {their_chain:?} ({their_n} of {})",
                total(their)
            )
        });
    }
    c.finish();
}
