use super::*;

fn eni(id: &str, device_index: Option<u32>, instance: &str) -> Eni {
    Eni {
        id: id.parse().unwrap(),
        mac: "02:00:00:00:00:01".into(),
        subnet_id: "subnet-1".into(),
        vpc_id: "vpc-1".into(),
        availability_zone: "us-east-1a".into(),
        description: String::new(),
        status: EniStatus::InUse,
        primary_ip: Ipv4Addr::new(10, 0, 0, 1),
        secondary_ips: vec![],
        ipv4_prefixes: Vec::new(),
        security_groups: vec![],
        attachment: device_index.map(|d| EniAttachment {
            attachment_id: format!("eni-attach-{d}"),
            instance_id: instance.into(),
            device_index: d,
            status: AttachmentStatus::Attached,
            delete_on_termination: true,
        }),
        tags: BTreeMap::new(),
        ipv6_addresses: Vec::new(),
        ipv6_prefixes: Vec::new(),
    }
}

fn instance(indexes: &[u32]) -> Instance {
    Instance {
        id: "i-1".into(),
        instance_type: "m5.large".into(),
        availability_zone: "us-east-1a".into(),
        vpc_id: "vpc-1".into(),
        subnet_id: "subnet-1".into(),
        enis: indexes
            .iter()
            .enumerate()
            .map(|(n, &d)| eni(&format!("eni-0000000{n}"), Some(d), "i-1"))
            .collect(),
    }
}

#[test]
fn next_free_device_index_fills_gaps_and_respects_limit() {
    let limits = InstanceLimits::new(3, 10);
    assert_eq!(next_free_device_index(&instance(&[0]), &limits), Some(1));
    assert_eq!(next_free_device_index(&instance(&[0, 2]), &limits), Some(1));
    assert_eq!(next_free_device_index(&instance(&[0, 1]), &limits), Some(2));
    assert_eq!(next_free_device_index(&instance(&[0, 1, 2]), &limits), None);
    // Index 0 is never offered, even if the primary were missing from the list.
    assert_eq!(next_free_device_index(&instance(&[]), &limits), Some(1));
}

#[test]
fn tags_carry_owner_cluster_instance_and_parseable_time() {
    let node = NodeContext {
        cluster_name: "prod".into(),
        instance_id: "i-1".into(),
        instance_type: "m5.large".into(),
        availability_zone: "us-east-1a".into(),
        vpc_id: "vpc-1".into(),
        subnet_id: "subnet-1".into(),
        security_groups: vec!["sg-1".into()],
        pod_subnets: Vec::new(),
        limits: InstanceLimits::new(3, 10),
    };
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let t = eni_tags(&node, now);
    assert_eq!(t[tags::OWNER], "eniipam");
    assert_eq!(t[tags::CLUSTER], "prod");
    assert_eq!(t[tags::INSTANCE_ID], "i-1");
    assert_eq!(t[tags::AWS_VPC_CNI_NO_MANAGE], "true");
    assert_eq!(humantime::parse_rfc3339(&t[tags::CREATED_AT]).unwrap(), now);
    assert_eq!(eni_description("i-1"), "eniipam-i-1");
}

#[test]
fn only_our_enis_pass_the_ownership_check() {
    let mut e = eni("eni-00000001", None, "i-1");
    assert!(matches!(check_ours(&e), Err(CloudError::NotOurs { .. })));
    e.tags.insert(tags::OWNER.into(), tags::OWNER_VALUE.into());
    assert!(check_ours(&e).is_ok());
    e.tags.insert(tags::NO_MANAGE.into(), "true".into());
    let err = check_ours(&e).unwrap_err();
    assert!(err.to_string().contains("no-manage"), "{err}");
}
