//! The source tree's layering: each top-level module of the library uses only the modules
//! `lib.rs` lists after it (plus the shared ones), so the tree reads from the drivers down to
//! what they stand on and no file imports "upward".

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
    let code: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut used = BTreeSet::new();
    let bytes = code.as_bytes();
    let ident = |from: usize| -> String {
        code[from..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut at = 0;
    while let Some(found) = code[at..].find("crate::") {
        let start = at + found + "crate::".len();
        at = start;
        if bytes.get(start) == Some(&b'{') {
            // A grouped use: every path that starts at depth one names a module.
            let (mut depth, mut i, mut segment_start) = (1, start + 1, true);
            while depth > 0 && i < bytes.len() {
                let c = bytes[i];
                if depth == 1 && segment_start && (c.is_ascii_alphabetic() || c == b'_') {
                    let name = ident(i);
                    i += name.len();
                    used.insert(name);
                    segment_start = false;
                    continue;
                }
                match c {
                    b'{' => depth += 1,
                    b'}' => depth -= 1,
                    b',' if depth == 1 => segment_start = true,
                    _ => {}
                }
                i += 1;
            }
        } else {
            used.insert(ident(start));
        }
    }
    used
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

#[test]
fn the_check_sees_grouped_and_plain_paths() {
    let used = used_modules(
        "use crate::{\n    kernel::{a, b::c},\n    output,\n};\nfn f() { crate::cli::x(); }\n// crate::daemon in a comment\n",
    );
    let expected: BTreeSet<String> = ["kernel", "output", "cli"].map(String::from).into();
    assert_eq!(used, expected);
}
