//! Capacity tokens: one per IP slot the node may hold.
//!
//! A token is taken before any IP is requested from EC2 (for a pod or for the warm pool) and given
//! back only when the IP is given back to EC2 (or the request fails). So at all times
//! `idle + assigned + being released + in flight = tokens used ≤ capacity`.

use crate::cloud::InstanceLimits;

/// How many pod IPs a node may hold.
///
/// `min(max_ips, (ENIs − 1 − foreign) × (IPv4 per ENI − 1))`, where ENIs is the instance type's
/// limit, lowered by `max_enis` when configured, and both counts include eth0.
///
/// - **eth0 is not used for pods**: its IPs belong to the node (kubelet, host-network pods) and it can
///   never be detached, so the pool never grows or shrinks it; one ENI slot is subtracted.
/// - **A secondary ENI's primary IP is not used for pods either**, hence `IPv4 per ENI − 1`: the primary
///   IP cannot be unassigned from its ENI, so a pod on it would pin the ENI — the ENI could never be
///   detached and deleted when the pool shrinks, and deleting it anyway would strand the pod on an
///   address that no longer exists. Secondary IPs can be moved and given back one by one.
/// - **Foreign ENIs** (attached, but not created by eniipam or carrying the opt-out tag) take a slot
///   and are never touched.
pub fn node_capacity(
    limits: InstanceLimits,
    max_enis: Option<u32>,
    max_ips: Option<u32>,
    foreign_enis: u32,
) -> u32 {
    let enis = max_enis.map_or(limits.max_enis, |cap| cap.min(limits.max_enis));
    let pod_enis = enis.saturating_sub(1).saturating_sub(foreign_enis);
    let slots = pod_enis.saturating_mul(limits.ipv4_per_eni.saturating_sub(1));
    max_ips.map_or(slots, |cap| cap.min(slots))
}

/// A counter of taken IP slots, bounded by the node's capacity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CapacityTokens {
    capacity: u32,
    used: u32,
}

impl CapacityTokens {
    /// `capacity` tokens, none taken.
    pub fn new(capacity: u32) -> Self {
        Self { capacity, used: 0 }
    }

    /// Total tokens.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Tokens taken.
    pub fn used(&self) -> u32 {
        self.used
    }

    /// Tokens left.
    pub fn available(&self) -> u32 {
        self.capacity.saturating_sub(self.used)
    }

    /// Takes `n` tokens if all of them are free; takes none otherwise.
    pub fn try_take(&mut self, n: u32) -> bool {
        if self.available() >= n {
            self.used += n;
            true
        } else {
            false
        }
    }

    /// Takes as many of `n` tokens as are free and returns how many.
    pub fn take_up_to(&mut self, n: u32) -> u32 {
        let n = n.min(self.available());
        self.used += n;
        n
    }

    /// Accounts for IPs the node already holds at startup, even beyond capacity (a lowered cap):
    /// no new token is handed out until enough are given back.
    pub fn take_existing(&mut self, n: u32) {
        self.used = self.used.saturating_add(n);
    }

    /// Returns `n` tokens.
    pub fn give_back(&mut self, n: u32) {
        debug_assert!(
            n <= self.used,
            "giving back {n} tokens, only {} taken",
            self.used
        );
        self.used = self.used.saturating_sub(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn limits(max_enis: u32, ipv4_per_eni: u32) -> InstanceLimits {
        InstanceLimits {
            max_enis,
            ipv4_per_eni,
        }
    }

    #[test]
    fn capacity_excludes_eth0_and_secondary_primaries() {
        // m5.large: 3 ENIs × 10 IPs → 2 pod ENIs × 9 secondaries.
        assert_eq!(node_capacity(limits(3, 10), None, None, 0), 18);
        assert_eq!(node_capacity(limits(3, 10), Some(2), None, 0), 9);
        assert_eq!(node_capacity(limits(3, 10), Some(8), Some(12), 0), 12);
        assert_eq!(node_capacity(limits(3, 10), None, None, 1), 9);
        assert_eq!(node_capacity(limits(1, 10), None, None, 0), 0);
    }

    proptest! {
        #[test]
        fn capacity_never_exceeds_any_bound(
            max_enis in 1u32..16, per in 1u32..50, cap_enis in proptest::option::of(1u32..16),
            cap_ips in proptest::option::of(0u32..1000), foreign in 0u32..4,
        ) {
            let c = node_capacity(limits(max_enis, per), cap_enis, cap_ips, foreign);
            prop_assert!(c <= (max_enis - 1) * (per - 1));
            if let Some(cap) = cap_ips { prop_assert!(c <= cap); }
            if let Some(e) = cap_enis { prop_assert!(c <= e.saturating_sub(1) * (per - 1)); }
        }

        #[test]
        fn tokens_never_exceed_capacity(capacity in 0u32..64, ops in proptest::collection::vec((any::<bool>(), 0u32..10), 0..64)) {
            let mut t = CapacityTokens::new(capacity);
            let mut model = 0u32;
            for (take, n) in ops {
                if take {
                    let got = t.take_up_to(n);
                    model += got;
                } else {
                    let n = n.min(model);
                    t.give_back(n);
                    model -= n;
                }
                prop_assert_eq!(t.used(), model);
                prop_assert!(t.used() <= t.capacity());
                prop_assert_eq!(t.available(), capacity - model);
            }
        }
    }

    #[test]
    fn try_take_is_all_or_nothing() {
        let mut t = CapacityTokens::new(3);
        assert!(t.try_take(2));
        assert!(!t.try_take(2));
        assert_eq!(t.used(), 2);
        t.take_existing(5);
        assert_eq!(t.available(), 0);
        assert_eq!(t.take_up_to(1), 0);
    }
}
