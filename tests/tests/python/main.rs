//! End-to-end tests of the Python support: CPython's frames read from outside the interpreter,
//! walked by the kernel program, named and shown, and the PyTorch drivers on top of them.
//!
//! One binary, one module per topic (`cargo test -p bpfprof-tests --test python -- walk::`).

mod asyncio;
mod cpython_314;
mod cpython_314_modes;
mod doctor;
mod frames;
mod free_threaded;
mod free_threaded_state;
mod gil;
mod layout;
mod pytorch;
mod pytorch_314;
mod stripped;
mod strobeclient;
mod strobelight_314;
mod thread_reuse;
mod view;
mod walk;
