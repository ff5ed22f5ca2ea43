//! Custom networking on the emulated VPC (issue 27, the custom-networking cell): the VPC is
//! 10.0.0.0/16 plus a secondary block 100.64.0.0/16 with a pod subnet in node A's AZ; node A's
//! real `eniipamd` puts pods only there (on secondary ENIs; eth0 serves none), node B runs the
//! default configuration (pods on eth0, in the node subnet). Every cell asserts the source the
//! server saw and 0 source/destination-check drops, under strict and loose `rp_filter` where the
//! traffic leaves the node.
//!
//! | cell | strict | loose |
//! | --- | --- | --- |
//! | custom pod ↔ node-subnet pod on B, custom pod → B's primary IP, B → custom pod | `across_nodes_strict_rp_filter` | `across_nodes_loose_rp_filter` |
//! | custom pod ↔ custom pod on A, A → its custom pod | `same_node_strict_rp_filter` | `same_node_loose_rp_filter` |
//! | custom pod → internet by the IGW: SNAT to A's primary IP | `internet_strict_rp_filter` | `internet_loose_rp_filter` |
//! | custom pod → internet by a NAT gateway | `nat_gateway_strict_rp_filter` | `nat_gateway_loose_rp_filter` |
//!
//! Node A runs in custom networking ([`start_custom`]): its ENIConfig, named after its zone as the
//! VPC CNI's users name them, comes from the API-server double through a port forward into the node,
//! as a cluster migrating from aws-node has it. Needs what `tests/datapath.rs` needs.

mod bins;
#[macro_use]
mod datapath_support;

use datapath_support::*;

use eniipam_kubeapi::{Crd, FakeApiServer, eniconfig_json};
use ipnet::Ipv4Net;
use mockcloud::{LaunchedInstance, MockCloud};
use vpclab::{Egress, INTERNET_SERVER, NAT_GATEWAY_PUBLIC_IP, PortForward};

/// The VPC's secondary block and the pod subnet in it.
const POD_BLOCK: &str = "100.64.0.0/16";
const POD_SUBNET: &str = "100.64.0.0/19";

fn pod_block() -> Ipv4Net {
    POD_BLOCK.parse().expect("literal")
}

/// A cluster whose VPC has the pod block and subnet (created before the lab starts); the pod
/// subnet's id and the security group node A's pod ENIs get.
async fn custom_cluster(
    test: &str,
    egress: Egress,
    rp_filter: RpFilter,
) -> Option<(Cluster, String, String)> {
    let mut made = None;
    let c = Cluster::start_prepared(
        test,
        egress,
        rp_filter,
        |mock: &MockCloud, a: &LaunchedInstance| {
            mock.associate_vpc_cidr_block(&a.vpc_id, pod_block())
                .expect("associate the pod block");
            let subnet = mock
                .create_subnet(
                    &a.vpc_id,
                    POD_SUBNET.parse().expect("literal"),
                    &a.availability_zone,
                )
                .expect("the pod subnet");
            made = Some((subnet, a.security_groups[0].clone()));
        },
    )
    .await?;
    let (subnet, sg) = made.expect("prepared");
    Some((c, subnet, sg))
}

/// Node A's `eniipamd` in custom networking, as a cluster migrating from aws-node runs it: the
/// ENIConfig named after the zone (`spec.subnet` the pod subnet, `spec.securityGroups` `sg`) served by
/// the API-server double, reached from inside node A through a port forward; the node labelled with
/// its zone.
struct CustomDaemon {
    daemon: Daemon,
    api: FakeApiServer,
    _forward: PortForward,
}

impl CustomDaemon {
    /// Puts the pod in the API server, bound to node A (the kubelet only runs the ADD of a pod the
    /// API server has; the daemon's NetworkPolicy gate reads its labels), then runs its CNI ADD.
    async fn add_pod(&self, c: &Cluster, name: &str, opts: PodOptions) -> CniPod {
        self.api.put_pod(eniipam_kubeapi::pod_json(
            "default",
            name,
            &format!("uid-{name}"),
            NODE_A,
            "Pending",
        ));
        self.daemon.add_pod(c, name, opts).await
    }
}

impl std::ops::Deref for CustomDaemon {
    type Target = Daemon;
    fn deref(&self) -> &Daemon {
        &self.daemon
    }
}

