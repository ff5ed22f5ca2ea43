//! The IPv6 invariants (ip_family ipv6 and dual, issue 26): one observation held against the runtime's
//! model and what the checker remembers of earlier ones. The IPv4 ones are [`super::checker`]'s.
//!
//! Checks (each a violation kind):
//! - `ipv6-prefix`: the node's /80 — the daemon shows none; it changed (one /80 in the node's life,
//!   SIGKILLs, a lost state file and an out-of-band unassign included: the daemon assigns the same
//!   /80 back, which the soak leaves free); it is not on eth0 in EC2 (mockcloud's view) once the
//!   daemon had its grace period to take it back; eth0 shows other than one /80; the state file
//!   records another.
//! - `duplicate-ipv6`: an IPv6 held by two attachments, whoever says so (live pods, the daemon's
//!   book through `Check`, the state file's `ipv6_ips`).
//! - `ipv6-reissued`: an IPv6 held by an attachment other than the first one an ADD gave it to, or
//!   than the first one the checker saw hold it (an ADD cut off by a SIGKILL never answers, but its
//!   address must not go to anyone else either). The driver checks every ADD's answer likewise.
//! - `ipv6-outside-prefix`: a live pod's IPv6, or one the daemon holds, is outside the node's /80.
//! - `live-lost-ipv6`: a live attachment's IPv6 is not held by the daemon for it.
//! - `store-daemon-disagree`: the state file's IPv6 rows and the daemon's book disagree (after
//!   settling).
//! - `dual-half`: (dual) an attachment held with one family only, unless the runtime still owes it a
//!   DEL (its DEL failed, or its pod died and the reconcile, a GC or a late DEL is due) or has ended
//!   it: an ADD or DEL cut off between its two records leaves one family until the runtime's retry,
//!   as the crash test allows, and a DEL the plugin answered while the daemon was being killed (a DEL
//!   succeeds when the daemon cannot be reached) leaves what it had not yet released until the
//!   reconcile finds the netns gone (`leak-after-gc` judges that half, as for IPv4). An answered ADD
//!   of a live pod holds both. An attachment whose IPv4 EC2
//!   took out of band keeps its IPv6 alone: the daemon reports the IPv4 lost (the IPv4 checks).
//! - `leak-after-gc`: an attachment a successful GC of its network did not list still holds an IPv6.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv6Addr;

use ipnet::Ipv6Net;

use super::findings::{Found, Rules, describe_att};
use super::model::{AttState, Key, Model};
use super::witnesses::Observation;

/// What the IPv6 checks remember between observations.
#[derive(Clone, Default)]
pub struct State6 {
    /// The node's /80 as first seen (and since each time EC2 took it).
    prefix: Option<Ipv6Net>,
    /// Every IPv6 the daemon was seen to hold, and for whom first.
    seen: BTreeMap<Ipv6Addr, Key>,
}

fn key_str(k: &Key) -> String {
    format!("{}/{}", k.0, k.1)
}

