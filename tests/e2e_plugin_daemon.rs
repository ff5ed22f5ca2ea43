//! The real plugin binary against the real daemon (on mockcloud): pods wired in network namespaces the
//! test makes (a "node" namespace and two pods; nothing in the machine's own namespace), IPs agreeing
//! with the daemon, pods reaching each other, then CHECK, GC, STATUS, DEL, and DEL with the daemon gone.

mod cni_support;
#[path = "daemon_support/mod.rs"]
mod daemon_support;

use std::net::Ipv4Addr;

use cni_support::{Invocation, Netns, can_use_netns};
use eniipam::model::AttachmentKey;
use serde_json::{Value, json};

fn config(socket: &std::path::Path, cache: &std::path::Path) -> Value {
    json!({
        "cniVersion": "1.1.0",
        "name": "eniipam-e2e",
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_plugin_real_daemon_in_namespaces() {
    if !can_use_netns() {
        mockcloud::ci::skip(
            "real_plugin_real_daemon_in_namespaces",
            "needs root and iproute2",
        );
        return;
    }
    let mock = mockcloud::MockCloud::start(mockcloud::Config {
        default_instance_type: "c5.4xlarge".into(),
        ..mockcloud::Config::fast()
    })
    .await
    .unwrap();
    let dir = daemon_support::TempDir::new("e2e");
    let d = daemon_support::start(daemon_support::config(&mock, &dir.0)).await;
    let cache = dir.0.join("cni-cache");
    let conf = config(&d.socket_path, &cache);

    let node = Netns::new("node");
    node.enable_forwarding();
    node.ip(&["addr", "add", "10.99.0.1/32", "dev", "lo"]);
    let pods = [Netns::new("pod"), Netns::new("pod")];
    let mut ips = Vec::new();
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
        let addr = r["ips"][0]["address"].as_str().unwrap().to_owned();
        let ip: Ipv4Addr = addr.trim_end_matches("/32").parse().unwrap();
        // The daemon holds exactly what the plugin printed, recorded durably, on an ENI EC2 agrees on.
        let alloc = d
            .pool
            .allocation(&AttachmentKey::new(format!("ctr{i}"), "eth0"))
            .expect("daemon holds it");
        assert_eq!(alloc.ip, ip);
        assert!(daemon_support::ec2_pod_ips(&mock).contains(&ip));
        let stored = d.store.load().await.unwrap();
        assert!(
            stored
                .assignments
                .iter()
                .any(|a| a.ip == ip && a.netns == pod.path())
        );
        // The pod: ip/32 and a default route via 169.254.1.1.
        let addrs = pod.ip(&["-j", "addr", "show", "dev", "eth0"]);
        assert!(addrs.contains(&format!("\"local\":\"{ip}\"")), "{addrs}");
        let routes = pod.ip(&["-j", "route", "show", "default"]);
        assert!(routes.contains("169.254.1.1"), "{routes}");
        // The node: a /32 route to the pod; a pod on a secondary ENI also gets the policy rule
        // for the ENI's table, a pod on eth0 (the default's first pods) leaves by the main table.
        let host = node.ip(&["-j", "route", "show", &format!("{ip}/32")]);
        assert!(host.contains("\"dev\""), "{host}");
        let rules = node.ip(&["-j", "rule", "show"]);
        let from_rule = rules.contains(&format!("\"src\":\"{ip}\""));
        assert_eq!(from_rule, alloc.device_index > 0, "{rules}");
        ips.push(ip);
    }
    assert_ne!(ips[0], ips[1]);

    if std::process::Command::new("ping")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        for (from, to) in [
            (&pods[0], ips[1].to_string()),
            (&pods[1], ips[0].to_string()),
            (&pods[0], "10.99.0.1".to_owned()),
        ] {
            let (ok, out) = from.exec("ping", &["-c", "1", "-W", "2", &to]);
            assert!(ok, "ping {to}: {out}");
        }
    } else {
        mockcloud::ci::skip(
            "real_plugin_real_daemon_in_namespaces' connectivity check",
            "ping is not installed (package iputils-ping)",
        );
    }

    // CHECK passes; STATUS is ready.
    plugin(
        Invocation::new("CHECK", &{
            let mut c = conf.clone();
            c["prevResult"] =
                json!({"cniVersion": "1.1.0", "ips": [{"address": format!("{}/32", ips[0])}]});
            c
        })
        .container("ctr0")
        .pod("default", "web-0")
        .netns(Some(&pods[0].path()))
        .in_node(&node),
    )
    .await
    .ok();
    plugin(Invocation::new("STATUS", &conf).in_node(&node))
        .await
        .ok();

    // DEL pod 0: released in the daemon (cooling), wiring gone. A repeated DEL succeeds.
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
    assert!(
        d.pool
            .allocation(&AttachmentKey::new("ctr0", "eth0"))
            .is_none()
    );
    let host = node.ip(&["-j", "route", "show", &format!("{}/32", ips[0])]);
    assert_eq!(host.trim(), "[]", "host route removed");

    // GC with only pod 1 valid leaves pod 1 alone.
    let mut gc = conf.clone();
    gc["cni.dev/valid-attachments"] = json!([{"containerID": "ctr1", "ifname": "eth0"}]);
    plugin(Invocation::new("GC", &gc).in_node(&node)).await.ok();
    assert_eq!(
        d.pool
            .allocation(&AttachmentKey::new("ctr1", "eth0"))
            .unwrap()
            .ip,
        ips[1]
    );

    // The daemon goes away: DEL still tears pod 1 down from the cache; STATUS says unavailable (50).
    d.shutdown().await;
    plugin(
        Invocation::new("DEL", &conf)
            .container("ctr1")
            .pod("default", "web-1")
            .netns(Some(&pods[1].path()))
            .in_node(&node),
    )
    .await
    .ok();
    let host = node.ip(&["-j", "route", "show", &format!("{}/32", ips[1])]);
    assert_eq!(host.trim(), "[]");
    plugin(Invocation::new("STATUS", &conf).in_node(&node))
        .await
        .err(50);
}
