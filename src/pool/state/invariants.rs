//! The token accounting check: every token is held by exactly one IP or request, and every IP the
//! pool holds is on one of its ENIs; and the network profiles' separation.

use std::collections::HashSet;

use tokio::time::Instant;

use super::PoolState;

impl PoolState {
    /// Checks the token accounting; `Err` describes the mismatch.
    pub fn check_invariants(&self) -> Result<(), String> {
        let inflight: u32 = self.enis.values().map(|r| r.inflight).sum();
        let creating: u32 = self.creating.values().map(|c| c.count).sum();
        let held = self.idle.len() as u32
            + self.releasing.len() as u32
            + self.allocations.len() as u32
            + self.quarantined.len() as u32
            + self.held_back.len() as u32;
        let sum = held + inflight + creating + self.create_waiters.len() as u32;
        if sum != self.capacity.used() {
            return Err(format!(
                "tokens used {} != idle {} + releasing {} + assigned {} + quarantined {} + held back {} \
                 + in flight {} + creating {} + waiting {}",
                self.capacity.used(),
                self.idle.len(),
                self.releasing.len(),
                self.allocations.len(),
                self.quarantined.len(),
                self.held_back.len(),
                inflight,
                creating,
                self.create_waiters.len()
            ));
        }
        if self.capacity.used() > self.capacity.capacity() {
            return Err(format!(
                "tokens used {} > capacity {}",
                self.capacity.used(),
                self.capacity.capacity()
            ));
        }
        let mut seen = HashSet::new();
        for ip in self
            .idle
            .ips()
            .chain(self.releasing.keys().copied())
            .chain(self.assigned.keys().copied())
            .chain(self.quarantined.keys().copied())
            .chain(self.held_back.keys().copied())
        {
            if !seen.insert(ip) {
                return Err(format!("{ip} is in two places at once"));
            }
        }
        let on_enis: u32 = self
            .enis
            .values()
            .filter(|r| r.serves)
            .map(|r| r.ips.len() as u32)
            .sum();
        if on_enis != held {
            return Err(format!(
                "ENIs hold {on_enis} IPs, the pool accounts for {held}"
            ));
        }
        self.check_profiles()
    }

    /// Network profiles: every allocation's IP is on an ENI of the allocation's profile (no IP of
    /// one network handed to a pod of another), and the default network's warm level counts no
    /// idle IP of a profile's ENI (nor does a profile's acquire wait for its warm-ups).
    fn check_profiles(&self) -> Result<(), String> {
        for (key, a) in &self.allocations {
            let Some(r) = self.enis.get(&a.eni) else {
                return Err(format!(
                    "{key} holds {} on {}, an ENI the pool does not know",
                    a.ip, a.eni
                ));
            };
            if r.profile != a.network || !r.ips.contains(&a.ip) {
                return Err(format!(
                    "{key} (network {}) holds {} on {} (network {}{})",
                    a.network.as_deref().unwrap_or("default"),
                    a.ip,
                    a.eni,
                    r.profile.as_deref().unwrap_or("default"),
                    if r.ips.contains(&a.ip) {
                        ""
                    } else {
                        ", which does not hold it"
                    }
                ));
            }
        }
        let now = Instant::now();
        let counted = self.warm_on_hand(now) - self.warming;
        let default_idle = self
            .idle
            .iter()
            .filter(|e| e.reserved_at(now).is_none())
            .filter(|e| self.enis.get(&e.eni).is_some_and(|r| r.profile.is_none()))
            .count() as u32;
        if counted != default_idle {
            let of_profiles = self
                .idle
                .iter()
                .filter(|e| self.enis.get(&e.eni).is_some_and(|r| r.profile.is_some()))
                .count();
            return Err(format!(
                "the default network's warm level counts {counted} idle IPs, its ENIs have {default_idle} \
                 unreserved ({of_profiles} idle IPs are on profiles' ENIs)"
            ));
        }
        if let Some(w) = self.warm_waiters.iter().find(|w| w.req.network.is_some()) {
            return Err(format!(
                "{} of profile {:?} waits for the default network's warm-ups",
                w.req.key, w.req.network
            ));
        }
        Ok(())
    }
}
