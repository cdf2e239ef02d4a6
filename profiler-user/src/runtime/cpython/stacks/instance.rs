//! CPython's side of the runtime interface: what a recording asks of a process's tracking.

use super::*;

impl crate::runtime::Instance for PythonTracking {
    fn tag(&self) -> profiler_common::RuntimeTag {
        profiler_common::RuntimeTag::CPython
    }

    fn refresh(&mut self, program: &mut KernelProgram) {
        self.refresh_threads(program);
    }

    fn queue_new_stacks(
        &mut self,
        program: &KernelProgram,
        ids: &[(u64, u32, StackId)],
        run: u32,
        ns_pid: u32,
    ) {
        PythonTracking::queue_new_stacks(self, program, ids, run, ns_pid);
    }

    fn has_queued(&self) -> bool {
        PythonTracking::has_queued(self)
    }

    fn name_queued(&mut self, cpu: Duration) -> Duration {
        PythonTracking::name_queued(self, cpu)
    }

    fn abandon_queued(&mut self) {
        PythonTracking::abandon_queued(self);
    }

    fn thread_names(&mut self) -> HashMap<u32, String> {
        self.threading_names()
    }

    fn thread_listed(&self, ns_tid: u32) -> Option<bool> {
        self.listed(ns_tid)
    }

    fn runs_no_runtime_code(&self, ns_tid: u32) -> bool {
        self.runs_no_python(ns_tid)
    }

    fn limits_hit(&self) -> Option<String> {
        PythonTracking::limits_hit(self)
    }

    fn naming_cost(&self) -> (usize, Duration) {
        PythonTracking::naming_cost(self)
    }

    fn frames(&self) -> &dyn crate::runtime::NamedFrames {
        &self.names
    }

    fn notes(&self) -> Vec<String> {
        PythonTracking::notes(self)
    }

    fn read_wait_stacks(
        &mut self,
        target: &crate::process::target::Target,
        scanned: &mut [crate::kernel::ScannedWait],
    ) {
        super::super::waits::read_python_frames(target, scanned);
    }

    fn stop(&mut self, program: &mut KernelProgram) {
        PythonTracking::stop(self, program);
    }
}
