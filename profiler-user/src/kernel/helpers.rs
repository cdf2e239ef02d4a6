//! The BPF helpers the kernel program calls, probed on this kernel: a load that fails
//! verification is explained by the helpers missing (`bpfprof doctor` lists them too).

use aya::{
    programs::{ProgramError, ProgramType},
    sys::{is_helper_supported, BpfHelper},
};

/// One helper the kernel program calls.
pub struct RequiredHelper {
    /// The name `bpfprof doctor` gives its check.
    pub check_name: &'static str,
    /// The helper, as the kernel numbers it.
    pub helper: BpfHelper,
    /// The helper's name and the kernel that brought it, for error messages.
    pub since: &'static str,
}

impl RequiredHelper {
    /// Whether this kernel lets perf_event programs call the helper (probed by loading a
    /// program that calls it, not guessed from the version).
    pub fn supported(&self) -> Result<bool, ProgramError> {
        is_helper_supported(ProgramType::PerfEvent, self.helper)
    }
}

/// Every helper the kernel program calls; all are required.
pub const REQUIRED_HELPERS: [RequiredHelper; 3] = [
    RequiredHelper {
        check_name: "helper_get_ns_current_pid_tgid",
        helper: BpfHelper::BPF_FUNC_get_ns_current_pid_tgid,
        since: "bpf_get_ns_current_pid_tgid (Linux 5.7)",
    },
    RequiredHelper {
        check_name: "helper_get_stack",
        helper: BpfHelper::BPF_FUNC_get_stack,
        since: "bpf_get_stack (Linux 4.18)",
    },
    RequiredHelper {
        check_name: "helper_loop",
        helper: BpfHelper::BPF_FUNC_loop,
        since: "bpf_loop (Linux 5.17)",
    },
];

/// The required helpers this kernel lacks, each with the kernel that brought it.
pub fn missing_helpers() -> Vec<&'static str> {
    REQUIRED_HELPERS
        .iter()
        .filter(|helper| matches!(helper.supported(), Ok(false)))
        .map(|helper| helper.since)
        .collect()
}
