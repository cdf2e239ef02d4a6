//! bpfprof's task runner, reached through the `cargo xtask` alias (`.cargo/config.toml`).
//!
//! - `setup`: installs what the build and the tests need (idempotent).
//! - `build-ebpf`: builds the kernel object reproducibly and copies it into the tree.
//! - `check-ebpf`: fails if the committed kernel object is not what the sources build.
//! - `test`: `cargo test --workspace`.
//! - `ci`: every check CI runs, in order, stopping at the first failure.
//!
//! The kernel object is built with Debian's `rustc-web` (which ships a prebuilt `core` for
//! `bpfel-unknown-none`) and `bpf-linker`; see `/work/shared/TOOLCHAIN.md` for why. Its bytes
//! depend on the absolute path of the crates it is built from (cargo's metadata hashes, which
//! end up in mangled symbol names), so it is always built from a copy of the sources in one
//! fixed directory, wherever the checkout lives.

mod bench;
mod vm;

use std::collections::BTreeSet;
use std::ffi::{OsStr, OsString};
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use clap::{Parser, Subcommand};
use sha2::{Digest, Sha256};
use toml_edit::{DocumentMut, InlineTable, Item, Table, TableLike, Value};

/// Fixed directory the kernel crate is copied to and built in, so its bytes do not depend on
/// where the checkout lives.
const EBPF_BUILD_DIR: &str = "/tmp/bpfprof-ebpf-build";
/// The kernel crate (its own cargo workspace) and the crate it shares types through.
const EBPF_CRATE: &str = "profiler-ebpf";
const COMMON_CRATE: &str = "profiler-common";
/// Where the kernel crate's build leaves the object, relative to the crate.
const EBPF_ARTIFACT: &str = "target/bpfel-unknown-none/release/profiler";
/// The committed kernel object that userspace embeds with `include_bytes!`.
const COMMITTED_OBJECT: &str = "profiler-user/bpf/profiler.bpf.o";

/// Debian's toolchain for the kernel side (packages `rustc-web`, `cargo-web`).
const DEBIAN_CARGO: &str = "/usr/bin/cargo";
const DEBIAN_RUSTC: &str = "/usr/bin/rustc";

const BPF_LINKER_VERSION: &str = "0.13.0";
const LLVM_PREFIX: &str = "/usr/lib/llvm-22";

/// Debian packages the build (first four) and the tests and benchmarks (the rest) need.
const APT_PACKAGES: &[&str] = &[
    "rustc-web",
    "cargo-web",
    "libstd-rust-web-dev-bpf",
    "llvm-22-dev",
    "linux-perf",
    "bpftrace",
    "libxml2-utils",
    "python3",
    // The strobeclient tests pip-install ./python into a venv offline with Debian's
    // setuptools and wheel.
    "python3-venv",
    "python3-setuptools",
    "python3-wheel",
    "gcc",
    "util-linux",
    // The python_layout test re-derives CPython's struct offsets from libpython's DWARF.
    "gdb",
    "bpftool",
    "qemu-system-x86",
    "cpio",
    // Independent readers of the output formats: `go tool pprof`, upstream pprof's source
    // (built by `setup` for `-disasm`, with GNU binutils), xz's stripped liblzma, and a
    // headless browser that lays out the flame graph.
    "golang-go",
    "golang-github-google-pprof-dev",
    "binutils",
    "xz-utils",
    "chromium",
];

/// Where `setup` builds upstream pprof, with a directory of the GNU binutils it must use.
const PPROF_DIR: &str = "target/tools";

/// npm packages the tests use as independent readers of bpfprof's output formats.
const NPM_VALIDATORS: &[(&str, &str)] = &[
    ("pprof-format", "pprof-format@2"),
    ("speedscope", "speedscope@1"),
    ("ajv", "ajv@8"),
];

/// Where the npm validators are installed, under the workspace's target directory.
const VALIDATORS_DIR: &str = "target/validators";

/// Python modules the Python client's tests need, with the pip package providing each.
const PYTHON_MODULES: &[(&str, &str)] = &[("pytest", "pytest"), ("numpy", "numpy")];

/// Programs from PyPI the tests run: py-spy, the peer the Python-walk tests compare shares with.
const PYTHON_TOOLS: &[&str] = &["py-spy"];