impl std::ops::DerefMut for CustomDaemon {
    fn deref_mut(&mut self) -> &mut Daemon {
        &mut self.daemon
    }
}

const NODE_A: &str = "node-a";
const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

async fn start_custom(c: &Cluster, subnet: &str, sg: &str) -> CustomDaemon {
    let api = FakeApiServer::start().await;
    api.install_crd(Crd::eniconfig());
    let (forward, url) = forward_api(c, &api, &c.a.instance_id, NODE_A).await;
    api.set_node_label(NODE_A, ZONE_LABEL, Some(&c.a.availability_zone));
    api.put_object(
        &Crd::eniconfig(),
        eniconfig_json(&c.a.availability_zone, subnet, Some(&[sg])),
    );
    let env = [
        ("ENIIPAM_CUSTOM_NETWORKING", "true"),
        ("ENIIPAM_ENI_CONFIG_LABEL", ZONE_LABEL),
        ("ENIIPAM_API_SERVER_URL", url.as_str()),
        ("ENIIPAM_API_SERVER_GC", "false"),
        ("ENIIPAM_NODE_CONDITION", "false"),
        ("ENIIPAM_NODE_NAME", NODE_A),
    ];
    let daemon = Daemon::start(c, &c.a.instance_id, Placement::SecondaryEni, &env).await;
    CustomDaemon {
        daemon,
        api,
        _forward: forward,
    }
}

/// The pod is in the pod block, on a secondary ENI of the pod subnet, and node A's eth0 holds no
/// pod address.
fn assert_custom(c: &Cluster, subnet: &str, p: &CniPod) {
    assert!(
        pod_block().contains(&p.ip),
        "{} is outside {POD_BLOCK}",
        p.ip
    );
    p.assert_placed(Placement::SecondaryEni);
    let enis = c.mock.network_interfaces();
    let eni = enis.iter().find(|e| e.id == p.eni).expect("the pod's ENI");
    assert_eq!(
        eni.subnet_id, subnet,
        "{}'s ENI is not in the pod subnet",
        p.name
    );
    let eth0 = enis
        .iter()
        .find(|e| e.id == c.a.primary_eni)
        .expect("A's primary ENI");
    assert!(
        eth0.secondary_ips.is_empty() && eth0.ipv4_prefixes.is_empty(),
        "eth0 holds pod addresses: {:?} {:?}",
        eth0.secondary_ips,
        eth0.ipv4_prefixes
    );
}

both_rp_filters!(across_nodes: across_nodes_strict_rp_filter, across_nodes_loose_rp_filter);
both_rp_filters!(same_node: same_node_strict_rp_filter, same_node_loose_rp_filter);
both_rp_filters!(internet: internet_strict_rp_filter, internet_loose_rp_filter);
both_rp_filters!(nat_gateway: nat_gateway_strict_rp_filter, nat_gateway_loose_rp_filter);

async fn across_nodes(test: &str, rp_filter: RpFilter) {
    let Some((c, subnet, sg)) = custom_cluster(test, Egress::InternetGateway, rp_filter).await
    else {
        return;
    };
    let da = start_custom(&c, &subnet, &sg).await;
    let db = Daemon::start(&c, &c.b.instance_id, Placement::Eth0, &[]).await;
    let pa = da.add_pod(&c, "custom-a", PodOptions::default()).await;
    let pb = db.add_pod(&c, "plain-b", PodOptions::default()).await;
    assert_custom(&c, &subnet, &pa);
    pb.assert_placed(Placement::Eth0);
    assert!(c.a.private_ip.octets()[0] == 10 && pb.ip.octets()[0] == 10);
    let (_sa, _sb) = (serve(&pa.ns), serve(&pb.ns));
    // No SNAT inside the VPC, whichever block: each side sees the other pod's own address.
    assert_eq!(
        reaches(&pa.ns, pb.ip, ECHO_PORT).await.server_saw.ip(),
        pa.ip
    );
    assert_eq!(
        reaches(&pb.ns, pa.ip, ECHO_PORT).await.server_saw.ip(),
        pb.ip
    );
    // The custom pod → node B's primary IP (a host-network server), and node B → the custom pod.
    let node_b = c.node_ns(&c.b.instance_id);
    let _on_b = serve(&node_b);
    assert_eq!(
        reaches(&pa.ns, c.b.private_ip, ECHO_PORT)
            .await
            .server_saw
            .ip(),
        pa.ip
    );
    assert_eq!(
        reaches(&node_b, pa.ip, ECHO_PORT).await.server_saw.ip(),
        c.b.private_ip
    );
    c.assert_no_drops().await;
}

