//! Java frames of a running HotSpot JVM (Debian's OpenJDK 17, and Debian sid's OpenJDK 25 in
//! the sid chroot), attached with `--pid` and no flag in the JVM: walked through its
//! interpreter and JIT code down to the thread's entry, named `Class.method`, methods the JIT
//! inlined included (JDK 25 keeps a compiled method's inlining tables outside the code cache),
//! and the time split as the program splits it.

use std::{path::Path, process::Command, time::Duration};

use bpfprof_tests::{
    ci, needs_root, output_ok, profile_pid, tempdir, PerfRecording, Profile, Share, Workload,
    SIGMAS,
};

/// Debian's JDK 17 (`openjdk-17-jdk-headless`, which `cargo xtask setup` installs).
const JDK17: &str = "/usr/lib/jvm/java-17-openjdk-amd64";
/// Debian sid's root, where `cargo xtask setup` installs sid's JDK 25.
const SID: &str = "/srv/sid";
/// Sid's JDK 25, as the root sees it.
const JDK25: &str = "/usr/lib/jvm/java-25-openjdk-amd64";

/// `hotA` does three times `hotB`'s work: its share of their samples.
const HOT_A_SHARE: f64 = 0.75;
/// Allowed distance from that share (or four standard errors where fewer samples make that
/// wider).
const SHARE_TOLERANCE: f64 = 0.03;
/// Share of the samples in Java code whose stack must reach the thread's entry (a walk that
/// starts in a compiled method's prologue or epilogue, where its frame is half built, may end
/// early: a few per thousand were).
const ENTRY_SHARE: f64 = 0.98;

/// The program: `main` calls `level1 -> level2 -> level3`, which calls `hotA` (work of 3n)
/// and `hotB` (work of n). `work` is longer than the 325 bytes of bytecode C2 inlines, so the
/// leaf is a compiled method of its own, called from compiled code that inlined the rest.
fn program() -> String {
    let step = "x = x * 31 + i; x ^= (x >>> 7); x += (x << 3);\n";
    format!(
        "public class Hot {{
    static volatile long sink;
    static long work(long n) {{
        long x = 0;
        for (long i = 0; i < n; i++) {{
{}        }}
        return x;
    }}
    static void hotA() {{ sink += work(3 * 2000); }}
    static void hotB() {{ sink += work(2000); }}
    static void level3() {{ hotA(); hotB(); }}
    static void level2() {{ level3(); }}
    static void level1() {{ level2(); }}
    public static void main(String[] args) {{
        long end = System.nanoTime() + Long.parseLong(args[0]) * 1_000_000_000L;
        while (System.nanoTime() < end) {{ level1(); }}
    }}
}}
",
        step.repeat(16)
    )
}

/// The JDK at `home`, or `None` (outside CI only) when it is not installed.
fn jdk(home: &str) -> Option<&Path> {
    let home = Path::new(home);
    if home.join("bin/javac").exists() {
        return Some(home);
    }
    assert!(!ci(), "{} missing: run `cargo xtask setup`", home.display());
    eprintln!("skipping: {} is not installed", home.display());
    None
}

/// Compiles the program with `home`'s javac into `dir`.
fn compile(home: &Path, dir: &Path) {
    std::fs::write(dir.join("Hot.java"), program()).unwrap();
    output_ok(
        Command::new(home.join("bin/javac"))
            .arg("-d")
            .arg(dir)
            .arg(dir.join("Hot.java")),
        "javac",
    );
}

/// The samples whose stack holds a Java frame of the program.
fn java_samples(profile: &Profile) -> u64 {
    profile.count_where(|frames| frames.iter().any(|f| f.starts_with("Hot.")))
}

