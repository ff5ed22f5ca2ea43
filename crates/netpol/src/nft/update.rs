//! A [`Ruleset`] as `nft -f` scripts: the whole table, or the change from the ruleset last loaded.
//!
//! The change is one transaction, ordered so that nothing is deleted while something refers to it
//! and nothing is referred to before it exists: chains that change are flushed first and the
//! verdict maps' elements that jump to a chain that goes (or is recreated) deleted, then gone
//! chains, sets and counters deleted, new ones declared, kept sets' elements deleted and added in
//! place, the flushed and new chains filled, and last the maps' new elements added (an element
//! can only jump to a chain that exists). A set or counter whose declaration changed (its names
//! encode its kind, so only a veth reused by another pod could do it) is deleted and declared
//! anew after the chains using it are flushed; a chain whose comment changed is deleted and added
//! anew, the map elements that jump to it with it. The base chains' rules are the same in every
//! ruleset ([`super::base`]): an update never touches them.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use super::base::{BASE_CHAINS, base_rules};
use super::{Chain, Ruleset, Set, TABLE};

impl Ruleset {
    /// The full-replace transaction: declare, delete and define table `inet eniipam_policy`, so
    /// the kernel's table is exactly this one whatever it held (counters start at zero).
    pub fn script(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "table inet {TABLE} {{}}");
        let _ = writeln!(s, "delete table inet {TABLE}");
        let _ = writeln!(s, "table inet {TABLE} {{");
        for (name, set) in &self.sets {
            let _ = writeln!(s, "  set {name} {{");
            let _ = writeln!(s, "    type {};", set.kind);
            if set.interval {
                let _ = writeln!(s, "    flags interval;");
            }
            if !set.elements.is_empty() {
                let _ = writeln!(s, "    elements = {{ {} }}", set.elements.join(", "));
            }
            let _ = writeln!(s, "  }}");
        }
        for (name, about) in &self.counters {
            let _ = writeln!(s, "  counter {name} {{");
            let _ = writeln!(s, "    comment \"{about}\"");
            let _ = writeln!(s, "  }}");
        }
        for (name, map) in &self.maps {
            let _ = writeln!(s, "  map {name} {{");
            let _ = writeln!(s, "    type {};", map.kind);
            let _ = writeln!(s, "  }}");
        }
        for base in BASE_CHAINS {
            let _ = writeln!(s, "  chain {} {{", base.name);
            let _ = writeln!(s, "    {}", base.declaration());
            for r in base_rules(base.name) {
                let _ = writeln!(s, "    {r}");
            }
            let _ = writeln!(s, "  }}");
        }
        for (name, chain) in &self.chains {
            let _ = writeln!(s, "  chain {name} {{");
            let _ = writeln!(s, "    comment \"{}\"", chain.comment);
            for r in &chain.rules {
                let _ = writeln!(s, "    {r}");
            }
            let _ = writeln!(s, "  }}");
        }
        let _ = writeln!(s, "}}");
        // The maps' elements jump to the chains above, so they come after them.
        for (name, map) in &self.maps {
            if !map.elements.is_empty() {
                let _ = writeln!(
                    s,
                    "add element inet {TABLE} {name} {{ {} }}",
                    map.elements.join(", ")
                );
            }
        }
        s
    }

    /// One `nft -f` transaction taking the kernel from `applied` (what was last loaded) to
    /// `self`: set elements added and deleted in place, changed chains flushed and refilled, new
    /// chains, sets and counters added, gone ones deleted once nothing refers to them, the base
    /// chain refilled only when its jumps changed. Counters of kept chains keep counting. Empty
    /// when nothing changed.
    pub fn update_script(&self, applied: &Ruleset) -> String {
        // Sets and counters whose declaration changed: deleted and declared anew.
        let redeclared: BTreeSet<&str> = self
            .sets
            .iter()
            .filter(|(name, set)| {
                applied
                    .sets
                    .get(*name)
                    .is_some_and(|old| (&old.kind, old.interval) != (&set.kind, set.interval))
            })
            .map(|(name, _)| name.as_str())
            .chain(
                self.counters
                    .iter()
                    .filter(|(name, about)| {
                        applied.counters.get(*name).is_some_and(|a| a != *about)
                    })
                    .map(|(name, _)| name.as_str()),
            )
            .collect();
        let recreated: BTreeSet<&str> = self
            .chains
            .iter()
            .filter(|(name, c)| {
                applied
                    .chains
                    .get(*name)
                    .is_some_and(|old| old.comment != c.comment)
            })
            .map(|(name, _)| name.as_str())
            .collect();
        let gone_chains: Vec<&str> = applied
            .chains
            .keys()
            .filter(|n| !self.chains.contains_key(*n))
            .map(String::as_str)
            .collect();
        // Kept chains whose rules change, or which use a redeclared object.
        let refilled: Vec<(&str, &Chain)> = self
            .chains
            .iter()
            .filter(|(name, c)| {
                applied.chains.get(*name).is_some_and(|old| {
                    old.comment == c.comment
                        && (old.rules != c.rules
                            || old.uses.iter().any(|u| redeclared.contains(u.as_str())))
                })
            })
            .map(|(name, c)| (name.as_str(), c))
            .collect();
        // Map elements that go, or jump to a recreated chain: deleted before the chains go.
        let empty = Set {
            kind: String::new(),
            interval: false,
            elements: Vec::new(),
        };
        let mut map_gone: Vec<(&str, Vec<&str>)> = Vec::new();
        let mut map_added: Vec<(&str, Vec<&str>)> = Vec::new();
        for (name, map) in &self.maps {
            let old = applied.maps.get(name).unwrap_or(&empty);
            let (mut gone, mut added) = element_changes(old, map);
            let renewed = |e: &&str| Ruleset::map_target(e).is_some_and(|c| recreated.contains(c));
            gone.extend(old.elements.iter().map(String::as_str).filter(renewed));
            added.extend(map.elements.iter().map(String::as_str).filter(renewed));
            map_gone.push((name.as_str(), gone));
            map_added.push((name.as_str(), added));
        }

        let mut s = String::new();
        let mut line = |l: std::fmt::Arguments<'_>| {
            let _ = writeln!(s, "{l}");
        };
        // 1. Nothing may refer to what goes: flush the chains that change or go, and delete the
        // map elements that jump to them (by key: a map's key names its element).
        for (name, gone) in &map_gone {
            if !gone.is_empty() {
                let keys: Vec<&str> = gone
                    .iter()
                    .map(|e| e.rsplit_once(" : ").map_or(*e, |(k, _)| k))
                    .collect();
                line(format_args!(
                    "delete element inet {TABLE} {name} {{ {} }}",
                    keys.join(", ")
                ));
            }
        }
        for (name, _) in &refilled {
            line(format_args!("flush chain inet {TABLE} {name}"));
        }
        for name in gone_chains.iter().chain(&recreated) {
            line(format_args!("flush chain inet {TABLE} {name}"));
        }
        // 2. Delete what goes.
        for name in gone_chains.iter().chain(&recreated) {
            line(format_args!("delete chain inet {TABLE} {name}"));
        }
        for name in applied.sets.keys() {
            if !self.sets.contains_key(name) || redeclared.contains(name.as_str()) {
                line(format_args!("delete set inet {TABLE} {name}"));
            }
        }
        for name in applied.counters.keys() {
            if !self.counters.contains_key(name) || redeclared.contains(name.as_str()) {
                line(format_args!("delete counter inet {TABLE} {name}"));
            }
        }
        // 3. Declare what comes.
        for (name, about) in &self.counters {
            if !applied.counters.contains_key(name) || redeclared.contains(name.as_str()) {
                line(format_args!(
                    "add counter inet {TABLE} {name} {{ comment \"{about}\"; }}"
                ));
            }
        }
        for (name, set) in &self.sets {
            let fresh = !applied.sets.contains_key(name) || redeclared.contains(name.as_str());
            if fresh {
                let flags = if set.interval { " flags interval;" } else { "" };
                line(format_args!(
                    "add set inet {TABLE} {name} {{ type {};{flags} }}",
                    set.kind
                ));
                if !set.elements.is_empty() {
                    line(format_args!(
                        "add element inet {TABLE} {name} {{ {} }}",
                        set.elements.join(", ")
                    ));
                }
            } else if let Some(old) = applied.sets.get(name) {
                let (gone, added) = element_changes(old, set);
                // Deleted first: a merged range that grew replaces the one it covers.
                if !gone.is_empty() {
                    line(format_args!(
                        "delete element inet {TABLE} {name} {{ {} }}",
                        gone.join(", ")
                    ));
                }
                if !added.is_empty() {
                    line(format_args!(
                        "add element inet {TABLE} {name} {{ {} }}",
                        added.join(", ")
                    ));
                }
            }
        }
        let new_chains: Vec<(&str, &Chain)> = self
            .chains
            .iter()
            .filter(|(name, _)| {
                !applied.chains.contains_key(*name) || recreated.contains(name.as_str())
            })
            .map(|(name, c)| (name.as_str(), c))
            .collect();
        for (name, c) in &new_chains {
            line(format_args!(
                "add chain inet {TABLE} {name} {{ comment \"{}\"; }}",
                c.comment
            ));
        }
        // 4. Fill the flushed and new chains, then the maps' elements that jump to them.
        for (name, c) in refilled.iter().chain(&new_chains) {
            for r in &c.rules {
                line(format_args!("add rule inet {TABLE} {name} {r}"));
            }
        }
        for (name, added) in &map_added {
            if !added.is_empty() {
                line(format_args!(
                    "add element inet {TABLE} {name} {{ {} }}",
                    added.join(", ")
                ));
            }
        }
        s
    }

    /// Rules over all chains, the base chain's included.
    pub fn rule_count(&self) -> usize {
        BASE_CHAINS
            .iter()
            .map(|b| base_rules(b.name).len())
            .sum::<usize>()
            + self.chains.values().map(|c| c.rules.len()).sum::<usize>()
    }

    /// Elements over all sets and maps.
    pub fn element_count(&self) -> usize {
        self.sets
            .values()
            .chain(self.maps.values())
            .map(|s| s.elements.len())
            .sum()
    }
}

