//! Injecting the soak's faults into mockcloud, the host and the daemon, and undoing them.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::time::Duration;

use anyhow::Context;
use mockcloud::{Fault, Throttling};
use rand::Rng as _;
use rand::seq::{IndexedRandom as _, SliceRandom as _};
use tokio::time::Instant;

use super::Soak;
use super::faults::{FaultKind, step_rng};
use super::host::RACKS;
use super::model::{Key, OobEvent, OobMark, PodPhase};
use super::witnesses::Ec2View;
use super::{ACTIONS, BASE_IMDS_LAG, ERROR_CODES};

pub(super) enum Undo {
    ClearEc2Faults,
    Throttling,
    ImdsLag,
    Disk,
    Unhide(usize),
    IamRestore,
    /// A SIGKILL in the next batch: an out-of-band unassign's IPs reported lost by now, a restart
    /// must not take them back (issue 44 case 8: from the journal and the plugin's cache it did).
    Restart,
}

pub(super) struct PendingUndo {
    pub(super) due_step: u64,
    pub(super) not_before: Instant,
    pub(super) undo: Undo,
}

impl Soak {
    /// Undoes the faults whose time is up (all of them when `all`).
    pub(super) fn undo_due(&mut self, step: u64, all: bool) -> anyhow::Result<()> {
        let now = Instant::now();
        let (due, keep): (Vec<PendingUndo>, Vec<PendingUndo>) = std::mem::take(&mut self.undos)
            .into_iter()
            .partition(|u| all || (u.due_step <= step && u.not_before <= now));
        self.undos = keep;
        for u in due {
            match u.undo {
                Undo::ClearEc2Faults => {
                    self.mock.clear_faults();
                    self.model.recovered_from("ec2-error-rate");
                }
                Undo::Throttling => {
                    self.mock.set_throttling(Throttling::default());
                    self.model.recovered_from("throttle-burst");
                }
                Undo::ImdsLag => self.mock.set_imds_lag(BASE_IMDS_LAG),
                Undo::Disk => {
                    self.host.free_disk()?;
                    self.model.recovered_from("disk-full");
                }
                Undo::Unhide(r) => self.unhide(r)?,
                Undo::IamRestore => self.iam_restore(step),
                Undo::Restart => self.kill_next = true,
            }
        }
        Ok(())
    }

    pub(super) fn undo_later(&mut self, step: u64, steps: u64, min: Duration, undo: Undo) {
        self.undos.push(PendingUndo {
            due_step: step + steps,
            not_before: Instant::now() + min,
            undo,
        });
    }

