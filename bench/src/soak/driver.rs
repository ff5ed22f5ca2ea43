//! The soak's driver: the step loop, restarts, GC, the checks and the end (the run's state,
//! [`Soak`], is the parent's).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::Context;
use mockcloud::Throttling;
use rand::Rng as _;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::checker;
use super::daemon::StartError;
use super::faults::{self, FaultKind, step_rng};
use super::findings::{Found, Rules};
use super::model::{AttState, Key};
use super::pods::{Job, run_job};
use super::witnesses::Witnesses;
use super::{BASE_IMDS_LAG, Budget, GC_CHANCE, NETWORKS, READY_DEADLINE, Soak, Violation};

impl Soak {
    pub(super) async fn drive(&mut self, started: Instant) -> anyhow::Result<()> {
        self.daemon.spawn()?;
        match self.daemon.wait_ready(READY_DEADLINE).await {
            Ok(()) => {}
            Err(e) => anyhow::bail!(
                "eniipamd did not start: {e:?}; log: {}",
                self.daemon.log_tail(10)
            ),
        }
        let pool = self.pool().await.context("the first Pool call")?;
        self.capacity = pool.capacity;
        let per_pod = if self.cfg.networks == 2 { 1.2 } else { 1.0 };
        // Pods as the kubelet would place them: its max-pods (the secondary-IP count) bounds a
        // node's pods whatever its addresses, and with `/28`s in the slots (burst prefixes) the
        // capacity is 16 times that.
        let pods_room =
            eniipam_limits::lookup(&self.cfg.instance_type).map_or(pool.capacity, |t| {
                pool.capacity.min(
                    t.max_pods()
                        .saturating_sub(eniipam_limits::HOST_NETWORK_PODS),
                )
            });
        self.target_pods = ((pods_room as f64 * 0.55) / per_pod).max(4.0) as usize;
        if self.cluster.is_some() {
            self.target_pods = self.target_pods.min(super::PROFILES_TARGET_POD_COUNT);
        }
        if self.cfg.progress {
            eprintln!(
                "soak {}: seed {}, {} ({} pod IPs), {} network(s), target {} live pods, faults: {}",
                self.cfg.tag(),
                self.cfg.seed,
                self.cfg.instance_type,
                pool.capacity,
                self.cfg.networks,
                self.target_pods,
                self.cfg
                    .faults
                    .iter()
                    .map(|k| k.name())
                    .collect::<Vec<_>>()
                    .join(",")
            );
        }
        let mut step = 0u64;
        loop {
            let done = match self.cfg.budget {
                Budget::Steps(n) => step >= n,
                Budget::Time(d) => started.elapsed() >= d,
            };
            if done {
                break;
            }
            self.step(step).await?;
            self.counts.steps = step + 1;
            if self.cfg.progress && step % 25 == 24 {
                eprintln!(
                    "soak {}: step {} at {:.0} s: {} live pods, {} ADDs ok, {} failed, {} kills, {} violations",
                    self.cfg.tag(),
                    step + 1,
                    started.elapsed().as_secs_f64(),
                    self.model.live_pods(),
                    self.counts.adds_ok,
                    self.counts.adds_failed,
                    self.counts.kills,
                    self.violations.len()
                );
            }
            step += 1;
        }
        self.finish(step).await
    }

    pub(super) async fn pool(&self) -> anyhow::Result<eniipam_api::pb::PoolReply> {
        let ch = self.daemon.channel().context("the daemon is not ready")?;
        Ok(
            eniipam_api::pb::introspect_client::IntrospectClient::new(ch)
                .pool(eniipam_api::pb::PoolRequest {})
                .await?
                .into_inner(),
        )
    }

    pub(super) fn violation(
        &mut self,
        step: u64,
        kind: &'static str,
        subject: String,
        text: String,
    ) {
        if !self.reported.insert((kind, subject.clone())) {
            return;
        }
        let context = self
            .recent
            .iter()
            .filter(|(s, _)| s + 12 >= step)
            .map(|(s, t)| format!("step {s} {t}"))
            .collect::<Vec<_>>()
            .join("; ");
        let v = Violation {
            kind,
            subject,
            seed: self.cfg.seed,
            step,
            text,
            context,
        };
        if self.cfg.progress {
            eprintln!("VIOLATION (soak {}) {v}", self.cfg.tag());
        }
        self.violations.push(v);
    }

    pub(super) fn note_fault(&mut self, step: u64, kind: FaultKind, detail: String) {
        *self.counts.faults.entry(kind.name()).or_insert(0) += 1;
        self.recent.push_back((step, format!("{kind}: {detail}")));
        while self.recent.len() > 16 {
            self.recent.pop_front();
        }
    }

