//! The enforcer's engine: the node's local pods compiled against the cluster and the kernel's table
//! `inet eniipam_policy` made to match, in one `nft -f` transaction per sync.
//!
//! The first sync (and any sync after a failed one) loads the whole table; later ones send only
//! what changed since the last table the kernel accepted ([`nft::Ruleset::update_script`]): peer
//! addresses added and removed in place, changed chains refilled. A pod on this node is known by
//! its host veth ([`LocalAttachment`]); a local pod the cluster view does not know (deleted from the
//! API server while its sandbox is still here) is isolated both ways with no rule: it is denied
//! rather than guessed at.
//!
//! Two attachments can name one host veth: a pod's sandbox recreated (its veth name comes from the
//! pod's name, not the sandbox's) while the old attachment is still assigned, its DEL not come yet.
//! The interface belongs to the newest sandbox, so the newest attachment is kept
//! ([`newest_per_veth`]: the one the pool has held the shortest) and each other one is reported
//! ([`SyncReport::superseded`], and the pod's `not_enforced`): one pod never fails the node's sync.

use std::net::IpAddr;
use std::time::Duration;

use tokio::time::Instant;

use super::compile::{Cluster, Compiled, Direction, PodView, compile_all};
use super::decisions::Reporting;
use super::nft::{self, LocalPod, RenderError, Ruleset};
use super::watch::ClusterWatch;
use eniipam_netfilter::{Nft, NftError};

/// A pod attachment on this node, as the pool knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalAttachment {
    pub namespace: String,
    pub name: String,
    /// Its host veth (`eniipam_api::host_veth_name`).
    pub veth: String,
    /// The addresses the pool gave it (the API server may not show them yet).
    pub ips: Vec<IpAddr>,
    /// Its sandbox (the CNI container ID), to name it when it is superseded.
    pub container_id: String,
    /// How long the pool has held its addresses for it: of two attachments naming one veth, the
    /// one held the shortest is the newest.
    pub held_for: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum EnforceError {
    #[error(transparent)]
    Render(#[from] RenderError),
    #[error("loading the NetworkPolicy rules: {0}")]
    Load(#[source] NftError),
}

/// How a sync reached the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncKind {
    /// The whole table was loaded.
    Full,
    /// Only the changes were sent.
    Update,
    /// The kernel already held this table.
    Unchanged,
}

impl SyncKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Full => "full",
            Self::Update => "update",
            Self::Unchanged => "unchanged",
        }
    }
}

/// What one sync did.
#[derive(Clone, Debug)]
pub struct SyncReport {
    pub kind: SyncKind,
    /// Each local pod (`namespace/name`), its veth and what applies to it.
    pub pods: Vec<LocalPod>,
    pub rules: usize,
    pub elements: usize,
    /// Bytes of the transaction sent.
    pub script_bytes: usize,
    pub not_enforced: Vec<String>,
    /// Attachments left out because a newer one names the same veth ([`newest_per_veth`]).
    pub superseded: Vec<String>,
    pub compile: Duration,
    pub render: Duration,
    pub load: Duration,
}

/// One sync of the watched cluster ([`Engine::sync_watched`]).
#[derive(Debug)]
pub struct Round {
    /// The watch's generation this sync took (in force when `result` is `Ok`).
    pub generation: u64,
    /// When the oldest change it took was seen by the watch.
    pub since: Option<Instant>,
    /// NetworkPolicies in the cluster it took.
    pub policies: usize,
    /// The time taken to copy the cluster out of the watch.
    pub snapshot: Duration,
    pub result: Result<SyncReport, EnforceError>,
}

/// The engine: the `nft` binary and the table the kernel holds.
pub struct Engine {
    nft: Nft,
    applied: Option<Ruleset>,
    /// What the chains report of their decisions (`super::decisions`).
    reporting: Reporting,
}

impl Engine {
    pub fn new(nft: Nft) -> Self {
        Self {
            nft,
            applied: None,
            reporting: Reporting::default(),
        }
    }

    /// The engine, its chains reporting their decisions as `reporting` says.
    pub fn with_reporting(mut self, reporting: Reporting) -> Self {
        self.reporting = reporting;
        self
    }

