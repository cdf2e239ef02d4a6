//! The command line: its flags ([`args`]), its drivers ([`drivers`]: a direct recording over
//! [`record`]'s recorder, the daemon, `doctor`), the client commands ([`client`], with
//! [`results`] copying a run's files), the `strobeclient` front end ([`strobeclient`]), the
//! checks of `bpfprof doctor` ([`doctor`]) a recording's text summary ([`summary`]), the live view ([`top`]) and the
//! thread dump ([`dump`]).

pub mod args;
pub mod client;
pub mod doctor;
pub mod drivers;
pub mod dump;
pub mod record;
pub mod results;
pub mod strobeclient;
pub mod summary;
pub mod terminal;
pub mod top;