/// The elements of `old` that `new` lacks, and those `new` adds, each in its set's order.
fn element_changes<'a>(old: &'a Set, new: &'a Set) -> (Vec<&'a str>, Vec<&'a str>) {
    if old.elements == new.elements {
        return (Vec::new(), Vec::new());
    }
    let before: BTreeSet<&str> = old.elements.iter().map(String::as_str).collect();
    let after: BTreeSet<&str> = new.elements.iter().map(String::as_str).collect();
    let gone = old
        .elements
        .iter()
        .map(String::as_str)
        .filter(|e| !after.contains(e))
        .collect();
    let added = new
        .elements
        .iter()
        .map(String::as_str)
        .filter(|e| !before.contains(e))
        .collect();
    (gone, added)
}

/// What an update touches, by kind (for the logs and the benchmark): sets whose elements
/// changed, chains flushed or added or deleted, and dispatch maps changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Changes {
    pub sets: usize,
    pub elements_added: usize,
    pub elements_deleted: usize,
    pub chains: usize,
    /// Verdict maps whose elements changed (a pod's chain came or went).
    pub maps: usize,
}

impl Ruleset {
    /// What [`Ruleset::update_script`] from `applied` changes, counted.
    pub fn changes_from(&self, applied: &Ruleset) -> Changes {
        let mut c = Changes::default();
        for (name, set) in &self.sets {
            if let Some(old) = applied.sets.get(name) {
                let (gone, added) = element_changes(old, set);
                if !gone.is_empty() || !added.is_empty() {
                    c.sets += 1;
                }
                c.elements_deleted += gone.len();
                c.elements_added += added.len();
            }
        }
        let names: BTreeSet<&String> = self.chains.keys().chain(applied.chains.keys()).collect();
        c.chains = names
            .into_iter()
            .filter(|n| self.chains.get(*n) != applied.chains.get(*n))
            .count();
        c.maps = self
            .maps
            .iter()
            .filter(|(name, map)| applied.maps.get(*name) != Some(*map))
            .count();
        c
    }
}
