use std::sync::atomic::{AtomicU32, Ordering};

use proptest::prelude::*;

use super::*;
use crate::throttle::ThrottleGate;

fn policy(base_ms: u64, cap_ms: u64, attempts: u32, total_ms: u64) -> BackoffPolicy {
    BackoffPolicy {
        base: Duration::from_millis(base_ms),
        cap: Duration::from_millis(cap_ms),
        max_attempts: attempts,
        max_elapsed: Duration::from_millis(total_ms),
    }
}

proptest! {
    /// GCRA bound: in every window of length t, at most burst + qps × t tokens.
    #[test]
    fn bucket_never_exceeds_burst_plus_rate(
        qps in 0.5f64..50.0, burst in 1u32..30, gaps in proptest::collection::vec(0u64..400, 1..120)
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap();
        rt.block_on(async {
            let bucket = TokenBucket::new("t", BucketConfig { qps, burst }).unwrap();
            let origin = Instant::now();
            let mut grants = Vec::new();
            for gap in gaps {
                tokio::time::advance(Duration::from_millis(gap)).await;
                // Greedy caller: take everything available at this instant.
                while bucket.try_acquire() {
                    grants.push(Instant::now() - origin);
                }
            }
            for (i, start) in grants.iter().enumerate() {
                for (j, end) in grants.iter().enumerate().skip(i) {
                    let n = (j - i + 1) as f64;
                    let t = (*end - *start).as_secs_f64();
                    // The replenish period is whole nanoseconds, rounded down: each grant may
                    // come up to 1 ns early, so n grants span up to n ns less than the exact
                    // rate's (a case found at qps 27.73, burst 12: 362 grants in 12.621 s).
                    let slack = qps * n * 1e-9 + 1e-6;
                    prop_assert!(n <= burst as f64 + qps * t + slack,
                        "{} grants in {}s with qps {} burst {}", n, t, qps, burst);
                }
            }
            Ok(())
        })?;
    }
}

#[tokio::test(start_paused = true)]
async fn acquire_waits_on_tokio_clock() {
    let bucket = TokenBucket::new("t", BucketConfig { qps: 2.0, burst: 3 }).unwrap();
    let start = Instant::now();
    for _ in 0..3 {
        assert_eq!(bucket.acquire().await, Duration::ZERO);
    }
    // The 4th and 5th wait 500 ms each (2 qps).
    let w4 = bucket.acquire().await;
    let w5 = bucket.acquire().await;
    assert_eq!(w4, Duration::from_millis(500));
    assert_eq!(w5, Duration::from_millis(500));
    assert_eq!(start.elapsed(), Duration::from_secs(1));
}

#[tokio::test(start_paused = true)]
async fn concurrent_waiters_are_paced() {
    let bucket = Arc::new(
        TokenBucket::new(
            "t",
            BucketConfig {
                qps: 10.0,
                burst: 1,
            },
        )
        .unwrap(),
    );
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let b = bucket.clone();
        tasks.push(tokio::spawn(async move {
            b.acquire().await;
            Instant::now() - start
        }));
    }
    let mut times = Vec::new();
    for t in tasks {
        times.push(t.await.unwrap());
    }
    times.sort();
    // 1 immediately, then one per 100 ms.
    assert_eq!(*times.last().unwrap(), Duration::from_millis(1900));
    for w in times.windows(2) {
        assert!(w[1] - w[0] >= Duration::from_millis(100) - Duration::from_nanos(1));
    }
}

