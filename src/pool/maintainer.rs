//! The maintainer: one task that keeps the warm pool within `[min_idle, max_idle]`, creates an ENI
//! when every ENI is full (carrying the IPs it needs in the create call itself), serves the pods
//! waiting for that ENI, and releases ENIs that hold no IP.
//!
//! It runs a round on every tick, whenever notified (after a short coalescing wait, so a burst of
//! acquires becomes one create), and on request ([`super::Pool::maintain_now`]). A round only
//! *plans* under the pool's lock ([`super::state::PoolState::plan_round`]); the cloud calls run in
//! spawned tasks (warm-ups and give-backs through the ENI actors, one batch per ENI), so a slow
//! create never stalls the next round. A burst that needs several new ENIs gets them in parallel (each
//! carrying its waiters' IPs), bounded by `max_concurrent_eni_creates`; warming alone creates one at
//! a time per subnet.
//!
//! A create's EC2 calls (the subnet describe included) are `Pod` calls when the ENI carries waiters,
//! `Refill` when it only warms ([`Purpose`]); warm-ups and give-backs get theirs in the ENI actors.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};
use tracing::Instrument;

use super::eni::ASSIGN_API;
use super::error::PoolError;
use super::shared::{NewEniFacts, Shared};
use super::slots::pack_in_subnet;
use super::state::CreatePlan;
use super::types::{
    AssignBatch, AssignOutcome, CreateOutcome, EniCommand, EniHandle, GiveBackOutcome,
    ReleaseOutcome,
};
use crate::cloud::lifecycle::{NewEni, Slots};
use crate::cloud::{ADDRESS_IN_USE, CloudError, Eni, Purpose, SubnetFilter, with_purpose};

/// Extra coalescing before the first ENI creation of a burst (on top of `batch_window`).
const CREATE_COALESCE: std::time::Duration = std::time::Duration::from_millis(40);

/// How long after a waiter's back-off (or budget) ends its round runs.
const DUE_SLACK: std::time::Duration = std::time::Duration::from_millis(10);

/// Requests to the maintainer task.
pub(crate) enum MaintainerCommand {
    /// Wait for the work earlier rounds started, run a round now, and answer when its cloud work
    /// is done too.
    RunNow { respond_to: oneshot::Sender<()> },
}

/// The maintainer's loop; ends when the command sender is dropped (pool shutdown).
pub(crate) async fn run(shared: Arc<Shared>, mut commands: mpsc::Receiver<MaintainerCommand>) {
    let mut tick = tokio::time::interval(shared.config.maintainer_tick);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let creates = Arc::new(Semaphore::new(shared.config.max_concurrent_eni_creates));
    // Work spawned by earlier rounds and maybe still running.
    let mut outstanding: Vec<JoinHandle<()>> = Vec::new();
    let refresh_every = shared.config.subnet_refresh;
    let refresh = tokio::time::sleep(jittered(refresh_every));
    tokio::pin!(refresh);
    // The next instant the waiters in line need a round (a back-off they wait out ends, or a
    // budget), when sooner than the tick.
    let due = tokio::time::sleep(shared.config.maintainer_tick);
    tokio::pin!(due);
    let mut due_armed = false;
    loop {
        let mut reply = None;
        tokio::select! {
            biased;
            cmd = commands.recv() => match cmd {
                Some(MaintainerCommand::RunNow { respond_to }) => reply = Some(respond_to),
                None => break,
            },
            () = &mut due, if due_armed => {}
            () = &mut refresh, if !refresh_every.is_zero() => {
                refresh.as_mut().reset(Instant::now() + jittered(refresh_every));
                outstanding.retain(|t| !t.is_finished());
                outstanding.push(tokio::spawn(with_purpose(
                    Purpose::Refill,
                    refresh_subnets(shared.clone()),
                )));
                continue;
            }
            () = shared.wake.notified() => {
                tokio::time::sleep(shared.config.batch_window).await;
                // Pods waiting for a new ENI and none being created: the burst may still be
                // arriving. An ENI's create+attach chain takes seconds, so a little more coalescing
                // lets the creates carry every pod of the burst; a pod that arrives after them waits
                // for an ENI's room and then an assign call (and IMDS) on top.
                let first_create = {
                    let st = shared.lock();
                    !st.create_waiters.is_empty() && st.creating.is_empty()
                };
                if first_create {
                    tokio::time::sleep(CREATE_COALESCE).await;
                }
            }
            _ = tick.tick() => {}
        }
        match reply {
            // Settle what earlier rounds started, run a round, and settle that too.
            Some(reply) => {
                for t in outstanding.drain(..) {
                    let _ = t.await;
                }
                for t in round(&shared, &creates) {
                    let _ = t.await;
                }
                let _ = reply.send(());
            }
            None => {
                outstanding.retain(|t| !t.is_finished());
                outstanding.extend(round(&shared, &creates));
            }
        }
        let now = Instant::now();
        let next = shared.lock().next_due(now);
        due_armed = next.is_some();
        if let Some(at) = next {
            // A little after the instant itself, so the back-off has ended when the round runs.
            due.as_mut().reset(at.max(now) + DUE_SLACK);
        }
    }
    tracing::debug!("maintainer stopped");
}

