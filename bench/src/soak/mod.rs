//! The fault soak (issue 13): the real `eniipamd` binary against an in-process mockcloud, driven by a
//! fake container runtime that runs the real `eniipam` plugin (IPAM role) for ADD/DEL/GC churn on two
//! networks, while a seeded schedule injects faults — SIGKILLs, EC2 errors, hangs, throttling, IMDS lag,
//! out-of-band unassigns and detaches, a lost state file, a full disk, hidden network namespaces,
//! pods dying without a DEL — and an invariant checker compares the daemon, the store,
//! EC2 and the host after every step.
//!
//! A run is a sequence of steps. Each step: undo the faults whose time is up, apply the step's
//! planned faults ([`faults::planned`]), maybe GC one network (never concurrently with ADD/DEL: the
//! spec makes the runtime serialise them), run one batch of pod operations concurrently (pods ending by
//! DEL or by dying, late DELs, new pods ADDing to one or both networks), SIGKILL the daemon in the
//! middle of the batch if planned, restart it, then check. Everything random is drawn from an RNG of
//! (seed, step), so a violation is named by its seed and step; the daemon's own timing still varies.
//!
//! mockcloud enforces the shipped IAM policy for the whole run; [`iam`] holds the `iam-revoke` fault
//! and its checks (no call of an action that is granted is refused; a refused one is named in the
//! daemon's log).
//!
//! Modules: [`driver`] (the run's state and the step loop, restarts, GC, checks, the end), [`pods`] (a
//! step's batch of pod operations and what the runtime learns from it), [`inject`] (applying and
//! undoing faults), [`faults`] (the kinds and the seeded schedule), [`witnesses`] (one observation
//! of the daemon, the store, EC2 and the host), [`checker`] (the invariants, held against an
//! observation), [`model`] (the runtime's truth), [`runtime`] (the plugin binary as libcni runs it),
//! [`daemon`] (the eniipamd subprocess), [`host`] (the temporary node: state tmpfs, cache, namespaces),
//! [`caught_up`] (the end's wait for the daemon to catch up with the last changes),
//! [`profiles`] and [`checker_profiles`] (the network-profiles mode, issue 27: custom networking with
//! ENIConfig changes and two network profiles served by an API-server double, and its invariants).
//! Besides the checker's kinds, the driver reports `del-failed` (a DEL answered an error),
//! `daemon-exited` (eniipamd ended by itself) and `daemon-down` (not ready within a minute).
//!
//! Used by the benchmark program (`eniipam-bench soak`) and, through a `#[path]` include, by the short
//! CI test `tests/soak.rs`; so it names only crates both have.

pub mod checker;
pub mod checker6;
pub mod checker_profiles;
pub mod daemon;
pub mod faults;
pub mod host;
pub mod iam;
pub mod model;
pub mod profiles;
pub mod runtime;
pub mod witnesses;

mod caught_up;
mod driver;
mod findings;
mod inject;
mod pods;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use mockcloud::{LatencyProfile, MockCloud, Throttling};
use tokio::time::Instant;

use checker::CheckerState;
use daemon::{DaemonKnobs, DaemonProc};
use faults::FaultKind;
use host::Host;
use model::Model;
use runtime::Runtime;

/// How long a run lasts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Budget {
    Steps(u64),
    Time(Duration),
}

/// Which address families the daemon gives pods (`ENIIPAM_IP_FAMILY`): the soak's own copy of
/// the daemon's setting, so the test that includes this module by path names no daemon type.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IpFamily {
    /// An IPv4 from the ENI pool.
    #[default]
    Ipv4,
    /// An IPv6 from the node's /80 only.
    Ipv6,
    /// Both, one record each, released together.
    Dual,
}

impl IpFamily {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ipv4 => "ipv4",
            Self::Ipv6 => "ipv6",
            Self::Dual => "dual",
        }
    }

    /// Whether pods get an IPv4 from the pool.
    pub fn has_ipv4(self) -> bool {
        self != Self::Ipv6
    }

    /// Whether pods get an IPv6 from the /80.
    pub fn has_ipv6(self) -> bool {
        self != Self::Ipv4
    }
}

