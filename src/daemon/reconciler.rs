//! The running reconcile: one pass at a time, every `reconcile_period_secs` ±20 % and on demand.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::cloud::{Cloud, CloudError, Metadata, Purpose, with_purpose};
use crate::ipam::Ipam;
use crate::metrics::Metrics;
use crate::reconcile::api_server::ApiServerGc;
use crate::reconcile::{self};

/// The running reconcile's parts: one pass at a time (the periodic task and `reconcile_now` share the
/// memory of what earlier passes saw).
#[derive(Clone)]
pub(super) struct Reconciler {
    pub(super) ipam: Ipam,
    pub(super) cloud: Arc<dyn Cloud>,
    /// IMDS: the ids of the ENIs attached here, by which the pass describes them.
    pub(super) metadata: Arc<dyn Metadata>,
    pub(super) api_server: Option<ApiServerGc>,
    pub(super) instance_id: String,
    pub(super) vpc_id: String,
    pub(super) host: reconcile::HostView,
    pub(super) memory: Arc<tokio::sync::Mutex<reconcile::Memory>>,
    pub(super) metrics: Metrics,
}

impl Reconciler {
    pub(super) async fn pass(&self) -> Result<reconcile::PassReport, CloudError> {
        let mut memory = self.memory.lock().await;
        let r = with_purpose(
            Purpose::Reconcile,
            reconcile::pass(
                &self.ipam,
                self.cloud.as_ref(),
                &reconcile::NodeEnis {
                    instance_id: &self.instance_id,
                    vpc_id: &self.vpc_id,
                    metadata: Some(self.metadata.as_ref()),
                },
                &self.host,
                &mut memory,
                self.api_server.as_ref(),
            ),
        )
        .await?;
        let m = &self.metrics;
        m.netns_gc_released
            .inc_by((r.released_dead.len() + r.released_dead_ipv6.len()) as u64);
        if self.ipam.ipv6().is_some() {
            // 0 while EC2 does not show the node's /80 on its ENI (the pass logs why).
            m.ipv6_prefixes.set(i64::from(!r.ipv6_prefix_missing));
        }
        m.drift_missing_in_ec2.set(r.missing_in_ec2.len() as i64);
        m.drift_unknown_to_pool.set(r.unknown_to_pool.len() as i64);
        m.lost_pods.inc_by(r.lost.len() as u64);
        m.forgotten_enis.inc_by(r.forgotten_enis.len() as u64);
        Ok(r)
    }
}

/// The running reconcile, every `period` ±20 %.
pub(super) fn spawn_reconcile(
    reconciler: Reconciler,
    period: Duration,
    cancel: CancellationToken,
) -> JoinHandle<()> {
    use rand::Rng;
    tokio::spawn(async move {
        loop {
            let wait = period.mul_f64(rand::rng().random_range(0.8..1.2));
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
            if let Err(e) = reconciler.pass().await {
                tracing::warn!(error = %e, "reconcile pass failed; trying again next period");
            }
        }
    })
}
