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
//! - [`rpc`]: the gRPC API (generated from `proto/`) the plugin and `eniipamctl` use.

pub mod cloud;
pub mod model;
pub mod pool;
pub mod rpc;
