//! The agent pays per sample, not per process (issue 46): it re-reads a process's maps when a
//! sample runs outside them and lists a CPython's threads when a sample names one not listed,
//! instead of doing both for every process on a timer. Nothing it has not re-read may name a
//! frame wrongly: a library loaded mid-window, and a Python thread started mid-window, are
//! named in the windows that sampled them.
//!
//! Each test runs an agent over the whole machine, so the binary runs them one at a time.

use std::{process::Command, sync::Mutex, time::Duration};

use bpfprof_tests::{
    agent::{free_port, go_pprof_url, start_agent, RawSample},
    hostile::compile,
    needs_root, poll_until, tempdir, Workload,
};

/// One agent at a time: each samples every process, those of the others included.
static MACHINE: Mutex<()> = Mutex::new(());

/// How long the workloads run before they change (load a library, start a thread): well past
/// a new process's youth (2 s, when it is re-read every few ticks), so that only the agent's
/// sample-driven re-reads can find the change.
const SETTLED_SECS: u64 = 8;

fn lock() -> std::sync::MutexGuard<'static, ()> {
    MACHINE.lock().unwrap_or_else(|e| e.into_inner())
}

/// The samples of `pid` and how many of them have a frame named `name`.
fn share_named(samples: &[RawSample], pid: u32, name: &str) -> (u64, u64) {
    let pid = pid.to_string();
    let mine: Vec<&RawSample> = samples
        .iter()
        .filter(|s| s.labels.get("pid") == Some(&pid))
        .collect();
    let total = mine.iter().map(|s| s.count).sum();
    let named = mine
        .iter()
        .filter(|s| s.frames.iter().any(|f| f == name))
        .map(|s| s.count)
        .sum();
    (total, named)
}

/// A program that sleeps, then `dlopen`s a library and spins in it: the agent, which read its
/// maps long before, names the library's function in the windows after the load.
#[test]
fn a_library_loaded_mid_window_is_named() {
    needs_root!();
    let _machine = lock();
    let dir = tempdir();
    let library = compile(
        dir.path(),
        "libcostlate.so",
        "c",
        "volatile unsigned long cost_late_sink;\n\
         __attribute__((noinline)) void cost_late_library_spin(void) {\n\
             for (;;) cost_late_sink++;\n\
         }\n",
        &["-O1", "-shared", "-fPIC"],
    );
    let main = compile(
        dir.path(),
        "late_dlopen",
        "c",
        "#include <dlfcn.h>\n#include <stdlib.h>\n#include <unistd.h>\n\
         int main(int argc, char **argv) {\n\
             sleep(atoi(argv[2]));\n\
             void *lib = dlopen(argv[1], RTLD_NOW);\n\
             if (!lib) return 2;\n\
             void (*spin)(void) = (void (*)(void))dlsym(lib, \"cost_late_library_spin\");\n\
             if (!spin) return 3;\n\
             spin();\n\
             return 0;\n\
         }\n",
        &["-O1", "-ldl"],
    );
    let port = free_port();
    let mut cmd = Command::new(&main);
    cmd.args([library.to_str().unwrap(), &SETTLED_SECS.to_string()]);
    let target = Workload::spawn_command(cmd);
    let _agent = start_agent(port, &["-F", "199", "--window", "2s"], 1.0);
    poll_until(Duration::from_secs(SETTLED_SECS + 30), || {
        std::fs::read_to_string(format!("/proc/{}/maps", target.pid()))
            .ok()
            .filter(|m| m.contains("libcostlate.so"))
    })
    .expect("the workload loads its library");
    // The endpoint serves the windows of the last N seconds: those cut after the change.
    std::thread::sleep(Duration::from_secs(5));
    let url = format!("http://127.0.0.1:{port}/debug/pprof/profile?seconds=4");
    let Some(samples) = go_pprof_url(&url, dir.path()) else {
        return;
    };
    let (total, named) = share_named(&samples, target.pid(), "cost_late_library_spin");
    // It spins on one core from the load on: ~800 samples at 199 Hz in 4 s; the window that
    // saw the load is named after its maps are read again.
    assert!(total >= 100, "too few samples of the workload: {total}");
    assert!(
        named as f64 >= 0.7 * total as f64,
        "{named} of {total} samples name the library's function: {:?}",
        samples
            .iter()
            .filter(|s| s.labels.get("pid") == Some(&target.pid().to_string()))
            .take(10)
            .collect::<Vec<_>>()
    );
}

/// A CPython that sleeps, then starts a thread that runs Python code: the agent, which listed
/// its threads long before, walks and names the new thread's Python frames.
#[test]
fn a_python_thread_started_mid_window_is_named() {
    needs_root!();
    let _machine = lock();
    let dir = tempdir();
    let script = dir.path().join("late_thread.py");
    std::fs::write(
        &script,
        format!(
            "import threading, time\n\
             def cost_late_thread_work():\n\
             \x20   n = 0\n\
             \x20   while True:\n\
             \x20       n += 1\n\
             time.sleep({SETTLED_SECS})\n\
             t = threading.Thread(target=cost_late_thread_work, daemon=True)\n\
             t.start()\n\
             open('{}', 'w').close()\n\
             t.join()\n",
            dir.path().join("started").display()
        ),
    )
    .unwrap();
    let port = free_port();
    let mut cmd = Command::new("/usr/bin/python3");
    cmd.arg(&script);
    let target = Workload::spawn_command(cmd);
    let _agent = start_agent(port, &["-F", "199", "--window", "2s"], 1.0);
    poll_until(Duration::from_secs(SETTLED_SECS + 30), || {
        dir.path().join("started").exists().then_some(())
    })
    .expect("the workload starts its thread");
    // The endpoint serves the windows of the last N seconds: those cut after the change.
    std::thread::sleep(Duration::from_secs(5));
    let url = format!("http://127.0.0.1:{port}/debug/pprof/profile?seconds=4");
    let Some(samples) = go_pprof_url(&url, dir.path()) else {
        return;
    };
    let (total, named) = share_named(&samples, target.pid(), "cost_late_thread_work");
    // The main thread waits in join, off the CPU: the samples are the new thread's, and
    // only those of its first half second or so may predate its listing.
    assert!(total >= 100, "too few samples of the workload: {total}");
    assert!(
        named as f64 >= 0.7 * total as f64,
        "{named} of {total} samples name the thread's Python function: {:?}",
        samples
            .iter()
            .filter(|s| s.labels.get("pid") == Some(&target.pid().to_string()))
            .take(10)
            .collect::<Vec<_>>()
    );
}