/// The PyTorch venv the end-to-end tests (`tests/tests/pytorch.rs`) run: a fixed path outside
/// the checkout, so every worktree and CI run on this machine reuses one 4 GB install.
const TORCH_VENV: &str = "/opt/bpfprof/torch-venv";
/// The interpreter of that venv: Debian's, which a non-root test user can run (pyenv's live
/// under /root, mode 700).
const TORCH_BASE_PYTHON: &str = "/usr/bin/python3.11";
/// torch's dependencies left out of the venv: triton (1 GB) only compiles GPU kernels; CPU
/// models and `torch.compile` on CPU (inductor's C++ backend) run without it. Every other
/// dependency is needed: `import torch` loads the CUDA libraries even without a GPU.
const TORCH_SKIPPED_DEPS: &[&str] = &["triton"];
/// What `setup` checks the venv with: torch imports and trains a step of a CPU model.
const TORCH_PROBE: &str = "import torch\n\
torch.set_num_threads(2)\n\
m = torch.nn.Linear(8, 2)\n\
m(torch.ones(4, 8)).sum().backward()\n\
print(torch.__version__)";

#[derive(Parser)]
#[command(
    name = "xtask",
    bin_name = "cargo xtask",
    about = "bpfprof's build, check and CI tasks"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install what the build and the tests need (apt packages, bpf-linker, rustfmt, clippy);
    /// does nothing for what is already there.
    Setup,
    /// Build the kernel object reproducibly and copy it to PATH
    /// (default: profiler-user/bpf/profiler.bpf.o).
    BuildEbpf {
        /// Where to put the object.
        #[arg(long, value_name = "PATH")]
        out: Option<PathBuf>,
        /// Wipe the build directory's target/ first (a full rebuild).
        #[arg(long)]
        clean: bool,
    },
    /// Build the kernel object and fail if it differs from the committed one.
    CheckEbpf {
        /// Wipe the build directory's target/ first (a full rebuild).
        #[arg(long)]
        clean: bool,
    },
    /// Run `cargo test --workspace`, passing ARGS on to it verbatim
    /// (e.g. `cargo xtask test -p bpfprof-tests -- --nocapture`).
    Test {
        #[arg(
            value_name = "ARGS",
            trailing_var_arg = true,
            allow_hyphen_values = true
        )]
        args: Vec<OsString>,
    },
    /// Benchmark bpfprof against perf and bpftrace; writes BENCHMARKS.md and bench/overhead.svg.
    Bench {
        /// One round at fewer frequencies: a smoke run.
        #[arg(long)]
        quick: bool,
    },
    /// Boot the tested kernels (Debian's 6.1 and 6.12, the host's 6.18 when /boot has it)
    /// under QEMU and run bpfprof's smoke suite inside each.
    VmTest {
        /// Which kernel, or all of them.
        #[arg(long, default_value = "all", value_parser = clap::builder::PossibleValuesParser::new(vm::KERNEL_CHOICES))]
        kernel: String,
    },
    /// Run every CI check in order, stopping at the first failure.
    Ci {
        /// Only print the steps.
        #[arg(long)]
        list: bool,
        /// Run only the named step(s) (see --list).
        #[arg(long, value_name = "STEP")]
        only: Vec<String>,
    },
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Cmd::Setup => setup(),
        Cmd::BuildEbpf { out, clean } => build_ebpf_cmd(out, clean),
        Cmd::CheckEbpf { clean } => check_ebpf(clean),
        // Verbatim, unlike clap, which would swallow a leading `--` (`cargo xtask test --
        // --nocapture` must reach the test binaries). No global options exist, so the
        // subcommand is argv[1].
        Cmd::Test { args: _ } => test(&std::env::args_os().skip(2).collect::<Vec<_>>()),
        Cmd::Ci { list, only } => ci(list, &only),
        Cmd::VmTest { kernel } => vm::vm_test(&kernel),
        Cmd::Bench { quick } => bench::run(bench::BenchArgs { quick }),
    };
    if let Err(err) = result {
        eprintln!("xtask: error: {err:#}");
        std::process::exit(1);
    }
}

/// The workspace root: xtask lives in `<root>/xtask`.
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask's manifest dir has a parent")
        .to_path_buf()
}

// ---------------------------------------------------------------------------------------------
// Running commands
// ---------------------------------------------------------------------------------------------

