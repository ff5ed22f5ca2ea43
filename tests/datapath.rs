//! The data-path matrix (issue 16) on the emulated VPC: the real `eniipamd` in each node namespace
//! (host routing and host rules on), pods made by the real plugin with the shipped conflist (and
//! `portmap` for hostPorts), real TCP packets, and EC2's source/destination check counting drops
//! (every case asserts none). Nodes run strict `rp_filter`: the daemon must loosen eth0 itself.
//!
//! | case | pod on eth0 | pod on a secondary ENI |
//! | --- | --- | --- |
//! | pod ↔ pod, same node | `same_node_eth0` | `same_node_secondary` |
//! | pod ↔ pod, across nodes | `across_nodes_eth0` | `across_nodes_secondary` |
//! | node → pod (probes) | `node_to_pod_eth0` | `node_to_pod_secondary` |
//! | pod → internet, SNAT | `snat_eth0` | `snat_secondary` |
//! | pod → internet, NAT gateway | `nat_gateway_eth0` | `nat_gateway_secondary` |
//! | NodePort via eth0 | `node_port_eth0` | `node_port_secondary` |
//! | hostPort (portmap) | `host_port_eth0` | `host_port_secondary` |
//! | pod IP reused | `reused_ip_eth0` | `reused_ip_secondary` |
//! | ENI released, re-created | — | `recreated_eni_secondary` |
//! | eth0 pod ↔ secondary-ENI pod, one node (strict, loose `rp_filter`) | `mixed_same_node_strict_rp_filter` | `mixed_same_node_loose_rp_filter` |
//! | pod → internet, SNAT, NodePort support off, `--prepare-host` | — | `snat_secondary_node_port_off_prepared_host` |
//! | first pod of a new ENI, traffic right after ADD | — | `first_pod_on_new_eni_routes_at_once` |
//!
//! Plus: the NodePort case fails without the connmark rule (and the daemon heals it), and the rules
//! survive daemon restarts, follow a knob change and go with `--uninstall-host-rules`.
//!
//! Pods on eth0 are served from eth0's secondary IPs (`use_primary_eni`, the default). Needs root, `ip`, `nft`,
//! `iptables`, `nsenter` and `/usr/lib/cni/portmap`; build the plugin first (`cargo build
//! --workspace --bins`). Skipped with a notice where the lab cannot run.

mod bins;
mod datapath_support;

use datapath_support::*;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use vpclab::{EchoOptions, Egress, INTERNET_SERVER, NAT_GATEWAY_PUBLIC_IP};

