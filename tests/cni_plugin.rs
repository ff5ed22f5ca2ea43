//! The real `eniipam` plugin binary, run as a runtime runs it, against a fake eniipamd on a unix
//! socket: VERSION, the IPAM role's ADD/CHECK/DEL, GC, STATUS, error mapping, a daemon that is down,
//! sticky keys, and bad input that must change nothing. (Pod wiring is in `cni_netns.rs`.)

mod cni_support;

use cni_support::{Call, FakeDaemon, Invocation, cache_files, ipam_config, ips, main_config};
use serde_json::{Value, json};
use tonic::Code;

fn pool() -> FakeDaemon {
    FakeDaemon::start(&ips(&["10.10.0.11", "10.10.0.12", "10.10.0.13"]))
}

#[test]
fn version_prints_supported_versions() {
    let out = Invocation::new("VERSION", &json!({"cniVersion": "1.1.0"}))
        .run()
        .ok();
    assert_eq!(
        out,
        json!({"cniVersion": "1.1.0", "supportedVersions": ["0.4.0", "1.0.0", "1.1.0"]})
    );
    let out = Invocation::new("VERSION", &json!({"cniVersion": "0.4.0"}))
        .run()
        .ok();
    assert_eq!(out["cniVersion"], "0.4.0");
    // No stdin at all still answers.
    let out = Invocation::new("VERSION", &json!({}))
        .stdin(Vec::new())
        .run()
        .ok();
    assert_eq!(out["supportedVersions"].as_array().unwrap().len(), 3);
}