/// Environment variables `cargo run` sets for the program it runs (here: xtask itself). They
/// describe xtask's package and must not reach the cargo invocations xtask makes.
fn is_cargo_run_var(key: &str) -> bool {
    key == "CARGO"
        || key.starts_with("CARGO_PKG_")
        || matches!(
            key,
            "CARGO_MANIFEST_DIR"
                | "CARGO_MANIFEST_PATH"
                | "CARGO_MANIFEST_LINKS"
                | "CARGO_CRATE_NAME"
                | "CARGO_BIN_NAME"
                | "CARGO_PRIMARY_PACKAGE"
                | "CARGO_RUSTC_CURRENT_DIR"
        )
}

/// Environment variables that would steer Debian's cargo away from the pinned kernel build:
/// every cargo setting (`CARGO_*` except `CARGO_HOME`, e.g. `CARGO_TARGET_DIR`,
/// `CARGO_BUILD_TARGET`, `CARGO_ENCODED_RUSTFLAGS`) and the compiler selection and flags.
fn leaks_into_ebpf_build(key: &str) -> bool {
    (key.starts_with("CARGO") && key != "CARGO_HOME")
        || key.starts_with("__CARGO")
        || matches!(
            key,
            "RUSTC"
                | "RUSTC_WRAPPER"
                | "RUSTC_WORKSPACE_WRAPPER"
                | "RUSTDOC"
                | "RUSTFLAGS"
                | "RUSTDOCFLAGS"
                | "RUSTC_BOOTSTRAP"
                | "RUSTUP_TOOLCHAIN"
        )
}

/// A command with `cargo run`'s per-package variables removed; for the workspace's own cargo
/// (rustup's, the one that runs xtask) and other tools.
fn command(program: impl AsRef<OsStr>) -> Command {
    let mut cmd = Command::new(program);
    for (key, _) in std::env::vars_os() {
        if key.to_str().is_some_and(is_cargo_run_var) {
            cmd.env_remove(&key);
        }
    }
    cmd
}

/// The rustup cargo that runs xtask (the proxy in PATH, pinned by `RUSTUP_TOOLCHAIN`).
fn cargo() -> Command {
    let mut cmd = command("cargo");
    cmd.current_dir(workspace_root());
    cmd
}

fn describe(cmd: &Command) -> String {
    let mut line = String::new();
    for (key, value) in cmd.get_envs() {
        if let Some(value) = value {
            line += &format!("{}={} ", key.to_string_lossy(), value.to_string_lossy());
        }
    }
    line += &cmd.get_program().to_string_lossy();
    for arg in cmd.get_args() {
        let arg = arg.to_string_lossy();
        let plain = |c: char| c.is_ascii_alphanumeric() || "_-./=:,+@%".contains(c);
        if arg.is_empty() || !arg.chars().all(plain) {
            line += &format!(" '{}'", arg.replace('\'', r"'\''"));
        } else {
            line += &format!(" {arg}");
        }
    }
    if let Some(dir) = cmd.get_current_dir() {
        line = format!("(in {}) {line}", dir.display());
    }
    line
}

/// Runs `cmd`, echoing it, and fails unless it exits successfully.
fn run(cmd: &mut Command) -> Result<()> {
    let line = describe(cmd);
    println!("    $ {line}");
    let status = cmd
        .status()
        .with_context(|| format!("could not start `{line}`"))?;
    ensure!(status.success(), "`{line}` failed ({status})");
    Ok(())
}

/// Runs `cmd` quietly and returns its stdout if it succeeded, `None` if it failed or could not
/// start (e.g. the program is not installed).
fn probe(cmd: &mut Command) -> Option<String> {
    let output = cmd
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).into_owned())
}

fn secs(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

// ---------------------------------------------------------------------------------------------
// setup
// ---------------------------------------------------------------------------------------------

fn setup() -> Result<()> {
    let started = Instant::now();
    setup_apt()?;
    setup_rustup_components()?;
    setup_bpf_linker()?;
    setup_validators()?;
    setup_pprof()?;
    setup_python()?;
    setup_py_spy()?;
    setup_torch()?;
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
        let present =
            probe(Command::new("python3").args(["-c", &format!("import {module}")])).is_some();
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
    println!("==> PyTorch in {TORCH_VENV} (for tests/tests/pytorch.rs)");
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

fn apt_installed(package: &str) -> bool {
    probe(Command::new("dpkg-query").args(["-W", "-f=${Status}", package]))
        .is_some_and(|status| status.trim() == "install ok installed")
}

/// A command run as root: directly when xtask is root, through sudo otherwise.
fn as_root(program: &str) -> Result<Command> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        return Ok(command(program));
    }
    ensure!(
        probe(Command::new("sudo").arg("--version")).is_some(),
        "installing packages needs root: run `cargo xtask setup` as root (sudo is not available)"
    );
    let mut cmd = command("sudo");
    cmd.arg(program);
    Ok(cmd)
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

fn bpf_linker_version() -> Option<String> {
    probe(Command::new("bpf-linker").arg("--version")).map(|v| v.trim().to_owned())
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

// ---------------------------------------------------------------------------------------------
// build-ebpf / check-ebpf
// ---------------------------------------------------------------------------------------------

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Copies the regular files under `from` to `to`, recursively.
fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    fs::create_dir_all(to).with_context(|| format!("creating {}", to.display()))?;
    for entry in fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let entry = entry?;
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        if fs::metadata(&src)?.is_dir() {
            copy_tree(&src, &dst)?;
        } else {
            copy_file(&src, &dst)?;
        }
    }
    Ok(())
}

