//! The kernel's table checked against the ruleset last loaded (issue 47, case 5): another agent's
//! `nft flush ruleset` (or `delete table`, `flush chain`) must not leave the node unenforced
//! until the next change. Two readings:
//!
//! - [`chains_differ`], from `nft -j list chains inet`: the table is there, its base chain hooked
//!   as loaded, every pod chain there. Cheap whatever the sets hold (about 10 ms at 2,500 chains
//!   and 500,000 set elements, where any listing of a table, a chain's rules, the tables or the
//!   counters costs `nft` 0.7 s: it reads every set element first), so it can run every few
//!   seconds;
//! - [`base_chain_differs`], from `nft -j list chain inet eniipam_policy forward`: the base chain
//!   holds its rules, with a jump to every pod chain (a table or chain flushed). A pod chain or a
//!   set cannot be deleted while a rule refers to it, so the jumps also vouch for the chains; a
//!   pod chain flushed by hand is not seen (the periodic whole reload repairs it).
//!
//! A table deleted and loaded again from a saved copy is not told apart from the one loaded (only
//! `list tables` shows a table's handle, at the cost above): its next in-place update fails on
//! what the copy lacks and the table is loaded whole, or the periodic reload replaces it.

use std::collections::BTreeSet;

use serde_json::Value;

use super::{Ruleset, TABLE};

fn items(json: &str) -> Result<Vec<Value>, String> {
    let doc: Value = serde_json::from_str(json).map_err(|e| e.to_string())?;
    doc["nftables"]
        .as_array()
        .cloned()
        .ok_or_else(|| "no `nftables` array".to_owned())
}

/// The base chain as `loaded` hooks it: type, hook, priority, policy.
const HOOKED: (&str, &str, i64, &str) = ("filter", "forward", 0, "accept");

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
    let Some(base) = ours.iter().find(|c| c["name"] == "forward") else {
        return Ok(Some(format!(
            "table inet {TABLE}: its base chain forward is missing"
        )));
    };
    let hooked = (
        base["type"].as_str().unwrap_or("none"),
        base["hook"].as_str().unwrap_or("none"),
        base["prio"].as_i64().unwrap_or(i64::MIN),
        base["policy"].as_str().unwrap_or("none"),
    );
    if hooked != HOOKED {
        return Ok(Some(format!(
            "table inet {TABLE}: its base chain forward is not hooked as loaded (type {} hook {} priority {} policy {}; loaded: {} {} {} {})",
            hooked.0, hooked.1, hooked.2, hooked.3, HOOKED.0, HOOKED.1, HOOKED.2, HOOKED.3
        )));
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

/// What the base chain in `nft -j list chain inet eniipam_policy forward` lacks of `loaded`'s
/// (`None`: nothing).
pub fn base_chain_differs(json: &str, loaded: &Ruleset) -> Result<Option<String>, String> {
    let items = items(json)?;
    if !items.iter().any(|i| i["chain"]["name"] == "forward") {
        return Ok(Some(format!(
            "table inet {TABLE}: its base chain forward is missing"
        )));
    }
    let rules: Vec<&Value> = items
        .iter()
        .map(|i| &i["rule"])
        .filter(|r| r["chain"] == "forward")
        .collect();
    let targets: BTreeSet<&str> = rules
        .iter()
        .flat_map(|r| r["expr"].as_array().into_iter().flatten())
        .filter_map(|e| e["jump"]["target"].as_str())
        .collect();
    let missing: Vec<&str> = loaded
        .chains
        .keys()
        .map(String::as_str)
        .filter(|c| !targets.contains(c))
        .collect();
    if !missing.is_empty() {
        return Ok(Some(format!(
            "table inet {TABLE}: its base chain forward lacks the jumps to {} pod chain(s) ({})",
            missing.len(),
            shown(&missing)
        )));
    }
    let wanted = 1 + loaded.jumps.len();
    if rules.len() != wanted {
        return Ok(Some(format!(
            "table inet {TABLE}: its base chain forward holds {} rule(s), loaded with {wanted}",
            rules.len()
        )));
    }
    Ok(None)
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
        let base = |policy: &str| {
            serde_json::json!({"chain": {"family": "inet", "table": TABLE, "name": "forward",
                "type": "filter", "hook": "forward", "prio": 0, "policy": policy}})
        };
        let pod =
            serde_json::json!({"chain": {"family": "inet", "table": TABLE, "name": "in_eni1"}});
        let other =
            serde_json::json!({"chain": {"family": "ip", "table": "eniipam", "name": "in_eni1"}});
        let read = |items: &[Value]| chains_differ(&chains(items), &loaded).unwrap();
        assert_eq!(read(&[base("accept"), pod.clone()]), None);
        assert_eq!(
            read(std::slice::from_ref(&other)).as_deref(),
            Some("table inet eniipam_policy is missing (no chain of it in the kernel)")
        );
        assert!(
            read(&[base("drop"), pod.clone()])
                .is_some_and(|w| w.contains("not hooked as loaded") && w.contains("policy drop"))
        );
        assert_eq!(
            read(&[base("accept"), other]).as_deref(),
            Some("table inet eniipam_policy: 1 pod chain(s) are missing (in_eni1)")
        );
    }
}
