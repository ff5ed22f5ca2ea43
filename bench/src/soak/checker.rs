//! The invariant checker: one observation of the four witnesses (the daemon, the store, EC2 and the
//! host: [`super::witnesses`]) held against the runtime's model.
//!
//! Checks (each a violation kind):
//! - `duplicate-ip`: an IP held by two attachments, whoever says so (live pods, the daemon's pool, the
//!   store; across networks).
//! - `detached-eni-serving`: the pool serves from an ENI EC2 no longer shows attached to the instance
//!   (longer than the grace period).
//! - `eni-unknown-to-pool`: EC2 shows a secondary ENI attached to the instance that the pool does not
//!   list (longer than the grace period): its IPs are out of reach and its slot counted free.
//! - `held-ip-not-in-ec2`: the pool or the store holds an IP for an attachment that is on none of the
//!   instance's attached ENIs in EC2 (outside the grace period of an out-of-band change).
//! - `lost-ip-kept`: an IP the soak removed out of band is still claimed after the grace period
//!   (it must be reported lost: dropped from the pool and the store).
//! - `token-accounting`: the pool's `invariant_error` is not empty, or idle + assigned + cooling +
//!   sticky + in flight (or tokens in use) exceed capacity.
//! - `live-lost-ip`: a live attachment (ADD succeeded, no DEL, netns alive, listed by GC) is not held by
//!   the pool with its IP.
//! - `live-ip-not-in-ec2`: a live attachment's IP is on none of the instance's attached ENIs in EC2.
//! - `store-daemon-disagree`: the store and the pool disagree on who holds what (after settling).
//! - `leak-after-gc`: an attachment a successful GC of its network did not list is still held.
//! - `host-cache`: the plugin's result cache misses a live attachment or keeps a deleted one (both
//!   families).
//!
//! The IPv6 invariants (ip_family ipv6 and dual) are [`super::checker6`]'s, the network profiles'
//! (the network-profiles mode) [`super::checker_profiles`]'s.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::time::Duration;

use tokio::time::Instant;

use super::findings::{Found, Rules, describe_att};
use super::model::{AttState, Key, Model};
use super::witnesses::{Observation, StoreRow};

fn key_str(k: &Key) -> String {
    format!("{}/{}", k.0, k.1)
}

/// The checker's memory between observations.
#[derive(Clone, Default)]
pub struct CheckerState {
    /// The IPv6 checks' memory.
    pub v6: super::checker6::State6,
    /// ENIs the pool shows while EC2 does not show them attached: since when.
    unattached_since: BTreeMap<String, Instant>,
    /// ENIs EC2 shows attached that the pool does not list: since when.
    unlisted_since: BTreeMap<String, Instant>,
}

impl CheckerState {
    /// When the discrepancies the checker is timing (ENIs unattached or unlisted) would have lasted
    /// `grace`: the final check waits for it, so a discrepancy that began late is still judged.
    pub fn judged_by(&self, grace: Duration) -> Option<Instant> {
        self.unattached_since
            .values()
            .chain(self.unlisted_since.values())
            .max()
            .map(|since| *since + grace)
    }
}

/// What one evaluation returns besides violations.
#[derive(Default)]
pub struct Evaluation {
    pub found: Vec<Found>,
    /// Out-of-band-hit attachments the daemon no longer claims.
    pub reported_lost: Vec<Key>,
}

