use std::net::Ipv4Addr;

use super::*;

fn table(rules: Vec<Rule>, kind: ChainType, hook: Hook) -> Table {
    Table {
        family: Family::Ip,
        name: "t".into(),
        chains: vec![Chain {
            name: "c".into(),
            kind,
            hook,
            priority: Priority::SrcNat(10),
            rules,
        }],
    }
}

#[test]
fn rules_render_in_nft_syntax() {
    let r = Rule {
        matches: vec![
            Match::IifNamePrefix("eni".into()),
            Match::CtStateNew,
            Match::DaddrIn {
                nets: vec![
                    "10.0.0.0/16".parse().unwrap(),
                    "100.64.1.7/10".parse().unwrap(),
                ],
                negate: true,
            },
            Match::DaddrLocal {
                on_iif: false,
                negate: true,
            },
        ],
        action: Action::CtMarkSet(0x80),
        comment: Some("eniipam: egress".into()),
    };
    assert_eq!(
        r.to_string(),
        "iifname \"eni*\" ct state new ip daddr != { 10.0.0.0/16, 100.64.0.0/10 } \
         fib daddr type != local ct mark set ct mark | 0x80 comment \"eniipam: egress\""
    );
    let r = Rule {
        matches: vec![
            Match::IifName("ens5".into()),
            Match::DaddrLocal {
                on_iif: true,
                negate: false,
            },
        ],
        action: Action::CtMarkSet(0x80),
        comment: None,
    };
    assert_eq!(
        r.to_string(),
        "iifname \"ens5\" fib daddr . iif type local ct mark set ct mark | 0x80"
    );
    let restore = Rule {
        matches: vec![Match::CtMarkHas(0x80)],
        action: Action::MetaMarkSet(0x80),
        comment: None,
    };
    assert_eq!(
        restore.to_string(),
        "ct mark & 0x80 == 0x80 meta mark set meta mark | 0x80"
    );
    let to: Ipv4Addr = "10.0.0.4".parse().unwrap();
    for (ports, text) in [
        (SnatPorts::Prng, "snat to 10.0.0.4 fully-random"),
        (SnatPorts::Hashrandom, "snat to 10.0.0.4 random"),
        (SnatPorts::None, "snat to 10.0.0.4"),
    ] {
        assert_eq!(Action::Snat { to, ports }.to_string(), text);
    }
    assert_eq!(Priority::Mangle(0).to_string(), "mangle");
    assert_eq!(Priority::DstNat(10).to_string(), "dstnat + 10");
    assert_eq!(Priority::SrcNat(-5).to_string(), "srcnat - 5");
    assert_eq!(Priority::DstNat(10).value(), -90);
}

#[test]
fn the_replace_script_declares_deletes_and_defines() {
    let t = table(
        vec![Rule {
            matches: vec![],
            action: Action::Return,
            comment: None,
        }],
        ChainType::Filter,
        Hook::Prerouting,
    );
    let s = t.replace_script().unwrap();
    assert_eq!(
        s,
        "table ip t {}\ndelete table ip t\ntable ip t {\n  chain c {\n    \
         type filter hook prerouting priority srcnat + 10; policy accept;\n    return\n  }\n}\n"
    );
}

#[test]
fn what_cannot_go_in_a_script_is_refused() {
    let bad_names = [
        "",
        "eth0\"; flush ruleset",
        "a b",
        "sixteen-chars-xx",
        "eth*",
    ];
    for name in bad_names {
        let t = table(
            vec![Rule {
                matches: vec![Match::IifName(name.into())],
                action: Action::Return,
                comment: None,
            }],
            ChainType::Filter,
            Hook::Prerouting,
        );
        assert!(t.render().is_err(), "{name:?}");
    }
    let snat_in_filter = table(
        vec![Rule {
            matches: vec![],
            action: Action::Snat {
                to: Ipv4Addr::new(10, 0, 0, 4),
                ports: SnatPorts::Prng,
            },
            comment: None,
        }],
        ChainType::Filter,
        Hook::Prerouting,
    );
    assert!(
        snat_in_filter
            .render()
            .unwrap_err()
            .to_string()
            .contains("nat chain")
    );
    let quote = table(
        vec![Rule {
            matches: vec![],
            action: Action::Return,
            comment: Some("say \"hi\"".into()),
        }],
        ChainType::Filter,
        Hook::Prerouting,
    );
    assert!(quote.render().is_err());
    let empty_set = table(
        vec![Rule {
            matches: vec![Match::DaddrIn {
                nets: vec![],
                negate: false,
            }],
            action: Action::Return,
            comment: None,
        }],
        ChainType::Filter,
        Hook::Prerouting,
    );
    assert!(empty_set.render().is_err());
    let mut bad_table = empty_set.clone();
    bad_table.name = "1table".into();
    assert!(bad_table.render().is_err());
}

#[test]
fn snat_ports_parse_like_the_vpc_cni_knob() {
    assert_eq!("prng".parse::<SnatPorts>(), Ok(SnatPorts::Prng));
    assert_eq!("hashrandom".parse::<SnatPorts>(), Ok(SnatPorts::Hashrandom));
    assert_eq!("none".parse::<SnatPorts>(), Ok(SnatPorts::None));
    assert!("random".parse::<SnatPorts>().is_err());
    for p in [SnatPorts::Prng, SnatPorts::Hashrandom, SnatPorts::None] {
        assert_eq!(p.as_str().parse::<SnatPorts>(), Ok(p));
    }
}
