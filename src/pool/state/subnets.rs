//! Subnets: which one a new ENI goes to, when one backs off (exhausted, or creations failing), when
//! it has no free `/28` for a prefix, and what EC2 last said of its free addresses.

use tokio::time::Instant;

use super::{PodNetwork, PoolState, PrefixBackoff, SubnetBackoff, SubnetBackoffKind, SubnetRecord};
use crate::cloud::lifecycle::SECURITY_GROUPS_TAG;
use crate::cloud::{CloudError, Subnet};
use crate::model::EniId;
use crate::pool::error::{BackoffTarget, ExhaustionReason, PoolError};

impl PoolState {
    /// An exhausted-subnet error for `subnet_id` if it is backing off as exhausted at `now`.
    pub(super) fn subnet_exhausted(&self, subnet_id: &str, now: Instant) -> Option<PoolError> {
        let b = self.subnets.get(subnet_id)?.backoff.as_ref()?;
        (b.kind == SubnetBackoffKind::Exhausted && b.until > now).then(|| PoolError::Exhausted {
            reason: ExhaustionReason::Cloud {
                subnet_id: subnet_id.to_owned(),
                error: Box::new(b.error.clone()),
            },
            retry_after: Some(b.until - now),
        })
    }

    /// Why no ENI may be created in `subnet_id` at `now`, if so: the node's ENIConfig is unusable
    /// (custom networking), or the subnet backs off.
    pub(super) fn create_blocked(&self, subnet_id: &str, now: Instant) -> Option<PoolError> {
        if let PodNetwork::Unavailable { reason } = &self.pod_network {
            return Some(PoolError::NoPodNetwork {
                reason: reason.clone(),
            });
        }
        self.subnet_backing_off(subnet_id, now)
    }

    /// The back-off of `subnet_id` at `now`, if any (exhausted, or creations failing): what blocks
    /// a create there for any network (the default one and every profile).
    pub(super) fn subnet_backing_off(&self, subnet_id: &str, now: Instant) -> Option<PoolError> {
        let b = self.subnets.get(subnet_id)?.backoff.as_ref()?;
        if b.until <= now {
            return None;
        }
        Some(match b.kind {
            SubnetBackoffKind::Exhausted => self.subnet_exhausted(subnet_id, now)?,
            SubnetBackoffKind::CreateFailing => PoolError::BackingOff {
                target: BackoffTarget::EniCreation {
                    subnet_id: subnet_id.to_owned(),
                },
                retry_after: b.until - now,
                last_error: Box::new(b.error.clone()),
            },
        })
    }