impl std::fmt::Display for IpFamily {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for IpFamily {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "ipv4" => Ok(Self::Ipv4),
            "ipv6" => Ok(Self::Ipv6),
            "dual" => Ok(Self::Dual),
            other => Err(format!("ip family {other:?} is not ipv4, ipv6 or dual")),
        }
    }
}

/// Everything a soak is told.
#[derive(Clone, Debug)]
pub struct SoakConfig {
    pub seed: u64,
    pub budget: Budget,
    pub daemon_bin: PathBuf,
    pub plugin_bin: PathBuf,
    /// 1 or 2 networks (conflists).
    pub networks: usize,
    /// Faults to inject; those that do not apply to `ip_family` are dropped at the start (see
    /// [`FaultKind::applies`]) and named in the outcome's notes.
    pub faults: BTreeSet<FaultKind>,
    pub ip_family: IpFamily,
    pub instance_type: String,
    pub knobs: DaemonKnobs,
    /// Keep the daemon's log here (else it goes with the temporary directory).
    pub log_file: Option<PathBuf>,
    /// Print progress and each violation on stderr as found.
    pub progress: bool,
    /// The network-profiles mode ([`profiles`]; IPv4 only): custom networking with two ENIConfigs
    /// switched during the run, two network profiles, an API-server double.
    pub network_profiles: bool,
}

impl SoakConfig {
    pub fn new(seed: u64, budget: Budget, daemon_bin: PathBuf, plugin_bin: PathBuf) -> Self {
        Self {
            seed,
            budget,
            daemon_bin,
            plugin_bin,
            networks: 2,
            faults: FaultKind::ALL.into_iter().collect(),
            ip_family: IpFamily::Ipv4,
            instance_type: "c5.xlarge".into(),
            knobs: DaemonKnobs::default(),
            log_file: None,
            progress: false,
            network_profiles: false,
        }
    }

    /// What names this soak in progress lines, where soaks run side by side (`tests/soak.rs`):
    /// its address family, and `+profiles` in the network-profiles mode.
    pub fn tag(&self) -> String {
        let profiles = if self.network_profiles {
            "+profiles"
        } else {
            ""
        };
        format!("{}{profiles}", self.ip_family)
    }

    /// The network-profiles mode, on a node with room for both profiles and the default network
    /// (8 ENIs of 30 addresses; eth0 serves no pods).
    pub fn with_network_profiles(mut self) -> Self {
        self.network_profiles = true;
        self.instance_type = PROFILES_INSTANCE.into();
        self
    }
}

/// The node of the network-profiles mode.
pub const PROFILES_INSTANCE: &str = "c5.4xlarge";
/// Live pods the network-profiles mode aims at (its node's capacity would ask for ~100).
pub const PROFILES_TARGET_POD_COUNT: usize = 44;

/// What happened, by the numbers.
#[derive(Clone, Debug, Default)]
pub struct Counts {
    pub steps: u64,
    pub adds_ok: u64,
    pub adds_failed: u64,
    pub dels_ok: u64,
    pub dels_failed: u64,
    pub gcs_ok: u64,
    pub gcs_failed: u64,
    pub kills: u64,
    pub restarts: u64,
    /// Startups that failed while the disk was full (expected).
    pub starts_failed_disk_full: u64,
    pub checks: u64,
    pub checks_skipped: u64,
    pub pods: u64,
    pub peak_live_pods: usize,
    pub distinct_ips: usize,
    /// IPv6 addresses ADDs handed out (ipv6, dual): each to one attachment only.
    pub distinct_ipv6: usize,
    pub faults: BTreeMap<&'static str, u64>,
    /// ADD failures by the plugin's error code.
    pub add_errors: BTreeMap<String, u64>,
    /// IAM: revocations of an action, and the calls EC2 refused for the revoked action.
    pub iam_revocations: u64,
    pub iam_refused: u64,
    /// Network-profiles mode: ADDs that succeeded per network (`db`, `app`, `default`).
    pub network_adds_ok: BTreeMap<String, u64>,
    /// Network-profiles mode: ADDs of a profile's pods refused with CNI error 11 naming the profile.
    pub profile_refusals: BTreeMap<String, u64>,
    /// Network-profiles mode: ADDs of a profile's pods that failed otherwise (daemon killed,
    /// unreachable, EC2 faults), per profile.
    pub profile_other_failures: BTreeMap<String, u64>,
    /// Network-profiles mode: changes of the node's ENIConfig.
    pub eniconfig_switches: u64,
    /// Network-profiles mode: distinct ENIs EC2 showed serving each network over the run.
    pub network_enis: BTreeMap<String, usize>,
}

