//! Sampling settings: which perf event drives the samples and how often, validated against
//! what the kernel allows before anything is loaded.

use std::{fmt, str::FromStr, time::Duration};

use crate::error::{Error, Result};

/// Sampling rates are drawn uniformly from `mean rate * (1 ± JITTER)`.
pub const JITTER: f64 = 0.5;
/// strobelight's default: one sample every ten million cycles.
pub const DEFAULT_CYCLES_PERIOD: u64 = 10_000_000;
/// Used to turn cycles into time when the CPU's clock cannot be read.
const FALLBACK_CPU_HZ: f64 = 2.0e9;
/// The slowest rate accepted: a run samples at least once a minute.
const MIN_RATE_HZ: f64 = 1.0 / 60.0;

/// The event a user asks for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum EventChoice {
    /// Hardware cycles where the CPU has a PMU, else `cpu-clock` at the same rate.
    #[default]
    Auto,
    /// Hardware CPU cycles; an error where there is no PMU.
    Cycles,
    /// The `cpu-clock` software event (an hrtimer), available everywhere.
    CpuClock,
}

impl FromStr for EventChoice {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(EventChoice::Auto),
            "cycles" | "cpu-cycles" => Ok(EventChoice::Cycles),
            "cpu-clock" => Ok(EventChoice::CpuClock),
            other => Err(Error::InvalidSampling(format!(
                "unknown event {other:?}: expected auto, cycles or cpu-clock"
            ))),
        }
    }
}

/// The event that really drives sampling.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Event {
    /// `PERF_COUNT_HW_CPU_CYCLES`.
    Cycles,
    /// `PERF_COUNT_SW_CPU_CLOCK`.
    CpuClock,
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Event::Cycles => "cycles",
            Event::CpuClock => "cpu-clock",
        })
    }
}

/// How often an event fires a sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rate {
    /// Every N events (cycles, or nanoseconds of cpu-clock).
    Period(u64),
    /// N times per second; the kernel adjusts the period to match.
    Frequency(u64),
}

/// Shortest time off the CPU recorded when a run names none (`--off-cpu-min`): 1 µs, bcc
/// `offcputime`'s default. A shorter wait is no longer than the context switch that ends it
/// (1-2 µs here): scheduling noise rather than a place where the program waits, and dropping
/// it keeps the sample map's updates to waits that matter. Set it to 0 for a wall-clock
/// profile whose threads' times add up to their wall time exactly.
pub const DEFAULT_OFF_CPU_MIN: Duration = Duration::from_micros(1);

/// What a recording measures besides CPU samples (`--off-cpu`, `--mode wall`): the kernel
/// program adds each target thread's time off the CPU, under its stacks when it left, to the
/// profile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OffCpu {
    /// Whether time a runnable thread spends waiting for a CPU (preempted or yielding) counts
    /// too, so that each thread's CPU and off-CPU time add up to its wall time (`--mode wall`);
    /// otherwise only blocking waits count (`--off-cpu`).
    pub preempted: bool,
    /// Shortest interval off the CPU recorded, in nanoseconds (`--off-cpu-min`).
    pub min_ns: u64,
}

/// What a profile measures (`--mode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// CPU samples alone.
    #[default]
    Cpu,
    /// CPU samples and each target thread's time off the CPU, blocked or waiting for a CPU:
    /// a thread's stacks add up to its wall time.
    Wall,
}

impl FromStr for Mode {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "cpu" => Ok(Mode::Cpu),
            "wall" => Ok(Mode::Wall),
            // A word the command line does not take is a usage error (exit 2), as clap's own;
            // off-CPU time alone is a flag, not a mode.
            "off-cpu" | "offcpu" | "off_cpu" => Err(Error::Usage(format!(
                "unknown mode {s:?}: expected cpu or wall (for blocking waits beside the CPU \
                 samples, use --off-cpu)"
            ))),
            other => Err(Error::Usage(format!(
                "unknown mode {other:?}: expected cpu or wall"
            ))),
        }
    }
}

impl OffCpu {
    /// The off-CPU settings of `--mode`, `--off-cpu` and `--off-cpu-min`: `None` for a CPU
    /// profile. `--off-cpu` adds blocking waits to the CPU samples; `--mode wall` adds waits
    /// for a CPU too. Saying both, or a minimum without either, is an error.
    pub fn from_flags(mode: Mode, off_cpu: bool, min: Option<Duration>) -> Result<Option<OffCpu>> {
        let preempted = match (mode, off_cpu) {
            (Mode::Cpu, false) => {
                if min.is_some() {
                    return Err(Error::InvalidSampling(
                        "--off-cpu-min applies to --off-cpu or --mode wall".into(),
                    ));
                }
                return Ok(None);
            }
            (Mode::Cpu, true) => false,
            (Mode::Wall, false) => true,
            (Mode::Wall, true) => {
                return Err(Error::InvalidSampling(
                    "--mode wall records off-CPU time already: drop --off-cpu".into(),
                ))
            }
        };
        let min = min.unwrap_or(DEFAULT_OFF_CPU_MIN);
        Ok(Some(OffCpu {
            preempted,
            min_ns: u64::try_from(min.as_nanos()).unwrap_or(u64::MAX),
        }))
    }
}

