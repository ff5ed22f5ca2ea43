//! A read-only view of the pool, for `Status`, `eniipamctl` and tests. Built on demand under the
//! pool's lock in one pass (a node holds at most a few hundred IPs); durations are relative to the
//! moment it was taken, so the view means the same to a reader on another clock.

use std::net::Ipv4Addr;
use std::time::Duration;

use ipnet::Ipv4Net;
use tokio::time::Instant;

use super::config::WarmPolicy;
use super::error::ExhaustionReason;
use super::state::{EniRole, PoolState, SubnetBackoffKind};
use super::types::{AttachmentMeta, EniPhase};
use crate::cloud::CloudError;
use crate::model::{AttachmentKey, EniId, PodRef};

/// The pool at one instant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolSnapshot {
    /// IP slots the node may hold (capacity tokens).
    pub capacity: u32,
    /// Tokens taken: idle + assigned + releasing + in flight.
    pub tokens_used: u32,
    /// Idle IPs, cooling and reserved ones included.
    pub idle: u32,
    /// Idle IPs any pod may have now.
    pub idle_eligible: u32,
    /// Idle IPs cooling down after a release.
    pub cooling: u32,
    /// Idle IPs reserved for a sticky key.
    pub reserved: u32,
    /// IPs held by attachments.
    pub assigned: u32,
    /// IPs being given back to EC2.
    pub releasing: u32,
    /// IPs held out of circulation (see [`IpState::Quarantined`]).
    pub quarantined: u32,
    /// Idle IPs held back on ENIs EC2 did not show attached (see [`IpState::HeldBack`]).
    pub held_back: u32,
    /// IPs asked of EC2 and not arrived (assigns and creates).
    pub in_flight: u32,
    /// Pods waiting for a new ENI.
    pub waiting_for_eni: u32,
    /// ENIs being created.
    pub creating_enis: u32,
    pub min_idle: u32,
    pub max_idle: u32,
    /// The warm policy in force.
    pub warm_policy: WarmPolicy,
    /// The warm levels now (see [`super::demand`]): the pool tops up when idle IPs fall below
    /// `warm_target`, fills to `warm_fill`, gives back beyond `warm_keep`.
    pub warm_target: u32,
    pub warm_fill: u32,
    pub warm_keep: u32,
    /// ENIs the node may have, eth0 included.
    pub max_enis: u32,
    /// Pod IPs per ENI.
    pub ips_per_eni: u32,
    /// Every attached ENI, by device index.
    pub enis: Vec<EniSnapshot>,
    pub subnets: Vec<SubnetSnapshot>,
    /// Why no more IPs can be had now, if so.
    pub exhaustion: Option<ExhaustionReason>,
}

impl PoolSnapshot {
    /// One ENI.
    pub fn eni(&self, id: &EniId) -> Option<&EniSnapshot> {
        self.enis.iter().find(|e| &e.id == id)
    }

    /// The ENIs that serve pods.
    pub fn pod_enis(&self) -> impl Iterator<Item = &EniSnapshot> {
        self.enis.iter().filter(|e| e.serves_pods)
    }

    /// Every pod IP and its state.
    pub fn ips(&self) -> impl Iterator<Item = &IpSnapshot> {
        self.enis.iter().flat_map(|e| e.ips.iter())
    }

    /// The state of one IP.
    pub fn ip(&self, ip: Ipv4Addr) -> Option<&IpState> {
        self.ips().find(|s| s.ip == ip).map(|s| &s.state)
    }
}

/// One ENI.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EniSnapshot {
    pub id: EniId,
    pub mac: String,
    pub device_index: u32,
    pub subnet_id: String,
    pub subnet_cidr: Option<Ipv4Net>,
    pub primary_ip: Ipv4Addr,
    pub role: EniRole,
    /// Its addresses serve pods (an ENI of ours, or eth0 with `use_primary_eni`).
    pub serves_pods: bool,
    /// Its delegated `/28` prefixes.
    pub prefixes: Vec<Ipv4Net>,
    pub phase: EniPhaseSnapshot,
    /// IPs asked of EC2 for this ENI and not arrived.
    pub in_flight: u32,
    /// Its pod IPs, ascending.
    pub ips: Vec<IpSnapshot>,
    /// The network profile it serves (`None`: the default pod network).
    pub network: Option<String>,
}