    /// Keeps the first note of each kind (`kind` is the text up to its first ':').
    pub(super) fn note(&mut self, text: String) {
        let kind = text.split(':').next().unwrap_or_default();
        if self.notes.len() < 20 && !self.notes.iter().any(|n| n.split(':').next() == Some(kind)) {
            self.notes.push(text);
        }
    }

    /// Starts the daemon when it is not running; checks a life that ended by itself.
    pub(super) async fn ensure_up(&mut self, step: u64) -> anyhow::Result<()> {
        if let Some(status) = self.daemon.exited() {
            let when = if self.host.disk_full() {
                " while the state disk was full"
            } else {
                ""
            };
            let tail = self.daemon.log_tail(4);
            self.violation(
                step,
                "daemon-exited",
                format!("life {}", self.daemon.lives()),
                format!("eniipamd exited by itself{when} ({status}); log: {tail}"),
            );
        }
        if self.daemon.is_running() && self.daemon.channel().is_some() {
            return Ok(());
        }
        if !self.daemon.is_running() {
            self.daemon.spawn()?;
        }
        match self.daemon.wait_ready(READY_DEADLINE).await {
            Ok(()) => {
                self.counts.restarts += 1;
            }
            Err(StartError::Exited(_)) if self.host.disk_full() => {
                self.counts.starts_failed_disk_full += 1;
                let last = self.daemon.log_tail(1);
                self.note(format!(
                    "eniipamd cannot start while its state disk is full (retried each step): {last}"
                ));
            }
            Err(e) => {
                let life = self.daemon.lives();
                self.violation(
                    step,
                    "daemon-down",
                    format!("life {life}"),
                    format!(
                        "eniipamd life {life} did not become ready: {e:?}; log: {}",
                        self.daemon.log_tail(4)
                    ),
                );
                self.daemon.kill().await;
            }
        }
        Ok(())
    }

    pub(super) async fn step(&mut self, step: u64) -> anyhow::Result<()> {
        let mut rng = step_rng(self.cfg.seed, step, 1);
        self.undo_due(step, false)?;
        self.ensure_up(step).await?;
        let planned = faults::planned(self.cfg.seed, step, &self.cfg.faults);
        let kill = planned.contains(&FaultKind::Kill) || std::mem::take(&mut self.kill_next);
        if let Some(c) = self.cluster.as_mut()
            && step > 0
            && step.is_multiple_of(super::profiles::SWITCH_EVERY)
        {
            let now = c.switch();
            self.counts.eniconfig_switches += 1;
            self.recent
                .push_back((step, format!("the node's ENIConfig switched to {now}")));
        }
        for k in planned.iter().filter(|k| **k != FaultKind::Kill) {
            self.apply_fault(step, *k).await?;
        }
        if rng.random_bool(GC_CHANCE) {
            let net = rng.random_range(0..self.cfg.networks);
            self.gc(step, net).await;
        }
        let jobs = self.plan_batch(step, &mut rng)?;
        let mut set = JoinSet::new();
        for job in jobs {
            set.spawn(run_job(self.runtime.clone(), job));
        }
        if kill {
            let offset = Duration::from_millis(rng.random_range(0..300));
            tokio::time::sleep(offset).await;
            self.daemon.kill().await;
            self.counts.kills += 1;
            self.note_fault(
                step,
                FaultKind::Kill,
                format!("SIGKILL {} ms into the batch", offset.as_millis()),
            );
        }
        while let Some(r) = set.join_next().await {
            let r = r.context("a pod job panicked")?;
            self.apply(step, r)?;
        }
        self.ensure_up(step).await?;
        self.counts.peak_live_pods = self.counts.peak_live_pods.max(self.model.live_pods());
        self.check(step, false).await;
        Ok(())
    }

    pub(super) async fn gc(&mut self, step: u64, net: usize) {
        if self.daemon.channel().is_none() {
            return;
        }
        let valid = self.model.valid_attachments(net);
        match self.runtime.gc(NETWORKS[net], &valid).await {
            Ok(()) => {
                self.counts.gcs_ok += 1;
                for a in self.model.atts.values_mut() {
                    if a.network == net
                        && !a.is_live()
                        && a.state != AttState::Adding
                        && a.collected.is_none()
                    {
                        a.collected = Some(step);
                    }
                }
                self.recent.push_back((
                    step,
                    format!(
                        "GC of {} listing {} live attachments",
                        NETWORKS[net],
                        valid.len()
                    ),
                ));
            }
            Err(e) => {
                self.counts.gcs_failed += 1;
                self.note(format!(
                    "a GC of {} failed: {}",
                    NETWORKS[net],
                    e.error_text()
                ));
            }
        }
    }

