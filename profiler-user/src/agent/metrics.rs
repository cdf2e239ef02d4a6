//! The agent's own metrics, served as `GET /metrics` in the OpenMetrics text format that
//! Prometheus scrapes: samples, losses by reason, windows, processes tracked, table and cache
//! sizes, every cap hit, and the agent's own CPU time and memory.
//!
//! Every metric is an atomic: the recording thread updates them, the HTTP server encodes
//! them, and neither waits for the other.

use std::sync::atomic::AtomicU64;

use prometheus_client::{
    encoding::text::encode,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use crate::profile::Losses;

/// A metric's labels: one `reason` or `cap` label.
type Labels = Vec<(&'static str, &'static str)>;

/// The caps whose hits are counted (the `cap` label of `bpfprof_agent_cap_hits`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cap {
    /// The window ring was full: its oldest window was dropped.
    WindowRing,
    /// The symbolizer's caches passed their cap and were emptied.
    SymbolCache,
    /// The unwind-table array was full: tables sampled least recently were evicted.
    UnwindTables,
    /// A sealed copy of a target's file would have passed `--copy-budget-mib`: the object
    /// was named `module+0xOFFSET` (counted once per object).
    CopyBudget,
}

impl Cap {
    fn name(self) -> &'static str {
        match self {
            Cap::WindowRing => "window_ring",
            Cap::SymbolCache => "symbol_cache",
            Cap::UnwindTables => "unwind_tables",
            Cap::CopyBudget => "copy_budget",
        }
    }
}

/// Every metric the agent exports.
pub struct Metrics {
    registry: Registry,
    /// Samples taken into windows.
    pub samples: Counter,
    /// Seconds target threads spent off the CPU in windows (`--off-cpu`; 0 without it).
    pub off_cpu_seconds: Counter<f64, AtomicU64>,
    /// Samples lost or incomplete, by reason.
    pub lost: Family<Labels, Counter>,
    /// Windows cut.
    pub windows: Counter,
    /// Windows in the ring now.
    pub windows_kept: Gauge,
    /// Processes the recording tracks now.
    pub processes: Gauge,
    /// Processes the agent holds labels for now.
    pub labelled_processes: Gauge,
    /// Bytes of unwind tables resident in the kernel's row array.
    pub unwind_resident_bytes: Gauge,
    /// Bytes of the kernel's row array.
    pub unwind_array_bytes: Gauge,
    /// Addresses the symbolizer holds names for.
    pub symbol_cache_entries: Gauge,
    /// Files the symbolizer holds open.
    pub symbol_files: Gauge,
    /// Python code objects named, in the processes tracked now.
    pub python_code_objects: Gauge,
    /// Stacks kept in userspace between windows.
    pub stacks_kept: Gauge,
    /// Cap hits, by cap.
    pub cap_hits: Family<Labels, Counter>,
    /// Windows whose daemon-run tags could not be asked for (no daemon answered).
    pub daemon_unreachable: Counter,
    /// The agent's own CPU time (user and system).
    pub cpu_seconds: Counter<f64, AtomicU64>,
    /// The agent's resident memory, with its sealed copies of targets' files.
    pub resident_bytes: Gauge,
    /// Bytes of the sealed copies of targets' files the agent holds.
    pub copy_bytes: Gauge,
    /// The budget of those copies (`--copy-budget-mib`), in bytes.
    pub copy_budget_bytes: Gauge,
    /// Seconds the last window took to symbolize and aggregate.
    pub window_build_seconds: Gauge<f64, AtomicU64>,
    /// Windows handed to the exporter, by outcome ([`EXPORT_OUTCOMES`]).
    pub exports: Family<Labels, Counter>,
    /// Bytes of the windows exported (the request as spooled), by backend.
    pub export_bytes: Family<Labels, Counter>,
    /// Entries in each backend's export spool now.
    pub spooled_windows: Family<Labels, Gauge>,
    /// Bytes of the entries in each backend's export spool now.
    pub spooled_bytes: Family<Labels, Gauge>,
    /// HTTP connections open now.
    pub http_connections: Gauge,
    /// HTTP connections closed at once, by reason ([`HTTP_REFUSALS`]).
    pub http_refused: Family<Labels, Counter>,
    /// HTTP requests refused, by reason ([`HTTP_REQUEST_REFUSALS`]).
    pub http_requests_refused: Family<Labels, Counter>,
}

