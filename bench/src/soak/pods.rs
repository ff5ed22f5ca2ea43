//! Pods: planning a step's batch of operations, running it through the plugin, and what the runtime
//! learns from the outcomes.

use std::collections::{BTreeMap, BTreeSet};

use rand::Rng as _;
use rand::seq::IndexedRandom as _;
use tokio::time::Instant;

use super::Soak;
use super::faults::{self, FaultKind};
use super::host::RACKS;
use super::model::{AttState, Attachment, Key, Pod, PodPhase};
use super::runtime::{Addrs, PodArgs, Runtime};
use super::{IFNAMES, NETWORKS};

/// Whether the error text names `profile` as a word (`db`, not `dbx`).
fn names(text: &str, profile: &str) -> bool {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '.'))
        .any(|w| w == profile)
}

/// A job of one step's batch, run concurrently with the others.
pub(super) enum Job {
    /// ADD to each network in order; on a failure DEL what was added (the sandbox fails).
    Start {
        pod: usize,
        args: PodArgs,
        plan: Vec<(Key, usize)>,
    },
    /// DEL these attachments (reverse order), then the pod's netns goes when `end_pod`.
    Del {
        pod: usize,
        args: PodArgs,
        keys: Vec<(Key, usize)>,
        end_pod: bool,
    },
}

/// An ADD's outcome: the addresses and when they came, or the plugin's error.
pub(super) type AddOutcome = Result<(Addrs, Instant), String>;

pub(super) enum JobResult {
    Started {
        pod: usize,
        adds: Vec<(Key, AddOutcome)>,
        dels: Vec<(Key, Result<(), String>)>,
    },
    Deleted {
        pod: usize,
        dels: Vec<(Key, Result<(), String>)>,
        end_pod: bool,
    },
}

pub(super) async fn run_job(rt: Runtime, job: Job) -> JobResult {
    match job {
        Job::Start { pod, args, plan } => {
            let mut adds = Vec::new();
            let mut dels = Vec::new();
            for (i, (key, net)) in plan.iter().enumerate() {
                match rt.add(NETWORKS[*net], &key.1, &args).await {
                    Ok(addrs) => adds.push((key.clone(), Ok((addrs, Instant::now())))),
                    Err(e) => {
                        adds.push((key.clone(), Err(e.error_text())));
                        // The spec: a DEL follows a failed ADD; the sandbox goes, so the others too.
                        for (k, n) in plan[..=i].iter().rev() {
                            let r = rt.del(NETWORKS[*n], &k.1, &args).await;
                            dels.push((k.clone(), r.map_err(|e| e.error_text())));
                        }
                        break;
                    }
                }
            }
            JobResult::Started { pod, adds, dels }
        }
        Job::Del {
            pod,
            args,
            keys,
            end_pod,
        } => {
            let mut dels = Vec::new();
            for (k, n) in keys.iter().rev() {
                let r = rt.del(NETWORKS[*n], &k.1, &args).await;
                dels.push((k.clone(), r.map_err(|e| e.error_text())));
            }
            JobResult::Deleted { pod, dels, end_pod }
        }
    }
}

impl Soak {
    pub(super) fn pod_args(&self, pod: usize) -> PodArgs {
        let p = &self.model.pods[pod];
        PodArgs {
            container_id: p.container_id.clone(),
            namespace: p.namespace.clone(),
            name: p.name.clone(),
            uid: p.uid.clone(),
            netns: p.netns.clone(),
        }
    }