#[test]
fn ipam_role_add_check_del() {
    let daemon = pool();
    let conf = ipam_config(&daemon, "1.1.0");
    let result = Invocation::new("ADD", &conf).run().ok();
    assert_eq!(result["cniVersion"], "1.1.0");
    assert_eq!(result["ips"][0]["address"], "10.10.0.11/32");
    assert_eq!(result["ips"][0]["gateway"], "169.254.1.1");
    assert!(result["ips"][0].get("version").is_none());
    assert!(
        result.get("interfaces").is_none(),
        "IPAM results have no interfaces: {result}"
    );
    assert_eq!(result["routes"][0]["dst"], "0.0.0.0/0");

    let calls = daemon.calls();
    let Call::Allocate(req) = &calls[0] else {
        panic!("{calls:?}")
    };
    assert_eq!(req.api_version, eniipam::rpc::API_VERSION);
    assert_eq!(req.container_id, "c0ffee");
    assert_eq!(req.ifname, "eth0");
    assert_eq!(req.netns, "/var/run/netns/none");
    let pod = req.pod.clone().unwrap();
    assert_eq!(
        (pod.namespace.as_str(), pod.name.as_str(), pod.uid.as_str()),
        ("default", "web", "u-1")
    );
    assert_eq!(req.sticky_key, "", "sticky IPs are opt-in");
    assert_eq!(cache_files(&daemon), vec!["c0ffee@eth0.json"]);

    // The cache entry is what DEL needs without the daemon.
    let entry: Value = serde_json::from_slice(
        &std::fs::read(daemon.cache_dir().join("eniipam-test/c0ffee@eth0.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(entry["format"], 1);
    assert_eq!(entry["ip"], "10.10.0.11");
    assert!(entry.get("host_veth").is_none());

    let mut check_conf = conf.clone();
    check_conf["prevResult"] = result.clone();
    Invocation::new("CHECK", &check_conf).run().ok();
    assert!(matches!(daemon.calls().last(), Some(Call::Check(c)) if c.ip == "10.10.0.11"));

    let mut del_conf = conf.clone();
    del_conf["prevResult"] = result;
    assert_eq!(Invocation::new("DEL", &del_conf).run().ok(), Value::Null);
    assert_eq!(daemon.releases().len(), 1);
    assert!(!daemon.releases()[0].sticky);
    assert!(daemon.held().is_empty());
    assert!(cache_files(&daemon).is_empty());
    // DEL is idempotent.
    Invocation::new("DEL", &del_conf).run().ok();
    // And succeeds for an attachment that never existed.
    Invocation::new("DEL", &conf)
        .container("neverseen")
        .run()
        .ok();
}

#[test]
fn results_follow_the_config_version() {
    let daemon = pool();
    let old = Invocation::new("ADD", &ipam_config(&daemon, "0.4.0"))
        .container("old")
        .run()
        .ok();
    assert_eq!(old["cniVersion"], "0.4.0");
    assert_eq!(old["ips"][0]["version"], "4");
    let mid = Invocation::new("ADD", &ipam_config(&daemon, "1.0.0"))
        .container("mid")
        .run()
        .ok();
    assert_eq!(mid["cniVersion"], "1.0.0");
    assert!(mid["ips"][0].get("version").is_none());
    // Errors too.
    let err = Invocation::new("ADD", &ipam_config(&daemon, "0.4.0"))
        .container("bad/id")
        .run()
        .err(4);
    assert_eq!(err["cniVersion"], "0.4.0");
}

#[test]
fn chained_prev_result_passes_through() {
    let daemon = pool();
    let mut conf = ipam_config(&daemon, "1.0.0");
    let prev = json!({
        "cniVersion": "1.0.0",
        "interfaces": [{"name": "cni0", "mac": "02:00:00:00:00:09"},
                       {"name": "eth9", "mac": "02:00:00:00:00:0a", "sandbox": "/run/netns/x"}],
        "ips": [{"address": "192.168.7.2/24", "gateway": "192.168.7.1", "interface": 1}],
        "routes": [{"dst": "192.168.0.0/16"}],
        "dns": {"nameservers": ["10.96.0.10"], "search": ["svc.cluster.local"]},
    });
    conf["prevResult"] = prev.clone();
    let out = Invocation::new("ADD", &conf).run().ok();
    assert_eq!(out["interfaces"], prev["interfaces"]);
    assert_eq!(out["ips"][0], prev["ips"][0]);
    assert_eq!(out["ips"][1]["address"], "10.10.0.11/32");
    assert_eq!(out["routes"][0], prev["routes"][0]);
    assert_eq!(out["dns"], prev["dns"]);
}

#[test]
fn gc_releases_and_prunes_the_cache() {
    let daemon = pool();
    let conf = ipam_config(&daemon, "1.1.0");
    Invocation::new("ADD", &conf).container("keep").run().ok();
    Invocation::new("ADD", &conf).container("gone").run().ok();
    assert_eq!(
        cache_files(&daemon),
        vec!["gone@eth0.json", "keep@eth0.json"]
    );

    let mut gc = conf.clone();
    gc["cni.dev/valid-attachments"] = json!([{"containerID": "keep", "ifname": "eth0"}]);
    let out = Invocation::new("GC", &gc)
        .netns(None)
        .ifname("x")
        .run()
        .ok();
    assert_eq!(out, Value::Null);
    let Some(Call::GarbageCollect(req)) = daemon.calls().last().cloned() else {
        panic!("no GC call: {:?}", daemon.calls())
    };
    assert_eq!(req.valid.len(), 1);
    assert_eq!(req.valid[0].container_id, "keep");
    assert_eq!(cache_files(&daemon), vec!["keep@eth0.json"]);
    assert_eq!(daemon.held().len(), 1);

    // GC still prunes the cache when the daemon is down, and reports try-again.
    let mut daemon = daemon;
    daemon.stop();
    gc["cni.dev/valid-attachments"] = json!([]);
    Invocation::new("GC", &gc).run().err(11);
    assert!(cache_files(&daemon).is_empty());
}

#[test]
fn status_reports_ready_exhausted_and_down() {
    let mut daemon = FakeDaemon::start(&ips(&["10.10.0.11"]));
    let conf = main_config(&daemon, "1.1.0");
    let ok = Invocation::new("STATUS", &conf).run();
    assert_eq!(ok.ok(), Value::Null);

    Invocation::new("ADD", &ipam_config(&daemon, "1.1.0"))
        .run()
        .ok();
    let err = Invocation::new("STATUS", &conf).run().err(51);
    assert!(
        err["msg"].as_str().unwrap().contains("no free addresses"),
        "{err}"
    );

    daemon.set_ready(false);
    Invocation::new("STATUS", &conf).run().err(50);

    daemon.stop();
    let err = Invocation::new("STATUS", &conf).run().err(50);
    assert!(
        err["msg"].as_str().unwrap().contains("unreachable"),
        "{err}"
    );
}

#[test]
fn exhausted_pool_fails_add_with_try_again() {
    let daemon = FakeDaemon::start(&[]);
    let err = Invocation::new("ADD", &ipam_config(&daemon, "1.1.0"))
        .run()
        .err(11);
    assert!(
        err["msg"].as_str().unwrap().contains("subnet-0abc"),
        "the daemon's reason: {err}"
    );
    assert!(cache_files(&daemon).is_empty());

    let daemon = pool();
    daemon.fail_with(
        Code::ResourceExhausted,
        "instance limit reached: 3 ENIs",
        eniipam_api::pb::ErrorReason::Exhausted,
    );
    let err = Invocation::new("ADD", &ipam_config(&daemon, "1.1.0"))
        .run()
        .err(11);
    assert!(
        err["details"].as_str().unwrap().contains("instance limit"),
        "{err}"
    );
    Invocation::new("STATUS", &main_config(&daemon, "1.1.0"))
        .run()
        .err(51);
}

#[test]
fn daemon_errors_map_to_spec_codes() {
    use eniipam_api::pb::ErrorReason;
    for (code, msg, reason, cni) in [
        (
            Code::InvalidArgument,
            "bad preferred_ip",
            ErrorReason::InvalidRequest,
            7,
        ),
        (
            Code::FailedPrecondition,
            "client API version 2, daemon speaks API version 1",
            ErrorReason::ApiVersionMismatch,
            1,
        ),
        (
            Code::FailedPrecondition,
            "preferred IP 10.0.0.9 is cooling down",
            ErrorReason::PreferredIpUnavailable,
            7,
        ),
        (
            Code::Unavailable,
            "starting: state not rebuilt yet",
            ErrorReason::NotReady,
            11,
        ),
        (Code::Internal, "disk full", ErrorReason::Internal, 101),
    ] {
        let daemon = pool();
        daemon.fail_with(code, msg, reason);
        let err = Invocation::new("ADD", &ipam_config(&daemon, "1.1.0"))
            .run()
            .err(cni);
        assert!(err["msg"].as_str().unwrap().contains(msg), "{err}");
        assert!(cache_files(&daemon).is_empty());
    }
}

#[test]
fn daemon_down_add_is_try_again_and_del_still_succeeds() {
    let mut daemon = pool();
    let conf = ipam_config(&daemon, "1.1.0");
    let result = Invocation::new("ADD", &conf).run().ok();
    daemon.stop();

    let err = Invocation::new("ADD", &conf)
        .container("second")
        .run()
        .err(11);
    assert!(
        err["msg"].as_str().unwrap().contains("unreachable"),
        "{err}"
    );

    let mut del = conf.clone();
    del["prevResult"] = result;
    Invocation::new("DEL", &del).run().ok();
    assert!(cache_files(&daemon).is_empty());
    // CHECK cannot verify without the daemon.
    Invocation::new("CHECK", &del).run().err(11);
}

#[test]
fn check_detects_what_the_daemon_does_not_hold() {
    let daemon = pool();
    let conf = ipam_config(&daemon, "1.1.0");
    Invocation::new("ADD", &conf).run().ok();
    let mut wrong = conf.clone();
    wrong["prevResult"] = json!({"cniVersion": "1.1.0", "ips": [{"address": "10.10.0.99/32"}]});
    let err = Invocation::new("CHECK", &wrong).run().err(102);
    assert!(err["msg"].as_str().unwrap().contains("10.10.0.11"), "{err}");
    // CHECK of an attachment nobody knows: no prevResult, no cache.
    Invocation::new("CHECK", &conf)
        .container("unknown")
        .run()
        .err(7);
}

#[test]
fn sticky_keys_are_sent_only_when_opted_in() {
    let daemon = pool();
    // Annotation through runtimeConfig.
    let mut conf = ipam_config(&daemon, "1.1.0");
    conf["runtimeConfig"] =
        json!({"io.kubernetes.cri.pod-annotations": {"eniipam.io/sticky-ip": "true"}});
    Invocation::new("ADD", &conf)
        .container("a1")
        .pod("db", "cache-7f9c")
        .run()
        .ok();
    // StatefulSet naming with the config opt-in.
    let mut sts = ipam_config(&daemon, "1.1.0");
    sts["ipam"]["sticky_statefulsets"] = json!(true);
    Invocation::new("ADD", &sts)
        .container("a2")
        .pod("db", "pg-0")
        .run()
        .ok();
    // Same naming without the opt-in: not sticky.
    Invocation::new("ADD", &ipam_config(&daemon, "1.1.0"))
        .container("a3")
        .pod("db", "pg-1")
        .run()
        .ok();
    let keys: Vec<String> = daemon
        .calls()
        .into_iter()
        .filter_map(|c| match c {
            Call::Allocate(a) => Some(a.sticky_key),
            _ => None,
        })
        .collect();
    assert_eq!(keys, vec!["db/cache-7f9c", "db/pg-0", ""]);

    // DEL keeps the reservation (sticky release) for sticky pods, from the cache alone.
    Invocation::new("DEL", &ipam_config(&daemon, "1.1.0"))
        .container("a2")
        .pod("db", "pg-0")
        .run()
        .ok();
    Invocation::new("DEL", &ipam_config(&daemon, "1.1.0"))
        .container("a3")
        .pod("db", "pg-1")
        .run()
        .ok();
    let sticky: Vec<_> = daemon
        .releases()
        .iter()
        .map(|r| (r.container_id.clone(), r.sticky))
        .collect();
    assert_eq!(
        sticky,
        vec![("a2".to_owned(), true), ("a3".to_owned(), false)]
    );
}

#[test]
fn preferred_ip_annotation_is_required() {
    let daemon = pool();
    let mut conf = ipam_config(&daemon, "1.1.0");
    conf["runtimeConfig"] =
        json!({"io.kubernetes.cri.pod-annotations": {"eniipam.io/ip": "10.10.0.13"}});
    Invocation::new("ADD", &conf).run().ok();
    let Some(Call::Allocate(req)) = daemon.calls().first().cloned() else {
        panic!()
    };
    assert_eq!(req.preferred_ip, "10.10.0.13");
    assert!(req.require_preferred);
}

/// Every malformed invocation fails with the right spec code, never panics, and changes nothing:
/// the daemon is not called and nothing is cached.
#[test]
fn bad_input_changes_nothing() {
    let daemon = pool();
    let good = ipam_config(&daemon, "1.1.0");
    let good_bytes = good.to_string().into_bytes();
    let mut cases: Vec<(&str, Invocation, u64)> = vec![
        (
            "malformed JSON",
            Invocation::new("ADD", &good).stdin(b"{\"cniVersion\":".to_vec()),
            6,
        ),
        (
            "not an object",
            Invocation::new("ADD", &good).stdin(b"[1,2]".to_vec()),
            6,
        ),
        (
            "not UTF-8",
            Invocation::new("ADD", &good).stdin(vec![0xff, 0xfe, 0x00]),
            6,
        ),
        (
            "empty stdin",
            Invocation::new("ADD", &good).stdin(Vec::new()),
            6,
        ),
    ];
    let mut huge = good_bytes.clone();
    huge.pop();
    huge.extend(format!(",\"pad\":\"{}\"}}", "x".repeat(2 << 20)).into_bytes());
    cases.push((
        "oversized stdin",
        Invocation::new("ADD", &good).stdin(huge),
        6,
    ));

    let mut v = good.clone();
    v["cniVersion"] = json!("0.3.1");
    cases.push(("unsupported version", Invocation::new("ADD", &v), 1));
    let mut v = good.clone();
    v.as_object_mut().unwrap().remove("cniVersion");
    cases.push(("missing version", Invocation::new("ADD", &v), 1));
    let mut v = good.clone();
    v["cniVersion"] = json!(1.1);
    cases.push(("version not a string", Invocation::new("ADD", &v), 7));
    let mut v = good.clone();
    v["ipam"]["timeout_ms"] = json!("soon");
    cases.push(("knob of the wrong type", Invocation::new("ADD", &v), 7));
    let mut v = good.clone();
    v["ipam"]["type"] = json!("host-local");
    cases.push(("not for us", Invocation::new("ADD", &v), 7));
    let mut v = good.clone();
    v["name"] = json!(42);
    cases.push(("name of the wrong type", Invocation::new("ADD", &v), 7));
    let mut v = good.clone();
    v["prevResult"] = json!({"ips": [{"address": "300.1.1.1/32"}]});
    cases.push(("malformed prevResult", Invocation::new("ADD", &v), 7));

    let mut inv = Invocation::new("ADD", &good);
    inv.command = "EXPLODE".into();
    cases.push(("unknown command", inv, 4));
    let mut inv = Invocation::new("ADD", &good);
    inv.command = String::new();
    cases.push(("empty command", inv, 4));
    let mut inv = Invocation::new("ADD", &good);
    inv.container_id = None;
    cases.push(("no container id", inv, 4));
    let mut inv = Invocation::new("ADD", &good);
    inv.ifname = None;
    cases.push(("no ifname", inv, 4));
    cases.push(("no netns", Invocation::new("ADD", &good).netns(None), 4));
    let mut inv = Invocation::new("ADD", &good);
    inv.path = None;
    cases.push(("no CNI_PATH", inv, 4));
    cases.push((
        "bad container id",
        Invocation::new("ADD", &good).container("../etc"),
        4,
    ));
    cases.push((
        "bad ifname",
        Invocation::new("ADD", &good).ifname("this-is-too-long0"),
        4,
    ));
    let mut inv = Invocation::new("ADD", &good);
    inv.args = Some("K8S_POD_NAME".into());
    cases.push(("malformed CNI_ARGS", inv, 4));
    let mut inv = Invocation::new("DEL", &good);
    inv.container_id = None;
    cases.push(("DEL without container id", inv, 4));
    cases.push((
        "GC without valid-attachments",
        Invocation::new("GC", &good),
        7,
    ));

    for (what, inv, code) in cases {
        let run = inv.run();
        assert!(!run.stderr.contains("panicked"), "{what}: {run:?}");
        let obj = run.err(code);
        assert!(
            obj.as_object()
                .unwrap()
                .keys()
                .all(|k| ["cniVersion", "code", "msg", "details"].contains(&k.as_str())),
            "{what}: {obj}"
        );
        assert!(
            daemon.calls().is_empty(),
            "{what} reached the daemon: {:?}",
            daemon.calls()
        );
        assert!(cache_files(&daemon).is_empty(), "{what} wrote the cache");
    }
}
