//! The security-group cells of the data-path matrix (issue 27, item 3): network profiles on the
//! emulated VPC, whose fabric enforces each ENI's security groups (`vpclab`'s `vpclab_sg` table,
//! stateful, dropping and counting per ENI: `Lab::sg_drops`). Both nodes run the real `eniipamd`
//! with `ENIIPAM_NETWORK_PROFILES=true` against the API-server double; the default network is
//! eth0 (the VPC's default group), so every secondary ENI belongs to a profile:
//!
//! - profile `db`: subnet 10.0.16.0/24 by id, group `db`, whose only ingress rule is TCP
//!   [`ECHO_PORT`] from members of group `app`;
//! - profile `app`: the subnet tagged `tier=app` (10.0.17.0/24) by selector, group `app`, whose only
//!   ingress rule is ICMP echo requests from members of group `db`; no TCP at all.
//!
//! Every pod exists in the API server, bound to its node, before its CNI ADD: the db pod selects
//! `db` by its own annotation, app pods select `app` by their namespace's (`shop`), the no-profile
//! pod has neither, and the opted-out pod (in `shop`) says `eniipam.io/network: ""` itself. Every
//! cell runs under strict and loose `rp_filter`, asserts the outcome and the lab's counters
//! (security-group drops per ENI, and 0 source/destination-check drops).
//!
//! | cell | outcome | strict | loose |
//! | --- | --- | --- | --- |
//! | app pod (B) → db pod (A), TCP | allowed; the server sees the app pod's IP; db's ENI drops nothing. The reply passes app's ENI although `app` allows no TCP in: groups are stateful | `across_nodes_strict_rp_filter` | `across_nodes_loose_rp_filter` |
//! | no-profile pod (B) → db pod (A), TCP; likewise a pod of `shop` that opts out with an empty annotation | denied; db's ENI counts the drops | `across_nodes_strict_rp_filter` | `across_nodes_loose_rp_filter` |
//! | db pod (A) → app pod (B), TCP | denied (no TCP rule in `app`); app's ENI counts the drops | `across_nodes_strict_rp_filter` | `across_nodes_loose_rp_filter` |
//! | db pod (A) → app pod (B), ICMP echo | allowed (`app` lets `db`'s members ping) | `across_nodes_strict_rp_filter` | `across_nodes_loose_rp_filter` |
//! | each pod's ENI in EC2 | db's carries exactly `db`, tagged `eniipam.io/network=db`, in db's subnet; app's exactly `app`, tagged `app`, in the selected subnet; the no-profile and opted-out pods are on eth0 (default group, untagged) | `across_nodes_strict_rp_filter` | `across_nodes_loose_rp_filter` |
//! | revoke `db`'s rule in EC2: app pod (B) → db pod (A) | allowed before, denied for new connections after (db's ENI counts the drops), allowed again once the rule is authorized again | `revoke_strict_rp_filter` | `revoke_loose_rp_filter` |
//! | same node: app pod and no-profile pod (A) → db pod (A) | both allowed: traffic between pods of one node is routed by the node and never crosses the VPC fabric, so security groups do not apply to it (in AWS as in vpclab); no packet reaches the VPC router, db's ENI drops nothing | `same_node_strict_rp_filter` | `same_node_loose_rp_filter` |
//!
//!
//! Egress outside the VPC (issue 44, case 3), on a VPC whose internet route is a NAT gateway:
//!
//! | cell | outcome | strict | loose |
//! | --- | --- | --- | --- |
//! | db pod (A, `strict`, the default) with db's outbound rule revoked → the internet, → a non-VPC address (TEST-NET-1, as on-premises) | denied at db's ENI, whose counter counts them: the pod leaves by its own ENI, not SNATed through eth0 | `own_eni_egress_strict_rp_filter` | `own_eni_egress_loose_rp_filter` |
//! | db pod (A) once db has an outbound rule → the internet | allowed through the NAT gateway (the server sees its public address), the VPC router sees the pod's own address; the node's rules skip strict-egress pods (`strict_egress_problems` is empty) | `own_eni_egress_strict_rp_filter` | `own_eni_egress_loose_rp_filter` |
//! | app pod (A, `egressMode: standard`, app with no outbound rule) → the internet; no-profile pod (A) → the internet | allowed: SNATed to A's primary IP and out of eth0 (eth0's groups judge it); the VPC router never sees the pod's address | `own_eni_egress_strict_rp_filter` | `own_eni_egress_loose_rp_filter` |
//!
//! The same-node cell is the limit operators must know: a profile's groups filter what comes from
//! other nodes (and the rest of the VPC), not pods of the same node. Needs what
//! `tests/datapath.rs` needs.