fn copy_file(from: &Path, to: &Path) -> Result<()> {
    fs::copy(from, to)
        .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    Ok(())
}

/// Removes `path` (file or directory) if it exists.
fn remove(path: &Path) -> Result<()> {
    let result = match fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => Err(e),
        Ok(m) if m.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
    };
    result.with_context(|| format!("removing {}", path.display()))
}

/// `table.workspace = true`, i.e. a key inherited from the workspace.
fn inherits(item: &Item) -> bool {
    item.as_table_like()
        .and_then(|t| t.get("workspace"))
        .and_then(Item::as_bool)
        == Some(true)
}

/// Resolves `dep = { workspace = true, ... }` against the workspace's entry for `dep`.
fn resolve_dependency(name: &str, member: &dyn TableLike, ws_deps: &dyn TableLike) -> Result<Item> {
    let ws = ws_deps
        .get(name)
        .with_context(|| format!("[workspace.dependencies] has no `{name}`"))?;
    let mut dep = match ws {
        Item::Value(Value::String(version)) => {
            let mut t = InlineTable::new();
            t.insert("version", version.value().as_str().into());
            t
        }
        other => other
            .as_table_like()
            .with_context(|| {
                format!("[workspace.dependencies] `{name}` is neither a string nor a table")
            })?
            .iter()
            .filter_map(|(k, v)| Some((k.to_owned(), v.as_value()?.clone())))
            .collect(),
    };
    ensure!(
        !dep.contains_key("path"),
        "dependency `{name}` is a path dependency of the workspace; the standalone copy of \
         {COMMON_CRATE} cannot refer to it (teach xtask's manifest rewrite about it)"
    );
    for (key, value) in member.iter().filter(|(k, _)| *k != "workspace") {
        let value = value
            .as_value()
            .with_context(|| format!("dependency `{name}`: unexpected `{key}`"))?;
        match (key, dep.get_mut("features")) {
            ("features", Some(Value::Array(features))) => {
                let extra = value.as_array().context("`features` is not an array")?;
                features.extend(extra.iter().cloned());
            }
            _ => {
                dep.insert(key, value.clone());
            }
        }
    }
    dep.fmt();
    Ok(Item::Value(Value::InlineTable(dep)))
}