    /// This step's pod operations.
    pub(super) fn plan_batch(
        &mut self,
        step: u64,
        rng: &mut rand::rngs::StdRng,
    ) -> anyhow::Result<Vec<Job>> {
        let mut jobs = Vec::new();
        let mut busy: BTreeSet<usize> = BTreeSet::new();
        // Pods whose time is up (not while their netns is hidden: it cannot be removed then).
        let ending: Vec<usize> = (0..self.model.pods.len())
            .filter(|i| {
                let p = &self.model.pods[*i];
                p.phase == PodPhase::Running && p.end_step <= step && !self.host.is_hidden(p.rack)
            })
            .collect();
        for i in ending {
            let keys: Vec<(Key, usize)> = self.model.pods[i]
                .attachments
                .iter()
                .filter(|k| self.model.atts[*k].is_live())
                .map(|k| (k.clone(), self.model.atts[k].network))
                .collect();
            let dies = self.cfg.faults.contains(&FaultKind::PodDeath)
                && rng.random_bool(faults::DEATH_CHANCE);
            if dies {
                let netns = self.model.pods[i].netns.clone();
                self.host.delete_netns(&netns)?;
                self.end_pod(i);
                let late = rng.random_bool(0.5).then(|| step + rng.random_range(2..=8));
                for (k, _) in &keys {
                    let a = self.model.atts.get_mut(k).expect("listed");
                    a.state = AttState::Dead;
                    a.ended_step = Some(step);
                    a.late_del = late;
                }
                let cid = self.model.pods[i].container_id.clone();
                self.note_fault(
                    step,
                    FaultKind::PodDeath,
                    format!(
                        "pod {cid} died: netns removed without DEL{}",
                        late.map(|s| format!(", DEL at step {s}"))
                            .unwrap_or_default()
                    ),
                );
                continue;
            }
            busy.insert(i);
            jobs.push(Job::Del {
                pod: i,
                args: self.pod_args(i),
                keys,
                end_pod: true,
            });
        }
        // Late DELs of dead pods, retried DELs.
        let mut extra: BTreeMap<usize, Vec<(Key, usize)>> = BTreeMap::new();
        for a in self.model.atts.values() {
            let due = match a.state {
                AttState::Dead => a.late_del.is_some_and(|s| s <= step),
                AttState::DelFailed => true,
                _ => false,
            };
            if due && !busy.contains(&a.pod) {
                extra
                    .entry(a.pod)
                    .or_default()
                    .push((a.key.clone(), a.network));
            }
        }
        for (pod, keys) in extra {
            for (k, _) in &keys {
                self.model.atts.get_mut(k).expect("listed").late_del = None;
            }
            jobs.push(Job::Del {
                pod,
                args: self.pod_args(pod),
                keys,
                end_pod: false,
            });
        }
        // New pods.
        let live = self.model.live_pods();
        let n = if live < self.target_pods {
            rng.random_range(1..=4)
        } else {
            rng.random_range(0..=1)
        };
        let racks: Vec<usize> = (0..RACKS).filter(|r| !self.host.is_hidden(*r)).collect();
        for j in 0..n {
            let Some(&rack) = racks.choose(rng) else {
                break;
            };
            let nets: Vec<usize> = if self.cfg.networks == 1 {
                vec![0]
            } else {
                match rng.random_range(0.0..1.0) {
                    x if x < 0.45 => vec![0],
                    x if x < 0.80 => vec![1],
                    _ => vec![0, 1],
                }
            };
            let container_id = format!("c{step:05}x{j}s{}", self.cfg.seed);
            let netns = self.host.netns_path(rack, &container_id);
            self.host.create_netns(&netns)?;
            let pod = self.model.pods.len();
            let choice = self
                .cluster
                .is_some()
                .then(|| super::profiles::Choice::draw(rng));
            let mut plan = Vec::new();
            for (slot, net) in nets.iter().enumerate() {
                let key = (container_id.clone(), IFNAMES[slot].to_owned());
                self.model.atts.insert(
                    key.clone(),
                    Attachment {
                        key: key.clone(),
                        network: *net,
                        pod,
                        state: AttState::Adding,
                        ip: None,
                        ip6: None,
                        added_step: step,
                        added_at: None,
                        ended_step: None,
                        oob: None,
                        lost_reported: false,
                        collected: None,
                        late_del: None,
                        record_lost_hidden: None,
                    },
                );
                plan.push((key, *net));
            }
            let (name, uid) = (
                format!("pod-{step}-{j}"),
                format!("uid-{step}-{j}-{}", self.cfg.seed),
            );
            let namespace = choice.map_or(super::profiles::PLAIN_NAMESPACE, |c| c.namespace());
            // The kubelet runs a sandbox only for a pod the API server has bound to the node.
            if let (Some(c), Some(choice)) = (&self.cluster, choice) {
                c.put_pod(choice, &name, &uid);
            }
            self.model.pods.push(Pod {
                name,
                uid,
                namespace: namespace.to_owned(),
                choice,
                container_id,
                rack,
                netns,
                attachments: plan.iter().map(|(k, _)| k.clone()).collect(),
                end_step: step + rng.random_range(2..=30),
                phase: PodPhase::Running,
            });
            self.counts.pods += 1;
            jobs.push(Job::Start {
                pod,
                args: self.pod_args(pod),
                plan,
            });
        }
        Ok(jobs)
    }

