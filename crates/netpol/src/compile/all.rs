//! [`compile_all`]: what [`compile`](super::compile) says of each of a node's pods, sharing the
//! work between them.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyPeer};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{
    Cluster, Compiled, Gathered, Peers, PodView, Ports, Rule, RuleSource, Target, compiled,
    ip_block, peers, ports, selecting, types,
};
use crate::selector::{check, matches};

/// What [`compile`] says of each of `pods`, in order, sharing the work between them (a node
/// compiles its ~110 pods on every change, against thousands of pods and policies):
/// - policies are indexed by namespace, so a pod meets only its namespace's;
/// - a policy's rules are evaluated once, when it first selects one of `pods`, not once per pod
///   (but an ingress rule with a named port, which is looked up on the selected pod);
/// - a peer's selectors are evaluated against the pods indexed by namespace: a namespace
///   selector once per namespace, a pod selector only on the pods of the matching namespaces,
///   and a pair of selectors that several peers repeat once.
///   A peer whose selector the API server would have refused takes [`compile`]'s own path, so
///   its problems are named alike.
///
/// `compile` stays the reference: the two agree on every cluster (a property test says so).
pub fn compile_all(cluster: &Cluster, pods: &[&PodView]) -> Vec<Compiled> {
    let mut policies_of: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, p) in cluster.policies.iter().enumerate() {
        if let Some(ns) = p.metadata.namespace.as_deref() {
            policies_of.entry(ns).or_default().push(i);
        }
    }
    let mut pods_of: BTreeMap<&str, Vec<&PodView>> = BTreeMap::new();
    for c in cluster.pods.iter().filter(|c| !c.host_network) {
        pods_of.entry(c.namespace.as_str()).or_default().push(c);
    }
    let index = Index {
        cluster,
        pods_of,
        selected: Default::default(),
    };
    let evaluated: Vec<std::cell::OnceCell<Evaluated>> = cluster
        .policies
        .iter()
        .map(|_| Default::default())
        .collect();
    pods.iter()
        .map(|pod| {
            let mut problems = Vec::new();
            let mut ingress: Gathered = None;
            let mut egress: Gathered = None;
            for &i in policies_of
                .get(pod.namespace.as_str())
                .into_iter()
                .flatten()
            {
                let p = &cluster.policies[i];
                let Some((name, spec)) = selecting(p, pod, &mut problems) else {
                    continue;
                };
                let ev = evaluated[i].get_or_init(|| index.evaluate(p, &name));
                let (is_ingress, is_egress) = types(p);
                if is_ingress {
                    let (policies, rules) = ingress.get_or_insert_with(Default::default);
                    policies.push(name.clone());
                    for (i, (r, ev)) in spec.ingress.iter().flatten().zip(&ev.ingress).enumerate() {
                        problems.extend(ev.peer_problems.iter().cloned());
                        let ports = match &ev.ports {
                            Some((ports, said)) => {
                                problems.extend(said.iter().cloned());
                                ports.clone()
                            }
                            None => ports(
                                cluster,
                                r.ports.as_deref(),
                                Target::Pod(pod),
                                &format!("NetworkPolicy {name}: spec.ingress[{i}]"),
                                &mut problems,
                            ),
                        };
                        rules.push(Rule {
                            source: RuleSource {
                                policy: name.clone(),
                                index: i,
                            },
                            peers: ev.peers.clone(),
                            ports,
                        });
                    }
                }
                if is_egress {
                    let (policies, rules) = egress.get_or_insert_with(Default::default);
                    policies.push(name.clone());
                    for (i, ev) in ev.egress.iter().enumerate() {
                        problems.extend(ev.peer_problems.iter().cloned());
                        let (ports, said) = ev.ports.as_ref().expect("egress ports are the pod's");
                        problems.extend(said.iter().cloned());
                        rules.push(Rule {
                            source: RuleSource {
                                policy: name.clone(),
                                index: i,
                            },
                            peers: ev.peers.clone(),
                            ports: ports.clone(),
                        });
                    }
                }
            }
            compiled(ingress, egress, problems)
        })
        .collect()
}

/// The cluster's pods by namespace (host-network pods left out: they are no selector's peers).
struct Index<'a> {
    cluster: &'a Cluster,
    pods_of: BTreeMap<&'a str, Vec<&'a PodView>>,
    /// The addresses a (namespace selector or home namespace, pod selector) pair selects, by
    /// the selectors' JSON.
    selected: std::cell::RefCell<BTreeMap<(String, String), Vec<IpAddr>>>,
}

/// A policy's rules as far as they do not depend on the pod they are compiled for.
#[derive(Default)]
struct Evaluated {
    ingress: Vec<EvaluatedRule>,
    egress: Vec<EvaluatedRule>,
}

