//! The cloud seam's IPv6 (issue 26): a `/80` delegated to the node's eth0 through the real SDK
//! against mockcloud, seen in the reply, in DescribeNetworkInterfaces and in IMDS; the subnet's and
//! VPC's IPv6 blocks from IMDS and DescribeSubnets; the per-ENI limit and a subnet without IPv6 as
//! typed errors; an ambiguous assign that leaves no unknown prefix; the calls on their own buckets,
//! counted by API and purpose; IAM refusing the IPv6 actions without the policy's grant.

mod cloud_support;

use std::collections::BTreeSet;
use std::time::Duration;

use tokio::time::Instant;

use ipnet::Ipv6Net;

use eniipam::cloud::calls::Outcome;
use eniipam::cloud::limiter::{BucketConfig, CallClass};
use eniipam::cloud::{Cloud, CloudError, EniFilter, Metadata, MetadataEni, Purpose, with_purpose};
use eniipam::model::EniId;
use mockcloud::Fault;
use mockcloud::iam::shipped_policy;

use cloud_support::*;

const ASSIGN6: &str = "AssignIpv6Addresses";
const UNASSIGN6: &str = "UnassignIpv6Addresses";
const DESCRIBE: &str = "DescribeNetworkInterfaces";

/// The default instance's eth0, as the daemon's IPv6 mode takes its `/80` from it.
fn eth0(env: &Env) -> EniId {
    env.instance.primary_eni.parse().expect("eth0's id")
}

/// The `/80`s mockcloud holds on `eni` (EC2's truth, not the client's view).
fn prefixes_on(env: &Env, eni: &EniId) -> BTreeSet<Ipv6Net> {
    env.mock
        .network_interfaces()
        .into_iter()
        .find(|e| e.id == eni.as_str())
        .expect("ENI exists in mockcloud")
        .ipv6_prefixes
        .into_iter()
        .collect()
}