/// Why an HTTP connection was closed as soon as it was accepted (the `reason` label of
/// `bpfprof_agent_http_connections_refused`): the endpoint held its most connections
/// (`total`), or the peer (a local uid, a remote address) held its own most (`per_peer`),
/// or, on a TLS endpoint, the peer did not complete a TLS handshake in time (`tls_handshake`:
/// plain HTTP, a certificate it refused, silence).
pub const HTTP_REFUSALS: &[&str] = &["total", "per_peer", "tls_handshake"];
/// Why an HTTP request was refused (`bpfprof_agent_http_requests_refused`): `busy` (a 503:
/// the most profiles were being built or sent), `forbidden` (a 403: a remote peer without
/// the token), `unauthorized` (a 401: a wrong token).
pub const HTTP_REQUEST_REFUSALS: &[&str] = &["busy", "forbidden", "unauthorized"];

/// The outcomes of exporting windows (the `outcome` label of `bpfprof_agent_export_windows`):
/// sent; retried (an attempt failed: the backend was unreachable, timed out or answered an
/// error worth retrying; the window stays spooled); rejected (the backend refused it for
/// good: set aside); dropped (the spool was full: its oldest window was deleted, or a window
/// could not be written or read); queue_full (the exporter was behind by
/// [`crate::agent::export::QUEUE_WINDOWS`] windows: the window was never spooled).
pub const EXPORT_OUTCOMES: &[&str] = &["sent", "retried", "rejected", "dropped", "queue_full"];
/// The export backends (the `backend` label): OTLP and Pyroscope (whose unit is one
/// service's window).
pub const EXPORT_BACKENDS: &[&str] = &["otlp", "pyroscope"];

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every metric under the `bpfprof_agent` prefix.
    pub fn new() -> Metrics {
        let mut m = Metrics {
            registry: Registry::with_prefix("bpfprof_agent"),
            samples: Counter::default(),
            off_cpu_seconds: Counter::default(),
            lost: Family::default(),
            windows: Counter::default(),
            windows_kept: Gauge::default(),
            processes: Gauge::default(),
            labelled_processes: Gauge::default(),
            unwind_resident_bytes: Gauge::default(),
            unwind_array_bytes: Gauge::default(),
            symbol_cache_entries: Gauge::default(),
            symbol_files: Gauge::default(),
            python_code_objects: Gauge::default(),
            stacks_kept: Gauge::default(),
            cap_hits: Family::default(),
            daemon_unreachable: Counter::default(),
            cpu_seconds: Counter::default(),
            resident_bytes: Gauge::default(),
            copy_bytes: Gauge::default(),
            copy_budget_bytes: Gauge::default(),
            window_build_seconds: Gauge::default(),
            exports: Family::default(),
            export_bytes: Family::default(),
            spooled_windows: Family::default(),
            spooled_bytes: Family::default(),
            http_connections: Gauge::default(),
            http_refused: Family::default(),
            http_requests_refused: Family::default(),
        };
        let r = &mut m.registry;
        r.register("samples", "Samples taken into windows", m.samples.clone());
        r.register(
            "off_cpu_seconds",
            "Seconds threads spent off the CPU, recorded with --off-cpu",
            m.off_cpu_seconds.clone(),
        );
        r.register(
            "samples_lost",
            "Samples lost or incomplete, by reason",
            m.lost.clone(),
        );
        r.register("windows", "Windows cut", m.windows.clone());
        r.register(
            "windows_kept",
            "Windows in the ring",
            m.windows_kept.clone(),
        );
        r.register(
            "processes_tracked",
            "Processes the recording tracks",
            m.processes.clone(),
        );
        r.register(
            "processes_labelled",
            "Processes the agent holds labels for",
            m.labelled_processes.clone(),
        );
        r.register(
            "unwind_table_resident_bytes",
            "Bytes of unwind tables in the kernel's row array",
            m.unwind_resident_bytes.clone(),
        );
        r.register(
            "unwind_table_array_bytes",
            "Bytes of the kernel's unwind row array (--unwind-table-mib caps it)",
            m.unwind_array_bytes.clone(),
        );
        r.register(
            "symbol_cache_entries",
            "Addresses the symbolizer holds names for",
            m.symbol_cache_entries.clone(),
        );
        r.register(
            "symbol_files_open",
            "Files the symbolizer holds open",
            m.symbol_files.clone(),
        );
        r.register(
            "python_code_objects",
            "Python code objects named in the processes tracked",
            m.python_code_objects.clone(),
        );
        r.register(
            "stacks_kept",
            "Stacks kept in userspace between windows",
            m.stacks_kept.clone(),
        );
        r.register(
            "cap_hits",
            "Times a cap on the agent's memory was hit, by cap",
            m.cap_hits.clone(),
        );
        r.register(
            "daemon_unreachable",
            "Windows whose daemon-run tags were skipped: no daemon answered",
            m.daemon_unreachable.clone(),
        );
        r.register(
            "cpu_seconds",
            "The agent's own CPU time, user and system",
            m.cpu_seconds.clone(),
        );
        r.register(
            "resident_memory_bytes",
            "The agent's resident memory, with its sealed copies of targets' files",
            m.resident_bytes.clone(),
        );
        r.register(
            "target_copy_bytes",
            "Bytes of the sealed copies of targets' files held (files their users could \
             truncate, copied to be read safely)",
            m.copy_bytes.clone(),
        );
        r.register(
            "target_copy_budget_bytes",
            "The most bytes of sealed copies of targets' files held at once (--copy-budget-mib)",
            m.copy_budget_bytes.clone(),
        );
        r.register(
            "window_build_seconds",
            "Seconds the last window took to symbolize and aggregate",
            m.window_build_seconds.clone(),
        );
        r.register(
            "export_windows",
            "Windows handed to the exporter, by outcome",
            m.exports.clone(),
        );
        r.register(
            "export_bytes",
            "Bytes of the windows exported, as spooled (before gzip), by backend",
            m.export_bytes.clone(),
        );
        r.register(
            "spooled_windows",
            "Windows in each backend's export spool, waiting to be sent (Pyroscope: per service)",
            m.spooled_windows.clone(),
        );
        r.register(
            "spooled_bytes",
            "Bytes of the windows in each backend's export spool",
            m.spooled_bytes.clone(),
        );
        r.register(
            "http_connections_open",
            "HTTP connections open",
            m.http_connections.clone(),
        );
        r.register(
            "http_connections_refused",
            "HTTP connections closed as soon as accepted, by reason",
            m.http_refused.clone(),
        );
        r.register(
            "http_requests_refused",
            "HTTP requests refused, by reason",
            m.http_requests_refused.clone(),
        );
        for reason in HTTP_REFUSALS {
            let _ = m.http_refused.get_or_create(&vec![("reason", *reason)]);
        }
        for reason in HTTP_REQUEST_REFUSALS {
            let _ = m
                .http_requests_refused
                .get_or_create(&vec![("reason", *reason)]);
        }
        for backend in EXPORT_BACKENDS {
            for outcome in EXPORT_OUTCOMES {
                let _ = m
                    .exports
                    .get_or_create(&vec![("backend", *backend), ("outcome", *outcome)]);
            }
        }
        // Every cap and reason is exported from the start, at 0: a cap never hit is said so.
        for cap in [
            Cap::WindowRing,
            Cap::SymbolCache,
            Cap::UnwindTables,
            Cap::CopyBudget,
        ] {
            let _ = m.cap_hits.get_or_create(&vec![("cap", cap.name())]);
        }
        for (reason, _) in loss_reasons(&Losses::default()) {
            let _ = m.lost.get_or_create(&vec![("reason", reason)]);
        }
        m
    }

    /// Counts a hit of `cap`.
    pub fn cap_hit(&self, cap: Cap, times: u64) {
        self.cap_hits
            .get_or_create(&vec![("cap", cap.name())])
            .inc_by(times);
    }

    /// Counts a window handed to the exporter, by its outcome (one of [`EXPORT_OUTCOMES`]).
    pub fn export(&self, backend: &'static str, outcome: &'static str) {
        self.export_n(backend, outcome, 1);
    }

    /// Counts `n` windows of one backend and outcome (one of [`EXPORT_OUTCOMES`]).
    pub fn export_n(&self, backend: &'static str, outcome: &'static str, n: u64) {
        debug_assert!(EXPORT_OUTCOMES.contains(&outcome));
        if n > 0 {
            self.exports
                .get_or_create(&vec![("backend", backend), ("outcome", outcome)])
                .inc_by(n);
        }
    }

    /// Sets a backend's spool's size: entries and bytes.
    pub fn spool_size(&self, backend: &'static str, (entries, bytes): (usize, u64)) {
        let label = vec![("backend", backend)];
        self.spooled_windows
            .get_or_create(&label)
            .set(entries as i64);
        self.spooled_bytes.get_or_create(&label).set(bytes as i64);
    }

    /// Adds a window's losses.
    pub fn add_losses(&self, losses: &Losses) {
        for (reason, n) in loss_reasons(losses) {
            if n > 0 {
                self.lost.get_or_create(&vec![("reason", reason)]).inc_by(n);
            }
        }
    }

    /// Updates the agent's own CPU time and memory from the kernel's accounts, with `copies`
    /// bytes of sealed copies (memory files, in no process's RSS unless mapped).
    pub fn update_own_cost(&self, copies: u64) {
        let cpu = crate::clock::own_usage().cpu_secs;
        let before = self.cpu_seconds.get();
        if cpu > before {
            self.cpu_seconds.inc_by(cpu - before);
        }
        if let Some(rss) = resident_bytes() {
            self.resident_bytes.set(rss.saturating_add(copies) as i64);
        }
        self.copy_bytes.set(copies as i64);
    }

    /// The metrics in the OpenMetrics text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

