//! The world's random choices (EC2 picking free addresses, /28 blocks and IPv6 prefixes): used by the
//! IPv4 address book ([`super::addresses`]) and the IPv6 one ([`super::ipv6`]) alike.

use crate::splitmix::splitmix;

/// A small deterministic generator (SplitMix64): the same seed gives the same addresses.
#[derive(Debug, Clone)]
pub(super) struct Rng(u64);

impl Rng {
    pub(super) fn new(seed: u64) -> Self {
        Self(seed)
    }

    fn next(&mut self) -> u64 {
        let r = splitmix(self.0);
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        r
    }

    /// Uniform in `0..n` (`n > 0`).
    pub(super) fn below(&mut self, n: u64) -> u64 {
        let zone = u64::MAX - u64::MAX % n;
        loop {
            let x = self.next();
            if x < zone {
                return x % n;
            }
        }
    }
}
