//! Issue 47, cases 3 and 4, on one node of the emulated VPC with the real daemon and plugin, under
//! strict and loose `rp_filter` (the world of [`small_world`]: `x/a` takes ingress only from pods
//! `b`; pods `x/a`, `x/b`, `y/a` serving).
//!
//! - **A new local pod is a peer from its ADD** (case 3): with `x/a` also taking ingress from pods
//!   `d`, a new `x/d` whose address the kubelet has not posted reaches `x/a` from its first
//!   packets: its node's pool knows the address at ADD.
//! - **Hairpin** (case 4): `x/a` closed both ways (but to `x/b`'s ingress) reaches itself through
//!   its Service (a ClusterIP the node DNATs to it, masqueraded as kube-proxy does a pod's packet
//!   to itself), while `y/a` does not get through, not even sending from `x/a`'s address (dropped
//!   as spoofed, case 2).

use std::net::{Ipv4Addr, SocketAddr};

use vpclab::service::{Service, ServiceMode};

use super::udp::{received, record_udp, send_udp};
use super::*;

both_rp_filters!(
    new_local_peer: a_new_local_pod_is_a_peer_from_its_add_strict_rp_filter,
    a_new_local_pod_is_a_peer_from_its_add_loose_rp_filter
);

both_rp_filters!(
    hairpin: a_pod_reaches_itself_through_its_service_strict_rp_filter,
    a_pod_reaches_itself_through_its_service_loose_rp_filter
);

/// Case 3. Before the fix, the node's peer sets came from the pod watch only, so `x/d` was no
/// peer of `x/a` until the kubelet posted its address: its first connections were dropped.
async fn new_local_peer(test: &str, rp_filter: RpFilter) {
    let Some((c, api, d, mut policies, pods, mut servers)) = small_world(test, rp_filter).await
    else {
        return;
    };
    let from_d = policy(
        "x",
        "from-d",
        json!({"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Ingress"],
               "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "d"}}}]}]}),
    );
    api.put_network_policy(from_d.clone());
    policies.push(from_d);
    let cells = all_cells(&pods);
    let want = expected(&model(&pods, &policies), &cells);
    until_matrix(
        "x/a from pods b and d",
        &pods,
        &cells,
        &want,
        IN_FORCE_WITHIN,
        || d.tail(),
    )
    .await;

    // x/d's ADD; the API server shows it Pending, without an address.
    let xd = d.add_pod_unposted(&c, &api, "x", "d", None).await;
    servers.push(serve_ports(&xd.cni.ns).await);
    c.lab.sync().await.expect("lab sync");
    let mut with_d = pods.clone();
    with_d.insert(xd.key.clone(), xd.clone());
    let first: Vec<Cell> = PROTOCOLS
        .into_iter()
        .flat_map(|protocol| {
            [("x/d", "x/a"), ("y/a", "x/a")].map(|(client, server)| Cell {
                client: client.to_owned(),
                server: server.to_owned(),
                protocol,
                port: 80,
            })
        })
        .collect();
    let want = expected(&model(&with_d, &policies), &first);
    assert!(
        want.iter().all(|(c, w)| *w == (c.client == "x/d")),
        "x/d reaches x/a, y/a does not"
    );
    let got = probe_cells(&with_d, &first, FIRST_PACKETS_WAIT).await;
    let wrong = differences(&with_d, &got, &want);
    assert!(
        wrong.is_empty(),
        "x/d's first packets, its address not posted yet:\n{}\n{}",
        wrong.join("\n"),
        d.policy_table().await.unwrap_or_default()
    );

    // The kubelet posts it: nothing changes but the API server's view.
    d.post_ip(&api, &xd);
    let cells = all_cells(&with_d);
    let want = expected(&model(&with_d, &policies), &cells);
    until_matrix(
        "x/d's address posted",
        &with_d,
        &cells,
        &want,
        IN_FORCE_WITHIN,
        || d.tail(),
    )
    .await;
    c.assert_no_drops().await;
}

/// The Service's ClusterIP (outside the VPC's 10.0.0.0/16).
const CLUSTER_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);