    /// `nft -j <args>`, its reading by `read` (a [`nft::chains_differ`] or
    /// [`nft::base_chain_differs`]).
    async fn ask(
        &self,
        args: &[&str],
        read: fn(&str, &Ruleset) -> Result<Option<String>, String>,
        loaded: &Ruleset,
    ) -> Result<Option<String>, NftError> {
        let json = self.nft.run(args, None).await?;
        read(&json, loaded)
            .map_err(|e| NftError::Invalid(format!("reading `nft {}`: {e}", args.join(" "))))
    }

    /// Whether the kernel still holds the table last put in force (issue 47, case 5): what is
    /// missing or altered, in words naming it, or `None`. Always: the table, its base chains
    /// hooked as loaded and every pod chain ([`nft::chains_differ`], cheap); `deep` also reads
    /// the base chains' rules and the dispatch maps (a jump to every pod chain; each read costs
    /// `nft` a read of every set element). When something is wrong the engine forgets the
    /// table, so the next [`Self::sync`] loads it whole. Nothing is checked before a table was put
    /// in force (the next sync loads it whole anyway).
    pub async fn check(&mut self, deep: bool) -> Result<Option<String>, NftError> {
        let Some(loaded) = &self.applied else {
            return Ok(None);
        };
        let mut what = self
            .ask(
                &["-j", "list", "chains", "inet"],
                nft::chains_differ,
                loaded,
            )
            .await?;
        if what.is_none() && deep {
            what = self.deep_check(loaded).await?;
        }
        if what.is_some() {
            self.forget();
        }
        Ok(what)
    }

    /// The base chains' rules and the dispatch maps' elements ([`nft::base_chain_differs`],
    /// [`nft::maps_differ`]): what is missing or altered, or `None`.
    async fn deep_check(&self, loaded: &Ruleset) -> Result<Option<String>, NftError> {
        for base in nft::BASE_CHAINS {
            let args = ["-j", "list", "chain", "inet", nft::TABLE, base.name];
            let json = match self.nft.run(&args, None).await {
                Err(e) if e.is_not_found() => {
                    return Ok(Some(format!(
                        "table inet {}: its base chain {} is missing",
                        nft::TABLE,
                        base.name
                    )));
                }
                other => other?,
            };
            let what = nft::base_chain_differs(&json, base.name)
                .map_err(|e| NftError::Invalid(format!("reading `nft {}`: {e}", args.join(" "))))?;
            if what.is_some() {
                return Ok(what);
            }
        }
        self.ask(&["-j", "list", "maps", "inet"], nft::maps_differ, loaded)
            .await
    }

    /// Compiles `local` against `cluster` and makes the kernel's table enforce it.
    pub async fn sync(
        &mut self,
        cluster: &Cluster,
        local: &[LocalAttachment],
    ) -> Result<SyncReport, EnforceError> {
        let started = Instant::now();
        let (local, superseded) = newest_per_veth(local);
        let pods = local_pods(cluster, &local);
        let compiled = started.elapsed();
        let ruleset = nft::render_with(&pods, &self.reporting)?;
        let rendered = started.elapsed();
        let (kind, script) = match &self.applied {
            Some(applied) => {
                let update = ruleset.update_script(applied);
                if update.is_empty() {
                    (SyncKind::Unchanged, update)
                } else {
                    (SyncKind::Update, update)
                }
            }
            None => (SyncKind::Full, ruleset.script()),
        };
        if kind != SyncKind::Unchanged {
            // Until it is known again, the kernel's table is taken to be anything: the next sync
            // loads it whole.
            let applied = self.applied.take();
            if let Err(e) = self.nft.apply(&script).await {
                if kind == SyncKind::Full {
                    return Err(EnforceError::Load(e));
                }
                tracing::warn!(error = %e, "network policy: an in-place update failed; loading the whole table");
                drop(applied);
                self.nft
                    .apply(&ruleset.script())
                    .await
                    .map_err(EnforceError::Load)?;
            }
        }
        let report = SyncReport {
            kind,
            rules: ruleset.rule_count(),
            elements: ruleset.element_count(),
            script_bytes: script.len(),
            not_enforced: superseded.clone(),
            superseded,
            compile: compiled,
            render: rendered - compiled,
            load: started.elapsed() - rendered,
            pods,
        };
        self.applied = Some(ruleset);
        Ok(report)
    }

