//! mockcloud: an EC2 Query API and IMDSv2 stand-in that the real AWS SDK talks to.
//!
//! The real `aws-sdk-ec2` client is pointed at [`MockCloud::ec2_url`] by endpoint override, and the real
//! `aws-config` IMDS client at [`MockCloud::imds_url`] (one per simulated instance). mockcloud enforces
//! what EC2 enforces and models what makes EC2 hard: per-action latency, account-level throttling,
//! attachments that take time, IMDS lagging EC2, injected errors and hangs, and fleets of instances.
//!
//! Modules:
//! - [`world`]: the simulated account (VPCs, subnets, instances, ENIs, /28 prefixes, subnet CIDR
//!   reservations, network cards) and EC2's rules.
//! - [`ec2`]: the Query API endpoint (form in, XML out); [`query`] decodes parameters, [`xml`] writes.
//! - [`imds`]: IMDSv2 per instance (tokens, lagged view).
//! - [`traffic`]: the throttling buckets' tokens, fault injection, counters and the call log;
//!   [`throttling`]: EC2's per-API buckets and their sizes; [`actions`]: the actions served.
//! - [`control`]: the JSON control API under `/_mock/`; [`subnet_api`]: the same for subnets in Rust.
//! - [`iam`]: identity-based policies evaluated on every EC2 call (`UnauthorizedOperation`).
//! - [`config`], [`catalog`], [`error`]: knobs, instance types with EC2's figures, EC2 errors.
//! - [`ci`]: what a test does when it cannot run its real parts (fails under `CI=true`).

use std::collections::{BTreeMap, HashMap};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::routing::post;
use ipnet::Ipv4Net;
use rand::Rng;
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::task::AbortHandle;
use tokio::time::Instant;

pub mod actions;
pub mod catalog;
pub mod ci;
pub mod config;
pub mod control;
pub mod ec2;
pub mod error;
pub mod iam;
pub mod imds;
pub mod new_eni_lag;
pub mod query;
mod splitmix;
pub mod subnet_api;
pub mod throttling;
pub mod traffic;
pub mod world;
pub mod xml;

pub use actions::ActionClass;
pub use config::{Config, LatencyProfile};
pub use error::Ec2Error;
pub use new_eni_lag::NewEniLag;
pub use throttling::{Bucket, BucketLevel, Category, Throttling, ThrottlingError};
pub use traffic::{ActionCounters, CallRecord, Counters, Fault, FaultKind};
pub use world::{
    AttachmentView, DEFAULT_ALLOCATION_SEED, EniView, ImdsEni, ImdsInstance, InstanceView,
    LaunchAddresses, OccupyPattern, ReservationType, ReservationView, SubnetUsage, SubnetView,
    VPC_IPV4_CIDR_LIMIT, VpcCidrAssociation,
};

/// Shared state behind every listener.
pub struct Inner {
    pub(crate) world: Mutex<world::World>,
    pub(crate) traffic: Mutex<traffic::Traffic>,
    pub(crate) latency: Mutex<LatencyProfile>,
    pub(crate) iam: Mutex<iam::IamState>,
    /// IMDS token → (instance id, expiry).
    pub(crate) imds_tokens: Mutex<HashMap<String, (String, Instant)>>,
    imds_urls: Mutex<BTreeMap<String, String>>,
    pub(crate) next_request: AtomicU64,
    tasks: Mutex<Vec<AbortHandle>>,
    ec2_addr: SocketAddr,
    region: String,
    default: Mutex<Option<DefaultWorld>>,
}

impl Inner {
    /// The jittered reply latency for one call of `action`.
    pub(crate) fn latency_for(&self, action: &str) -> Duration {
        let p = self.latency.lock().expect("latency lock");
        let base = p.latency(action);
        if p.jitter <= 0.0 || base.is_zero() {
            return base;
        }
        base.mul_f64(rand::rng().random_range(1.0 - p.jitter..=1.0 + p.jitter))
    }
}

/// What the default world holds (`--no-default-world` / `seed_default_world: false` skips it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DefaultWorld {
    pub vpc_id: String,
    pub vpc_cidr: Ipv4Net,
    pub subnet_id: String,
    pub subnet_cidr: Ipv4Net,
    pub security_group_id: String,
    pub instance: LaunchedInstance,
}

/// A simulated instance and where its IMDS listens.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchedInstance {
    pub instance_id: String,
    pub instance_type: String,
    pub availability_zone: String,
    pub subnet_id: String,
    pub vpc_id: String,
    pub security_groups: Vec<String>,
    pub primary_eni: String,
    pub mac: String,
    pub private_ip: Ipv4Addr,
    pub imds_url: String,
}

/// Aborts every listener when the last owning handle goes away.
struct TaskGuard(Arc<Inner>);

