//! The timeline ring: each sample's time for the runs that record a timeline, read into
//! userspace at every tick and taken per run.

use std::collections::HashMap as StdHashMap;

use anyhow::anyhow;
use aya::maps::MapData;
use profiler_common::{Config, SampleKey, TimelineRecord, MAX_RUNS};

use super::program::{kernel_err, KernelProgram};
use crate::error::{Error, Result};

impl KernelProgram {
    /// Makes `run` record a timeline: from now on each of its CPU samples' times is kept too,
    /// and [`crate::kernel::drain::drain`] gives each sample its times.
    pub fn record_timeline(&mut self, run: u32) -> Result<()> {
        if run >= MAX_RUNS {
            return Err(Error::Kernel(anyhow!("run slot {run} out of range")));
        }
        if self.timeline.is_none() {
            self.timeline = Some(self.map_timeline()?);
        }
        // What an earlier run of the slot left is not this run's: samples that raced with its
        // end are still in the ring, or were read after it took its times.
        self.read_timeline();
        self.take_times(run);
        self.timeline_runs |= 1 << run;
        self.config
            .set(Config::TimelineRuns as u32, self.timeline_runs, 0)
            .map_err(kernel_err)
    }

    /// Stops recording a timeline for `run` (a no-op for a run that did not), reading what the
    /// ring holds first. Call before draining the run's samples.
    pub fn end_timeline(&mut self, run: u32) {
        if self.timeline_runs & (1 << run) == 0 {
            return;
        }
        self.read_timeline();
        self.timeline_runs &= !(1 << run);
        let _ = self
            .config
            .set(Config::TimelineRuns as u32, self.timeline_runs, 0);
        if self.timeline_runs == 0 {
            // What the kernel writes after this is no run's: the next run to record a
            // timeline reads it and drops it.
            self.timeline = None;
        }
    }

    /// Maps the timeline ring (a second handle on the map, so that unmapping it leaves the
    /// map to the program).
    fn map_timeline(&self) -> Result<aya::maps::RingBuf<MapData>> {
        use std::os::fd::AsFd;
        let fd = self
            .timeline_map
            .fd()
            .as_fd()
            .try_clone_to_owned()
            .map_err(|e| kernel_err(anyhow!(e).context("duplicating the timeline ring's fd")))?;
        let map = MapData::from_fd(fd).map_err(kernel_err)?;
        aya::maps::RingBuf::try_from(aya::maps::Map::RingBuf(map)).map_err(kernel_err)
    }

    /// Moves what the timeline ring holds into `timeline_times`, each sample's time under its
    /// key for each run that records a timeline; call at every tick, so that the ring (room
    /// for 0.1 s of 145,000 samples a second) does not fill.
    pub(super) fn read_timeline(&mut self) {
        let Some(ring) = &mut self.timeline else {
            return;
        };
        // Records of runs that no longer record a timeline are read and dropped.
        while let Some(item) = ring.next() {
            if item.len() < std::mem::size_of::<TimelineRecord>() {
                continue;
            }
            // SAFETY: the kernel wrote a whole `TimelineRecord` (plain integers) here; the
            // ring's data is 8-aligned, read unaligned anyway.
            let record: TimelineRecord = unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
            let runs = record.key.runs & self.timeline_runs;
            for run in 0..MAX_RUNS {
                if runs & (1 << run) != 0 {
                    let key = SampleKey {
                        runs: 1 << run,
                        ..record.key
                    };
                    self.timeline_times
                        .entry(key)
                        .or_default()
                        .push(record.time_ns);
                }
            }
        }
    }

    /// Takes the sample times of `run` read so far, by the sample's key (as
    /// [`Self::take_samples`] gives keys); empty for a run without a timeline.
    pub(crate) fn take_times(&mut self, run: u32) -> StdHashMap<SampleKey, Vec<u64>> {
        let bit = 1u64 << run;
        let mut times = StdHashMap::new();
        self.timeline_times.retain(|key, t| {
            if key.runs == bit {
                times.insert(*key, std::mem::take(t));
                false
            } else {
                true
            }
        });
        times
    }
}
