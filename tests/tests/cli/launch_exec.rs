//! End to end: a launched command is recorded from its exec, not before: the first ~20 ms
//! after the fork are bpfprof's own code (`Command::do_exec`, then the kernel's `execve`
//! loading the new program and tearing down the copy of bpfprof's memory), which is no part
//! of the command's profile. At a high rate, several short launches: no stack holds those
//! frames. Needs root.

use std::time::Duration;

use bpfprof_tests::*;

const TIMEOUT: Duration = Duration::from_secs(120);
/// Launches: on the old code each had samples in the exec (2 and 14 of two runs at -F 4999).
const LAUNCHES: usize = 3;

#[test]
fn a_launched_command_has_no_samples_of_bpfprofs_code_before_its_exec() {
    needs_root!();
    let dir = tempdir();
    let mut checks = Checks::new();
    for i in 0..LAUNCHES {
        let folded = dir.path().join(format!("launch{i}.folded"));
        let run = run_bpfprof(
            [
                "-F",
                "4999",
                "-o",
                folded.to_str().unwrap(),
                "--",
                "/usr/bin/python3",
                "-c",
                "sum(i * i for i in range(300000))",
            ],
            TIMEOUT,
        );
        run.assert_code(exit::OK);
        let profile = Profile::read(&folded);
        let pre_exec = profile.count_where(|stack| {
            stack.iter().any(|f| {
                let f = f.trim_end_matches("_[k]");
                f == "execve"
                    || f.contains("do_execveat_common")
                    || f.contains("Command::do_exec")
                    || f.contains("pre_exec")
            })
        });
        eprintln!(
            "launch {i}: {} samples, {pre_exec} in bpfprof's code before the exec",
            profile.total()
        );
        checks.check(profile.total() > 0, || format!("launch {i}: no samples"));
        checks.check(pre_exec == 0, || {
            format!(
                "launch {i}: {pre_exec} samples before the exec:\n{}",
                profile.top(5)
            )
        });
    }
    checks.finish();
}
