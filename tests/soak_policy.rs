//! The NetworkPolicy soak (issue 28): policies changing under churn on a real data path, with the
//! invariant **a probe the policies deny never connects**.
//!
//! Two lab nodes of the emulated VPC (`datapath_support`) run the real `eniipamd` with
//! `ENIIPAM_NETWORK_POLICY=true` against the API-server double, and the real plugin makes the pods
//! (each a network namespace with TCP and UDP servers on 80 and 81), in namespaces `x`, `y`, `z`.
//! Every pod is in the API server, bound to its node, before its ADD, and gets its IP in its status
//! after (as the kubelet reports it). Each step, from a RNG seeded by (seed, step), does a batch of:
//!
//! - pods DELeted and ADDed (3 to 6 a node; a DELeted pod's IP may go to the next pod, so a rule
//!   left naming the old pod would let the wrong pod in: counted as `reused IPs`);
//! - pod and namespace label changes; policies added, changed and deleted (random but valid: pod
//!   and namespace selectors, ipBlock with except over live pods' addresses, numeric, named and
//!   ranged ports, every form of policy types), at most 10 at a time;
//! - faults: a daemon SIGKILLed while the changes are made and started again after (the kernel
//!   keeps its table meanwhile), every watch ended, history compacted (the watches come back to a
//!   410 and list again), the event stream held while the changes are made.
//!
//! - issue 47's attacks and Service traffic (`soak_policy_support::attacks`): a pod sending as
//!   another to a pod of its node (a raw datagram), a pod reaching itself through its Service,
//!   and a pod reaching another through a Service, each Service in a random kube-proxy mode
//!   (DNAT at prerouting, or IPVS's local-in/local-out path). The nodes run with `rp_filter` off,
//!   so that only the policy table stands between a spoofed datagram and its target;
//! - another agent's `nft flush ruleset` in a node (issue 47, case 5), while the step's changes
//!   are made: before the step's probes the node's table must be back (within
//!   [`RESTORED_WITHIN`]; a violation otherwise, as the node would be open).
//!
//! Then it checks against the model (`connection_allowed` on the cluster as the test holds it,
//! with the pods' real IPs; `soak_policy_support::checks`), in rounds from the step's last change
//! until a round agrees, for at most [`SETTLE`] (2 s: twice the p99 bound of 1 s from a
//! change to rules in force). The round that starts past that bound is the step's verdict:
//!
//! - **violation**: a cell (client, server, TCP/UDP, 80/81; the whole matrix) the model denies
//!   connected;
//! - **not converged**: a cell the model allows did not connect (reported per step; after the last
//!   step the whole matrix must have none);
//! - **chains**: in each node's `inet eniipam_policy`, a live pod has an ingress (egress) chain iff
//!   the model isolates that direction, and no chain names a veth that is not a live pod's.
//!
//! A round's probes are one sweep (`network_policy_support::sweep`): the cells still silent once
//! the answers have settled are denials. Issue 45: the fixed 2 s settle and a full probe wait per
//! silent cell made the short run 60 s of 13 steps; rounds that stop at agreement do more steps in
//! less time, and the short run is a number of steps, not of seconds.
//!
//! The run fails on any violation, and on a final check that is not clean. Its length comes from
//! `ENIIPAM_POLICY_SOAK_STEPS` (default [`STEPS`]) or, for a long run, `ENIIPAM_POLICY_SOAK_SECS`
//! (a number of seconds; `STEPS` wins when both are set), its seed from `ENIIPAM_POLICY_SOAK_SEED`
//! (default: random, printed); `ENIIPAM_POLICY_SOAK_REPORT` names a file the report is also
//! written to.
//! Needs what `tests/datapath.rs` needs (root, `nft`, `ip`, the plugin built:
//! `cargo build -p eniipam-cni`); skipped with a notice otherwise, failed when `CI=true`.

