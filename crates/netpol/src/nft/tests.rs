//! The renderer's own tests: address arithmetic, names refused, a whole script, IPv6 named.

use super::text::{merge, range, subtract};
use super::*;
use crate::compile::{Peers, Ports, Protocol, Rule, RuleSource};
use std::net::{IpAddr, Ipv4Addr};

/// The name prefix of the peer sets of `policy`'s rule `index` in `dir`.
fn sets_of(policy: &str, dir: PolicyType, index: usize) -> String {
    super::chain::rule_sets(
        dir,
        &RuleSource {
            policy: policy.into(),
            index,
        },
    )
}

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
        ips: Vec::new(),
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
    assert!(r.script().contains("ct state established,related accept"));
    assert!(!r.script().contains("jump"), "{}", r.script());
}

#[test]
fn a_pod_renders_to_named_sets_and_commented_chains() {
    use crate::compile::{IpBlock, PortRange, RuleSource};
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    let source = |policy: &str, index| RuleSource {
        policy: policy.into(),
        index,
    };
    let pod = LocalPod {
        name: "x/a".into(),
        veth: "eni0a1b2c3d4e5".into(),
        ips: vec!["10.1.0.5".parse().unwrap()],
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
    let want = r#"table inet eniipam_policy {}
delete table inet eniipam_policy
table inet eniipam_policy {
  set eg_x_q_074429ef23b3da72_r0_named {
    type ipv4_addr . inet_proto . inet_service;
    elements = { 10.1.2.10 . udp . 53 }
  }
  set hairpin {
    type ifname . ifname;
    elements = { "eni0a1b2c3d4e5" . "eni0a1b2c3d4e5" }
  }
  set in_eni0a1b2c3d4e5_r0_ports {
    type inet_proto . inet_service;
    flags interval;
    elements = { tcp . 80-90 }
  }
  set in_x_p_f59c007f256f334f_r0_blocks {
    type ipv4_addr;
    flags interval;
    elements = { 10.1.1.0-10.1.1.7, 10.1.1.16-10.1.1.255 }
  }
  set in_x_p_f59c007f256f334f_r0_pods {
    type ipv4_addr;
    elements = { 10.1.0.11, 10.1.1.11 }
  }
  set pod_sources {
    type ifname . ipv4_addr;
    elements = { "eni0a1b2c3d4e5" . 10.1.0.5 }
  }
  set pod_sources6 {
    type ifname . ipv6_addr;
  }
  set pod_veths {
    type ifname;
    elements = { "eni0a1b2c3d4e5" }
  }
  set pod_veths6 {
    type ifname;
  }
  counter eg_eni0a1b2c3d4e5_allowed {
    comment "eni0a1b2c3d4e5 x/a egress"
  }
  counter eg_eni0a1b2c3d4e5_denied {
    comment "eni0a1b2c3d4e5 x/a egress"
  }
  counter in_eni0a1b2c3d4e5_allowed {
    comment "eni0a1b2c3d4e5 x/a ingress"
  }
  counter in_eni0a1b2c3d4e5_denied {
    comment "eni0a1b2c3d4e5 x/a ingress"
  }
  counter spoofed {
    comment "packets from a pod's veth with a source not its own, dropped"
  }
  map egress_by_addr {
    type ipv4_addr : verdict;
  }
  map egress_by_addr6 {
    type ipv6_addr : verdict;
  }
  map egress_dispatch {
    type ifname : verdict;
  }
  map ingress_dispatch {
    type ifname : verdict;
  }
  chain prerouting {
    type filter hook prerouting priority -300; policy accept;
    iifname . ip saddr @pod_sources accept comment "a pod's own IPv4 address"
    iifname . ip6 saddr @pod_sources6 accept comment "a pod's own IPv6 address"
    iifname != @pod_veths accept comment "not a local pod's veth"
    ip6 saddr fe80::/10 accept comment "IPv6 link-local: neighbour discovery"
    ip6 saddr :: accept comment "duplicate address detection"
    meta nfproto ipv6 iifname != @pod_veths6 accept comment "IPv6 of the pod not known to the node: not checked"
    counter name "spoofed" drop comment "a source address that is not the pod's own"
  }
  chain forward {
    type filter hook forward priority 0; policy accept;
    ct state established,related accept comment "replies of allowed connections"
    iifname . oifname @hairpin accept comment "a pod reaching itself: a pod cannot block access to itself"
    iifname vmap @egress_dispatch comment "the sending pod's egress"
    oifname vmap @ingress_dispatch comment "the receiving pod's ingress"
  }
  chain output {
    type filter hook output priority 0; policy accept;
    ct state established,related accept comment "replies of allowed connections"
    icmpv6 type { nd-router-solicit, nd-router-advert, nd-neighbor-solicit, nd-neighbor-advert, mld-listener-query, mld-listener-report, mld-listener-done, mld2-listener-report } accept comment "the node's neighbour discovery and multicast listener reports"
    fib saddr type local accept comment "the node's own traffic"
    oifname . ip saddr @pod_sources accept comment "a pod reaching itself: a pod cannot block access to itself"
    oifname . ip6 saddr @pod_sources6 accept comment "a pod reaching itself: a pod cannot block access to itself"
    ip saddr vmap @egress_by_addr comment "the sending pod's egress, by its address"
    ip6 saddr vmap @egress_by_addr6 comment "the sending pod's egress, by its address"
    oifname vmap @ingress_dispatch comment "the receiving pod's ingress"
  }
  chain eg_eni0a1b2c3d4e5 {
    comment "x/a egress (eni0a1b2c3d4e5)"
    ip daddr . meta l4proto . th dport @eg_x_q_074429ef23b3da72_r0_named counter name "eg_eni0a1b2c3d4e5_allowed" return comment "x/q egress[0]"
    counter name "eg_eni0a1b2c3d4e5_allowed" return comment "x/r egress[2]"
    counter name "eg_eni0a1b2c3d4e5_denied" drop comment "x/a egress: no rule of x/q, x/r allows it"
  }
  chain in_eni0a1b2c3d4e5 {
    comment "x/a ingress (eni0a1b2c3d4e5)"
    ip saddr @in_x_p_f59c007f256f334f_r0_pods meta l4proto { udp } counter name "in_eni0a1b2c3d4e5_allowed" return comment "x/p ingress[0]"
    ip saddr @in_x_p_f59c007f256f334f_r0_pods meta l4proto . th dport @in_eni0a1b2c3d4e5_r0_ports counter name "in_eni0a1b2c3d4e5_allowed" return comment "x/p ingress[0]"
    ip saddr @in_x_p_f59c007f256f334f_r0_blocks meta l4proto { udp } counter name "in_eni0a1b2c3d4e5_allowed" return comment "x/p ingress[0]"
    ip saddr @in_x_p_f59c007f256f334f_r0_blocks meta l4proto . th dport @in_eni0a1b2c3d4e5_r0_ports counter name "in_eni0a1b2c3d4e5_allowed" return comment "x/p ingress[0]"
    counter name "in_eni0a1b2c3d4e5_denied" drop comment "x/a ingress: no rule of x/p allows it"
  }
}
add element inet eniipam_policy egress_by_addr { 10.1.0.5 : jump eg_eni0a1b2c3d4e5 }
add element inet eniipam_policy egress_dispatch { "eni0a1b2c3d4e5" : jump eg_eni0a1b2c3d4e5 }
add element inet eniipam_policy ingress_dispatch { "eni0a1b2c3d4e5" : jump in_eni0a1b2c3d4e5 }
"#;
    assert_eq!(r.script(), want, "{}", r.script());
}

/// Issue 47, case 4: a pod reaching itself through its Service (in and out of its own veth, its
/// address both ways after the DNAT) is accepted before any of its chains: a pod cannot block
/// access to itself. Only its own veth both ways: another pod sending from its address still meets
/// its ingress chain. Before the fix the base chain held the jumps alone.
#[test]
fn a_pod_reaching_itself_is_accepted_before_its_chains() {
    let closed = || Direction::Isolated {
        policies: vec!["x/closed".into()],
        rules: Vec::new(),
    };
    let pod = |name: &str, veth: &str, compiled: Compiled| LocalPod {
        name: name.into(),
        veth: veth.into(),
        ips: vec![format!("10.1.0.{}", &veth[3..]).parse().unwrap()],
        compiled,
    };
    let open = Compiled {
        ingress: Direction::Open,
        egress: Direction::Open,
        problems: vec![],
    };
    let only_ingress = Compiled {
        ingress: closed(),
        ..open.clone()
    };
    let both = Compiled {
        ingress: closed(),
        egress: closed(),
        problems: vec![],
    };
    let r = render(&[
        pod("x/a", "eni1", both),
        pod("x/b", "eni2", open),
        pod("x/c", "eni3", only_ingress),
    ])
    .unwrap();
    // Every local pod may reach itself (its veth both ways), isolated or not.
    assert_eq!(
        r.sets["hairpin"].elements,
        [
            "\"eni1\" . \"eni1\"",
            "\"eni2\" . \"eni2\"",
            "\"eni3\" . \"eni3\""
        ]
    );
    let forward = super::base::base_rules("forward");
    let hairpin = forward
        .iter()
        .position(|r| r.starts_with("iifname . oifname @hairpin accept"))
        .expect("the hairpin accept");
    let first_jump = forward
        .iter()
        .position(|r| r.contains("vmap"))
        .expect("the dispatch");
    assert!(hairpin < first_jump, "{forward:?}");
    // Issue 47, "Scale": the pods' chains are reached through verdict maps, not a list of jumps.
    assert_eq!(
        r.maps["egress_dispatch"].elements,
        ["\"eni1\" : jump eg_eni1"]
    );
    assert_eq!(
        r.maps["ingress_dispatch"].elements,
        ["\"eni1\" : jump in_eni1", "\"eni3\" : jump in_eni3"]
    );
    assert_eq!(
        r.maps["egress_by_addr"].elements,
        ["10.1.0.1 : jump eg_eni1"]
    );
}

#[test]
fn ipv6_peers_blocks_and_named_ports_have_sets_of_their_own() {
    use crate::compile::{IpBlock, RuleSource};
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    let source = |index| RuleSource {
        policy: "x/p".into(),
        index,
    };
    let pod = LocalPod {
        name: "x/a".into(),
        veth: "eni1".into(),
        ips: vec!["10.1.0.5".parse().unwrap()],
        compiled: Compiled {
            ingress: Direction::Isolated {
                policies: vec!["x/p".into()],
                rules: vec![Rule {
                    source: source(1),
                    // A dual-stack peer, an IPv6-only one, and an IPv6 block less an except.
                    peers: Peers::Listed {
                        pods: [ip("10.1.0.11"), ip("2001:db8:1::11"), ip("2001:db8:1::12")].into(),
                        blocks: vec![IpBlock {
                            cidr: "2001:db8:2::/64".parse().unwrap(),
                            except: vec![
                                "2001:db8:2::/65".parse().unwrap(),
                                "10.0.0.0/8".parse().unwrap(),
                            ],
                        }],
                    },
                    ports: Ports::Any,
                }],
            },
            egress: Direction::Isolated {
                policies: vec!["x/p".into()],
                rules: vec![Rule {
                    source: source(0),
                    peers: Peers::Any,
                    ports: Ports::Listed {
                        ranges: vec![],
                        protocols: BTreeSet::new(),
                        per_peer: [
                            (ip("10.1.2.10"), Protocol::Udp, 53),
                            (ip("2001:db8:1::10"), Protocol::Udp, 53),
                        ]
                        .into(),
                    },
                }],
            },
            problems: vec![],
        },
    };
    let r = render(&[pod]).unwrap();
    let (i, e) = (
        sets_of("x/p", PolicyType::Ingress, 1),
        sets_of("x/p", PolicyType::Egress, 0),
    );
    let set = |name: &str| r.sets.get(name).unwrap_or_else(|| panic!("{name}: {r:#?}"));
    assert_eq!(set(&format!("{i}_pods")).elements, ["10.1.0.11"]);
    assert_eq!(set(&format!("{i}_pods6")).kind, "ipv6_addr");
    assert_eq!(
        set(&format!("{i}_pods6")).elements,
        ["2001:db8:1::11", "2001:db8:1::12"]
    );
    // The block's upper half: the except of its own family cut out, the IPv4 one cutting nothing.
    let blocks6 = set(&format!("{i}_blocks6"));
    assert!(blocks6.interval);
    assert_eq!(
        blocks6.elements,
        ["2001:db8:2:0:8000::-2001:db8:2:0:ffff:ffff:ffff:ffff"]
    );
    // No IPv4 block, no IPv4 blocks' set.
    assert!(!r.sets.contains_key(&format!("{i}_blocks")));
    assert_eq!(
        set(&format!("{e}_named")).elements,
        ["10.1.2.10 . udp . 53"]
    );
    assert_eq!(
        set(&format!("{e}_named6")).kind,
        "ipv6_addr . inet_proto . inet_service"
    );
    assert_eq!(
        set(&format!("{e}_named6")).elements,
        ["2001:db8:1::10 . udp . 53"]
    );
    // Each family's set is matched on its own family's address.
    let ingress = &r.chains["in_eni1"].rules;
    assert!(
        ingress[0].starts_with(&format!("ip saddr @{i}_pods counter")),
        "{ingress:?}"
    );
    assert!(
        ingress[1].starts_with(&format!("ip6 saddr @{i}_pods6 counter")),
        "{ingress:?}"
    );
    assert!(
        ingress[2].starts_with(&format!("ip6 saddr @{i}_blocks6 counter")),
        "{ingress:?}"
    );
    let egress = &r.chains["eg_eni1"].rules;
    assert!(
        egress[1].starts_with(&format!("ip6 daddr . meta l4proto . th dport @{e}_named6 ")),
        "{egress:?}"
    );
    // An IPv4-only peer list still declares the (empty) IPv6 set, so an IPv6 peer that comes is
    // an element added, not a chain refilled.
    let p = sets_of("x/p", PolicyType::Ingress, 0);
    let v4 = render(&[from_peers(&["10.1.0.11"])]).unwrap();
    assert_eq!(
        v4.sets[&format!("{p}_pods6")].elements,
        Vec::<String>::new()
    );
    let both = render(&[from_peers(&["10.1.0.11", "2001:db8:1::11"])]).unwrap();
    assert_eq!(
        both.update_script(&v4),
        format!("add element inet eniipam_policy {p}_pods6 {{ 2001:db8:1::11 }}\n")
    );
}

/// Pod x/a on veth `eni1`, its ingress open to `peers` on TCP 80.
fn from_peers(peers: &[&str]) -> LocalPod {
    use crate::compile::{PortRange, RuleSource};
    LocalPod {
        name: "x/a".into(),
        veth: "eni1".into(),
        ips: vec!["10.1.0.5".parse().unwrap()],
        compiled: Compiled {
            ingress: Direction::Isolated {
                policies: vec!["x/p".into()],
                rules: vec![Rule {
                    source: RuleSource {
                        policy: "x/p".into(),
                        index: 0,
                    },
                    peers: Peers::Listed {
                        pods: peers.iter().map(|p| p.parse().unwrap()).collect(),
                        blocks: vec![],
                    },
                    ports: Ports::Listed {
                        ranges: vec![PortRange {
                            protocol: Protocol::Tcp,
                            first: 80,
                            last: 80,
                        }],
                        protocols: BTreeSet::new(),
                        per_peer: BTreeSet::new(),
                    },
                }],
            },
            egress: Direction::Open,
            problems: vec![],
        },
    }
}

#[test]
fn a_peer_change_updates_set_elements_in_place() {
    let a = render(&[from_peers(&["10.1.0.11", "10.1.0.12", "10.1.0.30"])]).unwrap();
    let b = render(&[from_peers(&[
        "10.1.0.12",
        "10.1.0.13",
        "10.1.0.30",
        "10.1.0.40",
    ])])
    .unwrap();
    // The pods' addresses are the elements: a pod gone is deleted, a new one added.
    let p = sets_of("x/p", PolicyType::Ingress, 0);
    assert_eq!(
        b.update_script(&a),
        format!(
            "delete element inet eniipam_policy {p}_pods {{ 10.1.0.11 }}\n\
             add element inet eniipam_policy {p}_pods {{ 10.1.0.13, 10.1.0.40 }}\n"
        )
    );
    assert_eq!(
        b.changes_from(&a),
        Changes {
            sets: 1,
            elements_added: 2,
            elements_deleted: 1,
            chains: 0,
            maps: 0
        }
    );
    assert_eq!(b.update_script(&b), "");
    // The base chains' rules (anti-spoofing 7, forward 4, output 8) and x/a's chain's three (the
    // IPv4 peers', the IPv6 peers', the drop); the peers and ports (5), x/a's veth, address and
    // hairpin in the base sets, its ingress jump.
    assert_eq!((b.rule_count(), b.element_count()), (22, 9));
}

#[test]
fn an_update_flushes_before_it_deletes_and_declares_before_it_refers() {
    let a = render(&[from_peers(&["10.1.0.11"])]).unwrap();
    let p = sets_of("x/p", PolicyType::Ingress, 0);
    let none = render(&[]).unwrap();
    let gone = none.update_script(&a);
    let at = |script: &str, what: &str| {
        script
            .find(what)
            .unwrap_or_else(|| panic!("no {what:?} in:\n{script}"))
    };
    // Everything removed: the map element that jumps to the chain goes first, then the chain,
    // then what it used; the base chains are never touched.
    assert!(
        at(
            &gone,
            "delete element inet eniipam_policy ingress_dispatch { \"eni1\" }"
        ) < at(&gone, "flush chain inet eniipam_policy in_eni1")
    );
    assert!(
        !gone.contains("forward") && !gone.contains("output"),
        "{gone}"
    );
    assert!(
        at(&gone, "flush chain inet eniipam_policy in_eni1")
            < at(&gone, "delete chain inet eniipam_policy in_eni1")
    );
    assert!(
        at(&gone, "delete chain inet eniipam_policy in_eni1")
            < at(&gone, &format!("delete set inet eniipam_policy {p}_pods"))
    );
    assert!(
        at(&gone, "delete chain") < at(&gone, "delete counter inet eniipam_policy in_eni1_denied")
    );
    // And back: sets and counters before the chain that uses them, the chain before its jump.
    let back = a.update_script(&none);
    assert!(
        at(&back, &format!("add set inet eniipam_policy {p}_pods"))
            < at(&back, "add rule inet eniipam_policy in_eni1 ")
    );
    assert!(
        at(&back, "add counter inet eniipam_policy in_eni1_allowed")
            < at(&back, "add rule inet eniipam_policy in_eni1 ")
    );
    assert!(
        at(&back, "add rule inet eniipam_policy in_eni1 ")
            < at(
                &back,
                "add element inet eniipam_policy ingress_dispatch { \"eni1\" : jump in_eni1 }"
            )
    );
    // A set whose type changed is deleted and declared anew, its chain flushed first and refilled.
    let mut retyped = a.clone();
    retyped.sets.get_mut(&format!("{p}_pods")).unwrap().interval = true;
    let u = a.update_script(&retyped);
    assert!(
        at(&u, "flush chain inet eniipam_policy in_eni1")
            < at(&u, &format!("delete set inet eniipam_policy {p}_pods"))
    );
    assert!(at(&u, "delete set") < at(&u, &format!("add set inet eniipam_policy {p}_pods")));
    assert!(at(&u, "add set") < at(&u, "add rule inet eniipam_policy in_eni1 "));
    assert!(!u.contains("forward"), "{u}");
}

#[test]
fn counters_are_read_back_by_veth_direction_and_verdict() {
    let json = r#"{"nftables": [{"metainfo": {"version": "1.0.6", "json_schema_version": 1}},
        {"counter": {"family": "inet", "name": "in_eni1_allowed", "table": "eniipam_policy", "handle": 3, "comment": "eni1 x/a ingress", "packets": 2, "bytes": 120}},
        {"counter": {"family": "inet", "name": "eg_eni1_denied", "table": "eniipam_policy", "handle": 4, "comment": "eni1 x/a egress", "packets": 1, "bytes": 60}},
        {"counter": {"family": "ip", "name": "other_denied", "table": "eniipam", "handle": 5, "packets": 9, "bytes": 9}}]}"#;
    let got = parse_counters(json).unwrap();
    assert_eq!(
        got,
        [
            CounterReading {
                chain: "in_eni1".into(),
                veth: "eni1".into(),
                pod: "x/a".into(),
                direction: PolicyType::Ingress,
                verdict: CounterVerdict::Allowed,
                packets: 2,
                bytes: 120
            },
            CounterReading {
                chain: "eg_eni1".into(),
                veth: "eni1".into(),
                pod: "x/a".into(),
                direction: PolicyType::Egress,
                verdict: CounterVerdict::Denied,
                packets: 1,
                bytes: 60
            }
        ]
    );
    assert!(parse_counters("[").unwrap_err().contains("not JSON"));
    assert!(parse_counters("{}").is_err());
}

