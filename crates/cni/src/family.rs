//! The node's IP family as the daemon's `AllocateReply` states it, and the addresses a reply gives
//! the pod, validated before anything is wired: a reply the plugin cannot wire exactly as it says is
//! refused whole (and the allocation given back), never wired in part.

use std::net::{Ipv4Addr, Ipv6Addr};

use eniipam_api::pb;
use ipnet::Ipv6Net;

/// What the node hands pods.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IpFamily {
    /// An IPv4 from the ENI pool (also what an empty `ip_family`, an older daemon, means).
    V4,
    /// An IPv6 from the node's `/80`, no IPv4.
    V6,
    /// Both.
    Dual,
}

impl IpFamily {
    /// Parses `ip_family` as the daemon sends it.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "" | "ipv4" => Ok(Self::V4),
            "ipv6" => Ok(Self::V6),
            "dual" => Ok(Self::Dual),
            other => Err(format!(
                "eniipamd answered ip_family {other:?}, which this plugin does not know \
                 (it wires \"ipv4\", \"ipv6\" and \"dual\"): is the plugin older than the daemon?"
            )),
        }
    }

    /// Whether pods get an IPv4.
    pub fn has_v4(self) -> bool {
        matches!(self, Self::V4 | Self::Dual)
    }

    /// Whether pods get an IPv6.
    pub fn has_v6(self) -> bool {
        matches!(self, Self::V6 | Self::Dual)
    }
}

/// The addresses of one attachment: at least one of the two.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Assigned {
    /// The family the daemon runs.
    pub family: IpFamily,
    /// The IPv4 (`/32`), in `ipv4` and `dual`.
    pub ip: Option<Ipv4Addr>,
    /// The IPv6 (`/128`), in `ipv6` and `dual`.
    pub ipv6: Option<Ipv6Addr>,
    /// An IPv6-only pod's node-local IPv4 for egress (`ipv4_egress`), wired but never reported
    /// (see `wiring::egress`).
    pub egress_ipv4: Option<Ipv4Addr>,
}

impl Assigned {
    /// Reads an `AllocateReply`: the family must be known, each address it promises must parse, and
    /// the IPv6 must lie inside the node's `ipv6_prefix` (an address outside it is not routed to this
    /// node by the VPC, so wiring it would make a pod that silently receives nothing).
    pub fn from_reply(reply: &pb::AllocateReply) -> Result<Self, String> {
        let family = IpFamily::parse(&reply.ip_family)?;
        let ip = if family.has_v4() {
            Some(reply.ip.parse::<Ipv4Addr>().map_err(|_| {
                format!(
                    "eniipamd allocated {:?}, which is not an IPv4 address",
                    reply.ip
                )
            })?)
        } else {
            None
        };
        let ipv6 = if family.has_v6() {
            let addr = reply.ipv6.parse::<Ipv6Addr>().map_err(|_| {
                format!(
                    "eniipamd allocated IPv6 {:?} (ip_family {:?}), which is not an IPv6 address",
                    reply.ipv6, reply.ip_family
                )
            })?;
            let prefix = reply.ipv6_prefix.parse::<Ipv6Net>().map_err(|_| {
                format!(
                    "eniipamd's ipv6_prefix {:?} is not an IPv6 prefix (like 2600:1f18::a1b2:0:0:0/80)",
                    reply.ipv6_prefix
                )
            })?;
            if !prefix.contains(&addr) {
                return Err(format!(
                    "eniipamd allocated IPv6 {addr}, which is outside the node's prefix {prefix}"
                ));
            }
            Some(addr)
        } else {
            None
        };
        let egress_ipv4 = egress(reply, family)?;
        Ok(Self {
            family,
            ip,
            ipv6,
            egress_ipv4,
        })
    }

    /// The addresses for messages (`10.0.0.5`, `2600::5`, `10.0.0.5 and 2600::5`).
    pub fn describe(&self) -> String {
        match (self.ip, self.ipv6) {
            (Some(v4), Some(v6)) => format!("{v4} and {v6}"),
            (Some(v4), None) => v4.to_string(),
            (None, Some(v6)) => v6.to_string(),
            (None, None) => "no address".into(),
        }
    }
}