/// IMDS's view of eth0 once `done` holds, polled for up to 5 s (IMDS lags EC2).
async fn imds_eth0_until(env: &Env, done: impl Fn(&MetadataEni) -> bool) -> MetadataEni {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let md = env
            .imds
            .interface(&env.instance.mac)
            .await
            .expect("IMDS read")
            .expect("IMDS lists eth0");
        if done(&md) {
            return md;
        }
        assert!(
            Instant::now() < deadline,
            "IMDS never showed what was expected: {md:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn start() -> Env {
    let mut limiter = fast_limiter();
    // The IPv6 calls have their own buckets, configurable by name like every other EC2 API.
    for api in [ASSIGN6, UNASSIGN6] {
        limiter.per_api.insert(
            api.to_owned(),
            BucketConfig {
                qps: 50.0,
                burst: 7,
            },
        );
    }
    Env::start_with(
        mockcloud::Config::fast(),
        limiter,
        Duration::from_millis(300),
    )
    .await
}

#[tokio::test]
async fn a_80_on_eth0_shows_in_the_reply_in_describe_and_in_imds_and_goes_back() {
    let env = start().await;
    let eth0 = eth0(&env);
    assert_eq!(
        env.cloud.limiter().rate(ASSIGN6, CallClass::Mutating),
        BucketConfig {
            qps: 50.0,
            burst: 7
        }
    );
    assert_eq!(
        env.cloud
            .limiter()
            .rate(UNASSIGN6, CallClass::Mutating)
            .burst,
        7
    );

    // The blocks: the subnet's /64 inside the VPC's /56, the same from IMDS and DescribeSubnets.
    let md = imds_eth0_until(&env, |_| true).await;
    assert!(md.ipv6s.is_empty() && md.ipv6_prefixes.is_empty(), "{md:?}");
    let [subnet6] = md.subnet_ipv6_cidrs[..] else {
        panic!("one subnet IPv6 block: {md:?}")
    };
    let [vpc6] = md.vpc_ipv6_cidrs[..] else {
        panic!("one VPC IPv6 block: {md:?}")
    };
    assert_eq!((subnet6.prefix_len(), vpc6.prefix_len()), (64, 56));
    assert!(vpc6.contains(&subnet6));
    let subnet = env
        .cloud
        .describe_subnet(&env.node.subnet_id)
        .await
        .unwrap();
    assert_eq!(subnet.ipv6_cidrs, vec![subnet6]);
    let listed = env
        .cloud
        .describe_subnets(&Default::default())
        .await
        .unwrap();
    assert!(listed.iter().any(|s| s.ipv6_cidrs == vec![subnet6]));

    env.mock.set_imds_lag(Duration::from_millis(300));
    env.mock.reset_counters();
    let got = with_purpose(Purpose::Startup, env.cloud.assign_ipv6_prefixes(&eth0, 1))
        .await
        .unwrap();
    let [p] = got[..] else {
        panic!("one /80: {got:?}")
    };
    assert_eq!(p.prefix_len(), 80);
    assert!(subnet6.contains(&p), "{p} inside {subnet6}");
    assert_eq!(prefixes_on(&env, &eth0), BTreeSet::from([p]));
    let described = env
        .cloud
        .describe_enis(&EniFilter {
            ids: vec![eth0.clone()],
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(described[0].ipv6_prefixes, vec![p]);
    assert!(described[0].ipv6_addresses.is_empty());
    let md = imds_eth0_until(&env, |md| !md.ipv6_prefixes.is_empty()).await;
    assert_eq!(md.ipv6_prefixes, vec![p]);

    // One EC2 call for the /80, counted by API and by purpose.
    assert_eq!(env.mock.counters().calls(ASSIGN6), 1);
    let snap = env.stats.snapshot();
    assert_eq!(snap.count(ASSIGN6, Outcome::Ok), 1);
    let startup = |api: &str| {
        snap.by_purpose
            .iter()
            .find(|s| s.purpose == Purpose::Startup && s.api == api)
            .map_or(0, |s| s.calls)
    };
    assert_eq!(startup(ASSIGN6), 1);
    assert_eq!(
        startup(DESCRIBE),
        1,
        "eth0's baseline, the first assign only"
    );
    assert_eq!(snap.purpose_calls(Purpose::Startup), 2);

    // Given back: gone from EC2, then from IMDS.
    env.cloud.unassign_ipv6_prefixes(&eth0, &got).await.unwrap();
    assert!(prefixes_on(&env, &eth0).is_empty());
    imds_eth0_until(&env, |md| md.ipv6_prefixes.is_empty()).await;
    assert_eq!(env.mock.counters().calls(UNASSIGN6), 1);
    assert_eq!(env.stats.snapshot().count(UNASSIGN6, Outcome::Ok), 1);
    // Nothing to do is no call.
    assert!(
        env.cloud
            .assign_ipv6_prefixes(&eth0, 0)
            .await
            .unwrap()
            .is_empty()
    );
    env.cloud.unassign_ipv6_prefixes(&eth0, &[]).await.unwrap();
    assert_eq!(env.mock.counters().calls(ASSIGN6), 1);
}

#[tokio::test]
async fn the_per_eni_limit_is_typed_and_all_or_nothing() {
    let env = start().await;
    let eth0 = eth0(&env);
    // m5.large: 10 per interface, IPv6 addresses and /80s counted apart from the IPv4 ones.
    let err = env.cloud.assign_ipv6_prefixes(&eth0, 11).await.unwrap_err();
    assert!(matches!(err, CloudError::IpLimitExceeded { .. }), "{err}");
    assert!(err.is_capacity());
    assert!(prefixes_on(&env, &eth0).is_empty(), "nothing assigned");
    let got = env.cloud.assign_ipv6_prefixes(&eth0, 10).await.unwrap();
    assert_eq!(got.len(), 10);
    let err = env.cloud.assign_ipv6_prefixes(&eth0, 1).await.unwrap_err();
    assert!(matches!(err, CloudError::IpLimitExceeded { .. }), "{err}");
    assert_eq!(prefixes_on(&env, &eth0).len(), 10);
    let snap = env.stats.snapshot();
    assert_eq!(snap.count(ASSIGN6, Outcome::Capacity), 2);
    assert_eq!(snap.retries(ASSIGN6), 0, "a limit is not retried");
}

#[tokio::test]
async fn a_subnet_without_an_ipv6_block_is_a_clear_error() {
    let env = start().await;
    let eth0 = eth0(&env);
    env.mock
        .disassociate_subnet_ipv6_cidr_block(&env.node.subnet_id)
        .expect("no ENI holds IPv6 yet");
    let err = env.cloud.assign_ipv6_prefixes(&eth0, 1).await.unwrap_err();
    assert!(matches!(err, CloudError::NoIpv6Cidr { .. }), "{err}");
    assert!(
        err.to_string().contains("no IPv6 CIDR block")
            && err.to_string().contains(&env.node.subnet_id),
        "{err}"
    );
    assert!(!err.is_capacity() && !err.is_retryable());
    assert_eq!(env.mock.counters().calls(ASSIGN6), 1, "not retried");
    assert_eq!(env.stats.snapshot().count(ASSIGN6, Outcome::Rejected), 1);
    // Both views agree: no block. (The VPC keeps its /56.)
    let subnet = env
        .cloud
        .describe_subnet(&env.node.subnet_id)
        .await
        .unwrap();
    assert!(subnet.ipv6_cidrs.is_empty(), "{subnet:?}");
    let md = imds_eth0_until(&env, |md| md.subnet_ipv6_cidrs.is_empty()).await;
    assert_eq!(md.vpc_ipv6_cidrs.len(), 1, "{md:?}");
}

/// A lost reply (performed) and a hang (not performed), settled from IMDS and from EC2: the
/// answer is exactly the new `/80`, and EC2 holds no other.
#[tokio::test]
async fn an_ambiguous_assign_leaves_no_unknown_prefix() {
    let env = start().await;
    let eth0 = eth0(&env);
    let viewed = (*env.cloud)
        .clone()
        .with_instance_view(env.imds.clone(), Duration::from_millis(600));
    env.mock.set_imds_lag(Duration::from_millis(200));

    // Performed, reply lost to the timeout; IMDS settles it: one assign, and one describe only for
    // the baseline of eth0, which this client has not seen yet.
    env.mock
        .inject_fault(Fault::slow_reply(ASSIGN6, Duration::from_millis(800), 1));
    env.mock.reset_counters();
    let got = viewed.assign_ipv6_prefixes(&eth0, 1).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(prefixes_on(&env, &eth0), got.iter().copied().collect());
    let c = env.mock.counters();
    assert_eq!(c.calls(ASSIGN6), 1, "assigned once");
    assert_eq!(
        c.calls(DESCRIBE),
        1,
        "eth0's baseline only: IMDS settled it"
    );

    // Not performed (a hang ending in a 500): IMDS shows nothing new, EC2 is asked, the retry
    // assigns exactly once.
    env.mock
        .inject_fault(Fault::hang(ASSIGN6, Duration::from_millis(10), 1));
    env.mock.reset_counters();
    let before = prefixes_on(&env, &eth0);
    let more = viewed.assign_ipv6_prefixes(&eth0, 1).await.unwrap();
    let after = prefixes_on(&env, &eth0);
    assert_eq!(after.difference(&before).copied().collect::<Vec<_>>(), more);
    assert_eq!(after.len(), 2);
    let c = env.mock.counters();
    assert_eq!((c.calls(ASSIGN6), c.calls(DESCRIBE)), (2, 1));

    // Without an instance view, EC2 settles a lost reply.
    env.mock
        .inject_fault(Fault::slow_reply(ASSIGN6, Duration::from_millis(800), 1));
    let before = after;
    let third = env.cloud.assign_ipv6_prefixes(&eth0, 1).await.unwrap();
    let after = prefixes_on(&env, &eth0);
    assert_eq!(
        after.difference(&before).copied().collect::<Vec<_>>(),
        third
    );
    assert_eq!(after.len(), 3);

    // An unassign whose reply is lost: done once, reported done.
    env.mock
        .inject_fault(Fault::slow_reply(UNASSIGN6, Duration::from_millis(800), 1));
    let all: Vec<Ipv6Net> = after.into_iter().collect();
    env.cloud.unassign_ipv6_prefixes(&eth0, &all).await.unwrap();
    assert!(prefixes_on(&env, &eth0).is_empty());
}

#[tokio::test]
async fn iam_refuses_the_ipv6_actions_without_the_policys_grant() {
    let env = start().await;
    let eth0 = eth0(&env);
    // The shipped policy grants both on eth0 (the VPC statement).
    env.mock
        .enforce_shipped_policy(CLUSTER)
        .expect("a default world");
    let got = env.cloud.assign_ipv6_prefixes(&eth0, 1).await.unwrap();
    env.cloud.unassign_ipv6_prefixes(&eth0, &got).await.unwrap();
    assert!(
        env.mock.iam_denials().is_empty(),
        "{:?}",
        env.mock.iam_denials()
    );

    // Without AssignIpv6Addresses: refused, naming the permission, not retried.
    let vpc = env.instance.vpc_id.clone();
    env.mock.set_iam_policy(Some(
        shipped_policy(CLUSTER, &vpc).without_action("ec2:AssignIpv6Addresses"),
    ));
    let err = env.cloud.assign_ipv6_prefixes(&eth0, 1).await.unwrap_err();
    assert!(
        matches!(&err, CloudError::Unauthorized { permission, .. } if permission == "ec2:AssignIpv6Addresses"),
        "{err}"
    );
    assert!(prefixes_on(&env, &eth0).is_empty());

    // Without UnassignIpv6Addresses: the /80 stays.
    env.mock.set_iam_policy(Some(shipped_policy(CLUSTER, &vpc)));
    let got = env.cloud.assign_ipv6_prefixes(&eth0, 1).await.unwrap();
    env.mock.set_iam_policy(Some(
        shipped_policy(CLUSTER, &vpc).without_action("ec2:UnassignIpv6Addresses"),
    ));
    let err = env
        .cloud
        .unassign_ipv6_prefixes(&eth0, &got)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, CloudError::Unauthorized { permission, .. } if permission == "ec2:UnassignIpv6Addresses"),
        "{err}"
    );
    assert_eq!(prefixes_on(&env, &eth0), got.into_iter().collect());
    let snap = env.stats.snapshot();
    assert_eq!(snap.count(ASSIGN6, Outcome::Unauthorized), 1);
    assert_eq!(snap.count(UNASSIGN6, Outcome::Unauthorized), 1);
}

/// The node's /80 taken back by value (`Ipv6Prefix.N`): a lost reply is settled by describing eth0
/// (the lost attempt landed: the answer, not a second assign refused as in use); a hang that did not
/// land is retried; a /80 in use is refused at once, as EC2 refuses it.
#[tokio::test]
async fn a_slash_80_taken_back_by_value_survives_an_ambiguous_reply_and_is_refused_in_use() {
    let env = start().await;
    let eth0 = eth0(&env);
    let [p] = env.cloud.assign_ipv6_prefixes(&eth0, 1).await.unwrap()[..] else {
        panic!("one /80")
    };
    env.cloud.unassign_ipv6_prefixes(&eth0, &[p]).await.unwrap();

    // Performed, reply lost: one assign, the describe finds it on eth0.
    env.mock
        .inject_fault(Fault::slow_reply(ASSIGN6, Duration::from_millis(800), 1));
    env.mock.reset_counters();
    let got = env
        .cloud
        .assign_specific_ipv6_prefixes(&eth0, &[p])
        .await
        .unwrap();
    assert_eq!(got, vec![p]);
    assert_eq!(prefixes_on(&env, &eth0), [p].into_iter().collect());
    assert_eq!(env.mock.counters().calls(ASSIGN6), 1, "assigned once");

    // Not performed (a hang ending in a 500): the describe shows it absent, the retry assigns it.
    env.cloud.unassign_ipv6_prefixes(&eth0, &[p]).await.unwrap();
    env.mock
        .inject_fault(Fault::hang(ASSIGN6, Duration::from_millis(10), 1));
    env.mock.reset_counters();
    let got = env
        .cloud
        .assign_specific_ipv6_prefixes(&eth0, &[p])
        .await
        .unwrap();
    assert_eq!(got, vec![p]);
    assert_eq!(prefixes_on(&env, &eth0), [p].into_iter().collect());
    assert_eq!(env.mock.counters().calls(ASSIGN6), 2);

    // In use (here, by eth0 itself): EC2's refusal, final, not retried.
    env.mock.reset_counters();
    let err = env
        .cloud
        .assign_specific_ipv6_prefixes(&eth0, &[p])
        .await
        .unwrap_err();
    assert!(
        matches!(&err, CloudError::Rejected { code, .. } if code == "InvalidIPAddress.InUse"),
        "{err}"
    );
    assert_eq!(env.mock.counters().calls(ASSIGN6), 1);
}
