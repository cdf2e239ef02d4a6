//! Python's `pstats` format, as cProfile writes it: what `pstats.Stats(path)`, snakeviz and
//! the other cProfile viewers load.
//!
//! The file is a `marshal` dump of one dict: `(filename, lineno, funcname)` maps to
//! `(cc, nc, tt, ct, callers)`, and `callers` maps each caller's key to `(nc, cc, tt, ct)`
//! (cProfile's order inside callers: total calls first, unlike the outer tuple).
//!
//! A sampling profiler sees no calls, so every number is derived from samples:
//! - a sample stands for `1 / nominal_hz` seconds (1 ms when the rate is unknown);
//! - `nc` counts the samples a function is on the stack, once per appearance, and `cc` counts
//!   them once per stack, so recursion shows as `nc/cc` just as cProfile's primitive calls do;
//! - `tt` is the time of the samples with the function at the leaf, and `ct` the time of the
//!   samples with it anywhere on the stack, recursion counted once (`cc` samples);
//! - a caller entry counts the samples where the caller sits directly above the function:
//!   `nc` per appearance of that pair, `cc` and `ct` once per stack, and `tt` when the
//!   function is the leaf. Call counts are therefore sample counts, not calls.
//!
//! Keys: a user frame's filename is its source file, else its binary, else `~`; a kernel
//! frame's is `[kernel]` (with the kernel module's name when it is not the core kernel);
//! the line is the function's first line (with `--line-numbers`, where debug info has it),
//! else 0, as cProfile keys a function by where it starts: a function is one entry whichever
//! of its lines were sampled (pprof keeps the per-line detail). Frames mapping to one key merge.
//!
//! Every frame of every stack but the run's tags becomes an entry, the non-code ones as
//! `("~", 0, name)` like cProfile's built-ins: the process, threads and `[truncated]`. So the
//! tree is rooted at the process as in the other formats, which snakeviz needs (it draws one
//! root and hides the others), and truncation is visible. Tags stay out of the call tree: as
//! root levels (one per tag) they pushed the program's functions below snakeviz's deepest view
//! (20 levels); the other formats carry them. `total_tt` is the profile's sample time.
//!
//! An empty profile writes one zero entry, `[no samples]`: `pstats.Stats` refuses an empty
//! table.
//!
//! The marshal writer is this file's own: the crates that write marshal are unfit
//! (`py-marshal` only reads and is unmaintained; `python_marshal` is GPL-3.0, which the
//! project's MIT/Apache-2.0 license excludes, and is built around `.pyc` files), and the
//! few types pstats needs take a few dozen lines.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    io::{self, Write},
};

use crate::{
    profile::{Profile, ProfileFrame},
    symbolize::FrameKind,
};

/// Seconds a sample stands for when the profile does not know its rate.
const FALLBACK_SAMPLE_SECS: f64 = 1.0 / 1000.0;

/// Writes `profile` as a pstats file.
pub fn write(profile: &Profile, w: &mut impl Write) -> io::Result<()> {
    let dt = sample_secs(profile);
    let functions = function_stats(profile);
    // Samples times the period; with off-CPU time, the stacks' own nanoseconds (CPU and
    // waiting alike), so that a function that waits shows its wait as time.
    let off_cpu = profile.meta.off_cpu.is_some();
    let time = |samples: u64, ns: u64| {
        if off_cpu {
            ns as f64 * 1e-9
        } else {
            samples as f64 * dt
        }
    };
    marshal::dict_start(w)?;
    if functions.is_empty() {
        // pstats refuses an empty table; one zero entry says what happened instead.
        write_key(w, &("~".to_string(), 0, "[no samples]".to_string()))?;
        marshal::tuple(w, 5)?;
        marshal::int(w, 0)?;
        marshal::int(w, 0)?;
        marshal::float(w, 0.0)?;
        marshal::float(w, 0.0)?;
        marshal::dict_start(w)?;
        marshal::dict_end(w)?;
    }
    for f in &functions {
        write_key(w, &f.key)?;
        marshal::tuple(w, 5)?;
        marshal::int(w, f.counts.stacks)?;
        marshal::int(w, f.counts.appearances)?;
        marshal::float(w, time(f.counts.leaf, f.counts.leaf_ns))?;
        marshal::float(w, time(f.counts.stacks, f.counts.stacks_ns))?;
        marshal::dict_start(w)?;
        for (&caller, edge) in &f.callers {
            write_key(w, &functions[caller].key)?;
            marshal::tuple(w, 4)?;
            marshal::int(w, edge.appearances)?;
            marshal::int(w, edge.stacks)?;
            marshal::float(w, time(edge.leaf, edge.leaf_ns))?;
            marshal::float(w, time(edge.stacks, edge.stacks_ns))?;
        }
        marshal::dict_end(w)?;
    }
    marshal::dict_end(w)
}

