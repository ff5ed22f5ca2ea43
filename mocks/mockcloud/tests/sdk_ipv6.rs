//! IPv6 through the real `aws-sdk-ec2` client: the VPC's /56 and the subnets' /64s in
//! DescribeSubnets, AssignIpv6Addresses / UnassignIpv6Addresses (addresses and /80 prefixes, by
//! count and by value), the per-interface limit, every error path with EC2's code, the describe
//! fields and filter, the IMDS keys and their lag, IAM, throttling and fault injection.

use std::net::Ipv6Addr;
use std::time::Duration;

use aws_sdk_ec2::error::ProvideErrorMetadata;
use ipnet::Ipv6Net;
use mockcloud::iam::Policy;
use mockcloud::{Config, Fault, MockCloud};

mod support;
use support::{code, create_eni, ec2, fast, filter, imds_raw};

/// The subnet's /64 as DescribeSubnets shows it.
async fn subnet_block(c: &aws_sdk_ec2::Client, subnet: &str) -> Option<Ipv6Net> {
    let out = c
        .describe_subnets()
        .subnet_ids(subnet)
        .send()
        .await
        .unwrap();
    let s = &out.subnets()[0];
    assert_eq!(s.assign_ipv6_address_on_creation(), Some(false));
    s.ipv6_cidr_block_association_set().first().map(|a| {
        assert_eq!(
            a.ipv6_cidr_block_state()
                .and_then(|s| s.state())
                .map(|s| s.as_str()),
            Some("associated")
        );
        a.ipv6_cidr_block().unwrap().parse().unwrap()
    })
}

async fn describe(c: &aws_sdk_ec2::Client, eni: &str) -> (Vec<Ipv6Addr>, Vec<Ipv6Net>) {
    let out = c
        .describe_network_interfaces()
        .network_interface_ids(eni)
        .send()
        .await
        .unwrap();
    let e = &out.network_interfaces()[0];
    (
        e.ipv6_addresses()
            .iter()
            .map(|a| a.ipv6_address().unwrap().parse().unwrap())
            .collect(),
        e.ipv6_prefixes()
            .iter()
            .map(|p| p.ipv6_prefix().unwrap().parse().unwrap())
            .collect(),
    )
}

#[tokio::test]
async fn subnets_carry_a_64_of_the_vpcs_56_stable_across_runs() {
    let mock = fast().await;
    let c = ec2(&mock);
    let d = mock.default_world().unwrap();
    let first = subnet_block(&c, &d.subnet_id).await.unwrap();
    assert_eq!(first.prefix_len(), 64);
    let second_subnet = mock
        .create_subnet(&d.vpc_id, "10.0.128.0/24".parse().unwrap(), "us-east-1a")
        .unwrap();
    let second = subnet_block(&c, &second_subnet).await.unwrap();
    assert_ne!(first, second);
    let vpc: Ipv6Net = Ipv6Net::new(first.network(), 56).unwrap().trunc();
    assert!(vpc.contains(&second), "{vpc} holds {second}");
    // Another run gives the same blocks.
    let again = fast().await;
    let d2 = again.default_world().unwrap();
    assert_eq!(subnet_block(&ec2(&again), &d2.subnet_id).await, Some(first));
    // A subnet without IPv6 shows an empty association set.
    mock.disassociate_subnet_ipv6_cidr_block(&second_subnet)
        .unwrap();
    assert_eq!(subnet_block(&c, &second_subnet).await, None);
}

