//! The running reconcile's decisions, without I/O: one case per kind of drift (and "nothing to do"),
//! each a pool, a host and an EC2 view looked at one or more times in a row.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::Duration;

use super::*;
use crate::cloud::{AttachmentStatus, EniAttachment, EniStatus, tags};
use crate::model::PodRef;
use crate::pool::AttachmentMeta;
use crate::pool::snapshot::IpSnapshot;

mod prefix6;
mod store;

const ETH0: &str = "eni-00000000";
const ETH1: &str = "eni-00000001";
const ETH2: &str = "eni-00000002";
const SUBNET: &str = "subnet-1";

fn id(s: &str) -> EniId {
    s.parse().unwrap()
}

fn ip(last: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 0, 0, last)
}

fn key(c: &str) -> AttachmentKey {
    AttachmentKey::new(c, "eth0")
}

fn pod(name: &str) -> PodRef {
    PodRef {
        namespace: "default".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
    }
}

fn netns(c: &str) -> String {
    format!("/var/run/netns/{c}")
}

fn assigned(last: u8, c: &str) -> IpSnapshot {
    IpSnapshot {
        ip: ip(last),
        state: IpState::Assigned {
            attachment: key(c),
            pod: pod(c),
            sticky_key: None,
            meta: AttachmentMeta {
                network: "net".into(),
                netns: netns(c),
            },
            held_for: Duration::from_secs(60),
        },
    }
}

fn idle(last: u8) -> IpSnapshot {
    IpSnapshot {
        ip: ip(last),
        state: IpState::Idle {
            idle_for: Duration::from_secs(60),
        },
    }
}

fn quarantined(last: u8) -> IpSnapshot {
    IpSnapshot {
        ip: ip(last),
        state: IpState::Quarantined {
            reason: "no evidence".into(),
            held_for: Duration::from_secs(60),
        },
    }
}

/// Quarantined at a startup whose file was lost, `held` ago (EC2's describe may have lagged).
fn unsettled(last: u8, held: Duration) -> IpSnapshot {
    IpSnapshot {
        ip: ip(last),
        state: IpState::Quarantined {
            reason: QUARANTINE_UNSETTLED.into(),
            held_for: held,
        },
    }
}

fn releasing(last: u8) -> IpSnapshot {
    IpSnapshot {
        ip: ip(last),
        state: IpState::Releasing,
    }
}

/// An ENI of the pool: eth0 (device 0, primary) or one of ours serving pods.
fn pool_eni(eni: &str, ips: Vec<IpSnapshot>) -> EniSnapshot {
    let primary = eni == ETH0;
    EniSnapshot {
        id: id(eni),
        mac: format!("02:00:00:00:00:{}", &eni[eni.len() - 2..]),
        device_index: u32::from(!primary),
        subnet_id: SUBNET.into(),
        subnet_cidr: Some("10.0.0.0/24".parse().unwrap()),
        primary_ip: Ipv4Addr::new(10, 0, 1, u8::from(!primary)),
        role: if primary {
            EniRole::Primary
        } else {
            EniRole::Pods
        },
        serves_pods: true,
        prefixes: Vec::new(),
        phase: EniPhaseSnapshot::Serving,
        in_flight: 0,
        ips,
        network: None,
    }
}

fn pool(enis: Vec<EniSnapshot>) -> PoolSnapshot {
    PoolSnapshot {
        capacity: 0,
        tokens_used: 0,
        idle: 0,
        idle_eligible: 0,
        cooling: 0,
        reserved: 0,
        assigned: 0,
        releasing: 0,
        quarantined: 0,
        held_back: 0,
        in_flight: 0,
        waiting_for_eni: 0,
        creating_enis: 0,
        min_idle: 0,
        max_idle: 0,
        warm_policy: Default::default(),
        warm_target: 0,
        warm_fill: 0,
        warm_keep: 0,
        max_enis: 4,
        ips_per_eni: 10,
        enis,
        subnets: vec![crate::pool::SubnetSnapshot {
            id: SUBNET.into(),
            cidr: Some("10.0.0.0/24".parse().unwrap()),
            backoff: None,
            prefixes_blocked_for: None,
            free: None,
        }],
        exhaustion: None,
    }
}

