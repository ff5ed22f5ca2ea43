//! Issue 26: the real plugin binary against the real daemon (on mockcloud, its shipped IAM policy
//! enforced) with `ip_family = ipv6` and `dual`: pods wired in network namespaces the test makes, their
//! `/128` from the node's /80 as the daemon recorded it and as EC2 delegated it, pods reaching each
//! other over IPv6 through the node, then CHECK, GC and DEL.

mod cni_support;
#[path = "daemon_support/mod.rs"]
mod daemon_support;

use std::net::{Ipv4Addr, Ipv6Addr};

use cni_support::{Invocation, Netns, can_use_netns};
use eniipam::ipv6::IpFamily;
use eniipam::model::AttachmentKey;
use serde_json::{Value, json};

fn config(socket: &std::path::Path, cache: &std::path::Path) -> Value {
    json!({
        "cniVersion": "1.1.0",
        "name": "eniipam-e2e6",
        "type": "eniipam",
        "socket": socket,
        "cache_dir": cache,
        "timeout_ms": 10000,
    })
}

async fn plugin(inv: Invocation) -> cni_support::PluginRun {
    tokio::task::spawn_blocking(move || inv.run())
        .await
        .unwrap()
}

fn has_ping() -> bool {
    std::process::Command::new("ping")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The addresses the plugin printed, by family.
fn result_ips(r: &Value) -> (Option<Ipv4Addr>, Option<Ipv6Addr>) {
    let mut v4 = None;
    let mut v6 = None;
    for ip in r["ips"].as_array().expect("ips") {
        let addr = ip["address"].as_str().unwrap();
        if let Some(a) = addr.strip_suffix("/32") {
            v4 = Some(a.parse().unwrap());
        } else if let Some(a) = addr.strip_suffix("/128") {
            v6 = Some(a.parse().unwrap());
        } else {
            panic!("unexpected address {addr}");
        }
    }
    (v4, v6)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv6_pods_real_plugin_real_daemon() {
    scenario("ipv6_pods_real_plugin_real_daemon", IpFamily::Ipv6).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dual_stack_pods_real_plugin_real_daemon() {
    scenario("dual_stack_pods_real_plugin_real_daemon", IpFamily::Dual).await;
}

async fn scenario(test: &str, family: IpFamily) {
    if !can_use_netns() {
        mockcloud::ci::skip(test, "needs root and iproute2");
        return;
    }
    let mock = mockcloud::MockCloud::start(mockcloud::Config {
        default_instance_type: "c5.4xlarge".into(),
        ..mockcloud::Config::fast()
    })
    .await
    .unwrap();
    let dir = daemon_support::TempDir::new("e2e6");
    let d = daemon_support::start(eniipam::config::DaemonConfig {
        ip_family: family,
        ..daemon_support::config(&mock, &dir.0)
    })
    .await;
    let prefix = d.ipam().ipv6().expect("an /80").prefix();
    let inst = mock.instance(&mock.default_instance().instance_id).unwrap();
    assert!(
        inst.enis.iter().any(|e| e.ipv6_prefixes.contains(&prefix)),
        "EC2 delegated {prefix} to the node"
    );
    let cache = dir.0.join("cni-cache");
    let conf = config(&d.socket_path, &cache);

    let node = Netns::new("node6");
    node.enable_forwarding();
    node.enable_ipv6_forwarding();
    let pods = [Netns::new("pod6"), Netns::new("pod6")];
    let mut v6s = Vec::new();
    let mut v4s = Vec::new();
    for (i, pod) in pods.iter().enumerate() {
        let r = plugin(
            Invocation::new("ADD", &conf)
                .container(&format!("ctr{i}"))
                .pod("default", &format!("web-{i}"))
                .netns(Some(&pod.path()))
                .in_node(&node),
        )
        .await
        .ok();
        let (v4, v6) = result_ips(&r);
        let v6 = v6.expect("an IPv6 in the result");
        assert!(prefix.contains(&v6), "{v6} outside {prefix}");
        assert_eq!(v4.is_some(), family == IpFamily::Dual, "{r}");
        let key = AttachmentKey::new(format!("ctr{i}"), "eth0");
        // The daemon holds exactly what the plugin printed, recorded with the pod's netns.
        assert_eq!(d.ipam().check6(&key).unwrap(), Some(v6));
        let stored = d.store.load_ipv6().await.unwrap();
        assert!(
            stored
                .assignments
                .iter()
                .any(|a| a.ip == v6 && a.netns == pod.path())
        );
        if let Some(v4) = v4 {
            assert_eq!(d.pool.allocation(&key).unwrap().ip, v4);
            v4s.push(v4);
        }
        // The pod: its /128, usable at once (not tentative), and the default route via fe80::1.
        let links = pod.ip_json(&["-6", "addr", "show", "dev", "eth0"]);
        let mine = links
            .iter()
            .flat_map(|l| l["addr_info"].as_array().cloned().unwrap_or_default())
            .find(|a| a["local"] == v6.to_string())
            .unwrap_or_else(|| panic!("{v6} not on the pod's eth0: {links:?}"));
        assert_eq!(mine["prefixlen"], 128, "{mine}");
        assert!(mine.get("tentative").is_none(), "{mine}");
        let routes = pod.ip(&["-6", "-j", "route", "show", "default"]);
        assert!(routes.contains("fe80::1"), "{routes}");
        // The node: a /128 route to the pod.
        let host = node.ip(&["-6", "-j", "route", "show", &format!("{v6}/128")]);
        assert!(host.contains("\"dev\""), "{host}");
        v6s.push(v6);
    }
    assert_ne!(v6s[0], v6s[1]);

    if has_ping() {
        let mut targets = vec![(0, 1, v6s[1].to_string()), (1, 0, v6s[0].to_string())];
        if let [a, b] = v4s[..] {
            targets.push((0, 1, b.to_string()));
            targets.push((1, 0, a.to_string()));
        }
        for (from, _, to) in targets {
            let (ok, out) = pods[from].exec("ping", &["-c", "1", "-W", "2", &to]);
            assert!(ok, "ping {to}: {out}");
        }
    } else {
        mockcloud::ci::skip(test, "ping is not installed (package iputils-ping)");
    }

    // CHECK with the result as prevResult passes.
    let mut prev_ips = vec![json!({"address": format!("{}/128", v6s[0])})];
    if let Some(v4) = v4s.first() {
        prev_ips.push(json!({"address": format!("{v4}/32")}));
    }
    plugin(
        Invocation::new("CHECK", &{
            let mut c = conf.clone();
            c["prevResult"] = json!({"cniVersion": "1.1.0", "ips": prev_ips});
            c
        })
        .container("ctr0")
        .pod("default", "web-0")
        .netns(Some(&pods[0].path()))
        .in_node(&node),
    )
    .await
    .ok();

    // DEL pod 0: both families released in the daemon and the file, the host route gone.
    for _ in 0..2 {
        plugin(
            Invocation::new("DEL", &conf)
                .container("ctr0")
                .pod("default", "web-0")
                .netns(Some(&pods[0].path()))
                .in_node(&node),
        )
        .await
        .ok();
    }
    let k0 = AttachmentKey::new("ctr0", "eth0");
    assert_eq!(d.ipam().check6(&k0).unwrap(), None);
    assert!(d.pool.allocation(&k0).is_none());
    let stored = d.store.load_ipv6().await.unwrap();
    assert!(stored.assignments.iter().all(|a| a.ip != v6s[0]));
    let host = node.ip(&["-6", "-j", "route", "show", &format!("{}/128", v6s[0])]);
    assert_eq!(host.trim(), "[]", "host route removed");

    // GC with only pod 1 valid leaves pod 1 alone; with none valid it releases pod 1.
    let mut gc = conf.clone();
    gc["cni.dev/valid-attachments"] = json!([{"containerID": "ctr1", "ifname": "eth0"}]);
    plugin(Invocation::new("GC", &gc).in_node(&node)).await.ok();
    let k1 = AttachmentKey::new("ctr1", "eth0");
    assert_eq!(d.ipam().check6(&k1).unwrap(), Some(v6s[1]));
    gc["cni.dev/valid-attachments"] = json!([]);
    plugin(Invocation::new("GC", &gc).in_node(&node)).await.ok();
    assert_eq!(d.ipam().check6(&k1).unwrap(), None, "GC released pod 1");
    assert!(d.pool.allocation(&k1).is_none());
    d.shutdown().await;
}
