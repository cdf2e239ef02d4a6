//! `cargo xtask build-ebpf`: builds the kernel object reproducibly and copies it into the tree.
//!
//! The object is built with Debian's `rustc-web` and `bpf-linker`: the rustup toolchains here
//! have no `rust-src`, so `-Z build-std=core` (and aya-build, which runs `rustup run nightly`
//! with it) cannot build for `bpfel-unknown-none`, while Debian's `libstd-rust-web-dev-bpf`
//! ships a prebuilt `core` for that target. The object's bytes depend on the absolute path of
//! the crates it is built from (cargo's metadata hashes, which end up in mangled symbol names),
//! so it is always built from a copy of the sources in one fixed directory
//! ([`EBPF_BUILD_DIR`]), wherever the checkout lives.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{ensure, Context, Result};
use sha2::{Digest, Sha256};
use toml_edit::{DocumentMut, InlineTable, Item, Table, TableLike, Value};

use crate::cmd::{probe, run, secs, workspace_root};
use crate::consts::{
    COMMITTED_OBJECT, COMMON_CRATE, DEBIAN_CARGO, DEBIAN_RUSTC, EBPF_ARTIFACT, EBPF_BUILD_DIR,
    EBPF_CRATE,
};

/// Options of `cargo xtask build-ebpf`.
#[derive(clap::Args)]
pub struct Options {
    /// Where to put the object.
    #[arg(long, value_name = "PATH")]
    out: Option<PathBuf>,
    /// Wipe the build directory's target/ first (a full rebuild).
    #[arg(long)]
    clean: bool,
}

/// Builds the kernel object and writes it to `--out` (default: the committed object).
pub fn build_ebpf_cmd(Options { out, clean }: Options) -> Result<()> {
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

/// The `bpf-linker` in PATH's `--version` line, `None` when it is not installed.
pub fn bpf_linker_version() -> Option<String> {
    probe(Command::new("bpf-linker").arg("--version")).map(|v| v.trim().to_owned())
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

/// The SHA-256 of `bytes` in lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
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

/// Copies one file, naming both paths on failure.
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
pub fn build_ebpf(clean: bool) -> Result<Vec<u8>> {
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