fn sample_secs(profile: &Profile) -> f64 {
    let hz = profile.meta.sampling.nominal_hz;
    if hz.is_finite() && hz > 0.0 {
        1.0 / hz
    } else {
        FALLBACK_SAMPLE_SECS
    }
}

/// `(filename, lineno, funcname)`.
type Key = (String, u32, String);

/// Sample counts of a function, or of one caller-callee pair.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Counts {
    /// Samples times appearances on the stack (pstats `nc`).
    appearances: u64,
    /// Samples with it on the stack at least once (pstats `cc`, and `ct` in samples).
    stacks: u64,
    /// Samples with it at the leaf (pstats `tt` in samples).
    leaf: u64,
    /// Nanoseconds of the stacks counted in `stacks` (a profile with off-CPU time only).
    stacks_ns: u64,
    /// Nanoseconds of the stacks counted in `leaf` (a profile with off-CPU time only).
    leaf_ns: u64,
}

#[derive(Debug)]
struct FunctionStats {
    key: Key,
    counts: Counts,
    /// Index of the caller in the function list -> counts of that pair.
    callers: BTreeMap<usize, Counts>,
}

/// Every function of the profile in order of first appearance, which keeps output stable.
fn function_stats(profile: &Profile) -> Vec<FunctionStats> {
    let mut functions: Vec<FunctionStats> = Vec::new();
    let mut index: HashMap<Key, usize> = HashMap::new();
    let mut of_frame: Vec<Option<usize>> = vec![None; profile.frames.len()];
    // Stack number that last counted each function, so a recursive one counts once a stack.
    let mut counted_in: Vec<usize> = Vec::new();
    let mut pairs_seen: HashSet<(usize, usize)> = HashSet::new();
    let mut ids: Vec<usize> = Vec::new();
    for (stack_no, stack) in profile.stacks.iter().enumerate() {
        ids.clear();
        for &frame in &stack.frames {
            if matches!(profile.frames[frame], ProfileFrame::Tag(_)) {
                continue;
            }
            let id = *of_frame[frame].get_or_insert_with(|| {
                let key = key(&profile.frames[frame]);
                *index.entry(key.clone()).or_insert_with(|| {
                    functions.push(FunctionStats {
                        key,
                        counts: Counts::default(),
                        callers: BTreeMap::new(),
                    });
                    counted_in.push(usize::MAX);
                    functions.len() - 1
                })
            });
            ids.push(id);
        }
        let n = stack.count;
        let ns = if profile.meta.off_cpu.is_some() {
            profile.stack_nanos(stack)
        } else {
            0
        };
        let Some(&leaf) = ids.last() else { continue };
        for &id in &ids {
            let counts = &mut functions[id].counts;
            counts.appearances += n;
            if counted_in[id] != stack_no {
                counted_in[id] = stack_no;
                counts.stacks += n;
                counts.stacks_ns += ns;
            }
        }
        functions[leaf].counts.leaf += n;
        functions[leaf].counts.leaf_ns += ns;
        pairs_seen.clear();
        for pair in ids.windows(2) {
            let (caller, callee) = (pair[0], pair[1]);
            let edge = functions[callee].callers.entry(caller).or_default();
            edge.appearances += n;
            if pairs_seen.insert((caller, callee)) {
                edge.stacks += n;
                edge.stacks_ns += ns;
            }
        }
        if let [.., caller, callee] = ids[..] {
            let edge = functions[callee].callers.entry(caller).or_default();
            edge.leaf += n;
            edge.leaf_ns += ns;
        }
    }
    functions
}

