//! The daemon's cloud layer against mockcloud with the real SDK clients: domain mapping, the ENI
//! lifecycle, ClientToken reuse, ambiguous assigns, typed capacity errors, IMDS lag.

mod cloud_support;

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use eniipam::cloud::calls::{CallStats, Outcome};
use eniipam::cloud::lifecycle::{LifecycleConfig, next_free_device_index};
use eniipam::cloud::limiter::BackoffPolicy;
use eniipam::cloud::{
    AttachmentStatus, Cloud, CloudError, CreateEni, EniFilter, EniStatus, Metadata, tags,
};
use mockcloud::Fault;

use cloud_support::*;

#[tokio::test]
async fn describes_map_to_domain_types() {
    let env = Env::start().await;
    let inst = env
        .cloud
        .describe_instance(&env.instance.instance_id)
        .await
        .unwrap();
    assert_eq!(inst.id, env.instance.instance_id);
    assert_eq!(inst.instance_type, "m5.large");
    assert_eq!(inst.subnet_id, env.instance.subnet_id);
    assert_eq!(inst.enis.len(), 1);
    let primary = &inst.enis[0];
    assert_eq!(primary.id.as_str(), env.instance.primary_eni);
    assert_eq!(primary.primary_ip, env.instance.private_ip);
    assert_eq!(primary.attachment.as_ref().unwrap().device_index, 0);
    assert!(!primary.is_managed_by_us());
    assert_eq!(next_free_device_index(&inst, &env.node.limits), Some(1));

    let limits = env.cloud.instance_limits("m5.large").await.unwrap();
    assert_eq!((limits.max_enis, limits.ipv4_per_eni), (3, 10));

    let subnet = env
        .cloud
        .describe_subnet(&env.instance.subnet_id)
        .await
        .unwrap();
    assert_eq!(subnet.cidr.to_string(), "10.0.0.0/20");
    assert_eq!(subnet.gateway(), Ipv4Addr::new(10, 0, 0, 1));
    assert!(subnet.available_ips > 4000);

    let err = env
        .cloud
        .describe_subnet("subnet-0000dead")
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "{err}");
    let err = env.cloud.instance_limits("bogus.type").await.unwrap_err();
    assert!(!err.is_retryable(), "{err}");
}

