//! The command line's drivers: the record driver behind `bpfprof --pid`/`-- CMD` ([`record`]),
//! the `strobeclient` front end ([`strobeclient`]), `bpfprof doctor` ([`doctor`]) and copying a
//! daemon run's results to where its user asked ([`results`]).

pub mod doctor;
pub mod record;
pub mod results;
pub mod strobeclient;