impl Drop for TaskGuard {
    fn drop(&mut self) {
        for t in self.0.tasks.lock().expect("tasks lock").drain(..) {
            t.abort();
        }
    }
}

/// A running mockcloud. Cloning is cheap; the listeners stop when the handle returned by
/// [`MockCloud::start`] and all its clones are dropped.
#[derive(Clone)]
pub struct MockCloud {
    inner: Arc<Inner>,
    _guard: Option<Arc<TaskGuard>>,
}

impl MockCloud {
    /// Starts on an ephemeral loopback port.
    pub async fn start(config: Config) -> std::io::Result<Self> {
        Self::start_on(config, SocketAddr::from((Ipv4Addr::LOCALHOST, 0))).await
    }

    /// Starts on an ephemeral loopback port with `allocation_seed` driving EC2's random choice of
    /// addresses and /28 blocks (the default world's too).
    pub async fn start_seeded(config: Config, allocation_seed: u64) -> std::io::Result<Self> {
        Self::start_on_seeded(
            config,
            SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            allocation_seed,
        )
        .await
    }

    /// Starts the EC2 + control listener on `addr` (IMDS listeners take ephemeral ports on its host).
    pub async fn start_on(config: Config, addr: SocketAddr) -> std::io::Result<Self> {
        Self::start_on_seeded(config, addr, DEFAULT_ALLOCATION_SEED).await
    }

