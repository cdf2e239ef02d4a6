//! The top-functions table: self and total samples per function, like `perf report`.

use std::{collections::HashMap, fmt::Write as _};

use crate::aggregate::{Profile, ProfileFrame};

/// One function's share of the samples.
#[derive(Clone, Debug, PartialEq)]
pub struct FunctionShare {
    /// Function name (kernel functions end in `_[k]`).
    pub name: String,
    /// Samples with this function at the leaf.
    pub self_samples: u64,
    /// Samples with this function anywhere on the stack (recursion counted once).
    pub total_samples: u64,
}

/// Self and total samples of every code frame, most self samples first.
pub fn function_shares(profile: &Profile) -> Vec<FunctionShare> {
    let mut shares: HashMap<String, (u64, u64)> = HashMap::new();
    for stack in &profile.stacks {
        let mut seen = std::collections::HashSet::new();
        let code: Vec<&ProfileFrame> = stack
            .frames
            .iter()
            .map(|&id| &profile.frames[id])
            .filter(|f| matches!(f, ProfileFrame::Code(_)))
            .collect();
        for (i, frame) in code.iter().enumerate() {
            let name = display_name(frame);
            let entry = shares.entry(name.clone()).or_default();
            if i + 1 == code.len() {
                entry.0 += stack.count;
            }
            if seen.insert(name) {
                entry.1 += stack.count;
            }
        }
    }
    let mut out: Vec<FunctionShare> = shares
        .into_iter()
        .map(|(name, (self_samples, total_samples))| FunctionShare {
            name,
            self_samples,
            total_samples,
        })
        .collect();
    out.sort_by(|a, b| {
        b.self_samples
            .cmp(&a.self_samples)
            .then(b.total_samples.cmp(&a.total_samples))
            .then(a.name.cmp(&b.name))
    });
    out
}

fn display_name(frame: &ProfileFrame) -> String {
    if frame.is_kernel() {
        format!("{}_[k]", frame.label())
    } else {
        frame.label()
    }
}

/// Renders the `limit` functions with most self samples and most total samples.
pub fn render(profile: &Profile, limit: usize) -> String {
    let total = profile.total_samples().max(1) as f64;
    let mut shares = function_shares(profile);
    let mut out = String::new();
    let pct = |n: u64| 100.0 * n as f64 / total;
    let _ = writeln!(out, "top functions by self samples:");
    let _ = writeln!(out, "  {:>7} {:>7}  function", "self", "total");
    for s in shares.iter().take(limit) {
        let _ = writeln!(
            out,
            "  {:>6.2}% {:>6.2}%  {}",
            pct(s.self_samples),
            pct(s.total_samples),
            s.name
        );
    }
    shares.sort_by(|a, b| {
        b.total_samples
            .cmp(&a.total_samples)
            .then(a.name.cmp(&b.name))
    });
    let _ = writeln!(out, "top functions by total samples:");
    let _ = writeln!(out, "  {:>7} {:>7}  function", "total", "self");
    for s in shares.iter().take(limit) {
        let _ = writeln!(
            out,
            "  {:>6.2}% {:>6.2}%  {}",
            pct(s.total_samples),
            pct(s.self_samples),
            s.name
        );
    }
    out
}
