//! Subnets, instance types and network cards through the real `aws-sdk-ec2` client: several subnets
//! per VPC in several AZs with tags and DescribeSubnets filters, `AvailableIpAddressCount` kept
//! true, the instance-type catalog with EC2's figures, `NetworkCardIndex` on attach with per-card
//! device indexes and limits, IMDS `network-card`, and the control API's new routes.

use std::collections::BTreeMap;

use aws_sdk_ec2::types::{InstanceType, InstanceTypeHypervisor, Tag};
use mockcloud::catalog::CATALOG;
use mockcloud::{OccupyPattern, SubnetUsage};

mod support;
use support::{code, create_eni, ec2, empty, fast, filter, imds, imds_raw};

fn tags(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[tokio::test]
async fn subnets_in_several_azs_with_tags_and_filters() {
    let mock = empty(3).await;
    let c = ec2(&mock);
    let (vpc, _) = mock.create_vpc("10.40.0.0/16".parse().unwrap()).unwrap();
    let (other_vpc, _) = mock.create_vpc("10.41.0.0/16".parse().unwrap()).unwrap();
    let cni = tags(&[("kubernetes.io/role/cni", "1")]);
    let a = mock
        .create_subnet_with_tags(&vpc, "10.40.0.0/20".parse().unwrap(), "us-east-1a", &cni)
        .unwrap();
    let a2 = mock
        .create_subnet(&vpc, "10.40.16.0/24".parse().unwrap(), "us-east-1a")
        .unwrap();
    let b = mock
        .create_subnet(&vpc, "10.40.32.0/22".parse().unwrap(), "us-east-1b")
        .unwrap();
    let c_sub = mock
        .create_subnet_with_tags(
            &vpc,
            "10.40.48.0/22".parse().unwrap(),
            "us-east-1c",
            &tags(&[("kubernetes.io/role/cni", "0")]),
        )
        .unwrap();
    mock.create_subnet(&other_vpc, "10.41.0.0/24".parse().unwrap(), "us-east-1a")
        .unwrap();
    // Tags through EC2 too.
    c.create_tags()
        .resources(&b)
        .tags(
            Tag::builder()
                .key("kubernetes.io/role/cni")
                .value("1")
                .build(),
        )
        .tags(Tag::builder().key("team").value("net").build())
        .send()
        .await
        .unwrap();

    let ids = |out: aws_sdk_ec2::operation::describe_subnets::DescribeSubnetsOutput| {
        let mut v: Vec<String> = out
            .subnets()
            .iter()
            .map(|s| s.subnet_id().unwrap().to_owned())
            .collect();
        v.sort();
        v
    };
    let sorted = |mut v: Vec<&String>| {
        v.sort();
        v.into_iter().cloned().collect::<Vec<String>>()
    };
    let in_vpc = c
        .describe_subnets()
        .filters(filter("vpc-id", &vpc))
        .send()
        .await
        .unwrap();
    assert_eq!(ids(in_vpc), sorted(vec![&a, &a2, &b, &c_sub]));
    let in_az = c
        .describe_subnets()
        .filters(filter("vpc-id", &vpc))
        .filters(filter("availability-zone", "us-east-1a"))
        .send()
        .await
        .unwrap();
    assert_eq!(ids(in_az), sorted(vec![&a, &a2]));
    let tagged = c
        .describe_subnets()
        .filters(filter("tag:kubernetes.io/role/cni", "1"))
        .send()
        .await
        .unwrap();
    assert_eq!(ids(tagged), sorted(vec![&a, &b]));
    let any_cni = c
        .describe_subnets()
        .filters(filter("tag-key", "kubernetes.io/role/*"))
        .send()
        .await
        .unwrap();
    assert_eq!(ids(any_cni), sorted(vec![&a, &b, &c_sub]));
    let by_id = c
        .describe_subnets()
        .filters(filter("subnet-id", &b))
        .send()
        .await
        .unwrap();
    let s = &by_id.subnets()[0];
    let mut got: Vec<(String, String)> = s
        .tags()
        .iter()
        .map(|t| (t.key().unwrap().to_owned(), t.value().unwrap().to_owned()))
        .collect();
    got.sort();
    assert_eq!(
        got,
        vec![
            ("kubernetes.io/role/cni".to_owned(), "1".to_owned()),
            ("team".to_owned(), "net".to_owned())
        ]
    );
    assert_eq!(s.availability_zone(), Some("us-east-1b"));
    // DeleteTags.
    c.delete_tags()
        .resources(&b)
        .tags(Tag::builder().key("team").build())
        .send()
        .await
        .unwrap();
    assert_eq!(
        mock.subnets().into_iter().find(|v| v.id == b).unwrap().tags,
        tags(&[("kubernetes.io/role/cni", "1")])
    );
    let e = c
        .describe_subnets()
        .filters(filter("owner-of-the-moon", "x"))
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(e), "InvalidParameterValue");

    // AvailableIpAddressCount stays true: /32s take one, prefixes sixteen, occupied ones count.
    let available = |id: String| {
        let c = c.clone();
        async move {
            c.describe_subnets()
                .subnet_ids(id)
                .send()
                .await
                .unwrap()
                .subnets()[0]
                .available_ip_address_count()
                .unwrap()
        }
    };
    assert_eq!(available(b.clone()).await, 1019);
    mock.occupy_addresses(
        &b,
        &OccupyPattern::Addresses {
            addresses: vec!["10.40.35.200".parse().unwrap()],
        },
    )
    .unwrap();
    let eni = create_eni(&c, &b).await;
    c.assign_private_ip_addresses()
        .network_interface_id(&eni)
        .secondary_private_ip_address_count(3)
        .send()
        .await
        .unwrap();
    c.assign_private_ip_addresses()
        .network_interface_id(&eni)
        .ipv4_prefix_count(2)
        .send()
        .await
        .unwrap();
    assert_eq!(available(b.clone()).await, 1019 - 1 - 3 - 32 - 1);
    let u: SubnetUsage = mock.subnet_usage(&b).unwrap();
    assert_eq!(u.free_addresses, 1019 - 37);
    assert_eq!((u.used, u.occupied), (37, 1));
}