#[test]
fn bad_configs_are_rejected() {
    assert!(matches!(
        TokenBucket::new("m", BucketConfig { qps: 0.0, burst: 1 }),
        Err(LimiterConfigError::BadQps { .. })
    ));
    assert!(matches!(
        TokenBucket::new(
            "m",
            BucketConfig {
                qps: f64::NAN,
                burst: 1
            }
        ),
        Err(LimiterConfigError::BadQps { .. })
    ));
    assert!(matches!(
        TokenBucket::new("m", BucketConfig { qps: 1.0, burst: 0 }),
        Err(LimiterConfigError::ZeroBurst { .. })
    ));
    let cfg = LimiterConfig {
        retry: BackoffPolicy {
            max_attempts: 0,
            ..Default::default()
        },
        ..Default::default()
    };
    assert!(matches!(
        Limiter::new(&cfg, Arc::new(CallStats::new())),
        Err(LimiterConfigError::ZeroAttempts)
    ));
}

fn limiter(attempts: u32, total_ms: u64) -> Limiter {
    let cfg = LimiterConfig {
        rates: RateLimitConfig {
            mutating: BucketConfig { qps: 5.0, burst: 1 },
            describe: BucketConfig {
                qps: 10.0,
                burst: 20,
            },
        },
        per_api: BTreeMap::new(),
        retry: policy(100, 1_000, attempts, total_ms),
    };
    Limiter::new(&cfg, Arc::new(CallStats::new())).unwrap()
}

/// The pause `api`'s throttle gate holds now.
fn pause(l: &Limiter, api: &'static str) -> Duration {
    l.gate(api).state.lock().unwrap().pause
}

fn throttled() -> CloudError {
    CloudError::Throttled {
        api: "AssignPrivateIpAddresses".into(),
        code: "RequestLimitExceeded".into(),
    }
}

#[tokio::test(start_paused = true)]
async fn a_throttle_pauses_every_call_of_its_api_on_the_node() {
    let l = limiter(1, 60_000);
    let r: CloudResult<()> = l
        .attempt("AssignPrivateIpAddresses", CallClass::Mutating, async {
            Err(throttled())
        })
        .await;
    assert!(r.is_err());
    // EC2 evaluates each API on its own bucket: another API, mutating or not, does not wait.
    let t = Instant::now();
    l.attempt("DescribeInstances", CallClass::Describe, async { Ok(()) })
        .await
        .unwrap();
    assert!(t.elapsed() < Duration::from_millis(10), "{:?}", t.elapsed());
    let t = Instant::now();
    l.attempt("CreateNetworkInterface", CallClass::Mutating, async {
        Ok(())
    })
    .await
    .unwrap();
    // At most the node's own mutating bucket (5/s, burst 1: the token went to the throttled call),
    // never the throttled API's pause (250..500 ms).
    assert!(
        t.elapsed() <= Duration::from_millis(210),
        "{:?}",
        t.elapsed()
    );
    assert!(!l.gate("CreateNetworkInterface").recovering());
    assert!(l.gate("AssignPrivateIpAddresses").recovering());
    // Another call of the throttled API, not itself throttled, waits out the pause (500 ms,
    // jittered to 250..500 ms), counted from the throttle.
    let since_throttle = Instant::now();
    let remaining = l.gate("AssignPrivateIpAddresses").remaining();
    l.attempt("AssignPrivateIpAddresses", CallClass::Mutating, async {
        Ok(())
    })
    .await
    .unwrap();
    assert!(
        since_throttle.elapsed() >= remaining,
        "{:?} < {remaining:?}",
        since_throttle.elapsed()
    );
    // That success halved the pause to nothing; consecutive throttles double it again
    // (0.5, 1, 2 s) and successes halve it back to nothing.
    for _ in 0..3 {
        let _: CloudResult<()> = l
            .attempt("AssignPrivateIpAddresses", CallClass::Mutating, async {
                Err(throttled())
            })
            .await;
    }
    assert_eq!(
        pause(&l, "AssignPrivateIpAddresses"),
        Duration::from_secs(2)
    );
    assert_eq!(pause(&l, "CreateNetworkInterface"), Duration::ZERO);
    for _ in 0..4 {
        l.attempt("AssignPrivateIpAddresses", CallClass::Mutating, async {
            Ok(())
        })
        .await
        .unwrap();
    }
    assert_eq!(pause(&l, "AssignPrivateIpAddresses"), Duration::ZERO);
    assert_eq!(CallClass::of_api("DescribeSubnets"), CallClass::Describe);
    assert_eq!(
        CallClass::of_api("AttachNetworkInterface"),
        CallClass::Mutating
    );
}

