//! The world of `tests/datapath_policy.rs`'s matrix tests: a lab of the emulated VPC, the
//! API-server double, the real daemons of its topology and upstream's nine pods serving, and the
//! policies put in the API server. The shared upstream cases are dealt over [`LABS`] such worlds
//! run side by side (issue 45): a case's time is mostly its sweep waiting out the silence of the
//! denied cells, and worlds of their own wait it out together. Each case replaces the policies of
//! the one before it in its world, and is judged on the whole matrix, as before.

use std::collections::BTreeMap;

use eniipam_kubeapi::FakeApiServer;
use serde_json::Value;
use vpclab::Egress;

use crate::datapath_support::policy::*;
use crate::datapath_support::*;
use crate::netpol_cases;
use crate::{IN_FORCE_WITHIN, NAMESPACES, NODE_A, NODE_B, PODS};

/// How many worlds a matrix test deals the shared cases over.
pub const LABS: usize = 2;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Topology {
    /// The nine pods on node A (secondary ENIs).
    OneNode,
    /// Pods `a` on node A (secondary ENIs), pods `b` and `c` on node B (eth0).
    TwoNodes,
}

pub struct World {
    pub c: Cluster,
    pub api: FakeApiServer,
    pub on_a: PolicyDaemon,
    pub on_b: Option<PolicyDaemon>,
    pub pods: BTreeMap<String, PolicyPod>,
    pub servers: Vec<Servers>,
    /// The policies put in the API server, (namespace, name).
    applied: Vec<(String, String)>,
    topology: Topology,
}

impl World {
    /// The lab, its daemons and pods, every pod serving, and the open matrix in force.
    pub async fn start(test: &str, rp_filter: RpFilter, topology: Topology) -> Option<World> {
        let c = Cluster::start_with(test, Egress::InternetGateway, rp_filter).await?;
        let api = FakeApiServer::start().await;
        for ns in NAMESPACES {
            api.put_namespace_labels(ns, &[("ns", ns)]);
        }
        let on_a =
            PolicyDaemon::start(&c, &api, &c.a.instance_id, NODE_A, Placement::SecondaryEni).await;
        let on_b = match topology {
            Topology::OneNode => None,
            Topology::TwoNodes => {
                Some(PolicyDaemon::start(&c, &api, &c.b.instance_id, NODE_B, Placement::Eth0).await)
            }
        };
        let mut pods = BTreeMap::new();
        for ns in NAMESPACES {
            for name in PODS {
                let d = match &on_b {
                    Some(b) if name != "a" => b,
                    _ => &on_a,
                };
                let pod = d.add_pod(&c, &api, ns, name, None).await;
                pods.insert(pod.key.clone(), pod);
            }
        }
        c.lab.sync().await.expect("lab sync");
        let mut servers = Vec::new();
        for pod in pods.values() {
            servers.push(serve_ports(&pod.cni.ns).await);
        }
        let world = World {
            c,
            api,
            on_a,
            on_b,
            pods,
            servers,
            applied: Vec::new(),
            topology,
        };
        let cells = all_cells(&world.pods);
        let open = expected(&model(&world.pods, &[]), &cells);
        until_matrix(
            "no policy",
            &world.pods,
            &cells,
            &open,
            IN_FORCE_WITHIN,
            || world.logs(),
        )
        .await;
        Some(world)
    }

    pub fn daemons(&self) -> Vec<&PolicyDaemon> {
        [Some(&self.on_a), self.on_b.as_ref()]
            .into_iter()
            .flatten()
            .collect()
    }

    /// The daemons' logs, for a failure.
    pub fn logs(&self) -> String {
        self.daemons()
            .iter()
            .map(|d| format!("{} daemon:\n{}", d.node, d.tail()))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Puts `policies` in the API server and deletes the others put before, then waits for every
    /// daemon to count a sync ([`synced_since`]).
    pub async fn set_policies(&mut self, policies: &[Value]) {
        let before = syncs(&self.daemons()).await;
        let key = |p: &Value| {
            (
                p["metadata"]["namespace"].as_str().unwrap().to_owned(),
                p["metadata"]["name"].as_str().unwrap().to_owned(),
            )
        };
        let wanted: Vec<(String, String)> = policies.iter().map(key).collect();
        for (ns, name) in self.applied.iter().filter(|k| !wanted.contains(k)) {
            assert!(
                self.api.delete_network_policy(ns, name),
                "{ns}/{name} was put"
            );
        }
        for p in policies {
            self.api.put_network_policy(p.clone());
        }
        self.applied = wanted;
        synced_since(&self.daemons(), &before).await;
    }

    /// The shared cases whose index is `share` modulo [`LABS`], in turn: each case's policies put
    /// (the previous case's deleted), and the whole matrix probed until it is the model's. How
    /// many cases it ran.
    pub async fn cases(&mut self, test: &str, share: usize) -> usize {
        let cells = all_cells(&self.pods);
        let pods = self.pods.clone();
        let cases = netpol_cases::cases(|ns, p| pods[&format!("{ns}/{p}")].cni.ip);
        let mut ran = 0;
        for case in cases.iter().skip(share).step_by(LABS) {
            self.set_policies(&case.policies).await;
            let want = expected(&model(&self.pods, &case.policies), &cells);
            if self.topology == Topology::TwoNodes {
                assert_crosses_nodes(case.name, &self.pods, &want);
            }
            let denied = want.values().filter(|w| !**w).count();
            let rounds = until_matrix(
                case.name,
                &self.pods,
                &cells,
                &want,
                IN_FORCE_WITHIN,
                || self.logs(),
            )
            .await;
            eprintln!(
                "{test} (lab {share}): {}: {denied} of {} cells denied, in force after {rounds} round(s)",
                case.name,
                cells.len()
            );
            ran += 1;
        }
        ran
    }
}

/// In the two-node topology, a case's cells that cross the VPC include allowed ones and, when the
/// case denies anything, denied ones.
fn assert_crosses_nodes(
    case: &str,
    pods: &BTreeMap<String, PolicyPod>,
    want: &BTreeMap<Cell, bool>,
) {
    let across = |allowed: bool| {
        want.iter()
            .filter(|(c, w)| **w == allowed && pods[&c.client].node != pods[&c.server].node)
            .count()
    };
    assert!(across(true) > 0, "{case}: no allowed cell crosses nodes");
    if want.values().any(|w| !w) {
        assert!(across(false) > 0, "{case}: no denied cell crosses nodes");
    }
}
