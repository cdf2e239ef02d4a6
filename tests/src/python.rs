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
