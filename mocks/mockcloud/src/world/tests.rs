//! Unit tests of the world's rules without HTTP (the SDK-level tests are in `mocks/mockcloud/tests/`).

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::Duration;

use ipnet::Ipv4Net;
use tokio::time::Instant;

use super::*;

fn timing() -> Timing {
    Timing {
        attach_delay: Duration::ZERO,
        detach_delay: Duration::ZERO,
        imds_lag: Duration::ZERO,
        describe_lag: Duration::ZERO,
        new_eni_lag: Default::default(),
    }
}

fn world_with(cidr: &str, itype: &str) -> (World, String, String, Instant) {
    let now = Instant::now();
    let mut w = World::new("us-east-1", timing());
    let (vpc, _) = w.create_vpc("10.0.0.0/16".parse().unwrap()).unwrap();
    let subnet = w
        .create_subnet(&vpc, cidr.parse().unwrap(), "us-east-1a")
        .unwrap();
    let inst = w.launch_instance(itype, &subnet, &[], now).unwrap();
    (w, subnet, inst, now)
}

fn eni(w: &mut World, subnet: &str, now: Instant) -> String {
    w.create_network_interface(
        &CreateEniArgs {
            subnet_id: subnet.to_owned(),
            ..Default::default()
        },
        now,
    )
    .unwrap()
    .id
}

fn all_held(w: &mut World, now: Instant) -> Vec<Ipv4Addr> {
    let views = w.describe_network_interfaces(&[], &[], now).unwrap();
    let mut out = Vec::new();
    for e in views {
        out.push(e.primary_ip);
        out.extend(e.secondary_ips);
        for p in e.ipv4_prefixes {
            out.extend(p.hosts().chain([p.network(), p.broadcast()]));
        }
    }
    out.sort();
    out
}

#[test]
fn small_subnet_runs_out_and_never_hands_out_reserved_addresses() {
    let (mut w, subnet, _inst, now) = world_with("10.0.0.0/28", "t3.medium");
    // /28 = 16 addresses, 11 usable, 1 used by the instance's primary ENI.
    let eni = w
        .create_network_interface(
            &CreateEniArgs {
                subnet_id: subnet.clone(),
                secondary_count: 5,
                ..Default::default()
            },
            now,
        )
        .unwrap();
    let err = w
        .assign_private_ip_addresses(&eni.id, AssignArgs::Count(5), now)
        .unwrap_err();
    assert_eq!(err.code, "InsufficientFreeAddressesInSubnet");
    let got = w
        .assign_private_ip_addresses(&eni.id, AssignArgs::Count(4), now)
        .unwrap();
    assert_eq!(got.len(), 4);
    let ips = all_held(&mut w, now);
    let n = ips.len();
    let mut unique = ips.clone();
    unique.dedup();
    assert_eq!(unique.len(), n, "no duplicates");
    assert_eq!(n, 11);
    for ip in ips {
        let o = ip.octets()[3];
        assert!((4..15).contains(&o), "{ip} is reserved");
    }
    // A /28 subnet has no /28 block clear of its reserved addresses.
    assert_eq!(w.subnet_usage(&subnet).unwrap().free_prefix_blocks, 0);
}

#[test]
fn automatic_addresses_spread_randomly_and_reproducibly() {
    let run = |seed: u64| {
        let (mut w, subnet, _inst, now) = world_with("10.0.0.0/20", "m5.large");
        w.set_allocation_seed(seed);
        let e = eni(&mut w, &subnet, now);
        w.assign_private_ip_addresses(&e, AssignArgs::Count(8), now)
            .unwrap()
    };
    let a = run(7);
    assert_eq!(a, run(7), "same seed, same addresses");
    assert_ne!(a, run(8), "another seed, other addresses");
    let mut sorted = a.clone();
    sorted.sort();
    let spread = u32::from(*sorted.last().unwrap()) - u32::from(sorted[0]);
    assert!(spread > 64, "spread over the subnet, not packed: {a:?}");
}

