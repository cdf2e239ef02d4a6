//! Naming a recording's Python frames: queueing the frames of new Python stacks while their
//! processes live, and naming them within the owner's CPU share.

use std::{collections::HashMap, time::Duration};

use profiler_common::StackId;

use crate::{
    kernel::pool::{ProgramPool, Slot},
    kernel::KernelProgram,
    recording::process::ProcessRecording,
    recording::Recording,
    runtime::cpython::stacks::PythonTracking,
};

/// What [`Recording::name_python`] may take of its owner's CPU share at once: all of it (the
/// share is what bounds it; a single-owner recording names everything queued).
const NAMING_WANT: Duration = Duration::MAX;

impl Recording {
    /// Names the Python frames ticks queued, reading code objects from the live processes:
    /// call it without the programs' lock (it needs none), on a thread that answers no
    /// client. It takes what is left of the owner's CPU share of the period (`at_end`: with
    /// the extra a run's end gets, see [`crate::runtime::cpython::shares`]) and names for that long, the
    /// processes in turn; what is left waits for the next call.
    pub fn name_python(&mut self, at_end: bool) {
        let owner = self.owner_uid();
        let waiting = self
            .processes
            .values()
            .filter(|p| p.python.as_ref().is_some_and(|t| t.has_queued()))
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
            let Some(python) = &mut p.python else {
                continue;
            };
            if !python.has_queued() {
                continue;
            }
            if p.exited {
                // Its code objects cannot be read any more.
                python.abandon_queued();
                continue;
            }
            if left.is_zero() {
                break;
            }
            left = left.saturating_sub(python.name_queued(left));
        }
        self.naming.give_back(owner, left);
    }

    /// Queues the frames of the Python stacks recorded since the last tick, to be named by
    /// [`Self::name_python`]: a driver that names off the programs' lock calls it before
    /// [`Self::collect`], so that the last stacks are named there.
    pub fn queue_python(&mut self, pool: &mut ProgramPool) {
        let mut python_ids = PythonStackIds::default();
        for p in self.processes.values_mut().filter(|p| !p.exited) {
            python_ids.queue(p, pool);
        }
    }
}

/// The Python stacks each program recorded so far, with their runs and pids (see
/// [`KernelProgram::python_stack_ids`]): read once per program in a pass over a recording's
/// processes, and shared by the processes of the program.
#[derive(Default)]
pub(super) struct PythonStackIds(HashMap<u32, Vec<(u64, u32, StackId)>>);

impl PythonStackIds {
    /// Queues the frames of the Python stacks recorded for `python` (a process of `slot`,
    /// whose samples carry `sample_pid`) that it has not queued yet, to be named by
    /// [`Recording::name_python`]; `read` reads the program's stacks the first time one of
    /// its processes asks.
    pub(super) fn queue_with(
        &mut self,
        python: &mut PythonTracking,
        program: &KernelProgram,
        slot: Slot,
        sample_pid: u32,
        read: impl FnOnce(&KernelProgram) -> Vec<(u64, u32, StackId)>,
    ) {
        let ids = self
            .0
            .entry(slot.program_id)
            .or_insert_with(|| read(program));
        python.queue_new_stacks(program, ids, slot.run, sample_pid);
    }

    /// [`Self::queue_with`] for process `p`, where it runs a CPython and its program is in
    /// `pool`.
    pub(super) fn queue(&mut self, p: &mut ProcessRecording, pool: &mut ProgramPool) {
        if let (Some(python), Ok(program)) = (&mut p.python, pool.program(p.slot)) {
            self.queue_with(
                python,
                program,
                p.slot,
                p.sample_pid,
                KernelProgram::python_stack_ids,
            );
        }
    }

    /// Whether the stacks of program `program_id` were read.
    pub(super) fn read_for(&self, program_id: u32) -> bool {
        self.0.contains_key(&program_id)
    }
}