fn key(frame: &ProfileFrame) -> Key {
    match frame {
        ProfileFrame::Code(f) => {
            let file = match f.kind {
                FrameKind::Kernel => match f.module.as_deref() {
                    Some(m) if m != "[kernel]" => format!("[kernel] {m}"),
                    _ => "[kernel]".to_string(),
                },
                FrameKind::User | FrameKind::Runtime(_) => f
                    .file
                    .as_deref()
                    .or(f.module.as_deref())
                    .unwrap_or("~")
                    .to_string(),
            };
            // The function's first line, as cProfile keys a function: never the sampled
            // line, which would split one function into an entry per line.
            (file, f.start_line.unwrap_or(0), f.name.to_string())
        }
        other => ("~".to_string(), 0, other.name().to_string()),
    }
}

fn write_key(w: &mut impl Write, (file, line, name): &Key) -> io::Result<()> {
    marshal::tuple(w, 3)?;
    marshal::str(w, file)?;
    marshal::int(w, u64::from(*line))?;
    marshal::str(w, name)
}

/// A writer for the few types of CPython's `marshal` format that pstats uses; every version
/// of `marshal.load` since Python 3.0 reads them.
mod marshal {
    use std::io::{self, Write};

    const TYPE_NULL: u8 = b'0';
    const TYPE_INT: u8 = b'i';
    const TYPE_LONG: u8 = b'l';
    const TYPE_BINARY_FLOAT: u8 = b'g';
    const TYPE_UNICODE: u8 = b'u';
    const TYPE_TUPLE: u8 = b'(';
    const TYPE_DICT: u8 = b'{';

    /// Bits in one digit of a marshalled long, whatever CPython uses inside.
    const LONG_SHIFT: u32 = 15;

    fn len(w: &mut impl Write, n: usize) -> io::Result<()> {
        let n = i32::try_from(n)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "too long for marshal"))?;
        w.write_all(&n.to_le_bytes())
    }

    /// Writes a non-negative int, as a long when it does not fit the 32-bit int type.
    pub fn int(w: &mut impl Write, v: u64) -> io::Result<()> {
        if let Ok(small) = i32::try_from(v) {
            w.write_all(&[TYPE_INT])?;
            return w.write_all(&small.to_le_bytes());
        }
        let mut digits = Vec::new();
        let mut rest = v;
        while rest != 0 {
            digits.push((rest & ((1 << LONG_SHIFT) - 1)) as u16);
            rest >>= LONG_SHIFT;
        }
        w.write_all(&[TYPE_LONG])?;
        len(w, digits.len())?;
        digits
            .iter()
            .try_for_each(|d| w.write_all(&d.to_le_bytes()))
    }

    /// Writes a float.
    pub fn float(w: &mut impl Write, v: f64) -> io::Result<()> {
        w.write_all(&[TYPE_BINARY_FLOAT])?;
        w.write_all(&v.to_le_bytes())
    }

    /// Writes a str.
    pub fn str(w: &mut impl Write, s: &str) -> io::Result<()> {
        w.write_all(&[TYPE_UNICODE])?;
        len(w, s.len())?;
        w.write_all(s.as_bytes())
    }

    /// Starts a tuple of `n` items, which the caller writes next.
    pub fn tuple(w: &mut impl Write, n: usize) -> io::Result<()> {
        w.write_all(&[TYPE_TUPLE])?;
        len(w, n)
    }

    /// Starts a dict, whose keys and values the caller writes next, alternately.
    pub fn dict_start(w: &mut impl Write) -> io::Result<()> {
        w.write_all(&[TYPE_DICT])
    }

    /// Ends a dict.
    pub fn dict_end(w: &mut impl Write) -> io::Result<()> {
        w.write_all(&[TYPE_NULL])
    }
}

#[cfg(test)]
mod tests {
    use std::{
        path::{Path, PathBuf},
        process::Command,
    };

    use serde_json::Value;

    use super::*;
    use crate::{output::fixture, profile::StackCount};

    /// Writes `bytes` to a file of its own, removed on drop.
    struct TempFile(PathBuf);

