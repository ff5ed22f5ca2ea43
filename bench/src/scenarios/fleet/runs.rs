//! `--runs N`: every (pattern, policy) pair run N times in one invocation, on the same code, each run
//! on its own seed (`--seed` + run), so the spread says how much a figure moves with the traffic's
//! draw and the simulation's own noise. The tables print each figure's median run and its range
//! [min – max]; with one run they print the figure alone, as before.

use super::harness::PairResult;
use super::policy::Policy;
use super::traffic::Pattern;
use crate::stats::AcrossRuns;

/// Run `run`'s seed (run 0 is `--seed` itself, so `--runs 1` draws what a single run always drew).
pub fn seed_of(base: u64, run: usize) -> u64 {
    base.wrapping_add(run as u64)
}

/// One (pattern, policy) pair's runs, in run order.
#[derive(Clone, Debug)]
pub struct Runs<'a> {
    pub pattern: Pattern,
    pub policy: Policy,
    pub runs: Vec<&'a PairResult>,
}

impl<'a> Runs<'a> {
    /// The first run: the one the plots draw.
    pub fn first(&self) -> &'a PairResult {
        self.runs[0]
    }

    /// `f` of each run, summarised: the median run and the range.
    pub fn across(&self, f: impl Fn(&PairResult) -> f64) -> AcrossRuns {
        let per_run: Vec<f64> = self.runs.iter().map(|r| f(r)).collect();
        AcrossRuns::of(&per_run).expect("a pair has at least one run")
    }
}

/// The results grouped by (pattern, policy), in the order each pair first appears, runs in run
/// order.
pub fn group(results: &[PairResult]) -> Vec<Runs<'_>> {
    let mut groups: Vec<Runs<'_>> = Vec::new();
    for r in results {
        match groups
            .iter_mut()
            .find(|g| g.pattern == r.pattern && g.policy == r.policy)
        {
            Some(g) => g.runs.push(r),
            None => groups.push(Runs {
                pattern: r.pattern,
                policy: r.policy,
                runs: vec![r],
            }),
        }
    }
    for g in &mut groups {
        g.runs.sort_by_key(|r| r.run);
    }
    groups
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::scenarios::fleet::floor::Floor;
    use crate::scenarios::fleet::p;

    /// A pair that measured nothing: what the aggregation's tests fill in.
    fn blank(pattern: Pattern, policy: Policy, run: usize) -> PairResult {
        PairResult {
            tail: Vec::new(),
            pattern,
            policy,
            run,
            seed: 17 + run as u64,
            pods: 0,
            all_done_s: None,
            waits_ms: Vec::new(),
            add_waits_ms: Vec::new(),
            last_wave_waits_ms: Vec::new(),
            unserved: 0,
            retries: 0,
            throttle_retries: 0,
            retry_reasons: Vec::new(),
            release_errors: 0,
            calls: 0,
            mutating: 0,
            throttled: 0,
            free_series: Vec::new(),
            free_mean: 0.0,
            free_end: 0,
            node_series: Vec::new(),
            by_purpose: Vec::new(),
            by_action: Vec::new(),
            start_free: (0, 0),
            start_short: 0,
            min_calls: BTreeMap::new(),
            alternatives: Vec::new(),
            floor: Floor::default(),
            schedulable_s: Vec::new(),
            boot_s: 0.0,
            ran_s: 0.0,
            real_s: 0.0,
        }
    }

    #[test]
    fn run_zero_keeps_the_given_seed() {
        assert_eq!(seed_of(17, 0), 17);
        assert_eq!(seed_of(17, 2), 19);
        assert_eq!(seed_of(u64::MAX, 1), 0);
    }

    /// Runs of a pair are gathered whatever order they finished in, each figure summarised as its
    /// median run and range.
    #[test]
    fn the_runs_of_a_pair_are_grouped_and_summarised() {
        let result = |policy, run, p99_ms: f64, free: f64| {
            let mut r = blank(Pattern::ScaleUp, policy, run);
            r.waits_ms = vec![p99_ms; 10];
            r.free_mean = free;
            r
        };
        let results = vec![
            result(Policy::Eniipam, 1, 86_000.0, 2900.0),
            result(Policy::WarmIp, 0, 98_000.0, 1800.0),
            result(Policy::Eniipam, 0, 93_000.0, 3100.0),
            result(Policy::Eniipam, 2, 104_000.0, 2700.0),
        ];
        let groups = group(&results);
        assert_eq!(groups.len(), 2);
        let ours = &groups[0];
        assert_eq!((ours.policy, ours.runs.len()), (Policy::Eniipam, 3));
        assert_eq!(
            ours.runs.iter().map(|r| r.run).collect::<Vec<_>>(),
            [0, 1, 2]
        );
        assert_eq!(ours.first().run, 0);
        let p99 = ours.across(|r| p(&r.waits_ms, 99.0));
        assert_eq!(
            (p99.median, p99.min, p99.max, p99.runs),
            (93.0, 86.0, 104.0, 3)
        );
        let free = ours.across(|r| r.free_mean);
        assert_eq!((free.median, free.min, free.max), (2900.0, 2700.0, 3100.0));
        // One run: the figure alone.
        let theirs = groups[1].across(|r| r.free_mean);
        assert_eq!((theirs.median, theirs.runs), (1800.0, 1));
        assert_eq!(theirs.shown(|v| format!("{v:.0}")), "1800");
    }
}
