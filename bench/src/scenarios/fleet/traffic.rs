//! The fleet's traffic patterns: which pod starts on which node when, and how long it lives. A plan
//! is drawn once from a seeded RNG, so every policy of a run, and every run with the same seed, sees
//! the same pods at the same instants.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The APIs the account-contention pattern's other tenant spends: the ones a node's growth and
/// shrinkage go through (`super::tenant` spends them).
pub const TENANT_APIS: [&str; 5] = [
    "CreateNetworkInterface",
    "AttachNetworkInterface",
    "ModifyNetworkInterfaceAttribute",
    "AssignPrivateIpAddresses",
    "UnassignPrivateIpAddresses",
];
/// A scale-up's pods start at uniformly random instants within this window (the scheduler binding
/// them; a cluster-wide scale-up does not reach every node in the same millisecond).
pub const SPREAD: Duration = Duration::from_secs(10);
/// How long the scale-up patterns are watched (extended while pods still wait).
const SCALE_UP_WINDOW: Duration = Duration::from_secs(5 * 60);
/// Churn: pods per node in steady state (arrival rate × mean lifetime), present before it starts.
pub const CHURN_STEADY: u32 = 30;
/// Churn: one pod start per node per this long, on average (Poisson arrivals).
pub const CHURN_MEAN_GAP: Duration = Duration::from_secs(10);
/// Churn: how long it runs.
pub const CHURN_WINDOW: Duration = Duration::from_secs(30 * 60);
/// Churn: a pod lives a uniformly random time in this range after it has its IP.
pub const CHURN_LIFE: (Duration, Duration) =
    (Duration::from_secs(2 * 60), Duration::from_secs(8 * 60));
/// Down-up: the first scale-up's pods are released this long after it starts.
pub const DOWN_AFTER: Duration = Duration::from_secs(10 * 60);
/// Down-up: the quiet hour between the release and the second scale-up.
pub const QUIET: Duration = Duration::from_secs(60 * 60);
/// Down-up: how long the second scale-up is watched.
pub const SECOND_WATCH: Duration = Duration::from_secs(10 * 60);
/// Mixed: every this-many-th node is a busy one.
pub const MIXED_EVERY: usize = 10;
/// Mixed: pods on a busy node, and on each other node.
pub const MIXED_PODS: (u32, u32) = (36, 1);
/// Node-boot: each node's eniipamd starts at a uniformly random instant within this window. Karpenter
/// batches pending pods for at most 10 s (`BATCH_MAX_DURATION`) and launches one NodeClaim per node of
/// the batch at once; what spreads the nodes is how long each instance takes from launch to its
/// DaemonSet pods running (boot, kubelet registration, image pull), which varies by tens of seconds.
/// 30 s is that spread, taken as a figure, not a measurement.
pub const LAUNCH_SPREAD: Duration = Duration::from_secs(30);
/// Node-boot: from the daemon's gRPC server answering to the node's pods starting their sandboxes.
/// The kubelet reports the node Ready as soon as the runtime reports its network ready (at start-up
/// it updates the node status every 100 ms until Ready, `fastStatusUpdateOnce`), then the scheduler
/// binds the waiting pods and the kubelet's pod watch sees them: about a second each. 2 s, a figure.
pub const KUBELET_READY: Duration = Duration::from_secs(2);
/// Node-boot with the startup taint: from the daemon lifting the taint to the node's pods being bound.
/// The scheduler's node informer sees the update and moves the pods it had left unschedulable back
/// to its active queue, binds them, and the kubelet's pod watch sees them: the scheduler's and the
/// kubelet's share of [`KUBELET_READY`], about a second. A figure, not a measurement.
pub const TAINT_TO_BIND: Duration = Duration::from_secs(1);

/// A traffic pattern.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Pattern {
    /// `--pods-per-node` pods on every node, starting within 10 s, on a booted and settled fleet.
    ScaleUp,
    /// 30 pods per node already running, then 30 min of Poisson arrivals (one per node per 10 s on
    /// average), each pod living 2–8 min.
    Churn,
    /// The scale-up; its pods released 10 min later; an hour of quiet; the same scale-up again,
    /// watched for 10 min: did the pool give back, and how fast does it come back.
    DownUp,
    /// Every 10th node takes 36 pods, every other node 1, within 10 s: 10 % of the nodes take ~80 %
    /// of the pods.
    Mixed,
    /// Karpenter-style: no node is booted beforehand. Each node's eniipamd starts within
    /// [`LAUNCH_SPREAD`] on the realistic, throttled cloud; [`KUBELET_READY`] after its gRPC server
    /// answers, its `--pods-per-node` pods start within 10 s, so boot, warm-up and ADDs overlap.
    NodeBoot,
    /// The scale-up (the same pods at the same instants) while another tenant of the account spends
    /// half of each growth API's bucket: half its burst at the start, half its refill rate after.
    AccountContention,
}

