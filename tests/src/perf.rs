//! `perf record -g` beside bpfprof on the same process, read back through `perf script`: the
//! peer a test compares its stacks with. For a JIT (a JVM, Node.js) perf names generated code
//! from the perf map the target writes (`/tmp/perf-PID.map`: Node's `--perf-basic-prof`,
//! HotSpot's `-XX:+DumpPerfMapAtExit`), which a restart with that flag is needed for.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
};

/// A `perf record -e cpu-clock -g` of one process, running.
pub struct PerfRecording {
    child: Option<Child>,
    data: PathBuf,
}

impl PerfRecording {
    /// Starts recording process `pid` at `hz` for `secs` seconds, into `dir`.
    pub fn start(pid: u32, hz: u32, secs: u64, dir: &Path) -> PerfRecording {
        let data = dir.join("perf.data");
        let child = Command::new("perf")
            .args([
                "record",
                "-q",
                "-e",
                "cpu-clock",
                "-g",
                "-F",
                &hz.to_string(),
            ])
            .args(["-p", &pid.to_string(), "-o"])
            .arg(&data)
            .args(["--", "sleep", &secs.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("running perf (linux-perf)");
        PerfRecording {
            child: Some(child),
            data,
        }
    }

    /// Waits for the recording to end (a JVM's perf map can then be written, by `jcmd PID
    /// Compiler.perfmap`, before [`PerfRecording::stacks`] reads it).
    pub fn wait(&mut self) {
        if let Some(mut child) = self.child.take() {
            assert!(child.wait().unwrap().success(), "perf record failed");
        }
    }

    /// Waits for the recording to end and returns its stacks, leaf first, each frame its
    /// symbol as `perf script` names it (`[unknown]` where it has none). `perf_map_root` is the
    /// root the target wrote its perf map under, when it is not `/` (a chroot, whose map perf
    /// does not look for): the map is copied to this machine's `/tmp` for `perf script`, and
    /// removed after.
    pub fn stacks(mut self, pid: u32, perf_map_root: &Path) -> Vec<Vec<String>> {
        self.wait();
        let map = format!("tmp/perf-{pid}.map");
        let copied = (perf_map_root != Path::new("/"))
            .then(|| {
                let host = Path::new("/").join(&map);
                std::fs::copy(perf_map_root.join(&map), &host)
                    .ok()
                    .map(|_| host)
            })
            .flatten();
        let script = Command::new("perf")
            .args(["script", "-F", "ip,sym", "--no-inline", "-i"])
            .arg(&self.data)
            .stderr(Stdio::null())
            .output()
            .expect("running perf script");
        if let Some(host) = copied {
            let _ = std::fs::remove_file(host);
        }
        assert!(script.status.success(), "perf script failed");
        String::from_utf8_lossy(&script.stdout)
            .split("\n\n")
            .map(|sample| {
                sample
                    .lines()
                    .filter_map(|l| {
                        // `\t    7f66960415f1 JS:^level3 /tmp/nodehot.js:26:16+0x471`
                        let (_, sym) = l.trim().split_once(' ')?;
                        Some(sym.trim().to_string())
                    })
                    .collect::<Vec<String>>()
            })
            .filter(|frames| !frames.is_empty())
            .collect()
    }
}