/// Case 4. Before the fix, `x/a`'s packet to its own Service met its egress chain (iif = its veth)
/// and its ingress chain (oif = its veth), which allow nothing to it: dropped.
async fn hairpin(test: &str, rp_filter: RpFilter) {
    let Some((c, api, d, mut policies, pods, _servers)) = small_world(test, rp_filter).await else {
        return;
    };
    let closed = policy(
        "x",
        "closed",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
               "policyTypes": ["Ingress", "Egress"]}),
    );
    api.put_network_policy(closed.clone());
    policies.push(closed);
    let cells = all_cells(&pods);
    let want = expected(&model(&pods, &policies), &cells);
    until_matrix(
        "x/a closed but to x/b",
        &pods,
        &cells,
        &want,
        IN_FORCE_WITHIN,
        || d.tail(),
    )
    .await;
    let xa = pods["x/a"].cni.clone();
    // kube-proxy's ClusterIP in its nftables mode's shape: DNATed to x/a, and x/a's packets to
    // itself masqueraded, so that their replies come back through the node.
    let _service = Service::start(&d.ns, ServiceMode::Dnat, CLUSTER_IP, xa.ip, &PORTS)
        .await
        .expect("the emulated kube-proxy's Service");
    let service = |port| SocketAddr::from((CLUSTER_IP, port));

    // The Service works: x/b (allowed) gets through it, y/a (denied) does not.
    for protocol in PROTOCOLS {
        assert!(
            probe_address(&pods["x/b"].cni.ns, service(80), protocol).await,
            "x/b → x/a's Service {CLUSTER_IP}:80 {protocol:?}: the lab's Service does not work\n{}",
            d.tail()
        );
        assert!(
            !probe_address(&pods["y/a"].cni.ns, service(80), protocol).await,
            "y/a → x/a's Service {CLUSTER_IP}:80 {protocol:?} connected"
        );
    }

    // x/a reaches itself through its Service: a pod cannot block access to itself.
    let mut failed = Vec::new();
    for protocol in PROTOCOLS {
        for port in PORTS {
            if !probe_address(&xa.ns, service(port), protocol).await {
                failed.push(format!("{protocol:?}/{port}"));
            }
        }
    }
    assert!(
        failed.is_empty(),
        "x/a ({}) cannot reach itself through its Service {CLUSTER_IP}: {}\n{}",
        xa.ip,
        failed.join(", "),
        d.policy_table().await.unwrap_or_default()
    );
    until_matrix(
        "x/a reached itself",
        &pods,
        &cells,
        &want,
        IN_FORCE_WITHIN,
        || d.tail(),
    )
    .await;

    // No spoofing through the hairpin: y/a sending from x/a's address to the Service (so that,
    // after the DNAT, the packet's source is its destination) is still judged by x/a's ingress.
    let (recorder, mut rx) = record_udp(&xa.ns, 82).await;
    let xb = &pods["x/b"].cni;
    send_udp(&xb.ns, xb.ip, service(82), b"control", 3).await;
    let got = received(&mut rx, Duration::from_secs(1)).await;
    assert!(
        got.iter().any(|p| p == b"control"),
        "x/b's datagrams to the Service did not reach x/a: {got:?}"
    );
    let ya = &pods["y/a"].cni;
    let spoofer = format!("{}/32", xa.ip);
    ya.ns
        .ip(&["addr", "add", &spoofer, "dev", "eth0"])
        .await
        .expect("x/a's address on y/a");
    // Reverse-path filtering would drop them first, loose too (a host veth has no address of its
    // own, so the kernel's loose check falls back to the strict one): off, as a node may have it,
    // so that only the policy stands between them and x/a.
    let rp_off = |key: String| (key, "0".to_owned());
    d.ns.write_sysctls(&[
        rp_off("net/ipv4/conf/all/rp_filter".into()),
        rp_off(format!("net/ipv4/conf/{}/rp_filter", host_veth(ya))),
    ])
    .await
    .expect("rp_filter off in the node");
    // Since issue 47's case 2 they never reach x/a's chains: y/a's veth carries y/a's address
    // only, so they are dropped (and counted) as spoofed before conntrack.
    let before = super::spoofing::spoofed(&d).await;
    send_udp(&ya.ns, xa.ip, service(82), b"spoofed", 5).await;
    let got = received(&mut rx, Duration::from_secs(1)).await;
    recorder.abort();
    assert!(
        got.is_empty(),
        "y/a, sending from x/a's address {} to x/a's Service, got through: {got:?}\n{}",
        xa.ip,
        d.policy_table().await.unwrap_or_default()
    );
    let after = super::spoofing::spoofed(&d).await;
    eprintln!("{test}: spoofed {before} → {after} with the datagrams sent from x/a's address");
    assert!(
        after >= before + 5,
        "the datagrams sent from x/a's address were not dropped as spoofed ({before} → {after})"
    );
    ya.ns
        .ip(&["addr", "del", &spoofer, "dev", "eth0"])
        .await
        .expect("x/a's address off y/a");
    c.assert_no_drops().await;
}