/// `every` × a random factor in [0.5, 1.5): nodes that boot together spread their reads.
fn jittered(every: std::time::Duration) -> std::time::Duration {
    every.mul_f64(0.5 + rand::random::<f64>())
}

/// Reads the pod subnets' free-address counts again (one DescribeSubnets for all of them), so a
/// subnet drained by other nodes is seen short and new ENIs go elsewhere.
async fn refresh_subnets(shared: Arc<Shared>) {
    let ids = shared.lock().pod_subnets.clone();
    let filter = SubnetFilter {
        ids,
        ..SubnetFilter::default()
    };
    match shared.cloud.describe_subnets(&filter).await {
        Ok(subnets) => {
            let mut st = shared.lock();
            for s in subnets {
                tracing::debug!(subnet = %s.id, free = s.available_ips, "subnet free count read again");
                st.learn_subnet(s);
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the pod subnets' free counts; trying at the next refresh")
        }
    }
}

/// The calls a new ENI cannot do without before it serves: when EC2 has throttled one of them from
/// this node within [`CONTENTION_MEMORY`], the account's bucket is short and warm-ups start no ENI.
const GROWTH_APIS: [&str; 2] = ["CreateNetworkInterface", "AttachNetworkInterface"];
/// How long a throttle of a growth call counts as contention: long enough to span a fleet's
/// scale-up on the account's refill (EC2 refills these buckets at 5 calls/s for the whole account),
/// short enough that a node warms up again within a minute of the storm's end.
const CONTENTION_MEMORY: Duration = Duration::from_secs(60);

/// Plans one round and spawns its work; returns the tasks.
fn round(shared: &Arc<Shared>, creates: &Arc<Semaphore>) -> Vec<JoinHandle<()>> {
    let throttled = |api: &str| shared.cloud.throttled_within(api, CONTENTION_MEMORY);
    let growth = GROWTH_APIS.iter().any(|api| throttled(api));
    // The call that tops up an ENI with room: once EC2 has throttled it lately, warm-ups ride
    // along in pods' assigns instead of making their own.
    let assign = throttled(ASSIGN_API);
    let plan = {
        let mut st = shared.lock();
        if (growth, assign) != (st.growth_contended, st.assign_contended) {
            tracing::info!(
                growth,
                assign,
                "EC2 throttled the node's growth calls or assigns lately (true) or not for a minute (false): warm-ups alone start no ENI while growth is, and make no assign while assign is"
            );
        }
        st.growth_contended = growth;
        st.assign_contended = assign;
        st.plan_round(Instant::now())
    };
    if plan.is_empty() {
        return Vec::new();
    }
    tracing::debug!(
        reroutes = plan.reroutes.len(),
        warms = plan.warms.len(),
        unassigns = plan.unassigns.len(),
        creates = plan.creates.len(),
        releases = plan.releases.len(),
        "maintainer round"
    );
    let mut tasks = Vec::new();
    for (eni, handle, waiter) in plan.reroutes {
        let shared = shared.clone();
        tasks.push(tokio::spawn(async move {
            if let Err(EniCommand::Assign(w)) =
                handle.send(EniCommand::Assign(Box::new(waiter))).await
            {
                let batch = AssignBatch {
                    pods: vec![*w],
                    warm: 0,
                };
                let not_sent = AssignOutcome::NotSent(PoolError::ShuttingDown);
                let _ = shared
                    .lock()
                    .settle_assign(&eni, batch, not_sent, Instant::now());
            }
        }));
    }
    for (eni, handle, count) in plan.warms {
        let shared = shared.clone();
        tasks.push(tokio::spawn(async move {
            let (tx, rx) = oneshot::channel();
            let cmd = EniCommand::Warm {
                count,
                respond_to: tx,
                span: tracing::info_span!("warm_up", %eni, count),
                enqueued_at: Instant::now(),
            };
            if handle.send(cmd).await.is_err() {
                let batch = AssignBatch {
                    pods: Vec::new(),
                    warm: count,
                };
                let not_sent = AssignOutcome::NotSent(PoolError::ShuttingDown);
                let _ = shared
                    .lock()
                    .settle_assign(&eni, batch, not_sent, Instant::now());
                return;
            }
            if let Ok(Err(e)) = rx.await {
                tracing::warn!(%eni, count, error = %e, "warm-up failed");
            }
        }));
    }
    for (eni, handle, ips, prefixes) in plan.unassigns {
        let shared = shared.clone();
        tasks.push(tokio::spawn(async move {
            let (tx, rx) = oneshot::channel();
            let cmd = EniCommand::Unassign {
                ips: ips.clone(),
                prefixes,
                respond_to: tx,
                span: tracing::info_span!("give_back", %eni, count = ips.len()),
                enqueued_at: Instant::now(),
            };
            if handle.send(cmd).await.is_err() {
                let not_sent = GiveBackOutcome::NotSent;
                let _ = shared
                    .lock()
                    .settle_give_back(&eni, &ips, &[], not_sent, Instant::now());
                return;
            }
            let _ = rx.await;
        }));
    }
    for c in plan.creates {
        let purpose = if c.waiters.is_empty() {
            Purpose::Refill
        } else {
            Purpose::Pod
        };
        tasks.push(tokio::spawn(with_purpose(
            purpose,
            create(shared.clone(), c, creates.clone()),
        )));
    }
    for (eni, handle) in plan.releases {
        let shared = shared.clone();
        tasks.push(tokio::spawn(async move {
            let (tx, rx) = oneshot::channel();
            let cmd = EniCommand::Release {
                respond_to: tx,
                span: tracing::info_span!("release", %eni),
            };
            if handle.send(cmd).await.is_err() {
                let not_sent = ReleaseOutcome::NotSent;
                shared.lock().settle_release(&eni, not_sent, Instant::now());
                return;
            }
            let _ = rx.await;
        }));
    }
    tasks
}

/// The readiness gate (issue 23): with a gate given ([`super::PoolSeams::readiness`], the
/// daemon's when it manages the ENIs' route tables), waits until the host routes through the new
/// ENI, so that no pod gets one of its IPs (and no ADD returns) while the pod's `from <ip> lookup
/// <table>` rule would still find an empty table and send its packets out of eth0 with the ENI's
/// address, which EC2's source/destination check drops. Returns false when the gate's bound passed:
/// the caller gives the ENI back and fails the create (its waiters get a retryable error, the subnet
/// backs off). Without a gate, true at once. The only pool code that knows about the host.
async fn host_ready(shared: &Arc<Shared>, plan: &CreatePlan, eni: &Eni) -> bool {
    let Some(gate) = shared.readiness() else {
        return true;
    };
    let facts = NewEniFacts {
        id: eni.id.clone(),
        mac: eni.mac.clone(),
        device_index: eni
            .attachment
            .as_ref()
            .map_or(plan.device_index, |a| a.device_index),
        subnet_cidr: shared
            .lock()
            .subnets
            .get(&eni.subnet_id)
            .and_then(|s| s.subnet.as_ref())
            .map(|s| s.cidr),
        primary_ip: eni.primary_ip,
    };
    let started = Instant::now();
    match gate.ready(&facts).await {
        Ok(()) => {
            tracing::info!(eni = %eni.id, device_index = facts.device_index,
                waited_ms = started.elapsed().as_millis() as u64, "the host routes through the new ENI: serving");
            true
        }
        Err(why) => {
            tracing::error!(eni = %eni.id, device_index = facts.device_index, error = %why,
                "the host cannot route through the new ENI: giving it back, its pods get a retryable error");
            false
        }
    }
}

/// Creates and attaches one ENI with `plan.count` secondary IPs, spawns its actor and serves the
/// plan's waiters.
async fn create(shared: Arc<Shared>, plan: CreatePlan, permits: Arc<Semaphore>) {
    let span = tracing::info_span!(
        "create_eni",
        subnet = %plan.subnet_id,
        device_index = plan.device_index,
        slots = ?plan.slots,
        pods = plan.waiters.len(),
        network = plan.network.as_deref().unwrap_or("default")
    );
    async move {
        let Ok(_permit) = permits.acquire_owned().await else {
            return;
        };
        for w in &plan.waiters {
            tracing::debug!(parent: &w.span, device_index = plan.device_index, slots = ?plan.slots, "waiting for a new ENI");
        }
        if plan.describe_subnet {
            match shared.cloud.describe_subnet(&plan.subnet_id).await {
                Ok(subnet) => shared.lock().learn_subnet(subnet),
                Err(err) => {
                    tracing::warn!(error = %err, "cannot describe the subnet for a new ENI");
                    let failed = CreateOutcome::Failed(err);
                    shared.lock().settle_create(plan, failed, Instant::now());
                    shared.wake.notify_one();
                    return;
                }
            }
        }
        let started = Instant::now();
        let security_groups = match &plan.security_groups {
            Some(groups) => groups.clone(),
            None => shared.lock().new_eni_security_groups(&plan.subnet_id),
        };
        // Slots that take prefixes but no `/28` left in the subnet: single addresses packed into its
        // fragmented blocks, not EC2's scattered picks.
        let mut slots = plan.slots.clone();
        let pack = {
            let st = shared.lock();
            match &slots {
                Slots::Ips(n)
                    if st.prefix_slots()
                        && st.prefixes_blocked(&plan.subnet_id, Instant::now()) =>
                {
                    st.subnets
                        .get(&plan.subnet_id)
                        .and_then(|s| s.subnet.clone())
                        .map(|s| (s, *n))
                }
                _ => None,
            }
        };
        if let Some((subnet, n)) = pack {
            match pack_in_subnet(shared.cloud.as_ref(), &subnet, n, &Default::default()).await {
                Ok(addresses) if addresses.len() as u32 == n => slots = Slots::Addresses(addresses),
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "cannot pack addresses for the new ENI; EC2 picks them"),
            }
        }
        let mut new = NewEni {
            subnet_id: plan.subnet_id.clone(),
            security_groups,
            // Packed addresses are named in the call: their count cannot grow.
            live_ips: matches!(slots, Slots::Ips(_))
                .then(|| plan.live.clone())
                .flatten(),
            slots,
            device_index: plan.device_index,
            network: plan.network.clone(),
        };
        let mut result = shared.provisioner.create_and_attach(&new).await;
        if let (Err(CloudError::Rejected { code, .. }), Slots::Addresses(addresses)) =
            (&result, &new.slots)
            && code == ADDRESS_IN_USE
        {
            // A packed address was taken meanwhile: EC2 picks this ENI's addresses.
            tracing::info!("a packed address was taken meanwhile; EC2 picks the new ENI's addresses");
            new.slots = Slots::Ips(addresses.len() as u32);
            result = shared.provisioner.create_and_attach(&new).await;
        }
        match result {
            Ok(eni) => {
                tracing::info!(
                    eni = %eni.id,
                    ips = eni.secondary_ips.len(),
                    prefixes = eni.ipv4_prefixes.len(),
                    took_ms = started.elapsed().as_millis() as u64,
                    "ENI ready"
                );
                if !host_ready(&shared, &plan, &eni).await {
                    let err = CloudError::Transient {
                        api: "HostRouteTable".into(),
                        message: format!(
                            "ENI {} is attached but the node cannot route through it yet (its route table \
                             is not installed): it was given back; try again later",
                            eni.id
                        ),
                    };
                    if let Err(e) = shared.provisioner.detach_and_delete(&eni).await {
                        tracing::warn!(eni = %eni.id, error = %e, "giving back the unroutable ENI failed; the leaked-ENI collector deletes it");
                    }
                    let failed = CreateOutcome::Failed(err);
                    shared.lock().settle_create(plan, failed, Instant::now());
                    shared.wake.notify_one();
                    return;
                }
                shared
                    .journal_assigned(&eni.id, &eni.secondary_ips, &eni.ipv4_prefixes)
                    .await;
                let (handle, task) = EniHandle::spawn(shared.clone(), eni.id.clone(), eni.mac.clone());
                let created = CreateOutcome::Created {
                    eni: Box::new(eni),
                    handle,
                    task,
                };
                shared.lock().settle_create(plan, created, Instant::now());
            }
            Err(err) => {
                tracing::warn!(error = %err, "ENI creation failed");
                let outcome = if matches!(err, CloudError::NoFreePrefix { .. }) {
                    CreateOutcome::NoFreePrefix
                } else {
                    CreateOutcome::Failed(err)
                };
                shared.lock().settle_create(plan, outcome, Instant::now());
            }
        }
        shared.wake.notify_one();
    }
    .instrument(span)
    .await
}
