//! Issue 47, case 2: a pod cannot send as another pod. On one node of the emulated VPC with the
//! real daemon and plugin (the world of [`small_world`]: `x/a` takes ingress only from pods `b`;
//! `x/b` and `y/a` open), under strict and loose `rp_filter` set up by the lab:
//!
//! - `y/a` sends UDP from a raw socket (a pod has `NET_RAW` by default) with `x/b`'s address as
//!   its source to the isolated `x/a`, which allows `x/b`: not delivered, counted as spoofed;
//! - `y/a` sends the same to the open `x/b` with `x/a`'s address: not delivered either (every
//!   local pod's veth is tied to its own addresses, isolated or not);
//! - a new pod (`y/c`) is tied to its address when its ADD returns: its source entry is in the
//!   table and its first spoofed datagrams are dropped;
//! - `x/b`'s own datagrams to `x/a` and `x/a`'s to `x/b` are delivered, the daemon exports the
//!   count (`eniipam_network_policy_spoofed_packets_total`), and the matrix stays the model's.
//!
//! `rp_filter` is turned off for the node (`all`) and the spoofer's host veth before the spoofed
//! datagrams: a host veth has no address of its own, and for such an interface the kernel's loose
//! check falls back to the strict one, which would drop them first. A node may run with it off
//! (or with a loose check that passes them, as on an interface with an address), and then only
//! the policy table stands between the spoofer and the isolated pod. Before the fix the datagrams
//! were delivered: `x/a`'s ingress matched on the source address alone.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};

use super::udp::{received, record_udp, send_udp};
use super::*;

both_rp_filters!(
    spoofing: a_pod_cannot_send_as_an_allowed_peer_strict_rp_filter,
    a_pod_cannot_send_as_an_allowed_peer_loose_rp_filter
);

/// How long the daemon may take to export the kernel's count (it reads it every 15 s).
const METRIC_WITHIN: Duration = Duration::from_secs(20);

/// The spoofed datagrams each attempt sends.
const SPOOFED: u32 = 5;

/// The node's `spoofed` counter (packets from a pod's veth with a source not its own).
pub(super) async fn spoofed(d: &PolicyDaemon) -> u64 {
    let json =
        d.ns.exec(
            "nft",
            &[
                "-j",
                "list",
                "counter",
                "inet",
                eniipam::network_policy::nft::TABLE,
                eniipam::network_policy::nft::SPOOFED,
            ],
        )
        .await
        .expect("nft list counter");
    eniipam::network_policy::nft::spoofed_packets(&json).expect("the spoofed counter")
}

/// Sends [`SPOOFED`] datagrams from `ns` through a raw socket, with source `from`.
async fn send_spoofed(ns: &vpclab::NetNs, from: Ipv4Addr, to: Ipv4Addr, port: u16) {
    ns.run_async(move || {
        for _ in 0..SPOOFED {
            vpclab::raw::send_udp_from(
                SocketAddrV4::new(from, 40_000),
                SocketAddrV4::new(to, port),
                b"spoofed",
            )
            .expect("a raw datagram");
        }
    })
    .await
    .expect("a raw socket in the pod");
}

