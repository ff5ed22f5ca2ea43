//! A VPC's secondary IPv4 CIDR blocks through the real `aws-sdk-ec2` client: AssociateVpcCidrBlock
//! with EC2's rules (size, overlap, the five-block quota, the ranges a 10.x primary permits), a pod
//! subnet in 100.64.0.0/16 and an ENI in it, IMDS `vpc-ipv4-cidr-blocks` listing every block on
//! every interface, the state dump, the control API route, IAM and the throttling bucket.

use aws_sdk_ec2::types::VpcCidrBlockStateCode;
use mockcloud::iam::Policy;
use mockcloud::{Config, MockCloud, VPC_IPV4_CIDR_LIMIT};

mod support;
use support::{code, create_eni, ec2, fast, imds_raw};

async fn associate(c: &aws_sdk_ec2::Client, vpc: &str, cidr: &str) -> Result<String, String> {
    c.associate_vpc_cidr_block()
        .vpc_id(vpc)
        .cidr_block(cidr)
        .send()
        .await
        .map(|o| {
            o.cidr_block_association()
                .and_then(|a| a.cidr_block())
                .unwrap_or_default()
                .to_owned()
        })
        .map_err(code)
}

#[tokio::test]
async fn a_pod_subnet_in_a_secondary_block_shows_in_imds_and_the_dump() {
    let mock = fast().await;
    let c = ec2(&mock);
    let d = mock.default_world().unwrap();

    // Before the association, a subnet in 100.64.0.0/16 is outside the VPC.
    let e = mock
        .create_subnet(&d.vpc_id, "100.64.0.0/19".parse().unwrap(), "us-east-1a")
        .unwrap_err();
    assert_eq!(e.code, "InvalidSubnet.Range");

    let out = c
        .associate_vpc_cidr_block()
        .vpc_id(&d.vpc_id)
        // Not canonical: EC2 keeps the canonical form.
        .cidr_block("100.64.7.9/16")
        .send()
        .await
        .unwrap();
    assert_eq!(out.vpc_id(), Some(d.vpc_id.as_str()));
    let a = out.cidr_block_association().unwrap();
    assert_eq!(a.cidr_block(), Some("100.64.0.0/16"));
    assert!(a.association_id().unwrap().starts_with("vpc-cidr-assoc-"));
    assert_eq!(
        a.cidr_block_state().and_then(|s| s.state()),
        Some(&VpcCidrBlockStateCode::Associated)
    );
    assert_eq!(
        mock.vpc_ipv4_cidrs(&d.vpc_id),
        vec![d.vpc_cidr, "100.64.0.0/16".parse().unwrap()]
    );

    // A subnet inside the new block, an ENI in it attached to the node (primary in 10.0.0.0/20).
    let pods = mock
        .create_subnet(&d.vpc_id, "100.64.0.0/19".parse().unwrap(), "us-east-1a")
        .unwrap();
    let eni = create_eni(&c, &pods).await;
    let ip = c
        .describe_network_interfaces()
        .network_interface_ids(&eni)
        .send()
        .await
        .unwrap()
        .network_interfaces()[0]
        .private_ip_address()
        .unwrap()
        .parse::<std::net::Ipv4Addr>()
        .unwrap();
    assert!(
        "100.64.0.0/19"
            .parse::<ipnet::Ipv4Net>()
            .unwrap()
            .contains(&ip)
    );
    c.attach_network_interface()
        .network_interface_id(&eni)
        .instance_id(&d.instance.instance_id)
        .device_index(1)
        .send()
        .await
        .unwrap();
    let eni_mac = mock
        .network_interfaces()
        .into_iter()
        .find(|e| e.id == eni)
        .unwrap()
        .mac;
    // IMDS: every interface lists both blocks, primary first; the singular key is the primary.
    let base = "/latest/meta-data/network/interfaces/macs";
    for mac in [&d.instance.mac, &eni_mac] {
        let (status, blocks) = imds_raw(
            &d.instance.imds_url,
            &format!("{base}/{mac}/vpc-ipv4-cidr-blocks"),
        )
        .await;
        // The new ENI appears after the IMDS lag; the primary's answer is immediate.
        if status == 404 {
            continue;
        }
        assert_eq!(blocks, "10.0.0.0/16\n100.64.0.0/16", "{mac}");
        let (_, one) = imds_raw(
            &d.instance.imds_url,
            &format!("{base}/{mac}/vpc-ipv4-cidr-block"),
        )
        .await;
        assert_eq!(one, "10.0.0.0/16");
    }
    let view = mock.imds_view(&d.instance.instance_id).unwrap();
    assert!(
        view.interfaces
            .iter()
            .all(|i| i.vpc_cidrs.len() == 2 && i.vpc_cidr == d.vpc_cidr)
    );
    // The state dump vpclab reads carries every block.
    let dump = mock.dump();
    let vpc = dump["vpcs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["id"] == d.vpc_id.as_str())
        .unwrap();
    assert_eq!(
        vpc["cidrs"],
        serde_json::json!(["10.0.0.0/16", "100.64.0.0/16"])
    );
    assert_eq!(vpc["cidr"], "10.0.0.0/16");
}

#[tokio::test]
async fn ec2s_rules_refuse_bad_blocks_with_ec2s_codes() {
    let mock = fast().await;
    let c = ec2(&mock);
    let d = mock.default_world().unwrap();
    let vpc = d.vpc_id.as_str();
    // Size: /16 to /28 only.
    assert_eq!(
        associate(&c, vpc, "100.64.0.0/15").await.unwrap_err(),
        "InvalidVpc.Range"
    );
    assert_eq!(
        associate(&c, vpc, "100.64.0.0/29").await.unwrap_err(),
        "InvalidVpc.Range"
    );
    // Overlap with the primary or another block.
    assert_eq!(
        associate(&c, vpc, "10.0.4.0/24").await.unwrap_err(),
        "InvalidVpc.Range"
    );
    associate(&c, vpc, "100.64.0.0/16").await.unwrap();
    assert_eq!(
        associate(&c, vpc, "100.64.128.0/20").await.unwrap_err(),
        "InvalidVpc.Range"
    );
    // The table: a 10.x primary cannot add other RFC 1918 space or 198.19.0.0/16.
    for cidr in ["172.20.0.0/16", "192.168.0.0/16", "198.19.0.0/16"] {
        let e = c
            .associate_vpc_cidr_block()
            .vpc_id(vpc)
            .cidr_block(cidr)
            .send()
            .await
            .unwrap_err()
            .into_service_error();
        assert_eq!(
            aws_sdk_ec2::error::ProvideErrorMetadata::code(&e),
            Some("InvalidVpc.Range"),
            "{cidr}"
        );
        let m = aws_sdk_ec2::error::ProvideErrorMetadata::message(&e).unwrap();
        assert!(m.contains(cidr) && m.contains("restricted"), "{m}");
    }
    // Another 10.x block and publicly routable space are fine.
    associate(&c, vpc, "10.8.0.0/16").await.unwrap();
    associate(&c, vpc, "54.20.0.0/20").await.unwrap();
    // Five blocks with the primary: the sixth is over EC2's default quota.
    associate(&c, vpc, "100.65.0.0/16").await.unwrap();
    assert_eq!(mock.vpc_ipv4_cidrs(vpc).len(), VPC_IPV4_CIDR_LIMIT);
    assert_eq!(
        associate(&c, vpc, "100.66.0.0/16").await.unwrap_err(),
        "CidrLimitExceeded"
    );
    // Unknown, malformed VPC; no CidrBlock at all.
    assert_eq!(
        associate(&c, "vpc-0123456789abcdef0", "100.66.0.0/16")
            .await
            .unwrap_err(),
        "InvalidVpcID.NotFound"
    );
    assert_eq!(
        associate(&c, "vpc-x", "100.66.0.0/16").await.unwrap_err(),
        "InvalidVpcID.Malformed"
    );
    let e = c
        .associate_vpc_cidr_block()
        .vpc_id(vpc)
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(e), "MissingParameter");
    // Nothing refused was kept.
    assert_eq!(
        mock.vpc_ipv4_cidrs(vpc)
            .iter()
            .map(|c| c.to_string())
            .collect::<Vec<_>>(),
        [
            "10.0.0.0/16",
            "100.64.0.0/16",
            "10.8.0.0/16",
            "54.20.0.0/20",
            "100.65.0.0/16"
        ]
    );
}

