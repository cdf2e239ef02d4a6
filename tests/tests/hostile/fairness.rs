//! End to end: the root daemon's slow work for targets is shared fairly between users (issue
//! 23, "fair shares"). One user's objects, however many or costly to read, cannot keep another
//! user's unwind tables waiting: the build threads serve each owner's queue in turn, the
//! owner whose builds cost the least CPU first.
//!
//! Run by real non-root users (the attacker `bpfprof-t1`, the victim `bpfprof-t2`) against a
//! real root daemon. Needs root.

use std::os::unix::fs::PermissionsExt;

use bpfprof_tests::{
    hostile::{
        cli, compile, folded_of, results_of, run_id_of, shared_dir, start_as, wait_for_mapping,
    },
    *,
};

/// The attacker's objects: each this many FDEs, all sharing one CIE of this many initial
/// instructions, which the builder evaluates again for every FDE (as gimli does): 900 million
/// instructions, 3.5 s of the build thread's CPU measured (45 s of a loaded machine's wall
/// clock; the builder's budget per object is 5 s), from a 1 MB file, so smaller than libc and
/// served before it by size.
const COSTLY_FDES: usize = 30_000;
const COSTLY_CIE_INSTRUCTIONS: usize = 30_000;

/// How many such objects the attacker's process maps: seconds of the build thread's CPU each,
/// far longer in all than the victim's run.
const COSTLY_OBJECTS: usize = 6;

/// The victim's run: a few seconds, started while the attacker's builds queue.
const VICTIM_RUN_MS: u64 = 4000;

/// Share of the victim's samples whose stack must reach `_start`: its tables (its executable's
/// and libc's, which the attacker's process also maps and queued first) are built within the
/// first moments of its run; the rest of its samples, taken meanwhile, may stop short.
const WHOLE_SHARE: f64 = 0.8;

/// Assembly of a shared object whose call frame information costs the table builder the most
/// CPU per byte: one CIE with a long list of initial instructions, shared by many one-word
/// FDEs (each evaluation of an FDE starts with its CIE's instructions).
fn costly_cfi_asm(variant: usize) -> String {
    // Each variant's code is 16 bytes longer, which moves its `.eh_frame`: a table of its own
    // (the table cache files tables by their content, so byte-identical copies would share
    // one build).
    let code = COSTLY_FDES * 4 + variant * 16;
    format!(
        r#"
	.text
	.globl costly_spin
	.type costly_spin, @function
costly_spin:
1:	decq %rdi
	jnz 1b
	ret
	.size costly_spin, .-costly_spin
code_start:
	.skip {code}, 0x90
	.section .eh_frame,"a",@progbits
cie:
	.long cie_end - cie_id
cie_id:
	.long 0
	.byte 1
	.string "zR"
	.uleb128 1
	.sleb128 -8
	.uleb128 16
	.uleb128 1
	.byte 0x1b
	.byte 0x0c, 7, 8
	.byte 0x90, 1
	.rept {COSTLY_CIE_INSTRUCTIONS}
	.byte 0x0e, 8
	.endr
	.balign 8, 0
cie_end:
	.set i, 0
	.rept {COSTLY_FDES}
	.long 1f - 0f
0:	.long 0b - cie
	.long code_start + i*4 - .
	.long 4
	.uleb128 0
	.balign 8, 0
1:
	.set i, i+1
	.endr
	.long 0
	.section .note.GNU-stack,"",@progbits
"#
    )
}

/// The attacker's program: maps every object named on its command line, then runs in each
/// in turn (so that its run's summary says where each object's table stands).
const ATTACKER: &str = r#"
#include <dlfcn.h>
#include <stdio.h>
int main(int argc, char **argv) {
    void (*spin[64])(unsigned long);
    int n = 0;
    for (int i = 1; i < argc && n < 64; i++) {
        void *lib = dlopen(argv[i], RTLD_NOW);
        if (!lib || !(spin[n++] = (void (*)(unsigned long))dlsym(lib, "costly_spin"))) {
            fprintf(stderr, "%s\n", dlerror());
            return 1;
        }
    }
    for (;;)
        for (int i = 0; i < n; i++)
            spin[i](1000000);
}
"#;

