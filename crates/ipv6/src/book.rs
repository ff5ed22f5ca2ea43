//! The node's /80, in memory: which pod holds which address, the sticky reservations, and the cursor
//! that picks the next address.
//!
//! A /80 holds 2^48 addresses, more than a node will hand out in its life. So the IPv4 pool's
//! cooldown and reverse-time reuse (hand out the longest-idle IP first, so a released address is not
//! reused while conntrack entries or other nodes' caches still name it) become one rule: **an
//! address is never handed out twice**. The cursor moves forward only and is written in the same
//! transaction as the allocation it made, so a crash cannot move it back; released addresses are
//! forgotten, except a StatefulSet pod's, which waits reserved for the pod to come back
//! (`ip_stick_time`), as in the IPv4 pool.
//!
//! Offset 0 of the prefix is never handed out: for a /80 that starts a /64 it is the subnet-router
//! anycast address, and it keeps the prefix's own address out of every pod.

use std::collections::HashMap;
use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::Ipv6Net;

use super::egress::{EgressBook, EgressExhausted};
use eniipam_api::model::{AttachmentKey, PodRef};

/// How many addresses a /80 holds; offsets run from 1 to `SPAN - 1`.
pub const SPAN: u64 = 1 << 48;

/// The cursor of a /80 the state file does not know: the wall clock in ms × 16, so it is past every
/// address an earlier life of the daemon handed out from the same /80 (whose cursor also started from
/// the clock) unless that life averaged more than 16 pods a millisecond. A lost state file then
/// cannot make the daemon hand out an address a pod held minutes before.
pub fn seed_offset(now_ms: u64) -> u64 {
    (now_ms.saturating_mul(16) % (SPAN - 1)).max(1)
}

/// Why an IPv6 address was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Ipv6Error {
    /// The preferred address is outside the node's /80, held by another attachment, or reserved for
    /// another StatefulSet pod.
    #[error("preferred IPv6 address {ip} is not available: {why}")]
    PreferredUnavailable { ip: Ipv6Addr, why: String },
    /// The daemon has no /80 yet (ip_family ipv4, or the startup did not take one).
    #[error("this node has no IPv6 prefix (ip_family is ipv4, or the /80 is not taken yet)")]
    NoPrefix,
    /// Every IPv4 egress address is held (`ipv4_egress`): nothing was handed out.
    #[error(transparent)]
    EgressExhausted(#[from] EgressExhausted),
}

/// One pod's address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    pub ip: Ipv6Addr,
    pub pod: PodRef,
    pub sticky_key: Option<String>,
    /// Where the attachment lives: its CNI network and network namespace.
    pub meta: Meta,
    /// Unix ms.
    pub assigned_at_ms: u64,
    /// The pod's node-local IPv4 for egress (`ipv4_egress` in ipv6 mode; see [`super::egress`]).
    pub egress: Option<Ipv4Addr>,
}

/// The CNI network (the conflist's `name`) and the pod's network namespace path.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Meta {
    pub network: String,
    pub netns: String,
}

/// What an acquire gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    pub ip: Ipv6Addr,
    /// False when the attachment already held this address (a repeated ADD).
    pub new: bool,
    /// The cursor after this grant, to be recorded with it.
    pub next_offset: u64,
    /// The attachment's egress IPv4, if the book hands them out.
    pub egress: Option<Ipv4Addr>,
    /// The egress cursor after this grant, to be recorded with it.
    pub egress_next: u64,
    /// The reservation this grant used up (a StatefulSet pod back within `ip_stick_time`), for undo.
    pub(crate) took_reservation: Option<(String, Reservation)>,
}

/// A StatefulSet pod's address kept while the pod is away.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reservation {
    pub ip: Ipv6Addr,
    /// Unix ms.
    pub until_ms: u64,
    /// Unix ms.
    pub released_at_ms: u64,
}

/// What a release did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Released6 {
    pub ip: Ipv6Addr,
    /// The egress IPv4 given back with it.
    pub egress: Option<Ipv4Addr>,
    /// The reservation made: the sticky key and until when (unix ms).
    pub reservation: Option<(String, u64)>,
    pub(crate) undo: (AttachmentKey, Held),
}

/// The address book of one /80.
#[derive(Clone, Debug)]
pub struct Book {
    prefix: Ipv6Net,
    next_offset: u64,
    held: HashMap<AttachmentKey, Held>,
    by_ip: HashMap<Ipv6Addr, AttachmentKey>,
    reserved: HashMap<String, Reservation>,
    /// The IPv4 egress addresses (`None`: the book hands none out).
    egress: Option<EgressBook>,
}

impl Book {
    /// An empty book of `prefix` whose cursor starts at `next_offset` (clamped into 1..SPAN).
    pub fn new(prefix: Ipv6Net, next_offset: u64) -> Self {
        Self {
            prefix: prefix.trunc(),
            next_offset: next_offset.clamp(1, SPAN - 1),
            held: HashMap::new(),
            by_ip: HashMap::new(),
            reserved: HashMap::new(),
            egress: None,
        }
    }

