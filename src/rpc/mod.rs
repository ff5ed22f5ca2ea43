//! The gRPC services on the daemon's unix socket: [`ipam`] (for the CNI plugin) converts protobuf to
//! and from the domain types of [`crate::ipam`] and maps its errors to status codes with typed reasons;
//! [`introspect`] (for `eniipamctl`) renders the pool and the state file; [`socket`] binds the socket.
//! The contract (`proto/eniipam/v1/*.proto`) and the generated code live in the `eniipam-api` crate.

pub mod introspect;
pub mod ipam;
pub mod socket;

pub use eniipam_api::{API_VERSION, DEFAULT_SOCKET, connect, endpoint, pb};
pub use introspect::IntrospectService;
pub use ipam::IpamService;
pub use socket::{SocketError, bind_socket};