/// The reply's `egress_ipv4`: none when empty; else an address of 169.254.172.0/22 (not its
/// network or broadcast address), and only for an IPv6-only pod (a dual-stack pod has a VPC IPv4).
/// Anything else is refused: wiring an address the node's SNAT does not translate would make a pod
/// whose IPv4 silently goes nowhere.
fn egress(reply: &pb::AllocateReply, family: IpFamily) -> Result<Option<Ipv4Addr>, String> {
    if reply.egress_ipv4.is_empty() {
        return Ok(None);
    }
    let range = format!(
        "{}/{}",
        eniipam_api::egress::NETWORK,
        eniipam_api::egress::PREFIX_LEN
    );
    let addr = reply.egress_ipv4.parse::<Ipv4Addr>().map_err(|_| {
        format!(
            "eniipamd's egress_ipv4 {:?} is not an IPv4 address",
            reply.egress_ipv4
        )
    })?;
    if !eniipam_api::egress::is_pod_address(addr) {
        return Err(format!(
            "eniipamd's egress_ipv4 {addr} is not a pod address of the egress range {range}"
        ));
    }
    if family != IpFamily::V6 {
        return Err(format!(
            "eniipamd sent egress_ipv4 {addr} with ip_family {:?}: only IPv6-only pods get one",
            reply.ip_family
        ));
    }
    Ok(Some(addr))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(family: &str, ip: &str, ipv6: &str) -> pb::AllocateReply {
        pb::AllocateReply {
            ip: ip.into(),
            ipv6: ipv6.into(),
            ipv6_prefix: "2600:1f18:6d00:100:a1b2::/80".into(),
            ip_family: family.into(),
            ..Default::default()
        }
    }

    #[test]
    fn each_family_yields_its_addresses() {
        let v4 = Assigned::from_reply(&reply("", "10.0.0.5", "")).unwrap();
        assert_eq!(v4.family, IpFamily::V4);
        assert_eq!(v4.ip, Some(Ipv4Addr::new(10, 0, 0, 5)));
        assert_eq!(v4.ipv6, None);
        let v6 = Assigned::from_reply(&reply("ipv6", "", "2600:1f18:6d00:100:a1b2::7")).unwrap();
        assert_eq!(v6.ip, None);
        assert_eq!(v6.ipv6, Some("2600:1f18:6d00:100:a1b2::7".parse().unwrap()));
        let dual =
            Assigned::from_reply(&reply("dual", "10.0.0.5", "2600:1f18:6d00:100:a1b2::7")).unwrap();
        assert_eq!(dual.describe(), "10.0.0.5 and 2600:1f18:6d00:100:a1b2::7");
    }

    #[test]
    fn bad_replies_name_what_is_wrong() {
        let err = Assigned::from_reply(&reply("ipv7", "10.0.0.5", "")).unwrap_err();
        assert!(err.contains("\"ipv7\""), "{err}");
        let err = Assigned::from_reply(&reply("ipv6", "", "not-an-ip")).unwrap_err();
        assert!(
            err.contains("\"not-an-ip\"") && err.contains("not an IPv6"),
            "{err}"
        );
        let err =
            Assigned::from_reply(&reply("ipv6", "", "2600:1f18:6d00:100:ffff::7")).unwrap_err();
        assert!(
            err.contains("outside the node's prefix 2600:1f18:6d00:100:a1b2::/80"),
            "{err}"
        );
        let err =
            Assigned::from_reply(&reply("dual", "", "2600:1f18:6d00:100:a1b2::7")).unwrap_err();
        assert!(err.contains("not an IPv4"), "{err}");
        let mut no_prefix = reply("ipv6", "", "2600:1f18:6d00:100:a1b2::7");
        no_prefix.ipv6_prefix.clear();
        let err = Assigned::from_reply(&no_prefix).unwrap_err();
        assert!(err.contains("ipv6_prefix \"\""), "{err}");
    }

    #[test]
    fn an_egress_address_is_taken_only_from_the_range_and_only_for_ipv6_pods() {
        let with = |family: &str, ip: &str, egress: &str| {
            let mut r = reply(family, ip, "2600:1f18:6d00:100:a1b2::7");
            r.egress_ipv4 = egress.into();
            Assigned::from_reply(&r)
        };
        let ok = with("ipv6", "", "169.254.172.9").unwrap();
        assert_eq!(ok.egress_ipv4, Some(Ipv4Addr::new(169, 254, 172, 9)));
        assert_eq!(ok.ip, None, "never the pod's reported IPv4");
        assert_eq!(with("ipv6", "", "").unwrap().egress_ipv4, None);
        let err = with("ipv6", "", "169.254.172.300").unwrap_err();
        assert!(
            err.contains("\"169.254.172.300\"") && err.contains("not an IPv4"),
            "{err}"
        );
        for outside in [
            "169.254.176.1",
            "10.0.0.9",
            "169.254.172.0",
            "169.254.175.255",
        ] {
            let err = with("ipv6", "", outside).unwrap_err();
            assert!(err.contains("169.254.172.0/22"), "{outside}: {err}");
        }
        let err = with("dual", "10.0.0.5", "169.254.172.9").unwrap_err();
        assert!(err.contains("only IPv6-only pods"), "{err}");
    }
}
