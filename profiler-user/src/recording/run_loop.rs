//! The one run loop every driver runs a recording in: it ends at the deadline, when the driver
//! is asked to stop, or when a tick says the run is over (its targets exited), ticking every
//! [`TICK`] meanwhile. The drivers differ only in what a tick does around
//! [`super::Recording::tick`] and in what stops them (signals and a launched command for the
//! command line, a client's `stop` for the daemon, its shutdown for the agent, which cuts a
//! window every `--window` in its tick and enters the loop again each day, having no deadline).

use std::{future::Future, time::Duration};

use crate::profile::RunEnd;

/// How often a running recording is ticked: stacks moved out of the kernel, maps refreshed,
/// followed children and exits noticed, progress reported.
pub const TICK: Duration = Duration::from_millis(100);

/// What a driver adds to the run loop.
pub trait RunDriver {
    /// Why a tick could not go on (the run then fails).
    type Error;

    /// Ticks the recording; `Ok(Some(end))` ends the run.
    fn tick(&mut self) -> impl Future<Output = Result<Option<RunEnd>, Self::Error>>;

    /// Resolves when the run is asked to end before its deadline, with how it ended.
    fn stopped(&mut self) -> impl Future<Output = RunEnd>;
}

/// Runs `driver`'s recording until `deadline` ([`RunEnd::Completed`]), a stop, or a tick
/// that ends it.
pub async fn run<D: RunDriver>(
    driver: &mut D,
    deadline: std::time::Instant,
) -> Result<RunEnd, D::Error> {
    let deadline = tokio::time::Instant::from_std(deadline);
    let mut tick = tokio::time::interval(TICK);
    // A tick that ran long (a loaded machine, a high rate) is not followed by a burst of ticks
    // to catch up: each would hold the thread past the deadline again.
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            // The deadline first: when a long tick ends past it, the run ends rather than
            // ticking again (a ready branch is otherwise picked at random).
            biased;
            _ = tokio::time::sleep_until(deadline) => return Ok(RunEnd::Completed),
            end = driver.stopped() => return Ok(end),
            _ = tick.tick() => {}
        }
        if tokio::time::Instant::now() >= deadline {
            return Ok(RunEnd::Completed);
        }
        if let Some(end) = driver.tick().await? {
            return Ok(end);
        }
    }
}

/// A thread that stops a run's sampling at its deadline, unless the run ended before: the run
/// loop sees the deadline only between ticks, and a tick can take seconds (a loaded machine,
/// or a rate whose samples, on every CPU, bpfprof's own included, slow bpfprof down), all of
/// which would be sampled, drained and named.
pub struct DeadlineGuard {
    cancel: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<bool>>,
}

impl DeadlineGuard {
    /// Runs `stop` at `deadline` on a thread of its own, unless [`Self::finish`] comes first.
    pub fn spawn(deadline: std::time::Instant, stop: impl FnOnce() + Send + 'static) -> Self {
        let (cancel, cancelled) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("bpfprof-deadline".into())
            .spawn(move || {
                let wait = deadline.saturating_duration_since(std::time::Instant::now());
                match cancelled.recv_timeout(wait) {
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                        stop();
                        log::debug!("deadline: sampling stopped");
                        true
                    }
                    // The run ended first.
                    _ => false,
                }
            })
            // Without the thread the run loop still ends at the deadline, a tick late at most.
            .map_err(|e| log::warn!("no deadline thread: {e}"))
            .ok();
        DeadlineGuard {
            cancel: Some(cancel),
            thread,
        }
    }

    /// Ends the guard; whether it stopped sampling at the deadline.
    pub fn finish(mut self) -> bool {
        self.cancel.take();
        self.thread
            .take()
            .is_some_and(|t| t.join().unwrap_or(false))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A driver whose tick ends the run after `end_after` ticks, or that is stopped
    /// `stop_after` from its first wait (the loop asks again after every tick, as a signal
    /// or a client's stop is asked for).
    struct Counting {
        ticks: u32,
        end_after: Option<u32>,
        stop_after: Option<Duration>,
        stop_at: Option<tokio::time::Instant>,
    }

    impl RunDriver for Counting {
        type Error = ();
        async fn tick(&mut self) -> Result<Option<RunEnd>, ()> {
            self.ticks += 1;
            Ok((Some(self.ticks) == self.end_after).then_some(RunEnd::TargetExited))
        }
        async fn stopped(&mut self) -> RunEnd {
            match self.stop_after {
                Some(after) => {
                    let at = *self
                        .stop_at
                        .get_or_insert_with(|| tokio::time::Instant::now() + after);
                    tokio::time::sleep_until(at).await;
                    RunEnd::Interrupted
                }
                None => std::future::pending().await,
            }
        }
    }

    fn block_on<F: Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn ends_at_the_deadline_a_stop_or_a_tick() {
        let start = std::time::Instant::now();
        let mut d = Counting {
            ticks: 0,
            end_after: None,
            stop_after: None,
            stop_at: None,
        };
        let end = block_on(run(&mut d, start + Duration::from_millis(1050)));
        assert_eq!(end, Ok(RunEnd::Completed));
        assert!(d.ticks >= 10, "{} ticks in 1.05 s", d.ticks);

        let mut d = Counting {
            ticks: 0,
            end_after: Some(3),
            stop_after: None,
            stop_at: None,
        };
        let end = block_on(run(&mut d, start + Duration::from_secs(60)));
        assert_eq!((end, d.ticks), (Ok(RunEnd::TargetExited), 3));

        let mut d = Counting {
            ticks: 0,
            end_after: None,
            stop_after: Some(Duration::from_millis(250)),
            stop_at: None,
        };
        let end = block_on(run(&mut d, start + Duration::from_secs(60)));
        assert_eq!(end, Ok(RunEnd::Interrupted));
        assert!(d.ticks <= 4, "{} ticks before a stop at 0.25 s", d.ticks);
    }
}
