//! The CNI plugin (`eniipam` binary): CNI spec 1.1.0 (accepting 0.4.0 and 1.0.0 configurations) over
//! the daemon's gRPC API.
//!
//! One binary, two roles, chosen by the network configuration: with `"type": "eniipam"` it is the main
//! plugin and wires the pod (veth pair, `/32`, link-local gateway, host route, policy rules); with
//! `"ipam": {"type": "eniipam"}` under another plugin it only allocates and returns the address.
//! The plugin links no cloud code: only `cni`, `rpc` and `model`.
//!
//! - [`spec`]: versions, the error object and codes, result types.
//! - [`config`]: the `CNI_*` environment and the network configuration, parsed and validated (knobs
//!   and the sticky-IP opt-in are documented there).
//! - [`command`]: ADD, DEL, CHECK, VERSION, GC, STATUS, and [`run`].
//! - [`client`]: the gRPC client over the unix socket and the daemon-error → CNI-code mapping.
//! - [`netns`]: pod plumbing with rtnetlink.
//! - [`cache`]: cached ADD results, so DEL and GC work without the daemon.

pub mod cache;
pub mod client;
pub mod command;
pub mod config;
pub mod netns;
pub mod spec;

pub use command::{Outcome, run};
pub use config::{Environment, ProcessEnvironment};
pub use spec::{CniError, CniVersion, ErrorCode};
