//! One actor per attached ENI: the [`EniHandle`] (cloneable, a bounded mpsc sender: the ENI's
//! *ipBacklog*) and the task that owns every cloud call for that ENI.
//!
//! The task waits for a command, then keeps collecting for `batch_window` (the coalescing window),
//! and makes ONE `AssignPrivateIpAddresses` for every pod and warm-up request of the batch and ONE
//! `UnassignPrivateIpAddresses` for every give-back. Replies go back on the commands' oneshot
//! senders; a failed call is answered to every waiter of the batch and moves the ENI into
//! [`EniPhase::BackingOff`]. Commands carry the caller's tracing span and enqueue time, so a slow
//! batch shows up in the trace of each pod that waited on it.
//!
//! The actor sets each call's [`Purpose`]: an assign batch with a pod in it is `Pod`, one of
//! warm-ups only `Refill`; unassign and release are `GiveBack` (they yield to pod-driven calls
//! while EC2 throttles the node, see [`crate::cloud::limiter`]).

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{Instrument, Span};

use std::collections::BTreeSet;

use ipnet::Ipv4Net;

use super::state::AssignPlan;
use super::{Allocation, AttachmentMeta, PoolError, Shared};
use crate::cloud::{ADDRESS_IN_USE, CloudError, EniFilter, Purpose, with_purpose};
use crate::model::{AttachmentKey, EniId, PodRef};

/// How often the actor re-reads IMDS while waiting for freshly assigned IPs to show.
const IMDS_POLL: Duration = Duration::from_millis(100);

/// Where an ENI is in its life, as far as the pool is concerned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EniPhase {
    /// Takes requests.
    Serving,
    /// A call failed; no new work is routed here until `until`.
    BackingOff {
        until: Instant,
        /// Consecutive failures (the back-off doubles with each).
        failures: u32,
        last_error: CloudError,
    },
    /// Being detached and deleted; takes no work.
    Draining,
    /// EC2 did not show the ENI attached to this instance at the last look (or answered NotFound
    /// for it): takes no work and its idle IPs are held back, until EC2 confirms it (serving again)
    /// or misses it a second time (forgotten).
    Suspect { since: Instant },
}

impl EniPhase {
    /// Whether work may be routed to the ENI at `now` (a back-off that has run out counts as serving).
    pub fn accepts_work(&self, now: Instant) -> bool {
        match self {
            Self::Serving => true,
            Self::BackingOff { until, .. } => *until <= now,
            Self::Draining | Self::Suspect { .. } => false,
        }
    }

    /// Time left in a back-off at `now`.
    pub fn retry_in(&self, now: Instant) -> Option<Duration> {
        match self {
            Self::BackingOff { until, .. } if *until > now => Some(*until - now),
            _ => None,
        }
    }

    /// After a successful call.
    pub fn succeeded(&self) -> Self {
        match self {
            Self::Draining => Self::Draining,
            Self::Suspect { since } => Self::Suspect { since: *since },
            _ => Self::Serving,
        }
    }

    /// After a failed call at `now`, backing off for `backoff(failures)`.
    pub fn failed(
        &self,
        error: CloudError,
        now: Instant,
        backoff: impl Fn(u32) -> Duration,
    ) -> Self {
        if let Self::Suspect { since } = self {
            return Self::Suspect { since: *since };
        }
        let failures = match self {
            Self::BackingOff { failures, .. } => failures + 1,
            _ => 1,
        };
        Self::BackingOff {
            until: now + backoff(failures),
            failures,
            last_error: error,
        }
    }
}

/// A pod request for one new IP, as it travels to an ENI actor or waits for a new ENI.
pub(crate) struct Waiter {
    pub key: AttachmentKey,
    pub pod: PodRef,
    pub sticky_key: Option<String>,
    pub meta: AttachmentMeta,
    pub respond_to: oneshot::Sender<Result<Allocation, PoolError>>,
    pub span: Span,
    pub enqueued_at: Instant,
}

