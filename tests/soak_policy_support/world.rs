//! The soak's truth: namespaces with labels, the live pods with their real IPs, labels and named
//! ports, and the NetworkPolicies, as the test put them in the API server; the model
//! ([`World::cluster`]) is built from it alone, never from what a daemon reports. And the random
//! changes a step makes to it: labels, and valid policies (pod and namespace selectors, ipBlock with
//! except, numeric, named and ranged ports, policy types).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};

use eniipam::network_policy::{Cluster, NamedPort, PodView, Protocol};
use eniipam_kubeapi::pod_json;
use ipnet::Ipv4Net;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use rand::Rng;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use serde_json::{Value, json};

use crate::datapath_support::CniPod;

use crate::datapath_support::policy::Servers;

/// The Kubernetes namespaces pods and policies live in.
pub const NAMESPACES: [&str; 3] = ["x", "y", "z"];
const APPS: [&str; 3] = ["web", "db", "cache"];
const TIERS: [&str; 2] = ["front", "back"];
const TEAMS: [&str; 2] = ["a", "b"];

/// A pod that has been ADDed and not DELeted.
pub struct LivePod {
    pub cni: CniPod,
    /// Index of its node's daemon.
    pub node: usize,
    pub labels: BTreeMap<String, String>,
    /// The container port named `http` (TCP) and the one named `dns` (UDP): 80 or 81 each.
    pub http: u16,
    pub dns: u16,
    /// Its host veth (the plugin's result names it first).
    pub veth: String,
    pub servers: Servers,
}

impl LivePod {
    pub fn key(&self) -> String {
        format!("{}/{}", self.cni.namespace, self.cni.name)
    }

    pub fn view(&self) -> PodView {
        PodView {
            namespace: self.cni.namespace.clone(),
            name: self.cni.name.clone(),
            labels: self.labels.clone(),
            ips: vec![IpAddr::V4(self.cni.ip)],
            host_network: false,
            ports: named_ports(self.http, self.dns),
        }
    }
}

fn named_ports(http: u16, dns: u16) -> Vec<NamedPort> {
    vec![
        NamedPort {
            name: "http".into(),
            protocol: Protocol::Tcp,
            port: http,
        },
        NamedPort {
            name: "dns".into(),
            protocol: Protocol::Udp,
            port: dns,
        },
    ]
}

/// The pod as the API server holds it: bound to `node`, with labels and named container ports,
/// and `ip` in its status once the ADD gave it one (as the kubelet reports it).
pub fn pod_object(
    namespace: &str,
    name: &str,
    node: &str,
    labels: &BTreeMap<String, String>,
    (http, dns): (u16, u16),
    ip: Option<Ipv4Addr>,
) -> Value {
    let mut pod = pod_json(namespace, name, &format!("uid-{name}"), node, "Pending");
    pod["metadata"]["labels"] = json!(labels);
    pod["spec"]["containers"][0]["ports"] = json!([
        {"name": "http", "containerPort": http, "protocol": "TCP"},
        {"name": "dns", "containerPort": dns, "protocol": "UDP"},
    ]);
    if let Some(ip) = ip {
        pod["status"] = json!({"phase": "Running", "podIP": ip.to_string(),
                               "podIPs": [{"ip": ip.to_string()}]});
    }
    pod
}

/// What the test holds true.
#[derive(Default)]
pub struct World {
    /// Namespace → its labels (`kubernetes.io/metadata.name` included, as the server sets it).
    pub namespaces: BTreeMap<String, BTreeMap<String, String>>,
    pub pods: Vec<LivePod>,
    /// `namespace/name` → the policy object.
    pub policies: BTreeMap<String, Value>,
}

impl World {
    /// The model's cluster: what the policies say is judged on this.
    pub fn cluster(&self) -> Cluster {
        Cluster {
            namespaces: self.namespaces.clone(),
            pods: self.pods.iter().map(LivePod::view).collect(),
            policies: self
                .policies
                .values()
                .map(|p| serde_json::from_value::<NetworkPolicy>(p.clone()).expect("a policy"))
                .collect(),
        }
    }
}

/// Labels for a pod: an `app` always, a `tier` most of the time.
pub fn pod_labels(rng: &mut StdRng) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::from([("app".to_owned(), pick(rng, &APPS).to_owned())]);
    if rng.random_bool(0.7) {
        labels.insert("tier".into(), pick(rng, &TIERS).to_owned());
    }
    labels
}

/// Labels for a namespace, besides its name: a `team` most of the time.
pub fn namespace_labels(rng: &mut StdRng) -> Vec<(String, String)> {
    if rng.random_bool(0.75) {
        vec![("team".into(), pick(rng, &TEAMS).to_owned())]
    } else {
        Vec::new()
    }
}

fn pick<'a>(rng: &mut StdRng, from: &[&'a str]) -> &'a str {
    from.choose(rng).expect("not empty")
}

