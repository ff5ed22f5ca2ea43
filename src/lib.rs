//! eniipamd, the node daemon of eniipam: pod IP address management for Kubernetes on EC2.
//!
//! The daemon keeps a warm pool of secondary private IPs on the node's ENIs and serves them over gRPC
//! on a unix socket to the CNI plugin (the `eniipam-cni` crate, which never links this one). The model
//! types, the gRPC contract and the result-cache format are the `eniipam-api` crate's; the netlink
//! primitives are `eniipam-netlink`'s.
//!
//! Modules, with imports flowing one way (`bin` → [`daemon`] → [`rpc`] → [`ipam`] → [`pool`] /
//! [`reconcile`] → [`cloud`] / [`store`] → [`model`]):
//!
//! - [`daemon`]: `Daemon::start`, which builds and runs everything (the `eniipamd` binary is a thin main).
//! - [`rpc`]: the tonic services (`Ipam`, `Introspect`) on the unix socket: protobuf ⇄ domain types.
//! - [`ipam`]: the service: allocate / release / check / GC with the durable record (invariant 5) and
//!   the sticky and fallback rules in one place.
//! - [`pool`]: the IP pool: capacity tokens, the idle queue (reverse-time order, cooldown, sticky IPs),
//!   one actor per ENI with its ipBacklog, the maintainer that keeps min/max idle.
//! - [`reconcile`]: the startup rebuild from the state file, IMDS, EC2 and the host; the running
//!   reconcile.
//! - [`cloud`]: the `Cloud` (EC2) and `Metadata` (IMDSv2) seams on the AWS SDK, rate limiting, retries
//!   and backoff, the ENI lifecycle and the leaked-ENI collector.
//! - [`store`]: SQLite state (WAL), one owner thread behind an async handle.
//! - [`host`]: the node's own networking the daemon keeps: each secondary ENI's route table, the SNAT and
//!   NodePort rules (nftables table `ip eniipam`, fwmark rule 1024, loose rp_filter on eth0).
//! - [`config`]: the daemon's configuration (file + `ENIIPAM_*` environment), validated.
//! - [`telemetry`]: logs, Prometheus metrics, `/healthz` and `/readyz`.
//! - [`clock`]: tokio time and the unix milliseconds the state file keeps.
//! - `simulate` (feature `simulate`, on by default): `--simulate`, the daemon on an embedded mockcloud.

pub mod clock;
pub mod cloud;
pub mod config;
pub mod daemon;
pub mod host;
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
