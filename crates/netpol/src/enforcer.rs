//! The enforcer (`network_policy`, on by default where it can be): the cluster's NetworkPolicies,
//! pods and namespaces watched ([`ClusterWatch`]), this node's pods taken from the IP core (through
//! [`LocalPods`]), and the kernel's table `inet eniipam_policy` kept enforcing what the policies say
//! of them ([`Engine`]).
//!
//! - **This node's pods** come from the daemon's pool (IPv4) and IPv6 book (ipv6 and dual), so
//!   every family is enforced; the daemon implements [`LocalPods`] over them, so this crate never
//!   sees the pool.
//! - **Syncing**: one task. Every change of the watched objects (or a pod ADDed or DELeted here)
//!   bumps a generation; the task takes the newest, compiles the node's pods and sends the kernel
//!   one transaction (the whole table the first time, in-place updates after), so a burst of
//!   changes costs one sync. The time from a change to its rules being in force is
//!   `eniipam_network_policy_sync_seconds`. A failed sync is retried with back-off; every
//!   [`RELOAD`] the whole table is loaded again.
//! - **The table kept** (issue 47, case 5): every [`CHECK`] the kernel is asked whether the table,
//!   its hooked base chain and every pod chain are still there, and every [`RESYNC`] whether the
//!   base chain still holds its jumps ([`Engine::check`]). Another agent's `nft flush ruleset` is
//!   logged at warn level (naming what was missing), the table loaded whole at once, and counted
//!   in `eniipam_network_policy_table_restored_total`.
//! - **A new pod starts with its rules in force**: its ADD ([`Enforcer::admit`], the IPAM service's admission) waits until a
//!   sync that includes it has reached the kernel, before the plugin even creates the veth the
//!   rules match; if that cannot happen within [`ADMIT_TIMEOUT`] (policies not listed yet, the pod
//!   unknown to the API server, `nft` failing) the ADD fails and its IP goes back: a pod never runs
//!   unfiltered while its policies say otherwise. That same sync lists it in the peer sets of the
//!   node's pods whose policies select it (by the pool's address, before the kubelet posts it:
//!   [`crate::enforce::local_pods`]), so it is a peer on its node from its ADD.
//! - **The startup taint** (`remove_startup_taint`) stays until a first sync has put the rules in
//!   the kernel ([`Setup::on_synced`]), not only until the pool is warm: no pod is scheduled to
//!   a node that would fail its ADD for want of its rules (issue 47, case 9).
//! - **Decisions reported** (`crate::decisions::task`): the chains carry per-rule counters and
//!   the NFLOG statements of the decision log; each sync that changed the table hands the log's
//!   reader and the counters' reader a new [`DecisionMap`].
//! - **Off** (`network_policy = false`): the table is deleted at startup, so turning enforcement
//!   off stops it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use eniipam_api::model::PodRef;
use eniipam_netfilter::Nft;

use crate::Direction;
use crate::decisions::{DecisionMap, LogConfig};
use crate::enforce::{Engine, LocalAttachment, Round, SyncKind, SyncReport};
use crate::metrics::{PolicyMetrics, Synced, VerdictCounts};
use crate::nft::LocalPod;
use crate::watch::{ClusterWatch, pod_view};
use crate::{DirectionCounts, Explanation};

/// How long a new pod's ADD waits for its rules.
const ADMIT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long an ADD waits for the API server when the pod watch does not know the pod.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// How often an ADD asks again for a pod the API server does not know yet.
const LOOKUP_RETRY: Duration = Duration::from_millis(500);

/// The whole table is loaded again this often.
const RELOAD: Duration = Duration::from_secs(600);

/// The sync is re-run this often even without a change (the pool's pods may have changed by a
/// path that does not tell the gate: the running reconcile's releases).
const RESYNC: Duration = Duration::from_secs(30);

/// The kernel's table is checked this often (there, its base chain hooked, every pod chain
/// there), so that another agent's `nft flush ruleset` leaves the node unenforced for seconds;
/// each [`RESYNC`] also checks the base chain's jumps. The frequent check reads only the chains'
/// list, which costs `nft` little whatever the sets hold.
const CHECK: Duration = Duration::from_secs(3);