/// Turns a workspace member's manifest into a standalone one by resolving everything it
/// inherits (`x.workspace = true`) from the root manifest: outside the workspace, cargo cannot.
fn standalone_manifest(member: &str, root: &str) -> Result<String> {
    let mut doc: DocumentMut = member.parse().context("parsing the member manifest")?;
    let root: DocumentMut = root.parse().context("parsing the root manifest")?;
    let empty = Table::new();
    let ws = root.get("workspace").and_then(Item::as_table_like);
    let section = |name: &str| -> &dyn TableLike {
        ws.and_then(|ws| ws.get(name))
            .and_then(Item::as_table_like)
            .unwrap_or(&empty)
    };
    let (ws_package, ws_deps) = (section("package"), section("dependencies"));

    if let Some(package) = doc.get_mut("package").and_then(Item::as_table_like_mut) {
        for (key, item) in package.iter_mut() {
            if inherits(item) {
                let value = ws_package
                    .get(&key)
                    .and_then(Item::as_value)
                    .with_context(|| format!("[workspace.package] has no `{key}`"))?;
                *item = Item::Value(value.clone());
            }
        }
    }

    let mut dep_tables: Vec<&mut Item> = Vec::new();
    let (plain, targets): (Vec<_>, Vec<_>) = doc
        .as_table_mut()
        .iter_mut()
        .partition(|(key, _)| key.get() != "target");
    for (key, item) in plain {
        if matches!(
            key.get(),
            "dependencies" | "dev-dependencies" | "build-dependencies"
        ) {
            dep_tables.push(item);
        }
    }
    for (_, target) in targets {
        if let Some(target) = target.as_table_like_mut() {
            for (_, cfg) in target.iter_mut() {
                if let Some(cfg) = cfg.as_table_like_mut() {
                    for (key, item) in cfg.iter_mut() {
                        if key.contains("dependencies") {
                            dep_tables.push(item);
                        }
                    }
                }
            }
        }
    }
    for deps in dep_tables {
        let Some(deps) = deps.as_table_like_mut() else {
            continue;
        };
        for (name, item) in deps.iter_mut() {
            if inherits(item) {
                let member = item.as_table_like().expect("inherits() checked it");
                *item = resolve_dependency(name.get(), member, ws_deps)?;
            }
        }
    }

    if doc.get("lints").is_some_and(inherits) {
        match ws.and_then(|ws| ws.get("lints")) {
            Some(lints) => doc["lints"] = lints.clone(),
            None => {
                doc.remove("lints");
            }
        }
    }

    let text = doc.to_string();
    ensure!(
        !text.contains("workspace"),
        "the standalone {COMMON_CRATE} manifest still mentions `workspace`:\n{text}"
    );
    Ok(text)
}

/// Replaces the sources in the fixed build directory with the tree's (keeping the kernel
/// crate's `target/` for incremental builds unless `clean`). Returns the kernel crate's dir.
fn stage_ebpf_sources(root: &Path, clean: bool) -> Result<PathBuf> {
    let build_dir = Path::new(EBPF_BUILD_DIR);
    let (src_ebpf, src_common) = (root.join(EBPF_CRATE), root.join(COMMON_CRATE));
    let (ebpf, common) = (build_dir.join(EBPF_CRATE), build_dir.join(COMMON_CRATE));

    // Everything but the kernel crate's target/ goes; so does target/ when asked.
    if ebpf.exists() {
        for entry in fs::read_dir(&ebpf)? {
            let entry = entry?;
            if entry.file_name() != "target" || clean {
                remove(&entry.path())?;
            }
        }
    }
    remove(&common)?;
    fs::create_dir_all(&ebpf).with_context(|| format!("creating {}", ebpf.display()))?;

    copy_tree(&src_ebpf.join("src"), &ebpf.join("src"))?;
    copy_tree(&src_ebpf.join(".cargo"), &ebpf.join(".cargo"))?;
    for file in ["Cargo.toml", "Cargo.lock", "build.rs"] {
        let src = src_ebpf.join(file);
        if file == "build.rs" && !src.exists() {
            continue;
        }
        copy_file(&src, &ebpf.join(file))?;
    }

    copy_tree(&src_common.join("src"), &common.join("src"))?;
    if src_common.join("build.rs").exists() {
        copy_file(&src_common.join("build.rs"), &common.join("build.rs"))?;
    }
    let read = |p: &Path| fs::read_to_string(p).with_context(|| format!("reading {}", p.display()));
    let manifest = standalone_manifest(
        &read(&src_common.join("Cargo.toml"))?,
        &read(&root.join("Cargo.toml"))?,
    )
    .with_context(|| format!("making {COMMON_CRATE}'s manifest standalone"))?;
    fs::write(common.join("Cargo.toml"), manifest)?;
    Ok(ebpf)
}

/// A `--config` value that adds `--remap-path-prefix=$CARGO_HOME=/cargo-home` to the kernel
/// crate's rustflags (cargo joins it to the ones in its `.cargo/config.toml`). The debug info
/// names the dependencies' sources under `$CARGO_HOME/registry/src`; without the remap the
/// object would differ between users (`/root/.cargo` vs `/home/me/.cargo`).
fn cargo_home_remap() -> Result<String> {
    let cargo_home = match std::env::var_os("CARGO_HOME") {
        Some(home) if !home.is_empty() => PathBuf::from(home),
        _ => PathBuf::from(std::env::var_os("HOME").context("neither CARGO_HOME nor HOME is set")?)
            .join(".cargo"),
    };
    let cargo_home = std::path::absolute(&cargo_home)
        .with_context(|| format!("making {} absolute", cargo_home.display()))?;
    let cargo_home = cargo_home
        .to_str()
        .with_context(|| format!("CARGO_HOME {} is not UTF-8", cargo_home.display()))?;
    let flags: toml_edit::Array = [format!("--remap-path-prefix={cargo_home}=/cargo-home")]
        .into_iter()
        .collect();
    Ok(format!("target.bpfel-unknown-none.rustflags={flags}"))
}

