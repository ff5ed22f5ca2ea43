//! The plugin wiring IPv6-only and dual-stack pods (issue 26): the real plugin binary, a fake daemon
//! answering `ip_family` ipv6/dual with a `/80`, a "node" namespace the test makes (IPv6 forwarding
//! on inside it only) and pod namespaces; nothing touches the machine's own namespace.

mod cni_support;

use cni_support::{FakeDaemon, Invocation, Netns, cache_files, can_use_netns, ips, main_config};
use eniipam::model::{AttachmentKey, PodRef};
use eniipam_cni::wiring::host_veth_name;
use serde_json::{Value, json};

const PREFIX: &str = "2600:1f18:6d00:100:a1b2::/80";
const A: &str = "2600:1f18:6d00:100:a1b2::11";
const B: &str = "2600:1f18:6d00:100:a1b2::12";

fn netns_available(test: &str) -> bool {
    let ok = can_use_netns();
    if !ok {
        mockcloud::ci::skip(
            test,
            "cannot create network namespaces (needs root and iproute2)",
        );
    }
    ok
}

fn node() -> Netns {
    let node = Netns::new("node6");
    node.enable_forwarding();
    node.enable_ipv6_forwarding();
    node
}

fn veth_name(pod: &str) -> String {
    host_veth_name(
        "eni",
        Some(&PodRef {
            namespace: "default".into(),
            name: pod.into(),
            uid: String::new(),
        }),
        &AttachmentKey::new("any", "eth0"),
    )
}

fn invoke(cmd: &str, conf: &Value, node: &Netns, pod: &Netns, ctr: &str, name: &str) -> Invocation {
    Invocation::new(cmd, conf)
        .container(ctr)
        .pod("default", name)
        .netns(Some(&pod.path()))
        .in_node(node)
}

fn with_prev(daemon: &FakeDaemon, prev: &Value) -> Value {
    let mut conf = main_config(daemon, "1.1.0");
    conf["prevResult"] = prev.clone();
    conf
}

fn host_route_dev(node: &Netns, ip: &str) -> Option<String> {
    node.ip_json(&["-6", "route", "show"])
        .into_iter()
        .find(|r| r["dst"] == ip)
        .map(|r| r["dev"].as_str().unwrap_or_default().to_owned())
}

fn assert_pod_v6(pod: &Netns, ip: &str) {
    let addrs = pod.ip_json(&["-6", "addr", "show", "dev", "eth0", "scope", "global"]);
    let inet6: Vec<_> = addrs[0]["addr_info"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a.get("local").is_some())
        .collect();
    assert_eq!(inet6.len(), 1, "{addrs:?}");
    assert_eq!(inet6[0]["local"], ip);
    assert_eq!(inet6[0]["prefixlen"], 128);
    assert!(inet6[0].get("tentative").is_none(), "nodad: {addrs:?}");
    let routes = pod.ip_json(&["-6", "route", "show"]);
    let default = routes
        .iter()
        .find(|r| r["dst"] == "default")
        .unwrap_or_else(|| panic!("no IPv6 default route: {routes:?}"));
    assert_eq!(default["gateway"], "fe80::1");
    assert_eq!(default["dev"], "eth0");
    let neigh = pod.ip_json(&["-6", "neigh", "show", "dev", "eth0"]);
    assert!(
        neigh.iter().any(|n| n["dst"] == "fe80::1"
            && n["state"]
                .as_array()
                .unwrap()
                .iter()
                .any(|s| s == "PERMANENT")),
        "{neigh:?}"
    );
}

