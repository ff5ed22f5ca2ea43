//! Prefix delegation through the real `aws-sdk-ec2` client: /28 prefixes on create and assign (by
//! count and by CIDR), describe and IMDS, the shared per-ENI limit, every bad input with EC2's code,
//! Nitro only, `InsufficientCidrBlocks`, a subnet fragmented by a recorded random churn of /32s,
//! and subnet CIDR reservations steering automatic assignment.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use aws_sdk_ec2::error::ProvideErrorMetadata;
use aws_sdk_ec2::types::{Ipv4PrefixSpecificationRequest, SubnetCidrReservationType};
use ipnet::Ipv4Net;
use mockcloud::{OccupyPattern, ReservationType};

mod support;
use support::{
    code, create_eni, ec2, empty, fast, filter, free_block, held_addresses, imds, imds_raw,
    prefixes,
};

fn nets(list: &[String]) -> Vec<Ipv4Net> {
    list.iter().map(|p| p.parse().unwrap()).collect()
}

#[tokio::test]
async fn prefixes_on_create_assign_describe_and_imds() {
    let mock = fast().await;
    let c = ec2(&mock);
    let d = mock.default_world().unwrap();
    let inst = &d.instance.instance_id;

    let created = c
        .create_network_interface()
        .subnet_id(&d.subnet_id)
        .ipv4_prefix_count(2)
        .send()
        .await
        .unwrap()
        .network_interface
        .unwrap();
    let eni = created.network_interface_id().unwrap().to_owned();
    let mac = created.mac_address().unwrap().to_owned();
    let first = nets(&prefixes(created.ipv4_prefixes()));
    assert_eq!(first.len(), 2);
    for p in &first {
        assert_eq!(p.prefix_len(), 28);
        assert_eq!(p.trunc(), *p, "aligned");
        assert!(d.subnet_cidr.contains(p));
    }
    c.attach_network_interface()
        .network_interface_id(&eni)
        .instance_id(inst)
        .device_index(1)
        .send()
        .await
        .unwrap();

    // By count: the reply lists only the new prefix, under AssignedIpv4Prefixes.
    let out = c
        .assign_private_ip_addresses()
        .network_interface_id(&eni)
        .ipv4_prefix_count(1)
        .send()
        .await
        .unwrap();
    let by_count = nets(&prefixes(out.assigned_ipv4_prefixes()));
    assert_eq!(by_count.len(), 1);
    assert!(out.assigned_private_ip_addresses().is_empty());
    // By CIDR.
    let chosen = free_block(&mock, d.subnet_cidr);
    let out = c
        .assign_private_ip_addresses()
        .network_interface_id(&eni)
        .ipv4_prefixes(chosen.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(nets(&prefixes(out.assigned_ipv4_prefixes())), vec![chosen]);

    let all: Vec<Ipv4Net> = first
        .iter()
        .chain(&by_count)
        .copied()
        .chain([chosen])
        .collect();
    let desc = c
        .describe_network_interfaces()
        .network_interface_ids(&eni)
        .send()
        .await
        .unwrap();
    let described = &desc.network_interfaces()[0];
    assert_eq!(nets(&prefixes(described.ipv4_prefixes())), all);
    assert_eq!(
        described.attachment().unwrap().network_card_index(),
        Some(0)
    );
    // Every prefix takes 16 addresses from AvailableIpAddressCount: 4090 free after the instance,
    // minus the ENI's primary, minus 4 × 16.
    let subnets = c
        .describe_subnets()
        .subnet_ids(&d.subnet_id)
        .send()
        .await
        .unwrap();
    assert_eq!(
        subnets.subnets()[0].available_ip_address_count(),
        Some(4090 - 1 - 64)
    );
    assert_eq!(
        mock.subnet_usage(&d.subnet_id).unwrap().free_addresses,
        4090 - 1 - 64
    );

    // IMDS: one CIDR per line; 404 on an interface without prefixes.
    let md = imds(&d.instance.imds_url);
    let text = md
        .get(format!(
            "/latest/meta-data/network/interfaces/macs/{mac}/ipv4-prefix"
        ))
        .await
        .unwrap();
    assert_eq!(
        nets(&text.as_ref().lines().map(str::to_owned).collect::<Vec<_>>()),
        all
    );
    let listing = md
        .get(format!("/latest/meta-data/network/interfaces/macs/{mac}/"))
        .await
        .unwrap();
    assert!(listing.as_ref().lines().any(|l| l == "ipv4-prefix"));
    let (status, _) = imds_raw(
        &d.instance.imds_url,
        &format!(
            "/latest/meta-data/network/interfaces/macs/{}/ipv4-prefix",
            d.instance.mac
        ),
    )
    .await;
    assert_eq!(status, 404, "no prefixes on eth0");

    // One limit for all: m5.large holds 10 per ENI; primary + 4 prefixes = 5.
    let e = c
        .assign_private_ip_addresses()
        .network_interface_id(&eni)
        .ipv4_prefix_count(6)
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(e), "PrivateIpAddressLimitExceeded");
    c.assign_private_ip_addresses()
        .network_interface_id(&eni)
        .secondary_private_ip_address_count(5)
        .send()
        .await
        .unwrap();
    let e = c
        .assign_private_ip_addresses()
        .network_interface_id(&eni)
        .ipv4_prefix_count(1)
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(e), "PrivateIpAddressLimitExceeded");

    // Unassign gives the 16 addresses back, and IMDS follows.
    c.unassign_private_ip_addresses()
        .network_interface_id(&eni)
        .ipv4_prefixes(all[0].to_string())
        .send()
        .await
        .unwrap();
    let view = mock
        .network_interfaces()
        .into_iter()
        .find(|v| v.id == eni)
        .unwrap();
    assert_eq!(view.ipv4_prefixes, all[1..].to_vec());
    assert_eq!(
        mock.subnet_usage(&d.subnet_id).unwrap().free_addresses,
        4090 - 1 - 48 - 5
    );
    let text = md
        .get(format!(
            "/latest/meta-data/network/interfaces/macs/{mac}/ipv4-prefix"
        ))
        .await
        .unwrap();
    assert_eq!(text.as_ref().lines().count(), 3);
    // The state dump carries the prefixes and the card.
    let dump = mock.dump();
    let enis = dump["network_interfaces"].as_array().unwrap();
    let e = enis.iter().find(|e| e["id"] == eni.as_str()).unwrap();
    assert_eq!(e["ipv4_prefixes"].as_array().unwrap().len(), 3);
    assert_eq!(e["attachment"]["network_card_index"], 0);
}

