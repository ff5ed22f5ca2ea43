//! The cloud layer under pressure: a throttling storm with injected 5xx still completes, and the
//! calls that reach EC2 never exceed the configured rates.
//!
//! Both run on tokio's paused clock (issue 45): the limiter, the retries' backoff, the SDK's
//! deadlines and mockcloud's latency, buckets and call log all read tokio's clock, which moves only
//! when nothing is runnable, so a loaded machine slows the test down but cannot change what it
//! measures (calls bunched by a slow scheduler, deadlines missed while waiting for a CPU).

mod cloud_support;

use std::sync::Arc;
use std::time::Duration;

use eniipam::cloud::Cloud;
use eniipam::cloud::calls::Outcome;
use eniipam::cloud::limiter::{BackoffPolicy, BucketConfig, LimiterConfig, RateLimitConfig};
use mockcloud::{Bucket, Fault, Throttling};

use cloud_support::*;

#[tokio::test(start_paused = true)]
async fn a_throttling_storm_with_5xx_still_completes_the_sequence() {
    let mut mock_config = mockcloud::Config::fast();
    // A tiny budget on every API: most of a burst is answered RequestLimitExceeded. EC2 (and
    // mockcloud) keep one bucket per API, so the two sequences collide only on the same API: one token
    // each, refilled at 2/s (mutating) and 4/s (describe).
    mock_config.throttling = Throttling::uniform(Bucket::new(1.0, 2.0), Bucket::new(1.0, 4.0));
    let limiter = LimiterConfig {
        retry: BackoffPolicy {
            base: Duration::from_millis(10),
            cap: Duration::from_millis(200),
            max_attempts: 30,
            max_elapsed: Duration::from_secs(8),
        },
        ..fast_limiter()
    };
    let env = Env::start_with(mock_config, limiter, Duration::from_millis(500)).await;
    env.mock
        .inject_fault(Fault::rate(None, "InternalError", 0.2));
    // At least one 5xx whatever the dice say (a sequence reaches EC2 a dozen times or so).
    env.mock
        .inject_fault(Fault::error("CreateNetworkInterface", "InternalError", 1));

    let start = tokio::time::Instant::now();
    // Two ENIs' worth of work at once (m5.large takes two secondary ENIs), so calls collide.
    tokio::join!(sequence(&env, 1), sequence(&env, 2));
    assert!(start.elapsed() < Duration::from_secs(20));

    let snap = env.stats.snapshot();
    let counters = env.mock.counters();
    assert!(
        counters.total_throttled() > 0,
        "the mock throttled: {counters:?}"
    );
    assert!(snap.total(Outcome::Throttled) > 0);
    assert!(snap.total(Outcome::Transient) > 0, "5xx were seen");
    assert!(
        snap.total_retries() >= snap.total(Outcome::Throttled),
        "every throttle was retried: {snap:?}"
    );
    assert_eq!(snap.total(Outcome::Rejected), 0, "{snap:?}");
    // A storm, not a drizzle: a large share of what reached EC2 was throttled or failed.
    let failed: u64 = counters.total_throttled()
        + counters
            .actions
            .values()
            .map(|c| c.errors.values().sum::<u64>())
            .sum::<u64>();
    assert!(
        failed * 4 >= counters.total_calls(),
        "{failed} of {} calls failed",
        counters.total_calls()
    );
}

/// Create+attach, three assigns, an unassign, detach+delete; checks the ENI's IPs in EC2.
async fn sequence(env: &Env, device_index: u32) {
    let lc = env.lifecycle(fast_lifecycle());
    let eni = lc
        .create_and_attach(2, device_index)
        .await
        .expect("create_and_attach through the storm");
    let mut assigned = Vec::new();
    for n in [2, 3, 1] {
        let ips = env
            .cloud
            .assign_ips(&eni.id, n)
            .await
            .expect("assign through the storm");
        assert_eq!(ips.len(), n as usize);
        assigned.extend(ips);
    }
    env.cloud
        .unassign_ips(&eni.id, &assigned[..3])
        .await
        .expect("unassign through the storm");
    let view = env
        .mock
        .network_interfaces()
        .into_iter()
        .find(|e| e.id == eni.id.as_str())
        .unwrap();
    assert_eq!(
        view.secondary_ips.len(),
        2 + 6 - 3,
        "no IP assigned twice or lost"
    );
    lc.detach_and_delete(&eni)
        .await
        .expect("detach and delete through the storm");
    assert!(!env.eni_ids().contains(&eni.id.to_string()));
}

