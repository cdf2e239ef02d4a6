//! Target processes: which processes a run profiles ([`target`]), their executable mappings
//! over time ([`maps`]) and the kernel's vDSO image they map ([`vdso`]).

pub mod maps;
pub mod target;
pub mod vdso;