/// Holds `obs` against `model`.
pub fn evaluate(
    obs: &Observation,
    model: &Model,
    state: &mut CheckerState,
    rules: &Rules,
) -> Evaluation {
    let mut ev = Evaluation::default();
    let now = obs.at;
    let grace = rules.grace;
    let window = rules.oob_window;
    let mut push = |kind: &'static str, subject: String, text: String, settle: bool| {
        ev.found.push(Found {
            kind,
            subject,
            text,
            settle,
        })
    };
    let p = &obs.pool;
    // Which ENI an IP is on: EC2's word while the ENI exists, else the daemon's (its store row), so an
    // IP of a detached ENI that was deleted since is still known as that ENI's.
    let eni_of = |ip: Ipv4Addr| {
        obs.ec2.all_ip_eni.get(&ip).cloned().or_else(|| {
            obs.store
                .iter()
                .find(|r| r.ip == ip)
                .map(|r| r.eni_id.clone())
        })
    };
    let eni_of: &dyn Fn(Ipv4Addr) -> Option<String> = &eni_of;
    let store_by_key: BTreeMap<&Key, &StoreRow> = obs.store.iter().map(|r| (&r.key, r)).collect();

    // Token accounting.
    if !p.invariant_error.is_empty() {
        push(
            "token-accounting",
            "invariant_error".into(),
            format!("Pool.invariant_error: {}", p.invariant_error),
            false,
        );
    }
    let sum = p.idle + p.assigned + p.cooling + p.sticky + p.in_flight;
    if sum > p.capacity || p.tokens_in_use > p.capacity {
        push(
            "token-accounting",
            "capacity".into(),
            format!(
                "idle {} + assigned {} + cooling {} + sticky {} + in flight {} = {sum}, tokens in use {}, capacity {}",
                p.idle, p.assigned, p.cooling, p.sticky, p.in_flight, p.tokens_in_use, p.capacity
            ),
            false,
        );
    }

    // ENIs the pool serves from.
    let mut seen_unattached = BTreeSet::new();
    for e in p.enis.iter().filter(|e| e.device_index > 0) {
        if obs.ec2.attached.contains(&e.eni_id) {
            continue;
        }
        seen_unattached.insert(e.eni_id.clone());
        let since = *state
            .unattached_since
            .entry(e.eni_id.clone())
            .or_insert(now);
        let holds = e.idle + e.assigned + e.cooling + e.sticky;
        if now.duration_since(since) >= model.grace_after(since, grace)
            && e.state != "draining"
            && holds > 0
        {
            push(
                "detached-eni-serving",
                e.eni_id.clone(),
                format!(
                    "the pool still serves {} (state {}, device {}, {} assigned, {} idle, {} cooling) \
                     {:.0} s after EC2 stopped showing it attached to the instance",
                    e.eni_id,
                    e.state,
                    e.device_index,
                    e.assigned,
                    e.idle,
                    e.cooling,
                    now.duration_since(since).as_secs_f64()
                ),
                false,
            );
        }
    }
    state
        .unattached_since
        .retain(|k, _| seen_unattached.contains(k));
    let listed: BTreeSet<&str> = p.enis.iter().map(|e| e.eni_id.as_str()).collect();
    let mut seen_unlisted = BTreeSet::new();
    for (eni, (_, ips)) in &obs.ec2.secondary_enis {
        if listed.contains(eni.as_str()) {
            continue;
        }
        seen_unlisted.insert(eni.clone());
        let since = *state.unlisted_since.entry(eni.clone()).or_insert(now);
        if now.duration_since(since) >= model.grace_after(since, grace) {
            push(
                "eni-unknown-to-pool",
                eni.clone(),
                format!(
                    "EC2 shows {eni} attached to the instance with {} secondary IPs, but the pool has not listed it for {:.0} s",
                    ips.len(),
                    now.duration_since(since).as_secs_f64()
                ),
                false,
            );
        }
    }
    state
        .unlisted_since
        .retain(|k, _| seen_unlisted.contains(k));

    // Who holds what: live pods (minus those whose IP the soak took), the pool, the store.
    let mut holders: BTreeMap<Ipv4Addr, BTreeMap<Key, BTreeSet<&'static str>>> = BTreeMap::new();
    for a in model.live() {
        if model.oob_since(a, window, eni_of).is_some() {
            continue;
        }
        if let Some(ip) = a.ip {
            holders
                .entry(ip)
                .or_default()
                .entry(a.key.clone())
                .or_default()
                .insert("live pod");
        }
    }
    for (k, ip) in &obs.held {
        holders
            .entry(*ip)
            .or_default()
            .entry(k.clone())
            .or_default()
            .insert("pool");
    }
    for r in &obs.store {
        holders
            .entry(r.ip)
            .or_default()
            .entry(r.key.clone())
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
                let state = model
                    .atts
                    .get(k)
                    .map(|a| format!(", {}", describe_att(a, &rules.network_names)))
                    .unwrap_or_default();
                format!(
                    "{} (per {}{state})",
                    key_str(k),
                    s.iter().copied().collect::<Vec<_>>().join("+")
                )
            })
            .collect::<Vec<_>>()
            .join(" and ");
        let who: Vec<String> = keys.keys().map(key_str).collect();
        push(
            "duplicate-ip",
            format!("{ip} {}", who.join(" ")),
            format!("{ip} is held by {text}"),
            not_store_only < 2,
        );
    }

    // The daemon's claims against EC2.
    let mut claims: Vec<(&Key, Ipv4Addr, &'static str)> =
        obs.held.iter().map(|(k, ip)| (k, *ip, "pool")).collect();
    claims.extend(obs.store.iter().map(|r| (&r.key, r.ip, "store")));
    for (k, ip, who) in claims {
        if obs.ec2.ip_eni.contains_key(&ip) {
            continue;
        }
        let att = model.atts.get(k);
        let oob = att.and_then(|a| model.oob_since(a, window, eni_of));
        if who == "pool" && oob.is_none() && att.is_some_and(|a| a.is_live() && a.ip == Some(ip)) {
            continue; // a live attachment's own IP: `live-ip-not-in-ec2` below
        }
        match oob {
            Some(at) if now.duration_since(at) < model.grace_after(at, grace) => {}
            Some(at) => {
                let what = att
                    .and_then(|a| a.oob.as_ref().map(|m| m.what.clone()))
                    .or_else(|| model.oob_event_of(ip, eni_of).map(|e| e.what.clone()))
                    .unwrap_or_default();
                push(
                    "lost-ip-kept",
                    key_str(k),
                    format!(
                        "the {who} still gives {} the IP {ip} {:.0} s after it was taken out of band \
                         ({what}); EC2 no longer has it on the instance, so the daemon must report it lost",
                        key_str(k),
                        now.duration_since(at).as_secs_f64()
                    ),
                    who == "store",
                );
            }
            None if model.ip_recently_oob(ip, now, grace, eni_of) => {}
            None => {
                let state = att
                    .map(|a| describe_att(a, &rules.network_names))
                    .unwrap_or_else(|| "unknown to the runtime".into());
                let origin = model
                    .oob_event_of(ip, eni_of)
                    .map(|e| format!(" (taken out of band at step {}: {})", e.step, e.what))
                    .unwrap_or_default();
                push(
                    "held-ip-not-in-ec2",
                    format!("{}@{ip}", key_str(k)),
                    format!(
                        "the {who} holds {ip} for {} ({state}), but no ENI attached to the instance has it in EC2{origin}",
                        key_str(k)
                    ),
                    who == "store",
                );
            }
        }
    }

    // Live attachments.
    for a in model.live() {
        let Some(ip) = a.ip else { continue };
        let k = &a.key;
        let net = rules
            .network_names
            .get(a.network)
            .cloned()
            .unwrap_or_default();
        if model.oob_since(a, window, eni_of).is_some() {
            let held =
                obs.held.get(k) == Some(&ip) || store_by_key.get(k).map(|r| r.ip) == Some(ip);
            if !held && !a.lost_reported {
                ev.reported_lost.push(k.clone());
            }
            continue;
        }
        match obs.held.get(k) {
            Some(h) if *h == ip => {
                if !obs.ec2.ip_eni.contains_key(&ip) {
                    push(
                        "live-ip-not-in-ec2",
                        key_str(k),
                        format!(
                            "live attachment {} on {net} holds {ip} in the pool (ADD at step {}), which no ENI attached to the instance has in EC2",
                            key_str(k),
                            a.added_step
                        ),
                        false,
                    );
                }
            }
            // The state file was lost while this pod's netns was hidden: no witness tells the
            // daemon about it until the rack shows again (its IP must stay out of circulation: the
            // duplicate check above still holds it to that).
            None if model.unknowable(a, now, grace) => {}
            // Once the pool has let go of the IP, what EC2 does with it is the pool's business:
            // the violation is the loss.
            other => push(
                "live-lost-ip",
                key_str(k),
                format!(
                    "live attachment {} on {net} (ADD at step {} gave {ip}) — the pool holds {}",
                    key_str(k),
                    a.added_step,
                    other.map_or("nothing for it".to_owned(), |o| o.to_string())
                ),
                false,
            ),
        }
    }
    // (An attachment whose IPv4 the soak took out of band is the out-of-band checks' business.)
    for a in model
        .live()
        .filter(|a| model.oob_since(a, window, eni_of).is_none())
    {
        let want = super::runtime::Addrs {
            v4: a.ip,
            v6: a.ip6,
        };
        match obs.cache.get(&a.key) {
            Some(c) if c.network == a.network && c.addrs == want => {}
            other => push(
                "host-cache",
                key_str(&a.key),
                format!(
                    "live attachment {} ({}): the plugin's result cache has {:?}",
                    key_str(&a.key),
                    describe_att(a, &rules.network_names),
                    other
                ),
                false,
            ),
        }
    }

    // Ended attachments.
    for a in model.atts.values() {
        let k = &a.key;
        let ended_by_del = matches!(a.state, AttState::Deleted | AttState::AddFailed);
        if (ended_by_del || a.collected.is_some()) && obs.cache.contains_key(k) {
            push(
                "host-cache",
                key_str(k),
                format!(
                    "{} ({}) still has a result-cache entry",
                    key_str(k),
                    describe_att(a, &rules.network_names)
                ),
                false,
            );
        }
        if let (false, Some(gc_step)) = (a.is_live(), a.collected) {
            let by_pool = obs.held.get(k);
            let by_store = store_by_key.get(k).map(|r| r.ip);
            if by_pool.is_some() || by_store.is_some() {
                push(
                    "leak-after-gc",
                    key_str(k),
                    format!(
                        "{} ({}) is still held after a GC of its network at step {gc_step} left it out \
                         (pool: {by_pool:?}, store: {by_store:?})",
                        key_str(k),
                        describe_att(a, &rules.network_names),
                    ),
                    by_pool.is_none(),
                );
            }
        }
    }

    // The store and the pool.
    for r in &obs.store {
        match obs.held.get(&r.key) {
            Some(ip) if *ip == r.ip => {}
            other => push(
                "store-daemon-disagree",
                key_str(&r.key),
                format!(
                    "the store says {} holds {} (on {}), the pool says {}",
                    key_str(&r.key),
                    r.ip,
                    r.eni_id,
                    other.map_or("it holds nothing".to_owned(), |o| format!("it holds {o}"))
                ),
                true,
            ),
        }
    }
    for (k, ip) in &obs.held {
        if store_by_key.get(k).map(|r| r.ip) != Some(*ip) {
            push(
                "store-daemon-disagree",
                key_str(k),
                format!(
                    "the pool says {} holds {ip}, the store has {}",
                    key_str(k),
                    store_by_key
                        .get(k)
                        .map_or("no row for it".to_owned(), |r| format!("{}", r.ip))
                ),
                true,
            );
        }
    }
    if p.assigned as usize != obs.store.len() {
        push(
            "store-daemon-disagree",
            "counts".into(),
            format!(
                "the pool counts {} assigned IPs, the store {} assigned rows",
                p.assigned,
                obs.store.len()
            ),
            true,
        );
    }
    // Attachments whose IPv4 EC2 lost out of band: the daemon reports it lost and they keep their
    // IPv6 (dual), which is not a half-done ADD or DEL.
    let ipv4_taken: BTreeSet<Key> = model
        .atts
        .values()
        .filter(|a| model.oob_since(a, window, eni_of).is_some())
        .map(|a| a.key.clone())
        .collect();
    super::checker6::evaluate(obs, model, &mut state.v6, rules, &ipv4_taken, &mut ev.found);
    if let Some(world) = &rules.profiles {
        super::checker_profiles::evaluate(obs, model, world, window, eni_of, &mut ev.found);
    }
    ev
}
