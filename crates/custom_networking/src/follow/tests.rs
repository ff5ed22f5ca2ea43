//! The controller against an in-memory EC2 (memcloud) and a recording sink: what each ENIConfig
//! resolves to, and what a change hands to the pool, counts and gauges.

use std::sync::Mutex;

use eniipam_cloud::CloudError;
use eniipam_memcloud::{Action, MemoryCloud, NodeSpec};

use super::*;
use crate::PodNetwork;

fn ready(subnet: &str, groups: &[&str]) -> NodeNetwork {
    NodeNetwork::Ready(PodNetwork {
        eni_config: "us-east-1a".into(),
        subnet_id: subnet.into(),
        security_groups: groups.iter().map(|g| (*g).to_owned()).collect(),
    })
}

fn reason(r: Result<ResolvedNetwork, CloudError>) -> String {
    match r.expect("EC2 answered") {
        ResolvedNetwork::Unavailable { reason } => reason,
        other => panic!("expected unavailable, got {other:?}"),
    }
}

#[tokio::test]
async fn an_unusable_eniconfig_says_why_without_asking_ec2() {
    let (cloud, node) = MemoryCloud::with_node(NodeSpec::default());
    let missing = NodeNetwork::Missing { name: "b".into() };
    assert!(
        reason(resolve(&missing, cloud.as_ref(), &node).await).contains("\"b\", and no ENIConfig")
    );
    let invalid = NodeNetwork::Invalid {
        name: "c".into(),
        why: "no spec.subnet".into(),
    };
    assert!(reason(resolve(&invalid, cloud.as_ref(), &node).await).contains("no spec.subnet"));
    let unnamed = reason(resolve(&NodeNetwork::Unnamed, cloud.as_ref(), &node).await);
    assert!(unnamed.contains("names no ENIConfig"), "{unnamed}");
    let unknown = reason(resolve(&NodeNetwork::Unknown, cloud.as_ref(), &node).await);
    assert!(unknown.contains("not known yet"), "{unknown}");
    assert!(cloud.calls().is_empty(), "{:?}", cloud.calls());
}

#[tokio::test]
async fn a_usable_eniconfig_resolves_to_its_subnet_and_groups() {
    let (cloud, node) = MemoryCloud::with_node(NodeSpec::default());
    // No groups named: eth0's, as the VPC CNI does.
    let got = resolve(&ready(&node.subnet_id, &[]), cloud.as_ref(), &node).await;
    let ResolvedNetwork::Ready {
        eni_config,
        subnet,
        security_groups,
    } = got.expect("EC2 answered")
    else {
        panic!("expected ready");
    };
    assert_eq!(eni_config, "us-east-1a");
    assert_eq!(subnet.id, node.subnet_id);
    assert_eq!(security_groups, node.security_groups);
    assert_eq!(cloud.call_count(Action::DescribeSecurityGroups), 0);

    cloud.add_security_group("sg-0000000e", &node.vpc_id, "pods");
    let got = resolve(
        &ready(&node.subnet_id, &["sg-0000000e"]),
        cloud.as_ref(),
        &node,
    )
    .await;
    assert!(
        matches!(got, Ok(ResolvedNetwork::Ready { security_groups, .. }) if security_groups == ["sg-0000000e"])
    );
}

#[tokio::test]
async fn a_wrong_subnet_or_group_is_named() {
    let (cloud, node) = MemoryCloud::with_node(NodeSpec::default());
    let why = reason(resolve(&ready("subnet-0000000f", &[]), cloud.as_ref(), &node).await);
    assert!(
        why.contains("subnet-0000000f, which EC2 does not know"),
        "{why}"
    );
    cloud.add_security_group("sg-0000000f", "vpc-00000000", "elsewhere");
    let got = resolve(
        &ready(&node.subnet_id, &["sg-0000000f"]),
        cloud.as_ref(),
        &node,
    )
    .await;
    let why = reason(got);
    assert!(why.contains("sg-0000000f of vpc-00000000"), "{why}");
    let why = reason(
        resolve(
            &ready(&node.subnet_id, &["sg-0000000a"]),
            cloud.as_ref(),
            &node,
        )
        .await,
    );
    assert!(why.contains("sg-0000000a"), "{why}");
}

#[tokio::test]
async fn ec2_failing_transiently_is_an_error_to_retry_not_a_verdict() {
    let (cloud, node) = MemoryCloud::with_node(NodeSpec::default());
    let throttled = CloudError::Throttled {
        api: "DescribeSubnets".into(),
        code: "RequestLimitExceeded".into(),
    };
    cloud.fail_next(Action::DescribeSubnets, 1, throttled);
    let got = resolve(&ready(&node.subnet_id, &[]), cloud.as_ref(), &node).await;
    assert!(got.is_err_and(|e| e.is_transient()));
}

/// The pool's setting and the feature's metrics, recorded.
#[derive(Default)]
struct Recorded {
    network: Mutex<Option<ResolvedNetwork>>,
    ready: Mutex<Vec<bool>>,
    changes: Mutex<usize>,
}

impl PodNetworkSink for Recorded {
    fn set_pod_network(&self, new: ResolvedNetwork) -> Option<ResolvedNetwork> {
        self.network.lock().unwrap().replace(new)
    }
    fn enis_serving_pods_in(&self, _subnet_id: &str) -> usize {
        2
    }
    fn set_ready(&self, ready: bool) {
        self.ready.lock().unwrap().push(ready);
    }
    fn count_change(&self) {
        *self.changes.lock().unwrap() += 1;
    }
}

#[tokio::test]
async fn a_change_is_handed_to_the_pool_and_only_a_usable_to_usable_one_counted() {
    let (cloud, node) = MemoryCloud::with_node(NodeSpec::default());
    let first = resolve(&ready(&node.subnet_id, &[]), cloud.as_ref(), &node).await;
    let first = first.expect("EC2 answered");
    let sink = Recorded::default();
    apply(&sink, first.clone());
    apply(&sink, first.clone());
    assert_eq!(
        *sink.changes.lock().unwrap(),
        0,
        "from the discovered subnets, or unchanged"
    );
    let ResolvedNetwork::Ready { mut subnet, .. } = first.clone() else {
        panic!("expected ready");
    };
    subnet.id = "subnet-0000000b".into();
    let second = ResolvedNetwork::Ready {
        eni_config: "b".into(),
        subnet,
        security_groups: node.security_groups.clone(),
    };
    apply(&sink, second.clone());
    assert_eq!(*sink.changes.lock().unwrap(), 1);
    apply(
        &sink,
        ResolvedNetwork::Unavailable {
            reason: "gone".into(),
        },
    );
    assert_eq!(*sink.changes.lock().unwrap(), 1);
    assert_eq!(*sink.ready.lock().unwrap(), [true, true, true, false]);
    let now = sink.network.lock().unwrap().clone();
    assert_eq!(
        now.map(|n| n.describe()),
        Some("unavailable: gone".to_owned())
    );
    assert!(
        second
            .describe()
            .starts_with("ENIConfig b (subnet subnet-0000000b ")
    );
}
