//! `eniipamd` as a library: [`Daemon::start`] builds and runs everything the binary runs, so the binary,
//! `--simulate`, the integration tests and the fleet simulation all start the same real daemon.
//!
//! Startup order (nothing is served before the rebuild): metrics listener (`/readyz` false) → state
//! file → IMDS identity → EC2 instance, limits and eth0 → rebuild from file + IMDS + EC2 + host → write
//! the rebuilt state → pool → host routing and rules (SNAT, NodePort) → leaked-ENI collector → gRPC
//! socket → ready.
//!
//! Shutdown in three steps: stop accepting, let in-flight requests finish within the grace period, then
//! stop the pool and close the file. Live pods' IPs are left alone (they are in the file and in EC2).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use aws_sdk_ec2::config::Credentials;
use ipnet::Ipv4Net;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::cloud::calls::CallStats;
use crate::cloud::ec2::{Ec2Cloud, Ec2Config};
use crate::cloud::imds::{ImdsConfig, ImdsMetadata};
use crate::cloud::leak::{LeakCollector, LeakConfig};
use crate::cloud::{Cloud, CloudError, Metadata, NodeContext};
use crate::config::DaemonConfig;
use crate::ipam::Ipam;
use crate::pool::PoolSeed;
use crate::pool::{Pool, PoolError};
use crate::reconcile::{self, ReconcileReport};
use crate::rpc::{IntrospectService, IpamService, SocketError, bind_socket, pb};
use crate::store::{Store, StoreError};
use crate::telemetry::{self, Metrics, Sources};

