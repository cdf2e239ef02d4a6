//! `bpfprof top`: a live view of where the targets spend their CPU, refreshed every second,
//! as `py-spy top` and `perf top` show it. It drives the same recording as any run (the
//! command line's [`Recorder`], ticked every [`TICK`]) and cuts a window from it every
//! [`REFRESH`] ([`Recorder::take_window`]: the aggregation every profile goes through, with
//! the Python view made by [`python_view`]); [`TopState`] keeps each window's function shares
//! and their sums since the start, and [`render`] draws them with ratatui in any terminal of
//! 80x24 or more.

use std::{collections::HashMap, io::IsTerminal, time::Duration};

use ratatui::{
    crossterm::event::{self, Event, KeyCode, KeyEvent, KeyEventKind, KeyModifiers},
    layout::{Constraint, Layout},
    style::{Modifier, Style},
    text::Line,
    widgets::{Paragraph, Row, Table},
    Frame,
};
use tokio::signal::unix::{signal, SignalKind};

use crate::{
    cli::{
        args::TopArgs,
        record::{CommandOutcome, Recorder},
    },
    error::{exit_code, Error, Result},
    kernel::pool::ProgramPool,
    output::top::function_shares,
    process::target::TargetSpec,
    profile::{Losses, Profile, RunEnd},
    recording::{
        aggregate::python_view,
        request::{RecordingRequest, Scope, SystemScope, TagsAndStacks, Walks},
        run_loop::TICK,
    },
    sampling::SamplingRequest,
    symbolize::Symbolizer,
};

/// How often the view is refreshed: each refresh shows the samples of the interval since the
/// last one (a second, as `py-spy top` and `perf top` refresh).
pub const REFRESH: Duration = Duration::from_secs(1);

/// Longest name of what is profiled in the header's first line, in characters: the rest of
/// its 80 columns say how long and at what rate.
const MAX_TITLE: usize = 24;

/// Samples per second per CPU by default: 99 Hz, as `perf top`'s `-F` advice for a live view
/// and `py-spy top`'s 100; enough for shares a second at a time, cheap on a loaded machine.
pub const DEFAULT_HZ: i64 = 99;

/// How the table is sorted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SortBy {
    /// Samples with the function at the leaf.
    SelfSamples,
    /// Samples with the function anywhere on the stack.
    Total,
}

/// Which samples the sort looks at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Period {
    /// The last interval's.
    Interval,
    /// Every sample since the start.
    SinceStart,
}

/// Function shares of some samples: (kernel, function) to (self, total) samples.
#[derive(Clone, Debug, Default)]
struct Shares {
    samples: u64,
    rows: HashMap<(bool, String), (u64, u64)>,
}

impl Shares {
    fn of(profile: &Profile) -> Shares {
        Shares {
            samples: profile.total_samples(),
            rows: function_shares(profile)
                .into_iter()
                .map(|s| ((s.kernel, s.name), (s.self_samples, s.total_samples)))
                .collect(),
        }
    }

    fn add(&mut self, other: &Shares) {
        self.samples += other.samples;
        for (key, (own, total)) in &other.rows {
            let entry = self.rows.entry(key.clone()).or_default();
            entry.0 += own;
            entry.1 += total;
        }
    }

    fn share(&self, samples: u64) -> f64 {
        if self.samples == 0 {
            0.0
        } else {
            samples as f64 / self.samples as f64
        }
    }
}

/// One row of the view: a function's shares over the last interval and since the start.
#[derive(Clone, Debug, PartialEq)]
pub struct TopRow {
    /// The function, `[k] ` before kernel functions.
    pub function: String,
    /// Its self share of the last interval's samples.
    pub interval_self: f64,
    /// Its total share of the last interval's samples.
    pub interval_total: f64,
    /// Its self share of the samples since the start.
    pub start_self: f64,
    /// Its total share of the samples since the start.
    pub start_total: f64,
}

