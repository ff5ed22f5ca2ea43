//! The idle queue: IPs the node holds that no pod uses, in reverse-time order.
//!
//! Each idle IP becomes *eligible* for an arbitrary pod at `max(idle since + cooldown, end of its
//! sticky reservation)`; the queue is ordered by that instant, so the IP idle the longest is taken
//! first and a freshly released one last — and never before its cooldown. This is what protects a
//! pod from receiving the IP of a pod whose teardown is still in flight. IPs fresh from EC2 (never
//! handed to a pod) are eligible at once.
//!
//! A sticky reservation (`namespace/name` of a StatefulSet pod) keeps an IP for its key until the
//! reservation ends: the same key gets it back at once (cooldown does not apply to the pod that
//! held it), nobody else before the end.
//!
//! Times are tokio [`Instant`]s, so `tokio::time::pause` drives everything; persistence converts
//! them to wall-clock time at its own boundary.

use std::collections::{BTreeSet, HashMap};
use std::net::Ipv4Addr;
use std::time::Duration;

use tokio::time::Instant;

use crate::model::EniId;

/// A sticky reservation of an idle IP.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reservation {
    /// The sticky key (`namespace/name`) the IP is kept for.
    pub key: String,
    /// When the reservation ends.
    pub until: Instant,
}

/// One idle IP.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdleEntry {
    pub ip: Ipv4Addr,
    /// The ENI the IP is assigned to.
    pub eni: EniId,
    /// When the IP became idle.
    pub idle_since: Instant,
    /// Before this instant the IP goes to no other pod.
    pub cooldown_until: Instant,
    pub reservation: Option<Reservation>,
    seq: u64,
}

impl IdleEntry {
    /// When the IP may go to any pod.
    pub fn eligible_at(&self) -> Instant {
        match &self.reservation {
            Some(r) => r.until.max(self.cooldown_until),
            None => self.cooldown_until,
        }
    }

    /// The reservation, if still in force at `now`.
    pub fn reserved_at(&self, now: Instant) -> Option<&Reservation> {
        self.reservation.as_ref().filter(|r| r.until > now)
    }

    /// Cooling down at `now` (and not reserved).
    pub fn cooling_at(&self, now: Instant) -> bool {
        self.reserved_at(now).is_none() && self.cooldown_until > now
    }
}

/// Why an idle-queue lookup refused an IP.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IdleRefusal {
    /// The IP is not idle.
    NotIdle,
    /// Still cooling down for this long.
    Cooling(Duration),
    /// Reserved for another key for this long.
    Reserved(Duration),
}

/// Idle IPs ordered by eligibility, with an index of sticky reservations.
#[derive(Debug, Default)]
pub struct IdleQueue {
    entries: HashMap<Ipv4Addr, IdleEntry>,
    /// `(eligible_at, seq, ip)`: the first eligible entry is the one idle the longest.
    order: BTreeSet<(Instant, u64, Ipv4Addr)>,
    /// key → `(idle_since, seq, ip)` of IPs reserved for it (expired ones are skipped and pruned on removal).
    by_key: HashMap<String, BTreeSet<(Instant, u64, Ipv4Addr)>>,
    seq: u64,
}

