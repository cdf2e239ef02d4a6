//! `cargo xtask setup`'s Node.js step: the runtimes the V8 tests profile. Debian 12's Node 18
//! (its `libnode.so.108` exports V8's postmortem constants), installed as `/usr/bin/node` on a
//! machine without another Node, or unpacked beside the machine's own `node` (a NodeSource
//! one, which apt will not replace by an older version) at [`NODE18_ROOT`]; and Debian sid's in
//! the sid chroot.

use std::path::Path;

use anyhow::{ensure, Context, Result};

use crate::cmd::{apt_installed, as_root, command, probe, run};

/// Where Debian 12's Node 18 is unpacked when the machine's `node` is another.
const NODE18_ROOT: &str = "/opt/node18";
/// The sid chroot (made by the sid Pythons' step).
const SID_ROOT: &str = "/srv/sid";
/// What the unpacked Node 18 needs beside its own two packages: libnode's libraries and the
/// JavaScript modules Debian keeps outside it (Node aborts at start without the lexer).
const NODE18_DEPENDENCIES: &[&str] = &[
    "libuv1",
    "libc-ares2",
    "libnghttp2-14",
    "libbrotli1",
    "libicu72",
    "node-cjs-module-lexer",
    "node-acorn",
    "node-undici",
];

fn node_version(node: &str, lib: Option<&str>) -> Option<String> {
    let mut cmd = command(node);
    cmd.arg("--version");
    if let Some(lib) = lib {
        cmd.env("LD_LIBRARY_PATH", lib);
    }
    probe(&mut cmd)
}

/// Installs Debian 12's Node 18 and sid's nodejs.
pub fn setup_node() -> Result<()> {
    println!("==> Node.js: Debian 12's 18, and sid's in {SID_ROOT}");
    let system = node_version("/usr/bin/node", None);
    if !apt_installed("nodejs") && system.is_none() {
        run(as_root("apt-get")?
            .args(["install", "-y", "nodejs"])
            .env("DEBIAN_FRONTEND", "noninteractive"))?;
    }
    let system = node_version("/usr/bin/node", None);
    let lib = format!("{NODE18_ROOT}/usr/lib/x86_64-linux-gnu");
    let unpacked = format!("{NODE18_ROOT}/usr/bin/node");
    if system.as_deref().is_some_and(|v| v.starts_with("v18.")) {
        println!("    /usr/bin/node is {}", system.unwrap_or_default());
    } else if node_version(&unpacked, Some(&lib)).is_some() {
        println!("    {unpacked} already there");
    } else {
        unpack_node18()?;
        let version = node_version(&unpacked, Some(&lib));
        ensure!(
            version.as_deref().is_some_and(|v| v.starts_with("v18.")),
            "{unpacked} does not run after unpacking"
        );
    }
    let sid = Path::new(SID_ROOT);
    if sid.join("usr/bin/node").is_file() {
        println!("    {SID_ROOT}/usr/bin/node already there");
    } else {
        ensure!(
            sid.join("usr/bin/apt-get").is_file(),
            "{SID_ROOT} has no apt-get (the sid Pythons' step makes it)"
        );
        std::fs::copy("/etc/resolv.conf", sid.join("etc/resolv.conf"))
            .context("copying /etc/resolv.conf into the sid root")?;
        run(as_root("chroot")?
            .arg(sid)
            .args([
                "apt-get",
                "install",
                "-y",
                "--no-install-recommends",
                "nodejs",
            ])
            .env("DEBIAN_FRONTEND", "noninteractive"))?;
    }
    Ok(())
}

/// Unpacks Debian 12's nodejs and libnode (18.x, the newest bookworm has) at [`NODE18_ROOT`],
/// with what they need installed by apt.
fn unpack_node18() -> Result<()> {
    let madison = probe(command("apt-cache").args(["madison", "nodejs"])).unwrap_or_default();
    let version = madison
        .lines()
        .filter_map(|l| l.split('|').nth(1).map(str::trim))
        .find(|v| v.starts_with("18."))
        .context("apt knows no nodejs 18.x (Debian 12's)")?
        .to_string();
    let dir = std::env::temp_dir().join("bpfprof-node18-debs");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).context("a directory for the packages")?;
    run(as_root("apt-get")?
        .current_dir(&dir)
        .arg("download")
        .arg(format!("nodejs={version}"))
        .arg(format!("libnode108={version}")))?;
    std::fs::create_dir_all(NODE18_ROOT).with_context(|| format!("create {NODE18_ROOT}"))?;
    for entry in std::fs::read_dir(&dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "deb") {
            run(as_root("dpkg")?.arg("-x").arg(&path).arg(NODE18_ROOT))?;
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    run(as_root("apt-get")?
        .args(["install", "-y", "--no-install-recommends"])
        .args(NODE18_DEPENDENCIES)
        .env("DEBIAN_FRONTEND", "noninteractive"))?;
    Ok(())
}
