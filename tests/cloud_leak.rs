//! The leaked-ENI collector against mockcloud: only our own, only available, only after the grace
//! period; ENIs without a creation time are stamped and aged. And no leak to begin with when EC2
//! answers not found about an ENI just created (its eventual consistency, mockcloud's new-ENI lag).

mod cloud_support;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use eniipam::cloud::Cloud;
use eniipam::cloud::leak::{LeakCollector, LeakConfig};
use eniipam::cloud::tags;
use mockcloud::{Fault, NewEniLag};
use tokio_util::sync::CancellationToken;

use cloud_support::*;

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

#[tokio::test]
async fn collects_only_our_old_available_enis() {
    let env = Env::start().await;
    let now = SystemTime::now();
    let old = rfc3339(now - Duration::from_secs(10 * 60));
    let fresh = rfc3339(now);
    let inst = env.instance.instance_id.clone();

    let leaked = env.create_raw(&our_tags(&inst, &old), 2).await;
    let young = env.create_raw(&our_tags(&inst, &fresh), 0).await;
    let mut opted_out_tags = our_tags(&inst, &old);
    opted_out_tags.push((tags::NO_MANAGE, "true"));
    let opted_out = env.create_raw(&opted_out_tags, 0).await;
    let no_time = env
        .create_raw(
            &[
                (tags::OWNER, tags::OWNER_VALUE),
                (tags::CLUSTER, CLUSTER),
                (tags::INSTANCE_ID, &inst),
            ],
            0,
        )
        .await;
    let garbled = env
        .create_raw(
            &[
                (tags::OWNER, tags::OWNER_VALUE),
                (tags::CLUSTER, CLUSTER),
                (tags::CREATED_AT, "yesterday-ish"),
            ],
            0,
        )
        .await;
    let other_cluster = env
        .create_raw(
            &[
                (tags::OWNER, tags::OWNER_VALUE),
                (tags::CLUSTER, "other"),
                (tags::CREATED_AT, &old),
            ],
            0,
        )
        .await;
    let foreign = env
        .create_raw(&[(tags::CLUSTER, CLUSTER), (tags::CREATED_AT, &old)], 0)
        .await;
    // Ours and old, but attached: never touched.
    let attached = env.create_raw(&our_tags(&inst, &old), 0).await;
    env.cloud.attach_eni(&attached.id, &inst, 1).await.unwrap();

    let collector = LeakCollector::new(
        env.cloud.clone(),
        CLUSTER,
        env.node.vpc_id.clone(),
        LeakConfig::default(),
    );
    let r = collector.run_once_at(now).await;
    assert_eq!(r.found, 5, "{r:?}"); // leaked, young, opted_out, no_time, garbled
    assert_eq!(r.deleted, 1, "{r:?}");
    assert_eq!(r.skipped_young, 1, "{r:?}");
    assert_eq!(r.skipped_not_ours, 1, "{r:?}");
    assert_eq!(r.tagged, 2, "{r:?}");
    assert_eq!(r.errors, 0, "{r:?}");

    let ids = env.eni_ids();
    let has = |e: &eniipam::cloud::Eni| ids.contains(&e.id.to_string());
    assert!(!has(&leaked));
    for e in [
        &young,
        &opted_out,
        &no_time,
        &garbled,
        &other_cluster,
        &foreign,
        &attached,
    ] {
        assert!(has(e), "{} must survive the first run", e.id);
    }
    // The stamped ENIs now carry a parseable creation time.
    let views = env.mock.network_interfaces();
    for e in [&no_time, &garbled] {
        let v = views.iter().find(|v| v.id == e.id.as_str()).unwrap();
        assert!(humantime::parse_rfc3339(&v.tags[tags::CREATED_AT]).is_ok());
    }

    // Past the grace period: the young and the stamped ones go; the rest never do.
    let later = now + Duration::from_secs(6 * 60);
    let r = collector.run_once_at(later).await;
    assert_eq!(r.deleted, 3, "{r:?}");
    assert_eq!(r.skipped_not_ours, 1, "{r:?}");
    let ids = env.eni_ids();
    let has = |e: &eniipam::cloud::Eni| ids.contains(&e.id.to_string());
    for e in [&young, &no_time, &garbled] {
        assert!(!has(e), "{} must be collected", e.id);
    }
    for e in [&opted_out, &other_cluster, &foreign, &attached] {
        assert!(has(e), "{} must never be collected", e.id);
    }
    assert!(ids.contains(&env.instance.primary_eni));
    let totals = collector.totals();
    assert_eq!(totals.runs, 2);
    assert_eq!(totals.deleted, 4);
}

#[tokio::test]
async fn a_failing_describe_is_counted_and_the_loop_stops_on_cancel() {
    let env = Env::start().await;
    let old = rfc3339(SystemTime::now() - Duration::from_secs(600));
    let leaked = env
        .create_raw(&our_tags(&env.instance.instance_id, &old), 0)
        .await;

    env.mock.deny("DescribeNetworkInterfaces", true);
    let collector = Arc::new(LeakCollector::new(
        env.cloud.clone(),
        CLUSTER,
        env.node.vpc_id.clone(),
        LeakConfig::default(),
    ));
    let r = collector.run_once().await;
    assert_eq!((r.errors, r.deleted), (1, 0));
    env.mock.deny("DescribeNetworkInterfaces", false);

    let cancel = CancellationToken::new();
    let task = collector
        .clone()
        .spawn(Duration::from_millis(50), cancel.clone());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    while collector.totals().deleted == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the loop never collected"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(1), task)
        .await
        .expect("the loop stops on cancel")
        .unwrap();
    assert!(!env.eni_ids().contains(&leaked.id.to_string()));
    assert!(collector.totals().runs >= 2);
}

