use std::collections::BTreeMap;
use std::time::Duration;

use eniipam_cloud::{Cloud, CloudError, CreateEni, Metadata};

use super::*;

fn create_req(count: u32, token: &str) -> CreateEni {
    CreateEni {
        subnet_id: NodeSpec::default().subnet_id,
        security_groups: vec![],
        description: "test".into(),
        secondary_ip_count: count,
        prefix_count: 0,
        private_ips: Vec::new(),
        tags: BTreeMap::new(),
        client_token: token.into(),
    }
}

#[tokio::test(start_paused = true)]
async fn created_enis_show_in_metadata_and_limits_hold() {
    let (cloud, node) = MemoryCloud::with_node(NodeSpec::default());
    let eni = cloud.create_eni(&create_req(3, "t1")).await.unwrap();
    assert_eq!(eni.secondary_ips.len(), 3);
    let again = cloud.create_eni(&create_req(3, "t1")).await.unwrap();
    assert_eq!(again.id, eni.id, "client token makes create idempotent");
    let attachment = cloud
        .attach_eni(&eni.id, &node.instance_id, 1)
        .await
        .unwrap();
    cloud
        .set_delete_on_termination(&eni.id, &attachment)
        .await
        .unwrap();
    let md = cloud
        .interface(&eni.mac)
        .await
        .unwrap()
        .expect("listed in IMDS");
    assert_eq!(md.device_number, 1);
    assert_eq!(md.ips.len(), 4);
    assert_eq!(md.ips[0], eni.primary_ip);

    let err = cloud.assign_ips(&eni.id, 7).await.unwrap_err();
    assert!(matches!(err, CloudError::IpLimitExceeded { .. }), "{err}");
    let more = cloud.assign_ips(&eni.id, 6).await.unwrap();
    assert_eq!(more.len(), 6);

    let e2 = cloud.create_eni(&create_req(1, "t2")).await.unwrap();
    cloud
        .attach_eni(&e2.id, &node.instance_id, 2)
        .await
        .unwrap();
    let e3 = cloud.create_eni(&create_req(1, "t3")).await.unwrap();
    let err = cloud
        .attach_eni(&e3.id, &node.instance_id, 3)
        .await
        .unwrap_err();
    assert!(
        matches!(err, CloudError::AttachmentLimitExceeded { .. }),
        "{err}"
    );

    let err = cloud.delete_eni(&eni.id).await.unwrap_err();
    assert!(
        matches!(err, CloudError::Rejected { .. }),
        "in-use delete: {err}"
    );
    cloud.detach_eni(&attachment, false).await.unwrap();
    cloud.delete_eni(&eni.id).await.unwrap();
    assert!(cloud.eni(&eni.id).is_none());
    assert_eq!(cloud.call_count(Action::CreateNetworkInterface), 3 + 1);
}

#[tokio::test(start_paused = true)]
async fn subnet_runs_out_and_faults_are_injected() {
    let (cloud, node) = MemoryCloud::with_node(NodeSpec {
        subnet_cidr: "10.0.1.0/28".parse().unwrap(),
        ..NodeSpec::default()
    });
    // /28: 16 addresses, 5 reserved, 1 taken by eth0.
    assert_eq!(cloud.subnet_free(), 10);
    let eni = cloud.create_eni(&create_req(9, "t")).await.unwrap();
    assert_eq!(cloud.subnet_free(), 0);
    cloud
        .attach_eni(&eni.id, &node.instance_id, 1)
        .await
        .unwrap();
    let err = cloud.create_eni(&create_req(1, "u")).await.unwrap_err();
    assert!(err.is_capacity(), "{err}");

    cloud
        .unassign_ips(&eni.id, &eni.secondary_ips[..2])
        .await
        .unwrap();
    assert_eq!(cloud.subnet_free(), 2);
    let injected = CloudError::Transient {
        api: "AssignPrivateIpAddresses".into(),
        message: "boom".into(),
    };
    cloud.fail_next(Action::AssignPrivateIpAddresses, 2, injected.clone());
    assert_eq!(cloud.assign_ips(&eni.id, 1).await.unwrap_err(), injected);
    assert_eq!(cloud.assign_ips(&eni.id, 1).await.unwrap_err(), injected);
    assert_eq!(cloud.assign_ips(&eni.id, 1).await.unwrap().len(), 1);
    let calls = cloud.calls_of(Action::AssignPrivateIpAddresses);
    assert_eq!(calls.len(), 3);
    assert_eq!(calls[0].error.as_ref(), Some(&injected));
    assert!(calls[2].error.is_none());
    assert!(calls[2].args.contains("count=1"));

    cloud.fail_rate(Action::DescribeSubnets, 1.0, injected.clone());
    assert!(cloud.describe_subnet(&node.subnet_id).await.is_err());
    cloud.clear_faults();
    assert_eq!(
        cloud
            .describe_subnet(&node.subnet_id)
            .await
            .unwrap()
            .available_ips,
        1
    );
}

#[tokio::test(start_paused = true)]
async fn latency_uses_tokio_time() {
    let (cloud, node) = MemoryCloud::with_node(NodeSpec::default());
    cloud.set_latency(Action::DescribeInstances, Duration::from_secs(2));
    let start = tokio::time::Instant::now();
    let inst = cloud.describe_instance(&node.instance_id).await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_secs(2));
    assert_eq!(inst.enis.len(), 1);
    assert_eq!(inst.enis[0].attachment.as_ref().unwrap().device_index, 0);
}