#[test]
fn prefixes_hold_sixteen_addresses_and_never_overlap_anything() {
    let (mut w, subnet, _inst, now) = world_with("10.0.0.0/24", "m5.large");
    let before = w.subnet_usage(&subnet).unwrap();
    // 256 addresses: 16 blocks, the first and last hold reserved addresses.
    assert_eq!(before.usable, 251);
    assert!(before.free_prefix_blocks <= 14);
    let e = eni(&mut w, &subnet, now);
    let got = w
        .assign_ipv4_prefixes(&e, PrefixArgs::Count(3), now)
        .unwrap();
    assert_eq!(got.len(), 3);
    for p in &got {
        assert_eq!(p.prefix_len(), 28);
        assert_eq!(p.trunc(), *p, "aligned");
    }
    let after = w.subnet_usage(&subnet).unwrap();
    assert_eq!(after.free_addresses, before.free_addresses - 1 - 48);
    let held = all_held(&mut w, now);
    let mut unique = held.clone();
    unique.dedup();
    assert_eq!(unique, held, "every address held once");
    // No /32 can land inside a prefix, explicitly or not.
    let inside = got[0].network();
    let err = w
        .assign_private_ip_addresses(
            &e,
            AssignArgs::Addresses {
                ips: vec![Ipv4Addr::from(u32::from(inside) + 3)],
                allow_reassignment: true,
            },
            now,
        )
        .unwrap_err();
    assert_eq!(err.code, "InvalidIPAddress.InUse");
    // Limit: m5.large holds 10 per ENI, the primary and 3 prefixes are 4, once attached.
    let inst = w.instance_ids()[0].clone();
    w.attach_network_interface(&e, &inst, 1, now).unwrap();
    let err = w
        .assign_ipv4_prefixes(&e, PrefixArgs::Count(7), now)
        .unwrap_err();
    assert_eq!(err.code, "PrivateIpAddressLimitExceeded");
    w.assign_ipv4_prefixes(&e, PrefixArgs::Count(6), now)
        .unwrap();
    // Unassign gives all 16 back.
    let free = w.subnet_usage(&subnet).unwrap().free_addresses;
    w.unassign_ipv4_prefixes(&e, &got[..1], now).unwrap();
    assert_eq!(w.subnet_usage(&subnet).unwrap().free_addresses, free + 16);
}

#[test]
fn reservations_steer_automatic_choice() {
    // Reservations first (they may not cover used addresses), then the ENI.
    let now = Instant::now();
    let mut w = World::new("us-east-1", timing());
    let (vpc, _) = w.create_vpc("10.0.0.0/16".parse().unwrap()).unwrap();
    let subnet = w
        .create_subnet(&vpc, "10.0.0.0/24".parse().unwrap(), "us-east-1a")
        .unwrap();
    let prefix_res: Ipv4Net = "10.0.0.64/27".parse().unwrap();
    let explicit_res: Ipv4Net = "10.0.0.128/25".parse().unwrap();
    w.create_subnet_cidr_reservation(
        &subnet,
        prefix_res,
        ReservationType::Prefix,
        "pods",
        &BTreeMap::new(),
    )
    .unwrap();
    w.create_subnet_cidr_reservation(
        &subnet,
        explicit_res,
        ReservationType::Explicit,
        "",
        &BTreeMap::new(),
    )
    .unwrap();
    let e = eni(&mut w, &subnet, now);
    // The first two automatic prefixes come from the prefix reservation, the next from outside
    // every reservation.
    let got = w
        .assign_ipv4_prefixes(&e, PrefixArgs::Count(3), now)
        .unwrap();
    assert!(
        prefix_res.contains(&got[0]) && prefix_res.contains(&got[1]),
        "{got:?}"
    );
    assert!(!prefix_res.contains(&got[2]) && !explicit_res.contains(&got[2]));
    // Automatic /32s never come from a reservation.
    let ips = w
        .assign_private_ip_addresses(&e, AssignArgs::Count(6), now)
        .unwrap();
    for ip in &ips {
        assert!(
            !prefix_res.contains(ip) && !explicit_res.contains(ip),
            "{ip}"
        );
    }
    // An explicit request may use an explicit reservation.
    let explicit: Ipv4Addr = "10.0.0.200".parse().unwrap();
    w.assign_private_ip_addresses(
        &e,
        AssignArgs::Addresses {
            ips: vec![explicit],
            allow_reassignment: false,
        },
        now,
    )
    .unwrap();
    // A reservation may not overlap another, nor cover used addresses.
    let err = w
        .create_subnet_cidr_reservation(
            &subnet,
            "10.0.0.192/28".parse().unwrap(),
            ReservationType::Prefix,
            "",
            &BTreeMap::new(),
        )
        .unwrap_err();
    assert_eq!(err.code, "InvalidParameterValue");
    assert!(err.message.contains("overlaps the reservation"), "{err}");
    let used = Ipv4Net::new(ips[0], 32).unwrap();
    let err = w
        .create_subnet_cidr_reservation(
            &subnet,
            used,
            ReservationType::Explicit,
            "",
            &BTreeMap::new(),
        )
        .unwrap_err();
    assert!(err.message.contains("in use"), "{err}");
}