mod bins;
#[macro_use]
mod datapath_support;

use std::collections::BTreeMap;

use datapath_support::profiles::{NETWORK_ANNOTATION, ProfileDaemon, assert_on_network};
use datapath_support::*;
use eniipam_kubeapi::{Crd, FakeApiServer};
use ipnet::Ipv4Net;
use mockcloud::world::{Direction, IpPermission};
use mockcloud::{LaunchedInstance, MockCloud};
use serde_json::json;
use vpclab::{Egress, INTERNET_SERVER, NAT_GATEWAY_PUBLIC_IP, NetNs};

const DB_SUBNET: &str = "10.0.16.0/24";
const APP_SUBNET: &str = "10.0.17.0/24";
const NODE_A: &str = "node-a";
const NODE_B: &str = "node-b";
/// The namespace whose annotation selects `app`.
const SHOP: &str = "shop";

/// What the cells' cloud holds besides the two nodes.
struct Net {
    db_sg: String,
    app_sg: String,
    db_subnet: String,
    app_subnet: String,
    /// The VPC's default group (eth0's, so the no-profile pods').
    default_sg: String,
}

/// `db`'s only ingress rule: TCP [`ECHO_PORT`] from members of `app`.
fn db_rule(app_sg: &str) -> IpPermission {
    IpPermission {
        ip_protocol: "tcp".into(),
        from_port: Some(i32::from(ECHO_PORT)),
        to_port: Some(i32::from(ECHO_PORT)),
        ip_ranges: vec![],
        ipv6_ranges: vec![],
        groups: vec![app_sg.to_owned()],
    }
}

/// `app`'s only ingress rule: ICMP echo requests (type 8, any code) from members of `db`.
fn app_rule(db_sg: &str) -> IpPermission {
    IpPermission {
        ip_protocol: "icmp".into(),
        from_port: Some(8),
        to_port: Some(-1),
        ip_ranges: vec![],
        ipv6_ranges: vec![],
        groups: vec![db_sg.to_owned()],
    }
}

/// The groups and the profiles' subnets, made in EC2 before the lab starts.
fn prepare(mock: &MockCloud, a: &LaunchedInstance) -> Net {
    let subnet = |s: &str| -> Ipv4Net { s.parse().expect("literal") };
    mock.with_world(|w, _| {
        let none = BTreeMap::new();
        let db_sg = w
            .create_security_group_named(Some(&a.vpc_id), "db", "db tier", &none)
            .expect("group db");
        let app_sg = w
            .create_security_group_named(Some(&a.vpc_id), "app", "app tier", &none)
            .expect("group app");
        w.change_rules(&db_sg, Direction::Ingress, &[db_rule(&app_sg)], true)
            .expect("db's rule");
        w.change_rules(&app_sg, Direction::Ingress, &[app_rule(&db_sg)], true)
            .expect("app's rule");
        let db_subnet = w
            .create_subnet(&a.vpc_id, subnet(DB_SUBNET), &a.availability_zone)
            .expect("db's subnet");
        let app_subnet = w
            .create_subnet_with_tags(
                &a.vpc_id,
                subnet(APP_SUBNET),
                &a.availability_zone,
                &BTreeMap::from([("tier".to_owned(), "app".to_owned())]),
            )
            .expect("app's subnet");
        Net {
            db_sg,
            app_sg,
            db_subnet,
            app_subnet,
            default_sg: a.security_groups[0].clone(),
        }
    })
}