/// An ENI's phase.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EniPhaseSnapshot {
    Serving,
    /// EC2 did not show it attached at the last look.
    Suspect {
        for_: Duration,
    },
    BackingOff {
        retry_in: Duration,
        failures: u32,
        last_error: CloudError,
    },
    Draining,
}

/// One pod IP.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IpSnapshot {
    pub ip: Ipv4Addr,
    pub state: IpState,
}

/// What a pod IP is doing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IpState {
    Assigned {
        attachment: AttachmentKey,
        pod: PodRef,
        sticky_key: Option<String>,
        meta: AttachmentMeta,
        held_for: Duration,
    },
    /// Idle and free for any pod.
    Idle { idle_for: Duration },
    /// Idle, released recently: no other pod before `remaining` has passed.
    Cooling {
        idle_for: Duration,
        remaining: Duration,
    },
    /// Idle, kept for a sticky key.
    Reserved {
        key: String,
        idle_for: Duration,
        remaining: Duration,
    },
    /// Being given back to EC2.
    Releasing,
    /// Held out of circulation: history unknown and no evidence of who holds it.
    Quarantined { reason: String, held_for: Duration },
    /// Idle on an ENI EC2 did not show attached at the last look: not handed out for now. The
    /// reservation (key and time left), if it had one, is kept.
    HeldBack {
        idle_for: Duration,
        reservation: Option<(String, Duration)>,
    },
}

/// A subnet the pool uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubnetSnapshot {
    pub id: String,
    pub cidr: Option<Ipv4Net>,
    pub backoff: Option<SubnetBackoffSnapshot>,
    /// With prefix delegation: EC2 had no free `/28` here at the last try; single packed addresses
    /// until prefixes are tried again in this long.
    pub prefixes_blocked_for: Option<Duration>,
    /// Free addresses as EC2 last reported them (`None` when EC2 has not been asked yet).
    pub free: Option<u32>,
}

/// A subnet's back-off.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubnetBackoffSnapshot {
    /// EC2 said full / limit reached (as opposed to ENI creation failing).
    pub exhausted: bool,
    pub retry_in: Duration,
    pub failures: u32,
    pub error: CloudError,
}

