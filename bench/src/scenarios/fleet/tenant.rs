//! The account-contention pattern's other tenant: another workload of the same AWS account whose
//! EC2 calls draw from the same per-API buckets as the fleet's. EC2's buckets are per account and
//! Region, so a second cluster, a CI job or a batch system scaling at the same time leaves the fleet
//! only part of each bucket.
//!
//! The tenant spends each of [`TENANT_APIS`]' buckets through mockcloud
//! ([`MockCloud::spend_tokens`]): its calls take tokens exactly as the daemons' calls do, and the
//! buckets keep their sizes. At the pattern's start it has spent [`TENANT_SHARE`] of each burst. After
//! that it calls at that share of each refill rate. A call the bucket throttles spends nothing and is
//! owed: the tenant makes it again at a later tick, as an SDK client retries. Over the window it
//! therefore spends its share of the refill, unless the fleet holds a bucket empty throughout.

use std::time::Duration;

use mockcloud::{MockCloud, Throttling};
use tokio::time::{Instant, MissedTickBehavior};

use super::traffic::{Pattern, TENANT_APIS};

/// The share of each bucket's burst spent before the pattern, and of its refill rate during it.
pub const TENANT_SHARE: f64 = 0.5;
/// How often the tenant makes the calls it owes (a call when a whole one is owed: every 400 ms at
/// half of a 5/s refill).
const TICK: Duration = Duration::from_millis(100);

/// The buckets the fleet has to itself in `pattern`: EC2's table, less the tenant's share of
/// [`TENANT_APIS`]' bursts and refill rates in account-contention. The account bound uses these.
pub fn buckets_left(pattern: Pattern) -> Throttling {
    let full = Throttling::default();
    if !pattern.has_tenant() {
        return full;
    }
    let mut left = full.clone();
    for api in TENANT_APIS {
        let mut b = full.bucket(api);
        b.capacity *= 1.0 - TENANT_SHARE;
        b.refill_per_sec *= 1.0 - TENANT_SHARE;
        left = left.with(api, b);
    }
    left
}

/// Spends the tenant's share of each bucket of `mock`'s throttling from now on: the burst share at
/// once, then the refill share, until the task is aborted.
pub async fn spend(mock: MockCloud) {
    let (throttling, _) = mock.throttling();
    let mut owed: Vec<f64> = TENANT_APIS
        .iter()
        .map(|api| (throttling.bucket(api).capacity * TENANT_SHARE).floor())
        .collect();
    let rates: Vec<f64> = TENANT_APIS
        .iter()
        .map(|api| throttling.bucket(api).refill_per_sec * TENANT_SHARE)
        .collect();
    let mut ticks = tokio::time::interval_at(Instant::now(), TICK);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut last = Instant::now();
    loop {
        let now = ticks.tick().await;
        let dt = (now - last).as_secs_f64();
        last = now;
        for ((api, owe), rate) in TENANT_APIS.iter().zip(&mut owed).zip(&rates) {
            *owe += rate * dt;
            let calls = owe.floor() as u32;
            if calls == 0 {
                continue;
            }
            let spent = mock
                .spend_tokens(api, calls)
                .expect("TENANT_APIS are buckets mockcloud has");
            *owe -= f64::from(spent);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bucket's tokens now.
    fn tokens(mock: &MockCloud, bucket: &str) -> f64 {
        mock.throttling()
            .1
            .into_iter()
            .find(|l| l.bucket == bucket)
            .map(|l| l.tokens)
            .expect("a bucket mockcloud has")
    }

    #[test]
    fn the_bound_sees_half_of_each_growth_bucket_in_account_contention_only() {
        let left = buckets_left(Pattern::AccountContention);
        let full = Throttling::default();
        for api in TENANT_APIS {
            let (l, f) = (left.bucket(api), full.bucket(api));
            assert_eq!(l.capacity, f.capacity / 2.0, "{api}");
            assert_eq!(l.refill_per_sec, f.refill_per_sec / 2.0, "{api}");
        }
        assert_eq!(
            left.bucket("DescribeNetworkInterfaces"),
            full.bucket("DescribeNetworkInterfaces")
        );
        assert_eq!(buckets_left(Pattern::ScaleUp), full);
        assert_eq!(buckets_left(Pattern::NodeBoot), full);
    }

    #[tokio::test(start_paused = true)]
    async fn the_tenant_spends_half_the_burst_then_half_the_refill_through_the_buckets() {
        let mock = MockCloud::start(mockcloud::Config::fast()).await.unwrap();
        mock.set_throttling(Throttling::default());
        let tenant = tokio::spawn(spend(mock.clone()));
        tokio::time::sleep(Duration::from_millis(1)).await;
        // Half of each burst gone at once: Assign 100 → 50, Attach (mutating, 50) → 25.
        let assign = tokens(&mock, "AssignPrivateIpAddresses");
        assert!((50.0..50.1).contains(&assign), "{assign}");
        let attach = tokens(&mock, "AttachNetworkInterface");
        assert!((25.0..25.1).contains(&attach), "{attach}");
        assert_eq!(tokens(&mock, "CreateTags"), 100.0, "not a growth API");
        // Ten seconds: 5/s refill, 2.5/s spent, so 25 more (within one call of the tick).
        tokio::time::sleep(Duration::from_secs(10)).await;
        let assign = tokens(&mock, "AssignPrivateIpAddresses");
        assert!((74.0..76.1).contains(&assign), "{assign}");
        // Someone else empties the bucket: the next call is throttled and the tenant's calls are
        // owed; as the bucket refills, the tenant takes its share of it again.
        let took = mock.spend_tokens("AssignPrivateIpAddresses", 1000).unwrap();
        assert!((74..=76).contains(&took), "{took}");
        assert_eq!(mock.spend_tokens("AssignPrivateIpAddresses", 1), Ok(0));
        tokio::time::sleep(Duration::from_secs(4)).await;
        // 4 s refill 20 tokens; the tenant took its 10 of them as they came.
        let assign = tokens(&mock, "AssignPrivateIpAddresses");
        assert!((9.0..11.1).contains(&assign), "{assign}");
        tenant.abort();
        // None of it is counted as the fleet's calls.
        assert_eq!(mock.counters().total_calls(), 0);
    }
}
