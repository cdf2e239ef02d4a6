//! The Python frames of the waits a target was in when the run took it in
//! ([`crate::kernel::KernelProgram::scan_waits`], which walks their native stacks): read
//! here, as the `runtime` module is above the kernel one.

use crate::{
    kernel::ScannedWait,
    process::target::Target,
    runtime::cpython::{Probe, PythonFrame, PythonTarget},
};

/// Reads the Python frames of the waits `scanned` of `target`, a CPython the kernel walks,
/// into them.
pub fn read_python_frames(target: &Target, scanned: &mut [ScannedWait]) {
    if scanned.is_empty() {
        return;
    }
    let mut interpreter = match PythonTarget::probe(target.pid) {
        Ok(Probe::Walkable(p)) => *p,
        _ => return,
    };
    let listing = match interpreter.thread_listing() {
        Ok(l) => l,
        Err(e) => {
            log::info!(
                "pid {}: its waiting threads' Python frames: {e:#}",
                target.pid
            );
            return;
        }
    };
    for wait in scanned {
        let Some(&(_, tstate)) = listing.python.iter().find(|(tid, _)| *tid == wait.tid) else {
            continue;
        };
        let frames = interpreter.walk_thread(tstate).unwrap_or_default();
        let packed = frames
            .iter()
            .map(|f| PythonFrame::pack(f.code, f.instruction, f.identity, f.eval_entry))
            .collect();
        wait.set_python_frames(packed);
    }
}