fn check_profile(profile: &Profile) {
    let a = profile.count_containing("Hot.hotA");
    let b = profile.count_containing("Hot.hotB");
    let shapes = profile.shapes(8, |_| true);
    Share::new(a, a + b)
        .near(HOT_A_SHARE, SHARE_TOLERANCE, 0.5)
        .unwrap_or_else(|e| panic!("hotA's share of hotA and hotB: {e}\n{shapes}"));
    // Each level named, in its caller, down to the thread's entry.
    let whole = profile.count_where(|frames| {
        let at = |name: &str| frames.iter().position(|f| f == name);
        let order = [
            at("JavaMain"),
            at("Hot.main"),
            at("Hot.level1"),
            at("Hot.level2"),
            at("Hot.level3"),
        ];
        let leaf = at("Hot.hotA").or(at("Hot.hotB"));
        order.iter().all(Option::is_some)
            && order.windows(2).all(|w| w[0] < w[1])
            && leaf.is_some_and(|l| l > order[4].unwrap())
            && frames.iter().any(|f| f == "Hot.work")
    });
    let java = java_samples(profile);
    Share::new(whole, java)
        .at_least(ENTRY_SHARE, 0.5)
        .unwrap_or_else(|e| {
            panic!("samples in Java code with the whole path from JavaMain: {e}\n{shapes}")
        });
    // Java code the walk met but could not name is shown as anonymous memory.
    let anonymous = profile.count_where(|frames| frames.iter().any(|f| f.starts_with("[anon]")));
    assert!(
        (anonymous as f64) < 0.02 * profile.total() as f64,
        "{anonymous} of {} samples kept unnamed JIT frames\n{shapes}",
        profile.total()
    );
}

/// The program compiled into `dir` and run for 60 s by `home`'s java with `flags`, once its
/// JIT settled: code compiled since the last refresh of the code cache's rows (every 500 ms)
/// is walked by the fallbacks until its rows are written, and during warm-up some stacks lost
/// their callers there.
fn settled_jvm17(home: &Path, dir: &Path, flags: &[&str]) -> Workload {
    compile(home, dir);
    let mut java = Command::new(home.join("bin/java"));
    java.args(flags).arg("-cp").arg(dir).args(["Hot", "60"]);
    let jvm = Workload::spawn_command(java);
    std::thread::sleep(Duration::from_secs(8));
    jvm
}

#[test]
fn java17_frames_are_walked_and_named_in_a_running_jvm() {
    needs_root!();
    let Some(home) = jdk(JDK17) else {
        return;
    };
    let dir = tempdir();
    let jvm = settled_jvm17(home, dir.path(), &[]);
    let profile = profile_pid(jvm.pid(), "8s", &["-F", "499"], dir.path());
    check_profile(&profile);
}

/// `argv` run inside the sid root with /proc mounted there (the JVM reads /proc/self at
/// start).
fn in_sid(argv: &[&str]) -> Command {
    let mut command = bpfprof_tests::with_proc_in(SID);
    command.arg("chroot").arg(SID).args(argv);
    command
}

