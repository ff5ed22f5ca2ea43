//! The kernel's table checked against the ruleset last loaded (issue 47, case 5): another agent's
//! `nft flush ruleset` (or `delete table`, `flush chain`) must not leave the node unenforced
//! until the next change. Two readings:
//!
//! - [`chains_differ`], from `nft -j list chains inet`: the table is there, its base chains
//!   (`prerouting`, `forward`, `output`) hooked as loaded, every pod chain there. Cheap whatever
//!   the sets hold (about 10 ms at 2,500 chains and 500,000 set elements, where any listing of a
//!   table, a chain's rules, the tables or the counters costs `nft` 0.7 s: it reads every set
//!   element first), so it can run every few seconds;
//! - [`base_chain_differs`], from `nft -j list chain inet eniipam_policy <base chain>`: the base
//!   chain holds its rules (a chain flushed);
//! - [`maps_differ`], from `nft -j list maps inet`: the dispatch maps hold
//!   their elements, a jump to every pod chain (a map flushed). A pod chain cannot be deleted
//!   while a map element jumps to it, so the elements also vouch for the chains; a pod chain
//!   flushed by hand is not seen (the periodic whole reload repairs it).
//!
//! A table deleted and loaded again from a saved copy is not told apart from the one loaded (only
//! `list tables` shows a table's handle, at the cost above): its next in-place update fails on
//! what the copy lacks and the table is loaded whole, or the periodic reload replaces it.

use std::collections::BTreeSet;

use serde_json::Value;

use super::base::{BASE_CHAINS, base_rules};
use super::{Ruleset, TABLE};

fn items(json: &str) -> Result<Vec<Value>, String> {
    let doc: Value = serde_json::from_str(json).map_err(|e| e.to_string())?;
    doc["nftables"]
        .as_array()
        .cloned()
        .ok_or_else(|| "no `nftables` array".to_owned())
}

/// What the table in `nft -j list chains inet` lacks of `loaded`'s chains (`None`: nothing).
pub fn chains_differ(json: &str, loaded: &Ruleset) -> Result<Option<String>, String> {
    let items = items(json)?;
    let ours: Vec<&Value> = items
        .iter()
        .map(|i| &i["chain"])
        .filter(|c| c["family"] == "inet" && c["table"] == TABLE)
        .collect();
    if ours.is_empty() {
        return Ok(Some(format!(
            "table inet {TABLE} is missing (no chain of it in the kernel)"
        )));
    }
    for wanted in BASE_CHAINS {
        let Some(base) = ours.iter().find(|c| c["name"] == wanted.name) else {
            return Ok(Some(format!(
                "table inet {TABLE}: its base chain {} is missing",
                wanted.name
            )));
        };
        let hooked = (
            base["type"].as_str().unwrap_or("none"),
            base["hook"].as_str().unwrap_or("none"),
            base["prio"].as_i64().unwrap_or(i64::MIN),
            base["policy"].as_str().unwrap_or("none"),
        );
        if hooked != (wanted.kind, wanted.hook, wanted.priority, wanted.policy) {
            return Ok(Some(format!(
                "table inet {TABLE}: its base chain {} is not hooked as loaded (type {} hook {} priority {} policy {}; loaded: {})",
                wanted.name,
                hooked.0,
                hooked.1,
                hooked.2,
                hooked.3,
                wanted.declaration()
            )));
        }
    }
    let names: BTreeSet<&str> = ours.iter().filter_map(|c| c["name"].as_str()).collect();
    let missing: Vec<&str> = loaded
        .chains
        .keys()
        .map(String::as_str)
        .filter(|c| !names.contains(c))
        .collect();
    Ok((!missing.is_empty()).then(|| {
        format!(
            "table inet {TABLE}: {} pod chain(s) are missing ({})",
            missing.len(),
            shown(&missing)
        )
    }))
}

/// A few names of a list, for a log line.
fn shown(names: &[&str]) -> String {
    let first: Vec<&str> = names.iter().take(5).copied().collect();
    let more = if names.len() > first.len() {
        ", ..."
    } else {
        ""
    };
    format!("{}{more}", first.join(", "))
}

