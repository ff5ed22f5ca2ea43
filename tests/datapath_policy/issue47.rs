//! Issue 47, cases 3 and 4, on one node of the emulated VPC with the real daemon and plugin, under
//! strict and loose `rp_filter` (the world of [`small_world`]: `x/a` takes ingress only from pods
//! `b`; pods `x/a`, `x/b`, `y/a` serving).
//!
//! - **A new local pod is a peer from its ADD** (case 3): with `x/a` also taking ingress from pods
//!   `d`, a new `x/d` whose address the kubelet has not posted reaches `x/a` from its first
//!   packets: its node's pool knows the address at ADD.
//! - **Hairpin** (case 4): `x/a` closed both ways (but to `x/b`'s ingress) reaches itself through
//!   its Service (a ClusterIP the node DNATs to it, masqueraded as kube-proxy does a pod's packet
//!   to itself), while `y/a` does not get through, not even sending from `x/a`'s address.

use std::net::{Ipv4Addr, SocketAddr};

use vpclab::NetNs;

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
    let got = probe_cells(&with_d, &first, PROBE_WAIT).await;
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

/// kube-proxy's ClusterIP in the node, in its nftables mode's shape: [`CLUSTER_IP`] DNATed to
/// `pod` (every port), and a packet of `pod` to itself masqueraded, so that its replies come back
/// through the node (the pod would take a reply from its own address as a martian).
async fn add_cluster_ip(node: &NetNs, pod: Ipv4Addr) {
    node.nft(&format!(
        "table ip labproxy {{
  chain services {{
    type nat hook prerouting priority dstnat; policy accept;
    ip daddr {CLUSTER_IP} dnat to {pod}
  }}
  chain masquerading {{
    type nat hook postrouting priority srcnat; policy accept;
    ip saddr {pod} ip daddr {pod} masquerade
  }}
}}"
    ))
    .await
    .expect("the emulated kube-proxy's Service");
}

/// A UDP socket on `port` in `ns` whose datagrams' payloads are sent to the receiver.
async fn record_udp(
    ns: &NetNs,
    port: u16,
) -> (
    tokio::task::JoinHandle<()>,
    tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>,
) {
    let socket = ns
        .run_async(move || std::net::UdpSocket::bind(("0.0.0.0", port)).expect("udp bind"))
        .await
        .expect("a socket in the pod");
    socket.set_nonblocking(true).expect("nonblocking");
    let socket = tokio::net::UdpSocket::from_std(socket).expect("tokio socket");
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        let mut buf = [0u8; 64];
        while let Ok((n, _)) = socket.recv_from(&mut buf).await {
            let _ = tx.send(buf[..n].to_vec());
        }
    });
    (task, rx)
}

/// Sends `count` datagrams `payload` from `from` (an address of `ns`) to `to`.
async fn send_udp(ns: &NetNs, from: Ipv4Addr, to: SocketAddr, payload: &'static [u8], count: u32) {
    ns.run_async(move || {
        let s = std::net::UdpSocket::bind((from, 0)).expect("udp bind");
        for _ in 0..count {
            s.send_to(payload, to).expect("send");
        }
    })
    .await
    .expect("a socket in the pod");
}

/// What datagrams `rx` holds within `wait`.
async fn received(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>,
    wait: Duration,
) -> Vec<Vec<u8>> {
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + wait;
    while let Ok(Some(d)) = tokio::time::timeout_at(deadline, rx.recv()).await {
        got.push(d);
    }
    got
}

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
    add_cluster_ip(&d.ns, xa.ip).await;
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
    let denied = |v: &Value| v["ingress"]["denied"].as_u64().expect("a denied count");
    let before = denied(&d.ctl_policy("x/a"));
    send_udp(&ya.ns, xa.ip, service(82), b"spoofed", 5).await;
    let got = received(&mut rx, Duration::from_secs(1)).await;
    recorder.abort();
    assert!(
        got.is_empty(),
        "y/a, sending from x/a's address {} to x/a's Service, got through: {got:?}\n{}",
        xa.ip,
        d.policy_table().await.unwrap_or_default()
    );
    let after = denied(&d.ctl_policy("x/a"));
    eprintln!("{test}: x/a's ingress denied {before} → {after} with the spoofed datagrams");
    assert!(
        after >= before + 5,
        "the spoofed datagrams were not denied by x/a's ingress ({before} → {after})"
    );
    ya.ns
        .ip(&["addr", "del", &spoofer, "dev", "eth0"])
        .await
        .expect("x/a's address off y/a");
    c.assert_no_drops().await;
}