    /// The book also hands every new attachment an IPv4 egress address, the cursor standing at
    /// `egress_next` ([`super::egress`]).
    pub fn with_egress(mut self, egress_next: u64) -> Self {
        self.egress = Some(EgressBook::new(egress_next));
        self
    }

    /// The egress addresses, when the book hands them out.
    pub fn egress(&self) -> Option<&EgressBook> {
        self.egress.as_ref()
    }

    fn egress_next(&self) -> u64 {
        self.egress.as_ref().map_or(0, EgressBook::next)
    }

    pub fn prefix(&self) -> Ipv6Net {
        self.prefix
    }

    pub fn next_offset(&self) -> u64 {
        self.next_offset
    }

    /// How many addresses pods hold.
    pub fn assigned(&self) -> usize {
        self.held.len()
    }

    /// How many addresses wait reserved for StatefulSet pods.
    pub fn reserved(&self) -> usize {
        self.reserved.len()
    }

    /// The offset of `ip` in the prefix, if it is a pod address of it (not offset 0).
    pub fn offset_of(&self, ip: Ipv6Addr) -> Option<u64> {
        if !self.prefix.contains(&ip) {
            return None;
        }
        let off = (u128::from(ip) - u128::from(self.prefix.network())) as u64;
        (off != 0).then_some(off)
    }

    fn address(&self, offset: u64) -> Ipv6Addr {
        Ipv6Addr::from(u128::from(self.prefix.network()) + u128::from(offset))
    }

    /// The attachment's address, if it holds one.
    pub fn get(&self, key: &AttachmentKey) -> Option<&Held> {
        self.held.get(key)
    }

    /// Who holds `ip`.
    pub fn holder_of(&self, ip: Ipv6Addr) -> Option<&AttachmentKey> {
        self.by_ip.get(&ip)
    }

    /// Every attachment and its address.
    pub fn held(&self) -> impl Iterator<Item = (&AttachmentKey, &Held)> {
        self.held.iter()
    }

    /// Every reservation.
    pub fn reservations(&self) -> impl Iterator<Item = (&String, &Reservation)> {
        self.reserved.iter()
    }

    /// Puts back what the state file holds (startup). Refuses an address outside the prefix or held
    /// twice, or an egress address outside its range or held twice; the caller drops such rows with
    /// a log line. A book without egress forgets the row's egress address (`ipv4_egress` turned off).
    pub fn restore_held(&mut self, key: AttachmentKey, mut held: Held) -> Result<(), String> {
        let Some(off) = self.offset_of(held.ip) else {
            return Err(format!(
                "{} is not a pod address of {}",
                held.ip, self.prefix
            ));
        };
        if let Some(other) = self.by_ip.get(&held.ip) {
            return Err(format!("{} is held by {other} already", held.ip));
        }
        if self.held.contains_key(&key) {
            return Err(format!("{key} holds another address already"));
        }
        match (self.egress.as_mut(), held.egress) {
            (Some(book), Some(ip)) => book.restore(ip)?,
            (None, Some(_)) => held.egress = None,
            _ => {}
        }
        // The cursor never falls behind an address on record.
        self.next_offset = self.next_offset.max((off + 1).min(SPAN - 1));
        self.by_ip.insert(held.ip, key.clone());
        self.held.insert(key, held);
        Ok(())
    }

    /// Puts back a reservation from the state file (startup); expired ones are dropped by the caller.
    pub fn restore_reservation(
        &mut self,
        sticky_key: String,
        r: Reservation,
    ) -> Result<(), String> {
        let Some(off) = self.offset_of(r.ip) else {
            return Err(format!("{} is not a pod address of {}", r.ip, self.prefix));
        };
        if self.by_ip.contains_key(&r.ip) || self.reserved.values().any(|x| x.ip == r.ip) {
            return Err(format!("{} is held or reserved already", r.ip));
        }
        self.next_offset = self.next_offset.max((off + 1).min(SPAN - 1));
        self.reserved.insert(sticky_key, r);
        Ok(())
    }

    /// Drops reservations that ran out by `now_ms`; returns their addresses (never handed out again:
    /// the cursor is past them).
    pub fn expire(&mut self, now_ms: u64) -> Vec<Ipv6Addr> {
        let gone: Vec<String> = self
            .reserved
            .iter()
            .filter(|(_, r)| r.until_ms <= now_ms)
            .map(|(k, _)| k.clone())
            .collect();
        gone.into_iter()
            .filter_map(|k| self.reserved.remove(&k).map(|r| r.ip))
            .collect()
    }

    fn reserved_for_other(&self, ip: Ipv6Addr, sticky_key: Option<&str>) -> Option<&str> {
        self.reserved
            .iter()
            .find(|(k, r)| r.ip == ip && Some(k.as_str()) != sticky_key)
            .map(|(k, _)| k.as_str())
    }