/// An ENI as EC2 shows it attached here at `device`, holding `ips`; ours (owner tag) or not.
fn ec2_eni(eni: &str, device: u32, ips: &[u8], ours: bool) -> Eni {
    let tags = if ours {
        BTreeMap::from([(tags::OWNER.to_owned(), tags::OWNER_VALUE.to_owned())])
    } else {
        BTreeMap::new()
    };
    Eni {
        id: id(eni),
        mac: format!("02:00:00:00:00:{}", &eni[eni.len() - 2..]),
        subnet_id: SUBNET.into(),
        vpc_id: "vpc-1".into(),
        availability_zone: "us-east-1a".into(),
        description: String::new(),
        status: EniStatus::InUse,
        primary_ip: Ipv4Addr::new(10, 0, 1, device as u8),
        secondary_ips: ips.iter().map(|l| ip(*l)).collect(),
        ipv4_prefixes: Vec::new(),
        security_groups: Vec::new(),
        attachment: Some(EniAttachment {
            attachment_id: format!("attach-{device}"),
            instance_id: "i-1".into(),
            device_index: device,
            status: AttachmentStatus::Attached,
            delete_on_termination: true,
        }),
        tags,
        ipv6_addresses: Vec::new(),
        ipv6_prefixes: Vec::new(),
    }
}

fn ec2(enis: Vec<Eni>) -> Option<BTreeMap<EniId, Eni>> {
    Some(enis.into_iter().map(|e| (e.id.clone(), e)).collect())
}

/// The usual node: eth0 (not serving from its secondaries here) and eth1 of ours holding pod `c1`
/// at .11 and an idle .12, EC2 agreeing, `c1`'s netns alive.
fn node() -> Snapshot {
    Snapshot {
        pool: pool(vec![
            EniSnapshot {
                serves_pods: false,
                ..pool_eni(ETH0, Vec::new())
            },
            pool_eni(ETH1, vec![assigned(11, "c1"), idle(12)]),
        ]),
        netns: BTreeMap::from([(netns("c1"), NetnsState::Alive)]),
        host: None,
        ec2: ec2(vec![
            ec2_eni(ETH0, 0, &[], false),
            ec2_eni(ETH1, 1, &[11, 12], true),
        ]),
    }
}

fn claim(last: u8, c: &str) -> HostClaim {
    HostClaim {
        ipv6: None,
        egress_ipv4: None,
        ip: ip(last),
        network: "net".into(),
        attachment: key(c),
        pod: pod(c),
        sticky_key: None,
        netns: netns(c),
        eni_id: String::new(),
    }
}

/// Decides on each snapshot in turn with one memory, as passes in a row do; returns every pass's
/// drifts.
fn looks(snapshots: &[Snapshot]) -> Vec<Vec<Drift>> {
    let mut memory = Memory::default();
    snapshots.iter().map(|s| decide(s, &mut memory)).collect()
}