/// What the user asked for, before validation; signed so that negative input gets a clear error.
/// Plain integers, so that identical requests compare equal and share one kernel program.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SamplingRequest {
    /// The event.
    pub event: EventChoice,
    /// Period in the event's unit: cycles, or nanoseconds for cpu-clock.
    pub sample_interval: Option<i64>,
    /// Period as CPU time, whatever the event: cpu-clock samples every this many nanoseconds
    /// of CPU time, cycles every as many cycles as the CPU's clock runs in that time.
    pub sample_period_ns: Option<i64>,
    /// Samples per second.
    pub frequency: Option<i64>,
    /// Keep the period fixed instead of re-randomizing it around its mean.
    pub fixed_interval: bool,
    /// Off-CPU time recorded alongside the samples, if asked: runs that differ in it get
    /// different kernel programs (the settings are the program's).
    pub off_cpu: Option<OffCpu>,
}

/// One event with its rate, ready to attach.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    /// The event.
    pub event: Event,
    /// Its rate.
    pub rate: Rate,
    /// Expected samples per second of on-CPU time.
    pub nominal_hz: f64,
    /// True when `auto` found no PMU and fell back to cpu-clock.
    pub fallback: bool,
    /// Whether a fixed period is re-randomized around its mean while sampling, so that
    /// periodic workloads do not alias with it.
    pub jitter: bool,
}

impl Sampling {
    /// The period in event units, or zero for frequency-driven sampling.
    pub fn period(&self) -> u64 {
        match self.rate {
            Rate::Period(p) => p,
            Rate::Frequency(_) => 0,
        }
    }

    /// One line saying what drives the samples, for logs and summaries.
    pub fn describe(&self) -> String {
        let rate = match (self.event, self.rate) {
            (_, Rate::Frequency(hz)) => format!("{hz} Hz"),
            (Event::Cycles, Rate::Period(p)) => format!("every {p} cycles"),
            (Event::CpuClock, Rate::Period(p)) => {
                format!("every {} ({:.0} Hz)", fmt_ns(p), self.nominal_hz)
            }
        };
        let fallback = if self.fallback {
            " (no hardware PMU here: fell back from cycles)"
        } else {
            ""
        };
        let jitter = if self.jitter && matches!(self.rate, Rate::Period(_)) {
            format!(", randomized ±{:.0}%", JITTER * 100.0)
        } else {
            String::new()
        };
        format!("{} {rate}{jitter}{fallback}", self.event)
    }
}

fn fmt_ns(ns: u64) -> String {
    if ns < 1_000_000_000 {
        format!("{:.3} ms", ns as f64 / 1e6)
    } else {
        humantime::format_duration(Duration::from_millis(ns / 1_000_000)).to_string()
    }
}

/// The events to try, in order, for a request: `auto` tries cycles first, then cpu-clock.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingPlan {
    /// Hardware cycles, when the request allows them.
    pub cycles: Option<Sampling>,
    /// cpu-clock at an equivalent rate, when the request allows it.
    pub cpu_clock: Option<Sampling>,
}

/// Limits the kernel puts on sampling, read from sysctls.
#[derive(Clone, Copy, Debug)]
pub struct KernelLimits {
    /// `kernel.perf_event_max_sample_rate`.
    pub max_sample_rate: u64,
    /// Nominal CPU clock in Hz, to convert cycles into time.
    pub cpu_hz: f64,
}

impl KernelLimits {
    /// Reads the limits of this machine.
    pub fn read() -> KernelLimits {
        let max_sample_rate =
            std::fs::read_to_string("/proc/sys/kernel/perf_event_max_sample_rate")
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(100_000);
        KernelLimits {
            max_sample_rate,
            cpu_hz: cpu_hz().unwrap_or(FALLBACK_CPU_HZ),
        }
    }
}

