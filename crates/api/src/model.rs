//! Plain data types shared by the plugin and every layer of the daemon. No I/O here.

use std::fmt;
use std::net::Ipv4Addr;

use sha1::{Digest, Sha1};
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A pod IP. eniipam hands out IPv4 secondary private addresses.
pub type Ip = Ipv4Addr;

/// An EC2 network interface id (`eni-` followed by 8 or 17 hex digits).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct EniId(String);

/// The error for a string that is not an ENI id.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("malformed ENI id {0:?}: expected `eni-` followed by 8 or 17 hex digits")]
pub struct MalformedEniId(pub String);

impl EniId {
    /// The id as EC2 spells it.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `s` has the shape of an ENI id.
    pub fn is_valid(s: &str) -> bool {
        s.strip_prefix("eni-").is_some_and(|hex| {
            (hex.len() == 8 || hex.len() == 17) && hex.bytes().all(|b| b.is_ascii_hexdigit())
        })
    }
}

impl FromStr for EniId {
    type Err = MalformedEniId;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if Self::is_valid(s) {
            Ok(Self(s.to_owned()))
        } else {
            Err(MalformedEniId(s.to_owned()))
        }
    }
}

impl TryFrom<String> for EniId {
    type Error = MalformedEniId;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<EniId> for String {
    fn from(id: EniId) -> Self {
        id.0
    }
}

impl fmt::Display for EniId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What the CNI spec uses to name one network attachment of one container.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct AttachmentKey {
    pub container_id: String,
    pub ifname: String,
}

impl AttachmentKey {
    pub fn new(container_id: impl Into<String>, ifname: impl Into<String>) -> Self {
        Self {
            container_id: container_id.into(),
            ifname: ifname.into(),
        }
    }
}

impl fmt::Display for AttachmentKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.container_id, self.ifname)
    }
}

/// Why a container id or interface name is refused.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum InvalidAttachment {
    #[error(
        "container id {0:?} is not valid: 1 to 256 characters, alphanumerics first, then alphanumerics, '_', '.', '-'"
    )]
    ContainerId(String),
    #[error(
        "interface name {0:?} is not valid: 1 to 15 bytes, not '.' or '..', no '/', ':' or whitespace"
    )]
    Ifname(String),
}

/// The CNI spec's rule for container ids (alphanumerics, then alphanumerics, `_`, `.`, `-`), at most
/// 256 characters. The plugin and the daemon apply this one rule.
pub fn validate_container_id(id: &str) -> Result<(), InvalidAttachment> {
    let mut bytes = id.bytes();
    let ok = id.len() <= 256
        && bytes.next().is_some_and(|b| b.is_ascii_alphanumeric())
        && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(InvalidAttachment::ContainerId(id.to_owned()))
    }
}

/// The spec's (and Linux's) rule for interface names: 1–15 bytes, not `.`/`..`, no `/`, `:` or
/// whitespace.
pub fn validate_ifname(name: &str) -> Result<(), InvalidAttachment> {
    let ok = !name.is_empty()
        && name.len() <= 15
        && name != "."
        && name != ".."
        && !name
            .chars()
            .any(|c| c == '/' || c == ':' || c.is_whitespace() || c.is_control());
    if ok {
        Ok(())
    } else {
        Err(InvalidAttachment::Ifname(name.to_owned()))
    }
}

/// The Kubernetes pod an attachment belongs to (as the runtime passes it in CNI_ARGS).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl PodRef {
    /// `namespace/name`, the key StatefulSet pods keep across restarts.
    pub fn sticky_key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// The policy-routing table of pod IPs on the ENI at `device_index`: `device_index + 1` (the AWS VPC
/// CNI's convention, so existing host tooling reads it the same), or `None` for the primary ENI, whose
/// pod IPs route through the main table. The daemon keeps these tables; the plugin adds the rules that
/// point at them.
pub fn route_table(device_index: u32) -> Option<u32> {
    (device_index > 0).then(|| device_index + 1)
}

/// The VPC router of a subnet whose network address is `network`: that address plus one, the gateway
/// for routes out of an ENI (the cloud crate's `vpc_router` takes the CIDR; the host's ENI tables
/// route through it).
pub fn vpc_router(network: Ipv4Addr) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(network).wrapping_add(1))
}

/// The host veth name: `prefix` + the first 11 hex digits of SHA-1 over `namespace/name` (plus
/// `/ifname` for interfaces other than `eth0`, so a pod with several eniipam interfaces gets distinct
/// names). Without a pod identity the container id stands in for `namespace/name`. At most 15 bytes
/// for prefixes of up to 4.
pub fn host_veth_name(prefix: &str, pod: Option<&PodRef>, key: &AttachmentKey) -> String {
    let mut seed = match pod {
        Some(pod) => pod.sticky_key(),
        None => key.container_id.clone(),
    };
    if key.ifname != "eth0" {
        seed.push('/');
        seed.push_str(&key.ifname);
    }
    let digest = Sha1::digest(seed.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("{prefix}{}", &hex[..11])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attachments_are_validated_by_one_rule() {
        assert!(validate_container_id("abc-1.2_3").is_ok());
        assert!(validate_container_id("").is_err());
        assert!(validate_container_id("-x").is_err());
        assert!(validate_container_id("a/b").is_err());
        assert!(validate_container_id(&"a".repeat(257)).is_err());
        assert!(validate_ifname("eth0").is_ok());
        assert!(validate_ifname("").is_err());
        assert!(validate_ifname("..").is_err());
        assert!(validate_ifname("a:b").is_err());
        assert!(validate_ifname("sixteen-chars-xx").is_err());
    }

    #[test]
    fn eni_ids_are_validated() {
        assert!("eni-0123abcd".parse::<EniId>().is_ok());
        assert!("eni-0123456789abcdef0".parse::<EniId>().is_ok());
        assert!("eni-xyz".parse::<EniId>().is_err());
        assert!("i-0123abcd".parse::<EniId>().is_err());
        assert!("eni-0123abcd0".parse::<EniId>().is_err());
    }
}
