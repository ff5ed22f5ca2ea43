//! Custom networking as the AWS VPC CNI has it (issue 27, item 1): the node's `ENIConfig` custom
//! resource names the subnet and the security groups of its pod ENIs, so that pods live in another
//! subnet than the node (usually a secondary CIDR such as 100.64.0.0/10).
//!
//! Clusters that migrate from aws-node already have the CRD (`deploy/eniconfig-crd.yaml` is the VPC
//! CNI's own, so applying it changes nothing) and the objects; this crate reads them as the VPC
//! CNI does, so the same objects and the same node labels keep working unchanged, and follows them:
//!
//! - [`eniconfig`]: the `ENIConfig` type (`crd.k8s.amazonaws.com/v1alpha1`, cluster-scoped,
//!   `spec.subnet`, `spec.securityGroups`) and its validation into a [`PodNetwork`].
//! - [`select`]: which object a node names ([`config_name`]), the VPC CNI's rule.
//! - [`watch`]: [`spawn`], one watch of the node (by name) and one of the ENIConfigs, publishing the
//!   node's [`NodeNetwork`] on a `tokio::sync::watch` channel whenever it changes.
//!
//! - [`follow`]: the controller. The node's ENIConfig checked against EC2 ([`resolve`]: its subnet
//!   in the node's VPC and zone, its groups in the VPC) into a [`ResolvedNetwork`], and every change
//!   followed ([`first_answer`], [`spawn_follower`]), handed to the pool through the seam
//!   [`PodNetworkSink`], which the daemon implements over its pool and metrics.
//!
//! Why a sink and a type of its own, not the pool's `PodNetwork`: the pool's setting also has "the
//! discovered subnets", the default that is no ENIConfig's, and the pool is the core, which imports
//! no feature's crate; so the pool keeps its type, this crate says only what an ENIConfig resolves
//! to, and the daemon's adapter converts one into the other (a field for a field). What the pool
//! does with the answer (new ENIs in that subnet with those groups; no pods on the primary ENI;
//! existing pods kept when it changes) is the pool's.

pub mod eniconfig;
pub mod follow;
pub mod select;
pub mod watch;

pub use eniconfig::{ENIConfig, ENIConfigSpec};
pub use follow::{
    FIRST_ANSWER, PodNetworkSink, ResolvedNetwork, apply, first_answer, resolve, spawn_follower,
};
pub use select::{DEFAULT_CONFIG, DEFAULT_KEY, EXTERNAL_LABEL, config_name};
pub use watch::spawn;

/// Which node label and annotation name a node's ENIConfig (the VPC CNI's `ENI_CONFIG_LABEL_DEF`
/// and `ENI_CONFIG_ANNOTATION_DEF`); both default to `k8s.amazonaws.com/eniConfig`
/// ([`DEFAULT_KEY`], the VPC CNI's `defaultEniConfigLabelDef`/`defaultEniConfigAnnotationDef` in
/// `pkg/eniconfig/eniconfig.go`). Clusters that name ENIConfigs after their zones set the label to
/// `topology.kubernetes.io/zone` (the EKS user guide's custom networking page, step 5).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Selector {
    pub label: String,
    pub annotation: String,
}

impl Default for Selector {
    fn default() -> Self {
        Self {
            label: DEFAULT_KEY.to_owned(),
            annotation: DEFAULT_KEY.to_owned(),
        }
    }
}

/// What the node's ENIConfig says its new pod ENIs get.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodNetwork {
    /// The ENIConfig's name (for logs and events: "ENIConfig us-east-1a").
    pub eni_config: String,
    /// `spec.subnet`, checked to be a subnet id.
    pub subnet_id: String,
    /// `spec.securityGroups`, checked to be security-group ids, in the object's order. Empty when
    /// the object has none: then, as with the VPC CNI, the new ENIs get the primary ENI's groups.
    pub security_groups: Vec<String>,
}

/// The node's custom networking, as the API server says now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeNetwork {
    /// Not known yet (before the first list of both node and ENIConfigs completed), or the node is
    /// not (or no longer) in the API. Errors later (API server away, RBAC) keep the last value.
    Unknown,
    /// The node has neither the annotation nor the label (nor the VPC CNI's
    /// `vpc.amazonaws.com/externalEniConfig` label), and there is no ENIConfig named `default`
    /// (which the VPC CNI uses for such a node).
    Unnamed,
    /// The node names `name` and no such ENIConfig exists.
    Missing {
        name: String,
    },
    /// The object exists but is unusable (no spec.subnet, a malformed subnet or group id): why.
    Invalid {
        name: String,
        why: String,
    },
    Ready(PodNetwork),
}