impl Pattern {
    pub const ALL: [Pattern; 6] = [
        Pattern::ScaleUp,
        Pattern::Churn,
        Pattern::DownUp,
        Pattern::Mixed,
        Pattern::NodeBoot,
        Pattern::AccountContention,
    ];

    /// The name on the command line, in the tables and in file names.
    pub fn name(self) -> &'static str {
        match self {
            Pattern::ScaleUp => "scale-up",
            Pattern::Churn => "churn",
            Pattern::DownUp => "down-up",
            Pattern::Mixed => "mixed",
            Pattern::NodeBoot => "node-boot",
            Pattern::AccountContention => "account-contention",
        }
    }

    /// Whether the nodes boot within the pattern (node-boot), not on a quiet cloud before it.
    pub fn boots_in_pattern(self) -> bool {
        self == Pattern::NodeBoot
    }

    /// Whether another tenant spends the account's buckets during the pattern.
    pub fn has_tenant(self) -> bool {
        self == Pattern::AccountContention
    }

    /// Whether the pattern ends with every pod of its last wave served (so "time until every pod has
    /// an IP" means something); churn never does.
    pub fn has_finish(self) -> bool {
        self != Pattern::Churn
    }

    /// The pods, drawn from `seed`.
    pub fn plan(self, nodes: usize, pods_per_node: u32, seed: u64) -> Plan {
        // One stream per pattern, so the scale-up of `all` is the same as the scale-up alone; the
        // account-contention pattern draws the scale-up's, so the two differ only in the tenant.
        let stream = match self {
            Pattern::AccountContention => Pattern::ScaleUp,
            p => p,
        };
        let mut rng = StdRng::seed_from_u64(seed ^ (stream as u64 + 1).wrapping_mul(0x9E37_79B9));
        let mut launches = Vec::new();
        let mut pods = Vec::new();
        let mut prepopulated = Vec::new();
        let window;
        let mut waves = vec![Duration::ZERO];
        let scale_up = |rng: &mut StdRng, pods: &mut Vec<PodPlan>, at: Duration, wave: u8| {
            for node in 0..nodes {
                let n = match self {
                    Pattern::Mixed if node % MIXED_EVERY == 0 => MIXED_PODS.0,
                    Pattern::Mixed => MIXED_PODS.1,
                    _ => pods_per_node,
                };
                for _ in 0..n {
                    pods.push(PodPlan {
                        node,
                        start: at + SPREAD.mul_f64(rng.random::<f64>()),
                        life: Life::Forever,
                        wave,
                    });
                }
            }
        };
        match self {
            Pattern::ScaleUp | Pattern::Mixed | Pattern::AccountContention => {
                scale_up(&mut rng, &mut pods, Duration::ZERO, 0);
                window = SCALE_UP_WINDOW;
            }
            Pattern::NodeBoot => {
                launches = (0..nodes)
                    .map(|_| LAUNCH_SPREAD.mul_f64(rng.random::<f64>()))
                    .collect();
                // Starts from each node's Ready (see `Plan::launches`).
                scale_up(&mut rng, &mut pods, Duration::ZERO, 0);
                window = SCALE_UP_WINDOW;
            }
            Pattern::DownUp => {
                scale_up(&mut rng, &mut pods, Duration::ZERO, 0);
                for p in &mut pods {
                    p.life = Life::Until(DOWN_AFTER + SPREAD.mul_f64(rng.random::<f64>()));
                }
                let second = DOWN_AFTER + QUIET;
                scale_up(&mut rng, &mut pods, second, 1);
                waves.push(second);
                window = second + SECOND_WATCH;
            }
            Pattern::Churn => {
                let (lo, hi) = (CHURN_LIFE.0.as_secs_f64(), CHURN_LIFE.1.as_secs_f64());
                for node in 0..nodes {
                    // Already running: each with the time left of a pod caught in steady state (a
                    // lifetime drawn length-biased, density ∝ l on [lo, hi], and a uniform point
                    // of it), so the releases keep the population steady from the first second.
                    for _ in 0..CHURN_STEADY {
                        let u: f64 = rng.random();
                        let life = (lo * lo + u * (hi * hi - lo * lo)).sqrt();
                        let left = life * rng.random::<f64>();
                        prepopulated.push(PodPlan {
                            node,
                            start: Duration::ZERO,
                            life: Life::Until(Duration::from_secs_f64(left)),
                            wave: 0,
                        });
                    }
                    let mut t = 0.0;
                    loop {
                        let u: f64 = rng.random();
                        t += -(1.0 - u).ln() * CHURN_MEAN_GAP.as_secs_f64();
                        if t >= CHURN_WINDOW.as_secs_f64() {
                            break;
                        }
                        pods.push(PodPlan {
                            node,
                            start: Duration::from_secs_f64(t),
                            life: Life::For(Duration::from_secs_f64(rng.random_range(lo..hi))),
                            wave: 0,
                        });
                    }
                }
                window = CHURN_WINDOW;
            }
        }
        pods.sort_by_key(|p| (p.node, p.start));
        Plan {
            prepopulated,
            pods,
            window,
            waves,
            launches,
        }
    }

    /// One line for the report's set-up.
    pub fn describe(self, pods_per_node: u32) -> String {
        let s = SPREAD.as_secs();
        match self {
            Pattern::ScaleUp => format!(
                "scale-up: {pods_per_node} pods per node, each starting at a uniformly random instant within {s} s; watched {} min (longer while pods wait)",
                SCALE_UP_WINDOW.as_secs() / 60
            ),
            Pattern::Churn => format!(
                "churn: {CHURN_STEADY} pods per node running at the start (allocated before the fleet settles; each released after the time left of a pod caught in steady state), then {} min of Poisson arrivals, one per node per {} s on average, each pod released {}–{} min after it has its IP",
                CHURN_WINDOW.as_secs() / 60,
                CHURN_MEAN_GAP.as_secs(),
                CHURN_LIFE.0.as_secs() / 60,
                CHURN_LIFE.1.as_secs() / 60
            ),
            Pattern::DownUp => format!(
                "down-up: the scale-up ({pods_per_node} pods per node within {s} s); {} min later all of them released (within {s} s); {} min quiet; the same scale-up again, watched {} min. Pod waits: both scale-ups; time until every pod has an IP: the second",
                DOWN_AFTER.as_secs() / 60,
                QUIET.as_secs() / 60,
                SECOND_WATCH.as_secs() / 60
            ),
            Pattern::Mixed => format!(
                "mixed: every {MIXED_EVERY}th node {} pods, the others {}, within {s} s; watched {} min",
                MIXED_PODS.0,
                MIXED_PODS.1,
                SCALE_UP_WINDOW.as_secs() / 60
            ),
            Pattern::NodeBoot => format!(
                "node-boot (Karpenter-style): no node booted beforehand; from the pattern's start the realistic latency and the account's buckets are on, and each node's eniipamd starts at a uniformly random instant within {} s (a batch of launches, spread by instance boot times); the node is Ready {} s after its gRPC server answers (kubelet status, scheduler binding), and its {pods_per_node} pods start within {s} s of that, so boot (describes), warm-up and ADDs overlap across the fleet; watched {} min from the first launch. With the startup taint modelled (`--fleet-startup-taint on`), eniipam's nodes take their pods only once the taint would be lifted, and every pod's wait runs from its node's launch (the next line). `free per node at start` = idle IPs when the node takes pods, `boot + settle` = when the last node did; the account bound counts each node from empty (its first pod ENI's room with nothing assigned)",
                LAUNCH_SPREAD.as_secs(),
                KUBELET_READY.as_secs(),
                SCALE_UP_WINDOW.as_secs() / 60
            ),
            Pattern::AccountContention => format!(
                "account-contention: the scale-up's pods ({pods_per_node} per node within {s} s, the same instants) while another tenant of the account spends the same buckets: it has spent half the burst of each of {} when the pattern starts, and keeps spending half of each one's refill rate (its calls take tokens from mockcloud's buckets as real calls would; a throttled one is made again later); the account bound uses what is left, burst/2 and refill/2; watched {} min",
                TENANT_APIS.join(", "),
                SCALE_UP_WINDOW.as_secs() / 60
            ),
        }
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Pattern {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Pattern::ALL
            .into_iter()
            .find(|p| p.name() == s.trim())
            .ok_or_else(|| {
                format!(
                    "unknown pattern {s:?} (known: {}, or all)",
                    Pattern::ALL.map(Pattern::name).join(", ")
                )
            })
    }
}

