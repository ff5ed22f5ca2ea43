//! The fleet's nodes: their VPCs, subnets and instances, and each node's eniipamd started. Most
//! patterns start every daemon on a quiet cloud before the pattern (`boot_all`, then `prepopulate`
//! and `settle`). In node-boot each daemon starts within the pattern at its own launch instant
//! (`Launched::start`, driven by the harness). Both go through the same `Launched::config` and
//! `start`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use eniipam::config::DaemonConfig;
use eniipam::daemon::DaemonHandle;
use eniipam::pool::snapshot::PoolSnapshot;
use eniipam_api::pb::ipam_client::IpamClient;
use ipnet::Ipv4Net;
use mockcloud::{LaunchedInstance, MockCloud};
use tokio::time::Instant;
use tonic::transport::Channel;

use super::pods::running_name;
use super::spec::{INSTANCE, PairSpec};
use super::traffic::PodPlan;
use crate::support;

/// Nodes per subnet: each gets its own VPC and `/16` (EC2's largest), so a node has 128 addresses of
/// room (primary, ENI primaries, up to 56 pod IPs, the warm pool, `/28` alignment).
const NODES_PER_SUBNET: usize = 500;
/// Daemons started at once while the fleet boots before the pattern.
const BOOT_WAVE: usize = 50;
/// The fleet is settled once every node has held nothing in flight and its warm target this long.
pub const SETTLE_HOLD: Duration = Duration::from_secs(30);
/// Longest boot-and-settle before the pair is reported as failed.
const SETTLE_LIMIT: Duration = Duration::from_secs(30 * 60);
/// Before the pattern (boot time, quiet cloud, not measured), a running pod's failed ADD is retried
/// after this long: only the fleet's start, not the kubelet model, is at stake.
const PREPOPULATE_RETRY: Duration = Duration::from_secs(2);
/// How often `settle` looks at the pools.
const SETTLE_POLL: Duration = Duration::from_secs(1);
/// A progress line at most this often (real time).
const PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// One node: its daemon, and a gRPC connection shared by its pods.
pub struct Node {
    pub handle: DaemonHandle,
    pub client: IpamClient<Channel>,
}

/// The fleet's instances, launched, with what each daemon's start needs.
pub struct Launched {
    mock: MockCloud,
    spec: PairSpec,
    root: PathBuf,
    instances: Vec<LaunchedInstance>,
    policy: mockcloud::iam::Policy,
    pod_ips_per_eni: u32,
}

/// One VPC with one `/16` subnet per `NODES_PER_SUBNET` nodes, and the nodes launched into them (no
/// daemon started yet).
pub async fn launch(mock: &MockCloud, spec: &PairSpec, root: &Path) -> anyhow::Result<Launched> {
    let world = mock.default_world().context("no default world")?;
    let limits =
        mockcloud::catalog::lookup(INSTANCE).context("instance type not in the catalog")?;
    let mut subnets = Vec::new();
    let mut vpcs = Vec::new();
    for k in 0..spec.nodes.div_ceil(NODES_PER_SUBNET) {
        let cidr: Ipv4Net = format!("10.{}.0.0/16", 64 + k)
            .parse()
            .context("subnet CIDR")?;
        let (vpc, _sg) = mock
            .create_vpc(cidr)
            .map_err(|e| anyhow!("creating the fleet's VPC {cidr}: {e}"))?;
        subnets.push(
            mock.create_subnet(&vpc, cidr, &world.instance.availability_zone)
                .map_err(|e| anyhow!("creating the fleet's subnet {cidr}: {e}"))?,
        );
        vpcs.push(vpc);
    }
    let mut instances = Vec::with_capacity(spec.nodes);
    for i in 0..spec.nodes {
        instances.push(
            mock.launch_instance_carrying(
                INSTANCE,
                &subnets[i / NODES_PER_SUBNET],
                &[],
                mockcloud::LaunchAddresses {
                    secondary_count: 0,
                    prefix_count: spec.launch_prefixes,
                },
            )
            .await
            .map_err(|e| anyhow!("launching node {i}: {e}"))?,
        );
    }
    Ok(Launched {
        mock: mock.clone(),
        spec: spec.clone(),
        root: root.to_owned(),
        instances,
        policy: fleet_policy(&vpcs),
        pod_ips_per_eni: limits.ipv4_per_eni - 1,
    })
}

impl Launched {
    /// Node `i`'s daemon configuration, with the policy's knobs; its state directory made.
    pub fn config(&self, i: usize) -> anyhow::Result<DaemonConfig> {
        let dir = self.root.join(format!("n{i}"));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let base = DaemonConfig {
            imds_endpoint: Some(self.instances[i].imds_url.clone()),
            reconcile_period_secs: DaemonConfig::default().reconcile_period_secs,
            log_level: "error".into(),
            ..support::daemon_config(&self.mock, &dir)
        };
        // `daemon_config` enforces the shipped policy for the default VPC; the nodes live in the
        // fleet's. Set back at once (no await in between: no daemon calls in the gap).
        self.mock.set_iam_policy(Some(self.policy.clone()));
        Ok(self.spec.policy.apply(base, self.pod_ips_per_eni))
    }