    pub(super) async fn apply_fault(&mut self, step: u64, kind: FaultKind) -> anyhow::Result<()> {
        let mut rng = step_rng(self.cfg.seed, step, 2);
        let detail = match kind {
            FaultKind::Kill | FaultKind::PodDeath => return Ok(()),
            FaultKind::Ec2Error => {
                let action = *ACTIONS.choose(&mut rng).expect("not empty");
                let code = *ERROR_CODES.choose(&mut rng).expect("not empty");
                let count = rng.random_range(1..=4);
                self.mock.inject_fault(Fault::error(action, code, count));
                self.model.impeded_by("ec2-error", Some(Instant::now()));
                format!("next {count} {action} answer {code}")
            }
            FaultKind::Ec2ErrorRate => {
                let code = *ERROR_CODES.choose(&mut rng).expect("not empty");
                let p = rng.random_range(0.1..0.3);
                self.mock.inject_fault(Fault::rate(None, code, p));
                self.model.impeded_by("ec2-error-rate", None);
                let steps = rng.random_range(2..=5);
                self.undo_later(step, steps, Duration::ZERO, Undo::ClearEc2Faults);
                format!(
                    "{:.0} % of all EC2 calls answer {code} for {steps} steps",
                    p * 100.0
                )
            }
            FaultKind::Ec2Hang => {
                let action = *ACTIONS[..4]
                    .iter()
                    .chain(&ACTIONS[6..7])
                    .collect::<Vec<_>>()
                    .choose(&mut rng)
                    .expect("not empty");
                let ms = rng.random_range(1500..6000);
                let count = rng.random_range(1..=2);
                self.mock
                    .inject_fault(Fault::hang(action, Duration::from_millis(ms), count));
                self.model.impeded_by(
                    "ec2-hang",
                    Some(Instant::now() + Duration::from_millis(ms) * count),
                );
                format!("next {count} {action} hang {ms} ms, then fail")
            }
            FaultKind::Ec2SlowReply => {
                let action = *ACTIONS[..4].choose(&mut rng).expect("not empty");
                let ms = rng.random_range(1000..5000);
                let count = rng.random_range(1..=2);
                self.mock
                    .inject_fault(Fault::slow_reply(action, Duration::from_millis(ms), count));
                format!("next {count} {action} performed, reply held {ms} ms")
            }
            FaultKind::ThrottleBurst => {
                self.mock.set_throttling(Throttling::uniform(
                    mockcloud::Bucket::new(4.0, 1.0),
                    mockcloud::Bucket::new(6.0, 2.0),
                ));
                self.model.impeded_by("throttle-burst", None);
                let steps = rng.random_range(3..=7);
                self.undo_later(step, steps, Duration::ZERO, Undo::Throttling);
                format!("every API's bucket 4 + 1/s mutating, 6 + 2/s describe for {steps} steps")
            }
            FaultKind::IamRevoke => {
                let action = *super::iam::REVOCABLE.choose(&mut rng).expect("not empty");
                self.iam_revoke(step, action);
                let steps = rng.random_range(2..=5);
                self.undo_later(step, steps, Duration::ZERO, Undo::IamRestore);
                format!("the IAM policy loses ec2:{action} for {steps} steps")
            }
            FaultKind::ImdsLag => {
                let ms = rng.random_range(1500..5000);
                self.mock.set_imds_lag(Duration::from_millis(ms));
                let steps = rng.random_range(3..=7);
                self.undo_later(step, steps, Duration::ZERO, Undo::ImdsLag);
                format!("IMDS lags EC2 by {ms} ms for {steps} steps")
            }
            FaultKind::OobUnassign => match self.oob_unassign(step, &mut rng)? {
                Some(d) => d,
                None => return Ok(()),
            },
            FaultKind::OobDetach => match self.oob_detach(step, &mut rng)? {
                Some(d) => d,
                None => return Ok(()),
            },
            FaultKind::OobPrefixUnassign => match self.oob_prefix_unassign(step)? {
                Some(d) => d,
                None => return Ok(()),
            },
            FaultKind::StateFileRemoved => {
                self.daemon.kill().await;
                self.counts.kills += 1;
                // Half the time the loss meets invisible evidence: one rack's netns hidden across
                // the restart, so the daemon can tell neither who holds those IPs nor that they are free.
                let hidden = if rng.random_bool(0.5) {
                    match self.busiest_visible_rack() {
                        Some(rack) => {
                            self.hide(rack)?;
                            let steps = rng.random_range(6..=10);
                            self.undo_later(
                                step,
                                steps,
                                Duration::from_secs(8),
                                Undo::Unhide(rack),
                            );
                            let pods: Vec<usize> = (0..self.model.pods.len())
                                .filter(|p| {
                                    self.model.pods[*p].rack == rack
                                        && self.model.pods[*p].phase == PodPhase::Running
                                })
                                .collect();
                            for p in &pods {
                                for k in self.model.pods[*p].attachments.clone() {
                                    let a = self.model.atts.get_mut(&k).expect("known");
                                    if a.is_live() {
                                        a.record_lost_hidden = Some(rack);
                                    }
                                }
                            }
                            format!(
                                ", rack {rack} ({} live pods) hidden across the restart for ≥ {steps} steps and 8 s",
                                pods.len()
                            )
                        }
                        None => String::new(),
                    }
                } else {
                    String::new()
                };
                for f in self.host.state_files() {
                    match std::fs::remove_file(&f) {
                        Ok(()) => {}
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                        Err(e) => {
                            return Err(e).with_context(|| format!("removing {}", f.display()));
                        }
                    }
                }
                self.note_fault(
                    step,
                    kind,
                    format!("SIGKILL, state.db + WAL + SHM removed{hidden}, restart"),
                );
                self.ensure_up(step).await?;
                return Ok(());
            }
            FaultKind::DiskFull => {
                // A clean stop checkpoints the WAL away, so the next life's writes need new blocks.
                self.daemon.stop().await;
                self.ensure_up(step).await?;
                let ballast = self.host.fill_disk()?;
                // Reporting an out-of-band loss is a write, and a daemon that cannot write cannot
                // report it (nor start, once killed): its time to notice runs on after the disk is
                // freed, as after EC2's own impediments.
                self.model.impeded_by("disk-full", None);
                let steps = rng.random_range(6..=10);
                self.undo_later(step, steps, Duration::from_secs(4), Undo::Disk);
                format!(
                    "clean restart, then the state tmpfs filled ({} KiB ballast) for {steps} steps",
                    ballast / 1024
                )
            }
            FaultKind::NetnsHidden => {
                let Some(rack) = self.busiest_visible_rack() else {
                    return Ok(());
                };
                let pods = self
                    .model
                    .pods
                    .iter()
                    .filter(|p| p.rack == rack && p.phase == PodPhase::Running)
                    .count();
                self.hide(rack)?;
                let steps = rng.random_range(6..=10);
                self.undo_later(step, steps, Duration::from_secs(8), Undo::Unhide(rack));
                let restart = rng.random_bool(0.5);
                let detail = format!(
                    "rack {rack} ({pods} live pods) hidden: its netns directory gone for ≥ {steps} steps and 8 s{}",
                    if restart {
                        ", SIGKILL + restart while hidden"
                    } else {
                        ""
                    }
                );
                if restart {
                    self.note_fault(step, kind, detail);
                    self.daemon.kill().await;
                    self.counts.kills += 1;
                    self.ensure_up(step).await?;
                    return Ok(());
                }
                detail
            }
        };
        self.note_fault(step, kind, detail);
        Ok(())
    }

