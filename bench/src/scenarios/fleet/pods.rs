//! The pods of a pattern: one task per node starts its pods at their instants; each pod ADDs (retried
//! as kubelet does) until it has an IP, and DELs when its life ends. A [`Recorder`] collects what
//! they report.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use eniipam_api::pb::ipam_client::IpamClient;
use tokio::task::AbortHandle;
use tokio::time::Instant;
use tonic::transport::Channel;

use super::traffic::{Life, Plan, PodPlan};
use crate::support;

/// How long a pod waits before its runtime retries a failed ADD (kubelet re-syncs the sandbox).
pub const POD_RETRY: Duration = Duration::from_secs(2);

/// The name of the `i`th pod running on `node` before the pattern starts.
pub fn running_name(node: usize, i: usize) -> String {
    format!("run-{node}-{i}")
}

/// One task per node that starts its pods at their instants, each pod a task of its own.
pub fn spawn_drivers(
    plan: &Plan,
    clients: &[IpamClient<Channel>],
    t0: Instant,
    deadline: Instant,
    rec: &Arc<Recorder>,
    tasks: &Arc<Mutex<Vec<AbortHandle>>>,
) {
    let mut by_node: BTreeMap<usize, Vec<PodPlan>> = BTreeMap::new();
    for p in &plan.pods {
        by_node.entry(p.node).or_default().push(*p);
    }
    for (node, pods) in by_node {
        let client = clients[node].clone();
        let rec = rec.clone();
        let spawned = tasks.clone();
        let h = tokio::spawn(async move {
            for (i, p) in pods.into_iter().enumerate() {
                tokio::time::sleep_until(t0 + p.start).await;
                let pod = Pod {
                    name: format!("pod-{node}-{i}"),
                    plan: p,
                    client: client.clone(),
                    rec: rec.clone(),
                };
                let h = tokio::spawn(pod.run(t0, deadline));
                spawned.lock().expect("tasks").push(h.abort_handle());
            }
        });
        tasks.lock().expect("tasks").push(h.abort_handle());
    }
}

/// One pod started during the pattern.
struct Pod {
    name: String,
    plan: PodPlan,
    client: IpamClient<Channel>,
    rec: Arc<Recorder>,
}

impl Pod {
    /// ADD (retried after `POD_RETRY` while it fails, as kubelet does) until it has an IP or the
    /// deadline passes; then, if it has a lifetime, DEL when that ends.
    async fn run(mut self, t0: Instant, deadline: Instant) {
        let started = Instant::now();
        let add = async {
            loop {
                match self.client.allocate(support::alloc_req(&self.name)).await {
                    Ok(_) => break,
                    Err(status) => {
                        self.rec.retried(&status);
                        tokio::time::sleep(POD_RETRY).await;
                    }
                }
            }
        };
        let served = tokio::time::timeout_at(deadline, add).await.is_ok();
        let now = Instant::now();
        self.rec.record(PodRecord {
            wave: self.plan.wave,
            wait_ms: (now - started).as_secs_f64() * 1e3,
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
        self.rec.release(&mut self.client, &self.name).await;
    }
}

/// One pod's outcome.
#[derive(Clone, Copy, Debug)]
pub struct PodRecord {
    pub wave: u8,
    pub wait_ms: f64,
    /// When it had its IP (or was given up), from the pattern's start.
    pub done_at_s: f64,
    pub served: bool,
}

/// What the pods report, shared by their tasks.
pub struct Recorder {
    pub records: Mutex<Vec<PodRecord>>,
    pub served: AtomicU64,
    pub retries: AtomicU64,
    pub retry_reasons: Mutex<BTreeMap<String, u64>>,
    pub release_errors: AtomicU64,
}

impl Recorder {
    pub fn new() -> Self {
        Self {
            records: Mutex::new(Vec::new()),
            served: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            retry_reasons: Mutex::new(BTreeMap::new()),
            release_errors: AtomicU64::new(0),
        }
    }

    /// An ADD failed and will be retried; its reason is counted by gRPC code and message (each run
    /// of digits in the message blanked to `#`, so the same reason with other figures counts once).
    fn retried(&self, status: &tonic::Status) {
        self.retries.fetch_add(1, Ordering::Relaxed);
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