#[tokio::test]
async fn create_with_explicit_prefixes() {
    let mock = fast().await;
    let c = ec2(&mock);
    let d = mock.default_world().unwrap();
    let block = free_block(&mock, d.subnet_cidr);
    let created = c
        .create_network_interface()
        .subnet_id(&d.subnet_id)
        .ipv4_prefixes(
            Ipv4PrefixSpecificationRequest::builder()
                .ipv4_prefix(block.to_string())
                .build(),
        )
        .send()
        .await
        .unwrap()
        .network_interface
        .unwrap();
    assert_eq!(nets(&prefixes(created.ipv4_prefixes())), vec![block]);
    let primary: Ipv4Addr = created.private_ip_address().unwrap().parse().unwrap();
    assert!(
        !block.contains(&primary),
        "the primary is outside the prefix"
    );
    // The same block again is in use.
    let e = c
        .create_network_interface()
        .subnet_id(&d.subnet_id)
        .ipv4_prefixes(
            Ipv4PrefixSpecificationRequest::builder()
                .ipv4_prefix(block.to_string())
                .build(),
        )
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(e), "InvalidIPAddress.InUse");
}

#[tokio::test]
async fn every_bad_prefix_request_gets_ec2_s_code_and_changes_nothing() {
    let mock = fast().await;
    let c = ec2(&mock);
    let d = mock.default_world().unwrap();
    let eni = create_eni(&c, &d.subnet_id).await;
    let other = create_eni(&c, &d.subnet_id).await;
    // A used address in the middle of the subnet, and a prefix elsewhere.
    let held = held_addresses(&mock);
    let used_ip = (0..64)
        .map(|k| Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 0, 9, 37)) + 16 * k))
        .find(|ip| !held.contains(ip))
        .unwrap();
    c.assign_private_ip_addresses()
        .network_interface_id(&other)
        .private_ip_addresses(used_ip.to_string())
        .send()
        .await
        .unwrap();
    let block = free_block(&mock, d.subnet_cidr);
    c.assign_private_ip_addresses()
        .network_interface_id(&other)
        .ipv4_prefixes(block.to_string())
        .send()
        .await
        .unwrap();
    let before = mock.dump();

    let assign = || c.assign_private_ip_addresses().network_interface_id(&eni);
    let cases = vec![
        (
            "count and list",
            assign()
                .ipv4_prefix_count(1)
                .ipv4_prefixes("10.0.8.0/28")
                .send()
                .await,
            "InvalidParameterCombination",
        ),
        (
            "prefix count with an address count",
            assign()
                .ipv4_prefix_count(1)
                .secondary_private_ip_address_count(1)
                .send()
                .await,
            "InvalidParameterCombination",
        ),
        (
            "prefix with an address",
            assign()
                .ipv4_prefixes("10.0.8.0/28")
                .private_ip_addresses("10.0.9.9")
                .send()
                .await,
            "InvalidParameterCombination",
        ),
        (
            "misaligned",
            assign().ipv4_prefixes("10.0.8.5/28").send().await,
            "InvalidParameterValue",
        ),
        (
            "not a /28",
            assign().ipv4_prefixes("10.0.8.0/27").send().await,
            "InvalidParameterValue",
        ),
        (
            "not a CIDR",
            assign().ipv4_prefixes("banana").send().await,
            "InvalidParameterValue",
        ),
        (
            "outside the subnet",
            assign().ipv4_prefixes("10.0.64.0/28").send().await,
            "InvalidParameterValue",
        ),
        (
            "covers the subnet's reserved addresses",
            assign().ipv4_prefixes("10.0.0.0/28").send().await,
            "InvalidParameterValue",
        ),
        (
            "covers the broadcast address",
            assign().ipv4_prefixes("10.0.15.240/28").send().await,
            "InvalidParameterValue",
        ),
        (
            "someone else's prefix",
            assign().ipv4_prefixes(block.to_string()).send().await,
            "InvalidIPAddress.InUse",
        ),
        (
            "covers a used address",
            assign()
                .ipv4_prefixes(Ipv4Net::new(used_ip, 28).unwrap().trunc().to_string())
                .send()
                .await,
            "InvalidIPAddress.InUse",
        ),
        (
            "a /32 inside someone's prefix",
            assign()
                .private_ip_addresses(Ipv4Addr::from(u32::from(block.network()) + 7).to_string())
                .allow_reassignment(true)
                .send()
                .await,
            "InvalidIPAddress.InUse",
        ),
        (
            "zero prefixes",
            assign().ipv4_prefix_count(0).send().await,
            "InvalidParameterValue",
        ),
    ];
    for (what, result, expected) in cases {
        assert_eq!(code(result.unwrap_err()), expected, "{what}");
    }
    let e = c
        .create_network_interface()
        .subnet_id(&d.subnet_id)
        .ipv4_prefix_count(1)
        .secondary_private_ip_address_count(1)
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(e), "InvalidParameterCombination");
    let e = c
        .create_network_interface()
        .subnet_id(&d.subnet_id)
        .ipv4_prefix_count(1)
        .ipv4_prefixes(
            Ipv4PrefixSpecificationRequest::builder()
                .ipv4_prefix("10.0.8.0/28")
                .build(),
        )
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(e), "InvalidParameterCombination");
    let e = c
        .unassign_private_ip_addresses()
        .network_interface_id(&eni)
        .ipv4_prefixes(block.to_string())
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(e), "InvalidParameterValue", "not this ENI's prefix");
    assert_eq!(mock.dump(), before, "no bad request changed the state");
}

