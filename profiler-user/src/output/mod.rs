//! Output writers: each format in its own file, all reading the same [`Profile`]; the
//! exporters' requests (OTLP profiles, Pyroscope ingest) too, sent by the agent.

pub mod folded;
pub mod otlp;
pub mod pprof;
pub mod pstats;
pub mod pyroscope;
pub mod speedscope;
pub mod summary;
pub mod svg;
pub mod top;
pub mod trace;

use std::{
    fmt,
    fs::File,
    io::{self, BufWriter, Write},
    path::{Path, PathBuf},
    str::FromStr,
};

use crate::{
    error::{Error, Result},
    profile::Profile,
};

/// A profile file format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Interactive flame graph (SVG, rendered by inferno).
    Svg,
    /// Brendan Gregg's collapsed stacks.
    Folded,
    /// gzipped pprof `profile.proto`.
    Pprof,
    /// speedscope's JSON file format.
    Speedscope,
    /// Python's `pstats`/cProfile marshal format, for `pstats.Stats` and snakeviz.
    Pstats,
    /// The top-functions table as text.
    Top,
    /// The run summary as JSON.
    SummaryJson,
    /// The timeline in the Chrome trace event format (Perfetto UI, chrome://tracing).
    TraceJson,
}

impl Format {
    /// Every format with its name, as `--format` takes it.
    pub const NAMES: [(&'static str, Format); 8] = [
        ("svg", Format::Svg),
        ("folded", Format::Folded),
        ("pprof", Format::Pprof),
        ("speedscope", Format::Speedscope),
        ("pstats", Format::Pstats),
        ("top", Format::Top),
        ("summary-json", Format::SummaryJson),
        ("trace", Format::TraceJson),
    ];

    /// The format a path's extension names, if any.
    pub fn from_path(path: &Path) -> Option<Format> {
        let name = path.file_name()?.to_str()?.to_ascii_lowercase();
        let ends = |suffix: &str| name.ends_with(suffix);
        Some(if ends(".svg") {
            Format::Svg
        } else if ends(".folded") || ends(".collapsed") {
            Format::Folded
        } else if ends(".pb.gz") || ends(".pprof") || ends(".pb") {
            Format::Pprof
        } else if ends(".speedscope.json") || ends(".speedscope") {
            Format::Speedscope
        } else if ends(".prof") || ends(".pstats") {
            Format::Pstats
        } else if ends(".txt") {
            Format::Top
        } else if ends(".summary.json") {
            Format::SummaryJson
        } else if ends(".trace.json") {
            Format::TraceJson
        } else {
            return None;
        })
    }

    /// The usual file extension of the format.
    pub fn extension(self) -> &'static str {
        match self {
            Format::Svg => "svg",
            Format::Folded => "folded",
            Format::Pprof => "pb.gz",
            Format::Speedscope => "speedscope.json",
            Format::Pstats => "prof",
            Format::Top => "txt",
            Format::SummaryJson => "summary.json",
            Format::TraceJson => "trace.json",
        }
    }

    fn write(self, profile: &Profile, w: &mut dyn Write) -> io::Result<()> {
        let mut w = w;
        match self {
            Format::Svg => svg::write(profile, &mut w),
            Format::Folded => folded::write(profile, &mut w),
            Format::Pprof => pprof::write(profile, &mut w),
            Format::Speedscope => speedscope::write(profile, &mut w),
            Format::Pstats => pstats::write(profile, &mut w),
            Format::Top => w.write_all(top::render_file(profile).as_bytes()),
            Format::SummaryJson => summary::write(profile, &mut w),
            Format::TraceJson => trace::write(profile, &mut w),
        }
    }
}

impl FromStr for Format {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let alias = match s {
            "flamegraph" => "svg",
            "collapsed" => "folded",
            "pb.gz" => "pprof",
            "prof" => "pstats",
            "trace-json" | "trace.json" | "chrome" | "perfetto" => "trace",
            other => other,
        };
        Format::NAMES
            .iter()
            .find(|(name, _)| *name == alias)
            .map(|(_, f)| *f)
            .ok_or_else(|| {
                let names: Vec<&str> = Format::NAMES.iter().map(|(n, _)| *n).collect();
                Error::InvalidOutput(format!(
                    "unknown format {s:?}: expected one of {}",
                    names.join(", ")
                ))
            })
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = Format::NAMES
            .iter()
            .find(|(_, format)| format == self)
            .map_or("?", |(n, _)| n);
        f.write_str(name)
    }
}

/// Where an output goes.
enum Sink {
    /// A temporary file beside the output, renamed over it once the profile is written.
    Staged(tempfile::NamedTempFile),
    /// A file written in place: one the caller created (the daemon's results), or a path that
    /// is not a regular file (`/dev/stdout`, a FIFO), which a rename would replace.
    File(File),
    Stdout,
}