    /// The visible rack with the most live pods, unless half the racks are hidden already (pods
    /// keep coming and going in the others).
    pub(super) fn busiest_visible_rack(&self) -> Option<usize> {
        let visible: Vec<usize> = (0..RACKS).filter(|r| !self.host.is_hidden(*r)).collect();
        if visible.len() <= RACKS / 2 {
            return None;
        }
        visible.into_iter().max_by_key(|r| {
            self.model
                .pods
                .iter()
                .filter(|p| p.rack == *r && p.phase == PodPhase::Running)
                .count()
        })
    }

    pub(super) fn hide(&mut self, rack: usize) -> anyhow::Result<()> {
        self.host.hide_rack(rack)?;
        self.model.hidden_racks.insert(rack);
        Ok(())
    }

    pub(super) fn unhide(&mut self, rack: usize) -> anyhow::Result<()> {
        self.host.unhide_rack(rack)?;
        if self.model.hidden_racks.remove(&rack) {
            self.model.rack_shown_at.insert(rack, Instant::now());
        }
        Ok(())
    }

    pub(super) fn oob_unassign(
        &mut self,
        step: u64,
        rng: &mut rand::rngs::StdRng,
    ) -> anyhow::Result<Option<String>> {
        let ec2 = Ec2View::read(&self.mock, &self.instance_id)?;
        // One attachment per IP: when the daemon gave an IP to two pods (a violation of its own),
        // the IP is taken once.
        let mut by_ip: BTreeMap<Ipv4Addr, Key> = BTreeMap::new();
        for a in self.model.live() {
            if let Some(ip) =
                a.ip.filter(|ip| a.oob.is_none() && ec2.ip_eni.contains_key(ip))
            {
                by_ip.entry(ip).or_insert_with(|| a.key.clone());
            }
        }
        let candidates: Vec<Key> = by_ip.into_values().collect();
        let n = rng.random_range(1..=2).min(candidates.len());
        if n == 0 {
            return Ok(None);
        }
        let now = Instant::now();
        let mut done = Vec::new();
        let mut ips = BTreeSet::new();
        let mut prefixes_gone = BTreeSet::new();
        for k in candidates.choose_multiple(rng, n) {
            let ip = self.model.atts[k].ip.expect("filtered");
            let eni = ec2.ip_eni[&ip].clone();
            if let Some((_, prefix)) = ec2.prefix_of.get(&ip) {
                // An address of a /28 goes back with its whole prefix (EC2 unassigns a prefix
                // only whole): every pod holding one of its addresses loses it.
                if prefixes_gone.insert(*prefix) {
                    self.mock
                        .with_world(|w, at| w.unassign_ipv4_prefixes(&eni, &[*prefix], at))
                        .map_err(|e| {
                            anyhow::anyhow!("out-of-band unassign of {prefix} from {eni}: {e}")
                        })?;
                    ips.extend(prefix.hosts().chain([prefix.network(), prefix.broadcast()]));
                    done.push(format!(
                        "{prefix} (with {ip} of {}/{}) from {eni}",
                        k.0, k.1
                    ));
                }
                continue;
            }
            self.mock
                .with_world(|w, at| w.unassign_private_ip_addresses(&eni, &[ip], at))
                .map_err(|e| anyhow::anyhow!("out-of-band unassign of {ip} from {eni}: {e}"))?;
            ips.insert(ip);
            done.push(format!("{ip} of {}/{} from {eni}", k.0, k.1));
        }
        let what = format!("unassigned {}", done.join(", "));
        self.record_oob(step, now, ips, None, &what);
        // Once the running reconcile has had its time to report them lost, a restart.
        self.undo_later(step, 1, self.grace, Undo::Restart);
        Ok(Some(what))
    }

