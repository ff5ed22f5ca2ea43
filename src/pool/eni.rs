//! One actor per attached ENI: the [`EniHandle`] (cloneable, a bounded mpsc sender: the ENI's
//! *ipBacklog*) and the task that owns every cloud call for that ENI.
//!
//! The task waits for a command, then keeps collecting for `batch_window` (the coalescing window),
//! and makes ONE `AssignPrivateIpAddresses` for every pod and warm-up request of the batch and ONE
//! `UnassignPrivateIpAddresses` for every give-back. Replies go back on the commands' oneshot
//! senders; a failed call is answered to every waiter of the batch and moves the ENI into
//! [`EniPhase::BackingOff`](super::types::EniPhase::BackingOff). Commands carry the caller's tracing span and enqueue time, so a slow
//! batch shows up in the trace of each pod that waited on it.
//!
//! The actor sets each call's [`Purpose`]: an assign batch with a pod in it is `Pod`, one of
//! warm-ups only `Refill`; unassign and release are `GiveBack` (they yield to pod-driven calls
//! while EC2 throttles the node, see [`crate::cloud::limiter`]).
//!
//! Each batch is one plan and one outcome: the actor asks the state for the plan
//! ([`PoolState::plan_assign`](super::state::PoolState::plan_assign)), makes the call, and hands
//! back what it came to (`settle_assign`, `settle_give_back`, `settle_release`), each under the
//! pool's lock once.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use ipnet::Ipv4Net;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{Instrument, Span};

use super::error::PoolError;
use super::shared::Shared;
use super::slots::{pack_in_subnet, prefix_addresses};
use super::types::{
    AssignBatch, AssignOutcome, AssignPlan, DoneReply, EniCommand, EniHandle, GiveBackOutcome,
    Packed, ReleaseOutcome,
};
use crate::cloud::{
    ADDRESS_IN_USE, AttachmentStatus, CloudError, EniFilter, Purpose, with_deadline, with_purpose,
    without_throttle_retries,
};
use crate::model::EniId;

mod give_back;

/// The EC2 API an assign batch goes through, addresses or prefixes: its throttle pause is waited
/// out before a batch, and its throttles tell the maintainer the account's bucket is short.
pub(super) const ASSIGN_API: &str = "AssignPrivateIpAddresses";

/// How often the actor re-reads IMDS while waiting for freshly assigned IPs to show.
const IMDS_POLL: Duration = Duration::from_millis(100);

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
        (Self::new(tx), task)
    }
}

#[derive(PartialEq, Eq)]
enum Flow {
    Continue,
    Stop,
}

/// What the actor collected in one window.
#[derive(Default)]
struct Batch {
    assign: AssignBatch,
    warm_replies: Vec<DoneReply>,
    unassign: Vec<Ipv4Addr>,
    unassign_prefixes: Vec<Ipv4Net>,
    unassign_replies: Vec<DoneReply>,
    release: Option<DoneReply>,
    oldest: Option<Instant>,
}