/// Each loss by its metric label.
fn loss_reasons(l: &Losses) -> [(&'static str, u64); 10] {
    [
        ("sample_map_full", l.sample_map_full),
        ("user_stack_map_full", l.user_stack_map_full),
        ("user_stack_unreadable", l.user_stack_error),
        ("kernel_stack_map_full", l.kernel_stack_map_full),
        ("kernel_stack_unreadable", l.kernel_stack_error),
        ("lost_in_transfer", l.lost_in_transfer),
        ("truncated", l.truncated),
        ("user_stack_ended_early", l.stack_ended_early),
        ("not_profilable", l.not_profilable),
        ("off_cpu_table_full", l.off_cpu_pending_full),
    ]
}

/// The agent's resident memory now, from `/proc/self/status`: anonymous and file pages,
/// without shared memory (the mapped parts of its sealed copies, counted whole beside it).
pub fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib = |field: &str| -> Option<u64> {
        let line = status.lines().find(|l| l.starts_with(field))?;
        line[field.len()..]
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()
    };
    Some((kib("RssAnon:")? + kib("RssFile:")?) * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_is_exported_with_caps_and_reasons_at_zero() {
        let m = Metrics::new();
        m.samples.inc_by(5);
        m.cap_hit(Cap::SymbolCache, 1);
        m.update_own_cost(4096);
        let text = m.encode();
        for line in [
            "bpfprof_agent_samples_total 5",
            "bpfprof_agent_off_cpu_seconds_total 0.0",
            "bpfprof_agent_samples_lost_total{reason=\"off_cpu_table_full\"} 0",
            "bpfprof_agent_cap_hits_total{cap=\"symbol_cache\"} 1",
            "bpfprof_agent_cap_hits_total{cap=\"window_ring\"} 0",
            "bpfprof_agent_cap_hits_total{cap=\"copy_budget\"} 0",
            "bpfprof_agent_target_copy_bytes 4096",
            "bpfprof_agent_samples_lost_total{reason=\"lost_in_transfer\"} 0",
            "bpfprof_agent_export_windows_total{backend=\"otlp\",outcome=\"queue_full\"} 0",
            "# TYPE bpfprof_agent_cpu_seconds counter",
            "# EOF",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
        assert!(m.resident_bytes.get() > 4096);
    }
}