/// What an ENI actor is asked to do.
pub(crate) enum EniCommand {
    /// One IP for a pod.
    Assign(Waiter),
    /// `count` IPs for the idle pool.
    Warm {
        count: u32,
        respond_to: oneshot::Sender<Result<(), PoolError>>,
        span: Span,
        enqueued_at: Instant,
    },
    /// Give these idle IPs (and prefixes, every address of which is among `ips`) back to EC2.
    Unassign {
        ips: Vec<Ipv4Addr>,
        prefixes: Vec<Ipv4Net>,
        respond_to: oneshot::Sender<Result<(), PoolError>>,
        span: Span,
        enqueued_at: Instant,
    },
    /// Detach and delete the (empty) ENI, then stop.
    Release {
        respond_to: oneshot::Sender<Result<(), PoolError>>,
        span: Span,
    },
}

/// The cloneable handle of one ENI actor: its ipBacklog.
#[derive(Clone, Debug)]
pub(crate) struct EniHandle {
    tx: mpsc::Sender<EniCommand>,
}

impl EniHandle {
    /// Spawns the actor of ENI `eni` (MAC `mac`); it runs until every handle is dropped or it has
    /// deleted its ENI.
    pub(crate) fn spawn(shared: Arc<Shared>, eni: EniId, mac: String) -> (Self, JoinHandle<()>) {
        let (tx, rx) = mpsc::channel(shared.config.backlog_depth);
        let actor = EniActor {
            shared,
            eni,
            mac,
            rx,
        };
        let span = tracing::info_span!("eni_actor", eni = %actor.eni);
        let task = tokio::spawn(actor.run().instrument(span));
        (Self { tx }, task)
    }

    /// Queues a command (waits while the backlog is full); gives it back if the actor is gone.
    pub(crate) async fn send(&self, cmd: EniCommand) -> Result<(), EniCommand> {
        self.tx.send(cmd).await.map_err(|e| e.0)
    }
}

#[derive(PartialEq, Eq)]
enum Flow {
    Continue,
    Stop,
}

#[derive(Default)]
struct Batch {
    pods: Vec<Waiter>,
    warm: u32,
    warm_replies: Vec<oneshot::Sender<Result<(), PoolError>>>,
    unassign: Vec<Ipv4Addr>,
    unassign_prefixes: Vec<Ipv4Net>,
    unassign_replies: Vec<oneshot::Sender<Result<(), PoolError>>>,
    release: Option<oneshot::Sender<Result<(), PoolError>>>,
    oldest: Option<Instant>,
}

impl Batch {
    fn add(&mut self, cmd: EniCommand) {
        let enqueued = match cmd {
            EniCommand::Assign(w) => {
                let at = w.enqueued_at;
                self.pods.push(w);
                at
            }
            EniCommand::Warm {
                count,
                respond_to,
                enqueued_at,
                span,
            } => {
                tracing::debug!(parent: &span, count, "warm-up joins a batch");
                self.warm += count;
                self.warm_replies.push(respond_to);
                enqueued_at
            }
            EniCommand::Unassign {
                ips,
                prefixes,
                respond_to,
                enqueued_at,
                span,
            } => {
                tracing::debug!(parent: &span, count = ips.len(), "give-back joins a batch");
                self.unassign.extend(ips);
                self.unassign_prefixes.extend(prefixes);
                self.unassign_replies.push(respond_to);
                enqueued_at
            }
            EniCommand::Release { respond_to, span } => {
                tracing::debug!(parent: &span, "release queued");
                self.release = Some(respond_to);
                Instant::now()
            }
        };
        self.oldest = Some(self.oldest.map_or(enqueued, |o| o.min(enqueued)));
    }
}

struct EniActor {
    shared: Arc<Shared>,
    eni: EniId,
    mac: String,
    rx: mpsc::Receiver<EniCommand>,
}

