//! Puts a sample's Python frames into its native stack: each native `_PyEval_EvalFrameDefault`
//! frame is one eval call, and the Python frames of that call (up to and including the frame
//! with the eval-entry flag) go where it is, so a stack reads native callers, Python functions
//! and their native callees in call order.

use profiler_common::PythonFrame;

/// One frame of a merged stack.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MergedFrame<N> {
    /// A native frame, as the native stack had it.
    Native(N),
    /// A Python frame.
    Python(PythonFrame),
}

/// Merges `python` (innermost first, as walked) into `native` (innermost first): the Python
/// frames of the k-th eval call from the top replace (or, with `keep_eval`, sit just above) the
/// k-th native frame `is_eval` accepts. Eval frames left without Python frames stay as they are
/// (the Python walk stopped at its depth bound); Python frames left without an eval frame (the
/// native walk stopped early) go at the outer end, where their callers were.
pub fn merge_stacks<N>(
    native: Vec<N>,
    python: &[PythonFrame],
    is_eval: impl Fn(&N) -> bool,
    keep_eval: bool,
) -> Vec<MergedFrame<N>> {
    let mut groups = eval_calls(python);
    let mut out = Vec::with_capacity(native.len() + python.len());
    for frame in native {
        if is_eval(&frame) {
            if let Some(group) = groups.next() {
                out.extend(group.iter().copied().map(MergedFrame::Python));
                if !keep_eval {
                    continue;
                }
            }
        }
        out.push(MergedFrame::Native(frame));
    }
    for group in groups {
        out.extend(group.iter().copied().map(MergedFrame::Python));
    }
    out
}

/// The Python frames split by eval call, innermost call first: each ends with its entry frame
/// (the last may lack one when the walk was cut).
fn eval_calls(python: &[PythonFrame]) -> impl Iterator<Item = &[PythonFrame]> {
    python.split_inclusive(|f| f.eval_entry)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn py(code: u64, entry: bool) -> PythonFrame {
        PythonFrame {
            code,
            instruction: 0,
            eval_entry: entry,
        }
    }

    fn names(merged: &[MergedFrame<&'static str>]) -> Vec<String> {
        merged
            .iter()
            .map(|f| match f {
                MergedFrame::Native(n) => n.to_string(),
                MergedFrame::Python(p) => format!("py{}", p.code),
            })
            .collect()
    }

    const EVAL: &str = "_PyEval_EvalFrameDefault";

    #[test]
    fn each_eval_call_gets_its_frames() {
        // zlib called from py1 (which py2 called in the same eval call), py2 run from C by
        // map(), called by py3, run by PyEval_EvalCode from main.
        let native = vec!["deflate", "zlib_compress", EVAL, "map_next", EVAL, "main"];
        let python = [py(1, false), py(2, true), py(3, true)];
        let merged = merge_stacks(native.clone(), &python, |n| *n == EVAL, false);
        assert_eq!(
            names(&merged),
            [
                "deflate",
                "zlib_compress",
                "py1",
                "py2",
                "map_next",
                "py3",
                "main"
            ]
        );
        let kept = merge_stacks(native, &python, |n| *n == EVAL, true);
        assert_eq!(
            names(&kept),
            [
                "deflate",
                "zlib_compress",
                "py1",
                "py2",
                EVAL,
                "map_next",
                "py3",
                EVAL,
                "main"
            ]
        );
    }

    #[test]
    fn leftovers_on_either_side() {
        // The Python walk was cut (no entry flag at its end): the outer eval frame stays.
        let merged = merge_stacks(
            vec![EVAL, EVAL, "main"],
            &[py(1, false)],
            |n| *n == EVAL,
            false,
        );
        assert_eq!(names(&merged), ["py1", EVAL, "main"]);
        // The native walk was cut: the outer Python frames go at the end.
        let merged = merge_stacks(
            vec!["leaf", EVAL],
            &[py(1, true), py(2, true)],
            |n| *n == EVAL,
            false,
        );
        assert_eq!(names(&merged), ["leaf", "py1", "py2"]);
        // No Python frames: the native stack unchanged.
        let merged = merge_stacks(vec!["a", EVAL], &[], |n| *n == EVAL, false);
        assert_eq!(names(&merged), ["a", EVAL]);
    }
}
