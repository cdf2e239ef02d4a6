//! One validated recording request, built in one place whether it comes from the command
//! line's flags or from a protocol `RunRequest`: tags parsed by one parser, the stack depth and
//! the duration checked against one set of limits, the event and rate validated before anything
//! is loaded.

use std::{
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    time::Duration,
};

use crate::{
    error::{Error, Result},
    profile::Tag,
    protocol::{RunRequest, MAX_TAGS},
    recording::aggregate::AggregateOptions,
    runtime::{cpython::stacks::PythonMode, Enabled, FrameOptions},
    sampling::{
        validate_max_stack_length, KernelLimits, Mode, OffCpu, SamplingPlan, SamplingRequest,
    },
    unwind::UnwindMode,
};

/// Deepest stack kept when a request names none: 127 frames, perf's default; deeper stacks
/// (up to [`profiler_common::MAX_STACK_DEPTH`]) only when asked.
pub const DEFAULT_MAX_STACK_LENGTH: i64 = profiler_common::DEFAULT_STACK_DEPTH as i64;

/// Tags and stack settings of a request, before validation.
#[derive(Clone, Debug, Default)]
pub struct TagsAndStacks<'a> {
    /// Bare tags (`--sample-tags a,b`).
    pub sample_tags: &'a [String],
    /// `key=value` tags.
    pub tags: Vec<(&'a str, &'a str)>,
    /// Deepest stack kept; `None` for the default.
    pub max_stack_length: Option<i64>,
    /// Keep threads apart.
    pub per_thread: bool,
    /// Show source lines.
    pub line_numbers: bool,
    /// How runtime frames are shown.
    pub runtime: FrameOptions,
}

/// How a request's stacks are walked, before validation.
#[derive(Clone, Copy, Debug)]
pub struct Walks {
    /// How user stacks are walked (`--unwind`, the protocol's `unwind`).
    pub unwind: UnwindMode,
    /// Whether CPython targets get their Python frames read.
    pub python: PythonMode,
    /// The cap on a kernel program's unwind row array, in MiB (`--unwind-table-mib`).
    pub table_mib: u32,
    /// Most asyncio tasks read above a sampled task (`--max-async-depth`); `None`: async
    /// stacks off (`--python-async off`).
    pub python_async: Option<u32>,
}

impl Default for Walks {
    fn default() -> Walks {
        Walks {
            unwind: UnwindMode::default(),
            python: PythonMode::default(),
            table_mib: crate::unwind::DEFAULT_TABLE_MIB,
            python_async: Some(crate::runtime::cpython::asyncio::DEFAULT_MAX_ASYNC_DEPTH as u32),
        }
    }
}

/// A recording request that passed every check: what the pipeline is handed.
#[derive(Clone, Debug)]
pub struct RecordingRequest {
    /// The event and rate asked for (validated: [`Self::plan`] is what it will try).
    pub sampling: SamplingRequest,
    /// The events to try, from `sampling`.
    pub plan: SamplingPlan,
    /// Follow the children targets fork.
    pub follow_children: bool,
    /// How long to record; `None` until the targets exit or the run is stopped.
    pub duration: Option<Duration>,
    /// How samples become a profile.
    pub options: AggregateOptions,
    /// How user stacks are walked.
    pub unwind: UnwindMode,
    /// The runtimes whose frames are read.
    pub runtimes: Enabled,
    /// Most rows of a kernel program's unwind table array.
    pub table_rows_cap: u32,
    /// Which processes are recorded: named targets, or every process on the machine.
    pub scope: Scope,
}

/// Which processes a recording records.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Scope {
    /// The targets a driver adds (`--pid`, a launched command, a daemon run's pid).
    #[default]
    Targets,
    /// Every process on the machine (`--all`), as [`SystemScope`] narrows it.
    System(SystemScope),
}

/// What a system-wide recording keeps.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SystemScope {
    /// Whether kernel threads are recorded (`--no-kernel-threads` leaves them out).
    pub kernel_threads: bool,
    /// The cgroup v2 whose processes (and its descendant cgroups') alone are kept: an absolute
    /// path, checked to be a directory of a cgroup2 mount when validated.
    pub cgroup: Option<PathBuf>,
}

/// `statfs` type of a cgroup v2 file system (`CGROUP2_SUPER_MAGIC`).
const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;