mod bins;
mod datapath_support;
mod network_policy_support;
mod soak_policy_support;

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::time::Duration;

use datapath_support::policy::{PolicyDaemon, serve_ports};
use datapath_support::{Cluster, Placement, PodOptions, RpFilter};
use eniipam_kubeapi::FakeApiServer;
use ipnet::Ipv4Net;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use soak_policy_support::world::{
    LivePod, NAMESPACES, World, namespace_labels, pod_labels, pod_object, random_policy,
};
use soak_policy_support::{attacks, checks};
use tokio::time::Instant;
use vpclab::Egress;

const TEST: &str = "policies_under_churn";
const NODES: [&str; 2] = ["node-a", "node-b"];
/// Live pods a node keeps: DELs stop at the first, ADDs at the second.
const PODS_PER_NODE: (usize, usize) = (3, 6);
const MAX_POLICIES: usize = 10;
/// From the last change of a step to the round of checks that is its verdict.
const SETTLE: Duration = Duration::from_secs(2);
/// The pause between two rounds of checks while the step's changes are not all in force.
const RECHECK_AFTER: Duration = Duration::from_millis(100);
/// How long a node's daemon may take to load its table again after `nft flush ruleset`.
const RESTORED_WITHIN: Duration = Duration::from_secs(15);
/// The short run's steps (`ENIIPAM_POLICY_SOAK_STEPS`): more than the 13 its former 60 s made.
const STEPS: u64 = 16;

/// What the run did and found.
#[derive(Default)]
struct Tally {
    steps: u64,
    adds: u64,
    dels: u64,
    reused_ips: u64,
    pod_relabels: u64,
    namespace_relabels: u64,
    policy_puts: u64,
    policy_deletes: u64,
    kills: u64,
    watch_ends: u64,
    compactions: u64,
    holds: u64,
    probes: u64,
    /// Probed cells the model denied.
    denied: u64,
    /// Rounds of checks that did not agree before one did (or the bound passed).
    rechecks: u64,
    violations: Vec<String>,
    not_converged: Vec<String>,
    chain_mismatches: Vec<String>,
    /// Issue 47: spoofing attempts, hairpins and Service probes (of which the model denied).
    spoofs: u64,
    hairpins: u64,
    services: u64,
    services_denied: u64,
    /// `nft flush ruleset` in a node.
    flushes: u64,
    /// The final check's findings (whole matrix).
    final_probes: u64,
    final_problems: Vec<String>,
}