    /// Attachments the pool is asked about: all in the final check, else the live, the dead and
    /// those that ended or were collected lately.
    pub(super) fn tracked(&self, step: u64, all: bool) -> BTreeSet<Key> {
        self.model
            .atts
            .values()
            .filter(|a| {
                all || a.is_live()
                    || matches!(a.state, AttState::Dead | AttState::DelFailed)
                    || a.ended_step.is_some_and(|s| s + 20 >= step)
                    || a.collected.is_some_and(|s| s + 5 >= step)
            })
            .map(|a| a.key.clone())
            .collect()
    }

    pub(super) async fn check(&mut self, step: u64, all: bool) {
        self.iam_check(step);
        let Some(channel) = self.daemon.channel() else {
            self.counts.checks_skipped += 1;
            return;
        };
        let tracked = self.tracked(step, all);
        let store_path = self.host.state_files()[0].clone();
        let rules = Rules {
            grace: self.grace,
            oob_window: self.grace,
            network_names: self.network_names.clone(),
            family: self.cfg.ip_family,
            profiles: self.cluster.as_ref().map(|c| c.world.clone()),
        };
        let witnesses = Witnesses {
            channel,
            store_path: &store_path,
            mock: &self.mock,
            instance_id: &self.instance_id,
            cache_dir: &self.host.cache_dir,
            networks: &self.network_names,
        };
        let obs = match witnesses.observe(&tracked).await {
            Ok(o) => o,
            Err(e) => {
                self.counts.checks_skipped += 1;
                self.note(format!("a check was skipped: {e:#}"));
                return;
            }
        };
        // An ENI detached out of band still takes IPs (EC2 assigns to a detached ENI): whatever
        // lands on it later was never the instance's either.
        for e in self.model.oob.iter_mut() {
            if let Some(eni) = &e.eni {
                e.ips.extend(
                    obs.ec2
                        .all_ip_eni
                        .iter()
                        .filter(|(_, on)| *on == eni)
                        .map(|(ip, _)| *ip),
                );
            }
        }
        if self.cluster.is_some() {
            for eni in obs.ec2.secondary_enis.keys() {
                let net = obs
                    .ec2
                    .eni_meta
                    .get(eni)
                    .and_then(|m| m.network.clone())
                    .unwrap_or_else(|| "default".into());
                self.network_enis
                    .entry(net)
                    .or_default()
                    .insert(eni.clone());
            }
            self.counts.network_enis = self
                .network_enis
                .iter()
                .map(|(k, v)| (k.clone(), v.len()))
                .collect();
        }
        let default_enis = default_network_enis(&obs.ec2);
        let mut ev = checker::evaluate(&obs, &self.model, &mut self.checker, &rules);
        // Findings that may be a moment between two writes count only if they persist.
        let mut settle: Vec<Found> = ev.found.iter().filter(|f| f.settle).cloned().collect();
        for _ in 0..4 {
            if settle.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
            let Ok(obs) = witnesses.observe(&tracked).await else {
                settle.clear();
                break;
            };
            let again = checker::evaluate(&obs, &self.model, &mut self.checker, &rules);
            settle.retain(|f| {
                again
                    .found
                    .iter()
                    .any(|g| g.kind == f.kind && g.subject == f.subject)
            });
            ev.reported_lost = again.reported_lost;
        }
        self.counts.checks += 1;
        for k in &ev.reported_lost {
            if let Some(a) = self.model.atts.get_mut(k) {
                a.lost_reported = true;
            }
        }
        let found: Vec<Found> = ev
            .found
            .into_iter()
            .filter(|f| !f.settle)
            .chain(settle)
            .collect();
        for f in found {
            self.violation(step, f.kind, f.subject, f.text);
        }
        self.check_promised(step, default_enis);
    }

    /// Network-profiles mode: the node advertises each profile's total slots as an extended
    /// resource (`eniipam.io/network-<profile>`, a count) in its capacity.
    fn check_advertised(&mut self, step: u64) {
        let Some(c) = &self.cluster else { return };
        let advertised = match c.advertised() {
            Ok(a) => a,
            Err(e) => {
                self.violation(
                    step,
                    "profile-not-advertised",
                    "node".into(),
                    format!("{e:#}"),
                );
                return;
            }
        };
        let profiles: Vec<String> = c.world.profiles.keys().cloned().collect();
        for p in profiles {
            let name = format!("eniipam.io/network-{p}");
            match advertised.get(&name) {
                Some(v) if v.parse::<u32>().is_ok() => {}
                other => self.violation(
                    step,
                    "profile-not-advertised",
                    p.clone(),
                    format!(
                        "at the end the node's capacity has {name} = {other:?}, not a count of \
                         slots (all: {advertised:?})"
                    ),
                ),
            }
        }
    }