/// Root of the cgroup mounts: a relative `--cgroup` path is taken below the cgroup2 mount
/// found here (`/sys/fs/cgroup` itself on a pure v2 system, `/sys/fs/cgroup/unified` on a
/// hybrid one).
pub const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// A cgroup v2 as the kernel program filters on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CgroupFilter {
    /// The cgroup's id: the inode of its directory.
    pub id: u64,
    /// Its depth below the hierarchy's root (the root is 0).
    pub level: u32,
}

impl SystemScope {
    /// Resolves `--cgroup PATH`: absolute, or relative to the cgroup2 mount under
    /// [`CGROUP_ROOT`]; it must be a directory of a cgroup v2 file system.
    pub fn resolve_cgroup(path: &Path) -> Result<PathBuf> {
        let invalid = |reason: String| Error::InvalidTarget {
            spec: path.display().to_string(),
            reason,
        };
        let mounts = cgroup2_mounts();
        let full = if path.is_absolute() {
            path.to_path_buf()
        } else {
            // Below the cgroup2 mount under /sys/fs/cgroup, else as given below /sys/fs/cgroup.
            let mut candidates: Vec<PathBuf> = mounts
                .iter()
                .filter(|(m, _)| m.starts_with(CGROUP_ROOT))
                .map(|(m, _)| m.join(path))
                .collect();
            candidates.push(Path::new(CGROUP_ROOT).join(path));
            candidates
                .iter()
                .find(|c| c.exists())
                .unwrap_or(&candidates[0])
                .clone()
        };
        let full = full
            .canonicalize()
            .map_err(|e| invalid(format!("no such cgroup ({}): {e}", full.display())))?;
        if !full.is_dir() {
            return Err(invalid(format!("{} is not a directory", full.display())));
        }
        if !is_cgroup2(&full) {
            return Err(invalid(format!(
                "{} is not in a cgroup v2 hierarchy (cgroup2 is mounted at {})",
                full.display(),
                if mounts.is_empty() {
                    "no place here".to_string()
                } else {
                    mounts
                        .iter()
                        .map(|(m, _)| m.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            )));
        }
        Ok(full)
    }

    /// The id and depth of the cgroup at `path` (from [`Self::resolve_cgroup`]), read now.
    pub fn cgroup_filter(path: &Path) -> Result<CgroupFilter> {
        let invalid = |reason: String| Error::InvalidTarget {
            spec: path.display().to_string(),
            reason,
        };
        let (mount, root) = cgroup2_mounts()
            .into_iter()
            .filter(|(m, _)| path.starts_with(m))
            .max_by_key(|(m, _)| m.components().count())
            .ok_or_else(|| invalid("not below a cgroup2 mount".into()))?;
        let below = path.strip_prefix(&mount).unwrap_or(path);
        // A mount of a subtree (`root` other than "/") starts that many levels down; in a
        // cgroup namespace the mount's root is the namespace's, not the hierarchy's, which the
        // root cgroup's id (1) tells.
        let root_depth = Path::new(&root).components().count().saturating_sub(1);
        let meta = std::fs::metadata(&mount)
            .map_err(|e| invalid(format!("reading {}: {e}", mount.display())))?;
        if root == "/" && meta.ino() != 1 {
            return Err(invalid(format!(
                "{} is not the root of the cgroup hierarchy (a cgroup namespace?): --cgroup \
                 needs the host's view",
                mount.display()
            )));
        }
        let level = root_depth + below.components().count();
        let id = std::fs::metadata(path)
            .map_err(|e| invalid(format!("no such cgroup: {e}")))?
            .ino();
        Ok(CgroupFilter {
            id,
            level: level as u32,
        })
    }
}

/// Whether `path` lies on a cgroup v2 file system.
// `f_type`'s integer type differs between architectures.
#[allow(clippy::unnecessary_cast)]
fn is_cgroup2(path: &Path) -> bool {
    rustix::fs::statfs(path).is_ok_and(|s| s.f_type as i64 == CGROUP2_SUPER_MAGIC)
}

/// The cgroup2 mounts bpfprof sees: mount point and the hierarchy path mounted there.
fn cgroup2_mounts() -> Vec<(PathBuf, String)> {
    procfs::process::Process::myself()
        .and_then(|p| p.mountinfo())
        .map(|mounts| {
            mounts
                .into_iter()
                .filter(|m| m.fs_type == "cgroup2")
                .map(|m| (m.mount_point, m.root))
                .collect()
        })
        .unwrap_or_default()
}

impl RecordingRequest {
    /// Validates a request; `max_duration` bounds `duration`.
    pub fn validate(
        sampling: SamplingRequest,
        follow_children: bool,
        duration: Option<Duration>,
        max_duration: Duration,
        stacks: TagsAndStacks<'_>,
        walks: Walks,
    ) -> Result<RecordingRequest> {
        let table_rows_cap = crate::unwind::table_rows_cap(walks.table_mib)?;
        let tags = parse_tags(stacks.sample_tags, &stacks.tags)?;
        let max_stack_length =
            validate_max_stack_length(stacks.max_stack_length.unwrap_or(DEFAULT_MAX_STACK_LENGTH))?;
        check_duration(duration, max_duration)?;
        let plan = sampling.plan(&KernelLimits::read())?;
        Ok(RecordingRequest {
            sampling,
            plan,
            follow_children,
            duration,
            options: AggregateOptions {
                per_thread: stacks.per_thread,
                max_stack_length,
                line_numbers: stacks.line_numbers,
                tags,
                runtime: stacks.runtime,
                // The recording sets it from what it records.
                pid_roots: false,
                // The driver sets it from the outputs asked for.
                timeline: false,
                // Likewise, where no output shows addresses.
                addresses: true,
            },
            unwind: walks.unwind,
            runtimes: walks
                .python
                .runtimes(Enabled::ALL)
                .with_async(walks.python_async),
            table_rows_cap,
            scope: Scope::Targets,
        })
    }

    /// The request recording `scope`, whose cgroup (if any) is resolved and checked.
    pub fn with_scope(mut self, scope: Scope) -> Result<RecordingRequest> {
        self.scope = match scope {
            Scope::System(SystemScope {
                kernel_threads,
                cgroup,
            }) => Scope::System(SystemScope {
                kernel_threads,
                cgroup: cgroup
                    .as_deref()
                    .map(SystemScope::resolve_cgroup)
                    .transpose()?,
            }),
            Scope::Targets => Scope::Targets,
        };
        Ok(self)
    }

    /// Validates a protocol request; a run without `duration_ms` lasts `max_duration`, and
    /// its kernel program's unwind row array is capped at `table_mib` MiB (the daemon's).
    pub fn from_run_request(
        req: &RunRequest,
        max_duration: Duration,
        table_mib: u32,
    ) -> Result<RecordingRequest> {
        let unwind: UnwindMode = req.unwind.as_deref().unwrap_or("auto").parse()?;
        let python: PythonMode = req.python.as_deref().unwrap_or("auto").parse()?;
        let sampling = SamplingRequest {
            event: req.event.as_deref().unwrap_or("auto").parse()?,
            sample_interval: req.sample_interval,
            sample_period_ns: None,
            frequency: req.frequency,
            fixed_interval: false,
            off_cpu: OffCpu::from_flags(
                req.mode.as_deref().unwrap_or("cpu").parse::<Mode>()?,
                req.off_cpu,
                req.off_cpu_min_ns.map(Duration::from_nanos),
            )?,
        };
        let max_ms = max_duration.as_millis() as u64;
        let duration_ms = req.duration_ms.unwrap_or(max_ms);
        // Said in the protocol's own terms, so that clients can tell this refusal apart.
        if duration_ms == 0 || duration_ms > max_ms {
            return Err(Error::InvalidTarget {
                spec: String::new(),
                reason: format!("duration_ms must be between 1 and {max_ms}, got {duration_ms}"),
            });
        }
        let duration = Duration::from_millis(duration_ms);
        RecordingRequest::validate(
            sampling,
            req.follow_children,
            Some(duration),
            max_duration,
            TagsAndStacks {
                sample_tags: &req.sample_tags,
                tags: req
                    .tags
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_str()))
                    .collect(),
                max_stack_length: req.max_stack_length,
                per_thread: false,
                line_numbers: false,
                runtime: Default::default(),
            },
            Walks {
                unwind,
                python,
                table_mib,
                python_async: match req.python_async {
                    Some(0) => None,
                    Some(depth) => Some(depth.min(4096)),
                    None => Walks::default().python_async,
                },
            },
        )
    }