/// mockcloud in the fast profile with the strict new-ENI lag: for `window` after a create, describes
/// do not list the new ENI and every call naming it answers `InvalidNetworkInterfaceID.NotFound`.
async fn env_with_new_eni_lag(window: Duration) -> Env {
    let mut config = mockcloud::Config::fast();
    config.latency.new_eni_lag = NewEniLag::strict(window);
    Env::start_with(config, fast_limiter(), Duration::from_millis(500)).await
}

/// How many calls of `action` mockcloud answered not found.
fn refused(env: &Env, action: &str) -> usize {
    env.mock
        .call_log()
        .iter()
        .filter(|c| c.action == action && c.outcome == "InvalidNetworkInterfaceID.NotFound")
        .count()
}

/// Issue 44, case 6: right after our own create, EC2 may not know the new ENI yet. The attach and
/// DeleteOnTermination ride that out instead of failing the create (which then read the ENI as gone
/// in its cleanup and leaked it).
#[tokio::test]
async fn create_and_attach_rides_out_not_found_right_after_the_create() {
    let window = Duration::from_millis(800);
    let env = env_with_new_eni_lag(window).await;
    let lifecycle = env.lifecycle(fast_lifecycle());
    let started = tokio::time::Instant::now();
    let eni = lifecycle
        .create_and_attach(2, 1)
        .await
        .expect("the create and attach ride out EC2's not-found");
    assert!(
        refused(&env, "AttachNetworkInterface") >= 1,
        "EC2 refused the attach as not found first"
    );
    assert!(started.elapsed() >= window, "the attach waited for EC2");
    let truth = env
        .mock
        .network_interfaces()
        .into_iter()
        .find(|e| e.id == eni.id.as_str())
        .expect("the ENI exists");
    let attachment = truth.attachment.expect("attached");
    assert_eq!(attachment.instance_id, env.instance.instance_id);
    assert!(attachment.delete_on_termination, "DeleteOnTermination set");
    assert_eq!(truth.secondary_ips.len(), 2);
}

/// Issue 44, case 6: a create whose attach fails for good right after the create cleans its ENI up;
/// the cleanup's describe and delete, answered not found while EC2 does not show the ENI yet, are
/// not read as "already gone".
#[tokio::test]
async fn a_failed_create_cleans_up_its_eni_while_ec2_does_not_show_it_yet() {
    let env = env_with_new_eni_lag(Duration::from_millis(800)).await;
    let before = env.eni_ids();
    env.mock.inject_fault(Fault::error(
        "AttachNetworkInterface",
        "InvalidParameterCombination",
        1,
    ));
    let err = env
        .lifecycle(fast_lifecycle())
        .create_and_attach(2, 1)
        .await
        .expect_err("the attach fails");
    assert!(!err.is_not_found(), "the attach's own error: {err}");
    assert!(
        refused(&env, "DescribeNetworkInterfaces") >= 1,
        "the cleanup's describe was answered not found first"
    );
    assert_eq!(env.eni_ids(), before, "the new ENI is deleted, not leaked");
}

/// Outside the window, a not-found stays final: an ENI this client did not just create and that
/// EC2 does not know is gone at once, with one call.
#[tokio::test]
async fn not_found_is_final_for_an_eni_not_just_created() {
    let env = env_with_new_eni_lag(Duration::from_millis(800)).await;
    let unknown = eniipam::model::EniId::try_from("eni-0123456789abcdef0".to_owned()).unwrap();
    let err = env.cloud.delete_eni(&unknown).await.expect_err("unknown");
    assert!(err.is_not_found(), "{err}");
    assert_eq!(
        refused(&env, "DeleteNetworkInterface"),
        1,
        "one call, no retry"
    );
}

/// Issue 44, case 6: EC2's describes do not show an attachment made moments ago either. A create
/// that fails after its attach was answered (here: IMDS never shows the ENI and EC2's describe,
/// still lagging, says it is not attached) detaches that attachment before the delete, instead of
/// deleting an ENI that is in use and leaving it attached.
#[tokio::test]
async fn a_failed_create_detaches_the_attachment_describes_do_not_show_yet() {
    let window = Duration::from_secs(4);
    let env = env_with_new_eni_lag(window).await;
    env.mock.set_imds_lag(Duration::from_secs(600));
    let before = env.eni_ids();
    // The attach goes through once the window after the create is over (about 4 s); IMDS is given
    // 3 s (fast_lifecycle), then EC2 is asked while its describes still hide the attachment.
    let err = env
        .lifecycle(fast_lifecycle())
        .create_and_attach(1, 1)
        .await
        .expect_err("EC2's lagging describe does not confirm the attachment");
    assert!(!err.is_not_found(), "{err}");
    assert_eq!(
        env.mock.counters().ok("DetachNetworkInterface"),
        1,
        "our own attachment was detached"
    );
    assert_eq!(
        env.eni_ids(),
        before,
        "the new ENI is deleted, not left attached"
    );
}