impl EniActor {
    async fn run(mut self) {
        while let Some(first) = self.rx.recv().await {
            let mut batch = Batch::default();
            batch.add(first);
            let window = tokio::time::sleep(self.shared.config.batch_window);
            tokio::pin!(window);
            loop {
                tokio::select! {
                    biased;
                    cmd = self.rx.recv() => match cmd {
                        Some(cmd) => batch.add(cmd),
                        None => break,
                    },
                    () = &mut window => break,
                }
            }
            if self.handle(batch).await == Flow::Stop {
                break;
            }
        }
        self.abandon_rest();
        tracing::debug!("ENI actor stopped");
    }

    /// Answers whatever is still queued after the actor decided to stop.
    fn abandon_rest(&mut self) {
        self.rx.close();
        let mut rest = Batch::default();
        while let Ok(cmd) = self.rx.try_recv() {
            rest.add(cmd);
        }
        let mut st = self.shared.lock();
        st.reject_assign(&self.eni, rest.pods, rest.warm, PoolError::ShuttingDown);
        for r in rest.warm_replies.into_iter().chain(rest.unassign_replies) {
            let _ = r.send(Err(PoolError::ShuttingDown));
        }
        if !rest.unassign.is_empty() {
            st.unassign_abandoned(&self.eni, &rest.unassign);
        }
        if let Some(r) = rest.release {
            let _ = r.send(Err(PoolError::ShuttingDown));
        }
    }

    async fn handle(&mut self, batch: Batch) -> Flow {
        if let Some(oldest) = batch.oldest {
            tracing::trace!(
                waited_ms = oldest.elapsed().as_millis() as u64,
                "batch collected"
            );
        }
        if !batch.pods.is_empty() || batch.warm > 0 {
            let purpose = if batch.pods.is_empty() {
                Purpose::Refill
            } else {
                Purpose::Pod
            };
            with_purpose(
                purpose,
                self.assign(batch.pods, batch.warm, batch.warm_replies),
            )
            .await;
        }
        if !batch.unassign.is_empty() {
            with_purpose(
                Purpose::GiveBack,
                self.unassign(
                    batch.unassign,
                    batch.unassign_prefixes,
                    batch.unassign_replies,
                ),
            )
            .await;
        }
        match batch.release {
            Some(reply) => with_purpose(Purpose::GiveBack, self.release(reply)).await,
            None => Flow::Continue,
        }
    }

