//! Every path, version and package list the tasks name, in one place: where the kernel object is
//! built and committed, the toolchain it is built with, and what `setup` installs.

/// Fixed directory the kernel crate is copied to and built in, so its bytes do not depend on
/// where the checkout lives.
pub const EBPF_BUILD_DIR: &str = "/tmp/bpfprof-ebpf-build";
/// The kernel crate (its own cargo workspace).
pub const EBPF_CRATE: &str = "profiler-ebpf";
/// The crate the kernel crate shares types with userspace through.
pub const COMMON_CRATE: &str = "profiler-common";
/// Where the kernel crate's build leaves the object, relative to the crate.
pub const EBPF_ARTIFACT: &str = "target/bpfel-unknown-none/release/profiler";
/// The committed kernel object that userspace embeds with `include_bytes!`.
pub const COMMITTED_OBJECT: &str = "profiler-user/bpf/profiler.bpf.o";

/// Debian's cargo for the kernel side (package `cargo-web`).
pub const DEBIAN_CARGO: &str = "/usr/bin/cargo";
/// Debian's rustc for the kernel side (package `rustc-web`, with a prebuilt `core` for
/// `bpfel-unknown-none` in `libstd-rust-web-dev-bpf`).
pub const DEBIAN_RUSTC: &str = "/usr/bin/rustc";

/// The bpf-linker `setup` installs (built against [`LLVM_PREFIX`]).
pub const BPF_LINKER_VERSION: &str = "0.13.0";
/// Debian's LLVM 22 (`llvm-22-dev`), the one Debian's rustc uses; `/usr/bin/llvm-config` is
/// LLVM 14, which bpf-linker cannot link against.
pub const LLVM_PREFIX: &str = "/usr/lib/llvm-22";

/// Debian packages the build (first four) and the tests and benchmarks (the rest) need.
pub const APT_PACKAGES: &[&str] = &[
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
    // The free-threaded 3.13t built from source needs them for ctypes (its layout test reads
    // the interpreter's own objects through it) and zlib.
    "libffi-dev",
    "zlib1g-dev",
    "make",
    "curl",
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
    // libc's separate debug file: its internal functions (`start_thread`,
    // `__libc_start_call_main`) are named from its symbol table, which tests assert on.
    "libc6-dbg",
    "chromium",
    // The `bpfprof top` test drives the live view in a detached 80x24 terminal.
    "tmux",
    // The HotSpot tests compile and run a Java program on Debian's JDK 17.
    "openjdk-17-jdk-headless",
    // The export tests make a private CA and a server certificate for a TLS receiver.
    "openssl",
];

/// Where `setup` builds upstream pprof, with a directory of the GNU binutils it must use.
pub const PPROF_DIR: &str = "target/tools";

/// npm packages the tests use as independent readers of bpfprof's output formats.
pub const NPM_VALIDATORS: &[(&str, &str)] = &[
    ("pprof-format", "pprof-format@2"),
    ("speedscope", "speedscope@1"),
    ("ajv", "ajv@8"),
];

/// Where the npm validators are installed, under the workspace's target directory.
pub const VALIDATORS_DIR: &str = "target/validators";

/// Python modules the tests need, with the pip package providing each: the Python client's
/// (pytest, numpy), and the Prometheus project's own parser, which the agent's test reads
/// `/metrics` with (Debian's promtool comes only with the whole Prometheus server).
pub const PYTHON_MODULES: &[(&str, &str)] = &[
    ("pytest", "pytest"),
    ("numpy", "numpy"),
    ("prometheus_client", "prometheus-client"),
    // The OTLP profiles receiver of tests/tests/agent/export.rs: the official generated stubs, at
    // the version whose protos (OTLP 1.10's v1development profiles) are those of the Rust
    // `opentelemetry-proto` crate the agent exports with, and gRPC.
    (
        "opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2_grpc",
        "opentelemetry-proto==1.45.2",
    ),
    ("grpc", "grpcio"),
];

/// Programs from PyPI the tests run: py-spy, the peer the Python-walk tests compare shares with.
pub const PYTHON_TOOLS: &[&str] = &["py-spy"];

/// The PyTorch venv the end-to-end tests (`tests/tests/python/pytorch.rs`) run: a fixed path outside
/// the checkout, so every worktree and CI run on this machine reuses one 4 GB install.
pub const TORCH_VENV: &str = "/opt/bpfprof/torch-venv";
/// The interpreter of that venv: Debian's, which a non-root test user can run (pyenv's live
/// under /root, mode 700).
pub const TORCH_BASE_PYTHON: &str = "/usr/bin/python3.11";
/// torch's dependencies left out of the venv: triton (1 GB) only compiles GPU kernels; CPU
/// models and `torch.compile` on CPU (inductor's C++ backend) run without it. Every other
/// dependency is needed: `import torch` loads the CUDA libraries even without a GPU.
pub const TORCH_SKIPPED_DEPS: &[&str] = &["triton"];
/// What `setup` checks the venv with: torch imports and trains a step of a CPU model.
pub const TORCH_PROBE: &str = "import torch\n\
torch.set_num_threads(2)\n\
m = torch.nn.Linear(8, 2)\n\
m(torch.ones(4, 8)).sum().backward()\n\
print(torch.__version__)";

/// The cargo-fuzz crate of the parsers' fuzz targets (its own workspace).
pub const FUZZ_DIR: &str = "fuzz";
/// The cargo-fuzz `setup` installs.
pub const CARGO_FUZZ_VERSION: &str = "0.13.2";
/// The toolchain the fuzz targets are built with where it is installed: cargo-fuzz's
/// sanitizers need nightly (rustup's `nightly` is on these machines; none can be fetched).
pub const FUZZ_TOOLCHAIN: &str = "nightly";
/// Seconds `cargo xtask fuzz` runs each target by default: eight targets stay under three
/// minutes of CI (after a build of about five), and every committed input is replayed first.
pub const FUZZ_SECONDS_PER_TARGET: u64 = 20;
/// libFuzzer's `-timeout`: one input taking longer is a hang. The unwind-table builder's own
/// CPU budget per object is 5 s; every seed takes milliseconds, under AddressSanitizer too.
pub const FUZZ_TIMEOUT_SECONDS: u64 = 10;
/// libFuzzer's `-malloc_limit_mb`: no input (at most tens of KiB) may make one allocation
/// larger, the blow-ups of issue 23 (3 GB from a 620 KB ELF, from a cyclic thread list) being
/// exactly that.
pub const FUZZ_MALLOC_LIMIT_MB: u64 = 64;
/// libFuzzer's `-rss_limit_mb`: the whole fuzzing process, AddressSanitizer's shadow memory and
/// quarantine (256 MiB) included.
pub const FUZZ_RSS_LIMIT_MB: u64 = 1024;
