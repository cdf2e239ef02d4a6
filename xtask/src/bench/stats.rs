//! Statistics: medians with their min–max spread over rounds, and the rotation that gives each
//! round a different order of profilers.

/// Rotates `order` left by `round`: each round starts with a different profiler.
pub(super) fn rotate<T>(order: &mut [T], round: usize) {
    let n = order.len().max(1);
    order.rotate_left(round % n);
}

/// `v` without NaNs, sorted.
pub(super) fn sorted(v: &[f64]) -> Vec<f64> {
    let mut v: Vec<f64> = v.iter().copied().filter(|x| !x.is_nan()).collect();
    v.sort_by(f64::total_cmp);
    v
}

/// The median (the mean of the middle two for an even count); NaN for no values.
pub(super) fn median(v: &[f64]) -> f64 {
    let v = sorted(v);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// `median (min–max)`, or the single value, or `n/a` (with how many runs had no value).
pub(super) fn stat(v: &[f64], digits: usize) -> String {
    let s = sorted(v);
    let missing = v.len() - s.len();
    let note = if missing > 0 {
        format!(" [{missing} of {} runs: no value]", v.len())
    } else {
        String::new()
    };
    match s.len() {
        0 => format!("n/a{note}"),
        1 => format!("{:.digits$}{note}", s[0]),
        _ => format!(
            "{:.digits$} ({:.digits$}–{:.digits$}){note}",
            median(&s),
            s[0],
            s[s.len() - 1]
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(stat(&[1.0, f64::NAN], 1), "1.0 [1 of 2 runs: no value]");
    }
}
