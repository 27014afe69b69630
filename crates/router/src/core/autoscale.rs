//! The autoscaler's policy: from a model's load over time to a worker
//! count. Pure: it sees samples with their time and answers a target.

use std::{collections::HashMap, time::Instant};

use crate::AutoscaleConfig;

/// One look at a model's load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sample {
    /// Workers serving it (not draining).
    pub(crate) workers: u32,
    /// Its requests waiting: in the router queue and inside its workers.
    pub(crate) waiting: u64,
    /// Whether one of its workers has nothing in flight.
    pub(crate) idle_worker: bool,
}

/// Per-model windows of sustained load and idleness.
#[derive(Default)]
pub(crate) struct Autoscaler {
    models: HashMap<String, Windows>,
}

#[derive(Default)]
struct Windows {
    busy_since: Option<Instant>,
    idle_since: Option<Instant>,
}

impl Autoscaler {
    /// A new worker count for `model`, when its load calls for one: one
    /// more after the queue stayed above the threshold for `up_window`,
    /// one fewer after `idle_window` with nothing waiting and a worker
    /// idle, always within `min_workers..=max_workers`. A decision restarts
    /// its window, so counts move one step per window.
    pub(crate) fn observe(
        &mut self,
        config: &AutoscaleConfig,
        now: Instant,
        model: &str,
        sample: Sample,
    ) -> Option<u32> {
        let windows = self.models.entry(model.to_string()).or_default();
        if sample.workers < config.min_workers {
            *windows = Windows::default();
            return Some(config.min_workers);
        }
        let busy =
            sample.waiting as f64 > config.queue_per_worker * f64::from(sample.workers.max(1));
        if busy {
            windows.idle_since = None;
            let since = *windows.busy_since.get_or_insert(now);
            if now.saturating_duration_since(since) >= config.up_window
                && sample.workers < config.max_workers
            {
                windows.busy_since = Some(now);
                return Some(sample.workers + 1);
            }
            return None;
        }
        windows.busy_since = None;
        if sample.waiting == 0 && sample.idle_worker {
            let since = *windows.idle_since.get_or_insert(now);
            if now.saturating_duration_since(since) >= config.idle_window
                && sample.workers > config.min_workers
            {
                windows.idle_since = Some(now);
                return Some(sample.workers - 1);
            }
        } else {
            windows.idle_since = None;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn config() -> AutoscaleConfig {
        AutoscaleConfig {
            min_workers: 1,
            max_workers: 3,
            queue_per_worker: 2.0,
            up_window: Duration::from_secs(10),
            idle_window: Duration::from_secs(30),
        }
    }

    /// Runs the policy over `seconds` of one sample per second, applying
    /// each decision, and returns the worker count after each second.
    fn run(
        scaler: &mut Autoscaler,
        start: Instant,
        workers: &mut u32,
        seconds: std::ops::Range<u64>,
        load: impl Fn(u32) -> (u64, bool),
    ) -> Vec<u32> {
        let config = config();
        seconds
            .map(|s| {
                let (waiting, idle_worker) = load(*workers);
                let sample = Sample {
                    workers: *workers,
                    waiting,
                    idle_worker,
                };
                if let Some(target) =
                    scaler.observe(&config, start + Duration::from_secs(s), "m", sample)
                {
                    *workers = target;
                }
                *workers
            })
            .collect()
    }

    #[test]
    fn a_burst_adds_workers_one_window_at_a_time_up_to_max() {
        let (mut scaler, start, mut workers) = (Autoscaler::default(), Instant::now(), 1);
        let counts = run(&mut scaler, start, &mut workers, 0..40, |_| (50, false));
        // Nothing before the window is full, then +1 per window, capped at 3.
        assert_eq!(counts[9], 1);
        assert_eq!(counts[10], 2);
        assert_eq!(counts[19], 2);
        assert_eq!(counts[20], 3);
        assert_eq!(*counts.last().unwrap(), 3);
    }

    #[test]
    fn a_short_spike_changes_nothing() {
        let (mut scaler, start, mut workers) = (Autoscaler::default(), Instant::now(), 1);
        let counts = run(&mut scaler, start, &mut workers, 0..30, |_| (0, false));
        assert!(counts.iter().all(|&n| n == 1));
        let spiky = run(&mut scaler, start, &mut workers, 30..60, |_| (0, false));
        assert!(spiky.iter().all(|&n| n == 1));
        // Busy 9 s, calm 1 s, busy 9 s: each busy stretch is shorter than
        // the window, which restarts after the calm second.
        let pattern = [true; 9].into_iter().chain([false]).chain([true; 9]);
        for (t, busy) in (60..).zip(pattern) {
            let load = if busy { 50 } else { 1 };
            run(&mut scaler, start, &mut workers, t..t + 1, |_| {
                (load, false)
            });
        }
        assert_eq!(workers, 1);
    }

    #[test]
    fn idleness_removes_workers_down_to_min() {
        let (mut scaler, start, mut workers) = (Autoscaler::default(), Instant::now(), 3);
        let counts = run(&mut scaler, start, &mut workers, 0..100, |_| (0, true));
        assert_eq!(counts[29], 3);
        assert_eq!(counts[30], 2);
        assert_eq!(counts[60], 1);
        assert_eq!(*counts.last().unwrap(), 1);
    }

    #[test]
    fn busy_workers_are_not_idle_and_min_is_restored() {
        let (mut scaler, start, mut workers) = (Autoscaler::default(), Instant::now(), 2);
        // Nothing waiting but every worker busy: no scale-in.
        let counts = run(&mut scaler, start, &mut workers, 0..100, |_| (0, false));
        assert!(counts.iter().all(|&n| n == 2));
        // Below min (a worker died): back to min at once.
        let mut none = 0;
        run(&mut scaler, start, &mut none, 100..101, |_| (0, false));
        assert_eq!(none, 1);
    }
}