    /// [`MockCloud::start_on`] with an allocation seed.
    pub async fn start_on_seeded(
        config: Config,
        addr: SocketAddr,
        allocation_seed: u64,
    ) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let ec2_addr = listener.local_addr()?;
        let now = Instant::now();
        let mut world = world::World::new(&config.region, world::Timing::of(&config.latency));
        world.set_allocation_seed(allocation_seed);
        let inner = Arc::new(Inner {
            world: Mutex::new(world),
            traffic: Mutex::new(traffic::Traffic::new(config.throttling.clone(), now)),
            latency: Mutex::new(config.latency.clone()),
            iam: Mutex::new(iam::IamState {
                account: config.iam_policy.clone().map(Arc::new),
                ..Default::default()
            }),
            imds_tokens: Mutex::new(HashMap::new()),
            imds_urls: Mutex::new(BTreeMap::new()),
            next_request: AtomicU64::new(1),
            tasks: Mutex::new(Vec::new()),
            ec2_addr,
            region: config.region.clone(),
            default: Mutex::new(None),
        });
        let app = Router::new()
            .route("/", post(ec2::handle))
            .merge(control::router())
            .with_state(inner.clone());
        let task = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!(error = %e, "mockcloud EC2 listener stopped");
            }
        });
        inner
            .tasks
            .lock()
            .expect("tasks lock")
            .push(task.abort_handle());
        let mock = Self {
            _guard: Some(Arc::new(TaskGuard(inner.clone()))),
            inner,
        };
        if config.seed_default_world {
            mock.seed_default_world(&config.default_instance_type)
                .await
                .map_err(|e| std::io::Error::other(e.to_string()))?;
        }
        Ok(mock)
    }

    /// A non-owning handle (used by the control API's handlers).
    pub(crate) fn from_inner(inner: &Arc<Inner>) -> Self {
        Self {
            inner: inner.clone(),
            _guard: None,
        }
    }

    async fn seed_default_world(&self, instance_type: &str) -> Result<(), Ec2Error> {
        let vpc_cidr: Ipv4Net = "10.0.0.0/16".parse().expect("literal");
        let subnet_cidr: Ipv4Net = "10.0.0.0/20".parse().expect("literal");
        let (vpc_id, sg) = self.create_vpc(vpc_cidr)?;
        let subnet_id = self.create_subnet(&vpc_id, subnet_cidr, &self.default_az())?;
        let instance = self
            .launch_instance_with(instance_type, &subnet_id, &[])
            .await?;
        *self.inner.default.lock().expect("default lock") = Some(DefaultWorld {
            vpc_id,
            vpc_cidr,
            subnet_id,
            subnet_cidr,
            security_group_id: sg,
            instance,
        });
        Ok(())
    }

    /// `http://127.0.0.1:PORT`: the EC2 endpoint to give the SDK.
    pub fn ec2_url(&self) -> String {
        format!("http://{}", self.inner.ec2_addr)
    }

    /// `http://127.0.0.1:PORT/_mock`: the control API.
    pub fn control_url(&self) -> String {
        format!("http://{}/_mock", self.inner.ec2_addr)
    }

    /// The IMDS endpoint of one instance.
    pub fn imds_url(&self, instance_id: &str) -> Option<String> {
        self.inner
            .imds_urls
            .lock()
            .expect("imds lock")
            .get(instance_id)
            .cloned()
    }

    pub fn region(&self) -> &str {
        &self.inner.region
    }

    pub(crate) fn default_az(&self) -> String {
        format!("{}a", self.inner.region)
    }

    /// The VPC, subnet and instance seeded at start, if any.
    pub fn default_world(&self) -> Option<DefaultWorld> {
        self.inner.default.lock().expect("default lock").clone()
    }

    /// The default instance (panics when started without a default world).
    pub fn default_instance(&self) -> LaunchedInstance {
        self.default_world()
            .expect("mockcloud was started without a default world")
            .instance
    }

    pub fn create_vpc(&self, cidr: Ipv4Net) -> Result<(String, String), Ec2Error> {
        self.inner
            .world
            .lock()
            .expect("world lock")
            .create_vpc(cidr)
    }

    pub fn create_security_group(&self, vpc_id: &str) -> Result<String, Ec2Error> {
        self.inner
            .world
            .lock()
            .expect("world lock")
            .create_security_group(vpc_id)
    }

    pub fn create_subnet(&self, vpc_id: &str, cidr: Ipv4Net, az: &str) -> Result<String, Ec2Error> {
        self.inner
            .world
            .lock()
            .expect("world lock")
            .create_subnet(vpc_id, cidr, az)
    }

    /// Launches an instance with the VPC's default security group and starts its IMDS.
    pub async fn launch_instance(
        &self,
        instance_type: &str,
        subnet_id: &str,
    ) -> Result<LaunchedInstance, Ec2Error> {
        self.launch_instance_with(instance_type, subnet_id, &[])
            .await
    }

    /// Launches an instance with the given security groups and starts its IMDS.
    pub async fn launch_instance_with(
        &self,
        instance_type: &str,
        subnet_id: &str,
        security_groups: &[String],
    ) -> Result<LaunchedInstance, Ec2Error> {
        self.launch_instance_carrying(
            instance_type,
            subnet_id,
            security_groups,
            world::LaunchAddresses::default(),
        )
        .await
    }

    /// Launches an instance whose eth0 carries `addresses` from the launch (a launch template's
    /// `SecondaryPrivateIpAddressCount` or `Ipv4PrefixCount`), and starts its IMDS.
    pub async fn launch_instance_carrying(
        &self,
        instance_type: &str,
        subnet_id: &str,
        security_groups: &[String],
        addresses: world::LaunchAddresses,
    ) -> Result<LaunchedInstance, Ec2Error> {
        let listener = TcpListener::bind(SocketAddr::new(self.inner.ec2_addr.ip(), 0))
            .await
            .map_err(|e| {
                Ec2Error::new(
                    500,
                    "InternalError",
                    format!("cannot bind an IMDS listener: {e}"),
                )
            })?;
        let imds_addr = listener
            .local_addr()
            .map_err(|e| Ec2Error::new(500, "InternalError", e.to_string()))?;
        let (id, view) = {
            let mut w = self.inner.world.lock().expect("world lock");
            let now = Instant::now();
            let id = w.launch_instance_carrying(
                instance_type,
                subnet_id,
                security_groups,
                addresses,
                now,
            )?;
            let view = w.instance(&id, now).expect("just launched");
            (id, view)
        };
        let app = imds::router(self.inner.clone(), id.clone());
        let task = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!(error = %e, "mockcloud IMDS listener stopped");
            }
        });
        self.inner
            .tasks
            .lock()
            .expect("tasks lock")
            .push(task.abort_handle());
        let imds_url = format!("http://{imds_addr}");
        self.inner
            .imds_urls
            .lock()
            .expect("imds lock")
            .insert(id.clone(), imds_url.clone());
        let primary = &view.enis[0];
        Ok(LaunchedInstance {
            instance_id: id,
            instance_type: view.instance_type.clone(),
            availability_zone: view.availability_zone.clone(),
            subnet_id: view.subnet_id.clone(),
            vpc_id: view.vpc_id.clone(),
            security_groups: view.security_groups.clone(),
            primary_eni: primary.id.clone(),
            mac: primary.mac.clone(),
            private_ip: view.private_ip,
            imds_url,
        })
    }

    /// Terminates an instance (DeleteOnTermination ENIs are deleted, the others left `available`).
    pub fn terminate_instance(&self, instance_id: &str) -> Result<(), Ec2Error> {
        self.inner
            .world
            .lock()
            .expect("world lock")
            .terminate_instance(instance_id, Instant::now())
    }

    /// One instance as EC2 sees it now.
    pub fn instance(&self, instance_id: &str) -> Option<InstanceView> {
        self.inner
            .world
            .lock()
            .expect("world lock")
            .instance(instance_id, Instant::now())
    }

    /// Every instance as EC2 sees it now.
    pub fn instances(&self) -> Vec<InstanceView> {
        let mut w = self.inner.world.lock().expect("world lock");
        let now = Instant::now();
        w.instance_ids()
            .iter()
            .filter_map(|id| w.instance(id, now))
            .collect()
    }

    /// Every ENI as it is now (EC2's truth, not what a describe would show within the describe lag).
    pub fn network_interfaces(&self) -> Vec<EniView> {
        self.inner
            .world
            .lock()
            .expect("world lock")
            .network_interfaces(Instant::now())
    }

    /// What an instance's IMDS shows now (lag applied).
    pub fn imds_view(&self, instance_id: &str) -> Option<ImdsInstance> {
        self.inner
            .world
            .lock()
            .expect("world lock")
            .imds(instance_id, Instant::now())
    }

    /// The whole state as JSON.
    pub fn dump(&self) -> serde_json::Value {
        self.inner
            .world
            .lock()
            .expect("world lock")
            .dump(Instant::now())
    }

    /// Runs `f` on the world under its lock, with the current time: for tests and simulations that
    /// set state up or inspect it without going through HTTP.
    pub fn with_world<R>(&self, f: impl FnOnce(&mut world::World, Instant) -> R) -> R {
        f(
            &mut self.inner.world.lock().expect("world lock"),
            Instant::now(),
        )
    }

    pub fn inject_fault(&self, fault: Fault) {
        self.inner
            .traffic
            .lock()
            .expect("traffic lock")
            .add_fault(fault);
    }

    pub fn clear_faults(&self) {
        self.inner
            .traffic
            .lock()
            .expect("traffic lock")
            .clear_faults();
    }

    /// Makes `action` answer `UnauthorizedOperation` (a missing IAM permission) or lifts that.
    pub fn deny(&self, action: &str, denied: bool) {
        self.inner
            .traffic
            .lock()
            .expect("traffic lock")
            .set_denied(action, denied);
    }

    /// Replaces every bucket's size; every bucket starts full.
    pub fn set_throttling(&self, throttling: Throttling) {
        self.inner
            .traffic
            .lock()
            .expect("traffic lock")
            .set_throttling(throttling);
    }

    /// Sizes one bucket (an API, `API:unfiltered`) or a category's default ([`Throttling::set`]);
    /// the buckets whose size changed start full.
    pub fn set_bucket(&self, name: &str, size: Bucket) -> Result<(), ThrottlingError> {
        self.inner
            .traffic
            .lock()
            .expect("traffic lock")
            .set_bucket(name, size)
    }

    /// Another tenant of the account makes `n` calls drawing from `bucket` (an API, or
    /// `API:unfiltered`) now: each takes a token as a real call would, and the calls this mock's
    /// clients make next find them gone. Stops at the first call the bucket throttles; returns how
    /// many got a token. Not in the counters or the call log ([`traffic::Traffic::spend`]).
    pub fn spend_tokens(&self, bucket: &str, n: u32) -> Result<u32, ThrottlingError> {
        self.inner
            .traffic
            .lock()
            .expect("traffic lock")
            .spend(bucket, n, Instant::now())
    }

    /// The throttling in force and every bucket's tokens now.
    pub fn throttling(&self) -> (Throttling, Vec<BucketLevel>) {
        let t = self.inner.traffic.lock().expect("traffic lock");
        (t.throttling.clone(), t.levels(Instant::now()))
    }

    /// Replaces the latency profile (attach/detach delays and IMDS lag included).
    pub fn set_latency(&self, profile: LatencyProfile) {
        self.inner.world.lock().expect("world lock").timing = world::Timing::of(&profile);
        *self.inner.latency.lock().expect("latency lock") = profile;
    }

    pub fn set_imds_lag(&self, lag: Duration) {
        self.inner.world.lock().expect("world lock").timing.imds_lag = lag;
        self.inner.latency.lock().expect("latency lock").imds_lag = lag;
    }

    /// How long EC2's describes lag its changes (eventual consistency): an address assigned shows
    /// only after it, one unassigned shows until it has passed.
    pub fn set_describe_lag(&self, lag: Duration) {
        self.inner
            .world
            .lock()
            .expect("world lock")
            .timing
            .describe_lag = lag;
        self.inner
            .latency
            .lock()
            .expect("latency lock")
            .describe_lag = lag;
    }

    pub fn counters(&self) -> Counters {
        self.inner.traffic.lock().expect("traffic lock").counters()
    }

    /// Every call in arrival order, with its time and outcome.
    pub fn call_log(&self) -> Vec<CallRecord> {
        self.inner.traffic.lock().expect("traffic lock").log()
    }

    pub fn reset_counters(&self) {
        self.inner
            .traffic
            .lock()
            .expect("traffic lock")
            .reset(Instant::now());
    }
}