    /// One sync as the daemon runs it: the changes `watch` has seen taken, then the node's pods
    /// read (`local`) and the cluster as it now stands, and [`Self::sync`] of the one against the
    /// other. The pods are read after the changes are taken: a pod whose ADD bumped the
    /// generation ([`ClusterWatch::touch`]) before it was taken is in them, so a round that
    /// reports that generation in force has the pod's rules in the kernel. A failed round's
    /// changes are still the caller's to put back ([`ClusterWatch::restore_pending`]).
    pub async fn sync_watched(
        &mut self,
        watch: &ClusterWatch,
        local: impl FnOnce() -> Vec<LocalAttachment>,
    ) -> Round {
        let (generation, since) = watch.take_pending();
        let local = local();
        let started = Instant::now();
        let cluster = watch.cluster();
        let snapshot = started.elapsed();
        Round {
            generation,
            since,
            policies: cluster.policies.len(),
            snapshot,
            result: self.sync(&cluster, &local).await,
        }
    }

    /// Forgets what the kernel holds: the next sync loads the whole table.
    pub fn forget(&mut self) {
        self.applied = None;
    }

    /// Deletes the table (enforcement off); true when there was one.
    pub async fn remove(&mut self) -> Result<bool, NftError> {
        self.forget();
        self.nft
            .delete_table(eniipam_netfilter::Family::Inet, nft::TABLE)
            .await
    }
}

/// The attachments with one per host veth, the newest (held the shortest by the pool; on a tie
/// the greater container ID, so the choice does not depend on the pool's order), in `local`'s
/// order; and a line per attachment left out, naming its pod (`pod <ns>/<name>: ...`, as
/// `not_enforced` lines do), its sandbox, address and veth, and the attachment kept.
pub fn newest_per_veth(local: &[LocalAttachment]) -> (Vec<LocalAttachment>, Vec<String>) {
    let mut newest: std::collections::BTreeMap<&str, &LocalAttachment> = Default::default();
    for a in local {
        let slot = newest.entry(a.veth.as_str()).or_insert(a);
        if (a.held_for, std::cmp::Reverse(&a.container_id))
            < (slot.held_for, std::cmp::Reverse(&slot.container_id))
        {
            *slot = a;
        }
    }
    let mut kept = Vec::new();
    let mut superseded = Vec::new();
    let ips = |a: &LocalAttachment| {
        let ips: Vec<String> = a.ips.iter().map(ToString::to_string).collect();
        ips.join(", ")
    };
    for a in local {
        let keep = newest[a.veth.as_str()];
        if std::ptr::eq(keep, a) {
            kept.push(a.clone());
        } else {
            superseded.push(format!(
                "pod {}/{}: attachment {} ({}, assigned {} s ago) shares host veth {} with the newer attachment {} of {}/{} ({}); left out of the rules until its DEL",
                a.namespace,
                a.name,
                a.container_id,
                ips(a),
                a.held_for.as_secs(),
                a.veth,
                keep.container_id,
                keep.namespace,
                keep.name,
                ips(keep),
            ));
        }
    }
    (kept, superseded)
}

/// The local pods compiled: each attachment's pod from the cluster view, with the pool's
/// addresses added to what the API server shows; all of them in one [`compile_all`], which
/// evaluates each policy once for the node rather than once per pod.
///
/// The peers are the cluster's pods with the same addresses added ([`with_local_addresses`]):
/// a new pod of this node is a peer of the node's pods from its ADD, not only once the kubelet
/// has posted its `status.podIPs` (issue 47, case 3).
pub fn local_pods(cluster: &Cluster, local: &[LocalAttachment]) -> Vec<LocalPod> {
    let cluster = with_local_addresses(cluster, local);
    let cluster = cluster.as_ref();
    let known: Vec<Option<PodView>> = local
        .iter()
        .map(|a| {
            let p = cluster
                .pods
                .iter()
                .find(|p| p.namespace == a.namespace && p.name == a.name)?;
            let mut pod: PodView = p.clone();
            for ip in &a.ips {
                if !pod.ips.contains(ip) {
                    pod.ips.push(*ip);
                }
            }
            Some(pod)
        })
        .collect();
    let views: Vec<&PodView> = known.iter().flatten().collect();
    let mut compiled = compile_all(cluster, &views).into_iter();
    local
        .iter()
        .zip(&known)
        .map(|(a, pod)| LocalPod {
            name: format!("{}/{}", a.namespace, a.name),
            veth: a.veth.clone(),
            ips: a.ips.clone(),
            compiled: match pod {
                Some(_) => compiled.next().expect("one compiled pod per known pod"),
                None => unknown_pod(),
            },
        })
        .collect()
}