    /// The samples per second the request means.
    pub fn nominal_hz(&self) -> f64 {
        self.plan
            .cycles
            .or(self.plan.cpu_clock)
            .map_or(0.0, |s| s.nominal_hz)
    }
}

/// The one tag parser: bare tags and `key=value` pairs, at most [`MAX_TAGS`] in all.
pub fn parse_tags(bare: &[String], pairs: &[(&str, &str)]) -> Result<Vec<Tag>> {
    if bare.len() + pairs.len() > MAX_TAGS {
        return Err(Error::InvalidTag(format!(
            "at most {MAX_TAGS} tags per run"
        )));
    }
    let mut tags = Vec::with_capacity(bare.len() + pairs.len());
    for t in bare {
        tags.push(Tag::new(Tag::BARE_KEY, t).map_err(Error::InvalidTag)?);
    }
    for (k, v) in pairs {
        if Tag::RESERVED_KEYS.contains(k) {
            return Err(Error::InvalidTag(format!(
                "tag key {k:?} is reserved: bpfprof sets it itself (reserved keys: {})",
                Tag::RESERVED_KEYS.join(", ")
            )));
        }
        tags.push(Tag::new(k, v).map_err(Error::InvalidTag)?);
    }
    Ok(tags)
}

/// Splits a `--tag KEY=VALUE` argument.
pub fn split_tag(arg: &str) -> Result<(&str, &str)> {
    arg.split_once('=')
        .ok_or_else(|| Error::InvalidTag(format!("--tag {arg:?} must be KEY=VALUE")))
}

