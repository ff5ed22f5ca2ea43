//! Instance types with EC2's published network figures, as `DescribeInstanceTypes` reports them.
//!
//! The table lives in the `eniipam-limits` crate (`crates/limits/data/instance-types.csv`), shared
//! with `eniipamctl max-pods` and the daemon; this module re-exports it so mockcloud's EC2 enforces
//! exactly the limits eniipam computes with. `max_enis` is every network interface of the instance,
//! on all its network cards (eth0 included); multi-card types split it evenly over their cards.

pub use eniipam_limits::{
    CATALOG, InstanceType, MAX_IPV4_PER_ENI, NITRO, NetworkCard, XEN, lookup,
};