#[tokio::test]
async fn instance_types_carry_ec2_s_figures() {
    let mock = fast().await;
    let c = ec2(&mock);
    let all = c.describe_instance_types().send().await.unwrap();
    assert_eq!(all.instance_types().len(), CATALOG.len());
    let one = |name: &'static str| {
        let c = c.clone();
        async move {
            c.describe_instance_types()
                .instance_types(InstanceType::from(name))
                .send()
                .await
                .unwrap()
                .instance_types()[0]
                .clone()
        }
    };
    let t2 = one("t2.medium").await;
    assert_eq!(t2.hypervisor(), Some(&InstanceTypeHypervisor::Xen));
    assert_eq!(t2.bare_metal(), Some(false));
    assert_eq!(t2.v_cpu_info().unwrap().default_v_cpus(), Some(2));
    let m5 = one("m5.large").await;
    assert_eq!(m5.hypervisor(), Some(&InstanceTypeHypervisor::Nitro));
    let n = m5.network_info().unwrap();
    assert_eq!(
        (
            n.maximum_network_interfaces(),
            n.ipv4_addresses_per_interface(),
            n.maximum_network_cards(),
            n.default_network_card_index()
        ),
        (Some(3), Some(10), Some(1), Some(0))
    );
    let metal = one("m5.metal").await;
    assert_eq!(metal.hypervisor(), None);
    assert_eq!(metal.bare_metal(), Some(true));
    assert_eq!(metal.v_cpu_info().unwrap().default_v_cpus(), Some(96));
    // Multi-card: max-pods from the default card, as the VPC CNI computes it.
    for (name, total, cards, per_card, pods) in [
        ("p5.48xlarge", 64, 32, 2, 100),
        ("p4d.24xlarge", 60, 4, 15, 737),
        ("c6in.32xlarge", 16, 2, 8, 394),
        ("m5.large", 3, 1, 3, 29),
        ("m4.large", 2, 1, 2, 20),
    ] {
        let t = one(name).await;
        let n = t.network_info().unwrap();
        assert_eq!(n.maximum_network_interfaces(), Some(total), "{name}");
        assert_eq!(n.maximum_network_cards(), Some(cards), "{name}");
        assert_eq!(n.network_cards().len(), cards as usize, "{name}");
        let default = n.default_network_card_index().unwrap();
        let card = n
            .network_cards()
            .iter()
            .find(|c| c.network_card_index() == Some(default))
            .unwrap();
        assert_eq!(card.maximum_network_interfaces(), Some(per_card), "{name}");
        let ips = n.ipv4_addresses_per_interface().unwrap();
        assert_eq!(per_card * (ips - 1) + 2, pods, "{name} max-pods");
    }
    // Paginated like EC2.
    let page = c
        .describe_instance_types()
        .max_results(5)
        .send()
        .await
        .unwrap();
    assert_eq!(page.instance_types().len(), 5);
    assert!(page.next_token().is_some());
}

