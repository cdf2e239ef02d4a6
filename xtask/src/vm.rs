//! `cargo xtask vm-test`: boots the kernels users run (Debian's 6.1 and 6.12 cloud kernels, and
//! the host's own when `/boot` has its image) under QEMU and runs bpfprof's smoke suite inside
//! each: `bpfprof doctor`, the kernel program's load and attach, profiling by pid, by NS:PID in
//! a new pid namespace and by launch, every output format, and the daemon with one run.
//!
//! The guest is an initramfs built here: busybox (Debian's static build) as the shell, the
//! `bpfprof` binary with its shared libraries, the test workloads from `tests/workloads`
//! compiled like `tests/build.rs` does, and `vm_guest.sh` as `/init`. The guest prints one
//! `VMTEST <name> PASS|FAIL` line per test on the serial console; a test that never reports (a
//! panic, a hang, a kernel that does not boot) fails.
//!
//! Kernels come from Debian's archive through `apt-get download` and are unpacked with
//! `dpkg-deb` into [`CACHE_DIR`], never installed: the host's boot setup is not touched.

use std::{
    collections::BTreeMap,
    fs,
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context, Result};

use crate::cmd::{as_root, cargo, command, probe, run, secs, workspace_root};

/// Options of `cargo xtask vm-test`.
#[derive(clap::Args)]
pub struct Options {
    /// Which kernel, or all of them.
    #[arg(long, default_value = "all", value_parser = clap::builder::PossibleValuesParser::new(KERNEL_CHOICES))]
    pub kernel: String,
}

/// Where unpacked kernel packages are kept between runs (outside the checkout, so that every
/// worktree and CI clone on this machine shares them).
pub const CACHE_DIR: &str = "/var/cache/bpfprof-vm";
/// Where the initramfs is assembled.
const BUILD_DIR: &str = "target/vm";
/// The guest's `/init`.
const GUEST_INIT: &str = include_str!("vm_guest.sh");
/// Debian package that holds a statically linked busybox for the guest's shell and tools.
const BUSYBOX_PACKAGE: &str = "busybox-static";
/// Flags the workloads are built with, as `tests/build.rs` builds them (frame pointers in
/// every function, -O0 so that gcc keeps them in leaves).
const WORKLOAD_CFLAGS: &[&str] = &[
    "-O0",
    "-g",
    "-fno-omit-frame-pointer",
    "-mno-omit-leaf-frame-pointer",
    "-pthread",
];
/// Workloads the guest script runs.
const WORKLOADS: &[&str] = &["hotcold", "shortlived"];
/// Flags of the workloads built as distributions build software (gcc's default `.eh_frame`,
/// no frame pointers), as `tests/build.rs` builds `nofp*`: only the CFI walk unwinds them.
const NOFP_CFLAGS: &[&str] = &["-O2", "-g", "-fomit-frame-pointer"];
/// Workloads the guest script runs that are built with [`NOFP_CFLAGS`].
const NOFP_WORKLOADS: &[&str] = &["nofp"];
/// The tests the guest script reports, in its order; each must report PASS.
const GUEST_TESTS: &[&str] = &[
    "doctor",
    "program_load",
    "program_attach",
    "pid",
    "formats",
    "daemon",
    "nspid",
    "launch",
    "children",
    "cfi",
];
/// Longest a guest may run, boot included, before it counts as hung (a whole suite takes about
/// two minutes under TCG on 2 busy cores).
const GUEST_TIMEOUT: Duration = Duration::from_secs(600);
/// Picks the accelerator, overriding the `/dev/kvm` probe.
const ACCEL_ENV: &str = "BPFPROF_VM_ACCEL";
/// Under KVM a guest reaches its init in a few seconds; one that has not after this long is
/// taken as KVM not working here (nested virtualization inside some VMs opens `/dev/kvm` and
/// then never runs the guest), and the kernel is booted again under TCG.
const KVM_BOOT_TIMEOUT: Duration = Duration::from_secs(30);
/// Guest memory: the initramfs (about 40 MiB unpacked) and bpfprof's maps fit easily.
const GUEST_MEMORY: &str = "1024M";

/// A kernel of the test matrix.
#[derive(Clone, Copy, Debug)]
struct Kernel {
    /// The version as `--kernel` names it.
    label: &'static str,
    /// Where its image comes from.
    source: KernelSource,
}