/// Why the daemon could not start.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("cloud: {0}")]
    Cloud(#[from] CloudError),
    #[error("cannot build the EC2 client: {0}")]
    Client(String),
    #[error("state file: {0}")]
    Store(#[from] StoreError),
    #[error("socket: {0}")]
    Socket(#[from] SocketError),
    #[error("pool: {0}")]
    Pool(#[from] PoolError),
    #[error("metrics listener on {addr}: {source}")]
    Metrics {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("host routing: {0}")]
    Host(#[from] crate::host::HostError),
    #[error("host netfilter rules (SNAT, NodePort): {0}")]
    HostRules(#[from] crate::host::RulesError),
    #[error("this node's primary interface (device 0) is not in EC2's view of {0}")]
    NoPrimaryEni(String),
}

/// The cloud clients a daemon uses (real ones from [`CloudClients::from_config`], or any other).
#[derive(Clone)]
pub struct CloudClients {
    pub cloud: Arc<dyn Cloud>,
    pub metadata: Arc<dyn Metadata>,
    pub stats: Arc<CallStats>,
}

impl CloudClients {
    /// `aws-sdk-ec2` and the `aws-config` IMDS client, as configured; `credentials` overrides the
    /// standard chain (`--simulate` and tests).
    pub async fn from_config(
        config: &DaemonConfig,
        credentials: Option<Credentials>,
    ) -> Result<Self, DaemonError> {
        let stats = Arc::new(CallStats::new());
        let cloud = Ec2Cloud::new(
            &Ec2Config {
                region: config.region.clone(),
                endpoint_url: config.ec2_endpoint.clone(),
                credentials,
                limiter: config.limiter_config(),
                ..Ec2Config::default()
            },
            stats.clone(),
        )
        .await
        .map_err(|e| DaemonError::Client(e.to_string()))?;
        let metadata = ImdsMetadata::new(
            &ImdsConfig {
                endpoint: config.imds_endpoint.clone(),
                ..ImdsConfig::default()
            },
            stats.clone(),
        )?;
        Ok(Self {
            cloud: Arc::new(cloud),
            metadata: Arc::new(metadata),
            stats,
        })
    }
}

/// A running daemon.
pub struct DaemonHandle {
    pub socket_path: PathBuf,
    pub metrics_addr: SocketAddr,
    pub pool: Pool,
    pub store: Store,
    pub node: NodeContext,
    pub report: ReconcileReport,
    pub metrics: Metrics,
    pub calls: Arc<CallStats>,
    ready: Arc<AtomicBool>,
    health: tonic_health::server::HealthReporter,
    ipam: Ipam,
    cloud: Arc<dyn Cloud>,
    cancel: CancellationToken,
    grpc: JoinHandle<()>,
    background: Vec<JoinHandle<()>>,
    grace: Duration,
}

/// Entry point.
pub struct Daemon;

/// What is shared while the daemon is being built: shutdown, readiness, metrics, background tasks.
struct Building {
    cancel: CancellationToken,
    ready: Arc<AtomicBool>,
    metrics: Metrics,
    pool_cell: Arc<OnceLock<Pool>>,
    leak_cell: Arc<OnceLock<Arc<LeakCollector>>>,
    background: Vec<JoinHandle<()>>,
}

impl Daemon {
    /// Starts with the real AWS clients built from `config`.
    pub async fn start(config: DaemonConfig) -> Result<DaemonHandle, DaemonError> {
        let clients = CloudClients::from_config(&config, None).await?;
        Self::start_with(config, clients).await
    }

    /// Starts with the given cloud clients: metrics first, then the state file, the node's identity,
    /// the rebuild, the pool and its helpers, and the socket last (see the module docs).
    pub async fn start_with(
        config: DaemonConfig,
        clients: CloudClients,
    ) -> Result<DaemonHandle, DaemonError> {
        let started = tokio::time::Instant::now();
        let mut b = Building {
            cancel: CancellationToken::new(),
            ready: Arc::new(AtomicBool::new(false)),
            metrics: Metrics::default(),
            pool_cell: Arc::new(OnceLock::new()),
            leak_cell: Arc::new(OnceLock::new()),
            background: Vec::new(),
        };
        let metrics_addr = serve_metrics(&config, &clients, &mut b).await?;
        let store = open_store(&config).await?;
        let node = discover_node(&config, &clients).await?;
        let (seed, report, vpc_cidrs) =
            rebuild(&config, &clients, &node, &store, &b.metrics).await?;
        let pool = Pool::start(
            config.pool_config(),
            clients.cloud.clone(),
            clients.metadata.clone(),
            node.clone(),
            seed,
        )?;
        let _ = b.pool_cell.set(pool.clone());
        if config.manage_eni_routes {
            spawn_host_routing(&pool, &mut b).await?;
            spawn_host_rules(&config, &clients, &mut b).await?;
        }
        if !config.cluster_name.is_empty() {
            spawn_leak_collector(&config, &clients, &node, &mut b);
        }
        let ipam = Ipam::new(
            pool.clone(),
            store.clone(),
            b.ready.clone(),
            vpc_cidrs,
            b.metrics.clone(),
        );
        b.background.push(spawn_reconcile(
            ipam.clone(),
            clients.cloud.clone(),
            node.instance_id.clone(),
            Duration::from_secs(config.reconcile_period_secs),
            b.metrics.clone(),
            b.cancel.clone(),
        ));
        let (health, grpc) = serve_grpc(&config, &node, &ipam, &b).await?;

        b.ready.store(true, Ordering::Release);
        let ms = started.elapsed().as_millis() as u64;
        b.metrics.set_startup_ms(ms);
        tracing::info!(
            instance = %node.instance_id, instance_type = %node.instance_type,
            socket = %config.socket_path.display(), metrics = %metrics_addr,
            enis = report.enis, kept = report.kept, adopted = report.adopted.len(),
            dropped = report.dropped_gone.len(),
            released = report.released_dead.len(), unknown_ips = report.unknown_ips,
            startup_ms = ms, "eniipamd ready"
        );
        Ok(DaemonHandle {
            socket_path: config.socket_path.clone(),
            metrics_addr,
            pool,
            store,
            node,
            report,
            metrics: b.metrics,
            calls: clients.stats,
            ready: b.ready,
            health,
            ipam,
            cloud: clients.cloud.clone(),
            cancel: b.cancel,
            grpc,
            background: b.background,
            grace: Duration::from_secs(config.shutdown_grace_secs),
        })
    }
}

/// Step 1: the metrics listener, so probes get a clear "starting" while the rest comes up.
async fn serve_metrics(
    config: &DaemonConfig,
    clients: &CloudClients,
    b: &mut Building,
) -> Result<SocketAddr, DaemonError> {
    let err = |source| DaemonError::Metrics {
        addr: config.metrics_addr,
        source,
    };
    let listener = telemetry::bind(config.metrics_addr).await.map_err(err)?;
    let addr = listener.local_addr().map_err(err)?;
    let sources = Sources {
        metrics: b.metrics.clone(),
        pool: b.pool_cell.clone(),
        calls: clients.stats.clone(),
        leak: b.leak_cell.clone(),
        ready: b.ready.clone(),
    };
    b.background.push(tokio::spawn(telemetry::serve(
        listener,
        sources,
        b.cancel.clone(),
    )));
    Ok(addr)
}

/// Step 2: the state file (a corrupt one is moved aside and rebuilt).
async fn open_store(config: &DaemonConfig) -> Result<Store, DaemonError> {
    let (store, opened) = Store::open(&config.state_path).await?;
    if let Some(aside) = &opened.moved_aside {
        tracing::error!(
            path = %config.state_path.display(), moved_to = %aside.display(),
            "STATE FILE WAS CORRUPT: moved aside for inspection; rebuilding from IMDS, EC2 and the host"
        );
    }
    Ok(store)
}

/// Step 3: who we are (IMDS), and what EC2 says about us: instance type, limits, eth0.
async fn discover_node(
    config: &DaemonConfig,
    clients: &CloudClients,
) -> Result<NodeContext, DaemonError> {
    let identity = clients.metadata.identity().await?;
    let instance = clients
        .cloud
        .describe_instance(&identity.instance_id)
        .await?;
    let limits = clients
        .cloud
        .instance_limits(&instance.instance_type)
        .await?;
    let eth0 = instance
        .enis
        .iter()
        .find(|e| e.attachment.as_ref().is_some_and(|a| a.device_index == 0))
        .ok_or_else(|| DaemonError::NoPrimaryEni(identity.instance_id.clone()))?;
    Ok(NodeContext {
        cluster_name: config.cluster_name.clone(),
        instance_id: identity.instance_id.clone(),
        instance_type: instance.instance_type.clone(),
        availability_zone: instance.availability_zone.clone(),
        vpc_id: instance.vpc_id.clone(),
        subnet_id: config
            .subnet_id
            .clone()
            .unwrap_or_else(|| eth0.subnet_id.clone()),
        security_groups: if config.security_groups.is_empty() {
            eth0.security_groups.clone()
        } else {
            config.security_groups.clone()
        },
        limits,
    })
}

/// Step 4: rebuild from the file, IMDS, EC2 and the host, and make the file equal the truth before
/// anything is served. Returns the pool's seed, the report and the VPC's CIDRs.
async fn rebuild(
    config: &DaemonConfig,
    clients: &CloudClients,
    node: &NodeContext,
    store: &Store,
    metrics: &Metrics,
) -> Result<(PoolSeed, ReconcileReport, Vec<Ipv4Net>), DaemonError> {
    let stored = store.load().await?;
    let host = reconcile::host_claims(&config.cni_cache_dir, &reconcile::netns_exists);
    let rebuilt = reconcile::rebuild(
        clients.cloud.as_ref(),
        clients.metadata.as_ref(),
        &node.instance_id,
        stored,
        &host,
        &reconcile::netns_exists,
    )
    .await?;
    let report = rebuilt.report;
    metrics
        .reconcile_dropped
        .inc_by(report.dropped_gone.len() as u64);
    metrics
        .reconcile_released
        .inc_by(report.released_dead.len() as u64);
    metrics.reconcile_unknown.inc_by(report.unknown_ips as u64);
    if report.foreign_state {
        tracing::warn!("the state file belonged to another instance: ignored");
    }
    store.replace_all(rebuilt.state).await?;
    let vpc_cidrs = clients
        .metadata
        .interfaces()
        .await?
        .into_iter()
        .find(|m| m.device_number == 0)
        .map(|m| m.vpc_cidrs)
        .unwrap_or_default();
    Ok((rebuilt.seed, report, vpc_cidrs))
}

/// Each secondary ENI's table (device_index + 1), kept in step with the pool: installed when an ENI
/// appears (retried until its link shows up), flushed when it goes.
async fn spawn_host_routing(pool: &Pool, b: &mut Building) -> Result<(), DaemonError> {
    let routing = crate::host::EniRouting::new().await?;
    let pool = pool.clone();
    b.background.push(
        crate::host::RouteKeeper::new(routing, Duration::from_secs(60)).spawn(
            move || crate::host::routes::pod_eni_routes(&pool.snapshot(), None),
            Duration::from_secs(2),
            b.cancel.clone(),
        ),
    );
    Ok(())
}

/// SNAT and NodePort rules (nftables table `ip eniipam`, `fwmark` rule 1024, loose rp_filter on
/// eth0), installed before the socket is served and then kept: drift healed, VPC CIDRs re-read
/// from IMDS every 30 s. Left in place on shutdown (see `host::rules_keeper`).
async fn spawn_host_rules(
    config: &DaemonConfig,
    clients: &CloudClients,
    b: &mut Building,
) -> Result<(), DaemonError> {
    let rules = crate::host::HostRules::new(crate::host::Nft::default())?;
    let mut keeper = crate::host::RulesKeeper::new(
        config.host_rules_config(),
        rules,
        clients.metadata.clone(),
        Duration::from_secs(30),
    );
    keeper.sync().await?;
    b.background.push(keeper.spawn(
        Duration::from_secs(config.host_rules_check_secs),
        b.cancel.clone(),
    ));
    Ok(())
}

/// The leaked-ENI collector (ours by cluster tag, `available`, past the grace period).
fn spawn_leak_collector(
    config: &DaemonConfig,
    clients: &CloudClients,
    node: &NodeContext,
    b: &mut Building,
) {
    let leak = Arc::new(LeakCollector::new(
        clients.cloud.clone(),
        config.cluster_name.clone(),
        node.vpc_id.clone(),
        LeakConfig {
            grace: Duration::from_secs(config.leaked_eni_grace_secs),
        },
    ));
    let _ = b.leak_cell.set(leak.clone());
    b.background.push(leak.spawn(
        Duration::from_secs(config.leaked_eni_period_secs),
        b.cancel.clone(),
    ));
}

/// Last step: the socket, with `Ipam`, `Introspect` and `grpc.health.v1`.
async fn serve_grpc(
    config: &DaemonConfig,
    node: &NodeContext,
    ipam: &Ipam,
    b: &Building,
) -> Result<(tonic_health::server::HealthReporter, JoinHandle<()>), DaemonError> {
    let listener = bind_socket(&config.socket_path).await?;
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<pb::ipam_server::IpamServer<IpamService>>()
        .await;
    let ipam_service = IpamService {
        ipam: ipam.clone(),
        metrics: b.metrics.clone(),
    };
    let introspect = IntrospectService {
        ipam: ipam.clone(),
        instance_id: node.instance_id.clone(),
        instance_type: node.instance_type.clone(),
    };
    let shutdown = b.cancel.clone();
    let grpc = tokio::spawn(async move {
        let result = tonic::transport::Server::builder()
            .add_service(health_service)
            .add_service(pb::ipam_server::IpamServer::new(ipam_service))
            .add_service(pb::introspect_server::IntrospectServer::new(introspect))
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::UnixListenerStream::new(listener),
                async move { shutdown.cancelled().await },
            )
            .await;
        if let Err(e) = result {
            tracing::error!(error = %e, "gRPC server stopped");
        }
    });
    Ok((health, grpc))
}

/// The running reconcile, every `period` ±20 %.
fn spawn_reconcile(
    ipam: Ipam,
    cloud: Arc<dyn Cloud>,
    instance_id: String,
    period: Duration,
    metrics: Metrics,
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
            match reconcile::pass(
                &ipam,
                cloud.as_ref(),
                &instance_id,
                &reconcile::netns_exists,
            )
            .await
            {
                Ok(r) => {
                    metrics
                        .netns_gc_released
                        .inc_by(r.released_dead.len() as u64);
                    metrics
                        .drift_missing_in_ec2
                        .set(r.missing_in_ec2.len() as i64);
                    metrics
                        .drift_unknown_to_pool
                        .set(r.unknown_to_pool.len() as i64);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "reconcile pass failed; trying again next period")
                }
            }
        }
    })
}

