//! eniipam's API: what the CNI plugin and the daemon (`eniipamd`) both speak, and nothing either side
//! keeps to itself. The plugin links this crate and the netlink crate only; so does the daemon, beside its
//! cloud, pool and store.
//!
//! - [`model`]: plain types (IPs, ENI ids, attachment keys, pod references), re-exported at the root.
//! - [`pb`]: the gRPC contract generated from the workspace's `proto/eniipam/v1/*.proto` (`Ipam` for the
//!   plugin, `Introspect` for `eniipamctl`), with [`API_VERSION`], [`DEFAULT_SOCKET`] and typed error
//!   reasons ([`status_with_reason`], [`reason_of`]).
//! - [`cache`]: the plugin's result cache, which the plugin writes and the daemon reads as evidence of
//!   live pods.

pub mod cache;
pub mod model;

pub use model::{
    AttachmentKey, EniId, InvalidAttachment, Ip, MalformedEniId, PodRef, host_veth_name,
    validate_container_id, validate_ifname,
};

/// Generated protobuf types, clients and servers.
pub mod pb {
    #![allow(clippy::all, missing_docs, rust_2018_idioms)]
    tonic::include_proto!("eniipam.v1");
}

/// The API version this build speaks; requests carry it and the daemon refuses others with
/// [`pb::ErrorReason::ApiVersionMismatch`].
pub const API_VERSION: u32 = 1;

/// Default socket path of the daemon's gRPC API (`socket` in the conflist, `socket_path` in the daemon's
/// configuration and `ENIIPAM_SOCKET_PATH` for both the daemon and `eniipamctl`).
pub const DEFAULT_SOCKET: &str = "/run/eniipam/eniipam.sock";

/// The link group (`ip link set <veth> group <n>`) of the host veth of a pod whose egress leaves by
/// its own ENI with its own address: a network profile in the `strict` egress mode (issue 44). The
/// plugin puts the veth in it when the daemon's Allocate reply says `own_eni_egress`; the daemon's
/// egress mark and SNAT skip packets that come in on it (`iifgroup`), so their routing is the pod's
/// `from <ip> lookup <ENI table>` rule and the VPC filters them by the ENI's security groups. The
/// number spells "ENI" in ASCII, far from the small groups operators number by hand.
pub const OWN_ENI_EGRESS_LINK_GROUP: u32 = 0x0045_4e49;

/// IPv4 egress of IPv6-only pods (`ip_family = ipv6` with `ipv4_egress`): the daemon hands each pod
/// an address of this range, the plugin wires it, the daemon's SNAT translates it. Both sides check
/// addresses against the same range, so it lives here.
pub mod egress {
    use std::net::Ipv4Addr;

    /// The network of the range: the VPC CNI's own (amazon-vpc-cni-k8s `cmd/aws-vpc-cni/main.go`,
    /// `egressPluginIpamSubnetV4 = "169.254.172.0/22"`), so an operator moving from it finds the same
    /// addresses; link-local, so the VPC never routes them.
    pub const NETWORK: Ipv4Addr = Ipv4Addr::new(169, 254, 172, 0);

    /// The range's prefix length.
    pub const PREFIX_LEN: u8 = 22;

    /// Whether `ip` is a pod address of the range (inside it, neither its network nor its broadcast
    /// address).
    pub fn is_pod_address(ip: Ipv4Addr) -> bool {
        let mask = u32::MAX << (32 - PREFIX_LEN);
        let (ip, net) = (u32::from(ip), u32::from(NETWORK));
        ip & mask == net && ip != net && ip != net | !mask
    }
}

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

/// An error and its sources, `outer: inner: innermost` (the one way both sides flatten an error chain
/// into a log line or a message for the user).
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut s = err.to_string();
    let mut cur = err.source();
    while let Some(e) = cur {
        s.push_str(": ");
        s.push_str(&e.to_string());
        cur = e.source();
    }
    s
}

/// A status whose details carry `reason` (a binary [`pb::ErrorDetail`]), so clients map errors by reason
/// rather than by the message's words.
pub fn status_with_reason(
    code: tonic::Code,
    message: impl Into<String>,
    reason: pb::ErrorReason,
) -> tonic::Status {
    use prost::Message;
    let detail = pb::ErrorDetail {
        reason: reason as i32,
    };
    tonic::Status::with_details(
        code,
        message,
        tonic::codegen::Bytes::from(detail.encode_to_vec()),
    )
}

/// The reason a status carries in its details, if the daemon set one.
pub fn reason_of(status: &tonic::Status) -> Option<pb::ErrorReason> {
    use prost::Message;
    let detail = pb::ErrorDetail::decode(status.details()).ok()?;
    pb::ErrorReason::try_from(detail.reason)
        .ok()
        .filter(|r| *r != pb::ErrorReason::Unspecified)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_round_trip_through_status_details() {
        let s = status_with_reason(
            tonic::Code::FailedPrecondition,
            "mismatch",
            pb::ErrorReason::ApiVersionMismatch,
        );
        assert_eq!(reason_of(&s), Some(pb::ErrorReason::ApiVersionMismatch));
        assert_eq!(
            reason_of(&tonic::Status::failed_precondition("version")),
            None
        );
    }
}