    /// Every node's daemon, started in waves of `BOOT_WAVE`.
    pub async fn boot_all(&self) -> anyhow::Result<Vec<Node>> {
        let mut nodes = Vec::with_capacity(self.instances.len());
        for first in (0..self.instances.len()).step_by(BOOT_WAVE) {
            let mut starting = Vec::new();
            for i in first..(first + BOOT_WAVE).min(self.instances.len()) {
                starting.push(tokio::spawn(start(self.config(i)?)));
            }
            for t in starting {
                nodes.push(t.await??);
            }
        }
        Ok(nodes)
    }
}

/// When the daemon's taint keeper (`reconcile::api_server::node`) would lift the startup taint: at
/// the first of its looks, at `started` (the keeper's start, with the pool's) and every `check`
/// after, that finds the pool warm (the keeper's own predicate, `node::warm`). The patch's round
/// trip is not counted.
pub async fn taint_lifted(
    pool: &eniipam::pool::Pool,
    started: Instant,
    check: Duration,
) -> Instant {
    use eniipam::reconcile::api_server::node::warm;
    let check = check.max(Duration::from_millis(1));
    let mut at = started;
    loop {
        let now = Instant::now();
        while at < now {
            at += check;
        }
        tokio::time::sleep_until(at).await;
        if warm(&pool.snapshot()) {
            return at;
        }
        at += check;
    }
}

/// Starts a daemon and connects to its gRPC server: once this returns, the node's server answers.
pub async fn start(config: DaemonConfig) -> anyhow::Result<Node> {
    let handle = support::start_daemon(config).await?;
    let client = support::client(&handle.socket_path).await?;
    Ok(Node { handle, client })
}

/// The shipped IAM policy for the fleet's VPCs (one per `NODES_PER_SUBNET` nodes): the policy
/// rendered for each, its statements together.
fn fleet_policy(vpcs: &[String]) -> mockcloud::iam::Policy {
    let mut vpcs = vpcs.iter();
    let first = vpcs.next().map_or("", String::as_str);
    let mut policy = mockcloud::iam::shipped_policy(support::CLUSTER, first);
    for vpc in vpcs {
        policy
            .statements
            .extend(mockcloud::iam::shipped_policy(support::CLUSTER, vpc).statements);
    }
    policy
}

/// The pods running before the pattern starts, allocated on the quiet boot-time cloud.
pub async fn prepopulate(nodes: &[Node], pods: &[PodPlan]) -> anyhow::Result<()> {
    let mut tasks = Vec::with_capacity(pods.len());
    for (i, p) in pods.iter().enumerate() {
        let mut c = nodes[p.node].client.clone();
        let name = running_name(p.node, i);
        tasks.push(tokio::spawn(async move {
            let mut attempts = 0;
            while let Err(s) = c.allocate(support::alloc_req(&name)).await {
                attempts += 1;
                if attempts > 30 {
                    bail!("pod {name} had no IP after {attempts} attempts: {s}");
                }
                tokio::time::sleep(PREPOPULATE_RETRY).await;
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

/// The free IPs the policy keeps ready.
pub fn warm_target(s: &PoolSnapshot) -> u32 {
    s.warm_target
}

/// Nothing in flight or waiting, and the warm target held.
fn settled(s: &PoolSnapshot) -> bool {
    s.in_flight == 0
        && s.creating_enis == 0
        && s.waiting_for_eni == 0
        && s.releasing == 0
        && s.idle_eligible >= warm_target(s)
}

/// Waits until every node has held `settled` for `SETTLE_HOLD`.
pub async fn settle(nodes: &[Node], tag: &str, real: std::time::Instant) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut steady_since: Option<Instant> = None;
    let mut last_progress = std::time::Instant::now();
    loop {
        let unsettled: Vec<PoolSnapshot> = nodes
            .iter()
            .map(|n| n.handle.pool.snapshot())
            .filter(|s| !settled(s))
            .collect();
        let now = Instant::now();
        if unsettled.is_empty() {
            if now - *steady_since.get_or_insert(now) >= SETTLE_HOLD {
                return Ok(());
            }
        } else {
            steady_since = None;
        }
        if now - started > SETTLE_LIMIT {
            let s = &unsettled[0];
            bail!(
                "{tag}: {} nodes did not settle within {SETTLE_LIMIT:?} (one: idle {} of which eligible {}, warm target {}, in flight {}, creating ENIs {}, waiting for an ENI {}, releasing {})",
                unsettled.len(),
                s.idle,
                s.idle_eligible,
                warm_target(s),
                s.in_flight,
                s.creating_enis,
                s.waiting_for_eni,
                s.releasing
            );
        }
        if last_progress.elapsed() >= PROGRESS_EVERY {
            last_progress = std::time::Instant::now();
            eprintln!(
                "fleet {tag}: settling, +{:.0} s simulated, {} of {} nodes not settled ({:.0} s real)",
                (now - started).as_secs_f64(),
                unsettled.len(),
                nodes.len(),
                real.elapsed().as_secs_f64()
            );
        }
        tokio::time::sleep(SETTLE_POLL).await;
    }
}
