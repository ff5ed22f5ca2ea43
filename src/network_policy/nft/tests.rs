//! The renderer's own tests: address arithmetic, names refused, a whole script, IPv6 named.

use super::text::{merge, range, subtract};
use super::*;
use std::net::Ipv4Addr;

#[test]
fn an_except_is_cut_out_of_its_cidr_and_overlaps_merge() {
    let ip = |s: &str| u32::from(s.parse::<Ipv4Addr>().unwrap());
    let left = subtract(
        (ip("10.1.1.0"), ip("10.1.1.255")),
        [(ip("10.1.1.11"), ip("10.1.1.11"))].into_iter(),
    );
    let shown: Vec<String> = merge(left).into_iter().map(range).collect();
    assert_eq!(shown, ["10.1.1.0-10.1.1.10", "10.1.1.12-10.1.1.255"]);
    // A pod inside the block, and the excepted address allowed by another peer.
    let joined = merge(vec![
        (ip("10.1.1.0"), ip("10.1.1.10")),
        (ip("10.1.1.5"), ip("10.1.1.5")),
        (ip("10.1.1.11"), ip("10.1.1.11")),
        (ip("10.1.1.12"), ip("10.1.1.255")),
    ]);
    assert_eq!(joined, [(ip("10.1.1.0"), ip("10.1.1.255"))]);
}

#[test]
fn bad_and_shared_veths_are_named() {
    let open = Compiled {
        ingress: Direction::Open,
        egress: Direction::Open,
        problems: vec![],
    };
    let pod = |name: &str, veth: &str| LocalPod {
        name: name.into(),
        veth: veth.into(),
        compiled: open.clone(),
    };
    assert_eq!(
        render(&[pod("x/a", "eni\"; flush ruleset")]),
        Err(RenderError::BadVeth {
            pod: "x/a".into(),
            veth: "eni\"; flush ruleset".into()
        })
    );
    let err = render(&[pod("x/a", "eni1.a"), pod("x/b", "eni1_a")]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "pods x/a and x/b both name host veth \"eni1_a\""
    );
    // Open pods: the base chain alone, replies accepted.
    let r = render(&[pod("x/a", "eni1")]).unwrap();
    assert!(r.script.contains("ct state established,related accept"));
    assert!(!r.script.contains("jump"), "{}", r.script);
}

#[test]
fn a_pod_renders_to_named_sets_and_commented_chains() {
    use crate::network_policy::compile::{IpBlock, PortRange, RuleSource};
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    let source = |policy: &str, index| RuleSource {
        policy: policy.into(),
        index,
    };
    let pod = LocalPod {
        name: "x/a".into(),
        veth: "eni0a1b2c3d4e5".into(),
        compiled: Compiled {
            ingress: Direction::Isolated {
                policies: vec!["x/p".into()],
                rules: vec![Rule {
                    source: source("x/p", 0),
                    peers: Peers::Listed {
                        pods: [ip("10.1.0.11"), ip("10.1.1.11")].into(),
                        blocks: vec![IpBlock {
                            cidr: "10.1.1.0/24".parse().unwrap(),
                            except: vec!["10.1.1.8/29".parse().unwrap()],
                        }],
                    },
                    ports: Ports::Listed {
                        ranges: vec![
                            PortRange {
                                protocol: Protocol::Tcp,
                                first: 80,
                                last: 81,
                            },
                            PortRange {
                                protocol: Protocol::Tcp,
                                first: 81,
                                last: 90,
                            },
                        ],
                        protocols: [Protocol::Udp].into(),
                        per_peer: BTreeSet::new(),
                    },
                }],
            },
            egress: Direction::Isolated {
                policies: vec!["x/q".into(), "x/r".into()],
                rules: vec![
                    Rule {
                        source: source("x/q", 0),
                        peers: Peers::Any,
                        ports: Ports::Listed {
                            ranges: vec![],
                            protocols: BTreeSet::new(),
                            per_peer: [(ip("10.1.2.10"), Protocol::Udp, 53)].into(),
                        },
                    },
                    Rule {
                        source: source("x/r", 2),
                        peers: Peers::Any,
                        ports: Ports::Any,
                    },
                ],
            },
            problems: vec![],
        },
    };
    let r = render(&[pod]).unwrap();
    assert!(r.not_enforced.is_empty());
    let want = r#"table inet eniipam_policy {}
delete table inet eniipam_policy
table inet eniipam_policy {
  set eg_eni0a1b2c3d4e5_r0_named {
    type ipv4_addr . inet_proto . inet_service;
    elements = { 10.1.2.10 . udp . 53 }
  }
  set in_eni0a1b2c3d4e5_r0_peers {
    type ipv4_addr;
    flags interval;
    elements = { 10.1.0.11, 10.1.1.0-10.1.1.7, 10.1.1.11, 10.1.1.16-10.1.1.255 }
  }
  set in_eni0a1b2c3d4e5_r0_ports {
    type inet_proto . inet_service;
    flags interval;
    elements = { tcp . 80-90 }
  }
  chain forward {
    type filter hook forward priority filter; policy accept;
    ct state established,related accept comment "replies of allowed connections"
    iifname "eni0a1b2c3d4e5" jump eg_eni0a1b2c3d4e5 comment "x/a egress"
    oifname "eni0a1b2c3d4e5" jump in_eni0a1b2c3d4e5 comment "x/a ingress"
  }
  chain eg_eni0a1b2c3d4e5 {
    comment "x/a egress (eni0a1b2c3d4e5), isolated by x/q, x/r"
    ip daddr . meta l4proto . th dport @eg_eni0a1b2c3d4e5_r0_named return comment "x/q egress[0]"
    return comment "x/r egress[2]"
    drop comment "x/a egress: no rule allows it"
  }
  chain in_eni0a1b2c3d4e5 {
    comment "x/a ingress (eni0a1b2c3d4e5), isolated by x/p"
    ip saddr @in_eni0a1b2c3d4e5_r0_peers meta l4proto { udp } return comment "x/p ingress[0]"
    ip saddr @in_eni0a1b2c3d4e5_r0_peers meta l4proto . th dport @in_eni0a1b2c3d4e5_r0_ports return comment "x/p ingress[0]"
    drop comment "x/a ingress: no rule allows it"
  }
}
"#;
    assert_eq!(r.script, want, "{}", r.script);
}

#[test]
fn ipv6_peers_are_named_as_not_enforced() {
    use crate::network_policy::compile::{IpBlock, RuleSource};
    let pod = LocalPod {
        name: "x/a".into(),
        veth: "eni1".into(),
        compiled: Compiled {
            ingress: Direction::Isolated {
                policies: vec!["x/p".into()],
                rules: vec![Rule {
                    source: RuleSource {
                        policy: "x/p".into(),
                        index: 1,
                    },
                    peers: Peers::Listed {
                        pods: BTreeSet::new(),
                        blocks: vec![IpBlock {
                            cidr: "2001:db8::/32".parse().unwrap(),
                            except: vec![],
                        }],
                    },
                    ports: Ports::Any,
                }],
            },
            egress: Direction::Open,
            problems: vec![],
        },
    };
    let r = render(&[pod]).unwrap();
    assert_eq!(
        r.not_enforced,
        ["pod x/a: x/p ingress[1]: 1 IPv6 peer address(es) or block(s) (IPv4 only)"]
    );
    // The set is declared empty: the rule matches no IPv4 peer, as the policy says.
    assert!(
        r.script
            .contains("set in_eni1_r0_peers {\n    type ipv4_addr;\n    flags interval;\n  }"),
        "{}",
        r.script
    );
}