    async fn assign(
        &self,
        mut pods: Vec<Waiter>,
        warm: u32,
        warm_replies: Vec<oneshot::Sender<Result<(), PoolError>>>,
    ) {
        let now = Instant::now();
        let ready = self.shared.lock().eni_accepts_work(&self.eni, now);
        if let Err(err) = ready {
            self.shared
                .lock()
                .reject_assign(&self.eni, pods, warm, err.clone());
            for r in warm_replies {
                let _ = r.send(Err(err.clone()));
            }
            return;
        }
        let count = pods.len() as u32 + warm;
        let span =
            tracing::info_span!("assign_batch", eni = %self.eni, count, pods = pods.len(), warm);
        for w in &pods {
            tracing::debug!(
                parent: &w.span,
                eni = %self.eni,
                batch = count,
                queued_ms = w.enqueued_at.elapsed().as_millis() as u64,
                "assigning in a batch"
            );
        }
        let plan = self.shared.lock().plan_assign(&self.eni, count, now);
        let (result, warm) = match plan {
            AssignPlan::Ips => (
                self.shared
                    .cloud
                    .assign_ips(&self.eni, count)
                    .instrument(span.clone())
                    .await
                    .map(|ips| (ips, Vec::new())),
                warm,
            ),
            AssignPlan::Prefixes { count: k, extra } => {
                let got = self
                    .shared
                    .cloud
                    .assign_prefixes(&self.eni, k)
                    .instrument(span.clone())
                    .await;
                match got {
                    Ok(prefixes) => {
                        let ips = prefixes
                            .iter()
                            .flat_map(|p| super::slots::prefix_addresses(*p))
                            .collect();
                        (Ok((ips, prefixes)), warm + extra)
                    }
                    Err(CloudError::NoFreePrefix { .. }) => {
                        // No `/28` left in the subnet: the batch as single packed addresses,
                        // cut to the ENI's free slots (the rest goes to a new ENI).
                        let warm = {
                            let mut st = self.shared.lock();
                            st.unplan_extra(&self.eni, extra);
                            st.no_free_prefix(&self.eni, Instant::now());
                            st.fit_single_addresses(&self.eni, &mut pods, warm)
                        };
                        self.assign_fitted(pods.len(), warm, &span).await
                    }
                    Err(e) => {
                        self.shared.lock().unplan_extra(&self.eni, extra);
                        (Err(e), warm)
                    }
                }
            }
            AssignPlan::Packed => {
                let warm = self
                    .shared
                    .lock()
                    .fit_single_addresses(&self.eni, &mut pods, warm);
                self.assign_fitted(pods.len(), warm, &span).await
            }
        };
        let outcome = match result {
            Ok((ips, prefixes)) => {
                span.in_scope(
                    || tracing::info!(assigned = ips.len(), prefixes = ?prefixes, "assigned IPs"),
                );
                let gone = self
                    .wait_visible(&ips, &prefixes)
                    .instrument(span.clone())
                    .await;
                let mut st = self.shared.lock();
                if gone && st.suspend_eni(&self.eni, Instant::now()) {
                    // Detached behind the pool's back (an assign on a detached ENI succeeds): its
                    // IPs are held back, not handed out, until the running reconcile asks EC2.
                    span.in_scope(|| tracing::warn!("IMDS does not list this ENI at all: it serves no new IPs until EC2 confirms it attached"));
                }
                st.complete_assign(&self.eni, ips, &prefixes, pods, warm, Instant::now());
                drop(st);
                Ok(())
            }
            Err(err) => {
                span.in_scope(|| tracing::warn!(error = %err, "assign failed; backing off"));
                let pool_err =
                    self.shared
                        .lock()
                        .fail_assign(&self.eni, err, pods, warm, Instant::now());
                Err(pool_err)
            }
        };
        if outcome.is_ok() || warm > 0 {
            self.shared.wake.notify_one();
        }
        for r in warm_replies {
            let _ = r.send(outcome.clone());
        }
    }

    /// `count` single addresses picked by the pool, packed into the subnet's `/28` blocks that are
    /// already fragmented (see [`super::slots`]), so whole blocks stay free for prefixes. Another node
    /// may take a picked address first (`InvalidIPAddress.InUse`): one more try with a fresh look.
    /// A batch already cut to the ENI's free slots (`fit_single_addresses`: `pods` waiters and `warm`
    /// warm-ups left) as single packed addresses; wakes the maintainer for the waiters cut, which
    /// went back to the queue for a new ENI. Returns the assign's outcome with `warm`.
    async fn assign_fitted(
        &self,
        pods: usize,
        warm: u32,
        span: &Span,
    ) -> (Result<(Vec<Ipv4Addr>, Vec<Ipv4Net>), CloudError>, u32) {
        self.shared.wake.notify_one();
        let got = self
            .assign_packed(pods as u32 + warm)
            .instrument(span.clone())
            .await
            .map(|ips| (ips, Vec::new()));
        (got, warm)
    }

    async fn assign_packed(&self, count: u32) -> Result<Vec<Ipv4Addr>, CloudError> {
        if count == 0 {
            return Ok(Vec::new()); // EC2 refuses an assign of nothing
        }
        let Some(subnet) = self.shared.lock().subnet_of(&self.eni) else {
            return self.shared.cloud.assign_ips(&self.eni, count).await;
        };
        // The picks come from a moment-old view, and EC2 does not list every taken address (another
        // node may take one first): on a collision, pack again without the addresses just tried.
        // After three collisions this batch is left to EC2's picks; the pods are served either way.
        let mut avoid = BTreeSet::new();
        for _ in 0..3 {
            let picked =
                super::slots::pack_in_subnet(self.shared.cloud.as_ref(), &subnet, count, &avoid)
                    .await?;
            match self
                .shared
                .cloud
                .assign_specific_ips(&self.eni, &picked)
                .await
            {
                Err(CloudError::Rejected { code, .. }) if code == ADDRESS_IN_USE => {
                    tracing::info!(
                        ?picked,
                        "a packed address was taken meanwhile; packing again"
                    );
                    avoid.extend(picked);
                }
                other => return other,
            }
        }
        tracing::warn!("packed addresses collided three times; EC2 picks this batch");
        self.shared.cloud.assign_ips(&self.eni, count).await
    }