/// An output, checked before sampling starts so that an unwritable path fails early.
///
/// A file output is written to a temporary file created (`O_EXCL`, so no link is followed)
/// in the output's own directory before sampling, and renamed over the path only once the
/// profile is complete: an existing file is never truncated by a run that fails, a reader
/// never sees half a profile, and a directory that went away during the run is an error at
/// the rename rather than a file that silently went with it.
pub struct Output {
    path: Option<PathBuf>,
    format: Format,
    sink: Option<Sink>,
}

impl Output {
    /// Checks that `format` can be written to `path`: creates its temporary file beside it,
    /// without touching `path` itself.
    pub fn create(path: &Path, format: Format) -> Result<Output> {
        let error = |source| Error::Output {
            path: path.to_path_buf(),
            source,
        };
        // A device or a FIFO (`-o /dev/stdout`, a named pipe) is written in place: a rename
        // would replace it with a file. Only its opening is checked now, as it will be
        // written.
        if let Ok(meta) = std::fs::metadata(path) {
            if !meta.is_file() && !meta.is_dir() {
                let file = File::options().write(true).open(path).map_err(error)?;
                return Ok(Output::to_file(file, path.to_path_buf(), format));
            }
        }
        let dir = match path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => Path::new("."),
        };
        let name = path
            .file_name()
            .map_or_else(|| "bpfprof".into(), |n| n.to_string_lossy());
        let staged = tempfile::Builder::new()
            .prefix(&format!(".{name}."))
            .suffix(".partial")
            // As `File::create` would: the umask decides.
            .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666))
            .tempfile_in(dir)
            .map_err(error)?;
        Ok(Output {
            path: Some(path.to_path_buf()),
            format,
            sink: Some(Sink::Staged(staged)),
        })
    }

    /// Writes `format` to `file`, already open (created safely by the caller), named `path`.
    pub fn to_file(file: File, path: PathBuf, format: Format) -> Output {
        Output {
            path: Some(path),
            format,
            sink: Some(Sink::File(file)),
        }
    }

    /// Writes `format` to standard output.
    pub fn stdout(format: Format) -> Output {
        Output {
            path: None,
            format,
            sink: Some(Sink::Stdout),
        }
    }

    /// The path written to, or `None` for standard output.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The format written.
    pub fn format(&self) -> Format {
        self.format
    }

    /// Writes the profile and closes the output: a staged file is renamed into place only
    /// when all of it was written (and is removed otherwise).
    pub fn write(mut self, profile: &Profile) -> Result<()> {
        let path = self
            .path
            .clone()
            .unwrap_or_else(|| PathBuf::from("<stdout>"));
        let result = match self.sink.take() {
            Some(Sink::Staged(mut staged)) => {
                let mut w = BufWriter::new(staged.as_file_mut());
                let written = self.format.write(profile, &mut w).and_then(|()| w.flush());
                drop(w);
                // The rename fails (ENOENT) when the directory was removed during the run.
                written.and_then(|()| staged.persist(&path).map(drop).map_err(|e| e.error))
            }
            Some(Sink::File(file)) => {
                let mut w = BufWriter::new(file);
                self.format.write(profile, &mut w).and_then(|()| w.flush())
            }
            Some(Sink::Stdout) => {
                let stdout = io::stdout();
                let mut w = stdout.lock();
                self.format.write(profile, &mut w).and_then(|()| w.flush())
            }
            None => Ok(()),
        };
        result.map_err(|source| Error::Output { path, source })
    }

    /// Gives the output up when the run produced nothing to write: a staged file is removed
    /// (the path keeps what it had), a file the caller created is deleted.
    pub fn discard(mut self) {
        match (self.sink.take(), &self.path) {
            (Some(Sink::File(_)), Some(path)) => {
                let _ = std::fs::remove_file(path);
            }
            // Dropping the temporary file removes it.
            (sink, _) => drop(sink),
        }
    }
}