/// The scale half of issue 47: a policy rule's peer sets are the rule's, not each pod's. Two pods
/// selected by one policy share its sets (one set, its elements once); each keeps its own chain,
/// counters and (pod-dependent) ports' set. A peer that comes is one element added for both.
#[test]
fn two_pods_selected_by_one_policy_share_its_peer_sets() {
    let on = |name: &str, veth: &str, peers: &[&str]| LocalPod {
        name: name.into(),
        veth: veth.into(),
        ..from_peers(peers)
    };
    let a = render(&[
        on("x/a", "eni1", &["10.1.0.11", "2001:db8::11"]),
        on("x/b", "eni2", &["10.1.0.11", "2001:db8::11"]),
    ])
    .unwrap();
    let p = sets_of("x/p", PolicyType::Ingress, 0);
    // The policy rules' sets (the base chains' own sets, `pod_sources` and the like, aside).
    let peer_sets: Vec<&String> = a
        .sets
        .keys()
        .filter(|n| (n.starts_with("in_") || n.starts_with("eg_")) && !n.ends_with("_ports"))
        .collect();
    assert_eq!(peer_sets, [&format!("{p}_pods"), &format!("{p}_pods6")]);
    assert_eq!(a.sets[&format!("{p}_pods")].elements, ["10.1.0.11"]);
    for chain in ["in_eni1", "in_eni2"] {
        assert!(
            a.chains[chain].uses.contains(&format!("{p}_pods")),
            "{chain}"
        );
        assert!(a.chains[chain].rules[0].starts_with(&format!("ip saddr @{p}_pods ")));
    }
    // 2 shared peer sets (one element each) and a ports' set per pod (one element each), beside
    // the base chains' sets.
    let rule_sets: Vec<&Set> = a
        .sets
        .iter()
        .filter(|(n, _)| n.starts_with("in_") || n.starts_with("eg_"))
        .map(|(_, s)| s)
        .collect();
    let elements: usize = rule_sets.iter().map(|s| s.elements.len()).sum();
    assert_eq!((rule_sets.len(), elements), (4, 4));
    let b = render(&[
        on("x/a", "eni1", &["10.1.0.11", "10.1.0.12", "2001:db8::11"]),
        on("x/b", "eni2", &["10.1.0.11", "10.1.0.12", "2001:db8::11"]),
    ])
    .unwrap();
    assert_eq!(
        b.update_script(&a),
        format!("add element inet eniipam_policy {p}_pods {{ 10.1.0.12 }}\n")
    );
    // One pod goes: the set stays for the other; the last goes: the set goes, after its chain.
    let one = render(&[on("x/b", "eni2", &["10.1.0.11", "2001:db8::11"])]).unwrap();
    let left = one.update_script(&a);
    assert!(
        left.contains("delete set inet eniipam_policy in_eni1_r0_ports"),
        "{left}"
    );
    assert!(
        !left.contains(&format!("delete set inet eniipam_policy {p}_")),
        "{left}"
    );
    let none = render(&[]).unwrap();
    let gone = none.update_script(&one);
    let at = |what: &str| gone.find(what).unwrap_or_else(|| panic!("{what}: {gone}"));
    assert!(
        at("delete chain inet eniipam_policy in_eni2")
            < at(&format!("delete set inet eniipam_policy {p}_pods\n"))
    );
}

/// A rule whose render differs between two pods (a hand-made one here: the compiler never
/// makes one) keeps a set of its own for the second pod: sharing never changes a verdict.
#[test]
fn a_rule_rendered_otherwise_for_another_pod_keeps_its_own_set() {
    let mut b = from_peers(&["10.1.0.12"]);
    b.name = "x/b".into();
    b.veth = "eni2".into();
    let r = render(&[from_peers(&["10.1.0.11"]), b]).unwrap();
    let p = sets_of("x/p", PolicyType::Ingress, 0);
    assert_eq!(r.sets[&format!("{p}_pods")].elements, ["10.1.0.11"]);
    assert_eq!(r.sets["in_eni2_r0_pods"].elements, ["10.1.0.12"]);
    assert!(r.chains["in_eni2"].rules[0].starts_with("ip saddr @in_eni2_r0_pods "));
}