/// The cluster, its groups and subnets, and the API-server double holding the two profiles and
/// namespace [`SHOP`] (annotated `app`).
async fn profiles_cluster(
    test: &str,
    rp_filter: RpFilter,
) -> Option<(Cluster, Net, FakeApiServer)> {
    profiles_cluster_via(test, Egress::InternetGateway, rp_filter).await
}

/// [`profiles_cluster`] on a VPC that reaches the internet by `egress`.
async fn profiles_cluster_via(
    test: &str,
    egress: Egress,
    rp_filter: RpFilter,
) -> Option<(Cluster, Net, FakeApiServer)> {
    let mut made = None;
    let c = Cluster::start_prepared(test, egress, rp_filter, |mock, a| {
        made = Some(prepare(mock, a));
    })
    .await?;
    let net = made.expect("prepared");
    let api = FakeApiServer::start().await;
    let crd = Crd::network_profile();
    api.install_crd(crd.clone());
    api.put_object(
        &crd,
        json!({"metadata": {"name": "db"},
               "spec": {"subnet": net.db_subnet, "securityGroups": [net.db_sg]}}),
    );
    api.put_object(
        &crd,
        json!({"metadata": {"name": "app"},
               "spec": {"subnetSelector": {"tags": {"tier": "app"}},
                        "securityGroups": [net.app_sg]}}),
    );
    api.put_namespace("default", &[]);
    api.put_namespace(SHOP, &[(NETWORK_ANNOTATION, "app")]);
    Some((c, net, api))
}

/// One ICMP echo from `from` to `to` that must be answered.
async fn pings(from: &NetNs, to: std::net::Ipv4Addr) {
    from.exec("ping", &["-c", "1", "-W", "2", &to.to_string()])
        .await
        .unwrap_or_else(|e| panic!("{} ping {to}: {e}", from.name()));
}

both_rp_filters!(across_nodes: across_nodes_strict_rp_filter, across_nodes_loose_rp_filter);
both_rp_filters!(revoke: revoke_strict_rp_filter, revoke_loose_rp_filter);
both_rp_filters!(same_node: same_node_strict_rp_filter, same_node_loose_rp_filter);
both_rp_filters!(own_eni_egress: own_eni_egress_strict_rp_filter, own_eni_egress_loose_rp_filter);