impl Batch {
    fn add(&mut self, cmd: EniCommand) {
        let enqueued = match cmd {
            EniCommand::Assign(w) => {
                let at = w.enqueued_at;
                self.assign.pods.push(*w);
                at
            }
            EniCommand::Warm {
                count,
                respond_to,
                enqueued_at,
                span,
            } => {
                tracing::debug!(parent: &span, count, "warm-up joins a batch");
                self.assign.warm += count;
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
            if batch.assign.count() > 0 {
                // EC2 throttled the node's assigns lately: the call waits out the pause, and the
                // pods and warm-ups that come meanwhile go in it too (a throttled batch comes back
                // through the pool, see `handle`).
                self.shared.cloud.throttle_pause(ASSIGN_API).await;
                while let Ok(cmd) = self.rx.try_recv() {
                    batch.add(cmd);
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
        let now = Instant::now();
        let mut st = self.shared.lock();
        let not_sent = AssignOutcome::NotSent(PoolError::ShuttingDown);
        let _ = st.settle_assign(&self.eni, rest.assign, not_sent, now);
        for r in rest.warm_replies.into_iter().chain(rest.unassign_replies) {
            let _ = r.send(Err(PoolError::ShuttingDown));
        }
        if !rest.unassign.is_empty() {
            let (ips, prefixes) = (&rest.unassign, &rest.unassign_prefixes);
            let _ = st.settle_give_back(&self.eni, ips, prefixes, GiveBackOutcome::NotSent, now);
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
        if batch.assign.count() > 0 {
            let purpose = if batch.assign.pods.is_empty() {
                Purpose::Refill
            } else {
                Purpose::Pod
            };
            // The call's retries end before the earliest of its pods' deadlines: the pods are
            // answered (and wait in line for the next try) while their runtime still waits.
            // An assign takes EC2's throttle as its answer rather than being retried as it is: the
            // pods wait in line and the maintainer routes every waiter of the node here again,
            // so the next try carries the pods that came meanwhile too (the run loop waits out
            // the throttle pause before it gathers the batch). A warm-up alone is planned again,
            // and under contention rides along in the pods' calls: the account's bucket is dry,
            // and its next token is one a pod, here or on another node, waits on. Transient
            // failures are retried as before, within the pods' earliest deadline.
            let deadline = batch.assign.pods.iter().map(|w| w.deadline).min();
            let call = with_purpose(
                purpose,
                without_throttle_retries(self.assign(batch.assign, batch.warm_replies)),
            );
            match deadline {
                Some(d) => with_deadline(d, call).await,
                None => call.await,
            }
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

    /// One assign call for the batch: the state's plan, the call, the outcome settled.
    async fn assign(&self, mut batch: AssignBatch, warm_replies: Vec<DoneReply>) {
        let (count, pods, warm) = (batch.count(), batch.pods.len(), batch.warm);
        let plan = self
            .shared
            .lock()
            .plan_assign(&self.eni, &mut batch, Instant::now());
        if let AssignPlan::Refused(err) = plan {
            for r in warm_replies {
                let _ = r.send(Err(err.clone()));
            }
            return;
        }
        let span = tracing::info_span!("assign_batch", eni = %self.eni, count, pods, warm);
        for w in &batch.pods {
            tracing::debug!(
                parent: &w.span,
                eni = %self.eni,
                batch = count,
                queued_ms = w.enqueued_at.elapsed().as_millis() as u64,
                "assigning in a batch"
            );
        }
        // Warm-ups a failed prefix call adds to the batch: they do not wake the maintainer.
        let mut unplanned_warm = 0;
        let result = match plan {
            AssignPlan::Refused(_) => unreachable!("answered above"),
            AssignPlan::Ips { count } => self
                .shared
                .cloud
                .assign_ips(&self.eni, count)
                .instrument(span.clone())
                .await
                .map(|ips| (ips, Vec::new())),
            AssignPlan::Prefixes { count: k, extra } => {
                let got = self
                    .shared
                    .cloud
                    .assign_prefixes(&self.eni, k)
                    .instrument(span.clone())
                    .await;
                match got {
                    Ok(prefixes) => {
                        let ips = prefixes.iter().flat_map(|p| prefix_addresses(*p)).collect();
                        Ok((ips, prefixes))
                    }
                    Err(CloudError::NoFreePrefix { .. }) => {
                        // No `/28` left in the subnet: the batch as single packed addresses,
                        // cut to the ENI's free slots (the rest goes to a new ENI).
                        let packed = self.shared.lock().fall_back_to_packed(
                            &self.eni,
                            &mut batch,
                            extra,
                            Instant::now(),
                        );
                        self.assign_fitted(packed, &span).await
                    }
                    Err(e) => {
                        unplanned_warm = extra;
                        Err(e)
                    }
                }
            }
            AssignPlan::Packed(packed) => self.assign_fitted(packed, &span).await,
        };
        // A failed batch's pods may wait in line for the next try: the maintainer plans it.
        let wake = result.is_ok() || batch.warm > unplanned_warm || !batch.pods.is_empty();
        let outcome = match result {
            Ok((ips, prefixes)) => {
                span.in_scope(
                    || tracing::info!(assigned = ips.len(), prefixes = ?prefixes, "assigned IPs"),
                );
                self.shared
                    .journal_assigned(&self.eni, &ips, &prefixes)
                    .await;
                let eni_unlisted = self
                    .wait_visible(&ips, &prefixes)
                    .instrument(span.clone())
                    .await;
                AssignOutcome::Assigned {
                    ips,
                    prefixes,
                    eni_unlisted,
                }
            }
            Err(err) => {
                span.in_scope(|| tracing::warn!(error = %err, "assign failed; backing off"));
                AssignOutcome::Failed(err)
            }
        };
        let settled = span.in_scope(|| {
            self.shared
                .lock()
                .settle_assign(&self.eni, batch, outcome, Instant::now())
        });
        if wake {
            self.shared.wake.notify_one();
        }
        for r in warm_replies {
            let _ = r.send(settled.clone());
        }
    }

    /// A batch already cut to the ENI's free slots, as single packed addresses; wakes the
    /// maintainer for the waiters cut, which went back to the queue for a new ENI.
    async fn assign_fitted(
        &self,
        packed: Packed,
        span: &Span,
    ) -> Result<(Vec<Ipv4Addr>, Vec<Ipv4Net>), CloudError> {
        self.shared.wake.notify_one();
        self.assign_packed(packed)
            .instrument(span.clone())
            .await
            .map(|ips| (ips, Vec::new()))
    }

    /// `count` single addresses picked by the pool, packed into the subnet's `/28` blocks that are
    /// already fragmented (see [`super::slots`]), so whole blocks stay free for prefixes. Another node
    /// may take a picked address first (`InvalidIPAddress.InUse`): one more try with a fresh look.
    async fn assign_packed(&self, packed: Packed) -> Result<Vec<Ipv4Addr>, CloudError> {
        let Packed { count, subnet } = packed;
        if count == 0 {
            return Ok(Vec::new()); // EC2 refuses an assign of nothing
        }
        let Some(subnet) = subnet else {
            return self.shared.cloud.assign_ips(&self.eni, count).await;
        };
        // The picks come from a moment-old view, and EC2 does not list every taken address (another
        // node may take one first): on a collision, pack again without the addresses just tried.
        // After three collisions this batch is left to EC2's picks; the pods are served either way.
        let mut avoid = BTreeSet::new();
        for _ in 0..3 {
            let picked = pack_in_subnet(self.shared.cloud.as_ref(), &subnet, count, &avoid).await?;
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

    /// Whether EC2 shows this ENI attached to `instance` (this one): `None` when EC2 cannot say.
    async fn attached_here(&self, instance: &str) -> Option<bool> {
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
                            AttachmentStatus::Attached | AttachmentStatus::Attaching
                        )
                })
            })),
            Err(e) if e.is_not_found() => Some(false),
            Err(_) => None,
        }
    }

    async fn release(&self, reply: DoneReply) -> Flow {
        let span = tracing::info_span!("release_eni", eni = %self.eni);
        let (described, instance) = {
            let st = self.shared.lock();
            (st.cloud_eni(&self.eni), st.node.instance_id.clone())
        };
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
        let (settled, answer) = match result {
            Ok(()) => {
                span.in_scope(|| tracing::info!("ENI detached and deleted"));
                (ReleaseOutcome::Deleted, Ok(()))
            }
            Err(err) => {
                // The detach may have happened and only the delete failed: ask EC2 before this ENI
                // serves again (an ENI that is not attached must never hand out IPs).
                let attached = self.attached_here(&instance).instrument(span.clone()).await;
                let settled = match attached {
                    Some(true) => {
                        span.in_scope(|| tracing::warn!(error = %err, "ENI release failed; still attached, keeping it"));
                        ReleaseOutcome::StillAttached
                    }
                    Some(false) => {
                        span.in_scope(|| tracing::warn!(error = %err, "ENI detached but not deleted: forgotten by the pool; the leaked-ENI collector deletes it"));
                        ReleaseOutcome::Detached
                    }
                    None => {
                        span.in_scope(|| tracing::warn!(error = %err, "ENI release failed and EC2 cannot say whether it is still attached: it serves nothing until the reconcile decides"));
                        ReleaseOutcome::Unknown
                    }
                };
                (settled, Err(PoolError::Cloud(err)))
            }
        };
        self.shared
            .lock()
            .settle_release(&self.eni, settled, Instant::now());
        let flow = match settled {
            ReleaseOutcome::Deleted | ReleaseOutcome::Detached => Flow::Stop,
            _ => Flow::Continue,
        };
        self.shared.wake.notify_one();
        let _ = reply.send(answer);
        flow
    }
}
