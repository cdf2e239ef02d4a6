//! Language runtimes whose frames bpfprof reads: CPython ([`cpython`]).

pub mod cpython;
