//! Unwind tables that scale: a sampled library gets its table on demand, within the row
//! array's bound, and one whose table can never fit is decided once, not rebuilt on every
//! refresh (issue 21: a 20 MiB libtorch_cpu.so table rebuilt every 500 ms froze the daemon).
//!
//! The target is `nofp_dlopen` with a generated 430 MB library (`large_library`), whose
//! `lib_work` loop it calls from `call_lib` after a second.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use bpfprof_tests::{
    exit, large_library::large_library, needs_root, run_bpfprof, tempdir, Checks, Daemon, Profile,
    Summary, Workload,
};

/// Profiles `nofp_dlopen` on the large library for `duration` with `args`; returns the
/// profile, the summary and what bpfprof printed.
fn profile_large(duration: &str, args: &[&str]) -> (Profile, Summary, String) {
    let library = large_library();
    let dir = tempdir();
    let folded = dir.path().join("large.folded");
    let summary = dir.path().join("large.summary.json");
    let target = Workload::spawn("nofp_dlopen", &[library.to_str().unwrap(), "60"]);
    // The profile starts once the library is mapped: its table is then the target's to build.
    bpfprof_tests::poll_until(Duration::from_secs(30), || {
        std::fs::read_to_string(format!("/proc/{}/maps", target.pid()))
            .ok()
            .filter(|m| m.contains("liblarge-cfi.so"))
    })
    .expect("the workload maps the library");
    let pid = target.pid().to_string();
    let mut all = vec![
        "--pid",
        &pid,
        "-F",
        "499",
        "-d",
        duration,
        "-v",
        "-o",
        folded.to_str().unwrap(),
        "--summary-json",
        summary.to_str().unwrap(),
    ];
    all.extend_from_slice(args);
    let run = run_bpfprof(&all, Duration::from_secs(120));
    run.assert_code(exit::OK);
    (Profile::read(&folded), Summary::read(&summary), run.stderr)
}

/// The large library's entry in a summary's list of objects (null when it is not there).
fn the_library_in(objects: &serde_json::Value) -> serde_json::Value {
    objects
        .as_array()
        .and_then(|list| {
            list.iter().find(|o| {
                o["name"]
                    .as_str()
                    .is_some_and(|n| n.ends_with("liblarge-cfi.so"))
            })
        })
        .cloned()
        .unwrap_or_default()
}

/// Samples in `lib_work` whose stack reaches `main` through `call_lib`.
fn whole_lib_work(profile: &Profile) -> (u64, u64) {
    let in_lib = profile.count_containing("lib_work");
    let whole = profile.count_where(|frames| {
        let user = bpfprof_tests::user_frames(frames);
        user.ends_with(&["main", "call_lib", "lib_work"])
    });
    (in_lib, whole)
}

