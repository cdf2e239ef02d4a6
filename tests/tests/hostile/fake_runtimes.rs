//! End to end: a process that fakes a JVM's `VMStructs` or V8's postmortem constants costs
//! its own run only (issue 45). `tests/workloads/fake/runtime.c`, built by the test, spins in
//! `fake_runtime_spin` linked with a fake `libjvm.so` (`fake/libjvm.c`: 30,000 struct entries
//! with no end and 255-character names, type sizes of 2**63, integer constants whose names
//! point at themselves, an unmapped table), or, named `node-fake`, exporting `v8dbg_*`
//! constants out of every range. Both are profiled beside an honest `hotcold` (3:1) in one
//! run: it ends in time with exit 0, names the honest process right, names the fakes' own
//! native function, keeps bpfprof's CPU and memory bounded, and says in the summary, per
//! process, that their JVM or V8 could not be read. A third fake (`fake/heaps.c`), whose
//! VMStructs are believed and whose code heaps are 300 MiB of 16-byte blocks, costs bpfprof
//! a bounded share of a CPU however often the run rescans. A fourth (`fake/v8inline.c`), whose
//! V8 constants are believed, runs a frame in a forged TurboFan Code whose inlining table
//! loops: shown as one frame, at the usual cost. Needs root.

use std::{path::Path, process::Command, time::Duration};

use bpfprof_tests::*;

const TIMEOUT: Duration = Duration::from_secs(120);
const RUN_SECONDS: f64 = 6.0;
/// Most of the run's wall time bpfprof may spend on CPU (0.14 s for 5 s by hand; a debug
/// build on a loaded machine is given many times that).
const MAX_PROFILER_CPU_SHARE: f64 = 0.5;
/// bpfprof's peak resident memory at most (about 25 MiB by hand): the fake tables would
/// make it read and keep 30,000 entries of 512 bytes of names, were they not bounded.
const MAX_PROFILER_RSS: u64 = 512 << 20;