/// Builds the kernel object in the fixed build directory and returns its bytes.
fn build_ebpf(clean: bool) -> Result<Vec<u8>> {
    for tool in [DEBIAN_CARGO, DEBIAN_RUSTC] {
        ensure!(
            Path::new(tool).exists(),
            "{tool} is missing (Debian's rustc-web/cargo-web): run `cargo xtask setup`"
        );
    }
    ensure!(
        bpf_linker_version().is_some(),
        "bpf-linker is not in PATH: run `cargo xtask setup`"
    );

    let root = workspace_root();
    let build_dir = Path::new(EBPF_BUILD_DIR);
    fs::create_dir_all(build_dir).with_context(|| format!("creating {EBPF_BUILD_DIR}"))?;
    // One build at a time in the shared directory.
    let lock_path = build_dir.join(".lock");
    let lock =
        File::create(&lock_path).with_context(|| format!("creating {}", lock_path.display()))?;
    if lock.try_lock().is_err() {
        println!("    waiting for another build in {EBPF_BUILD_DIR} to finish");
        lock.lock()
            .with_context(|| format!("locking {}", lock_path.display()))?;
    }

    println!(
        "==> copying {EBPF_CRATE} and {COMMON_CRATE} from {} to {EBPF_BUILD_DIR}{}",
        root.display(),
        if clean { " (clean build)" } else { "" }
    );
    let crate_dir = stage_ebpf_sources(&root, clean)?;

    println!("==> building the kernel object with Debian's rustc and bpf-linker");
    let mut cmd = Command::new(DEBIAN_CARGO);
    for (key, _) in std::env::vars_os() {
        if key.to_str().is_some_and(leaks_into_ebpf_build) {
            cmd.env_remove(&key);
        }
    }
    cmd.current_dir(&crate_dir)
        .env("RUSTC", DEBIAN_RUSTC)
        .env("RUSTC_BOOTSTRAP", "1")
        .args(["build", "--release", "--locked"])
        .arg("--config")
        .arg(cargo_home_remap()?);
    let started = Instant::now();
    run(&mut cmd).context(
        "building the kernel crate failed (if cargo says the lock file needs updating, update \
         profiler-ebpf/Cargo.lock in the tree)",
    )?;
    println!("    built in {}", secs(started.elapsed()));

    let artifact = crate_dir.join(EBPF_ARTIFACT);
    let bytes = fs::read(&artifact).with_context(|| format!("reading {}", artifact.display()))?;
    // ELF, 64-bit, little-endian, e_machine EM_BPF (247).
    ensure!(
        bytes.len() > 20
            && bytes[..6] == *b"\x7fELF\x02\x01"
            && bytes[18..20] == 247u16.to_le_bytes(),
        "{} is not a little-endian BPF ELF object",
        artifact.display()
    );
    drop(lock);
    Ok(bytes)
}

fn build_ebpf_cmd(out: Option<PathBuf>, clean: bool) -> Result<()> {
    let out = out.unwrap_or_else(|| workspace_root().join(COMMITTED_OBJECT));
    let bytes = build_ebpf(clean)?;
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    fs::write(&out, &bytes).with_context(|| format!("writing {}", out.display()))?;
    println!(
        "==> wrote {}: {} bytes, sha256 {}",
        out.display(),
        bytes.len(),
        sha256_hex(&bytes)
    );
    Ok(())
}