/// Through the daemon, whose kernel program keeps its tables between runs: the first runs on
/// the library's process build its table once it is sampled (on the build thread: half a
/// second in a release build, seconds in a debug one on a loaded machine), and from then on
/// every run has whole stacks through it.
#[test]
fn a_sampled_library_gets_its_table_on_demand() {
    needs_root!();
    use bpfprof::{client::ProfileOptions, protocol::RunState};
    let library = large_library();
    let daemon = Daemon::start(&[]);
    let target = Workload::spawn("nofp_dlopen", &[library.to_str().unwrap(), "120"]);
    // The first run starts once the library is mapped, so that its kernel program's row array
    // is sized for it and kept (with the table) for the runs after it.
    bpfprof_tests::poll_until(Duration::from_secs(30), || {
        std::fs::read_to_string(format!("/proc/{}/maps", target.pid()))
            .ok()
            .filter(|m| m.contains("liblarge-cfi.so"))
    })
    .expect("the workload maps the library");
    let mut client = daemon.client();
    let mut run = |seconds: u64| {
        let request = ProfileOptions {
            frequency: Some(499),
            max_profile_duration: Duration::from_secs(seconds),
            ..ProfileOptions::default()
        }
        .run_request(target.pid(), None);
        let id = client.run(request).unwrap().run_id.unwrap();
        let reply = client.results(id, Duration::from_secs(120)).unwrap();
        assert_eq!(reply.state, Some(RunState::Success), "{reply:?}");
        let profile = Profile::read(Path::new(&reply.files.as_ref().unwrap()["folded"]));
        (profile, reply.summary.unwrap_or_default())
    };
    // Runs of 3 s until one ends with the library's table built (or a minute passes).
    let started = Instant::now();
    let mut built = None;
    while built.is_none() && started.elapsed() < Duration::from_secs(60) {
        let (profile, summary) = run(3);
        let untabled = summary["objects_without_unwind_tables"].to_string();
        if whole_lib_work(&profile).0 > 0 && !untabled.contains("liblarge-cfi.so") {
            built = Some(summary);
        }
    }
    let mut c = Checks::new();
    let Some(summary) = built else {
        c.check(false, || {
            "no run ended with the library's table built in 60 s".into()
        });
        return c.finish();
    };
    let rows = summary["cost"]["unwind_rows_built"].as_u64().unwrap_or(0);
    c.check(rows >= 1_000_000, || {
        format!("{rows} rows built: the library's table was not among them")
    });
    // The next run starts with the table resident: whole stacks from its first sample.
    let (profile, _) = run(3);
    let (in_lib, whole) = whole_lib_work(&profile);
    c.check(in_lib >= 300, || {
        format!("only {in_lib} samples in lib_work")
    });
    c.check(whole as f64 >= 0.97 * in_lib as f64, || {
        format!(
            "{whole} of {in_lib} samples in lib_work reach main through call_lib:\n{}",
            profile.top(10)
        )
    });
    c.finish();
}

#[test]
fn a_table_that_cannot_fit_is_decided_once_and_named() {
    needs_root!();
    // 4 MiB of rows: the library's table (about 17 MiB) can never fit.
    let (profile, summary, stderr) = profile_large("4s", &["--unwind-table-mib", "4"]);
    let mut c = Checks::new();
    let (in_lib, _) = whole_lib_work(&profile);
    c.check(in_lib >= 200, || {
        format!("only {in_lib} samples in lib_work")
    });
    let objects = summary.field("objects_without_unwind_tables");
    let entry = the_library_in(objects);
    c.check(entry["samples"].as_u64().unwrap_or(0) > 0, || {
        format!("the summary does not name the library with its samples: {objects}")
    });
    c.check(
        entry["why"]
            .as_str()
            .is_some_and(|w| w.contains("larger than the unwind row array")),
        || format!("the reason given: {entry}"),
    );
    // Refused from its estimated size, never built: no rebuild loop, and no time spent.
    let rows = summary.field("cost")["unwind_rows_built"]
        .as_u64()
        .unwrap_or(u64::MAX);
    c.check(rows < 1_000_000, || {
        format!("{rows} rows built: the library's table was built although it cannot fit")
    });
    let warnings = stderr
        .matches("liblarge-cfi.so unwinds by frame pointer")
        .count();
    c.eq("warnings naming the library (by its path)", warnings, 1);
    c.check(!stderr.contains("/map_files/"), || {
        format!("a message names a map_files entry instead of the library:\n{stderr}")
    });
    // Every sample in lib_work was walked through the library without its table, and the
    // kernel counts each such stack.
    let through = summary.field("unwind")["stacks_through_untabled"]
        .as_u64()
        .unwrap_or(0);
    c.check(through >= in_lib, || {
        format!("{through} stacks counted as walked without a table, {in_lib} in lib_work")
    });
    c.check(
        stderr.contains("stacks had frames that no unwind table covered")
            && stderr.contains("without a table: "),
        || format!("the text summary does not count and name them:\n{stderr}"),
    );
    c.finish();
}