/// Throttles AssignPrivateIpAddresses once: its gate recovers (pause 500 ms, jittered 250..500 ms).
async fn throttle_once(l: &Limiter) {
    let _: CloudResult<()> = l
        .attempt("AssignPrivateIpAddresses", CallClass::Mutating, async {
            Err(throttled())
        })
        .await;
    assert!(l.gate("AssignPrivateIpAddresses").recovering());
}

/// One mutating attempt of `purpose` that takes `took`; returns when it started and ended.
async fn timed_attempt(l: &Limiter, purpose: Purpose, took: Duration) -> (Instant, Instant) {
    crate::with_purpose(purpose, async {
        l.attempt("AssignPrivateIpAddresses", CallClass::Mutating, async {
            let started = Instant::now();
            tokio::time::sleep(took).await;
            Ok((started, Instant::now()))
        })
        .await
        .unwrap()
    })
    .await
}

#[tokio::test(start_paused = true)]
async fn after_a_throttle_one_attempt_runs_at_a_time() {
    let l = Arc::new(limiter(1, 60_000));
    throttle_once(&l).await;
    let (a, b) = tokio::join!(
        timed_attempt(&l, Purpose::Pod, Duration::from_secs(1)),
        timed_attempt(&l, Purpose::Pod, Duration::from_secs(1)),
    );
    let (first, second) = if a.0 <= b.0 { (a, b) } else { (b, a) };
    assert!(second.0 >= first.1, "overlap: {first:?} {second:?}");
    // The first one's success ended the recovery: attempts run side by side again.
    assert!(!l.gate("AssignPrivateIpAddresses").recovering());
    let start = Instant::now();
    tokio::join!(
        timed_attempt(&l, Purpose::Pod, Duration::from_secs(1)),
        timed_attempt(&l, Purpose::Pod, Duration::from_secs(1)),
    );
    // Side by side (the bucket's 200 ms between tokens aside).
    assert!(
        start.elapsed() < Duration::from_millis(1_500),
        "{:?}",
        start.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn after_a_throttle_a_refill_waits_for_the_pods_call() {
    let l = limiter(1, 60_000);
    // Three throttles: a 2 s pause, which two successes only halve to 500 ms (still recovering).
    for _ in 0..3 {
        throttle_once(&l).await;
    }
    let secs = Duration::from_secs;
    let after = |d: Duration, purpose| {
        let l = &l;
        async move {
            tokio::time::sleep(d).await;
            timed_attempt(l, purpose, secs(3)).await
        }
    };
    // A pod's call is the probe; a refill, then another pod's call, arrive while it runs. The
    // refill asked first, yet the pod's call goes first.
    let (_, refill, pod) = tokio::join!(
        after(Duration::ZERO, Purpose::Pod),
        after(Duration::from_millis(2_100), Purpose::Refill),
        after(Duration::from_millis(2_200), Purpose::Pod),
    );
    assert!(refill.0 >= pod.1, "refill {refill:?} pod {pod:?}");
}

#[tokio::test(start_paused = true)]
async fn a_refill_yields_for_a_bounded_time_and_alone_goes_as_the_probe() {
    let l = limiter(1, 60_000);
    throttle_once(&l).await;
    // Alone, a refill is the probe: it goes once the pause is over.
    let start = Instant::now();
    timed_attempt(&l, Purpose::GiveBack, Duration::ZERO).await;
    assert!(
        start.elapsed() <= Duration::from_millis(510),
        "{:?}",
        start.elapsed()
    );
    // A pod-driven call that never ends holds a refill back at most MAX_YIELD.
    throttle_once(&l).await;
    let _pod = l.gate("AssignPrivateIpAddresses").enter_priority();
    let start = Instant::now();
    timed_attempt(&l, Purpose::Refill, Duration::ZERO).await;
    let waited = start.elapsed();
    assert!(
        waited >= ThrottleGate::MAX_YIELD
            && waited <= ThrottleGate::MAX_YIELD + Duration::from_millis(510),
        "{waited:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn ec2_calls_are_counted_by_purpose() {
    let l = limiter(1, 60_000);
    timed_attempt(&l, Purpose::Pod, Duration::ZERO).await;
    let _: CloudResult<()> = crate::with_purpose(
        Purpose::Refill,
        l.attempt("AssignPrivateIpAddresses", CallClass::Mutating, async {
            Err(throttled())
        }),
    )
    .await;
    // Unscoped: counted as reconcile. IMDS reads are not counted by purpose.
    l.attempt("DescribeSubnets", CallClass::Describe, async { Ok(()) })
        .await
        .unwrap();
    l.stats()
        .record_call("imds:mac", Outcome::Ok, Duration::from_millis(1));
    let s = l.stats().snapshot();
    assert_eq!(s.purpose_calls(Purpose::Pod), 1);
    assert_eq!(s.purpose_throttled(Purpose::Pod), 0);
    assert_eq!(s.purpose_calls(Purpose::Refill), 1);
    assert_eq!(s.purpose_throttled(Purpose::Refill), 1);
    assert_eq!(s.purpose_calls(Purpose::Reconcile), 1);
    assert_eq!(s.purpose_calls(Purpose::Startup), 0);
    assert_eq!(s.by_purpose.len(), 3);
    assert!(s.by_purpose.iter().all(|p| !p.api.starts_with("imds:")));
    assert_eq!(
        s.by_purpose[0],
        crate::calls::PurposeSeries {
            purpose: Purpose::Pod,
            api: "AssignPrivateIpAddresses".into(),
            calls: 1,
            throttled: 0,
        }
    );
}

#[tokio::test(start_paused = true)]
async fn throttled_calls_are_retried_until_success() {
    let l = limiter(6, 60_000);
    let n = AtomicU32::new(0);
    let r = l
        .call("AssignPrivateIpAddresses", CallClass::Mutating, || async {
            if n.fetch_add(1, Ordering::SeqCst) < 3 {
                Err(throttled())
            } else {
                Ok(7)
            }
        })
        .await;
    assert_eq!(r, Ok(7));
    let s = l.stats().snapshot();
    assert_eq!(s.count("AssignPrivateIpAddresses", Outcome::Throttled), 3);
    assert_eq!(s.count("AssignPrivateIpAddresses", Outcome::Ok), 1);
    assert_eq!(s.retries("AssignPrivateIpAddresses"), 3);
    // Burst 1 at 5 qps: the four attempts each took a token; the limiter wait is recorded.
    assert_eq!(s.limiter_waits["mutating"].count, 4);
}

#[tokio::test(start_paused = true)]
async fn work_that_takes_a_throttle_as_its_answer_is_not_retried_but_rides_out_a_5xx() {
    let l = limiter(6, 60_000);
    let n = AtomicU32::new(0);
    let r: CloudResult<()> = crate::without_throttle_retries(l.call(
        "AssignPrivateIpAddresses",
        CallClass::Mutating,
        || async {
            n.fetch_add(1, Ordering::SeqCst);
            Err(throttled())
        },
    ))
    .await;
    assert!(
        matches!(
            r,
            Err(CloudError::RetriesExhausted {
                attempts: 1,
                throttled: true,
                ..
            })
        ),
        "{r:?}"
    );
    assert_eq!(n.load(Ordering::SeqCst), 1, "one attempt, no retry");
    let s = l.stats().snapshot();
    assert_eq!(s.retries("AssignPrivateIpAddresses"), 0);
    assert_eq!(s.retries_exhausted["AssignPrivateIpAddresses"], 1);
    // The throttle still counts: the gate pauses the API and remembers it.
    assert!(l.throttled_within("AssignPrivateIpAddresses", Duration::from_secs(60)));

    // A transient failure is still retried in that scope.
    let n = AtomicU32::new(0);
    let r = crate::without_throttle_retries(l.call(
        "DescribeNetworkInterfaces",
        CallClass::Describe,
        || async {
            if n.fetch_add(1, Ordering::SeqCst) == 0 {
                Err(CloudError::Transient {
                    api: "DescribeNetworkInterfaces".into(),
                    message: "503".into(),
                })
            } else {
                Ok(3)
            }
        },
    ))
    .await;
    assert_eq!(r, Ok(3));
    assert_eq!(n.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn final_errors_are_not_retried() {
    let l = limiter(6, 60_000);
    let n = AtomicU32::new(0);
    let r: CloudResult<()> = l
        .call("AssignPrivateIpAddresses", CallClass::Mutating, || async {
            n.fetch_add(1, Ordering::SeqCst);
            Err(CloudError::SubnetFull {
                api: "AssignPrivateIpAddresses".into(),
                message: "full".into(),
            })
        })
        .await;
    assert!(matches!(r, Err(CloudError::SubnetFull { .. })));
    assert_eq!(n.load(Ordering::SeqCst), 1);
    assert_eq!(l.stats().snapshot().total_retries(), 0);
}

#[tokio::test(start_paused = true)]
async fn retries_stop_at_max_attempts() {
    let l = limiter(4, 600_000);
    let n = AtomicU32::new(0);
    let r: CloudResult<()> = l
        .call("DescribeNetworkInterfaces", CallClass::Describe, || async {
            n.fetch_add(1, Ordering::SeqCst);
            Err(CloudError::Transient {
                api: "DescribeNetworkInterfaces".into(),
                message: "503".into(),
            })
        })
        .await;
    assert!(matches!(
        r,
        Err(CloudError::RetriesExhausted { attempts: 4, .. })
    ));
    assert_eq!(n.load(Ordering::SeqCst), 4);
    let s = l.stats().snapshot();
    assert_eq!(s.retries("DescribeNetworkInterfaces"), 3);
    assert_eq!(s.retries_exhausted["DescribeNetworkInterfaces"], 1);
}

#[tokio::test(start_paused = true)]
async fn retries_stop_at_total_time() {
    let l = limiter(1_000, 2_500);
    let start = Instant::now();
    let r: CloudResult<()> = l
        .call("DescribeNetworkInterfaces", CallClass::Describe, || async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            Err(throttled())
        })
        .await;
    assert!(matches!(r, Err(CloudError::RetriesExhausted { .. })));
    // No retry starts after 2.5 s; the last attempt may run its 300 ms (plus a token wait).
    assert!(
        start.elapsed() <= Duration::from_millis(2_500 + 300 + 100),
        "{:?}",
        start.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn a_throttle_is_remembered_per_api_for_the_window_even_after_a_retry_got_through() {
    let l = limiter(3, 60_000);
    let window = Duration::from_secs(60);
    assert!(!l.throttled_within("AssignPrivateIpAddresses", window));
    // Throttled once, then through on the retry: the caller saw success, the account was short.
    let mut first = true;
    l.call("AssignPrivateIpAddresses", CallClass::Mutating, || {
        let throttle = std::mem::replace(&mut first, false);
        async move { if throttle { Err(throttled()) } else { Ok(()) } }
    })
    .await
    .unwrap();
    assert!(l.throttled_within("AssignPrivateIpAddresses", window));
    assert!(
        !l.throttled_within("CreateNetworkInterface", window),
        "another API's bucket says nothing"
    );
    tokio::time::sleep(window).await;
    assert!(!l.throttled_within("AssignPrivateIpAddresses", window));
}
