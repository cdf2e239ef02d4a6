//! Target resolution: turns `PID` or `NS:PID` into a live process, its pid namespace and the
//! pid it has inside that namespace — what the kernel program filters on.

use std::{fmt, os::unix::fs::MetadataExt, str::FromStr};

use profiler_common::PidNamespace;

use crate::error::{Error, Result};

/// A process as the user names it on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TargetSpec {
    /// A pid as seen by bpfprof itself.
    Pid(u32),
    /// A pid as seen inside the pid namespace with inode `ns`.
    NsPid {
        /// Inode of the pid namespace (`/proc/PID/ns/pid` reads `pid:[INODE]`).
        ns: u64,
        /// The pid inside that namespace.
        pid: u32,
    },
}

impl FromStr for TargetSpec {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let invalid = |reason: &str| Error::InvalidTarget {
            spec: s.to_string(),
            reason: reason.to_string(),
        };
        let parse_pid = |p: &str| -> Result<u32> {
            match p.trim().parse::<u32>() {
                Ok(0) => Err(invalid("pid 0 is not a process")),
                Ok(pid) => Ok(pid),
                Err(_) => Err(invalid("expected PID or NS:PID, both positive integers")),
            }
        };
        match s.split_once(':') {
            None => Ok(TargetSpec::Pid(parse_pid(s)?)),
            Some((ns, pid)) => {
                let ns = ns
                    .trim()
                    .parse::<u64>()
                    .ok()
                    .filter(|ns| *ns != 0)
                    .ok_or_else(|| invalid("NS must be the pid namespace's inode number"))?;
                Ok(TargetSpec::NsPid {
                    ns,
                    pid: parse_pid(pid)?,
                })
            }
        }
    }
}

impl fmt::Display for TargetSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TargetSpec::Pid(pid) => write!(f, "{pid}"),
            TargetSpec::NsPid { ns, pid } => write!(f, "{ns}:{pid}"),
        }
    }
}

/// A live process resolved from a [`TargetSpec`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The pid in bpfprof's own pid namespace: what `/proc` here shows.
    pub pid: u32,
    /// The process's active pid namespace.
    pub ns: PidNamespace,
    /// The pid inside `ns`.
    pub ns_pid: u32,
    /// The process name (`comm`) when it was resolved.
    pub comm: String,
    /// Start time in clock ticks since boot; tells the process apart from a later one with its pid.
    pub start_time: u64,
}

impl Target {
    /// Resolves `spec` to the process it names, failing with [`Error::NoSuchProcess`].
    pub fn resolve(spec: &TargetSpec) -> Result<Target> {
        match *spec {
            TargetSpec::Pid(pid) => Target::from_pid(pid),
            TargetSpec::NsPid { ns, pid } => {
                // A process has a pid in its own namespace and in every ancestor of it:
                // `NSpid` lists them from bpfprof's namespace inwards. So NS:PID may name a
                // containerized process by its own namespace and pid, or by the host's (or any
                // namespace in between) and the pid it has there.
                let candidates = procfs::process::all_processes()
                    .map_err(|e| anyhow::anyhow!("listing /proc: {e}"))?;
                let mut seen = Vec::new();
                let mut depth_of_ns = std::collections::HashMap::new();
                for process in candidates.flatten() {
                    let Ok(status) = read_status(process.pid as u32) else {
                        continue;
                    };
                    let Ok(meta) = std::fs::metadata(format!("/proc/{}/ns/pid", process.pid))
                    else {
                        continue;
                    };
                    let nspid: Vec<u32> = status
                        .nspid
                        .unwrap_or_else(|| vec![process.pid])
                        .into_iter()
                        .map(|p| p as u32)
                        .collect();
                    depth_of_ns.insert(meta.ino(), nspid.len() - 1);
                    seen.push((process.pid as u32, nspid));
                }
                if let Some(&depth) = depth_of_ns.get(&ns) {
                    // Other namespaces at the same depth (other containers) have their own
                    // pid 1, 2, ...: only a process whose namespace is `ns` or lies inside it
                    // is the one named.
                    if let Some((host_pid, _)) = seen.iter().find(|(host_pid, nspid)| {
                        nspid.get(depth) == Some(&pid)
                            && ancestor_namespace_is(*host_pid, nspid.len() - 1 - depth, ns)
                    }) {
                        return Target::from_pid(*host_pid);
                    }
                }
                Err(Error::NoSuchProcess(format!(
                    "no process has pid {pid} in pid namespace {ns} \
                     (the namespace is the inode of /proc/PID/ns/pid: `stat -L -c %i /proc/PID/ns/pid`)"
                )))
            }
        }
    }