#[test]
fn occupying_a_stride_leaves_no_block_free() {
    let (mut w, subnet, _inst, now) = world_with("10.0.0.0/22", "m5.large");
    let blocks = w.subnet_usage(&subnet).unwrap().free_prefix_blocks;
    assert!(blocks >= 60);
    // The instance's primary IP may already sit at offset 9 of its block.
    let primary = all_held(&mut w, now)[0];
    let expected = 64 - u32::from(u32::from(primary) % 16 == 9);
    let n = w
        .occupy_addresses(
            &subnet,
            &OccupyPattern::Stride {
                stride: 16,
                offset: 9,
            },
        )
        .unwrap();
    assert_eq!(n, expected, "one address in each of the 64 blocks");
    let u = w.subnet_usage(&subnet).unwrap();
    assert_eq!(u.free_prefix_blocks, 0);
    assert_eq!(u.occupied, expected);
    assert!(u.free_addresses > 900, "plenty of /32s left");
    assert_eq!(w.release_occupied(&subnet).unwrap(), expected);
    assert_eq!(w.subnet_usage(&subnet).unwrap().free_prefix_blocks, blocks);
}

#[test]
fn glob_matches_like_ec2() {
    assert!(glob("eni-*", "eni-123"));
    assert!(glob("a?c", "abc"));
    assert!(!glob("a?c", "ac"));
    assert!(glob("*", ""));
}

/// A world with one m5.large instance, timed by `timing`: the world, the instance and its primary
/// ENI.
fn one_instance(timing: Timing, t0: Instant) -> (World, String, String) {
    let mut w = World::new("us-east-1", timing);
    let (vpc, _) = w.create_vpc("10.0.0.0/16".parse().unwrap()).unwrap();
    let subnet = w
        .create_subnet(&vpc, "10.0.0.0/22".parse().unwrap(), "us-east-1a")
        .unwrap();
    let inst = w.launch_instance("m5.large", &subnet, &[], t0).unwrap();
    let primary = w.instance(&inst, t0).unwrap().enis[0].id.clone();
    (w, inst, primary)
}

#[test]
fn imds_shows_prefixes_after_the_lag_and_lets_removed_ones_linger() {
    let t0 = Instant::now();
    let lag = Duration::from_secs(1);
    let (mut w, inst, primary) = one_instance(
        Timing {
            imds_lag: lag,
            ..timing()
        },
        t0,
    );
    let got = w
        .assign_ipv4_prefixes(&primary, PrefixArgs::Count(1), t0)
        .unwrap();
    let shown = |w: &mut World, at: Instant| {
        w.imds(&inst, at).unwrap().interfaces[0]
            .ipv4_prefixes
            .clone()
    };
    assert!(shown(&mut w, t0).is_empty(), "not yet");
    assert_eq!(shown(&mut w, t0 + lag), got);
    let t1 = t0 + lag * 2;
    w.unassign_ipv4_prefixes(&primary, &got, t1).unwrap();
    assert!(
        w.instance(&inst, t1).unwrap().enis[0]
            .ipv4_prefixes
            .is_empty(),
        "EC2 at once"
    );
    assert_eq!(shown(&mut w, t1), got, "IMDS still shows it");
    assert!(shown(&mut w, t1 + lag).is_empty());
}