fn check_ebpf(clean: bool) -> Result<()> {
    let committed_path = workspace_root().join(COMMITTED_OBJECT);
    let committed = match fs::read(&committed_path) {
        Ok(bytes) => Some(bytes),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e).with_context(|| format!("reading {}", committed_path.display())),
    };
    let built = build_ebpf(clean)?;
    let built_sha = sha256_hex(&built);
    let Some(committed) = committed else {
        bail!(
            "{COMMITTED_OBJECT} does not exist (the sources build sha256 {built_sha}): run \
             `cargo xtask build-ebpf` and commit {COMMITTED_OBJECT}"
        );
    };
    let committed_sha = sha256_hex(&committed);
    ensure!(
        built == committed,
        "{COMMITTED_OBJECT} is stale: committed sha256 {committed_sha} ({} bytes), the sources \
         build sha256 {built_sha} ({} bytes). Run `cargo xtask build-ebpf` and commit \
         {COMMITTED_OBJECT}",
        committed.len(),
        built.len()
    );
    println!(
        "==> {COMMITTED_OBJECT} is up to date: {} bytes, sha256 {committed_sha}",
        committed.len()
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// test / ci
// ---------------------------------------------------------------------------------------------

fn test(args: &[OsString]) -> Result<()> {
    println!("==> cargo test --workspace");
    run(cargo().args(["test", "--workspace"]).args(args))
}

struct Step {
    name: &'static str,
    what: String,
    action: Box<dyn Fn() -> Result<()>>,
}

impl Step {
    fn new(
        name: &'static str,
        what: impl Into<String>,
        action: impl Fn() -> Result<()> + 'static,
    ) -> Self {
        Self {
            name,
            what: what.into(),
            action: Box::new(action),
        }
    }

    /// A step that runs the workspace's cargo with `args` in `dir` (relative to the root).
    fn cargo(name: &'static str, dir: &'static str, args: &'static [&'static str]) -> Self {
        let what = match dir {
            "" => format!("cargo {}", args.join(" ")),
            dir => format!("cargo {} (in {dir}/)", args.join(" ")),
        };
        Self::new(name, what, move || {
            let root = workspace_root();
            let dir = if dir.is_empty() { root } else { root.join(dir) };
            run(cargo().current_dir(dir).args(args))
        })
    }
}

fn ci_steps() -> Vec<Step> {
    let mut steps = vec![
        Step::cargo("fmt", "", &["fmt", "--all", "--", "--check"]),
        Step::cargo("fmt-ebpf", EBPF_CRATE, &["fmt", "--check"]),
        Step::cargo(
            "clippy",
            "",
            &[
                "clippy",
                "--workspace",
                "--all-targets",
                "--",
                "-D",
                "warnings",
            ],
        ),
        Step::new(
            "clippy-ebpf",
            format!(
                "cargo clippy in {EBPF_CRATE}/ for the host target (lints the kernel program's \
                 Rust; the bpf target has no clippy here), -D warnings"
            ),
            || {
                let mut cmd = cargo();
                cmd.current_dir(workspace_root().join(EBPF_CRATE))
                    .env("RUSTC_BOOTSTRAP", "1")
                    .args([
                        "clippy",
                        "--target",
                        "x86_64-unknown-linux-gnu",
                        "--release",
                        "--",
                        "-D",
                        "warnings",
                    ]);
                run(&mut cmd)
            },
        ),
        Step::new(
            "check-ebpf",
            format!("cargo xtask check-ebpf ({COMMITTED_OBJECT} matches the sources)"),
            || check_ebpf(false),
        ),
        Step::cargo("build", "", &["build", "--workspace", "--all-targets"]),
        Step::new(
            "test",
            "cargo test --workspace --no-fail-fast -- --test-threads=2 (with CI=true unless CI is set)",
            || {
                let mut cmd = cargo();
                cmd.args(["test", "--workspace", "--no-fail-fast", "--", "--test-threads=2"]);
                // CI makes the end-to-end tests run (as root) instead of skipping.
                if std::env::var_os("CI").is_none() {
                    cmd.env("CI", "true");
                }
                run(&mut cmd)
            },
        ),
    ];
    if workspace_root().join("python/tests").is_dir() {
        steps.push(Step::new(
            "pip-install",
            "pip install ./python into a fresh venv and import it",
            || {
                let venv = workspace_root().join("target/py-venv");
                let _ = std::fs::remove_dir_all(&venv);
                run(command("python3").args(["-m", "venv"]).arg(&venv))?;
                run(command(venv.join("bin/pip"))
                    .args(["install", "--quiet"])
                    .arg(workspace_root().join("python")))?;
                run(command(venv.join("bin/python")).args([
                    "-c",
                    "import bpfprof; print('bpfprof', bpfprof.__version__, 'imports')",
                ]))
            },
        ));
        steps.push(Step::new(
            "pytest",
            "python3 -m pytest python/tests (with CI=true unless CI is set)",
            || {
                let mut cmd = command("python3");
                cmd.current_dir(workspace_root()).args([
                    "-m",
                    "pytest",
                    "-p",
                    "no:cacheprovider",
                    "python/tests",
                ]);
                if std::env::var_os("CI").is_none() {
                    cmd.env("CI", "true");
                }
                run(&mut cmd)
            },
        ));
    }
    // Last: the slowest step (about 5 minutes under TCG on 2 cores), and the others already
    // built what it packs into the guest.
    steps.push(Step::new(
        "vm-test",
        "cargo xtask vm-test --kernel all (the smoke suite on Debian's 6.1 and 6.12 kernels in QEMU)",
        || vm::vm_test("all"),
    ));
    steps
}