#[tokio::test]
async fn network_cards_on_a_multi_card_instance() {
    let mock = fast().await;
    let c = ec2(&mock);
    let d = mock.default_world().unwrap();
    let big = mock
        .launch_instance("c6in.32xlarge", &d.subnet_id)
        .await
        .unwrap();
    let attach = |eni: String, device: i32, card: Option<i32>| {
        let c = c.clone();
        let inst = big.instance_id.clone();
        async move {
            let mut r = c
                .attach_network_interface()
                .network_interface_id(eni)
                .instance_id(inst)
                .device_index(device);
            if let Some(card) = card {
                r = r.network_card_index(card);
            }
            r.send().await
        }
    };
    // Card 1, device 0: allowed (device indexes are per card).
    let on_card1 = create_eni(&c, &d.subnet_id).await;
    let out = attach(on_card1.clone(), 0, Some(1)).await.unwrap();
    assert_eq!(out.network_card_index(), Some(1));
    let desc = c
        .describe_network_interfaces()
        .network_interface_ids(&on_card1)
        .send()
        .await
        .unwrap();
    let att = desc.network_interfaces()[0].attachment().unwrap();
    assert_eq!(
        (att.network_card_index(), att.device_index()),
        (Some(1), Some(0))
    );
    let inst = c
        .describe_instances()
        .instance_ids(&big.instance_id)
        .send()
        .await
        .unwrap();
    let nics = inst.reservations()[0].instances()[0].network_interfaces();
    let cards: Vec<Option<i32>> = nics
        .iter()
        .map(|n| n.attachment().unwrap().network_card_index())
        .collect();
    assert_eq!(cards, vec![Some(0), Some(1)]);
    assert_eq!(
        mock.instance(&big.instance_id).unwrap().enis[1]
            .attachment
            .as_ref()
            .unwrap()
            .network_card_index,
        1
    );

    // IMDS: network-card per MAC on a multi-card type.
    let mac1 = desc.network_interfaces()[0]
        .mac_address()
        .unwrap()
        .to_owned();
    let md = imds(&big.imds_url);
    let card_of = |mac: String| {
        let md = md.clone();
        async move {
            md.get(format!(
                "/latest/meta-data/network/interfaces/macs/{mac}/network-card"
            ))
            .await
            .unwrap()
            .as_ref()
            .to_owned()
        }
    };
    assert_eq!(card_of(mac1.clone()).await, "1");
    assert_eq!(card_of(big.mac.clone()).await, "0");
    // On a single-card type it is absent (404 = card 0).
    let (status, _) = imds_raw(
        &d.instance.imds_url,
        &format!(
            "/latest/meta-data/network/interfaces/macs/{}/network-card",
            d.instance.mac
        ),
    )
    .await;
    assert_eq!(status, 404);

    // Out of range, taken, full.
    let spare = create_eni(&c, &d.subnet_id).await;
    let e = attach(spare.clone(), 1, Some(2)).await.unwrap_err();
    assert_eq!(code(e), "InvalidParameterValue", "card 2 of 2");
    let e = attach(spare.clone(), 0, Some(1)).await.unwrap_err();
    assert_eq!(
        code(e),
        "InvalidParameterValue",
        "device 0 of card 1 is taken"
    );
    let e = attach(spare.clone(), 8, None).await.unwrap_err();
    assert_eq!(code(e), "InvalidParameterValue", "card 0 holds devices 0-7");
    for device in 1..8 {
        let eni = create_eni(&c, &d.subnet_id).await;
        attach(eni, device, Some(1)).await.unwrap();
    }
    let e = attach(spare.clone(), 3, Some(1)).await.unwrap_err();
    assert_eq!(code(e), "AttachmentLimitExceeded", "card 1 is full");
    // Card 0 still has room.
    attach(spare.clone(), 1, Some(0)).await.unwrap();
    // Card 1's device 0 is not the primary: it can be detached.
    let att_id = att.attachment_id().unwrap().to_owned();
    c.detach_network_interface()
        .attachment_id(att_id)
        .send()
        .await
        .unwrap();
    // A single-card type has only card 0.
    let e = c
        .attach_network_interface()
        .network_interface_id(create_eni(&c, &d.subnet_id).await)
        .instance_id(&d.instance.instance_id)
        .device_index(1)
        .network_card_index(1)
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(e), "InvalidParameterValue");
}