/// What base chain `name` in `nft -j list chain inet eniipam_policy <name>` lacks of its rules
/// (`None`: nothing).
pub fn base_chain_differs(json: &str, name: &str) -> Result<Option<String>, String> {
    let items = items(json)?;
    if !items.iter().any(|i| i["chain"]["name"] == name) {
        return Ok(Some(format!(
            "table inet {TABLE}: its base chain {name} is missing"
        )));
    }
    let rules = items.iter().filter(|i| i["rule"]["chain"] == name).count();
    let wanted = base_rules(name).len();
    Ok((rules != wanted).then(|| {
        format!(
            "table inet {TABLE}: its base chain {name} holds {rules} rule(s), loaded with {wanted}"
        )
    }))
}

/// What the dispatch maps of the table in `nft -j list maps inet` lack of `loaded`'s
/// (`None`: nothing): each map there, with as many elements, jumping to every pod chain.
pub fn maps_differ(json: &str, loaded: &Ruleset) -> Result<Option<String>, String> {
    let items = items(json)?;
    let mut targets: BTreeSet<&str> = BTreeSet::new();
    for (name, map) in &loaded.maps {
        let Some(found) = items
            .iter()
            .map(|i| &i["map"])
            .find(|m| m["table"] == TABLE && m["name"] == name.as_str())
        else {
            return Ok(Some(format!(
                "table inet {TABLE}: its map {name} is missing"
            )));
        };
        let elements = found["elem"].as_array().map_or(0, Vec::len);
        if elements != map.elements.len() {
            return Ok(Some(format!(
                "table inet {TABLE}: its map {name} holds {elements} element(s), loaded with {}",
                map.elements.len()
            )));
        }
        let mut stack: Vec<&Value> = vec![&found["elem"]];
        while let Some(v) = stack.pop() {
            match v {
                Value::Array(a) => stack.extend(a),
                Value::Object(o) => {
                    if let Some(t) = o.get("target").and_then(Value::as_str) {
                        targets.insert(t);
                    }
                    stack.extend(o.values());
                }
                _ => {}
            }
        }
    }
    let missing: Vec<&str> = loaded
        .chains
        .keys()
        .map(String::as_str)
        .filter(|c| !targets.contains(c))
        .collect();
    Ok((!missing.is_empty()).then(|| {
        format!(
            "table inet {TABLE}: its dispatch maps lack the jumps to {} pod chain(s) ({})",
            missing.len(),
            shown(&missing)
        )
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chains(items: &[Value]) -> String {
        serde_json::json!({"nftables": items}).to_string()
    }

    #[test]
    fn the_chains_list_names_what_is_missing_or_rehooked() {
        let mut loaded = Ruleset::default();
        let chain = super::super::Chain {
            comment: String::new(),
            rules: Vec::new(),
            uses: BTreeSet::new(),
        };
        loaded.chains.insert("in_eni1".into(), chain);
        // Every base chain as loaded, but `forward`'s policy; `skip` left out.
        let base = |policy: &str, skip: &str| -> Vec<Value> {
            BASE_CHAINS
                .iter()
                .filter(|b| b.name != skip)
                .map(|b| {
                    let policy = if b.name == "forward" {
                        policy
                    } else {
                        b.policy
                    };
                    serde_json::json!({"chain": {"family": "inet", "table": TABLE,
                        "name": b.name, "type": b.kind, "hook": b.hook, "prio": b.priority,
                        "policy": policy}})
                })
                .collect()
        };
        let pod =
            serde_json::json!({"chain": {"family": "inet", "table": TABLE, "name": "in_eni1"}});
        let other =
            serde_json::json!({"chain": {"family": "ip", "table": "eniipam", "name": "in_eni1"}});
        let read = |base: Vec<Value>, more: &[Value]| {
            let items: Vec<Value> = base.into_iter().chain(more.iter().cloned()).collect();
            chains_differ(&chains(&items), &loaded).unwrap()
        };
        assert_eq!(read(base("accept", ""), std::slice::from_ref(&pod)), None);
        assert_eq!(
            read(Vec::new(), std::slice::from_ref(&other)).as_deref(),
            Some("table inet eniipam_policy is missing (no chain of it in the kernel)")
        );
        assert!(
            read(base("drop", ""), std::slice::from_ref(&pod))
                .is_some_and(|w| w.contains("not hooked as loaded") && w.contains("policy drop"))
        );
        // Issue 47, case 2: the anti-spoofing chain is checked like the others.
        assert_eq!(
            read(base("accept", "prerouting"), std::slice::from_ref(&pod)).as_deref(),
            Some("table inet eniipam_policy: its base chain prerouting is missing")
        );
        assert_eq!(
            read(base("accept", ""), &[other]).as_deref(),
            Some("table inet eniipam_policy: 1 pod chain(s) are missing (in_eni1)")
        );
    }
}