macro_rules! matrix {
    ($case:ident: $eth0:ident, $secondary:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $eth0() {
            $case(stringify!($eth0), Placement::Eth0).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $secondary() {
            $case(stringify!($secondary), Placement::SecondaryEni).await;
        }
    };
}

matrix!(same_node: same_node_eth0, same_node_secondary);
matrix!(across_nodes: across_nodes_eth0, across_nodes_secondary);
matrix!(node_to_pod: node_to_pod_eth0, node_to_pod_secondary);
matrix!(snat: snat_eth0, snat_secondary);
matrix!(nat_gateway: nat_gateway_eth0, nat_gateway_secondary);
matrix!(node_port: node_port_eth0, node_port_secondary);
matrix!(host_port: host_port_eth0, host_port_secondary);
matrix!(reused_ip: reused_ip_eth0, reused_ip_secondary);

async fn same_node(test: &str, placement: Placement) {
    let Some(c) = Cluster::start(test, Egress::InternetGateway).await else {
        return;
    };
    let d = Daemon::start(&c, &c.a.instance_id, placement, &[]).await;
    let p1 = d.add_pod(&c, "web-1", PodOptions::default()).await;
    let p2 = d.add_pod(&c, "web-2", PodOptions::default()).await;
    p1.assert_placed(placement);
    p2.assert_placed(placement);
    let (_s1, _s2) = (serve(&p1.ns), serve(&p2.ns));
    assert_eq!(
        reaches(&p1.ns, p2.ip, ECHO_PORT).await.server_saw.ip(),
        p1.ip
    );
    assert_eq!(
        reaches(&p2.ns, p1.ip, ECHO_PORT).await.server_saw.ip(),
        p2.ip
    );
    c.assert_no_drops().await;
}

async fn across_nodes(test: &str, placement: Placement) {
    let Some(c) = Cluster::start(test, Egress::InternetGateway).await else {
        return;
    };
    let da = Daemon::start(&c, &c.a.instance_id, placement, &[]).await;
    let db = Daemon::start(&c, &c.b.instance_id, placement, &[]).await;
    let pa = da.add_pod(&c, "web-a", PodOptions::default()).await;
    let pb = db.add_pod(&c, "web-b", PodOptions::default()).await;
    pa.assert_placed(placement);
    pb.assert_placed(placement);
    let (_sa, _sb) = (serve(&pa.ns), serve(&pb.ns));
    // No SNAT inside the VPC: each side sees the other pod's own address.
    assert_eq!(
        reaches(&pa.ns, pb.ip, ECHO_PORT).await.server_saw.ip(),
        pa.ip
    );
    assert_eq!(
        reaches(&pb.ns, pa.ip, ECHO_PORT).await.server_saw.ip(),
        pb.ip
    );
    // And a node reaches a pod on the other node (and its reply goes back by the pod's ENI).
    let node_b = c.node_ns(&c.b.instance_id);
    assert_eq!(
        reaches(&node_b, pa.ip, ECHO_PORT).await.server_saw.ip(),
        c.b.private_ip
    );
    c.assert_no_drops().await;
}

async fn node_to_pod(test: &str, placement: Placement) {
    let Some(c) = Cluster::start(test, Egress::InternetGateway).await else {
        return;
    };
    let d = Daemon::start(&c, &c.a.instance_id, placement, &[]).await;
    let p = d.add_pod(&c, "probed", PodOptions::default()).await;
    p.assert_placed(placement);
    let _s = serve(&p.ns);
    // The kubelet's probes come from the node itself.
    let node = c.node_ns(&c.a.instance_id);
    assert_eq!(
        reaches(&node, p.ip, ECHO_PORT).await.server_saw.ip(),
        c.a.private_ip
    );
    // And the pod reaches a host-network server on its node.
    let _on_node = serve(&node);
    assert_eq!(
        reaches(&p.ns, c.a.private_ip, ECHO_PORT)
            .await
            .server_saw
            .ip(),
        p.ip
    );
    c.assert_no_drops().await;
}

async fn snat(test: &str, placement: Placement) {
    let Some(c) = Cluster::start(test, Egress::InternetGateway).await else {
        return;
    };
    let d = Daemon::start(&c, &c.a.instance_id, placement, &[]).await;
    let p = d.add_pod(&c, "egress", PodOptions::default()).await;
    p.assert_placed(placement);
    let _internet = serve(c.lab.internet());
    let _on_b = serve(&c.node_ns(&c.b.instance_id));
    // Outside the VPC: SNAT to eth0's primary IP, the address the IGW lets through.
    let r = reaches(&p.ns, INTERNET_SERVER, ECHO_PORT).await;
    assert_eq!(r.server_saw.ip(), c.a.private_ip);
    // Several connections, each translated (fully random ports).
    for _ in 0..3 {
        let r = reaches(&p.ns, INTERNET_SERVER, ECHO_PORT).await;
        assert_eq!(r.server_saw.ip(), c.a.private_ip);
    }
    // Inside the VPC: the pod's own address.
    assert_eq!(
        reaches(&p.ns, c.b.private_ip, ECHO_PORT)
            .await
            .server_saw
            .ip(),
        p.ip
    );
    assert_eq!(c.lab.igw_drops().await.expect("igw").egress_not_public, 0);
    c.assert_no_drops().await;
    // The daemon loosened the primary interface's reverse-path filter (the lab starts it strict).
    assert_eq!(
        d.ns.read_sysctl("net/ipv4/conf/eth0/rp_filter")
            .await
            .expect("sysctl"),
        "2"
    );
    assert!(
        d.ip_rules()
            .await
            .contains("1024:\tfrom all fwmark 0x80/0x80 lookup main"),
        "{}",
        d.ip_rules().await
    );
}

async fn nat_gateway(test: &str, placement: Placement) {
    let Some(c) = Cluster::start(test, Egress::NatGateway).await else {
        return;
    };
    let d = Daemon::start(
        &c,
        &c.a.instance_id,
        placement,
        &[("ENIIPAM_EXTERNAL_SNAT", "true")],
    )
    .await;
    let rules = d.rules().await.expect("the NodePort rules stay");
    assert!(
        !rules.contains("snat to"),
        "no SNAT with external_snat:\n{rules}"
    );
    let p = d.add_pod(&c, "egress", PodOptions::default()).await;
    p.assert_placed(placement);
    let _internet = serve(c.lab.internet());
    let _on_b = serve(&c.node_ns(&c.b.instance_id));
    // The pod leaves with its own address (by its own ENI); the NAT gateway translates.
    let r = reaches(&p.ns, INTERNET_SERVER, ECHO_PORT).await;
    assert_eq!(r.server_saw.ip(), NAT_GATEWAY_PUBLIC_IP);
    assert_eq!(
        reaches(&p.ns, c.b.private_ip, ECHO_PORT)
            .await
            .server_saw
            .ip(),
        p.ip
    );
    c.assert_no_drops().await;
}

async fn node_port(test: &str, placement: Placement) {
    let Some(c) = Cluster::start(test, Egress::InternetGateway).await else {
        return;
    };
    let d = Daemon::start(&c, &c.a.instance_id, placement, &[]).await;
    let p = d.add_pod(&c, "svc", PodOptions::default()).await;
    p.assert_placed(placement);
    let _s = serve(&p.ns);
    d.add_node_port(p.ip).await;
    // A client on another node → node A's eth0 primary IP:NodePort → DNAT → the pod; the reply
    // gets back (un-DNATed to node A's address, out of eth0).
    let client = c.node_ns(&c.b.instance_id);
    for _ in 0..3 {
        let r = reaches(&client, c.a.private_ip, NODE_PORT).await;
        assert_eq!(
            r.server_saw.ip(),
            c.b.private_ip,
            "no masquerade (Local policy)"
        );
    }
    c.assert_no_drops().await;
}

async fn host_port(test: &str, placement: Placement) {
    let Some(c) = Cluster::start(test, Egress::InternetGateway).await else {
        return;
    };
    let d = Daemon::start(&c, &c.a.instance_id, placement, &[]).await;
    let p = d
        .add_pod(
            &c,
            "hostport",
            PodOptions {
                host_port: Some(HOST_PORT),
                ..Default::default()
            },
        )
        .await;
    p.assert_placed(placement);
    let _s = serve(&p.ns);
    assert!(
        d.iptables_nat()
            .await
            .contains(&format!("--dport {HOST_PORT}")),
        "portmap's DNAT"
    );
    let client = c.node_ns(&c.b.instance_id);
    let r = reaches(&client, c.a.private_ip, HOST_PORT).await;
    assert_eq!(r.server_saw.ip(), c.b.private_ip);
    c.assert_no_drops().await;
    d.del_pod(&p).await;
    assert!(
        !d.iptables_nat()
            .await
            .contains(&format!("--dport {HOST_PORT}")),
        "portmap's DEL removed its DNAT"
    );
}

/// Every kind of traffic for `p` on node A: from node B, to node B, to the internet (SNAT),
/// through the NodePort (DNAT rule already in place) and its hostPort (if any).
async fn all_traffic(c: &Cluster, p: &CniPod) {
    let _s = serve(&p.ns);
    let node_b = c.node_ns(&c.b.instance_id);
    let _on_b = serve(&node_b);
    let _internet = serve(c.lab.internet());
    assert_eq!(
        reaches(&node_b, p.ip, ECHO_PORT).await.server_saw.ip(),
        c.b.private_ip
    );
    assert_eq!(
        reaches(&p.ns, c.b.private_ip, ECHO_PORT)
            .await
            .server_saw
            .ip(),
        p.ip
    );
    assert_eq!(
        reaches(&p.ns, INTERNET_SERVER, ECHO_PORT)
            .await
            .server_saw
            .ip(),
        c.a.private_ip
    );
    assert_eq!(
        reaches(&node_b, c.a.private_ip, NODE_PORT)
            .await
            .server_saw
            .ip(),
        c.b.private_ip
    );
    if let Some(port) = p.host_port {
        assert_eq!(
            reaches(&node_b, c.a.private_ip, port).await.server_saw.ip(),
            c.b.private_ip
        );
    }
}

async fn reused_ip(test: &str, placement: Placement) {
    let Some(c) = Cluster::start(test, Egress::InternetGateway).await else {
        return;
    };
    let d = Daemon::start(
        &c,
        &c.a.instance_id,
        placement,
        &[("ENIIPAM_REUSE_COOLDOWN_SECS", "0")],
    )
    .await;
    let with_port = PodOptions {
        host_port: Some(HOST_PORT),
        ..Default::default()
    };
    let old = d.add_pod(&c, "old", with_port).await;
    old.assert_placed(placement);
    d.add_node_port(old.ip).await;
    all_traffic(&c, &old).await;
    d.del_pod(&old).await;
    // A new pod (another name, another sandbox) asks for the same address.
    let new = d
        .add_pod(
            &c,
            "new",
            PodOptions {
                want_ip: Some(old.ip),
                ..with_port
            },
        )
        .await;
    assert_eq!(new.ip, old.ip, "the address is reused");
    new.assert_placed(placement);
    all_traffic(&c, &new).await;
    c.assert_no_drops().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recreated_eni_secondary() {
    let test = "recreated_eni_secondary";
    let Some(c) = Cluster::start(test, Egress::InternetGateway).await else {
        return;
    };
    // No warm IPs: the ENI empties when its only pod goes, and is detached and deleted.
    let d = Daemon::start(
        &c,
        &c.a.instance_id,
        Placement::SecondaryEni,
        &[
            ("ENIIPAM_MIN_IDLE", "0"),
            ("ENIIPAM_MAX_IDLE", "0"),
            ("ENIIPAM_REUSE_COOLDOWN_SECS", "0"),
        ],
    )
    .await;
    let first = d.add_pod(&c, "first", PodOptions::default()).await;
    first.assert_placed(Placement::SecondaryEni);
    d.add_node_port(first.ip).await;
    all_traffic(&c, &first).await;
    c.assert_no_drops().await;
    d.del_pod(&first).await;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    while c
        .mock
        .network_interfaces()
        .iter()
        .any(|e| e.id == first.eni)
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} was not released within 60 s:\n{}",
            first.eni,
            d.tail()
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    c.lab.sync().await.expect("sync");
    assert!(
        c.lab
            .node(&c.a.instance_id)
            .expect("node")
            .link(&first.eni)
            .is_none(),
        "the released ENI's link is gone"
    );
    // A new pod needs a new ENI: another id and MAC, the same device index (and table).
    let second = d
        .add_pod(
            &c,
            "second",
            PodOptions {
                want_ip: None,
                host_port: Some(HOST_PORT),
            },
        )
        .await;
    second.assert_placed(Placement::SecondaryEni);
    assert_ne!(second.eni, first.eni, "a new ENI");
    println!(
        "{} (device {}) replaced {} (device {})",
        second.eni, second.device_index, first.eni, first.device_index
    );
    d.add_node_port(second.ip).await;
    all_traffic(&c, &second).await;
    c.assert_no_drops().await;
}

/// Deleting the connmark rule breaks the NodePort case for a pod on a secondary ENI: the reply
/// leaves by the pod's ENI with node A's address and EC2's check drops it. The daemon puts the rule
/// back at its next check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_port_needs_the_connmark_rule_and_the_daemon_heals_it() {
    let test = "node_port_needs_the_connmark_rule_and_the_daemon_heals_it";
    let Some(c) = Cluster::start(test, Egress::InternetGateway).await else {
        return;
    };
    let d = Daemon::start(
        &c,
        &c.a.instance_id,
        Placement::SecondaryEni,
        &[("ENIIPAM_HOST_RULES_CHECK_SECS", "3")],
    )
    .await;
    let p = d.add_pod(&c, "svc", PodOptions::default()).await;
    p.assert_placed(Placement::SecondaryEni);
    let _s = serve(&p.ns);
    d.add_node_port(p.ip).await;
    let client = c.node_ns(&c.b.instance_id);
    reaches(&client, c.a.private_ip, NODE_PORT).await;
    c.assert_no_drops().await;
    let installed = d.rules().await.expect("rules");

    // Delete the mark rule; keep the attempt only if the daemon did not restore it meanwhile.
    let mut broken = false;
    for _ in 0..5 {
        let listing =
            d.ns.exec(
                "nft",
                &["-a", "list", "chain", "ip", "eniipam", "mark-primary"],
            )
            .await
            .expect("nft -a");
        let handle = listing
            .lines()
            .find(|l| l.contains("fib daddr . iif type local"))
            .and_then(|l| l.rsplit("# handle ").next())
            .map(|h| h.trim().to_owned())
            .expect("the connmark rule and its handle");
        d.ns.exec(
            "nft",
            &[
                "delete",
                "rule",
                "ip",
                "eniipam",
                "mark-primary",
                "handle",
                &handle,
            ],
        )
        .await
        .expect("delete the connmark rule");
        let before = c.drops_on(&p.eni).await;
        dropped(&client, c.a.private_ip, NODE_PORT).await;
        let still_missing = !d
            .rules()
            .await
            .expect("rules")
            .contains("fib daddr . iif type local");
        if still_missing {
            assert!(
                c.drops_on(&p.eni).await > before,
                "the reply left by {} with node A's address and was dropped",
                p.eni
            );
            broken = true;
            break;
        }
    }
    assert!(broken, "the rule kept coming back before the probe ended");

    // Healed at the next check (every 3 s): the same table as before, the NodePort answers again,
    // and kube-proxy's chains are untouched.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(15);
    while d.rules().await.as_deref() != Some(installed.as_str()) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not healed within 15 s:\n{}",
            d.tail()
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert!(d.log_text().contains("drifted"), "the repair is logged");
    let r = reaches(&client, c.a.private_ip, NODE_PORT).await;
    assert_eq!(r.server_saw.ip(), c.b.private_ip);
    assert!(d.iptables_nat().await.contains("KUBE-NODEPORTS"));
}

