//! The token accounting check: every token is held by exactly one IP or request, and every IP the
//! pool holds is on one of its ENIs.

use std::collections::HashSet;

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
        Ok(())
    }
}