#[tokio::test]
async fn prefix_delegation_is_nitro_only() {
    let mock = fast().await;
    let c = ec2(&mock);
    let d = mock.default_world().unwrap();
    let xen = mock
        .launch_instance("t2.medium", &d.subnet_id)
        .await
        .unwrap();
    let old = mock
        .launch_instance("m4.large", &d.subnet_id)
        .await
        .unwrap();
    let metal = mock
        .launch_instance("m5.metal", &d.subnet_id)
        .await
        .unwrap();

    // On a Xen instance's ENI.
    let e = c
        .assign_private_ip_addresses()
        .network_interface_id(&xen.primary_eni)
        .ipv4_prefix_count(1)
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(e), "UnsupportedOperation");
    // An ENI holding a prefix cannot be attached to one.
    let eni = create_eni(&c, &d.subnet_id).await;
    c.assign_private_ip_addresses()
        .network_interface_id(&eni)
        .ipv4_prefix_count(1)
        .send()
        .await
        .unwrap();
    let e = c
        .attach_network_interface()
        .network_interface_id(&eni)
        .instance_id(&old.instance_id)
        .device_index(1)
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(e), "UnsupportedOperation");
    // Bare metal reports no hypervisor but is Nitro.
    c.attach_network_interface()
        .network_interface_id(&eni)
        .instance_id(&metal.instance_id)
        .device_index(1)
        .send()
        .await
        .unwrap();
    c.assign_private_ip_addresses()
        .network_interface_id(&metal.primary_eni)
        .ipv4_prefix_count(2)
        .send()
        .await
        .unwrap();
    // Secondary IPs still work on Xen.
    c.assign_private_ip_addresses()
        .network_interface_id(&xen.primary_eni)
        .secondary_private_ip_address_count(2)
        .send()
        .await
        .unwrap();
}