/// One broken invariant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub kind: &'static str,
    pub subject: String,
    pub seed: u64,
    pub step: u64,
    pub text: String,
    /// The faults of the steps before.
    pub context: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "[seed {} step {}] {}: {}",
            self.seed, self.step, self.kind, self.text
        )?;
        if !self.context.is_empty() {
            write!(f, " (before: {})", self.context)?;
        }
        Ok(())
    }
}

/// One run's state: driven by [`driver`] and added to by [`iam`], [`inject`] and [`pods`] (each an
/// `impl Soak` of its own). Here, above them all, so that none of them imports another for it.
pub(super) struct Soak {
    cfg: SoakConfig,
    host: Host,
    mock: MockCloud,
    instance_id: String,
    daemon: DaemonProc,
    runtime: Runtime,
    network_names: Vec<String>,
    model: Model,
    counts: Counts,
    violations: Vec<Violation>,
    reported: BTreeSet<(&'static str, String)>,
    undos: Vec<inject::PendingUndo>,
    checker: CheckerState,
    recent: VecDeque<(u64, String)>,
    notes: Vec<String>,
    capacity: u32,
    target_pods: usize,
    ips_seen: BTreeSet<std::net::Ipv4Addr>,
    last_oob: Option<Instant>,
    grace: Duration,
    iam: iam::IamState,
    /// The network-profiles mode's API-server double and world (`None`: not that mode).
    cluster: Option<profiles::ProfileCluster>,
    /// Network-profiles mode: the ENIs EC2 showed attached, per network tag (`default` untagged).
    network_enis: BTreeMap<String, BTreeSet<String>>,
    /// Network-profiles mode: an overcommit seen at the last check, to be confirmed by the next.
    promised_breach: Option<(u64, String)>,
    /// The next step's batch is cut by a SIGKILL whatever the schedule says ([`inject`]'s
    /// restart after an out-of-band unassign).
    kill_next: bool,
}

/// A run's result.
#[derive(Clone, Debug)]
pub struct SoakOutcome {
    pub seed: u64,
    pub ip_family: IpFamily,
    pub wall: Duration,
    pub capacity: u32,
    pub counts: Counts,
    /// Distinct violations (kind, subject), in the order found.
    pub violations: Vec<Violation>,
    /// Things worth knowing that are not violations (failed GCs, skipped checks).
    pub notes: Vec<String>,
}

impl SoakOutcome {
    pub fn by_kind(&self) -> BTreeMap<&'static str, usize> {
        let mut m = BTreeMap::new();
        for v in &self.violations {
            *m.entry(v.kind).or_insert(0) += 1;
        }
        m
    }

    /// Up to `per_kind` violations of each kind, kind by kind (in name order), each kind's in the
    /// order found.
    pub fn first_of_each_kind(&self, per_kind: usize) -> impl Iterator<Item = &Violation> {
        self.by_kind().into_keys().flat_map(move |k| {
            self.violations
                .iter()
                .filter(move |v| v.kind == k)
                .take(per_kind)
        })
    }

