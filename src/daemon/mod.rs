//! `eniipamd` as a library: [`Daemon::start`] builds and runs everything the binary runs, so the binary,
//! `--simulate`, the integration tests and the fleet simulation all start the same real daemon.
//!
//! Startup order (nothing is served before the rebuild): metrics listener (`/readyz` false) → state
//! file → IMDS identity → EC2 instance, limits and eth0 → rebuild from file + IMDS + EC2 + host → write
//! the rebuilt state → the node's ENIConfig (custom networking only) → pool, built with its seams (the
//! state file's journal; the host's readiness gate of new ENIs) and the demand it learned before →
//! host routing and rules (SNAT, NodePort) → leaked-ENI collector → API-server pod watch → network
//! profiles (when on: their first check against EC2) → NetworkPolicy enforcement (when on: its
//! watches and sync task; off: its table deleted) → lookahead (when on) → node readiness: startup
//! taint and condition (when on) → gRPC socket → the pod subnets' `prefix` CIDR reservation (when
//! on, in the background: `prefix_reservation`) → ready.
//!
//! Shutdown in three steps: stop accepting, let in-flight requests finish within the grace period, then
//! stop the pool and close the file. Live pods' IPs are left alone (they are in the file and in EC2).
//!
//! Its parts, by step: [`clients`] (the EC2 and IMDS clients), `serve` (the metrics listener first and
//! the gRPC socket last), `startup` (state file, the node's identity and subnets, the rebuild),
//! `host` (route tables, the pool's readiness gate, SNAT and NodePort rules), `collectors` (leaked
//! ENIs, pods gone from the API server, the node's startup taint and condition), `demand` (the
//! learned demand to and from the state file, the lookahead on the pods bound here), `pod_network`
//! (where custom networking's controller, `crate::custom_networking::follow`, meets the pool),
//! `profiles` (where network profiles' controller, `crate::network_profiles::controller`, meets the
//! pool, the metrics, the pod watch and the IPAM service's `ProfileSelector`), `network_policy`
//! (where the NetworkPolicy crate, `crate::network_policy`, meets the pool and the IPAM service: its
//! enforcer started over the node's pods and wired into the service as the admission a new ADD
//! waits on), `reconciler` (the running reconcile), `prefix_reservation` (each pod subnet's
//! `prefix` CIDR reservation, made once per fleet), and [`run`]: the modes of the `eniipamd` binary
//! (serve until a signal, prepare the host, remove the host rules).

mod clients;
mod collectors;
mod demand;
mod host;
mod ipv6;
mod network_policy;
mod pod_network;
mod prefix_reservation;
mod profiles;
mod reconciler;
pub mod run;
mod serve;
mod startup;

pub use clients::CloudClients;
pub use host::ImdsPrimary;
pub use startup::{SUBNET_CLUSTER_TAG_PREFIX, SUBNET_ROLE_TAG, subnet_open_to_cluster};