#[tokio::test]
async fn insufficient_cidr_blocks_when_no_aligned_block_is_free() {
    let mock = empty(1).await;
    let c = ec2(&mock);
    let (vpc, _) = mock.create_vpc("10.9.0.0/16".parse().unwrap()).unwrap();
    // A /26: four blocks, the first and last hold reserved addresses, two are usable.
    let subnet = mock
        .create_subnet(&vpc, "10.9.0.0/26".parse().unwrap(), "us-east-1a")
        .unwrap();
    let eni = create_eni(&c, &subnet).await;
    let usage = mock.subnet_usage(&subnet).unwrap();
    let expected_blocks = 2 - u32::from(held_addresses(&mock).iter().any(|ip| {
        let o = ip.octets()[3];
        (16..48).contains(&o)
    }));
    assert_eq!(usage.free_prefix_blocks, expected_blocks);
    // One address in the middle of each block leaves none.
    mock.occupy_addresses(
        &subnet,
        &OccupyPattern::Stride {
            stride: 16,
            offset: 8,
        },
    )
    .unwrap();
    let usage = mock.subnet_usage(&subnet).unwrap();
    assert_eq!(usage.free_prefix_blocks, 0);
    assert!(usage.free_addresses > 50, "{usage:?}");
    let e = c
        .assign_private_ip_addresses()
        .network_interface_id(&eni)
        .ipv4_prefix_count(1)
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        e.as_service_error().and_then(|s| s.message()),
        Some("The specified subnet does not have enough free cidr blocks to satisfy the request.")
    );
    assert_eq!(code(e), "InsufficientCidrBlocks");
    let e = c
        .create_network_interface()
        .subnet_id(&subnet)
        .ipv4_prefix_count(1)
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(e), "InsufficientCidrBlocks");
    assert_eq!(mock.network_interfaces().len(), 1, "nothing half-created");
    // /32s still work.
    c.assign_private_ip_addresses()
        .network_interface_id(&eni)
        .secondary_private_ip_address_count(10)
        .send()
        .await
        .unwrap();
    // Freed again, a prefix fits.
    mock.release_occupied(&subnet).unwrap();
    let held: Vec<u8> = held_addresses(&mock)
        .iter()
        .map(|ip| ip.octets()[3])
        .collect();
    let fits = [16u8, 32]
        .iter()
        .any(|o| !held.iter().any(|h| (*o..*o + 16).contains(h)));
    let r = c
        .assign_private_ip_addresses()
        .network_interface_id(&eni)
        .ipv4_prefix_count(1)
        .send()
        .await;
    assert_eq!(r.is_ok(), fits, "{r:?}");
}

/// The test's own churn generator (SplitMix64), so the churn is recorded by its seed.
struct Churn(u64);

impl Churn {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) % n as u64) as usize
    }
}

