//! Networking of the node itself that the daemon owns, as opposed to the per-pod plumbing the CNI
//! plugin does ([`crate::cni::netns`]).
//!
//! - [`routes`]: the policy-routing table of every secondary ENI (`device_index + 1`): the subnet
//!   route and the default route via the subnet's VPC router on that ENI's link, which the plugin's
//!   `from <pod ip> lookup <table>` rules send replies through.

pub mod routes;

pub use routes::{EniRoute, EniRouting, HostError, RouteKeeper, SyncReport, TableRoute};
