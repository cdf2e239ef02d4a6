//! Folded (collapsed-stack) profiles and the stack queries the tests make on them.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

/// A parsed folded (collapsed-stack) profile: frames root first, the first
/// frame being the process name, kernel frames suffixed `_[k]`.
#[derive(Debug, Clone, Default)]
pub struct Profile {
    pub stacks: BTreeMap<Vec<String>, u64>,
}

/// Whether a folded frame is a kernel frame (`name_[k]`).
pub fn is_kernel_frame(frame: &str) -> bool {
    frame.ends_with("_[k]")
}

/// The process name of a root frame: `name`, or `name (pid N)` in runs that can have more than
/// one process.
pub fn process_name(root: &str) -> &str {
    match root_pid(root) {
        Some(_) => &root[..root.rfind(" (pid ").unwrap_or(root.len())],
        None => root,
    }
}

/// The pid a root frame `name (pid N)` carries.
pub fn root_pid(root: &str) -> Option<u32> {
    let (_, tail) = root.rsplit_once(" (pid ")?;
    tail.strip_suffix(')')?.parse().ok()
}

/// The user frames of a folded stack (root first, without the process name).
pub fn user_frames(frames: &[String]) -> Vec<&str> {
    frames
        .iter()
        .skip(1)
        .filter(|f| !is_kernel_frame(f))
        .map(String::as_str)
        .collect()
}

