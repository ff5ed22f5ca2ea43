//! `eniipamd` as a library: [`Daemon::start`] builds and runs everything the binary runs, so the binary,
//! `--simulate`, the integration tests and the fleet simulation all start the same real daemon.
//!
//! Startup order (nothing is served before the rebuild): metrics listener (`/readyz` false) → state
//! file → IMDS identity → EC2 instance, limits and eth0 → rebuild from file + IMDS + EC2 + host → write
//! the rebuilt state → pool → host routing and rules (SNAT, NodePort) → leaked-ENI collector →
//! API-server pod watch (when on) → gRPC socket → ready.
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
use crate::cloud::{Cloud, CloudError, Metadata, NodeContext, Purpose, with_purpose};
use crate::config::DaemonConfig;
use crate::ipam::Ipam;
use crate::pool::PoolSeed;
use crate::pool::{Pool, PoolError};
use crate::reconcile::api_server::{self, ApiServerGc, BoundPods, PodWatch};
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
    /// The configuration does not fit this node (a knob the instance type cannot honour, a subnet
    /// in another availability zone).
    #[error("configuration: {0}")]
    Config(String),
    #[error("Kubernetes API server: {0}")]
    ApiServer(#[from] api_server::ApiServerError),
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
    reconciler: Reconciler,
    api_server: Option<ApiServerGc>,
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
        let (store, state_lost) = open_store(&config).await?;
        // Every EC2 call until the pool starts is the startup's.
        let (node, (seed, report, vpc_cidrs)) = with_purpose(Purpose::Startup, async {
            let node = discover_node(&config, &clients).await?;
            let rebuilt =
                rebuild(&config, &clients, &node, (&store, state_lost), &b.metrics).await?;
            Ok::<_, DaemonError>((node, rebuilt))
        })
        .await?;
        let pool = Pool::start(
            config.pool_config(),
            clients.cloud.clone(),
            clients.metadata.clone(),
            node.clone(),
            seed,
        )?;
        let _ = b.pool_cell.set(pool.clone());
        if config.manage_eni_routes {
            spawn_host_routing(
                &pool,
                &mut b,
                Duration::from_secs(config.eni_route_wait_secs),
            )
            .await?;
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
        let api_server = spawn_api_server_gc(&config, &mut b)?;
        let reconciler = Reconciler {
            ipam: ipam.clone(),
            cloud: clients.cloud.clone(),
            instance_id: node.instance_id.clone(),
            host: reconcile::HostView {
                cni_cache_dir: config.cni_cache_dir.clone(),
                netns_dirs: config.netns_dirs.clone(),
            },
            api_server: api_server.clone(),
            memory: Arc::new(tokio::sync::Mutex::new(reconcile::Memory::default())),
            metrics: b.metrics.clone(),
        };
        b.background.push(spawn_reconcile(
            reconciler.clone(),
            Duration::from_secs(config.reconcile_period_secs),
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
            reconciler,
            api_server,
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

/// Step 2: the state file (a corrupt one is moved aside and rebuilt). Returns whether it was lost
/// (created afresh or moved aside): the rebuild then trusts nothing but EC2 and the host's evidence.
async fn open_store(config: &DaemonConfig) -> Result<(Store, bool), DaemonError> {
    let (store, opened) = Store::open(&config.state_path).await?;
    if let Some(aside) = &opened.moved_aside {
        tracing::error!(
            path = %config.state_path.display(), moved_to = %aside.display(),
            "STATE FILE WAS CORRUPT: moved aside for inspection; rebuilding from IMDS, EC2 and the host"
        );
    }
    Ok((store, opened.created || opened.moved_aside.is_some()))
}

/// Step 3: who we are (IMDS), and what EC2 says about us: instance type, limits, eth0, and the
/// subnets new ENIs may go to.
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
    if config.prefix_delegation && !limits.nitro {
        return Err(DaemonError::Config(format!(
            "prefix_delegation (ENIIPAM_PREFIX_DELEGATION) needs a Nitro instance type; {} is not one: \
             turn it off for this node group",
            instance.instance_type
        )));
    }
    let eth0 = instance
        .enis
        .iter()
        .find(|e| e.attachment.as_ref().is_some_and(|a| a.device_index == 0))
        .ok_or_else(|| DaemonError::NoPrimaryEni(identity.instance_id.clone()))?;
    let subnet_id = config
        .subnet_id
        .clone()
        .unwrap_or_else(|| eth0.subnet_id.clone());
    let pod_subnets = pod_subnets(config, clients, &instance, &subnet_id).await?;
    Ok(NodeContext {
        cluster_name: config.cluster_name.clone(),
        instance_id: identity.instance_id.clone(),
        instance_type: instance.instance_type.clone(),
        availability_zone: instance.availability_zone.clone(),
        vpc_id: instance.vpc_id.clone(),
        subnet_id,
        security_groups: if config.security_groups.is_empty() {
            eth0.security_groups.clone()
        } else {
            config.security_groups.clone()
        },
        limits,
        pod_subnets,
    })
}

/// The AWS VPC CNI's subnet tag: `0` excludes a subnet, any other value includes it.
pub const SUBNET_ROLE_TAG: &str = "kubernetes.io/role/cni";

/// The subnets new ENIs may go to: `subnet_ids` when configured (each must be in the node's VPC and
/// availability zone: a clear error otherwise); else the VPC's subnets in the node's availability
/// zone tagged `kubernetes.io/role/cni` (not `0`), plus the node's own subnet unless tagged `0`. When
/// EC2 cannot list them, the node's own subnet alone.
async fn pod_subnets(
    config: &DaemonConfig,
    clients: &CloudClients,
    instance: &crate::cloud::Instance,
    own: &str,
) -> Result<Vec<crate::cloud::Subnet>, DaemonError> {
    use crate::cloud::SubnetFilter;
    if !config.subnet_ids.is_empty() {
        let found = clients
            .cloud
            .describe_subnets(&SubnetFilter {
                ids: config.subnet_ids.clone(),
                ..SubnetFilter::default()
            })
            .await?;
        for id in &config.subnet_ids {
            let Some(s) = found.iter().find(|s| &s.id == id) else {
                return Err(DaemonError::Config(format!(
                    "subnet_ids: {id} does not exist (or the node may not describe it)"
                )));
            };
            if s.availability_zone != instance.availability_zone || s.vpc_id != instance.vpc_id {
                return Err(DaemonError::Config(format!(
                    "subnet_ids: {id} is in {} ({}), but this node is in {} ({}): an ENI can only use \
                     a subnet of the instance's own availability zone and VPC",
                    s.availability_zone, s.vpc_id, instance.availability_zone, instance.vpc_id
                )));
            }
        }
        return Ok(config
            .subnet_ids
            .iter()
            .filter_map(|id| found.iter().find(|s| &s.id == id).cloned())
            .collect());
    }
    let listed = clients
        .cloud
        .describe_subnets(&SubnetFilter {
            vpc_id: Some(instance.vpc_id.clone()),
            availability_zone: Some(instance.availability_zone.clone()),
            ..SubnetFilter::default()
        })
        .await;
    let subnets = match listed {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot list the availability zone's subnets: new ENIs go to the node's own");
            return Ok(Vec::new());
        }
    };
    let mut chosen: Vec<crate::cloud::Subnet> = subnets
        .into_iter()
        .filter(|s| match s.tags.get(SUBNET_ROLE_TAG).map(String::as_str) {
            Some("0") => false,
            Some(_) => true,
            None => s.id == own,
        })
        .collect();
    // The node's own subnet first among equals.
    chosen.sort_by_key(|s| s.id != own);
    if chosen.len() > 1 {
        tracing::info!(subnets = ?chosen.iter().map(|s| &s.id).collect::<Vec<_>>(), "subnets for new ENIs");
    }
    Ok(chosen)
}

/// Step 4: rebuild from the file, IMDS, EC2 and the host, and make the file equal the truth before
/// anything is served. Returns the pool's seed, the report and the VPC's CIDRs.
async fn rebuild(
    config: &DaemonConfig,
    clients: &CloudClients,
    node: &NodeContext,
    (store, state_lost): (&Store, bool),
    metrics: &Metrics,
) -> Result<(PoolSeed, ReconcileReport, Vec<Ipv4Net>), DaemonError> {
    let stored = store.load().await?;
    let netns = reconcile::NetnsView::of(&config.netns_dirs);
    let host = reconcile::host_evidence(&config.cni_cache_dir, &netns);
    let rebuilt = reconcile::rebuild(
        clients.cloud.as_ref(),
        clients.metadata.as_ref(),
        &node.instance_id,
        reconcile::Inputs {
            stored,
            state_lost,
            host: &host,
            netns: &netns,
            use_primary_eni: config.use_primary_eni,
        },
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
    if !report.quarantined.is_empty() {
        tracing::error!(
            quarantined = report.quarantined.len(),
            cache = %config.cni_cache_dir.display(),
            "the state file was lost and the plugin's result cache is not visible: IPs on our ENIs are \
             QUARANTINED (neither handed out nor given back) until the cache is visible or an operator \
             clears them (eniipamctl quarantine release)"
        );
    }
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
/// appears (retried until its link shows up), flushed when it goes. A new ENI serves no pod before
/// its table is installed: the pool's readiness gate ([`HostRouteGate`]) waits for the keeper.
async fn spawn_host_routing(
    pool: &Pool,
    b: &mut Building,
    wait: Duration,
) -> Result<(), DaemonError> {
    let routing = crate::host::EniRouting::new().await?;
    let (ready_tx, ready_rx) = tokio::sync::mpsc::channel(16);
    pool.set_eni_readiness(Arc::new(HostRouteGate {
        requests: ready_tx,
        wait,
        metrics: b.metrics.clone(),
    }));
    let pool = pool.clone();
    b.background.push(
        crate::host::RouteKeeper::new(routing, Duration::from_secs(60)).spawn_gated(
            move || crate::host::routes::pod_eni_routes(&pool.snapshot(), None),
            Duration::from_secs(2),
            ready_rx,
            b.cancel.clone(),
        ),
    );
    Ok(())
}

/// The pool's readiness gate of new ENIs when the daemon keeps their route tables: asks the route
/// keeper to install the new ENI's table now and waits, up to `wait` (`eni_route_wait_secs`), until it
/// is (see `pool::EniReadiness`, issue 23).
struct HostRouteGate {
    requests: tokio::sync::mpsc::Sender<crate::host::ReadyRequest>,
    wait: Duration,
    metrics: Metrics,
}

#[async_trait::async_trait]
impl crate::pool::EniReadiness for HostRouteGate {
    async fn ready(&self, eni: &crate::pool::NewEniFacts) -> Result<(), String> {
        let Some(cidr) = eni.subnet_cidr else {
            return Err(format!("the subnet of {} is not known", eni.id));
        };
        // As `pod_eni_routes` will list it once the pool serves it (no MTU: the same as there).
        let Some(route) =
            crate::host::EniRoute::of_eni(&eni.mac, eni.device_index, cidr, eni.primary_ip, None)
        else {
            // The primary ENI: routed by the main table, nothing to wait for.
            return Ok(());
        };
        let (respond_to, installed) = tokio::sync::oneshot::channel();
        let asked = crate::host::ReadyRequest { route, respond_to };
        if self.requests.send(asked).await.is_err() {
            return Err("the host route keeper has stopped".into());
        }
        match tokio::time::timeout(self.wait, installed).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err("the host route keeper has stopped".into()),
            Err(_) => {
                self.metrics.eni_route_timeouts.inc();
                Err(format!(
                    "its route table (table {}) was not installed within {:?}: its link (MAC {}) did not \
                     show up on the host, or writing the table failed (see the warnings of the route keeper)",
                    eni.device_index + 1,
                    self.wait,
                    eni.mac
                ))
            }
        }
    }
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

/// The pods bound to this node from the Kubernetes API server, when that source is on
/// (`config.api_server_target()`): the watch starts now and syncs in the background (until it has,
/// pods are unknown and nothing is released); the running reconcile releases allocations whose pod is
/// gone from it.
fn spawn_api_server_gc(
    config: &DaemonConfig,
    b: &mut Building,
) -> Result<Option<ApiServerGc>, DaemonError> {
    let Some(target) = config.api_server_target() else {
        if config.api_server_gc.is_none()
            && let Some(url) = &config.api_server_url
        {
            tracing::info!(api_server = %url, token_file = %config.api_server_token_file.display(),
                "API-server pod GC off: an API server is known but there is no service-account token \
                 (set api_server_gc = true to require it)");
        }
        return Ok(None);
    };
    let client = api_server::client(&target)?;
    let (watch, task) = PodWatch::spawn(
        client.clone(),
        config.node_name.clone(),
        b.metrics.clone(),
        b.cancel.clone(),
    );
    b.background.push(task);
    tracing::info!(api_server = %target.url, node = %config.node_name, grace_secs = config.api_server_grace_secs,
        "API-server pod GC on: watching the pods bound to this node");
    Ok(Some(ApiServerGc::new(
        watch,
        client,
        Duration::from_secs(config.api_server_grace_secs),
        b.metrics.clone(),
    )))
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

/// The running reconcile's parts: one pass at a time (the periodic task and `reconcile_now` share the
/// memory of what earlier passes saw).
#[derive(Clone)]
struct Reconciler {
    ipam: Ipam,
    cloud: Arc<dyn Cloud>,
    api_server: Option<ApiServerGc>,
    instance_id: String,
    host: reconcile::HostView,
    memory: Arc<tokio::sync::Mutex<reconcile::Memory>>,
    metrics: Metrics,
}

impl Reconciler {
    async fn pass(&self) -> Result<reconcile::PassReport, CloudError> {
        let mut memory = self.memory.lock().await;
        let r = with_purpose(
            Purpose::Reconcile,
            reconcile::pass(
                &self.ipam,
                self.cloud.as_ref(),
                &self.instance_id,
                &self.host,
                &mut memory,
                self.api_server.as_ref(),
            ),
        )
        .await?;
        let m = &self.metrics;
        m.netns_gc_released.inc_by(r.released_dead.len() as u64);
        m.drift_missing_in_ec2.set(r.missing_in_ec2.len() as i64);
        m.drift_unknown_to_pool.set(r.unknown_to_pool.len() as i64);
        m.lost_pods.inc_by(r.lost.len() as u64);
        m.forgotten_enis.inc_by(r.forgotten_enis.len() as u64);
        Ok(r)
    }
}

/// The running reconcile, every `period` ±20 %.
fn spawn_reconcile(
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

impl DaemonHandle {
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// The pods bound to this node as the API server watch knows them (a cheap snapshot; for a
    /// lookahead that pre-allocates for pods bound but not yet ADDed). `None` when that source is off.
    pub fn bound_pods(&self) -> Option<BoundPods> {
        self.api_server.as_ref().map(|a| a.watch().bound_pods())
    }

    /// The API-server pod GC, when on (its watch, for waiting on the view).
    pub fn api_server(&self) -> Option<&ApiServerGc> {
        self.api_server.as_ref()
    }

    /// Runs one pass of the running reconcile now (it also runs every `reconcile_period_secs`).
    pub async fn reconcile_now(&self) -> Result<reconcile::PassReport, CloudError> {
        self.reconciler.pass().await
    }

    /// The IPAM service (what the gRPC API calls).
    pub fn ipam(&self) -> &Ipam {
        &self.ipam
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