#[test]
fn ipv6_and_dual_pods_are_wired_reach_each_other_and_are_torn_down() {
    if !netns_available("ipv6_and_dual_pods_are_wired_reach_each_other_and_are_torn_down") {
        return;
    }
    let daemon = FakeDaemon::start(&ips(&["10.10.0.21"]));
    daemon.set_ipv6("ipv6", PREFIX, &[A]);
    let node = node();
    let (pod1, pod2, pod3) = (Netns::new("pod6"), Netns::new("pod6"), Netns::new("pod6"));
    let conf = main_config(&daemon, "1.1.0");

    // IPv6-only: the /128 with fe80::1, a ::/0 route; no IPv4 at all.
    let r1 = invoke("ADD", &conf, &node, &pod1, "ctr1", "v6-0")
        .run()
        .ok();
    assert_eq!(
        r1["ips"],
        json!([{"address": format!("{A}/128"), "gateway": "fe80::1", "interface": 1}])
    );
    assert_eq!(r1["routes"], json!([{"dst": "::/0", "gw": "fe80::1"}]));
    assert_pod_v6(&pod1, A);
    assert!(
        pod1.ip_json(&["-4", "addr", "show", "dev", "eth0"])
            .is_empty()
    );
    let veth1 = veth_name("v6-0");
    assert_eq!(host_route_dev(&node, A).as_deref(), Some(veth1.as_str()));

    // Dual: both families on one veth, both routes; 0.4.0 results carry each family's version.
    daemon.set_ipv6("dual", PREFIX, &[B]);
    let r2 = invoke(
        "ADD",
        &main_config(&daemon, "0.4.0"),
        &node,
        &pod2,
        "ctr2",
        "dual-0",
    )
    .run()
    .ok();
    assert_eq!(r2["ips"][0]["address"], "10.10.0.21/32");
    assert_eq!(r2["ips"][0]["version"], "4");
    assert_eq!(r2["ips"][1]["address"], format!("{B}/128"));
    assert_eq!(r2["ips"][1]["version"], "6");
    assert_eq!(r2["routes"][1], json!({"dst": "::/0", "gw": "fe80::1"}));
    assert_pod_v6(&pod2, B);
    let veth2 = veth_name("dual-0");
    assert_eq!(host_route_dev(&node, B).as_deref(), Some(veth2.as_str()));
    assert!(
        node.ip_json(&["-4", "route", "show"])
            .iter()
            .any(|r| r["dst"] == "10.10.0.21" && r["dev"] == veth2.as_str())
    );

    // Pod to pod over IPv6 through the node namespace.
    for (from, to) in [(&pod1, B), (&pod2, A)] {
        let (ok, out) = from.exec("ping", &["-6", "-c", "1", "-W", "5", to]);
        assert!(ok, "ping {to} from {}: {out}", from.name);
    }

    // CHECK passes, then fails once the pod's address is gone.
    let check1 = invoke(
        "CHECK",
        &with_prev(&daemon, &r1),
        &node,
        &pod1,
        "ctr1",
        "v6-0",
    );
    check1.run().ok();
    pod1.ip(&["-6", "addr", "del", &format!("{A}/128"), "dev", "eth0"]);
    let err = check1.run().err(102);
    assert!(err["msg"].as_str().unwrap().contains(A), "{err}");

    // DEL removes the host route and the cache entry.
    invoke(
        "DEL",
        &with_prev(&daemon, &r1),
        &node,
        &pod1,
        "ctr1",
        "v6-0",
    )
    .run()
    .ok();
    assert_eq!(host_route_dev(&node, A), None);
    assert!(!node.link_names().contains(&veth1));
    assert_eq!(daemon.releases()[0].ipv6, A);

    // B goes to a third pod too (the fake hands it out again): the late DEL of pod 2 is told
    // `ipv6_held_by_other` and leaves pod 3's route alone.
    daemon.set_ipv6("ipv6", PREFIX, &[B]);
    invoke("ADD", &conf, &node, &pod3, "ctr3", "v6-1")
        .run()
        .ok();
    let veth3 = veth_name("v6-1");
    assert_eq!(host_route_dev(&node, B).as_deref(), Some(veth3.as_str()));
    invoke(
        "DEL",
        &with_prev(&daemon, &r2),
        &node,
        &pod2,
        "ctr2",
        "dual-0",
    )
    .run()
    .ok();
    assert!(!node.link_names().contains(&veth2));
    assert_eq!(host_route_dev(&node, B).as_deref(), Some(veth3.as_str()));
    assert_eq!(cache_files(&daemon), vec!["ctr3@eth0.json"]);

    invoke("DEL", &conf, &node, &pod3, "ctr3", "v6-1")
        .run()
        .ok();
    assert_eq!(host_route_dev(&node, B), None);
    assert!(cache_files(&daemon).is_empty());
    assert!(daemon.held_v6().is_empty());
}

#[test]
fn bad_ipv6_replies_fail_cleanly_with_nothing_wired() {
    if !netns_available("bad_ipv6_replies_fail_cleanly_with_nothing_wired") {
        return;
    }
    let daemon = FakeDaemon::start(&ips(&["10.10.0.31"]));
    let node = node();
    let pod = Netns::new("pod6");
    let cases = [
        ("ipv6", "not-an-ip", "\"not-an-ip\""),
        (
            "ipv6",
            "2600:1f18:6d00:100:ffff::1",
            "outside the node's prefix",
        ),
        (
            "dual",
            "2600:1f18:6d00:100:ffff::1",
            "outside the node's prefix",
        ),
        ("ipv7", A, "\"ipv7\""),
    ];
    for (family, addr, says) in cases {
        daemon.set_ipv6(family, PREFIX, &[addr]);
        let run = invoke(
            "ADD",
            &main_config(&daemon, "1.1.0"),
            &node,
            &pod,
            "ctr",
            "bad-0",
        )
        .run();
        let err = run.err(101);
        assert!(
            err["msg"].as_str().unwrap().contains(says),
            "{family} {addr}: {err}"
        );
        assert!(
            !pod.link_names().contains(&"eth0".to_owned()),
            "{family} {addr}"
        );
        assert!(!node.link_names().contains(&veth_name("bad-0")));
        assert!(
            node.ip_json(&["-6", "route", "show"])
                .iter()
                .all(|r| r["dst"] != addr)
        );
        assert!(cache_files(&daemon).is_empty());
        assert!(daemon.held_v6().is_empty(), "{family} {addr}: not released");
        assert!(daemon.held().is_empty(), "{family} {addr}: not released");
    }
}