    /// Waits (bounded by `imds_wait`) until IMDS lists `ips` on this ENI. EC2 already has them, so
    /// after the bound the pods get them anyway; the reconciler trusts EC2 over IMDS.
    ///
    /// Addresses inside `prefixes` are not listed one by one (IMDS has the prefix under `ipv4-prefix`):
    /// the prefix is what is waited for.
    ///
    /// Returns true when every read in the wait (at least two) found no interface with this ENI's
    /// MAC: IMDS, the instance's own view, does not have the ENI attached (IMDS lag shows an older
    /// state, in which an ENI the pool has served from was attached).
    async fn wait_visible(&self, ips: &[Ipv4Addr], prefixes: &[Ipv4Net]) -> bool {
        let bound = self.shared.config.imds_wait;
        if bound.is_zero() || ips.is_empty() {
            return false;
        }
        let (mut absent, mut reads) = (0u32, 0u32);
        let singles: Vec<Ipv4Addr> = ips
            .iter()
            .copied()
            .filter(|ip| !prefixes.iter().any(|p| p.contains(ip)))
            .collect();
        let deadline = Instant::now() + bound;
        loop {
            match self.shared.metadata.interface(&self.mac).await {
                Ok(Some(md))
                    if singles.iter().all(|ip| md.ips.contains(ip))
                        && prefixes.iter().all(|p| md.ipv4_prefixes.contains(p)) =>
                {
                    return false;
                }
                Ok(md) => {
                    reads += 1;
                    absent += u32::from(md.is_none());
                }
                Err(e) => tracing::debug!(error = %e, "IMDS read failed while waiting for IPs"),
            }
            if Instant::now() + IMDS_POLL > deadline {
                tracing::warn!(
                    waited_ms = bound.as_millis() as u64,
                    "IMDS does not list the new IPs yet; going on"
                );
                return reads >= 2 && absent == reads;
            }
            tokio::time::sleep(IMDS_POLL).await;
        }
    }

    async fn unassign(
        &self,
        ips: Vec<Ipv4Addr>,
        prefixes: Vec<Ipv4Net>,
        replies: Vec<oneshot::Sender<Result<(), PoolError>>>,
    ) {
        let span = tracing::info_span!("unassign_batch", eni = %self.eni, count = ips.len(), prefixes = prefixes.len());
        let in_prefixes: BTreeSet<Ipv4Addr> = prefixes
            .iter()
            .flat_map(|p| super::slots::prefix_addresses(*p))
            .collect();
        let singles: Vec<Ipv4Addr> = ips
            .iter()
            .copied()
            .filter(|ip| !in_prefixes.contains(ip))
            .collect();
        // EC2 refuses a call naming nothing: each kind goes only when there is some. The two calls
        // are settled each on its own: the `bool` says whether the singles went back before the
        // prefixes' call failed.
        let result: Result<(), (CloudError, bool)> = async {
            if !singles.is_empty() {
                let r = self.shared.cloud.unassign_ips(&self.eni, &singles).await;
                r.map_err(|e| (e, false))?;
            }
            if !prefixes.is_empty() {
                let r = self.shared.cloud.unassign_prefixes(&self.eni, &prefixes);
                r.await.map_err(|e| (e, true))?;
            }
            Ok(())
        }
        .instrument(span.clone())
        .await;
        let outcome = {
            let mut st = self.shared.lock();
            match result {
                Ok(()) => {
                    span.in_scope(|| tracing::info!("gave IPs back to EC2"));
                    st.complete_unassign(&self.eni, &ips, &prefixes);
                    Ok(())
                }
                Err((err, singles_gone)) => {
                    span.in_scope(
                        || tracing::warn!(error = %err, singles_gone, "unassign failed; what EC2 kept stays idle"),
                    );
                    st.settle_failed_unassign(
                        &self.eni,
                        &ips,
                        &prefixes,
                        singles_gone,
                        err.clone(),
                        Instant::now(),
                    );
                    Err(PoolError::Cloud(err))
                }
            }
        };
        self.shared.wake.notify_one();
        for r in replies {
            let _ = r.send(outcome.clone());
        }
    }

