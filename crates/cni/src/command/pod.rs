//! The kernel's side of a command: the namespaces and netlink sockets of a main-role ADD or CHECK,
//! and how a wiring error maps to a CNI code.

use eniipam_netlink::{Netlink, NetnsFile};

use crate::spec::{CniError, ErrorCode};
use crate::wiring::NetnsError;

pub(super) fn netns_to_cni(err: NetnsError) -> CniError {
    let code = match &err {
        NetnsError::Netlink(eniipam_netlink::Error::Open { .. }) => ErrorCode::InvalidEnvironment,
        NetnsError::Mismatch(_) => ErrorCode::CheckFailed,
        NetnsError::Netlink(_) | NetnsError::Conflict(_) => ErrorCode::WiringFailed,
    };
    CniError::new(code, err.to_string())
}

/// Namespaces and netlink sockets of a main-role ADD or CHECK.
pub(super) struct PodSide {
    pub(super) ns: NetnsFile,
    pub(super) host: Netlink,
    pub(super) pod: Netlink,
}

impl PodSide {
    pub(super) fn open(path: &str) -> Result<Self, CniError> {
        let nl = |e: eniipam_netlink::Error| netns_to_cni(e.into());
        let ns = NetnsFile::open(path).map_err(nl)?;
        let host = Netlink::current().map_err(nl)?;
        let pod = Netlink::in_netns(&ns).map_err(nl)?;
        Ok(Self { ns, host, pod })
    }
}

/// The addresses a cache entry records: its IPv4 (`0.0.0.0` stands for none, in an IPv6-only
/// entry) and the IPv6 of the result ADD cached for `ifname`.
pub(super) fn cached_addresses(
    entry: &eniipam_api::cache::CacheEntry,
) -> (Option<std::net::Ipv4Addr>, Option<std::net::Ipv6Addr>) {
    let ip = Some(entry.ip).filter(|ip| !ip.is_unspecified());
    let ipv6 = crate::spec::CniResult::from_json(&entry.result)
        .ok()
        .and_then(|r| r.ipv6_for(&entry.ifname));
    (ip, ipv6)
}