async fn same_node(test: &str, rp_filter: RpFilter) {
    let Some((c, subnet, sg)) = custom_cluster(test, Egress::InternetGateway, rp_filter).await
    else {
        return;
    };
    let d = start_custom(&c, &subnet, &sg).await;
    let p1 = d.add_pod(&c, "custom-1", PodOptions::default()).await;
    let p2 = d.add_pod(&c, "custom-2", PodOptions::default()).await;
    assert_custom(&c, &subnet, &p1);
    assert_custom(&c, &subnet, &p2);
    let (_s1, _s2) = (serve(&p1.ns), serve(&p2.ns));
    assert_eq!(
        reaches(&p1.ns, p2.ip, ECHO_PORT).await.server_saw.ip(),
        p1.ip
    );
    assert_eq!(
        reaches(&p2.ns, p1.ip, ECHO_PORT).await.server_saw.ip(),
        p2.ip
    );
    // The kubelet's probes: node A → its own custom pod, from A's primary IP.
    let node_a = c.node_ns(&c.a.instance_id);
    assert_eq!(
        reaches(&node_a, p1.ip, ECHO_PORT).await.server_saw.ip(),
        c.a.private_ip
    );
    c.assert_no_drops().await;
}

async fn internet(test: &str, rp_filter: RpFilter) {
    let Some((c, subnet, sg)) = custom_cluster(test, Egress::InternetGateway, rp_filter).await
    else {
        return;
    };
    let d = start_custom(&c, &subnet, &sg).await;
    let p = d.add_pod(&c, "egress", PodOptions::default()).await;
    assert_custom(&c, &subnet, &p);
    let _internet = serve(c.lab.internet());
    // Outside every VPC block: SNAT to eth0's primary IP, the address the IGW lets through.
    for _ in 0..3 {
        let r = reaches(&p.ns, INTERNET_SERVER, ECHO_PORT).await;
        assert_eq!(r.server_saw.ip(), c.a.private_ip);
    }
    assert_eq!(c.lab.igw_drops().await.expect("igw").egress_not_public, 0);
    c.assert_no_drops().await;
}

async fn nat_gateway(test: &str, rp_filter: RpFilter) {
    let Some((c, subnet, sg)) = custom_cluster(test, Egress::NatGateway, rp_filter).await else {
        return;
    };
    let d = start_custom(&c, &subnet, &sg).await;
    let p = d.add_pod(&c, "egress", PodOptions::default()).await;
    assert_custom(&c, &subnet, &p);
    let _internet = serve(c.lab.internet());
    let node_b = c.node_ns(&c.b.instance_id);
    let _on_b = serve(&node_b);
    // SNAT to the node's address, then the NAT gateway's translation.
    let r = reaches(&p.ns, INTERNET_SERVER, ECHO_PORT).await;
    assert_eq!(r.server_saw.ip(), NAT_GATEWAY_PUBLIC_IP);
    // Inside the VPC the pod keeps its own address.
    assert_eq!(
        reaches(&p.ns, c.b.private_ip, ECHO_PORT)
            .await
            .server_saw
            .ip(),
        p.ip
    );
    c.assert_no_drops().await;
}

/// Node A's daemon read both VPC blocks from IMDS: its SNAT leaves 100.64.0.0/16 alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snat_excludes_every_vpc_block() {
    let test = "snat_excludes_every_vpc_block";
    let Some((c, subnet, sg)) =
        custom_cluster(test, Egress::InternetGateway, RpFilter::Strict).await
    else {
        return;
    };
    let d = start_custom(&c, &subnet, &sg).await;
    let rules = d.rules().await.expect("host rules");
    for block in ["10.0.0.0/16", POD_BLOCK] {
        assert!(rules.contains(block), "{block} missing from:\n{rules}");
    }
}
