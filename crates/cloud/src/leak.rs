//! The leaked-ENI collector: finds ENIs eniipam created that nobody uses any more and deletes them.
//!
//! ENIs leak when a node or the daemon dies between create and attach, or between detach and delete
//! (AWS VPC CNI issue #608: detach-then-delete takes seconds). Every ENI eniipam creates is tagged
//! in the create call itself, so the collector can find them: on a jittered period it asks EC2 for
//! `available` ENIs in our VPC with our cluster tag and our owner tag, and deletes those that
//!
//! - are managed by us (owner tag, no `eniipam.io/no-manage=true`),
//! - are not attached to anything (checked again on the described state, not only by the filter),
//! - are older than the grace period by their `eniipam.io/created-at` tag (default 5 minutes, so an
//!   ENI between create and attach on a live node is never taken). An ENI without a parseable
//!   creation time is tagged with the current time and left for a later run.
//!
//! Ages use the wall clock (the tag is wall-clock time); [`LeakCollector::run_once_at`] takes
//! "now" explicitly for tests.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use rand::Rng;
use serde::Serialize;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::{AttachmentStatus, Cloud, EniFilter, EniStatus, Purpose, tags, with_purpose};

/// Settings of the collector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeakConfig {
    /// Minimum age (by the created-at tag) before an available ENI is deleted. Default 5 min: longer
    /// than any create → attach window, and the AWS VPC CNI's `eniDeleteCooldownTime`.
    pub grace: Duration,
}

impl Default for LeakConfig {
    fn default() -> Self {
        Self {
            grace: Duration::from_secs(5 * 60),
        }
    }
}

/// What one run (or all runs, in [`LeakCollector::totals`]) did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LeakReport {
    /// Runs counted (1 for a single report).
    pub runs: u64,
    /// ENIs the filtered describe returned.
    pub found: u64,
    /// Deleted by us.
    pub deleted: u64,
    /// Already gone when we tried to delete (someone else did).
    pub already_gone: u64,
    /// Younger than the grace period.
    pub skipped_young: u64,
    /// Not ours (no owner tag, other cluster) or carrying the opt-out tag.
    pub skipped_not_ours: u64,
    /// Attached or not `available` by the time we looked.
    pub skipped_attached: u64,
    /// Without a parseable created-at tag: tagged now, deleted on a later run.
    pub tagged: u64,
    /// Describe, tag or delete calls that failed.
    pub errors: u64,
}

impl LeakReport {
    fn add(&mut self, o: &LeakReport) {
        self.runs += o.runs;
        self.found += o.found;
        self.deleted += o.deleted;
        self.already_gone += o.already_gone;
        self.skipped_young += o.skipped_young;
        self.skipped_not_ours += o.skipped_not_ours;
        self.skipped_attached += o.skipped_attached;
        self.tagged += o.tagged;
        self.errors += o.errors;
    }
}

/// Deletes this cluster's leaked ENIs in one VPC.
pub struct LeakCollector {
    cloud: Arc<dyn Cloud>,
    cluster_name: String,
    vpc_id: String,
    config: LeakConfig,
    totals: Mutex<LeakReport>,
}

