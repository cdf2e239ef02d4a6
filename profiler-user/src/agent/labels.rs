//! The labels each process's samples carry in the agent's profiles: `service_name`,
//! `executable`, `container_id` where its cgroup has one, `host`, and the tags of daemon runs
//! that profiled it during the window (`pid` and `comm` come with every profile's process
//! frame).
//!
//! What a process shows here (its cgroup path, its executable's path) is the process's to
//! choose, within what the kernel allows: every read is bounded, values are cut to
//! [`MAX_LABEL_LEN`], and nothing read is followed or opened.

use std::{
    collections::{BTreeMap, HashMap},
    io::Read,
    time::{SystemTime, UNIX_EPOCH},
};

use crate::{
    agent::rules::{ProcessFacts, ServiceRules},
    client::Client,
    protocol::RunInfo,
};

/// Longest label value kept, in bytes (cut at a character boundary): a path or a cgroup
/// longer than any real one says nothing more.
pub const MAX_LABEL_LEN: usize = 256;
/// Most bytes read of `/proc/PID/cgroup`: cgroup v2 has one line; v1 a dozen.
const MAX_CGROUP_FILE: u64 = 16 * 1024;
/// How long the agent waits for the daemon's list of runs before giving up on a window's
/// tags: the daemon answers `list` in milliseconds.
pub const DAEMON_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);
/// Label keys the agent (and the exporter) sets itself; a daemon run's tag with one of these
/// keys is left out (the daemon refuses them too, but a daemon of an older version may not).
const OWN_KEYS: &[&str] = crate::profile::Tag::RESERVED_KEYS;

/// What the agent knows of one process, read once when it is first seen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessLabels {
    /// The process's start time (clock ticks since boot), to tell it from a later process
    /// with its pid.
    pub start_time: u64,
    /// Its labels, in the order pprof shows them.
    pub labels: Vec<(String, String)>,
    /// Who owns it, as `/proc/PID` says (the effective uid; root for a process the kernel
    /// marks not dumpable, such as a setuid program): the one user besides root whom the
    /// HTTP endpoint shows its samples. `None` when it was gone before it was read.
    pub uid: Option<u32>,
}

/// The owner of process `pid`: the owner of `/proc/PID`, which the kernel sets to the
/// process's effective uid, or root while the process is not dumpable (a setuid or
/// capability-raising exec), the rule `ptrace` and `/proc/PID/maps` follow.
pub fn process_owner(pid: u32) -> Option<u32> {
    std::fs::metadata(format!("/proc/{pid}"))
        .ok()
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m))
}

/// `value` cut to at most [`MAX_LABEL_LEN`] bytes at a character boundary, control
/// characters replaced.
pub fn bounded(value: &str) -> String {
    let mut end = value.len().min(MAX_LABEL_LEN);
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    value[..end]
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// The cgroup v2 path of a `/proc/PID/cgroup` text: the `0::PATH` line; on a v1-only
/// machine, systemd's `name=systemd` hierarchy.
pub fn cgroup_path(text: &str) -> Option<&str> {
    let mut v1 = None;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if id == "0" && controllers.is_empty() {
            return Some(path);
        }
        if controllers == "name=systemd" {
            v1 = Some(path);
        }
    }
    v1
}