    pub(super) fn oob_detach(
        &mut self,
        step: u64,
        rng: &mut rand::rngs::StdRng,
    ) -> anyhow::Result<Option<String>> {
        let ec2 = Ec2View::read(&self.mock, &self.instance_id)?;
        let live_ips: BTreeSet<Ipv4Addr> = self.model.live().filter_map(|a| a.ip).collect();
        let mut enis: Vec<(&String, &(String, Vec<Ipv4Addr>))> =
            ec2.secondary_enis.iter().collect();
        if enis.is_empty() {
            return Ok(None);
        }
        enis.shuffle(rng);
        let (eni, (att_id, ips)) = enis
            .into_iter()
            .max_by_key(|(_, (_, ips))| ips.iter().filter(|ip| live_ips.contains(ip)).count())
            .expect("not empty");
        let (eni, att_id, ips) = (eni.clone(), att_id.clone(), ips.clone());
        let now = Instant::now();
        self.mock
            .with_world(|w, at| w.detach_network_interface(&att_id, false, at))
            .map_err(|e| anyhow::anyhow!("out-of-band detach of {eni}: {e}"))?;
        let ips: BTreeSet<Ipv4Addr> = ips.into_iter().collect();
        let hit = ips.iter().filter(|ip| live_ips.contains(ip)).count();
        let what = format!(
            "detached {eni} ({} secondary IPs, {hit} held by live pods)",
            ips.len()
        );
        self.record_oob(step, now, ips, Some(eni.clone()), &what);
        Ok(Some(what))
    }

    /// The node's /80 unassigned from eth0 through EC2 (`UnassignIpv6Addresses` with `Ipv6Prefix`).
    pub(super) fn oob_prefix_unassign(&mut self, step: u64) -> anyhow::Result<Option<String>> {
        let inst = self
            .mock
            .instance(&self.instance_id)
            .context("the instance is gone from mockcloud")?;
        let Some((eni, prefix)) = inst
            .enis
            .iter()
            .filter(|e| e.attachment.as_ref().is_some_and(|a| a.device_index == 0))
            .find_map(|e| e.ipv6_prefixes.first().map(|p| (e.id.clone(), *p)))
        else {
            return Ok(None);
        };
        let now = Instant::now();
        self.mock
            .with_world(|w, at| w.unassign_ipv6(&eni, &[], &[prefix], at))
            .map_err(|e| anyhow::anyhow!("out-of-band unassign of {prefix} from {eni}: {e}"))?;
        self.model.prefix_taken.push((step, now, prefix));
        self.last_oob = Some(now);
        let live = self.model.live().filter(|a| a.ip6.is_some()).count();
        Ok(Some(format!(
            "unassigned the /80 {prefix} from eth0 ({eni}; {live} live attachments hold addresses of it)"
        )))
    }

    /// An out-of-band change took `ips` (and detached `eni`): the live attachments holding them are
    /// marked, and the event is kept for the checker.
    fn record_oob(
        &mut self,
        step: u64,
        now: Instant,
        ips: BTreeSet<Ipv4Addr>,
        eni: Option<String>,
        what: &str,
    ) {
        for a in self.model.atts.values_mut() {
            if a.is_live() && a.ip.is_some_and(|ip| ips.contains(&ip)) {
                a.oob = Some(OobMark {
                    step,
                    at: now,
                    what: what.to_owned(),
                });
            }
        }
        self.model.oob.push(OobEvent {
            step,
            at: now,
            ips,
            eni,
            what: what.to_owned(),
        });
        self.last_oob = Some(now);
    }
}