/// Compiles `args` with gcc, panicking with its output on failure.
fn gcc(args: &[&str]) {
    let out = Command::new("gcc").args(args).output().expect("gcc runs");
    assert!(
        out.status.success(),
        "gcc {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Builds the fake JVM (`fakejvm` beside its `libjvm.so`) and the fake Node (`node-fake`)
/// in `dir`.
fn build(dir: &Path) {
    // Not in tests/workloads itself, whose C files the build script compiles as programs.
    let src = workspace_root().join("tests/workloads/fake");
    let s = |name: &str| src.join(name).display().to_string();
    let d = |name: &str| dir.join(name).display().to_string();
    gcc(&[
        "-O0",
        "-shared",
        "-fPIC",
        "-o",
        &d("libjvm.so"),
        &s("libjvm.c"),
    ]);
    gcc(&[
        "-O0",
        "-DJVM",
        "-o",
        &d("fakejvm"),
        &s("runtime.c"),
        "-L",
        &d(""),
        "-ljvm",
        "-Wl,-rpath,$ORIGIN",
    ]);
    gcc(&[
        "-O0",
        "-DV8",
        "-rdynamic",
        "-o",
        &d("node-fake"),
        &s("runtime.c"),
    ]);
}

#[test]
fn fake_vmstructs_and_v8_constants_cost_their_own_run_only() {
    needs_root!();
    let dir = tempdir();
    build(dir.path());
    let mut jvm = Command::new(dir.path().join("fakejvm"));
    jvm.arg("90");
    let jvm = Workload::spawn_command(jvm);
    let mut node = Command::new(dir.path().join("node-fake"));
    node.arg("90");
    let node = Workload::spawn_command(node);
    let honest = Workload::spawn("hotcold", &["90"]);
    // The fake JVM maps its libjvm before main runs; give both a moment to be running.
    poll_until(Duration::from_secs(10), || {
        std::fs::read_to_string(format!("/proc/{}/maps", jvm.pid()))
            .ok()
            .filter(|m| m.contains("/libjvm.so"))
    })
    .expect("the fake JVM maps its libjvm.so");
    let (j, v, o) = (jvm.pid(), node.pid(), honest.pid());
    let (profile, summary) = profile_pids(&[j, v, o], RUN_SECONDS, dir.path(), TIMEOUT);
    drop((jvm, node, honest));

    let mut c = Checks::new();
    let of = |pid: u32, name: &str| {
        profile.count_where(|f| root_pid(&f[0]) == Some(pid) && f.iter().any(|x| x == name))
    };
    let (hot, cold) = (of(o, "leaf_hot"), of(o, "leaf_cold"));
    let (spun_jvm, spun_node) = (of(j, "fake_runtime_spin"), of(v, "fake_runtime_spin"));
    eprintln!(
        "honest: leaf_hot {hot}, leaf_cold {cold}; fake JVM: {spun_jvm} in its spin; fake \
         Node: {spun_node}"
    );
    c.check(hot + cold >= 100, || {
        format!("honest: {} samples of its work: too few", hot + cold)
    });
    c.result(
        "honest: leaf_hot's share",
        Share::new(hot, hot + cold).near(0.75, 0.05, 0.5),
    );
    c.check(spun_jvm > 0 && spun_node > 0, || {
        format!(
            "the fakes' own function is not named (JVM {spun_jvm}, Node {spun_node}):\n{}",
            profile.top(10)
        )
    });
    let said: Vec<String> = summary
        .field("python_unsupported")
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(String::from))
        .collect();
    eprintln!("the summary says: {said:?}");
    c.check(
        said.iter()
            .any(|s| s.contains("its JVM") && s.contains("could not be read")),
        || format!("the summary does not say the fake JVM was not read: {said:?}"),
    );
    c.check(
        said.iter()
            .any(|s| s.contains("JavaScript frames not named") && s.contains("node-fake")),
        || format!("the summary does not say the fake Node was not read: {said:?}"),
    );
    let cost = &summary.field("cost");
    let cpu = cost["profiler_cpu_secs"].as_f64().unwrap_or(f64::MAX);
    let rss = cost["profiler_peak_rss_bytes"].as_u64().unwrap_or(u64::MAX);
    eprintln!("bpfprof: {cpu:.3} s of CPU in a {RUN_SECONDS} s run, peak RSS {rss} bytes");
    c.check(cpu < MAX_PROFILER_CPU_SHARE * RUN_SECONDS, || {
        format!("bpfprof used {cpu:.3} s of CPU in a {RUN_SECONDS} s run")
    });
    c.check(rss < MAX_PROFILER_RSS, || {
        format!("bpfprof's peak RSS was {rss} bytes")
    });
    c.finish();
}

/// Seconds the code-heap run samples: long enough for many refreshes (each asked for a scan).
const HEAPS_RUN_SECONDS: f64 = 10.0;
/// Most of that run bpfprof may spend on CPU: 3.3 s before scans were spaced by their cost,
/// about 0.7 s after (a first scan of the 256 MiB bound, one more after twenty times its
/// length, the rest of the run's work).
const MAX_HEAPS_CPU_SHARE: f64 = 0.2;

/// A fake JVM whose VMStructs are believed and whose code heaps are 300 MiB of 16-byte
/// blocks (`fake/heaps.c`) costs bpfprof a bounded share of a CPU, however often the run
/// asks for the code cache: every scan reads up to its 256 MiB bound.
#[test]
fn a_fake_code_cache_costs_a_bounded_share_of_a_cpu() {
    needs_root!();
    let dir = tempdir();
    let src = workspace_root().join("tests/workloads/fake");
    let s = |name: &str| src.join(name).display().to_string();
    let d = |name: &str| dir.path().join(name).display().to_string();
    gcc(&[
        "-O0",
        "-shared",
        "-fPIC",
        "-o",
        &d("libjvm.so"),
        &s("heaps.c"),
    ]);
    gcc(&[
        "-O0",
        "-DJVM",
        "-o",
        &d("fakejvm"),
        &s("runtime.c"),
        "-L",
        &d(""),
        "-ljvm",
        "-Wl,-rpath,$ORIGIN",
    ]);
    let mut jvm = Command::new(dir.path().join("fakejvm"));
    jvm.arg("90");
    let jvm = Workload::spawn_command(jvm);
    let honest = Workload::spawn("hotcold", &["90"]);
    // Its constructor fills the heaps before main runs.
    poll_until(Duration::from_secs(30), || {
        let status = std::fs::read_to_string(format!("/proc/{}/status", jvm.pid())).ok()?;
        let rss_kib: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))?
            .trim()
            .trim_end_matches(" kB")
            .parse()
            .ok()?;
        (rss_kib > 300 << 10).then_some(())
    })
    .expect("the fake JVM fills its code heaps");
    let (j, o) = (jvm.pid(), honest.pid());
    let (profile, summary) = profile_pids(&[j, o], HEAPS_RUN_SECONDS, dir.path(), TIMEOUT);
    drop((jvm, honest));
    let mut c = Checks::new();
    let of = |pid: u32, name: &str| {
        profile.count_where(|f| root_pid(&f[0]) == Some(pid) && f.iter().any(|x| x == name))
    };
    let (hot, cold, spun) = (
        of(o, "leaf_hot"),
        of(o, "leaf_cold"),
        of(j, "fake_runtime_spin"),
    );
    let cpu = summary.field("cost")["profiler_cpu_secs"]
        .as_f64()
        .unwrap_or(f64::MAX);
    let limits = summary.field("limits_hit").clone();
    eprintln!(
        "honest: leaf_hot {hot}, leaf_cold {cold}; fake JVM: {spun}; bpfprof: {cpu:.3} s of \
         CPU in a {HEAPS_RUN_SECONDS} s run; limits: {limits}"
    );
    c.check(hot + cold >= 100, || {
        format!("honest: {} samples of its work: too few", hot + cold)
    });
    c.result(
        "honest: leaf_hot's share",
        Share::new(hot, hot + cold).near(0.75, 0.05, 0.5),
    );
    c.check(spun > 0, || {
        "the fake JVM's own function is not named".into()
    });
    c.check(limits.to_string().contains("code cache was larger"), || {
        format!("the summary does not say the fake code cache was cut: {limits}")
    });
    c.check(cpu < MAX_HEAPS_CPU_SHARE * HEAPS_RUN_SECONDS, || {
        format!("bpfprof used {cpu:.3} s of CPU in a {HEAPS_RUN_SECONDS} s run")
    });
    c.finish();
}

