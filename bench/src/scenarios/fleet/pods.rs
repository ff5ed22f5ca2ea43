//! The pods of a pattern: one task per node starts its pods at their instants; each pod ADDs (retried
//! as kubelet does) until it has an IP, and DELs when its life ends. A [`Recorder`] collects what
//! they report.
//!
//! The kubelet model. A pod's sandbox is created by the kubelet's pod worker: `RunPodSandbox` over
//! CRI, which runs the CNI ADD. When it fails, the sync fails and the pod worker requeues the pod
//! after `wait.Jitter(backOffPeriod, workerBackOffPeriodJitterFactor)`, `backOffPeriod` = 10 s and
//! the jitter factor 0.5: uniformly in [10 s, 15 s) (kubernetes `pkg/kubelet/pod_workers.go`,
//! `completeWork`; the constants in `pkg/kubelet/kubelet.go`). The CRI call carries the kubelet's
//! `runtimeRequestTimeout` (default 2 min), longer than the CNI plugin's own deadline for one daemon
//! call ([`eniipam_cni::netconf::DEFAULT_TIMEOUT_MS`]), so the plugin's deadline is the one that
//! binds: each attempt is one gRPC Allocate with that deadline, sent as the gRPC timeout header so
//! the daemon can see how long its caller waits.
//!
//! A pod's sandbox is not created the instant the scheduler binds it: the kubelet's pod watch sees
//! the binding, the pod worker waits for its volumes (at least the projected service-account token,
//! mounted by the volume manager's reconciler, which polls every 100 ms), then calls
//! `RunPodSandbox`. [`BIND_TO_ADD`] is that lead. eniipamd's own pod watch sees the binding as soon
//! as the kubelet's does, and its lookahead announces the pod to the pool
//! ([`eniipam::pool::Pool::announce_bound_pods`]) before its ADD. [`BoundView`] is that watch's view
//! as the lookahead feeds it to the pool: every pod bound to the node and not deleted, re-announced at
//! each change (the watch itself, against an API server, is tested in `tests/api_server_lookahead.rs`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use eniipam::model::PodRef;
use eniipam::pool::Pool;
use eniipam_api::pb::ipam_client::IpamClient;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::task::AbortHandle;
use tokio::time::Instant;
use tonic::transport::Channel;

use super::traffic::{Life, Plan, PodPlan};
use crate::support;

/// The kubelet pod worker's back-off after a failed sync (`backOffPeriod`, `pkg/kubelet/kubelet.go`).
pub const KUBELET_BACKOFF: Duration = Duration::from_secs(10);
/// The jitter on it (`workerBackOffPeriodJitterFactor`): `wait.Jitter(d, f)` waits d + U[0, f·d).
pub const KUBELET_JITTER: f64 = 0.5;

/// From the scheduler's binding to the CNI ADD, drawn uniformly in this range per pod. Measured in
/// kubelet logs: 389 ms from "Receiving a new pod" to "Creating sandbox for pod" (kubernetes#66672);
/// 3 ms from the binding to the kubelet's `SyncLoop ADD`, then 185 ms to the service-account
/// volume's mount starting (kubernetes#103578); 100 ms of it the volume manager's poll between
/// attach and mount (kubernetes#136839). The runtime then creates the network namespace and runs the
/// plugin. 0.2–0.6 s, a figure from those.
pub const BIND_TO_ADD: (Duration, Duration) =
    (Duration::from_millis(200), Duration::from_millis(600));

