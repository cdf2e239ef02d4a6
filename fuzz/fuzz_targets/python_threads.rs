//! The thread-state listing of a CPython process, as the daemon reads it from a target's
//! memory at every refresh (`bpfprof::runtime::cpython::list_thread_states`): the reads go through the
//! real `ProcessMemory` (this process's own memory), from an image of the target's memory that
//! the fuzzer writes.
//!
//! Input: byte 0 picks the CPython version whose layout is used (3.10 to 3.13, by
//! `byte % 4`); the rest is mapped at `IMAGE_BASE`, where `_PyRuntime` starts. The
//! interpreter and thread-state pointers are addresses in that mapping (or anywhere: wild
//! ones), so the fuzzer can build any list there, cycles across interpreters included. The
//! listing must end (libFuzzer's timeout), read each thread state once, and stay within its
//! bounds.
#![no_main]

use std::collections::HashSet;

use bpfprof::runtime::cpython::{list_thread_states, MAX_THREAD_STATES};
use bpfprof_fuzz::{python_image, IMAGE_BASE};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((layout, _image, mem)) = python_image(data) else {
        return;
    };
    let Ok(listed) = list_thread_states(&mem, &layout, IMAGE_BASE as u64) else {
        return;
    };
    assert!(
        listed.states.len() <= MAX_THREAD_STATES,
        "{} thread states listed",
        listed.states.len()
    );
    let mut seen = HashSet::new();
    for state in &listed.states {
        assert_ne!(state.address, 0, "a null thread state listed");
        assert!(
            seen.insert(state.address),
            "{:#x} listed twice",
            state.address
        );
    }
});
