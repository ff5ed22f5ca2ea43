//! Issue 47, case 1: Service traffic is judged whichever way kube-proxy sends it. On one node of
//! the emulated VPC with the real daemon and plugin, under strict and loose `rp_filter`, each pod
//! of [`small_world`] (`x/a` takes ingress only from pods `b`; `x/b`, `y/a` serving) behind a
//! ClusterIP of the lab ([`vpclab::service`]), in each of its modes in turn:
//!
//! - `Dnat` (kube-proxy's iptables and nftables modes): DNAT at prerouting, then forward;
//! - `LocalInOut` (kube-proxy's IPVS mode): the ClusterIP local to the node, the client's
//!   connection taken at local-in and a new one sent to the backend through local-out with the
//!   client's address (a transparent proxy: the lab's kernel has no IPVS; `vpclab::service` says
//!   what differs). Before the fix this path never met a rule: the only hook was forward.
//!
//! With `x/a`'s egress denied (policy `x/no-egress-a`): `x/a` → `y/a`'s Service does not connect
//! (egress), `y/a` → `x/a`'s does not (ingress), `x/b` → `x/a`'s and `y/a` → `x/b`'s do (what
//! the model says of the pods behind them), and `x/a` reaches itself through its own Service (a
//! pod cannot block access to itself), over TCP and UDP on 80 and 81.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};

use vpclab::service::{Service, ServiceMode};

use super::*;

both_rp_filters!(
    services: services_are_judged_in_every_kube_proxy_mode_strict_rp_filter,
    services_are_judged_in_every_kube_proxy_mode_loose_rp_filter
);

/// The ClusterIP of pod `i` of the world (outside the VPC's 10.0.0.0/16).
fn cluster_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 96, 1, 10 + u8::try_from(i).expect("a few pods"))
}

async fn services(test: &str, rp_filter: RpFilter) {
    let Some((c, api, d, mut policies, pods, _servers)) = small_world(test, rp_filter).await else {
        return;
    };
    let no_egress = policy(
        "x",
        "no-egress-a",
        json!({"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Egress"]}),
    );
    api.put_network_policy(no_egress.clone());
    policies.push(no_egress);
    let cells = all_cells(&pods);
    let want = expected(&model(&pods, &policies), &cells);
    until_matrix(
        "x/a no egress, ingress only from x/b",
        &pods,
        &cells,
        &want,
        IN_FORCE_WITHIN,
        || d.tail(),
    )
    .await;

    // Through the Services: the model's verdict on the pods behind them, but a pod to itself.
    let through: Vec<Cell> = [
        ("x/a", "y/a"),
        ("y/a", "x/a"),
        ("x/b", "x/a"),
        ("y/a", "x/b"),
    ]
    .into_iter()
    .chain([("x/a", "x/a")])
    .flat_map(|(client, server)| {
        PROTOCOLS.into_iter().flat_map(move |protocol| {
            PORTS.map(|port| Cell {
                client: client.to_owned(),
                server: server.to_owned(),
                protocol,
                port,
            })
        })
    })
    .collect();
    let mut want = expected(&model(&pods, &policies), &through);
    for (cell, w) in &mut want {
        if cell.client == cell.server {
            *w = true;
        }
    }
    let allowed = |client: &str, server: &str| {
        want.iter()
            .any(|(c, w)| c.client == client && c.server == server && *w)
    };
    assert!(
        !allowed("x/a", "y/a") && !allowed("y/a", "x/a"),
        "x/a's egress and ingress are denied"
    );
    assert!(
        allowed("x/b", "x/a") && allowed("y/a", "x/b"),
        "x/b reaches x/a, y/a reaches x/b"
    );

    let keys: Vec<&String> = pods.keys().collect();
    for mode in [ServiceMode::Dnat, ServiceMode::LocalInOut] {
        let mut services = BTreeMap::new();
        for (i, key) in keys.iter().enumerate() {
            let service = Service::start(&d.ns, mode, cluster_ip(i), pods[*key].cni.ip, &PORTS)
                .await
                .unwrap_or_else(|e| panic!("{mode:?} Service of {key}: {e}"));
            services.insert((*key).clone(), service);
        }
        let got = futures::future::join_all(want.keys().map(|cell| {
            let to = SocketAddr::from((services[&cell.server].cluster_ip(), cell.port));
            let from = pods[&cell.client].cni.ns.clone();
            let protocol = cell.protocol;
            async move { (cell.clone(), probe_address(&from, to, protocol).await) }
        }))
        .await;
        let wrong: Vec<String> = got
            .iter()
            .filter(|(cell, connected)| want[cell] != *connected)
            .map(|(cell, connected)| {
                format!(
                    "{} → {}'s Service {:?}/{}: {} (want {})",
                    cell.client,
                    cell.server,
                    cell.protocol,
                    cell.port,
                    verb(*connected),
                    verb(want[cell])
                )
            })
            .collect();
        assert!(
            wrong.is_empty(),
            "{mode:?} Services:\n{}\n{}",
            wrong.join("\n"),
            d.policy_table().await.unwrap_or_default()
        );
        eprintln!(
            "{test}: {mode:?}: {} cells through the Services as the model says",
            got.len()
        );
        drop(services);
    }
    // The pods' own traffic is unchanged.
    until_matrix(
        "after the Services",
        &pods,
        &cells,
        &want_pods(&pods, &policies),
        IN_FORCE_WITHIN,
        || d.tail(),
    )
    .await;
    c.assert_no_drops().await;
}

/// The model's verdict on every cell of `pods`.
fn want_pods(pods: &BTreeMap<String, PolicyPod>, policies: &[Value]) -> BTreeMap<Cell, bool> {
    expected(&model(pods, policies), &all_cells(pods))
}