impl std::fmt::Debug for LeakCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeakCollector")
            .field("cluster_name", &self.cluster_name)
            .field("vpc_id", &self.vpc_id)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl LeakCollector {
    /// A collector for `cluster_name`'s ENIs in `vpc_id`.
    pub fn new(
        cloud: Arc<dyn Cloud>,
        cluster_name: impl Into<String>,
        vpc_id: impl Into<String>,
        config: LeakConfig,
    ) -> Self {
        Self {
            cloud,
            cluster_name: cluster_name.into(),
            vpc_id: vpc_id.into(),
            config,
            totals: Mutex::new(LeakReport::default()),
        }
    }

    /// The sum of every run so far.
    pub fn totals(&self) -> LeakReport {
        *self.totals.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One collection pass, aged against the wall clock.
    pub async fn run_once(&self) -> LeakReport {
        self.run_once_at(SystemTime::now()).await
    }

    /// One collection pass, with ages computed against `now`.
    pub async fn run_once_at(&self, now: SystemTime) -> LeakReport {
        let report = self.collect(now).await;
        self.totals
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .add(&report);
        if report.deleted > 0 || report.errors > 0 {
            tracing::info!(?report, "leaked-ENI collection");
        } else {
            tracing::debug!(?report, "leaked-ENI collection");
        }
        report
    }

    async fn collect(&self, now: SystemTime) -> LeakReport {
        let mut r = LeakReport {
            runs: 1,
            ..Default::default()
        };
        let filter = EniFilter {
            status: Some(EniStatus::Available),
            vpc_id: Some(self.vpc_id.clone()),
            tags: BTreeMap::from([(tags::CLUSTER.to_owned(), self.cluster_name.clone())]),
            tag_keys: vec![tags::OWNER.to_owned()],
            ..Default::default()
        };
        let enis = match self.cloud.describe_enis(&filter).await {
            Ok(enis) => enis,
            Err(e) => {
                tracing::warn!(error = %e, "leaked-ENI collection: describe failed");
                r.errors += 1;
                return r;
            }
        };
        r.found = enis.len() as u64;
        for eni in enis {
            // The filter is EC2's; check again on what came back, the cost of a mistake is an outage.
            if !eni.is_managed_by_us()
                || eni.tags.get(tags::CLUSTER) != Some(&self.cluster_name)
                || eni.vpc_id != self.vpc_id
            {
                r.skipped_not_ours += 1;
                continue;
            }
            let attached = eni
                .attachment
                .as_ref()
                .is_some_and(|a| a.status != AttachmentStatus::Detached);
            if eni.status != EniStatus::Available || attached {
                r.skipped_attached += 1;
                continue;
            }
            let created = eni
                .tags
                .get(tags::CREATED_AT)
                .and_then(|t| humantime::parse_rfc3339_weak(t).ok());
            let Some(created) = created else {
                let stamp = BTreeMap::from([(
                    tags::CREATED_AT.to_owned(),
                    humantime::format_rfc3339_seconds(now).to_string(),
                )]);
                match self.cloud.create_tags(eni.id.as_str(), &stamp).await {
                    Ok(()) => {
                        tracing::info!(eni = %eni.id, "leaked-ENI candidate without created-at: tagged, will age");
                        r.tagged += 1;
                    }
                    Err(e) => {
                        tracing::warn!(eni = %eni.id, error = %e, "could not tag leaked-ENI candidate");
                        r.errors += 1;
                    }
                }
                continue;
            };
            // A creation time in the future (clock skew) counts as young.
            let young = now
                .duration_since(created)
                .map_or(true, |age| age < self.config.grace);
            if young {
                r.skipped_young += 1;
                continue;
            }
            match self.cloud.delete_eni(&eni.id).await {
                Ok(()) => {
                    tracing::info!(eni = %eni.id, created = %humantime::format_rfc3339_seconds(created), "deleted leaked ENI");
                    r.deleted += 1;
                }
                Err(e) if e.is_not_found() => r.already_gone += 1,
                Err(e) => {
                    tracing::warn!(eni = %eni.id, error = %e, "could not delete leaked ENI");
                    r.errors += 1;
                }
            }
        }
        r
    }

    /// Run every `period` (±20 % jitter, and a first run after a random delay in `[0, period)`, so
    /// a fleet started together does not describe in lockstep) until `cancel` fires.
    pub fn spawn(self: Arc<Self>, period: Duration, cancel: CancellationToken) -> JoinHandle<()> {
        tokio::spawn(async move {
            let mut delay = jittered_start(period, &mut rand::rng());
            loop {
                tokio::select! {
                    biased;
                    _ = cancel.cancelled() => break,
                    _ = tokio::time::sleep(delay) => {}
                }
                tokio::select! {
                    biased;
                    _ = cancel.cancelled() => break,
                    _ = with_purpose(Purpose::Reconcile, self.run_once()) => {}
                }
                delay = jittered_period(period, &mut rand::rng());
            }
            tracing::debug!("leaked-ENI collector stopped");
        })
    }
}

/// The first run's delay: uniform in `[0, period)`.
pub fn jittered_start<R: Rng + ?Sized>(period: Duration, rng: &mut R) -> Duration {
    period.mul_f64(rng.random_range(0.0..1.0))
}

/// A period with ±20 % jitter.
pub fn jittered_period<R: Rng + ?Sized>(period: Duration, rng: &mut R) -> Duration {
    period.mul_f64(rng.random_range(0.8..=1.2))
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    use super::*;

    #[test]
    fn jitter_stays_in_bounds() {
        let mut rng = StdRng::seed_from_u64(7);
        let p = Duration::from_secs(3600);
        for _ in 0..1000 {
            let s = jittered_start(p, &mut rng);
            assert!(s < p);
            let d = jittered_period(p, &mut rng);
            assert!(d >= p.mul_f64(0.8) && d <= p.mul_f64(1.2));
        }
    }

    #[test]
    fn reports_add_up() {
        let mut t = LeakReport::default();
        let one = LeakReport {
            runs: 1,
            found: 3,
            deleted: 1,
            skipped_young: 1,
            tagged: 1,
            ..Default::default()
        };
        t.add(&one);
        t.add(&one);
        assert_eq!(t.runs, 2);
        assert_eq!(t.found, 6);
        assert_eq!(t.deleted, 2);
    }
}
