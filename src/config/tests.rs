use super::*;

fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[test]
fn defaults_are_valid() {
    DaemonConfig::default().validate().unwrap();
}

#[test]
fn env_overrides_and_names_bad_knobs() {
    let c = DaemonConfig::load(
        None,
        &env(&[
            ("ENIIPAM_MIN_IDLE", "4"),
            ("ENIIPAM_MAX_ENIS", "3"),
            ("ENIIPAM_SECURITY_GROUPS", "sg-1, sg-2"),
        ]),
    )
    .unwrap();
    assert_eq!((c.min_idle, c.max_enis), (4, Some(3)));
    assert_eq!(c.security_groups, vec!["sg-1", "sg-2"]);
    let e = DaemonConfig::load(None, &env(&[("ENIIPAM_MIN_IDLE", "lots")])).unwrap_err();
    assert!(e.to_string().starts_with("min_idle:"), "{e}");
    let e = DaemonConfig::load(
        None,
        &env(&[("ENIIPAM_MIN_IDLE", "50"), ("ENIIPAM_MAX_IDLE", "5")]),
    )
    .unwrap_err();
    assert!(e.to_string().contains("max_idle"), "{e}");
    let e = DaemonConfig::load(None, &env(&[("ENIIPAM_MAX_ENIS", "1")])).unwrap_err();
    assert!(e.to_string().contains("2 ..= 32"), "{e}");
    let e = DaemonConfig::load(None, &env(&[("ENIIPAM_EC2_MUTATING_QPS", "0")])).unwrap_err();
    assert!(e.to_string().starts_with("ec2_mutating_qps"), "{e}");
    let e = DaemonConfig::load(None, &env(&[("ENIIPAM_LOG_FORMAT", "xml")])).unwrap_err();
    assert!(e.to_string().starts_with("log_format"), "{e}");
}

#[test]
fn host_rule_knobs_read_like_the_vpc_cni() {
    let c = DaemonConfig::load(None, &env(&[])).unwrap();
    assert_eq!(
        c.host_rules_config(),
        HostRulesConfig::default(),
        "SNAT with prng ports and NodePort support by default"
    );
    let c = DaemonConfig::load(
        None,
        &env(&[
            ("ENIIPAM_EXTERNAL_SNAT", "true"),
            ("ENIIPAM_NODE_PORT_SUPPORT", "false"),
            ("ENIIPAM_CONNMARK", "0x100"),
            ("ENIIPAM_VETH_PREFIX", "pod"),
        ]),
    )
    .unwrap();
    let h = c.host_rules_config();
    assert_eq!(h.snat, Snat::External);
    assert!(!h.node_port_support && !h.wants_rules());
    assert_eq!((h.connmark, h.veth_prefix.as_str()), (0x100, "pod"));
    let c = DaemonConfig::load(
        None,
        &env(&[
            ("ENIIPAM_SNAT_EXCLUDE_CIDRS", "10.1.0.0/16, 192.168.0.0/24"),
            ("ENIIPAM_SNAT_RANDOMIZE", "hashrandom"),
            ("ENIIPAM_CONNMARK", "64"),
        ]),
    )
    .unwrap();
    assert_eq!(
        c.host_rules_config().snat,
        Snat::Node {
            ports: SnatPorts::Hashrandom,
            exclude: vec![
                "10.1.0.0/16".parse().unwrap(),
                "192.168.0.0/24".parse().unwrap()
            ],
        }
    );
    assert_eq!(c.connmark, 64);
    for (var, value, knob) in [
        (
            "ENIIPAM_SNAT_EXCLUDE_CIDRS",
            "10.1.0.0/16,nope",
            "snat_exclude_cidrs",
        ),
        ("ENIIPAM_SNAT_RANDOMIZE", "random", "snat_randomize"),
        ("ENIIPAM_CONNMARK", "0", "connmark"),
        ("ENIIPAM_CONNMARK", "0x4000", "connmark"),
        ("ENIIPAM_CONNMARK", "0xzz", "connmark"),
        ("ENIIPAM_VETH_PREFIX", "toolong", "veth_prefix"),
        (
            "ENIIPAM_HOST_RULES_CHECK_SECS",
            "0",
            "host_rules_check_secs",
        ),
        ("ENIIPAM_ENI_ROUTE_WAIT_SECS", "0", "eni_route_wait_secs"),
    ] {
        let e = DaemonConfig::load(None, &env(&[(var, value)])).unwrap_err();
        assert!(e.to_string().starts_with(knob), "{var}={value}: {e}");
    }
    // The TOML spelling of the same knobs.
    let c: DaemonConfig = toml::from_str(
        "external_snat = true\nsnat_randomize = \"none\"\nsnat_exclude_cidrs = [\"10.9.0.0/16\"]\nconnmark = 0x200\n",
    )
    .unwrap();
    c.validate().unwrap();
    assert_eq!(
        (c.external_snat, c.snat_randomize, c.connmark),
        (true, SnatPorts::None, 0x200)
    );
}

