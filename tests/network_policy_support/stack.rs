//! The address families of the world's pods (issue 47, case 7): IPv4 only (upstream's world),
//! IPv6 only, or dual-stack. Each pod's IPv6 is its IPv4's twin in `2001:db8::/96` (the IPv4 in
//! its low 32 bits), and a policy's `ipBlock`s get their twins the same way (`/n` becomes
//! `/n+96`), so one case reads the same in every stack: over IPv6 the blocks are their twins;
//! dual-stack, each block peer is joined by its twin (as an operator of a dual-stack cluster
//! writes it) and both families are probed.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde_json::Value;

use super::ip_of;

/// Which addresses the world's pods have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stack {
    V4,
    V6,
    Dual,
}

impl Stack {
    /// A pod's addresses, IPv4 first.
    pub fn addresses(self, ns: &str, pod: &str) -> Vec<IpAddr> {
        let v4 = ip_of(ns, pod);
        match self {
            Self::V4 => vec![IpAddr::V4(v4)],
            Self::V6 => vec![IpAddr::V6(twin(v4))],
            Self::Dual => vec![IpAddr::V4(v4), IpAddr::V6(twin(v4))],
        }
    }

    /// How many families a matrix probes: each cell is probed once per family.
    pub fn families(self) -> usize {
        match self {
            Self::V4 | Self::V6 => 1,
            Self::Dual => 2,
        }
    }

    pub fn has_ipv4(self) -> bool {
        self != Self::V6
    }

    pub fn has_ipv6(self) -> bool {
        self != Self::V4
    }

    /// `policy` (a NetworkPolicy's JSON) with its `ipBlock`s for this stack (see the module docs).
    pub fn translate(self, policy: &Value) -> Value {
        let mut p = policy.clone();
        for (dir, peers) in [("ingress", "from"), ("egress", "to")] {
            let Some(rules) = p["spec"][dir].as_array_mut() else {
                continue;
            };
            for rule in rules {
                let Some(list) = rule[peers].as_array_mut() else {
                    continue;
                };
                *list = list
                    .iter()
                    .flat_map(|peer| match (&peer["ipBlock"], self) {
                        (Value::Null, _) | (_, Self::V4) => vec![peer.clone()],
                        (block, Self::V6) => {
                            vec![serde_json::json!({"ipBlock": twin_block(block)})]
                        }
                        (block, Self::Dual) => vec![
                            peer.clone(),
                            serde_json::json!({"ipBlock": twin_block(block)}),
                        ],
                    })
                    .collect();
            }
        }
        p
    }
}

/// An IPv4's twin in `2001:db8::/96`.
pub fn twin(v4: Ipv4Addr) -> Ipv6Addr {
    Ipv6Addr::from((0x2001_0db8_u128 << 96) | u128::from(u32::from(v4)))
}

/// An IPv4 CIDR's twin: its address's twin, its prefix 96 longer.
fn twin_cidr(cidr: &str) -> String {
    let (addr, len) = cidr.split_once('/').expect("a CIDR");
    let addr: Ipv4Addr = addr.parse().expect("an IPv4 CIDR");
    let len: u8 = len.parse().expect("a prefix length");
    format!("{}/{}", twin(addr), len + 96)
}

fn twin_block(block: &Value) -> Value {
    let mut b = block.clone();
    b["cidr"] = Value::from(twin_cidr(block["cidr"].as_str().expect("a cidr")));
    if let Some(except) = block["except"].as_array() {
        b["except"] = except
            .iter()
            .map(|e| Value::from(twin_cidr(e.as_str().expect("an except"))))
            .collect();
    }
    b
}