#[test]
fn describes_show_addresses_as_they_were_a_lag_ago() {
    let t0 = Instant::now();
    let lag = Duration::from_secs(2);
    let (mut w, inst, eni) = one_instance(
        Timing {
            describe_lag: lag,
            ..timing()
        },
        t0,
    );
    let got = w
        .assign_private_ip_addresses(&eni, AssignArgs::Count(2), t0)
        .unwrap();
    let described = |w: &mut World, at: Instant| {
        let by_eni = w
            .describe_network_interfaces(std::slice::from_ref(&eni), &[], at)
            .unwrap()[0]
            .secondary_ips
            .clone();
        let by_instance = w
            .describe_instances(std::slice::from_ref(&inst), &[], at)
            .unwrap()[0]
            .enis[0]
            .secondary_ips
            .clone();
        assert_eq!(by_eni, by_instance, "both describes lag alike");
        let mut ips = by_eni;
        ips.sort();
        ips
    };
    let mut got = got;
    got.sort();
    assert!(described(&mut w, t0).is_empty(), "not yet");
    assert!(described(&mut w, t0 + lag - Duration::from_millis(1)).is_empty());
    assert_eq!(described(&mut w, t0 + lag), got);
    let mut truth = w
        .network_interfaces(t0)
        .into_iter()
        .find(|e| e.id == eni)
        .unwrap()
        .secondary_ips;
    truth.sort();
    assert_eq!(truth, got, "the truth shows them at once");
    let t1 = t0 + lag * 2;
    w.unassign_private_ip_addresses(&eni, &got[..1], t1)
        .unwrap();
    assert_eq!(described(&mut w, t1), got, "a describe still shows it");
    assert_eq!(described(&mut w, t1 + lag), got[1..].to_vec());
}

#[test]
fn a_new_eni_is_unlisted_and_its_first_calls_refused_within_the_lag() {
    let t0 = Instant::now();
    let window = Duration::from_secs(2);
    let (mut w, inst, primary) = one_instance(
        Timing {
            new_eni_lag: crate::NewEniLag {
                refusals: 2,
                ..crate::NewEniLag::strict(window)
            },
            ..timing()
        },
        t0,
    );
    let ms = Duration::from_millis;
    let subnet = w.instance(&inst, t0).unwrap().subnet_id;
    let id = eni(&mut w, &subnet, t0);
    let listed = |w: &mut World, at: Instant| {
        let by_id = w.describe_network_interfaces(std::slice::from_ref(&id), &[], at);
        let all = w.describe_network_interfaces(&[], &[], at).unwrap();
        let unfiltered = all.iter().any(|v| v.id == id);
        match by_id {
            Ok(v) => {
                assert!(unfiltered, "both describes lag alike");
                Some(v[0].clone())
            }
            Err(e) => {
                assert_eq!(e.code, "InvalidNetworkInterfaceID.NotFound");
                assert!(!unfiltered, "both describes lag alike");
                assert!(all.iter().any(|v| v.id == primary), "a launch's ENI shows");
                None
            }
        }
    };
    assert!(
        listed(&mut w, t0).is_none(),
        "not listed right after the create"
    );
    assert!(listed(&mut w, t0 + window - ms(1)).is_none());
    assert!(
        listed(&mut w, t0 + window).is_some(),
        "listed after the lag"
    );

    // Within the window, the first two calls naming it are refused, unperformed.
    let t1 = t0 + ms(500);
    for _ in 0..2 {
        let e = w.attach_network_interface(&id, &inst, 1, t1).unwrap_err();
        assert_eq!(e.code, "InvalidNetworkInterfaceID.NotFound");
    }
    assert!(
        w.network_interfaces(t1)
            .iter()
            .any(|v| v.id == id && v.attachment.is_none())
    );
    w.attach_network_interface(&id, &inst, 1, t1).unwrap();
    let truth = w
        .network_interfaces(t1)
        .into_iter()
        .find(|v| v.id == id)
        .unwrap();
    assert_eq!(truth.status, "in-use", "the truth at once");

    // Describes show the attachment only a window after it was made.
    let attached = |w: &mut World, at: Instant| {
        let v = listed(w, at).expect("listed");
        let in_instance = w
            .describe_instances(std::slice::from_ref(&inst), &[], at)
            .unwrap()[0]
            .enis
            .iter()
            .any(|e| e.id == id);
        assert_eq!(
            v.attachment.is_some(),
            in_instance,
            "both describes lag alike"
        );
        (v.status, in_instance)
    };
    assert_eq!(attached(&mut w, t1 + window - ms(1)), ("available", false));
    assert_eq!(attached(&mut w, t1 + window), ("in-use", true));

    // After the window nothing is refused, whatever the count.
    let late = eni(&mut w, &subnet, t0);
    w.assign_private_ip_addresses(&late, AssignArgs::Count(1), t0 + window)
        .unwrap();
}