impl Profile {
    /// Parses folded text; panics on a malformed line.
    pub fn parse(text: &str) -> Profile {
        let mut stacks = BTreeMap::new();
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let (stack, count) = line
                .rsplit_once(' ')
                .unwrap_or_else(|| panic!("folded line {} has no count: {line:?}", i + 1));
            let count: u64 = count
                .parse()
                .unwrap_or_else(|e| panic!("folded line {} bad count ({e}): {line:?}", i + 1));
            assert!(
                !stack.is_empty(),
                "folded line {} has an empty stack",
                i + 1
            );
            let frames: Vec<String> = stack.split(';').map(str::to_string).collect();
            assert!(
                frames.iter().all(|f| !f.is_empty()),
                "folded line {} has an empty frame: {line:?}",
                i + 1
            );
            *stacks.entry(frames).or_insert(0) += count;
        }
        Profile { stacks }
    }

    /// Reads and parses a folded file.
    pub fn read(path: &Path) -> Profile {
        let text = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("reading folded profile {}: {e}", path.display()));
        Profile::parse(&text)
    }

    /// py-spy's `--format raw` output at `path`: folded lines, less those with an empty stack
    /// (py-spy 0.4 writes a sample it got no frames for as ` COUNT`; seen once in a CI run of
    /// `pytorch_314`), which have nothing to compare; their samples are returned beside it.
    pub fn read_py_spy(path: &Path) -> (Profile, u64) {
        let text = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("reading py-spy's profile {}: {e}", path.display()));
        let mut empty = 0;
        let kept: String = text
            .lines()
            .filter(|line| match line.trim_start().rsplit_once(' ') {
                None if !line.trim().is_empty() => match line.trim().parse::<u64>() {
                    Ok(n) => {
                        empty += n;
                        false
                    }
                    Err(_) => true,
                },
                Some(("", count)) => {
                    empty += count.parse::<u64>().unwrap_or(0);
                    false
                }
                _ => true,
            })
            .flat_map(|l| [l, "\n"])
            .collect();
        (Profile::parse(&kept), empty)
    }

    /// Total number of samples.
    pub fn total(&self) -> u64 {
        self.stacks.values().sum()
    }

    /// Samples whose stack satisfies `pred`.
    pub fn count_where(&self, mut pred: impl FnMut(&[String]) -> bool) -> u64 {
        self.stacks
            .iter()
            .filter(|(frames, _)| pred(frames))
            .map(|(_, n)| n)
            .sum()
    }

    /// Samples whose stack contains `frame` anywhere.
    pub fn count_containing(&self, frame: &str) -> u64 {
        self.count_where(|f| f.iter().any(|x| x == frame))
    }

    /// Samples whose last frame is `frame`.
    pub fn count_leaf(&self, frame: &str) -> u64 {
        self.count_where(|f| f.last().is_some_and(|x| x == frame))
    }

    /// Samples whose last non-kernel frame is `frame` (the user-space leaf,
    /// ignoring kernel frames appended after it).
    pub fn count_user_leaf(&self, frame: &str) -> u64 {
        self.count_where(|f| {
            f.iter()
                .skip(1)
                .rev()
                .find(|x| !is_kernel_frame(x))
                .is_some_and(|x| x == frame)
        })
    }

    /// Share (0..=1) of all samples whose stack contains `frame`.
    pub fn share_containing(&self, frame: &str) -> f64 {
        ratio(self.count_containing(frame), self.total())
    }

    /// Share (0..=1) of all samples whose last frame is `frame`.
    pub fn share_leaf(&self, frame: &str) -> f64 {
        ratio(self.count_leaf(frame), self.total())
    }

    /// Samples in which `child` appears directly under `parent`
    /// (`...;parent;child;...`).
    pub fn count_directly_under(&self, child: &str, parent: &str) -> u64 {
        self.count_where(|f| f.windows(2).any(|w| w[0] == parent && w[1] == child))
    }

    /// Samples in which `ancestor` appears somewhere before (root-ward of) `frame`.
    pub fn count_with_ancestor(&self, frame: &str, ancestor: &str) -> u64 {
        self.count_where(|f| {
            let Some(pos) = f.iter().position(|x| x == frame) else {
                return false;
            };
            f[..pos].iter().any(|x| x == ancestor)
        })
    }

    /// Whether any stack contains `frame`.
    pub fn has_frame(&self, frame: &str) -> bool {
        self.count_containing(frame) > 0
    }

    /// Samples grouped by the first frame (the process name).
    pub fn by_comm(&self) -> BTreeMap<String, u64> {
        let mut m = BTreeMap::new();
        for (frames, n) in &self.stacks {
            *m.entry(process_name(&frames[0]).to_string()).or_insert(0) += n;
        }
        m
    }

    /// Samples per root frame (`name (pid N)` in multi-process runs).
    pub fn by_root(&self) -> BTreeMap<String, u64> {
        let mut m = BTreeMap::new();
        for (frames, n) in &self.stacks {
            *m.entry(frames[0].clone()).or_insert(0) += n;
        }
        m
    }

    /// The `n` heaviest stacks, for failure messages.
    /// The `n` commonest shapes of the stacks that satisfy `pred`, a run of one frame written
    /// once with its length (`recurse x300`), so that deep stacks that differ fit on a line.
    pub fn shapes(&self, n: usize, mut pred: impl FnMut(&[String]) -> bool) -> String {
        let mut shapes: BTreeMap<String, u64> = BTreeMap::new();
        for (frames, count) in self.stacks.iter().filter(|(f, _)| pred(f)) {
            let mut parts: Vec<String> = Vec::new();
            let mut i = 0;
            while i < frames.len() {
                let run = frames[i..].iter().take_while(|f| **f == frames[i]).count();
                parts.push(match run {
                    1 => frames[i].clone(),
                    _ => format!("{} x{run}", frames[i]),
                });
                i += run;
            }
            *shapes.entry(parts.join(";")).or_insert(0) += count;
        }
        let mut v: Vec<_> = shapes.into_iter().collect();
        v.sort_by_key(|s| std::cmp::Reverse(s.1));
        let mut s = String::new();
        for (shape, count) in v.into_iter().take(n) {
            let _ = writeln!(s, "  {count:6} {shape}");
        }
        s
    }

    pub fn top(&self, n: usize) -> String {
        let mut v: Vec<_> = self.stacks.iter().collect();
        v.sort_by(|a, b| b.1.cmp(a.1));
        let mut s = format!(
            "{} samples in {} stacks; top:\n",
            self.total(),
            self.stacks.len()
        );
        for (frames, count) in v.into_iter().take(n) {
            let _ = writeln!(s, "  {count:6} {}", frames.join(";"));
        }
        s
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

/// The standard output of `script` run by Debian's Python on the pstats file `path` (passed as
/// `sys.argv[1]`): how tests read a `.prof` with Python's own `pstats` module.
pub fn run_pstats(path: &Path, script: &str) -> String {
    let out = crate::output_ok(
        std::process::Command::new("/usr/bin/python3")
            .args(["-c", script])
            .arg(path),
        "python3 -c pstats",
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