/// One recorded churn: each round creates an ENI with 40 automatic /32s and gives 30 of them back
/// (chosen by the churn's own seed). Returns the free /28 blocks after every round and the error of
/// the prefix request made once none is left.
async fn churn(allocation_seed: u64, churn_seed: u64) -> (Vec<u32>, Vec<u32>, String) {
    let mock = empty(allocation_seed).await;
    let c = ec2(&mock);
    let (vpc, _) = mock.create_vpc("10.20.0.0/16".parse().unwrap()).unwrap();
    let subnet = mock
        .create_subnet(&vpc, "10.20.0.0/22".parse().unwrap(), "us-east-1a")
        .unwrap();
    let mut rng = Churn(churn_seed);
    let mut blocks = vec![mock.subnet_usage(&subnet).unwrap().free_prefix_blocks];
    let mut free = vec![mock.subnet_usage(&subnet).unwrap().free_addresses];
    let mut last = None;
    for _ in 0..60 {
        let created = c
            .create_network_interface()
            .subnet_id(&subnet)
            .secondary_private_ip_address_count(40)
            .send()
            .await
            .unwrap()
            .network_interface
            .unwrap();
        let eni = created.network_interface_id().unwrap().to_owned();
        let mut secondaries: Vec<String> = created
            .private_ip_addresses()
            .iter()
            .filter(|a| a.primary() == Some(false))
            .filter_map(|a| a.private_ip_address().map(str::to_owned))
            .collect();
        let mut req = c.unassign_private_ip_addresses().network_interface_id(&eni);
        for _ in 0..30 {
            req = req.private_ip_addresses(secondaries.remove(rng.below(secondaries.len())));
        }
        req.send().await.unwrap();
        let u = mock.subnet_usage(&subnet).unwrap();
        blocks.push(u.free_prefix_blocks);
        free.push(u.free_addresses);
        last = Some(eni);
        if u.free_prefix_blocks == 0 {
            break;
        }
    }
    let err = c
        .assign_private_ip_addresses()
        .network_interface_id(last.unwrap())
        .ipv4_prefix_count(1)
        .send()
        .await
        .unwrap_err();
    (blocks, free, code(err))
}

#[tokio::test]
async fn a_random_churn_of_32s_fragments_the_subnet() {
    let (blocks, free, err) = churn(42, 7).await;
    eprintln!("free /28 blocks per round: {blocks:?}");
    eprintln!("free addresses per round:  {free:?}");
    // A /22 has 62 blocks clear of reserved addresses; a few hundred scattered /32s take them all.
    assert_eq!(blocks[0], 62);
    assert_eq!(
        *blocks.last().unwrap(),
        0,
        "the churn ends with no free block"
    );
    assert!(blocks.len() > 4, "it takes a churn, not one request");
    assert!(
        blocks[blocks.len() / 2] < blocks[0] / 2,
        "halfway through, most blocks are gone"
    );
    assert_eq!(err, "InsufficientCidrBlocks");
    let still_free = *free.last().unwrap();
    assert!(
        still_free > 500,
        "{still_free} addresses free, but no aligned /28 among them"
    );
    // Recorded: the same seeds give the same subnet, a different allocation seed another one.
    assert_eq!(churn(42, 7).await, (blocks.clone(), free, err));
    assert_ne!(churn(43, 7).await.0, blocks);
}