#[tokio::test]
async fn assign_by_count_and_list_prefixes_describe_filter_and_unassign() {
    let mock = fast().await;
    let c = ec2(&mock);
    let d = mock.default_world().unwrap();
    let block = subnet_block(&c, &d.subnet_id).await.unwrap();
    let eni = create_eni(&c, &d.subnet_id).await;

    let out = c
        .assign_ipv6_addresses()
        .network_interface_id(&eni)
        .ipv6_address_count(2)
        .send()
        .await
        .unwrap();
    assert_eq!(out.network_interface_id(), Some(eni.as_str()));
    let auto: Vec<Ipv6Addr> = out
        .assigned_ipv6_addresses()
        .iter()
        .map(|a| a.parse().unwrap())
        .collect();
    assert_eq!(auto.len(), 2);
    assert!(
        auto.iter().all(|a| block.contains(a)),
        "{auto:?} in {block}"
    );
    assert!(out.assigned_ipv6_prefixes().is_empty());

    let explicit: Ipv6Addr = (u128::from(block.network()) + 0x1234).into();
    let out = c
        .assign_ipv6_addresses()
        .network_interface_id(&eni)
        .ipv6_addresses(explicit.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(out.assigned_ipv6_addresses(), [explicit.to_string()]);

    let out = c
        .assign_ipv6_addresses()
        .network_interface_id(&eni)
        .ipv6_prefix_count(1)
        .send()
        .await
        .unwrap();
    let auto_prefix: Ipv6Net = out.assigned_ipv6_prefixes()[0].parse().unwrap();
    assert_eq!(auto_prefix.prefix_len(), 80);
    assert!(block.contains(&auto_prefix));
    assert!(out.assigned_ipv6_addresses().is_empty());
    let wanted: Ipv6Net =
        Ipv6Net::new((u128::from(block.network()) | (7u128 << 48)).into(), 80).unwrap();
    let out = c
        .assign_ipv6_addresses()
        .network_interface_id(&eni)
        .ipv6_prefixes(wanted.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(out.assigned_ipv6_prefixes(), [wanted.to_string()]);

    let (addresses, prefixes) = describe(&c, &eni).await;
    assert_eq!(addresses, [auto[0], auto[1], explicit]);
    assert_eq!(prefixes, [auto_prefix, wanted]);

    // The filter finds the ENI by any of its addresses, and nothing by someone else's.
    let found = c
        .describe_network_interfaces()
        .filters(filter("ipv6-addresses.ipv6-address", &explicit.to_string()))
        .send()
        .await
        .unwrap();
    let ids: Vec<_> = found
        .network_interfaces()
        .iter()
        .map(|e| e.network_interface_id().unwrap())
        .collect();
    assert_eq!(ids, [eni.as_str()]);
    let none = c
        .describe_network_interfaces()
        .filters(filter("ipv6-addresses.ipv6-address", "2001:db8::1"))
        .send()
        .await
        .unwrap();
    assert!(none.network_interfaces().is_empty());

    // Unassign is all or nothing: one address it does not hold fails the whole call.
    let e = c
        .unassign_ipv6_addresses()
        .network_interface_id(&eni)
        .ipv6_addresses(auto[0].to_string())
        .ipv6_addresses(Ipv6Addr::from(u128::from(block.network()) + 0x9999).to_string())
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(e), "InvalidParameterValue");
    assert_eq!(describe(&c, &eni).await.0.len(), 3, "nothing unassigned");
    let out = c
        .unassign_ipv6_addresses()
        .network_interface_id(&eni)
        .ipv6_addresses(auto[0].to_string())
        .ipv6_prefixes(wanted.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(out.unassigned_ipv6_addresses(), [auto[0].to_string()]);
    assert_eq!(out.unassigned_ipv6_prefixes(), [wanted.to_string()]);
    let (addresses, prefixes) = describe(&c, &eni).await;
    assert_eq!(addresses, [auto[1], explicit]);
    assert_eq!(prefixes, [auto_prefix]);
    // The freed address can be taken again, by another ENI.
    let other = create_eni(&c, &d.subnet_id).await;
    c.assign_ipv6_addresses()
        .network_interface_id(&other)
        .ipv6_addresses(auto[0].to_string())
        .send()
        .await
        .unwrap();
    // Deleting an ENI frees its IPv6 too.
    c.delete_network_interface()
        .network_interface_id(&eni)
        .send()
        .await
        .unwrap();
    c.assign_ipv6_addresses()
        .network_interface_id(&other)
        .ipv6_addresses(explicit.to_string())
        .ipv6_addresses(auto[1].to_string())
        .send()
        .await
        .unwrap();
}

#[tokio::test]
async fn every_error_path_answers_ec2s_code() {
    let mock = fast().await;
    let c = ec2(&mock);
    let d = mock.default_world().unwrap();
    let block = subnet_block(&c, &d.subnet_id).await.unwrap();
    let base = u128::from(block.network());
    let eth0 = mock.instance(&d.instance.instance_id).unwrap().enis[0]
        .id
        .clone();
    let eni = create_eni(&c, &d.subnet_id).await;
    type Reply = Result<
        aws_sdk_ec2::operation::assign_ipv6_addresses::AssignIpv6AddressesOutput,
        aws_sdk_ec2::error::SdkError<
            aws_sdk_ec2::operation::assign_ipv6_addresses::AssignIpv6AddressesError,
            aws_sdk_ec2::config::http::HttpResponse,
        >,
    >;
    let fail = |r: Reply| -> (String, String) {
        let e = r.unwrap_err().into_service_error();
        (
            e.code().unwrap_or_default().to_owned(),
            e.message().unwrap_or_default().to_owned(),
        )
    };
    let a = |n: u128| Ipv6Addr::from(base + n).to_string();

    // The limit: an attached m5.large ENI holds 10 (IPv6 addresses and /80s together).
    c.assign_ipv6_addresses()
        .network_interface_id(&eth0)
        .ipv6_address_count(8)
        .send()
        .await
        .unwrap();
    c.assign_ipv6_addresses()
        .network_interface_id(&eth0)
        .ipv6_prefix_count(2)
        .send()
        .await
        .unwrap();
    let (code_, message) = fail(
        c.assign_ipv6_addresses()
            .network_interface_id(&eth0)
            .ipv6_address_count(1)
            .send()
            .await,
    );
    assert_eq!(code_, "PrivateIpAddressLimitExceeded", "{message}");
    assert!(
        message.contains("(11)") && message.contains("limit of 10"),
        "{message}"
    );
    let (code_, _) = fail(
        c.assign_ipv6_addresses()
            .network_interface_id(&eth0)
            .ipv6_prefix_count(1)
            .send()
            .await,
    );
    assert_eq!(code_, "PrivateIpAddressLimitExceeded");
    // IPv4 is counted apart: eth0 still takes secondary IPv4 addresses.
    c.assign_private_ip_addresses()
        .network_interface_id(&eth0)
        .secondary_private_ip_address_count(2)
        .send()
        .await
        .unwrap();

    // Outside the subnet's /64, and its reserved addresses.
    for bad in [
        "2001:db8::10".to_owned(),
        a(0),
        a(3),
        Ipv6Addr::from(u128::from(block.broadcast())).to_string(),
    ] {
        let (code_, message) = fail(
            c.assign_ipv6_addresses()
                .network_interface_id(&eni)
                .ipv6_addresses(&bad)
                .send()
                .await,
        );
        assert_eq!(code_, "InvalidParameterValue", "{bad}: {message}");
    }
    // Not an address at all.
    let (code_, message) = fail(
        c.assign_ipv6_addresses()
            .network_interface_id(&eni)
            .ipv6_addresses("10.0.0.1")
            .send()
            .await,
    );
    assert_eq!(code_, "InvalidParameterValue");
    assert!(message.contains("Ipv6Addresses"), "{message}");
    // In use: another ENI's address, an address inside another ENI's /80, a /80 over an address.
    c.assign_ipv6_addresses()
        .network_interface_id(&eni)
        .ipv6_addresses(a(0x50))
        .send()
        .await
        .unwrap();
    let held_prefix: Ipv6Net = describe(&c, &eth0).await.1[0];
    let inside = Ipv6Addr::from(u128::from(held_prefix.network()) + 5).to_string();
    let low_prefix = Ipv6Net::new(Ipv6Addr::from(base | (1 << 48)), 80).unwrap();
    c.assign_ipv6_addresses()
        .network_interface_id(&eni)
        .ipv6_addresses(Ipv6Addr::from(u128::from(low_prefix.network()) + 9).to_string())
        .send()
        .await
        .unwrap();
    let other = create_eni(&c, &d.subnet_id).await;
    for (addr, prefix) in [
        (Some(a(0x50)), None),
        (Some(inside), None),
        (None, Some(low_prefix.to_string())),
        (None, Some(held_prefix.to_string())),
    ] {
        let mut call = c.assign_ipv6_addresses().network_interface_id(&other);
        if let Some(x) = &addr {
            call = call.ipv6_addresses(x);
        }
        if let Some(p) = &prefix {
            call = call.ipv6_prefixes(p);
        }
        let (code_, message) = fail(call.send().await);
        assert_eq!(
            code_, "InvalidIPAddress.InUse",
            "{addr:?} {prefix:?}: {message}"
        );
    }
    // A prefix that is not an aligned /80 of the subnet.
    for bad in [
        format!("{}/80", a(1 << 20)),
        format!("{}/96", Ipv6Addr::from(base | (3 << 48))),
        "2001:db8::/80".to_owned(),
    ] {
        let (code_, message) = fail(
            c.assign_ipv6_addresses()
                .network_interface_id(&other)
                .ipv6_prefixes(&bad)
                .send()
                .await,
        );
        assert_eq!(code_, "InvalidParameterValue", "{bad}: {message}");
    }
    // Mixing count and list parameters, or asking for nothing.
    let mixes = [
        c.assign_ipv6_addresses()
            .network_interface_id(&other)
            .ipv6_address_count(1)
            .ipv6_addresses(a(0x77)),
        c.assign_ipv6_addresses()
            .network_interface_id(&other)
            .ipv6_prefix_count(1)
            .ipv6_prefixes(format!("{}/80", Ipv6Addr::from(base | (9 << 48)))),
        c.assign_ipv6_addresses()
            .network_interface_id(&other)
            .ipv6_address_count(1)
            .ipv6_prefix_count(1),
    ];
    for call in mixes {
        let (code_, message) = fail(call.send().await);
        assert_eq!(code_, "InvalidParameterCombination", "{message}");
    }
    let (code_, _) = fail(
        c.assign_ipv6_addresses()
            .network_interface_id(&other)
            .send()
            .await,
    );
    assert_eq!(code_, "MissingParameter");
    let (code_, _) = fail(
        c.assign_ipv6_addresses()
            .network_interface_id(&other)
            .ipv6_address_count(0)
            .send()
            .await,
    );
    assert_eq!(code_, "InvalidParameterValue");
    // Unknown and malformed ENIs.
    let (code_, _) = fail(
        c.assign_ipv6_addresses()
            .network_interface_id("eni-0123456789abcdef0")
            .ipv6_address_count(1)
            .send()
            .await,
    );
    assert_eq!(code_, "InvalidNetworkInterfaceID.NotFound");
    let (code_, _) = fail(
        c.assign_ipv6_addresses()
            .network_interface_id("nope")
            .ipv6_address_count(1)
            .send()
            .await,
    );
    assert_eq!(code_, "InvalidNetworkInterfaceID.Malformed");
    // A subnet without an IPv6 block.
    let v4only = mock
        .create_subnet(&d.vpc_id, "10.0.200.0/24".parse().unwrap(), "us-east-1a")
        .unwrap();
    mock.disassociate_subnet_ipv6_cidr_block(&v4only).unwrap();
    let lone = create_eni(&c, &v4only).await;
    let (code_, message) = fail(
        c.assign_ipv6_addresses()
            .network_interface_id(&lone)
            .ipv6_address_count(1)
            .send()
            .await,
    );
    assert_eq!(code_, "InvalidParameterValue");
    assert!(
        message.contains("does not have an IPv6 CIDR block"),
        "{message}"
    );
    // Disassociating a block in use is refused.
    assert_eq!(
        mock.disassociate_subnet_ipv6_cidr_block(&d.subnet_id)
            .unwrap_err()
            .code,
        "InvalidCidrBlock.InUse"
    );
    // Unassign: unknown prefix, nothing given.
    let e = c
        .unassign_ipv6_addresses()
        .network_interface_id(&other)
        .ipv6_prefixes(held_prefix.to_string())
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(e), "InvalidParameterValue");
    let e = c
        .unassign_ipv6_addresses()
        .network_interface_id(&other)
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(e), "MissingParameter");
}