    /// The subnet for a new ENI: of the pod subnets not backing off, the one with the most free
    /// addresses EC2 last reported (with prefix delegation, one that still has `/28`s first).
    ///
    /// Subnets within a quarter of the best count are as good: among them each node takes one by
    /// a hash of its instance id, so nodes that boot together (and read the same counts) spread over
    /// them instead of all draining the same one.
    ///
    /// With custom networking, the ENIConfig's subnet, backing off or not (no other is a candidate).
    pub fn pick_subnet(&self, now: Instant) -> String {
        if let PodNetwork::Custom { subnet, .. } = &self.pod_network {
            return subnet.id.clone();
        }
        let candidates: Vec<&String> = self
            .pod_subnets
            .iter()
            .filter(|id| self.create_blocked(id, now).is_none())
            .collect();
        let free = |id: &str| {
            self.subnets
                .get(id)
                .and_then(|s| s.subnet.as_ref())
                .map_or(0, |s| s.available_ips)
        };
        let takes_prefixes = self.prefix_slots();
        let prefixes_ok = |id: &str| !takes_prefixes || !self.prefixes_blocked(id, now);
        let Some(best) = candidates
            .iter()
            .max_by_key(|id| {
                (
                    prefixes_ok(id),
                    free(id),
                    std::cmp::Reverse(self.pod_subnets.iter().position(|s| s == **id)),
                )
            })
            .map(|id| (*id).clone())
        else {
            return self.node.subnet_id.clone();
        };
        let (best_ok, best_free) = (prefixes_ok(&best), free(&best));
        let as_good: Vec<&&String> = candidates
            .iter()
            .filter(|id| prefixes_ok(id) == best_ok && free(id) >= best_free - best_free / 4)
            .collect();
        if as_good.len() < 2 || best_free == 0 {
            return best;
        }
        let spread = self
            .node
            .instance_id
            .bytes()
            .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
            });
        (*as_good[(spread % as_good.len() as u64) as usize]).clone()
    }

    pub(super) fn back_off_subnet(
        &mut self,
        subnet_id: &str,
        kind: SubnetBackoffKind,
        error: CloudError,
        now: Instant,
    ) {
        let rec = self
            .subnets
            .entry(subnet_id.to_owned())
            .or_insert_with(|| SubnetRecord::new(None));
        let failures = rec
            .backoff
            .as_ref()
            .filter(|b| b.kind == kind)
            .map_or(1, |b| b.failures + 1);
        let delay = match kind {
            SubnetBackoffKind::Exhausted => self.config.subnet_backoff,
            SubnetBackoffKind::CreateFailing => self.config.backoff_after(failures),
        };
        tracing::warn!(subnet = subnet_id, ?kind, error = %error, backoff_ms = delay.as_millis() as u64, "subnet backs off");
        rec.backoff = Some(SubnetBackoff {
            until: now + delay,
            kind,
            failures,
            error,
        });
    }

    /// EC2 answered that `subnet_id` has no free address: its count is zero until the next read.
    pub(super) fn subnet_seen_full(&mut self, subnet_id: &str) {
        if let Some(s) = self
            .subnets
            .get_mut(subnet_id)
            .and_then(|r| r.subnet.as_mut())
        {
            s.available_ips = 0;
        }
        if let Some(r) = self.subnets.get_mut(subnet_id) {
            r.free_known = r.subnet.is_some();
        }
    }

    /// Records a subnet description (fetched before a create, or by the periodic refresh).
    pub fn learn_subnet(&mut self, subnet: Subnet) {
        let id = subnet.id.clone();
        let r = self
            .subnets
            .entry(id)
            .or_insert_with(|| SubnetRecord::new(None));
        r.subnet = Some(subnet);
        r.free_known = true;
    }

    /// Whether prefixes are off for now in `subnet_id` (no free `/28` at the last try).
    pub fn prefixes_blocked(&self, subnet_id: &str, now: Instant) -> bool {
        self.subnets
            .get(subnet_id)
            .and_then(|s| s.no_prefix.as_ref())
            .is_some_and(|b| b.until > now)
    }

    /// EC2 found no free `/28` in the subnet of `eni`: single packed addresses there until the
    /// back-off ends.
    pub fn no_free_prefix(&mut self, eni: &EniId, now: Instant) {
        if let Some(subnet_id) = self.enis.get(eni).map(|r| r.subnet_id.clone()) {
            self.no_free_prefix_in(&subnet_id, now);
        }
    }

    /// EC2 found no free `/28` in `subnet_id`.
    pub fn no_free_prefix_in(&mut self, subnet_id: &str, now: Instant) {
        let subnet_id = subnet_id.to_owned();
        let rec = self
            .subnets
            .entry(subnet_id.clone())
            .or_insert_with(|| SubnetRecord::new(None));
        let failures = rec.no_prefix.as_ref().map_or(1, |b| b.failures + 1);
        let delay = self.config.prefix_retry_after(failures);
        tracing::warn!(subnet = %subnet_id, failures, retry_in_s = delay.as_secs(),
            "no free /28 for a prefix in this subnet: serving single addresses packed into fragmented blocks");
        rec.no_prefix = Some(PrefixBackoff {
            until: now + delay,
            failures,
        });
    }

    /// The subnet of `eni`, as far as the pool knows it.
    pub fn subnet_of(&self, eni: &EniId) -> Option<Subnet> {
        let r = self.enis.get(eni)?;
        self.subnets.get(&r.subnet_id)?.subnet.clone()
    }
}

impl PoolState {
    /// Sets what decides new ENIs' subnet and groups; returns what it was. Custom networking's
    /// subnet becomes the only pod subnet (its free count learned from EC2's description); the
    /// ENIs the node has are left as they are: a change applies to new ENIs only.
    pub fn set_pod_network(&mut self, network: PodNetwork) -> PodNetwork {
        if let PodNetwork::Custom { subnet, .. } = &network {
            self.pod_subnets = vec![subnet.id.clone()];
            self.learn_subnet(subnet.clone());
        }
        std::mem::replace(&mut self.pod_network, network)
    }

    /// The security groups of a new ENI in `subnet_id`: the ENIConfig's with custom networking;
    /// else the subnet's `eniipam.io/security-groups` tag when it has one, else the node's.
    pub fn new_eni_security_groups(&self, subnet_id: &str) -> Vec<String> {
        if let PodNetwork::Custom {
            security_groups, ..
        } = &self.pod_network
        {
            return security_groups.clone();
        }
        self.subnets
            .get(subnet_id)
            .and_then(|s| s.subnet.as_ref())
            .and_then(|s| s.tags.get(SECURITY_GROUPS_TAG))
            .map(|v| {
                v.split(',')
                    .map(str::trim)
                    .filter(|g| !g.is_empty())
                    .map(str::to_owned)
                    .collect::<Vec<_>>()
            })
            .filter(|g| !g.is_empty())
            .unwrap_or_else(|| self.node.security_groups.clone())
    }
}
