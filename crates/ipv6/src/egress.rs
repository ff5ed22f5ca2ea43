//! IPv4 egress for IPv6-only pods: a node-local IPv4 per pod, SNATed to the node's primary IPv4.
//!
//! An IPv6-only pod has no IPv4 at all, so it cannot reach an IPv4-only destination (much of the
//! internet, many AWS endpoints, on-premises networks). The VPC CNI chains a second plugin for this
//! (`egress-v4-cni` with host-local IPAM over 169.254.172.0/22); eniipam builds it in: the daemon
//! hands out the address with the pod's IPv6, records both in one transaction, the plugin wires it,
//! and the daemon's `pod-snat` chain translates it to the node's primary IPv4 (`host::snat`).
//!
//! The address means nothing beyond the node, so two nodes may use the same ones; on one node two
//! live pods never share one. Released addresses are not reused at once: the cursor moves forward
//! over the range and wraps, so a gone pod's conntrack entries (a NATed UDP flow lives 30–180 s)
//! cannot steer packets to the pod that comes after it unless 1022 pods started in between.

use std::collections::HashSet;
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

/// The range the addresses come from, 169.254.172.0/22: the VPC CNI's own, kept in `eniipam-api`
/// ([`eniipam_api::egress`]) since the plugin checks replies against it.
pub const EGRESS_RANGE: Ipv4Net = Ipv4Net::new_assert(
    eniipam_api::egress::NETWORK,
    eniipam_api::egress::PREFIX_LEN,
);

/// How many addresses pods can hold: the /22 without its network and broadcast addresses.
pub const EGRESS_SPAN: u64 = (1 << (32 - 22)) - 2;

/// Every egress address is held by a live pod.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "every IPv4 egress address of {EGRESS_RANGE} ({EGRESS_SPAN}) is held by a pod on this node: \
     release pods, or turn ipv4_egress off"
)]
pub struct EgressExhausted;

/// The egress addresses pods hold, and the cursor that picks the next one.
///
/// The cursor is a count that only grows (recorded with each allocation, `MAX`ed in the state file
/// so concurrent records cannot move it back); the address it names is `count mod EGRESS_SPAN`.
#[derive(Clone, Debug, Default)]
pub struct EgressBook {
    next: u64,
    held: HashSet<Ipv4Addr>,
}

impl EgressBook {
    /// An empty book whose cursor stands at `next`.
    pub fn new(next: u64) -> Self {
        Self {
            next,
            held: HashSet::new(),
        }
    }

    /// The cursor, to be recorded.
    pub fn next(&self) -> u64 {
        self.next
    }

    /// How many addresses pods hold.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// Whether `ip` is one this book hands out (in the range, not its network or broadcast).
    pub fn is_pod_address(ip: Ipv4Addr) -> bool {
        eniipam_api::egress::is_pod_address(ip)
    }

    fn address(count: u64) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(EGRESS_RANGE.network()) + 1 + (count % EGRESS_SPAN) as u32)
    }

    /// Whether one more address can be handed out.
    pub fn has_room(&self) -> bool {
        (self.held.len() as u64) < EGRESS_SPAN
    }

    /// The next free address at or after the cursor; the cursor moves past it. Exhaustion changes
    /// nothing.
    pub fn take(&mut self) -> Result<Ipv4Addr, EgressExhausted> {
        if !self.has_room() {
            return Err(EgressExhausted);
        }
        loop {
            let ip = Self::address(self.next);
            self.next = self.next.wrapping_add(1);
            if self.held.insert(ip) {
                return Ok(ip);
            }
        }
    }

    /// Gives `ip` back (a release, or the undo of a take whose record failed). The cursor stays.
    pub fn free(&mut self, ip: Ipv4Addr) {
        self.held.remove(&ip);
    }

    /// Puts back an address of the state file (startup, or the undo of a release). Refuses one
    /// outside the range or held already.
    pub fn restore(&mut self, ip: Ipv4Addr) -> Result<(), String> {
        if !Self::is_pod_address(ip) {
            return Err(format!(
                "egress address {ip} is not a pod address of {EGRESS_RANGE}"
            ));
        }
        if !self.held.insert(ip) {
            return Err(format!("egress address {ip} is held twice"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> Ipv4Addr {
        s.parse().unwrap()
    }

    #[test]
    fn the_range_is_the_vpc_cnis_and_skips_network_and_broadcast() {
        assert_eq!(EGRESS_RANGE.to_string(), "169.254.172.0/22");
        assert_eq!(EGRESS_SPAN, 1022);
        assert!(!EgressBook::is_pod_address(ip("169.254.172.0")));
        assert!(EgressBook::is_pod_address(ip("169.254.172.1")));
        assert!(EgressBook::is_pod_address(ip("169.254.175.254")));
        assert!(!EgressBook::is_pod_address(ip("169.254.175.255")));
        assert!(!EgressBook::is_pod_address(ip("169.254.176.1")));
        assert!(!EgressBook::is_pod_address(ip("10.0.0.1")));
    }

    #[test]
    fn a_freed_address_is_not_handed_out_again_until_the_cursor_wraps() {
        let mut b = EgressBook::new(0);
        let first = b.take().unwrap();
        assert_eq!(first, ip("169.254.172.1"));
        assert_eq!(b.take().unwrap(), ip("169.254.172.2"));
        b.free(first);
        // The next takes go forward, never back to the freed one ...
        let mut seen = vec![];
        for _ in 0..EGRESS_SPAN - 2 {
            seen.push(b.take().unwrap());
        }
        assert!(!seen.contains(&first));
        assert_eq!(*seen.last().unwrap(), ip("169.254.175.254"));
        // ... until the cursor wraps and finds it free.
        assert_eq!(b.take().unwrap(), first);
        assert_eq!(b.next(), EGRESS_SPAN + 1);
    }

    #[test]
    fn the_wrapped_cursor_skips_held_addresses() {
        let mut b = EgressBook::new(EGRESS_SPAN - 1);
        b.restore(ip("169.254.172.1")).unwrap();
        assert_eq!(b.take().unwrap(), ip("169.254.175.254"));
        assert_eq!(
            b.take().unwrap(),
            ip("169.254.172.2"),
            "wrapped past the held .1"
        );
    }

    #[test]
    fn exhaustion_is_an_error_that_changes_nothing() {
        let mut b = EgressBook::new(7);
        for _ in 0..EGRESS_SPAN {
            b.take().unwrap();
        }
        let next = b.next();
        let e = b.take().unwrap_err();
        assert!(e.to_string().contains("169.254.172.0/22"), "{e}");
        assert_eq!((b.next(), b.held() as u64), (next, EGRESS_SPAN));
        b.free(ip("169.254.173.9"));
        assert_eq!(b.take().unwrap(), ip("169.254.173.9"));
    }

    #[test]
    fn restore_refuses_foreign_and_doubled_addresses() {
        let mut b = EgressBook::new(0);
        b.restore(ip("169.254.172.5")).unwrap();
        assert!(
            b.restore(ip("169.254.172.5"))
                .unwrap_err()
                .contains("held twice")
        );
        assert!(
            b.restore(ip("10.0.0.5"))
                .unwrap_err()
                .contains("not a pod address")
        );
        assert!(b.restore(ip("169.254.175.255")).is_err());
        // A restored address is skipped by the cursor.
        assert_eq!(b.take().unwrap(), ip("169.254.172.1"));
        let mut b = EgressBook::new(4);
        b.restore(ip("169.254.172.5")).unwrap();
        assert_eq!(b.take().unwrap(), ip("169.254.172.6"));
    }
}