/// The CPU's nominal clock: cpufreq's maximum where present (VMs often lack it), else
/// `/proc/cpuinfo`'s first "cpu MHz".
fn cpu_hz() -> Option<f64> {
    if let Ok(khz) =
        std::fs::read_to_string("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")
    {
        if let Ok(khz) = khz.trim().parse::<f64>() {
            return Some(khz * 1e3);
        }
    }
    let info = <procfs::CpuInfo as procfs::Current>::current().ok()?;
    let mhz: f64 = info.get_field(0, "cpu MHz")?.trim().parse().ok()?;
    (mhz > 0.0).then_some(mhz * 1e6)
}

impl SamplingRequest {
    /// Validates the request and works out the event(s) to try.
    pub fn plan(&self, limits: &KernelLimits) -> Result<SamplingPlan> {
        let given = [
            self.sample_interval.is_some(),
            self.sample_period_ns.is_some(),
            self.frequency.is_some(),
        ];
        if given.iter().filter(|g| **g).count() > 1 {
            return Err(Error::InvalidSampling(
                "give either --sample-interval or --frequency, not both".into(),
            ));
        }
        let positive = |v: i64, what: &str| -> Result<u64> {
            if v <= 0 {
                Err(Error::InvalidSampling(format!(
                    "{what} must be a positive number, got {v}"
                )))
            } else {
                Ok(v as u64)
            }
        };
        let check_rate = |hz: f64, what: String| -> Result<f64> {
            if hz > limits.max_sample_rate as f64 {
                Err(Error::InvalidSampling(format!(
                    "{what} means {hz:.0} samples/s, above the kernel's limit of {} \
                     (sysctl kernel.perf_event_max_sample_rate)",
                    limits.max_sample_rate
                )))
            } else if hz < MIN_RATE_HZ {
                Err(Error::InvalidSampling(format!(
                    "{what} means fewer than one sample a minute: nothing useful would be recorded"
                )))
            } else {
                Ok(hz)
            }
        };
        let frequency = self
            .frequency
            .map(|f| positive(f, "--frequency"))
            .transpose()?;
        let interval = self
            .sample_interval
            .map(|i| positive(i, "--sample-interval"))
            .transpose()?;
        if let Some(ns) = self.sample_period_ns {
            return self.plan_time_period(positive(ns, "--sample-interval")?, limits);
        }

        // Cycles: the interval is in cycles; cpu-clock: in nanoseconds. With `auto` the
        // interval is in cycles (strobelight's meaning) and cpu-clock gets the same rate.
        let jitter = !self.fixed_interval;
        let cycles = |rate: Rate, hz: f64| Sampling {
            event: Event::Cycles,
            rate,
            nominal_hz: hz,
            fallback: false,
            jitter,
        };
        let clock = |hz: f64, fallback: bool| Sampling {
            event: Event::CpuClock,
            rate: Rate::Period(((1e9 / hz).round() as u64).max(1)),
            nominal_hz: hz,
            fallback,
            jitter,
        };
        Ok(match (self.event, frequency, interval) {
            (EventChoice::CpuClock, Some(hz), _) => {
                let hz = check_rate(hz as f64, format!("--frequency {hz}"))?;
                SamplingPlan {
                    cycles: None,
                    cpu_clock: Some(clock(hz, false)),
                }
            }
            (EventChoice::CpuClock, None, interval) => {
                let ns =
                    interval.unwrap_or((DEFAULT_CYCLES_PERIOD as f64 / limits.cpu_hz * 1e9) as u64);
                let hz = check_rate(1e9 / ns as f64, format!("an interval of {ns} ns"))?;
                SamplingPlan {
                    cycles: None,
                    cpu_clock: Some(Sampling {
                        rate: Rate::Period(ns),
                        ..clock(hz, false)
                    }),
                }
            }
            (choice, Some(hz), _) => {
                let hz = check_rate(hz as f64, format!("--frequency {hz}"))?;
                SamplingPlan {
                    cycles: Some(cycles(Rate::Frequency(hz as u64), hz)),
                    cpu_clock: (choice == EventChoice::Auto).then(|| clock(hz, true)),
                }
            }
            (choice, None, interval) => {
                let period = interval.unwrap_or(DEFAULT_CYCLES_PERIOD);
                let hz = check_rate(
                    limits.cpu_hz / period as f64,
                    format!(
                        "an interval of {period} cycles at {:.2} GHz",
                        limits.cpu_hz / 1e9
                    ),
                )?;
                SamplingPlan {
                    cycles: Some(cycles(Rate::Period(period), hz)),
                    cpu_clock: (choice == EventChoice::Auto).then(|| clock(hz, true)),
                }
            }
        })
    }
}

