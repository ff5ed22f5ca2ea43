//! What the fake runtime knows: its pods, their attachments (one per network a pod joins) and what
//! happened to each — the truth the checker holds the daemon to — plus the out-of-band changes the
//! soak made to EC2 behind the daemon's back.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;
use std::time::Duration;

use tokio::time::Instant;

/// The daemon's name for an attachment: (container id, ifname).
pub type Key = (String, String);

/// Where an attachment is in its life, as the runtime saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttState {
    /// ADD is running.
    Adding,
    /// ADD succeeded; no DEL since, the netns exists, GC lists it.
    Live,
    /// ADD failed and the DEL that follows succeeded.
    AddFailed,
    /// DEL succeeded.
    Deleted,
    /// A DEL failed (retried at the next step).
    DelFailed,
    /// The pod's netns was removed without a DEL (the pod died); GC or a late DEL ends it.
    Dead,
}

impl AttState {
    pub fn name(self) -> &'static str {
        match self {
            Self::Adding => "adding",
            Self::Live => "live",
            Self::AddFailed => "add failed",
            Self::Deleted => "deleted",
            Self::DelFailed => "DEL failed",
            Self::Dead => "dead (netns gone, no DEL)",
        }
    }
}

/// The soak removed this attachment's IP from EC2 behind the daemon's back.
#[derive(Clone, Debug)]
pub struct OobMark {
    pub step: u64,
    pub at: Instant,
    pub what: String,
}

#[derive(Clone, Debug)]
pub struct Attachment {
    pub key: Key,
    pub network: usize,
    pub pod: usize,
    pub state: AttState,
    /// The IP ADD returned (kept after the attachment ends, for the record).
    pub ip: Option<Ipv4Addr>,
    /// The IPv6 ADD returned (ipv6, dual), kept likewise.
    pub ip6: Option<Ipv6Addr>,
    pub added_step: u64,
    pub added_at: Option<Instant>,
    pub ended_step: Option<u64>,
    pub oob: Option<OobMark>,
    /// The daemon no longer claims the attachment's out-of-band-removed IP.
    pub lost_reported: bool,
    /// A successful GC of its network did not list it (step).
    pub collected: Option<u64>,
    /// A late DEL for a dead attachment is due at this step.
    pub late_del: Option<u64>,
    /// The state file was lost while this (live) attachment's netns was hidden in this rack: no
    /// witness can tell the daemon who holds its IP until the rack shows again.
    pub record_lost_hidden: Option<usize>,
}