/// One case: what it shows, the snapshots of passes in a row, and what each pass decides.
type Case = (&'static str, Vec<Snapshot>, Vec<Vec<Drift>>);

/// The pool's eth1 in `s`.
fn eth1(s: &mut Snapshot) -> &mut EniSnapshot {
    &mut s.pool.enis[1]
}

/// EC2 shows `eni` attached here in `s`.
fn attach(s: &mut Snapshot, eni: Eni) {
    s.ec2.as_mut().unwrap().insert(eni.id.clone(), eni);
}

/// EC2 does not show `eni` attached here in `s`.
fn detach(s: &mut Snapshot, eni: &str) {
    s.ec2.as_mut().unwrap().remove(&id(eni));
}

/// eth1 as EC2 shows it in `s`.
fn ec2_eth1(s: &mut Snapshot) -> &mut Eni {
    s.ec2.as_mut().unwrap().get_mut(&id(ETH1)).unwrap()
}

#[test]
fn every_kind_of_drift() {
    let with = |f: &dyn Fn(&mut Snapshot)| {
        let mut s = node();
        f(&mut s);
        s
    };
    let cases: Vec<Case> = vec![
        ("nothing to do", vec![node(), node()], vec![vec![], vec![]]),
        (
            "a pod's netns is gone: released; an unknown netns is not",
            vec![
                with(&|s| {
                    s.netns.insert(netns("c1"), NetnsState::Gone);
                }),
                with(&|s| {
                    s.netns.insert(netns("c1"), NetnsState::Unknown);
                }),
            ],
            vec![
                vec![Drift::NetnsGone {
                    attachment: key("c1"),
                    ip: ip(11),
                    netns: netns("c1"),
                }],
                vec![],
            ],
        ),
        (
            "quarantine: adopted where the cache names a pod, lifted elsewhere, kept while the cache \
             is not visible or not read",
            vec![
                with(&|s| {
                    eth1(s).ips.extend([quarantined(13), quarantined(14)]);
                    ec2_eth1(s).secondary_ips.extend([ip(13), ip(14)]);
                    s.host = Some(HostEvidence {
                        cache_visible: true,
                        claims: vec![claim(13, "c3")],
                    });
                }),
                with(&|s| {
                    eth1(s).ips.push(quarantined(13));
                    ec2_eth1(s).secondary_ips.push(ip(13));
                    s.host = Some(HostEvidence::default());
                }),
                with(&|s| {
                    eth1(s).ips.push(quarantined(13));
                    ec2_eth1(s).secondary_ips.push(ip(13));
                }),
            ],
            vec![
                vec![
                    Drift::AdoptQuarantined {
                        claim: claim(13, "c3"),
                    },
                    Drift::LiftQuarantine { ips: vec![ip(14)] },
                ],
                vec![],
                vec![],
            ],
        ),
        (
            "quarantine after a lost file, EC2's describe perhaps lagging: lifted only once held a \
             minute and shown by EC2; one EC2 does not show is forgotten at its second miss",
            vec![
                with(&|s| {
                    eth1(s).ips.extend([
                        unsettled(13, Duration::from_secs(20)),
                        unsettled(14, Duration::from_secs(20)),
                    ]);
                    ec2_eth1(s).secondary_ips.push(ip(13));
                    s.host = Some(HostEvidence {
                        cache_visible: true,
                        claims: Vec::new(),
                    });
                }),
                with(&|s| {
                    eth1(s).ips.extend([
                        unsettled(13, Duration::from_secs(60)),
                        unsettled(14, Duration::from_secs(60)),
                    ]);
                    ec2_eth1(s).secondary_ips.push(ip(13));
                    s.host = Some(HostEvidence {
                        cache_visible: true,
                        claims: Vec::new(),
                    });
                }),
            ],
            vec![
                vec![Drift::MissingInEc2 {
                    eni: id(ETH1),
                    ips: vec![ip(14)],
                    confirmed: vec![],
                }],
                vec![
                    Drift::LiftQuarantine { ips: vec![ip(13)] },
                    Drift::MissingInEc2 {
                        eni: id(ETH1),
                        ips: vec![ip(14)],
                        confirmed: vec![ip(14)],
                    },
                ],
            ],
        ),
        (
            "an ENI EC2 does not show attached: suspended, then forgotten",
            vec![
                with(&|s| {
                    detach(s, ETH1);
                }),
                with(&|s| {
                    detach(s, ETH1);
                    eth1(s).phase = EniPhaseSnapshot::Suspect {
                        for_: Duration::from_secs(30),
                    };
                }),
            ],
            vec![
                vec![Drift::SuspendEni { eni: id(ETH1) }],
                vec![Drift::ForgetEni { eni: id(ETH1) }],
            ],
        ),
        (
            "a suspected ENI EC2 shows again: resumed, and its misses start over",
            vec![
                with(&|s| {
                    detach(s, ETH1);
                }),
                with(&|s| {
                    eth1(s).phase = EniPhaseSnapshot::Suspect {
                        for_: Duration::from_secs(30),
                    };
                }),
                with(&|s| {
                    detach(s, ETH1);
                }),
            ],
            vec![
                vec![Drift::SuspendEni { eni: id(ETH1) }],
                vec![Drift::ResumeEni { eni: id(ETH1) }],
                vec![Drift::SuspendEni { eni: id(ETH1) }],
            ],
        ),
        (
            "eth0, a draining ENI and an ENI serving no pods are never suspended",
            vec![with(&|s| {
                s.ec2 = ec2(Vec::new());
                s.pool.enis[0].serves_pods = true;
                s.pool.enis.push(EniSnapshot {
                    phase: EniPhaseSnapshot::Draining,
                    ..pool_eni(ETH2, Vec::new())
                });
                eth1(s).serves_pods = false;
            })],
            vec![vec![]],
        ),
        (
            "an IP EC2 no longer shows: reported, forgotten at the second miss; one being given \
             back is not missing",
            vec![
                with(&|s| {
                    ec2_eth1(s).secondary_ips = vec![ip(12)];
                    eth1(s).ips.push(releasing(13));
                }),
                with(&|s| {
                    ec2_eth1(s).secondary_ips = vec![ip(12)];
                }),
            ],
            vec![
                vec![Drift::MissingInEc2 {
                    eni: id(ETH1),
                    ips: vec![ip(11)],
                    confirmed: vec![],
                }],
                vec![Drift::MissingInEc2 {
                    eni: id(ETH1),
                    ips: vec![ip(11)],
                    confirmed: vec![ip(11)],
                }],
            ],
        ),
        (
            "an IP back in EC2 between two misses starts over",
            vec![
                with(&|s| ec2_eth1(s).secondary_ips = vec![ip(12)]),
                node(),
                with(&|s| ec2_eth1(s).secondary_ips = vec![ip(12)]),
            ],
            vec![
                vec![Drift::MissingInEc2 {
                    eni: id(ETH1),
                    ips: vec![ip(11)],
                    confirmed: vec![],
                }],
                vec![],
                vec![Drift::MissingInEc2 {
                    eni: id(ETH1),
                    ips: vec![ip(11)],
                    confirmed: vec![],
                }],
            ],
        ),
        (
            "an IP EC2 shows on our ENI that the pool does not hold: reported, unless IPs are in \
             flight on it or the ENI is not ours",
            vec![
                with(&|s| ec2_eth1(s).secondary_ips.push(ip(15))),
                with(&|s| {
                    ec2_eth1(s).secondary_ips.push(ip(15));
                    eth1(s).in_flight = 1;
                }),
                with(&|s| {
                    ec2_eth1(s).secondary_ips.push(ip(15));
                    ec2_eth1(s).tags.clear();
                }),
            ],
            vec![
                vec![Drift::UnknownToPool {
                    eni: id(ETH1),
                    ips: vec![ip(15)],
                }],
                vec![],
                vec![],
            ],
        ),
        (
            "an ENI attached here that the pool does not know: adopted at the second sighting",
            vec![
                with(&|s| {
                    attach(s, ec2_eni(ETH2, 2, &[21], true));
                }),
                with(&|s| {
                    attach(s, ec2_eni(ETH2, 2, &[21], true));
                }),
            ],
            vec![
                vec![],
                vec![Drift::AdoptEni {
                    eni: Box::new(ec2_eni(ETH2, 2, &[21], true)),
                    subnet: Some(Subnet {
                        id: SUBNET.into(),
                        vpc_id: "vpc-1".into(),
                        cidr: "10.0.0.0/24".parse().unwrap(),
                        availability_zone: "us-east-1a".into(),
                        available_ips: 0,
                        tags: Default::default(),
                        ipv6_cidrs: Vec::new(),
                    }),
                    managed: true,
                }],
            ],
        ),
        (
            "an unknown ENI not ours, in a subnet the pool does not know: recorded, EC2 asked for \
             the subnet",
            vec![
                with(&|s| {
                    attach(s, ec2_eni(ETH2, 2, &[], false));
                    s.pool.subnets.clear();
                }),
                with(&|s| {
                    attach(s, ec2_eni(ETH2, 2, &[], false));
                    s.pool.subnets.clear();
                }),
            ],
            vec![
                vec![],
                vec![Drift::AdoptEni {
                    eni: Box::new(ec2_eni(ETH2, 2, &[], false)),
                    subnet: None,
                    managed: false,
                }],
            ],
        ),
        (
            "never while the pool is creating an ENI: the sightings start over",
            vec![
                with(&|s| {
                    attach(s, ec2_eni(ETH2, 2, &[21], true));
                }),
                with(&|s| {
                    attach(s, ec2_eni(ETH2, 2, &[21], true));
                    s.pool.creating_enis = 1;
                }),
                with(&|s| {
                    attach(s, ec2_eni(ETH2, 2, &[21], true));
                }),
            ],
            vec![vec![], vec![], vec![]],
        ),
        (
            "EC2 not asked: the host's drifts only, and EC2's misses are kept for the next look",
            vec![
                with(&|s| {
                    detach(s, ETH1);
                }),
                with(&|s| {
                    s.ec2 = None;
                    s.netns.insert(netns("c1"), NetnsState::Gone);
                }),
                with(&|s| {
                    detach(s, ETH1);
                }),
            ],
            vec![
                vec![Drift::SuspendEni { eni: id(ETH1) }],
                vec![Drift::NetnsGone {
                    attachment: key("c1"),
                    ip: ip(11),
                    netns: netns("c1"),
                }],
                vec![Drift::ForgetEni { eni: id(ETH1) }],
            ],
        ),
    ];
    for (name, snapshots, want) in cases {
        assert_eq!(looks(&snapshots), want, "{name}");
    }
}

#[test]
fn host_drifts_come_first() {
    let mut s = node();
    s.netns.insert(netns("c1"), NetnsState::Gone);
    detach(&mut s, ETH1);
    s.pool.enis[1].ips.push(quarantined(13));
    s.host = Some(HostEvidence {
        cache_visible: true,
        claims: Vec::new(),
    });
    let drifts = decide(&s, &mut Memory::default());
    let kinds: Vec<bool> = drifts.iter().map(Drift::from_host).collect();
    assert_eq!(kinds, vec![true, true, false], "{drifts:?}");
    assert!(matches!(drifts[0], Drift::NetnsGone { .. }));
}

#[test]
fn managed_means_ours_and_not_eth0() {
    assert!(managed(&ec2_eni(ETH1, 1, &[], true)));
    assert!(!managed(&ec2_eni(ETH1, 1, &[], false)));
    assert!(!managed(&ec2_eni(ETH0, 0, &[], true)));
    let mut opted_out = ec2_eni(ETH1, 1, &[], true);
    opted_out.tags.insert(tags::NO_MANAGE.into(), "true".into());
    assert!(!managed(&opted_out));
}
