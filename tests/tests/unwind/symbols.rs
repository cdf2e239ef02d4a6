//! End to end: symbolization cases with real programs compiled here for the case at hand:
//! truncation of deep stacks, inlined functions from DWARF, source lines, C++ demangling,
//! separate debug info through `.gnu_debuglink`, JIT code through `/tmp/perf-PID.map`, a binary
//! only reachable inside another mount namespace, a binary deleted before the run ends, and
//! per-thread stacks. Needs root.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use bpfprof_tests::*;

const TIMEOUT: Duration = Duration::from_secs(60);

/// Compiles `source` (C, or C++ when `cpp`) into `dir/name` with `flags`.
fn compile(dir: &Path, name: &str, source: &str, cpp: bool, flags: &[&str]) -> PathBuf {
    let src = dir.join(if cpp {
        format!("{name}.cpp")
    } else {
        format!("{name}.c")
    });
    std::fs::write(&src, source).unwrap();
    let out = dir.join(name);
    let compiler = if cpp { "g++" } else { "cc" };
    let status = Command::new(compiler)
        .args(flags)
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .status()
        .unwrap_or_else(|e| panic!("running {compiler}: {e}"));
    assert!(status.success(), "{compiler} failed on {name}");
    out
}

/// Profiles `pid` (a `--pid` argument) with extra options; returns the folded profile, the
/// summary and the run.
fn profile(pid: &str, extra: &[&str], duration: &str) -> (Profile, Summary, RunResult) {
    let dir = tempdir();
    let out = dir.path().join("p.folded");
    let summary = dir.path().join("p.summary.json");
    let mut args: Vec<String> = vec![
        "--pid".into(),
        pid.into(),
        "-F".into(),
        "499".into(),
        "-d".into(),
        duration.into(),
        "-o".into(),
        out.display().to_string(),
        "--summary-json".into(),
        summary.display().to_string(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let run = run_bpfprof(&args, TIMEOUT);
    assert!(
        matches!(run.code(), 0 | 7),
        "bpfprof failed ({}):\n{}",
        run.code(),
        run.stderr
    );
    (Profile::read(&out), Summary::read(&summary), run)
}

fn settle() {
    std::thread::sleep(Duration::from_millis(300));
}

const DEEP: &str = r#"
volatile unsigned long sink;
__attribute__((noinline)) void burn_deep(void) { for (unsigned long i = 0; i < 100000000UL; i++) sink += i; }
__attribute__((noinline)) void recurse(int n) { if (n == 0) burn_deep(); else recurse(n - 1); sink++; }
int main(void) { for (;;) recurse(300); }
"#;

#[test]
fn deep_stacks_keep_their_leaf_frames_under_a_truncated_marker() {
    needs_root!();
    let dir = tempdir();
    let bin = compile(
        dir.path(),
        "deep",
        DEEP,
        false,
        &["-O0", "-g", "-fno-omit-frame-pointer"],
    );
    let target = Workload::spawn_command(Command::new(&bin));
    settle();
    let (p, summary, _) = profile(
        &target.pid().to_string(),
        &["--max-stack-length", "40"],
        "1s",
    );
    assert!(p.total() > 100, "{}", p.top(3));
    // Almost every sample is in burn_deep, 302 frames deep, and is cut to its 40 leaf-most
    // frames. A few land in `recurse` while the recursion unwinds and starts again: those
    // shallower than the limit are whole stacks from `_start`, never marked.
    let mut truncated = 0;
    for (frames, count) in &p.stacks {
        let stack = frames.join(";");
        assert_eq!(frames[0], "deep");
        if frames[1] == "[truncated]" {
            assert_eq!(frames.len() - 2, 40, "{stack}");
            truncated += count;
        } else {
            assert_eq!(frames[1], "_start", "{stack}");
            assert!(frames.len() - 1 <= 40, "{stack}");
            assert_ne!(frames.last().unwrap(), "burn_deep", "{stack}");
        }
    }
    assert!(
        p.count_user_leaf("burn_deep") as f64 >= 0.95 * p.total() as f64,
        "{}",
        p.top(3)
    );
    assert!(truncated as f64 >= 0.95 * p.total() as f64, "{}", p.top(3));
    assert_eq!(summary.field("lost")["truncated"].as_u64(), Some(truncated));
    assert_eq!(summary.u64("max_stack_length"), 40);
    // A limit above the kernel program's is refused, naming it.
    let refused = run_bpfprof(
        [
            "--pid",
            &target.pid().to_string(),
            "--max-stack-length",
            "100000",
        ],
        TIMEOUT,
    );
    refused.assert_code(5);
    refused.assert_stderr_mentions(&["512 frames"]);
}

const INLINED: &str = r#"
volatile unsigned long sink;
static inline __attribute__((always_inline)) void inlined_burn(unsigned long n) {
    for (unsigned long i = 0; i < n; i++) sink += i;   /* BURN LINE */
}
__attribute__((noinline)) void real_caller(unsigned long n) { inlined_burn(n); sink++; }
int main(void) { for (;;) real_caller(100000000UL); }
"#;

fn burn_line(source: &str) -> u32 {
    source
        .lines()
        .position(|l| l.contains("BURN LINE"))
        .expect("marker") as u32
        + 1
}

#[test]
fn inlined_functions_are_expanded_from_dwarf_with_lines() {
    needs_root!();
    let dir = tempdir();
    let bin = compile(
        dir.path(),
        "inlined",
        INLINED,
        false,
        &["-O2", "-g", "-fno-omit-frame-pointer"],
    );
    let target = Workload::spawn_command(Command::new(&bin));
    settle();
    let (p, _, _) = profile(&target.pid().to_string(), &[], "1s");
    let expanded = p.count_directly_under("inlined_burn", "real_caller");
    assert!(
        expanded as f64 >= 0.8 * p.total() as f64,
        "inlined_burn under real_caller in {expanded} of {}\n{}",
        p.total(),
        p.top(5)
    );
    // With --line-numbers the inlined frame names the burn loop's line.
    let (p, _, _) = profile(&target.pid().to_string(), &["--line-numbers"], "1s");
    let want = format!("inlined_burn (inlined.c:{})", burn_line(INLINED));
    assert!(p.has_frame(&want), "no {want:?}\n{}", p.top(5));
}

const CPP: &str = r#"
#include <cstdio>
volatile unsigned long sink;
namespace ns {
template <class T> struct Widget {
    __attribute__((noinline)) void spin() { for (unsigned long i = 0; i < 100000000UL; i++) sink += i; }
};
}
int main() { ns::Widget<int> w; for (;;) w.spin(); }
"#;

#[test]
fn cpp_names_are_demangled() {
    needs_root!();
    let dir = tempdir();
    let bin = compile(
        dir.path(),
        "widget",
        CPP,
        true,
        &["-O0", "-g", "-fno-omit-frame-pointer"],
    );
    let target = Workload::spawn_command(Command::new(&bin));
    settle();
    let (p, _, _) = profile(&target.pid().to_string(), &[], "1s");
    assert!(p.has_frame("ns::Widget<int>::spin()"), "{}", p.top(5));
}

/// A stripped C++ program whose hot function is internal: only `.dynsym`'s exports are left
/// (`-rdynamic`), and the hot function sits after an exported one.
const STRIPPED_CPP: &str = r#"
volatile unsigned long sink;
namespace ns {
__attribute__((noinline)) void exported_entry(int n) { sink += n; }
}
static __attribute__((noinline)) void spin_internal() { for (unsigned long i = 0; i < 100000000UL; i++) sink += i; }
int main() { for (;;) { ns::exported_entry(1); spin_internal(); } }
"#;

/// Code no symbol covers, past the end of the exported function before it (its size says
/// where it ends), is named by its own start, `module+0xSTART`, not `export+0xOFF` (Debian's
/// python3.14 showed its eval loop as `_PyObject_DebugMallocStats+0x10bb7`, 68 KB past an
/// export of 414 bytes); exact names stay demangled (issue 27: cc1plus showed
/// `_Z14debug_df_chainP7df_link+0x16c0` beside demangled exact names).
#[test]
fn stripped_cpp_internal_code_is_named_by_its_own_start() {
    needs_root!();
    let dir = tempdir();
    let bin = compile(
        dir.path(),
        "stripped",
        STRIPPED_CPP,
        true,
        &["-O0", "-fno-omit-frame-pointer", "-rdynamic"],
    );
    // Where spin_internal starts in the file, from the symbols strip removes.
    let data = std::fs::read(&bin).unwrap();
    let start = {
        use object::{Object, ObjectSegment, ObjectSymbol};
        let elf = object::File::parse(&*data).unwrap();
        let address = elf
            .symbols()
            .find(|s| s.name().is_ok_and(|n| n.contains("spin_internal")))
            .expect("spin_internal's symbol")
            .address();
        elf.segments()
            .find(|s| (s.address()..s.address() + s.size()).contains(&address))
            .map(|s| address - s.address() + s.file_range().0)
            .unwrap()
    };
    let status = Command::new("strip")
        .arg("--strip-all")
        .arg(&bin)
        .status()
        .unwrap();
    assert!(status.success(), "strip failed");
    let nm = Command::new("nm").arg("-D").arg(&bin).output().unwrap();
    let exports = String::from_utf8_lossy(&nm.stdout);
    assert!(
        exports.contains("_ZN2ns14exported_entryEi") && !exports.contains("spin_internal"),
        "the stripped binary exports only ns::exported_entry (mangled) and main:\n{exports}"
    );
    let target = Workload::spawn_command(Command::new(&bin));
    settle();
    let (p, _, _) = profile(&target.pid().to_string(), &[], "1s");
    let own = format!("stripped+{start:#x}");
    let in_spin = p.count_where(|f| f.contains(&own));
    assert!(
        // A 1 s run at 499 Hz of a process sharing 2 busy cores: 87 samples seen here.
        in_spin as f64 >= 0.8 * p.total() as f64 && p.total() >= 30,
        "{in_spin} of {} samples in {own}:\n{}",
        p.total(),
        p.top(5)
    );
    assert_eq!(
        p.count_where(|f| f
            .iter()
            .any(|x| x.starts_with("ns::exported_entry(int)+0x"))),
        0,
        "named from an export it lies past:\n{}",
        p.top(5)
    );
    assert_eq!(
        p.count_where(|f| f.iter().any(|x| x.starts_with("_Z"))),
        0,
        "mangled frames:\n{}",
        p.top(5)
    );
}

const PLAIN: &str = r#"
volatile unsigned long sink;
__attribute__((noinline)) void debuglink_work(void) { for (unsigned long i = 0; i < 100000000UL; i++) sink += i; }
int main(void) { for (;;) debuglink_work(); }
"#;

#[test]
fn stripped_binaries_resolve_through_gnu_debuglink() {
    needs_root!();
    let dir = tempdir();
    let bin = compile(
        dir.path(),
        "linked",
        PLAIN,
        false,
        &["-O0", "-g", "-fno-omit-frame-pointer"],
    );
    let debug = dir.path().join("linked.debug");
    let run = |program: &str, args: &[&str]| {
        let status = Command::new(program).args(args).status().unwrap();
        assert!(status.success(), "{program} {args:?}");
    };
    let (b, d) = (bin.to_str().unwrap(), debug.to_str().unwrap());
    run("objcopy", &["--only-keep-debug", b, d]);
    run("strip", &["--strip-all", b]);
    run("objcopy", &[&format!("--add-gnu-debuglink={d}"), b]);
    let nm = Command::new("nm").arg(&bin).output().unwrap();
    assert!(
        !String::from_utf8_lossy(&nm.stdout).contains("debuglink_work"),
        "the stripped binary still has its symbols"
    );
    let target = Workload::spawn_command(Command::new(&bin));
    settle();
    let (p, _, _) = profile(&target.pid().to_string(), &[], "1s");
    assert!(
        p.count_user_leaf("debuglink_work") as f64 >= 0.9 * p.total() as f64,
        "{}",
        p.top(5)
    );
}

const JIT: &str = r#"
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
int main(void) {
    /* mov rcx, rdi; 1: dec rcx; jnz 1b; ret */
    static const unsigned char code[] = {0x48, 0x89, 0xf9, 0x48, 0xff, 0xc9, 0x75, 0xfb, 0xc3};
    unsigned char *mem = mmap(NULL, 4096, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) return 1;
    memcpy(mem, code, sizeof code);
    char path[64];
    snprintf(path, sizeof path, "/tmp/perf-%d.map", getpid());
    FILE *map = fopen(path, "w");
    if (!map) return 2;
    fprintf(map, "%lx %zx jitted_spin\n", (unsigned long)mem, sizeof code);
    fclose(map);
    void (*spin)(unsigned long) = (void (*)(unsigned long))mem;
    for (;;) spin(100000000UL);
}
"#;

#[test]
fn jit_frames_resolve_through_the_perf_map() {
    needs_root!();
    if !cfg!(target_arch = "x86_64") {
        eprintln!("skipping: the JIT workload carries x86-64 machine code");
        return;
    }
    let dir = tempdir();
    let bin = compile(
        dir.path(),
        "jit",
        JIT,
        false,
        &["-O0", "-fno-omit-frame-pointer"],
    );
    let target = Workload::spawn_command(Command::new(&bin));
    settle();
    let map = PathBuf::from(format!("/tmp/perf-{}.map", target.pid()));
    let (p, _, _) = profile(&target.pid().to_string(), &[], "1s");
    let _ = std::fs::remove_file(&map);
    assert!(
        p.count_user_leaf("jitted_spin") as f64 >= 0.9 * p.total() as f64,
        "{}",
        p.top(5)
    );
}

/// Finds the pid of a process named `comm` that lives in a child pid namespace.
fn find_namespaced(comm: &str) -> Option<(u32, u32)> {
    for pid in all_pids() {
        let Some(status) = proc_status(pid) else {
            continue;
        };
        if status.name == comm && status.nspid.len() == 2 {
            return Some((pid, status.nspid[1]));
        }
    }
    None
}

#[test]
fn binaries_only_visible_in_another_mount_namespace_resolve() {
    needs_root!();
    let dir = tempdir();
    let bin = compile(
        dir.path(),
        "hidden_hot",
        PLAIN.replace("debuglink_work", "hidden_work").as_str(),
        false,
        &["-O0", "-g", "-fno-omit-frame-pointer"],
    );
    let mountpoint = dir.path().join("private");
    std::fs::create_dir(&mountpoint).unwrap();
    // Inside new pid and mount namespaces, a tmpfs hides the copy of the binary from the host.
    let script = format!(
        "mount -t tmpfs none {m} && cp {b} {m}/hidden_hot && exec {m}/hidden_hot",
        m = mountpoint.display(),
        b = bin.display()
    );
    let mut cmd = Command::new("unshare");
    cmd.args([
        "--mount",
        "--pid",
        "--fork",
        "--mount-proc",
        "sh",
        "-c",
        &script,
    ]);
    let _ns = Workload::spawn_command(cmd);
    let (pid, ns_pid) = poll_until(Duration::from_secs(5), || find_namespaced("hidden_hot"))
        .expect("hidden_hot did not start in its namespaces");
    assert!(
        !mountpoint.join("hidden_hot").exists(),
        "the host can see the binary: the test would prove nothing"
    );
    // Killing unshare would orphan the namespace's init: kill it by pid when done.
    struct KillOnDrop(u32);
    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            // SAFETY: kill(2) on a pid this test started.
            unsafe { libc::kill(self.0 as libc::pid_t, libc::SIGKILL) };
        }
    }
    let _guard = KillOnDrop(pid);
    let spec = format!("{}:{ns_pid}", pid_ns_inode(pid));
    let (p, _, _) = profile(&spec, &[], "1s");
    assert!(
        p.count_user_leaf("hidden_work") as f64 >= 0.9 * p.total() as f64,
        "{}",
        p.top(5)
    );
}

