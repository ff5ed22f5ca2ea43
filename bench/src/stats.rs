//! Statistics over measured samples: nearest-rank percentiles, summaries, and the median of a
//! per-run statistic across runs.

use std::time::Duration;

/// A duration in milliseconds, the unit latency samples are kept in.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The `p`-th percentile (0 ≤ p ≤ 100) of `samples` by the nearest-rank method: the smallest sample
/// with at least `p` % of the samples at or below it (p = 0 gives the minimum). `None` when empty or
/// when `p` is out of range or NaN.
pub fn percentile(samples: &[f64], p: f64) -> Option<f64> {
    if samples.is_empty() || !(0.0..=100.0).contains(&p) {
        return None;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    Some(percentile_sorted(&sorted, p))
}

/// [`percentile`] on an already sorted, non-empty slice.
fn percentile_sorted(sorted: &[f64], p: f64) -> f64 {
    let n = sorted.len();
    let rank = ((p / 100.0) * n as f64).ceil() as usize;
    sorted[rank.clamp(1, n) - 1]
}

/// The median: the mean of the two middle samples for an even count.
pub fn median(samples: &[f64]) -> Option<f64> {
    if samples.is_empty() {
        return None;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    Some(if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    })
}

/// Summary of one distribution.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    pub n: usize,
    pub min: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
    pub mean: f64,
}

impl Summary {
    /// `None` for no samples.
    pub fn of(samples: &[f64]) -> Option<Self> {
        if samples.is_empty() {
            return None;
        }
        let mut sorted = samples.to_vec();
        sorted.sort_by(f64::total_cmp);
        Some(Self {
            n: sorted.len(),
            min: sorted[0],
            p50: median(&sorted).expect("non-empty"),
            p90: percentile_sorted(&sorted, 90.0),
            p99: percentile_sorted(&sorted, 99.0),
            max: sorted[sorted.len() - 1],
            mean: sorted.iter().sum::<f64>() / sorted.len() as f64,
        })
    }
}

/// A statistic computed once per run, summarised across runs: the median run's value and the range.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AcrossRuns {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub runs: usize,
}

impl AcrossRuns {
    /// `per_run` holds one value per run; `None` when there were no runs.
    pub fn of(per_run: &[f64]) -> Option<Self> {
        Some(Self {
            median: median(per_run)?,
            min: per_run.iter().copied().fold(f64::INFINITY, f64::min),
            max: per_run.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            runs: per_run.len(),
        })
    }

    /// As the tables print it: `fmt` of the median run, and ` [min – max]` after it when the runs
    /// differ (one run, or runs that agree, print the figure alone).
    pub fn shown(&self, fmt: impl Fn(f64) -> String) -> String {
        let (min, max) = (fmt(self.min), fmt(self.max));
        if self.runs > 1 && min != max {
            format!("{} [{min} – {max}]", fmt(self.median))
        } else {
            fmt(self.median)
        }
    }

    /// Applies `stat` to each run's samples and summarises.
    pub fn of_runs(runs: &[Vec<f64>], stat: impl Fn(&[f64]) -> Option<f64>) -> Option<Self> {
        let per_run: Vec<f64> = runs.iter().filter_map(|r| stat(r)).collect();
        Self::of(&per_run)
    }

