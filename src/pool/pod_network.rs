//! Where the pool's new ENIs go: the subnets that discovery found (the default), or with custom
//! networking the subnet and security groups of the node's ENIConfig, which can change while the
//! daemon runs and can be unusable (missing, invalid, not known yet).
//!
//! A change applies to new ENIs only: the ENIs the node has keep their subnet, groups and pods, as
//! with the VPC CNI, and are given back in the usual way once idle. While the ENIConfig is unusable
//! no ENI is created at all (never one in the node's own subnet as a fallback: with custom networking
//! that subnet is the one the operator is keeping pods out of), and the acquires that need one fail
//! with [`super::PoolError::NoPodNetwork`], which names the reason.

use crate::cloud::Subnet;

/// What decides the subnet and security groups of new ENIs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodNetwork {
    /// Subnet discovery (or `subnet_ids`) and the node's groups: the default.
    Discovered,
    /// The node's ENIConfig (custom networking).
    Custom {
        /// The ENIConfig's name.
        eni_config: String,
        /// Its `spec.subnet`, as EC2 describes it (in the node's VPC and availability zone).
        subnet: Subnet,
        /// Its `spec.securityGroups`, or eth0's when it names none.
        security_groups: Vec<String>,
    },
    /// Custom networking is on and the node's ENIConfig cannot be used now: why, for the operator
    /// (the log, the pod's CNI error).
    Unavailable { reason: String },
}

impl PodNetwork {
    /// One line for logs and status: `ENIConfig x (subnet-…, groups sg-…)`, `discovered subnets`
    /// or the reason.
    pub fn describe(&self) -> String {
        match self {
            Self::Discovered => "discovered subnets".into(),
            Self::Custom {
                eni_config,
                subnet,
                security_groups,
            } => crate::cloud::node_fit::describe_eni_config(eni_config, subnet, security_groups),
            Self::Unavailable { reason } => format!("unavailable: {reason}"),
        }
    }
}
