//! [`Checks`]: failed checks collected so that one run reports all of them.

/// Collects failed checks so that one run reports all of them; panics in
/// [`Checks::finish`] (or on drop, if not finished) when any failed.
#[derive(Debug, Default)]
pub struct Checks {
    failures: Vec<String>,
    finished: bool,
}

impl Checks {
    pub fn new() -> Checks {
        Checks::default()
    }

    /// Whether no check has failed so far.
    pub fn is_ok(&self) -> bool {
        self.failures.is_empty()
    }

    /// Records `msg` as a failure unless `ok`.
    pub fn check(&mut self, ok: bool, msg: impl FnOnce() -> String) {
        if !ok {
            self.failures.push(msg());
        }
    }

    /// Records `what: error` as a failure when `result` is an error (a [`crate::Share`]'s
    /// judgement, say).
    pub fn result(&mut self, what: &str, result: Result<(), String>) {
        if let Err(e) = result {
            self.failures.push(format!("{what}: {e}"));
        }
    }

    /// Records a failure unless `actual == expected`.
    pub fn eq<T: PartialEq + std::fmt::Debug>(&mut self, what: &str, actual: T, expected: T) {
        if actual != expected {
            self.failures
                .push(format!("{what}: got {actual:?}, expected {expected:?}"));
        }
    }

    /// Panics listing every failed check, if any.
    #[track_caller]
    pub fn finish(mut self) {
        self.finished = true;
        let failures = std::mem::take(&mut self.failures);
        if !failures.is_empty() {
            panic!(
                "{} check(s) failed:\n- {}",
                failures.len(),
                failures.join("\n- ")
            );
        }
    }
}

impl Drop for Checks {
    fn drop(&mut self) {
        if !self.finished && !self.failures.is_empty() && !std::thread::panicking() {
            panic!(
                "unfinished checks failed:\n- {}",
                self.failures.join("\n- ")
            );
        }
    }
}
