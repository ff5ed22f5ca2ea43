//! The decision reporting's own tests: what the chains carry, prefixes read back, packets mapped
//! to pods and policy rules, NFLOG datagrams read, counters mapped.

use std::net::IpAddr;

use super::counters::rule_readings;
use super::nflog::{parse_packets, read_flow, wire};
use super::*;
use crate::compile::{Compiled, Peers, Ports, Rule};
use crate::nft::render_with;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// `x/a` on `eni0a1b2c3d4e5`: ingress isolated by `x/p` (rule 0 from 10.1.0.11, rule 1 from
/// everyone on UDP) and `x/q` (no rules); egress open.
fn pod() -> LocalPod {
    let rule = |policy: &str, index, peers, ports| Rule {
        source: RuleSource {
            policy: policy.into(),
            index,
        },
        peers,
        ports,
    };
    LocalPod {
        name: "x/a".into(),
        veth: "eni0a1b2c3d4e5".into(),
        ips: vec![ip("10.1.0.5")],
        compiled: Compiled {
            ingress: Direction::Isolated {
                policies: vec!["x/p".into(), "x/q".into()],
                rules: vec![
                    rule(
                        "x/p",
                        0,
                        Peers::Listed {
                            pods: [ip("10.1.0.11")].into(),
                            blocks: vec![],
                        },
                        Ports::Any,
                    ),
                    rule(
                        "x/p",
                        1,
                        Peers::Any,
                        Ports::Listed {
                            ranges: vec![],
                            protocols: [crate::Protocol::Udp].into(),
                            per_peer: Default::default(),
                        },
                    ),
                ],
            },
            egress: Direction::Open,
            problems: vec![],
        },
    }
}

#[test]
fn chains_carry_rule_counters_and_a_limited_log_before_their_drop() {
    let r = render_with(&[pod()], &Reporting::new(Logged::Denied, 100, 5)).unwrap();
    let chain = &r.chains["in_eni0a1b2c3d4e5"];
    assert_eq!(
        chain.rules,
        [
            "ip saddr @in_x_p_f59c007f256f334f_r0_pods counter name \"in_eni0a1b2c3d4e5_allowed\" counter name \"in_eni0a1b2c3d4e5_r0\" return comment \"x/p ingress[0]\"",
            "ip6 saddr @in_x_p_f59c007f256f334f_r0_pods6 counter name \"in_eni0a1b2c3d4e5_allowed\" counter name \"in_eni0a1b2c3d4e5_r0\" return comment \"x/p ingress[0]\"",
            "meta l4proto { udp } counter name \"in_eni0a1b2c3d4e5_allowed\" counter name \"in_eni0a1b2c3d4e5_r1\" return comment \"x/p ingress[1]\"",
            "limit rate 5/second burst 10 packets log prefix \"eniipam deny eni0a1b2c3d4e5 in\" group 100",
            "counter name \"in_eni0a1b2c3d4e5_denied\" drop comment \"x/a ingress: no rule of x/p, x/q allows it\"",
        ]
    );
    assert_eq!(
        r.counters["in_eni0a1b2c3d4e5_r1"],
        "eni0a1b2c3d4e5 ingress r1 x/p ingress[1]"
    );
    assert!(chain.uses.contains("in_eni0a1b2c3d4e5_r0"));
    // Allowed ones logged too: on the allowing lines, without a kernel limit.
    let r = render_with(&[pod()], &Reporting::new(Logged::All, 7, 5)).unwrap();
    assert!(
        r.chains["in_eni0a1b2c3d4e5"].rules[0].contains(
            "counter name \"in_eni0a1b2c3d4e5_r0\" log prefix \"eniipam allow eni0a1b2c3d4e5 in r0\" group 7 return"
        ),
        "{:?}",
        r.chains
    );
    // Off: counters still, no log statement.
    let r = render_with(&[pod()], &Reporting::new(Logged::Off, 7, 5)).unwrap();
    assert!(!r.script().contains(" log "), "{}", r.script());
    assert!(r.counters.contains_key("in_eni0a1b2c3d4e5_r0"));
}

#[test]
fn prefixes_read_back_and_others_are_refused() {
    let tap = Reporting::new(Logged::All, 100, 5);
    let prefix = |line: &str| {
        let at = line.find("prefix \"").unwrap() + 8;
        line[at..at + line[at..].find('"').unwrap()].to_owned()
    };
    let deny = prefix(&tap.deny_line("eni1", PolicyType::Egress).unwrap());
    assert_eq!(
        Tag::parse(&deny),
        Some(Tag {
            allowed: false,
            veth: "eni1".into(),
            direction: PolicyType::Egress,
            rule: None
        })
    );
    let allow = prefix(&tap.allow_statements("in_eni1", "eni1", PolicyType::Ingress, 3));
    assert_eq!(Tag::parse(&allow).unwrap().rule, Some(3));
    for other in [
        "",
        "calico-deny",
        "eniipam drop eni1 in",
        "eniipam deny eni1 sideways",
        "eniipam deny eni1 in r0",
        "eniipam allow eni1 in",
        "eniipam allow eni1 in rx",
        "eniipam allow eni1 in r0 extra",
    ] {
        assert_eq!(Tag::parse(other), None, "{other:?}");
    }
}

