//! Issue 47, case 3, on one node of the emulated VPC with the real daemon and plugin, under
//! strict and loose `rp_filter` (the world of [`small_world`]: `x/a` takes ingress only from pods
//! `b`; pods `x/a`, `x/b`, `y/a` serving).
//!
//! - **A new local pod is a peer from its ADD** (case 3): with `x/a` also taking ingress from pods
//!   `d`, a new `x/d` whose address the kubelet has not posted reaches `x/a` from its first
//!   packets: its node's pool knows the address at ADD.

use super::*;

both_rp_filters!(
    new_local_peer: a_new_local_pod_is_a_peer_from_its_add_strict_rp_filter,
    a_new_local_pod_is_a_peer_from_its_add_loose_rp_filter
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
