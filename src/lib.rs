//! eniipam: pod IP address management for Kubernetes on EC2.
//!
//! A daemon per node (`eniipamd`) keeps a warm pool of secondary private IPs on the node's ENIs; the CNI
//! plugin (`eniipam`) asks it for one per pod over gRPC. Modules:
//!
//! - [`model`]: plain types (IPs, ENI ids, attachment keys, pod references).
//! - [`cloud`]: the `Cloud` (EC2) and `Metadata` (IMDSv2) seams, their real implementations on the AWS
//!   SDK, rate limiting and retries, and in-memory fakes for tests.
//! - [`pool`]: the IP pool: capacity tokens, the idle queue (reverse-time order, cooldown, sticky IPs),
//!   one actor per ENI with its ipBacklog, and the maintainer that keeps min/max idle.
//! - [`rpc`]: the gRPC API (generated from `proto/`) the plugin and `eniipamctl` use; the server side.
//! - [`cni`]: the CNI plugin: spec types, config, commands, the daemon client, pod plumbing, result cache.
//! - [`store`]: SQLite state (WAL), one owner task behind an async handle.
//! - [`host`]: the node's own routing the daemon keeps: each secondary ENI's route table.
//! - [`reconcile`]: the startup rebuild from the state file, IMDS, EC2 and the host.
//! - [`config`]: the daemon's configuration (file + `ENIIPAM_*` environment), validated.
//! - [`telemetry`]: logs, Prometheus metrics, `/healthz` and `/readyz`.
//! - [`daemon`]: `Daemon::start`, which builds and runs all of the above (the `eniipamd` binary is a thin
//!   main over it).

pub mod cloud;
pub mod cni;
pub mod config;
pub mod daemon;
pub mod host;
pub mod model;
pub mod pool;
pub mod reconcile;
pub mod rpc;
pub mod simulate;
pub mod store;
pub mod telemetry;
