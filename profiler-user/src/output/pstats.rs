//! Placeholder replaced by the pstats writer.

use std::io::{self, Write};

use crate::aggregate::Profile;

/// Writes `profile` as pstats.
pub fn write(_profile: &Profile, _w: &mut impl Write) -> io::Result<()> {
    Err(io::Error::other("pstats output is not implemented yet"))
}