impl SamplingRequest {
    /// The plan for a period given as CPU time: the same rate on either event.
    fn plan_time_period(&self, ns: u64, limits: &KernelLimits) -> Result<SamplingPlan> {
        let hz = 1e9 / ns as f64;
        if hz > limits.max_sample_rate as f64 {
            return Err(Error::InvalidSampling(format!(
                "a period of {} means {hz:.0} samples/s, above the kernel's limit of {} \
                 (sysctl kernel.perf_event_max_sample_rate)",
                fmt_ns(ns),
                limits.max_sample_rate
            )));
        }
        if hz < MIN_RATE_HZ {
            return Err(Error::InvalidSampling(format!(
                "a period of {} means fewer than one sample a minute",
                fmt_ns(ns)
            )));
        }
        let jitter = !self.fixed_interval;
        let clock = |fallback| Sampling {
            event: Event::CpuClock,
            rate: Rate::Period(ns),
            nominal_hz: hz,
            fallback,
            jitter,
        };
        let cycles = Sampling {
            event: Event::Cycles,
            rate: Rate::Period(((limits.cpu_hz / hz).round() as u64).max(1)),
            nominal_hz: hz,
            fallback: false,
            jitter,
        };
        Ok(match self.event {
            EventChoice::CpuClock => SamplingPlan {
                cycles: None,
                cpu_clock: Some(clock(false)),
            },
            EventChoice::Cycles => SamplingPlan {
                cycles: Some(cycles),
                cpu_clock: None,
            },
            EventChoice::Auto => SamplingPlan {
                cycles: Some(cycles),
                cpu_clock: Some(clock(true)),
            },
        })
    }
}

/// A `--sample-interval` as given: a plain number is in the event's own unit (cycles, or
/// nanoseconds for cpu-clock); a number with a time unit (`250us`, `1ms`, `0.01s`) is CPU time
/// between samples on any event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IntervalArg {
    /// In the event's unit.
    Events(i64),
    /// CPU time, in nanoseconds.
    TimeNs(i64),
}

impl FromStr for IntervalArg {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let s = s.trim();
        if let Ok(n) = s.parse::<i64>() {
            return Ok(IntervalArg::Events(n));
        }
        let split = s
            .find(|c: char| c.is_ascii_alphabetic())
            .ok_or_else(|| format!("{s:?} is neither a number nor a time such as 1ms"))?;
        let (number, unit) = s.split_at(split);
        let value: f64 = number
            .trim()
            .parse()
            .map_err(|_| format!("{s:?}: {number:?} is not a number"))?;
        let scale = match unit {
            "ns" => 1.0,
            "us" | "µs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            other => {
                return Err(format!(
                    "{s:?}: unknown unit {other:?} (use ns, us, ms or s)"
                ))
            }
        };
        Ok(IntervalArg::TimeNs((value * scale).round() as i64))
    }
}

