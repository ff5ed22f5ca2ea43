//! The verdict counters read back: `nft -j list counters table inet eniipam_policy`, one reading
//! per isolated direction and verdict, labelled by the pod's veth (for metrics and
//! `eniipamctl policy <pod>`).

use serde_json::Value;

use super::{PolicyType, TABLE};

/// What a chain's counter counts: connections a rule let through, or the chain's final `drop`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CounterVerdict {
    Allowed,
    Denied,
}

impl CounterVerdict {
    /// `allowed` or `denied` (a metric label).
    pub fn word(self) -> &'static str {
        match self {
            Self::Allowed => "allowed",
            Self::Denied => "denied",
        }
    }
}

/// One counter of the table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CounterReading {
    /// The chain it counts for (`in_<veth>` or `eg_<veth>`).
    pub chain: String,
    /// The pod's host veth.
    pub veth: String,
    /// The pod (`namespace/name`), as rendered; cut if its comment was too long for `nft`.
    pub pod: String,
    pub direction: PolicyType,
    pub verdict: CounterVerdict,
    /// Packets that met the verdict: new connections' first packets (and their retransmissions).
    pub packets: u64,
    pub bytes: u64,
}

/// The counter objects of our table (`inet eniipam_policy`) in the output of `nft -j list counters
/// …`, other tables' left out: what the verdict counters ([`parse_counters`]) and the decision log's
/// per-rule readings both start from.
pub(crate) fn table_counters(json: &str) -> Result<Vec<Value>, String> {
    let doc: Value = serde_json::from_str(json).map_err(|e| format!("not JSON: {e}"))?;
    let items = doc
        .get("nftables")
        .and_then(Value::as_array)
        .ok_or("no \"nftables\" array")?;
    Ok(items
        .iter()
        .filter_map(|i| i.get("counter"))
        .filter(|c| {
            let text = |key: &str| c.get(key).and_then(Value::as_str).unwrap_or_default();
            text("table") == TABLE && text("family") == "inet"
        })
        .cloned()
        .collect())
}

/// Reads the output of `nft -j list counters table inet eniipam_policy`: the table's counters
/// that [`super::render`] declares (others, and other tables', are left out).
pub fn parse_counters(json: &str) -> Result<Vec<CounterReading>, String> {
    let mut out = Vec::new();
    for c in &table_counters(json)? {
        let text = |key: &str| c.get(key).and_then(Value::as_str).unwrap_or_default();
        let name = text("name");
        let (chain, verdict) = if let Some(chain) = name.strip_suffix("_allowed") {
            (chain, CounterVerdict::Allowed)
        } else if let Some(chain) = name.strip_suffix("_denied") {
            (chain, CounterVerdict::Denied)
        } else {
            continue;
        };
        let direction = if chain.starts_with("in_") {
            PolicyType::Ingress
        } else if chain.starts_with("eg_") {
            PolicyType::Egress
        } else {
            continue;
        };
        // The comment is "<veth> <namespace/name> <direction>", the veth first (see render).
        let mut words = text("comment").split(' ');
        let veth = words.next().unwrap_or_default();
        if veth.is_empty() {
            return Err(format!("counter {name}: no veth in its comment"));
        }
        let pod = words.next().unwrap_or_default();
        let number = |key: &str| {
            c.get(key)
                .and_then(Value::as_u64)
                .ok_or_else(|| format!("counter {name}: no {key}"))
        };
        out.push(CounterReading {
            chain: chain.to_owned(),
            veth: veth.to_owned(),
            pod: pod.to_owned(),
            direction,
            verdict,
            packets: number("packets")?,
            bytes: number("bytes")?,
        });
    }
    Ok(out)
}
