//! Synthetic pod churn through the plugin's gRPC client path, and the simulation's status lines.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use rand::Rng;
use tokio::task::JoinHandle;

use super::CHURN_LIFETIME_MS;
use crate::pool::Pool;

/// Synthetic pods over the plugin's API: every `1/rate` s one pod is allocated with the same gRPC
/// `Allocate` request the `eniipam` plugin sends (IPAM role: nothing is wired), its result is written to
/// the plugin's result cache as the plugin does, it lives [`CHURN_LIFETIME_MS`], and is released the
/// same way. Pods
/// name the daemon's own network namespace (`/proc/self/ns/net`), which always exists.
pub fn spawn_churn(socket: PathBuf, cache_dir: PathBuf, rate: f64) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
        let mut n: u64 = 0;
        loop {
            tick.tick().await;
            n += 1;
            let lifetime = Duration::from_millis(rand::rng().random_range(CHURN_LIFETIME_MS));
            let pod = SyntheticPod::new(n, &socket, &cache_dir);
            tokio::spawn(async move {
                if let Err(e) = pod.add().await {
                    tracing::warn!(pod = %pod.container_id, error = %e, "churn ADD failed");
                    return;
                }
                tokio::time::sleep(lifetime).await;
                if let Err(e) = pod.del().await {
                    tracing::warn!(pod = %pod.container_id, error = %e, "churn DEL failed");
                }
            });
        }
    })
}

/// The network name synthetic pods are attached to.
const CHURN_NETWORK: &str = "simulate";

/// One synthetic pod: what the plugin would send and cache for it.
struct SyntheticPod {
    container_id: String,
    pod: eniipam_api::PodRef,
    socket: PathBuf,
    cache: eniipam_api::cache::ResultCache,
}

impl SyntheticPod {
    fn new(n: u64, socket: &std::path::Path, cache_dir: &std::path::Path) -> Self {
        let container_id = format!("churn-{n:08}");
        Self {
            pod: eniipam_api::PodRef {
                namespace: "churn".into(),
                name: format!("pod-{n}"),
                uid: container_id.clone(),
            },
            container_id,
            socket: socket.to_owned(),
            cache: eniipam_api::cache::ResultCache::new(cache_dir, CHURN_NETWORK),
        }
    }

    async fn client(
        &self,
    ) -> anyhow::Result<eniipam_api::pb::ipam_client::IpamClient<tonic::transport::Channel>> {
        let channel = eniipam_api::connect(&self.socket)
            .await
            .with_context(|| format!("cannot connect to {}", self.socket.display()))?;
        Ok(eniipam_api::pb::ipam_client::IpamClient::new(channel))
    }

    async fn add(&self) -> anyhow::Result<()> {
        use eniipam_api::pb;
        let reply = self
            .client()
            .await?
            .allocate(pb::AllocateRequest {
                api_version: eniipam_api::API_VERSION,
                container_id: self.container_id.clone(),
                ifname: "eth0".into(),
                netns: "/proc/self/ns/net".into(),
                pod: Some(pb::Pod {
                    namespace: self.pod.namespace.clone(),
                    name: self.pod.name.clone(),
                    uid: self.pod.uid.clone(),
                }),
                network: CHURN_NETWORK.into(),
                ..Default::default()
            })
            .await?
            .into_inner();
        let ip = reply.ip.parse().context("the daemon answered a bad IP")?;
        self.cache
            .write(&eniipam_api::cache::CacheEntry {
                format: eniipam_api::cache::CACHE_FORMAT,
                network: CHURN_NETWORK.into(),
                container_id: self.container_id.clone(),
                ifname: "eth0".into(),
                netns: "/proc/self/ns/net".into(),
                pod: Some(self.pod.clone()),
                sticky_key: None,
                ip,
                route_table: reply.route_table,
                eni_id: reply.eni_id.clone(),
                host_veth: None,
                egress_ipv4: None,
                own_eni_egress: false,
                result: serde_json::json!({"cniVersion": "1.0.0", "ips": [{"address": format!("{ip}/32")}]}),
            })
            .context("cannot write the result cache")?;
        tracing::debug!(pod = %self.container_id, %ip, "churn ADD");
        Ok(())
    }

    async fn del(&self) -> anyhow::Result<()> {
        self.client()
            .await?
            .release(eniipam_api::pb::ReleaseRequest {
                api_version: eniipam_api::API_VERSION,
                container_id: self.container_id.clone(),
                ifname: "eth0".into(),
                network: CHURN_NETWORK.into(),
                ..Default::default()
            })
            .await?;
        self.cache
            .remove(&eniipam_api::AttachmentKey::new(
                self.container_id.clone(),
                "eth0",
            ))
            .context("cannot remove the result cache entry")?;
        Ok(())
    }
}

/// One status line every `every`.
pub fn spawn_status(pool: Pool, every: Duration) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        loop {
            tick.tick().await;
            let s = pool.snapshot();
            println!(
                "pool: {} ENIs, capacity {}, assigned {}, idle {} (+{} cooling, {} sticky), in flight {}{}",
                s.enis.len(),
                s.capacity,
                s.assigned,
                s.idle_eligible,
                s.cooling,
                s.reserved,
                s.in_flight,
                s.exhaustion
                    .as_ref()
                    .map(|r| format!(", EXHAUSTED: {r}"))
                    .unwrap_or_default()
            );
        }
    })
}