struct Soak {
    c: Cluster,
    api: FakeApiServer,
    daemons: Vec<PolicyDaemon>,
    world: World,
    seed: u64,
    /// The block pods' addresses come from (ipBlocks are drawn over it).
    vpc: Ipv4Net,
    next_id: u64,
    /// Addresses DELeted pods had.
    gone_ips: BTreeSet<Ipv4Addr>,
    tally: Tally,
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| {
        v.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number"))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policies_under_churn() {
    let (steps, secs) = match (
        env_u64("ENIIPAM_POLICY_SOAK_STEPS"),
        env_u64("ENIIPAM_POLICY_SOAK_SECS"),
    ) {
        (None, Some(secs)) => (u64::MAX, Some(secs)),
        (steps, _) => (steps.unwrap_or(STEPS), None),
    };
    let seed = env_u64("ENIIPAM_POLICY_SOAK_SEED").unwrap_or_else(rand::random);
    let Some(c) =
        Cluster::start_prepared(TEST, Egress::InternetGateway, RpFilter::Strict, |_, _| {}).await
    else {
        return;
    };
    match secs {
        Some(secs) => println!("{TEST}: seed {seed}, {secs} s"),
        None => println!("{TEST}: seed {seed}, {steps} steps"),
    }
    let api = FakeApiServer::start().await;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut world = World::default();
    for ns in NAMESPACES {
        set_namespace(&api, &mut world, ns, namespace_labels(&mut rng));
    }
    let mut daemons = Vec::new();
    for (instance, node) in [&c.a.instance_id, &c.b.instance_id].into_iter().zip(NODES) {
        let d = PolicyDaemon::start(&c, &api, instance, node, Placement::Eth0).await;
        // rp_filter off (`all`, and `default` for the veths to come): spoofed datagrams meet
        // only the policy table.
        let off = |key: &str| (format!("net/ipv4/conf/{key}/rp_filter"), "0".to_owned());
        d.ns.write_sysctls(&[off("all"), off("default")])
            .await
            .expect("rp_filter off");
        daemons.push(d);
    }
    let vpc = Ipv4Net::new(c.a.private_ip, 16).expect("a prefix").trunc();
    let mut soak = Soak {
        c,
        api,
        daemons,
        world,
        seed,
        vpc,
        next_id: 0,
        gone_ips: BTreeSet::new(),
        tally: Tally::default(),
    };
    for node in 0..NODES.len() {
        for _ in 0..PODS_PER_NODE.0 + 1 {
            soak.add_pod(&mut rng, node).await;
        }
    }
    for _ in 0..4 {
        soak.change_policy(&mut rng);
    }
    let started = Instant::now();
    let deadline = secs.map(|secs| started + Duration::from_secs(secs));
    let mut step = 0;
    while step < steps && deadline.is_none_or(|d| Instant::now() < d) {
        step += 1;
        soak.step(step).await;
    }
    soak.final_check().await;
    let report = soak.report(started.elapsed());
    println!("{report}");
    if let Ok(path) = std::env::var("ENIIPAM_POLICY_SOAK_REPORT") {
        std::fs::write(&path, &report).unwrap_or_else(|e| panic!("writing {path}: {e}"));
    }
    let t = &soak.tally;
    assert!(
        t.violations.is_empty(),
        "{} probes the policies deny connected (seed {seed}):\n{}",
        t.violations.len(),
        t.violations.join("\n")
    );
    assert!(
        t.final_problems.is_empty(),
        "the final check is not clean (seed {seed}):\n{}",
        t.final_problems.join("\n")
    );
}

/// Puts namespace `ns` with `labels` (and its name label) in the API server and the truth.
fn set_namespace(api: &FakeApiServer, world: &mut World, ns: &str, labels: Vec<(String, String)>) {
    let pairs: Vec<(&str, &str)> = labels
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    api.put_namespace_labels(ns, &pairs);
    let mut labels: std::collections::BTreeMap<String, String> = labels.into_iter().collect();
    labels.insert("kubernetes.io/metadata.name".into(), ns.to_owned());
    world.namespaces.insert(ns.to_owned(), labels);
}

fn step_rng(seed: u64, step: u64) -> StdRng {
    StdRng::seed_from_u64(seed ^ step.wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

impl Soak {
    fn pods_on(&self, node: usize) -> usize {
        self.world.pods.iter().filter(|p| p.node == node).count()
    }

    fn live_ips(&self) -> Vec<Ipv4Addr> {
        self.world.pods.iter().map(|p| p.cni.ip).collect()
    }

    /// Puts a new pod in the API server, runs its ADD on `node`, reports its IP in its status
    /// and starts its servers.
    async fn add_pod(&mut self, rng: &mut StdRng, node: usize) {
        self.next_id += 1;
        let (ns, name) = (
            *NAMESPACES.choose(rng).expect("some"),
            format!("p{}", self.next_id),
        );
        let labels = pod_labels(rng);
        let ports = (rng.random_range(80..=81), rng.random_range(80..=81));
        let node_name = &self.daemons[node].node;
        self.api
            .put_pod(pod_object(ns, &name, node_name, &labels, ports, None));
        let cni = self.daemons[node]
            .add_pod_in(&self.c, ns, &name, PodOptions::default())
            .await;
        self.api.put_pod(pod_object(
            ns,
            &name,
            node_name,
            &labels,
            ports,
            Some(cni.ip),
        ));
        let veth = cni.result["interfaces"][0]["name"]
            .as_str()
            .unwrap_or_else(|| panic!("no host interface in {}", cni.result))
            .to_owned();
        self.tally.adds += 1;
        if self.gone_ips.remove(&cni.ip) {
            self.tally.reused_ips += 1;
        }
        let servers = serve_ports(&cni.ns).await;
        self.world.pods.push(LivePod {
            cni,
            node,
            labels,
            http: ports.0,
            dns: ports.1,
            veth,
            servers,
        });
    }

    /// Deletes pod `i` from the API server (as a deletion does before the kubelet tears the
    /// sandbox down), stops its servers and runs its DEL.
    async fn del_pod(&mut self, i: usize) {
        let pod = self.world.pods.swap_remove(i);
        self.api.delete_pod(&pod.cni.namespace, &pod.cni.name);
        drop(pod.servers);
        self.daemons[pod.node].del_pod(&pod.cni).await;
        self.gone_ips.insert(pod.cni.ip);
        self.tally.dels += 1;
    }

    /// Adds a policy, or changes or deletes one.
    fn change_policy(&mut self, rng: &mut StdRng) {
        let existing: Vec<String> = self.world.policies.keys().cloned().collect();
        // Adds outweigh deletes, so the cluster holds a handful of policies most of the time.
        let choice = if existing.is_empty() {
            0
        } else if existing.len() >= MAX_POLICIES {
            rng.random_range(1..3)
        } else {
            [0, 0, 0, 1, 1, 2][rng.random_range(0..6)]
        };
        let ips = self.live_ips();
        match choice {
            0 => {
                self.next_id += 1;
                let ns = *NAMESPACES.choose(rng).expect("some");
                let name = format!("np{}", self.next_id);
                let p = random_policy(rng, ns, &name, &ips, self.vpc);
                self.api.put_network_policy(p.clone());
                self.world.policies.insert(format!("{ns}/{name}"), p);
                self.tally.policy_puts += 1;
            }
            1 => {
                let key = existing.choose(rng).expect("some").clone();
                let (ns, name) = key.split_once('/').expect("ns/name");
                let p = random_policy(rng, ns, name, &ips, self.vpc);
                self.api.put_network_policy(p.clone());
                self.world.policies.insert(key, p);
                self.tally.policy_puts += 1;
            }
            _ => {
                let key = existing.choose(rng).expect("some").clone();
                let (ns, name) = key.split_once('/').expect("ns/name");
                assert!(self.api.delete_network_policy(ns, name), "{key} was there");
                self.world.policies.remove(&key);
                self.tally.policy_deletes += 1;
            }
        }
    }

    /// One step: faults around a batch of changes, pod churn, the settle, the checks.
    async fn step(&mut self, step: u64) {
        let mut rng = step_rng(self.seed, step);
        self.tally.steps += 1;
        let killed = rng
            .random_bool(0.1)
            .then(|| rng.random_range(0..NODES.len()));
        let held = killed.is_none() && rng.random_bool(0.1);
        if let Some(node) = killed {
            self.daemons[node].kill().await;
            self.tally.kills += 1;
        }
        if held {
            self.api.hold_events();
            self.tally.holds += 1;
        }
        let flushed = rng
            .random_bool(0.1)
            .then(|| rng.random_range(0..NODES.len()));
        if let Some(node) = flushed {
            self.daemons[node]
                .ns
                .exec("nft", &["flush", "ruleset"])
                .await
                .expect("nft flush ruleset");
            self.tally.flushes += 1;
        }
        if rng.random_bool(0.3) && !self.world.pods.is_empty() {
            let i = rng.random_range(0..self.world.pods.len());
            let labels = pod_labels(&mut rng);
            let pod = &mut self.world.pods[i];
            pod.labels = labels;
            self.api.put_pod(pod_object(
                &pod.cni.namespace,
                &pod.cni.name,
                &self.daemons[pod.node].node,
                &pod.labels,
                (pod.http, pod.dns),
                Some(pod.cni.ip),
            ));
            self.tally.pod_relabels += 1;
        }
        if rng.random_bool(0.2) {
            let ns = *NAMESPACES.choose(&mut rng).expect("some");
            let labels = namespace_labels(&mut rng);
            set_namespace(&self.api, &mut self.world, ns, labels);
            self.tally.namespace_relabels += 1;
        }
        for _ in 0..rng.random_range(0..=2) {
            self.change_policy(&mut rng);
        }
        match rng.random_range(0..10) {
            0 => {
                self.api.end_watches();
                self.tally.watch_ends += 1;
            }
            1 => {
                self.api.compact();
                self.api.end_watches();
                self.tally.compactions += 1;
            }
            _ => {}
        }
        if held {
            tokio::time::sleep(Duration::from_millis(500)).await;
            self.api.release_events();
        }
        if let Some(node) = killed {
            self.daemons[node].start_again().await;
        }
        for _ in 0..rng.random_range(0..=2) {
            let candidates: Vec<usize> = (0..self.world.pods.len())
                .filter(|i| self.pods_on(self.world.pods[*i].node) > PODS_PER_NODE.0)
                .collect();
            if let Some(&i) = candidates.choose(&mut rng) {
                self.del_pod(i).await;
            }
        }
        for _ in 0..rng.random_range(0..=2) {
            let node = rng.random_range(0..NODES.len());
            if self.pods_on(node) < PODS_PER_NODE.1 {
                self.add_pod(&mut rng, node).await;
            }
        }
        let changed = Instant::now();
        if let Some(node) = flushed {
            while self.daemons[node].policy_table().await.is_none() {
                if changed.elapsed() > RESTORED_WITHIN {
                    self.tally.violations.push(format!(
                        "seed {} step {step}: {}'s table not restored within {RESTORED_WITHIN:?} of nft flush ruleset",
                        self.seed, NODES[node]
                    ));
                    break;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        let (chains, problems, denied, probed) = self.check_until_agreed(changed).await;
        for m in chains {
            self.tally
                .chain_mismatches
                .push(format!("seed {} step {step}: {m}", self.seed));
        }
        self.tally.probes += probed;
        self.tally.denied += denied;
        for (violation, text) in problems {
            let line = format!("seed {} step {step}: {text}", self.seed);
            if violation {
                self.tally.violations.push(line);
            } else {
                self.tally.not_converged.push(line);
            }
        }
        let nodes: Vec<vpclab::NetNs> = self.daemons.iter().map(|d| d.ns.clone()).collect();
        let x = u8::try_from(step % 200).expect("under 200") + 10;
        let ips = [Ipv4Addr::new(10, 96, 2, x), Ipv4Addr::new(10, 96, 3, x)];
        let found = attacks::attack(&self.world, &nodes, &mut rng, ips).await;
        let t = &mut self.tally;
        (t.spoofs, t.hairpins) = (t.spoofs + found.spoofs, t.hairpins + found.hairpins);
        t.services += found.services;
        t.services_denied += found.services_denied;
        let line = |text: String| format!("seed {} step {step}: {text}", self.seed);
        t.violations.extend(found.violations.into_iter().map(line));
        t.not_converged
            .extend(found.not_converged.into_iter().map(line));
    }

    /// Rounds of checks, the chains and the whole matrix, from the changes made at `changed` until
    /// one agrees with the model, or until the round that starts [`SETTLE`] after them: that
    /// round's chain mismatches, probe problems (true: a violation), the cells the model denied,
    /// and the cells probed.
    async fn check_until_agreed(
        &mut self,
        changed: Instant,
    ) -> (Vec<String>, Vec<(bool, String)>, u64, u64) {
        let cells = checks::all_cells(&self.world);
        loop {
            let last = changed.elapsed() >= SETTLE;
            let chains = checks::chain_mismatches(&self.world, &self.daemons).await;
            let (problems, denied) = checks::probe(&self.world, &self.daemons, &cells).await;
            if last || (chains.is_empty() && problems.is_empty()) {
                return (chains, problems, denied, cells.len() as u64);
            }
            self.tally.rechecks += 1;
            tokio::time::sleep(RECHECK_AFTER).await;
        }
    }

    /// After the last step: the whole matrix probed, and the chains, must agree with the model
    /// (in rounds, as a step's checks, for at most [`SETTLE`]).
    async fn final_check(&mut self) {
        let (chains, problems, _, probed) = self.check_until_agreed(Instant::now()).await;
        self.tally.final_probes = probed;
        let mut found: Vec<String> = problems.into_iter().map(|(_, t)| t).collect();
        found.extend(chains);
        for f in found {
            self.tally
                .final_problems
                .push(format!("seed {} final: {f}", self.seed));
        }
    }

    fn report(&self, took: Duration) -> String {
        let t = &self.tally;
        let mut r = String::new();
        let _ = writeln!(r, "# NetworkPolicy soak\n");
        let _ = writeln!(
            r,
            "Seed {}, {:.0} s, {} nodes, pods in namespaces {:?} ({}-{} a node), at most {MAX_POLICIES} policies; a step's checks agree within {:?}, every cell probed a step.\n",
            self.seed,
            took.as_secs_f64(),
            NODES.len(),
            NAMESPACES,
            PODS_PER_NODE.0,
            PODS_PER_NODE.1,
            SETTLE
        );
        let rows = [
            ("steps", t.steps),
            ("pod ADDs", t.adds),
            ("pod DELs", t.dels),
            ("IPs reused by a later pod", t.reused_ips),
            ("pod label changes", t.pod_relabels),
            ("namespace label changes", t.namespace_relabels),
            ("policies put (added or changed)", t.policy_puts),
            ("policies deleted", t.policy_deletes),
            ("daemon SIGKILLs (+ restart)", t.kills),
            ("watches ended", t.watch_ends),
            ("compactions (410, re-list)", t.compactions),
            ("event streams held", t.holds),
            ("nft flush ruleset in a node", t.flushes),
            ("cells probed after steps", t.probes),
            ("of which the model denies", t.denied),
            ("rounds of checks before a step's agreed", t.rechecks),
            ("spoofing attempts (raw datagrams as another pod)", t.spoofs),
            ("hairpins through a Service", t.hairpins),
            ("Service probes", t.services),
            ("of which the model denies", t.services_denied),
            ("cells probed at the end (whole matrix)", t.final_probes),
            (
                "**violations** (denied, connected)",
                t.violations.len() as u64,
            ),
            (
                "not converged after a step (allowed, no answer)",
                t.not_converged.len() as u64,
            ),
            (
                "chain mismatches after a step",
                t.chain_mismatches.len() as u64,
            ),
            ("final check problems", t.final_problems.len() as u64),
        ];
        let _ = writeln!(r, "| | |\n| --- | --- |");
        for (what, n) in rows {
            let _ = writeln!(r, "| {what} | {n} |");
        }
        for (title, list) in [
            ("Violations", &t.violations),
            ("Not converged after a step", &t.not_converged),
            ("Chain mismatches after a step", &t.chain_mismatches),
            ("Final check", &t.final_problems),
        ] {
            if !list.is_empty() {
                let _ = writeln!(r, "\n## {title}\n");
                for l in list.iter().take(50) {
                    let _ = writeln!(r, "- {l}");
                }
                if list.len() > 50 {
                    let _ = writeln!(r, "- … {} more", list.len() - 50);
                }
            }
        }
        r
    }
}