/// What the view shows: the last window's shares and their sums since the start, natively
/// and in the Python view, and how the user asked to see them.
pub struct TopState {
    /// What is profiled, for the header.
    title: String,
    /// The event and rate in use.
    sampling: String,
    /// The last interval's shares: [native, Python view].
    interval: [Shares; 2],
    /// The shares since the start: [native, Python view].
    since_start: [Shares; 2],
    /// The last interval's length.
    interval_length: Duration,
    /// Time since the start.
    elapsed: Duration,
    /// Samples lost (or incomplete) in the last interval and since the start.
    losses: (Losses, Losses),
    /// The sort's column.
    pub sort: SortBy,
    /// The sort's samples.
    pub period: Period,
    /// Whether the Python view is shown.
    pub python_view: bool,
    /// The CPythons among the targets whose Python frames bpfprof cannot walk, one sentence
    /// each: shown under the header, and said again when top ends.
    pub python_unsupported: Vec<String>,
}

impl TopState {
    /// An empty view of `title`, sampled with `sampling`.
    pub fn new(title: String, sampling: String, python_view: bool) -> TopState {
        TopState {
            title,
            sampling,
            interval: Default::default(),
            since_start: Default::default(),
            interval_length: Duration::ZERO,
            elapsed: Duration::ZERO,
            losses: Default::default(),
            sort: SortBy::SelfSamples,
            period: Period::Interval,
            python_view,
            python_unsupported: Vec::new(),
        }
    }

    /// Takes in the profile of the interval that just ended.
    pub fn add_window(&mut self, window: &Profile, elapsed: Duration) {
        let shares = [Shares::of(window), Shares::of(&python_view(window))];
        for said in &window.meta.python_unsupported {
            if !self.python_unsupported.contains(said) {
                self.python_unsupported.push(said.clone());
            }
        }
        for (total, new) in self.since_start.iter_mut().zip(&shares) {
            total.add(new);
        }
        self.interval = shares;
        self.interval_length = window.meta.duration;
        self.elapsed = elapsed;
        self.losses.0 = window.meta.losses.clone();
        self.losses.1.add(&window.meta.losses);
    }

    /// Applies a key; `true` when it asks to quit (`q`, Esc, Ctrl-C).
    pub fn key(&mut self, key: KeyEvent) -> bool {
        if key.kind != KeyEventKind::Press {
            return false;
        }
        match key.code {
            KeyCode::Char('q') | KeyCode::Esc => return true,
            KeyCode::Char('c') if key.modifiers.contains(KeyModifiers::CONTROL) => return true,
            KeyCode::Char('s') => self.sort = SortBy::SelfSamples,
            KeyCode::Char('t') => self.sort = SortBy::Total,
            KeyCode::Char('i') => {
                self.period = match self.period {
                    Period::Interval => Period::SinceStart,
                    Period::SinceStart => Period::Interval,
                }
            }
            KeyCode::Char('p') => self.python_view = !self.python_view,
            _ => {}
        }
        false
    }

    /// The rows, sorted as asked (ties by the other column, then by name).
    pub fn rows(&self) -> Vec<TopRow> {
        let view = usize::from(self.python_view);
        let (interval, start) = (&self.interval[view], &self.since_start[view]);
        let mut rows: Vec<TopRow> = start
            .rows
            .iter()
            .map(|((kernel, name), &(own, total))| {
                let (now_own, now_total) = interval
                    .rows
                    .get(&(*kernel, name.clone()))
                    .copied()
                    .unwrap_or_default();
                TopRow {
                    function: if *kernel {
                        format!("[k] {name}")
                    } else {
                        name.clone()
                    },
                    interval_self: interval.share(now_own),
                    interval_total: interval.share(now_total),
                    start_self: start.share(own),
                    start_total: start.share(total),
                }
            })
            .collect();
        let key = |r: &TopRow| match (self.period, self.sort) {
            (Period::Interval, SortBy::SelfSamples) => (r.interval_self, r.interval_total),
            (Period::Interval, SortBy::Total) => (r.interval_total, r.interval_self),
            (Period::SinceStart, SortBy::SelfSamples) => (r.start_self, r.start_total),
            (Period::SinceStart, SortBy::Total) => (r.start_total, r.start_self),
        };
        rows.sort_by(|a, b| {
            key(b)
                .partial_cmp(&key(a))
                .unwrap_or(std::cmp::Ordering::Equal)
                .then_with(|| a.function.cmp(&b.function))
        });
        rows
    }