#[test]
fn file_then_env() {
    let dir = std::env::temp_dir().join(format!("eniipam-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("c.toml");
    std::fs::write(&f, "cluster_name = \"prod\"\nmin_idle = 1\nmax_idle = 3\n").unwrap();
    let c = DaemonConfig::load(Some(&f), &env(&[("ENIIPAM_MAX_IDLE", "7")])).unwrap();
    assert_eq!(
        (c.cluster_name.as_str(), c.min_idle, c.max_idle),
        ("prod", 1, 7)
    );
    std::fs::write(&f, "no_such_knob = 1\n").unwrap();
    let e = DaemonConfig::load(Some(&f), &env(&[])).unwrap_err();
    assert!(e.to_string().contains("no_such_knob"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn per_api_rates_read_from_the_environment_and_toml_and_bad_ones_are_named() {
    use crate::cloud::limiter::BucketConfig;
    let c = DaemonConfig::load(
        None,
        &env(&[(
            "ENIIPAM_EC2_API_RATES",
            "AssignPrivateIpAddresses=1/5, CreateTags=0.5/2",
        )]),
    )
    .unwrap();
    let limiter = c.limiter_config();
    assert_eq!(
        limiter.per_api["AssignPrivateIpAddresses"],
        BucketConfig { qps: 1.0, burst: 5 }
    );
    assert_eq!(
        limiter.per_api["CreateTags"],
        BucketConfig { qps: 0.5, burst: 2 }
    );
    assert_eq!(limiter.per_api.len(), 2);
    // The class rates are still the defaults for every other API.
    assert_eq!(
        limiter.rates,
        DaemonConfig::default().limiter_config().rates
    );

    let toml: DaemonConfig =
        toml::from_str("[ec2_api_rates.DescribeNetworkInterfaces]\nqps = 2.0\nburst = 4\n")
            .unwrap();
    assert_eq!(
        toml.ec2_api_rates["DescribeNetworkInterfaces"],
        BucketConfig { qps: 2.0, burst: 4 }
    );

    for (value, names) in [
        (
            "AssignPrivateIpAdresses=1/5",
            "ec2_api_rates.AssignPrivateIpAdresses",
        ),
        ("CreateTags=0/5", "ec2_api_rates.CreateTags"),
        ("CreateTags=1/0", "ec2_api_rates.CreateTags"),
        ("CreateTags=1", "ec2_api_rates"),
        ("CreateTags=1/5,CreateTags=2/5", "ec2_api_rates"),
    ] {
        let e = DaemonConfig::load(None, &env(&[("ENIIPAM_EC2_API_RATES", value)])).unwrap_err();
        assert!(e.to_string().starts_with(names), "{value}: {e}");
    }
}

#[test]
fn ipv4_egress_is_on_by_default_and_only_means_something_in_ipv6_mode() {
    let c = DaemonConfig::load(None, &env(&[("ENIIPAM_IP_FAMILY", "ipv6")])).unwrap();
    assert!(c.ipv4_egress);
    assert_eq!(c.host_rules_config().ipv4_egress, Some(SnatPorts::Prng));
    let c = DaemonConfig::load(
        None,
        &env(&[
            ("ENIIPAM_IP_FAMILY", "ipv6"),
            ("ENIIPAM_IPV4_EGRESS", "false"),
        ]),
    )
    .unwrap();
    assert_eq!(c.host_rules_config().ipv4_egress, None);
    // Dual-stack pods have a VPC IPv4 of their own.
    let c = DaemonConfig::load(None, &env(&[("ENIIPAM_IP_FAMILY", "dual")])).unwrap();
    assert_eq!(c.host_rules_config().ipv4_egress, None);
    // With external_snat the egress rule keeps the node's snat_randomize ports.
    let c = DaemonConfig::load(
        None,
        &env(&[
            ("ENIIPAM_IP_FAMILY", "ipv6"),
            ("ENIIPAM_EXTERNAL_SNAT", "true"),
            ("ENIIPAM_SNAT_RANDOMIZE", "none"),
        ]),
    )
    .unwrap();
    assert_eq!(c.host_rules_config().ipv4_egress, Some(SnatPorts::None));
    let e = DaemonConfig::load(None, &env(&[("ENIIPAM_IPV4_EGRESS", "yes")])).unwrap_err();
    assert!(e.to_string().starts_with("ipv4_egress"), "{e}");
}

#[test]
fn custom_networking_reads_like_the_vpc_cni_and_refuses_what_cannot_work() {
    let c = DaemonConfig::load(None, &env(&[])).unwrap();
    assert!(!c.custom_networking);
    assert_eq!(c.eni_config_label, "k8s.amazonaws.com/eniConfig");
    assert_eq!(c.eni_config_annotation, "k8s.amazonaws.com/eniConfig");
    assert!(c.eth0_serves_pods() && c.pool_config().use_primary_eni);
    assert!(c.custom_networking_target().is_none());
    let on = [
        ("ENIIPAM_CUSTOM_NETWORKING", "true"),
        ("ENIIPAM_API_SERVER_URL", "http://127.0.0.1:6443"),
        ("ENIIPAM_NODE_NAME", "node-a"),
        ("ENIIPAM_API_SERVER_GC", "false"),
    ];
    let c = DaemonConfig::load(
        None,
        &env(&[
            &on[..],
            &[("ENIIPAM_ENI_CONFIG_LABEL", "topology.kubernetes.io/zone")],
        ]
        .concat()),
    )
    .unwrap();
    assert!(c.custom_networking);
    assert_eq!(c.eni_config_label, "topology.kubernetes.io/zone");
    // eth0 is in the node's subnet, not the ENIConfig's: it serves no pods.
    assert!(!c.eth0_serves_pods());
    let pool = c.pool_config();
    assert!(!pool.use_primary_eni && pool.custom_networking);
    let target = c.custom_networking_target().expect("reads the ENIConfig");
    assert_eq!(target.url, "http://127.0.0.1:6443");
    // What cannot work is named.
    for (extra, field, says) in [
        (
            ("ENIIPAM_IP_FAMILY", "ipv6"),
            "custom_networking",
            "ip_family = ipv6",
        ),
        (
            ("ENIIPAM_SUBNET_IDS", "subnet-0a1b"),
            "subnet_ids",
            "ENIConfig chooses",
        ),
        (
            ("ENIIPAM_NODE_NAME", ""),
            "node_name",
            "custom_networking is on",
        ),
        (
            ("ENIIPAM_ENI_CONFIG_LABEL", "bad label!"),
            "eni_config_label",
            "label key",
        ),
        (
            ("ENIIPAM_ENI_CONFIG_ANNOTATION", "/x"),
            "eni_config_annotation",
            "annotation key",
        ),
    ] {
        let mut vars = env(&on);
        vars.insert(extra.0.to_owned(), extra.1.to_owned());
        let e = DaemonConfig::load(None, &vars).unwrap_err().to_string();
        assert!(e.starts_with(field), "{extra:?}: {e}");
        assert!(e.contains(says), "{extra:?}: {e}");
    }
    let e = DaemonConfig::load(None, &env(&[("ENIIPAM_CUSTOM_NETWORKING", "true")]))
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("custom_networking") && e.contains("no API server"),
        "{e}"
    );
    // Dual stack is refused with it (issue 44: the ENIConfig would not apply to pods' IPv6), see
    // `dual_stack_is_refused_with_network_profiles_and_with_custom_networking`.
}

#[test]
fn network_profiles_need_the_api_server_and_the_node_name_and_an_ipv4_pool() {
    let c = DaemonConfig::load(None, &env(&[])).unwrap();
    assert!(!c.network_profiles && c.network_profiles_target().is_none());
    let on = [
        ("ENIIPAM_NETWORK_PROFILES", "true"),
        ("ENIIPAM_API_SERVER_URL", "http://127.0.0.1:6443"),
        ("ENIIPAM_NODE_NAME", "node-a"),
        ("ENIIPAM_API_SERVER_GC", "false"),
    ];
    let c = DaemonConfig::load(None, &env(&on)).unwrap();
    assert!(c.network_profiles);
    let target = c.network_profiles_target().expect("reads the profiles");
    assert_eq!(target.url, "http://127.0.0.1:6443");
    for (extra, field, says) in [
        (
            ("ENIIPAM_IP_FAMILY", "ipv6"),
            "network_profiles",
            "ip_family = ipv6",
        ),
        (
            ("ENIIPAM_NODE_NAME", ""),
            "node_name",
            "network_profiles is on",
        ),
        (
            ("ENIIPAM_NETWORK_PROFILES", "yes"),
            "network_profiles",
            "true or false",
        ),
        (
            ("ENIIPAM_MAX_IPS", "100"),
            "max_ips",
            "network_profiles is on",
        ),
    ] {
        let mut vars = env(&on);
        vars.insert(extra.0.to_owned(), extra.1.to_owned());
        let e = DaemonConfig::load(None, &vars).unwrap_err().to_string();
        assert!(e.contains(field), "{extra:?}: {e}");
        assert!(e.contains(says), "{extra:?}: {e}");
    }
    let e = DaemonConfig::load(None, &env(&[("ENIIPAM_NETWORK_PROFILES", "true")]))
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("network_profiles") && e.contains("no API server"),
        "{e}"
    );
    // Profiles and custom networking combine.
    let mut vars = env(&on);
    vars.insert("ENIIPAM_CUSTOM_NETWORKING".into(), "true".into());
    let c = DaemonConfig::load(None, &vars).unwrap();
    assert!(c.network_profiles && c.custom_networking);
}

/// Issue 44, case 4: every pod's IPv6 comes from eth0's /80, so with `dual` a profile's groups
/// and an ENIConfig's subnet and groups would not apply to a pod's IPv6: refused, naming both.
#[test]
fn dual_stack_is_refused_with_network_profiles_and_with_custom_networking() {
    let api = [
        ("ENIIPAM_API_SERVER_URL", "http://127.0.0.1:6443"),
        ("ENIIPAM_NODE_NAME", "node-a"),
        ("ENIIPAM_API_SERVER_GC", "false"),
        ("ENIIPAM_IP_FAMILY", "dual"),
    ];
    for knob in ["network_profiles", "custom_networking"] {
        let mut vars = env(&api);
        vars.insert(format!("ENIIPAM_{}", knob.to_uppercase()), "true".into());
        let e = DaemonConfig::load(None, &vars).unwrap_err().to_string();
        assert!(e.starts_with(knob), "{e}");
        assert!(
            e.contains("ip_family = dual") && e.contains("eth0's /80"),
            "{e}"
        );
        // Without dual stack the same knob is accepted.
        vars.insert("ENIIPAM_IP_FAMILY".into(), "ipv4".into());
        DaemonConfig::load(None, &vars).unwrap();
    }
    // Dual stack alone stays.
    let c = DaemonConfig::load(None, &env(&api)).unwrap();
    assert_eq!(c.ip_family, crate::ipv6::IpFamily::Dual);
}

#[test]
fn network_policy_is_on_where_it_can_be_unless_turned_off() {
    let c = DaemonConfig::load(None, &env(&[])).unwrap();
    assert!(
        !c.network_policy_enabled(),
        "no API server: nothing to read"
    );
    assert!(
        c.network_policy_off().unwrap().contains("no API server"),
        "{:?}",
        c.network_policy_off()
    );
    let api = [
        ("ENIIPAM_API_SERVER_URL", "http://127.0.0.1:6443"),
        ("ENIIPAM_NODE_NAME", "node-a"),
    ];
    let c = DaemonConfig::load(None, &env(&api)).unwrap();
    assert!(c.network_policy_enabled(), "auto: on");
    assert_eq!(
        c.network_policy_target().unwrap().url,
        "http://127.0.0.1:6443"
    );
    for (knob, value) in [
        ("ENIIPAM_NETWORK_POLICY", "false"),
        ("ENIIPAM_MANAGE_ENI_ROUTES", "false"),
    ] {
        let mut vars = env(&api);
        vars.insert(knob.into(), value.into());
        let c = DaemonConfig::load(None, &vars).unwrap();
        assert!(!c.network_policy_enabled(), "auto with {knob}={value}: off");
        assert!(c.network_policy_target().is_none());
        // The startup log says why.
        let why = c.network_policy_off().unwrap();
        assert!(
            why.contains(&knob["ENIIPAM_".len()..].to_lowercase()),
            "{why}"
        );
    }
    // Every family is enforced (issue 47 case 7): auto is on, and true is accepted.
    for family in ["ipv4", "ipv6", "dual"] {
        for knob in [None, Some("true")] {
            let mut vars = env(&api);
            vars.insert("ENIIPAM_IP_FAMILY".into(), family.into());
            if let Some(v) = knob {
                vars.insert("ENIIPAM_NETWORK_POLICY".into(), v.into());
            }
            let c = DaemonConfig::load(None, &vars).unwrap();
            assert!(c.network_policy_enabled(), "{family} {knob:?}: on");
            assert_eq!(c.network_policy_off(), None);
        }
    }
    // Required where it cannot be: an error naming the knob and why.
    for (extra, says) in [
        (("ENIIPAM_MANAGE_ENI_ROUTES", "false"), "manage_eni_routes"),
        (("ENIIPAM_API_SERVER_URL", ""), "no API server"),
        (("ENIIPAM_NETWORK_POLICY", "yes"), "true, false or auto"),
    ] {
        let mut vars = env(&api);
        vars.insert("ENIIPAM_NETWORK_POLICY".into(), "true".into());
        if extra.0 == "ENIIPAM_API_SERVER_URL" {
            vars.remove(extra.0);
        } else {
            vars.insert(extra.0.into(), extra.1.into());
        }
        let e = DaemonConfig::load(None, &vars).unwrap_err().to_string();
        assert!(e.starts_with("network_policy"), "{extra:?}: {e}");
        assert!(e.contains(says), "{extra:?}: {e}");
    }
}

#[test]
fn service_cidrs_are_a_list_of_cidrs_of_either_family() {
    let c = DaemonConfig::load(
        None,
        &env(&[("ENIIPAM_SERVICE_CIDRS", "10.100.0.0/16, fd00:100::/108")]),
    )
    .unwrap();
    assert_eq!(
        c.service_cidrs,
        vec![
            "10.100.0.0/16".parse::<ipnet::IpNet>().unwrap(),
            "fd00:100::/108".parse().unwrap()
        ]
    );
    assert!(
        DaemonConfig::load(None, &env(&[]))
            .unwrap()
            .service_cidrs
            .is_empty()
    );
    let many: Vec<String> = (0..17).map(|i| format!("10.{i}.0.0/16")).collect();
    for value in ["10.100.0.0/16,nope", "10.100.0.0", many.join(",").as_str()] {
        let e = DaemonConfig::load(None, &env(&[("ENIIPAM_SERVICE_CIDRS", value)])).unwrap_err();
        assert!(e.to_string().starts_with("service_cidrs"), "{value}: {e}");
    }
    let c: DaemonConfig = toml::from_str("service_cidrs = [\"172.20.0.0/16\"]\n").unwrap();
    c.validate().unwrap();
    assert_eq!(c.service_cidrs.len(), 1);
}

#[test]
fn decision_log_knobs_are_read_and_bad_ones_named() {
    use crate::network_policy::decisions::Logged;
    let d = DaemonConfig::default();
    assert_eq!(
        (d.network_policy_log, d.network_policy_log_file.as_ref()),
        (Logged::Denied, None),
        "denials logged to the daemon's log; no file unless asked"
    );
    let c = DaemonConfig::load(
        None,
        &env(&[
            ("ENIIPAM_NETWORK_POLICY_LOG", "all"),
            ("ENIIPAM_NETWORK_POLICY_LOG_GROUP", "9"),
            ("ENIIPAM_NETWORK_POLICY_LOG_RATE", "50"),
            (
                "ENIIPAM_NETWORK_POLICY_LOG_FILE",
                "/var/log/eniipam/decisions.log",
            ),
            ("ENIIPAM_NETWORK_POLICY_LOG_FILE_MAX_MB", "5"),
            ("ENIIPAM_NETWORK_POLICY_LOG_FILE_KEEP", "0"),
        ]),
    )
    .unwrap();
    assert_eq!(c.network_policy_log, Logged::All);
    assert_eq!(
        (c.network_policy_log_group, c.network_policy_log_rate),
        (9, 50)
    );
    assert_eq!(
        c.network_policy_log_file.as_deref(),
        Some(Path::new("/var/log/eniipam/decisions.log"))
    );
    assert_eq!(
        (
            c.network_policy_log_file_max_mb,
            c.network_policy_log_file_keep
        ),
        (5, 0)
    );
    for ((knob, value), says) in [
        (
            ("ENIIPAM_NETWORK_POLICY_LOG", "denies"),
            "off, denied or all",
        ),
        (("ENIIPAM_NETWORK_POLICY_LOG_GROUP", "70000"), "NFLOG group"),
        (("ENIIPAM_NETWORK_POLICY_LOG_RATE", "0"), "1 ..= 10000"),
        (("ENIIPAM_NETWORK_POLICY_LOG_FILE", "/"), "not a file path"),
        (
            ("ENIIPAM_NETWORK_POLICY_LOG_FILE_MAX_MB", "0"),
            "1 ..= 10240",
        ),
        (("ENIIPAM_NETWORK_POLICY_LOG_FILE_KEEP", "101"), "0 ..= 100"),
    ] {
        let e = DaemonConfig::load(None, &env(&[(knob, value)]))
            .unwrap_err()
            .to_string();
        let name = knob.trim_start_matches("ENIIPAM_").to_ascii_lowercase();
        assert!(e.starts_with(&name), "{knob}: {e}");
        assert!(e.contains(says), "{knob}: {e}");
    }
}

#[test]
fn prefix_reservation_percent_is_off_by_default_and_names_a_bad_value() {
    assert_eq!(DaemonConfig::default().prefix_reservation_percent, 0);
    let on = |v: &str| DaemonConfig::load(None, &env(&[("ENIIPAM_PREFIX_RESERVATION_PERCENT", v)]));
    assert_eq!(on("10").unwrap().prefix_reservation_percent, 10);
    let e = on("40").unwrap_err().to_string();
    assert!(
        e.starts_with("prefix_reservation_percent: 40 is above 25"),
        "{e}"
    );
    let e = on("ten").unwrap_err().to_string();
    assert!(e.starts_with("prefix_reservation_percent:"), "{e}");
    let e = DaemonConfig::load(
        None,
        &env(&[
            ("ENIIPAM_PREFIX_RESERVATION_PERCENT", "10"),
            ("ENIIPAM_IP_FAMILY", "ipv6"),
        ]),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("ip_family = ipv6"), "{e}");
    let toml: DaemonConfig = toml::from_str("prefix_reservation_percent = 5").unwrap();
    assert_eq!(toml.prefix_reservation_percent, 5);
}
