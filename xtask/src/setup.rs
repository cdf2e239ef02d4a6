//! `cargo xtask setup`: installs what the build, the tests and the bench need (apt packages,
//! rustfmt and clippy, bpf-linker, cargo-fuzz, the format validators, upstream pprof, Python
//! modules, py-spy and PyTorch, Debian sid's CPython 3.14 and 3.15 in a chroot with PyTorch
//! for its 3.14, a free-threaded CPython 3.13t built from Debian's source, Node.js 18 and
//! sid's, sid's OpenJDK 25, and the VM test's kernels); each step does nothing for what is
//! already there.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, ensure, Context, Result};

use crate::build_ebpf::bpf_linker_version;
use crate::cmd::{apt_installed, as_root, cargo, command, probe, run, secs, workspace_root};
use crate::consts::{
    APT_PACKAGES, BPF_LINKER_VERSION, CARGO_FUZZ_VERSION, FUZZ_TOOLCHAIN, LLVM_PREFIX,
    NPM_VALIDATORS, PPROF_DIR, PYTHON_MODULES, PYTHON_TOOLS, TORCH_BASE_PYTHON, TORCH_PROBE,
    TORCH_SKIPPED_DEPS, TORCH_VENV, VALIDATORS_DIR,
};
use crate::vm;

/// Runs every setup step in order, stopping at the first failure.
pub fn setup() -> Result<()> {
    let started = Instant::now();
    setup_apt()?;
    setup_rustup_components()?;
    setup_bpf_linker()?;
    setup_cargo_fuzz()?;
    setup_validators()?;
    setup_pprof()?;
    setup_python()?;
    setup_py_spy()?;
    setup_torch()?;
    setup_sid_pythons()?;
    setup_sid_torch()?;
    setup_free_threaded_python()?;
    crate::setup_node::setup_node()?;
    crate::setup_jdk::setup_sid_jdk()?;
    vm::setup()?;
    println!("setup: done in {}", secs(started.elapsed()));
    Ok(())
}

/// Builds upstream pprof from Debian's source package: Go 1.19's `go tool pprof` cannot
/// disassemble position-independent C binaries (its object reader ignores mapping offsets).
/// It is pointed at GNU binutils, since the pprof release Debian ships cannot read the output
/// of the LLVM 14 `llvm-objdump` it would otherwise prefer.
fn setup_pprof() -> Result<()> {
    let dir = workspace_root().join(PPROF_DIR);
    let gnu = dir.join("gnu-binutils");
    println!("==> upstream pprof in {}", dir.display());
    std::fs::create_dir_all(&gnu).with_context(|| format!("creating {}", gnu.display()))?;
    for tool in ["objdump", "nm", "addr2line"] {
        let link = gnu.join(tool);
        if !link.exists() {
            std::os::unix::fs::symlink(Path::new("/usr/bin").join(tool), &link)
                .with_context(|| format!("linking {}", link.display()))?;
        }
    }
    let bin = dir.join("pprof");
    if bin.is_file() {
        println!("    already built");
        return Ok(());
    }
    let mut cmd = command("go");
    cmd.arg("build")
        .arg("-o")
        .arg(&bin)
        .arg("github.com/google/pprof")
        .env("GO111MODULE", "off")
        .env("GOPATH", "/usr/share/gocode")
        .env("GOCACHE", dir.join("go-cache"));
    run(&mut cmd)
}

