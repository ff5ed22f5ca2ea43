//! The CNI plugin (`eniipam` binary): CNI spec 1.1.0 (accepting 0.4.0 and 1.0.0 configurations) over
//! the daemon's gRPC API.
//!
//! One binary, two roles, chosen by the network configuration: with `"type": "eniipam"` it is the main
//! plugin and wires the pod (veth pair, `/32`, link-local gateway, host route, policy rules); with
//! `"ipam": {"type": "eniipam"}` under another plugin it only allocates and returns the address.
//! It links no cloud, store or pool code: only `eniipam-api` (the gRPC contract, model types, the result
//! cache) and `eniipam-netlink`.
//!
//! - [`spec`]: versions, the error object and codes, result types.
//! - [`env`]: the `CNI_*` environment, parsed and validated.
//! - [`family`]: the node's IP family (`ipv4`, `ipv6`, `dual`) and the daemon's reply validated.
//! - [`netconf`]: the network configuration (knobs and the sticky-IP opt-in are documented there).
//! - [`command`]: ADD, DEL, CHECK, VERSION, GC, STATUS (a file each): [`prepare`] reads and
//!   validates an invocation synchronously (VERSION and refused input are answered there, with no
//!   runtime), [`Job::run`] does the rest; [`run`] is both.
//! - [`client`]: the gRPC client over the unix socket and the daemon-error → CNI-code mapping.
//! - [`wiring`]: pod plumbing with rtnetlink, and its teardown in two halves (the pod end, the host side).

pub mod client;
pub mod command;
pub mod env;
pub mod family;
pub mod netconf;
pub mod spec;
pub mod wiring;

pub use command::{Job, Outcome, Prepared, prepare, run};
pub use env::{Environment, ProcessEnvironment};
pub use spec::{CniError, CniVersion, ErrorCode};
