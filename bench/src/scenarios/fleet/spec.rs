//! What one pair of the fleet scenario runs (pattern, policy, size) and on which instance type: read
//! by the harness that runs it ([`super::harness`]) and by the boot it calls ([`super::boot`]), so
//! it lives beside both.

use super::policy::Policy;
use super::traffic::Pattern;

/// The instance type every node of the fleet is.
pub const INSTANCE: &str = "m5.xlarge";

/// What to run.
#[derive(Clone, Debug)]
pub struct PairSpec {
    pub pattern: Pattern,
    pub policy: Policy,
    pub nodes: usize,
    pub pods_per_node: u32,
    pub seed: u64,
    /// Each daemon's lookahead sees the pods bound to its node before their ADDs.
    pub lookahead: bool,
    /// Node-boot: eniipam's nodes carry the startup taint, so their pods are bound only once the
    /// daemon would lift it, and every policy's pod waits run from the node's launch.
    pub startup_taint: bool,
    /// `/28`s each node's eth0 carries from its launch (a launch template's `Ipv4PrefixCount`,
    /// `--fleet-boot-prefixes`): node-boot, policies that take prefixes; else 0.
    pub launch_prefixes: u32,
    /// Which of `--runs` this is (0-based); `seed` is already this run's.
    pub run: usize,
}

impl PairSpec {
    pub(super) fn tag(&self) -> String {
        if self.run == 0 {
            format!("{}/{}", self.pattern, self.policy)
        } else {
            format!("{}/{}#{}", self.pattern, self.policy, self.run + 1)
        }
    }
}
