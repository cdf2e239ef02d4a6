//! The Python package (`python/`) installed the way a user installs it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::env::workspace_root;
use crate::files::tempdir;

/// The Python package installed into a fresh venv (once per test process) the way a user
/// does it, `pip install ./python`, offline; returns its `strobeclient` console script.
pub fn python_console_script() -> &'static Path {
    static SCRIPT: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    &SCRIPT
        .get_or_init(|| {
            let dir = tempdir();
            std::fs::set_permissions(
                dir.path(),
                std::os::unix::fs::PermissionsExt::from_mode(0o755),
            )
            .unwrap();
            // A copy of the package, so that the build's scratch files stay out of the tree.
            let source = dir.path().join("python");
            let copied = Command::new("cp")
                .arg("-r")
                .arg(workspace_root().join("python"))
                .arg(&source)
                .status()
                .expect("cp");
            assert!(copied.success());
            let _ = std::fs::remove_dir_all(source.join("build"));
            // The system interpreter: one the test user can run (not one under /root).
            // --system-site-packages gives pip Debian's setuptools and wheel, so the
            // install needs no network.
            let venv = dir.path().join("venv");
            let made = Command::new("/usr/bin/python3")
                .args(["-m", "venv", "--system-site-packages"])
                .arg(&venv)
                .status()
                .expect("python3 -m venv");
            assert!(made.success(), "python3 -m venv failed");
            crate::output_ok(
                Command::new(venv.join("bin/pip"))
                    .args([
                        "install",
                        "--quiet",
                        "--no-index",
                        "--no-build-isolation",
                        "--no-deps",
                    ])
                    .arg(&source),
                "pip install ./python",
            );
            let script = venv.join("bin/strobeclient");
            assert!(script.is_file(), "pip installed no strobeclient script");
            (dir, script)
        })
        .1
}

/// py-spy (`cargo xtask setup` pip-installs it): on PATH, else where `python3` puts scripts.
pub fn py_spy() -> Option<PathBuf> {
    crate::env::find_tool("py-spy").or_else(|| {
        let out = Command::new("python3")
            .args([
                "-c",
                "import sysconfig; print(sysconfig.get_path('scripts'))",
            ])
            .output()
            .ok()?;
        let bin = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join("py-spy");
        bin.is_file().then_some(bin)
    })
}

/// The CPythons under test, each with a label naming it: pyenv's 3.10.13, 3.11.7, 3.12.1 and
/// 3.13.0 (built without frame pointers) and, `with_debian`, Debian's 3.11 (a stripped static
/// binary). One that is missing is skipped, and a failure under CI.
pub fn labelled_cpythons(with_debian: bool) -> Vec<(String, PathBuf)> {
    let pyenv =
        PathBuf::from(std::env::var("HOME").unwrap_or("/root".into())).join(".pyenv/versions");
    let mut all: Vec<(String, PathBuf)> = ["3.10.13", "3.11.7", "3.12.1", "3.13.0"]
        .iter()
        .map(|v| (format!("pyenv {v}"), pyenv.join(v).join("bin/python3")))
        .collect();
    if with_debian {
        all.push(("Debian 3.11".into(), PathBuf::from("/usr/bin/python3.11")));
    }
    all.into_iter()
        .filter(|(label, path)| {
            let present = path.exists();
            if !present {
                assert!(
                    !crate::ci(),
                    "{label} ({}) is needed under CI",
                    path.display()
                );
                eprintln!("skipping {label}: {} missing", path.display());
            }
            present
        })
        .collect()
}

/// Where `.PyRuntime` (which starts with `_Py_DebugOffsets`) and `Py_Version` are in the file
/// of the ELF executable `bytes`.
pub fn version_offsets(bytes: &[u8]) -> (usize, usize) {
    use object::{Object, ObjectSection, ObjectSymbol};
    let elf = object::File::parse(bytes).expect("an ELF file");
    let file_offset = |address: u64| -> usize {
        let section = elf
            .sections()
            .find(|s| (s.address()..s.address() + s.size()).contains(&address))
            .expect("a section holds it");
        let (start, _) = section.file_range().expect("in the file");
        (start + address - section.address()) as usize
    };
    let symbol = |name: &str| {
        elf.dynamic_symbols()
            .find(|s| s.name() == Ok(name))
            .unwrap_or_else(|| panic!("{name} in .dynsym"))
            .address()
    };
    (
        file_offset(symbol("_PyRuntime")),
        file_offset(symbol("Py_Version")),
    )
}

/// `source` (sid's 3.14) as a 3.16.0 (final) would be named, in `Py_Version` and in its debug offsets,
/// at `binary`; with `changed_shape`, its `_Py_DebugOffsets` also gains a field at the end of
/// its thread section (as 3.15's did), which moves every section after it.
pub fn write_python_316(source: &Path, binary: &Path, changed_shape: bool) {
    let mut bytes = std::fs::read(source).unwrap();
    let (runtime, py_version) = version_offsets(&bytes);
    assert_eq!(&bytes[runtime..runtime + 8], b"xdebugpy");
    const V316: u64 = 0x0310_00f0;
    bytes[runtime + 8..runtime + 16].copy_from_slice(&V316.to_le_bytes());
    bytes[py_version..py_version + 4].copy_from_slice(&(V316 as u32).to_le_bytes());
    if changed_shape {
        // 3.14's frame section starts at byte 248; its struct is 760 bytes (its last word,
        // the debugger's script path size, is dropped). Only profilers read these bytes.
        let (frame, end) = (runtime + 248, runtime + 760);
        bytes.copy_within(frame..end - 8, frame + 8);
        bytes[frame..frame + 8].copy_from_slice(&400u64.to_le_bytes());
    }
    std::fs::write(binary, &bytes).unwrap();
    std::fs::set_permissions(binary, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
}