    /// An address for `key`: the one it holds (a repeated ADD); else its StatefulSet reservation;
    /// else `prefer` when it is free for this caller; else the next never-used address.
    pub fn acquire(
        &mut self,
        key: &AttachmentKey,
        pod: &PodRef,
        sticky_key: Option<&str>,
        meta: &Meta,
        prefer: Option<Ipv6Addr>,
        now_ms: u64,
    ) -> Result<Grant, Ipv6Error> {
        if let Some(h) = self.held.get(key) {
            return Ok(Grant {
                ip: h.ip,
                new: false,
                next_offset: self.next_offset,
                egress: h.egress,
                egress_next: self.egress_next(),
                took_reservation: None,
            });
        }
        self.expire(now_ms);
        // Checked before anything moves, so running out changes nothing; the take below cannot fail.
        if self.egress.as_ref().is_some_and(|e| !e.has_room()) {
            return Err(EgressExhausted.into());
        }
        let mut took_reservation = None;
        let ip = if let Some(r) = sticky_key.and_then(|k| self.reserved.remove_entry(k)) {
            let ip = r.1.ip;
            took_reservation = Some(r);
            ip
        } else if let Some(ip) = prefer {
            if self.offset_of(ip).is_none() {
                return Err(Ipv6Error::PreferredUnavailable {
                    ip,
                    why: format!("not a pod address of this node's prefix {}", self.prefix),
                });
            }
            if let Some(other) = self.by_ip.get(&ip) {
                return Err(Ipv6Error::PreferredUnavailable {
                    ip,
                    why: format!("held by {other}"),
                });
            }
            if let Some(other) = self.reserved_for_other(ip, sticky_key) {
                return Err(Ipv6Error::PreferredUnavailable {
                    ip,
                    why: format!("reserved for StatefulSet pod {other}"),
                });
            }
            ip
        } else {
            self.fresh()
        };
        if let Some(off) = self.offset_of(ip) {
            self.next_offset = self.next_offset.max((off + 1).min(SPAN - 1));
        }
        let egress = self.egress.as_mut().map(EgressBook::take).transpose()?;
        let held = Held {
            ip,
            pod: pod.clone(),
            sticky_key: sticky_key.map(str::to_owned),
            meta: meta.clone(),
            assigned_at_ms: now_ms,
            egress,
        };
        self.by_ip.insert(ip, key.clone());
        self.held.insert(key.clone(), held);
        Ok(Grant {
            ip,
            new: true,
            next_offset: self.next_offset,
            egress,
            egress_next: self.egress_next(),
            took_reservation,
        })
    }

    /// The next address at or after the cursor that nobody holds or reserves (wrapping past the end
    /// of the prefix, which a node would need 2^48 pods to reach).
    fn fresh(&mut self) -> Ipv6Addr {
        loop {
            let ip = self.address(self.next_offset);
            self.next_offset = if self.next_offset + 1 >= SPAN {
                1
            } else {
                self.next_offset + 1
            };
            if !self.by_ip.contains_key(&ip) && !self.reserved.values().any(|r| r.ip == ip) {
                return ip;
            }
        }
    }

    /// Undoes a new grant whose record failed: the address is forgotten (the cursor stays past it,
    /// so it is not handed out again), and a reservation it used is back.
    pub fn undo_acquire(&mut self, key: &AttachmentKey, grant: &Grant) {
        if !grant.new {
            return;
        }
        if let Some(h) = self.held.remove(key) {
            self.by_ip.remove(&h.ip);
            self.free_egress(h.egress);
        }
        if let Some((k, r)) = grant.took_reservation.clone() {
            self.reserved.insert(k, r);
        }
    }

    /// Releases the attachment's address; with `sticky` and a sticky key, reserves it for
    /// `stick_ms`. `None` for an attachment that holds none.
    pub fn release(
        &mut self,
        key: &AttachmentKey,
        sticky: bool,
        stick_ms: u64,
        now_ms: u64,
    ) -> Option<Released6> {
        let held = self.held.remove(key)?;
        self.by_ip.remove(&held.ip);
        self.free_egress(held.egress);
        let reservation = match (&held.sticky_key, sticky && stick_ms > 0) {
            (Some(k), true) => {
                let until_ms = now_ms + stick_ms;
                self.reserved.insert(
                    k.clone(),
                    Reservation {
                        ip: held.ip,
                        until_ms,
                        released_at_ms: now_ms,
                    },
                );
                Some((k.clone(), until_ms))
            }
            _ => None,
        };
        Some(Released6 {
            ip: held.ip,
            egress: held.egress,
            reservation,
            undo: (key.clone(), held),
        })
    }

    fn free_egress(&mut self, ip: Option<Ipv4Addr>) {
        if let (Some(book), Some(ip)) = (self.egress.as_mut(), ip) {
            book.free(ip);
        }
    }

    /// Undoes a release whose record failed: the attachment holds its address again.
    ///
    /// Its egress address too, unless another attachment took it in between (the cursor wrapped onto
    /// it while the record was failing): then the attachment keeps no egress address in memory.
    pub fn undo_release(&mut self, released: &Released6) {
        let (key, mut held) = released.undo.clone();
        if let Some((k, _)) = &released.reservation {
            self.reserved.remove(k);
        }
        if let (Some(book), Some(ip)) = (self.egress.as_mut(), held.egress)
            && book.restore(ip).is_err()
        {
            held.egress = None;
        }
        self.by_ip.insert(held.ip, key.clone());
        self.held.insert(key, held);
    }
}