async fn across_nodes(test: &str, rp_filter: RpFilter) {
    let Some((c, net, api)) = profiles_cluster(test, rp_filter).await else {
        return;
    };
    let on_a = ProfileDaemon::start(&c, &api, &c.a.instance_id, NODE_A, Placement::Eth0).await;
    let on_b = ProfileDaemon::start(&c, &api, &c.b.instance_id, NODE_B, Placement::Eth0).await;
    let db_pod = on_a.add_pod(&c, &api, "default", "db-0", Some("db")).await;
    let app = on_b.add_pod(&c, &api, SHOP, "app-0", None).await;
    let plain = on_b.add_pod(&c, &api, "default", "plain-0", None).await;
    // In `shop` but opted out by its own empty annotation: the default network.
    let opted_out = on_b.add_pod(&c, &api, SHOP, "opted-out", Some("")).await;

    // Each pod's ENI, as EC2 describes it.
    assert_on_network(&c, &db_pod, Some("db"), &[&net.db_sg], &net.db_subnet);
    assert_on_network(&c, &app, Some("app"), &[&net.app_sg], &net.app_subnet);
    plain.assert_placed(Placement::Eth0);
    assert_on_network(&c, &plain, None, &[&net.default_sg], &c.b.subnet_id);
    opted_out.assert_placed(Placement::Eth0);
    assert_on_network(&c, &opted_out, None, &[&net.default_sg], &c.b.subnet_id);
    db_pod.assert_placed(Placement::SecondaryEni);
    app.assert_placed(Placement::SecondaryEni);

    let (_s_db, _s_app) = (serve(&db_pod.ns), serve(&app.ns));
    // app → db: allowed by db's rule; the reply passes app's ENI by conntrack alone.
    for _ in 0..3 {
        let r = reaches(&app.ns, db_pod.ip, ECHO_PORT).await;
        assert_eq!(r.server_saw.ip(), app.ip);
    }
    assert_eq!(c.lab.sg_drops(&db_pod.eni).await.expect("db's counter"), 0);
    assert_eq!(c.lab.sg_drops(&app.eni).await.expect("app's counter"), 0);

    // no profile → db: no rule lets the default group in.
    dropped(&plain.ns, db_pod.ip, ECHO_PORT).await;
    let at_db = c.lab.sg_drops(&db_pod.eni).await.expect("db's counter");
    assert!(
        at_db > 0,
        "the no-profile pod's SYNs are not counted at db's ENI"
    );
    dropped(&opted_out.ns, db_pod.ip, ECHO_PORT).await;
    let at_db2 = c.lab.sg_drops(&db_pod.eni).await.expect("db's counter");
    assert!(
        at_db2 > at_db,
        "the opted-out pod's SYNs are not counted at db's ENI"
    );
    let at_db = at_db2;

    // db → app: TCP has no rule in app (dropped at app's ENI), ICMP echo has one.
    dropped(&db_pod.ns, app.ip, ECHO_PORT).await;
    let at_app = c.lab.sg_drops(&app.eni).await.expect("app's counter");
    assert!(at_app > 0, "db's SYNs are not counted at app's ENI");
    pings(&db_pod.ns, app.ip).await;
    assert_eq!(
        c.lab.sg_drops(&app.eni).await.expect("app's counter"),
        at_app,
        "the allowed ping was counted as a drop"
    );
    // The allowed direction still works after the denied attempts.
    reaches(&app.ns, db_pod.ip, ECHO_PORT).await;
    assert_eq!(
        c.lab.sg_drops(&db_pod.eni).await.expect("db's counter"),
        at_db
    );
    c.assert_no_drops().await;
}

/// Authorizes (`true`) or revokes db's only ingress rule in mockcloud, and lets the lab follow.
async fn set_db_rule(c: &Cluster, net: &Net, authorized: bool) {
    c.mock
        .with_world(|w, _| {
            w.change_rules(
                &net.db_sg,
                Direction::Ingress,
                &[db_rule(&net.app_sg)],
                authorized,
            )
        })
        .unwrap_or_else(|e| panic!("setting db's rule to {authorized}: {e:?}"));
    c.lab.sync().await.expect("lab sync");
}

async fn revoke(test: &str, rp_filter: RpFilter) {
    let Some((c, net, api)) = profiles_cluster(test, rp_filter).await else {
        return;
    };
    let on_a = ProfileDaemon::start(&c, &api, &c.a.instance_id, NODE_A, Placement::Eth0).await;
    let on_b = ProfileDaemon::start(&c, &api, &c.b.instance_id, NODE_B, Placement::Eth0).await;
    let db_pod = on_a.add_pod(&c, &api, "default", "db-0", Some("db")).await;
    let app = on_b.add_pod(&c, &api, SHOP, "app-0", None).await;
    assert_on_network(&c, &db_pod, Some("db"), &[&net.db_sg], &net.db_subnet);
    let _s_db = serve(&db_pod.ns);
    assert_eq!(
        reaches(&app.ns, db_pod.ip, ECHO_PORT).await.server_saw.ip(),
        app.ip
    );
    assert_eq!(c.lab.sg_drops(&db_pod.eni).await.expect("db's counter"), 0);

    // RevokeSecurityGroupIngress on db's only rule: new connections from app are dropped.
    set_db_rule(&c, &net, false).await;
    dropped(&app.ns, db_pod.ip, ECHO_PORT).await;
    let after = c.lab.sg_drops(&db_pod.eni).await.expect("db's counter");
    assert!(
        after > 0,
        "the revoked connection's SYNs are not counted at db's ENI"
    );

    // Authorizing it again lets new connections in again.
    set_db_rule(&c, &net, true).await;
    reaches(&app.ns, db_pod.ip, ECHO_PORT).await;
    assert_eq!(
        c.lab.sg_drops(&db_pod.eni).await.expect("db's counter"),
        after
    );
    c.assert_no_drops().await;
}