    /// The header's lines: what is profiled and how, the samples and their losses, the keys.
    pub fn header(&self) -> [String; 3] {
        let interval = &self.interval[0];
        let rate = if self.interval_length.is_zero() {
            0.0
        } else {
            interval.samples as f64 / self.interval_length.as_secs_f64()
        };
        let lost = |l: &Losses| -> u64 {
            l.nonzero()
                .iter()
                .filter(|(reason, _)| {
                    // Kept, only shortened: not lost.
                    *reason != "truncated stacks" && *reason != "user stacks ended early"
                })
                .map(|(_, n)| n)
                .sum()
        };
        [
            format!(
                "bpfprof top: {}  {:.0}s  {}{}",
                self.title,
                self.elapsed.as_secs_f64(),
                self.sampling,
                if self.python_view {
                    "  [Python view]"
                } else {
                    ""
                }
            ),
            format!(
                "samples: {} in {:.1}s ({rate:.0}/s), {} since start; lost {} ({} since start)",
                interval.samples,
                self.interval_length.as_secs_f64(),
                self.since_start[0].samples,
                lost(&self.losses.0),
                lost(&self.losses.1),
            ),
            format!(
                "sort: {} {}  keys: s self  t total  i period  p Python  q quit",
                match self.sort {
                    SortBy::SelfSamples => "self",
                    SortBy::Total => "total",
                },
                match self.period {
                    Period::Interval => "(interval)",
                    Period::SinceStart => "(since start)",
                },
            ),
        ]
    }
}

/// Draws the view: the header, then as many rows as the terminal has room for.
pub fn render(frame: &mut Frame, state: &TopState) {
    let notes = state.python_unsupported.len() as u16;
    let [header, table] =
        Layout::vertical([Constraint::Length(3 + notes), Constraint::Min(1)]).areas(frame.area());
    let lines: Vec<Line> = state
        .header()
        .into_iter()
        .chain(state.python_unsupported.iter().cloned())
        .map(|l| Line::from(crate::cli::terminal::escape(&l).into_owned()))
        .collect();
    frame.render_widget(Paragraph::new(lines), header);
    let percent = |share: f64| format!("{:5.1}%", 100.0 * share);
    let rows = state.rows().into_iter().map(|r| {
        Row::new(vec![
            percent(r.interval_self),
            percent(r.interval_total),
            percent(r.start_self),
            percent(r.start_total),
            crate::cli::terminal::escape(&r.function).into_owned(),
        ])
    });
    let bold = Style::default().add_modifier(Modifier::BOLD);
    let widths = [
        Constraint::Length(6),
        Constraint::Length(6),
        Constraint::Length(6),
        Constraint::Length(6),
        Constraint::Min(10),
    ];
    let table_widget = Table::new(rows, widths)
        .header(
            Row::new(vec![
                "Self",
                "Total",
                "Self*",
                "Total*",
                "Function  (* since start)",
            ])
            .style(bold),
        )
        .column_spacing(1);
    frame.render_widget(table_widget, table);
}

/// The terminal in the view's mode (raw, alternate screen) for as long as this lives: dropped
/// on every way out (an error, a panic), it gives the terminal back as it was.
struct Screen {
    terminal: ratatui::DefaultTerminal,
}

impl Screen {
    fn enter() -> Result<Screen> {
        let terminal = ratatui::try_init().map_err(anyhow::Error::from)?;
        Ok(Screen { terminal })
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        ratatui::restore();
    }
}

