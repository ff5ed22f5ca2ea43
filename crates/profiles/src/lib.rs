//! Network profiles, the Kubernetes half (issue 27, item 2): security groups per workload without
//! trunking. A `NetworkProfile` (our small cluster-scoped CRD, `deploy/networkprofile-crd.yaml`)
//! names a subnet (or a tag selector for the node's zone) and the security groups its pods' ENIs
//! carry; a pod selects one by the annotation `eniipam.io/network: <name>`, on itself or on its
//! namespace (the pod's wins; an empty value means the default network). The node advertises each
//! profile's total slots as the extended resource `eniipam.io/network-<name>`, so the scheduler
//! places a pod that requests one only where a slot exists.
//!
//! What this crate gives the daemon, which wires it to the pool (ENIs per profile, their capacity):
//!
//! - [`controller`]: [`start`], everything running: the watches, the checker that hands the usable
//!   profiles to the pool, the selector asked on ADD ([`PodProfiles`]) and the advertiser. It meets
//!   the pool through the seam [`ProfileSink`] and the daemon's pod watch through [`KnownPods`],
//!   both implemented by the daemon.
//! - [`check`]: each profile checked against EC2 for this node into a [`CheckedProfile`] (or why
//!   not), and a profile's ENIs brought to its groups.
//! - [`profile`]: the `NetworkProfile` type and its validation into a [`ProfileSpec`], each refusal
//!   naming the object and the field.
//! - [`watch`]: [`spawn`], the profiles published as [`Profiles`] on a `tokio::sync::watch` channel
//!   whenever they change.
//! - [`select`]: which profile a pod selects ([`pod_profile`]) and the namespaces' annotations
//!   ([`Namespaces`], [`spawn_namespaces`]).
//! - [`resources`]: the node's extended resources ([`Advertiser`], [`resources::spawn`]), and why
//!   they are patched as they are.
//!
//! [`CheckedProfile`] is the cloud crate's `node_fit::ProfileNetwork`, the pool's type too: the pool
//! is the core and imports no feature's crate, so the one type both need sits below both, beside
//! the EC2 checks that make it (`eniipam_cloud::node_fit`).
//!
//! Why ENIs and not branch ENIs: trunking (what the VPC CNI's security groups for pods use) is not a
//! public EC2 API. An ENI already carries security groups, so a profile is a set of ENIs; since a
//! node has few ENI slots, capacity is per profile, and the scheduler must see it.

pub mod check;
pub mod controller;
pub mod profile;
pub mod resources;
pub mod select;
pub mod watch;

pub use check::CheckedProfile;
pub use controller::{KnownPods, PodProfiles, ProfileSink, SelectError, start};
pub use profile::{EgressMode, NetworkProfile, ProfileSpec, SubnetChoice};
pub use resources::{Advertiser, RESOURCE_PREFIX, resource_name};
pub use select::{ANNOTATION, Namespaces, pod_profile, spawn_namespaces};
pub use watch::{Profiles, spawn};