use collectors::{spawn_api_server_gc, spawn_leak_collector, spawn_node_status};
use demand::{restore_demand, save_demand, spawn_demand_writer, spawn_lookahead_on};
use host::{host_route_gate, spawn_host_routing, spawn_host_rules};
use reconciler::{Reconciler, spawn_reconcile};
use serve::{serve_grpc, serve_metrics};
use startup::{discover_node, eth0_of, open_store, patiently, rebuild};

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::cloud::calls::CallStats;
use crate::cloud::leak::LeakCollector;
use crate::cloud::{CloudError, NodeContext, Purpose, with_purpose};
use crate::config::DaemonConfig;
use crate::ipam::{Admission, Extensions, Ipam, ProfileSelector};
use crate::metrics::Metrics;
use crate::pool::{Pool, PoolError, PoolSeams};
use crate::reconcile::api_server::node::StartupGate;
use crate::reconcile::api_server::{self, ApiServerGc, BoundPods};
use crate::reconcile::{self, ReconcileReport};
use crate::rpc::{IpamService, SocketError, pb};
use crate::store::{Store, StoreError};

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
    /// The node's IPv6 /80 could not be taken.
    #[error("IPv6 prefix: {0}")]
    Ipv6(String),
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
        let (node, (seed, report, vpc_cidrs), ipv6) = with_purpose(Purpose::Startup, async {
            let (node, instance) =
                patiently("node discovery", || discover_node(&config, &clients)).await?;
            let eth0 = eth0_of(&instance).cloned();
            // The first try reads the node's ENIs from node discovery's describe; a retry
            // describes them afresh.
            let mut described = Some(instance);
            let rebuilt = patiently("rebuild", || {
                let described = described.take();
                rebuild(
                    &config,
                    &clients,
                    &node,
                    (&store, state_lost),
                    &b.metrics,
                    described,
                )
            })
            .await?;
            let ipv6 = if config.ip_family.has_ipv6() {
                // The first try reads eth0 from node discovery's describe; a retry describes it
                // afresh (a /80 an interrupted try had assigned is then adopted, not doubled).
                let mut described = eth0;
                let p = patiently("IPv6 prefix", || {
                    let eth0 = described.take();
                    ipv6::take_prefix(
                        &config,
                        &clients,
                        &node,
                        eth0,
                        (&store, state_lost),
                        &b.metrics,
                    )
                })
                .await?;
                Some((config.ip_family, p))
            } else {
                None
            };
            Ok::<_, DaemonError>((node, rebuilt, ipv6))
        })
        .await?;
        // Custom networking: the node's ENIConfig, known (or known missing) before the pool starts.
        let custom = match config.custom_networking_target() {
            Some(target) => {
                let selector = crate::custom_networking::Selector {
                    label: config.eni_config_label.clone(),
                    annotation: config.eni_config_annotation.clone(),
                };
                let client = api_server::client(&target)?;
                let (mut rx, watcher) =
                    crate::custom_networking::spawn(client, config.node_name.clone(), selector);
                b.background.push(watcher);
                let first = crate::custom_networking::first_answer(&mut rx).await;
                let resolved = with_purpose(
                    Purpose::Startup,
                    crate::custom_networking::resolve(&first, clients.cloud.as_ref(), &node),
                )
                .await;
                Some((rx, resolved))
            }
            None => None,
        };
        // The pool's seams, given when it is built: the state file journals its address changes;
        // with the ENIs' route tables kept here, a new ENI serves no pod before its table is in.
        let (readiness, routing) = if config.manage_eni_routes {
            let wait = Duration::from_secs(config.eni_route_wait_secs);
            let (gate, routing) = host_route_gate(&b, wait).await?;
            (Some(gate), Some(routing))
        } else {
            (None, None)
        };
        let seams = PoolSeams {
            readiness,
            journal: Some(Arc::new(crate::ipam::StoreJournal::new(store.clone()))),
        };
        let pool = Pool::start_with_seams(
            config.pool_config(),
            clients.cloud.clone(),
            clients.metadata.clone(),
            node.clone(),
            seed,
            seams,
        )?;
        pool.hold_unconfirmed(&report.unconfirmed);
        let _ = b.pool_cell.set(pool.clone());
        if let Some((rx, resolved)) = custom {
            let sink = Arc::new(pod_network::PoolPodNetwork {
                pool: pool.clone(),
                metrics: b.metrics.clone(),
            });
            let pending = match resolved {
                Ok(network) => {
                    crate::custom_networking::apply(sink.as_ref(), network);
                    false
                }
                Err(e) => {
                    tracing::warn!(error = %e, "custom networking: cannot check the node's ENIConfig against EC2 yet; no new ENI until it is");
                    b.metrics.pod_network_ready.set(0);
                    true
                }
            };
            b.background.push(crate::custom_networking::spawn_follower(
                rx,
                pending,
                sink,
                (clients.cloud.clone(), node.clone()),
                b.cancel.clone(),
            ));
        }
        restore_demand(&pool, &store).await;
        b.background.push(spawn_demand_writer(
            pool.clone(),
            store.clone(),
            b.cancel.clone(),
        ));
        if let Some(routing) = routing {
            spawn_host_routing(&pool, routing, &mut b);
            spawn_host_rules(&config, &clients, &mut b).await?;
        }
        if !config.cluster_name.is_empty() {
            spawn_leak_collector(&config, &clients, &node, &mut b);
        }
        let api_server = spawn_api_server_gc(&config, &mut b)?;
        let profile_selector = if let Some(target) = config.network_profiles_target() {
            let selector = profiles::start(
                api_server::client(&target)?,
                &config.node_name,
                api_server.as_ref().map(|a| a.watch().clone()),
                (pool.clone(), clients.cloud.clone(), node.clone()),
                b.metrics.clone(),
                b.cancel.clone(),
                &mut b.background,
            );
            selector.first_answer().await;
            Some(selector)
        } else {
            None
        };
        // What the node's startup taint waits for besides warm IPs.
        let mut startup_gates = Vec::new();
        // NetworkPolicy enforcement, started before the IPAM service so that the service is built
        // with it as the admission every new ADD waits on.
        let policy = if let Some(target) = config.network_policy_target() {
            let first_sync = StartupGate::new("network policy's first sync");
            startup_gates.push(first_sync.clone());
            let pods = network_policy::PoolPods {
                pool: pool.clone(),
                ipv6: ipv6
                    .as_ref()
                    .filter(|(family, _)| family.has_ipv6())
                    .map(|(_, p)| p.clone()),
                veth_prefix: config.veth_prefix.clone(),
            };
            Some(network_policy::start(
                api_server::client(&target)?,
                (&config, pods),
                first_sync,
                &b.metrics,
                b.cancel.clone(),
                &mut b.background,
            ))
        } else {
            let why = config.network_policy_off().unwrap_or_default();
            if config.network_policy.is_none() {
                tracing::warn!(why = %why, "network policy: not enforced on this node");
            } else {
                tracing::info!(why = %why, "network policy: not enforced on this node");
            }
            if config.manage_eni_routes {
                crate::network_policy::remove_table().await;
            }
            None
        };
        let ipam = Ipam::with_family(
            pool.clone(),
            ipv6,
            store.clone(),
            b.ready.clone(),
            vpc_cidrs,
            b.metrics.clone(),
            Extensions {
                profiles: profile_selector.map(|s| s as Arc<dyn ProfileSelector>),
                admission: policy.clone().map(|enforcer| {
                    Arc::new(network_policy::PolicyAdmission(enforcer)) as Arc<dyn Admission>
                }),
                forget_flows: config.manage_eni_routes,
            },
        );
        // The lookahead warms IPv4 for pods bound here: none with ip_family = ipv6.
        if let Some(a) = api_server.as_ref().filter(|_| config.ip_family.has_ipv4()) {
            b.background
                .push(spawn_lookahead_on(a, &pool, &b.metrics, b.cancel.clone()));
        }
        spawn_node_status(&config, &clients, (&pool, startup_gates), &mut b)?;
        let reconciler = Reconciler {
            ipam: ipam.clone(),
            cloud: clients.cloud.clone(),
            metadata: clients.metadata.clone(),
            instance_id: node.instance_id.clone(),
            vpc_id: node.vpc_id.clone(),
            host: reconcile::HostView {
                cni_cache_dir: config.cni_cache_dir.clone(),
                netns_dirs: config.netns_dirs.clone(),
            },
            api_server: api_server.clone(),
            memory: Arc::new(tokio::sync::Mutex::new(reconcile::Memory::after_start(
                &report.unconfirmed,
            ))),
            metrics: b.metrics.clone(),
        };
        b.background.push(spawn_reconcile(
            reconciler.clone(),
            Duration::from_secs(config.reconcile_period_secs),
            b.cancel.clone(),
        ));
        let (health, grpc) = serve_grpc(&config, &node, (&ipam, policy), &b).await?;
        b.background.extend(prefix_reservation::spawn(
            &config,
            clients.cloud.clone(),
            &node,
            b.cancel.clone(),
        ));

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

impl DaemonHandle {
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// The pods bound to this node as the API server watch knows them (a cheap snapshot; the
    /// lookahead counts those not ADDed yet as demand). `None` when that source is off.
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
        // What the demand learned since the last periodic write.
        save_demand(&self.pool, &self.store, u64::MAX).await;
        self.store.close().await;
        for t in self.background {
            t.abort();
        }
        let _ = std::fs::remove_file(&self.socket_path);
        tracing::info!("eniipamd stopped");
    }
}
