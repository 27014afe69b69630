//! The live progress display, on stderr so `--json` output stays clean.

use std::{
    io::IsTerminal,
    time::{Duration, Instant},
};

use indicatif::{ProgressBar, ProgressStyle};

use super::driver::Progress;

/// How often the plain-text fallback prints a line.
const LINE_EVERY: Duration = Duration::from_secs(5);

/// A bar on a terminal, a line every few seconds when forced on elsewhere,
/// or nothing.
#[derive(Debug)]
pub(crate) enum Display {
    /// No display.
    Off,
    /// An indicatif bar over requests (count budget) or seconds (time budget).
    Bar {
        /// The bar.
        bar: ProgressBar,
        /// Whether the bar counts seconds rather than requests.
        by_time: bool,
        /// When the run started.
        start: Instant,
    },
    /// Plain lines, for `--progress` when stderr is not a terminal.
    Lines {
        /// Label of the run.
        label: String,
        /// When the run started.
        start: Instant,
        /// When the last line was printed.
        last: Instant,
    },
}

impl Display {
    /// A display for a run labelled `label`; `forced` is `--progress`
    /// (`Some(true)`) or `--no-progress` (`Some(false)`), `None` shows a bar
    /// only when stderr is a terminal.
    pub(crate) fn new(
        label: &str,
        forced: Option<bool>,
        max_requests: Option<usize>,
        duration: Option<Duration>,
    ) -> Display {
        let terminal = std::io::stderr().is_terminal();
        let start = Instant::now();
        match (forced, terminal) {
            (Some(false), _) | (None, false) => Display::Off,
            (Some(true), false) => Display::Lines {
                label: label.into(),
                start,
                last: start,
            },
            (_, true) => {
                let (len, by_time) = match (max_requests, duration) {
                    (Some(n), _) => (n as u64, false),
                    (None, Some(d)) => (d.as_secs().max(1), true),
                    (None, None) => (0, false),
                };
                let bar = ProgressBar::new(len);
                let unit = if by_time { "s" } else { "req" };
                let template = format!(
                    "{label} {{elapsed_precise}} [{{wide_bar}}] {{pos}}/{{len}} {unit} {{msg}}"
                );
                if let Ok(style) = ProgressStyle::with_template(&template) {
                    bar.set_style(style);
                }
                Display::Bar {
                    bar,
                    by_time,
                    start,
                }
            }
        }
    }

    /// Shows the latest counts.
    pub(crate) fn update(&mut self, progress: Progress) {
        let message = format!(
            "done {} failed {} in flight {}",
            progress.completed, progress.failed, progress.in_flight
        );
        match self {
            Display::Off => {}
            Display::Bar {
                bar,
                by_time,
                start,
            } => {
                let position = if *by_time {
                    start.elapsed().as_secs()
                } else {
                    (progress.completed + progress.failed) as u64
                };
                bar.set_position(position.min(bar.length().unwrap_or(u64::MAX)));
                bar.set_message(message);
            }
            Display::Lines { label, start, last } => {
                if last.elapsed() >= LINE_EVERY {
                    *last = Instant::now();
                    eprintln!("{label} [{:.0}s] {message}", start.elapsed().as_secs_f64());
                }
            }
        }
    }

    /// Removes the bar.
    pub(crate) fn finish(self) {
        if let Display::Bar { bar, .. } = self {
            bar.finish_and_clear();
        }
    }
}