struct EvaluatedRule {
    peers: Peers,
    peer_problems: Vec<String>,
    /// The ports and their problems; `None` for an ingress rule with a named port.
    ports: Option<(Ports, Vec<String>)>,
}

impl Index<'_> {
    fn evaluate(&self, policy: &NetworkPolicy, name: &str) -> Evaluated {
        let Some(spec) = policy.spec.as_ref() else {
            return Evaluated::default();
        };
        let ingress = spec
            .ingress
            .iter()
            .flatten()
            .enumerate()
            .map(|(i, r)| {
                let at = format!("NetworkPolicy {name}: spec.ingress[{i}]");
                let mut peer_problems = Vec::new();
                let peers = self.peers(policy, r.from.as_deref(), &at, &mut peer_problems);
                let named = r
                    .ports
                    .iter()
                    .flatten()
                    .any(|p| matches!(p.port, Some(IntOrString::String(_))));
                let ports = (!named).then(|| {
                    let mut said = Vec::new();
                    let ports = ports(
                        self.cluster,
                        r.ports.as_deref(),
                        Target::Peers(&Peers::Any),
                        &at,
                        &mut said,
                    );
                    (ports, said)
                });
                EvaluatedRule {
                    peers,
                    peer_problems,
                    ports,
                }
            })
            .collect();
        let egress = spec
            .egress
            .iter()
            .flatten()
            .enumerate()
            .map(|(i, r)| {
                let at = format!("NetworkPolicy {name}: spec.egress[{i}]");
                let mut peer_problems = Vec::new();
                let peers = self.peers(policy, r.to.as_deref(), &at, &mut peer_problems);
                let mut said = Vec::new();
                let ports = ports(
                    self.cluster,
                    r.ports.as_deref(),
                    Target::Peers(&peers),
                    &at,
                    &mut said,
                );
                EvaluatedRule {
                    peers,
                    peer_problems,
                    ports: Some((ports, said)),
                }
            })
            .collect();
        Evaluated { ingress, egress }
    }

    /// [`peers`] through the index; a list with a selector that could fail goes to `peers`.
    fn peers(
        &self,
        policy: &NetworkPolicy,
        list: Option<&[NetworkPolicyPeer]>,
        at: &str,
        problems: &mut Vec<String>,
    ) -> Peers {
        let Some(list) = list.filter(|l| !l.is_empty()) else {
            return Peers::Any;
        };
        let sound = list.iter().all(|peer| {
            peer.ip_block.is_some()
                || [&peer.namespace_selector, &peer.pod_selector]
                    .into_iter()
                    .flatten()
                    .all(|s| check(s).is_ok())
        });
        if !sound {
            return peers(self.cluster, policy, Some(list), at, problems);
        }
        let home = policy.metadata.namespace.as_deref().unwrap_or_default();
        let mut pods = BTreeSet::new();
        let mut blocks = Vec::new();
        let no_labels = BTreeMap::new();
        for (j, peer) in list.iter().enumerate() {
            if let Some(b) = &peer.ip_block {
                match ip_block(&b.cidr, b.except.as_deref().unwrap_or_default()) {
                    Ok(b) => blocks.push(b),
                    Err(e) => problems.push(format!("{at}.peers[{j}].ipBlock: {e}")),
                }
                continue;
            }
            // Policies repeat selectors (every pod of a tier, of a team's namespaces): a pair
            // of selectors is evaluated once per round.
            let key = (
                match &peer.namespace_selector {
                    None => format!("home {home}"),
                    Some(sel) => serde_json::to_string(sel).unwrap_or_default(),
                },
                serde_json::to_string(&peer.pod_selector).unwrap_or_default(),
            );
            let mut selected = self.selected.borrow_mut();
            let addresses = selected.entry(key).or_insert_with(|| {
                let any = LabelSelector::default();
                let pod_sel = peer.pod_selector.as_ref().unwrap_or(&any);
                let mut found = Vec::new();
                for (ns, candidates) in &self.pods_of {
                    let ns_ok = match &peer.namespace_selector {
                        None => *ns == home,
                        Some(sel) => {
                            let labels = self.cluster.namespaces.get(*ns).unwrap_or(&no_labels);
                            matches(sel, labels) == Ok(true)
                        }
                    };
                    if !ns_ok {
                        continue;
                    }
                    for c in candidates {
                        if matches(pod_sel, &c.labels) == Ok(true) {
                            found.extend(c.ips.iter().copied());
                        }
                    }
                }
                found
            });
            pods.extend(addresses.iter().copied());
        }
        Peers::Listed { pods, blocks }
    }
}
