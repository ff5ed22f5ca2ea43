//! The generated cluster: 50 namespaces of 100 pods (5,000), 20 policies each (1,000), a node
//! with 110 of the pods; and the changes the scenario times, each a new cluster state and the
//! object written to the API server ([`Change`]).
//!
//! Pod addresses are every other address of 10.64.0.0/16, so a peer set of N pods holds N
//! elements (no two pods' addresses merge into one range): the sets are as large as the pods
//! they name. Two of the local pods, in namespace `bench`, carry the packet-cost traffic: a
//! policy isolates both ways every pod of `bench` and allows every pod of the cluster, a peer set
//! of ~5,000 elements on each side.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};

use anyhow::Context;

use eniipam::network_policy::enforce::LocalAttachment;
use eniipam::network_policy::{Cluster, NamedPort, PodView, Protocol};
use eniipam_kubeapi::{FakeApiServer, pod_json};
use serde_json::{Value, json};

pub const NAMESPACES: usize = 50;
pub const PODS_PER_NAMESPACE: usize = 100;
pub const POLICIES_PER_NAMESPACE: usize = 20;
/// Local pods: 108 generated ones and the two of `bench`.
pub const LOCAL_PODS: usize = 110;
/// The packet-cost pods' namespace and addresses.
pub const BENCH_NS: &str = "bench";
pub const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 1);
pub const SERVER_IP: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 2);

fn ns_name(n: usize) -> String {
    format!("ns{n:02}")
}

/// Generated pod `i`'s address: every other address, so no two merge into a range.
fn pod_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 64, 0, 0)) + 2 * i as u32)
}

fn pod(ns: &str, name: String, ip: Ipv4Addr, app: usize, tier: &str) -> PodView {
    PodView {
        namespace: ns.into(),
        name,
        labels: BTreeMap::from([
            ("app".to_owned(), format!("app{app}")),
            ("tier".to_owned(), tier.to_owned()),
        ]),
        ips: vec![IpAddr::V4(ip)],
        host_network: false,
        ports: vec![
            NamedPort {
                name: "http".into(),
                protocol: Protocol::Tcp,
                port: 8080,
            },
            NamedPort {
                name: "metrics".into(),
                protocol: Protocol::Tcp,
                port: 9090,
            },
        ],
    }
}

fn policy(ns: &str, name: &str, spec: Value) -> Value {
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
           "metadata": {"namespace": ns, "name": name}, "spec": spec})
}

/// Policy `k` of namespace `n`, in one of five shapes (a default-deny with an allow, ingress
/// from selected namespaces' pods on ports and a range, egress to every namespace's API pods on
/// a named port plus a block and DNS, ingress from the next namespace and a block, metrics
/// scraping of every pod), `version` varying its ports (a changed policy).
pub fn policy_of(n: usize, k: usize, version: u16) -> Value {
    let ns = ns_name(n);
    let app = (k + n) % 20;
    let name = format!("pol{k:02}");
    let spec = match k % 5 {
        0 => json!({"podSelector": {"matchLabels": {"tier": "db"}}, "policyTypes": ["Ingress"],
                    "ingress": [{"from": [{"podSelector": {"matchLabels": {"tier": "api"}}}],
                                 "ports": [{"port": 5432 + version}]}]}),
        1 => json!({"podSelector": {"matchLabels": {"app": format!("app{app}")}},
                    "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": format!("team{}", k % 5)}},
                                           "podSelector": {"matchLabels": {"tier": "web"}}}],
                                 "ports": [{"port": 8080 + version}, {"port": 8443, "endPort": 8450}]}]}),
        2 => {
            json!({"podSelector": {"matchLabels": {"app": format!("app{app}")}}, "policyTypes": ["Egress"],
                    "egress": [{"to": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"tier": "api"}}}],
                                "ports": [{"port": "http"}]},
                               {"to": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.64.0.0/16"]}}]},
                               {"ports": [{"port": 53 + version, "protocol": "UDP"}]}]})
        }
        3 => json!({"podSelector": {"matchLabels": {"app": format!("app{app}"), "tier": "api"}},
                    "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns_name((n + 1) % NAMESPACES)}}},
                                          {"ipBlock": {"cidr": "172.16.0.0/12"}}]}]}),
        _ => json!({"podSelector": {},
                    "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "team0"}},
                                           "podSelector": {"matchLabels": {"app": "app0"}}}],
                                 "ports": [{"port": "metrics"}, {"port": 9100 + version}]}]}),
    };
    policy(&ns, &name, spec)
}

