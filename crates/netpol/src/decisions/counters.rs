//! The per-rule counters read back (`nft -j list counters table inet eniipam_policy`), each
//! mapped to its policy rule through the [`DecisionMap`] of the sync in force: a rule's
//! `<chain>_r<j>` counts the new connections its lines allowed; a chain's `<chain>_denied` the
//! ones its `drop` denied, which count against every policy isolating the pod in that direction
//! (none of them allowed it).

use serde_json::Value;

use super::DecisionMap;
use crate::nft::{PolicyType, table_counters};

/// One counter's reading for one policy rule (or, denied, one isolating policy).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleReading {
    /// The kernel counter's name and the policy: what the reading's growth is tracked by.
    pub key: String,
    pub namespace: String,
    pub policy: String,
    pub direction: PolicyType,
    /// The rule's index in the policy's `ingress`/`egress` (`None`: the denial).
    pub rule: Option<usize>,
    pub allowed: bool,
    pub packets: u64,
}

/// The readings of the table's per-rule and denied counters whose pod `map` knows.
pub fn rule_readings(json: &str, map: &DecisionMap) -> Result<Vec<RuleReading>, String> {
    let mut out = Vec::new();
    for c in &table_counters(json)? {
        let text = |key: &str| c.get(key).and_then(Value::as_str).unwrap_or_default();
        let name = text("name");
        // Both kinds of comment start "<veth> ", and name the direction after it (a rule's) or
        // last (the chain's).
        let mut words = text("comment").split(' ');
        let veth = words.next().unwrap_or_default();
        let direction = if name.starts_with("in_") {
            PolicyType::Ingress
        } else if name.starts_with("eg_") {
            PolicyType::Egress
        } else {
            continue;
        };
        let packets = c.get("packets").and_then(Value::as_u64).unwrap_or(0);
        let split = |policy: &str| {
            let (ns, name) = policy.split_once('/').unwrap_or(("", policy));
            (ns.to_owned(), name.to_owned())
        };
        if name.ends_with("_allowed") {
            continue;
        } else if name.ends_with("_denied") {
            let Some((_, policies)) = map.policies(veth, direction) else {
                continue;
            };
            for p in policies {
                let (namespace, policy) = split(p);
                out.push(RuleReading {
                    key: format!("{name} {p}"),
                    namespace,
                    policy,
                    direction,
                    rule: None,
                    allowed: false,
                    packets,
                });
            }
        } else if let Some((_, j)) = name.rsplit_once("_r")
            && let Ok(j) = j.parse::<usize>()
            && let Some((_, source)) = map.rule(veth, direction, j)
        {
            let (namespace, policy) = split(&source.policy);
            out.push(RuleReading {
                key: name.to_owned(),
                namespace,
                policy,
                direction,
                rule: Some(source.index),
                allowed: true,
                packets,
            });
        }
    }
    Ok(out)
}
