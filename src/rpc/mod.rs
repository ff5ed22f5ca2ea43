//! The gRPC API over a unix socket: generated types ([`pb`]) and the version both sides speak.
//!
//! `proto/eniipam/v1/ipam.proto` (for the CNI plugin) and `proto/eniipam/v1/introspect.proto` (for
//! `eniipamctl`) are the contract; see their comments for error semantics.

/// Generated protobuf types, clients and servers.
pub mod pb {
    #![allow(clippy::all, missing_docs, rust_2018_idioms)]
    tonic::include_proto!("eniipam.v1");
}

/// The API version this build speaks; requests carry it and the daemon refuses others.
pub const API_VERSION: u32 = 1;

/// Default socket path.
pub const DEFAULT_SOCKET: &str = "/run/eniipam/eniipam.sock";

pub mod server;

/// The gRPC endpoint of the daemon's unix socket (`unix:<path>`).
pub fn endpoint(
    path: &std::path::Path,
) -> Result<tonic::transport::Endpoint, tonic::transport::Error> {
    tonic::transport::Endpoint::from_shared(format!("unix:{}", path.display()))
}

/// Connects a gRPC channel to the daemon's unix socket.
pub async fn connect(
    path: &std::path::Path,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    endpoint(path)?.connect().await
}
