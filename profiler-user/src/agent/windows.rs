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
    collections::{BTreeMap, VecDeque},
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
    /// Whom besides root the HTTP endpoint shows each process's samples.
    pub owners: Owners,
}

/// Who owns each process of a window, for the views of users other than root.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Owners {
    /// Each process's owner during the window (see [`crate::agent::labels::process_owner`]);
    /// a process missing here (exited before it was read, or whose owner changed during the
    /// window: a setuid exec, a server dropping root) is shown to root alone.
    pub uid: BTreeMap<u32, u32>,
    /// Labels of a process that its owner may not see: the tags of daemon runs another user
    /// started on it.
    pub hidden_labels: BTreeMap<u32, Vec<(String, String)>>,
}

/// What a scraper may see of the windows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum View {
    /// Everything: root, or the holder of the endpoint's token.
    All,
    /// The processes `uid` owns, without the tags of other users' daemon runs, and without
    /// kernel frames unless `kernel` (the kernel shows an unprivileged user its own kernel
    /// stacks only below `perf_event_paranoid` 2).
    User {
        /// The scraper's uid.
        uid: u32,
        /// Whether kernel frames are kept.
        kernel: bool,
    },
}

impl View {
    /// The view of `uid` on this machine now: everything for root, else its own processes,
    /// with kernel frames as `/proc/sys/kernel/perf_event_paranoid` allows (none when it
    /// cannot be read).
    pub fn of_uid(uid: u32) -> View {
        if uid == 0 {
            return View::All;
        }
        let paranoid = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
            .unwrap_or(i32::MAX);
        View::User {
            uid,
            kernel: paranoid < 2,
        }
    }
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

/// The windows merged into one profile, with only the processes `filter` keeps and `view`
/// shows; `None` when there are no windows.
pub fn merge(windows: &[Arc<Window>], filter: &Filter, view: View) -> Option<Profile> {
    // Each window's labels and owners decide for its own processes (a pid's service or owner
    // may differ between windows when the pid was reused).
    let kept: Vec<Profile> = windows
        .iter()
        .filter_map(|w| {
            let shown = |pid: u32| match view {
                View::All => true,
                View::User { uid, .. } => w.owners.uid.get(&pid) == Some(&uid),
            };
            let mut part = Profile::merge(&[&w.profile], |pid| {
                shown(pid) && filter.keeps(&w.profile, pid)
            })?;
            if let View::User { kernel, .. } = view {
                for (pid, labels) in &mut part.process_labels {
                    if let Some(hidden) = w.owners.hidden_labels.get(pid) {
                        labels.retain(|l| !hidden.contains(l));
                    }
                }
                // What the window says of objects it could not unwind through names other
                // users' files: left out.
                part.meta.untabled.clear();
                part.meta.tabled_late.clear();
                if !kernel {
                    strip_kernel_frames(&mut part);
                }
            }
            Some(part)
        })
        .collect();
    let parts: Vec<&Profile> = kept.iter().collect();
    // Merging again interns anew: frames and mappings no stack refers to any more (kernel
    // ones stripped above) are dropped, and stacks made equal by the strip are added up.
    Profile::merge(&parts, |_| true)
}

/// Removes the kernel's frames (and their addresses) from every stack of `profile`.
fn strip_kernel_frames(profile: &mut Profile) {
    let kernel: Vec<bool> = profile.frames.iter().map(|f| f.is_kernel()).collect();
    for stack in &mut profile.stacks {
        if !stack.frames.iter().any(|&f| kernel[f]) {
            continue;
        }
        let with_addresses = stack.addresses.len() == stack.frames.len();
        let mut frames = Vec::with_capacity(stack.frames.len());
        let mut addresses = Vec::with_capacity(stack.addresses.len());
        for (i, &f) in stack.frames.iter().enumerate() {
            if !kernel[f] {
                frames.push(f);
                if with_addresses {
                    addresses.push(stack.addresses[i]);
                }
            }
        }
        stack.frames = frames;
        if with_addresses {
            stack.addresses = addresses;
        } else {
            stack.addresses.clear();
        }
    }
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
            owners: Owners::default(),
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
        let all = merge(&windows, &Filter::default(), View::All).unwrap();
        assert_eq!(all.total_samples(), 2 * one);
        assert_eq!(all.meta.duration, Duration::from_secs(2));
        assert_eq!(all.frames.len(), fixture::profile().frames.len());
        let shop = Filter {
            service_name: Some("shop".into()),
            pid: None,
        };
        assert_eq!(
            merge(&windows, &shop, View::All).unwrap().total_samples(),
            one
        );
        let other = Filter {
            service_name: None,
            pid: Some(1),
        };
        assert_eq!(
            merge(&windows, &other, View::All).unwrap().total_samples(),
            0
        );
        assert!(merge(&[], &Filter::default(), View::All).is_none());
    }
}
