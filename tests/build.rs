//! Compiles the C workload programs in `workloads/` with the system C compiler
//! and exports their paths as `WORKLOAD_<NAME>` (e.g. `WORKLOAD_HOTCOLD`).
//!
//! Flags: `-O0` plus frame pointers everywhere. Debian's gcc 12 drops the frame
//! pointer of leaf functions at -O1/-O2 even with `-mno-omit-leaf-frame-pointer`,
//! which would hide a leaf's caller from a frame-pointer unwinder; the workloads
//! also keep their burn loops inside the leaf functions for the same reason.
//!
//! Workloads named `nofp*` are built as distributions build most software, `-O2
//! -fomit-frame-pointer`: their stacks unwind only through CFI (`.eh_frame`). Those ending in
//! `_ibt` are also built for Intel IBT (`-fcf-protection=full`, PLT stubs in `.plt.sec`), as
//! Ubuntu and Fedora build. Those named `lib*` are shared libraries (`libNAME.so`, without
//! frame pointers), for workloads that `dlopen` them.
//!
//! Rust workloads (`*.rs`) are built twice with `rustc -C opt-level=3 -g`: `NAME_nofp` with
//! `-C force-frame-pointers=no` (a release build's default) and `NAME_fp` with `=yes`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::{env, fs};

fn main() {
    let manifest_dir =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));
    let src_dir = manifest_dir.join("workloads");
    let cc = env::var("WORKLOAD_CC").unwrap_or_else(|_| "cc".to_string());

    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed={}", src_dir.display());
    println!("cargo:rerun-if-env-changed=WORKLOAD_CC");

    let mut sources: Vec<PathBuf> = fs::read_dir(&src_dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", src_dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|ext| ext == "c" || ext == "rs"))
        .collect();
    sources.sort();
    let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".to_string());

    for src in &sources {
        println!("cargo:rerun-if-changed={}", src.display());
        let name = src
            .file_stem()
            .and_then(|s| s.to_str())
            .expect("UTF-8 workload name");
        if src.extension().is_some_and(|ext| ext == "rs") {
            for (variant, frame_pointers) in [("nofp", "no"), ("fp", "yes")] {
                let out = out_dir.join(format!("{name}_{variant}"));
                compile_rust(&rustc, frame_pointers, src, &out);
                println!(
                    "cargo:rustc-env=WORKLOAD_{}_{}={}",
                    name.to_ascii_uppercase(),
                    variant.to_ascii_uppercase(),
                    out.display()
                );
            }
            continue;
        }
        if name.starts_with("lib") {
            let out = out_dir.join(format!("{name}.so"));
            compile(
                &cc,
                &["-O2", "-g", "-fomit-frame-pointer", "-fPIC", "-shared"],
                src,
                &out,
            );
            println!(
                "cargo:rustc-env=WORKLOAD_{}={}",
                name.to_ascii_uppercase(),
                out.display()
            );
            continue;
        }
        let out = out_dir.join(name);
        let flags: &[&str] = if name.starts_with("nofp") && name.ends_with("_ibt") {
            &[
                "-O2",
                "-g",
                "-fomit-frame-pointer",
                "-fcf-protection=full",
                "-Wl,-z,ibtplt",
            ]
        } else if name.starts_with("nofp") {
            &["-O2", "-g", "-fomit-frame-pointer"]
        } else {
            &[
                "-O0",
                "-g",
                "-fno-omit-frame-pointer",
                "-mno-omit-leaf-frame-pointer",
            ]
        };
        compile(&cc, flags, src, &out);
        println!(
            "cargo:rustc-env=WORKLOAD_{}={}",
            name.to_ascii_uppercase(),
            out.display()
        );
    }
}

fn compile(cc: &str, flags: &[&str], src: &Path, out: &Path) {
    let status = Command::new(cc)
        .args(flags)
        .args(["-pthread", "-Wall", "-o"])
        .arg(out)
        .arg(src)
        .status()
        .unwrap_or_else(|e| {
            panic!("cannot run the C compiler `{cc}` (install gcc, or set WORKLOAD_CC): {e}")
        });
    assert!(
        status.success(),
        "`{cc}` failed to compile {} ({status})",
        src.display()
    );
}

fn compile_rust(rustc: &str, frame_pointers: &str, src: &Path, out: &Path) {
    let status = Command::new(rustc)
        .args(["--edition", "2021", "-C", "opt-level=3", "-g", "-C"])
        .arg(format!("force-frame-pointers={frame_pointers}"))
        .arg("-o")
        .arg(out)
        .arg(src)
        .status()
        .unwrap_or_else(|e| panic!("cannot run `{rustc}`: {e}"));
    assert!(
        status.success(),
        "`{rustc}` failed to compile {} ({status})",
        src.display()
    );
}
