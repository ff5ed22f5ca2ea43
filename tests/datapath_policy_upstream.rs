//! Every upstream NetworkPolicy case, every stage, through the real daemons' watches, over TCP,
//! UDP and SCTP (issue 47, case 8). Among them the dynamic ones ("should enforce updated policy",
//! "... from updated namespace", "... from updated pod", "should deny ingress access to updated
//! pod") and every other case whose world changes between two checks (a policy added, updated in
//! place under its name, or deleted).
//!
//! Two nodes of the emulated VPC run the real `eniipamd` with enforcement on, watching the
//! API-server double; pods `a` on node A, `b` and `c` on node B (so label changes on one node must
//! reach the other's peer sets), made by the real plugin. Each stage goes into the API server as
//! upstream's test makes it: a policy put under its name (a watch `MODIFIED` for an update), a
//! namespace's or pod's labels changed, a policy deleted. Once each daemon has counted a sync, the
//! full matrix (9 × 9 pods, TCP, UDP and SCTP on 80 and 81: 486 cells, one sweep; SCTP probed by
//! its `INIT`, `network_policy_support/sctp.rs`) is probed until it equals the model's, cell by
//! cell (`datapath_support/policy/probe.rs`: a round that cannot agree stops early). The
//! daemons must take every change in place: no whole-table load (`..._syncs_total{kind="full"}`
//! unchanged), an update counted for each later stage of a case, and no failed update; under
//! strict and loose `rp_filter`. The cases are dealt over two such labs side by side, each case
//! whole on one ([`LABS`]). (`tests/datapath_policy.rs` runs each case's first stage over TCP and
//! UDP, on one node and two.)
//!
//! Needs what `tests/datapath.rs` needs.

mod bins;
#[macro_use]
mod datapath_support;
#[path = "netpol_cases/mod.rs"]
mod netpol_cases;
#[path = "network_policy_support/sctp.rs"]
mod sctp;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use datapath_support::policy::*;
use datapath_support::*;
use eniipam::network_policy::Protocol;
use eniipam_kubeapi::FakeApiServer;
use netpol_cases::Stage;
use serde_json::{Value, json};
use vpclab::Egress;

const NODE_A: &str = "node-a";
const NODE_B: &str = "node-b";
const NAMESPACES: [&str; 3] = ["x", "y", "z"];
const PODS: [&str; 3] = ["a", "b", "c"];
/// How long the daemons may take to put a change in force before the matrix must agree.
const IN_FORCE_WITHIN: Duration = Duration::from_secs(15);
const ALL_PROTOCOLS: [Protocol; 3] = [Protocol::Tcp, Protocol::Udp, Protocol::Sctp];
/// How often an SCTP probe asks its listener whether its `INIT` came.
const SCTP_POLL: Duration = Duration::from_millis(10);

both_rp_filters!(upstream_cases: upstream_cases_strict_rp_filter, upstream_cases_loose_rp_filter);

/// The SCTP `INIT`s each pod's namespace receives, by `ns/pod`.
type Listeners = BTreeMap<String, Arc<sctp::InitListener>>;

/// Every cell between `pods` over TCP, UDP and SCTP, 80 and 81.
fn cells_of(pods: &BTreeMap<String, PolicyPod>) -> Vec<Cell> {
    let mut cells = Vec::new();
    for client in pods.keys() {
        for server in pods.keys() {
            for protocol in ALL_PROTOCOLS {
                for port in PORTS {
                    cells.push(Cell {
                        client: client.clone(),
                        server: server.clone(),
                        protocol,
                        port,
                    });
                }
            }
        }
    }
    cells
}