#[test]
fn the_refused_share_of_new_enis_is_picked_by_id() {
    let ids: Vec<String> = (0..1000u64)
        .map(|n| format!("eni-0{:016x}", splitmix(n)))
        .collect();
    let refused = |lag: crate::NewEniLag| ids.iter().filter(|id| lag.refusals_for(id) > 0).count();
    let window = Duration::from_secs(2);
    assert_eq!(refused(crate::NewEniLag::strict(window)), 1000);
    assert_eq!(refused(crate::NewEniLag::none()), 0, "no refusals");
    let quarter = refused(crate::NewEniLag::realistic());
    assert!((200..300).contains(&quarter), "about a quarter: {quarter}");
    assert_eq!(
        quarter,
        refused(crate::NewEniLag::realistic()),
        "reproducible"
    );
}

/// RunInstances' primary interface may carry secondary IPs or `/28`s from the launch, as EC2
/// checks them: never both, prefixes only on Nitro, never beyond the type's addresses per
/// interface; a refused launch creates nothing.
#[test]
fn a_launch_carries_addresses_on_eth0_as_ec2_checks_them() {
    let t0 = Instant::now();
    let mut w = World::new("us-east-1", timing());
    let (vpc, _) = w.create_vpc("10.0.0.0/16".parse().unwrap()).unwrap();
    let subnet = w
        .create_subnet(&vpc, "10.0.0.0/22".parse().unwrap(), "us-east-1a")
        .unwrap();
    let carrying = |secondary_count, prefix_count| super::LaunchAddresses {
        secondary_count,
        prefix_count,
    };
    let inst = w
        .launch_instance_carrying("m5.xlarge", &subnet, &[], carrying(0, 2), t0)
        .unwrap();
    let eth0 = &w.instance(&inst, t0).unwrap().enis[0];
    assert_eq!(eth0.ipv4_prefixes.len(), 2);
    assert!(eth0.secondary_ips.is_empty());
    let inst = w
        .launch_instance_carrying("m5.xlarge", &subnet, &[], carrying(14, 0), t0)
        .unwrap();
    assert_eq!(
        w.instance(&inst, t0).unwrap().enis[0].secondary_ips.len(),
        14
    );

    let enis_before = w.network_interfaces(t0).len();
    let refused = [
        (carrying(4, 1), "m5.xlarge", "InvalidParameterCombination"),
        (carrying(0, 1), "m4.xlarge", "UnsupportedOperation"),
        (
            carrying(15, 0),
            "m5.xlarge",
            "PrivateIpAddressLimitExceeded",
        ),
        (
            carrying(0, 15),
            "m5.xlarge",
            "PrivateIpAddressLimitExceeded",
        ),
    ];
    for (addresses, itype, code) in refused {
        let e = w
            .launch_instance_carrying(itype, &subnet, &[], addresses, t0)
            .unwrap_err();
        assert_eq!(e.code, code, "{addresses:?} on {itype}: {e:?}");
    }
    assert_eq!(
        w.network_interfaces(t0).len(),
        enis_before,
        "nothing created"
    );
}
