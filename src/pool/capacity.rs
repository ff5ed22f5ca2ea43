//! Capacity tokens: one per IP slot the node may hold.
//!
//! A token is taken before any IP is requested from EC2 (for a pod or for the warm pool) and given
//! back only when the IP is given back to EC2 (or the request fails). So at all times
//! `idle + assigned + being released + in flight = tokens used ≤ capacity`.

use eniipam_limits::{AddressMode, EniLimits};

use super::config::PoolConfig;
use crate::cloud::InstanceLimits;

/// How many pod IPs a node may hold.
///
/// Slots: `(ENIs − foreign − [1 without eth0]) × (IPv4 per ENI − 1)`, where ENIs is the instance type's
/// limit (lowered by `max_enis` when configured), eth0 counted: `eniipam-limits`' formula
/// ([`eniipam_limits::eniipam_pod_ips`]) on the ENIs that serve pods. With prefix delegation each slot is a
/// `/28` of 16 addresses. Capped by `max_ips`; with prefix delegation the cap is rounded up to whole
/// prefixes (a node holds addresses 16 at a time).
///
/// - **eth0's secondary IPs serve pods by default** (`use_primary_eni`), as with the VPC CNI, so the
///   secondary-IP capacity is the VPC CNI's max-pods − 2. eth0 itself never detaches: the pool grows
///   and shrinks only its secondary IPs.
/// - **An ENI's primary IP is never used for pods**, hence `IPv4 per ENI − 1`: the primary IP cannot
///   be unassigned from its ENI, so a pod on it would pin the ENI — it could never be detached and
///   deleted when the pool shrinks. Secondary IPs (and prefixes) can be given back one by one.
/// - **Foreign ENIs** (attached, but not created by eniipam or carrying the opt-out tag) take a slot
///   and are never touched.
/// - **With prefix delegation the capacity is what the ENIs can hold** (432 on an m5.large), not the
///   kubelet's max-pods (110 there, 250 above 30 vCPUs): the kubelet keeps the pods under its own
///   limit, the pool only ever holds what its pods and warm pool need, and a ceiling at max-pods
///   would make two batches rounded up to whole prefixes collide with it. `eniipamctl max-pods`
///   gives the kubelet's value.
pub fn node_capacity(limits: InstanceLimits, config: &PoolConfig, foreign_enis: u32) -> u32 {
    let enis = config
        .max_enis
        .map_or(limits.max_enis, |cap| cap.min(limits.max_enis));
    let reserved = foreign_enis + u32::from(!config.use_primary_eni);
    let pod_enis = EniLimits {
        enis: enis.saturating_sub(reserved),
        ..limits.eni_limits()
    };
    // Burst prefixes hold addresses a /28 at a time too: counting their slots as single IPs would
    // put a node whose slots hold prefixes over its own capacity (the fault soak's restart).
    let mode = if config.prefix_delegation || (config.burst_prefixes && limits.nitro) {
        AddressMode::Prefixes
    } else {
        AddressMode::SecondaryIps
    };
    let addresses = eniipam_limits::eniipam_pod_ips(&pod_enis, mode);
    // A node holds addresses a slot at a time: the cap in whole slots.
    let per_slot = mode.addresses_per_slot();
    config.max_ips.map_or(addresses, |cap| {
        addresses.min(cap.div_ceil(per_slot) * per_slot)
    })
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
        InstanceLimits::new(max_enis, ipv4_per_eni)
    }

    fn config(
        max_enis: Option<u32>,
        max_ips: Option<u32>,
        use_primary_eni: bool,
        prefix_delegation: bool,
    ) -> PoolConfig {
        PoolConfig {
            max_enis,
            max_ips,
            use_primary_eni,
            prefix_delegation,
            ..PoolConfig::default()
        }
    }

    #[test]
    fn capacity_without_eth0_excludes_it_and_secondary_primaries() {
        // m5.large: 3 ENIs × 10 IPs → 2 pod ENIs × 9 secondaries.
        let no_eth0 = |e, i| config(e, i, false, false);
        assert_eq!(node_capacity(limits(3, 10), &no_eth0(None, None), 0), 18);
        assert_eq!(node_capacity(limits(3, 10), &no_eth0(Some(2), None), 0), 9);
        assert_eq!(
            node_capacity(limits(3, 10), &no_eth0(Some(8), Some(12)), 0),
            12
        );
        assert_eq!(node_capacity(limits(3, 10), &no_eth0(None, None), 1), 9);
        assert_eq!(node_capacity(limits(1, 10), &no_eth0(None, None), 0), 0);
    }

    #[test]
    fn capacity_with_eth0_is_the_vpc_cnis_max_pods_minus_two() {
        // m5.large 29, t3.medium 17, m5.xlarge 58, c5.4xlarge 234, m5.24xlarge 737.
        for (enis, ips, max_pods) in [
            (3, 10, 29),
            (3, 6, 17),
            (4, 15, 58),
            (8, 30, 234),
            (15, 50, 737),
        ] {
            let c = node_capacity(limits(enis, ips), &config(None, None, true, false), 0);
            assert_eq!(c + 2, max_pods, "{enis}×{ips}");
        }
    }

    #[test]
    fn prefix_capacity_is_every_slot_in_whole_prefixes() {
        let pd = config(None, None, true, true);
        // m5.large: 3 × 9 × 16 = 432 (the VPC CNI's max-pods there is 110: the kubelet's cap).
        assert_eq!(node_capacity(limits(3, 10), &pd, 0), 432);
        // Without eth0: 2 × 9 × 16.
        assert_eq!(
            node_capacity(limits(3, 10), &config(None, None, false, true), 0),
            288
        );
        // An explicit max_ips wins, in whole prefixes.
        assert_eq!(
            node_capacity(limits(3, 10), &config(None, Some(40), true, true), 0),
            48
        );
        assert_eq!(
            node_capacity(limits(3, 10), &config(None, Some(110), true, true), 0),
            112
        );
        assert_eq!(node_capacity(limits(2, 3), &pd, 0), 64);
    }

    #[test]
    fn burst_prefixes_count_every_slot_in_whole_prefixes_on_nitro_types_only() {
        let burst = PoolConfig {
            burst_prefixes: true,
            ..config(None, None, true, false)
        };
        let nitro = InstanceLimits {
            nitro: true,
            ..limits(3, 10)
        };
        assert_eq!(node_capacity(nitro, &burst, 0), 432);
        // Not a Nitro type: burst prefixes are off, single IPs.
        assert_eq!(node_capacity(limits(3, 10), &burst, 0), 27);
    }

    proptest! {
        #[test]
        fn capacity_never_exceeds_any_bound(
            max_enis in 1u32..16, per in 1u32..50, cap_enis in proptest::option::of(1u32..16),
            cap_ips in proptest::option::of(0u32..1000), foreign in 0u32..4, eth0 in any::<bool>(),
            pd in any::<bool>(),
        ) {
            let cfg = config(cap_enis, cap_ips, eth0, pd);
            let c = node_capacity(limits(max_enis, per), &cfg, foreign);
            let per_slot = if pd { 16 } else { 1 };
            let enis = cap_enis.map_or(max_enis, |e| e.min(max_enis));
            prop_assert!(c <= enis * (per - 1) * per_slot);
            if let Some(cap) = cap_ips {
                prop_assert!(c <= cap.div_ceil(per_slot) * per_slot);
            }
            if pd { prop_assert_eq!(c % 16, 0); }
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
