//! `Cloud::describe_security_groups` through `Ec2Cloud` against mockcloud: the node's groups and an
//! ENIConfig's group are found with their VPC and name (what the daemon checks before it creates
//! ENIs with them), a group that does not exist is EC2's not-found, one of another VPC is seen as
//! such, no ids make no call, and a throttled describe is retried on the describe bucket.

mod cloud_support;

use eniipam::cloud::Cloud;
use eniipam::cloud::calls::Outcome;
use mockcloud::Fault;

use cloud_support::*;

#[tokio::test]
async fn groups_are_described_with_their_vpc_and_name() {
    let env = Env::start().await;
    let vpc = env.node.vpc_id.clone();
    let node_groups = env.node.security_groups.clone();
    assert!(!node_groups.is_empty());
    let db = env
        .mock
        .with_world(|w, _| {
            w.create_security_group_named(Some(&vpc), "db", "db tier", &Default::default())
        })
        .unwrap();
    let (other_vpc, other_default) = env
        .mock
        .create_vpc("10.90.0.0/16".parse().unwrap())
        .unwrap();

    let mut ids = node_groups.clone();
    ids.push(db.clone());
    ids.push(other_default.clone());
    let groups = env.cloud.describe_security_groups(&ids).await.unwrap();
    assert_eq!(groups.len(), ids.len());
    let by_id = |id: &str| groups.iter().find(|g| g.id == id).unwrap().clone();
    assert_eq!(by_id(&node_groups[0]).name, "default");
    assert_eq!(by_id(&node_groups[0]).vpc_id, vpc);
    assert_eq!(
        (by_id(&db).name.as_str(), by_id(&db).vpc_id.as_str()),
        ("db", vpc.as_str())
    );
    // A group of another VPC is described as such: the caller sees it is not the node's VPC's.
    assert_eq!(by_id(&other_default).vpc_id, other_vpc);

    // A group that does not exist fails the call, as EC2's InvalidGroup.NotFound.
    let err = env
        .cloud
        .describe_security_groups(&[db.clone(), "sg-0123456789abcdef0".into()])
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "{err}");
    assert!(err.to_string().contains("sg-0123456789abcdef0"), "{err}");
    // A malformed id is a final rejection, naming it.
    let err = env
        .cloud
        .describe_security_groups(&["sg-nothex".into()])
        .await
        .unwrap_err();
    assert!(!err.is_retryable() && !err.is_not_found(), "{err}");
    assert!(err.to_string().contains("sg-nothex"), "{err}");

    // No ids: no call.
    let before = env.stats.snapshot().calls("DescribeSecurityGroups");
    assert!(
        env.cloud
            .describe_security_groups(&[])
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(env.stats.snapshot().calls("DescribeSecurityGroups"), before);
}

#[tokio::test]
async fn a_throttled_describe_is_retried() {
    let env = Env::start().await;
    let ids = env.node.security_groups.clone();
    env.mock.inject_fault(Fault::error(
        "DescribeSecurityGroups",
        "RequestLimitExceeded",
        2,
    ));
    let groups = env.cloud.describe_security_groups(&ids).await.unwrap();
    assert_eq!(groups.len(), ids.len());
    let s = env.stats.snapshot();
    assert_eq!(s.count("DescribeSecurityGroups", Outcome::Throttled), 2);
    assert_eq!(s.count("DescribeSecurityGroups", Outcome::Ok), 1);
}