async fn spoofing(test: &str, rp_filter: RpFilter) {
    let Some((c, api, d, policies, pods, _servers)) = small_world(test, rp_filter).await else {
        return;
    };
    let cells = all_cells(&pods);
    let want = expected(&model(&pods, &policies), &cells);
    until_matrix(
        "x/a only from x/b",
        &pods,
        &cells,
        &want,
        IN_FORCE_WITHIN,
        || d.tail(),
    )
    .await;
    let (xa, xb, ya) = (&pods["x/a"].cni, &pods["x/b"].cni, &pods["y/a"].cni);
    let rp_off = |key: String| (key, "0".to_owned());
    d.ns.write_sysctls(&[
        rp_off("net/ipv4/conf/all/rp_filter".into()),
        rp_off(format!("net/ipv4/conf/{}/rp_filter", host_veth(ya))),
    ])
    .await
    .expect("rp_filter off in the node");

    for (victim, victim_name, allowed, allowed_name) in [
        (xa, "x/a (isolated)", xb, "x/b"),
        (xb, "x/b (open)", xa, "x/a"),
    ] {
        let (recorder, mut rx) = record_udp(&victim.ns, 82).await;
        // The control: the real peer's datagrams arrive.
        send_udp(
            &allowed.ns,
            allowed.ip,
            SocketAddr::from((victim.ip, 82)),
            b"control",
            3,
        )
        .await;
        let got = received(&mut rx, Duration::from_secs(1)).await;
        assert!(
            got.iter().any(|p| p == b"control"),
            "{allowed_name}'s own datagrams did not reach {victim_name}: {got:?}\n{}",
            d.tail()
        );
        let before = spoofed(&d).await;
        send_spoofed(&ya.ns, allowed.ip, victim.ip, 82).await;
        let got = received(&mut rx, Duration::from_secs(1)).await;
        recorder.abort();
        let after = spoofed(&d).await;
        eprintln!("{test}: y/a as {allowed_name} → {victim_name}: spoofed {before} → {after}");
        assert!(
            got.is_empty(),
            "y/a, sending as {allowed_name} ({}) to {victim_name}, got through: {got:?}\n{}",
            allowed.ip,
            d.policy_table().await.unwrap_or_default()
        );
        assert!(
            after >= before + u64::from(SPOOFED),
            "the spoofed datagrams were not counted ({before} → {after})"
        );
    }
    // A new pod is tied to its address from its ADD, open as it is: when the plugin returns,
    // its veth and address are in the table, and its first spoofed datagrams are dropped.
    let yc = d.add_pod(&c, &api, "y", "c", None).await;
    let veth = host_veth(&yc.cni);
    d.ns.write_sysctls(&[rp_off(format!("net/ipv4/conf/{veth}/rp_filter"))])
        .await
        .expect("rp_filter off on y/c's veth");
    let json =
        d.ns.exec(
            "nft",
            &["-j", "list", "set", "inet", "eniipam_policy", "pod_sources"],
        )
        .await
        .expect("nft list set pod_sources");
    let entry = json!([veth, yc.cni.ip.to_string()]);
    let listed = serde_json::from_str::<Value>(&json).expect("nft's JSON")["nftables"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i["set"]["elem"].as_array())
        .flatten()
        .any(|e| e["concat"] == entry);
    assert!(
        listed,
        "y/c's ADD returned before its source {entry} was in force:\n{json}"
    );
    let (recorder, mut rx) = record_udp(&xb.ns, 83).await;
    let before = spoofed(&d).await;
    send_spoofed(&yc.cni.ns, xa.ip, xb.ip, 83).await;
    let got = received(&mut rx, Duration::from_secs(1)).await;
    recorder.abort();
    assert!(
        got.is_empty(),
        "the new y/c, sending as x/a right after its ADD, got through to x/b: {got:?}"
    );
    let after = spoofed(&d).await;
    assert!(
        after >= before + u64::from(SPOOFED),
        "y/c's spoofed datagrams were not counted ({before} → {after})"
    );

    // The daemon exports the kernel's count (read every 15 s).
    let exported = tokio::time::Instant::now();
    let total = spoofed(&d).await as f64;
    loop {
        let seen = d
            .metric("eniipam_network_policy_spoofed_packets_total")
            .await;
        if seen.is_some_and(|n| n >= total) {
            break;
        }
        assert!(
            exported.elapsed() < METRIC_WITHIN,
            "eniipam_network_policy_spoofed_packets_total is {seen:?}, the kernel counted {total}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Nothing else changed: every pod's own traffic is judged as before.
    until_matrix(
        "after the spoofing",
        &pods,
        &cells,
        &want,
        IN_FORCE_WITHIN,
        || d.tail(),
    )
    .await;
    c.assert_no_drops().await;
}