/// The node's name in the API server (its pods' `spec.nodeName`).
pub const NODE: &str = "bench-node";

/// A pod as the API server holds it: labels, container ports and `status.podIP(s)` from `p`.
pub fn pod_object(p: &PodView, node: &str) -> Value {
    let mut o = pod_json(
        &p.namespace,
        &p.name,
        &format!("uid-{}-{}", p.namespace, p.name),
        node,
        "Running",
    );
    o["metadata"]["labels"] = json!(p.labels);
    o["spec"]["containers"][0]["ports"] = p
        .ports
        .iter()
        .map(|n| json!({"name": n.name, "containerPort": n.port, "protocol": n.protocol.as_str()}))
        .collect();
    let ips: Vec<String> = p.ips.iter().map(ToString::to_string).collect();
    o["status"]["podIP"] = json!(ips.first());
    o["status"]["podIPs"] = ips.iter().map(|ip| json!({"ip": ip})).collect();
    o
}

/// One change of the cluster, as written to the API server.
pub enum Change {
    PutPod(Value),
    DeletePod { namespace: String, name: String },
    PutPolicy(Value),
    DeletePolicy { namespace: String, name: String },
}

impl Change {
    pub fn apply(&self, api: &FakeApiServer) -> anyhow::Result<()> {
        let done = match self {
            Change::PutPod(pod) => {
                api.put_pod(pod.clone());
                true
            }
            Change::DeletePod { namespace, name } => api.delete_pod(namespace, name),
            Change::PutPolicy(policy) => {
                api.put_network_policy(policy.clone());
                true
            }
            Change::DeletePolicy { namespace, name } => api.delete_network_policy(namespace, name),
        };
        anyhow::ensure!(done, "the API server has no such object to delete");
        Ok(())
    }

    fn delete_pod(p: &PodView) -> Self {
        Change::DeletePod {
            namespace: p.namespace.clone(),
            name: p.name.clone(),
        }
    }
}

fn policy_key(p: &Value) -> (String, String) {
    let key = |k: &str| p["metadata"][k].as_str().unwrap_or_default().to_owned();
    (key("namespace"), key("name"))
}

/// The cluster and the node's pods (indices into `cluster.pods`).
pub struct World {
    pub cluster: Cluster,
    pub local: Vec<usize>,
}