/// A fake Node.js whose V8 constants are believed (Node 24's) and whose one JavaScript frame
/// runs in a forged TurboFan Code (`fake/v8inline.c`): found from the frame's pc (its
/// InstructionStream header), read, and its inlining table says the inlined call is its own
/// caller, a chain with no end. The frame is shown once, as its own function, with no inlined
/// frames; the run ends in time and an honest process beside it is profiled right, at the
/// usual cost.
#[test]
fn a_fake_inlining_table_shows_one_frame_and_costs_its_own_run_only() {
    needs_root!();
    let dir = tempdir();
    let src = workspace_root().join("tests/workloads/fake/v8inline.c");
    let fake = dir.path().join("node-inline-fake");
    gcc(&[
        "-O0",
        "-rdynamic",
        "-o",
        fake.to_str().unwrap(),
        src.to_str().unwrap(),
    ]);
    let mut node = Command::new(&fake);
    node.arg("90");
    let node = Workload::spawn_command(node);
    let honest = Workload::spawn("hotcold", &["90"]);
    let (v, o) = (node.pid(), honest.pid());
    let (profile, summary) = profile_pids(&[v, o], RUN_SECONDS, dir.path(), TIMEOUT);
    drop((node, honest));

    let mut c = Checks::new();
    let of = |pid: u32, name: &str| {
        profile.count_where(|f| root_pid(&f[0]) == Some(pid) && f.iter().any(|x| x == name))
    };
    let (hot, cold) = (of(o, "leaf_hot"), of(o, "leaf_cold"));
    let fake_frames = of(v, "fakeInlined");
    let repeated = profile.count_where(|f| {
        root_pid(&f[0]) == Some(v) && f.iter().filter(|x| *x == "fakeInlined").count() > 1
    });
    eprintln!(
        "honest: leaf_hot {hot}, leaf_cold {cold}; fake Node: {fake_frames} samples in \
         fakeInlined, {repeated} with it more than once"
    );
    c.check(hot + cold >= 100, || {
        format!("honest: {} samples of its work: too few", hot + cold)
    });
    c.result(
        "honest: leaf_hot's share",
        Share::new(hot, hot + cold).near(0.75, 0.05, 0.5),
    );
    c.check(fake_frames > 0 && repeated == 0, || {
        format!(
            "the fake's frame: {fake_frames} samples, {repeated} with it more than once:\n{}",
            profile.top(10)
        )
    });
    let cost = &summary.field("cost");
    let cpu = cost["profiler_cpu_secs"].as_f64().unwrap_or(f64::MAX);
    let rss = cost["profiler_peak_rss_bytes"].as_u64().unwrap_or(u64::MAX);
    eprintln!("bpfprof: {cpu:.3} s of CPU in a {RUN_SECONDS} s run, peak RSS {rss} bytes");
    c.check(cpu < MAX_PROFILER_CPU_SHARE * RUN_SECONDS, || {
        format!("bpfprof used {cpu:.3} s of CPU in a {RUN_SECONDS} s run")
    });
    c.check(rss < MAX_PROFILER_RSS, || {
        format!("bpfprof's peak RSS was {rss} bytes")
    });
    c.finish();
}
