//! Upstream's world as the model sees it: the pods' addresses ([`ip_of`], a /24 per namespace),
//! the cluster of a case ([`world`]; [`world_in`] with IPv6-only or dual-stack pods, [`Stack`]) and
//! of a stage of a dynamic case ([`world_at`], [`world_at_in`]).

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use eniipam::network_policy::{Cluster, NamedPort, PodView, Protocol};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use serde_json::{Value, json};

use super::{NAMESPACES, PODS, PORTS, Stack};

pub fn ip_of(ns: &str, pod: &str) -> Ipv4Addr {
    let n = NAMESPACES.iter().position(|x| *x == ns).unwrap() as u8;
    let p = PODS.iter().position(|x| *x == pod).unwrap() as u8;
    Ipv4Addr::new(10, 1, n, 10 + p)
}

pub fn world(policies: &[Value]) -> Cluster {
    world_in(policies, Stack::V4)
}

/// The world with `stack`'s addresses, `policies`' `ipBlock`s translated for it.
pub fn world_in(policies: &[Value], stack: Stack) -> Cluster {
    let mut c = Cluster::default();
    for ns in NAMESPACES {
        c.namespaces.insert(
            ns.into(),
            BTreeMap::from([
                ("ns".to_owned(), ns.to_owned()),
                ("kubernetes.io/metadata.name".to_owned(), ns.to_owned()),
            ]),
        );
        for pod in PODS {
            let mut ports = Vec::new();
            for port in PORTS {
                // Upstream's names: SCTP too (the model's cases probe it; no socket serves it here).
                for (protocol, p) in [
                    (Protocol::Tcp, "tcp"),
                    (Protocol::Udp, "udp"),
                    (Protocol::Sctp, "sctp"),
                ] {
                    ports.push(NamedPort {
                        name: format!("serve-{port}-{p}"),
                        protocol,
                        port,
                    });
                }
            }
            c.pods.push(PodView {
                namespace: ns.into(),
                name: pod.into(),
                labels: BTreeMap::from([("pod".to_owned(), pod.to_owned())]),
                ips: stack.addresses(ns, pod),
                host_network: false,
                ports,
            });
        }
    }
    c.policies = policies
        .iter()
        .map(|p| {
            serde_json::from_value::<NetworkPolicy>(stack.translate(p)).expect("a NetworkPolicy")
        })
        .collect();
    c
}

/// [`world`] with labels added: (namespace, key, value) to namespaces and (namespace, pod, key,
/// value) to pods (a stage of upstream's dynamic cases).
pub fn world_at(
    policies: &[Value],
    namespace_labels: &[(&str, &str, &str)],
    pod_labels: &[(&str, &str, &str, &str)],
) -> Cluster {
    world_at_in(policies, namespace_labels, pod_labels, Stack::V4)
}

/// [`world_at`] with `stack`'s addresses (and `ipBlock`s, [`world_in`]).
pub fn world_at_in(
    policies: &[Value],
    namespace_labels: &[(&str, &str, &str)],
    pod_labels: &[(&str, &str, &str, &str)],
    stack: Stack,
) -> Cluster {
    let mut c = world_in(policies, stack);
    for (ns, key, value) in namespace_labels {
        c.namespaces
            .get_mut(*ns)
            .unwrap_or_else(|| panic!("no namespace {ns} in the world"))
            .insert((*key).to_owned(), (*value).to_owned());
    }
    for (ns, name, key, value) in pod_labels {
        c.pods
            .iter_mut()
            .find(|p| p.namespace == *ns && p.name == *name)
            .unwrap_or_else(|| panic!("no pod {ns}/{name} in the world"))
            .labels
            .insert((*key).to_owned(), (*value).to_owned());
    }
    c
}

pub fn policy(ns: &str, name: &str, spec: Value) -> Value {
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
           "metadata": {"namespace": ns, "name": name}, "spec": spec})
}
