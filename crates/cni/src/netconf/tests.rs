use super::*;
use proptest::prelude::*;
use serde_json::json;

fn parse(v: Value) -> Result<NetConf, CniError> {
    NetConf::parse(v.to_string().as_bytes())
}

#[test]
fn main_role_with_defaults() {
    let conf = parse(json!({"cniVersion": "1.0.0", "name": "net", "type": "eniipam"})).unwrap();
    assert_eq!(conf.role, Role::Main);
    assert_eq!(conf.cni_version, CniVersion::V1_0_0);
    assert_eq!(conf.plugin, PluginConfig::default());
    assert_eq!(
        conf.plugin.socket,
        PathBuf::from(eniipam_api::DEFAULT_SOCKET)
    );
    assert_eq!(conf.plugin.veth_prefix, "eni");
    assert!(conf.prev_result.is_none());
}

#[test]
fn ipam_role_reads_knobs_from_the_ipam_section() {
    let conf = parse(
        json!({"cniVersion": "0.4.0", "name": "net", "type": "bridge",
        "ipam": {"type": "eniipam", "socket": "/tmp/s.sock", "timeout_ms": 250}}),
    )
    .unwrap();
    assert_eq!(conf.role, Role::Ipam);
    assert_eq!(conf.plugin.socket, PathBuf::from("/tmp/s.sock"));
    assert_eq!(conf.plugin.timeout, Duration::from_millis(250));
}

#[test]
fn knobs_are_validated() {
    let base = json!({"cniVersion": "1.1.0", "name": "n", "type": "eniipam"});
    for (k, v) in [
        ("mtu", json!(10)),
        ("mtu", json!("1500")),
        ("veth_prefix", json!("toolong")),
        ("veth_prefix", json!("")),
        ("socket", json!("relative.sock")),
        ("cache_dir", json!("rel")),
        ("timeout_ms", json!(0)),
        ("timeout_ms", json!(-5)),
        ("sticky_statefulsets", json!("yes")),
    ] {
        let mut c = base.clone();
        c[k] = v.clone();
        let err = parse(c).unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidNetworkConfig, "{k}={v}");
    }
}

#[test]
fn version_and_decode_errors() {
    assert_eq!(
        NetConf::parse(b"{").unwrap_err().code,
        ErrorCode::DecodingFailure
    );
    assert_eq!(
        NetConf::parse(b"[1]").unwrap_err().code,
        ErrorCode::DecodingFailure
    );
    assert_eq!(
        NetConf::parse(b"").unwrap_err().code,
        ErrorCode::DecodingFailure
    );
    let big = vec![b' '; MAX_STDIN_BYTES + 1];
    assert_eq!(
        NetConf::parse(&big).unwrap_err().code,
        ErrorCode::DecodingFailure
    );
    let err = parse(json!({"cniVersion": "0.3.1", "name": "n", "type": "eniipam"})).unwrap_err();
    assert_eq!(err.code, ErrorCode::IncompatibleVersion);
    let err = parse(json!({"name": "n", "type": "eniipam"})).unwrap_err();
    assert_eq!(err.code, ErrorCode::IncompatibleVersion);
    let err = parse(json!({"cniVersion": 1, "name": "n", "type": "eniipam"})).unwrap_err();
    assert_eq!(err.code, ErrorCode::InvalidNetworkConfig);
}

#[test]
fn structural_errors_are_invalid_config() {
    for c in [
        json!({"cniVersion": "1.1.0", "type": "eniipam"}),
        json!({"cniVersion": "1.1.0", "name": "bad name", "type": "eniipam"}),
        json!({"cniVersion": "1.1.0", "name": "n"}),
        json!({"cniVersion": "1.1.0", "name": "n", "type": "bridge"}),
        json!({"cniVersion": "1.1.0", "name": "n", "type": "bridge", "ipam": "eniipam"}),
        json!({"cniVersion": "1.1.0", "name": "n", "type": "eniipam", "prevResult": 3}),
        json!({"cniVersion": "1.1.0", "name": "n", "type": "eniipam", "runtimeConfig": []}),
        json!({"cniVersion": "1.1.0", "name": "n", "type": "eniipam",
               "cni.dev/valid-attachments": [{"containerID": 1}]}),
    ] {
        assert_eq!(
            parse(c.clone()).unwrap_err().code,
            ErrorCode::InvalidNetworkConfig,
            "{c}"
        );
    }
    let err = parse(
        json!({"cniVersion": "1.1.0", "name": "n", "type": "eniipam",
        "ipam": {"type": "host-local"}}),
    )
    .unwrap_err();
    assert_eq!(err.code, ErrorCode::UnsupportedField);
}

#[test]
fn gc_attachments_and_prev_result_parse() {
    let conf = parse(
        json!({"cniVersion": "1.1.0", "name": "n", "type": "eniipam",
        "cni.dev/valid-attachments": [{"containerID": "abc", "ifname": "eth0"}],
        "prevResult": {"cniVersion": "1.1.0", "ips": [{"address": "10.1.2.3/32"}]}}),
    )
    .unwrap();
    assert_eq!(
        conf.valid_attachments.unwrap(),
        vec![AttachmentKey::new("abc", "eth0")]
    );
    assert_eq!(
        conf.prev_result.unwrap().ips[0].address.to_string(),
        "10.1.2.3/32"
    );
}

