//! The rebuild's merge, without I/O: what the journal and the plugin's cache may add to EC2's
//! describe, and what they may not (issue 44 case 8).

use std::collections::BTreeMap;

use super::*;
use crate::cloud::{AttachmentStatus, EniAttachment, EniStatus, tags};
use crate::reconcile::evidence::HostClaim;
use crate::store::StoredAssignment;

const INSTANCE: &str = "i-1";
const NOW_MS: u64 = 1_700_000_000_000;

fn ip(last: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 0, 0, last)
}

/// An ENI of ours attached at `device` with `secondary` IPs (primary 10.0.0.<device+1>).
fn eni(id: &str, device: u32, secondary: &[u8]) -> Eni {
    Eni {
        id: id.parse().unwrap(),
        mac: format!("02:00:00:00:00:0{device}"),
        subnet_id: "subnet-1".into(),
        vpc_id: "vpc-1".into(),
        availability_zone: "az-1".into(),
        description: String::new(),
        status: EniStatus::InUse,
        primary_ip: ip(device as u8 + 1),
        secondary_ips: secondary.iter().map(|l| ip(*l)).collect(),
        ipv4_prefixes: Vec::new(),
        security_groups: Vec::new(),
        attachment: Some(EniAttachment {
            attachment_id: format!("att-{device}"),
            instance_id: INSTANCE.into(),
            device_index: device,
            status: AttachmentStatus::Attached,
            delete_on_termination: true,
        }),
        tags: BTreeMap::from([(tags::OWNER.to_owned(), tags::OWNER_VALUE.to_owned())]),
        ipv6_addresses: Vec::new(),
        ipv6_prefixes: Vec::new(),
    }
}

fn stored_eni(e: &Eni) -> StoredEni {
    StoredEni {
        eni_id: e.id.to_string(),
        mac: e.mac.clone(),
        device_index: e.attachment.as_ref().unwrap().device_index,
        subnet_id: e.subnet_id.clone(),
        subnet_cidr: "10.0.0.0/24".into(),
        primary_ip: e.primary_ip,
        created_by_us: true,
        created_at_ms: NOW_MS - 600_000,
    }
}

fn change(eni: &str, last: u8, change: Ec2Change, ago_ms: u64) -> StoredEc2Change {
    StoredEc2Change {
        address: Ec2Address::Ip(ip(last)),
        eni_id: eni.into(),
        change,
        at_ms: NOW_MS - ago_ms,
    }
}

fn claim(container: &str, last: u8, eni: &str) -> HostClaim {
    HostClaim {
        ip: ip(last),
        ipv6: None,
        egress_ipv4: None,
        network: "eniipam".into(),
        attachment: AttachmentKey::new(container, "eth0"),
        pod: PodRef::default(),
        sticky_key: None,
        netns: format!("/run/netns/{container}"),
        eni_id: eni.into(),
    }
}

fn assignment(container: &str, last: u8, eni: &str) -> StoredAssignment {
    StoredAssignment {
        ip: ip(last),
        eni_id: eni.into(),
        network: "eniipam".into(),
        container_id: container.into(),
        ifname: "eth0".into(),
        netns: format!("/run/netns/{container}"),
        pod_namespace: "default".into(),
        pod_name: container.into(),
        pod_uid: format!("uid-{container}"),
        sticky_key: None,
        assigned_at_ms: NOW_MS - 30_000,
    }
}

fn run(
    described: &[Eni],
    stored: StoredState,
    state_lost: bool,
    claims: Vec<HostClaim>,
    changes: Vec<StoredEc2Change>,
) -> Rebuilt {
    run_as(described, stored, (state_lost, false), claims, changes)
}

/// `run` with `(state_lost, first_start)`.
fn run_as(
    described: &[Eni],
    stored: StoredState,
    (state_lost, first_start): (bool, bool),
    claims: Vec<HostClaim>,
    changes: Vec<StoredEc2Change>,
) -> Rebuilt {
    let host = HostEvidence {
        cache_visible: true,
        claims,
    };
    let netns = NetnsView::default();
    merge(
        INSTANCE,
        &[],
        described,
        &BTreeMap::from([("subnet-1".to_owned(), "10.0.0.0/24".parse().unwrap())]),
        Inputs {
            stored,
            state_lost,
            first_start,
            host: &host,
            netns: &netns,
            use_primary_eni: false,
            ec2_changes: changes,
            described: None,
        },
        Instant::now(),
        NOW_MS,
    )
}

