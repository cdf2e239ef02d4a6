//! Naming a recording's runtime frames: queueing the frames of new runtime stacks while their
//! processes live, and naming them within the owner's CPU share.

use std::{collections::HashMap, time::Duration};

use profiler_common::StackId;

use crate::{
    kernel::pool::{ProgramPool, Slot},
    kernel::KernelProgram,
    recording::process::ProcessRecording,
    recording::Recording,
    runtime::Instance,
};

/// What [`Recording::name_runtime_frames`] may take of its owner's CPU share at once: all of it (the
/// share is what bounds it; a single-owner recording names everything queued).
const NAMING_WANT: Duration = Duration::MAX;

impl Recording {
    /// Names the runtime frames ticks queued, reading code objects from the live processes:
    /// call it without the programs' lock (it needs none), on a thread that answers no
    /// client. It takes what is left of the owner's CPU share of the period (`at_end`: with
    /// the extra a run's end gets, see [`crate::runtime::shares`]) and names for that long, the
    /// processes in turn; what is left waits for the next call.
    pub fn name_runtime_frames(&mut self, at_end: bool) {
        let owner = self.owner_uid();
        let waiting = self
            .processes
            .values()
            .filter(|p| p.runtime.as_ref().is_some_and(|t| t.has_queued()))
            .count();
        if waiting == 0 {
            return;
        }
        let given = self.naming.take_cpu(owner, NAMING_WANT, at_end);
        let mut left = given;
        let mut order: Vec<&mut ProcessRecording> = self.processes.values_mut().collect();
        let turn = self.naming_turn % order.len().max(1);
        order.rotate_left(turn);
        self.naming_turn = self.naming_turn.wrapping_add(1);
        for p in order {
            let Some(runtime) = &mut p.runtime else {
                continue;
            };
            if !runtime.has_queued() {
                continue;
            }
            if p.exited {
                // Its code objects cannot be read any more.
                runtime.abandon_queued();
                continue;
            }
            if left.is_zero() {
                break;
            }
            left = left.saturating_sub(runtime.name_queued(left));
        }
        self.naming.give_back(owner, left);
    }

    /// Queues the frames of the runtime stacks recorded since the last tick, to be named by
    /// [`Self::name_runtime_frames`]: a driver that names off the programs' lock calls it before
    /// [`Self::collect`], so that the last stacks are named there.
    pub fn queue_runtime_stacks(&mut self, pool: &mut ProgramPool) {
        let mut runtime_ids = RuntimeStackIds::default();
        for p in self.processes.values_mut().filter(|p| !p.exited) {
            runtime_ids.queue(p, pool);
        }
    }
}

/// The runtime stacks each program recorded so far, with their runs and pids (see
/// [`KernelProgram::runtime_stack_ids`]): read once per program in a pass over a recording's
/// processes, and shared by the processes of the program.
#[derive(Default)]
pub(super) struct RuntimeStackIds(HashMap<u32, Vec<(u64, u32, StackId)>>);

impl RuntimeStackIds {
    /// Queues the frames of the runtime stacks recorded for `runtime` (a process of `slot`,
    /// whose samples carry `sample_pid`) that it has not queued yet, to be named by
    /// [`Recording::name_runtime_frames`]; `read` reads the program's stacks the first time one of
    /// its processes asks.
    pub(super) fn queue_with(
        &mut self,
        runtime: &mut dyn Instance,
        program: &KernelProgram,
        slot: Slot,
        sample_pid: u32,
        read: impl FnOnce(&KernelProgram) -> Vec<(u64, u32, StackId)>,
    ) {
        let ids = self
            .0
            .entry(slot.program_id)
            .or_insert_with(|| read(program));
        runtime.queue_new_stacks(program, ids, slot.run, sample_pid);
    }

    /// [`Self::queue_with`] for process `p`, where it runs a runtime and its program is in
    /// `pool`.
    pub(super) fn queue(&mut self, p: &mut ProcessRecording, pool: &mut ProgramPool) {
        if let (Some(runtime), Ok(program)) = (&mut p.runtime, pool.program(p.slot)) {
            self.queue_with(
                runtime.as_mut(),
                program,
                p.slot,
                p.sample_pid,
                KernelProgram::runtime_stack_ids,
            );
        }
    }

    /// Whether the stacks of program `program_id` were read.
    pub(super) fn read_for(&self, program_id: u32) -> bool {
        self.0.contains_key(&program_id)
    }
}
