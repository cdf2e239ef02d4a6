//! The one way a test says it needs root: `needs_root!();` as its first line (or
//! `needs_root!(alone);` for a test that must have the machine to itself).
//!
//! The macro returns from the test when it cannot run (not root, outside CI: see
//! [`require_root`](crate::require_root)) and otherwise holds the test binary's machine lock
//! for the rest of the test. The tests of one family share one binary, and libtest runs a
//! binary's tests beside each other (CI passes `--test-threads=2`): most tests take the lock
//! shared and run as before, while one that measures the whole CPU (the sampled rate of
//! `hotcold`, shares of the whole machine, distinct stacks counted against time) takes it
//! alone, as it had when it was the only test of its own binary.

use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// The machine, as this test binary's tests share it.
static MACHINE: RwLock<()> = RwLock::new(());

/// How a test shares the machine with the other tests of its binary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Turn {
    /// Beside any other test that shares it.
    Beside,
    /// Alone: no other test of the binary that took the lock runs meanwhile.
    Alone,
}

/// The machine lock a running root test holds; released when the test ends.
#[derive(Debug)]
pub enum MachineGuard {
    /// Held by a test that runs beside others.
    Beside(#[allow(dead_code)] RwLockReadGuard<'static, ()>),
    /// Held by a test that runs alone.
    Alone(#[allow(dead_code)] RwLockWriteGuard<'static, ()>),
}

/// `None` when the test cannot run (see [`require_root`](crate::require_root)); else the machine
/// lock, taken as `turn` says. A test that panicked while alone does not keep the others from
/// running: the lock's poison is ignored (its `()` has nothing to leave half-written).
pub fn enter(turn: Turn) -> Option<MachineGuard> {
    if !crate::require_root() {
        return None;
    }
    Some(match turn {
        Turn::Beside => MachineGuard::Beside(MACHINE.read().unwrap_or_else(|e| e.into_inner())),
        Turn::Alone => MachineGuard::Alone(MACHINE.write().unwrap_or_else(|e| e.into_inner())),
    })
}

/// Returns from the test unless it can run as root, and holds the machine lock until the test
/// ends: `needs_root!();` beside the binary's other tests, `needs_root!(alone);` alone.
#[macro_export]
macro_rules! needs_root {
    () => {
        let Some(_machine) = $crate::root::enter($crate::root::Turn::Beside) else {
            return;
        };
    };
    (alone) => {
        let Some(_machine) = $crate::root::enter($crate::root::Turn::Alone) else {
            return;
        };
    };
}