#[tokio::test]
async fn control_api_for_subnets_usage_occupy_reservations_and_seed() {
    let mock = empty(9).await;
    let http = reqwest::Client::new();
    let ctl = mock.control_url();
    let vpc: serde_json::Value = http
        .post(format!("{ctl}/vpcs"))
        .json(&serde_json::json!({"cidr": "10.50.0.0/16"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let subnet: serde_json::Value = http
        .post(format!("{ctl}/subnets"))
        .json(&serde_json::json!({
            "vpc_id": vpc["vpc_id"], "cidr": "10.50.0.0/24", "availability_zone": "us-east-1b",
            "tags": {"kubernetes.io/role/cni": "1"}
        }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = subnet["subnet_id"].as_str().unwrap().to_owned();
    let list: serde_json::Value = http
        .get(format!("{ctl}/subnets"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list[0]["tags"]["kubernetes.io/role/cni"], "1");
    assert_eq!(list[0]["availability_zone"], "us-east-1b");
    let usage = |http: reqwest::Client, url: String| async move {
        http.get(url)
            .send()
            .await
            .unwrap()
            .json::<SubnetUsage>()
            .await
            .unwrap()
    };
    let u = usage(http.clone(), format!("{ctl}/subnets/{id}/usage")).await;
    assert_eq!(
        (u.usable, u.free_addresses, u.free_prefix_blocks),
        (251, 251, 14)
    );
    // Occupy one address in every block: no /28 left, 235 addresses still free.
    let r: serde_json::Value = http
        .post(format!("{ctl}/subnets/{id}/occupy"))
        .json(&serde_json::json!({"stride": 16, "offset": 8}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["occupied"], 16);
    assert_eq!(r["usage"]["free_prefix_blocks"], 0);
    assert_eq!(r["usage"]["free_addresses"], 235);
    let r = http
        .post(format!("{ctl}/subnets/{id}/occupy"))
        .json(&serde_json::json!({"addresses": ["10.50.0.8"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400, "already occupied");
    let r: serde_json::Value = http
        .delete(format!("{ctl}/subnets/{id}/occupy"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["released"], 16);
    // Reservations.
    let res: serde_json::Value = http
        .post(format!("{ctl}/subnets/{id}/reservations"))
        .json(&serde_json::json!({"cidr": "10.50.0.64/26", "reservation_type": "prefix"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(res["reservation_type"], "prefix");
    let u = usage(http.clone(), format!("{ctl}/subnets/{id}/usage")).await;
    assert_eq!(u.reservations, 1);
    assert_eq!(u.auto_free_addresses, 251 - 64);
    let all: serde_json::Value = http
        .get(format!("{ctl}/subnets/{id}/reservations"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(all.as_array().unwrap().len(), 1);
    let r = http
        .delete(format!(
            "{ctl}/reservations/{}",
            res["id"].as_str().unwrap()
        ))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    // The allocation seed makes automatic choice reproducible.
    let c = ec2(&mock);
    let pick = || async {
        let eni = create_eni(&c, &id).await;
        let out = c
            .assign_private_ip_addresses()
            .network_interface_id(&eni)
            .secondary_private_ip_address_count(5)
            .send()
            .await
            .unwrap();
        let ips: Vec<String> = out
            .assigned_private_ip_addresses()
            .iter()
            .map(|a| a.private_ip_address().unwrap().to_owned())
            .collect();
        c.delete_network_interface()
            .network_interface_id(&eni)
            .send()
            .await
            .unwrap();
        ips
    };
    let put_seed = |seed: u64| {
        let http = http.clone();
        let url = format!("{ctl}/allocation");
        async move {
            let r = http
                .put(url)
                .json(&serde_json::json!({ "seed": seed }))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 204);
        }
    };
    put_seed(77).await;
    let first = pick().await;
    put_seed(77).await;
    assert_eq!(pick().await, first);
    put_seed(78).await;
    assert_ne!(pick().await, first);
}
