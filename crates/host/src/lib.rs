//! The node's datapath, one room (`eniipam-host`; the daemon's `eniipam::host`): networking of the
//! node itself that the daemon owns, as opposed to the per-pod plumbing the CNI plugin does. This
//! crate never touches a pod's netns, and depends on no part of the daemon: the model comes from
//! `eniipam-api`, rtnetlink from `eniipam-netlink`, `nft` and netfilter framing from
//! `eniipam-netfilter`, and the one fact it needs from IMDS through its own [`PrimaryFacts`].
//!
//! - [`routes`]: the policy-routing table of every secondary ENI (`device_index + 1`): the subnet
//!   route and the default route via the subnet's VPC router on that ENI's link, which the plugin's
//!   `from <pod ip> lookup <table>` rules send replies through.
//! - [`keeper`]: [`RouteKeeper`], which follows the pool's ENIs and keeps their tables in step.
//! - [`netfilter`]: a typed wrapper over the system's `nft` binary (tables, base chains, rules,
//!   atomic replace).
//! - [`snat`]: SNAT of pod egress to eth0's primary IP outside the VPC, and the egress mark.
//! - [`nodeport`]: NodePort / hostPort: the connmark on eth0, its restore, `fwmark` rule 1024,
//!   loose `rp_filter` on the primary interface.
//! - [`rules`]: the node's whole rule set for a configuration ([`desired_table`]), installed, read
//!   back and removed by [`HostRules`] (nftables table `ip eniipam`).
//! - [`rules_keeper`]: [`RulesKeeper`], which keeps those rules in step with the config and the
//!   primary interface's facts ([`PrimaryFacts`]: VPC CIDRs re-read periodically) and heals drift.
//! - [`conntrack`]: a released pod address's conntrack entries deleted (over ctnetlink), so its
//!   next pod inherits no flow; [`nfnetlink`]: the netfilter netlink framing it shares with the
//!   NetworkPolicy decision log.
//! - [`prepare`]: `eniipamd --prepare-host` (loose `rp_filter` on the primary interface) and
//!   `--uninstall-host-rules`.
//!
//! The pool's ENIs reach the route keeper as [`EniRoute`]s the daemon derives from the pool's
//! snapshot: this crate never imports the pool.

pub mod conntrack;
pub mod keeper;
pub mod nodeport;
pub mod prepare;
pub mod routes;
pub mod rules;
pub mod rules_keeper;
pub mod snat;

/// The `nft` wrapper and the netfilter netlink framing, their own crate (`crates/netfilter`, shared
/// with the NetworkPolicy crate): `host::netfilter::…` and `host::nfnetlink::…` read as before.
pub use eniipam_netfilter as netfilter;
pub use eniipam_netfilter::nfnetlink;
pub use eniipam_netlink::TableRoute;
pub use keeper::{ReadyRequest, RouteKeeper, SyncReport};
pub use netfilter::{Nft, NftError, SnatPorts};
pub use prepare::{PrepareError, Prepared};
pub use routes::{EniRoute, EniRouting, HostError};
pub use rules::{HostRules, HostRulesConfig, PrimaryInterface, RulesError, TABLE, desired_table};
pub use rules_keeper::{InterfaceFacts, PrimaryFacts, RulesKeeper, RulesReport, TableChange};
pub use snat::Snat;