    pub(super) fn record_del(
        &mut self,
        step: u64,
        key: &Key,
        r: &Result<(), String>,
        after: AttState,
    ) {
        let a = self.model.atts.get_mut(key).expect("known");
        match r {
            Ok(()) => {
                self.counts.dels_ok += 1;
                a.state = after;
                a.ended_step.get_or_insert(step);
            }
            Err(e) => {
                self.counts.dels_failed += 1;
                a.state = AttState::DelFailed;
                let text = format!(
                    "DEL {}/{} failed ({e}); the spec wants DEL to succeed whatever the daemon's state",
                    key.0, key.1
                );
                self.violation(step, "del-failed", format!("{}/{}", key.0, key.1), text);
            }
        }
    }

    pub(super) fn apply(&mut self, step: u64, r: JobResult) -> anyhow::Result<()> {
        match r {
            JobResult::Started { pod, adds, dels } => {
                let failed = adds.iter().any(|(_, r)| r.is_err());
                for (k, r) in &adds {
                    match r {
                        Ok((addrs, at)) => {
                            self.counts.adds_ok += 1;
                            self.added_on_network(step, k, addrs.v4);
                            self.ips_seen.extend(addrs.v4);
                            if let Some(v6) = addrs.v6 {
                                self.given_v6(step, v6, k);
                            }
                            let a = self.model.atts.get_mut(k).expect("known");
                            a.ip = addrs.v4;
                            a.ip6 = addrs.v6;
                            a.added_at = Some(*at);
                            a.state = AttState::Live;
                        }
                        Err(e) => {
                            self.counts.adds_failed += 1;
                            let code = e.split(' ').take(2).collect::<Vec<_>>().join(" ");
                            *self.counts.add_errors.entry(code).or_insert(0) += 1;
                            self.add_failed_on_network(step, k, e);
                            self.model.atts.get_mut(k).expect("known").state = AttState::AddFailed;
                        }
                    }
                }
                for (k, r) in &dels {
                    let after = if self.model.atts[k].state == AttState::AddFailed {
                        AttState::AddFailed
                    } else {
                        AttState::Deleted
                    };
                    self.record_del(step, k, r, after);
                }
                if failed {
                    // Attachments never tried (after the failed one) never existed.
                    let keys = self.model.pods[pod].attachments.clone();
                    for k in keys {
                        let a = self.model.atts.get_mut(&k).expect("known");
                        if a.state == AttState::Adding {
                            a.state = AttState::AddFailed;
                            a.ended_step = Some(step);
                        }
                    }
                    let netns = self.model.pods[pod].netns.clone();
                    self.host.delete_netns(&netns)?;
                    self.end_pod(pod);
                }
            }
            JobResult::Deleted { pod, dels, end_pod } => {
                for (k, r) in &dels {
                    self.record_del(step, k, r, AttState::Deleted);
                }
                if end_pod {
                    let netns = self.model.pods[pod].netns.clone();
                    self.host.delete_netns(&netns)?;
                    self.end_pod(pod);
                }
            }
        }
        self.counts.distinct_ips = self.ips_seen.len();
        self.counts.distinct_ipv6 = self.model.v6_given.len();
        Ok(())
    }

    /// The pod ended: its netns is gone; in the network-profiles mode it goes from the API server.
    fn end_pod(&mut self, pod: usize) {
        let p = &mut self.model.pods[pod];
        p.phase = PodPhase::Ended;
        if let Some(c) = &self.cluster {
            c.delete_pod(&p.namespace, &p.name);
        }
    }