    impl TempFile {
        fn new(tag: &str, bytes: &[u8]) -> TempFile {
            let path = std::env::temp_dir().join(format!(
                "bpfprof-pstats-test-{}-{tag}.prof",
                std::process::id()
            ));
            std::fs::write(&path, bytes).unwrap();
            TempFile(path)
        }
    }

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    /// Runs `script` with the file as `sys.argv[1]` and parses what it prints as JSON; `None`
    /// when python3 is missing outside CI, where a missing reader must fail the test.
    fn python(script: &str, path: &Path) -> Option<Value> {
        let out = match Command::new("python3")
            .arg("-c")
            .arg(script)
            .arg(path)
            .output()
        {
            Ok(out) => out,
            Err(e) if std::env::var("CI").as_deref() != Ok("true") => {
                eprintln!("skipped: python3 cannot run ({e})");
                return None;
            }
            Err(e) => panic!("python3 cannot run, and CI needs it: {e}"),
        };
        assert!(
            out.status.success(),
            "python3 failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Some(serde_json::from_slice(&out.stdout).expect("python printed JSON"))
    }

    const READ_STATS: &str = r#"
import io, json, pstats, sys
s = pstats.Stats(sys.argv[1])
out = io.StringIO()
s.stream = out
s.sort_stats("cumulative").print_stats()
s.print_callers()
s.print_callees()
funcs = {}
for (file, line, name), (cc, nc, tt, ct, callers) in s.stats.items():
    assert name not in funcs, name
    funcs[name] = {
        "file": file, "line": line, "stats": [cc, nc, tt, ct],
        "callers": {k[2]: list(v) for k, v in callers.items()},
    }
print(json.dumps({"funcs": funcs, "total_tt": s.total_tt, "total_calls": s.total_calls,
                  "prim_calls": s.prim_calls, "printed": out.getvalue()}))
"#;

    fn fixture_bytes() -> Vec<u8> {
        let mut bytes = Vec::new();
        write(&fixture::profile(), &mut bytes).unwrap();
        bytes
    }

    fn approx(v: &Value, expected: f64) -> bool {
        (v.as_f64().unwrap() - expected).abs() < 1e-9
    }

    #[test]
    fn counts_follow_the_stacks() {
        let functions = function_stats(&fixture::profile());
        let get = |name: &str| {
            functions
                .iter()
                .find(|f| f.key.2 == name)
                .unwrap_or_else(|| panic!("no {name}"))
        };
        let caller = |callee: &str, caller: &str| {
            let id = functions.iter().position(|f| f.key.2 == caller).unwrap();
            get(callee).callers[&id]
        };
        let counts = |appearances, stacks, leaf| Counts {
            appearances,
            stacks,
            leaf,
            ..Counts::default()
        };
        // Tags stay out of the call tree: the process is the root.
        assert!(functions.iter().all(|f| f.key.2 != "[phase=train]"));
        assert_eq!(get("app").counts, counts(100, 100, 0));
        assert!(get("app").callers.is_empty());
        assert_eq!(get("main").counts, counts(98, 98, 0));
        assert_eq!(get("leaf_hot").counts, counts(70, 70, 70));
        assert_eq!(caller("leaf_hot", "parent_hot"), counts(60, 60, 60));
        assert_eq!(caller("leaf_hot", "recurse"), counts(10, 10, 10));
        assert_eq!(get("recurse").counts, counts(20, 10, 0));
        assert_eq!(caller("recurse", "recurse"), counts(10, 10, 0));
        assert_eq!(caller("recurse", "main"), counts(10, 10, 0));
        assert_eq!(get("sys_write").counts, counts(8, 8, 8));
        assert_eq!(
            get("sys_write").key,
            ("[kernel]".into(), 0, "sys_write".into())
        );
        assert_eq!(get("[truncated]").counts, counts(2, 2, 0));
        assert_eq!(caller("deep", "[truncated]"), counts(2, 2, 2));
        let leaf_total: u64 = functions.iter().map(|f| f.counts.leaf).sum();
        assert_eq!(leaf_total, 100);
    }

    #[test]
    fn pstats_reads_the_fixture() {
        let file = TempFile::new("fixture", &fixture_bytes());
        let Some(out) = python(READ_STATS, &file.0) else {
            return;
        };
        let dt = 1.0 / 999.0;
        let funcs = &out["funcs"];
        let stats = |name: &str| funcs[name]["stats"].as_array().unwrap().clone();
        let callers = |name: &str, caller: &str| {
            funcs[name]["callers"][caller]
                .as_array()
                .unwrap_or_else(|| panic!("{caller} does not call {name}: {out}"))
                .clone()
        };

        assert!(approx(&out["total_tt"], 100.0 * dt), "{}", out["total_tt"]);
        // Process, main, parent_hot, leaf_hot, parent_cold, leaf_cold, recurse (twice a
        // stack), inlined_helper, sys_write, [truncated], deep: no tag.
        assert_eq!(
            out["total_calls"],
            100 + 98 + 68 + 70 + 20 + 20 + 20 + 8 + 8 + 2 + 2
        );
        assert_eq!(out["prim_calls"], 416 - 10);

        let leaf_hot = stats("leaf_hot");
        assert_eq!(leaf_hot[..2], [70, 70]);
        assert!(approx(&leaf_hot[2], 70.0 * dt) && approx(&leaf_hot[3], 70.0 * dt));
        assert_eq!(funcs["leaf_hot"]["file"], "/src/app.c");
        // Keyed by the function's first line, as cProfile keys functions.
        assert_eq!(funcs["leaf_hot"]["line"], 28);
        let via_parent = callers("leaf_hot", "parent_hot");
        assert_eq!(via_parent[..2], [60, 60]);
        assert!(approx(&via_parent[2], 60.0 * dt) && approx(&via_parent[3], 60.0 * dt));
        let via_recurse = callers("leaf_hot", "recurse");
        assert_eq!(via_recurse[..2], [10, 10]);
        assert!(approx(&via_recurse[3], 10.0 * dt));

        let main = stats("main");
        assert_eq!(main[..2], [98, 98]);
        assert!(approx(&main[2], 0.0) && approx(&main[3], 98.0 * dt));
        assert_eq!(callers("main", "app")[..2], [98, 98]);
        assert!(funcs.get("[phase=train]").is_none(), "{out}");
        assert_eq!(funcs["app"]["file"], "~");

        // Recursion: 20 appearances in 10 samples, cumulative time counted once.
        let recurse = stats("recurse");
        assert_eq!(recurse[..2], [10, 20]);
        assert!(approx(&recurse[3], 10.0 * dt));
        assert_eq!(callers("recurse", "recurse")[..2], [10, 10]);

        let sys_write = stats("sys_write");
        assert!(approx(&sys_write[2], 8.0 * dt));
        assert_eq!(funcs["sys_write"]["file"], "[kernel]");
        assert_eq!(callers("sys_write", "inlined_helper")[..2], [8, 8]);

        assert!(approx(&stats("deep")[2], 2.0 * dt));
        assert_eq!(callers("deep", "[truncated]")[..2], [2, 2]);
        assert_eq!(callers("[truncated]", "app")[..2], [2, 2]);

        let printed = out["printed"].as_str().unwrap();
        assert!(printed.contains("app.c:28(leaf_hot)"), "{printed}");
        assert!(printed.contains("20/10"), "{printed}");
        assert!(printed.contains("[kernel]:0(sys_write)"), "{printed}");
    }

    #[test]
    fn a_function_sampled_at_several_lines_is_one_entry() {
        // leaf_hot sampled at line 31 as well as 30 (as with --line-numbers): same function,
        // first line 28, so one entry with both lines' samples.
        let profile = fixture::profile_with_leaf_hot_at_two_lines();
        let file = TempFile::new("lines", &{
            let mut bytes = Vec::new();
            write(&profile, &mut bytes).unwrap();
            bytes
        });
        // READ_STATS fails on a name seen twice.
        let Some(out) = python(READ_STATS, &file.0) else {
            return;
        };
        let leaf_hot = &out["funcs"]["leaf_hot"];
        assert_eq!(leaf_hot["line"], 28);
        assert_eq!(leaf_hot["stats"][0], 75);
        assert_eq!(leaf_hot["callers"]["parent_hot"][0], 65);
    }

    #[test]
    fn repeated_pairs_count_like_cprofile() {
        // main;parent_hot;parent_cold;parent_hot;parent_cold: mutual recursion, whose
        // caller entries cProfile writes as (total, primitive): (10, 5) here.
        let mut profile = fixture::profile();
        profile.stacks = vec![StackCount {
            frames: vec![0, 1, 2, 3, 5, 3, 5],
            count: 5,
            off_cpu_ns: 0,
            addresses: Vec::new(),
        }];
        let file = TempFile::new("mutual", &{
            let mut bytes = Vec::new();
            write(&profile, &mut bytes).unwrap();
            bytes
        });
        let Some(out) = python(READ_STATS, &file.0) else {
            return;
        };
        let funcs = &out["funcs"];
        let list = |v: &Value| v.as_array().unwrap().clone();
        assert_eq!(list(&funcs["parent_cold"]["stats"])[..2], [5, 10]);
        let edge = list(&funcs["parent_cold"]["callers"]["parent_hot"]);
        assert_eq!(edge[..2], [10, 5]);
        assert!(approx(&edge[2], 5.0 / 999.0) && approx(&edge[3], 5.0 / 999.0));
        assert_eq!(
            list(&funcs["parent_hot"]["callers"]["parent_cold"])[..2],
            [5, 5]
        );
        assert!(out["printed"].as_str().unwrap().contains("10/5"));
    }

    #[test]
    fn marshal_load_reads_every_type() {
        let mut bytes = Vec::new();
        marshal::dict_start(&mut bytes).unwrap();
        let ints = [0, 1, i32::MAX as u64, 1 << 31, 1 << 45, u64::MAX];
        for (i, &v) in ints.iter().enumerate() {
            marshal::tuple(&mut bytes, 2).unwrap();
            marshal::str(&mut bytes, "int").unwrap();
            marshal::int(&mut bytes, i as u64).unwrap();
            marshal::int(&mut bytes, v).unwrap();
        }
        marshal::str(&mut bytes, "ünïcode ✓ ~").unwrap();
        marshal::tuple(&mut bytes, 3).unwrap();
        marshal::float(&mut bytes, 0.1).unwrap();
        marshal::float(&mut bytes, -2.5e300).unwrap();
        marshal::dict_start(&mut bytes).unwrap();
        marshal::dict_end(&mut bytes).unwrap();
        marshal::dict_end(&mut bytes).unwrap();
        let file = TempFile::new("marshal", &bytes);
        let script = r#"
import json, marshal, sys
with open(sys.argv[1], "rb") as f:
    d = marshal.load(f)
    assert f.read() == b"", "trailing bytes"
print(json.dumps([[list(k) if isinstance(k, tuple) else k, v] for k, v in d.items()]))
"#;
        let Some(out) = python(script, &file.0) else {
            return;
        };
        let mut expected: Vec<Value> = ints
            .iter()
            .enumerate()
            .map(|(i, &v)| serde_json::json!([["int", i], v]))
            .collect();
        expected.push(serde_json::json!(["ünïcode ✓ ~", [0.1, -2.5e300, {}]]));
        assert_eq!(out, Value::Array(expected));
    }

    #[test]
    fn marshal_bytes_are_cpythons() {
        let mut bytes = Vec::new();
        marshal::int(&mut bytes, 1).unwrap();
        marshal::int(&mut bytes, 1 << 31).unwrap();
        marshal::str(&mut bytes, "ab").unwrap();
        marshal::tuple(&mut bytes, 0).unwrap();
        assert_eq!(
            bytes,
            b"i\x01\0\0\0l\x03\0\0\0\0\0\0\0\x02\0u\x02\0\0\0ab(\0\0\0\0"
        );
    }

    #[test]
    fn empty_profile_loads_with_one_zero_entry() {
        let mut profile = fixture::profile();
        profile.stacks.clear();
        profile.meta.sampling.nominal_hz = 0.0;
        assert_eq!(sample_secs(&profile), FALLBACK_SAMPLE_SECS);
        let mut bytes = Vec::new();
        write(&profile, &mut bytes).unwrap();
        let file = TempFile::new("empty", &bytes);
        let script = r#"
import json, pstats, sys
s = pstats.Stats(sys.argv[1])
print(json.dumps({"functions": [k[2] for k in s.stats], "total_tt": s.total_tt}))
"#;
        let Some(out) = python(script, &file.0) else {
            return;
        };
        assert_eq!(out["functions"], serde_json::json!(["[no samples]"]));
        assert_eq!(out["total_tt"], 0.0);
    }
}
