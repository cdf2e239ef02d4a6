//! End to end: `bpfprof dump` says why each stack ends, in the JSON (`unwind_end`: its
//! `reason`, with the address and object concerned) and in the text (`[stack ends: ...]`). A C
//! program whose main thread waits in `pthread_join` (its stack reaches `_start`: the entry)
//! and whose other thread runs code it wrote into anonymous memory, as a JIT does (its stack
//! ends at once: the pc is in no mapped file, at the address the program reports). Needs
//! root (ptrace).

use std::{process::Command, time::Duration};

use bpfprof_tests::*;
use serde_json::Value;

const DUMP_TIMEOUT: Duration = Duration::from_secs(60);
const SETTLE_TIMEOUT: Duration = Duration::from_secs(60);

/// The main thread joins the `jitted` one, which writes `jmp .` into an anonymous executable
/// page, writes the page's address into the file named by argv[1], and runs it.
const JIT: &str = r#"
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <sys/mman.h>

static const char *out;

static void *jitted(void *arg) {
    (void)arg;
    pthread_setname_np(pthread_self(), "jitted");
    unsigned char *code = mmap(0, 4096, PROT_READ | PROT_WRITE | PROT_EXEC,
                               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    code[0] = 0xeb; /* jmp . */
    code[1] = 0xfe;
    FILE *f = fopen(out, "w");
    fprintf(f, "%lx\n", (unsigned long)code);
    fclose(f);
    ((void (*)(void))code)();
    return 0;
}

int main(int argc, char **argv) {
    pthread_t t;
    (void)argc;
    out = argv[1];
    pthread_create(&t, 0, jitted, 0);
    pthread_join(t, 0);
    return 0;
}
"#;

#[test]
fn dump_says_why_each_stack_ends() {
    needs_root!();
    let dir = tempdir();
    let source = dir.path().join("jit.c");
    std::fs::write(&source, JIT).unwrap();
    let bin = dir.path().join("jit");
    let built = Command::new("cc")
        .args(["-O1", "-g", "-pthread", "-o"])
        .arg(&bin)
        .arg(&source)
        .status()
        .expect("run cc");
    assert!(built.success(), "cc failed");
    let address_file = dir.path().join("code-address");
    let mut cmd = Command::new(&bin);
    cmd.arg(&address_file);
    let target = Workload::spawn_command(cmd);
    let code = poll_until(SETTLE_TIMEOUT, || {
        let text = std::fs::read_to_string(&address_file).ok()?;
        u64::from_str_radix(text.trim(), 16).ok()
    })
    .expect("the program wrote its code's address");
    let pid = target.pid().to_string();
    let run = run_bpfprof(["dump", "--pid", &pid, "--json"], DUMP_TIMEOUT);
    run.assert_code(exit::OK);
    let dump: Value = serde_json::from_str(&run.stdout)
        .unwrap_or_else(|e| panic!("--json wrote no JSON ({e}):\n{}", run.stdout));
    let named = |name: &str| -> &Value {
        dump["threads"]
            .as_array()
            .and_then(|t| t.iter().find(|t| t["name"] == name))
            .unwrap_or_else(|| panic!("no thread {name}: {dump:#}"))
    };
    let mut checks = Checks::new();
    // The main thread waits in pthread_join: its walk reaches the program's entry.
    let main = named("jit");
    let frames: Vec<&str> = main["frames"]
        .as_array()
        .map(|f| f.iter().filter_map(|f| f["name"].as_str()).collect())
        .unwrap_or_default();
    checks.check(main["unwind_end"]["reason"] == "entry", || {
        format!("main thread: {} (frames {frames:?})", main["unwind_end"])
    });
    checks.check(frames.last() == Some(&"_start"), || {
        format!("main thread's outermost frame: {frames:?}")
    });
    // The JIT thread runs in anonymous memory: its walk ends there, at its pc, which is the
    // code's address (`jmp .` jumps to itself).
    let jitted = named("jitted");
    let end = &jitted["unwind_end"];
    checks.check(end["reason"] == "no_object", || {
        format!("jitted thread: {end} (wanted no_object)")
    });
    let at = end["address"]
        .as_str()
        .and_then(|a| u64::from_str_radix(a.trim_start_matches("0x"), 16).ok());
    checks.check(at == Some(code), || {
        format!("jitted thread ends at {at:x?}, its code is at {code:#x}")
    });
    checks.check(jitted["unwind"] == "early", || {
        format!("jitted thread: unwind {}", jitted["unwind"])
    });
    // The text says the same under each stack.
    let text = run_bpfprof(["dump", "--pid", &pid], DUMP_TIMEOUT);
    text.assert_code(exit::OK);
    checks.check(
        text.stdout
            .contains("[stack ends: reached the thread's entry]"),
        || format!("no entry reached in the text:\n{}", text.stdout),
    );
    checks.check(
        text.stdout
            .contains(&format!("[stack ends: {code:#x} is in no mapped file")),
        || format!("no JIT end in the text:\n{}", text.stdout),
    );
    drop(target);
    checks.finish();
}