#[test]
fn java25_frames_are_walked_and_named_in_a_running_jvm() {
    needs_root!();
    let inside = |p: &str| Path::new(SID).join(&p[1..]);
    if !inside(JDK25).join("bin/javac").exists() {
        assert!(!ci(), "{SID}{JDK25} missing: run `cargo xtask setup`");
        eprintln!("skipping: {SID}{JDK25} is not installed");
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("bpfprof-jdk25-")
        .tempdir_in(inside("/tmp"))
        .unwrap();
    let here = format!("/{}", dir.path().strip_prefix(SID).unwrap().display());
    std::fs::write(dir.path().join("Hot.java"), program()).unwrap();
    let javac = format!("{JDK25}/bin/javac");
    output_ok(
        &mut in_sid(&[&javac, "-d", &here, &format!("{here}/Hot.java")]),
        "javac (JDK 25)",
    );
    let java = format!("{JDK25}/bin/java");
    let jvm = Workload::spawn_command(in_sid(&[&java, "-cp", &here, "Hot", "60"]));
    // As for JDK 17: the JIT settles first.
    std::thread::sleep(Duration::from_secs(8));
    let profile = profile_pid(jvm.pid(), "8s", &["-F", "499"], dir.path());
    check_profile(&profile);
}

/// The peer on the same run: a JVM started with what perf needs (`-XX:+PreserveFramePointer`
/// for its walk through compiled code, and a perf map written by `jcmd PID Compiler.perfmap`
/// after the recording; bpfprof needs neither), `perf record -g` and `bpfprof --pid` on it at
/// once. Of the samples in the program's Java code, bpfprof's reach `JavaMain` at least as
/// often as perf's (less 5 points); where perf names hotA and hotB (C2 inlines them into
/// level1, whose frame perf's map then names alone), hotA's share of the two is perf's within
/// 3 points or four standard errors.
#[test]
fn java17_beside_perf_with_its_perf_map() {
    needs_root!();
    let Some(home) = jdk(JDK17) else {
        return;
    };
    let dir = tempdir();
    let jvm = settled_jvm17(home, dir.path(), &["-XX:+PreserveFramePointer"]);
    let pid = jvm.pid();
    let mut perf = PerfRecording::start(pid, 499, 8, dir.path());
    let ours = profile_pid(pid, "8s", &["-F", "499"], dir.path());
    perf.wait();
    output_ok(
        Command::new(home.join("bin/jcmd")).args([&pid.to_string(), "Compiler.perfmap"]),
        "jcmd Compiler.perfmap",
    );
    let theirs = perf.stacks(pid, Path::new("/"));
    drop(jvm);
    let _ = std::fs::remove_file(format!("/tmp/perf-{pid}.map"));
    // perf names a Java frame from the map as `RETURN Hot.NAME(ARGS)`.
    let perf_has =
        |frames: &[String], name: &str| frames.iter().any(|f| f.contains(&format!("Hot.{name}(")));
    let perf_java = theirs.iter().filter(|f| perf_has(f, "work")).count() as u64;
    let perf_whole = theirs
        .iter()
        .filter(|f| perf_has(f, "work") && f.iter().any(|x| x == "JavaMain"))
        .count() as u64;
    let (perf_a, perf_b) = (
        theirs.iter().filter(|f| perf_has(f, "hotA")).count() as u64,
        theirs.iter().filter(|f| perf_has(f, "hotB")).count() as u64,
    );
    let ours_java = ours.count_containing("Hot.work");
    let ours_whole = ours
        .count_where(|f| f.iter().any(|x| x == "Hot.work") && f.iter().any(|x| x == "JavaMain"));
    let (ours_a, ours_b) = (
        ours.count_containing("Hot.hotA"),
        ours.count_containing("Hot.hotB"),
    );
    let share = |a: u64, b: u64| a as f64 / (a + b).max(1) as f64;
    eprintln!(
        "beside perf: bpfprof {ours_whole} of {ours_java} samples in Hot.work reach JavaMain \
         ({:.3}), hotA {ours_a}, hotB {ours_b} ({:.3}); perf with the map {perf_whole} of \
         {perf_java} ({:.3}), hotA {perf_a}, hotB {perf_b}, of {} samples",
        share(ours_whole, ours_java - ours_whole),
        share(ours_a, ours_b),
        share(perf_whole, perf_java - perf_whole),
        theirs.len()
    );
    assert!(
        ours_java >= 500 && perf_java >= 500,
        "too few samples in Hot.work to compare: bpfprof {ours_java}, perf {perf_java}"
    );
    let whole = |whole: u64, java: u64| whole as f64 / java as f64;
    assert!(
        whole(ours_whole, ours_java) >= whole(perf_whole, perf_java) - 0.05,
        "bpfprof's samples in Hot.work reach JavaMain {:.3} of the time, perf's {:.3}",
        whole(ours_whole, ours_java),
        whole(perf_whole, perf_java)
    );
    if perf_a + perf_b >= 200 {
        let (p, q) = (share(ours_a, ours_b), share(perf_a, perf_b));
        let error = |n: u64| q * (1.0 - q) / n as f64;
        let width =
            SHARE_TOLERANCE.max(SIGMAS * (error(ours_a + ours_b) + error(perf_a + perf_b)).sqrt());
        assert!(
            (p - q).abs() <= width,
            "hotA's share {p:.3}, perf's on the same run {q:.3} (within {width:.3})"
        );
    }
}