/// The SCTP probes of `cells`, each waiting `wait` at most: every client sends its `INIT`s from its
/// namespace, then each probe asks its server's listener, every few milliseconds, whether its
/// `INIT` came.
async fn sctp_probes(
    pods: &BTreeMap<String, PolicyPod>,
    listeners: &Listeners,
    cells: &[Cell],
    wait: Duration,
) -> Vec<(Cell, Probe)> {
    let mut probes: Vec<(Cell, Probe)> = Vec::new();
    let mut by_client: BTreeMap<&str, Vec<&Cell>> = BTreeMap::new();
    for cell in cells {
        by_client.entry(&cell.client).or_default().push(cell);
    }
    for (client, cells) in by_client {
        let inits: Vec<(Cell, SocketAddr, u16, u32)> = cells
            .into_iter()
            .map(|cell| {
                let (port, tag) = sctp::next_probe();
                let to = SocketAddr::from((pods[&cell.server].cni.ip, cell.port));
                (cell.clone(), to, port, tag)
            })
            .collect();
        let to_send: Vec<(SocketAddr, u16, u32)> =
            inits.iter().map(|(_, to, p, t)| (*to, *p, *t)).collect();
        pods[client]
            .cni
            .ns
            .run_async(move || {
                for (to, port, tag) in to_send {
                    sctp::send_init(to, port, tag);
                }
            })
            .await
            .expect("SCTP INITs from the client pod");
        for (cell, to, port, tag) in inits {
            let listener = listeners[&cell.server].clone();
            let probe: Probe = Box::pin(async move {
                let deadline = tokio::time::Instant::now() + wait;
                loop {
                    if listener.received((port, to.port(), tag), Duration::ZERO) {
                        return true;
                    }
                    if tokio::time::Instant::now() >= deadline {
                        return false;
                    }
                    tokio::time::sleep(SCTP_POLL).await;
                }
            });
            probes.push((cell, probe));
        }
    }
    probes
}

/// Probes `cells` (TCP and UDP as the data-path harness does, SCTP by its `INIT`, all in one
/// sweep) in rounds until every one gives what `want` says, for up to [`IN_FORCE_WITHIN`]
/// ([`until_agreed`]); the rounds it took.
async fn until_all_protocols(
    what: &str,
    pods: &BTreeMap<String, PolicyPod>,
    listeners: &Listeners,
    cells: &[Cell],
    want: &BTreeMap<Cell, bool>,
    logs: impl Fn() -> String,
) -> u32 {
    let (sctp_cells, others): (Vec<Cell>, Vec<Cell>) = cells
        .iter()
        .cloned()
        .partition(|c| c.protocol == Protocol::Sctp);
    let (sctp_cells, others) = (&sctp_cells, &others);
    until_agreed(
        what,
        pods,
        want,
        IN_FORCE_WITHIN,
        logs,
        |may_stop| async move {
            let mut probes = socket_probes(pods, others, PROBE_WAIT).await;
            probes.extend(sctp_probes(pods, listeners, sctp_cells, PROBE_WAIT).await);
            sweep(probes, PROBE_WAIT, may_stop.then_some(want)).await
        },
    )
    .await
}

/// The pod as the API server holds it once running: [`pod_object`] with `labels` added and its
/// `status.podIPs`, as the kubelet wrote them.
fn running_pod(pod: &PolicyPod, labels: &[(&str, &str)]) -> Value {
    let mut object = pod_object(&pod.cni.namespace, &pod.cni.name, &pod.node);
    for (k, v) in labels {
        object["metadata"]["labels"][*k] = json!(v);
    }
    object["status"] = json!({
        "phase": "Running",
        "podIP": pod.cni.ip.to_string(),
        "podIPs": [{"ip": pod.cni.ip.to_string()}],
    });
    object
}