fn seeded(r: &Rebuilt) -> Vec<Ipv4Addr> {
    let mut ips: Vec<Ipv4Addr> = r
        .seed
        .enis
        .iter()
        .flat_map(|e| e.secondary_ips.iter().copied())
        .collect();
    ips.sort();
    ips
}

/// The soak's path: a pod's IP (.10) unassigned out of band 30 s after the pool assigned it, found
/// lost by the running reconcile, which forgot its record and the journal's assign of it
/// (`Store::remove_ips`); its slot went to .13. The pod still runs, so the plugin's cache still
/// names .10. With the file intact the cache does not put .10 back: the file no longer records it.
#[test]
fn a_lost_ip_is_not_taken_back_from_a_live_pods_cache_entry() {
    let described = vec![eni("eni-00000001", 1, &[11, 12, 13])];
    let stored = StoredState {
        instance_id: Some(INSTANCE.into()),
        enis: vec![stored_eni(&described[0])],
        assignments: vec![assignment("b", 11, "eni-00000001")],
        ..StoredState::default()
    };
    let changes = vec![change("eni-00000001", 13, Ec2Change::Assigned, 5_000)];
    let claims = vec![
        claim("a", 10, "eni-00000001"),
        claim("b", 11, "eni-00000001"),
    ];
    let r = run(&described, stored, false, claims, changes);
    assert_eq!(seeded(&r), vec![ip(11), ip(12), ip(13)]);
    assert!(r.report.adopted.is_empty(), "{:?}", r.report.adopted);
    assert!(r.seed.allocations.iter().all(|a| a.ip != ip(10)));
    assert_eq!(r.report.journal_corrections, 0, "{:?}", r.report);
}

/// The soak's second path (seed 27, step 405): an IP lost out of band while idle was handed to a
/// new pod before the running reconcile missed it twice, so the file records that pod holding it;
/// a restart then must not take it back from the cache either (it did at every restart, for over
/// a minute). With the file, only the journal vouches for an address the describe does not show:
/// the pool writes it before handing any of them out.
#[test]
fn with_the_file_the_cache_places_nothing_only_the_journal_does() {
    let described = vec![eni("eni-00000001", 1, &[11])];
    let stored = StoredState {
        instance_id: Some(INSTANCE.into()),
        enis: vec![stored_eni(&described[0])],
        assignments: vec![
            assignment("a", 10, "eni-00000001"),
            assignment("b", 12, "eni-00000001"),
        ],
        ..StoredState::default()
    };
    let claims = vec![
        claim("a", 10, "eni-00000001"),
        claim("b", 12, "eni-00000001"),
    ];
    // .12 was assigned by EC2 5 s ago (the journal says so); .10 long ago, and gone since.
    let changes = vec![change("eni-00000001", 12, Ec2Change::Assigned, 5_000)];
    let r = run(&described, stored, false, claims, changes);
    assert_eq!(seeded(&r), vec![ip(11), ip(12)]);
    assert_eq!(r.report.kept, 1, "{:?}", r.report);
    assert_eq!(
        r.report.dropped_gone,
        vec![(AttachmentKey::new("a", "eth0"), ip(10))]
    );
}

/// A lost state file within the describe lag still places a live pod's IP from the cache.
#[test]
fn with_the_file_lost_a_live_pods_ip_the_describe_does_not_show_yet_is_placed_from_the_cache() {
    let described = vec![eni("eni-00000001", 1, &[11])];
    let claims = vec![claim("a", 10, "eni-00000001")];
    let r = run(&described, StoredState::default(), true, claims, Vec::new());
    assert_eq!(seeded(&r), vec![ip(10), ip(11)]);
    assert_eq!(r.report.adopted.len(), 1);
}

