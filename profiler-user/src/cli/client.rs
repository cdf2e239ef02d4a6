//! The client commands (`run`, `status`, `stop`, `results`, `list`): one request to the
//! daemon each, its reply printed for a person or as JSON.

use std::time::Duration;

use crate::{
    cli::{args::Command, terminal::escape},
    client::Client,
    error::{exit_code, Error},
    process::target::TargetSpec,
    protocol::{self, Reply, RunRequest, MAX_RUN_DURATION},
    recording::request::split_tag,
};

/// Runs a client command against the daemon; failures map to exit codes by error code.
pub fn client_command(command: Command) -> Result<i32, Error> {
    let client_args = match &command {
        Command::Run(args) => &args.client,
        Command::Status(a) | Command::Stop(a) => &a.client,
        Command::Results(a) => &a.client,
        Command::List(a) => a,
        Command::Daemon(_)
        | Command::Doctor(_)
        | Command::Agent(_)
        | Command::Top(_)
        | Command::Dump(_) => {
            unreachable!("handled by main")
        }
    };
    let socket = protocol::socket_path(client_args.socket.as_deref());
    let mut client = Client::connect(Some(&socket)).map_err(Error::from)?;
    let reply = match &command {
        Command::Run(args) => {
            let spec: TargetSpec = args.pid.parse()?;
            let (pid, pid_ns) = match spec {
                TargetSpec::Pid(pid) => (pid, None),
                TargetSpec::NsPid { ns, pid } => (pid, Some(ns)),
            };
            let mut tags = std::collections::BTreeMap::new();
            for t in &args.tags {
                let (k, v) = split_tag(t)?;
                tags.insert(k.to_string(), v.to_string());
            }
            let request = RunRequest {
                pid,
                pid_ns,
                event: args.event.clone(),
                sample_interval: args.sample_interval,
                frequency: args.frequency,
                duration_ms: args.length_ms(),
                sample_tags: args.sample_tags.clone(),
                tags,
                max_stack_length: args.max_stack_length,
                formats: args.formats.clone(),
                follow_children: args.follow_children,
                unwind: args.unwind.map(|m| m.name().to_string()),
                python: args.python.map(|m| m.name().to_string()),
                python_async: args.max_async_depth,
                mode: args.mode.clone(),
                off_cpu: args.off_cpu,
                off_cpu_min_ns: args
                    .off_cpu_min
                    .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
            };
            let started = client.run(request).map_err(Error::from)?;
            if args.run_async {
                started
            } else {
                let id = started.run_id.unwrap_or_default();
                let wait = Duration::from_millis(
                    args.length_ms()
                        .unwrap_or(MAX_RUN_DURATION.as_millis() as u64)
                        + 60_000,
                );
                client.results(id, wait).map_err(Error::from)?
            }
        }
        Command::Status(a) => client.status(a.run_id).map_err(Error::from)?,
        Command::Stop(a) => client.stop(a.run_id).map_err(Error::from)?,
        Command::Results(a) => {
            let mut reply = client
                .results(a.run_id, a.wait.unwrap_or_default())
                .map_err(Error::from)?;
            if let Some(dir) = &a.copy_to {
                let files = reply.files.clone().unwrap_or_default();
                let copied = crate::cli::results::copy_results(&mut client, a.run_id, &files, dir)?;
                reply.files = Some(copied);
            }
            reply
        }
        Command::List(_) => Reply {
            runs: Some(client.list().map_err(Error::from)?),
            ..Reply::ok()
        },
        Command::Daemon(_)
        | Command::Doctor(_)
        | Command::Agent(_)
        | Command::Top(_)
        | Command::Dump(_) => {
            unreachable!("handled by main")
        }
    };
    if client_args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&reply).map_err(anyhow::Error::from)?
        );
        return Ok(exit_code::OK);
    }
    match &command {
        Command::Run(args) if args.run_async => {
            println!("Run Id: {}", reply.run_id.unwrap_or_default());
        }
        Command::Status(_) | Command::Stop(_) => {
            println!(
                "Profile run status: {}",
                reply.state.map(|s| s.to_string()).unwrap_or_default()
            );
            if let Some(reason) = &reply.reason {
                println!("Reason: {}", escape(reason));
            }
        }
        Command::List(_) => {
            println!(
                "{:>6}  {:<10}  {:>8}  {:>8}  {:<16}  tags",
                "run", "state", "samples", "pid", "comm"
            );
            for run in reply.runs.iter().flatten() {
                let mut tags: Vec<String> = run.sample_tags.clone();
                tags.extend(run.tags.iter().map(|(k, v)| format!("{k}={v}")));
                println!(
                    "{:>6}  {:<10}  {:>8}  {:>8}  {:<16}  {}",
                    run.run_id,
                    run.state.to_string(),
                    run.samples,
                    run.pid,
                    escape(&run.comm),
                    escape(&tags.join(","))
                );
            }
        }
        _ => print_results(&reply),
    }
    Ok(exit_code::OK)
}

/// Prints a run's results as `bpfprof run` and `results` show them.
fn print_results(reply: &Reply) {
    println!("Run Id: {}", reply.run_id.unwrap_or_default());
    println!(
        "Profile run status: {}",
        reply.state.map(|s| s.to_string()).unwrap_or_default()
    );
    if let Some(reason) = &reply.reason {
        println!("Reason: {}", escape(reason));
    }
    println!("Total samples: {}", reply.samples.unwrap_or_default());
    for (format, path) in reply.files.iter().flatten() {
        println!("  {format:<13} {}", escape(path));
    }
    if let Some(top) = &reply.top {
        let total = reply.samples.unwrap_or(0).max(1) as f64;
        println!("Top functions (self, total):");
        for f in top.iter().take(10) {
            println!(
                "  {:>6.2}% {:>6.2}%  {}",
                100.0 * f.self_samples as f64 / total,
                100.0 * f.total_samples as f64 / total,
                escape(&f.name)
            );
        }
    }
}