impl Attachment {
    pub fn is_live(&self) -> bool {
        self.state == AttState::Live
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodPhase {
    Running,
    Ended,
}

#[derive(Clone, Debug)]
pub struct Pod {
    pub container_id: String,
    pub name: String,
    pub uid: String,
    /// Its namespace (in the API server, in the network-profiles mode; always in CNI_ARGS).
    pub namespace: String,
    /// How it chose its network, in the network-profiles mode (`None` otherwise).
    pub choice: Option<super::profiles::Choice>,
    pub rack: usize,
    pub netns: PathBuf,
    /// Keys of its attachments, in ADD order.
    pub attachments: Vec<Key>,
    pub end_step: u64,
    pub phase: PodPhase,
}

/// An out-of-band change to EC2: the IPs it took from the instance (and the ENI it detached).
#[derive(Clone, Debug)]
pub struct OobEvent {
    pub step: u64,
    pub at: Instant,
    pub ips: BTreeSet<Ipv4Addr>,
    pub eni: Option<String>,
    pub what: String,
}

impl OobEvent {
    /// Whether the change took `ip` (`eni_of` says which ENI holds an IP in EC2 now, attached or not).
    fn took(&self, ip: Ipv4Addr, eni_of: &dyn Fn(Ipv4Addr) -> Option<String>) -> bool {
        self.ips.contains(&ip) || (self.eni.is_some() && eni_of(ip) == self.eni)
    }
}

#[derive(Default)]
pub struct Model {
    pub pods: Vec<Pod>,
    pub atts: BTreeMap<Key, Attachment>,
    pub oob: Vec<OobEvent>,
    /// Racks hidden now.
    pub hidden_racks: BTreeSet<usize>,
    /// When each rack last became visible again.
    pub rack_shown_at: BTreeMap<usize, Instant>,
    /// Spans in which EC2 was impeded (throttling bursts, failing or hanging calls), or the daemon
    /// could not record a change (its state disk full); `None`: not over yet. The daemon notices
    /// out-of-band changes by asking EC2, and backs off while EC2 throttles or fails, and reports
    /// one by writing it down, so its time to notice runs from when both work again.
    pub impeded: Vec<(&'static str, Instant, Option<Instant>)>,
    /// Every IPv6 an ADD handed out in the run, and to which attachment: the /80's contract is that
    /// none goes to a second one, restarts and a lost state file included.
    pub v6_given: BTreeMap<Ipv6Addr, Key>,
    /// The soak unassigned the node's /80 from eth0 (`oob-prefix-unassign`): when, and
    /// which /80.
    pub prefix_taken: Vec<(u64, Instant, ipnet::Ipv6Net)>,
    /// Network-profiles mode: every IPv4 an ADD handed out, the network of the pod it went to first
    /// (its profile, `None` for the default network) and that attachment: no IP of one network
    /// ever goes to a pod of another (each network has its own subnets).
    pub ip_network: BTreeMap<Ipv4Addr, (Option<String>, Key)>,
}

impl Model {
    /// The daemon's time to notice a change made at `at`: `grace`, or, when EC2 was impeded within
    /// it, until `grace` after EC2 recovered (repeatedly, for spans that follow each other).
    pub fn grace_after(&self, at: Instant, grace: Duration) -> Duration {
        let now = Instant::now();
        let mut deadline = at + grace;
        loop {
            let later = self
                .impeded
                .iter()
                .filter(|(_, start, end)| *start <= deadline && end.unwrap_or(now) >= at)
                .map(|(_, _, end)| end.unwrap_or(now) + grace)
                .max();
            match later {
                Some(d) if d > deadline => deadline = d,
                _ => return deadline - at,
            }
        }
    }

    /// EC2 (or the daemon's state disk) is impeded by fault `kind` from now (until `end`, or
    /// until [`Model::recovered_from`] when `None`).
    pub fn impeded_by(&mut self, kind: &'static str, end: Option<Instant>) {
        self.impeded.push((kind, Instant::now(), end));
    }

    /// The open impeded spans of fault `kind` end now.
    pub fn recovered_from(&mut self, kind: &'static str) {
        let now = Instant::now();
        for (_, _, end) in self.impeded.iter_mut().filter(|(k, _, _)| *k == kind) {
            end.get_or_insert(now);
        }
    }

    pub fn live(&self) -> impl Iterator<Item = &Attachment> {
        self.atts.values().filter(|a| a.is_live())
    }

    /// The profile of `a`'s pod (`None`: the default network, or not the network-profiles mode).
    pub fn profile_of(&self, a: &Attachment) -> Option<&'static str> {
        self.pods[a.pod].choice.and_then(|c| c.profile())
    }

    pub fn live_pods(&self) -> usize {
        self.pods
            .iter()
            .filter(|p| p.phase == PodPhase::Running)
            .count()
    }

    /// When the attachment's IP was taken out of band, if it was: marked at the change, or handed out
    /// within `window` after it from what the change took (an IP it removed, or any IP of the ENI it
    /// detached, even one assigned to that ENI afterwards): the daemon cannot have known yet. The
    /// latest such change: with burst prefixes EC2 hands the same `/28` back after an out-of-band
    /// unassign, and a window that impeded spans kept stretching could still hold an address handed
    /// out ten minutes on, its grace counted from the first change (the 20-minute soak's "584 s"
    /// `lost-ip-kept` at seed 46, 1.5 s after the change that took it).
    pub fn oob_since(
        &self,
        a: &Attachment,
        window: Duration,
        eni_of: &dyn Fn(Ipv4Addr) -> Option<String>,
    ) -> Option<Instant> {
        if let Some(m) = &a.oob {
            return Some(m.at);
        }
        let (ip, added) = (a.ip?, a.added_at?);
        self.oob
            .iter()
            .filter(|e| {
                added >= e.at
                    && added <= e.at + self.grace_after(e.at, window)
                    && e.took(ip, eni_of)
            })
            .map(|e| e.at)
            .max()
    }

    /// Whether `ip` was taken out of band less than `window` ago.
    pub fn ip_recently_oob(
        &self,
        ip: Ipv4Addr,
        now: Instant,
        window: Duration,
        eni_of: &dyn Fn(Ipv4Addr) -> Option<String>,
    ) -> bool {
        self.oob
            .iter()
            .any(|e| now < e.at + self.grace_after(e.at, window) && e.took(ip, eni_of))
    }

    /// The out-of-band event that took `ip`, if any (for messages).
    pub fn oob_event_of(
        &self,
        ip: Ipv4Addr,
        eni_of: &dyn Fn(Ipv4Addr) -> Option<String>,
    ) -> Option<&OobEvent> {
        self.oob.iter().rev().find(|e| e.took(ip, eni_of))
    }

    /// Whether the daemon cannot know `a` holds its IP now: its record was lost while its netns was
    /// hidden, and the rack is still hidden or showed again less than `window` ago.
    pub fn unknowable(&self, a: &Attachment, now: Instant, window: Duration) -> bool {
        a.record_lost_hidden.is_some_and(|r| {
            self.hidden_racks.contains(&r)
                || self
                    .rack_shown_at
                    .get(&r)
                    .is_some_and(|at| now < *at + window)
        })
    }

    /// Live attachments of `network`, as GC's valid list.
    pub fn valid_attachments(&self, network: usize) -> Vec<Key> {
        self.live()
            .filter(|a| a.network == network)
            .map(|a| a.key.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(step: u64, at: Instant, ip: Ipv4Addr) -> OobEvent {
        OobEvent {
            step,
            at,
            ips: BTreeSet::from([ip]),
            eni: None,
            what: format!("unassigned {ip}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_address_taken_twice_counts_its_grace_from_the_change_before_its_add() {
        let ip = Ipv4Addr::new(10, 0, 14, 112);
        let t0 = Instant::now();
        let mut m = Model::default();
        // EC2 impeded from the start and still: every window stretches to now.
        m.impeded.push(("ec2-error", t0, None));
        m.oob.push(event(100, t0, ip));
        tokio::time::advance(Duration::from_secs(584)).await;
        let second = Instant::now();
        m.oob.push(event(2098, second, ip));
        tokio::time::advance(Duration::from_millis(500)).await;
        let a = Attachment {
            key: ("c1".into(), "eth0".into()),
            network: 0,
            pod: 0,
            state: AttState::Live,
            ip: Some(ip),
            ip6: None,
            added_step: 2099,
            added_at: Some(Instant::now()),
            ended_step: None,
            oob: None,
            lost_reported: false,
            collected: None,
            late_del: None,
            record_lost_hidden: None,
        };
        let eni_of = |_: Ipv4Addr| None;
        assert_eq!(
            m.oob_since(&a, Duration::from_secs(30), &eni_of),
            Some(second)
        );
        // An address no change took: none.
        let other = Attachment {
            ip: Some(Ipv4Addr::new(10, 0, 14, 200)),
            ..a
        };
        assert_eq!(m.oob_since(&other, Duration::from_secs(30), &eni_of), None);
    }
}
