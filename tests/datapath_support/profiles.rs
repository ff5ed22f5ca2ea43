//! Network profiles on the data path (issue 27, item 2): the real `eniipamd` with
//! `ENIIPAM_NETWORK_PROFILES=true` in a lab node, reading `NetworkProfile` objects, namespaces and
//! pods from the API-server double (`mocks/kubeapi`) through a port forward into the node (nothing
//! in the node namespace can reach the machine's loopback otherwise), and pods that exist in the
//! double, with their `eniipam.io/network` annotation, before their CNI ADD, as the kubelet only
//! runs the ADD for a pod the API server has bound to the node.

use std::ops::{Deref, DerefMut};

use eniipam_kubeapi::{FakeApiServer, pod_json};
use serde_json::json;
use vpclab::PortForward;

use super::{Cluster, CniPod, Daemon, Placement, PodOptions};

/// The annotation (on a pod or its namespace) that selects a profile.
pub const NETWORK_ANNOTATION: &str = "eniipam.io/network";

/// The tag eniipamd puts on a profile's ENIs.
pub const NETWORK_TAG: &str = "eniipam.io/network";

/// A node's `eniipamd` with network profiles on, and the port forward that lets it reach the
/// API-server double from inside the node.
pub struct ProfileDaemon {
    pub daemon: Daemon,
    /// The node's name in the API server (`ENIIPAM_NODE_NAME`, the pods' `spec.nodeName`).
    pub node: String,
    _forward: PortForward,
}

impl Deref for ProfileDaemon {
    type Target = Daemon;
    fn deref(&self) -> &Daemon {
        &self.daemon
    }
}

impl DerefMut for ProfileDaemon {
    fn deref_mut(&mut self) -> &mut Daemon {
        &mut self.daemon
    }
}

impl ProfileDaemon {
    /// Registers node `node` (instance `instance_id`) in `api` and starts its `eniipamd` with
    /// network profiles on; the default network is served as `placement` says.
    pub async fn start(
        c: &Cluster,
        api: &FakeApiServer,
        instance_id: &str,
        node: &str,
        placement: Placement,
    ) -> ProfileDaemon {
        let (forward, url) = super::forward_api(c, api, instance_id, node).await;
        let env = [
            ("ENIIPAM_NETWORK_PROFILES", "true"),
            ("ENIIPAM_API_SERVER_URL", url.as_str()),
            ("ENIIPAM_API_SERVER_GC", "false"),
            ("ENIIPAM_NODE_CONDITION", "false"),
            ("ENIIPAM_NODE_NAME", node),
        ];
        let daemon = Daemon::start(c, instance_id, placement, &env).await;
        ProfileDaemon {
            daemon,
            node: node.to_owned(),
            _forward: forward,
        }
    }

    /// Puts pod `namespace/name` in `api`, bound to this node and carrying `annotation` as its
    /// `eniipam.io/network` (none: no annotation, so its namespace's, if any, decides), then runs
    /// the CNI ADD for it.
    pub async fn add_pod(
        &self,
        c: &Cluster,
        api: &FakeApiServer,
        namespace: &str,
        name: &str,
        annotation: Option<&str>,
    ) -> CniPod {
        let mut pod = pod_json(
            namespace,
            name,
            &format!("uid-{name}"),
            &self.node,
            "Pending",
        );
        if let Some(profile) = annotation {
            pod["metadata"]["annotations"] = json!({ NETWORK_ANNOTATION: profile });
        }
        api.put_pod(pod);
        self.daemon
            .add_pod_in(c, namespace, name, PodOptions::default())
            .await
    }
}

/// The pod's IP is on an ENI that carries exactly `groups` (as EC2 describes it), in
/// `subnet`, tagged with `profile` (`None`: a default-network ENI, untagged); returns nothing, panics
/// naming what differs.
pub fn assert_on_network(
    c: &Cluster,
    pod: &CniPod,
    profile: Option<&str>,
    groups: &[&str],
    subnet: &str,
) {
    let enis = c.mock.network_interfaces();
    let eni = enis
        .iter()
        .find(|e| e.id == pod.eni)
        .unwrap_or_else(|| panic!("{}'s ENI {} is not in EC2", pod.name, pod.eni));
    let mut have: Vec<&str> = eni.security_groups.iter().map(String::as_str).collect();
    let mut want = groups.to_vec();
    have.sort_unstable();
    want.sort_unstable();
    assert_eq!(
        have, want,
        "{} ({}) is on {} whose groups are not {profile:?}'s",
        pod.name, pod.ip, eni.id
    );
    assert_eq!(
        eni.tags.get(NETWORK_TAG).map(String::as_str),
        profile,
        "{} ({}) is on {} tagged {:?}",
        pod.name,
        pod.ip,
        eni.id,
        eni.tags
    );
    assert_eq!(
        eni.subnet_id, subnet,
        "{} ({}) is on {} in the wrong subnet",
        pod.name, pod.ip, eni.id
    );
}
