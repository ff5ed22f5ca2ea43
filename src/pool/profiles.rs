//! Network profiles: security groups per workload without trunking. A profile is a name with a
//! subnet and a set of security groups; a pod that selects one gets its IP only from an ENI created
//! for that profile (in its subnet, with its groups, tagged [`NETWORK_TAG`] so a restart knows it).
//! Pods without a profile use the node's default pod network ([`super::PodNetwork`]).
//!
//! ENIs are a scarce per-node resource, shared by the default network and every profile (device
//! indexes and capacity tokens alike): a profile keeps no warm IPs beyond what an acquire brings
//! (the warm levels are the default network's), its idle IPs go back to EC2 once cooled, and its
//! empty ENIs are released. What the node can hold for each profile in all is
//! [`ProfileCapacity::total`], which the daemon advertises as an extended resource so the scheduler
//! places pods only where a slot is.
//!
//! The shared room is split, never promised twice: each profile below its `max_enis` holds at
//! most one spare device index, and so does the default network while no ENI serves it (free
//! indexes go one per claimant, fewest ENIs first); a network creates an ENI only on its own spare
//! or an index no spare holds. With capacity tokens equal to the ENIs' room (the node's capacity is what its ENIs
//! hold unless `max_ips` lowers it, which config validation refuses with profiles), the totals
//! advertised for the profiles plus the default network's ENIs never exceed what the node can create.
//!
//! The daemon sets the profiles the node serves with [`super::Pool::set_profiles`] and reads the
//! numbers with [`super::Pool::profile_capacity`].

use crate::cloud::Eni;

pub use crate::cloud::lifecycle::NETWORK_TAG;

/// A profile's name (the `eniipam.io/network` annotation's value).
pub type ProfileName = String;

/// What the daemon resolved for one profile (subnet described by EC2, groups checked): the cloud
/// crate's type, which the profiles' controller hands over as it is.
pub use crate::cloud::node_fit::ProfileNetwork;

/// One profile's use of the node, and what it could still take.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProfileCapacity {
    /// ENIs of the profile (attached, and being created).
    pub enis: u32,
    /// IPs of its ENIs held by pods.
    pub assigned: u32,
    /// IPs of its ENIs idle (cooling, or waiting to go back to EC2).
    pub idle: u32,
    /// Pods the node can hold for it in all: every address of its serving ENIs (attached or being
    /// created) and one ENI's worth for the spare device index it holds, if any (below its
    /// `max_enis`, its subnet not backing off). The node advertises this as the profile's extended
    /// resource in `capacity` and `allocatable`; the scheduler subtracts the bound pods itself.
    pub total: u32,
    /// Of [`Self::total`], what no pod holds and no cooling IP waits on now (a gauge only).
    pub free: u32,
}

/// The profile `eni` was created for, from its [`NETWORK_TAG`].
pub fn profile_of(eni: &Eni) -> Option<ProfileName> {
    eni.tags.get(NETWORK_TAG).filter(|v| !v.is_empty()).cloned()
}
