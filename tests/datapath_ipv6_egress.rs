//! IPv4 egress of IPv6-only pods (issue 26: "pod → IPv4 internet through the node's SNAT") on the
//! emulated VPC: the real `eniipamd` with `ip_family = ipv6` (and `ipv4_egress` at its default, on),
//! pods made by the real plugin, real TCP over IPv4 from the pod's node-local 169.254.172.0/22
//! address. The lab's IGW lets only a node's primary address out and EC2's source/destination check
//! drops any other source on an ENI, so a cell passes only if the node's `pod-snat` chain
//! translated the pod's address to the node's primary IPv4.
//!
//! | case | cell |
//! | --- | --- |
//! | pod → IPv4 internet and → IPv4 VPC address (another node), strict `rp_filter` | `egress_ipv4_strict_rp_filter` |
//! | the same, loose `rp_filter` | `egress_ipv4_loose_rp_filter` |
//! | the SNAT rule deleted by hand: traffic stops, the rules keeper heals it, traffic flows | `egress_snat_rule_is_healed` |
//! | `ipv4_egress = false`: no IPv4 on the pod, no route, no rule | `egress_off_gives_the_pod_no_ipv4` |
//!
//! Needs root, `ip`, `nft`, `iptables`, `nsenter` and `/usr/lib/cni/portmap` (the harness's
//! checks); build the plugin first (`cargo build --workspace --bins`). Skipped with a notice where
//! the lab cannot run.

mod bins;
mod datapath_support;

use std::time::Duration;

use datapath_support::egress::*;
use datapath_support::v6::*;
use datapath_support::*;
use vpclab::INTERNET_SERVER;

const EGRESS_RULE: &str = "ip saddr 169.254.172.0/22 snat to";

async fn egress(test: &str, rp_filter: RpFilter) {
    let Some(c) = Cluster::start_v6(test, rp_filter).await else {
        return;
    };
    let d = Daemon::start_v6(&c, &c.a.instance_id).await;
    let p = d.add_pod_v6(&c, "egress").await;
    let v4 = pod_ipv4s(&p.ns).await;
    assert_eq!(v4.len(), 1, "{v4:?}");
    let (addr, len) = v4[0];
    assert!(addr.octets()[..2] == [169, 254] && (172..=175).contains(&addr.octets()[2]));
    assert_eq!(len, 32);
    assert!(
        !p.result.to_string().contains(&addr.to_string()),
        "not reported: {}",
        p.result
    );
    let _internet = serve(c.lab.internet());
    let _on_b = serve(&c.node_ns(&c.b.instance_id));
    // The IPv4 internet sees the node's primary IPv4, connection after connection.
    for _ in 0..3 {
        let r = reaches(&p.ns, INTERNET_SERVER, ECHO_PORT).await;
        assert_eq!(r.server_saw.ip(), c.a.private_ip);
    }
    // A VPC address (node B) too: the node-local address means nothing in the VPC.
    let r = reaches(&p.ns, c.b.private_ip, ECHO_PORT).await;
    assert_eq!(r.server_saw.ip(), c.a.private_ip);
    assert_eq!(c.lab.igw_drops().await.expect("igw").egress_not_public, 0);
    c.assert_no_drops().await;
    // The pod's IPv6 still works alongside.
    let _s6 = serve6(&p.ns);
    reaches6(&c.node_ns(&c.b.instance_id), p.ip).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn egress_ipv4_strict_rp_filter() {
    egress("egress_ipv4_strict_rp_filter", RpFilter::Strict).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn egress_ipv4_loose_rp_filter() {
    egress("egress_ipv4_loose_rp_filter", RpFilter::Loose).await;
}

/// The egress rule deleted by hand: the pod's IPv4 to a VPC address leaves with its 169.254 source
/// (the node's general SNAT returns for VPC destinations) and EC2's source/destination check drops
/// it; the rules keeper's next check loads the table again and traffic flows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn egress_snat_rule_is_healed() {
    let Some(c) = Cluster::start_v6("egress_snat_rule_is_healed", RpFilter::Strict).await else {
        return;
    };
    let d = Daemon::start_v6_with(
        &c,
        &c.a.instance_id,
        &[("ENIIPAM_HOST_RULES_CHECK_SECS", "3")],
    )
    .await;
    let p = d.add_pod_v6(&c, "healed").await;
    let _on_b = serve(&c.node_ns(&c.b.instance_id));
    reaches(&p.ns, c.b.private_ip, ECHO_PORT).await;
    let installed = d.rules().await.expect("rules");
    assert!(installed.contains(EGRESS_RULE), "{installed}");

    // Delete it; keep the attempt only if the daemon did not restore it meanwhile.
    let mut broken = false;
    for _ in 0..5 {
        let handle = d
            .snat_rule_handle(EGRESS_RULE)
            .await
            .expect("the egress rule and its handle");
        d.ns.exec(
            "nft",
            &[
                "delete", "rule", "ip", "eniipam", "pod-snat", "handle", &handle,
            ],
        )
        .await
        .expect("delete the egress rule");
        let before = c.drops_on(&c.a.primary_eni.to_string()).await;
        dropped(&p.ns, c.b.private_ip, ECHO_PORT).await;
        if d.snat_rule_handle(EGRESS_RULE).await.is_none() {
            assert!(
                c.drops_on(&c.a.primary_eni.to_string()).await > before,
                "the pod's 169.254 source was dropped by the source/destination check"
            );
            broken = true;
            break;
        }
    }
    assert!(broken, "the rule kept coming back before the probe ended");

    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while d.rules().await.as_deref() != Some(installed.as_str()) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not healed within 15 s:\n{}",
            d.tail()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(d.log_text().contains("drifted"), "the repair is logged");
    let r = reaches(&p.ns, c.b.private_ip, ECHO_PORT).await;
    assert_eq!(r.server_saw.ip(), c.a.private_ip);
}

/// `ipv4_egress = false`: the pod has no IPv4 address and no IPv4 route, the node no egress rule.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn egress_off_gives_the_pod_no_ipv4() {
    let Some(c) = Cluster::start_v6("egress_off_gives_the_pod_no_ipv4", RpFilter::Strict).await
    else {
        return;
    };
    let d = Daemon::start_v6_with(&c, &c.a.instance_id, &[("ENIIPAM_IPV4_EGRESS", "false")]).await;
    let p = d.add_pod_v6(&c, "v6only").await;
    assert!(pod_ipv4s(&p.ns).await.is_empty());
    assert_eq!(pod_ipv4_default(&p.ns).await, None);
    let rules = d.rules().await.unwrap_or_default();
    assert!(!rules.contains("169.254.172.0/22"), "{rules}");
    // IPv6 is unaffected.
    let _s6 = serve6(&p.ns);
    reaches6(&c.node_ns(&c.b.instance_id), p.ip).await;
    c.assert_no_drops().await;
}