/// A random valid NetworkPolicy `namespace/name`; `ips` are live pods' addresses (ipBlocks name
/// them, so a reused address meets a stale rule), `vpc` the block they come from.
pub fn random_policy(
    rng: &mut StdRng,
    namespace: &str,
    name: &str,
    ips: &[Ipv4Addr],
    vpc: Ipv4Net,
) -> Value {
    let mut spec = serde_json::Map::new();
    spec.insert("podSelector".into(), pod_selector(rng, true));
    let (ingress, egress) = match rng.random_range(0..5) {
        0 => {
            // No policyTypes: Ingress, plus Egress when egress rules are given.
            let egress = rng.random_bool(0.4);
            (true, egress)
        }
        1 => {
            spec.insert("policyTypes".into(), json!(["Ingress"]));
            (true, false)
        }
        2 => {
            spec.insert("policyTypes".into(), json!(["Egress"]));
            (false, true)
        }
        _ => {
            spec.insert("policyTypes".into(), json!(["Ingress", "Egress"]));
            (true, true)
        }
    };
    let has_types = spec.contains_key("policyTypes");
    if ingress && (!has_types || rng.random_bool(0.85)) {
        spec.insert("ingress".into(), rules(rng, "from", ips, vpc));
    }
    if egress && (!has_types || rng.random_bool(0.85)) {
        spec.insert("egress".into(), rules(rng, "to", ips, vpc));
    }
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
           "metadata": {"namespace": namespace, "name": name}, "spec": spec})
}

/// 0 to 2 rules (none: the direction allows nothing).
fn rules(rng: &mut StdRng, peers_key: &str, ips: &[Ipv4Addr], vpc: Ipv4Net) -> Value {
    let n = rng.random_range(0..=2);
    let rules: Vec<Value> = (0..n)
        .map(|_| {
            let mut rule = serde_json::Map::new();
            // Without peers a rule allows every peer; without ports, every port.
            if rng.random_bool(0.8) {
                let peers: Vec<Value> = (0..rng.random_range(1..=2))
                    .map(|_| peer(rng, ips, vpc))
                    .collect();
                rule.insert(peers_key.into(), json!(peers));
            }
            if rng.random_bool(0.7) {
                let ports: Vec<Value> = (0..rng.random_range(1..=2)).map(|_| port(rng)).collect();
                rule.insert("ports".into(), json!(ports));
            }
            Value::Object(rule)
        })
        .collect();
    json!(rules)
}

fn pod_selector(rng: &mut StdRng, empty_ok: bool) -> Value {
    match rng.random_range(if empty_ok { 0 } else { 1 }..6) {
        0 => json!({}),
        1 | 2 => json!({"matchLabels": {"app": pick(rng, &APPS)}}),
        3 => json!({"matchExpressions": [{"key": "tier",
            "operator": pick(rng, &["In", "NotIn"]), "values": [pick(rng, &TIERS)]}]}),
        4 => json!({"matchExpressions": [{"key": "tier",
            "operator": pick(rng, &["Exists", "DoesNotExist"])}]}),
        _ => json!({"matchLabels": {"app": pick(rng, &APPS), "tier": pick(rng, &TIERS)}}),
    }
}

fn namespace_selector(rng: &mut StdRng) -> Value {
    match rng.random_range(0..4) {
        0 => json!({}),
        1 => json!({"matchLabels": {"team": pick(rng, &TEAMS)}}),
        2 => json!({"matchLabels": {"kubernetes.io/metadata.name": pick(rng, &NAMESPACES)}}),
        _ => json!({"matchExpressions": [{"key": "team", "operator": "DoesNotExist"}]}),
    }
}

fn peer(rng: &mut StdRng, ips: &[Ipv4Addr], vpc: Ipv4Net) -> Value {
    match rng.random_range(0..8) {
        0..=2 => json!({"podSelector": pod_selector(rng, true)}),
        3 | 4 => json!({"namespaceSelector": namespace_selector(rng)}),
        5 => json!({"namespaceSelector": namespace_selector(rng),
                    "podSelector": pod_selector(rng, false)}),
        _ => json!({"ipBlock": ip_block(rng, ips, vpc)}),
    }
}

/// An ipBlock over pod addresses: the VPC block but one or two pods, one pod's /32, the /28 around
/// one, or everything but the VPC.
fn ip_block(rng: &mut StdRng, ips: &[Ipv4Addr], vpc: Ipv4Net) -> Value {
    let some_ip = |rng: &mut StdRng| ips.choose(rng).copied().unwrap_or(vpc.network());
    let net = |ip: Ipv4Addr, len: u8| Ipv4Net::new(ip, len).expect("a prefix").trunc();
    match rng.random_range(0..4) {
        0 => {
            let except: Vec<String> = (0..rng.random_range(1..=2))
                .map(|_| net(some_ip(rng), 32).to_string())
                .collect();
            json!({"cidr": vpc.to_string(), "except": except})
        }
        1 => json!({"cidr": net(some_ip(rng), 32).to_string()}),
        2 => {
            let ip = some_ip(rng);
            json!({"cidr": net(ip, 28).to_string(), "except": [net(ip, 30).to_string()]})
        }
        _ => json!({"cidr": "0.0.0.0/0", "except": [vpc.to_string()]}),
    }
}

/// A port: numeric (80 or 81), named (`http` is TCP, `dns` UDP: a name under the other protocol
/// matches nothing), or the range 80-81 (`endPort`); the protocol left out means TCP.
fn port(rng: &mut StdRng) -> Value {
    let protocol = pick(rng, &["TCP", "UDP", ""]);
    let mut p = match rng.random_range(0..5) {
        0 | 1 => json!({"port": pick(rng, &["80", "81"]).parse::<u16>().expect("a port")}),
        2 => json!({"port": pick(rng, &["http", "dns"])}),
        3 => json!({"port": 80, "endPort": 81}),
        _ => json!({}),
    };
    if !protocol.is_empty() {
        p["protocol"] = json!(protocol);
    }
    p
}