#[tokio::test]
async fn describe_enis_follows_next_token_pages() {
    let mock = mockcloud::MockCloud::start(mockcloud::Config::fast())
        .await
        .unwrap();
    let inst = mock.default_instance();
    let stats = Arc::new(CallStats::new());
    let cloud = Ec2CloudBuilder::paged(&mock, 5, stats.clone()).await;
    for _ in 0..12 {
        cloud
            .create_eni(&CreateEni {
                subnet_id: inst.subnet_id.clone(),
                security_groups: inst.security_groups.clone(),
                description: "page".into(),
                secondary_ip_count: 0,
                prefix_count: 0,
                private_ips: Vec::new(),
                tags: tag_map(&[(tags::CLUSTER, "paged")]),
                client_token: uuid::Uuid::new_v4().to_string(),
                live_ip_count: None,
            })
            .await
            .unwrap();
    }
    let found = cloud
        .describe_enis(&EniFilter {
            tags: tag_map(&[(tags::CLUSTER, "paged")]),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(found.len(), 12);
    assert_eq!(
        found.iter().map(|e| &e.id).collect::<BTreeSet<_>>().len(),
        12
    );
    // 12 ENIs at 5 per page: 3 pages.
    assert_eq!(stats.snapshot().calls("DescribeNetworkInterfaces"), 3);
}

/// Builds clients with a custom page size.
struct Ec2CloudBuilder;

impl Ec2CloudBuilder {
    async fn paged(
        mock: &mockcloud::MockCloud,
        page: u32,
        stats: Arc<CallStats>,
    ) -> eniipam::cloud::ec2::Ec2Cloud {
        eniipam::cloud::ec2::Ec2Cloud::new(
            &eniipam::cloud::ec2::Ec2Config {
                region: Some("us-east-1".into()),
                endpoint_url: Some(mock.ec2_url()),
                credentials: Some(aws_sdk_ec2::config::Credentials::new(
                    "AKID", "s", None, None, "t",
                )),
                describe_page_size: page,
                limiter: fast_limiter(),
                ..Default::default()
            },
            stats,
        )
        .await
        .unwrap()
    }
}

#[tokio::test]
async fn lifecycle_creates_attaches_and_deletes() {
    let env = Env::start().await;
    let lc = env.lifecycle(fast_lifecycle());
    let idx = lc.next_device_index().await.unwrap().unwrap();
    assert_eq!(idx, 1);
    let eni = lc.create_and_attach(4, idx).await.unwrap();
    assert_eq!(eni.secondary_ips.len(), 4);
    assert!(eni.is_managed_by_us());
    let att = eni.attachment.clone().unwrap();
    assert_eq!(att.device_index, 1);
    assert_eq!(att.instance_id, env.instance.instance_id);

    // EC2's view: tagged in the create call, DeleteOnTermination set, attached.
    let view = env
        .mock
        .network_interfaces()
        .into_iter()
        .find(|e| e.id == eni.id.as_str())
        .unwrap();
    assert_eq!(
        view.description,
        format!("eniipam-{}", env.instance.instance_id)
    );
    assert_eq!(view.tags[tags::OWNER], "eniipam");
    assert_eq!(view.tags[tags::CLUSTER], CLUSTER);
    assert_eq!(view.tags[tags::INSTANCE_ID], env.instance.instance_id);
    assert!(humantime::parse_rfc3339(&view.tags[tags::CREATED_AT]).is_ok());
    assert!(view.attachment.as_ref().unwrap().delete_on_termination);
    assert_eq!(view.security_groups, env.node.security_groups);

    // IMDS shows it with every IP.
    let md = env.imds.interface(&eni.mac).await.unwrap().unwrap();
    assert_eq!(md.eni_id, eni.id);
    assert_eq!(md.device_number, 1);
    assert_eq!(md.ips.len(), 5);
    assert_eq!(md.ips[0], eni.primary_ip);

    // The next free index moves on.
    assert_eq!(lc.next_device_index().await.unwrap(), Some(2));

    lc.detach_and_delete(&eni).await.unwrap();
    assert!(!env.eni_ids().contains(&eni.id.to_string()));
    // Deleting again is fine: already gone.
    lc.detach_and_delete(&eni).await.unwrap();
}

#[tokio::test]
async fn detach_and_delete_refuses_enis_that_are_not_ours() {
    let env = Env::start().await;
    let lc = env.lifecycle(fast_lifecycle());
    let inst = env
        .cloud
        .describe_instance(&env.instance.instance_id)
        .await
        .unwrap();
    let primary = inst.enis[0].clone();
    let err = lc.detach_and_delete(&primary).await.unwrap_err();
    assert!(matches!(err, CloudError::NotOurs { .. }), "{err}");

    // Ours by tag, but opted out in EC2 after we looked: refused on EC2's current view.
    let eni = lc.create_and_attach(1, 1).await.unwrap();
    env.cloud
        .create_tags(eni.id.as_str(), &tag_map(&[(tags::NO_MANAGE, "true")]))
        .await
        .unwrap();
    let err = lc.detach_and_delete(&eni).await.unwrap_err();
    assert!(matches!(err, CloudError::NotOurs { .. }), "{err}");
    assert!(env.eni_ids().contains(&eni.id.to_string()));
    assert!(
        env.mock
            .instance(&env.instance.instance_id)
            .unwrap()
            .enis
            .len()
            == 2
    );
}

#[tokio::test]
async fn create_retry_reuses_the_client_token() {
    // The first create is performed but its reply comes after our 300 ms attempt timeout.
    let env = Env::start_with(
        mockcloud::Config::fast(),
        fast_limiter(),
        Duration::from_millis(300),
    )
    .await;
    env.mock.inject_fault(Fault::slow_reply(
        "CreateNetworkInterface",
        Duration::from_millis(800),
        1,
    ));
    let before = env.eni_ids().len();
    let lc = env.lifecycle(fast_lifecycle());
    let eni = lc.create_and_attach(2, 1).await.unwrap();
    let after = env.mock.network_interfaces();
    assert_eq!(
        after.len(),
        before + 1,
        "exactly one ENI was created: {after:#?}"
    );
    assert!(after.iter().any(|e| e.id == eni.id.as_str()));
    let snap = env.stats.snapshot();
    assert_eq!(snap.count("CreateNetworkInterface", Outcome::Transient), 1);
    assert_eq!(snap.count("CreateNetworkInterface", Outcome::Ok), 1);
    assert_eq!(snap.retries("CreateNetworkInterface"), 1);
    assert_eq!(env.mock.counters().calls("CreateNetworkInterface"), 2);
}

#[tokio::test]
async fn assign_after_an_ambiguous_failure_returns_exactly_the_new_ips() {
    let env = Env::start_with(
        mockcloud::Config::fast(),
        fast_limiter(),
        Duration::from_millis(300),
    )
    .await;
    let lc = env.lifecycle(fast_lifecycle());
    let eni = lc.create_and_attach(1, 1).await.unwrap();
    let before = ips_on(&env, &eni.id);

    // Performed, reply lost to the timeout: the IPs are found by describing, not assigned twice.
    env.mock.inject_fault(Fault::slow_reply(
        "AssignPrivateIpAddresses",
        Duration::from_millis(800),
        1,
    ));
    let got = env.cloud.assign_ips(&eni.id, 3).await.unwrap();
    let after = ips_on(&env, &eni.id);
    assert_eq!(got.len(), 3);
    let new: BTreeSet<Ipv4Addr> = after.difference(&before).copied().collect();
    assert_eq!(new, got.iter().copied().collect::<BTreeSet<_>>());
    assert_eq!(after.len(), before.len() + 3);
    // One request reached EC2 (its reply was lost to our timeout), and none after it.
    assert_eq!(
        env.mock.counters().calls("AssignPrivateIpAddresses"),
        1,
        "assigned once"
    );

    // Not performed (a hang that ends in a 500): retried, and exactly the new IPs come back.
    let before = after;
    env.mock.inject_fault(Fault::hang(
        "AssignPrivateIpAddresses",
        Duration::from_millis(10),
        1,
    ));
    let got = env.cloud.assign_ips(&eni.id, 2).await.unwrap();
    let after = ips_on(&env, &eni.id);
    let new: BTreeSet<Ipv4Addr> = after.difference(&before).copied().collect();
    assert_eq!(new, got.iter().copied().collect::<BTreeSet<_>>());
    assert_eq!(got.len(), 2);
    // The hung call and its retry.
    assert_eq!(env.mock.counters().calls("AssignPrivateIpAddresses"), 3);

    // Unassign after an ambiguous failure: done once, reported done.
    env.mock.inject_fault(Fault::slow_reply(
        "UnassignPrivateIpAddresses",
        Duration::from_millis(800),
        1,
    ));
    env.cloud.unassign_ips(&eni.id, &got).await.unwrap();
    let now = ips_on(&env, &eni.id);
    assert!(got.iter().all(|ip| !now.contains(ip)));
    assert_eq!(now.len(), after.len() - 2);
}

#[tokio::test]
async fn capacity_and_permission_errors_are_typed_and_not_retried() {
    let env = Env::start().await;
    let lc = env.lifecycle(fast_lifecycle());
    let eni = lc.create_and_attach(0, 1).await.unwrap();

    // Subnet exhaustion (injected): typed, one call, no retry.
    env.mock.inject_fault(Fault::error(
        "AssignPrivateIpAddresses",
        "InsufficientFreeAddressesInSubnet",
        1,
    ));
    let calls_before = env.mock.counters().calls("AssignPrivateIpAddresses");
    let err = env.cloud.assign_ips(&eni.id, 2).await.unwrap_err();
    assert!(matches!(err, CloudError::SubnetFull { .. }), "{err}");
    assert!(err.is_capacity());
    assert_eq!(
        env.mock.counters().calls("AssignPrivateIpAddresses"),
        calls_before + 1
    );

    // The per-ENI limit, enforced by mockcloud (m5.large: 10 IPv4 per ENI, the primary included).
    let err = env.cloud.assign_ips(&eni.id, 10).await.unwrap_err();
    assert!(matches!(err, CloudError::IpLimitExceeded { .. }), "{err}");

    // The attachment limit (m5.large: 3 ENIs): index 2 fills it, a 4th ENI cannot attach — and
    // the failed create is cleaned up, nothing leaks.
    lc.create_and_attach(0, 2).await.unwrap();
    let count_before = env.eni_ids().len();
    let err = lc.create_and_attach(0, 3).await.unwrap_err();
    assert!(
        matches!(
            err,
            CloudError::AttachmentLimitExceeded { .. } | CloudError::Rejected { .. }
        ),
        "{err}"
    );
    assert_eq!(
        env.eni_ids().len(),
        count_before,
        "the unattachable ENI was deleted"
    );

    // A missing IAM permission names it.
    env.mock.deny("CreateTags", true);
    let err = env
        .cloud
        .create_tags(eni.id.as_str(), &tag_map(&[("k", "v")]))
        .await
        .unwrap_err();
    assert!(matches!(err, CloudError::Unauthorized { .. }), "{err}");
    assert!(err.to_string().contains("ec2:CreateTags"), "{err}");

    let snap = env.stats.snapshot();
    assert_eq!(snap.retries("AssignPrivateIpAddresses"), 0);
    assert_eq!(snap.retries("CreateTags"), 0);
    assert_eq!(snap.count("AssignPrivateIpAddresses", Outcome::Capacity), 2);
    assert_eq!(snap.count("CreateTags", Outcome::Unauthorized), 1);
}

#[tokio::test]
async fn failed_attach_deletes_the_created_eni() {
    let env = Env::start().await;
    let lc = env.lifecycle(fast_lifecycle());
    let before = env.eni_ids();
    env.mock.inject_fault(Fault::error(
        "AttachNetworkInterface",
        "InvalidParameterValue",
        1,
    ));
    let err = lc.create_and_attach(2, 1).await.unwrap_err();
    assert!(matches!(err, CloudError::Rejected { .. }), "{err}");
    assert_eq!(env.eni_ids(), before, "nothing leaked");
    assert_eq!(env.mock.counters().ok("DeleteNetworkInterface"), 1);

    // DeleteOnTermination refused after the attach: the attached ENI and its IPs are kept (tearing
    // it down would cost more calls than it saves), flagged as not deleted on termination.
    env.mock.inject_fault(Fault::error(
        "ModifyNetworkInterfaceAttribute",
        "InvalidParameterValue",
        1,
    ));
    let eni = lc.create_and_attach(2, 1).await.unwrap();
    let att = eni.attachment.as_ref().unwrap();
    assert_eq!(att.device_index, 1);
    assert!(!att.delete_on_termination);
    assert_eq!(eni.secondary_ips.len(), 2);
    assert_eq!(env.mock.counters().calls("DetachNetworkInterface"), 0);

    // The next ENI planned for index 1 (taken, as if behind the caller's back) goes to index 2.
    let next = lc.create_and_attach(1, 1).await.unwrap();
    assert_eq!(next.attachment.as_ref().unwrap().device_index, 2);
    assert_eq!(env.mock.counters().calls("AttachNetworkInterface"), 4);
}

#[tokio::test]
async fn imds_lag_is_ridden_out() {
    let env = Env::start().await;
    env.mock.set_imds_lag(Duration::from_millis(700));
    let lc = env.lifecycle(fast_lifecycle());
    let start = tokio::time::Instant::now();
    let eni = lc.create_and_attach(3, 1).await.unwrap();
    assert!(
        start.elapsed() >= Duration::from_millis(600),
        "waited for IMDS: {:?}",
        start.elapsed()
    );
    // When create_and_attach returns, IMDS shows the ENI with all its IPs.
    let md = env
        .imds
        .interface(&eni.mac)
        .await
        .unwrap()
        .expect("visible in IMDS");
    assert_eq!(md.ips.len(), 4);
    assert!(
        env.stats
            .snapshot()
            .count("imds:interface-id", Outcome::NotFound)
            >= 1
    );
}

#[tokio::test]
async fn imds_lag_beyond_the_bound_defers_to_ec2() {
    let env = Env::start().await;
    env.mock.set_imds_lag(Duration::from_secs(30));
    let short = BackoffPolicy::polling(
        Duration::from_millis(10),
        Duration::from_millis(50),
        Duration::from_millis(300),
    );
    let lc = env.lifecycle(LifecycleConfig {
        imds_wait: short,
        ..fast_lifecycle()
    });
    let start = tokio::time::Instant::now();
    let eni = lc.create_and_attach(2, 1).await.unwrap();
    assert!(start.elapsed() < Duration::from_secs(3));
    assert!(
        env.imds.interface(&eni.mac).await.unwrap().is_none(),
        "IMDS still lags"
    );
    let att = eni.attachment.expect("EC2 confirms the attachment");
    assert_eq!(att.instance_id, env.instance.instance_id);
    assert!(matches!(
        att.status,
        AttachmentStatus::Attached | AttachmentStatus::Attaching
    ));
    assert_eq!(eni.secondary_ips.len(), 2);
    assert!(eni.status == EniStatus::InUse || eni.status == EniStatus::Attaching);
}

#[tokio::test]
async fn imds_reads_identity_and_interfaces() {
    let env = Env::start().await;
    let id = env.imds.identity().await.unwrap();
    assert_eq!(id.instance_id, env.instance.instance_id);
    assert_eq!(id.instance_type, "m5.large");
    assert_eq!(id.availability_zone, env.instance.availability_zone);
    assert_eq!(id.mac, env.instance.mac);

    let lc = env.lifecycle(fast_lifecycle());
    let eni = lc.create_and_attach(2, 1).await.unwrap();
    let all = env.imds.interfaces().await.unwrap();
    assert_eq!(all.len(), 2);
    assert_eq!(all[0].device_number, 0);
    assert_eq!(all[0].eni_id.as_str(), env.instance.primary_eni);
    assert_eq!(all[0].ips[0], env.instance.private_ip);
    assert_eq!(all[0].subnet_cidr.to_string(), "10.0.0.0/20");
    assert_eq!(all[0].vpc_cidrs.len(), 1);
    assert_eq!(all[0].security_groups, env.instance.security_groups);
    assert_eq!(all[1].eni_id, eni.id);
    assert_eq!(all[1].ips.len(), 3);

    assert_eq!(env.imds.interface("02:ff:ff:ff:ff:ff").await.unwrap(), None);
    let snap = env.stats.snapshot();
    assert!(snap.count("imds:instance-id", Outcome::Ok) >= 1);

    // A dead IMDS endpoint is a typed metadata error.
    let dead = eniipam::cloud::imds::ImdsMetadata::new(
        &eniipam::cloud::imds::ImdsConfig {
            endpoint: Some("http://127.0.0.1:9".into()),
            timeout: Duration::from_millis(200),
            max_attempts: 1,
        },
        Arc::new(CallStats::new()),
    )
    .unwrap();
    let err = dead.identity().await.unwrap_err();
    assert!(matches!(err, CloudError::Metadata(_)), "{err}");
}