#[tokio::test]
async fn subnet_cidr_reservations_through_the_sdk() {
    let mock = empty(5).await;
    let c = ec2(&mock);
    let (vpc, _) = mock.create_vpc("10.30.0.0/16".parse().unwrap()).unwrap();
    let subnet = mock
        .create_subnet(&vpc, "10.30.0.0/24".parse().unwrap(), "us-east-1a")
        .unwrap();
    let create = |cidr: &str, kind: SubnetCidrReservationType| {
        c.create_subnet_cidr_reservation()
            .subnet_id(&subnet)
            .cidr(cidr)
            .reservation_type(kind)
            .description("pods")
            .send()
    };
    let pods = create("10.30.0.64/27", SubnetCidrReservationType::Prefix)
        .await
        .unwrap()
        .subnet_cidr_reservation
        .unwrap();
    assert_eq!(pods.cidr(), Some("10.30.0.64/27"));
    assert_eq!(
        pods.reservation_type(),
        Some(&SubnetCidrReservationType::Prefix)
    );
    assert_eq!(pods.subnet_id(), Some(subnet.as_str()));
    assert_eq!(pods.description(), Some("pods"));
    assert!(
        pods.subnet_cidr_reservation_id()
            .unwrap()
            .starts_with("scr-")
    );
    create("10.30.0.128/25", SubnetCidrReservationType::Explicit)
        .await
        .unwrap();
    // Bad ones.
    for (cidr, kind, why) in [
        (
            "10.30.0.64/28",
            SubnetCidrReservationType::Explicit,
            "overlaps a reservation",
        ),
        ("10.31.0.0/28", SubnetCidrReservationType::Prefix, "outside"),
        (
            "10.30.0.5/28",
            SubnetCidrReservationType::Prefix,
            "not a network address",
        ),
        (
            "10.30.0.32/28",
            SubnetCidrReservationType::from("everything"),
            "unknown type",
        ),
    ] {
        let e = create(cidr, kind).await.unwrap_err();
        assert_eq!(code(e), "InvalidParameterValue", "{why}");
    }
    let list = c
        .get_subnet_cidr_reservations()
        .subnet_id(&subnet)
        .filters(filter("reservationType", "prefix"))
        .send()
        .await
        .unwrap();
    assert_eq!(list.subnet_ipv4_cidr_reservations().len(), 1);
    assert!(list.subnet_ipv6_cidr_reservations().is_empty());

    // Automatic /32s avoid every reservation; automatic prefixes come from the prefix one first.
    let eni = create_eni(&c, &subnet).await;
    let prefix_res: Ipv4Net = "10.30.0.64/27".parse().unwrap();
    let explicit_res: Ipv4Net = "10.30.0.128/25".parse().unwrap();
    let ips = c
        .assign_private_ip_addresses()
        .network_interface_id(&eni)
        .secondary_private_ip_address_count(20)
        .send()
        .await
        .unwrap();
    for a in ips.assigned_private_ip_addresses() {
        let ip: Ipv4Addr = a.private_ip_address().unwrap().parse().unwrap();
        assert!(
            !prefix_res.contains(&ip) && !explicit_res.contains(&ip),
            "{ip}"
        );
    }
    let got = c
        .assign_private_ip_addresses()
        .network_interface_id(&eni)
        .ipv4_prefix_count(2)
        .send()
        .await
        .unwrap();
    for p in nets(&prefixes(got.assigned_ipv4_prefixes())) {
        assert!(prefix_res.contains(&p), "{p} from the prefix reservation");
    }
    // Explicit requests may use the explicit reservation.
    c.assign_private_ip_addresses()
        .network_interface_id(&eni)
        .private_ip_addresses("10.30.0.130")
        .send()
        .await
        .unwrap();
    // Used addresses cannot be reserved.
    let res = c
        .get_subnet_cidr_reservations()
        .subnet_id(&subnet)
        .send()
        .await
        .unwrap();
    let explicit_id = res
        .subnet_ipv4_cidr_reservations()
        .iter()
        .find(|r| r.cidr() == Some("10.30.0.128/25"))
        .unwrap()
        .subnet_cidr_reservation_id()
        .unwrap()
        .to_owned();
    let deleted = c
        .delete_subnet_cidr_reservation()
        .subnet_cidr_reservation_id(&explicit_id)
        .send()
        .await
        .unwrap();
    assert_eq!(
        deleted.deleted_subnet_cidr_reservation().unwrap().cidr(),
        Some("10.30.0.128/25")
    );
    let e = create("10.30.0.128/28", SubnetCidrReservationType::Explicit)
        .await
        .unwrap_err();
    assert_eq!(code(e), "InvalidParameterValue", "covers 10.30.0.130");
    let e = c
        .delete_subnet_cidr_reservation()
        .subnet_cidr_reservation_id(&explicit_id)
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(e), "InvalidSubnetCidrReservationID.NotFound");
    let e = c
        .delete_subnet_cidr_reservation()
        .subnet_cidr_reservation_id("scr-nope")
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(e), "InvalidSubnetCidrReservationID.Malformed");
    // Rust API sees the same.
    let left: BTreeSet<Ipv4Net> = mock
        .subnet_cidr_reservations(&subnet)
        .unwrap()
        .into_iter()
        .map(|r| {
            assert_eq!(r.reservation_type, ReservationType::Prefix);
            r.cidr
        })
        .collect();
    assert_eq!(left, [prefix_res].into());
}