#[tokio::test(start_paused = true)]
async fn imds_keys_appear_with_content_and_lag_like_ipv4() {
    let mut config = Config::fast();
    config.latency.imds_lag = Duration::from_secs(2);
    let mock = MockCloud::start(config).await.unwrap();
    let c = ec2(&mock);
    let d = mock.default_world().unwrap();
    let url = d.instance.imds_url.clone();
    let inst = mock.instance(&d.instance.instance_id).unwrap();
    let eth0 = &inst.enis[0];
    let mac_path = format!("/latest/meta-data/network/interfaces/macs/{}/", eth0.mac);
    let block = subnet_block(&c, &d.subnet_id).await.unwrap();

    let (status, listing) = imds_raw(&url, &mac_path).await;
    assert_eq!(status, 200);
    let keys: Vec<&str> = listing.lines().collect();
    assert!(
        !keys.contains(&"ipv6s") && !keys.contains(&"ipv6-prefix"),
        "{listing}"
    );
    assert!(keys.contains(&"subnet-ipv6-cidr-blocks") && keys.contains(&"vpc-ipv6-cidr-blocks"));
    assert_eq!(imds_raw(&url, &format!("{mac_path}ipv6s")).await.0, 404);
    assert_eq!(
        imds_raw(&url, &format!("{mac_path}ipv6-prefix")).await.0,
        404
    );
    assert_eq!(
        imds_raw(&url, &format!("{mac_path}subnet-ipv6-cidr-blocks")).await,
        (200, block.to_string())
    );
    let vpc = imds_raw(&url, &format!("{mac_path}vpc-ipv6-cidr-blocks"))
        .await
        .1;
    let vpc: Ipv6Net = vpc.parse().unwrap();
    assert_eq!(vpc.prefix_len(), 56);
    assert!(vpc.contains(&block));

    let out = c
        .assign_ipv6_addresses()
        .network_interface_id(&eth0.id)
        .ipv6_address_count(2)
        .send()
        .await
        .unwrap();
    let addresses = out.assigned_ipv6_addresses().join("\n");
    let out = c
        .assign_ipv6_addresses()
        .network_interface_id(&eth0.id)
        .ipv6_prefix_count(1)
        .send()
        .await
        .unwrap();
    let prefix = out.assigned_ipv6_prefixes()[0].clone();
    // Not yet: IMDS lags EC2.
    assert_eq!(imds_raw(&url, &format!("{mac_path}ipv6s")).await.0, 404);
    assert_eq!(
        imds_raw(&url, &format!("{mac_path}ipv6-prefix")).await.0,
        404
    );
    tokio::time::advance(Duration::from_millis(2100)).await;
    assert_eq!(
        imds_raw(&url, &format!("{mac_path}ipv6s")).await,
        (200, addresses.clone())
    );
    assert_eq!(
        imds_raw(&url, &format!("{mac_path}ipv6-prefix")).await,
        (200, prefix.clone())
    );
    let listing = imds_raw(&url, &mac_path).await.1;
    assert!(listing.lines().any(|k| k == "ipv6s"), "{listing}");
    assert!(listing.lines().any(|k| k == "ipv6-prefix"), "{listing}");
    // Unassigned ones linger for the lag, then go.
    c.unassign_ipv6_addresses()
        .network_interface_id(&eth0.id)
        .ipv6_prefixes(&prefix)
        .send()
        .await
        .unwrap();
    assert_eq!(
        imds_raw(&url, &format!("{mac_path}ipv6-prefix")).await,
        (200, prefix.clone())
    );
    tokio::time::advance(Duration::from_millis(2100)).await;
    assert_eq!(
        imds_raw(&url, &format!("{mac_path}ipv6-prefix")).await.0,
        404
    );
    let listing = imds_raw(&url, &mac_path).await.1;
    assert!(!listing.lines().any(|k| k == "ipv6-prefix"), "{listing}");
}

