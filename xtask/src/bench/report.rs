//! Writing the report: the machine paragraph, profiler × frequency tables, and the overhead
//! plot (`bench/overhead.svg`).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::path::Path;
use std::process::Command;

use anyhow::Result;

use super::plan::{Arm, Tool};
use super::stats::{median, sorted};
use super::Bench;

impl Bench {
    /// The machine and tool versions, for the report's first paragraph.
    pub(super) fn machine(&self) -> Result<String> {
        let out = |c: &str, a: &[&str]| {
            crate::cmd::probe(Command::new(c).args(a))
                .map(|s| s.lines().next().unwrap_or("").trim().to_string())
                .unwrap_or_else(|| "?".into())
        };
        let cpu = fs::read_to_string("/proc/cpuinfo")?
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split(':').nth(1))
            .unwrap_or("?")
            .trim()
            .to_string();
        let mem_gib = fs::read_to_string("/proc/meminfo")?
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .map_or("?".into(), |kb| format!("{:.0} GiB", kb / 1048576.0));
        let bpfprof = out(self.bpfprof.to_str().unwrap_or("bpfprof"), &["--version"]);
        let rev = out(
            "git",
            &[
                "-C",
                self.root.to_str().unwrap_or("."),
                "describe",
                "--always",
                "--dirty",
            ],
        );
        Ok(format!(
            "Date {}; machine: {} CPUs ({cpu}), {mem_gib} RAM, kernel {}; {}; {}; {bpfprof} (git {rev}); {}. Sampling event: cpu-clock for all three (no hardware PMU here).",
            out("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
            self.cpus,
            out("uname", &["-r"]),
            out("perf", &["--version"]),
            out("bpftrace", &["--version"]),
            out("gcc", &["--version"]),
        ))
    }
}

/// `items` joined by `sep`.
pub(super) fn join<T: std::fmt::Display>(items: impl IntoIterator<Item = T>, sep: &str) -> String {
    items
        .into_iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(sep)
}

/// A profiler × frequency table.
pub(super) fn table(
    md: &mut String,
    tools: &[Tool],
    freqs: &[u64],
    cell: impl Fn(Tool, u64) -> String,
) -> Result<()> {
    writeln!(
        md,
        "| profiler | {} |",
        join(freqs.iter().map(|hz| format!("{hz} Hz")), " | ")
    )?;
    writeln!(md, "|---|{}", "---|".repeat(freqs.len()))?;
    for &tool in tools {
        writeln!(
            md,
            "| {} | {} |",
            tool.name(),
            join(freqs.iter().map(|&hz| cell(tool, hz)), " | ")
        )?;
    }
    Ok(())
}

/// The overhead plot: slowdown against frequency (log), one line per profiler, min–max
/// whiskers; points are nudged sideways per profiler so that whiskers do not hide each other.
pub(super) fn plot(
    path: &Path,
    freqs: &[u64],
    overhead: &BTreeMap<(Arm, u64), Vec<f64>>,
) -> Result<()> {
    use plotters::prelude::*;
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir)?;
    }
    let root = SVGBackend::new(path, (820, 520)).into_drawing_area();
    root.fill(&WHITE)?;
    let all: Vec<f64> = overhead.values().flatten().copied().collect();
    let hi = all.iter().copied().fold(1.0f64, f64::max);
    let lo = all.iter().copied().fold(1.0f64, f64::min);
    let pad = (hi - lo).max(0.05) * 0.08;
    let (xmin, xmax) = (
        *freqs.first().unwrap_or(&99) as f64 * 0.6,
        *freqs.last().unwrap_or(&4999) as f64 * 1.6,
    );
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Workload slowdown under each profiler (median, min–max whiskers)",
            ("sans-serif", 20),
        )
        .margin(16)
        .x_label_area_size(45)
        .y_label_area_size(65)
        .build_cartesian_2d((xmin..xmax).log_scale(), (lo - pad)..(hi + pad))?;
    chart
        .configure_mesh()
        .x_desc("sampling frequency, Hz (log scale)")
        .y_desc("time under profiler / time alone")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.2}"))
        .draw()?;
    chart.draw_series(LineSeries::new(
        [(xmin, 1.0), (xmax, 1.0)],
        BLACK.mix(0.4).stroke_width(1),
    ))?;
    // The three profilers, then the timer floor in grey.
    let arms = [
        (Arm::Under(Tool::Bpfprof), RGBColor(200, 40, 40), 0.92),
        (Arm::Under(Tool::Perf), RGBColor(30, 90, 200), 0.97),
        (Arm::Under(Tool::Bpftrace), RGBColor(20, 140, 60), 1.03),
        (Arm::Floor, RGBColor(130, 130, 130), 1.08),
    ];
    for (arm, color, nudge) in arms {
        let points: Vec<(f64, f64, f64, f64)> = freqs
            .iter()
            .filter_map(|&hz| {
                let v = sorted(overhead.get(&(arm, hz))?);
                (!v.is_empty()).then(|| (hz as f64 * nudge, median(&v), v[0], v[v.len() - 1]))
            })
            .collect();
        let line = points.iter().map(|p| (p.0, p.1));
        // The floor is a reference, not a profiler: dashed.
        let series = if arm == Arm::Floor {
            chart.draw_series(DashedLineSeries::new(line, 6, 4, color.stroke_width(2)))?
        } else {
            chart.draw_series(LineSeries::new(line, color.stroke_width(2)))?
        };
        series.label(arm.name()).legend(move |(x, y)| {
            PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
        });
        chart.draw_series(
            points
                .iter()
                .map(|p| PathElement::new(vec![(p.0, p.2), (p.0, p.3)], color.stroke_width(1))),
        )?;
        chart.draw_series(points.iter().flat_map(|p| {
            [p.2, p.3].map(|y| {
                PathElement::new(
                    vec![(p.0 * 0.985, y), (p.0 * 1.015, y)],
                    color.stroke_width(1),
                )
            })
        }))?;
        chart.draw_series(
            points
                .iter()
                .map(|p| Circle::new((p.0, p.1), 4, color.filled())),
        )?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