/// Back-off of a failed sync: doubling from the first, up to the last.
const RETRY: (Duration, Duration) = (Duration::from_millis(200), Duration::from_secs(30));

/// The kernel's counters are read this often for the verdict metrics.
const COUNTERS_EVERY: Duration = Duration::from_secs(15);

/// What the last sync left, for `eniipamctl policy`.
#[derive(Default)]
struct Status {
    last: Option<SyncReport>,
    error: Option<String>,
}

/// The last sync that reached the kernel (its generation), or its error.
#[derive(Clone, Debug, Default)]
struct Applied {
    generation: u64,
    error: Option<String>,
}

/// The gate the IPAM service asks on ADD, and what `eniipamctl policy` reads.
pub struct Enforcer {
    watch: ClusterWatch,
    client: kube::Client,
    applied: watch::Receiver<Applied>,
    status: Arc<Mutex<Status>>,
    metrics: PolicyMetrics,
}

/// What the sync task tells the others: the last sync (the gate), the decision map (the decision
/// log and the per-rule counters).
struct SyncOutputs {
    applied: watch::Sender<Applied>,
    decision_map: watch::Sender<Arc<DecisionMap>>,
}

/// This node's pod attachments, as the IP core holds them: the daemon's pool and IPv6 book, each
/// attachment with its host veth and its addresses of both families, in veth order (two
/// attachments may still name one veth, see [`crate::enforce::newest_per_veth`]). The daemon
/// implements it, so the enforcer reads the node's pods without knowing the pool.
pub trait LocalPods: Send + Sync + 'static {
    fn attachments(&self) -> Vec<LocalAttachment>;
}

/// What enforcement starts from, given by the daemon.
pub struct Setup {
    /// The API server, for the watches and an ADD's pod lookup.
    pub client: kube::Client,
    /// This node's pods.
    pub pods: Arc<dyn LocalPods>,
    /// Called after every sync that put the rules in force: the node's startup taint waits for the
    /// first (`remove_startup_taint`), so no pod is scheduled to a node that would fail its ADD.
    pub on_synced: Box<dyn Fn() + Send + Sync>,
    /// The decision log's knobs.
    pub log: LogConfig,
    pub metrics: PolicyMetrics,
}

/// Starts enforcement: the watches, the sync task, the decision log and the verdict counters'
/// reader. The enforcer is returned for the IPAM service's admission and `eniipamctl policy`.
pub fn start(
    Setup {
        client,
        pods,
        on_synced,
        log,
        metrics,
    }: Setup,
    cancel: CancellationToken,
    background: &mut Vec<JoinHandle<()>>,
) -> Arc<Enforcer> {
    let (cluster, watches) = ClusterWatch::spawn(client.clone());
    background.extend(watches);
    let (tx, rx) = watch::channel(Applied::default());
    let status = Arc::new(Mutex::new(Status::default()));
    let (map_tx, map) = watch::channel(Arc::new(DecisionMap::default()));
    let engine = Engine::new(Nft::default()).with_reporting(log.reporting());
    let outputs = SyncOutputs {
        applied: tx,
        decision_map: map_tx,
    };
    background.push(tokio::spawn(sync_loop(
        (cluster.clone(), engine),
        (pods, on_synced),
        outputs,
        status.clone(),
        metrics.clone(),
        cancel.clone(),
    )));
    background.push(tokio::spawn(crate::decisions::task::run(
        log,
        map.clone(),
        metrics.clone(),
        cancel.clone(),
    )));
    background.push(tokio::spawn(count_verdicts(metrics.clone(), map, cancel)));
    Arc::new(Enforcer {
        watch: cluster,
        client,
        applied: rx,
        status,
        metrics,
    })
}

/// Enforcement off: a table an earlier run left is deleted.
pub async fn remove_table() {
    match Engine::new(Nft::default()).remove().await {
        Ok(true) => tracing::info!(
            "network policy: enforcement is off (network_policy = false); deleted the table an earlier run left"
        ),
        Ok(false) => {}
        Err(e) => {
            tracing::warn!(error = %e, "network policy: cannot delete table inet eniipam_policy")
        }
    }
}