impl World {
    pub fn generate() -> anyhow::Result<Self> {
        let mut cluster = Cluster::default();
        for n in 0..NAMESPACES {
            let ns = ns_name(n);
            cluster.namespaces.insert(
                ns.clone(),
                BTreeMap::from([
                    ("kubernetes.io/metadata.name".to_owned(), ns),
                    ("team".to_owned(), format!("team{}", n % 5)),
                ]),
            );
        }
        cluster.namespaces.insert(
            BENCH_NS.into(),
            BTreeMap::from([(
                "kubernetes.io/metadata.name".to_owned(),
                BENCH_NS.to_owned(),
            )]),
        );
        for i in 0..NAMESPACES * PODS_PER_NAMESPACE {
            let ns = ns_name(i % NAMESPACES);
            let tier = ["web", "api", "db"][(i / NAMESPACES) % 3];
            cluster.pods.push(pod(
                &ns,
                format!("p{i:04}"),
                pod_ip(i),
                (i / NAMESPACES) % 20,
                tier,
            ));
        }
        // Generated pods 0..108 are spread over the namespaces (pod i is in namespace i % 50).
        let mut local: Vec<usize> = (0..LOCAL_PODS - 2).collect();
        for (name, ip) in [("client", CLIENT_IP), ("server", SERVER_IP)] {
            local.push(cluster.pods.len());
            cluster
                .pods
                .push(pod(BENCH_NS, name.into(), ip, 0, "bench"));
        }
        for n in 0..NAMESPACES {
            for k in 0..POLICIES_PER_NAMESPACE - usize::from(n == 0) {
                cluster
                    .policies
                    .push(serde_json::from_value(policy_of(n, k, 0))?);
            }
        }
        // The packet-cost policy: both bench pods isolated both ways, every pod a peer.
        cluster.policies.push(serde_json::from_value(policy(
            BENCH_NS,
            "everyone",
            json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"],
                   "ingress": [{"from": [{"namespaceSelector": {}}]}],
                   "egress": [{"to": [{"namespaceSelector": {}}]}]}),
        ))?);
        Ok(Self { cluster, local })
    }

    /// Writes the whole cluster to the API server: namespaces, pods (the local ones bound to
    /// [`NODE`]), policies.
    pub fn load(&self, api: &FakeApiServer) -> anyhow::Result<()> {
        for (name, labels) in &self.cluster.namespaces {
            let labels: Vec<(&str, &str)> = labels
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            api.put_namespace_labels(name, &labels);
        }
        for (i, p) in self.cluster.pods.iter().enumerate() {
            let node = if self.local.contains(&i) {
                NODE
            } else {
                "other"
            };
            api.put_pod(pod_object(p, node));
        }
        for p in &self.cluster.policies {
            api.put_network_policy(serde_json::to_value(p)?);
        }
        Ok(())
    }

    /// The node's pods as the daemon's pool knows them.
    pub fn attachments(&self) -> Vec<LocalAttachment> {
        self.local
            .iter()
            .map(|&i| {
                let p = &self.cluster.pods[i];
                LocalAttachment {
                    namespace: p.namespace.clone(),
                    name: p.name.clone(),
                    veth: veth_of(p),
                    ips: p.ips.clone(),
                    container_id: format!("c{i}"),
                    held_for: std::time::Duration::ZERO,
                }
            })
            .collect()
    }

    /// A remote pod that many local pods' peer sets name (tier `api`, every egress `http` rule).
    pub fn add_remote(&mut self, serial: usize) -> Change {
        let i = NAMESPACES * PODS_PER_NAMESPACE + serial;
        let p = pod(
            &ns_name(serial % NAMESPACES),
            format!("extra{serial}"),
            pod_ip(i),
            serial % 20,
            "api",
        );
        let change = Change::PutPod(pod_object(&p, "other"));
        self.cluster.pods.push(p);
        change
    }

    /// Removes the last pod added (a remote one).
    pub fn remove_last_pod(&mut self) -> anyhow::Result<Change> {
        let p = self.cluster.pods.pop().context("no pod to remove")?;
        Ok(Change::delete_pod(&p))
    }

    /// Changes the ports of policy `k` of namespace `n` (its rules' sets and chains change).
    pub fn change_policy(&mut self, n: usize, k: usize, version: u16) -> anyhow::Result<Change> {
        let at = n * POLICIES_PER_NAMESPACE + k - usize::from(n > 0);
        let p = policy_of(n, k, version);
        self.cluster.policies[at] = serde_json::from_value(p.clone())?;
        Ok(Change::PutPolicy(p))
    }

    /// Adds a policy isolating local pods of namespace `n` (a new rule in their chains).
    pub fn add_policy(&mut self, n: usize, serial: usize) -> anyhow::Result<Change> {
        let p = policy(
            &ns_name(n),
            &format!("added{serial}"),
            json!({"podSelector": {"matchLabels": {"tier": "web"}},
                   "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": format!("app{}", serial % 20)}}}],
                                "ports": [{"port": 7000 + (serial % 1000) as u16}]}]}),
        );
        self.cluster
            .policies
            .push(serde_json::from_value(p.clone())?);
        Ok(Change::PutPolicy(p))
    }

    /// Removes the last policy added.
    pub fn remove_last_policy(&mut self) -> anyhow::Result<Change> {
        let p = self.cluster.policies.pop().context("no policy to remove")?;
        let (namespace, name) = policy_key(&serde_json::to_value(&p)?);
        Ok(Change::DeletePolicy { namespace, name })
    }

    /// A new local pod in namespace `n` (new chains, sets and jumps).
    pub fn add_local(&mut self, serial: usize) -> Change {
        let i = NAMESPACES * PODS_PER_NAMESPACE + 10_000 + serial;
        let p = pod(
            &ns_name(serial % NAMESPACES),
            format!("new{serial}"),
            pod_ip(i),
            serial % 20,
            ["web", "api", "db"][serial % 3],
        );
        let change = Change::PutPod(pod_object(&p, NODE));
        self.local.push(self.cluster.pods.len());
        self.cluster.pods.push(p);
        change
    }

    /// Removes the last local pod added.
    pub fn remove_last_local(&mut self) -> anyhow::Result<Change> {
        let i = self.local.pop().context("no local pod to remove")?;
        Ok(Change::delete_pod(&self.cluster.pods.remove(i)))
    }
}

/// A pod's host veth: `eni` and 11 hex digits of its address, as unique as the address.
pub fn veth_of(p: &PodView) -> String {
    let ip = match p.ips.first() {
        Some(IpAddr::V4(a)) => u32::from(*a),
        _ => 0,
    };
    format!("eni{ip:011x}")
}