    /// Network-profiles mode: an ADD gave `key` the IPv4 `ip`. No IP of one network (a profile, or
    /// the default network) ever goes to a pod of another, over the whole run, restarts and a lost
    /// state file included: each network has its own subnets, so EC2 never moves an address across.
    fn added_on_network(&mut self, step: u64, key: &Key, ip: Option<std::net::Ipv4Addr>) {
        if self.cluster.is_none() {
            return;
        }
        let profile = self
            .model
            .profile_of(&self.model.atts[key])
            .map(str::to_owned);
        *self
            .counts
            .network_adds_ok
            .entry(profile.clone().unwrap_or_else(|| "default".into()))
            .or_insert(0) += 1;
        if profile.as_deref() == Some(super::profiles::MISSING) {
            self.violation(
                step,
                "profile-refusal",
                format!("{}/{}", key.0, key.1),
                format!(
                    "ADD gave {}/{} {ip:?}, though its pod names the profile {}, which no \
                     NetworkProfile defines: it must be refused with CNI error 11 naming it",
                    key.0,
                    key.1,
                    super::profiles::MISSING
                ),
            );
        }
        let Some(ip) = ip else { return };
        let (first, first_key) = self
            .model
            .ip_network
            .entry(ip)
            .or_insert_with(|| (profile.clone(), key.clone()))
            .clone();
        if first != profile {
            let name = |p: &Option<String>| {
                p.as_deref()
                    .map_or("the default network".to_owned(), |p| format!("profile {p}"))
            };
            self.violation(
                step,
                "profile-ip-crossed",
                format!("{ip} {}/{}", key.0, key.1),
                format!(
                    "ADD gave {}/{} (a pod of {}) the IP {ip}, which {}/{} (a pod of {}) had before: \
                     no IP of one network is ever handed to a pod of another",
                    key.0,
                    key.1,
                    name(&profile),
                    first_key.0,
                    first_key.1,
                    name(&first)
                ),
            );
        }
    }

    /// Network-profiles mode: an ADD of `key` failed with `e` (`code N message`). A refusal for a
    /// profile (the daemon's `network profile <name> cannot serve this pod: ...`) is CNI error 11,
    /// names the pod's own profile, and never comes to a pod of the default network; the rest
    /// (daemon killed or unreachable, EC2 failing) is counted.
    fn add_failed_on_network(&mut self, step: u64, key: &Key, e: &str) {
        if self.cluster.is_none() {
            return;
        }
        let profile = self.model.profile_of(&self.model.atts[key]);
        let refusal = e.contains("network profile");
        let code11 = e.starts_with("code 11 ");
        let subject = format!("{}/{}", key.0, key.1);
        match profile {
            None if refusal => self.violation(
                step,
                "profile-refusal",
                subject.clone(),
                format!(
                    "{subject}, a pod of the default network, was refused for a network profile: {e}"
                ),
            ),
            None => {}
            Some(p) if refusal && code11 && names(e, p) => {
                *self.counts.profile_refusals.entry(p.into()).or_insert(0) += 1;
            }
            Some(p) if refusal => self.violation(
                step,
                "profile-refusal",
                subject.clone(),
                format!(
                    "{subject}, a pod of profile {p}, was refused{}{}: {e}",
                    if code11 { "" } else { " not as CNI error 11" },
                    if names(e, p) {
                        ""
                    } else {
                        ", the message not naming its profile"
                    }
                ),
            ),
            // The missing profile's refusal, in whatever words: error 11, naming it.
            Some(p) if p == super::profiles::MISSING && names(e, p) => {
                if code11 {
                    *self.counts.profile_refusals.entry(p.into()).or_insert(0) += 1;
                } else {
                    self.violation(
                        step,
                        "profile-refusal",
                        subject.clone(),
                        format!(
                            "{subject}, whose pod names the missing profile {p}, was refused not as \
                             CNI error 11: {e}"
                        ),
                    );
                }
            }
            Some(p) => {
                *self.counts.profile_other_failures.entry(p.into()).or_insert(0) += 1;
                self.note(format!("a {p} pod's ADD failed otherwise: {e}"));
            }
        }
    }

    /// An ADD gave `key` the IPv6 `ip`: the /80's contract is that no other attachment ever had it.
    fn given_v6(&mut self, step: u64, ip: std::net::Ipv6Addr, key: &Key) {
        let first = self
            .model
            .v6_given
            .entry(ip)
            .or_insert_with(|| key.clone())
            .clone();
        if &first != key {
            let state =
                super::findings::describe_att(&self.model.atts[&first], &self.network_names);
            self.violation(
                step,
                "ipv6-reissued",
                format!("{ip} {}/{}", key.0, key.1),
                format!(
                    "ADD gave {}/{} the IPv6 {ip}, which {}/{} had first ({state}): an address of the \
                     /80 is never handed out twice",
                    key.0, key.1, first.0, first.1
                ),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::names;

    #[test]
    fn a_refusal_names_a_profile_as_a_word() {
        let e = "code 11 eniipamd: Resource exhausted: network profile db cannot serve this pod: its 1 ENIs are full";
        assert!(names(e, "db"));
        assert!(!names(e, "app"));
        assert!(!names("network profile dbx cannot serve this pod", "db"));
        assert!(names("network profile \"team.a-1\" cannot", "team.a-1"));
    }
}
