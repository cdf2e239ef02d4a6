//! Target processes: which processes a run profiles ([`target`]), their executable mappings
//! over time ([`maps`]), the kernel's vDSO image they map ([`vdso`]), and how the files they
//! control are opened and read as hostile input ([`target_file`]), within a budget for the
//! copies made of them ([`copies`]).

pub mod copies;
pub mod maps;
pub mod snapshot;
pub mod target;
pub mod target_file;
pub mod vdso;