/// An IPv6-only pod's IPv4 egress address (`ipv4_egress`): wired as a `/32` with the IPv4 default
/// route and the host route, never reported in the result, checked, and gone with the veth.
#[test]
fn an_ipv6_pods_egress_address_is_wired_checked_and_not_reported() {
    if !netns_available("an_ipv6_pods_egress_address_is_wired_checked_and_not_reported") {
        return;
    }
    const EGRESS: &str = "169.254.172.7";
    let daemon = FakeDaemon::start(&ips(&[]));
    daemon.set_ipv6("ipv6", PREFIX, &[A]);
    daemon.set_egress(&[EGRESS]);
    let node = node();
    let pod = Netns::new("pod6e");
    let conf = main_config(&daemon, "1.1.0");
    let r = invoke("ADD", &conf, &node, &pod, "ctre", "egress-0")
        .run()
        .ok();
    // Only the IPv6 is reported: containerd would give Kubernetes a 169.254 pod IP otherwise.
    assert_eq!(
        r["ips"],
        json!([{"address": format!("{A}/128"), "gateway": "fe80::1", "interface": 1}])
    );
    assert!(!r.to_string().contains(EGRESS), "{r}");
    assert_pod_v6(&pod, A);
    let v4 = pod.ip_json(&["-4", "addr", "show", "dev", "eth0"]);
    let inet: Vec<_> = v4[0]["addr_info"].as_array().unwrap().iter().collect();
    assert_eq!(inet.len(), 1, "{v4:?}");
    assert_eq!(
        (inet[0]["local"].as_str(), inet[0]["prefixlen"].as_u64()),
        (Some(EGRESS), Some(32))
    );
    let routes = pod.ip_json(&["-4", "route", "show"]);
    let default = routes
        .iter()
        .find(|r| r["dst"] == "default")
        .unwrap_or_else(|| panic!("no IPv4 default route: {routes:?}"));
    assert_eq!(default["gateway"], "169.254.1.1");
    assert_eq!(default["dev"], "eth0");
    assert!(
        default["flags"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f == "onlink"),
        "{default}"
    );
    let neigh = pod.ip_json(&["-4", "neigh", "show", "dev", "eth0"]);
    assert!(
        neigh.iter().any(|n| n["dst"] == "169.254.1.1"
            && n["state"]
                .as_array()
                .unwrap()
                .iter()
                .any(|s| s == "PERMANENT")),
        "{neigh:?}"
    );
    let veth = veth_name("egress-0");
    assert!(
        node.ip_json(&["-4", "route", "show"])
            .iter()
            .any(|r| r["dst"] == EGRESS && r["dev"] == veth.as_str()),
        "host route"
    );

    // CHECK passes, then fails once the egress address is gone from the pod.
    let check = invoke(
        "CHECK",
        &with_prev(&daemon, &r),
        &node,
        &pod,
        "ctre",
        "egress-0",
    );
    check.run().ok();
    pod.ip(&["-4", "addr", "del", &format!("{EGRESS}/32"), "dev", "eth0"]);
    let err = check.run().err(102);
    assert!(err["msg"].as_str().unwrap().contains(EGRESS), "{err}");

    // DEL: the veth goes with the host route; the daemon released the attachment.
    invoke(
        "DEL",
        &with_prev(&daemon, &r),
        &node,
        &pod,
        "ctre",
        "egress-0",
    )
    .run()
    .ok();
    assert!(!node.link_names().contains(&veth));
    assert!(
        node.ip_json(&["-4", "route", "show"])
            .iter()
            .all(|r| r["dst"] != EGRESS)
    );
    assert!(daemon.held_v6().is_empty());
}

#[test]
fn bad_egress_addresses_are_refused_with_nothing_wired() {
    if !netns_available("bad_egress_addresses_are_refused_with_nothing_wired") {
        return;
    }
    let daemon = FakeDaemon::start(&ips(&["10.10.0.41"]));
    let node = node();
    let pod = Netns::new("pod6e");
    let cases = [
        ("ipv6", "169.254.172", "not an IPv4 address"),
        ("ipv6", "169.254.180.1", "169.254.172.0/22"),
        ("ipv6", "10.10.0.9", "169.254.172.0/22"),
        ("dual", "169.254.172.9", "only IPv6-only pods"),
    ];
    for (family, egress, says) in cases {
        daemon.set_ipv6(family, PREFIX, &[A]);
        daemon.set_egress(&[egress]);
        let err = invoke(
            "ADD",
            &main_config(&daemon, "1.1.0"),
            &node,
            &pod,
            "ctr",
            "bad-e",
        )
        .run()
        .err(101);
        assert!(
            err["msg"].as_str().unwrap().contains(says),
            "{egress}: {err}"
        );
        assert!(!pod.link_names().contains(&"eth0".to_owned()), "{egress}");
        assert!(!node.link_names().contains(&veth_name("bad-e")));
        assert!(cache_files(&daemon).is_empty());
        assert!(daemon.held_v6().is_empty(), "{egress}: not released");
        assert!(daemon.held().is_empty(), "{egress}: not released");
    }
}