/// With the defaults the library's table is built once a sample runs in it, during the run:
/// the stacks walked before it went in are counted by the kernel, and the summary names the
/// library among the tables loaded during the run (issue 21, item 5).
#[test]
fn a_table_built_during_the_run_is_named_and_the_stacks_before_it_counted() {
    needs_root!();
    let (profile, summary, stderr) = profile_large("4s", &[]);
    let mut c = Checks::new();
    let (in_lib, whole) = whole_lib_work(&profile);
    c.check(in_lib >= 200, || {
        format!("only {in_lib} samples in lib_work")
    });
    let late = summary.field("unwind_tables_loaded_late");
    let entry = the_library_in(late);
    let after = entry["after_secs"].as_f64().unwrap_or(-1.0);
    c.check(after >= 0.0, || {
        format!("the library is not named as loaded during the run: {late}")
    });
    // The first samples in lib_work came before its table: walked by frame pointer or a
    // scan, they are the stacks that do not reach main whole, and the kernel counted them.
    let through = summary.field("unwind")["stacks_through_untabled"]
        .as_u64()
        .unwrap_or(0);
    c.check(through >= 1 && through >= in_lib - whole, || {
        format!(
            "{through} stacks counted as walked without a table; {} of {in_lib} samples in \
             lib_work do not reach main whole",
            in_lib - whole
        )
    });
    c.check(stderr.contains("tables loaded during the run: "), || {
        format!("the text summary does not name the table loaded late:\n{stderr}")
    });
    eprintln!(
        "table in after {after:.2} s; {through} stacks without a table; lib_work {in_lib}, \
         whole {whole}"
    );
    c.finish();
}

/// A program without frame pointers whose hot leaf runs under `main` → `CHAIN` for a second
/// and a half of its own CPU time (as many samples on a loaded machine, over a longer run);
/// `PAD` bytes of code ahead of the chain move every function.
const REBUILT_SOURCE: &str = r#"
#include <time.h>
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}
__attribute__((noinline)) void pad(volatile long *x) { PAD }
__attribute__((noinline)) long hot_leaf(long n) {
    long acc = 0;
    for (long i = 0; i < n; i++) acc = acc * 31 + i;
    return acc;
}
__attribute__((noinline)) long CHAIN(double until) {
    volatile long sink = 0;
    while (now() < until) sink += hot_leaf(200000);
    return sink;
}
int main(void) {
    volatile long x = 0;
    pad(&x);
    return (int)(CHAIN(now() + 1.5) & 1);
}
"#;

/// Builds `REBUILT_SOURCE` at `path` with `chain` as the middle function and `pads`
/// increments of padding, without frame pointers.
fn build_rebuilt(dir: &Path, chain: &str, pads: usize) -> std::path::PathBuf {
    let source = REBUILT_SOURCE
        .replace("CHAIN", chain)
        .replace("PAD", &"*x += 1; ".repeat(pads));
    bpfprof_tests::hostile::compile(
        dir,
        "rebuilt",
        "c",
        &source,
        &[
            "-O2",
            "-g",
            "-fomit-frame-pointer",
            "-fno-optimize-sibling-calls",
            "-fno-inline",
        ],
    )
}

/// Profiles `program` with `--unwind cfi` and the table cache in `cache`: the profile and
/// the summary.
fn profile_cached(program: &Path, cache: &Path, dir: &Path) -> (Profile, Summary) {
    let folded = dir.join("rebuilt.folded");
    let summary = dir.join("rebuilt.summary.json");
    let run = run_bpfprof(
        [
            "-F",
            "499",
            "--unwind",
            "cfi",
            "--unwind-cache",
            cache.to_str().unwrap(),
            "-o",
            folded.to_str().unwrap(),
            "--summary-json",
            summary.to_str().unwrap(),
            "--",
            program.to_str().unwrap(),
        ],
        Duration::from_secs(120),
    );
    run.assert_code(exit::OK);
    (Profile::read(&folded), Summary::read(&summary))
}

