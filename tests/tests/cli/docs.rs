//! The documentation against the tree and the real command line: every relative link in the
//! README, BENCHMARKS.md and `docs/` resolves to a file (and, into a Markdown file, to one of
//! its headings), and every long flag the README and `docs/` give bpfprof exists in the
//! `--help` of the command it is written with. No root needed: it runs `--help` only.
//!
//! The Markdown is read with pulldown-cmark, so links, headings and code are what a renderer
//! sees (not what a regular expression guesses); anchors follow GitHub's heading ids.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use bpfprof_tests::*;
use pulldown_cmark::{Event, Options, Parser, Tag, TagEnd};

/// bpfprof's subcommands, each with its own `--help`.
const SUBCOMMANDS: [&str; 10] = [
    "daemon", "run", "status", "stop", "results", "list", "doctor", "agent", "top", "dump",
];

/// `strobeclient`'s subcommands (`bpfprof strobeclient SUB`, or the binary under that name).
const STROBECLIENT: [&str; 3] = ["run", "getRunStatus", "stopRun"];

/// Flags the docs write in code on their own that belong to another tool, with the tool: the
/// docs compare bpfprof with it or say how to run the checks. Anything else written as
/// `--flag` must be bpfprof's, and each entry here must still be used.
const OTHER_TOOLS: [(&str, &str); 2] = [("--idle", "py-spy"), ("--only", "cargo xtask ci")];

/// One Markdown file as the checks need it.
struct Doc {
    path: PathBuf,
    /// Link and image destinations.
    links: Vec<String>,
    /// Ids of its headings, as GitHub makes them.
    anchors: BTreeSet<String>,
    /// Inline code spans and the lines of code blocks.
    code: Vec<String>,
}

fn read_doc(path: &Path) -> Doc {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let mut doc = Doc {
        path: path.to_path_buf(),
        links: Vec::new(),
        anchors: BTreeSet::new(),
        code: Vec::new(),
    };
    let mut heading: Option<String> = None;
    let mut block: Option<String> = None;
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for event in Parser::new_ext(&text, Options::ENABLE_TABLES) {
        match event {
            Event::Start(Tag::Link { dest_url, .. } | Tag::Image { dest_url, .. }) => {
                doc.links.push(dest_url.to_string())
            }
            Event::Start(Tag::Heading { .. }) => heading = Some(String::new()),
            Event::End(TagEnd::Heading(_)) => {
                let slug = slug(&heading.take().unwrap_or_default());
                // GitHub numbers repeated ids: `x`, `x-1`, `x-2`.
                let n = seen.entry(slug.clone()).or_insert(0);
                doc.anchors
                    .insert(if *n == 0 { slug } else { format!("{slug}-{n}") });
                *n += 1;
            }
            Event::Start(Tag::CodeBlock(_)) => block = Some(String::new()),
            Event::End(TagEnd::CodeBlock) => {
                doc.code
                    .extend(block.take().unwrap_or_default().lines().map(String::from));
            }
            Event::Text(t) => {
                if let Some(h) = heading.as_mut() {
                    h.push_str(&t);
                }
                if let Some(b) = block.as_mut() {
                    b.push_str(&t);
                }
            }
            Event::Code(c) => {
                if let Some(h) = heading.as_mut() {
                    h.push_str(&c);
                }
                doc.code.push(c.to_string());
            }
            _ => {}
        }
    }
    doc
}