/// A daemon restart keeps pod egress and the NodePort working throughout (the rules stay while it
/// is down, and the restarted daemon finds them exactly as it would load them); a knob change
/// applies at the next start; `--prepare-host` (the init container) loosens a strict rp_filter;
/// `--uninstall-host-rules` removes everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_survive_restarts_follow_knobs_and_uninstall() {
    let test = "rules_survive_restarts_follow_knobs_and_uninstall";
    let Some(c) = Cluster::start(test, Egress::InternetGateway).await else {
        return;
    };
    let mut d = Daemon::start(&c, &c.a.instance_id, Placement::SecondaryEni, &[]).await;
    let p = d.add_pod(&c, "egress", PodOptions::default()).await;
    p.assert_placed(Placement::SecondaryEni);
    let _s = serve(&p.ns);
    let _internet = serve(c.lab.internet());
    d.add_node_port(p.ip).await;
    let client = c.node_ns(&c.b.instance_id);
    let works = |what: &'static str| {
        let (c, p, client) = (&c, &p, &client);
        async move {
            let r = reaches(&p.ns, INTERNET_SERVER, ECHO_PORT).await;
            assert_eq!(r.server_saw.ip(), c.a.private_ip, "SNAT {what}");
            let r = reaches(client, c.a.private_ip, NODE_PORT).await;
            assert_eq!(r.server_saw.ip(), c.b.private_ip, "NodePort {what}");
        }
    };
    works("before").await;
    let installed = d.rules().await.expect("rules");

    d.stop().await;
    assert_eq!(d.rules().await.as_deref(), Some(installed.as_str()));
    works("while the daemon is down").await;

    d.restart_with(&[]).await;
    assert_eq!(d.rules().await.as_deref(), Some(installed.as_str()));
    assert!(
        d.log_text().contains("change=Kept"),
        "the restarted daemon found its rules as they were:\n{}",
        d.tail()
    );
    works("after a restart").await;
    assert_eq!(
        d.ip_rules().await.matches("fwmark 0x80/0x80").count(),
        1,
        "no duplicate rule"
    );

    // A NAT gateway takes over: SNAT goes at the next start, the NodePort marks stay; in this
    // public subnet the pod's own address is then dropped by the IGW.
    d.restart_with(&[("ENIIPAM_EXTERNAL_SNAT", "true")]).await;
    let rules = d.rules().await.expect("rules");
    assert!(
        !rules.contains("snat to") && rules.contains("mark-primary"),
        "{rules}"
    );
    let igw_before = c.lab.igw_drops().await.expect("igw").egress_not_public;
    dropped(&p.ns, INTERNET_SERVER, ECHO_PORT).await;
    assert!(c.lab.igw_drops().await.expect("igw").egress_not_public > igw_before);
    let r = reaches(&client, c.a.private_ip, NODE_PORT).await;
    assert_eq!(r.server_saw.ip(), c.b.private_ip);
    c.assert_no_drops().await;

    // The privileged init container's job: the primary interface's strict rp_filter made loose
    // (the daemon's own container sees /proc/sys read-only).
    d.stop().await;
    let node = c.node_ns(&c.a.instance_id);
    let links = node.ip(&["-o", "link"]).await.expect("links");
    let ifname = links
        .lines()
        .find(|l| l.contains(&c.a.mac))
        .and_then(|l| l.split(':').nth(1))
        .map(|n| n.trim().split('@').next().unwrap_or_default().to_owned())
        .expect("the primary interface, by eth0's MAC");
    let key = format!("net/ipv4/conf/{ifname}/rp_filter");
    node.write_sysctls(&[(key.clone(), "1".into())])
        .await
        .expect("strict rp_filter");
    let out = d.run_once(&["--prepare-host"]).await;
    assert!(out.contains("set to 2 (loose)"), "{out}");
    assert_eq!(node.read_sysctl(&key).await.expect("rp_filter"), "2");
    let out = d.run_once(&["--prepare-host"]).await;
    assert!(out.contains("left as it is"), "{out}");

    // eniipam leaves the node.
    let out = d.run_once(&["--uninstall-host-rules"]).await;
    assert!(out.contains("deleted"), "{out}");
    assert_eq!(d.rules().await, None);
    assert!(
        !d.ip_rules().await.contains("fwmark"),
        "{}",
        d.ip_rules().await
    );
}