/// Issue 28: tables kept on disk between runs are read back by the next run, and a binary
/// rebuilt at the same path (same name, new code and unwind information) never gets the old
/// one: its stacks through the new chain are whole, and nothing of the old chain appears.
#[test]
fn a_rebuilt_binary_at_the_same_path_never_gets_its_old_cached_table() {
    needs_root!();
    let dir = tempdir();
    let cache = dir.path().join("cache");
    let whole = |profile: &Profile, chain: &str| {
        profile.count_where(|frames| {
            bpfprof_tests::user_frames(frames).ends_with(&["main", chain, "hot_leaf"])
        })
    };
    let cost = |summary: &Summary, key: &str| summary.field("cost")[key].as_u64().unwrap_or(0);
    let mut c = Checks::new();

    let program = build_rebuilt(dir.path(), "chain_before", 0);
    let (first, first_summary) = profile_cached(&program, &cache, dir.path());
    let (second, second_summary) = profile_cached(&program, &cache, dir.path());
    // The same binary again: its tables (and libc's) come from the cache.
    c.check(cost(&first_summary, "unwind_tables_cached") == 0, || {
        format!(
            "an empty cache served tables: {}",
            first_summary.field("cost")
        )
    });
    c.check(cost(&second_summary, "unwind_tables_cached") >= 2, || {
        format!(
            "the second run built its tables again: {}",
            second_summary.field("cost")
        )
    });
    // A launched command starts once the CFI walker is verified: no stack of it is walked by
    // frame pointer (which this binary has not) for want of the walker.
    let early = |summary: &Summary| {
        summary.field("unwind")["before_walker_ready"]
            .as_u64()
            .unwrap_or(0)
    };
    for (run, profile, summary) in [
        ("first", &first, &first_summary),
        ("second", &second, &second_summary),
    ] {
        c.check(early(summary) == 0, || {
            format!(
                "{run} run: {} stacks were taken before the walker was ready",
                early(summary)
            )
        });
        let hot = profile.count_containing("hot_leaf");
        let w = whole(profile, "chain_before");
        let walked = hot.saturating_sub(early(summary));
        c.check(hot >= 100 && w * 100 >= walked * 95, || {
            format!(
                "{run} run: {w} of {hot} hot_leaf stacks ({walked} after the walker was ready) \
                 reach main through chain_before"
            )
        });
    }
    let entries = std::fs::read_dir(&cache).unwrap().count();

    // Rebuilt at the same path: new function names, every address moved by the padding.
    let rebuilt = build_rebuilt(dir.path(), "chain_after", 3000);
    assert_eq!(rebuilt, program);
    let (third, third_summary) = profile_cached(&rebuilt, &cache, dir.path());
    let hot = third.count_containing("hot_leaf");
    let w = whole(&third, "chain_after");
    let walked = hot.saturating_sub(early(&third_summary));
    c.check(hot >= 100 && w * 100 >= walked * 95, || {
        format!(
            "after the rebuild: {w} of {hot} hot_leaf stacks ({walked} after the walker was \
             ready) reach main through chain_after"
        )
    });
    c.check(third.count_containing("chain_before") == 0, || {
        "the old binary's function appears after the rebuild".into()
    });
    // libc came from the cache, the rebuilt program's table was built and filed anew.
    let (built, cached) = (
        cost(&third_summary, "unwind_tables_built"),
        cost(&third_summary, "unwind_tables_cached"),
    );
    c.check(cached >= 1 && cached < built, || {
        format!("after the rebuild {cached} of {built} tables came from the cache")
    });
    let now = std::fs::read_dir(&cache).unwrap().count();
    c.check(now == entries + 1, || {
        format!("the cache held {entries} entries, {now} after the rebuild's run")
    });

    // `bpfprof doctor` reports what the cache holds, and `--clean` empties it.
    let cache_arg = cache.to_str().unwrap();
    let report = run_bpfprof(
        ["doctor", "--json", "--unwind-cache", cache_arg],
        Duration::from_secs(60),
    );
    // The tables and the kernel's names, filed by the first run.
    c.check(report.stdout.contains(&format!("{now} entries")), || {
        format!(
            "doctor does not report the {now} entries:\n{}",
            report.stdout
        )
    });
    let cleaned = run_bpfprof(
        ["doctor", "--clean", "--unwind-cache", cache_arg],
        Duration::from_secs(60),
    );
    c.check(
        cleaned.stderr.contains(&format!("removed {now} entries")) && !cache.exists(),
        || {
            format!(
                "doctor --clean left {}:\n{}",
                cache.display(),
                cleaned.stderr
            )
        },
    );
    c.finish();
}
