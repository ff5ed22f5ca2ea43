//! eniipamd, the node daemon of eniipam: pod IP address management for Kubernetes on EC2.
//!
//! The daemon keeps a warm pool of secondary private IPs on the node's ENIs and serves them over gRPC
//! on a unix socket to the CNI plugin (the `eniipam-cni` crate, which never links this one). The model
//! types, the gRPC contract and the result-cache format are the `eniipam-api` crate's; the netlink
//! primitives are `eniipam-netlink`'s; the `nft` wrapper and netfilter framing `eniipam-netfilter`'s;
//! NetworkPolicy, whole, is the `eniipam-netpol` crate's (a feature in one room, which depends on
//! no part of this crate: the daemon gives it the node's pods and wires its enforcer into the IPAM
//! service at construction).
//!
//! The modules, in layers (the map `tests/module_map.rs` checks against every `crate::…` path in
//! `src/`, and against the same block in `docs/how-it-works.md`). `src/bin/eniipamd.rs`, the thin main,
//! sits above them all.
//!
//! <!-- module-map: checked by tests/module_map.rs; keep docs/how-it-works.md's copy the same -->
//! A module imports only from the layers below its own: never from its own layer, never upward.
//!
//! | layer | modules | what they hold |
//! | --- | --- | --- |
//! | 1 | `simulate` | `eniipamd --simulate`: the daemon on an embedded mockcloud, synthetic churn (feature `simulate`) |
//! | 2 | `daemon` | `Daemon::start` in named steps, where the pool and the host meet; `daemon::run`: the binary's modes |
//! | 3 | `telemetry` | logs; `/metrics` (rendered from `metrics` and snapshots), `/healthz`, `/readyz` |
//! | 4 | `config` | the configuration: TOML file, `ENIIPAM_*` overrides, validation; each part's knobs |
//! | 5 | `rpc` | the tonic services on the unix socket: protobuf ⇄ domain |
//! | 6 | `reconcile` | the startup rebuild, the running reconcile, pods gone from the API server |
//! | 7 | `ipam` | allocate / release / check / GC with the durable record (invariant 5); its extension points, wired at construction (`ipam::Extensions`): "choose the network for a new pod" (`ipam::ProfileSelector`) and "admit a wired pod before ADD returns" (`ipam::Admission`) |
//! | 8 | `pool` | the IP pool (capacity, idle queue, one actor per ENI, maintainer) |
//! | 9 | `store` | SQLite state (WAL), one owner thread |
//! | 10 | `cloud`, `metrics`, `clock` | the `eniipam-cloud` crate: the `Cloud` (EC2) and `Metadata` (IMDSv2) seams, limits, retries and the back-off every retrying task shares, ENI lifecycle; the metric families the request path records; tokio time and unix milliseconds |
//! | 11 | `model`, `network_policy`, `host`, `ipv6`, `network_profiles`, `custom_networking` | `eniipam-api`'s model types (IPs, ENI ids, attachment keys, pods); the `eniipam-netpol` crate, Kubernetes NetworkPolicy whole (policies, pods and namespaces watched, each local pod compiled into the nftables table `inet eniipam_policy` and kept in the kernel, the enforcer, decision logs, metrics): one room, wired by `daemon`; the `eniipam-host` crate, the node datapath whole (ENI route tables and their keeper, SNAT and NodePort rules and their keeper, conntrack of released addresses, `--prepare-host`): one room, wired by `daemon`; the `eniipam-ipv6` crate, IPv6 pods' half outside the pool (the node's /80 taken and recorded, the address book, the egress addresses, the feature's stored rows): one room; the `eniipam-profiles` crate, network profiles whole (the CRD read and validated, the watches, each profile checked against EC2 and handed to the pool through its seam `ProfileSink`, the pod's choice on ADD, the node's extended resources): one room, wired by `daemon`; the `eniipam-custom-networking` crate, the node's ENIConfig read, validated, watched, checked against EC2 and followed into the pool through its seam `PodNetworkSink`: one room, wired by `daemon` |
//! <!-- /module-map -->
//!
//! Where to look: the pool in [`pool`] (the ENI actor in `pool::eni`), the state file in [`store`], the
//! cloud seam in [`cloud`], the data path in [`host`] (and the plugin's wiring in `crates/cni`), the
//! daemon's startup in [`daemon`], the binary's modes in [`daemon::run`].

pub mod clock;
pub mod config;
pub mod daemon;
pub mod ipam;
pub mod metrics;
pub mod pool;
pub mod reconcile;
pub mod rpc;
#[cfg(feature = "simulate")]
pub mod simulate;
pub mod store;
pub mod telemetry;

pub use eniipam_api::model;
/// The cloud seam, its own crate (`crates/cloud`): `crate::cloud::…` paths read as before.
pub use eniipam_cloud as cloud;
/// Custom networking (the node's ENIConfig), its own crate (`crates/custom_networking`):
/// `crate::custom_networking::…` paths read as before.
pub use eniipam_custom_networking as custom_networking;
/// The node datapath, its own crate (`crates/host`): `crate::host::…` paths read as before.
pub use eniipam_host as host;
/// IPv6 pods' /80, address book and egress, its own crate (`crates/ipv6`): `crate::ipv6::…` paths
/// read as before.
pub use eniipam_ipv6 as ipv6;
/// NetworkPolicy, its own crate (`crates/netpol`): `crate::network_policy::…` paths read as before.
pub use eniipam_netpol as network_policy;
/// Network profiles, their own crate (`crates/profiles`): `crate::network_profiles::…` paths read
/// as before.
pub use eniipam_profiles as network_profiles;