    /// A plain-text summary: counts, then up to `per_kind` violations of each kind.
    pub fn summary(&self, per_kind: usize) -> String {
        let c = &self.counts;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "soak seed {} ({}): {} steps in {:.0} s, capacity {}; ADD {} ok / {} failed, DEL {} ok / {} failed, \
             GC {} ok / {} failed; {} SIGKILLs, {} restarts; {} pods, peak {} live, {} distinct IPs; \
             {} IPv6 addresses; {} checks ({} skipped)",
            self.seed,
            self.ip_family,
            c.steps,
            self.wall.as_secs_f64(),
            self.capacity,
            c.adds_ok,
            c.adds_failed,
            c.dels_ok,
            c.dels_failed,
            c.gcs_ok,
            c.gcs_failed,
            c.kills,
            c.restarts,
            c.pods,
            c.peak_live_pods,
            c.distinct_ips,
            c.distinct_ipv6,
            c.checks,
            c.checks_skipped
        );
        let faults: Vec<String> = c.faults.iter().map(|(k, n)| format!("{k} {n}")).collect();
        let _ = writeln!(s, "faults: {}", faults.join(", "));
        let _ = writeln!(
            s,
            "IAM: the shipped policy enforced throughout; {} revocations, {} calls refused for the \
             revoked action (a refusal of anything else is an iam-denied violation)",
            c.iam_revocations, c.iam_refused
        );
        if !c.network_adds_ok.is_empty() || c.eniconfig_switches > 0 {
            let _ = writeln!(
                s,
                "network profiles: ADDs ok per network {:?}; ENIs per network {:?}; refusals naming the \
                 profile {:?}; other failures of profile pods {:?}; {} ENIConfig changes",
                c.network_adds_ok,
                c.network_enis,
                c.profile_refusals,
                c.profile_other_failures,
                c.eniconfig_switches
            );
        }
        let kinds = self.by_kind();
        if kinds.is_empty() {
            let _ = writeln!(s, "violations: none");
        } else {
            let list: Vec<String> = kinds.iter().map(|(k, n)| format!("{k} {n}")).collect();
            let _ = writeln!(
                s,
                "violations: {} ({})",
                self.violations.len(),
                list.join(", ")
            );
            for v in self.first_of_each_kind(per_kind) {
                let _ = writeln!(s, "  {v}");
            }
        }
        for n in &self.notes {
            let _ = writeln!(s, "note: {n}");
        }
        s
    }
}

/// mockcloud as the soak runs it: EC2's shape of latency at a fifth of the realistic figures (the
/// attach and IMDS delays included), EC2's default account throttling, and EC2's lag in showing a
/// new ENI at its realistic figure (`NewEniLag::realistic`: unlisted for 2 s, the first call on one
/// new ENI in four refused as not found).
pub fn mock_latency() -> LatencyProfile {
    let mut p = LatencyProfile::realistic();
    for v in p.per_action.values_mut() {
        *v /= 5;
    }
    p.default /= 5;
    p.attach_delay = Duration::from_millis(400);
    p.detach_delay = Duration::from_millis(400);
    p.imds_lag = BASE_IMDS_LAG;
    p
}

const BASE_IMDS_LAG: Duration = Duration::from_millis(200);
const NETWORKS: [&str; 2] = ["soak-a", "soak-b"];
const IFNAMES: [&str; 2] = ["eth0", "net1"];
/// Chance a step starts with a GC of one network.
const GC_CHANCE: f64 = 0.12;
/// How long the daemon may take to become ready.
const READY_DEADLINE: Duration = Duration::from_secs(60);
/// EC2 actions the error, hang and slow-reply faults pick from.
const ACTIONS: [&str; 9] = [
    "AssignPrivateIpAddresses",
    "UnassignPrivateIpAddresses",
    "CreateNetworkInterface",
    "AttachNetworkInterface",
    "DetachNetworkInterface",
    "DeleteNetworkInterface",
    "DescribeNetworkInterfaces",
    "ModifyNetworkInterfaceAttribute",
    "CreateTags",
];
const ERROR_CODES: [&str; 3] = ["InternalError", "RequestLimitExceeded", "Unavailable"];

