//! A running daemon run's life after its start: the task that watches it to its end, then
//! processes its samples off the reactor (symbolized, written in each format, summarized)
//! and records how it finished.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use tokio::sync::Notify;

use super::{result_file_name, DaemonDriver, Runs, Validated, PROGRAM_LINGER};
use crate::{
    clock::thread_cpu_time,
    daemon::store::now_ms,
    error::Error,
    output::{summary, top::function_shares, write_all, Format, Output},
    profile::{CostScope, RunEnd},
    protocol::{RunInfo, RunState, TopFunction},
    recording::{aggregate::pstats_view, run_loop, Recording},
    symbolize::Symbolizer,
};

impl Runs {
    pub(super) async fn monitor(
        self: Arc<Self>,
        id: u64,
        recording: Recording,
        stop: Arc<Notify>,
        validated: Validated,
        mut cpu: Duration,
    ) {
        let duration = validated
            .recording
            .duration
            .unwrap_or(self.limits.max_duration);
        let deadline = recording.started() + duration;
        // The run's sampling stops at its deadline even while a tick holds the pool (at a
        // high rate one took seconds); its program's other runs go on.
        let stoppers = recording.run_stoppers(&mut self.lock_pool());
        let guard = run_loop::DeadlineGuard::spawn(deadline, move || {
            stoppers.iter().for_each(crate::kernel::RunStopper::stop)
        });
        let mut driver = DaemonDriver {
            runs: self.clone(),
            id,
            recording: Some(recording),
            cpu,
            stop,
        };
        let ended = run_loop::run(&mut driver, deadline).await;
        let ended_at = std::time::SystemTime::now();
        // Joined off the reactor: the thread has stopped sampling, or will not now.
        let _ = tokio::task::spawn_blocking(move || guard.finish()).await;
        cpu = driver.cpu;
        let (mut recording, end) = match (driver.recording.take(), ended) {
            (Some(recording), Ok(end)) => (recording, end),
            (_, Err(reason)) => {
                self.finish_off_reactor(id, RunState::Failed, Some(reason), None)
                    .await;
                return;
            }
            (None, Ok(_)) => unreachable!("only a panicked tick loses the recording"),
        };
        {
            // Saving the state syncs a file: not on the thread that answers clients.
            let runs = self.clone();
            let _ =
                tokio::task::spawn_blocking(move || runs.set_state(id, RunState::Processing)).await;
        }
        let runs = self.clone();
        let collected = tokio::task::spawn_blocking(move || {
            let before = thread_cpu_time();
            // The last Python stacks are named off the programs' lock, with the extra CPU a
            // run's end gets; `collect` names what came since within the owner's share.
            recording.queue_runtime_stacks(&mut runs.lock_pool());
            recording.name_runtime_frames(true);
            let collected = recording.collect(&mut runs.lock_pool());
            (collected, thread_cpu_time().saturating_sub(before))
        })
        .await;
        let collected = match collected {
            Ok((collected, used)) => {
                cpu += used;
                collected
            }
            Err(e) => {
                let reason = format!("collecting the run's samples panicked: {e}");
                self.finish_off_reactor(id, RunState::Failed, Some(reason), None)
                    .await;
                return;
            }
        };
        // The program may now be the pool's idle spare: unload it once it has lingered.
        let runs = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(PROGRAM_LINGER + Duration::from_millis(100)).await;
            let _ = tokio::task::spawn_blocking(move || runs.lock_pool().expire_idle()).await;
        });
        let owner = self.owner(id);
        let final_state = if end == RunEnd::Interrupted {
            RunState::Stopped
        } else {
            RunState::Success
        };
        let runs = self.clone();
        let result = self
            .symbolizer
            .run(move |symbolizer| -> Result<Processed, Error> {
                let before = thread_cpu_time();
                let mut collected = collected?;
                if !may_see_kernel_frames(owner) {
                    collected.drop_kernel_frames();
                }
                // Once the run's frames are named (`assemble` took the run's own handles on
                // its targets' files), the symbolizer closes the files it opened for it, a
                // target's deleted binaries among them, before the profile is built.
                let mut profile = collected.assemble(
                    end,
                    symbolizer,
                    &validated.recording.options,
                    Symbolizer::release,
                );
                symbolizer.bound();
                // The daemon serves many runs: this run's cost is the CPU spent on its work
                // (attach, ticks, collection, processing), beside the daemon's peak memory.
                cpu += thread_cpu_time().saturating_sub(before);
                profile.meta.cost.profiler_cpu_secs = cpu.as_secs_f64();
                profile.meta.cost.scope = CostScope::DaemonRun;
                let owner = runs.owner(id);
                let mut files = BTreeMap::new();
                let mut formats = validated.formats.clone();
                formats.push(Format::SummaryJson);
                let outputs = formats.iter().map(|&format| {
                    let (file, path) = runs
                        .store
                        .create_result(id, &result_file_name(format), owner)
                        .map_err(Error::Other)?;
                    Ok(Output::to_file(file, path, format))
                });
                let view = formats
                    .contains(&Format::Pstats)
                    .then(|| pstats_view(&profile, &validated.recording.options))
                    .flatten();
                let wrote = write_all(&profile, view.as_ref(), outputs, |format, path| {
                    let path = path.map(|p| p.display().to_string()).unwrap_or_default();
                    files.insert(format.to_string(), path);
                });
                if let Err(e) = wrote {
                    // A full disk must not leave empty or partial files behind.
                    for format in formats {
                        runs.store.remove_result(id, &result_file_name(format));
                    }
                    return Err(e);
                }
                let mut json = Vec::new();
                summary::write(&profile, &mut json).map_err(|e| Error::Other(e.into()))?;
                let summary = serde_json::from_slice(&json).ok();
                let top = function_shares(&profile)
                    .into_iter()
                    .take(20)
                    .map(|s| TopFunction {
                        name: s.name,
                        self_samples: s.self_samples,
                        total_samples: s.total_samples,
                    })
                    .collect();
                let samples = profile.total_samples();
                // Queued, not sent: the run's results do not wait on a backend.
                runs.export(id, owner, profile, ended_at);
                Ok(Processed {
                    samples,
                    files,
                    top,
                    summary,
                })
            })
            .await;
        match result {
            Ok(Ok(processed)) => {
                self.finish_off_reactor(id, final_state, None, Some(processed))
                    .await
            }
            Ok(Err(e)) => {
                self.finish_off_reactor(id, RunState::Failed, Some(e.to_string()), None)
                    .await
            }
            Err(e) => {
                self.finish_off_reactor(id, RunState::Failed, Some(e), None)
                    .await
            }
        }
    }

    /// [`Self::finish`] on a blocking thread: it syncs the run's state file and cleans up
    /// old runs' folders, which must not hold up the thread that answers clients.
    pub(super) async fn finish_off_reactor(
        self: &Arc<Self>,
        id: u64,
        state: RunState,
        reason: Option<String>,
        processed: Option<Processed>,
    ) {
        let runs = self.clone();
        let finished =
            tokio::task::spawn_blocking(move || runs.finish(id, state, reason, processed)).await;
        if let Err(e) = finished {
            log::warn!("finishing run {id} panicked: {e}");
        }
    }

    pub(super) fn finish(
        &self,
        id: u64,
        state: RunState,
        reason: Option<String>,
        processed: Option<Processed>,
    ) {
        let mut info = match self.lock().runs.get(&id) {
            Some(run) => run.info.clone(),
            None => return,
        };
        info.state = state;
        info.reason = reason.clone();
        info.ended_unix_ms = Some(now_ms());
        if let Some(p) = processed {
            info.samples = p.samples;
            info.files = p.files;
            info.top = p.top;
            info.summary = p.summary;
        }
        match &reason {
            Some(r) => log::warn!("run {id}: {state}: {r}"),
            None => log::info!("run {id}: {state}, {} samples", info.samples),
        }
        // Saved before clients learn of it: a client told that a run ended must find it so
        // after a crash. Announced first, a crash during the sync brought the run back as
        // interrupted (FAILED) although its client had its results.
        if let Err(e) = self.store.save(&info) {
            log::warn!("saving run {id}: {e:#}");
        }
        {
            let mut table = self.lock();
            if let Some(run) = table.runs.get_mut(&id) {
                run.info = info.clone();
                let _ = run.state.send(state);
            }
        }
        let all: Vec<RunInfo> = self.lock().runs.values().map(|r| r.info.clone()).collect();
        let deleted = self.store.cleanup(&all);
        if !deleted.is_empty() {
            let mut table = self.lock();
            for d in deleted {
                table.runs.remove(&d);
            }
        }
    }
}

pub(super) struct Processed {
    samples: u64,
    files: BTreeMap<String, String>,
    top: Vec<TopFunction>,
    summary: Option<serde_json::Value>,
}

/// Whether user `uid` may see kernel frames: root always, others where
/// `kernel.perf_event_paranoid` lets unprivileged users profile the kernel (1 or less), as
/// `perf record` run by that user would.
pub(super) fn may_see_kernel_frames(uid: u32) -> bool {
    uid == 0
        || std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
            .is_some_and(|level| level <= 1)
}
