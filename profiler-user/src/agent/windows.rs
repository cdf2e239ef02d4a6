//! The agent's windows: each a profile of every process over `--window`, with its labels,
//! kept in a ring of the [`RING_WINDOWS`] most recent, which the HTTP server reads.
//!
//! `GET /debug/pprof/profile?seconds=N` is answered from the ring at once: the newest whole
//! windows that cover the last N seconds (at least one; all the ring has when it covers less),
//! merged into one profile. Whole windows, because a window is the unit samples are taken out
//! of the kernel in; at once, because a scraper that asks every W seconds with `seconds=W` and
//! `--window W` then gets each window once without holding a connection open for W seconds.
//! Before the first window is complete, a request waits for it.

use std::{
    collections::VecDeque,
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use crate::profile::Profile;

/// Windows kept: 30, five minutes at the default 10 s windows, so that a scraper that missed
/// a few scrapes (a restart, a network blip) can still ask for what it missed, while the ring
/// stays small (at 19 Hz a window of a busy 64-CPU host is ~12k samples, a few MB once
/// symbolized).
pub const RING_WINDOWS: usize = 30;

/// One window: the profile of every process's samples between `start` and `end`.
#[derive(Debug)]
pub struct Window {
    /// When it began.
    pub start: SystemTime,
    /// When it was cut.
    pub end: SystemTime,
    /// Its samples, with each process's labels.
    pub profile: Profile,
}

/// The ring of recent windows, shared between the recording thread (which pushes) and the
/// HTTP server (which reads): the lock is held only to push or clone a few `Arc`s.
#[derive(Debug)]
pub struct Ring {
    windows: Mutex<VecDeque<Arc<Window>>>,
    /// The number of windows pushed so far, for requests that wait for the first.
    pushed: tokio::sync::watch::Sender<u64>,
}

impl Default for Ring {
    fn default() -> Self {
        Ring {
            windows: Mutex::new(VecDeque::with_capacity(RING_WINDOWS)),
            pushed: tokio::sync::watch::channel(0).0,
        }
    }
}

impl Ring {
    /// Adds the newest window, dropping the oldest past [`RING_WINDOWS`]; returns whether one
    /// was dropped.
    pub fn push(&self, window: Arc<Window>) -> bool {
        let dropped = {
            let mut windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
            let dropped = windows.len() >= RING_WINDOWS;
            if dropped {
                windows.pop_front();
            }
            windows.push_back(window);
            dropped
        };
        self.pushed.send_modify(|n| *n += 1);
        dropped
    }

    /// How many windows the ring holds.
    pub fn len(&self) -> usize {
        self.windows.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The newest windows that together cover `seconds` (at least one), oldest first.
    pub fn last(&self, seconds: Duration) -> Vec<Arc<Window>> {
        let windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = Vec::new();
        let mut covered = Duration::ZERO;
        for window in windows.iter().rev() {
            if !out.is_empty() && covered >= seconds {
                break;
            }
            covered += window.profile.meta.duration;
            out.push(Arc::clone(window));
        }
        out.reverse();
        out
    }

    /// Waits until at least one window was pushed, at most `timeout`; returns whether one was.
    pub async fn wait_first(&self, timeout: Duration) -> bool {
        let mut pushed = self.pushed.subscribe();
        tokio::time::timeout(timeout, pushed.wait_for(|n| *n > 0))
            .await
            .is_ok_and(|r| r.is_ok())
    }
}

/// The filter of a profile request: `?service_name=` and `?pid=`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Filter {
    /// Only processes with this `service_name` label.
    pub service_name: Option<String>,
    /// Only this process.
    pub pid: Option<u32>,
}

impl Filter {
    /// Whether the process `pid` of `profile` passes.
    pub fn keeps(&self, profile: &Profile, pid: u32) -> bool {
        if self.pid.is_some_and(|p| p != pid) {
            return false;
        }
        match &self.service_name {
            None => true,
            Some(name) => profile
                .process_labels
                .get(&pid)
                .is_some_and(|labels| labels.iter().any(|(k, v)| k == "service_name" && v == name)),
        }
    }
}

/// The windows merged into one profile, with only the processes `filter` keeps; `None` when
/// there are no windows.
pub fn merge(windows: &[Arc<Window>], filter: &Filter) -> Option<Profile> {
    // Each window's labels decide for its own processes (a pid's service may differ between
    // windows when the pid was reused).
    let kept: Vec<Profile> = windows
        .iter()
        .filter_map(|w| Profile::merge(&[&w.profile], |pid| filter.keeps(&w.profile, pid)))
        .collect();
    let parts: Vec<&Profile> = kept.iter().collect();
    Profile::merge(&parts, |_| true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::fixture;

    fn window(secs: u64, labels: &[(&str, &str)]) -> Window {
        let mut profile = fixture::profile();
        profile.meta.duration = Duration::from_secs(secs);
        profile.process_labels.insert(
            1234,
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        Window {
            start: SystemTime::UNIX_EPOCH,
            end: SystemTime::UNIX_EPOCH,
            profile,
        }
    }

    #[test]
    fn the_ring_keeps_the_newest_and_covers_the_seconds_asked() {
        let ring = Ring::default();
        for _ in 0..RING_WINDOWS {
            assert!(!ring.push(Arc::new(window(10, &[]))));
        }
        assert!(
            ring.push(Arc::new(window(10, &[]))),
            "the oldest is dropped past the cap"
        );
        assert_eq!(ring.len(), RING_WINDOWS);
        assert_eq!(ring.last(Duration::from_secs(3)).len(), 1);
        assert_eq!(ring.last(Duration::from_secs(10)).len(), 1);
        assert_eq!(ring.last(Duration::from_secs(11)).len(), 2);
        assert_eq!(ring.last(Duration::from_secs(100_000)).len(), RING_WINDOWS);
    }

    #[test]
    fn merged_windows_add_up_and_filters_keep_their_processes() {
        let one = fixture::profile().total_samples();
        let windows = vec![
            Arc::new(window(1, &[("service_name", "shop")])),
            Arc::new(window(1, &[("service_name", "cart")])),
        ];
        let all = merge(&windows, &Filter::default()).unwrap();
        assert_eq!(all.total_samples(), 2 * one);
        assert_eq!(all.meta.duration, Duration::from_secs(2));
        assert_eq!(all.frames.len(), fixture::profile().frames.len());
        let shop = Filter {
            service_name: Some("shop".into()),
            pid: None,
        };
        assert_eq!(merge(&windows, &shop).unwrap().total_samples(), one);
        let other = Filter {
            service_name: None,
            pid: Some(1),
        };
        assert_eq!(merge(&windows, &other).unwrap().total_samples(), 0);
        assert!(merge(&[], &Filter::default()).is_none());
    }
}
