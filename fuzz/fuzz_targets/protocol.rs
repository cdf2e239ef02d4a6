//! The daemon's protocol as a client (any local user) speaks it: request lines parsed and
//! checked as the daemon does before acting on them, a run request validated into a
//! recording request, and reply lines parsed as the Rust client does.
#![no_main]

use bpfprof::{
    daemon::parse_request,
    protocol::{Op, Reply, Request, MAX_REQUEST_BYTES, MAX_RUN_DURATION},
    recording::request::RecordingRequest,
    unwind::DEFAULT_TABLE_MIB,
};
use libfuzzer_sys::fuzz_target;

/// What a refusal may add to the request it quotes (serde's message around a field name).
const MESSAGE_SLACK: usize = 512;

fuzz_target!(|data: &[u8]| {
    // As the daemon's line codec frames them: lines, non-UTF-8 refused, longer ones refused
    // before parsing, blank ones skipped.
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for line in text.split('\n') {
        if line.len() > MAX_REQUEST_BYTES || line.trim().is_empty() {
            continue;
        }
        match parse_request(line) {
            Ok(request) => {
                // What the daemon accepted means the same once re-encoded (clients and the
                // daemon agree on every field).
                let json = serde_json::to_string(&request).expect("a request encodes");
                let again: Request = serde_json::from_str(&json).expect("its encoding parses");
                assert_eq!(again, request);
                if let Op::Run(run) = &request.op {
                    let _ = RecordingRequest::from_run_request(
                        run,
                        MAX_RUN_DURATION,
                        DEFAULT_TABLE_MIB,
                    );
                }
            }
            Err((_code, message)) => {
                assert!(message.len() <= line.len() + MESSAGE_SLACK, "{message}");
            }
        }
        // The client's side of the socket: a reply line.
        if let Ok(reply) = serde_json::from_str::<Reply>(line) {
            let json = serde_json::to_string(&reply).expect("a reply encodes");
            let _: Reply = serde_json::from_str(&json).expect("its encoding parses");
        }
    }
});