/// Checks a requested stack depth against the kernel program's limit. Stacks walked with CFI
/// tables and Python stacks reach it; frame-pointer user stacks and kernel stacks stop at the
/// kernel's `perf_event_max_stack` (127 by default), as perf's do, whatever is asked.
pub fn validate_max_stack_length(requested: i64) -> Result<usize> {
    let ours = profiler_common::MAX_STACK_DEPTH as i64;
    if requested < 1 {
        return Err(Error::InvalidSampling(format!(
            "--max-stack-length must be at least 1, got {requested}"
        )));
    }
    if requested > ours {
        return Err(Error::InvalidSampling(format!(
            "--max-stack-length {requested} is above the {ours} frames bpfprof's kernel program collects"
        )));
    }
    Ok(requested as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_cpu_flags_become_one_setting_or_a_clear_error() {
        let us = Duration::from_micros;
        assert_eq!(OffCpu::from_flags(Mode::Cpu, false, None).unwrap(), None);
        assert_eq!(
            OffCpu::from_flags(Mode::Cpu, true, None).unwrap(),
            Some(OffCpu {
                preempted: false,
                min_ns: 1_000
            })
        );
        assert_eq!(
            OffCpu::from_flags(Mode::Wall, false, Some(us(0))).unwrap(),
            Some(OffCpu {
                preempted: true,
                min_ns: 0
            })
        );
        for (mode, off_cpu, min, says) in [
            (Mode::Wall, true, None, "drop --off-cpu"),
            (Mode::Cpu, false, Some(us(5)), "--off-cpu-min applies"),
        ] {
            let err = OffCpu::from_flags(mode, off_cpu, min).unwrap_err();
            assert!(matches!(err, Error::InvalidSampling(_)), "{err}");
            assert!(err.to_string().contains(says), "{err}");
        }
        let err = "idle".parse::<Mode>().unwrap_err();
        assert!(err.to_string().contains("cpu or wall"), "{err}");
        assert!(matches!(err, Error::Usage(_)), "{err}");
        let err = "off-cpu".parse::<Mode>().unwrap_err();
        assert!(err.to_string().contains("--off-cpu"), "{err}");
        assert_eq!(err.exit_code(), crate::error::exit_code::USAGE);
    }

    const LIMITS: KernelLimits = KernelLimits {
        max_sample_rate: 100_000,
        cpu_hz: 2.5e9,
    };

    fn plan(event: EventChoice, interval: Option<i64>, freq: Option<i64>) -> Result<SamplingPlan> {
        SamplingRequest {
            event,
            sample_interval: interval,
            frequency: freq,
            ..SamplingRequest::default()
        }
        .plan(&LIMITS)
    }

    #[test]
    fn a_time_interval_is_cpu_time_on_every_event() {
        assert_eq!("1ms".parse(), Ok(IntervalArg::TimeNs(1_000_000)));
        assert_eq!("250us".parse(), Ok(IntervalArg::TimeNs(250_000)));
        assert_eq!("0.01s".parse(), Ok(IntervalArg::TimeNs(10_000_000)));
        assert_eq!("1000000".parse(), Ok(IntervalArg::Events(1_000_000)));
        assert!("1 fortnight".parse::<IntervalArg>().is_err());
        let time = |event| {
            SamplingRequest {
                event,
                sample_period_ns: Some(1_000_000),
                ..SamplingRequest::default()
            }
            .plan(&LIMITS)
            .unwrap()
        };
        let auto = time(EventChoice::Auto);
        // 1 ms of CPU time: 1000 Hz on cpu-clock, and 2.5 million cycles at 2.5 GHz.
        assert_eq!(auto.cpu_clock.unwrap().rate, Rate::Period(1_000_000));
        assert_eq!(auto.cycles.unwrap().rate, Rate::Period(2_500_000));
        assert!((auto.cpu_clock.unwrap().nominal_hz - 1000.0).abs() < 1e-6);
        assert_eq!(
            time(EventChoice::CpuClock).cpu_clock.unwrap().rate,
            Rate::Period(1_000_000)
        );
        let too_fast = SamplingRequest {
            sample_period_ns: Some(1_000),
            ..SamplingRequest::default()
        };
        assert!(matches!(
            too_fast.plan(&LIMITS),
            Err(Error::InvalidSampling(_))
        ));
    }

    #[test]
    fn auto_default_is_strobelight_interval_with_equivalent_clock() {
        let p = plan(EventChoice::Auto, None, None).unwrap();
        let cycles = p.cycles.unwrap();
        assert_eq!(cycles.rate, Rate::Period(DEFAULT_CYCLES_PERIOD));
        let clock = p.cpu_clock.unwrap();
        // 10M cycles at 2.5 GHz = 4 ms = 250 Hz.
        assert_eq!(clock.rate, Rate::Period(4_000_000));
        assert!(clock.fallback);
        assert!((clock.nominal_hz - 250.0).abs() < 1e-9);
    }

    #[test]
    fn explicit_events_do_not_fall_back() {
        let p = plan(EventChoice::Cycles, None, Some(999)).unwrap();
        assert!(p.cpu_clock.is_none());
        let p = plan(EventChoice::CpuClock, None, Some(999)).unwrap();
        assert!(p.cycles.is_none());
        assert_eq!(p.cpu_clock.unwrap().rate, Rate::Period(1_001_001));
        let p = plan(EventChoice::CpuClock, Some(2_000_000), None).unwrap();
        assert_eq!(p.cpu_clock.unwrap().rate, Rate::Period(2_000_000));
    }

    #[test]
    fn rejects_zero_negative_and_absurd_rates() {
        for (interval, freq) in [
            (Some(0), None),
            (Some(-5), None),
            (None, Some(0)),
            (None, Some(-1)),
            (None, Some(100_001)),
            (Some(1), None),
            (Some(i64::MAX), None),
            (Some(10), Some(10)),
        ] {
            let err = plan(EventChoice::Auto, interval, freq).unwrap_err();
            assert!(matches!(err, Error::InvalidSampling(_)), "{err}");
        }
        let err = plan(EventChoice::Auto, None, Some(200_000)).unwrap_err();
        assert!(err.to_string().contains("perf_event_max_sample_rate"));
    }

    #[test]
    fn unknown_event_is_an_error() {
        assert!("branch-misses".parse::<EventChoice>().is_err());
        assert_eq!(
            "cpu-clock".parse::<EventChoice>().unwrap(),
            EventChoice::CpuClock
        );
    }
}
