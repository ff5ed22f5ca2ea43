use std::collections::BTreeMap;
use std::time::Duration;

use eniipam_cloud::{Cloud, CloudError, CreateEni, Eni, Metadata, NodeContext};
use ipnet::Ipv6Net;

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
        live_ip_count: None,
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

/// eth0 of the node `with_node` built.
async fn primary(cloud: &MemoryCloud, node: &NodeContext) -> Eni {
    cloud
        .describe_instance(&node.instance_id)
        .await
        .unwrap()
        .enis
        .remove(0)
}

#[tokio::test(start_paused = true)]
async fn ipv6_prefixes_follow_ec2s_rules() {
    let (cloud, node) = MemoryCloud::with_node(NodeSpec::default());
    let eth0 = primary(&cloud, &node).await;
    let subnet6 = NodeSpec::default().subnet_ipv6_cidr.unwrap();
    let vpc6 = NodeSpec::default().vpc_ipv6_cidr.unwrap();
    assert!(vpc6.contains(&subnet6));
    assert_eq!(
        cloud
            .describe_subnet(&node.subnet_id)
            .await
            .unwrap()
            .ipv6_cidrs,
        vec![subnet6]
    );
    let md = cloud.interface(&eth0.mac).await.unwrap().unwrap();
    assert_eq!(
        (md.subnet_ipv6_cidrs, md.vpc_ipv6_cidrs),
        (vec![subnet6], vec![vpc6])
    );

    // One /80 of the subnet's /64, never one covering its reserved first or last address.
    let got = cloud.assign_ipv6_prefixes(&eth0.id, 1).await.unwrap();
    let [p] = got[..] else { panic!("{got:?}") };
    assert_eq!(p.prefix_len(), 80);
    assert!(subnet6.contains(&p) && p.network() != subnet6.network());
    assert_eq!(cloud.eni(&eth0.id).unwrap().ipv6_prefixes, vec![p]);
    let md = cloud.interface(&eth0.mac).await.unwrap().unwrap();
    assert_eq!(md.ipv6_prefixes, vec![p]);
    assert!(md.ipv6s.is_empty());

    // The per-ENI limit (the IPv4 one, 10, IPv6 counted on its own): all or nothing.
    let err = cloud.assign_ipv6_prefixes(&eth0.id, 10).await.unwrap_err();
    assert!(matches!(err, CloudError::IpLimitExceeded { .. }), "{err}");
    assert_eq!(cloud.eni(&eth0.id).unwrap().ipv6_prefixes, vec![p]);
    let nine = cloud.assign_ipv6_prefixes(&eth0.id, 9).await.unwrap();
    assert_eq!(nine.len(), 9);
    assert!(!nine.contains(&p), "never a prefix held already");
    assert_eq!(cloud.ipv6_prefixes_held().len(), 10);

    // Unassign: every one held, or nothing changes.
    let stranger: Ipv6Net = "2600:1f18:6d00:1:ffff::/80".parse().unwrap();
    let err = cloud
        .unassign_ipv6_prefixes(&eth0.id, &[p, stranger])
        .await
        .unwrap_err();
    assert!(
        matches!(&err, CloudError::Rejected { code, .. } if code == "InvalidParameterValue"),
        "{err}"
    );
    assert_eq!(cloud.eni(&eth0.id).unwrap().ipv6_prefixes.len(), 10);
    cloud.unassign_ipv6_prefixes(&eth0.id, &[p]).await.unwrap();
    assert_eq!(cloud.eni(&eth0.id).unwrap().ipv6_prefixes, nine);
    assert!(!cloud.ipv6_prefixes_held().contains(&p));
    assert_eq!(cloud.call_count(Action::AssignIpv6Prefixes), 3);
    assert_eq!(cloud.call_count(Action::UnassignIpv6Prefixes), 2);

    // An unknown ENI is not found.
    let ghost: EniId = "eni-00000000000000999".parse().unwrap();
    assert!(
        cloud
            .assign_ipv6_prefixes(&ghost, 1)
            .await
            .unwrap_err()
            .is_not_found()
    );
}

#[tokio::test(start_paused = true)]
async fn a_subnet_without_ipv6_refuses_prefixes_with_its_own_kind() {
    let (cloud, node) = MemoryCloud::with_node(NodeSpec {
        subnet_ipv6_cidr: None,
        ..NodeSpec::default()
    });
    let eth0 = primary(&cloud, &node).await;
    let err = cloud.assign_ipv6_prefixes(&eth0.id, 1).await.unwrap_err();
    assert!(matches!(err, CloudError::NoIpv6Cidr { .. }), "{err}");
    assert!(err.to_string().contains(&node.subnet_id), "{err}");
    assert!(
        cloud
            .describe_subnet(&node.subnet_id)
            .await
            .unwrap()
            .ipv6_cidrs
            .is_empty()
    );
    let md = cloud.interface(&eth0.mac).await.unwrap().unwrap();
    assert!(md.subnet_ipv6_cidrs.is_empty());

    // Taking the block away is refused while an ENI holds a /80 of it, as EC2 refuses.
    let (cloud, node) = MemoryCloud::with_node(NodeSpec::default());
    let eth0 = primary(&cloud, &node).await;
    let got = cloud.assign_ipv6_prefixes(&eth0.id, 1).await.unwrap();
    let refused = cloud.disassociate_subnet_ipv6().unwrap_err();
    assert!(refused.contains(eth0.id.as_str()), "{refused}");
    cloud.unassign_ipv6_prefixes(&eth0.id, &got).await.unwrap();
    cloud.disassociate_subnet_ipv6().unwrap();
    let err = cloud.assign_ipv6_prefixes(&eth0.id, 1).await.unwrap_err();
    assert!(matches!(err, CloudError::NoIpv6Cidr { .. }), "{err}");
}