#[derive(Clone, Copy, Debug)]
enum KernelSource {
    /// The newest image that this Debian metapackage depends on.
    Debian(&'static str),
    /// The host's running kernel, from `/boot/vmlinuz-$(uname -r)`.
    Host,
}

/// The matrix: Debian 12's kernel, Debian 12 backports' 6.12 (cloud images) and the host's 6.18.
const KERNELS: &[Kernel] = &[
    Kernel {
        label: "6.1",
        source: KernelSource::Debian("linux-image-cloud-amd64"),
    },
    Kernel {
        label: "6.12",
        source: KernelSource::Debian("linux-image-6.12-cloud-amd64"),
    },
    Kernel {
        label: "6.18",
        source: KernelSource::Host,
    },
];

/// The labels `--kernel` accepts.
pub const KERNEL_CHOICES: &[&str] = &["6.1", "6.12", "6.18", "all"];

/// The result of one guest test.
#[derive(Debug)]
struct Outcome {
    passed: bool,
    detail: String,
}

/// What became of one kernel.
enum KernelResult {
    Ran {
        release: String,
        tests: BTreeMap<String, Outcome>,
        took: Duration,
    },
    Skipped(String),
    Failed(String),
    /// Under KVM, the guest did not reach its init within [`KVM_BOOT_TIMEOUT`].
    KvmHung,
}

/// The concrete image package a metapackage depends on (e.g. `linux-image-6.1.0-56-cloud-amd64`).
fn image_package(meta: &str) -> Result<String> {
    let out = probe(Command::new("apt-cache").args(["depends", meta]))
        .with_context(|| format!("apt-cache depends {meta} failed (run apt-get update?)"))?;
    out.lines()
        .filter_map(|l| l.trim().strip_prefix("Depends: "))
        .map(str::trim)
        .find(|d| d.starts_with("linux-image-") && !d.contains('<'))
        .map(str::to_string)
        .with_context(|| format!("{meta} depends on no linux-image package:\n{out}"))
}

/// The unpacked `vmlinuz` of `package` in the cache, if it is there.
fn cached_image(package: &str) -> Option<PathBuf> {
    let boot = Path::new(CACHE_DIR).join(package).join("boot");
    fs::read_dir(boot)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("vmlinuz-"))
        })
}

/// Downloads `package` and unpacks it into the cache (not installed); returns the unpacked
/// tree.
fn fetch_package(package: &str) -> Result<PathBuf> {
    let dest = Path::new(CACHE_DIR).join(package);
    let debs = Path::new(CACHE_DIR).join("debs");
    fs::create_dir_all(&debs).with_context(|| format!("creating {}", debs.display()))?;
    // apt's download user cannot write into a root-only folder; the files are public anyway.
    let _ = Command::new("chmod").arg("777").arg(&debs).status();
    run(as_root("apt-get")?
        .args(["download", package])
        .current_dir(&debs))?;
    let deb = fs::read_dir(&debs)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("{package}_")) && n.ends_with(".deb"))
        })
        .with_context(|| format!("apt-get download left no {package}_*.deb"))?;
    let partial = Path::new(CACHE_DIR).join(format!("{package}.partial"));
    let _ = fs::remove_dir_all(&partial);
    fs::create_dir_all(&partial)?;
    run(command("dpkg-deb").arg("-x").arg(&deb).arg(&partial))?;
    let _ = fs::remove_dir_all(&dest);
    fs::rename(&partial, &dest)?;
    let _ = fs::remove_file(&deb);
    Ok(dest)
}

/// `cargo xtask setup`'s part: the Debian kernels of the matrix and busybox, unpacked into
/// the cache; does nothing for what is there.
pub fn setup() -> Result<()> {
    println!("==> vm-test kernels and busybox in {CACHE_DIR}");
    for kernel in KERNELS {
        let KernelSource::Debian(meta) = kernel.source else {
            continue;
        };
        let package = image_package(meta)?;
        match cached_image(&package) {
            Some(image) => println!("    {}: {} already there", kernel.label, image.display()),
            None => {
                fetch_package(&package)?;
                let image = cached_image(&package)
                    .with_context(|| format!("{package} holds no boot/vmlinuz-*"))?;
                println!("    {}: unpacked {}", kernel.label, image.display());
            }
        }
    }
    if busybox().is_none() {
        fetch_package(BUSYBOX_PACKAGE)?;
    }
    let busybox = busybox().context("busybox-static holds no bin/busybox")?;
    println!("    busybox: {}", busybox.display());
    Ok(())
}

fn busybox() -> Option<PathBuf> {
    let path = Path::new(CACHE_DIR)
        .join(BUSYBOX_PACKAGE)
        .join("bin/busybox");
    path.is_file().then_some(path)
}