/// A node's first start finds the addresses its launch template asked for (eth0's secondary IPs)
/// and no pod on the host: they never served a pod, so they are idle and eligible at once, neither
/// quarantined nor cooling. The same addresses after a lost state file (a daemon served this
/// instance before) stay quarantined until a settled describe; with a pod's cache entry on the
/// host, a first start is not trusted either.
#[test]
fn a_first_starts_launch_addresses_are_fresh_only_with_no_pod_on_the_host() {
    // (The runner's eth0 serves no pods: an ENI of ours at device 1 stands for it.)
    let described = vec![eni("eni-00000001", 1, &[11, 12, 13])];
    let first = run_as(
        &described,
        StoredState::default(),
        (true, true),
        Vec::new(),
        Vec::new(),
    );
    assert!(first.report.quarantined.is_empty(), "{:?}", first.report);
    assert_eq!(first.report.fresh_ips, 3, "{:?}", first.report);
    assert_eq!(first.report.unknown_ips, 0);
    assert_eq!(first.seed.idle.len(), 3);
    assert!(
        first.seed.idle.iter().all(|i| i.fresh),
        "{:?}",
        first.seed.idle
    );

    let lost = run_as(
        &described,
        StoredState::default(),
        (true, false),
        Vec::new(),
        Vec::new(),
    );
    assert_eq!(lost.report.quarantined.len(), 3, "{:?}", lost.report);
    assert_eq!(lost.report.fresh_ips, 0);
    assert!(lost.seed.idle.iter().all(|i| !i.fresh));

    let with_pod = run_as(
        &described,
        StoredState::default(),
        (true, true),
        vec![claim("a", 11, "eni-00000001")],
        Vec::new(),
    );
    assert_eq!(with_pod.report.fresh_ips, 0, "{:?}", with_pod.report);
    assert_eq!(
        with_pod.report.quarantined.len(),
        2,
        "{:?}",
        with_pod.report
    );
    assert!(with_pod.seed.idle.iter().all(|i| !i.fresh));

    // A kept state file is never a first start's.
    let kept = run_as(
        &described,
        StoredState {
            instance_id: Some(INSTANCE.into()),
            enis: vec![stored_eni(&described[0])],
            ..StoredState::default()
        },
        (false, true),
        Vec::new(),
        Vec::new(),
    );
    assert_eq!(kept.report.fresh_ips, 0);
    assert!(kept.seed.idle.iter().all(|i| !i.fresh));
}

/// The soak's path with burst prefixes (seed 46, step 42): a `/28` assigned to an ENI that already
/// holds one, moments before a SIGKILL that lost the state file, is in IMDS but not yet in EC2's
/// describe. The live pods on its addresses keep them: the `/28` is taken from IMDS, its addresses
/// held from new pods until a describe shows it; a single address IMDS lists is placed as one. An
/// address on an ENI with `/28`s that IMDS lists in neither way is left out (nothing tells a single
/// address from one of a `/28` not listed yet).
#[test]
fn with_the_file_lost_a_live_pods_address_in_a_28_imds_lists_keeps_the_28() {
    let old: Ipv4Net = "10.0.0.16/28".parse().unwrap();
    let new: Ipv4Net = "10.0.0.32/28".parse().unwrap();
    let mut e = eni("eni-00000001", 1, &[]);
    e.ipv4_prefixes = vec![old];
    let imds = vec![MetadataEni {
        mac: e.mac.clone(),
        eni_id: e.id.clone(),
        device_number: 1,
        subnet_id: e.subnet_id.clone(),
        vpc_id: e.vpc_id.clone(),
        subnet_cidr: "10.0.0.0/24".parse().unwrap(),
        vpc_cidrs: Vec::new(),
        security_groups: Vec::new(),
        ips: vec![e.primary_ip, ip(77)],
        ipv4_prefixes: vec![old, new],
        ipv6s: Vec::new(),
        ipv6_prefixes: Vec::new(),
        subnet_ipv6_cidrs: Vec::new(),
        vpc_ipv6_cidrs: Vec::new(),
    }];
    let host = HostEvidence {
        cache_visible: true,
        // .34 is in the new /28; .77 a single address IMDS lists; .99 in neither.
        claims: vec![
            claim("a", 34, "eni-00000001"),
            claim("b", 99, "eni-00000001"),
            claim("c", 77, "eni-00000001"),
        ],
    };
    let netns = NetnsView::default();
    let r = merge(
        INSTANCE,
        &imds,
        &[e],
        &BTreeMap::from([("subnet-1".to_owned(), "10.0.0.0/24".parse().unwrap())]),
        Inputs {
            stored: StoredState::default(),
            state_lost: true,
            first_start: false,
            host: &host,
            netns: &netns,
            use_primary_eni: false,
            ec2_changes: Vec::new(),
            described: None,
        },
        Instant::now(),
        NOW_MS,
    );
    let mut held: Vec<Ipv4Addr> = r.seed.allocations.iter().map(|a| a.ip).collect();
    held.sort();
    assert_eq!(held, vec![ip(34), ip(77)], "{:?}", r.report);
    assert!(r.seed.enis[0].prefixes.contains(&new), "{:?}", r.seed.enis);
    assert!(
        new.hosts().all(|a| r.report.unconfirmed.contains(&a)),
        "the /28's addresses wait for a describe: {:?}",
        r.report.unconfirmed
    );
    assert!(!r.report.unconfirmed.contains(&ip(99)));
}