#[tokio::test]
async fn control_api_iam_and_throttling_apply_to_the_association() {
    let mock = MockCloud::start(Config {
        throttling: mockcloud::Throttling::default(),
        ..Config::fast()
    })
    .await
    .unwrap();
    let c = ec2(&mock);
    let d = mock.default_world().unwrap();

    // The control API associates a block for tests, with the same rules.
    let http = reqwest::Client::new();
    let url = format!("{}/vpcs/{}/cidrs", mock.control_url(), d.vpc_id);
    let r = http
        .post(&url)
        .json(&serde_json::json!({"cidr": "100.64.0.0/16"}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["cidr"], "100.64.0.0/16");
    assert_eq!(body["vpc_id"], d.vpc_id.as_str());
    let r = http
        .post(&url)
        .json(&serde_json::json!({"cidr": "172.16.0.0/16"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    assert!(r.text().await.unwrap().contains("InvalidVpc.Range"));

    // IAM: the action is authorized on the VPC (the shipped node policy does not grant it).
    mock.set_iam_policy(Some(
        Policy::parse(
            &serde_json::json!({"Version": "2012-10-17", "Statement": [
                {"Effect": "Allow", "Action": ["ec2:Describe*"], "Resource": "*"}]})
            .to_string(),
        )
        .unwrap(),
    ));
    let e = c
        .associate_vpc_cidr_block()
        .vpc_id(&d.vpc_id)
        .cidr_block("100.65.0.0/16")
        .send()
        .await
        .unwrap_err()
        .into_service_error();
    assert_eq!(
        aws_sdk_ec2::error::ProvideErrorMetadata::code(&e),
        Some("UnauthorizedOperation")
    );
    let m = aws_sdk_ec2::error::ProvideErrorMetadata::message(&e).unwrap();
    assert!(
        m.contains("ec2:AssociateVpcCidrBlock") && m.contains(&format!("vpc/{}", d.vpc_id)),
        "{m}"
    );
    assert_eq!(
        mock.iam_denials().last().unwrap().action,
        "ec2:AssociateVpcCidrBlock"
    );
    mock.set_iam_policy(None);
    assert_eq!(
        mock.vpc_ipv4_cidrs(&d.vpc_id).len(),
        2,
        "the denied call kept nothing"
    );

    // Throttling: its own bucket of the mutating category's size.
    let (_, levels) = mock.throttling();
    let b = levels
        .iter()
        .find(|b| b.bucket == "AssociateVpcCidrBlock")
        .unwrap();
    assert_eq!((b.capacity, b.refill_per_sec, b.own), (50.0, 5.0, false));
    mock.set_bucket("AssociateVpcCidrBlock", mockcloud::Bucket::new(1.0, 0.001))
        .unwrap();
    associate(&c, &d.vpc_id, "100.65.0.0/16").await.unwrap();
    assert_eq!(
        associate(&c, &d.vpc_id, "100.66.0.0/16").await.unwrap_err(),
        "RequestLimitExceeded"
    );
    // Another API's bucket is untouched.
    c.describe_subnets().send().await.unwrap();
}