/// Secondary IPs EC2 shows on `instance`'s ENI at `device_index`.
fn secondary_ips_at(c: &Cluster, instance: &str, device_index: u32) -> Vec<Ipv4Addr> {
    c.mock
        .network_interfaces()
        .into_iter()
        .find(|e| {
            e.attachment
                .as_ref()
                .is_some_and(|a| a.instance_id == instance && a.device_index == device_index)
        })
        .map(|e| e.secondary_ips)
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_same_node_strict_rp_filter() {
    mixed_same_node("mixed_same_node_strict_rp_filter", RpFilter::Strict).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_same_node_loose_rp_filter() {
    mixed_same_node("mixed_same_node_loose_rp_filter", RpFilter::Loose).await;
}

/// Whether `d`'s pool (`eniipamctl status --json`) serves the ENI at `device_index` with idle IPs.
fn pool_serves_idle_ips_on(d: &Daemon, device_index: u64) -> bool {
    let out = std::process::Command::new(bins::target_bin("eniipamctl"))
        .arg("--socket")
        .arg(&d.socket)
        .args(["status", "--json"])
        .output()
        .expect("eniipamctl runs");
    let Ok(status) = serde_json::from_slice::<serde_json::Value>(&out.stdout) else {
        return false;
    };
    status["enis"].as_array().is_some_and(|enis| {
        enis.iter().any(|e| {
            e["device_index"] == device_index
                && e["state"] == "serving"
                && e["idle"].as_u64().unwrap_or(0) > 0
        })
    })
}

/// A pod on eth0 and a pod on a secondary ENI of the same node talk both ways, and not one packet
/// of theirs reaches the VPC router: every pod's `to <ip> lookup main` rule (512) wins over the
/// secondary-ENI pod's `from <ip> lookup <table>` rule (1536). Without the eth0 pod's `to` rule the
/// secondary-ENI pod's packets to it left by its ENI, crossed the VPC and came back through eth0.
async fn mixed_same_node(test: &str, rp_filter: RpFilter) {
    let Some(c) = Cluster::start_with(test, Egress::InternetGateway, rp_filter).await else {
        return;
    };
    // eth0 serves pods; warm more than it holds (9 secondary IPs on an m5.large), so an eth1 is
    // created with idle IPs of its own (single IPs: with burst prefixes eth0's /28s would hold them).
    let d = Daemon::start(
        &c,
        &c.a.instance_id,
        Placement::Eth0,
        &[
            ("ENIIPAM_BURST_PREFIXES", "false"),
            ("ENIIPAM_WARM_POLICY", "fixed"),
            ("ENIIPAM_MIN_IDLE", "12"),
            ("ENIIPAM_MAX_IDLE", "24"),
        ],
    )
    .await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while secondary_ips_at(&c, &c.a.instance_id, 1).is_empty()
        || secondary_ips_at(&c, &c.a.instance_id, 0).is_empty()
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no eth1 with IPs within 30 s:\n{}",
            d.tail()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // EC2 shows eth1's IPs before the pool serves them (it waits for the host to route through
    // eth1: the readiness gate): wait until the pool lists eth1 with idle IPs.
    while !pool_serves_idle_ips_on(&d, 1) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the pool never served eth1's IPs within 30 s:\n{}",
            d.tail()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let on_eth0 = secondary_ips_at(&c, &c.a.instance_id, 0)[0];
    let on_eth1 = secondary_ips_at(&c, &c.a.instance_id, 1)[0];
    let p0 = d
        .add_pod(
            &c,
            "on-eth0",
            PodOptions {
                want_ip: Some(on_eth0),
                ..Default::default()
            },
        )
        .await;
    let p1 = d
        .add_pod(
            &c,
            "on-eth1",
            PodOptions {
                want_ip: Some(on_eth1),
                ..Default::default()
            },
        )
        .await;
    p0.assert_placed(Placement::Eth0);
    p1.assert_placed(Placement::SecondaryEni);
    let probe = FlowProbe::start(&c, &d.ns, p0.ip, p1.ip).await;
    let (_s0, _s1) = (serve(&p0.ns), serve(&p1.ns));
    let exchange = |from: &CniPod, to: &CniPod| {
        let (from, to, probe) = (from.clone(), to.clone(), &probe);
        async move {
            let sent = vpclab::echo(
                &from.ns,
                SocketAddr::from((to.ip, ECHO_PORT)),
                &EchoOptions {
                    timeout: Duration::from_secs(5),
                    ..Default::default()
                },
            )
            .await;
            let (node, vpc) = probe.packets().await;
            match sent {
                Ok(r) => assert_eq!(r.server_saw.ip(), from.ip),
                Err(e) => panic!(
                    "{} → {} ({}): {e}; {node} packets of the flow left the node by an ENI, {vpc} \
                     reached the VPC router",
                    from.name, to.name, to.ip
                ),
            }
        }
    };
    for _ in 0..3 {
        exchange(&p1, &p0).await;
        exchange(&p0, &p1).await;
    }
    assert_eq!(
        probe.packets().await,
        (0, 0),
        "packets between {} and {} left the node (by an ENI, to the VPC router)",
        p0.ip,
        p1.ip
    );
    c.assert_no_drops().await;
    // Both pods have their `to` rule, whichever ENI holds their address.
    let rules = d.ip_rules().await;
    for p in [&p0, &p1] {
        assert!(
            rules.contains(&format!("512:\tfrom all to {} lookup main", p.ip)),
            "{}: no `to` rule:\n{rules}",
            p.name
        );
    }
}

/// NodePort support off, SNAT on, strict `rp_filter`, the daemon unable to write `/proc/sys` (its
/// DaemonSet container): the init container's `eniipamd --prepare-host` still loosens the primary
/// interface, because SNATed replies to pods on secondary ENIs need it (their reverse route follows
/// the pod's `from` rule out of its ENI), and a secondary-ENI pod reaches the internet through the
/// node's SNAT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snat_secondary_node_port_off_prepared_host() {
    let test = "snat_secondary_node_port_off_prepared_host";
    let Some(c) = Cluster::start(test, Egress::InternetGateway).await else {
        return;
    };
    let mut d = Daemon::start_opts(
        &c,
        &c.a.instance_id,
        Placement::SecondaryEni,
        &[("ENIIPAM_NODE_PORT_SUPPORT", "false")],
        true,
    )
    .await;
    d.stop().await;
    let node = c.node_ns(&c.a.instance_id);
    assert_eq!(
        node.read_sysctl("net/ipv4/conf/eth0/rp_filter")
            .await
            .expect("sysctl"),
        "1",
        "the daemon could not loosen it (read-only /proc/sys):\n{}",
        d.tail()
    );
    // The init container, then the daemon, as the DaemonSet runs them.
    let prepared = d.run_once(&["--prepare-host"]).await;
    d.restart_with(&[]).await;
    let rules = d.rules().await.expect("the SNAT rules");
    assert!(
        rules.contains("snat to") && !rules.contains("mark-primary"),
        "{rules}"
    );
    let p = d.add_pod(&c, "egress", PodOptions::default()).await;
    p.assert_placed(Placement::SecondaryEni);
    let _internet = serve(c.lab.internet());
    let r = reaches(&p.ns, INTERNET_SERVER, ECHO_PORT).await;
    assert_eq!(r.server_saw.ip(), c.a.private_ip, "SNAT to eth0's address");
    assert!(prepared.contains("set to 2 (loose)"), "{prepared}");
    assert_eq!(
        node.read_sysctl("net/ipv4/conf/eth0/rp_filter")
            .await
            .expect("sysctl"),
        "2"
    );
    c.assert_no_drops().await;
}

/// The first pod on a newly created ENI can send at once: when its ADD returns, the ENI's route
/// table is installed in the node, and one TCP exchange (no retry: shorter than the first SYN
/// retransmission) to the other node succeeds, on both nodes, with nothing dropped by EC2's
/// source/destination check. Before the readiness gate the ADD returned up to the host keeper's
/// next round (2 s) before the table existed, and the pod's packets left by eth0 with eth1's
/// address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_pod_on_new_eni_routes_at_once() {
    let test = "first_pod_on_new_eni_routes_at_once";
    let Some(c) = Cluster::start(test, Egress::InternetGateway).await else {
        return;
    };
    let no_warm = [
        ("ENIIPAM_WARM_POLICY", "fixed"),
        ("ENIIPAM_MIN_IDLE", "0"),
        ("ENIIPAM_MAX_IDLE", "0"),
    ];
    let da = Daemon::start(&c, &c.a.instance_id, Placement::SecondaryEni, &no_warm).await;
    let db = Daemon::start(&c, &c.b.instance_id, Placement::SecondaryEni, &no_warm).await;
    let (node_a, node_b) = (c.node_ns(&c.a.instance_id), c.node_ns(&c.b.instance_id));
    let (_sa, _sb) = (serve(&node_a), serve(&node_b));
    for (d, peer, name) in [
        (&da, c.b.private_ip, "first-a"),
        (&db, c.a.private_ip, "first-b"),
    ] {
        assert!(
            secondary_ips_at(&c, &d.instance_id, 1).is_empty(),
            "no secondary ENI before the first pod"
        );
        let p = d.add_pod_now(&c, name, PodOptions::default()).await;
        let table =
            d.ns.routes(Some(p.device_index + 1))
                .await
                .unwrap_or_default();
        let sent = vpclab::echo(
            &p.ns,
            SocketAddr::from((peer, ECHO_PORT)),
            &EchoOptions {
                timeout: Duration::from_millis(900),
                ..Default::default()
            },
        )
        .await;
        p.assert_placed(Placement::SecondaryEni);
        assert!(
            table.iter().any(|r| r.dst == vpclab::RouteDst::Default),
            "{name}: table {} had no default route when the ADD returned: {table:?}\n{}",
            p.device_index + 1,
            d.tail()
        );
        assert_eq!(
            sent.unwrap_or_else(|e| panic!("{name} → {peer} right after ADD: {e}"))
                .server_saw
                .ip(),
            p.ip
        );
    }
    c.assert_no_drops().await;
}