async fn sync_loop(
    (cluster, mut engine): (ClusterWatch, Engine),
    (pods, on_synced): (Arc<dyn LocalPods>, Box<dyn Fn() + Send + Sync>),
    outputs: SyncOutputs,
    status: Arc<Mutex<Status>>,
    metrics: PolicyMetrics,
    cancel: CancellationToken,
) {
    let mut changes = cluster.subscribe();
    let mut failures = 0u32;
    let mut last_full = tokio::time::Instant::now();
    // The superseded attachments already warned of (a warning each, not one per sync).
    let mut reported: Vec<String> = Vec::new();
    let mut last_round = tokio::time::Instant::now();
    let mut check = tokio::time::interval(CHECK);
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // What a check found missing, until the table is loaded whole again.
    let mut restoring: Option<String> = None;
    loop {
        let wait = if failures > 0 {
            (RETRY.0 * 2u32.saturating_pow(failures - 1)).min(RETRY.1)
        } else {
            RESYNC
        };
        let resync = tokio::select! {
            _ = cancel.cancelled() => return,
            r = changes.changed() => if r.is_err() { return } else { false },
            _ = tokio::time::sleep_until(last_round + wait) => true,
            _ = check.tick() => match table_altered(&mut engine, false).await {
                Some(what) => {
                    restoring = Some(what);
                    false
                }
                None => continue,
            },
        };
        last_round = tokio::time::Instant::now();
        changes.borrow_and_update();
        if !cluster.synced() {
            continue;
        }
        if resync && let Some(what) = table_altered(&mut engine, true).await {
            restoring = Some(what);
        }
        if last_full.elapsed() >= RELOAD {
            engine.forget();
            last_full = tokio::time::Instant::now();
        }
        let Round {
            generation,
            since,
            policies,
            result,
            ..
        } = engine.sync_watched(&cluster, || pods.attachments()).await;
        match result {
            Ok(report) => {
                failures = 0;
                if let Some(what) = restoring.take() {
                    metrics.table_restored();
                    tracing::info!(missing = %what, kind = report.kind.as_str(),
                        "network policy: table inet eniipam_policy restored");
                }
                let isolated = |f: fn(&LocalPod) -> &Direction| {
                    report
                        .pods
                        .iter()
                        .filter(|p| matches!(f(p), Direction::Isolated { .. }))
                        .count()
                };
                metrics.synced(Synced {
                    kind: report.kind.as_str(),
                    policies,
                    rules: report.rules,
                    elements: report.elements,
                    isolated: (
                        isolated(|p| &p.compiled.ingress),
                        isolated(|p| &p.compiled.egress),
                    ),
                    since,
                });
                if report.kind != SyncKind::Unchanged {
                    outputs
                        .decision_map
                        .send_replace(Arc::new(DecisionMap::new(&report.pods)));
                    tracing::debug!(kind = report.kind.as_str(), rules = report.rules,
                        elements = report.elements, bytes = report.script_bytes,
                        compile = ?report.compile, render = ?report.render, load = ?report.load,
                        "network policy: rules in force");
                }
                metrics.superseded_attachments(report.superseded.len());
                for line in report.superseded.iter().filter(|l| !reported.contains(*l)) {
                    tracing::warn!("network policy: {line}");
                }
                reported = report.superseded.clone();
                let mut s = status.lock().unwrap_or_else(|p| p.into_inner());
                s.last = Some(report);
                s.error = None;
                drop(s);
                outputs.applied.send_replace(Applied {
                    generation,
                    error: None,
                });
                // The node's startup taint may go now (it waited for this).
                on_synced();
            }
            Err(e) => {
                failures += 1;
                metrics.sync_failed();
                tracing::warn!(error = %e, failures, "network policy: the rules could not be put in force; retrying");
                status.lock().unwrap_or_else(|p| p.into_inner()).error = Some(e.to_string());
                outputs.applied.send_replace(Applied {
                    generation,
                    error: Some(e.to_string()),
                });
                // The changes not in force are still pending.
                cluster.restore_pending(since);
            }
        }
    }
}

/// [`Engine::check`] with its finding logged: what is missing or altered (the next sync loads the
/// table whole), or `None` (also when the kernel cannot be read: the sync will say why).
async fn table_altered(engine: &mut Engine, deep: bool) -> Option<String> {
    match engine.check(deep).await {
        Ok(Some(what)) => {
            tracing::warn!(
                "network policy: the kernel's rules were changed behind the daemon: {what}; loading table inet eniipam_policy whole"
            );
            Some(what)
        }
        Ok(None) => None,
        Err(e) => {
            tracing::debug!(error = %e, "network policy: cannot check table inet eniipam_policy");
            None
        }
    }
}