#[test]
fn a_target_whose_binary_is_deleted_and_that_exits_is_still_symbolized() {
    needs_root!();
    let dir = tempdir();
    let bin = dir.path().join("shortlived");
    std::fs::copy(workload_path("shortlived"), &bin).unwrap();
    // A thread of this test process forking while the copy's write fd was open holds that fd
    // until it execs, and exec of the copy fails with ETXTBSY meanwhile: wait it out.
    let ready = poll_until(Duration::from_secs(5), || {
        match Command::new(&bin).arg("0").status() {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) => None,
            other => Some(other),
        }
    });
    assert!(
        matches!(ready, Some(Ok(_))),
        "cannot run the copy: {ready:?}"
    );
    let mut cmd = Command::new(&bin);
    cmd.arg("2");
    let target = Workload::spawn_command(cmd);
    std::thread::sleep(Duration::from_millis(100));
    // Profiling starts while the target lives; the file is gone before the run ends and the
    // process exits during it, so only what bpfprof captured while it lived can name frames.
    let pid = target.pid().to_string();
    let bin_for_delete = bin.clone();
    let deleter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(700));
        std::fs::remove_file(&bin_for_delete).unwrap();
    });
    let (p, summary, run) = profile(&pid, &[], "10s");
    deleter.join().unwrap();
    run.assert_code(7);
    assert_eq!(summary.exit(), "target_exited");
    assert!(
        p.count_containing("short_work") as f64 >= 0.9 * p.total() as f64,
        "{}",
        p.top(5)
    );
}

#[test]
fn per_thread_stacks_sit_under_their_thread() {
    needs_root!();
    let target = Workload::spawn("multithread", &["30"]);
    settle();
    let (p, _, _) = profile(&target.pid().to_string(), &["--per-thread"], "1s");
    let thread_of = |work: &str| -> Vec<String> {
        let mut threads: Vec<String> = p
            .stacks
            .keys()
            .filter(|f| f.iter().any(|x| x == work))
            .map(|f| f[1].clone())
            .collect();
        threads.sort();
        threads.dedup();
        threads
    };
    let (a, b) = (thread_of("thread_a_work"), thread_of("thread_b_work"));
    assert_eq!(a.len(), 1, "thread_a_work under {a:?}\n{}", p.top(5));
    assert_eq!(b.len(), 1, "thread_b_work under {b:?}\n{}", p.top(5));
    assert_ne!(a, b);
    assert!(a[0].contains("tid "), "{a:?}");
}
