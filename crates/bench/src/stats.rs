//! Latency summaries.
//!
//! Percentiles use linear interpolation between closest ranks (numpy's
//! default, "type 7" in Hyndman and Fan): for `n` sorted samples the p-th
//! percentile sits at rank `p / 100 * (n - 1)`, and a fractional rank
//! interpolates between its two neighbours. vLLM's `benchmark_serving`
//! computes its percentiles the same way, so figures compare directly.

use serde::{Deserialize, Serialize};

/// Mean and tail percentiles of one latency, in seconds. `count` is 0 (and
/// every figure 0) when no request produced a sample.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Summary {
    /// Samples summarised.
    pub(crate) count: u64,
    /// Arithmetic mean.
    pub(crate) mean: f64,
    /// Median.
    pub(crate) p50: f64,
    /// 90th percentile.
    pub(crate) p90: f64,
    /// 99th percentile.
    pub(crate) p99: f64,
}

impl Summary {
    /// Summarises `samples` (any order; non-finite values are dropped so a
    /// clock glitch cannot poison the report).
    pub(crate) fn of(samples: &[f64]) -> Summary {
        let mut sorted: Vec<f64> = samples.iter().copied().filter(|x| x.is_finite()).collect();
        if sorted.is_empty() {
            return Summary::default();
        }
        sorted.sort_by(f64::total_cmp);
        let mean = sorted.iter().sum::<f64>() / sorted.len() as f64;
        Summary {
            count: sorted.len() as u64,
            mean,
            p50: percentile(&sorted, 50.0),
            p90: percentile(&sorted, 90.0),
            p99: percentile(&sorted, 99.0),
        }
    }
}

/// The `p`-th percentile (0..=100) of ascending `sorted` samples, by linear
/// interpolation between closest ranks. `sorted` must not be empty.
pub(crate) fn percentile(sorted: &[f64], p: f64) -> f64 {
    let last = sorted.len().saturating_sub(1);
    let rank = (p.clamp(0.0, 100.0) / 100.0) * last as f64;
    let lo = rank.floor() as usize;
    let hi = rank.ceil() as usize;
    let (Some(a), Some(b)) = (sorted.get(lo), sorted.get(hi)) else {
        return f64::NAN;
    };
    a + (b - a) * (rank - lo as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn percentiles_of_one_to_ten_match_numpy() {
        // numpy.percentile(range(1, 11), [50, 90, 99]) == [5.5, 9.1, 9.91]
        let data: Vec<f64> = (1..=10).map(f64::from).collect();
        assert!(close(percentile(&data, 50.0), 5.5));
        assert!(close(percentile(&data, 90.0), 9.1));
        assert!(close(percentile(&data, 99.0), 9.91));
        assert!(close(percentile(&data, 0.0), 1.0));
        assert!(close(percentile(&data, 100.0), 10.0));
    }

    #[test]
    fn summary_sorts_its_input_and_drops_non_finite_samples() {
        // numpy.percentile([0.1, 0.2, 0.4, 0.8, 1.6], [50, 90, 99])
        //   == [0.4, 1.28, 1.568]
        let summary = Summary::of(&[1.6, 0.4, f64::NAN, 0.1, 0.8, 0.2, f64::INFINITY]);
        assert_eq!(summary.count, 5);
        assert!(close(summary.mean, 0.62));
        assert!(close(summary.p50, 0.4));
        assert!(close(summary.p90, 1.28));
        assert!(close(summary.p99, 1.568));
    }

    #[test]
    fn one_sample_is_every_percentile_and_none_is_all_zero() {
        let one = Summary::of(&[0.25]);
        assert_eq!((one.count, one.p50, one.p99), (1, 0.25, 0.25));
        assert_eq!(Summary::of(&[]), Summary::default());
    }
}