async fn same_node(test: &str, rp_filter: RpFilter) {
    let Some((c, net, api)) = profiles_cluster(test, rp_filter).await else {
        return;
    };
    let d = ProfileDaemon::start(&c, &api, &c.a.instance_id, NODE_A, Placement::Eth0).await;
    let db_pod = d.add_pod(&c, &api, "default", "db-0", Some("db")).await;
    let app = d.add_pod(&c, &api, SHOP, "app-0", None).await;
    let plain = d.add_pod(&c, &api, "default", "plain-0", None).await;
    assert_on_network(&c, &db_pod, Some("db"), &[&net.db_sg], &net.db_subnet);
    assert_on_network(&c, &app, Some("app"), &[&net.app_sg], &net.app_subnet);
    assert_on_network(&c, &plain, None, &[&net.default_sg], &c.a.subnet_id);
    let node_a = c.node_ns(&c.a.instance_id);
    let probe_plain = FlowProbe::start(&c, &node_a, plain.ip, db_pod.ip).await;
    let probe_app = FlowProbe::start(&c, &node_a, app.ip, db_pod.ip).await;
    let _s_db = serve(&db_pod.ns);
    // Both reach db, the no-profile pod too: `db`'s rule is never consulted.
    for from in [&app, &plain] {
        assert_eq!(
            reaches(&from.ns, db_pod.ip, ECHO_PORT)
                .await
                .server_saw
                .ip(),
            from.ip
        );
    }
    // Neither flow left node A by an ENI or reached the VPC router, so the fabric (and its
    // groups) never saw them.
    assert_eq!(probe_plain.packets().await, (0, 0));
    assert_eq!(probe_app.packets().await, (0, 0));
    assert_eq!(c.lab.sg_drops(&db_pod.eni).await.expect("db's counter"), 0);
    c.assert_no_drops().await;
}

/// A group's rule letting everything out (what EC2 gives a new group), or TCP [`ECHO_PORT`] out
/// to anywhere.
fn outbound(all: bool) -> IpPermission {
    IpPermission {
        ip_protocol: if all { "-1" } else { "tcp" }.into(),
        from_port: (!all).then_some(i32::from(ECHO_PORT)),
        to_port: (!all).then_some(i32::from(ECHO_PORT)),
        ip_ranges: vec!["0.0.0.0/0".parse().expect("literal")],
        ipv6_ranges: if all {
            vec!["::/0".parse().expect("literal")]
        } else {
            vec![]
        },
        groups: vec![],
    }
}

/// Authorizes (`true`) or revokes `rule` among `group`'s outbound rules, and lets the lab follow.
async fn set_outbound(c: &Cluster, group: &str, rule: IpPermission, authorized: bool) {
    c.mock
        .with_world(|w, _| w.change_rules(group, Direction::Egress, &[rule], authorized))
        .unwrap_or_else(|e| panic!("outbound rule of {group} to {authorized}: {e:?}"));
    c.lab.sync().await.expect("lab sync");
}

/// A non-VPC address with no host behind it (TEST-NET-1), as a peered VPC or on-premises is.
const OUTSIDE: std::net::Ipv4Addr = std::net::Ipv4Addr::new(192, 0, 2, 10);

