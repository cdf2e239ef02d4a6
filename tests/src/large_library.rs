//! A generated shared object of the size of PyTorch's libtorch_cpu.so (430 MB) with CFI like a
//! compiler's, for tests of unwind tables that are large to build and to hold.

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use crate::workspace_root;

/// Functions of the generated library, and their body size: 100 000 × 4 KiB, the size of
/// PyTorch's libtorch_cpu.so (the bench's `large-cfi.so`, `xtask/src/bench/unwind.rs`).
pub const FUNCTIONS: usize = 100_000;
pub const BODY_BYTES: usize = 4096;
/// The frameless functions push and pop every this many bytes (a CFA change, so a row).
pub const CHUNK_BYTES: usize = 256;
/// The generator of `xtask/src/bench/unwind.rs` (`generate_large_asm`), plus `lib_work`, the
/// loop the `nofp_dlopen` workload calls.
fn large_asm() -> String {
    use std::fmt::Write as _;
    let mut frameless_body = String::new();
    for _ in 0..BODY_BYTES / CHUNK_BYTES {
        let _ = writeln!(
            frameless_body,
            "\tpushq %rax\n\t.cfi_adjust_cfa_offset 8\n\t.skip {}, 0x90\n\tpopq %rax\n\t.cfi_adjust_cfa_offset -8",
            CHUNK_BYTES - 2
        );
    }
    let mut s = String::with_capacity(FUNCTIONS * 420);
    s.push_str("\t.text\n");
    s.push_str(
        "\t.globl lib_work\n\t.type lib_work, @function\n\t.p2align 4\nlib_work:\n\t.cfi_startproc\n\
         1:\n\tdecq %rdi\n\tjnz 1b\n\tret\n\t.cfi_endproc\n\t.size lib_work, .-lib_work\n",
    );
    for i in 0..FUNCTIONS {
        let _ = writeln!(
            s,
            "\t.globl f{i}\n\t.type f{i}, @function\n\t.p2align 4\nf{i}:\n\t.cfi_startproc"
        );
        match i % 4 {
            0 => {
                s.push_str("\tpushq %rbp\n\t.cfi_def_cfa_offset 16\n\t.cfi_offset %rbp, -16\n\tmovq %rsp, %rbp\n\t.cfi_def_cfa_register %rbp\n\tpushq %rbx\n\t.cfi_offset %rbx, -24\n");
                let _ = writeln!(s, "\t.skip {BODY_BYTES}, 0x90");
                s.push_str("\tpopq %rbx\n\tpopq %rbp\n\t.cfi_def_cfa %rsp, 8\n\tret\n");
            }
            1 => {
                let frame = 24 + 16 * (i % 7);
                let _ = writeln!(
                    s,
                    "\tsubq ${frame}, %rsp\n\t.cfi_def_cfa_offset {}",
                    frame + 8
                );
                s.push_str(&frameless_body);
                let _ = writeln!(s, "\taddq ${frame}, %rsp\n\t.cfi_def_cfa_offset 8\n\tret");
            }
            2 => {
                s.push_str("\tpushq %r15\n\t.cfi_def_cfa_offset 16\n\t.cfi_offset %r15, -16\n\tpushq %r14\n\t.cfi_def_cfa_offset 24\n\t.cfi_offset %r14, -24\n\tpushq %rbx\n\t.cfi_def_cfa_offset 32\n\t.cfi_offset %rbx, -32\n");
                s.push_str(&frameless_body);
                s.push_str("\tpopq %rbx\n\t.cfi_def_cfa_offset 24\n\tpopq %r14\n\t.cfi_def_cfa_offset 16\n\tpopq %r15\n\t.cfi_def_cfa_offset 8\n\tret\n");
            }
            _ => {
                let _ = writeln!(s, "\t.skip {BODY_BYTES}, 0x90\n\tret");
            }
        }
        let _ = writeln!(s, "\t.cfi_endproc\n\t.size f{i}, .-f{i}");
    }
    s.push_str("\t.section .note.GNU-stack,\"\",@progbits\n");
    s
}

/// The generated library, built once (about 15 s) and cached under `target/large-library/`
/// while the generator's parameters stay the same. Readable by everyone: the daemon opens it
/// through the target's `/proc/PID/map_files`.
pub fn large_library() -> PathBuf {
    let dir = workspace_root().join("target/large-library");
    std::fs::create_dir_all(&dir).unwrap();
    let so = dir.join("liblarge-cfi.so");
    let stamp = dir.join("liblarge-cfi.stamp");
    let params = format!("{FUNCTIONS} {BODY_BYTES} {CHUNK_BYTES} lib_work v1");
    if so.exists() && std::fs::read_to_string(&stamp).ok().as_deref() == Some(params.as_str()) {
        return so;
    }
    let started = Instant::now();
    // Test binaries run concurrently: each writes its own files, then renames.
    let asm = dir.join(format!("large-cfi.{}.s", std::process::id()));
    let tmp = dir.join(format!("liblarge-cfi.{}.so", std::process::id()));
    std::fs::write(&asm, large_asm()).unwrap();
    let out = Command::new("gcc")
        .args(["-shared", "-nostdlib", "-Wl,--eh-frame-hdr", "-o"])
        .arg(&tmp)
        .arg(&asm)
        .output()
        .expect("running gcc");
    let _ = std::fs::remove_file(&asm);
    crate::assert_ok(&out, "assembling the large library");
    std::fs::rename(&tmp, &so).unwrap();
    std::fs::write(&stamp, params).unwrap();
    eprintln!(
        "generated {} ({} MB) in {:.1}s",
        so.display(),
        std::fs::metadata(&so).unwrap().len() >> 20,
        started.elapsed().as_secs_f64()
    );
    so
}
