//! Custom networking in the pool (in-memory cloud, paused clock): while the node's ENIConfig is not
//! usable no ENI is created — never one in the node's own subnet as a fallback — and the acquires
//! that need one fail with an error naming the reason; once it is usable, new ENIs go to its subnet;
//! when it becomes unusable again, the ENIs the node has keep serving. (The ENIConfig read from the
//! API server and checked against EC2, through the real daemon: `tests/daemon_custom_networking.rs`.)

mod pool_support;

use eniipam::cloud::{Cloud, SubnetFilter};
use eniipam::pool::{PodNetwork, PoolConfig, PoolError};
use pool_support::memory_cloud::{Action, NodeSpec};
use pool_support::{acquire_many, key, pod, quiet_config, start};

fn custom_config() -> PoolConfig {
    PoolConfig {
        custom_networking: true,
        ..quiet_config()
    }
}

fn no_pod_network(r: &Result<eniipam::pool::Allocation, PoolError>) -> String {
    match r {
        Err(e @ PoolError::NoPodNetwork { reason }) => {
            assert!(e.is_retryable(), "CNI error 11: tried again once fixed");
            reason.clone()
        }
        other => panic!("expected NoPodNetwork, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn no_eni_until_the_eniconfig_is_usable_then_new_enis_follow_it() {
    let n = start(custom_config(), NodeSpec::default()).await;
    assert!(matches!(
        n.pool.pod_network(),
        PodNetwork::Unavailable { .. }
    ));
    // Before the daemon hands over the ENIConfig: refused, nothing created in the node's subnet.
    let r = n.pool.acquire(key(0), pod(0), None, None).await;
    assert!(no_pod_network(&r).contains("not known yet"), "{r:?}");
    n.pool.set_pod_network(PodNetwork::Unavailable {
        reason: "this node names ENIConfig \"us-east-1z\", and no ENIConfig of that name exists"
            .into(),
    });
    let r = n.pool.acquire(key(1), pod(1), None, None).await;
    assert!(no_pod_network(&r).contains("us-east-1z"), "{r:?}");
    assert_eq!(n.cloud.call_count(Action::CreateNetworkInterface), 0);
    n.pool.check_invariants().unwrap();

    // Usable: the ENIConfig's subnet (the in-memory cloud has one) and groups.
    let subnet = n
        .cloud
        .describe_subnets(&SubnetFilter {
            ids: vec![n.node.subnet_id.clone()],
            ..SubnetFilter::default()
        })
        .await
        .unwrap()
        .remove(0);
    let old = n.pool.set_pod_network(PodNetwork::Custom {
        eni_config: "us-east-1a".into(),
        subnet: subnet.clone(),
        security_groups: vec!["sg-0pods".into()],
    });
    assert!(matches!(old, PodNetwork::Unavailable { .. }));
    let got = acquire_many(&n.pool, 10..13).await;
    assert!(got.iter().all(Result::is_ok), "{got:?}");
    let creates = n.cloud.calls_of(Action::CreateNetworkInterface);
    assert_eq!(creates.len(), 1, "{creates:?}");
    assert!(creates[0].args.contains(&format!("subnet={}", subnet.id)));
    let eni = got[0].as_ref().unwrap().eni.clone();
    assert!(got.iter().all(|a| a.as_ref().unwrap().eni == eni));
    assert_ne!(
        got[0].as_ref().unwrap().device_index,
        0,
        "eth0 serves no pods"
    );

    // Unusable again: the ENI the node has keeps serving; only a new ENI is refused.
    n.pool.set_pod_network(PodNetwork::Unavailable {
        reason: "ENIConfig \"us-east-1a\" is not usable: spec.subnet is empty".into(),
    });
    let more = acquire_many(&n.pool, 20..26).await;
    assert!(more.iter().all(Result::is_ok), "the ENI had room: {more:?}");
    assert!(more.iter().all(|a| a.as_ref().unwrap().eni == eni));
    // m5.large-like: 9 slots per ENI, 9 taken: the next needs a new ENI.
    let r = n.pool.acquire(key(30), pod(30), None, None).await;
    assert!(no_pod_network(&r).contains("spec.subnet is empty"), "{r:?}");
    assert_eq!(n.cloud.call_count(Action::CreateNetworkInterface), 1);
    n.pool.check_invariants().unwrap();
}