#[tokio::test(start_paused = true)]
async fn a_deleted_enis_prefixes_go_back_to_the_subnet() {
    let (cloud, _node) = MemoryCloud::with_node(NodeSpec::default());
    let eni = cloud.create_eni(&create_req(0, "v6")).await.unwrap();
    let got = cloud.assign_ipv6_prefixes(&eni.id, 2).await.unwrap();
    assert_eq!(cloud.ipv6_prefixes_held(), got.iter().copied().collect());
    cloud.delete_eni(&eni.id).await.unwrap();
    assert!(cloud.ipv6_prefixes_held().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_slash_80_assigned_by_value_comes_back_only_while_free_and_well_formed() {
    let (cloud, node) = MemoryCloud::with_node(NodeSpec::default());
    let eth0 = primary(&cloud, &node).await;
    let [p] = cloud.assign_ipv6_prefixes(&eth0.id, 1).await.unwrap()[..] else {
        panic!("one /80")
    };
    cloud.unassign_ipv6_prefixes(&eth0.id, &[p]).await.unwrap();
    // Free again in the subnet: the same /80 by value.
    assert_eq!(
        cloud
            .assign_specific_ipv6_prefixes(&eth0.id, &[p])
            .await
            .unwrap(),
        vec![p]
    );
    assert_eq!(cloud.eni(&eth0.id).unwrap().ipv6_prefixes, vec![p]);
    assert!(cloud.ipv6_prefixes_held().contains(&p));
    assert_eq!(cloud.call_count(Action::AssignSpecificIpv6Prefixes), 1);

    // Held by another ENI (or this one): in use, as EC2 answers.
    let other = cloud.create_eni(&create_req(0, "v6")).await.unwrap();
    let in_use = |err: &CloudError| matches!(err, CloudError::Rejected { code, .. } if code == "InvalidIPAddress.InUse");
    for eni in [&other.id, &eth0.id] {
        let err = cloud
            .assign_specific_ipv6_prefixes(eni, &[p])
            .await
            .unwrap_err();
        assert!(in_use(&err), "{err}");
    }
    // Not an aligned /80 of the subnet's /64, one covering a reserved address, a duplicate: a bad
    // value; nothing assigned.
    let block = cloud
        .describe_subnet(&node.subnet_id)
        .await
        .unwrap()
        .ipv6_cidrs[0];
    let first = Ipv6Net::new(block.network(), 80).unwrap();
    let next = |n: u128| {
        Ipv6Net::new(
            std::net::Ipv6Addr::from(u128::from(block.network()) | (n << 48)),
            80,
        )
        .unwrap()
    };
    let unaligned: Ipv6Net = format!(
        "{}/80",
        std::net::Ipv6Addr::from(u128::from(next(7).network()) + 1)
    )
    .parse()
    .unwrap();
    let outside: Ipv6Net = "2001:db8::/80".parse().unwrap();
    let wide = Ipv6Net::new(next(9).network(), 96).unwrap();
    for bad in [
        vec![unaligned],
        vec![outside],
        vec![wide],
        vec![first],
        vec![next(5), next(5)],
        vec![],
    ] {
        let err = cloud
            .assign_specific_ipv6_prefixes(&other.id, &bad)
            .await
            .unwrap_err();
        assert!(
            matches!(&err, CloudError::Rejected { code, .. } if code == "InvalidParameterValue"),
            "{bad:?}: {err}"
        );
    }
    assert!(cloud.eni(&other.id).unwrap().ipv6_prefixes.is_empty());
    // A subnet without IPv6 answers with its own kind.
    let (bare, node) = MemoryCloud::with_node(NodeSpec {
        subnet_ipv6_cidr: None,
        ..NodeSpec::default()
    });
    let eth0 = primary(&bare, &node).await;
    let err = bare
        .assign_specific_ipv6_prefixes(&eth0.id, &[p])
        .await
        .unwrap_err();
    assert!(matches!(err, CloudError::NoIpv6Cidr { .. }), "{err}");
}

#[tokio::test(start_paused = true)]
async fn security_groups_are_described_by_id_and_a_missing_one_fails_the_call() {
    let (cloud, node) = MemoryCloud::with_node(NodeSpec::default());
    cloud.add_security_group("sg-0000000000000db00", &node.vpc_id, "db");
    cloud.add_security_group("sg-0000000000000e1e0", "vpc-0e1e0e1e", "elsewhere");
    let ids = vec![
        node.security_groups[0].clone(),
        "sg-0000000000000db00".to_owned(),
        "sg-0000000000000e1e0".to_owned(),
    ];
    let groups = cloud.describe_security_groups(&ids).await.unwrap();
    let seen: Vec<(&str, &str, &str)> = groups
        .iter()
        .map(|g| (g.id.as_str(), g.vpc_id.as_str(), g.name.as_str()))
        .collect();
    assert_eq!(
        seen,
        vec![
            (ids[0].as_str(), node.vpc_id.as_str(), "default"),
            ("sg-0000000000000db00", node.vpc_id.as_str(), "db"),
            ("sg-0000000000000e1e0", "vpc-0e1e0e1e", "elsewhere"),
        ]
    );
    let err = cloud
        .describe_security_groups(&["sg-0000000000000dead".to_owned()])
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "{err}");
    assert!(err.to_string().contains("sg-0000000000000dead"), "{err}");
    assert!(
        cloud
            .describe_security_groups(&[])
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(cloud.call_count(Action::DescribeSecurityGroups), 2);
}
