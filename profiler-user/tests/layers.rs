//! The source tree's layering: each top-level module of the library uses only the modules
//! `lib.rs` lists after it (plus the shared ones), so the tree reads from the drivers down to
//! what they stand on and no file imports "upward"; and inside a layer, no two of its modules
//! use each other (a circle: neither can be read, tested or moved without the other).

use std::{collections::BTreeSet, fs, path::Path};

/// The layers, top to bottom, as `lib.rs` lists them.
const LAYERS: &[&str] = &[
    "cli",
    "daemon",
    "agent",
    "recording",
    "runtime",
    "kernel",
    "unwind",
    "output",
    "profile",
    "symbolize",
    "process",
];

/// Modules every layer may use: shared settings and errors, the client crate's re-exports.
const SHARED: &[&str] = &[
    "error",
    "sampling",
    "clock",
    "trusted_dir",
    "protocol",
    "client",
    "Error",
    "Result",
];

/// The crate-level modules a file's code names (`crate::x::...` and `use crate::{x, ...}`),
/// comments left out.
fn used_modules(text: &str) -> BTreeSet<String> {
    paths_after(text, "crate::")
        .into_iter()
        .map(|p| p[0].clone())
        .collect()
}

/// The paths a file's code writes right after `prefix`, use groups expanded: `crate::{a::{b,
/// c}, d}` gives `a::b`, `a::c` and `d`; comments left out.
fn paths_after(text: &str, prefix: &str) -> Vec<Vec<String>> {
    let code: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut paths = Vec::new();
    let mut at = 0;
    while let Some(found) = code[at..].find(prefix) {
        let pos = at + found;
        at = pos + prefix.len();
        // `super::x` inside `super::super::x` is not `prefix` then `x`.
        if code[..pos].ends_with("::") {
            continue;
        }
        let mut i = at;
        use_tree(&code, &mut i, Vec::new(), &mut paths);
    }
    paths.retain(|p| !p.is_empty() && !["super", "self", "crate"].contains(&p[0].as_str()));
    paths
}

/// Reads the use tree at `*i` below `base` into `paths` (a path, or a `{...}` group of trees).
fn use_tree(code: &str, i: &mut usize, base: Vec<String>, paths: &mut Vec<Vec<String>>) {
    let skip_space = |i: &mut usize| {
        while code
            .as_bytes()
            .get(*i)
            .is_some_and(|c| c.is_ascii_whitespace())
        {
            *i += 1;
        }
    };
    skip_space(i);
    if code.as_bytes().get(*i) == Some(&b'{') {
        *i += 1;
        loop {
            skip_space(i);
            match code.as_bytes().get(*i) {
                None => return,
                Some(b'}') => {
                    *i += 1;
                    return;
                }
                Some(b',') => *i += 1,
                Some(_) => {
                    let before = *i;
                    use_tree(code, i, base.clone(), paths);
                    if *i == before {
                        *i += 1;
                    }
                }
            }
        }
    }
    let name: String = code[*i..]
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    if name.is_empty() {
        // A glob (`*`) or the path's end.
        if !base.is_empty() {
            paths.push(base);
        }
        return;
    }
    *i += name.len();
    let mut path = base;
    path.push(name);
    if code[*i..].starts_with("::") {
        *i += 2;
        use_tree(code, i, path, paths);
    } else {
        paths.push(path);
    }
}

/// The `.rs` files below `dir`.
fn rust_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files
}

/// Pairs of modules of one layer that use each other ("unwind: builder <-> loader"). A
/// module is a file or a folder right below the layer's folder; it uses a sibling `x` through
/// `crate::LAYER::x`, or `super::x` from its top file (`super::super::x` one folder down).
fn circles(src: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for layer in LAYERS {
        let dir = src.join(layer);
        if !dir.is_dir() {
            continue;
        }
        let mut uses: BTreeSet<(String, String)> = BTreeSet::new();
        for file in rust_files(&dir) {
            let relative = file.strip_prefix(&dir).unwrap();
            let parts: Vec<&str> = relative.iter().map(|p| p.to_str().unwrap()).collect();
            if parts == ["mod.rs"] {
                continue;
            }
            let module = parts[0].trim_end_matches(".rs").to_string();
            let text = fs::read_to_string(&file).unwrap();
            let mut named: BTreeSet<String> = paths_after(&text, "crate::")
                .into_iter()
                .filter(|p| p.len() > 1 && p[0] == *layer)
                .map(|p| p[1].clone())
                .collect();
            // How far up the layer's folder is from this file's module.
            let up = match parts.len() {
                1 => "super::".to_string(),
                2 if parts[1] == "mod.rs" => "super::".to_string(),
                n => "super::".repeat(if parts[n - 1] == "mod.rs" { n - 1 } else { n }),
            };
            named.extend(paths_after(&text, &up).into_iter().map(|p| p[0].clone()));
            for other in named {
                if other != module {
                    uses.insert((module.clone(), other));
                }
            }
        }
        for (a, b) in &uses {
            if a < b && uses.contains(&(b.clone(), a.clone())) {
                found.push(format!("{layer}: {a} <-> {b}"));
            }
        }
    }
    found
}