fn setup_validators() -> Result<()> {
    let dir = workspace_root().join(VALIDATORS_DIR);
    let missing: Vec<&str> = NPM_VALIDATORS
        .iter()
        .filter(|(name, _)| {
            !dir.join("node_modules")
                .join(name)
                .join("package.json")
                .exists()
        })
        .map(|(_, spec)| *spec)
        .collect();
    println!("==> npm validators in {}", dir.display());
    if missing.is_empty() {
        println!("    already installed");
        return Ok(());
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut cmd = command("npm");
    cmd.args(["install", "--no-audit", "--no-fund", "--prefix"])
        .arg(&dir)
        .args(&missing);
    run(&mut cmd)?;
    println!("    installed {}", missing.join(" "));
    Ok(())
}

fn setup_python() -> Result<()> {
    println!("==> python modules");
    for (module, package) in PYTHON_MODULES {
        // A pinned package must be at its version, not only import.
        let check = match package.split_once("==") {
            Some((name, version)) => format!(
                "import {module}, importlib.metadata as m; assert m.version('{name}') == '{version}'"
            ),
            None => format!("import {module}"),
        };
        let present = probe(Command::new("python3").args(["-c", &check])).is_some();
        if present {
            println!("    {module}: already installed");
            continue;
        }
        let mut cmd = command("python3");
        cmd.args(["-m", "pip", "install", "--quiet", package]);
        run(&mut cmd)?;
        println!("    {module}: installed");
    }
    for tool in PYTHON_TOOLS {
        if probe(Command::new(tool).arg("--version")).is_some() {
            println!("    {tool}: already installed");
            continue;
        }
        let mut cmd = command("python3");
        cmd.args(["-m", "pip", "install", "--quiet", tool]);
        run(&mut cmd)?;
        // Under pyenv the new script is on PATH only once its shim exists.
        let _ = probe(Command::new("pyenv").arg("rehash"));
        println!("    {tool}: installed");
    }
    Ok(())
}

/// py-spy, the Python profiler `cargo xtask bench` compares bpfprof with on Python workloads
/// (issue 12); pip puts its `py-spy` binary on the PATH of the Python that installs it.
fn setup_py_spy() -> Result<()> {
    println!("==> py-spy (for the bench)");
    if probe(Command::new("py-spy").arg("--version")).is_some() {
        println!("    already installed");
        return Ok(());
    }
    run(command("python3").args(["-m", "pip", "install", "--quiet", "py-spy"]))?;
    println!("    installed");
    Ok(())
}

/// PyTorch from PyPI in [`TORCH_VENV`], for the PyTorch end-to-end tests: skipped when torch
/// already imports there. PyPI's only Linux x86-64 wheel is the CUDA build; it is installed
/// without its dependencies, which are then installed from its own metadata less
/// [`TORCH_SKIPPED_DEPS`] (4.3 GB instead of 5.3; `--no-deps` alone does not import). The venv
/// is made world-readable so that the tests' non-root user can run it.
fn setup_torch() -> Result<()> {
    let venv = Path::new(TORCH_VENV);
    let python = venv.join("bin/python");
    println!("==> PyTorch in {TORCH_VENV} (for tests/tests/python/pytorch.rs)");
    if let Some(version) = probe(Command::new(&python).args(["-c", TORCH_PROBE])) {
        println!("    torch {} already installed", version.trim());
        return world_readable(venv);
    }
    let started = Instant::now();
    if !python.is_file() {
        run(command(TORCH_BASE_PYTHON).args(["-m", "venv"]).arg(venv))?;
    }
    let pip = || {
        let mut cmd = command(&python);
        // pip's own cache (root's) keeps the wheels for the next machine set up here.
        cmd.args(["-m", "pip", "install", "--progress-bar", "off"]);
        cmd
    };
    println!("    installing torch without its dependencies (about 1 GB)");
    run(pip().args(["--no-deps", "torch"]))?;
    let requires = probe(Command::new(&python).args([
        "-c",
        "import importlib.metadata as m\nprint('\\n'.join(m.requires('torch') or []))",
    ]))
    .context("reading torch's dependencies from its metadata")?;
    let deps = torch_dependencies(&requires);
    println!(
        "    installing its dependencies but {} (about 3.3 GB): {}",
        TORCH_SKIPPED_DEPS.join(", "),
        deps.join(" ")
    );
    run(pip().args(&deps))?;
    let version = probe(Command::new(&python).args(["-c", TORCH_PROBE]))
        .context("torch was installed but does not import and run a CPU model")?;
    world_readable(venv)?;
    println!(
        "    torch {} installed in {}",
        version.trim(),
        secs(started.elapsed())
    );
    Ok(())
}

/// torch's requirements (one per line, as `importlib.metadata.requires` gives them, markers
/// included: pip evaluates them) less extras and [`TORCH_SKIPPED_DEPS`].
fn torch_dependencies(requires: &str) -> Vec<String> {
    requires
        .lines()
        .map(str::trim)
        .filter(|r| !r.is_empty() && !r.contains("extra =="))
        .filter(|r| {
            let name: String = r
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
                .collect();
            !TORCH_SKIPPED_DEPS
                .iter()
                .any(|skip| name.eq_ignore_ascii_case(skip))
        })
        .map(String::from)
        .collect()
}

/// `chmod -R a+rX`: a non-root user can read every file and enter every folder under `path`.
fn world_readable(path: &Path) -> Result<()> {
    let mut cmd = command("chmod");
    cmd.args(["-R", "a+rX"]).arg(path);
    let status = cmd
        .status()
        .with_context(|| format!("chmod -R a+rX {}", path.display()))?;
    ensure!(status.success(), "chmod -R a+rX {} failed", path.display());
    Ok(())
}

/// Where Debian sid's root goes: its `python3.14` and `python3.15` (which Debian 12 cannot
/// install: they need a newer libc) run there, as ordinary processes of the host, for the
/// `python_314` tests.
const SID_ROOT: &str = "/srv/sid";
/// The sid packages the tests run.
const SID_PYTHONS: &[&str] = &["python3.14", "python3.15"];

/// Debian sid's CPython 3.14 and 3.15 in a chroot at [`SID_ROOT`], from the mirror the host's
/// apt uses (`debootstrap --variant=minbase`, about 40 s); where the root is there but lacks
/// an interpreter, installed into it.
fn setup_sid_pythons() -> Result<()> {
    println!("==> Debian sid's {} in {SID_ROOT}", SID_PYTHONS.join(", "));
    let root = Path::new(SID_ROOT);
    let missing: Vec<&str> = SID_PYTHONS
        .iter()
        .copied()
        .filter(|p| !root.join("usr/bin").join(p).is_file())
        .collect();
    if missing.is_empty() {
        println!("    already there");
        return Ok(());
    }
    if root.join("usr/bin/apt-get").is_file() {
        // A root made before: its apt reaches the mirror with the host's resolver.
        std::fs::copy("/etc/resolv.conf", root.join("etc/resolv.conf"))
            .context("copying /etc/resolv.conf into the sid root")?;
        run(as_root("chroot")?
            .arg(root)
            .args(["apt-get", "install", "-y"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"))?;
    } else {
        if !apt_installed("debootstrap") {
            run(as_root("apt-get")?
                .args(["install", "-y", "debootstrap"])
                .env("DEBIAN_FRONTEND", "noninteractive"))?;
        }
        let mirror = debian_mirror();
        run(as_root("debootstrap")?
            .args(["--variant=minbase"])
            .arg(format!("--include={}", SID_PYTHONS.join(",")))
            .args(["sid", SID_ROOT, &mirror]))?;
    }
    for python in SID_PYTHONS {
        ensure!(
            root.join("usr/bin").join(python).is_file(),
            "{SID_ROOT}/usr/bin/{python} is still missing"
        );
    }
    Ok(())
}

/// The venv in the sid root (its own path there) with PyTorch for sid's CPython 3.14, for
/// `tests/tests/python/pytorch_314.rs`.
const SID_TORCH_VENV: &str = "/opt/torch314";
/// The host's CA bundle as the sid root sees it, for pip there: the registries are reached
/// through a proxy only the host's bundle trusts. A name of its own, since sid's
/// `ca-certificates` rewrites `/etc/ssl/certs/ca-certificates.crt` whenever apt installs it.
const SID_HOST_CA: &str = "/etc/ssl/host-ca-certificates.crt";

/// PyTorch's cp314 wheel from PyPI in a venv of sid's `python3.14` at [`SID_TORCH_VENV`]
/// inside [`SID_ROOT`], skipped when torch already imports and trains a step there. As for
/// [`setup_torch`]: PyPI's only Linux x86-64 build is the CUDA one (no CPU-only wheel), so
/// it is torch without its dependencies, then those less [`TORCH_SKIPPED_DEPS`]; about 4.3
/// GB and 5 minutes here (torch 70 s, the CUDA libraries 200 s).
fn setup_sid_torch() -> Result<()> {
    let root = Path::new(SID_ROOT);
    let venv = Path::new(SID_TORCH_VENV);
    let python = venv.join("bin/python");
    println!("==> PyTorch for sid's python3.14 in {SID_ROOT}{SID_TORCH_VENV}");
    let in_root = |program: &Path| -> Result<Command> {
        let mut cmd = as_root("chroot")?;
        cmd.arg(root).arg(program);
        Ok(cmd)
    };
    if let Some(version) = probe(in_root(&python)?.args(["-c", TORCH_PROBE])) {
        println!("    torch {} already installed", version.trim());
        return Ok(());
    }
    let started = Instant::now();
    std::fs::copy("/etc/resolv.conf", root.join("etc/resolv.conf"))
        .context("copying /etc/resolv.conf into the sid root")?;
    let venv_module = probe(in_root(Path::new("/usr/bin/dpkg-query"))?.args([
        "-W",
        "-f=${Status}",
        "python3.14-venv",
    ]))
    .is_some_and(|status| status.trim() == "install ok installed");
    if !venv_module {
        run(in_root(Path::new("/usr/bin/apt-get"))?
            .args(["install", "-y", "python3.14-venv"])
            .env("DEBIAN_FRONTEND", "noninteractive"))?;
    }
    let ca = root.join(SID_HOST_CA.trim_start_matches('/'));
    std::fs::create_dir_all(ca.parent().expect("a folder"))?;
    std::fs::copy("/etc/ssl/certs/ca-certificates.crt", &ca)
        .context("copying the host's CA bundle into the sid root")?;
    if !root
        .join(python.strip_prefix("/").expect("absolute"))
        .is_file()
    {
        run(in_root(Path::new("/usr/bin/python3.14"))?
            .args(["-m", "venv"])
            .arg(venv))?;
    }
    let pip = || -> Result<Command> {
        let mut cmd = in_root(Path::new("/usr/bin/env"))?;
        cmd.arg(format!("SSL_CERT_FILE={SID_HOST_CA}"))
            .arg(format!("PIP_CERT={SID_HOST_CA}"))
            .arg("PIP_DISABLE_PIP_VERSION_CHECK=1")
            .arg(&python)
            .args(["-m", "pip", "install", "--progress-bar", "off"]);
        Ok(cmd)
    };
    println!("    installing torch without its dependencies (about 540 MB)");
    run(pip()?.args(["--no-deps", "torch"]))?;
    let requires = probe(in_root(&python)?.args([
        "-c",
        "import importlib.metadata as m\nprint('\\n'.join(m.requires('torch') or []))",
    ]))
    .context("reading torch's dependencies from its metadata")?;
    let deps = torch_dependencies(&requires);
    println!(
        "    installing its dependencies but {} (about 3.3 GB)",
        TORCH_SKIPPED_DEPS.join(", ")
    );
    run(pip()?.args(&deps))?;
    let version = probe(in_root(&python)?.args(["-c", TORCH_PROBE]))
        .context("torch was installed in the sid root but does not import and run a CPU model")?;
    println!(
        "    torch {} installed in {}",
        version.trim(),
        secs(started.elapsed())
    );
    Ok(())
}

/// The Debian mirror the host's apt uses.
fn debian_mirror() -> String {
    let sources =
        std::fs::read_to_string("/etc/apt/sources.list.d/debian.sources").unwrap_or_default();
    sources
        .lines()
        .find_map(|l| l.strip_prefix("URIs:"))
        .and_then(|uris| uris.split_whitespace().next())
        .unwrap_or("http://deb.debian.org/debian")
        .to_string()
}

/// Where the free-threaded CPython is installed, and its interpreter.
const PY313T_PREFIX: &str = "/opt/py313t";
const PY313T: &str = "/opt/py313t/bin/python3.13t";
/// The CPython source Debian's mirror serves (trixie's `python3.13`; sid's 3.14 and 3.15
/// sources are not there), and its directory once unpacked.
const PY313_SOURCE: &str = "pool/main/p/python3.13/python3.13_3.13.5.orig.tar.xz";
const PY313_SOURCE_DIR: &str = "Python-3.13.5";
/// Where it is built (1 GB while building; removed after).
const PY313T_BUILD: &str = "/var/tmp/bpfprof-py313t";

/// A free-threaded (`--disable-gil`) CPython 3.13t at [`PY313T_PREFIX`], built from the
/// CPython source on the mirror the host's apt uses: Debian packages no free-threaded build
/// (about 10 minutes on 2 cores).
fn setup_free_threaded_python() -> Result<()> {
    println!("==> free-threaded CPython 3.13t in {PY313T_PREFIX}");
    if Path::new(PY313T).is_file() {
        println!("    already there");
        return Ok(());
    }
    // A fixed directory, made anew: an interrupted build's leftovers are not reused.
    let build = Path::new(PY313T_BUILD);
    if build.exists() {
        std::fs::remove_dir_all(build).with_context(|| format!("removing {PY313T_BUILD}"))?;
    }
    std::fs::create_dir_all(build).with_context(|| format!("creating {PY313T_BUILD}"))?;
    let tarball = build.join("python3.13.orig.tar.xz");
    run(command("curl")
        .args(["-fsSL", "-o"])
        .arg(&tarball)
        .arg(format!("{}/{PY313_SOURCE}", debian_mirror())))?;
    run(command("tar").arg("xf").arg(&tarball).arg("-C").arg(build))?;
    let source = build.join(PY313_SOURCE_DIR);
    run(command("./configure")
        .args(["--disable-gil", &format!("--prefix={PY313T_PREFIX}")])
        .current_dir(&source))?;
    let jobs = std::thread::available_parallelism().map_or(2, |n| n.get());
    run(command("make")
        .arg(format!("-j{jobs}"))
        .current_dir(&source))?;
    run(as_root("make")?.arg("install").current_dir(&source))?;
    ensure!(
        Path::new(PY313T).is_file(),
        "{PY313T} is still missing after `make install`"
    );
    std::fs::remove_dir_all(build).with_context(|| format!("removing {PY313T_BUILD}"))?;
    Ok(())
}

fn setup_apt() -> Result<()> {
    println!("==> apt packages: {}", APT_PACKAGES.join(" "));
    let missing: Vec<&str> = APT_PACKAGES
        .iter()
        .copied()
        .filter(|p| !apt_installed(p))
        .collect();
    if missing.is_empty() {
        println!("    all already installed");
        return Ok(());
    }
    println!("    missing: {}", missing.join(" "));
    run(as_root("apt-get")?
        .arg("update")
        .env("DEBIAN_FRONTEND", "noninteractive"))?;
    run(as_root("apt-get")?
        .args(["install", "-y"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive"))?;
    let still_missing: Vec<&str> = missing
        .iter()
        .copied()
        .filter(|p| !apt_installed(p))
        .collect();
    ensure!(
        still_missing.is_empty(),
        "apt-get reported success but these packages are still not installed: {}",
        still_missing.join(" ")
    );
    println!("    installed: {}", missing.join(" "));
    Ok(())
}

fn setup_rustup_components() -> Result<()> {
    println!("==> rustup components: rustfmt clippy");
    let fmt = probe(cargo().args(["fmt", "--version"]));
    let clippy = probe(cargo().args(["clippy", "--version"]));
    if let (Some(fmt), Some(clippy)) = (&fmt, &clippy) {
        println!("    already installed: {}, {}", fmt.trim(), clippy.trim());
        return Ok(());
    }
    run(command("rustup").args(["component", "add", "rustfmt", "clippy"]))?;
    ensure!(
        probe(cargo().args(["fmt", "--version"])).is_some()
            && probe(cargo().args(["clippy", "--version"])).is_some(),
        "`cargo fmt` or `cargo clippy` still does not work after `rustup component add`"
    );
    println!("    installed rustfmt and clippy");
    Ok(())
}

fn setup_bpf_linker() -> Result<()> {
    println!("==> bpf-linker {BPF_LINKER_VERSION}");
    let wanted = |v: &str| v.split_whitespace().any(|word| word == BPF_LINKER_VERSION);
    match bpf_linker_version() {
        Some(v) if wanted(&v) => {
            println!("    already installed: {v}");
            return Ok(());
        }
        Some(v) => println!("    found {v}, installing {BPF_LINKER_VERSION} over it"),
        None => println!("    not found, installing (takes a minute or two)"),
    }
    ensure!(
        Path::new(LLVM_PREFIX).join("bin/llvm-config").exists(),
        "{LLVM_PREFIX}/bin/llvm-config is missing: is llvm-22-dev installed?"
    );
    // Without LLVM_PREFIX the build finds /usr/bin/llvm-config (LLVM 14) and fails to link.
    run(command("cargo")
        .env("LLVM_PREFIX", LLVM_PREFIX)
        .env("LLVM_SYS_221_PREFIX", LLVM_PREFIX)
        .args([
            "install",
            "--locked",
            "bpf-linker",
            "--version",
            BPF_LINKER_VERSION,
        ])
        .args(["--no-default-features", "--features", "llvm-22"]))?;
    match bpf_linker_version() {
        Some(v) if wanted(&v) => println!("    installed: {v}"),
        Some(v) => bail!(
            "installed bpf-linker {BPF_LINKER_VERSION}, but the `bpf-linker` in PATH says {v}"
        ),
        None => bail!(
            "installed bpf-linker {BPF_LINKER_VERSION}, but `bpf-linker` is not in PATH \
             (add ~/.cargo/bin to PATH)"
        ),
    }
    Ok(())
}

/// cargo-fuzz, for `cargo xtask fuzz`, when missing; and says whether the nightly toolchain
/// its sanitizers need is there (rustup cannot fetch one here: without it the targets are
/// built on the default toolchain without a sanitizer).
fn setup_cargo_fuzz() -> Result<()> {
    println!("==> cargo-fuzz {CARGO_FUZZ_VERSION}");
    match probe(command("cargo").args(["fuzz", "--version"])) {
        Some(v) => println!("    already installed: {}", v.trim()),
        None => {
            run(command("cargo").args([
                "install",
                "--locked",
                "cargo-fuzz",
                "--version",
                CARGO_FUZZ_VERSION,
            ]))?;
            ensure!(
                probe(command("cargo").args(["fuzz", "--version"])).is_some(),
                "installed cargo-fuzz, but `cargo fuzz` does not run (add ~/.cargo/bin to PATH)"
            );
        }
    }
    match probe(command("rustup").args(["run", FUZZ_TOOLCHAIN, "rustc", "--version"])) {
        Some(v) => println!("    {FUZZ_TOOLCHAIN} toolchain: {}", v.trim()),
        None => println!(
            "    no {FUZZ_TOOLCHAIN} toolchain: `cargo xtask fuzz` builds without a sanitizer"
        ),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn torch_dependencies_leave_out_triton_and_extras() {
        let requires = "filelock\n\
            sympy>=1.13.3\n\
            nvidia-nccl-cu13==2.30.7; platform_system == \"Linux\"\n\
            triton~=3.9.0; platform_system == \"Linux\" and python_version < \"3.16\"\n\
            optree>=0.13.0; extra == \"optree\"\n";
        assert_eq!(
            torch_dependencies(requires),
            [
                "filelock",
                "sympy>=1.13.3",
                "nvidia-nccl-cu13==2.30.7; platform_system == \"Linux\""
            ]
        );
    }
}