impl DaemonHandle {
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// Runs one pass of the running reconcile now (it also runs every `reconcile_period_secs`).
    pub async fn reconcile_now(&self) -> Result<reconcile::PassReport, CloudError> {
        let r = reconcile::pass(
            &self.ipam,
            self.cloud.as_ref(),
            &self.node.instance_id,
            &reconcile::netns_exists,
        )
        .await?;
        self.metrics
            .netns_gc_released
            .inc_by(r.released_dead.len() as u64);
        self.metrics
            .drift_missing_in_ec2
            .set(r.missing_in_ec2.len() as i64);
        self.metrics
            .drift_unknown_to_pool
            .set(r.unknown_to_pool.len() as i64);
        Ok(r)
    }

    /// Stops accepting, lets in-flight requests finish within the grace period, then stops the pool and
    /// closes the state file. Live pods' IPs are left alone.
    pub async fn shutdown(self) {
        self.ready.store(false, Ordering::Release);
        self.health
            .set_not_serving::<pb::ipam_server::IpamServer<IpamService>>()
            .await;
        self.cancel.cancel();
        let mut grpc = self.grpc;
        if tokio::time::timeout(self.grace, &mut grpc).await.is_err() {
            tracing::warn!(grace = ?self.grace, "in-flight requests did not finish within the grace period");
            grpc.abort();
        }
        self.pool.shutdown().await;
        self.store.close().await;
        for t in self.background {
            t.abort();
        }
        let _ = std::fs::remove_file(&self.socket_path);
        tracing::info!("eniipamd stopped");
    }
}