#[tokio::test(start_paused = true)]
async fn calls_reaching_ec2_never_exceed_the_configured_rate() {
    const MUT_QPS: f64 = 10.0;
    const MUT_BURST: u32 = 3;
    const DESC_QPS: f64 = 25.0;
    const DESC_BURST: u32 = 5;
    let limiter = LimiterConfig {
        rates: RateLimitConfig {
            mutating: BucketConfig {
                qps: MUT_QPS,
                burst: MUT_BURST,
            },
            describe: BucketConfig {
                qps: DESC_QPS,
                burst: DESC_BURST,
            },
        },
        ..fast_limiter()
    };
    // A per-call deadline far above the mock's latency: a timed-out call the mock had served would
    // reach EC2 again as a retry, which is the deadline's business (tests/cloud_ec2.rs), not the
    // limiter's.
    let env = Env::start_with(mockcloud::Config::fast(), limiter, Duration::from_secs(10)).await;
    // Let the buckets fill after the setup calls, then start counting.
    tokio::time::sleep(Duration::from_millis(400)).await;
    env.mock.reset_counters();
    let cloud = env.cloud.clone();
    let subnet = env.node.subnet_id.clone();
    let eni = env.instance.primary_eni.clone();
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::new();
    for i in 0..40 {
        let describer = cloud.clone();
        let subnet = subnet.clone();
        tasks.push(tokio::spawn(async move {
            describer.describe_subnet(&subnet).await.map(|_| ())
        }));
        if i % 2 == 0 {
            let cloud = Arc::clone(&cloud);
            let eni = eni.clone();
            tasks.push(tokio::spawn(async move {
                cloud
                    .create_tags(&eni, &tag_map(&[("n", &i.to_string())]))
                    .await
            }));
        }
    }
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    let took = start.elapsed();
    // 20 mutating at 10/s after a burst of 3 needs ≥ 1.7 s; 40 describes at 25/s after 5, ≥ 1.4 s.
    // On the paused clock CPU time costs nothing: the limiter's waits are all the time there is, so
    // it also holds calls no longer than the rate asks (plus the mock's latency).
    assert!(took >= Duration::from_millis(1600), "{took:?}");
    assert!(took < Duration::from_millis(2500), "{took:?}");

    let log = env.mock.call_log();
    for (action, qps, burst) in [
        ("CreateTags", MUT_QPS, MUT_BURST),
        ("DescribeSubnets", DESC_QPS, DESC_BURST),
    ] {
        let times: Vec<f64> = log
            .iter()
            .filter(|r| r.action == action)
            .map(|r| r.at_ms)
            .collect();
        assert_eq!(times.len(), if action == "CreateTags" { 20 } else { 40 });
        for i in 0..times.len() {
            for j in i..times.len() {
                let n = (j - i + 1) as f64;
                let window_s = (times[j] - times[i]) / 1000.0;
                // Slack for the transport: arrival order at the mock can differ slightly from grant
                // order (one call). No slack for a loaded machine: on the paused clock calls
                // granted apart arrive apart. An unlimited client would put all 20 or 40 calls at
                // one instant, far beyond it.
                assert!(
                    n <= burst as f64 + qps * window_s + 1.0,
                    "{action}: {n} calls in {window_s:.3}s exceeds burst {burst} + {qps}/s"
                );
            }
        }
    }
    let snap = env.stats.snapshot();
    assert!(
        snap.limiter_waits["mutating"].sum > Duration::from_millis(1000),
        "{snap:?}"
    );
    assert_eq!(env.mock.counters().total_throttled(), 0);
}
