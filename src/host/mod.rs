//! Networking of the node itself that the daemon owns, as opposed to the per-pod plumbing the CNI
//! plugin does. Both use the `eniipam-netlink` primitives; this module never touches a pod's netns.
//!
//! - [`routes`]: the policy-routing table of every secondary ENI (`device_index + 1`): the subnet
//!   route and the default route via the subnet's VPC router on that ENI's link, which the plugin's
//!   `from <pod ip> lookup <table>` rules send replies through.
//! - [`keeper`]: [`RouteKeeper`], which follows the pool's ENIs and keeps their tables in step.

pub mod keeper;
pub mod routes;

pub use eniipam_netlink::TableRoute;
pub use keeper::{RouteKeeper, SyncReport};
pub use routes::{EniRoute, EniRouting, HostError};