/// The cluster with each local pod's pool addresses added to its pod (known by namespace and
/// name, its labels from the watch): the API server shows a new pod's address only once the
/// kubelet has posted it, a second or two after the ADD (longer under load), while this node's
/// pool knows it at the ADD. Borrowed when the API server already shows every one of them (the
/// usual case: a copy only in a new pod's first seconds). Pods of other nodes are peers once
/// their address is posted: their pools are not this node's.
fn with_local_addresses<'a>(
    cluster: &'a Cluster,
    local: &[LocalAttachment],
) -> std::borrow::Cow<'a, Cluster> {
    let mut missing: std::collections::BTreeMap<(&str, &str), Vec<IpAddr>> = Default::default();
    for a in local {
        let Some(p) = cluster
            .pods
            .iter()
            .find(|p| p.namespace == a.namespace && p.name == a.name)
        else {
            continue;
        };
        for ip in a.ips.iter().filter(|ip| !p.ips.contains(ip)) {
            let ips = missing.entry((&a.namespace, &a.name)).or_default();
            if !ips.contains(ip) {
                ips.push(*ip);
            }
        }
    }
    if missing.is_empty() {
        return std::borrow::Cow::Borrowed(cluster);
    }
    let mut patched = cluster.clone();
    for p in &mut patched.pods {
        if let Some(ips) = missing.get(&(p.namespace.as_str(), p.name.as_str())) {
            p.ips.extend(ips.iter().copied());
        }
    }
    std::borrow::Cow::Owned(patched)
}

/// A local pod the API server does not know: denied both ways.
fn unknown_pod() -> Compiled {
    let why = "(the pod is unknown to the API server)".to_owned();
    let closed = || Direction::Isolated {
        policies: vec![why.clone()],
        rules: Vec::new(),
    };
    Compiled {
        ingress: closed(),
        egress: closed(),
        problems: vec![format!(
            "{why}: isolated both ways until the API server shows it"
        )],
    }
}

