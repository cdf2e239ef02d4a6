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
    exit, large_library::large_library, require_root, run_bpfprof, tempdir, Checks, Daemon,
    Profile, Summary, Workload,
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
    if !require_root() {
        return;
    }
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
    if !require_root() {
        return;
    }
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
    if !require_root() {
        return;
    }
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