fn check_dir(dir: &Path, layer: usize, upward: &mut Vec<String>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            check_dir(&path, layer, upward);
        } else if path.extension().is_some_and(|e| e == "rs") {
            for used in used_modules(&fs::read_to_string(&path).unwrap()) {
                match LAYERS.iter().position(|l| *l == used) {
                    Some(at) if at < layer => upward.push(format!(
                        "{} uses crate::{used}, a layer above {}",
                        path.display(),
                        LAYERS[layer]
                    )),
                    Some(_) => {}
                    None => assert!(
                        SHARED.contains(&used.as_str()),
                        "{} uses crate::{used}, which is neither a layer nor shared",
                        path.display()
                    ),
                }
            }
        }
    }
}

#[test]
fn no_module_uses_a_layer_above_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = fs::read_to_string(src.join("lib.rs")).unwrap();
    let declared: Vec<&str> = lib
        .lines()
        .filter_map(|l| l.strip_prefix("pub mod "))
        .map(|l| l.trim_end_matches(';'))
        .filter(|m| !SHARED.contains(m))
        .collect();
    assert_eq!(
        declared, LAYERS,
        "lib.rs's modules and this test's layers differ"
    );
    let mut upward = Vec::new();
    for (layer, name) in LAYERS.iter().enumerate() {
        let dir = src.join(name);
        if dir.is_dir() {
            check_dir(&dir, layer, &mut upward);
        } else {
            let file = src.join(format!("{name}.rs"));
            for used in used_modules(&fs::read_to_string(&file).unwrap()) {
                if LAYERS[..layer].contains(&used.as_str()) {
                    upward.push(format!("{} uses crate::{used}", file.display()));
                }
            }
        }
    }
    assert!(upward.is_empty(), "imports upward:\n{}", upward.join("\n"));
}

/// The circles there were when the count began (2026-11-29): issue 40 lists agent's and
/// cli's (and two in xtask's bench, another crate); the count found four more in kernel and
/// process. Unwind's loader and builder no longer use each other (`FileKey` has a file of its
/// own), nor agent's export and Pyroscope client (their shared send rules are in
/// `agent/send.rs`). None may be added; take one out of this list when it goes.
const KNOWN_CIRCLES: &[&str] = &[
    "cli: args <-> top",
    "kernel: load <-> walker",
    "kernel: program <-> walker",
    "process: copies <-> maps",
    "process: maps <-> target_file",
];

#[test]
fn no_two_modules_of_a_layer_use_each_other() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let found = circles(&src);
    eprintln!("{} circles: {found:?}", found.len());
    let new: Vec<&String> = found
        .iter()
        .filter(|c| !KNOWN_CIRCLES.contains(&c.as_str()))
        .collect();
    assert!(new.is_empty(), "modules that use each other: {new:?}");
    let gone: Vec<&&str> = KNOWN_CIRCLES
        .iter()
        .filter(|c| !found.iter().any(|f| f == *c))
        .collect();
    assert!(
        gone.is_empty(),
        "circles gone: take them out of KNOWN_CIRCLES: {gone:?}"
    );
}

#[test]
fn nested_groups_and_globs_are_read_as_paths() {
    let paths = paths_after(
        "use crate::{\n    agent::{export::{a, B}, pyroscope},\n    cli::*,\n};\nuse super::super::x;\n",
        "crate::",
    );
    let joined: Vec<String> = paths.iter().map(|p| p.join("::")).collect();
    assert_eq!(
        joined,
        [
            "agent::export::a",
            "agent::export::B",
            "agent::pyroscope",
            "cli"
        ]
    );
    let up: Vec<Vec<String>> =
        paths_after("use super::super::x;\nuse super::{y, z::w};", "super::");
    assert_eq!(up, [vec!["y".to_string()], vec!["z".into(), "w".into()]]);
}

#[test]
fn the_check_sees_grouped_and_plain_paths() {
    let used = used_modules(
        "use crate::{\n    kernel::{a, b::c},\n    output,\n};\nfn f() { crate::cli::x(); }\n// crate::daemon in a comment\n",
    );
    let expected: BTreeSet<String> = ["kernel", "output", "cli"].map(String::from).into();
    assert_eq!(used, expected);
}