/// GitHub's id for a heading: lower case, punctuation other than `-` and `_` dropped, spaces
/// to `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The Markdown files whose links are checked, and those whose flags are.
fn docs() -> (Vec<PathBuf>, Vec<PathBuf>) {
    let root = workspace_root();
    let mut flagged = vec![root.join("README.md")];
    let mut pages: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/ exists")
        .map(|e| e.expect("reading docs/").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    pages.sort();
    assert!(pages.len() >= 10, "docs/ holds {} pages", pages.len());
    flagged.extend(pages);
    let mut linked = flagged.clone();
    for extra in ["BENCHMARKS.md", "bench/README.md", "python/README.md"] {
        linked.push(root.join(extra));
    }
    (linked, flagged)
}

/// Problems with one document's relative links.
fn broken_links(doc: &Doc, by_path: &BTreeMap<PathBuf, Doc>) -> Vec<String> {
    let dir = doc.path.parent().expect("a file has a folder");
    let mut broken = Vec::new();
    for link in &doc.links {
        if link.contains("://") || link.starts_with("mailto:") {
            continue;
        }
        let (file, anchor) = link.split_once('#').unwrap_or((link, ""));
        let target = if file.is_empty() {
            doc.path.clone()
        } else {
            dir.join(file)
        };
        let Ok(target) = target.canonicalize() else {
            broken.push(format!("{link}: no such file"));
            continue;
        };
        if anchor.is_empty() || target.extension().is_none_or(|e| e != "md") {
            continue;
        }
        let anchors = match by_path.get(&target) {
            Some(d) => d.anchors.clone(),
            None => read_doc(&target).anchors,
        };
        if !anchors.contains(anchor) {
            broken.push(format!(
                "{link}: no heading #{anchor} there (headings: {anchors:?})"
            ));
        }
    }
    broken
}

#[test]
fn every_relative_link_resolves() {
    let (linked, _) = docs();
    let by_path: BTreeMap<PathBuf, Doc> = linked
        .iter()
        .map(|p| (p.canonicalize().expect("doc exists"), read_doc(p)))
        .collect();
    let mut broken = Vec::new();
    let mut checked = 0;
    for doc in by_path.values() {
        checked += doc.links.len();
        for b in broken_links(doc, &by_path) {
            broken.push(format!("{}: {b}", doc.path.display()));
        }
    }
    eprintln!("{checked} links checked in {} files", by_path.len());
    assert!(
        checked > 50,
        "only {checked} links found: is the parser reading the docs?"
    );
    assert!(
        broken.is_empty(),
        "{} broken links:\n{}",
        broken.len(),
        broken.join("\n")
    );
}

/// The long flags in one `--help` output: those its option lines define.
fn help_flags(args: &[&str]) -> BTreeSet<String> {
    let out = Command::new(bpfprof_bin())
        .args(args)
        .arg("--help")
        .output()
        .unwrap_or_else(|e| panic!("running bpfprof {args:?} --help: {e}"));
    assert!(out.status.success(), "bpfprof {args:?} --help: {out:?}");
    let option = regex::Regex::new(r"^\s+(?:-[A-Za-z0-9], )?(--[a-z0-9][a-z0-9-]*)").unwrap();
    let flags: BTreeSet<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| option.captures(l).map(|c| c[1].to_string()))
        .collect();
    assert!(
        flags.contains("--help"),
        "bpfprof {args:?} --help lists no options: {flags:?}"
    );
    flags
}

/// Every command line's flags, keyed by the command (`bpfprof`, `bpfprof run`,
/// `strobeclient run`...).
fn real_flags() -> BTreeMap<String, BTreeSet<String>> {
    let mut flags = BTreeMap::new();
    flags.insert("bpfprof".to_string(), help_flags(&[]));
    for sub in SUBCOMMANDS {
        flags.insert(format!("bpfprof {sub}"), help_flags(&[sub]));
    }
    for sub in STROBECLIENT {
        flags.insert(
            format!("strobeclient {sub}"),
            help_flags(&["strobeclient", sub]),
        );
    }
    flags
}

/// The command a shell word starts, where it is bpfprof or strobeclient: `bpfprof`,
/// `./target/release/bpfprof`, `$(target/debug/bpfprof`.
fn program(word: &str) -> Option<&'static str> {
    let word = word.rsplit("$(").next().unwrap_or(word);
    if word.contains('=') {
        return None;
    }
    match word.rsplit('/').next() {
        Some("bpfprof") => Some("bpfprof"),
        Some("strobeclient") => Some("strobeclient"),
        _ => None,
    }
}

/// The long flag a shell word gives (`--pid`, `--python-view=off`, `[--sample-tags`), if any.
fn long_flag(word: &str) -> Option<String> {
    let word = word.trim_start_matches(['[', '(', '`', '"', '\'']);
    let rest = word.strip_prefix("--")?;
    let name: String = rest
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
        .collect();
    // `--otlp-*` names a family of flags: kept with its star, matched as a prefix.
    let star = if rest[name.len()..].starts_with('*') {
        "*"
    } else {
        ""
    };
    (!name.is_empty() && name.starts_with(|c: char| c.is_ascii_lowercase()))
        .then(|| format!("--{name}{star}"))
}

/// Whether `flag` is one of `flags`, or, written as `--prefix-*`, names some of them.
fn is_one_of<'a>(flag: &str, mut flags: impl Iterator<Item = &'a String>) -> bool {
    match flag.strip_suffix('*') {
        Some(prefix) => flags.any(|f| f.starts_with(prefix)),
        None => flags.any(|f| f == flag),
    }
}