    /// Network-profiles mode (issue 44, case 2): the totals the node advertises for its profiles
    /// never promise more than it can still create: their sum is at most the room of every ENI
    /// slot the default network's ENIs (per EC2) leave. The advertiser follows the pool within a
    /// second, so a breach counts only when the next check still sees one.
    fn check_promised(&mut self, step: u64, default_enis: u32) {
        let Some(c) = &self.cluster else { return };
        let Ok(advertised) = c.advertised() else {
            return;
        };
        let Some(it) = mockcloud::catalog::lookup(&self.cfg.instance_type) else {
            return;
        };
        // The soak runs without prefix delegation: an ENI holds ipv4_per_eni − 1 pod addresses.
        let per_eni = it.ipv4_per_eni - 1;
        let room = it.max_enis.saturating_sub(1 + default_enis) * per_eni;
        let promised: u32 = advertised
            .values()
            .filter_map(|v| v.parse::<u32>().ok())
            .sum();
        if promised <= room {
            self.promised_breach = None;
            return;
        }
        let text = format!(
            "the node advertises {promised} profile slots ({advertised:?}) but its ENI slots left \
             by the default network's {default_enis} ENIs hold {room}"
        );
        if let Some((first, _)) = self.promised_breach.take() {
            self.violation(
                step,
                "profiles-overcommitted",
                "node".into(),
                format!("{text} (since step {first})"),
            );
        } else {
            self.promised_breach = Some((step, text));
        }
    }

    /// The end: every fault undone, the out-of-band changes given time to be noticed (until the
    /// daemon has caught up, at most their grace period: [`super::caught_up`]), a GC of every
    /// network, then a check of every attachment ever made.
    pub(super) async fn finish(&mut self, step: u64) -> anyhow::Result<()> {
        self.undo_due(step, true)?;
        self.mock.clear_faults();
        self.mock.set_throttling(Throttling::default());
        self.mock.set_imds_lag(BASE_IMDS_LAG);
        for r in self.host.hidden_racks() {
            self.unhide(r)?;
        }
        self.host.free_disk()?;
        self.ensure_up(step).await?;
        // DELs still owed.
        let mut set = JoinSet::new();
        let mut owed: BTreeMap<usize, Vec<(Key, usize)>> = BTreeMap::new();
        for a in self.model.atts.values() {
            if a.state == AttState::DelFailed || (a.state == AttState::Dead && a.late_del.is_some())
            {
                owed.entry(a.pod)
                    .or_default()
                    .push((a.key.clone(), a.network));
            }
        }
        for (pod, keys) in owed {
            set.spawn(run_job(
                self.runtime.clone(),
                Job::Del {
                    pod,
                    args: self.pod_args(pod),
                    keys,
                    end_pod: false,
                },
            ));
        }
        while let Some(r) = set.join_next().await {
            self.apply(step, r.context("a pod job panicked")?)?;
        }
        // Out-of-band changes, and discrepancies the checker is timing, get their grace period.
        self.check(step, false).await;
        let until = [
            self.last_oob
                .map(|at| at + self.model.grace_after(at, self.grace)),
            self.checker.judged_by(self.grace),
        ]
        .into_iter()
        .flatten()
        .max();
        if let Some(until) = until {
            self.wait_caught_up(step, until + Duration::from_millis(100))
                .await;
        }
        self.ensure_up(step).await?;
        for net in 0..self.cfg.networks {
            self.gc(step, net).await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        self.check(step, true).await;
        self.check_advertised(step);
        if self.cfg.progress {
            eprintln!(
                "soak {}: finished after {step} steps: {} live pods, {} violations",
                self.cfg.tag(),
                self.model.live_pods(),
                self.violations.len()
            );
        }
        Ok(())
    }
}

/// The default network's secondary ENIs EC2 shows attached (no network tag).
fn default_network_enis(ec2: &super::witnesses::Ec2View) -> u32 {
    ec2.secondary_enis
        .keys()
        .filter(|e| ec2.eni_meta.get(*e).is_none_or(|m| m.network.is_none()))
        .count() as u32
}