    /// Whether EC2 shows this ENI attached to this instance: `None` when EC2 cannot say.
    async fn attached_here(&self) -> Option<bool> {
        let instance = self.shared.lock().node.instance_id.clone();
        match self
            .shared
            .cloud
            .describe_enis(&EniFilter {
                ids: vec![self.eni.clone()],
                ..EniFilter::default()
            })
            .await
        {
            Ok(found) => Some(found.iter().any(|e| {
                e.attachment.as_ref().is_some_and(|a| {
                    a.instance_id == instance
                        && matches!(
                            a.status,
                            crate::cloud::AttachmentStatus::Attached
                                | crate::cloud::AttachmentStatus::Attaching
                        )
                })
            })),
            Err(e) if e.is_not_found() => Some(false),
            Err(_) => None,
        }
    }

    async fn release(&self, reply: oneshot::Sender<Result<(), PoolError>>) -> Flow {
        let span = tracing::info_span!("release_eni", eni = %self.eni);
        let described = self.shared.lock().cloud_eni(&self.eni);
        let eni = match described {
            Some(eni) => Ok(eni),
            None => self
                .shared
                .cloud
                .describe_enis(&EniFilter {
                    ids: vec![self.eni.clone()],
                    ..EniFilter::default()
                })
                .instrument(span.clone())
                .await
                .and_then(|mut v| {
                    v.pop().ok_or_else(|| CloudError::NotFound {
                        api: "DescribeNetworkInterfaces".into(),
                        code: "InvalidNetworkInterfaceID.NotFound".into(),
                        message: format!("{} not found", self.eni),
                    })
                }),
        };
        let result = match eni {
            Ok(eni) => {
                self.shared
                    .provisioner
                    .detach_and_delete(&eni)
                    .instrument(span.clone())
                    .await
            }
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(e),
        };
        let (flow, outcome) = match result {
            Ok(()) => {
                span.in_scope(|| tracing::info!("ENI detached and deleted"));
                self.shared.lock().complete_release(&self.eni);
                (Flow::Stop, Ok(()))
            }
            Err(err) => {
                // The detach may have happened and only the delete failed: ask EC2 before this ENI
                // serves again (an ENI that is not attached must never hand out IPs).
                let attached = self.attached_here().instrument(span.clone()).await;
                let mut st = self.shared.lock();
                match attached {
                    Some(true) => {
                        span.in_scope(|| tracing::warn!(error = %err, "ENI release failed; still attached, keeping it"));
                        st.fail_release(&self.eni, Instant::now());
                        (Flow::Continue, Err(PoolError::Cloud(err)))
                    }
                    Some(false) => {
                        span.in_scope(|| tracing::warn!(error = %err, "ENI detached but not deleted: forgotten by the pool; the leaked-ENI collector deletes it"));
                        st.complete_release(&self.eni);
                        (Flow::Stop, Err(PoolError::Cloud(err)))
                    }
                    None => {
                        span.in_scope(|| tracing::warn!(error = %err, "ENI release failed and EC2 cannot say whether it is still attached: it serves nothing until the reconcile decides"));
                        st.fail_release(&self.eni, Instant::now());
                        st.suspend_eni(&self.eni, Instant::now());
                        (Flow::Continue, Err(PoolError::Cloud(err)))
                    }
                }
            }
        };
        self.shared.wake.notify_one();
        let _ = reply.send(outcome);
        flow
    }
}