/// The image to boot for `kernel`, or why there is none (a skip for the host's kernel only).
fn kernel_image(kernel: &Kernel) -> std::result::Result<PathBuf, KernelResult> {
    match kernel.source {
        KernelSource::Debian(meta) => {
            let package =
                image_package(meta).map_err(|e| KernelResult::Failed(format!("{e:#}")))?;
            cached_image(&package).ok_or_else(|| {
                KernelResult::Failed(format!(
                    "{package} is not in {CACHE_DIR}: run `cargo xtask setup`"
                ))
            })
        }
        KernelSource::Host => {
            let release = fs::read_to_string("/proc/sys/kernel/osrelease")
                .map(|s| s.trim().to_string())
                .unwrap_or_default();
            let image = PathBuf::from(format!("/boot/vmlinuz-{release}"));
            if image.is_file() {
                Ok(image)
            } else {
                Err(KernelResult::Skipped(format!(
                    "the host kernel {release} has no image at {} to boot (the host's \
                     end-to-end tests already run on it)",
                    image.display()
                )))
            }
        }
    }
}

/// Builds bpfprof and the workloads and packs them with busybox and the guest script into an
/// uncompressed initramfs; returns its path.
fn build_initramfs() -> Result<PathBuf> {
    let root = workspace_root();
    let busybox = busybox().context("busybox is not in the cache: run `cargo xtask setup`")?;
    run(cargo().args(["build", "-p", "profiler-user", "--bin", "bpfprof"]))?;
    let bpfprof = root.join("target/debug/bpfprof");

    let build = root.join(BUILD_DIR);
    let tree = build.join("root");
    let _ = fs::remove_dir_all(&tree);
    for dir in ["bin", "proc", "sys", "dev", "tmp", "run", "lib64"] {
        fs::create_dir_all(tree.join(dir))?;
    }
    fs::copy(&busybox, tree.join("bin/busybox"))?;
    // Debug info is not needed to profile the workloads and would triple the image.
    run(command("objcopy")
        .arg("--strip-debug")
        .arg(&bpfprof)
        .arg(tree.join("bin/bpfprof")))?;
    let workloads = WORKLOADS
        .iter()
        .map(|w| (w, WORKLOAD_CFLAGS))
        .chain(NOFP_WORKLOADS.iter().map(|w| (w, NOFP_CFLAGS)));
    for (name, flags) in workloads {
        let src = root.join("tests/workloads").join(format!("{name}.c"));
        run(command("cc")
            .args(flags)
            .arg("-o")
            .arg(tree.join("bin").join(name))
            .arg(&src))?;
    }
    for lib in shared_libraries(&tree.join("bin/bpfprof"))?
        .into_iter()
        .chain(shared_libraries(&tree.join("bin/hotcold"))?)
    {
        let dest = tree.join(lib.strip_prefix("/").unwrap_or(&lib));
        if !dest.exists() {
            fs::create_dir_all(dest.parent().expect("a library has a folder"))?;
            fs::copy(&lib, &dest).with_context(|| format!("copying {}", lib.display()))?;
        }
    }
    let init = tree.join("init");
    fs::write(&init, GUEST_INIT)?;
    fs::set_permissions(&init, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;

    let image = build.join("initramfs.cpio");
    let list = probe(
        Command::new("find")
            .arg(".")
            .current_dir(&tree)
            .stdout(Stdio::piped()),
    )
    .context("listing the initramfs tree")?;
    let mut cpio = command("cpio")
        .args(["--quiet", "-o", "-H", "newc", "-R", "0:0"])
        .current_dir(&tree)
        .stdin(Stdio::piped())
        .stdout(fs::File::create(&image)?)
        .spawn()
        .context("starting cpio (install it: cargo xtask setup)")?;
    std::io::Write::write_all(cpio.stdin.as_mut().expect("piped stdin"), list.as_bytes())?;
    drop(cpio.stdin.take());
    ensure!(cpio.wait()?.success(), "cpio failed");
    println!(
        "    initramfs {} ({:.1} MiB)",
        image.display(),
        fs::metadata(&image)?.len() as f64 / (1024.0 * 1024.0)
    );
    Ok(image)
}

/// The shared libraries (with the dynamic loader) that `binary` loads, as `ldd` lists them.
fn shared_libraries(binary: &Path) -> Result<Vec<PathBuf>> {
    let out = probe(Command::new("ldd").arg(binary))
        .with_context(|| format!("ldd {}", binary.display()))?;
    Ok(parse_ldd(&out))
}

/// The absolute paths in `ldd` output: `name => /path (addr)` lines and the loader's
/// `/path (addr)` line; the vDSO has no file and is left out.
fn parse_ldd(out: &str) -> Vec<PathBuf> {
    out.lines()
        .filter_map(|l| {
            let path = match l.split_once("=>") {
                Some((_, right)) => right.split_whitespace().next()?,
                None => l.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

/// How the guest's CPU is run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Accel {
    /// Hardware virtualization through `/dev/kvm`.
    Kvm,
    /// QEMU's own emulation: slower, but works everywhere.
    Tcg,
}

/// The accelerator to try first: `BPFPROF_VM_ACCEL=kvm|tcg` when set, else KVM when this
/// process can open `/dev/kvm` (it may exist and still be unusable).
fn first_accel() -> Result<Accel> {
    match std::env::var(ACCEL_ENV).ok().as_deref() {
        Some("kvm") => return Ok(Accel::Kvm),
        Some("tcg") => return Ok(Accel::Tcg),
        Some(other) => bail!("{ACCEL_ENV}={other:?}: expected kvm or tcg"),
        None => {}
    }
    let opens = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_ok();
    Ok(if opens { Accel::Kvm } else { Accel::Tcg })
}

/// Boots `image` with the initramfs and collects the guest's test lines, echoing them.
fn boot(kernel: &Kernel, image: &Path, initramfs: &Path, accel: Accel) -> KernelResult {
    let started = Instant::now();
    let mut qemu = Command::new("qemu-system-x86_64");
    match accel {
        // IA32_ARCH_CAPABILITIES cannot be set in some nested setups (qemu aborts).
        Accel::Kvm => qemu.args(["-accel", "kvm", "-cpu", "host,-arch-capabilities"]),
        Accel::Tcg => qemu.args(["-accel", "tcg", "-cpu", "max"]),
    };
    // q35: Debian's cloud kernels panic on i440FX's timer setup under TCG.
    qemu.args(["-machine", "q35", "-m", GUEST_MEMORY, "-smp", "2"])
        .args(["-nographic", "-no-reboot"])
        .args(["-monitor", "none", "-serial", "stdio", "-nodefaults"])
        .arg("-kernel")
        .arg(image)
        .arg("-initrd")
        .arg(initramfs)
        .args([
            "-append",
            "console=ttyS0 panic=-1 rdinit=/init quiet loglevel=3",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = match qemu.spawn() {
        Ok(c) => c,
        Err(e) => {
            return KernelResult::Failed(format!(
                "cannot start qemu-system-x86_64 ({e}): run `cargo xtask setup`"
            ))
        }
    };
    let stdout = child.stdout.take().expect("piped stdout");
    let (lines_tx, lines_rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(|l| l.ok()) {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let label = kernel.label;
    let mut release = String::new();
    let mut tests = BTreeMap::new();
    let mut done = false;
    let mut tail: Vec<String> = Vec::new();
    let deadline = started + GUEST_TIMEOUT;
    loop {
        let mut left = deadline.saturating_duration_since(Instant::now());
        if accel == Accel::Kvm && release.is_empty() {
            left = left.min((started + KVM_BOOT_TIMEOUT).saturating_duration_since(Instant::now()));
        }
        match lines_rx.recv_timeout(left) {
            Ok(line) => {
                let line = line.trim_end_matches('\r').to_string();
                // The firmware's screen clearing can precede a marker on its line.
                let marked = line.find("VMTEST").map(|at| &line[at..]).unwrap_or("");
                if let Some(r) = marked.strip_prefix("VMTEST-KERNEL ") {
                    release = r.trim().to_string();
                    println!(
                        "    [{label}] booted {release} in {}",
                        secs(started.elapsed())
                    );
                } else if let Some(rest) = marked.strip_prefix("VMTEST ") {
                    let mut parts = rest.splitn(3, ' ');
                    let name = parts.next().unwrap_or_default().to_string();
                    let passed = parts.next() == Some("PASS");
                    let detail = parts.next().unwrap_or_default().to_string();
                    println!(
                        "    [{label}] {name:<15} {}  {detail}  ({})",
                        if passed { "ok" } else { "FAILED" },
                        secs(started.elapsed())
                    );
                    tests.insert(name, Outcome { passed, detail });
                } else if marked == "VMTEST-DONE" {
                    done = true;
                } else {
                    // Guest output other than results (doctor's report, failure details).
                    println!("    [{label}] | {line}");
                    tail.push(line);
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                let _ = child.wait();
                if accel == Accel::Kvm && release.is_empty() {
                    return KernelResult::KvmHung;
                }
                break;
            }
        }
    }
    let status = child.wait();
    let took = started.elapsed();
    if release.is_empty() {
        let mut stderr = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut stderr);
        }
        return KernelResult::Failed(format!(
            "the guest never reached its init ({status:?}, {}): {stderr}",
            secs(took)
        ));
    }
    if !done {
        tests.insert(
            "finished".into(),
            Outcome {
                passed: false,
                detail: format!(
                    "the guest stopped before the suite ended (timeout {}s or crash)",
                    GUEST_TIMEOUT.as_secs()
                ),
            },
        );
    }
    KernelResult::Ran {
        release,
        tests,
        took,
    }
}

/// Runs the smoke suite on `choice` ("6.1", "6.12", "6.18" or "all"); fails if any kernel
/// fails to boot or any test fails on it.
pub fn vm_test(choice: &str) -> Result<()> {
    let started = Instant::now();
    let kernels: Vec<&Kernel> = KERNELS
        .iter()
        .filter(|k| choice == "all" || k.label == choice)
        .collect();
    ensure!(
        !kernels.is_empty(),
        "unknown kernel {choice:?}: choose one of {}",
        KERNEL_CHOICES.join(", ")
    );
    let mut accel = first_accel()?;
    println!(
        "==> vm-test: {} (trying {accel:?} first)",
        kernels
            .iter()
            .map(|k| k.label)
            .collect::<Vec<_>>()
            .join(", "),
    );
    let initramfs = build_initramfs()?;
    let mut results = Vec::new();
    for kernel in kernels {
        println!("==> vm-test [{}]", kernel.label);
        let result = match kernel_image(kernel) {
            Ok(image) => {
                println!(
                    "    [{}] booting {} ({accel:?})",
                    kernel.label,
                    image.display()
                );
                match boot(kernel, &image, &initramfs, accel) {
                    KernelResult::KvmHung => {
                        println!(
                            "    [{}] no sign of the guest after {}s under KVM: /dev/kvm does \
                             not run guests here; using TCG from now on",
                            kernel.label,
                            KVM_BOOT_TIMEOUT.as_secs()
                        );
                        accel = Accel::Tcg;
                        boot(kernel, &image, &initramfs, accel)
                    }
                    other => other,
                }
            }
            Err(other) => other,
        };
        results.push((kernel.label, result));
    }

    println!("\n=== vm-test summary");
    let mut failures = Vec::new();
    for (label, result) in &results {
        match result {
            KernelResult::Skipped(why) => println!("    {label:<5} skipped: {why}"),
            KernelResult::Failed(why) => {
                println!("    {label:<5} FAILED: {why}");
                failures.push(format!("{label}: {why}"));
            }
            KernelResult::KvmHung => unreachable!("booted again under TCG"),
            KernelResult::Ran {
                release,
                tests,
                took,
            } => {
                println!("    {label:<5} {release} in {}", secs(*took));
                for name in GUEST_TESTS.iter().map(|s| s.to_string()).chain(
                    tests
                        .keys()
                        .filter(|k| !GUEST_TESTS.contains(&k.as_str()))
                        .cloned(),
                ) {
                    let (status, detail) = match tests.get(&name) {
                        Some(o) if o.passed => ("ok", o.detail.as_str()),
                        Some(o) => ("FAILED", o.detail.as_str()),
                        None => ("FAILED", "never reported"),
                    };
                    println!("      test vm[{release}]::{name} ... {status} {detail}");
                    if status != "ok" {
                        failures.push(format!("{release}::{name}"));
                    }
                }
            }
        }
    }
    println!("    total {}", secs(started.elapsed()));
    if !failures.is_empty() {
        bail!("vm-test failed: {}", failures.join(", "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_output_gives_every_library_and_the_loader() {
        let out = "\tlinux-vdso.so.1 (0x00007ffd)\n\
                   \tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007fa1)\n\
                   \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007fa2)\n\
                   \t/lib64/ld-linux-x86-64.so.2 (0x00007fa3)\n";
        assert_eq!(
            parse_ldd(out),
            [
                "/lib/x86_64-linux-gnu/libgcc_s.so.1",
                "/lib/x86_64-linux-gnu/libc.so.6",
                "/lib64/ld-linux-x86-64.so.2"
            ]
            .map(PathBuf::from)
        );
    }

    #[test]
    fn every_guest_test_is_in_the_guest_script() {
        for name in GUEST_TESTS {
            assert!(
                GUEST_INIT.contains(&format!("pass {name}")),
                "vm_guest.sh never reports {name}"
            );
        }
    }
}
