//! Placeholder replaced by the pprof writer.

use std::io::{self, Write};

use crate::aggregate::Profile;

/// Writes `profile` as pprof.
pub fn write(_profile: &Profile, _w: &mut impl Write) -> io::Result<()> {
    Err(io::Error::other("pprof output is not implemented yet"))
}