/// The `i`th pod of `node`'s own stream: a pod's lead and retries do not depend on the order pods
/// run in, and the floor model (`super::floor`) draws the same leads.
pub fn pod_rng(seed: u64, node: usize, i: usize) -> StdRng {
    StdRng::seed_from_u64(
        seed ^ ((node as u64) << 32 | i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
    )
}

/// One pod's lead from binding to ADD, drawn from `rng`.
pub fn bind_to_add(rng: &mut impl Rng) -> Duration {
    let (lo, hi) = BIND_TO_ADD;
    lo + (hi - lo).mul_f64(rng.random::<f64>())
}

/// How long the kubelet waits before it retries a failed sandbox: `wait.Jitter(KUBELET_BACKOFF,
/// KUBELET_JITTER)`, drawn from `rng`.
pub fn kubelet_retry(rng: &mut impl Rng) -> Duration {
    KUBELET_BACKOFF + KUBELET_BACKOFF.mul_f64(KUBELET_JITTER * rng.random::<f64>())
}

/// One ADD attempt's deadline: the CNI plugin's own for one daemon call (the kubelet's CRI
/// `runtimeRequestTimeout`, 2 min by default, is longer and never binds).
pub fn add_deadline() -> Duration {
    Duration::from_millis(eniipam_cni::netconf::DEFAULT_TIMEOUT_MS)
}

/// Whether a failed ADD failed because of EC2's throttling or the daemon's back-off from it (its
/// error text names it): the failures issue 25 wants at ≤ 1 % of pods.
pub fn is_throttling(status: &tonic::Status) -> bool {
    let m = status.message().to_ascii_lowercase();
    [
        "throttl",
        "requestlimitexceeded",
        "backing off",
        "back-off",
        "backoff",
    ]
    .iter()
    .any(|w| m.contains(w))
}

/// The name of the `i`th pod running on `node` before the pattern starts.
pub fn running_name(node: usize, i: usize) -> String {
    format!("run-{node}-{i}")
}

/// What every pod of a pattern shares: the pattern's start and deadline, the recorder, the task
/// list, the seed.
#[derive(Clone)]
pub struct Drive {
    pub t0: Instant,
    pub deadline: Instant,
    pub rec: Arc<Recorder>,
    pub tasks: Arc<Mutex<Vec<AbortHandle>>>,
    pub seed: u64,
}

/// One node's daemon as the pods reach it: its gRPC client, and its pool when the lookahead is on
/// (the daemon watches the pods bound to its node).
#[derive(Clone)]
pub struct NodeIo {
    pub client: IpamClient<Channel>,
    pub lookahead: Option<Pool>,
}

/// One task per node that starts its pods at their instants from the pattern's start, each pod a
/// task of its own.
pub fn spawn_drivers(plan: &Plan, nodes: &[NodeIo], drive: &Drive) {
    let mut by_node: BTreeMap<usize, Vec<PodPlan>> = BTreeMap::new();
    for p in &plan.pods {
        by_node.entry(p.node).or_default().push(*p);
    }
    for (node, pods) in by_node {
        spawn_node_driver(node, pods, nodes[node].clone(), (drive.t0, None), drive);
    }
}

/// The task that binds `node`'s pods, each at `origin` + its `start` (the pattern's start, or in
/// node-boot the instant the node takes pods); each pod's ADD follows [`bind_to_add`] later. A
/// pod's wait runs from `since` when given (node-boot: the node's launch), else from its ADD.
pub fn spawn_node_driver(
    node: usize,
    pods: Vec<PodPlan>,
    io: NodeIo,
    (origin, since): (Instant, Option<Instant>),
    drive: &Drive,
) {
    let d = drive.clone();
    let view = io.lookahead.map(BoundView::new);
    let h = tokio::spawn(async move {
        for (i, p) in pods.into_iter().enumerate() {
            tokio::time::sleep_until(origin + p.start).await;
            let name = format!("pod-{node}-{i}");
            let mut rng = pod_rng(d.seed, node, i);
            let lead = bind_to_add(&mut rng);
            if let Some(v) = &view {
                v.bind(&name);
            }
            let pod = Pod {
                name,
                plan: p,
                client: io.client.clone(),
                rec: d.rec.clone(),
                rng,
                lead,
                view: view.clone(),
                since,
            };
            let h = tokio::spawn(pod.run(d.t0, d.deadline));
            d.tasks.lock().expect("tasks").push(h.abort_handle());
        }
    });
    drive.tasks.lock().expect("tasks").push(h.abort_handle());
}

/// One pod started during the pattern.
struct Pod {
    name: String,
    plan: PodPlan,
    client: IpamClient<Channel>,
    rec: Arc<Recorder>,
    /// Draws the kubelet's retry delays.
    rng: StdRng,
    /// From its binding to its ADD's first attempt.
    lead: Duration,
    /// The node's bound pods as its daemon's lookahead sees them (`None`: the lookahead is off).
    view: Option<BoundView>,
    /// Its wait runs from here (node-boot: its node's launch) rather than from its ADD.
    since: Option<Instant>,
}

/// The pods bound to one node and not deleted, as eniipamd's pod watch shows them: each change is
/// announced to the pool, as the lookahead does (`reconcile::api_server::lookahead`).
#[derive(Clone)]
pub struct BoundView {
    pool: Pool,
    pods: Arc<Mutex<BTreeMap<String, PodRef>>>,
}

impl BoundView {
    fn new(pool: Pool) -> Self {
        Self {
            pool,
            pods: Arc::default(),
        }
    }

    /// The scheduler bound the pod `name` here.
    fn bind(&self, name: &str) {
        let pod = PodRef {
            namespace: support::POD_NAMESPACE.into(),
            name: name.into(),
            uid: support::pod_uid(name),
        };
        self.change(|pods| {
            pods.insert(name.to_owned(), pod);
        });
    }

    /// The pod `name` is being deleted (before its DEL).
    fn delete(&self, name: &str) {
        self.change(|pods| {
            pods.remove(name);
        });
    }

    fn change(&self, f: impl FnOnce(&mut BTreeMap<String, PodRef>)) {
        let view: Vec<PodRef> = {
            let mut pods = self.pods.lock().expect("bound pods");
            f(&mut pods);
            pods.values().cloned().collect()
        };
        self.pool.announce_bound_pods(&view);
    }
}

impl Pod {
    /// ADD, each attempt bounded by [`add_deadline`] and retried after [`kubelet_retry`] while it
    /// fails, as kubelet does, until it has an IP or the pattern's deadline passes; then, if it has
    /// a lifetime, DEL when that ends.
    async fn run(mut self, t0: Instant, deadline: Instant) {
        tokio::time::sleep(self.lead).await;
        let started = Instant::now();
        let mut failed = 0u32;
        let add = async {
            let per_attempt = add_deadline();
            loop {
                let mut req = tonic::Request::new(support::alloc_req(&self.name));
                req.set_timeout(per_attempt);
                let status =
                    match tokio::time::timeout(per_attempt, self.client.allocate(req)).await {
                        Ok(Ok(_)) => break,
                        Ok(Err(status)) => status,
                        Err(_) => tonic::Status::deadline_exceeded(format!(
                            "no answer within the CNI plugin's {} ms",
                            per_attempt.as_millis()
                        )),
                    };
                self.rec.retried(&status);
                failed += 1;
                tokio::time::sleep(kubelet_retry(&mut self.rng)).await;
            }
        };
        let served = tokio::time::timeout_at(deadline, add).await.is_ok();
        let now = Instant::now();
        self.rec.record(PodRecord {
            node: self.plan.node,
            failed_adds: failed,
            wave: self.plan.wave,
            wait_ms: (now - self.since.unwrap_or(started)).as_secs_f64() * 1e3,
            add_wait_ms: (now - started).as_secs_f64() * 1e3,
            done_at_s: (now - t0).as_secs_f64(),
            served,
        });
        if !served {
            return;
        }
        let release_at = match self.plan.life {
            Life::Forever => return,
            Life::For(d) => now + d,
            Life::Until(at) => t0 + at,
        };
        tokio::time::sleep_until(release_at).await;
        if let Some(v) = &self.view {
            v.delete(&self.name);
        }
        self.rec.release(&mut self.client, &self.name).await;
    }
}

/// One pod's outcome.
#[derive(Clone, Copy, Debug)]
pub struct PodRecord {
    pub node: usize,
    /// Its ADD attempts that failed (each retried).
    pub failed_adds: u32,
    pub wave: u8,
    /// From its node's launch when the pattern counts from there, else from its ADD's first attempt.
    pub wait_ms: f64,
    /// From its ADD's first attempt.
    pub add_wait_ms: f64,
    /// When it had its IP (or was given up), from the pattern's start.
    pub done_at_s: f64,
    pub served: bool,
}

/// What the pods report, shared by their tasks.
pub struct Recorder {
    pub records: Mutex<Vec<PodRecord>>,
    pub served: AtomicU64,
    pub retries: AtomicU64,
    /// Failed ADDs whose error names EC2's throttling or the daemon's back-off ([`is_throttling`]).
    pub throttle_retries: AtomicU64,
    pub retry_reasons: Mutex<BTreeMap<String, u64>>,
    pub release_errors: AtomicU64,
}

impl Recorder {
    pub fn new() -> Self {
        Self {
            records: Mutex::new(Vec::new()),
            served: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            throttle_retries: AtomicU64::new(0),
            retry_reasons: Mutex::new(BTreeMap::new()),
            release_errors: AtomicU64::new(0),
        }
    }

    /// An ADD failed and will be retried; its reason is counted by gRPC code and message (each run
    /// of digits in the message blanked to `#`, so the same reason with other figures counts once).
    fn retried(&self, status: &tonic::Status) {
        self.retries.fetch_add(1, Ordering::Relaxed);
        if is_throttling(status) {
            self.throttle_retries.fetch_add(1, Ordering::Relaxed);
        }
        let mut message = String::new();
        for c in status.message().chars().take(200) {
            if !c.is_ascii_digit() {
                message.push(c);
            } else if !message.ends_with('#') {
                message.push('#');
            }
        }
        *self
            .retry_reasons
            .lock()
            .expect("reasons")
            .entry(format!("{:?}: {message}", status.code()))
            .or_default() += 1;
    }

    fn record(&self, r: PodRecord) {
        if r.served {
            self.served.fetch_add(1, Ordering::Relaxed);
        }
        self.records.lock().expect("records").push(r);
    }

    /// Pods served or given up.
    pub fn resolved(&self) -> u64 {
        self.records.lock().expect("records").len() as u64
    }

    pub async fn release(&self, client: &mut IpamClient<Channel>, name: &str) {
        if client.release(support::release_req(name)).await.is_err() {
            self.release_errors.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kubelet_retries_after_ten_to_fifteen_seconds_spread_evenly() {
        let mut rng = StdRng::seed_from_u64(25);
        let draws: Vec<f64> = (0..10_000)
            .map(|_| kubelet_retry(&mut rng).as_secs_f64())
            .collect();
        assert!(draws.iter().all(|d| (10.0..15.0).contains(d)));
        // U[10, 15): mean 12.5, and each second of the range gets about a fifth of the draws.
        let mean = draws.iter().sum::<f64>() / draws.len() as f64;
        assert!((12.4..12.6).contains(&mean), "{mean}");
        for s in 10..15 {
            let share = draws.iter().filter(|d| d.floor() as i32 == s).count() as f64 / 1e4;
            assert!((0.18..0.22).contains(&share), "[{s}, {}): {share}", s + 1);
        }
        // The same seed draws the same delays.
        let mut again = StdRng::seed_from_u64(25);
        assert_eq!(kubelet_retry(&mut again).as_secs_f64(), draws[0]);
        assert_eq!(
            add_deadline(),
            Duration::from_millis(eniipam_cni::netconf::DEFAULT_TIMEOUT_MS)
        );
    }

    #[test]
    fn a_pods_add_follows_its_binding_by_a_fifth_to_three_fifths_of_a_second() {
        let mut rng = StdRng::seed_from_u64(25);
        let leads: Vec<f64> = (0..10_000)
            .map(|_| bind_to_add(&mut rng).as_secs_f64())
            .collect();
        assert!(leads.iter().all(|l| (0.2..0.6).contains(l)));
        let mean = leads.iter().sum::<f64>() / leads.len() as f64;
        assert!((0.39..0.41).contains(&mean), "{mean}");
    }

    #[test]
    fn throttling_failures_are_told_from_the_others() {
        let throttled = tonic::Status::resource_exhausted(
            "cloud call failed: AssignPrivateIpAddresses: gave up after 3 attempts: AssignPrivateIpAddresses: throttled by EC2 (RequestLimitExceeded)",
        );
        let backing_off = tonic::Status::resource_exhausted(
            "ENI eni-0a is backing off for 800ms after: AssignPrivateIpAddresses: gave up",
        );
        let full = tonic::Status::resource_exhausted("node is full: 56 of 56 pod IPs in use");
        assert!(is_throttling(&throttled));
        assert!(is_throttling(&backing_off));
        assert!(!is_throttling(&full));
        let rec = Recorder::new();
        rec.retried(&throttled);
        rec.retried(&full);
        assert_eq!(rec.retries.load(Ordering::Relaxed), 2);
        assert_eq!(rec.throttle_retries.load(Ordering::Relaxed), 1);
    }
}