    /// Resolves a pid in bpfprof's own namespace.
    pub fn from_pid(pid: u32) -> Result<Target> {
        Target::read(pid).map(|(target, _)| target)
    }

    /// [`Target::from_pid`], with the `/proc/PID/status` it read: a caller that needs more of
    /// it (whether the pid is a process's or a thread's, its executable memory) reads it once
    /// (each read has the kernel format the whole file: taking in the processes of a host of
    /// 150 services, reading it three times for each was a third of the agent's CPU).
    pub fn read(pid: u32) -> Result<(Target, procfs::process::Status)> {
        let missing = || Error::NoSuchProcess(format!("pid {pid} does not exist"));
        let process = procfs::process::Process::new(pid as i32).map_err(|_| missing())?;
        let stat = process.stat().map_err(|_| missing())?;
        if stat.state == 'Z' || stat.state == 'X' {
            return Err(Error::NoSuchProcess(format!(
                "pid {pid} ({}) has exited and is a zombie",
                stat.comm
            )));
        }
        let ns_meta = std::fs::metadata(format!("/proc/{pid}/ns/pid")).map_err(|e| {
            if e.kind() == std::io::ErrorKind::PermissionDenied {
                // Neither its name nor whose it is: a refusal tells nothing about a process
                // the caller may not inspect.
                Error::PermissionDenied(format!(
                    "you may not profile pid {pid}: cannot read /proc/{pid}/ns/pid ({e}); only \
                     your own processes, unless you run bpfprof as root (or with \
                     CAP_SYS_PTRACE)"
                ))
            } else {
                missing()
            }
        })?;
        let status = read_status(pid).map_err(|_| missing())?;
        let ns_pid = status
            .nspid
            .as_ref()
            .and_then(|ids| ids.last().copied())
            .map(|id| id as u32)
            .unwrap_or(pid);
        let target = Target {
            pid,
            ns: PidNamespace {
                dev: kernel_dev(ns_meta.dev()),
                ino: ns_meta.ino(),
            },
            ns_pid,
            comm: stat.comm,
            start_time: stat.starttime,
        };
        Ok((target, status))
    }

    /// Whether `owner` may profile the process now, as the kernel would let that user attach
    /// perf to it (ptrace read access): it is still this process (not replaced under its pid),
    /// every uid (real, effective, saved, filesystem) is the owner's, every gid is the owner's,
    /// and it is dumpable (a setuid program, one that exec'd a program its user cannot read, or
    /// one that made itself undumpable, is not).
    pub fn profilable_by(&self, owner: Owner) -> bool {
        let Ok(status) = read_status(self.pid) else {
            return false;
        };
        let uids = [status.ruid, status.euid, status.suid, status.fuid];
        let gids = [status.rgid, status.egid, status.sgid, status.fgid];
        if uids.iter().any(|u| *u != owner.uid) || gids.iter().any(|g| *g != owner.gid) {
            return false;
        }
        // The kernel makes the files in /proc/PID root-owned while a process is not dumpable.
        let dumpable = std::fs::metadata(format!("/proc/{}/status", self.pid))
            .is_ok_and(|m| m.uid() == owner.uid);
        dumpable && self.is_alive()
    }

    /// Its executable memory in KiB (`VmExe` + `VmLib` of `/proc/PID/status`, the kernel's
    /// `exec_vm`), which changes when it maps new code (a `dlopen`): a far cheaper sign that
    /// its maps changed than reading them. `None` when the status cannot be read.
    pub fn executable_kib(&self) -> Option<u64> {
        read_status(self.pid).ok().map(|s| executable_kib(&s))
    }

    /// How long ago the process started (its exec'd program may be younger); `None` when
    /// the clocks cannot be read.
    pub fn age(&self) -> Option<std::time::Duration> {
        let ticks = procfs::ticks_per_second();
        if ticks == 0 {
            return None;
        }
        let now = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
        let now = std::time::Duration::new(now.tv_sec as u64, now.tv_nsec as u32);
        let started = std::time::Duration::from_secs_f64(self.start_time as f64 / ticks as f64);
        Some(now.saturating_sub(started))
    }

    /// Whether the process still runs (not exited, not a zombie, not replaced by a new pid owner).
    pub fn is_alive(&self) -> bool {
        procfs::process::Process::new(self.pid as i32)
            .and_then(|p| p.stat())
            .map(|s| s.starttime == self.start_time && s.state != 'Z' && s.state != 'X')
            .unwrap_or(false)
    }
}