#[tokio::test]
async fn iam_throttling_and_faults_apply_to_the_ipv6_actions() {
    let mock = MockCloud::start(Config {
        throttling: mockcloud::Throttling::default(),
        ..Config::fast()
    })
    .await
    .unwrap();
    let c = ec2(&mock);
    let d = mock.default_world().unwrap();
    let eni = create_eni(&c, &d.subnet_id).await;
    let reclaim_block = subnet_block(&c, &d.subnet_id).await.unwrap();
    // IAM: a policy allowing AssignPrivateIpAddresses only denies AssignIpv6Addresses on the ENI.
    mock.set_iam_policy(Some(
        Policy::parse(
            &serde_json::json!({"Version": "2012-10-17", "Statement": [
                {"Effect": "Allow", "Action": ["ec2:AssignPrivateIpAddresses",
                    "ec2:UnassignIpv6Addresses"], "Resource": "*"}]})
            .to_string(),
        )
        .unwrap(),
    ));
    let e = c
        .assign_ipv6_addresses()
        .network_interface_id(&eni)
        .ipv6_address_count(1)
        .send()
        .await
        .unwrap_err()
        .into_service_error();
    assert_eq!(e.code(), Some("UnauthorizedOperation"));
    let message = e.message().unwrap();
    assert!(
        message.contains("ec2:AssignIpv6Addresses")
            && message.contains(&format!("network-interface/{eni}")),
        "{message}"
    );
    assert_eq!(
        mock.iam_denials().last().unwrap().action,
        "ec2:AssignIpv6Addresses"
    );
    // A /80 asked for by value (the daemon taking its own back) needs the same permission.
    let denied = mock.iam_denials().len();
    let wanted = Ipv6Net::new(
        Ipv6Addr::from(u128::from(reclaim_block.network()) | (7 << 48)),
        80,
    )
    .unwrap();
    let e = c
        .assign_ipv6_addresses()
        .network_interface_id(&eni)
        .ipv6_prefixes(wanted.to_string())
        .send()
        .await
        .unwrap_err()
        .into_service_error();
    assert_eq!(e.code(), Some("UnauthorizedOperation"));
    assert_eq!(mock.iam_denials().len(), denied + 1);
    mock.set_iam_policy(None);

    // Throttling: its own bucket, the mutating category's size; the IPv4 bucket is untouched.
    let (_, levels) = mock.throttling();
    for api in ["AssignIpv6Addresses", "UnassignIpv6Addresses"] {
        let b = levels.iter().find(|b| b.bucket == api).unwrap();
        assert_eq!(
            (b.capacity, b.refill_per_sec, b.own),
            (50.0, 5.0, false),
            "{api}"
        );
    }
    mock.set_bucket("AssignIpv6Addresses", mockcloud::Bucket::new(1.0, 0.001))
        .unwrap();
    c.assign_ipv6_addresses()
        .network_interface_id(&eni)
        .ipv6_address_count(1)
        .send()
        .await
        .unwrap();
    let e = c
        .assign_ipv6_addresses()
        .network_interface_id(&eni)
        .ipv6_address_count(1)
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(e), "RequestLimitExceeded");
    c.assign_private_ip_addresses()
        .network_interface_id(&eni)
        .secondary_private_ip_address_count(1)
        .send()
        .await
        .expect("another API's bucket");
    assert_eq!(mock.counters().throttled("AssignIpv6Addresses"), 1);

    // Fault injection works by action name.
    mock.inject_fault(Fault::error("UnassignIpv6Addresses", "InternalError", 1));
    let held = describe(&c, &eni).await.0[0].to_string();
    let e = c
        .unassign_ipv6_addresses()
        .network_interface_id(&eni)
        .ipv6_addresses(&held)
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(e), "InternalError");
    c.unassign_ipv6_addresses()
        .network_interface_id(&eni)
        .ipv6_addresses(&held)
        .send()
        .await
        .unwrap();
}