/// Runs `bpfprof top` until `q`, Ctrl-C, SIGTERM or the targets' exit; returns the exit code
/// (a launched command's own status when it ended the view).
pub async fn run(args: TopArgs) -> Result<i32> {
    if !std::io::stdout().is_terminal() {
        return Err(Error::Usage(
            "bpfprof top draws in a terminal: run it in one (to record a file, use bpfprof -o)"
                .into(),
        ));
    }
    let specs = args
        .pids
        .iter()
        .map(|p| p.parse::<TargetSpec>())
        .collect::<Result<Vec<_>>>()?;
    let launch = !args.command.is_empty();
    let ways = [!specs.is_empty(), launch, args.all];
    if ways.iter().filter(|w| **w).count() != 1 {
        return Err(Error::InvalidTarget {
            spec: String::new(),
            reason: "give one of --pid (repeatable), a command after --, or --all".into(),
        });
    }
    let request = RecordingRequest::validate(
        SamplingRequest {
            frequency: Some(args.frequency),
            ..SamplingRequest::default()
        },
        // A command is followed into its children, as a recording of it is.
        launch,
        None,
        // The view runs until it is quit: no run length applies.
        Duration::MAX,
        TagsAndStacks::default(),
        Walks::default(),
    )?
    .with_scope(if args.all {
        Scope::System(SystemScope {
            kernel_threads: true,
            cgroup: None,
        })
    } else {
        Scope::Targets
    })?;
    crate::kernel::check_privileges()?;
    let title = if launch {
        // The program's own name and its arguments, within a third of the header's line.
        let mut words = args
            .command
            .iter()
            .map(|a| a.to_string_lossy().into_owned());
        let program = words.next().unwrap_or_default();
        let program = program.rsplit('/').next().unwrap_or_default().to_string();
        let title: String = std::iter::once(program)
            .chain(words)
            .collect::<Vec<_>>()
            .join(" ");
        if title.chars().count() > MAX_TITLE {
            let cut: String = title.chars().take(MAX_TITLE - 3).collect();
            format!("{cut}...")
        } else {
            title
        }
    } else if args.all {
        "every process".to_string()
    } else {
        format!("pid {}", args.pids.join(", "))
    };
    let table_cache = crate::unwind::open_table_cache(crate::unwind::DEFAULT_TABLE_CACHE);
    let pool = ProgramPool::new(false).with_table_cache(table_cache.clone());
    let mut recorder = if launch {
        Recorder::launch(&request, &args.command, pool, true)?
    } else if args.all {
        Recorder::system(&request, pool)?
    } else {
        Recorder::attach(&request, &specs, pool)?
    };
    // The event and its rate per CPU, short: the header has one line of 80 columns.
    let sampling = recorder.sampling().map_or_else(String::new, |s| {
        format!("{} {:.0} Hz", s.event, s.nominal_hz)
    });
    let mut state = TopState::new(title, sampling, args.python_view);
    let mut sigterm = signal(SignalKind::terminate()).map_err(anyhow::Error::from)?;
    let mut sigint = signal(SignalKind::interrupt()).map_err(anyhow::Error::from)?;
    let mut sighup = signal(SignalKind::hangup()).map_err(anyhow::Error::from)?;
    let mut symbolizer = Symbolizer::new().with_kernel_cache(table_cache.map(|c| c as _));
    let started = std::time::Instant::now();
    let end = {
        let mut screen = Screen::enter()?;
        let mut tick = tokio::time::interval(TICK);
        let mut next_refresh = started + REFRESH;
        let draw = |screen: &mut Screen, state: &TopState| -> Result<()> {
            screen
                .terminal
                .draw(|f| render(f, state))
                .map_err(anyhow::Error::from)?;
            Ok(())
        };
        draw(&mut screen, &state)?;
        loop {
            tokio::select! {
                _ = sigterm.recv() => break RunEnd::Interrupted,
                _ = sigint.recv() => break RunEnd::Interrupted,
                _ = sighup.recv() => break RunEnd::Interrupted,
                _ = tick.tick() => {}
            }
            if let Some(end) = recorder.tick() {
                break end;
            }
            let mut quit = false;
            let mut changed = false;
            while event::poll(Duration::ZERO).map_err(anyhow::Error::from)? {
                match event::read().map_err(anyhow::Error::from)? {
                    Event::Key(key) => {
                        quit |= state.key(key);
                        changed = true;
                    }
                    Event::Resize(..) => changed = true,
                    _ => {}
                }
            }
            if quit {
                break RunEnd::Completed;
            }
            if std::time::Instant::now() >= next_refresh {
                let window = recorder.take_window(&mut symbolizer, &request.options)?;
                state.add_window(&window, started.elapsed());
                next_refresh += REFRESH;
                // Behind by more than an interval (a slow first symbolization): start afresh.
                if next_refresh < std::time::Instant::now() {
                    next_refresh = std::time::Instant::now() + REFRESH;
                }
                let (entries, files) = symbolizer.cache_sizes();
                if entries > crate::agent::MAX_SYMBOL_CACHE
                    || files > crate::agent::MAX_SYMBOL_FILES
                {
                    symbolizer.forget();
                }
                changed = true;
            }
            if changed {
                draw(&mut screen, &state)?;
            }
        }
    };
    let (_, outcome) = recorder.finish(end)?;
    // Said again where it stays once the screen is gone.
    for said in &state.python_unsupported {
        eprintln!("bpfprof top: {}", crate::cli::terminal::escape(said));
    }
    let samples = state.since_start[0].samples;
    let elapsed = started.elapsed().as_secs_f64();
    Ok(match (outcome, end) {
        (Some(CommandOutcome::Exited(status)), _) => {
            eprintln!(
                "bpfprof top: the command ended ({status}) after {elapsed:.1}s; {samples} samples"
            );
            CommandOutcome::exit_code(status)
        }
        (_, RunEnd::Interrupted) => exit_code::INTERRUPTED,
        (_, RunEnd::TargetExited) => {
            eprintln!("bpfprof top: the targets exited after {elapsed:.1}s; {samples} samples");
            exit_code::OK
        }
        _ => exit_code::OK,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::fixture;
    use ratatui::{backend::TestBackend, Terminal};

    /// Two windows of the fixture: shares are per interval and summed since the start; keys
    /// re-sort; the view fits 80x24 with the hottest function on the first row.
    #[test]
    fn windows_sum_since_start_and_keys_resort() {
        let profile = fixture::profile();
        let mut state = TopState::new("pid 1".into(), "cpu-clock 99 Hz".into(), false);
        state.add_window(&profile, Duration::from_secs(1));
        state.add_window(&profile, Duration::from_secs(2));
        let rows = state.rows();
        let first = &rows[0];
        assert_eq!(first.interval_self, first.start_self);
        assert!(first.interval_self > 0.0);
        assert_eq!(state.since_start[0].samples, 2 * profile.total_samples());
        let press = |c| KeyEvent::new(KeyCode::Char(c), KeyModifiers::NONE);
        assert!(!state.key(press('t')));
        let by_total = state.rows();
        assert!(by_total
            .windows(2)
            .all(|w| w[0].interval_total >= w[1].interval_total));
        assert!(state.key(press('q')));
        assert!(state.key(KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL)));

        let mut terminal = Terminal::new(TestBackend::new(80, 24)).unwrap();
        terminal.draw(|f| render(f, &state)).unwrap();
        let screen: Vec<String> = terminal
            .backend()
            .buffer()
            .content
            .chunks(80)
            .map(|cells| cells.iter().map(|c| c.symbol()).collect())
            .collect();
        assert!(screen[0].starts_with("bpfprof top: pid 1"), "{screen:#?}");
        assert!(screen[4].contains(&by_total[0].function), "{screen:#?}");
    }
}