/// What the API server holds now, changed into `stage` as upstream's test changes it.
struct Applied {
    policies: Vec<(String, String)>,
    namespace_labels: Vec<(&'static str, &'static str, &'static str)>,
    pod_labels: Vec<(&'static str, &'static str, &'static str, &'static str)>,
}

impl Applied {
    fn apply(&mut self, api: &FakeApiServer, pods: &BTreeMap<String, PolicyPod>, stage: &Stage) {
        let key = |p: &Value| {
            (
                p["metadata"]["namespace"].as_str().unwrap().to_owned(),
                p["metadata"]["name"].as_str().unwrap().to_owned(),
            )
        };
        let wanted: Vec<(String, String)> = stage.policies.iter().map(key).collect();
        for (ns, name) in self.policies.iter().filter(|k| !wanted.contains(k)) {
            assert!(api.delete_network_policy(ns, name), "{ns}/{name} was put");
        }
        // Put under its name: a new policy is ADDED, a changed one MODIFIED (an update in place).
        for p in &stage.policies {
            api.put_network_policy(p.clone());
        }
        self.policies = wanted;
        if self.namespace_labels != stage.namespace_labels {
            for ns in NAMESPACES {
                let mut labels = vec![("ns", ns)];
                labels.extend(
                    stage
                        .namespace_labels
                        .iter()
                        .filter(|(n, _, _)| *n == ns)
                        .map(|(_, k, v)| (*k, *v)),
                );
                api.put_namespace_labels(ns, &labels);
            }
            self.namespace_labels = stage.namespace_labels.clone();
        }
        if self.pod_labels != stage.pod_labels {
            for pod in pods.values() {
                let labels: Vec<(&str, &str)> = stage
                    .pod_labels
                    .iter()
                    .filter(|(ns, name, _, _)| pod.key == format!("{ns}/{name}"))
                    .map(|(_, _, k, v)| (*k, *v))
                    .collect();
                api.put_pod(running_pod(pod, &labels));
            }
            self.pod_labels = stage.pod_labels.clone();
        }
    }
}

/// The model of `pods` at `stage`: its policies, and its labels added.
fn model_at(pods: &BTreeMap<String, PolicyPod>, stage: &Stage) -> eniipam::network_policy::Cluster {
    let mut c = model(pods, &stage.policies);
    for (ns, k, v) in &stage.namespace_labels {
        c.namespaces
            .get_mut(*ns)
            .expect("a namespace of the world")
            .insert((*k).to_owned(), (*v).to_owned());
    }
    for (ns, name, k, v) in &stage.pod_labels {
        c.pods
            .iter_mut()
            .find(|p| p.namespace == *ns && p.name == *name)
            .expect("a pod of the world")
            .labels
            .insert((*k).to_owned(), (*v).to_owned());
    }
    c
}

/// How many labs [`upstream_cases`] deals the cases over, side by side (issue 45): a stage's time is
/// mostly its sweep waiting out the silence of the denied cells, which labs of their own wait out
/// together. Each lab takes every [`LABS`]th case, whole, its stages in turn.
const LABS: usize = 2;

async fn upstream_cases(test: &str, rp_filter: RpFilter) {
    let started = tokio::time::Instant::now();
    let ran =
        futures::future::join_all((0..LABS).map(|share| lab_cases(test, rp_filter, share))).await;
    let Some(ran) = ran
        .into_iter()
        .collect::<Option<Vec<(usize, usize, usize)>>>()
    else {
        return;
    };
    let (cases, staged, stages) = ran
        .into_iter()
        .fold((0, 0, 0), |t, r| (t.0 + r.0, t.1 + r.1, t.2 + r.2));
    assert_eq!(
        cases,
        netpol_cases::cases(|_, _| std::net::Ipv4Addr::UNSPECIFIED).len(),
        "every case ran"
    );
    assert!(staged >= 4, "the four dynamic cases at least");
    eprintln!(
        "{test}: {cases} cases ({staged} staged), {stages} stages over {LABS} labs in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// The cases whose index is `share` modulo [`LABS`], on a lab of their own: how many cases, how
/// many of them staged, and how many stages it ran (`None`: skipped).
async fn lab_cases(test: &str, rp_filter: RpFilter, share: usize) -> Option<(usize, usize, usize)> {
    let c = Cluster::start_with(test, Egress::InternetGateway, rp_filter).await?;
    let api = FakeApiServer::start().await;
    for ns in NAMESPACES {
        api.put_namespace_labels(ns, &[("ns", ns)]);
    }
    let on_a =
        PolicyDaemon::start(&c, &api, &c.a.instance_id, NODE_A, Placement::SecondaryEni).await;
    let on_b = PolicyDaemon::start(&c, &api, &c.b.instance_id, NODE_B, Placement::Eth0).await;
    let mut pods = BTreeMap::new();
    for ns in NAMESPACES {
        for name in PODS {
            let d = if name == "a" { &on_a } else { &on_b };
            let pod = d.add_pod(&c, &api, ns, name, None).await;
            pods.insert(pod.key.clone(), pod);
        }
    }
    c.lab.sync().await.expect("lab sync");
    let mut servers = Vec::new();
    let mut listeners = Listeners::new();
    for pod in pods.values() {
        servers.push(serve_ports(&pod.cni.ns).await);
        let fd = pod
            .cni
            .ns
            .run_async(|| sctp::raw_socket(false))
            .await
            .expect("an SCTP socket in the pod");
        listeners.insert(
            pod.key.clone(),
            Arc::new(sctp::InitListener::start(fd, false)),
        );
    }
    let logs = || {
        [&on_a, &on_b]
            .iter()
            .map(|d| format!("{} daemon:\n{}", d.node, d.tail()))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let cells = cells_of(&pods);
    let mut applied = Applied {
        policies: Vec::new(),
        namespace_labels: Vec::new(),
        pod_labels: Vec::new(),
    };
    let all = netpol_cases::cases(|ns, p| pods[&format!("{ns}/{p}")].cni.ip);
    let cases: Vec<_> = all.iter().skip(share).step_by(LABS).collect();
    let staged = cases.iter().filter(|case| !case.then.is_empty()).count();
    let mut stages = 0;
    for case in &cases {
        for (i, stage) in case.stages().iter().enumerate() {
            let before = [on_a.syncs().await, on_b.syncs().await];
            let staged_at = tokio::time::Instant::now();
            applied.apply(&api, &pods, stage);
            let in_force = [before[0].in_force(), before[1].in_force()];
            synced_since(&[&on_a, &on_b], &in_force).await;
            let synced = staged_at.elapsed();
            let want = expected(&model_at(&pods, stage), &cells);
            let what = format!("{}: {}", case.name, stage.what);
            let rounds = until_all_protocols(&what, &pods, &listeners, &cells, &want, logs).await;
            stages += 1;
            let denied = want.values().filter(|w| !**w).count();
            eprintln!(
                "{test} (lab {share}): {what}: {denied} of {} cells denied, in force after {rounds} round(s); \
                 synced in {:.2} s, agreed in {:.2} s",
                cells.len(),
                synced.as_secs_f64(),
                staged_at.elapsed().as_secs_f64()
            );
            let after = [on_a.syncs().await, on_b.syncs().await];
            assert_eq!(
                [before[0].full, before[1].full],
                [after[0].full, after[1].full],
                "{what}: a daemon loaded its whole table instead of updating it in place:\n{}",
                logs()
            );
            // A later stage changes what the case's policies select (a case's first stage may
            // compile as its predecessor's last did: nothing to change).
            if i > 0 {
                assert!(
                    after[0].update + after[1].update > before[0].update + before[1].update,
                    "{what}: no in-place update was counted:\n{}",
                    logs()
                );
            }
        }
    }
    for d in [&on_a, &on_b] {
        assert!(
            !d.log_text().contains("in-place update failed"),
            "{}: an in-place update failed:\n{}",
            d.node,
            d.tail()
        );
    }
    drop(servers);
    c.assert_no_drops().await;
    Some((cases.len(), staged, stages))
}
