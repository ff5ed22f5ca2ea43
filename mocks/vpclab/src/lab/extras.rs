//! Namespaces beyond the fabric: pods plumbed by hand, further namespaces, and a node's view of
//! its instance metadata.

use std::net::{Ipv4Addr, SocketAddr};

use super::{IMDS_ADDR, Lab, POD_GATEWAY, Pod, random_mac};
use crate::error::LabError;
use crate::netns::NetNs;
use crate::state::StateSource;
use crate::traffic::PortForward;

impl Lab {
    /// Plumbs a pod with address `ip` on node `instance_id` (see [`Pod`]). The address is not
    /// assigned in mockcloud: that is the caller's choice.
    pub async fn add_pod(&self, instance_id: &str, ip: Ipv4Addr) -> Result<Pod, LabError> {
        let (node_ns, ns, host_if) = self.pod_namespace(instance_id).await?;
        let host_mac = random_mac();
        node_ns
            .ip_batch(&[
                format!(
                    "link add {host_if} address {host_mac} type veth peer name eth0 address {} netns {}",
                    random_mac(),
                    ns.name()
                ),
                format!("link set {host_if} up"),
            ])
            .await?;
        ns.ip_batch(&[
            "link set lo up".into(),
            "link set eth0 up".into(),
            format!("addr add {ip}/32 dev eth0"),
            format!("route add {POD_GATEWAY} dev eth0 scope link"),
            format!("route add default via {POD_GATEWAY} dev eth0"),
            format!("neigh add {POD_GATEWAY} lladdr {host_mac} dev eth0 nud permanent"),
        ])
        .await?;
        node_ns
            .ip_batch(&[format!("route add {ip}/32 dev {host_if} scope link")])
            .await?;
        Ok(Pod {
            instance_id: instance_id.to_owned(),
            ns,
            ip,
            host_if,
        })
    }

    /// Removes a pod made by [`Lab::add_pod`]: its veth, node route and namespace.
    pub async fn remove_pod(&self, pod: &Pod) -> Result<(), LabError> {
        self.remove_plumbed(&pod.instance_id, &pod.host_if, &pod.ns)
            .await
    }

    /// A hand-plumbed pod's node namespace, its own new namespace and the name of its host veth.
    pub(super) async fn pod_namespace(
        &self,
        instance_id: &str,
    ) -> Result<(NetNs, NetNs, String), LabError> {
        let (node_ns, idx) = {
            let mut a = self.inner.applied.lock().expect("applied lock");
            let ns = a
                .nodes
                .get(instance_id)
                .map(|n| n.ns.clone())
                .ok_or_else(|| LabError::NotFound(format!("no node for instance {instance_id}")))?;
            a.next_extra += 1;
            (ns, a.next_extra)
        };
        let ns = self
            .inner
            .spaces
            .create(format!("{}-p{idx}", self.inner.name))
            .await?;
        Ok((node_ns, ns, format!("vlp{idx}")))
    }

    /// Removes a hand-plumbed pod's host veth (its node route goes with it) and namespace.
    pub(super) async fn remove_plumbed(
        &self,
        instance_id: &str,
        host_if: &str,
        ns: &NetNs,
    ) -> Result<(), LabError> {
        // The node end is gone already if the node was; its deletion takes the route with it.
        if let Some(node) = self.node(instance_id)
            && node.ns.links().await?.iter().any(|l| l.name == host_if)
        {
            node.ns.ip(&["link", "del", host_if]).await?;
        }
        self.inner.spaces.delete(ns).await
    }

    /// Makes instance `instance_id`'s IMDS reachable inside its node at `http://169.254.169.254`,
    /// as on EC2, for a daemon run in the node namespace (`nsenter --net=<node ns>`): the address
    /// goes on the node's loopback (scope host) and a [`PortForward`] relays port 80 to the instance's IMDS
    /// listener. Needs an in-process mockcloud ([`StateSource::InProcess`]).
    pub async fn expose_imds(&self, instance_id: &str) -> Result<PortForward, LabError> {
        let StateSource::InProcess(mock) = &self.inner.source else {
            return Err(LabError::Invalid(
                "expose_imds needs an in-process mockcloud; use PortForward::start with the IMDS address".into(),
            ));
        };
        let url = mock.imds_url(instance_id).ok_or_else(|| {
            LabError::NotFound(format!("mockcloud has no IMDS for {instance_id}"))
        })?;
        let target: SocketAddr = url
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .parse()
            .map_err(|e| LabError::CloudState(format!("IMDS url {url:?}: {e}")))?;
        let node = self
            .node(instance_id)
            .ok_or_else(|| LabError::NotFound(format!("no node for instance {instance_id}")))?;
        // Scope host: local to the node, never picked as the source of the node's own traffic
        // (on EC2 the IMDS address is not a node address; with global scope on `lo` the kernel
        // would pick it as the source towards a pod's veth, which has no address of its own).
        node.ns
            .ip(&[
                "addr",
                "replace",
                &format!("{IMDS_ADDR}/32"),
                "dev",
                "lo",
                "scope",
                "host",
            ])
            .await?;
        PortForward::start(&node.ns, SocketAddr::from((IMDS_ADDR, 80)), target).await
    }

    /// A further empty namespace owned by the lab (deleted with it), e.g. for a runtime's pods.
    pub async fn add_namespace(&self, tag: &str) -> Result<NetNs, LabError> {
        if tag.is_empty() || !tag.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
            return Err(LabError::Invalid(format!(
                "namespace tag {tag:?}: use letters, digits and '-'"
            )));
        }
        let idx = {
            let mut a = self.inner.applied.lock().expect("applied lock");
            a.next_extra += 1;
            a.next_extra
        };
        let ns = self
            .inner
            .spaces
            .create(format!("{}-x{idx}-{tag}", self.inner.name))
            .await?;
        ns.ip(&["link", "set", "lo", "up"]).await?;
        Ok(ns)
    }
}