/// Writes `profile` to each output in turn: the one place a profile's outputs are written, for
/// the command line and the daemon alike; pstats outputs get `pstats_view` instead where
/// given (the Python view, which pstats shows by default). Each output written is reported
/// to `written` (its format and path). An output that cannot be opened or written does not
/// stop the others (the samples are not lost for one bad path); the first failure is
/// returned, so that the caller can say so, keep the samples elsewhere, or remove what was
/// written.
pub fn write_all(
    profile: &Profile,
    pstats_view: Option<&Profile>,
    outputs: impl IntoIterator<Item = Result<Output>>,
    mut written: impl FnMut(Format, Option<&Path>),
) -> Result<()> {
    let mut first_error = None;
    for output in outputs {
        let result = output.and_then(|output| {
            let (format, path) = (output.format(), output.path().map(Path::to_path_buf));
            let shown = match (format, pstats_view) {
                (Format::Pstats, Some(view)) => view,
                _ => profile,
            };
            output.write(shown)?;
            written(format, path.as_deref());
            Ok(())
        });
        if let Err(e) = result {
            first_error.get_or_insert(e);
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// Keeps the samples of a run whose outputs could not all be written: the folded stacks, in
/// `bpfprof-rescue-<pid>.folded` in the current directory, or in the temporary directory
/// when the current one is not writable. Created anew (`O_EXCL`, no link followed); its path,
/// or why neither place took it.
pub fn write_rescue(profile: &Profile) -> std::result::Result<PathBuf, String> {
    let name = format!("bpfprof-rescue-{}.folded", std::process::id());
    let mut failures = Vec::new();
    for dir in [PathBuf::from("."), std::env::temp_dir()] {
        let path = dir.join(&name);
        let file = match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
        {
            Ok(file) => file,
            Err(e) => {
                failures.push(format!("{}: {e}", path.display()));
                continue;
            }
        };
        let mut w = BufWriter::new(file);
        match folded::write(profile, &mut w).and_then(|()| w.flush()) {
            Ok(()) => return Ok(std::path::absolute(&path).unwrap_or(path)),
            Err(e) => {
                // Ours (created just now): a partial rescue would pass for the profile.
                let _ = std::fs::remove_file(&path);
                failures.push(format!("{}: {e}", path.display()));
            }
        }
    }
    Err(failures.join("; "))
}

/// A small profile with known contents, for the writers' tests.
#[cfg(test)]
pub(crate) mod fixture {
    use std::time::Duration;

    use crate::{
        profile::{
            Losses, Profile, ProfileFrame, ProfileMeta, ProfiledTarget, RunCost, RunEnd,
            StackCount, Tag,
        },
        sampling::{Event, Rate, Sampling},
        symbolize::{Frame, FrameKind},
    };

    fn code(name: &str, kind: FrameKind, inlined: bool, line: Option<u32>) -> ProfileFrame {
        ProfileFrame::Code(Frame {
            name: name.into(),
            module: Some(
                if kind == FrameKind::Kernel {
                    "[kernel]"
                } else {
                    "app"
                }
                .into(),
            ),
            kind,
            inlined,
            file: (kind == FrameKind::User).then(|| "/src/app.c".into()),
            line,
            start_line: line.map(|l| l - 2),
            build_id: (kind == FrameKind::User).then(|| "0123abcd".into()),
        })
    }

    /// [`profile`] with 5 more samples of `leaf_hot` at another of its lines (31), as
    /// `--line-numbers` records a function sampled at several lines.
    pub fn profile_with_leaf_hot_at_two_lines() -> Profile {
        let mut profile = profile();
        let ProfileFrame::Code(mut other_line) = profile.frames[4].clone() else {
            unreachable!("frame 4 is leaf_hot")
        };
        other_line.line = Some(31);
        profile.frames.push(ProfileFrame::Code(other_line));
        let id = profile.frames.len() - 1;
        profile.stacks.push(crate::profile::StackCount {
            frames: vec![0, 1, 2, 3, id],
            count: 5,
            off_cpu_ns: 0,
            addresses: Vec::new(),
        });
        profile
    }

    /// Stacks (root first):
    /// - tag;app;main;parent_hot;leaf_hot                  x 60
    /// - tag;app;main;parent_cold;leaf_cold                x 20
    /// - tag;app;main;recurse;recurse;leaf_hot             x 10 (recursion)
    /// - tag;app;main;parent_hot;inlined_helper;write_[k]  x 8  (inlined, kernel)
    /// - tag;app;[truncated];deep                          x 2
    ///
    /// Total 100 samples. Self: leaf_hot 70, leaf_cold 20, sys_write 8, deep 2.
    pub fn profile() -> Profile {
        let user = FrameKind::User;
        let tag = Tag::new("phase", "train").unwrap();
        let frames = vec![
            ProfileFrame::Tag(tag.clone()), // 0
            ProfileFrame::Process {
                name: "app".into(),
                pid: 1234,
                comm: "app".into(),
            }, // 1
            code("main", user, false, Some(10)), // 2
            code("parent_hot", user, false, Some(20)), // 3
            code("leaf_hot", user, false, Some(30)), // 4
            code("parent_cold", user, false, Some(40)), // 5
            code("leaf_cold", user, false, Some(50)), // 6
            code("recurse", user, false, Some(60)), // 7
            code("inlined_helper", user, true, Some(70)), // 8
            code("sys_write", FrameKind::Kernel, false, None), // 9
            ProfileFrame::Truncated,        // 10
            code("deep", user, false, None), // 11
        ];
        let stacks = vec![
            StackCount {
                frames: vec![0, 1, 2, 3, 4],
                count: 60,
                off_cpu_ns: 0,
                addresses: Vec::new(),
            },
            StackCount {
                frames: vec![0, 1, 2, 5, 6],
                count: 20,
                off_cpu_ns: 0,
                addresses: Vec::new(),
            },
            StackCount {
                frames: vec![0, 1, 2, 7, 7, 4],
                count: 10,
                off_cpu_ns: 0,
                addresses: Vec::new(),
            },
            StackCount {
                frames: vec![0, 1, 2, 3, 8, 9],
                count: 8,
                off_cpu_ns: 0,
                addresses: Vec::new(),
            },
            StackCount {
                frames: vec![0, 1, 10, 11],
                count: 2,
                off_cpu_ns: 0,
                addresses: Vec::new(),
            },
        ];
        Profile {
            meta: ProfileMeta {
                targets: vec![ProfiledTarget {
                    pid: 1234,
                    ns_pid: 1234,
                    pid_ns: 4026531836,
                    comm: "app".into(),
                }],
                sampling: Sampling {
                    event: Event::CpuClock,
                    rate: Rate::Period(1_001_001),
                    nominal_hz: 999.0,
                    fallback: true,
                    jitter: true,
                },
                duration: Duration::from_millis(100),
                samples_seen: 100,
                losses: Losses {
                    truncated: 2,
                    ..Losses::default()
                },
                end: RunEnd::Completed,
                program_id: 7,
                tags: vec![tag],
                max_stack_length: 127,
                cost: RunCost::default(),
                throttled: None,
                unwound: Default::default(),
                untabled: Vec::new(),
                tabled_late: Vec::new(),
                off_cpu: None,
                limits_hit: Vec::new(),
                unavailable: Vec::new(),
                python_unsupported: Vec::new(),
            },
            frames,
            stacks,
            mappings: Vec::new(),
            process_labels: Default::default(),
            timeline: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_all_writes_each_output_and_stops_at_the_first_failure() {
        let dir = tempfile::tempdir().unwrap();
        let profile = fixture::profile();
        let folded = dir.path().join("p.folded");
        let summary = dir.path().join("p.summary.json");
        let mut reported = Vec::new();
        write_all(
            &profile,
            None,
            [
                Output::create(&folded, Format::Folded),
                Output::create(&summary, Format::SummaryJson),
            ],
            |format, path| reported.push((format, path.map(Path::to_path_buf))),
        )
        .unwrap();
        assert_eq!(
            reported,
            [
                (Format::Folded, Some(folded.clone())),
                (Format::SummaryJson, Some(summary.clone()))
            ]
        );
        assert!(std::fs::read_to_string(&folded).unwrap().contains("app"));
        assert!(std::fs::metadata(&summary).unwrap().len() > 0);

        let mut reported = Vec::new();
        let svg = dir.path().join("p.svg");
        let err = write_all(
            &profile,
            None,
            [
                Output::create(&folded, Format::Folded),
                Output::create(&dir.path().join("missing/p.pb.gz"), Format::Pprof),
                Output::create(&svg, Format::Svg),
            ],
            |format, _| reported.push(format),
        )
        .unwrap_err();
        assert!(matches!(err, Error::Output { .. }), "{err}");
        // The failure does not stop the outputs after it.
        assert_eq!(reported, [Format::Folded, Format::Svg]);
        assert!(std::fs::read_to_string(&svg).unwrap().contains("<svg"));
    }

    #[test]
    fn an_existing_file_keeps_its_contents_until_the_profile_replaces_it() {
        let dir = tempfile::tempdir().unwrap();
        let folded = dir.path().join("keep.folded");
        std::fs::write(&folded, "old\n").unwrap();
        let output = Output::create(&folded, Format::Folded).unwrap();
        assert_eq!(std::fs::read_to_string(&folded).unwrap(), "old\n");
        // Given up (the run failed): the file is as it was, and nothing else is left.
        output.discard();
        assert_eq!(std::fs::read_to_string(&folded).unwrap(), "old\n");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        // Written: replaced whole.
        Output::create(&folded, Format::Folded)
            .unwrap()
            .write(&fixture::profile())
            .unwrap();
        assert!(std::fs::read_to_string(&folded)
            .unwrap()
            .contains("leaf_hot"));
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_directory_removed_during_the_run_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("out");
        std::fs::create_dir(&sub).unwrap();
        let output = Output::create(&sub.join("p.svg"), Format::Svg).unwrap();
        std::fs::remove_dir_all(&sub).unwrap();
        let err = output.write(&fixture::profile()).unwrap_err();
        assert!(matches!(err, Error::Output { .. }), "{err}");
    }

    #[test]
    fn an_unwritable_directory_fails_at_creation() {
        let err = Output::create(Path::new("/nonexistent/dir/x.svg"), Format::Svg)
            .err()
            .expect("no such directory");
        assert!(matches!(err, Error::Output { .. }), "{err}");
    }
}