/// When a pod is released.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Life {
    /// Never (within the run).
    Forever,
    /// This long after it has its IP.
    For(Duration),
    /// At this offset from the pattern's start.
    Until(Duration),
}

/// One pod.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PodPlan {
    pub node: usize,
    /// Its ADD's first attempt, from the pattern's start (node-boot: from its node's Ready).
    pub start: Duration,
    pub life: Life,
    /// Which scale-up it belongs to (down-up has two; the others one).
    pub wave: u8,
}

/// A pattern's pods.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Running before the pattern starts (allocated while the fleet boots), by node.
    pub prepopulated: Vec<PodPlan>,
    /// Started during the pattern, sorted by node then start.
    pub pods: Vec<PodPlan>,
    /// How long the pattern is watched.
    pub window: Duration,
    /// Each wave's start.
    pub waves: Vec<Duration>,
    /// Node-boot: each node's launch (its eniipamd's start), from the pattern's start; its pods'
    /// `start` counts from when it is Ready. Empty when the fleet boots before the pattern.
    pub launches: Vec<Duration>,
}

impl Plan {
    /// Pods of the last wave: the ones "time until every pod has an IP" waits for.
    pub fn last_wave(&self) -> u8 {
        (self.waves.len() - 1) as u8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_are_repeatable_and_shaped_as_documented() {
        let a = Pattern::ScaleUp.plan(10, 20, 7);
        let b = Pattern::ScaleUp.plan(10, 20, 7);
        assert_eq!(a.pods, b.pods);
        assert_eq!(a.pods.len(), 200);
        assert!(a.pods.iter().all(|p| p.start < SPREAD));

        let mixed = Pattern::Mixed.plan(20, 20, 7);
        assert_eq!(mixed.pods.len(), 2 * 36 + 18);

        let du = Pattern::DownUp.plan(4, 20, 7);
        assert_eq!(du.pods.len(), 160);
        assert_eq!(du.pods.iter().filter(|p| p.wave == 1).count(), 80);
        assert_eq!(du.window, DOWN_AFTER + QUIET + SECOND_WATCH);

        let churn = Pattern::Churn.plan(50, 20, 7);
        assert_eq!(churn.prepopulated.len(), 50 * CHURN_STEADY as usize);
        // 50 nodes × 1800 s / 10 s = 9000 arrivals expected; Poisson spread ≈ ±95.
        let n = churn.pods.len() as f64;
        assert!((8600.0..9400.0).contains(&n), "{n}");
        // Steady state: the running pods' mean time left is E[L²]/(2 E[L]) = 2.8 min for U(2, 8).
        let left: f64 = churn
            .prepopulated
            .iter()
            .map(|p| match p.life {
                Life::Until(d) => d.as_secs_f64(),
                _ => unreachable!(),
            })
            .sum::<f64>()
            / churn.prepopulated.len() as f64;
        assert!((155.0..181.0).contains(&left), "{left}");
    }

    #[test]
    fn node_boot_launches_every_node_once_and_starts_its_pods_after_ready() {
        let a = Pattern::NodeBoot.plan(40, 12, 9);
        assert_eq!(a.launches, Pattern::NodeBoot.plan(40, 12, 9).launches);
        assert_eq!(a.pods, Pattern::NodeBoot.plan(40, 12, 9).pods);
        assert_ne!(a.launches, Pattern::NodeBoot.plan(40, 12, 10).launches);
        assert_eq!(a.launches.len(), 40);
        assert!(a.launches.iter().all(|l| *l < LAUNCH_SPREAD));
        // Spread over the window, not bunched: both halves launch nodes.
        let early = a
            .launches
            .iter()
            .filter(|l| **l < LAUNCH_SPREAD / 2)
            .count();
        assert!((10..=30).contains(&early), "{early}");
        // Every node its 12 pods, each within SPREAD of its node's Ready, none before it.
        for node in 0..40 {
            let of: Vec<&PodPlan> = a.pods.iter().filter(|p| p.node == node).collect();
            assert_eq!(of.len(), 12, "node {node}");
            assert!(
                of.iter()
                    .all(|p| p.start < SPREAD && p.life == Life::Forever)
            );
        }
        assert!(a.prepopulated.is_empty());
        assert_eq!(a.window, SCALE_UP_WINDOW);
        assert!(Pattern::ScaleUp.plan(40, 12, 9).launches.is_empty());
    }

    #[test]
    fn account_contention_is_the_scale_up_pod_for_pod() {
        let ours = Pattern::AccountContention.plan(30, 20, 7);
        let scale_up = Pattern::ScaleUp.plan(30, 20, 7);
        assert_eq!(ours.pods, scale_up.pods);
        assert_eq!((ours.window, ours.launches.len()), (scale_up.window, 0));
        assert!(Pattern::AccountContention.has_tenant() && !Pattern::ScaleUp.has_tenant());
    }

    #[test]
    fn the_new_patterns_parse_by_name() {
        for p in [Pattern::NodeBoot, Pattern::AccountContention] {
            assert_eq!(p.name().parse::<Pattern>(), Ok(p));
            assert!(Pattern::ALL.contains(&p) && p.has_finish());
        }
        let e = "node-bot".parse::<Pattern>().unwrap_err();
        assert!(
            e.contains("\"node-bot\"") && e.contains("account-contention"),
            "{e}"
        );
    }
}