/// Runs one soak. Errors are the harness's (cannot mount, cannot start); broken invariants are in the
/// outcome.
pub async fn run(mut cfg: SoakConfig) -> anyhow::Result<SoakOutcome> {
    anyhow::ensure!(
        (1..=2).contains(&cfg.networks),
        "networks must be 1 or 2, not {}",
        cfg.networks
    );
    for b in [&cfg.daemon_bin, &cfg.plugin_bin] {
        anyhow::ensure!(b.is_file(), "{} is not built", b.display());
    }
    let family = cfg.ip_family;
    let moot: Vec<FaultKind> = cfg
        .faults
        .iter()
        .copied()
        .filter(|k| !k.applies(family))
        .collect();
    cfg.faults.retain(|k| k.applies(family));
    cfg.knobs.ip_family = family;
    anyhow::ensure!(
        !cfg.network_profiles || family == IpFamily::Ipv4,
        "the network-profiles mode is IPv4 only (the daemon refuses network_profiles with ip_family \
         ipv6), not {family}"
    );
    let started = Instant::now();
    let host = Host::new(&format!("s{}-{family}", cfg.seed))?;
    let mock = MockCloud::start_seeded(
        mockcloud::Config {
            latency: mock_latency(),
            throttling: Throttling::default(),
            default_instance_type: cfg.instance_type.clone(),
            ..mockcloud::Config::fast()
        },
        cfg.seed,
    )
    .await
    .context("starting mockcloud")?;
    // The shipped IAM policy, enforced for the whole run (the iam-revoke fault edits it).
    let shipped = mock
        .enforce_shipped_policy(iam::CLUSTER)
        .context("mockcloud has no default world")?;
    let instance_id = mock.default_instance().instance_id;
    let cluster = if cfg.network_profiles {
        let c = profiles::setup(&mock).await?;
        cfg.knobs.extra_env.extend(c.daemon_env());
        Some(c)
    } else {
        None
    };
    let log = cfg
        .log_file
        .clone()
        .unwrap_or_else(|| host.root.join("eniipamd.log"));
    if let Some(dir) = log.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let _ = std::fs::remove_file(&log);
    let daemon = DaemonProc::new(
        &cfg.daemon_bin,
        &mock,
        &host.state_dir,
        &host.cache_dir,
        &host.root,
        &log,
        &cfg.knobs,
    );
    let runtime = Runtime {
        plugin: cfg.plugin_bin.clone(),
        socket: daemon.socket.clone(),
        cache_dir: host.cache_dir.clone(),
        cni_path: host.cni_path.clone(),
        family,
    };
    // The reconcile runs every period ±20 %: two of them, and a second, to notice an out-of-band change.
    let grace = Duration::from_secs_f64(cfg.knobs.reconcile_period_secs as f64 * 1.2 * 2.0 + 2.0);
    let mut soak = Soak {
        network_names: NETWORKS[..cfg.networks]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        cfg,
        host,
        mock,
        instance_id,
        daemon,
        runtime,
        model: Model::default(),
        counts: Counts::default(),
        violations: Vec::new(),
        reported: BTreeSet::new(),
        undos: Vec::new(),
        checker: CheckerState::default(),
        recent: VecDeque::new(),
        notes: moot
            .iter()
            .map(|k| {
                format!(
                    "{k}: not injected with ip_family {family}: {}",
                    k.moot_why()
                )
            })
            .collect(),
        capacity: 0,
        target_pods: 0,
        ips_seen: BTreeSet::new(),
        last_oob: None,
        grace,
        iam: iam::IamState::new(shipped),
        cluster,
        network_enis: BTreeMap::new(),
        promised_breach: None,
        kill_next: false,
    };
    let result = soak.drive(started).await;
    soak.counts.iam_revocations = soak.iam.revocations;
    soak.counts.iam_refused = soak.iam.denials_of_revoked;
    soak.daemon.kill().await;
    result?;
    Ok(SoakOutcome {
        seed: soak.cfg.seed,
        ip_family: soak.cfg.ip_family,
        wall: started.elapsed(),
        capacity: soak.capacity,
        counts: soak.counts.clone(),
        violations: soak.violations.clone(),
        notes: soak.notes.clone(),
    })
}