/// The container id a cgroup path holds, in the forms the runtimes write: Docker
/// (`/docker/ID`, `docker-ID.scope`), containerd and Kubernetes (`cri-containerd-ID.scope`,
/// `/kubepods/.../pod.../ID`), CRI-O (`crio-ID.scope`), Podman (`libpod-ID.scope`). An id is
/// 64 lowercase hex digits.
pub fn container_id(cgroup: &str) -> Option<&str> {
    const PREFIXES: &[&str] = &[
        "docker-",
        "cri-containerd-",
        "crio-",
        "libpod-",
        "containerd-",
        "",
    ];
    // The innermost component that is an id: a container's own cgroup may have children
    // (`libpod-ID.scope/container`).
    cgroup.rsplit('/').find_map(|component| {
        let stem = component.strip_suffix(".scope").unwrap_or(component);
        PREFIXES.iter().find_map(|prefix| {
            let id = stem.strip_prefix(prefix)?;
            (id.len() == 64 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
                .then_some(id)
        })
    })
}

/// The systemd service a cgroup path is in: its innermost `NAME.service` component, except
/// a user's service manager (`user@UID.service`), which holds that user's every app.
pub fn systemd_unit(cgroup: &str) -> Option<&str> {
    cgroup
        .rsplit('/')
        .find(|c| c.len() > ".service".len() && c.ends_with(".service") && !c.starts_with("user@"))
}

/// The service a process belongs to: the rules' name, else its systemd unit, else its
/// container (as `container/SHORT_ID`, Docker's 12-digit form: the cgroup has no name), else
/// its executable's file name, else its `comm`.
pub fn service_name(rules: &ServiceRules, facts: ProcessFacts<'_>) -> String {
    if let Some(name) = rules.service(facts) {
        return name.to_string();
    }
    if let Some(unit) = systemd_unit(facts.cgroup) {
        return unit.to_string();
    }
    if let Some(id) = container_id(facts.cgroup) {
        return format!("container/{}", &id[..12]);
    }
    let exe = facts.executable.rsplit('/').next().unwrap_or_default();
    if exe.is_empty() {
        facts.comm.to_string()
    } else {
        exe.to_string()
    }
}

/// Reads the labels of process `pid` (named `comm`) from `/proc`; `None` when it is gone.
pub fn read(
    pid: u32,
    comm: &str,
    start_time: u64,
    rules: &ServiceRules,
    host: &str,
) -> ProcessLabels {
    let cgroup_text = read_bounded(&format!("/proc/{pid}/cgroup"), MAX_CGROUP_FILE);
    let cgroup = cgroup_text
        .as_deref()
        .and_then(cgroup_path)
        .map(bounded)
        .unwrap_or_default();
    // The link's text only, never followed; a deleted executable's path says so.
    let executable = std::fs::read_link(format!("/proc/{pid}/exe"))
        .map(|p| bounded(&p.to_string_lossy()))
        .unwrap_or_default();
    let comm = bounded(comm);
    let facts = ProcessFacts {
        comm: &comm,
        executable: &executable,
        cgroup: &cgroup,
    };
    let mut labels = vec![(
        "service_name".to_string(),
        bounded(&service_name(rules, facts)),
    )];
    if !executable.is_empty() {
        labels.push(("executable".to_string(), executable.clone()));
    }
    if let Some(id) = container_id(&cgroup) {
        labels.push(("container_id".to_string(), id.to_string()));
    }
    labels.push(("host".to_string(), host.to_string()));
    ProcessLabels {
        start_time,
        labels,
        uid: process_owner(pid),
    }
}

/// At most `max` bytes of a `/proc` file, as text.
fn read_bounded(path: &str, max: u64) -> Option<String> {
    let file = std::fs::File::open(path).ok()?;
    let mut bytes = Vec::new();
    file.take(max).read_to_end(&mut bytes).ok()?;
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// This machine's host name, for the `host` label.
pub fn host_name() -> String {
    read_bounded("/proc/sys/kernel/hostname", MAX_LABEL_LEN as u64)
        .map(|h| bounded(h.trim()))
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

/// The daemon's runs (their tags and owners are read from them), and the agent's pid
/// namespace to map their pids to; `None` when no daemon answered.
pub fn daemon_runs(socket: &std::path::Path) -> Option<(Vec<RunInfo>, Option<u64>)> {
    let mut client = Client::connect_timeout(Some(socket), DAEMON_TIMEOUT).ok()?;
    client.set_io_timeout(DAEMON_TIMEOUT);
    let runs = client.list().ok()?;
    let own_ns = std::fs::metadata("/proc/self/ns/pid")
        .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
        .ok();
    Some((runs, own_ns))
}

/// Daemon runs' tags, by the pid of the process each profiled.
pub type RunTags = BTreeMap<u32, Vec<(String, String)>>;

/// The tags of `runs` that overlap `[start, end]`, by pid; runs of processes in another pid
/// namespace than `own_ns` are mapped to this namespace's pid where `/proc` tells it.
pub fn run_tags(
    runs: &[RunInfo],
    own_ns: Option<u64>,
    start: SystemTime,
    end: SystemTime,
) -> RunTags {
    let ms = |t: SystemTime| {
        t.duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    };
    let (start, end) = (ms(start), ms(end));
    let mut out: BTreeMap<u32, Vec<(String, String)>> = BTreeMap::new();
    let mut pids: HashMap<(u64, u32), Option<u32>> = HashMap::new();
    for run in runs {
        let ended = run.ended_unix_ms.unwrap_or(u64::MAX);
        if run.created_unix_ms > end || ended < start {
            continue;
        }
        let pid = *pids.entry((run.pid_ns, run.pid)).or_insert_with(|| {
            if Some(run.pid_ns) == own_ns {
                Some(run.pid)
            } else {
                let spec = crate::process::target::TargetSpec::NsPid {
                    ns: run.pid_ns,
                    pid: run.pid,
                };
                crate::process::target::Target::resolve(&spec)
                    .ok()
                    .map(|t| t.pid)
            }
        });
        let Some(pid) = pid else {
            continue;
        };
        let labels = out.entry(pid).or_default();
        let mut add = |key: &str, value: String| {
            if !OWN_KEYS.contains(&key) && !labels.iter().any(|(k, v)| k == key && *v == value) {
                labels.push((bounded(key), bounded(&value)));
            }
        };
        if !run.sample_tags.is_empty() {
            // One label per key: pprof discourages repeated keys.
            add("tag", run.sample_tags.join(","));
        }
        for (key, value) in &run.tags {
            add(key, value.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "3f2a9c0e8b7d6c5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a";

    #[test]
    fn container_ids_in_every_runtime_form() {
        for path in [
            format!("/docker/{ID}"),
            format!("/system.slice/docker-{ID}.scope"),
            format!("/kubepods/besteffort/pod1b2c/{ID}"),
            format!(
                "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1b2c.slice/cri-containerd-{ID}.scope"
            ),
            format!("/kubepods.slice/kubepods-pod1.slice/crio-{ID}.scope"),
            format!("/machine.slice/libpod-{ID}.scope/container"),
        ] {
            assert_eq!(container_id(&path), Some(ID), "{path}");
        }
        for path in [
            "/system.slice/nginx.service",
            "/user.slice/user-1000.slice/session-2.scope",
            &format!("/docker/{}", &ID[..63]),
            &format!("/docker/{}", ID.to_uppercase()),
        ] {
            assert_eq!(container_id(path), None, "{path}");
        }
    }

    #[test]
    fn service_names_from_rules_units_containers_and_executables() {
        let rules =
            ServiceRules::parse("[[rule]]\nservice = \"web\"\ncomm = \"^nginx$\"\n").unwrap();
        let facts = |comm, executable, cgroup| ProcessFacts {
            comm,
            executable,
            cgroup,
        };
        let nginx = facts("nginx", "/usr/sbin/nginx", "/system.slice/nginx.service");
        assert_eq!(service_name(&rules, nginx), "web");
        let cron = facts("cron", "/usr/sbin/cron", "/system.slice/cron.service");
        assert_eq!(service_name(&rules, cron), "cron.service");
        let app = facts(
            "app",
            "/usr/bin/app",
            "/user.slice/user-1000.slice/user@1000.service/app.slice/app-x.scope",
        );
        assert_eq!(service_name(&rules, app), "app");
        let docker = format!("/system.slice/docker-{ID}.scope");
        let contained = facts("python3", "/usr/bin/python3.11", &docker);
        assert_eq!(service_name(&rules, contained), "container/3f2a9c0e8b7d");
        let kthread = facts("kworker/0:1", "", "/");
        assert_eq!(service_name(&rules, kthread), "kworker/0:1");
    }

    #[test]
    fn cgroup_files_of_v2_and_v1() {
        assert_eq!(
            cgroup_path("0::/system.slice/a.service\n"),
            Some("/system.slice/a.service")
        );
        let v1 = "12:cpu,cpuacct:/x\n1:name=systemd:/system.slice/b.service\n";
        assert_eq!(cgroup_path(v1), Some("/system.slice/b.service"));
        assert_eq!(cgroup_path("garbage"), None);
    }

    #[test]
    fn hostile_values_are_cut_and_cleaned() {
        let long = "é".repeat(MAX_LABEL_LEN);
        let cut = bounded(&long);
        assert!(cut.len() <= MAX_LABEL_LEN && cut.chars().all(|c| c == 'é'));
        assert_eq!(bounded("a\nb\x1b"), "a?b?");
    }

    #[test]
    fn tags_of_runs_overlapping_the_window() {
        let at = |ms: u64| UNIX_EPOCH + std::time::Duration::from_millis(ms);
        let run = |id, pid, created, ended: Option<u64>, tags: &[(&str, &str)]| RunInfo {
            run_id: id,
            state: crate::protocol::RunState::Running,
            reason: None,
            samples: 0,
            pid,
            pid_ns: 7,
            comm: String::new(),
            owner_uid: 0,
            sample_tags: vec!["fwd".into()],
            tags: tags
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            created_unix_ms: created,
            ended_unix_ms: ended,
            files: Default::default(),
            top: Vec::new(),
            summary: None,
        };
        let runs = [
            run(1, 10, 1_000, Some(5_000), &[("phase", "step1")]),
            run(
                2,
                11,
                6_000,
                None,
                &[("pid", "999"), ("run_id", "1"), ("owner_uid", "0")],
            ),
            run(3, 12, 100, Some(900), &[]),
        ];
        let tags = run_tags(&runs, Some(7), at(2_000), at(7_000));
        assert_eq!(
            tags.get(&10).unwrap(),
            &vec![
                ("tag".to_string(), "fwd".to_string()),
                ("phase".to_string(), "step1".to_string())
            ]
        );
        // A tag that would overwrite one of the agent's own labels is left out.
        assert_eq!(tags.get(&11).unwrap(), &vec![("tag".into(), "fwd".into())]);
        assert!(!tags.contains_key(&12), "ended before the window");
    }
}