impl IdleQueue {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// Every idle IP (any order).
    pub fn ips(&self) -> impl Iterator<Item = Ipv4Addr> + '_ {
        self.entries.keys().copied()
    }

    /// The idle IPs of `eni`.
    pub fn ips_on(&self, eni: &EniId) -> Vec<Ipv4Addr> {
        self.entries
            .values()
            .filter(|e| &e.eni == eni)
            .map(|e| e.ip)
            .collect()
    }

    /// Adds an IP that became idle at `idle_since`, cooling for `cooldown`, maybe reserved.
    pub fn push(
        &mut self,
        ip: Ipv4Addr,
        eni: EniId,
        idle_since: Instant,
        cooldown: Duration,
        reservation: Option<Reservation>,
    ) {
        self.seq += 1;
        self.insert(IdleEntry {
            ip,
            eni,
            idle_since,
            cooldown_until: idle_since + cooldown,
            reservation,
            seq: self.seq,
        });
    }

    /// Puts back an entry taken out earlier (a give-back that failed), keeping its place.
    pub fn reinsert(&mut self, entry: IdleEntry) {
        self.insert(entry);
    }

    fn insert(&mut self, entry: IdleEntry) {
        if let Some(old) = self.remove(entry.ip) {
            tracing::warn!(ip = %old.ip, "IP was already idle; replacing its entry");
        }
        self.order
            .insert((entry.eligible_at(), entry.seq, entry.ip));
        if let Some(r) = &entry.reservation {
            self.by_key.entry(r.key.clone()).or_default().insert((
                entry.idle_since,
                entry.seq,
                entry.ip,
            ));
        }
        self.entries.insert(entry.ip, entry);
    }

    /// Takes an IP out of the queue.
    pub fn remove(&mut self, ip: Ipv4Addr) -> Option<IdleEntry> {
        let entry = self.entries.remove(&ip)?;
        self.order.remove(&(entry.eligible_at(), entry.seq, ip));
        if let Some(r) = &entry.reservation
            && let Some(set) = self.by_key.get_mut(&r.key)
        {
            set.remove(&(entry.idle_since, entry.seq, ip));
            if set.is_empty() {
                self.by_key.remove(&r.key);
            }
        }
        Some(entry)
    }

    /// Takes the IP idle the longest that any pod may have at `now`.
    pub fn pop_oldest(&mut self, now: Instant) -> Option<IdleEntry> {
        let &(eligible_at, _, ip) = self.order.first()?;
        if eligible_at > now {
            return None;
        }
        self.remove(ip)
    }

    /// [`Self::pop_oldest`] among the IPs of the ENIs `on` accepts (a network profile's, or the
    /// default network's): the queue is shared, the order kept within the part.
    pub fn pop_oldest_on(
        &mut self,
        now: Instant,
        on: impl Fn(&EniId) -> bool,
    ) -> Option<IdleEntry> {
        let ip = self
            .order
            .iter()
            .take_while(|(at, _, _)| *at <= now)
            .map(|(_, _, ip)| *ip)
            .find(|ip| self.entries.get(ip).is_some_and(|e| on(&e.eni)))?;
        self.remove(ip)
    }

    /// Takes an IP reserved for `key` (and still reserved at `now`): `prefer` if it is one of them,
    /// else the one idle the longest.
    pub fn pop_for_key(
        &mut self,
        key: &str,
        now: Instant,
        prefer: Option<Ipv4Addr>,
    ) -> Option<IdleEntry> {
        self.pop_for_key_on(key, now, prefer, |_| true)
    }

    /// [`Self::pop_for_key`] among the IPs of the ENIs `on` accepts.
    pub fn pop_for_key_on(
        &mut self,
        key: &str,
        now: Instant,
        prefer: Option<Ipv4Addr>,
        on: impl Fn(&EniId) -> bool,
    ) -> Option<IdleEntry> {
        let set = self.by_key.get(key)?;
        let live = |ip: &Ipv4Addr| {
            self.entries.get(ip).is_some_and(|e| on(&e.eni))
                && self
                    .entries
                    .get(ip)
                    .and_then(|e| e.reserved_at(now))
                    .is_some_and(|r| r.key == key)
        };
        let ip = prefer
            .filter(|p| set.iter().any(|(_, _, ip)| ip == p) && live(p))
            .or_else(|| set.iter().map(|(_, _, ip)| *ip).find(|ip| live(ip)))?;
        self.remove(ip)
    }

    /// Whether `ip` is idle and may go to a caller with sticky key `key` at `now`.
    pub fn check(&self, ip: Ipv4Addr, now: Instant, key: Option<&str>) -> Result<(), IdleRefusal> {
        let entry = self.entries.get(&ip).ok_or(IdleRefusal::NotIdle)?;
        if let Some(r) = entry.reserved_at(now) {
            return if Some(r.key.as_str()) == key {
                Ok(())
            } else {
                Err(IdleRefusal::Reserved(r.until - now))
            };
        }
        if entry.cooldown_until > now {
            return Err(IdleRefusal::Cooling(entry.cooldown_until - now));
        }
        Ok(())
    }

    /// Takes `ip` if [`Self::check`] allows it.
    pub fn take_if_free(
        &mut self,
        ip: Ipv4Addr,
        now: Instant,
        key: Option<&str>,
    ) -> Result<IdleEntry, IdleRefusal> {
        self.check(ip, now, key)?;
        Ok(self.remove(ip).expect("checked present"))
    }

    /// IPs that may be given back to EC2 at `now` (past cooldown, not reserved), longest idle first.
    pub fn give_back_candidates(&self, now: Instant) -> Vec<&IdleEntry> {
        let mut out: Vec<&IdleEntry> = self
            .order
            .iter()
            .take_while(|(at, _, _)| *at <= now)
            .filter_map(|(_, _, ip)| self.entries.get(ip))
            .filter(|e| e.reserved_at(now).is_none())
            .collect();
        out.sort_by_key(|e| (e.idle_since, e.seq));
        out
    }

    /// When the next IP becomes eligible for any pod (now or in the past if one is).
    pub fn next_eligible_at(&self) -> Option<Instant> {
        self.order.first().map(|(at, _, _)| *at)
    }

    /// One idle IP.
    pub fn get(&self, ip: Ipv4Addr) -> Option<&IdleEntry> {
        self.entries.get(&ip)
    }

    /// Every idle IP, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = &IdleEntry> {
        self.entries.values()
    }

    /// Idle IPs, reserved and cooling ones included.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no IP is idle.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Idle IPs not reserved at `now` (cooling ones included): what the warm-pool bounds count.
    pub fn unreserved(&self, now: Instant) -> u32 {
        self.entries
            .values()
            .filter(|e| e.reserved_at(now).is_none())
            .count() as u32
    }

    /// Idle IPs reserved at `now`.
    pub fn reserved(&self, now: Instant) -> u32 {
        self.entries
            .values()
            .filter(|e| e.reserved_at(now).is_some())
            .count() as u32
    }

    /// Idle IPs cooling at `now` (not reserved).
    pub fn cooling(&self, now: Instant) -> u32 {
        self.entries.values().filter(|e| e.cooling_at(now)).count() as u32
    }

    /// Idle IPs any pod may have at `now`.
    pub fn eligible(&self, now: Instant) -> u32 {
        self.order
            .iter()
            .take_while(|(at, _, _)| *at <= now)
            .count() as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ip(n: u8) -> Ipv4Addr {
        Ipv4Addr::new(10, 0, 0, n)
    }

    fn eni() -> EniId {
        "eni-00000001".parse().unwrap()
    }

    const COOL: Duration = Duration::from_secs(30);

    #[tokio::test(start_paused = true)]
    async fn oldest_first_and_cooldown_holds() {
        let mut q = IdleQueue::new();
        let t0 = Instant::now();
        q.push(ip(1), eni(), t0, COOL, None);
        q.push(ip(2), eni(), t0 + Duration::from_secs(1), COOL, None);
        q.push(ip(3), eni(), t0, Duration::ZERO, None); // fresh from EC2
        assert_eq!(q.pop_oldest(t0).map(|e| e.ip), Some(ip(3)));
        assert_eq!(q.pop_oldest(t0 + Duration::from_secs(29)), None, "cooling");
        assert_eq!(q.cooling(t0 + Duration::from_secs(29)), 2);
        let later = t0 + Duration::from_secs(40);
        assert_eq!(q.pop_oldest(later).map(|e| e.ip), Some(ip(1)));
        assert_eq!(q.pop_oldest(later).map(|e| e.ip), Some(ip(2)));
        assert!(q.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn reservations_go_to_their_key_only_until_expiry() {
        let mut q = IdleQueue::new();
        let t0 = Instant::now();
        let until = t0 + Duration::from_secs(300);
        q.push(
            ip(1),
            eni(),
            t0,
            COOL,
            Some(Reservation {
                key: "ns/web-0".into(),
                until,
            }),
        );
        let mid = t0 + Duration::from_secs(100);
        assert_eq!(q.pop_oldest(mid), None);
        assert_eq!(
            q.check(ip(1), mid, Some("ns/web-1")),
            Err(IdleRefusal::Reserved(Duration::from_secs(200)))
        );
        assert_eq!(
            q.check(ip(1), t0, Some("ns/web-0")),
            Ok(()),
            "same key skips cooldown"
        );
        assert!(q.pop_for_key("ns/web-1", mid, None).is_none());
        assert!(q.give_back_candidates(mid).is_empty());
        assert_eq!(q.reserved(mid), 1);
        // Expired: an ordinary idle IP, behind the reservation end.
        let after = until + Duration::from_secs(1);
        assert!(q.pop_for_key("ns/web-0", after, None).is_none());
        assert_eq!(q.give_back_candidates(after).len(), 1);
        assert_eq!(q.pop_oldest(after).map(|e| e.ip), Some(ip(1)));
    }

    proptest! {
        /// Whatever is pushed, popping at increasing times never returns an IP before its
        /// eligibility, returns them in eligibility order, and never a reserved IP to another key.
        #[test]
        fn pops_respect_eligibility(
            pushes in proptest::collection::vec((0u64..100, any::<bool>(), 0u64..200), 1..40),
            steps in proptest::collection::vec(0u64..50, 1..40),
        ) {
            let rt = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap();
            rt.block_on(async {
                let t0 = Instant::now();
                let mut q = IdleQueue::new();
                for (i, (since, reserved, stick)) in pushes.iter().enumerate() {
                    let r = reserved.then(|| Reservation { key: format!("k{i}"), until: t0 + Duration::from_secs(since + stick) });
                    q.push(ip(i as u8), eni(), t0 + Duration::from_secs(*since), COOL, r);
                }
                let mut now = t0;
                let mut last = None;
                for s in steps {
                    now += Duration::from_secs(s);
                    while let Some(e) = q.pop_oldest(now) {
                        prop_assert!(e.eligible_at() <= now);
                        prop_assert!(e.cooldown_until <= now);
                        prop_assert!(e.reserved_at(now).is_none());
                        if let Some(prev) = last { prop_assert!(prev <= e.eligible_at()); }
                        last = Some(e.eligible_at());
                    }
                }
                Ok(())
            })?;
        }
    }
}
