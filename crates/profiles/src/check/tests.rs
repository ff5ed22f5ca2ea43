//! The profiles judged against an in-memory EC2 (memcloud): the set in two calls when all is well,
//! a wrong profile named alone, EC2's transient failure an error to retry.

use eniipam_cloud::CloudError;
use eniipam_memcloud::{Action, MemoryCloud, NodeSpec};

use super::*;
use crate::EgressMode;

fn spec(name: &str, subnet: &str, groups: &[&str]) -> ProfileSpec {
    ProfileSpec {
        name: name.into(),
        subnet: SubnetChoice::Id(subnet.into()),
        security_groups: groups.iter().map(|g| (*g).to_owned()).collect(),
        max_enis: Some(2),
        egress_mode: EgressMode::Strict,
    }
}

fn profiles(valid: &[ProfileSpec], invalid: &[(&str, &str)]) -> Profiles {
    Profiles {
        known: true,
        valid: valid.iter().map(|p| (p.name.clone(), p.clone())).collect(),
        invalid: invalid
            .iter()
            .map(|(n, why)| ((*n).to_owned(), (*why).to_owned()))
            .collect(),
    }
}

#[tokio::test]
async fn usable_profiles_are_checked_in_two_calls_for_the_whole_set() {
    let (cloud, node) = MemoryCloud::with_node(NodeSpec::default());
    cloud.add_security_group("sg-000000db", &node.vpc_id, "db");
    cloud.add_security_group("sg-000000ab", &node.vpc_id, "app");
    let set = profiles(
        &[
            spec("db", &node.subnet_id, &["sg-000000db"]),
            spec("app", &node.subnet_id, &["sg-000000ab", "sg-000000db"]),
        ],
        &[("bad", "NetworkProfile \"bad\": spec.subnet is missing")],
    );
    let judged = judge(&set, cloud.as_ref(), &node)
        .await
        .expect("EC2 answered");
    assert!(judged.known);
    let db = judged.profiles["db"].as_ref().expect("db usable");
    assert_eq!(db.subnet.id, node.subnet_id);
    assert_eq!(db.security_groups, ["sg-000000db"]);
    assert_eq!(db.max_enis, Some(2));
    assert!(
        judged.profiles["bad"]
            .as_ref()
            .is_err_and(|why| why.contains("spec.subnet"))
    );
    assert_eq!(
        judged.usable().keys().collect::<Vec<_>>(),
        ["app", "db"],
        "the invalid one is not handed to the pool"
    );
    assert_eq!(cloud.call_count(Action::DescribeSubnets), 1);
    assert_eq!(cloud.call_count(Action::DescribeSecurityGroups), 1);
}

#[tokio::test]
async fn a_wrong_profile_is_named_alone_and_the_rest_stay_usable() {
    let (cloud, node) = MemoryCloud::with_node(NodeSpec::default());
    cloud.add_security_group("sg-000000db", &node.vpc_id, "db");
    let set = profiles(
        &[
            spec("db", &node.subnet_id, &["sg-000000db"]),
            spec("typo", &node.subnet_id, &["sg-0000beef"]),
            spec("away", "subnet-0000000f", &["sg-000000db"]),
        ],
        &[],
    );
    let judged = judge(&set, cloud.as_ref(), &node)
        .await
        .expect("EC2 answered");
    assert!(judged.profiles["db"].is_ok());
    let typo = judged.profiles["typo"].as_ref().expect_err("unknown group");
    assert!(
        typo.contains("NetworkProfile \"typo\"") && typo.contains("sg-0000beef"),
        "{typo}"
    );
    let away = judged.profiles["away"]
        .as_ref()
        .expect_err("unknown subnet");
    assert!(
        away.contains("subnet-0000000f, which EC2 does not know"),
        "{away}"
    );
}

#[tokio::test]
async fn ec2_failing_transiently_is_an_error_to_retry_not_a_verdict() {
    let (cloud, node) = MemoryCloud::with_node(NodeSpec::default());
    let set = profiles(&[spec("db", &node.subnet_id, &["sg-0a1b2c3d"])], &[]);
    let throttled = CloudError::Throttled {
        api: "DescribeSubnets".into(),
        code: "RequestLimitExceeded".into(),
    };
    cloud.fail_next(Action::DescribeSubnets, 1, throttled);
    let got = judge(&set, cloud.as_ref(), &node).await;
    assert!(got.is_err_and(|e| e.is_transient()));
    // No profile at all: nothing to ask EC2.
    let none = judge(&profiles(&[], &[]), cloud.as_ref(), &node).await;
    assert_eq!(none.expect("no call").profiles.len(), 0);
}

#[tokio::test]
async fn sync_groups_without_a_usable_profile_asks_nothing() {
    let (cloud, node) = MemoryCloud::with_node(NodeSpec::default());
    let judged = Judged {
        known: true,
        profiles: BTreeMap::from([("bad".to_owned(), Err("why".to_owned()))]),
    };
    assert_eq!(
        sync_groups(&judged, cloud.as_ref(), &node).await.ok(),
        Some(0)
    );
    assert!(cloud.calls().is_empty(), "{:?}", cloud.calls());
}
