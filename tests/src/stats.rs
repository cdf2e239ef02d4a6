//! [`Share`]: a share of sampled events judged with its sampling error.
//!
//! A profile's share (of a function, a thread, a stack shape) is a count of `total` samples,
//! each one a draw: its standard error is `sqrt(p (1 - p) / total)`. A fixed bound, say
//! "at least 0.8", holds on a quiet machine that takes many samples and fails a correct build
//! on a loaded one that takes few (0.776 of 147 samples against a truth of 0.75-0.89 in CI).
//! So every bound here is the measured truth give or take [`SIGMAS`] standard errors at the
//! samples the run took, and a bound that so few samples would widen to the share of the
//! defect the test exists to catch fails as "too few samples", never as a pass.

/// Standard errors a share may stray from its truth: a correct build fails about one run in
/// 30,000 for each one-sided bound.
pub const SIGMAS: f64 = 4.0;

/// `hits` of `total` samples.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Share {
    pub hits: u64,
    pub total: u64,
}

impl Share {
    pub fn new(hits: u64, total: u64) -> Share {
        Share { hits, total }
    }

    /// The share `value` of `total` samples (`hits` rounded from them).
    pub fn of(value: f64, total: u64) -> Share {
        Share::new((value * total as f64).round() as u64, total)
    }

    /// Whether the share is `truth` within `tolerance` or [`SIGMAS`] standard errors, as
    /// [`Share::near`] judges it, never passing an even split (the defect of a shares test
    /// whose truth is well above one half).
    pub fn near_truth(&self, truth: f64, tolerance: f64) -> bool {
        self.near(truth, tolerance, 0.5).is_ok()
    }

    /// `hits / total`; 0 without samples.
    pub fn value(&self) -> f64 {
        self.hits as f64 / self.total.max(1) as f64
    }

    /// The standard error of a share whose truth is `truth`, at this share's samples.
    pub fn standard_error(&self, truth: f64) -> f64 {
        (truth * (1.0 - truth) / self.total.max(1) as f64).sqrt()
    }

    /// Whether the share is `truth` within `tolerance`, or within [`SIGMAS`] standard errors
    /// where too few samples make those wider; `Err` names the share and its bounds. `defect`
    /// is the share the check exists to catch: a bound so wide that it would pass it is an
    /// error (the test must take more samples).
    pub fn near(&self, truth: f64, tolerance: f64, defect: f64) -> Result<(), String> {
        let width = tolerance.max(SIGMAS * self.standard_error(truth));
        let (low, high) = (truth - width, truth + width);
        self.judge(low, high, defect)
    }

    /// Whether the share is at least `truth` (the lowest share a correct build measured) less
    /// [`SIGMAS`] standard errors; `Err` as in [`Share::near`].
    pub fn at_least(&self, truth: f64, defect: f64) -> Result<(), String> {
        let low = truth - SIGMAS * self.standard_error(truth);
        self.judge(low, f64::INFINITY, defect)
    }

    fn judge(&self, low: f64, high: f64, defect: f64) -> Result<(), String> {
        let value = self.value();
        let bounds = if high.is_finite() {
            format!("{low:.3}-{high:.3}")
        } else {
            format!("at least {low:.3}")
        };
        if (low..=high).contains(&defect) {
            return Err(format!(
                "too few samples to judge: {} of {} ({value:.3}); at {SIGMAS} standard errors \
                 the bound ({bounds}) would pass the defect's share {defect}",
                self.hits, self.total
            ));
        }
        if (low..=high).contains(&value) {
            Ok(())
        } else {
            Err(format!(
                "{} of {} samples ({value:.3}), not {bounds}",
                self.hits, self.total
            ))
        }
    }
}

/// `hotcold`'s split: `leaf_hot` does three units of work for each of `leaf_cold`'s.
pub const HOTCOLD_HOT_SHARE: f64 = 0.75;

/// Panics unless `leaf_hot`'s share of `hot` and `cold` samples is [`HOTCOLD_HOT_SHARE`]
/// within 0.08 (four standard errors at 470 samples), or four standard errors where fewer
/// samples make those wider, but never so wide as to pass an even split (samples given to the
/// wrong leaf, or counted twice). `context` is printed with the failure.
#[track_caller]
pub fn assert_hotcold_split(hot: u64, cold: u64, context: &dyn std::fmt::Debug) {
    if let Err(e) = Share::new(hot, hot + cold).near(HOTCOLD_HOT_SHARE, 0.08, 0.5) {
        panic!(
            "leaf_hot's share of hotcold's leaves (truth {HOTCOLD_HOT_SHARE}): {e}: {context:?}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::Share;

    #[test]
    fn bounds_widen_with_few_samples_but_never_to_the_defect() {
        // 3000 samples: 4 standard errors of 0.75 are 0.032, under the tolerance of 0.06.
        assert!(Share::new(2200, 3000).near(0.75, 0.06, 0.5).is_ok());
        assert!(Share::new(2000, 3000).near(0.75, 0.06, 0.5).is_err());
        // 147 samples: 4 standard errors of 0.75 are 0.14; 0.776 passes "at least 0.75".
        assert!(Share::new(114, 147).at_least(0.75, 0.4).is_ok());
        assert!(Share::new(80, 147).at_least(0.75, 0.4).is_err());
        // 20 samples cannot tell 0.75 from 0.5.
        let few = Share::new(15, 20).near(0.75, 0.06, 0.5).unwrap_err();
        assert!(few.starts_with("too few samples"), "{few}");
    }
}
