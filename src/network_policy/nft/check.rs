//! The kernel's table checked against the ruleset last loaded (issue 47, case 5): another agent's
//! `nft flush ruleset` (or `delete table`, `flush chain`) must not leave the node unenforced
//! until the next change. Two readings, both small whatever the number of pods' peers:
//!
//! - [`table_handle`], from `nft -j list tables inet`: the table is there, and is the one loaded
//!   (a table deleted and created again, say from a saved ruleset, has another handle);
//! - [`base_chain_differs`], from `nft -j list chain inet eniipam_policy forward`: the base chain
//!   is hooked as loaded and holds its rules, with a jump to every pod chain. A pod chain or a set
//!   cannot be deleted while a rule refers to it, so the jumps also vouch for the chains; a pod
//!   chain flushed by hand is not seen here (the periodic whole reload repairs it).

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

/// The handle of table `inet eniipam_policy` in `nft -j list tables inet`; `None` when absent.
pub fn table_handle(json: &str) -> Result<Option<u64>, String> {
    Ok(items(json)?.iter().find_map(|i| {
        let t = &i["table"];
        (t["family"] == "inet" && t["name"] == TABLE).then(|| t["handle"].as_u64().unwrap_or(0))
    }))
}

/// What the base chain in `nft -j list chain inet eniipam_policy forward` lacks of `loaded`'s
/// (`None`: nothing).
pub fn base_chain_differs(json: &str, loaded: &Ruleset) -> Result<Option<String>, String> {
    let items = items(json)?;
    let Some(chain) = items
        .iter()
        .map(|i| &i["chain"])
        .find(|c| c["name"] == "forward")
    else {
        return Ok(Some("its base chain forward is missing".into()));
    };
    let hooked = (
        chain["type"].as_str().unwrap_or("none"),
        chain["hook"].as_str().unwrap_or("none"),
        chain["prio"].as_i64().unwrap_or(i64::MIN),
        chain["policy"].as_str().unwrap_or("none"),
    );
    if hooked != ("filter", "forward", 0, "accept") {
        return Ok(Some(format!(
            "its base chain forward is not hooked as loaded (type {} hook {} priority {} policy {}; loaded: filter forward 0 accept)",
            hooked.0, hooked.1, hooked.2, hooked.3
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
        let shown: Vec<&str> = missing.iter().take(5).copied().collect();
        return Ok(Some(format!(
            "its base chain forward lacks the jumps to {} pod chain(s) ({}{})",
            missing.len(),
            shown.join(", "),
            if missing.len() > shown.len() {
                ", ..."
            } else {
                ""
            }
        )));
    }
    let wanted = 1 + loaded.jumps.len();
    if rules.len() != wanted {
        return Ok(Some(format!(
            "its base chain forward holds {} rule(s), loaded with {wanted}",
            rules.len()
        )));
    }
    Ok(None)
}
