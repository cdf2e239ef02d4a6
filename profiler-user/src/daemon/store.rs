//! The daemon's state directory: one folder per run holding `run.json` and the result files,
//! so that results survive a restart and runs in flight at a crash are not lost silently.

use std::{
    fs,
    io::Write,
    os::unix::fs::{DirBuilderExt, PermissionsExt},
    path::{Path, PathBuf},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context, Result};

use crate::protocol::{RunInfo, RunState};

/// Where runs are kept, with the limits of how many and how long.
#[derive(Clone, Debug)]
pub struct Store {
    root: PathBuf,
    /// Most ended runs kept; older ones are deleted first.
    pub keep_runs: usize,
    /// Ended runs older than this are deleted.
    pub keep_age: Duration,
}

impl Store {
    /// Opens (creating) the state directory.
    pub fn open(root: &Path, keep_runs: usize, keep_age: Duration) -> Result<Store> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(root.join("runs"))
            .with_context(|| format!("creating state directory {}", root.display()))?;
        Ok(Store {
            root: root.to_path_buf(),
            keep_runs,
            keep_age,
        })
    }

    /// The folder of run `id`.
    pub fn run_dir(&self, id: u64) -> PathBuf {
        self.root.join("runs").join(id.to_string())
    }

    /// Creates the folder of a new run, owned by `owner` and closed to everyone else.
    pub fn create_run_dir(&self, id: u64, owner: u32) -> Result<PathBuf> {
        let dir = self.run_dir(id);
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .with_context(|| format!("creating {}", dir.display()))?;
        chown(&dir, owner)?;
        Ok(dir)
    }

    /// Writes `run.json` of a run atomically.
    pub fn save(&self, info: &RunInfo) -> Result<()> {
        let dir = self.run_dir(info.run_id);
        let tmp = dir.join("run.json.tmp");
        let json = serde_json::to_vec_pretty(info)?;
        let mut file =
            fs::File::create(&tmp).with_context(|| format!("writing {}", tmp.display()))?;
        file.write_all(&json)?;
        file.sync_all()?;
        fs::rename(&tmp, dir.join("run.json"))?;
        Ok(())
    }

    /// Reads every run; runs that had not ended were cut off by a daemon exit and are marked
    /// FAILED (and saved so).
    pub fn load_all(&self) -> Vec<RunInfo> {
        let mut runs = Vec::new();
        let Ok(entries) = fs::read_dir(self.root.join("runs")) else {
            return runs;
        };
        for entry in entries.flatten() {
            let path = entry.path().join("run.json");
            let Ok(bytes) = fs::read(&path) else {
                continue;
            };
            let mut info: RunInfo = match serde_json::from_slice(&bytes) {
                Ok(info) => info,
                Err(e) => {
                    log::warn!("ignoring unreadable {}: {e}", path.display());
                    continue;
                }
            };
            if !info.state.is_final() {
                info.state = RunState::Failed;
                info.reason = Some("the daemon stopped while the run was in flight".into());
                info.ended_unix_ms = Some(now_ms());
                if let Err(e) = self.save(&info) {
                    log::warn!("saving run {}: {e:#}", info.run_id);
                }
            }
            runs.push(info);
        }
        runs.sort_by_key(|r| r.run_id);
        runs
    }

    /// Deletes the ended runs beyond the count and age limits; returns the deleted ids.
    pub fn cleanup(&self, runs: &[RunInfo]) -> Vec<u64> {
        let mut ended: Vec<&RunInfo> = runs.iter().filter(|r| r.state.is_final()).collect();
        ended.sort_by_key(|r| std::cmp::Reverse(r.run_id));
        let cutoff = now_ms().saturating_sub(self.keep_age.as_millis() as u64);
        let mut deleted = Vec::new();
        for (i, run) in ended.iter().enumerate() {
            let too_old = run.ended_unix_ms.unwrap_or(run.created_unix_ms) < cutoff;
            if i >= self.keep_runs || too_old {
                if let Err(e) = fs::remove_dir_all(self.run_dir(run.run_id)) {
                    log::warn!("deleting run {}: {e}", run.run_id);
                } else {
                    deleted.push(run.run_id);
                }
            }
        }
        deleted
    }
}

/// Gives `path` to `owner` and makes it private to them.
pub fn chown(path: &Path, owner: u32) -> Result<()> {
    std::os::unix::fs::chown(path, Some(owner), None)
        .with_context(|| format!("chown {}", path.display()))?;
    let mode = if path.is_dir() { 0o700 } else { 0o600 };
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .with_context(|| format!("chmod {}", path.display()))
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(id: u64, state: RunState, ended: Option<u64>) -> RunInfo {
        RunInfo {
            run_id: id,
            state,
            reason: None,
            samples: 0,
            pid: 1,
            pid_ns: 1,
            comm: "x".into(),
            owner_uid: 0,
            sample_tags: vec![],
            tags: Default::default(),
            created_unix_ms: now_ms(),
            ended_unix_ms: ended,
            files: Default::default(),
            top: vec![],
            summary: None,
        }
    }

    #[test]
    fn in_flight_runs_come_back_failed_and_old_runs_are_cleaned() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), 2, Duration::from_secs(3600)).unwrap();
        for (id, state) in [
            (1, RunState::Success),
            (2, RunState::Success),
            (3, RunState::Running),
            (4, RunState::Stopped),
        ] {
            store.create_run_dir(id, 0).unwrap();
            store.save(&info(id, state, Some(now_ms()))).unwrap();
        }
        let runs = store.load_all();
        assert_eq!(runs.len(), 4);
        let run3 = runs.iter().find(|r| r.run_id == 3).unwrap();
        assert_eq!(run3.state, RunState::Failed);
        assert!(run3.reason.as_deref().unwrap().contains("daemon"));
        // Keep 2 of the 4 ended runs: the newest (4 and 3).
        let deleted = store.cleanup(&runs);
        assert_eq!(deleted, vec![2, 1]);
        assert!(!store.run_dir(1).exists());
        assert!(store.run_dir(4).exists());
    }
}