#[test]
fn a_logged_packet_maps_to_its_pod_peer_port_and_rule() {
    let map = DecisionMap::new(&[pod()]);
    let flow = read_flow(&wire::ipv4([10, 1, 0, 99], [10, 1, 0, 10], 6, 40000, 80)).unwrap();
    let denied = map
        .decide(
            &Tag::parse("eniipam deny eni0a1b2c3d4e5 in").unwrap(),
            &flow,
        )
        .unwrap();
    assert_eq!(
        denied,
        Decision {
            verdict: "deny",
            pod: "x/a".into(),
            veth: "eni0a1b2c3d4e5".into(),
            direction: "ingress",
            peer: ip("10.1.0.99"),
            src: ip("10.1.0.99"),
            dst: ip("10.1.0.10"),
            protocol: "tcp".into(),
            port: Some(80),
            src_port: Some(40000),
            rule: None,
            policies: vec!["x/p".into(), "x/q".into()],
        }
    );
    let allowed = map
        .decide(
            &Tag::parse("eniipam allow eni0a1b2c3d4e5 in r1").unwrap(),
            &flow,
        )
        .unwrap();
    assert_eq!(allowed.rule.as_deref(), Some("x/p ingress[1]"));
    assert!(allowed.policies.is_empty());
    // A chain the map does not know (a pod gone since, an open direction, a rule past the end).
    for tag in [
        "eniipam deny eni99 in",
        "eniipam deny eni0a1b2c3d4e5 eg",
        "eniipam allow eni0a1b2c3d4e5 in r2",
    ] {
        assert_eq!(map.decide(&Tag::parse(tag).unwrap(), &flow), None, "{tag}");
    }
}

#[test]
fn nflog_datagrams_yield_their_prefixes_and_flows() {
    let mut data = wire::packet(
        "eniipam deny eni1 in",
        &wire::ipv4([10, 0, 0, 1], [10, 0, 0, 2], 17, 5353, 81),
    );
    data.extend(wire::packet("other", &[0x45]));
    let got = parse_packets(&data);
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].prefix, "eniipam deny eni1 in");
    let flow = got[0].flow.unwrap();
    assert_eq!((flow.protocol, flow.ports), (17, Some((5353, 81))));
    assert_eq!(got[1].flow, None, "a header cut short is no flow");
    // A truncated datagram ends the walk without a panic.
    assert_eq!(parse_packets(&data[..10]), vec![]);
    // IPv6: ports after the fixed header.
    let mut v6 = vec![0x60, 0, 0, 0, 0, 8, 6, 64];
    v6.extend("fd00::1".parse::<std::net::Ipv6Addr>().unwrap().octets());
    v6.extend("fd00::2".parse::<std::net::Ipv6Addr>().unwrap().octets());
    v6.extend([0x1f, 0x90, 0, 80]);
    let flow = read_flow(&v6).unwrap();
    assert_eq!((flow.dst, flow.ports), (ip("fd00::2"), Some((8080, 80))));
}

#[test]
fn per_rule_counters_map_to_policy_rules_and_denials_to_every_isolating_policy() {
    let r = render_with(&[pod()], &Reporting::new(Logged::Denied, 100, 5)).unwrap();
    let counter = |name: &str, packets: u64| {
        serde_json::json!({"counter": {"family": "inet", "table": "eniipam_policy",
            "name": name, "comment": r.counters[name], "packets": packets, "bytes": 0}})
    };
    let json = serde_json::json!({"nftables": [
        counter("in_eni0a1b2c3d4e5_allowed", 9),
        counter("in_eni0a1b2c3d4e5_r0", 4),
        counter("in_eni0a1b2c3d4e5_r1", 5),
        counter("in_eni0a1b2c3d4e5_denied", 2),
    ]})
    .to_string();
    let got = rule_readings(&json, &DecisionMap::new(&[pod()])).unwrap();
    let shown: Vec<(String, Option<usize>, bool, u64)> = got
        .iter()
        .map(|g| (g.policy.clone(), g.rule, g.allowed, g.packets))
        .collect();
    assert_eq!(
        shown,
        [
            ("p".into(), Some(0), true, 4),
            ("p".into(), Some(1), true, 5),
            ("p".into(), None, false, 2),
            ("q".into(), None, false, 2),
        ]
    );
    assert!(got.iter().all(|g| g.namespace == "x"));
    // A pod the map no longer knows: nothing.
    assert!(
        rule_readings(&json, &DecisionMap::default())
            .unwrap()
            .is_empty()
    );
}