fn ci(list: bool, only: &[String]) -> Result<()> {
    let steps = ci_steps();
    let known: BTreeSet<&str> = steps.iter().map(|s| s.name).collect();
    for name in only {
        ensure!(
            known.contains(name.as_str()),
            "no CI step `{name}`; the steps are: {}",
            steps.iter().map(|s| s.name).collect::<Vec<_>>().join(", ")
        );
    }
    let steps: Vec<Step> = steps
        .into_iter()
        .filter(|s| only.is_empty() || only.iter().any(|o| o == s.name))
        .collect();
    if list {
        for (i, step) in steps.iter().enumerate() {
            println!("{:>2}. {:<11} {}", i + 1, step.name, step.what);
        }
        return Ok(());
    }

    let started = Instant::now();
    let mut results: Vec<(&Step, Result<Duration>)> = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        println!(
            "\n=== ci step {}/{}: {} — {}",
            i + 1,
            steps.len(),
            step.name,
            step.what
        );
        let t = Instant::now();
        let result = (step.action)().map(|()| t.elapsed());
        let failed = result.is_err();
        results.push((step, result));
        if failed {
            break;
        }
    }

    println!("\n=== ci summary");
    let mut failure = None;
    for step in &steps {
        let (status, time) = match results.iter().find(|(s, _)| s.name == step.name) {
            Some((_, Ok(d))) => ("ok", secs(*d)),
            Some((_, Err(e))) => {
                failure = Some((step.name, format!("{e:#}")));
                ("FAILED", String::new())
            }
            None => ("not run", String::new()),
        };
        println!("    {:<11} {:<8} {:>7}", step.name, status, time);
    }
    println!("    total {}", secs(started.elapsed()));
    match failure {
        Some((name, err)) => bail!("ci failed at step `{name}`: {err}"),
        None => {
            println!("ci: all {} steps passed", steps.len());
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standalone_manifest_resolves_inheritance() {
        let root = r#"
[workspace.package]
edition = "2021"
license = "MIT OR Apache-2.0"
version = "0.1.0"

[workspace.dependencies]
aya = "=0.14.0"
serde = { version = "1", features = ["derive"] }
"#;
        let member = r#"
[package]
name = "profiler-common"
edition.workspace = true
license = { workspace = true }
version.workspace = true

[features]
user = ["aya"]

[dependencies]
aya = { workspace = true, optional = true }
serde = { workspace = true, features = ["rc"] }
"#;
        let out = standalone_manifest(member, root).unwrap();
        let doc: DocumentMut = out.parse().unwrap();
        assert_eq!(doc["package"]["edition"].as_str(), Some("2021"));
        assert_eq!(
            doc["package"]["license"].as_str(),
            Some("MIT OR Apache-2.0")
        );
        assert_eq!(doc["package"]["version"].as_str(), Some("0.1.0"));
        assert_eq!(
            doc["dependencies"]["aya"]["version"].as_str(),
            Some("=0.14.0")
        );
        assert_eq!(doc["dependencies"]["aya"]["optional"].as_bool(), Some(true));
        let features: Vec<_> = doc["dependencies"]["serde"]["features"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_owned())
            .collect();
        assert_eq!(features, ["derive", "rc"]);
        assert!(!out.contains("workspace"), "{out}");
    }

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

    #[test]
    fn ebpf_env_filter() {
        for key in [
            "CARGO_TARGET_DIR",
            "CARGO_BUILD_TARGET",
            "CARGO_PKG_NAME",
            "CARGO",
            "RUSTC",
            "RUSTFLAGS",
            "RUSTUP_TOOLCHAIN",
            "__CARGO_FIX_PLZ",
        ] {
            assert!(leaks_into_ebpf_build(key), "{key}");
        }
        for key in ["CARGO_HOME", "PATH", "HOME", "RUSTUP_HOME"] {
            assert!(!leaks_into_ebpf_build(key), "{key}");
        }
    }
}