/// A duration of zero, or one beyond `max`, is refused before anything starts.
fn check_duration(duration: Option<Duration>, max: Duration) -> Result<()> {
    let usage = Error::Usage;
    if max.is_zero() {
        return Err(usage(
            "the longest run (--max-duration) must be longer than 0".into(),
        ));
    }
    match duration {
        Some(d) if d.is_zero() => Err(usage("--duration must be longer than 0".into())),
        Some(d) if d > max => Err(usage(format!(
            "--duration {} is longer than --max-duration {}; raise --max-duration",
            humantime::format_duration(d),
            humantime::format_duration(max)
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unwind::DEFAULT_TABLE_MIB;

    #[test]
    fn one_parser_for_every_tag_and_one_limit() {
        let bare = vec!["fwd".to_string()];
        let tags = parse_tags(&bare, &[("phase", "step7")]).unwrap();
        assert_eq!(tags.len(), 2);
        assert!(parse_tags(&[], &[("bad key", "x")]).is_err());
        let many: Vec<String> = (0..=MAX_TAGS).map(|i| format!("t{i}")).collect();
        assert!(matches!(parse_tags(&many, &[]), Err(Error::InvalidTag(_))));
        for key in ["run_id", "owner_uid", "service_name"] {
            let refused = parse_tags(&[], &[(key, "0")]);
            assert!(
                matches!(&refused, Err(Error::InvalidTag(why)) if why.contains("reserved")),
                "{refused:?}"
            );
        }
        assert_eq!(split_tag("a=b").unwrap(), ("a", "b"));
        assert!(split_tag("ab").is_err());
    }

    #[test]
    fn protocol_and_cli_requests_get_the_same_checks() {
        let req = RunRequest {
            pid: 1,
            duration_ms: Some(0),
            ..RunRequest::default()
        };
        let err =
            RecordingRequest::from_run_request(&req, Duration::from_secs(60), DEFAULT_TABLE_MIB)
                .unwrap_err();
        assert!(err.to_string().contains("duration_ms"), "{err}");
        let req = RunRequest {
            pid: 1,
            duration_ms: Some(120_000),
            ..RunRequest::default()
        };
        assert!(RecordingRequest::from_run_request(
            &req,
            Duration::from_secs(60),
            DEFAULT_TABLE_MIB
        )
        .is_err());
        let ok = RecordingRequest::from_run_request(
            &RunRequest {
                pid: 1,
                ..RunRequest::default()
            },
            Duration::from_secs(60),
            DEFAULT_TABLE_MIB,
        )
        .unwrap();
        assert_eq!(ok.duration, Some(Duration::from_secs(60)));
        assert_eq!(
            ok.options.max_stack_length,
            profiler_common::DEFAULT_STACK_DEPTH
        );
        // Deep stacks up to the kernel program's 512 frames, only when asked.
        let deep = |n: i64| {
            RecordingRequest::from_run_request(
                &RunRequest {
                    pid: 1,
                    max_stack_length: Some(n),
                    ..RunRequest::default()
                },
                Duration::from_secs(60),
                DEFAULT_TABLE_MIB,
            )
        };
        assert_eq!(deep(512).unwrap().options.max_stack_length, 512);
        assert!(deep(513).is_err());
        // An absent unwind mode is auto (older clients); a named one is kept; an unknown
        // one is refused with the names that work.
        assert_eq!(ok.unwind, UnwindMode::Auto);
        // Likewise the Python mode.
        assert!(ok.runtimes.contains(crate::runtime::RuntimeTag::CPython));
        let off = RecordingRequest::from_run_request(
            &RunRequest {
                pid: 1,
                python: Some("off".into()),
                ..RunRequest::default()
            },
            Duration::from_secs(600),
            DEFAULT_TABLE_MIB,
        )
        .unwrap();
        assert!(!off.runtimes.contains(crate::runtime::RuntimeTag::CPython));
        let err = RecordingRequest::from_run_request(
            &RunRequest {
                pid: 1,
                python: Some("pyperf".into()),
                ..RunRequest::default()
            },
            Duration::from_secs(600),
            DEFAULT_TABLE_MIB,
        )
        .unwrap_err();
        assert!(err.to_string().contains("expected auto or off"), "{err}");
        let fp = RecordingRequest::from_run_request(
            &RunRequest {
                pid: 1,
                unwind: Some("fp".into()),
                ..RunRequest::default()
            },
            Duration::from_secs(60),
            DEFAULT_TABLE_MIB,
        )
        .unwrap();
        assert_eq!(fp.unwind, UnwindMode::Fp);
        let err = RecordingRequest::from_run_request(
            &RunRequest {
                pid: 1,
                unwind: Some("dwarf".into()),
                ..RunRequest::default()
            },
            Duration::from_secs(60),
            DEFAULT_TABLE_MIB,
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("expected auto, fp or cfi"),
            "{err}"
        );
    }

    #[test]
    fn a_system_scope_needs_a_cgroup_v2_directory() {
        let base = || {
            RecordingRequest::validate(
                SamplingRequest::default(),
                false,
                None,
                Duration::from_secs(60),
                TagsAndStacks::default(),
                Walks::default(),
            )
            .unwrap()
        };
        assert_eq!(base().scope, Scope::Targets);
        let system = |cgroup: Option<&str>| {
            base().with_scope(Scope::System(SystemScope {
                kernel_threads: false,
                cgroup: cgroup.map(PathBuf::from),
            }))
        };
        let whole = system(None).unwrap();
        assert_eq!(
            whole.scope,
            Scope::System(SystemScope {
                kernel_threads: false,
                cgroup: None
            })
        );
        let err = system(Some("no-such-cgroup-anywhere")).unwrap_err();
        assert!(err.to_string().contains("no such cgroup"), "{err}");
        assert_eq!(err.exit_code(), crate::error::exit_code::USAGE);
        // A directory, but of no cgroup v2.
        let err = system(Some("/tmp")).unwrap_err();
        assert!(err.to_string().contains("not in a cgroup v2"), "{err}");
        // Where cgroup2 is mounted, its root resolves (relative "." and absolute alike) to
        // the root cgroup: id 1 at level 0.
        if let Some((mount, root)) = cgroup2_mounts().into_iter().next() {
            let resolved = system(Some(mount.to_str().unwrap())).unwrap();
            let Scope::System(SystemScope {
                cgroup: Some(path), ..
            }) = resolved.scope
            else {
                panic!("no cgroup kept");
            };
            assert_eq!(path, mount.canonicalize().unwrap());
            if root == "/" {
                assert_eq!(
                    SystemScope::cgroup_filter(&path).unwrap(),
                    CgroupFilter { id: 1, level: 0 }
                );
            }
        }
    }

    #[test]
    fn walks_reach_the_request_whole() {
        let walks = Walks {
            unwind: UnwindMode::Cfi,
            python: crate::runtime::cpython::stacks::PythonMode::Off,
            table_mib: 32,
            python_async: Some(7),
        };
        let validated = RecordingRequest::validate(
            SamplingRequest::default(),
            true,
            None,
            Duration::from_secs(60),
            TagsAndStacks::default(),
            walks,
        )
        .unwrap();
        assert_eq!(validated.unwind, UnwindMode::Cfi);
        assert!(!validated
            .runtimes
            .contains(crate::runtime::RuntimeTag::CPython));
        assert_eq!(validated.runtimes.async_depth(), Some(7));
        assert_eq!(
            validated.table_rows_cap,
            crate::unwind::table_rows_cap(32).unwrap()
        );
        for mib in [0, crate::unwind::MAX_TABLE_MIB + 1] {
            let err = RecordingRequest::validate(
                SamplingRequest::default(),
                false,
                None,
                Duration::from_secs(60),
                TagsAndStacks::default(),
                Walks {
                    table_mib: mib,
                    ..walks
                },
            )
            .unwrap_err();
            assert!(err.to_string().contains("--unwind-table-mib"), "{err}");
        }
    }
}
