//! Shared setup for the pool tests: a node on [`MemoryCloud`], a pool on it, and helpers.
#![allow(dead_code)]

/// The in-memory fake cloud, its own crate (`mocks/memcloud`).
pub use eniipam_memcloud as memory_cloud;

use std::sync::Arc;
use std::time::Duration;

use eniipam::cloud::lifecycle::{EniLifecycle, LifecycleConfig};
use eniipam::cloud::{CloudError, InstanceLimits, Metadata, NodeContext};
use eniipam::model::{AttachmentKey, EniId, PodRef};
use eniipam::pool::config::WarmPolicy;
use eniipam::pool::{Allocation, Pool, PoolConfig, PoolError, PoolSeed};
use memory_cloud::{MemoryCloud, NodeSpec};

/// A config that leaves the pool alone unless a test says otherwise: no warm pool (the `fixed`
/// policy with `min_idle` 0, so a burst of acquires does not warm more; tests/pool_adaptive.rs
/// tests the adaptive default), a high ceiling, a tick far away (tests drive rounds with
/// `maintain_now`). eth0 does not serve pods, so the
/// secondary-ENI mechanics (create, attach, give back, delete) are what a burst exercises; the
/// tests of eth0 and of prefix delegation start from [`eth0_config`] and [`prefix_config`].
pub fn quiet_config() -> PoolConfig {
    PoolConfig {
        warm_policy: WarmPolicy::Fixed,
        min_idle: 0,
        max_idle: 100,
        maintainer_tick: Duration::from_secs(3600),
        use_primary_eni: false,
        ..PoolConfig::default()
    }
}

/// [`quiet_config`] with the default of serving pods from eth0's secondary IPs too.
pub fn eth0_config() -> PoolConfig {
    PoolConfig {
        use_primary_eni: true,
        ..quiet_config()
    }
}

/// [`eth0_config`] with prefix delegation: every slot is a `/28` of 16 addresses.
pub fn prefix_config() -> PoolConfig {
    PoolConfig {
        prefix_delegation: true,
        ..eth0_config()
    }
}

/// The adaptive default with room: 49 pod IPs per ENI, `max_idle` 40, so what the levels ask for
/// fits eth0 in one assign call.
pub fn roomy() -> (PoolConfig, NodeSpec) {
    let config = PoolConfig {
        max_idle: 40,
        maintainer_tick: Duration::from_secs(3600),
        ..PoolConfig::default()
    };
    let spec = NodeSpec {
        limits: InstanceLimits::new(4, 50),
        ..NodeSpec::default()
    };
    (config, spec)
}

pub struct Node {
    pub cloud: Arc<MemoryCloud>,
    pub node: NodeContext,
    pub pool: Pool,
}

/// A node with only eth0, and a pool on it.
pub async fn start(config: PoolConfig, spec: NodeSpec) -> Node {
    start_with_enis(config, spec, &[]).await
}

/// A node with eth0 plus one managed ENI per entry of `enis` (holding that many secondary IPs),
/// created through the real lifecycle and seeded into the pool from IMDS.
pub async fn start_with_enis(config: PoolConfig, spec: NodeSpec, enis: &[u32]) -> Node {
    let (cloud, node) = MemoryCloud::with_node(spec);
    let lifecycle = EniLifecycle::new(
        cloud.clone(),
        cloud.clone(),
        node.clone(),
        LifecycleConfig::default(),
    );
    let mut managed: Vec<EniId> = Vec::new();
    for (i, n) in enis.iter().enumerate() {
        let eni = lifecycle
            .create_and_attach(*n, i as u32 + 1)
            .await
            .expect("seed ENI");
        managed.push(eni.id);
    }
    let interfaces = cloud.interfaces().await.expect("IMDS");
    let seed = PoolSeed::from_metadata(&interfaces, &managed);
    cloud.reset_calls();
    let pool =
        Pool::start(config, cloud.clone(), cloud.clone(), node.clone(), seed).expect("pool starts");
    Node { cloud, node, pool }
}

pub fn key(n: usize) -> AttachmentKey {
    AttachmentKey::new(format!("container-{n}"), "eth0")
}

pub fn pod(n: usize) -> PodRef {
    PodRef {
        namespace: "default".into(),
        name: format!("pod-{n}"),
        uid: format!("uid-{n}"),
    }
}

/// Acquires for attachments `range` concurrently (all routed before any actor runs).
pub async fn acquire_many(
    pool: &Pool,
    range: std::ops::Range<usize>,
) -> Vec<Result<Allocation, PoolError>> {
    futures::future::join_all(range.map(|n| pool.acquire(key(n), pod(n), None, None))).await
}

/// Lets spawned tasks run without moving the clock.
pub async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

/// What the cloud layer returns once EC2 has throttled every attempt of a call to `api`.
pub fn throttled(api: &str) -> CloudError {
    CloudError::RetriesExhausted {
        api: api.into(),
        attempts: 5,
        last: format!("{api}: throttled by EC2 (RequestLimitExceeded)"),
        throttled: true,
    }
}
