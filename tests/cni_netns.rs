//! The plugin wiring real pods: every test makes a "node" network namespace (the plugin runs in it via
//! `ip netns exec`) and pod namespaces, and never touches the machine's own namespace. Addresses,
//! routes, neighbours and rules are read back with `ip -j`. Needs root; skipped with a notice otherwise.

mod cni_support;

use cni_support::{
    Call, FakeDaemon, Invocation, Netns, cache_files, can_use_netns, ips, main_config,
};
use eniipam::model::{AttachmentKey, PodRef};
use eniipam_cni::wiring::host_veth_name;
use serde_json::{Value, json};

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

fn ping_available() -> bool {
    std::process::Command::new("ping")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// A node namespace that forwards between its pods and owns 10.99.0.1 (on lo).
fn node() -> Netns {
    let node = Netns::new("node");
    node.enable_forwarding();
    node.ip(&["addr", "add", "10.99.0.1/32", "dev", "lo"]);
    node
}

fn add(daemon: &FakeDaemon, node: &Netns, pod: &Netns, container: &str, name: &str) -> Value {
    Invocation::new("ADD", &main_config(daemon, "1.1.0"))
        .container(container)
        .pod("default", name)
        .netns(Some(&pod.path()))
        .in_node(node)
        .run()
        .ok()
}

fn with_prev(daemon: &FakeDaemon, prev: &Value) -> Value {
    let mut conf = main_config(daemon, "1.1.0");
    conf["prevResult"] = prev.clone();
    conf
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

fn rules_for(node: &Netns, ip: &str) -> Vec<Value> {
    node.ip_json(&["rule", "show"])
        .into_iter()
        .filter(|r| r["src"] == ip || r["dst"] == ip)
        .collect()
}

fn assert_pod_wired(pod: &Netns, ip: &str, host_mac: &str) {
    let addrs = pod.ip_json(&["addr", "show", "dev", "eth0"]);
    assert_eq!(addrs[0]["mtu"], 1500, "{addrs:?}");
    let inet: Vec<_> = addrs[0]["addr_info"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["family"] == "inet")
        .collect();
    assert_eq!(inet.len(), 1, "{addrs:?}");
    assert_eq!(inet[0]["local"], ip);
    assert_eq!(inet[0]["prefixlen"], 32);

    let routes = pod.ip_json(&["route", "show"]);
    let default = routes
        .iter()
        .find(|r| r["dst"] == "default")
        .unwrap_or_else(|| panic!("no default route: {routes:?}"));
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

    let neigh = pod.ip_json(&["neigh", "show", "dev", "eth0"]);
    let gw = neigh
        .iter()
        .find(|n| n["dst"] == "169.254.1.1")
        .unwrap_or_else(|| panic!("no gateway neighbour: {neigh:?}"));
    assert_eq!(gw["lladdr"], host_mac);
    assert!(
        gw["state"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s == "PERMANENT"),
        "{gw}"
    );
}

fn assert_host_wired(node: &Netns, ip: &str, veth: &str, table: Option<&str>) {
    assert!(node.link_names().contains(&veth.to_owned()));
    let routes = node.ip_json(&["route", "show"]);
    let to_pod = routes
        .iter()
        .find(|r| r["dst"] == ip)
        .unwrap_or_else(|| panic!("no host route to {ip}: {routes:?}"));
    assert_eq!(to_pod["dev"], veth);
    assert_eq!(to_pod["scope"], "link");
    let rules = rules_for(node, ip);
    // Every pod IP: `to <ip> lookup main`.
    assert!(
        rules
            .iter()
            .any(|r| r["priority"] == 512 && r["dst"] == ip && r["table"] == "main"),
        "{rules:?}"
    );
    match table {
        None => assert_eq!(
            rules.len(),
            1,
            "primary-ENI IPs get the `to` rule only: {rules:?}"
        ),
        Some(table) => {
            assert!(
                rules
                    .iter()
                    .any(|r| r["priority"] == 1536 && r["src"] == ip && r["table"] == table),
                "{rules:?}"
            );
        }
    }
}

#[test]
fn pods_are_wired_reach_each_other_and_are_torn_down() {
    if !netns_available("pods_are_wired_reach_each_other_and_are_torn_down") {
        return;
    }
    let daemon = FakeDaemon::start(&ips(&["10.10.0.11", "10.10.0.12"]));
    daemon.set_route_table(2);
    let node = node();
    let pod1 = Netns::new("pod");
    let pod2 = Netns::new("pod");

    let r1 = add(&daemon, &node, &pod1, "ctr1", "web-0");
    let veth1 = veth_name("web-0");
    assert_eq!(r1["cniVersion"], "1.1.0");
    assert_eq!(r1["interfaces"][0]["name"], veth1.as_str());
    assert!(r1["interfaces"][0].get("sandbox").is_none());
    assert_eq!(r1["interfaces"][1]["name"], "eth0");
    assert_eq!(r1["interfaces"][1]["sandbox"], pod1.path());
    assert_eq!(
        r1["ips"][0],
        json!({"address": "10.10.0.11/32", "gateway": "169.254.1.1", "interface": 1})
    );
    assert_eq!(
        r1["routes"][0],
        json!({"dst": "0.0.0.0/0", "gw": "169.254.1.1"})
    );
    let mac1 = r1["interfaces"][0]["mac"].as_str().unwrap().to_owned();
    assert_eq!(r1["interfaces"][1]["mac"].as_str().unwrap().len(), 17);
    assert_pod_wired(&pod1, "10.10.0.11", &mac1);
    assert_host_wired(&node, "10.10.0.11", &veth1, Some("2"));
    // Nothing landed in the machine's own namespace.
    let root_links = cni_support::run_ok(cni_support::ip_binary(), &["-o", "link", "show"]);
    assert!(
        !root_links.contains(&veth1),
        "host veth leaked into the root namespace"
    );

    let r2 = add(&daemon, &node, &pod2, "ctr2", "web-1");
    let veth2 = veth_name("web-1");
    assert_ne!(veth1, veth2);
    assert_pod_wired(
        &pod2,
        "10.10.0.12",
        r2["interfaces"][0]["mac"].as_str().unwrap(),
    );
    assert_host_wired(&node, "10.10.0.12", &veth2, Some("2"));

    if ping_available() {
        for (from, to) in [
            (&pod1, "10.10.0.12"),
            (&pod2, "10.10.0.11"),
            (&pod1, "10.99.0.1"),
            (&pod2, "10.99.0.1"),
        ] {
            let (ok, out) = from.exec("ping", &["-c", "1", "-W", "5", to]);
            assert!(ok, "ping {to} from {}: {out}", from.name);
        }
        let (ok, out) = node.exec("ping", &["-c", "1", "-W", "5", "10.10.0.11"]);
        assert!(ok, "ping pod from node: {out}");
    } else {
        mockcloud::ci::skip(
            "the plugin's connectivity check",
            "ping is not installed (package iputils-ping)",
        );
    }

    Invocation::new("CHECK", &with_prev(&daemon, &r1))
        .container("ctr1")
        .pod("default", "web-0")
        .netns(Some(&pod1.path()))
        .in_node(&node)
        .run()
        .ok();

    let del1 = Invocation::new("DEL", &with_prev(&daemon, &r1))
        .container("ctr1")
        .pod("default", "web-0")
        .netns(Some(&pod1.path()))
        .in_node(&node);
    del1.run().ok();
    assert!(!pod1.link_names().contains(&"eth0".to_owned()));
    assert!(!node.link_names().contains(&veth1));
    assert!(rules_for(&node, "10.10.0.11").is_empty());
    assert!(
        node.ip_json(&["route", "show"])
            .iter()
            .all(|r| r["dst"] != "10.10.0.11")
    );
    assert_eq!(cache_files(&daemon), vec!["ctr2@eth0.json"]);
    // Repeated DEL succeeds and leaves pod 2 alone.
    del1.run().ok();
    assert_host_wired(&node, "10.10.0.12", &veth2, Some("2"));
    assert_eq!(daemon.releases().len(), 2);

    Invocation::new("DEL", &main_config(&daemon, "1.1.0"))
        .container("ctr2")
        .pod("default", "web-1")
        .netns(Some(&pod2.path()))
        .in_node(&node)
        .run()
        .ok();
    assert!(
        node.ip_json(&["rule", "show"])
            .iter()
            .all(|r| r["priority"] != 1536 && r["priority"] != 512)
    );
    assert!(cache_files(&daemon).is_empty());
    assert!(daemon.held().is_empty());
}

#[test]
fn primary_eni_ips_get_the_to_rule_only_and_old_configs_work() {
    if !netns_available("primary_eni_ips_get_the_to_rule_only_and_old_configs_work") {
        return;
    }
    let daemon = FakeDaemon::start(&ips(&["10.10.0.21"]));
    let node = node();
    let pod = Netns::new("pod");
    let result = Invocation::new("ADD", &main_config(&daemon, "0.4.0"))
        .container("old1")
        .pod("default", "legacy")
        .netns(Some(&pod.path()))
        .in_node(&node)
        .run()
        .ok();
    assert_eq!(result["cniVersion"], "0.4.0");
    assert_eq!(result["ips"][0]["version"], "4");
    assert_host_wired(&node, "10.10.0.21", &veth_name("legacy"), None);
    let mut del = main_config(&daemon, "0.4.0");
    del["prevResult"] = result;
    Invocation::new("DEL", &del)
        .container("old1")
        .pod("default", "legacy")
        .netns(Some(&pod.path()))
        .in_node(&node)
        .run()
        .ok();
    assert!(!node.link_names().contains(&veth_name("legacy")));
    assert!(
        rules_for(&node, "10.10.0.21").is_empty(),
        "the `to` rule went"
    );

    // A pod an earlier plugin version wired (no `to` rule on eth0) is torn down all the same.
    let pod = Netns::new("pod");
    let result = Invocation::new("ADD", &main_config(&daemon, "1.1.0"))
        .container("old2")
        .pod("default", "legacy")
        .netns(Some(&pod.path()))
        .in_node(&node)
        .run()
        .ok();
    node.ip(&["rule", "del", "priority", "512", "to", "10.10.0.21"]);
    let mut del = main_config(&daemon, "1.1.0");
    del["prevResult"] = result;
    Invocation::new("DEL", &del)
        .container("old2")
        .pod("default", "legacy")
        .netns(Some(&pod.path()))
        .in_node(&node)
        .run()
        .ok();
    assert!(!node.link_names().contains(&veth_name("legacy")));
    assert!(rules_for(&node, "10.10.0.21").is_empty());
}

#[test]
fn check_detects_removed_routes_neighbours_and_rules() {
    if !netns_available("check_detects_removed_routes_neighbours_and_rules") {
        return;
    }
    let daemon = FakeDaemon::start(&ips(&["10.10.0.31"]));
    daemon.set_route_table(3);
    let node = node();
    let pod = Netns::new("pod");
    let result = add(&daemon, &node, &pod, "chk", "checked");
    let check = Invocation::new("CHECK", &with_prev(&daemon, &result))
        .container("chk")
        .pod("default", "checked")
        .netns(Some(&pod.path()))
        .in_node(&node);
    check.run().ok();

    pod.ip(&["route", "del", "default"]);
    let err = check.run().err(102);
    assert!(
        err["msg"].as_str().unwrap().contains("default route"),
        "{err}"
    );
    pod.ip(&[
        "route",
        "add",
        "default",
        "via",
        "169.254.1.1",
        "dev",
        "eth0",
        "onlink",
    ]);
    check.run().ok();

    node.ip(&["route", "del", "10.10.0.31/32"]);
    let err = check.run().err(102);
    assert!(err["msg"].as_str().unwrap().contains("host route"), "{err}");
    node.ip(&[
        "route",
        "add",
        "10.10.0.31/32",
        "dev",
        &veth_name("checked"),
        "scope",
        "link",
    ]);
    check.run().ok();

    node.ip(&[
        "rule",
        "del",
        "from",
        "10.10.0.31",
        "lookup",
        "3",
        "priority",
        "1536",
    ]);
    let err = check.run().err(102);
    assert!(err["msg"].as_str().unwrap().contains("1536"), "{err}");
    node.ip(&[
        "rule",
        "add",
        "from",
        "10.10.0.31",
        "lookup",
        "3",
        "priority",
        "1536",
    ]);

    pod.ip(&["neigh", "del", "169.254.1.1", "dev", "eth0"]);
    let err = check.run().err(102);
    assert!(err["msg"].as_str().unwrap().contains("neighbour"), "{err}");
    assert!(daemon.calls().iter().any(|c| matches!(c, Call::Check(_))));
}

#[test]
fn del_without_the_daemon_tears_down_from_the_cache() {
    if !netns_available("del_without_the_daemon_tears_down_from_the_cache") {
        return;
    }
    let mut daemon = FakeDaemon::start(&ips(&["10.10.0.41", "10.10.0.42"]));
    daemon.set_route_table(2);
    let node = node();
    let pod_a = Netns::new("pod");
    add(&daemon, &node, &pod_a, "down-a", "alpha");
    let pod_b = Netns::new("pod");
    let pod_b_path = pod_b.path();
    add(&daemon, &node, &pod_b, "down-b", "beta");
    daemon.stop();

    // No prevResult, no daemon: the cache says what to remove.
    Invocation::new("DEL", &main_config(&daemon, "1.1.0"))
        .container("down-a")
        .pod("default", "alpha")
        .netns(Some(&pod_a.path()))
        .in_node(&node)
        .run()
        .ok();
    assert!(!pod_a.link_names().contains(&"eth0".to_owned()));
    assert!(!node.link_names().contains(&veth_name("alpha")));
    assert!(rules_for(&node, "10.10.0.41").is_empty());

    // The pod's netns is already gone: DEL still succeeds and removes the rules.
    drop(pod_b);
    Invocation::new("DEL", &main_config(&daemon, "1.1.0"))
        .container("down-b")
        .pod("default", "beta")
        .netns(Some(&pod_b_path))
        .in_node(&node)
        .run()
        .ok();
    assert!(rules_for(&node, "10.10.0.42").is_empty());
    assert!(!node.link_names().contains(&veth_name("beta")));
    assert!(cache_files(&daemon).is_empty());
    // And again, with no netns at all.
    Invocation::new("DEL", &main_config(&daemon, "1.1.0"))
        .container("down-b")
        .pod("default", "beta")
        .netns(None)
        .in_node(&node)
        .run()
        .ok();
}

#[test]
fn wiring_failure_releases_the_ip() {
    if !netns_available("wiring_failure_releases_the_ip") {
        return;
    }
    let daemon = FakeDaemon::start(&ips(&["10.10.0.51"]));
    let node = node();
    let pod = Netns::new("pod");
    // Something that is not ours holds the host veth's name.
    let name = veth_name("blocked");
    node.ip(&["link", "add", &name, "type", "bridge"]);
    let err = Invocation::new("ADD", &main_config(&daemon, "1.1.0"))
        .container("blk")
        .pod("default", "blocked")
        .netns(Some(&pod.path()))
        .in_node(&node)
        .run()
        .err(100);
    assert!(err["msg"].as_str().unwrap().contains("not a veth"), "{err}");
    assert!(
        err["details"].as_str().unwrap().contains("released"),
        "{err}"
    );
    let releases = daemon.releases();
    assert_eq!(releases.len(), 1);
    assert_eq!(releases[0].container_id, "blk");
    assert!(daemon.held().is_empty());
    assert!(!pod.link_names().contains(&"eth0".to_owned()));
    assert!(
        node.link_names().contains(&name),
        "the bridge is not ours to delete"
    );
    assert!(cache_files(&daemon).is_empty());
}

#[test]
fn add_refuses_an_existing_interface_before_allocating() {
    if !netns_available("add_refuses_an_existing_interface_before_allocating") {
        return;
    }
    let daemon = FakeDaemon::start(&ips(&["10.10.0.61"]));
    let node = node();
    let pod = Netns::new("pod");
    pod.ip(&[
        "link", "add", "eth0", "type", "veth", "peer", "name", "other0",
    ]);
    let err = Invocation::new("ADD", &main_config(&daemon, "1.1.0"))
        .container("dup")
        .netns(Some(&pod.path()))
        .in_node(&node)
        .run()
        .err(100);
    assert!(
        err["msg"].as_str().unwrap().contains("already exists"),
        "{err}"
    );
    assert_eq!(daemon.allocations(), 0);

    // A netns path that does not exist: invalid environment, nothing allocated.
    Invocation::new("ADD", &main_config(&daemon, "1.1.0"))
        .container("nons")
        .netns(Some("/run/netns/eniipam-does-not-exist"))
        .in_node(&node)
        .run()
        .err(4);
    assert_eq!(daemon.allocations(), 0);
}

#[test]
fn main_role_appends_to_prev_result() {
    if !netns_available("main_role_appends_to_prev_result") {
        return;
    }
    let daemon = FakeDaemon::start(&ips(&["10.10.0.71"]));
    let node = node();
    let pod = Netns::new("pod");
    let mut conf = main_config(&daemon, "1.1.0");
    conf["prevResult"] = json!({"cniVersion": "1.1.0",
        "interfaces": [{"name": "lo", "sandbox": pod.path()}],
        "ips": [{"address": "127.0.0.1/8", "interface": 0}],
        "dns": {"nameservers": ["10.96.0.10"]}});
    let out = Invocation::new("ADD", &conf)
        .container("chain")
        .pod("default", "chained")
        .netns(Some(&pod.path()))
        .in_node(&node)
        .run()
        .ok();
    assert_eq!(out["interfaces"][0]["name"], "lo");
    assert_eq!(out["interfaces"][2]["name"], "eth0");
    assert_eq!(out["ips"][0]["address"], "127.0.0.1/8");
    assert_eq!(out["ips"][1]["interface"], 2);
    assert_eq!(out["dns"]["nameservers"][0], "10.96.0.10");
}

#[test]
fn chained_with_portmap() {
    if !netns_available("chained_with_portmap") {
        return;
    }
    let portmap = "/usr/lib/cni/portmap";
    if !std::path::Path::new(portmap).exists() {
        mockcloud::ci::skip(
            "chained_with_portmap",
            &format!("{portmap} is absent (package containernetworking-plugins)"),
        );
        return;
    }
    let daemon = FakeDaemon::start(&ips(&["10.10.0.81"]));
    let node = node();
    let pod = Netns::new("pod");
    // Debian's portmap speaks up to 1.0.0.
    let ours = Invocation::new("ADD", &main_config(&daemon, "1.0.0"))
        .container("pm")
        .pod("default", "mapped")
        .netns(Some(&pod.path()))
        .in_node(&node)
        .run()
        .ok();
    let pm_conf = json!({
        "cniVersion": "1.0.0",
        "name": "eniipam-test",
        "type": "portmap",
        "capabilities": {"portMappings": true},
        "runtimeConfig": {"portMappings": [{"hostPort": 18080, "containerPort": 80, "protocol": "tcp"}]},
        "prevResult": ours,
    });
    let pm = Invocation::new("ADD", &pm_conf)
        .container("pm")
        .pod("default", "mapped")
        .netns(Some(&pod.path()))
        .in_node(&node)
        .binary(portmap)
        .run();
    if pm.code != 0 && pm.stdout.contains("iptables") {
        mockcloud::ci::skip(
            "chained_with_portmap",
            &format!("portmap needs iptables here: {}", pm.stdout),
        );
        return;
    }
    let chained = pm.ok();
    assert_eq!(chained, ours, "portmap passes eniipam's result through");
    let (_, nat) = node.exec("iptables", &["-t", "nat", "-S"]);
    assert!(nat.contains("18080"), "portmap installed its DNAT: {nat}");

    // Teardown in reverse order, as a runtime does.
    Invocation::new("DEL", &pm_conf)
        .container("pm")
        .pod("default", "mapped")
        .netns(Some(&pod.path()))
        .in_node(&node)
        .binary(portmap)
        .run()
        .ok();
    let mut del = main_config(&daemon, "1.0.0");
    del["prevResult"] = chained;
    Invocation::new("DEL", &del)
        .container("pm")
        .pod("default", "mapped")
        .netns(Some(&pod.path()))
        .in_node(&node)
        .run()
        .ok();
    assert!(!node.link_names().contains(&veth_name("mapped")));
}