/// Holds `obs` against `model` for IPv6, adding what is broken to `found`.
pub fn evaluate(
    obs: &Observation,
    model: &Model,
    state: &mut State6,
    rules: &Rules,
    ipv4_taken: &BTreeSet<Key>,
    found: &mut Vec<Found>,
) {
    if !rules.family.has_ipv6() {
        return;
    }
    let mut push = |kind: &'static str, subject: String, text: String, settle: bool| {
        found.push(Found {
            kind,
            subject,
            text,
            settle,
        })
    };
    let now = obs.at;
    let describe = |k: &Key| {
        model
            .atts
            .get(k)
            .map(|a| describe_att(a, &rules.network_names))
            .unwrap_or_else(|| "unknown to the runtime".into())
    };

    // The /80.
    let prefix: Option<Ipv6Net> = obs.pool.ipv6_prefix.parse().ok();
    // The soak took this /80 from eth0 less than the grace period ago (`oob-prefix-unassign`).
    let taken_lately = |p: Ipv6Net| {
        model
            .prefix_taken
            .iter()
            .any(|(_, at, q)| *q == p && now < *at + model.grace_after(*at, rules.grace))
    };
    let taken_ever = |p: Ipv6Net| model.prefix_taken.iter().any(|(_, _, q)| *q == p);
    match prefix {
        None => push(
            "ipv6-prefix",
            "none".into(),
            format!(
                "ip_family {}: the daemon shows no /80 (Pool.ipv6_prefix {:?})",
                rules.family, obs.pool.ipv6_prefix
            ),
            false,
        ),
        Some(p) => {
            match state.prefix {
                Some(first) if first != p => push(
                    "ipv6-prefix",
                    format!("changed {first} {p}"),
                    format!(
                        "the node's /80 changed from {first} to {p} (eth0 shows {:?}){}: one /80 in \
                         the node's life",
                        obs.ec2.eth0_prefixes6,
                        if taken_ever(first) {
                            "; the soak unassigned it out of band, and it was free to assign back"
                        } else {
                            ""
                        }
                    ),
                    false,
                ),
                _ => {}
            }
            state.prefix = Some(p);
            if !obs.ec2.eth0_prefixes6.contains(&p) && !taken_lately(p) {
                push(
                    "ipv6-prefix",
                    format!("not in EC2 {p}"),
                    format!(
                        "the daemon serves the /80 {p}, which EC2 does not show on eth0 (it shows {:?}){}",
                        obs.ec2.eth0_prefixes6,
                        if taken_ever(p) {
                            " — the soak unassigned it out of band, and the daemon did not take it back"
                        } else {
                            ""
                        }
                    ),
                    false,
                );
            }
            if obs.ec2.eth0_prefixes6.len() > 1 {
                push(
                    "ipv6-prefix",
                    "count".into(),
                    format!(
                        "EC2 shows {} /80s on eth0 ({:?}): the node takes one in its life",
                        obs.ec2.eth0_prefixes6.len(),
                        obs.ec2.eth0_prefixes6
                    ),
                    false,
                );
            }
            if obs.store6.prefix != Some(p) {
                push(
                    "store-daemon-disagree",
                    "ipv6 prefix".into(),
                    format!(
                        "the daemon serves the /80 {p}, the state file records {:?}",
                        obs.store6.prefix
                    ),
                    true,
                );
            }
        }
    }

    // Who holds what: live pods, the daemon, the state file.
    let mut holders: BTreeMap<Ipv6Addr, BTreeMap<&Key, BTreeSet<&'static str>>> = BTreeMap::new();
    for a in model.live() {
        if let Some(ip) = a.ip6 {
            holders
                .entry(ip)
                .or_default()
                .entry(&a.key)
                .or_default()
                .insert("live pod");
        }
    }
    for (k, ip) in &obs.held6 {
        holders
            .entry(*ip)
            .or_default()
            .entry(k)
            .or_default()
            .insert("daemon");
    }
    for r in &obs.store6.rows {
        holders
            .entry(r.ip)
            .or_default()
            .entry(&r.key)
            .or_default()
            .insert("store");
    }
    for (ip, keys) in &holders {
        if keys.len() < 2 {
            continue;
        }
        let not_store_only = keys
            .values()
            .filter(|s| s.iter().any(|x| *x != "store"))
            .count();
        let text = keys
            .iter()
            .map(|(k, s)| {
                let who: Vec<&str> = s.iter().copied().collect();
                format!("{} (per {}, {})", key_str(k), who.join("+"), describe(k))
            })
            .collect::<Vec<_>>()
            .join(" and ");
        let who: Vec<String> = keys.keys().map(|k| key_str(k)).collect();
        push(
            "duplicate-ipv6",
            format!("{ip} {}", who.join(" ")),
            format!("{ip} is held by {text}"),
            not_store_only < 2,
        );
    }

    // Never handed out twice, and inside the /80.
    let claims = obs
        .held6
        .iter()
        .map(|(k, ip)| (k, *ip, "daemon"))
        .chain(obs.store6.rows.iter().map(|r| (&r.key, r.ip, "store")));
    for (k, ip, who) in claims {
        let given = model.v6_given.get(&ip);
        let seen = state.seen.entry(ip).or_insert_with(|| k.clone());
        for (first, how) in [
            (given, "an ADD gave it to"),
            (Some(&*seen), "was first held by"),
        ] {
            if let Some(first) = first.filter(|f| *f != k) {
                push(
                    "ipv6-reissued",
                    format!("{ip} {}", key_str(k)),
                    format!(
                        "the {who} gives {ip} to {} ({}), but {how} {} ({}): an address of the /80 \
                         is never handed out twice",
                        key_str(k),
                        describe(k),
                        key_str(first),
                        describe(first)
                    ),
                    who == "store",
                );
            }
        }
        if who == "daemon"
            && let Some(p) = prefix.filter(|p| !p.contains(&ip))
        {
            push(
                "ipv6-outside-prefix",
                format!("{ip} {}", key_str(k)),
                format!(
                    "the daemon holds {ip} for {} ({}), outside the node's /80 {p}",
                    key_str(k),
                    describe(k)
                ),
                false,
            );
        }
    }

    // Live attachments.
    for a in model.live() {
        let Some(ip) = a.ip6 else { continue };
        let k = &a.key;
        if let Some(p) = prefix.filter(|p| !p.contains(&ip)) {
            push(
                "ipv6-outside-prefix",
                format!("{ip} {}", key_str(k)),
                format!(
                    "live attachment {} ({}) has {ip}, outside the node's /80 {p}",
                    key_str(k),
                    describe(k)
                ),
                false,
            );
        }
        match obs.held6.get(k) {
            Some(h) if *h == ip => {}
            // The state file was lost while this pod's netns was hidden (see the IPv4 check).
            None if model.unknowable(a, now, rules.grace) => {}
            other => push(
                "live-lost-ipv6",
                key_str(k),
                format!(
                    "live attachment {} ({}) — the daemon holds {} for it",
                    key_str(k),
                    describe(k),
                    other.map_or("no IPv6".to_owned(), |o| o.to_string())
                ),
                false,
            ),
        }
    }

    // The state file and the daemon.
    let store_by_key: BTreeMap<&Key, Ipv6Addr> =
        obs.store6.rows.iter().map(|r| (&r.key, r.ip)).collect();
    for r in &obs.store6.rows {
        if obs.held6.get(&r.key) != Some(&r.ip) {
            push(
                "store-daemon-disagree",
                format!("v6 {}", key_str(&r.key)),
                format!(
                    "the state file says {} holds {}, the daemon says {}",
                    key_str(&r.key),
                    r.ip,
                    obs.held6
                        .get(&r.key)
                        .map_or("it holds no IPv6".to_owned(), |o| format!("it holds {o}"))
                ),
                true,
            );
        }
    }
    for (k, ip) in &obs.held6 {
        if !store_by_key.contains_key(k) {
            push(
                "store-daemon-disagree",
                format!("v6 {}", key_str(k)),
                format!(
                    "the daemon says {} holds {ip}, the state file has no IPv6 row for it",
                    key_str(k)
                ),
                true,
            );
        }
    }

    // Dual-stack attachments hold both or neither.
    if rules.family.has_ipv4() {
        let keys: BTreeSet<&Key> = obs.held.keys().chain(obs.held6.keys()).collect();
        for k in keys {
            let (v4, v6) = (obs.held.get(k), obs.held6.get(k));
            if v4.is_some() && v6.is_some() || v4.is_none() && ipv4_taken.contains(k) {
                continue;
            }
            let owed = model.atts.get(k).is_some_and(|a| {
                matches!(
                    a.state,
                    AttState::DelFailed | AttState::Dead | AttState::Deleted | AttState::AddFailed
                )
            });
            if owed {
                continue;
            }
            push(
                "dual-half",
                key_str(k),
                format!(
                    "{} ({}) holds only {} in dual mode, and the runtime owes it no DEL",
                    key_str(k),
                    describe(k),
                    v4.map(|ip| format!("the IPv4 {ip}"))
                        .or(v6.map(|ip| format!("the IPv6 {ip}")))
                        .unwrap_or_default()
                ),
                true,
            );
        }
    }

    // GC.
    for a in model.atts.values() {
        if let (false, Some(gc_step)) = (a.is_live(), a.collected) {
            let by_daemon = obs.held6.get(&a.key);
            let by_store = store_by_key.get(&a.key);
            if by_daemon.is_some() || by_store.is_some() {
                push(
                    "leak-after-gc",
                    format!("v6 {}", key_str(&a.key)),
                    format!(
                        "{} ({}) still holds an IPv6 after a GC of its network at step {gc_step} \
                         left it out (daemon: {by_daemon:?}, store: {by_store:?})",
                        key_str(&a.key),
                        describe(&a.key)
                    ),
                    by_daemon.is_none(),
                );
            }
        }
    }
}