/// The attacker's process maps six 1 MB objects, each with CFI of its own (copies of one would
/// share one build through the table cache), whose CFI costs the build thread seconds of
/// CPU each (about 20 s in all); the victim's `nofp` (no frame pointers: its stacks unwind only
/// by CFI) starts right after. Served in one queue by one thread, the victim's executable
/// waited for the attacker's build in progress and its libc behind every one of the
/// attacker's objects: none of its stacks got past `burn` for the whole run. Served in turns,
/// the victim's tables are built beside the attacker's builds, and its stacks reach `_start`
/// while the attacker's objects still queue.
#[test]
fn one_users_costly_objects_do_not_hold_up_another_users_tables() {
    needs_root!();
    let daemon = Daemon::start(&[]);
    let (_bin_dir, bin) = world_executable_bpfprof();
    let attacker = test_user("bpfprof-t1");
    let victim = test_user("bpfprof-t2");
    let dir = shared_dir();

    let objects: Vec<_> = (0..COSTLY_OBJECTS)
        .map(|i| {
            compile(
                dir.path(),
                &format!("costly{i}.so"),
                "s",
                &costly_cfi_asm(i),
                &["-shared", "-nostdlib", "-Wl,--eh-frame-hdr"],
            )
        })
        .collect();
    for object in &objects {
        std::os::unix::fs::chown(object, Some(attacker.uid), Some(attacker.gid)).unwrap();
        std::fs::set_permissions(object, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let program = compile(dir.path(), "churn", "c", ATTACKER, &["-O1"]);
    let mut cmd = attacker.command(&program);
    cmd.args(&objects);
    let attack = Workload::spawn_command(cmd);
    let last = objects
        .last()
        .unwrap()
        .file_name()
        .unwrap()
        .to_string_lossy();
    wait_for_mapping(attack.pid(), &last);

    // The attacker's run queues its objects' tables; it lasts past the victim's.
    let started = start_as(
        &attacker,
        &bin,
        &daemon,
        attack.pid(),
        VICTIM_RUN_MS + 6000,
        &["--formats", "folded"],
    );
    let attack_run = run_id_of(&started);

    let nofp = workload_as(&victim, dir.path(), "nofp", &["parents", "60"]);
    let victim_run = cli(
        &victim,
        &bin,
        &daemon,
        &[
            "run",
            "--pid",
            &nofp.pid().to_string(),
            "-F",
            "499",
            "--duration-ms",
            &VICTIM_RUN_MS.to_string(),
            "--formats",
            "folded",
            "--json",
        ],
    );
    let (attack_state, _, attack_summary) = results_of(&daemon, attack_run);

    let mut c = Checks::new();
    c.eq("the victim's run's exit code", victim_run.code(), 0);
    // The attack held: when the attacker's run ended, after the victim's, some of its
    // objects' tables were still queued.
    c.eq(
        "the attacker's run",
        attack_state,
        bpfprof::protocol::RunState::Success,
    );
    let untabled = attack_summary
        .field("objects_without_unwind_tables")
        .clone();
    let costly: Vec<String> = untabled
        .as_array()
        .into_iter()
        .flatten()
        .filter(|o| o["name"].as_str().is_some_and(|n| n.contains("costly")))
        .map(|o| o["why"].as_str().unwrap_or_default().to_string())
        .collect();
    c.check(
        costly.iter().any(|why| why.contains("still being built")),
        || format!("none of the attacker's objects was still queued at its run's end: {untabled}"),
    );
    if victim_run.code() == 0 {
        let reply: serde_json::Value = serde_json::from_str(victim_run.stdout.trim())
            .unwrap_or_else(|e| panic!("{e}: {}", victim_run.stdout));
        let profile = folded_of(&reply);
        let whole = profile.share_containing("_start");
        eprintln!(
            "victim: {} samples, {whole:.3} reach _start; attacker's objects: {costly:?}",
            profile.total()
        );
        c.check(profile.total() >= 100, || {
            format!("the victim's run took {} samples", profile.total())
        });
        c.check(whole >= WHOLE_SHARE, || {
            format!(
                "{whole:.3} of the victim's {} stacks reach _start (at least {WHOLE_SHARE}):\n{}",
                profile.total(),
                profile.top(10)
            )
        });
    }
    c.finish();
}