/// The kernel's word that a process exited: a pidfd of it, which becomes readable once the
/// process is gone, registered in its recording's [`ExitWatches`].
#[derive(Debug, Default)]
pub struct ExitWatch(Option<std::os::fd::OwnedFd>);

impl ExitWatch {
    /// Watches `target` in `watches`, unless the kernel refuses a pidfd (older than 5.3) or
    /// its registration, the pid is no longer the target's, or the descriptor would take more
    /// than a quarter of the descriptors this process may open (the agent's connections and
    /// mapped files need the rest): its exit is then looked for in /proc
    /// ([`Target::is_alive`]).
    pub fn open(target: &Target, watches: &ExitWatches) -> ExitWatch {
        use std::os::fd::AsRawFd;
        let Some(pid) = rustix::process::Pid::from_raw(target.pid as i32) else {
            return ExitWatch(None);
        };
        let Ok(fd) = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()) else {
            return ExitWatch(None);
        };
        // Descriptors are numbered lowest free first: its number is about how many are open.
        let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile)
            .current
            .unwrap_or(u64::MAX);
        if fd.as_raw_fd() as u64 > limit / 4 {
            return ExitWatch(None);
        }
        // Opened before this check: a pid reused before the open fails it (another start
        // time), so the pidfd is of the target itself.
        if !target.is_alive() || !watches.add(&fd) {
            return ExitWatch(None);
        }
        ExitWatch(Some(fd))
    }

    /// Whether the kernel watches this process's exit (else /proc must be read).
    pub fn is_watching(&self) -> bool {
        self.0.is_some()
    }

    /// Whether this is the watch of a process [`ExitWatches::exited`] gave.
    pub fn is_among(&self, exited: &std::collections::HashSet<i32>) -> bool {
        use std::os::fd::AsRawFd;
        self.0
            .as_ref()
            .is_some_and(|fd| exited.contains(&fd.as_raw_fd()))
    }
}

/// The pidfds of a recording's processes in one epoll set, each reported once, when its
/// process exits. A tick asks the set which exited: the kernel answers from its list of ready
/// descriptors, so the look costs what the exits do, not what the processes do. A `poll` of
/// every pidfd at each tick cost the agent a sixth of its CPU on a host of 150 services
/// (`pidfd_poll`, ten times a second for each), and reading each one's `/proc/PID/stat`, before
/// pidfds, a tenth.
#[derive(Debug)]
pub struct ExitWatches(Option<std::os::fd::OwnedFd>);

impl Default for ExitWatches {
    fn default() -> ExitWatches {
        ExitWatches::new()
    }
}

impl ExitWatches {
    /// An empty set; one that watches nothing where the kernel refuses an epoll instance
    /// (processes' exits are then looked for in /proc).
    pub fn new() -> ExitWatches {
        use rustix::event::epoll;
        ExitWatches(epoll::create(epoll::CreateFlags::CLOEXEC).ok())
    }

    /// Adds `pidfd`, named by its descriptor's number: closing it (dropping its
    /// [`ExitWatch`]) takes it out again, so a number is never another process's.
    fn add(&self, pidfd: &std::os::fd::OwnedFd) -> bool {
        use rustix::event::epoll;
        use std::os::fd::AsRawFd;
        let Some(epoll_fd) = &self.0 else {
            return false;
        };
        // One-shot: an exited process's pidfd stays readable until it is dropped at the
        // window's end, and is reported once.
        epoll::add(
            epoll_fd,
            pidfd,
            epoll::EventData::new_u64(pidfd.as_raw_fd() as u64),
            epoll::EventFlags::IN | epoll::EventFlags::ONESHOT,
        )
        .is_ok()
    }

    /// The descriptors of the watches whose process exited since the last look, without
    /// waiting.
    pub fn exited(&self) -> std::collections::HashSet<i32> {
        use rustix::event::epoll;
        let mut exited = std::collections::HashSet::new();
        let Some(epoll_fd) = &self.0 else {
            return exited;
        };
        const BATCH: usize = 64;
        let mut events: Vec<epoll::Event> = Vec::with_capacity(BATCH);
        let zero = rustix::time::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        loop {
            events.clear();
            let Ok(n) = epoll::wait(
                epoll_fd,
                rustix::buffer::spare_capacity(&mut events),
                Some(&zero),
            ) else {
                return exited;
            };
            exited.extend(events.iter().map(|e| e.data.u64() as i32));
            if n < BATCH {
                return exited;
            }
        }
    }
}

/// A non-root user on whose behalf processes are profiled: every process of the run must stay
/// one that user could attach perf to itself ([`Target::profilable_by`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Owner {
    /// The user's id.
    pub uid: u32,
    /// The user's group id.
    pub gid: u32,
}