/// Reads the kernel's per-chain and per-rule counters into the verdict metrics, and its `spoofed`
/// counter.
async fn count_verdicts(
    metrics: PolicyMetrics,
    map: watch::Receiver<Arc<DecisionMap>>,
    cancel: CancellationToken,
) {
    let nft = Nft::default();
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(COUNTERS_EVERY) => {}
        }
        let Some(json) = counters_json(&nft).await else {
            continue;
        };
        let map = map.borrow().clone();
        metrics.rule_verdicts(&crate::decisions::task::per_rule(&json, &map));
        if let Some(totals) = sum_counters(&json) {
            metrics.verdicts(VerdictCounts {
                ingress_allowed: totals.ingress_allowed,
                ingress_denied: totals.ingress_denied,
                egress_allowed: totals.egress_allowed,
                egress_denied: totals.egress_denied,
            });
        }
        if let Ok(total) = crate::nft::spoofed_packets(&json) {
            metrics.spoofed(total);
        }
    }
}

/// The kernel's counters summed over the node's pods; `None` when they cannot be read.
fn sum_counters(json: &str) -> Option<DirectionCounts> {
    let readings = crate::enforce::counters_by_veth(json).ok()?;
    let mut t = DirectionCounts::default();
    for (_, c) in readings {
        t.ingress_allowed += c.ingress_allowed;
        t.ingress_denied += c.ingress_denied;
        t.egress_allowed += c.egress_allowed;
        t.egress_denied += c.egress_denied;
    }
    Some(t)
}

/// The kernel's counters per host veth.
async fn per_pod_counters(nft: &Nft) -> Option<Vec<(String, DirectionCounts)>> {
    let json = counters_json(nft).await?;
    crate::enforce::counters_by_veth(&json).ok()
}

/// `nft -j list counters table inet eniipam_policy`.
async fn counters_json(nft: &Nft) -> Option<String> {
    nft.run(
        &["-j", "list", "counters", "table", "inet", crate::nft::TABLE],
        None,
    )
    .await
    .ok()
}

impl Enforcer {
    /// Waits until the cluster's three lists have completed once, until `deadline`.
    async fn synced_by(&self, deadline: tokio::time::Instant) -> bool {
        let mut changes = self.watch.subscribe();
        loop {
            if self.watch.synced() {
                return true;
            }
            // The lists' completion is a change; a missed one is caught by the poll.
            let tick = tokio::time::sleep(Duration::from_millis(50));
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => return self.watch.synced(),
                _ = changes.changed() => {}
                _ = tick => {}
            }
        }
    }
}

impl Enforcer {
    /// Makes sure the watch knows `pod` (its labels decide which policies select it): the pod
    /// watch, else a GET, asked again until `deadline` while the API server says it has no such
    /// pod (a pod the watch has not delivered yet, a static pod's mirror not created yet).
    async fn learn_pod(
        &self,
        pod: &PodRef,
        deadline: tokio::time::Instant,
    ) -> Result<(), AdmitError> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace);
        let what = format!("{}/{}", pod.namespace, pod.name);
        loop {
            if self.watch.pod(&pod.namespace, &pod.name).is_some() {
                return Ok(());
            }
            let answer = tokio::time::timeout(LOOKUP_TIMEOUT, api.get_opt(&pod.name)).await;
            let why = match answer {
                Ok(Ok(Some(p))) => {
                    self.watch.remember(pod_view(&p));
                    return Ok(());
                }
                Ok(Ok(None)) => format!(
                    "pod {what} is not known to the API server, so the policies that select it cannot be known"
                ),
                Ok(Err(e)) => format!("cannot read pod {what} from the API server: {e}"),
                Err(_) => {
                    format!(
                        "the API server did not answer for pod {what} within {LOOKUP_TIMEOUT:?}"
                    )
                }
            };
            if tokio::time::Instant::now() + LOOKUP_RETRY >= deadline {
                return Err(AdmitError(why));
            }
            tokio::time::sleep(LOOKUP_RETRY).await;
        }
    }
}