async fn own_eni_egress(test: &str, rp_filter: RpFilter) {
    let Some((c, net, api)) = profiles_cluster_via(test, Egress::NatGateway, rp_filter).await
    else {
        return;
    };
    // `app` asks for the VPC CNI's standard mode; `db` says nothing: strict.
    api.put_object(
        &Crd::network_profile(),
        json!({"metadata": {"name": "app"},
               "spec": {"subnetSelector": {"tags": {"tier": "app"}},
                        "securityGroups": [net.app_sg], "egressMode": "standard"}}),
    );
    // Neither profile's group lets anything out.
    set_outbound(&c, &net.db_sg, outbound(true), false).await;
    set_outbound(&c, &net.app_sg, outbound(true), false).await;
    let d = ProfileDaemon::start(&c, &api, &c.a.instance_id, NODE_A, Placement::Eth0).await;
    let rules = d.rules().await.expect("the node's rules");
    assert_eq!(
        eniipam::host::snat::strict_egress_problems(&rules),
        Vec::<String>::new(),
        "{rules}"
    );
    let db_pod = d.add_pod(&c, &api, "default", "db-0", Some("db")).await;
    let app = d.add_pod(&c, &api, SHOP, "app-0", None).await;
    let plain = d.add_pod(&c, &api, "default", "plain-0", None).await;
    assert_on_network(&c, &db_pod, Some("db"), &[&net.db_sg], &net.db_subnet);
    assert_on_network(&c, &app, Some("app"), &[&net.app_sg], &net.app_subnet);
    let _internet = serve(c.lab.internet());
    let node_a = c.node_ns(&c.a.instance_id);
    // Only db's host veth is in the strict-egress link group (app is `standard`, plain has none).
    let group = eniipam_api::OWN_ENI_EGRESS_LINK_GROUP.to_string();
    let in_group = node_a
        .ip(&["-o", "link", "show", "group", &group])
        .await
        .expect("ip link show group");
    assert_eq!(in_group.lines().count(), 1, "{in_group}");

    // db, no outbound rule: the internet and a non-VPC address are denied at db's own ENI.
    dropped(&db_pod.ns, INTERNET_SERVER, ECHO_PORT).await;
    let at_db = c.lab.sg_drops(&db_pod.eni).await.expect("db's counter");
    assert!(
        at_db > 0,
        "db's SYNs to the internet left by another ENI than db's (SNATed by eth0?)"
    );
    let _ = vpclab::echo(
        &db_pod.ns,
        std::net::SocketAddr::from((OUTSIDE, ECHO_PORT)),
        &vpclab::EchoOptions {
            timeout: std::time::Duration::from_millis(800),
            ..Default::default()
        },
    )
    .await;
    let at_db2 = c.lab.sg_drops(&db_pod.eni).await.expect("db's counter");
    assert!(
        at_db2 > at_db,
        "db's SYNs to {OUTSIDE} were not denied at db's ENI"
    );

    // With an outbound rule: through the NAT gateway, the VPC seeing db's own address.
    set_outbound(&c, &net.db_sg, outbound(false), true).await;
    let probe_db = FlowProbe::start(&c, &node_a, db_pod.ip, INTERNET_SERVER).await;
    let r = reaches(&db_pod.ns, INTERNET_SERVER, ECHO_PORT).await;
    assert_eq!(r.server_saw.ip(), NAT_GATEWAY_PUBLIC_IP);
    let (_, at_vpc) = probe_db.packets().await;
    assert!(at_vpc > 0, "the VPC router never saw db's own address");

    // `standard` and the default network: SNATed to A's primary IP, out of eth0 (eth0's groups
    // let them out; app's have no outbound rule), the VPC never seeing the pod's address.
    for pod in [&app, &plain] {
        let probe = FlowProbe::start(&c, &node_a, pod.ip, INTERNET_SERVER).await;
        let r = reaches(&pod.ns, INTERNET_SERVER, ECHO_PORT).await;
        assert_eq!(r.server_saw.ip(), NAT_GATEWAY_PUBLIC_IP, "{}", pod.name);
        assert_eq!(
            probe.packets().await.1,
            0,
            "{}: the VPC saw its address",
            pod.name
        );
    }
    assert_eq!(c.lab.sg_drops(&app.eni).await.expect("app's counter"), 0);
    c.assert_no_drops().await;
}