/// Each flag written in a piece of code, with the command it is given to (`None` for a bare
/// flag in prose, such as `` `--off-cpu` ``).
fn written_flags(code: &str) -> Vec<(Option<String>, String)> {
    let mut found = Vec::new();
    for line in code.lines() {
        // A shell comment ends what the command line says.
        let line = line.split(" #").next().unwrap_or(line);
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.first().is_some_and(|w| w.starts_with('-')) && !words.contains(&"--") {
            // A flag named in prose: `--max-stack-length N`, `-d/--duration 500ms|3s|2m`.
            for w in &words {
                for part in w.split('/') {
                    if let Some(f) = long_flag(part) {
                        found.push((None, f));
                    }
                }
            }
            continue;
        }
        let mut i = 0;
        while i < words.len() {
            let Some(prog) = program(words[i]) else {
                i += 1;
                continue;
            };
            i += 1;
            let mut command = prog.to_string();
            if prog == "bpfprof" && words.get(i) == Some(&"strobeclient") {
                command = "strobeclient".into();
                i += 1;
            }
            let subs: &[&str] = if command == "bpfprof" {
                &SUBCOMMANDS
            } else {
                &STROBECLIENT
            };
            if let Some(sub) = words.get(i).filter(|w| subs.contains(*w)) {
                command = format!("{command} {sub}");
                i += 1;
            }
            while let Some(w) = words.get(i) {
                // The end of bpfprof's own arguments: a launched command, a pipe, the next
                // command.
                if ["--", "|", "&&", "||", ";", "&"].contains(w) || w.ends_with(';') {
                    break;
                }
                if let Some(f) = long_flag(w) {
                    found.push((Some(command.clone()), f));
                }
                i += 1;
            }
        }
    }
    found
}

#[test]
fn every_flag_in_the_docs_exists() {
    let real = real_flags();
    let any: BTreeSet<&String> = real.values().flatten().collect();
    let other: BTreeMap<&str, &str> = OTHER_TOOLS.into_iter().collect();
    let (_, flagged) = docs();
    let mut missing = BTreeSet::new();
    let mut others_used = BTreeSet::new();
    let mut checked = 0;
    for path in &flagged {
        let doc = read_doc(path);
        for code in &doc.code {
            for (command, flag) in written_flags(code) {
                checked += 1;
                let known = match &command {
                    // A command line: the flag must be that command's (strobeclient's too;
                    // a `bpfprof` with no subcommand is the recorder).
                    Some(c) => real.get(c).is_some_and(|f| is_one_of(&flag, f.iter())),
                    None if is_one_of(&flag, any.iter().copied()) => true,
                    None => {
                        let theirs = other.contains_key(flag.as_str());
                        if theirs {
                            others_used.insert(flag.clone());
                        }
                        theirs
                    }
                };
                if !known {
                    missing.insert(format!(
                        "{}: {flag} (in `{code}`{})",
                        path.strip_prefix(workspace_root())
                            .unwrap_or(path)
                            .display(),
                        command
                            .map(|c| format!(", given to {c}"))
                            .unwrap_or_default()
                    ));
                }
            }
        }
    }
    eprintln!("{checked} flags checked in {} files", flagged.len());
    assert!(
        checked > 200,
        "only {checked} flags found: is the parser reading the docs?"
    );
    let unused: Vec<_> = other
        .iter()
        .filter(|(f, _)| !others_used.contains(**f))
        .collect();
    assert!(
        unused.is_empty(),
        "OTHER_TOOLS lists flags the docs no longer write: {unused:?}"
    );
    assert!(
        missing.is_empty(),
        "{} flags in the docs that the command line does not have:\n{}",
        missing.len(),
        missing.into_iter().collect::<Vec<_>>().join("\n")
    );
}

/// The extraction itself, on lines of the kinds the docs hold.
#[test]
fn flags_are_read_from_command_lines_and_prose() {
    let got = written_flags(
        "sudo bpfprof -F 999 -o out.svg --per-thread -- ./bench --iters 100 # --nope\n\
         id=$(target/debug/bpfprof run --socket $D/sock --pid $P --async | sed -n p)\n\
         bpfprof strobeclient run --profiler pyperf [--sample-tags a,b]\n\
         BPFPROF_BENCH_BIN=$PWD/target/release/bpfprof cargo xtask bench --quick",
    );
    let want: Vec<(Option<String>, String)> = [
        ("bpfprof", "--per-thread"),
        ("bpfprof run", "--socket"),
        ("bpfprof run", "--pid"),
        ("bpfprof run", "--async"),
        ("strobeclient run", "--profiler"),
        ("strobeclient run", "--sample-tags"),
    ]
    .into_iter()
    .map(|(c, f)| (Some(c.to_string()), f.to_string()))
    .collect();
    assert_eq!(got, want);
    assert_eq!(
        written_flags("-d/--duration 500ms|3s|2m"),
        vec![(None, "--duration".to_string())]
    );
    assert_eq!(
        written_flags("--python-view=off"),
        vec![(None, "--python-view".to_string())]
    );
    assert_eq!(
        written_flags("--otlp-*"),
        vec![(None, "--otlp-*".to_string())]
    );
    assert_eq!(
        slug("Timeline: `.trace.json` for Perfetto"),
        "timeline-tracejson-for-perfetto"
    );
    assert_eq!(
        slug("Leaf-only stacks after a `dlopen`"),
        "leaf-only-stacks-after-a-dlopen"
    );
}