/// Why a new pod's rules could not be put in force before its ADD is answered: the ADD fails, its
/// addresses go back, and the runtime's next try asks again.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct AdmitError(pub String);

/// What the IPAM service asks on ADD and DEL.
impl Enforcer {
    /// Returns once the rules of `pod` (its IP just allocated here) are in the kernel, within
    /// [`ADMIT_TIMEOUT`]; an error fails the ADD.
    pub async fn admit(&self, pod: &PodRef) -> Result<(), AdmitError> {
        let deadline = tokio::time::Instant::now() + ADMIT_TIMEOUT;
        if pod.namespace.is_empty() || pod.name.is_empty() {
            // Not a Kubernetes pod (no K8S_POD_* arguments): no policy can select it.
            return Ok(());
        }
        if !self.synced_by(deadline).await {
            return Err(AdmitError(format!(
                "the cluster's NetworkPolicies, pods and namespaces are not listed yet (within {ADMIT_TIMEOUT:?}); is the API server reachable, and may the daemon list them (deploy/rbac.yaml)?"
            )));
        }
        self.learn_pod(pod, deadline).await?;
        let wanted = self.watch.touch();
        let mut applied = self.applied.clone();
        let result =
            tokio::time::timeout_at(deadline, applied.wait_for(|a| a.generation >= wanted)).await;
        match result {
            Ok(Ok(a)) if a.generation >= wanted && a.error.is_none() => Ok(()),
            Ok(Ok(a)) => Err(AdmitError(format!(
                "the rules could not be put in force: {}",
                a.error.clone().unwrap_or_default()
            ))),
            Ok(Err(_)) => Err(AdmitError("the enforcer stopped".into())),
            Err(_) => Err(AdmitError(format!(
                "the rules were not in force within {ADMIT_TIMEOUT:?}"
            ))),
        }
    }

    /// An attachment was released: its pod's rules go at the next sync (not waited for).
    pub fn released(&self) {
        self.watch.touch();
    }

    /// A pod allocated for in the IPAM role: another plugin wired it, under names this crate's
    /// rules do not match, so nothing is enforced for it. Counted, and logged as a warning at the
    /// first such ADD and every 100th after (then at debug).
    pub fn unwired(&self, pod: &PodRef) {
        let n = self.metrics.unwired_add();
        if n == 1 || n.is_multiple_of(100) {
            tracing::warn!(
                pod = %format!("{}/{}", pod.namespace, pod.name),
                adds = n,
                "NetworkPolicy is NOT enforced for this pod: eniipam runs as another plugin's IPAM \
                 (\"ipam\": {{\"type\": \"eniipam\"}}), so that plugin wires the pod and eniipam's \
                 rules match nothing of it; run eniipam as the main plugin, or set \
                 network_policy = false and let the parent plugin (Calico, Cilium) enforce policy"
            );
        } else {
            tracing::debug!(pod = %format!("{}/{}", pod.namespace, pod.name), "NetworkPolicy not enforced: IPAM role");
        }
    }

    /// What applies to pod `namespace/name` on this node now, for `eniipamctl policy`.
    pub async fn explain(&self, namespace: &str, name: &str) -> Explanation {
        let mut e = {
            let s = self.status.lock().unwrap_or_else(|p| p.into_inner());
            let full = format!("{namespace}/{name}");
            let prefix = format!("pod {full}:");
            Explanation {
                enforcing: true,
                pod: s
                    .last
                    .as_ref()
                    .and_then(|r| r.pods.iter().find(|p| p.name == full).cloned()),
                not_enforced: s
                    .last
                    .iter()
                    .flat_map(|r| r.not_enforced.iter())
                    .filter(|n| n.starts_with(&prefix))
                    .cloned()
                    .collect(),
                last_error: s.error.clone(),
                counts: DirectionCounts::default(),
            }
        };
        if let Some(veth) = e.pod.as_ref().map(|p| p.veth.clone())
            && let Some(readings) = per_pod_counters(&Nft::default()).await
            && let Some((_, c)) = readings.into_iter().find(|(v, _)| *v == veth)
        {
            e.counts = c;
        }
        e
    }
}
