//! Output writers: each format in its own file, all reading the same [`Profile`].

pub mod folded;
pub mod summary;
pub mod top;

use std::{
    fs::File,
    io::{BufWriter, Write},
    path::{Path, PathBuf},
    str::FromStr,
};

use crate::{
    aggregate::Profile,
    error::{Error, Result},
};

/// A profile file format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Brendan Gregg's collapsed stacks.
    Folded,
    /// The run summary as JSON.
    SummaryJson,
}

impl FromStr for Format {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "folded" | "collapsed" => Ok(Format::Folded),
            "summary-json" => Ok(Format::SummaryJson),
            other => Err(Error::Other(anyhow::anyhow!(
                "unknown format {other:?}: expected folded or summary-json"
            ))),
        }
    }
}

impl Format {
    /// The format a path's extension names, if any.
    pub fn from_path(path: &Path) -> Option<Format> {
        match path.extension()?.to_str()? {
            "folded" | "collapsed" | "txt" => Some(Format::Folded),
            _ => None,
        }
    }
}

/// An output file, created before sampling starts so that an unwritable path fails early.
pub struct Output {
    path: PathBuf,
    format: Format,
    file: Option<File>,
}

impl Output {
    /// Creates (truncates) `path` for writing `format`.
    pub fn create(path: &Path, format: Format) -> Result<Output> {
        let file = File::create(path).map_err(|source| Error::Output {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(Output {
            path: path.to_path_buf(),
            format,
            file: Some(file),
        })
    }

    /// The path written to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The format written.
    pub fn format(&self) -> Format {
        self.format
    }

    /// Writes the profile and closes the file.
    pub fn write(mut self, profile: &Profile) -> Result<()> {
        let file = self.file.take().expect("written once");
        let mut w = BufWriter::new(file);
        let result = match self.format {
            Format::Folded => folded::write(profile, &mut w),
            Format::SummaryJson => summary::write(profile, &mut w),
        }
        .and_then(|()| w.flush());
        result.map_err(|source| Error::Output {
            path: self.path.clone(),
            source,
        })
    }

    /// Deletes the file when the run produced nothing to write.
    pub fn discard(mut self) {
        self.file.take();
        let _ = std::fs::remove_file(&self.path);
    }
}