impl PoolState {
    /// The view at `now`.
    pub fn snapshot(&self, now: Instant) -> PoolSnapshot {
        let levels = self.warm_levels(now);
        let mut enis: Vec<EniSnapshot> = self
            .enis
            .values()
            .map(|r| {
                let mut ips: Vec<IpSnapshot> = r
                    .ips
                    .iter()
                    .map(|ip| IpSnapshot {
                        ip: *ip,
                        state: self.ip_state(*ip, now),
                    })
                    .collect();
                ips.sort_by_key(|s| s.ip);
                EniSnapshot {
                    id: r.id.clone(),
                    mac: r.mac.clone(),
                    device_index: r.device_index,
                    subnet_id: r.subnet_id.clone(),
                    subnet_cidr: self
                        .subnets
                        .get(&r.subnet_id)
                        .and_then(|s| s.subnet.as_ref())
                        .map(|s| s.cidr),
                    primary_ip: r.primary_ip,
                    role: r.role,
                    serves_pods: r.serves,
                    prefixes: r.prefixes.iter().copied().collect(),
                    phase: match &r.phase {
                        EniPhase::BackingOff {
                            until,
                            failures,
                            last_error,
                        } if *until > now => EniPhaseSnapshot::BackingOff {
                            retry_in: *until - now,
                            failures: *failures,
                            last_error: last_error.clone(),
                        },
                        EniPhase::Draining => EniPhaseSnapshot::Draining,
                        EniPhase::Suspect { since } => EniPhaseSnapshot::Suspect {
                            for_: now.saturating_duration_since(*since),
                        },
                        _ => EniPhaseSnapshot::Serving,
                    },
                    in_flight: r.inflight,
                    ips,
                    network: r.profile.clone(),
                }
            })
            .collect();
        enis.sort_by_key(|e| e.device_index);
        let subnets: Vec<SubnetSnapshot> = self
            .subnets
            .iter()
            .map(|(id, s)| SubnetSnapshot {
                id: id.clone(),
                cidr: s.subnet.as_ref().map(|s| s.cidr),
                free: s
                    .subnet
                    .as_ref()
                    .filter(|_| s.free_known)
                    .map(|s| s.available_ips),
                backoff: s.backoff.as_ref().filter(|b| b.until > now).map(|b| {
                    SubnetBackoffSnapshot {
                        exhausted: b.kind == SubnetBackoffKind::Exhausted,
                        retry_in: b.until - now,
                        failures: b.failures,
                        error: b.error.clone(),
                    }
                }),
                prefixes_blocked_for: s
                    .no_prefix
                    .as_ref()
                    .filter(|b| b.until > now)
                    .map(|b| b.until - now),
            })
            .collect();
        let in_flight = self.enis.values().map(|r| r.inflight).sum::<u32>()
            + self.creating.values().map(|c| c.count).sum::<u32>();
        let exhaustion = self
            .subnets
            .iter()
            .filter_map(|(id, s)| s.backoff.as_ref().map(|b| (id, b)))
            .find(|(_, b)| b.kind == SubnetBackoffKind::Exhausted && b.until > now)
            .map(|(id, b)| ExhaustionReason::Cloud {
                subnet_id: id.clone(),
                error: Box::new(b.error.clone()),
            })
            .or_else(|| {
                (self.capacity.available() == 0).then(|| ExhaustionReason::CapacityReached {
                    capacity: self.capacity.capacity(),
                    cooling: self.idle.cooling(now),
                    reserved: self.idle.reserved(now),
                })
            });
        PoolSnapshot {
            capacity: self.capacity.capacity(),
            tokens_used: self.capacity.used(),
            idle: self.idle.len() as u32,
            idle_eligible: self.idle.eligible(now),
            cooling: self.idle.cooling(now),
            reserved: self.idle.reserved(now),
            assigned: self.allocations.len() as u32,
            releasing: self.releasing.len() as u32,
            quarantined: self.quarantined.len() as u32,
            held_back: self.held_back.len() as u32,
            in_flight,
            waiting_for_eni: self.create_waiters.len() as u32,
            creating_enis: self.creating.len() as u32,
            min_idle: self.config.min_idle,
            max_idle: self.config.max_idle,
            warm_policy: self.config.warm_policy,
            warm_target: levels.low,
            warm_fill: levels.fill,
            warm_keep: levels.keep,
            max_enis: self.max_enis,
            ips_per_eni: self.per_eni,
            enis,
            subnets,
            exhaustion,
        }
    }

    fn ip_state(&self, ip: Ipv4Addr, now: Instant) -> IpState {
        if let Some(key) = self.assigned.get(&ip)
            && let Some(rec) = self.allocations.get(key)
        {
            return IpState::Assigned {
                attachment: key.clone(),
                pod: rec.pod.clone(),
                sticky_key: rec.sticky_key.clone(),
                meta: rec.meta.clone(),
                held_for: now.saturating_duration_since(rec.since),
            };
        }
        if let Some(q) = self.quarantined.get(&ip) {
            return IpState::Quarantined {
                reason: q.reason.clone(),
                held_for: now.saturating_duration_since(q.since),
            };
        }
        if let Some(e) = self.held_back.get(&ip) {
            return IpState::HeldBack {
                idle_for: now.saturating_duration_since(e.idle_since),
                reservation: e.reserved_at(now).map(|r| (r.key.clone(), r.until - now)),
            };
        }
        if let Some(e) = self.idle.get(ip) {
            let idle_for = now.saturating_duration_since(e.idle_since);
            if let Some(r) = e.reserved_at(now) {
                return IpState::Reserved {
                    key: r.key.clone(),
                    idle_for,
                    remaining: r.until - now,
                };
            }
            if e.cooldown_until > now {
                return IpState::Cooling {
                    idle_for,
                    remaining: e.cooldown_until - now,
                };
            }
            return IpState::Idle { idle_for };
        }
        IpState::Releasing
    }
}