#[test]
fn sticky_is_opt_in() {
    let pod = PodRef {
        namespace: "db".into(),
        name: "pg-1".into(),
        uid: String::new(),
    };
    let plain = parse(json!({"cniVersion": "1.1.0", "name": "n", "type": "eniipam"})).unwrap();
    assert_eq!(plain.sticky_key(Some(&pod), &CniArgs::default()), None);
    let sts = parse(
        json!({"cniVersion": "1.1.0", "name": "n", "type": "eniipam",
        "sticky_statefulsets": true}),
    )
    .unwrap();
    assert_eq!(
        sts.sticky_key(Some(&pod), &CniArgs::default()).as_deref(),
        Some("db/pg-1")
    );
    let deploy = PodRef {
        name: "web-7d9f8-x2k4q".into(),
        ..pod.clone()
    };
    assert_eq!(sts.sticky_key(Some(&deploy), &CniArgs::default()), None);
    assert_eq!(sts.sticky_key(None, &CniArgs::default()), None);
    let annotated = parse(
        json!({"cniVersion": "1.1.0", "name": "n", "type": "eniipam",
        "runtimeConfig": {"io.kubernetes.cri.pod-annotations": {"eniipam.io/sticky-ip": "true"}}}),
    )
    .unwrap();
    assert_eq!(
        annotated
            .sticky_key(Some(&deploy), &CniArgs::default())
            .as_deref(),
        Some("db/web-7d9f8-x2k4q")
    );
    let args = CniArgs {
        sticky: Some(true),
        ..CniArgs::default()
    };
    assert!(plain.sticky_key(Some(&deploy), &args).is_some());
}

#[test]
fn ordinal_suffixes() {
    assert!(has_ordinal_suffix("web-0"));
    assert!(has_ordinal_suffix("a-b-12"));
    assert!(!has_ordinal_suffix("web-01"));
    assert!(!has_ordinal_suffix("web-"));
    assert!(!has_ordinal_suffix("-3"));
    assert!(!has_ordinal_suffix("web"));
    assert!(!has_ordinal_suffix("web-x1"));
}

#[test]
fn preferred_ip_annotation() {
    let conf = parse(
        json!({"cniVersion": "1.1.0", "name": "n", "type": "eniipam",
        "runtimeConfig": {"io.kubernetes.cri.pod-annotations": {"eniipam.io/ip": "10.0.0.9"}}}),
    )
    .unwrap();
    assert_eq!(
        conf.preferred_ip().unwrap(),
        Some(Ipv4Addr::new(10, 0, 0, 9))
    );
    let bad = parse(
        json!({"cniVersion": "1.1.0", "name": "n", "type": "eniipam",
        "runtimeConfig": {"io.kubernetes.cri.pod-annotations": {"eniipam.io/ip": "nope"}}}),
    )
    .unwrap();
    assert_eq!(
        bad.preferred_ip().unwrap_err().code,
        ErrorCode::InvalidNetworkConfig
    );
}

fn is_spec_code(code: ErrorCode) -> bool {
    matches!(
        code,
        ErrorCode::IncompatibleVersion
            | ErrorCode::UnsupportedField
            | ErrorCode::DecodingFailure
            | ErrorCode::InvalidNetworkConfig
    )
}

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        prop_oneof![
            Just("eniipam".to_owned()),
            Just("1.1.0".to_owned()),
            Just("0.4.0".to_owned()),
            Just("/tmp/x".to_owned()),
            ".{0,12}"
        ]
        .prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        let key = prop_oneof![
            Just("cniVersion".to_owned()),
            Just("name".to_owned()),
            Just("type".to_owned()),
            Just("ipam".to_owned()),
            Just("prevResult".to_owned()),
            Just("runtimeConfig".to_owned()),
            Just("mtu".to_owned()),
            Just("socket".to_owned()),
            Just("ips".to_owned()),
            Just("cni.dev/valid-attachments".to_owned()),
            "[a-z]{1,6}"
        ];
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(key, inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        if let Err(err) = NetConf::parse(&bytes) {
            prop_assert!(is_spec_code(err.code), "{err:?}");
            let obj = err.to_json(peek_version(&bytes));
            prop_assert!(obj["code"].as_u64().is_some());
            prop_assert!(obj["msg"].as_str().is_some_and(|m| !m.is_empty()));
        }
    }

    #[test]
    fn arbitrary_json_never_panics(v in arb_json(), version in prop_oneof![Just("1.1.0"), Just("0.4.0"), Just("9.9.9")]) {
        let mut v = v;
        // Give most inputs a chance to get past the version check.
        if let Value::Object(obj) = &mut v {
            obj.entry("cniVersion").or_insert_with(|| version.into());
            obj.entry("name").or_insert_with(|| "net".into());
        }
        let bytes = v.to_string().into_bytes();
        match NetConf::parse(&bytes) {
            Ok(conf) => prop_assert!(conf.plugin.mtu >= 68),
            Err(err) => {
                prop_assert!(is_spec_code(err.code), "{err:?}");
                let obj = err.to_json(peek_version(&bytes));
                prop_assert!(obj.get("cniVersion").is_some());
            }
        }
    }
}