/// `/proc/PID/status`, parsed by procfs from its bytes made UTF-8: a process name is any bytes
/// (`prctl(PR_SET_NAME)`), and procfs's own reader fails the whole file on a name that is not
/// UTF-8.
pub fn read_status(pid: u32) -> std::io::Result<procfs::process::Status> {
    use procfs::FromBufRead;
    let bytes = std::fs::read(format!("/proc/{pid}/status"))?;
    let text = String::from_utf8_lossy(&bytes);
    procfs::process::Status::from_buf_read(text.as_bytes()).map_err(std::io::Error::other)
}

/// A process's executable memory in KiB, from its status (see [`Target::executable_kib`]).
pub fn executable_kib(status: &procfs::process::Status) -> u64 {
    status.vmexe.unwrap_or(0) + status.vmlib.unwrap_or(0)
}

/// Whether the pid namespace `levels` above the one of process `pid` has inode `ns` (0 levels:
/// the process's own), followed with the kernel's `NS_GET_PARENT`.
fn ancestor_namespace_is(pid: u32, levels: usize, ns: u64) -> bool {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let Ok(file) = std::fs::File::open(format!("/proc/{pid}/ns/pid")) else {
        return false;
    };
    let mut fd = OwnedFd::from(file);
    for _ in 0..levels {
        // SAFETY: NS_GET_PARENT takes no argument and returns a new descriptor or -1.
        let parent = unsafe { libc::ioctl(fd.as_raw_fd(), libc::NS_GET_PARENT) };
        if parent < 0 {
            return false;
        }
        // SAFETY: `parent` is a descriptor the kernel just opened for us and nothing else owns.
        fd = unsafe { OwnedFd::from_raw_fd(parent) };
    }
    std::fs::File::from(fd)
        .metadata()
        .is_ok_and(|meta| meta.ino() == ns)
}

/// Converts a userspace `st_dev` into the kernel's internal `dev_t` (`major << 20 | minor`),
/// the encoding `bpf_get_ns_current_pid_tgid` compares against.
fn kernel_dev(dev: u64) -> u64 {
    let major = libc::major(dev) as u64;
    let minor = libc::minor(dev) as u64;
    (major << 20) | minor
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exit_is_reported_once_and_only_for_its_process() {
        let mut ending = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let mut staying = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let watches = ExitWatches::new();
        let ending_watch = ExitWatch::open(&Target::from_pid(ending.id()).unwrap(), &watches);
        let staying_watch = ExitWatch::open(&Target::from_pid(staying.id()).unwrap(), &watches);
        assert!(ending_watch.is_watching() && staying_watch.is_watching());
        assert!(watches.exited().is_empty(), "nothing exited yet");
        ending.kill().unwrap();
        ending.wait().unwrap();
        let exited = watches.exited();
        assert!(ending_watch.is_among(&exited), "{exited:?}");
        assert!(!staying_watch.is_among(&exited), "{exited:?}");
        assert!(watches.exited().is_empty(), "reported a second time");
        staying.kill().unwrap();
        staying.wait().unwrap();
        assert!(staying_watch.is_among(&watches.exited()));
    }

    #[test]
    fn parses_pid_and_ns_pid() {
        assert_eq!("42".parse::<TargetSpec>().unwrap(), TargetSpec::Pid(42));
        assert_eq!(
            "4026531836:1".parse::<TargetSpec>().unwrap(),
            TargetSpec::NsPid {
                ns: 4026531836,
                pid: 1
            }
        );
    }

    #[test]
    fn rejects_malformed_targets() {
        for bad in [
            "",
            "abc",
            "0",
            "-1",
            "1:",
            ":1",
            "0:1",
            "1:0",
            "1:2:3",
            "99999999999",
        ] {
            let err = bad.parse::<TargetSpec>().unwrap_err();
            assert!(matches!(err, Error::InvalidTarget { .. }), "{bad}: {err}");
        }
    }

    #[test]
    fn resolves_self_in_both_forms() {
        let me = Target::from_pid(std::process::id()).unwrap();
        assert!(me.is_alive());
        let again = Target::resolve(&TargetSpec::NsPid {
            ns: me.ns.ino,
            pid: me.ns_pid,
        })
        .unwrap();
        assert_eq!(again.pid, me.pid);
    }

    #[test]
    fn missing_pid_is_no_such_process() {
        let max: u32 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let err = Target::resolve(&TargetSpec::Pid(max + 1)).unwrap_err();
        assert!(matches!(err, Error::NoSuchProcess(_)), "{err}");
    }
}