    /// The `p`-th percentile of each run's samples, summarised across runs; `p` = 50 takes each
    /// run's [`median`] (the mean of the two middle samples for an even count), as the p50 rows do.
    pub fn percentile_of_runs(runs: &[Vec<f64>], p: f64) -> Option<Self> {
        Self::of_runs(runs, |xs| {
            if p == 50.0 {
                median(xs)
            } else {
                percentile(xs, p)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let xs: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&xs, 50.0), Some(50.0));
        assert_eq!(percentile(&xs, 99.0), Some(99.0));
        assert_eq!(percentile(&xs, 99.5), Some(100.0));
        assert_eq!(percentile(&xs, 100.0), Some(100.0));
        assert_eq!(percentile(&xs, 0.0), Some(1.0));
        assert_eq!(percentile(&xs, 1.0), Some(1.0));
        assert_eq!(percentile(&xs, 1.5), Some(2.0));
        // The classic textbook example (15, 20, 35, 40, 50).
        let ys = [40.0, 15.0, 50.0, 35.0, 20.0];
        assert_eq!(percentile(&ys, 5.0), Some(15.0));
        assert_eq!(percentile(&ys, 30.0), Some(20.0));
        assert_eq!(percentile(&ys, 40.0), Some(20.0));
        assert_eq!(percentile(&ys, 50.0), Some(35.0));
        assert_eq!(percentile(&ys, 100.0), Some(50.0));
    }

    #[test]
    fn percentile_edge_cases() {
        assert_eq!(percentile(&[], 50.0), None);
        assert_eq!(percentile(&[3.0], 0.0), Some(3.0));
        assert_eq!(percentile(&[3.0], 99.0), Some(3.0));
        assert_eq!(percentile(&[1.0, 2.0], -1.0), None);
        assert_eq!(percentile(&[1.0, 2.0], 100.1), None);
        assert_eq!(percentile(&[1.0, 2.0], f64::NAN), None);
        // A percentile is always one of the samples, and monotone in p.
        let xs = [5.0, 1.0, 9.0, 3.0, 7.0, 7.0, 2.0];
        let mut last = f64::NEG_INFINITY;
        for p in 0..=100 {
            let v = percentile(&xs, f64::from(p)).unwrap();
            assert!(xs.contains(&v));
            assert!(v >= last);
            last = v;
        }
    }

    #[test]
    fn medians() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[4.0]), Some(4.0));
        assert_eq!(median(&[4.0, 1.0, 3.0]), Some(3.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
    }

    #[test]
    fn summary_of_a_distribution() {
        let xs: Vec<f64> = (1..=1000).rev().map(f64::from).collect();
        let s = Summary::of(&xs).unwrap();
        assert_eq!(s.n, 1000);
        assert_eq!(s.min, 1.0);
        assert_eq!(s.max, 1000.0);
        assert_eq!(s.p50, 500.5);
        assert_eq!(s.p90, 900.0);
        assert_eq!(s.p99, 990.0);
        assert!((s.mean - 500.5).abs() < 1e-9);
        assert_eq!(Summary::of(&[]), None);
    }

    #[test]
    fn across_runs_takes_the_median_run() {
        let runs = vec![
            vec![1.0, 2.0, 3.0],
            vec![10.0, 20.0, 30.0],
            vec![5.0, 6.0, 7.0],
        ];
        let a = AcrossRuns::of_runs(&runs, median).unwrap();
        assert_eq!((a.median, a.min, a.max, a.runs), (6.0, 2.0, 20.0, 3));
        assert_eq!(AcrossRuns::of(&[]), None);
        let one = AcrossRuns::of(&[4.0]).unwrap();
        assert_eq!((one.median, one.min, one.max), (4.0, 4.0, 4.0));
    }

    #[test]
    fn runs_are_shown_as_their_median_and_range_and_one_run_as_its_figure_alone() {
        let secs = |v: f64| format!("{v:.1}");
        let three = AcrossRuns::of(&[93.0, 86.5, 104.2]).unwrap();
        assert_eq!(three.shown(secs), "93.0 [86.5 – 104.2]");
        assert_eq!(AcrossRuns::of(&[93.0]).unwrap().shown(secs), "93.0");
        // Runs that agree print one figure.
        assert_eq!(AcrossRuns::of(&[4.0, 4.0, 4.0]).unwrap().shown(secs), "4.0");
        // So do runs that differ below the figure's precision.
        assert_eq!(
            AcrossRuns::of(&[4.01, 4.0, 4.04]).unwrap().shown(secs),
            "4.0"
        );
        // Two runs: the median is their mean.
        assert_eq!(
            AcrossRuns::of(&[1.0, 2.0]).unwrap().shown(secs),
            "1.5 [1.0 – 2.0]"
        );
    }
}