/// The table's verdict counters (`nft -j list counters table inet eniipam_policy`) summed per
/// veth, in veth order.
pub fn counters_by_veth(json: &str) -> Result<Vec<(String, super::DirectionCounts)>, String> {
    let mut by_veth: std::collections::BTreeMap<String, super::DirectionCounts> =
        std::collections::BTreeMap::new();
    for c in nft::parse_counters(json)? {
        let counts = by_veth.entry(c.veth).or_default();
        let slot = match (c.direction, c.verdict) {
            (nft::PolicyType::Ingress, nft::CounterVerdict::Allowed) => &mut counts.ingress_allowed,
            (nft::PolicyType::Ingress, nft::CounterVerdict::Denied) => &mut counts.ingress_denied,
            (nft::PolicyType::Egress, nft::CounterVerdict::Allowed) => &mut counts.egress_allowed,
            (nft::PolicyType::Egress, nft::CounterVerdict::Denied) => &mut counts.egress_denied,
        };
        *slot += c.packets;
    }
    Ok(by_veth.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attachment(container_id: &str, ip: &str, held_for: u64) -> LocalAttachment {
        LocalAttachment {
            namespace: "x".into(),
            name: "a".into(),
            veth: "eni0a1b2c3d4e5".into(),
            ips: vec![ip.parse().unwrap()],
            container_id: container_id.into(),
            held_for: Duration::from_secs(held_for),
        }
    }

    /// Issue 47, case 6: a sandbox recreated while the old attachment is still assigned. Before
    /// the fix the render refused the node: `pods x/a and x/a both name host veth
    /// "eni0a1b2c3d4e5"`.
    #[test]
    fn a_shared_veth_keeps_the_newest_attachment_and_reports_the_other() {
        let old = attachment("old", "10.0.0.5", 600);
        let new = attachment("new", "10.0.0.6", 2);
        let other = LocalAttachment {
            name: "b".into(),
            veth: "eni9f8e7d6c5b4".into(),
            ..attachment("b1", "10.0.0.7", 100)
        };
        for local in [
            vec![old.clone(), new.clone(), other.clone()],
            vec![new.clone(), other.clone(), old.clone()],
        ] {
            let (kept, superseded) = newest_per_veth(&local);
            assert!(kept.contains(&new) && kept.contains(&other) && kept.len() == 2);
            assert_eq!(superseded.len(), 1, "{superseded:?}");
            assert!(
                superseded[0].starts_with("pod x/a: attachment old (10.0.0.5")
                    && superseded[0].contains("eni0a1b2c3d4e5")
                    && superseded[0].contains("newer attachment new of x/a (10.0.0.6)"),
                "{}",
                superseded[0]
            );
            // The node's rules render: the pod (unknown to this empty cluster: isolated) once.
            let pods = local_pods(&Cluster::default(), &kept);
            let ruleset = nft::render(&pods).expect("one pod's duplicate does not fail the node");
            // Each: a jump by its veth each way, and by its address for egress.
            let elements: usize = ruleset.maps.values().map(|m| m.elements.len()).sum();
            assert_eq!(elements, 6, "{:?}", ruleset.maps);
        }
        // A tie in age: the choice does not depend on the pool's order.
        let twin = attachment("zz", "10.0.0.8", 600);
        let (a, _) = newest_per_veth(&[old.clone(), twin.clone()]);
        let (b, _) = newest_per_veth(&[twin.clone(), old.clone()]);
        assert_eq!((a.clone(), b), (vec![twin.clone()], vec![twin]));
    }

    /// Issue 47, case 3: a new local pod whose address the API server does not show yet (the
    /// kubelet posts it after the ADD) is a peer of the node's pods from its ADD, by the pool's
    /// address; a remote pod is a peer once its address is posted. Before the fix the peers were
    /// the API server's addresses only: `Listed { pods: {}, blocks: [] }`.
    #[test]
    fn a_local_pod_is_a_peer_from_its_add() {
        use crate::compile::Peers;
        use k8s_openapi::api::networking::v1::NetworkPolicy;
        let from_d: NetworkPolicy = serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": "x", "name": "from-d"},
            "spec": {"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Ingress"],
                     "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "d"}}}]}]}
        }))
        .unwrap();
        let view = |name: &str, label: &str, ips: &[&str]| PodView {
            namespace: "x".into(),
            name: name.into(),
            labels: [("pod".to_owned(), label.to_owned())].into(),
            ips: ips.iter().map(|ip| ip.parse().unwrap()).collect(),
            host_network: false,
            ports: Vec::new(),
        };
        let cluster = Cluster {
            namespaces: [("x".to_owned(), Default::default())].into(),
            // x/d is local and new; x/e is remote and new: neither address is posted yet.
            pods: vec![
                view("a", "a", &["10.0.0.5"]),
                view("d", "d", &[]),
                view("e", "d", &[]),
            ],
            policies: vec![from_d],
        };
        let a = LocalAttachment {
            veth: "eni0000000000a".into(),
            ..attachment("sa", "10.0.0.5", 600)
        };
        let d = LocalAttachment {
            name: "d".into(),
            veth: "eni000000000d".into(),
            ..attachment("sd", "10.0.0.6", 0)
        };
        let pods = local_pods(&cluster, &[a, d]);
        let Direction::Isolated { rules, .. } = &pods[0].compiled.ingress else {
            panic!("x/a is isolated: {:?}", pods[0].compiled);
        };
        assert_eq!(
            rules[0].peers,
            Peers::Listed {
                pods: ["10.0.0.6".parse().unwrap()].into(),
                blocks: Vec::new()
            },
            "x/d, local, is a peer of x/a from its ADD"
        );
    }
}
