//! `cargo xtask setup`'s current JDK: Debian sid's OpenJDK 25 in the sid chroot, beside
//! Debian 12's JDK 17 (an apt package of the host), for the HotSpot tests of a JDK whose code
//! blobs keep their tables outside the code cache (JDK 23+'s immutable data, JDK 25's mutable
//! data).

use std::path::Path;

use anyhow::{ensure, Context, Result};

use crate::cmd::{as_root, run};

/// The sid chroot (made by the sid Pythons' step).
const SID_ROOT: &str = "/srv/sid";
/// The package, and the JDK's home inside the root.
const SID_JDK: &str = "openjdk-25-jdk-headless";
/// See [`SID_JDK`].
const SID_JDK_HOME: &str = "/usr/lib/jvm/java-25-openjdk-amd64";

/// Installs [`SID_JDK`] in [`SID_ROOT`] (about 25 s, 230 MB), unless its `javac` is there.
pub fn setup_sid_jdk() -> Result<()> {
    println!("==> Debian sid's {SID_JDK} in {SID_ROOT}");
    let sid = Path::new(SID_ROOT);
    let javac = sid
        .join(SID_JDK_HOME.trim_start_matches('/'))
        .join("bin/javac");
    if javac.is_file() {
        println!("    already there");
        return Ok(());
    }
    ensure!(
        sid.join("usr/bin/apt-get").is_file(),
        "{SID_ROOT} has no apt-get (the sid Pythons' step makes it)"
    );
    std::fs::copy("/etc/resolv.conf", sid.join("etc/resolv.conf"))
        .context("copying /etc/resolv.conf into the sid root")?;
    // The JRE's postinst runs `java`, which needs /proc: mounted for apt alone, in a mount
    // namespace of its own, so nothing stays mounted in the root after it (and the host's
    // mounts are never touched). `dpkg --configure -a` first finishes an install an earlier
    // run left half done.
    let script = format!(
        "mount -t proc proc {SID_ROOT}/proc && chroot {SID_ROOT} dpkg --configure -a && \
         chroot {SID_ROOT} apt-get install -y --no-install-recommends {SID_JDK}"
    );
    run(as_root("unshare")?
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .env("DEBIAN_FRONTEND", "noninteractive"))?;
    ensure!(javac.is_file(), "{} is still missing", javac.display());
    Ok(())
}
