//! Shared setup of the cloud-layer integration tests: a mockcloud with the fast profile and the real
//! EC2 and IMDS clients pointed at it, with short timeouts and backoffs so each test takes seconds.

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_ec2::config::Credentials;
use eniipam::cloud::calls::CallStats;
use eniipam::cloud::ec2::{Ec2Cloud, Ec2Config};
use eniipam::cloud::imds::{ImdsConfig, ImdsMetadata};
use eniipam::cloud::lifecycle::{EniLifecycle, LifecycleConfig};
use eniipam::cloud::limiter::{BackoffPolicy, BucketConfig, LimiterConfig, RateLimitConfig};
use eniipam::cloud::{Cloud, CreateEni, Eni, Metadata, NodeContext, tags};
use eniipam::model::EniId;
use eniipam::pool::{Pool, PoolConfig, PoolSeed};
use mockcloud::{LaunchedInstance, MockCloud};

pub const CLUSTER: &str = "test-cluster";

/// Generous rates (tests that measure rates set their own) and quick retries.
pub fn fast_limiter() -> LimiterConfig {
    LimiterConfig {
        rates: RateLimitConfig {
            mutating: BucketConfig {
                qps: 500.0,
                burst: 100,
            },
            describe: BucketConfig {
                qps: 500.0,
                burst: 100,
            },
        },
        retry: BackoffPolicy {
            base: Duration::from_millis(5),
            cap: Duration::from_millis(50),
            max_attempts: 12,
            max_elapsed: Duration::from_secs(5),
        },
        per_api: Default::default(),
    }
}

pub fn fast_lifecycle() -> LifecycleConfig {
    let poll = BackoffPolicy::polling(
        Duration::from_millis(10),
        Duration::from_millis(100),
        Duration::from_secs(3),
    );
    LifecycleConfig {
        imds_wait: poll,
        detach_wait: poll,
        delete_wait: poll,
    }
}

pub struct Env {
    pub mock: MockCloud,
    pub cloud: Arc<Ec2Cloud>,
    pub imds: Arc<ImdsMetadata>,
    pub stats: Arc<CallStats>,
    pub instance: LaunchedInstance,
    pub node: NodeContext,
}

impl Env {
    pub async fn start() -> Self {
        Self::start_with(
            mockcloud::Config::fast(),
            fast_limiter(),
            Duration::from_millis(500),
        )
        .await
    }

    pub async fn start_with(
        mock_config: mockcloud::Config,
        limiter: LimiterConfig,
        call_timeout: Duration,
    ) -> Self {
        let mock = MockCloud::start(mock_config)
            .await
            .expect("mockcloud starts");
        let instance = mock.default_instance();
        let stats = Arc::new(CallStats::new());
        let cloud = Arc::new(ec2_client(&mock, limiter, call_timeout, stats.clone()).await);
        let imds = Arc::new(
            ImdsMetadata::new(
                &ImdsConfig {
                    endpoint: Some(instance.imds_url.clone()),
                    ..Default::default()
                },
                stats.clone(),
            )
            .expect("IMDS client"),
        );
        let limits = cloud
            .instance_limits(&instance.instance_type)
            .await
            .expect("instance limits");
        let node = NodeContext {
            cluster_name: CLUSTER.to_owned(),
            instance_id: instance.instance_id.clone(),
            instance_type: instance.instance_type.clone(),
            availability_zone: instance.availability_zone.clone(),
            vpc_id: instance.vpc_id.clone(),
            subnet_id: instance.subnet_id.clone(),
            security_groups: instance.security_groups.clone(),
            limits,
            pod_subnets: Vec::new(),
        };
        Self {
            mock,
            cloud,
            imds,
            stats,
            instance,
            node,
        }
    }

    pub fn lifecycle(&self, config: LifecycleConfig) -> EniLifecycle {
        EniLifecycle::new(
            self.cloud.clone(),
            self.imds.clone(),
            self.node.clone(),
            config,
        )
    }

    /// A pool on this node with `config`, seeded from its IMDS (no ENI of ours yet). mockcloud's
    /// counters are reset after, so the test counts what the pool does from here on.
    pub async fn pool(&self, config: PoolConfig) -> Pool {
        let interfaces = self.imds.interfaces().await.expect("IMDS interfaces");
        let pool = Pool::start(
            config,
            self.cloud.clone(),
            self.imds.clone(),
            self.node.clone(),
            PoolSeed::from_metadata(&interfaces, &[]),
        )
        .expect("pool starts");
        self.mock.reset_counters();
        pool
    }

    /// Create an ENI directly (not through the lifecycle) with exactly these tags.
    pub async fn create_raw(&self, tags: &[(&str, &str)], secondary: u32) -> Eni {
        self.cloud
            .create_eni(&CreateEni {
                subnet_id: self.node.subnet_id.clone(),
                security_groups: self.node.security_groups.clone(),
                description: "raw test ENI".into(),
                secondary_ip_count: secondary,
                prefix_count: 0,
                private_ips: Vec::new(),
                tags: tags
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
                client_token: uuid::Uuid::new_v4().to_string(),
                live_ip_count: None,
            })
            .await
            .expect("create ENI")
    }

    /// ENI ids EC2 (the mock) knows now.
    pub fn eni_ids(&self) -> Vec<String> {
        self.mock
            .network_interfaces()
            .into_iter()
            .map(|e| e.id)
            .collect()
    }
}

pub async fn ec2_client(
    mock: &MockCloud,
    limiter: LimiterConfig,
    call_timeout: Duration,
    stats: Arc<CallStats>,
) -> Ec2Cloud {
    Ec2Cloud::new(
        &Ec2Config {
            region: Some("us-east-1".into()),
            endpoint_url: Some(mock.ec2_url()),
            credentials: Some(Credentials::new("AKIDTEST", "secret", None, None, "test")),
            call_timeout,
            connect_timeout: Duration::from_millis(500),
            limiter,
            ..Default::default()
        },
        stats,
    )
    .await
    .expect("EC2 client")
}

/// Our full tag set for `instance_id`, created at `created_at` (RFC 3339).
pub fn our_tags<'a>(instance_id: &'a str, created_at: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        (tags::OWNER, tags::OWNER_VALUE),
        (tags::CLUSTER, CLUSTER),
        (tags::INSTANCE_ID, instance_id),
        (tags::CREATED_AT, created_at),
    ]
}

pub fn tag_map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// The addresses mockcloud holds on `eni`: its primary and its secondaries.
pub fn ips_on(env: &Env, eni: &EniId) -> BTreeSet<Ipv4Addr> {
    let view = env
        .mock
        .network_interfaces()
        .into_iter()
        .find(|e| e.id == eni.as_str())
        .expect("ENI exists in mockcloud");
    std::iter::once(view.primary_ip)
        .chain(view.secondary_ips)
        .collect()
}
