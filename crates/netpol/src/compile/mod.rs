//! Kubernetes NetworkPolicy, compiled for one pod: what its ingress and its egress allow, as sets of
//! peer addresses and ports that a packet filter can hold (the node's nftables sets will), with
//! each rule naming the policy it came from (for `eniipamctl policy <pod>`).
//!
//! The semantics are Kubernetes' (`networking.k8s.io/v1`):
//! - a pod is isolated for a direction when some policy of its namespace selects it
//!   (`spec.podSelector`) and has that direction in `spec.policyTypes` (unset or empty: `Ingress`,
//!   plus `Egress` when `spec.egress` has a rule, as the API server defaults it). An isolated direction allows only what some rule of
//!   some selecting policy allows (policies add up; none denies); a direction no policy isolates
//!   allows everything;
//! - a rule with no peers (`from`/`to` empty or absent) matches every peer; a peer is a
//!   `podSelector` (pods of the policy's namespace), a `namespaceSelector` (every pod of the matching
//!   namespaces), both (the matching pods of the matching namespaces), or an `ipBlock` (a CIDR less
//!   its `except`s, matched on the peer's address);
//! - a rule with no ports matches every port and protocol; a port has a protocol (`TCP` when
//!   unset, `UDP`, `SCTP`), a number with an optional `endPort`, or a name: for ingress the name is
//!   looked up in the selected pod's container ports, for egress in each peer pod's;
//! - a connection is allowed when the client's egress and the server's ingress both allow it;
//!   replies follow the connection (conntrack), whatever the policies say of the reverse direction.
//!
//! Host-network pods and pods without an address are no selector's peers (their address is the
//! node's, which Kubernetes leaves to the implementation); an `ipBlock` still matches the node's
//! address. A part of a policy that the API server would have refused (an unknown operator, a
//! malformed CIDR, a bad port) is named in [`Compiled::problems`] and allows nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::selector::matches;

mod all;
pub use all::compile_all;

/// A transport protocol NetworkPolicy names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    /// `TCP`, `UDP` or `SCTP` (the API's spelling); unset means TCP.
    pub fn parse(s: Option<&str>) -> Result<Self, String> {
        match s.unwrap_or("TCP") {
            "TCP" => Ok(Self::Tcp),
            "UDP" => Ok(Self::Udp),
            "SCTP" => Ok(Self::Sctp),
            other => Err(format!("protocol {other:?} is not TCP, UDP or SCTP")),
        }
    }

    /// The API's spelling: `TCP`, `UDP`, `SCTP`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tcp => "TCP",
            Self::Udp => "UDP",
            Self::Sctp => "SCTP",
        }
    }
}

/// A container port of a pod, by name (what a named policy port refers to).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamedPort {
    pub name: String,
    pub protocol: Protocol,
    pub port: u16,
}

/// What the compiler needs of a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodView {
    pub namespace: String,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// Its addresses (none while it has none).
    pub ips: Vec<IpAddr>,
    pub host_network: bool,
    pub ports: Vec<NamedPort>,
}

/// The cluster as the policies see it.
#[derive(Clone, Debug, Default)]
pub struct Cluster {
    /// Each namespace's labels (`kubernetes.io/metadata.name` included, as the API server sets it).
    pub namespaces: BTreeMap<String, BTreeMap<String, String>>,
    pub pods: Vec<PodView>,
    pub policies: Vec<NetworkPolicy>,
}

/// Which policy rule allowed something: `namespace/name`, direction and index.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct RuleSource {
    pub policy: String,
    pub index: usize,
}

/// An `ipBlock`: the CIDR less its exceptions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IpBlock {
    pub cidr: IpNet,
    pub except: Vec<IpNet>,
}

impl IpBlock {
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.cidr.contains(&ip) && !self.except.iter().any(|e| e.contains(&ip))
    }
}

/// The peers a rule matches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Peers {
    /// No `from`/`to`: every address.
    Any,
    /// The addresses of the selected pods, and the blocks.
    Listed {
        pods: BTreeSet<IpAddr>,
        blocks: Vec<IpBlock>,
    },
}

/// A protocol and an inclusive port range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PortRange {
    pub protocol: Protocol,
    pub first: u16,
    pub last: u16,
}

/// The ports a rule matches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ports {
    /// No `ports`: every port of every protocol.
    Any,
    Listed {
        /// Numbers and ranges, and (ingress) names resolved on the selected pod.
        ranges: Vec<PortRange>,
        /// A whole protocol (a port entry with a protocol and no port).
        protocols: BTreeSet<Protocol>,
        /// Egress names resolved on each peer pod: (peer address, protocol, port).
        per_peer: BTreeSet<(IpAddr, Protocol, u16)>,
    },
}

/// One rule, compiled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    pub source: RuleSource,
    pub peers: Peers,
    pub ports: Ports,
}

impl Rule {
    /// Whether the rule allows a connection with `peer` on `protocol`/`port`.
    pub fn allows(&self, peer: IpAddr, protocol: Protocol, port: u16) -> bool {
        let peer_ok = match &self.peers {
            Peers::Any => true,
            Peers::Listed { pods, blocks } => {
                pods.contains(&peer) || blocks.iter().any(|b| b.contains(peer))
            }
        };
        peer_ok
            && match &self.ports {
                Ports::Any => true,
                Ports::Listed {
                    ranges,
                    protocols,
                    per_peer,
                } => {
                    protocols.contains(&protocol)
                        || ranges
                            .iter()
                            .any(|r| r.protocol == protocol && (r.first..=r.last).contains(&port))
                        || per_peer.contains(&(peer, protocol, port))
                }
            }
    }
}

/// One direction of a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Direction {
    /// No policy isolates it: everything is allowed.
    Open,
    /// Isolated by these policies: only what a rule allows (no rule: nothing).
    Isolated {
        policies: Vec<String>,
        rules: Vec<Rule>,
    },
}

/// What one direction says of a connection, and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict<'a> {
    /// No policy isolates the direction.
    Open,
    /// Isolated, and this rule allows it.
    AllowedBy(&'a RuleSource),
    /// Isolated, and no rule allows it.
    Denied,
}

impl Verdict<'_> {
    pub fn is_allowed(&self) -> bool {
        !matches!(self, Self::Denied)
    }
}

impl Direction {
    /// What this direction says of a connection with `peer` on `protocol`/`port`.
    pub fn verdict(&self, peer: IpAddr, protocol: Protocol, port: u16) -> Verdict<'_> {
        match self {
            Self::Open => Verdict::Open,
            Self::Isolated { rules, .. } => rules
                .iter()
                .find(|r| r.allows(peer, protocol, port))
                .map_or(Verdict::Denied, |r| Verdict::AllowedBy(&r.source)),
        }
    }
}

/// A pod's policy, compiled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Compiled {
    pub ingress: Direction,
    pub egress: Direction,
    /// Parts of selecting policies that could not be used, each naming the policy and the field.
    pub problems: Vec<String>,
}

fn policy_name(p: &NetworkPolicy) -> String {
    format!(
        "{}/{}",
        p.metadata.namespace.as_deref().unwrap_or_default(),
        p.metadata.name.as_deref().unwrap_or_default()
    )
}

/// The policy types of `p`: (ingress, egress), defaulted as the API server defaults them
/// (`SetDefaults_NetworkPolicy`): `policyTypes` unset or empty means `Ingress`, plus `Egress` when
/// `spec.egress` has a rule (`egress: []` adds none). A policy read from the API server already
/// has them; one read from a file or another source may not.
fn types(p: &NetworkPolicy) -> (bool, bool) {
    let spec = p.spec.as_ref();
    match spec
        .and_then(|s| s.policy_types.as_ref())
        .filter(|t| !t.is_empty())
    {
        Some(t) => (
            t.iter().any(|t| t == "Ingress"),
            t.iter().any(|t| t == "Egress"),
        ),
        None => (
            true,
            spec.and_then(|s| s.egress.as_ref())
                .is_some_and(|rules| !rules.is_empty()),
        ),
    }
}

/// Policy `p`'s name and spec when its `spec.podSelector` selects `pod`; a selector the API server
/// would have refused is named in `problems` and selects nothing.
fn selecting<'p>(
    p: &'p NetworkPolicy,
    pod: &PodView,
    problems: &mut Vec<String>,
) -> Option<(String, &'p NetworkPolicySpec)> {
    let spec = p.spec.as_ref()?;
    let name = policy_name(p);
    let every = LabelSelector::default();
    match matches(spec.pod_selector.as_ref().unwrap_or(&every), &pod.labels) {
        Ok(true) => Some((name, spec)),
        Ok(false) => None,
        Err(e) => {
            problems.push(format!("NetworkPolicy {name}: spec.podSelector: {e}"));
            None
        }
    }
}

/// Compiles what the policies of `cluster` say of `pod`.
pub fn compile(cluster: &Cluster, pod: &PodView) -> Compiled {
    let mut problems = Vec::new();
    let mut ingress: Gathered = None;
    let mut egress: Gathered = None;
    for p in &cluster.policies {
        if p.metadata.namespace.as_deref() != Some(pod.namespace.as_str()) {
            continue;
        }
        let Some((name, spec)) = selecting(p, pod, &mut problems) else {
            continue;
        };
        let (is_ingress, is_egress) = types(p);
        if is_ingress {
            let (policies, rules) = ingress.get_or_insert_with(Default::default);
            policies.push(name.clone());
            for (i, r) in spec.ingress.iter().flatten().enumerate() {
                let at = format!("NetworkPolicy {name}: spec.ingress[{i}]");
                rules.push(Rule {
                    source: RuleSource {
                        policy: name.clone(),
                        index: i,
                    },
                    peers: peers(cluster, p, r.from.as_deref(), &at, &mut problems),
                    ports: ports(
                        cluster,
                        r.ports.as_deref(),
                        Target::Pod(pod),
                        &at,
                        &mut problems,
                    ),
                });
            }
        }
        if is_egress {
            let (policies, rules) = egress.get_or_insert_with(Default::default);
            policies.push(name.clone());
            for (i, r) in spec.egress.iter().flatten().enumerate() {
                let at = format!("NetworkPolicy {name}: spec.egress[{i}]");
                let peers = peers(cluster, p, r.to.as_deref(), &at, &mut problems);
                let ports = ports(
                    cluster,
                    r.ports.as_deref(),
                    Target::Peers(&peers),
                    &at,
                    &mut problems,
                );
                rules.push(Rule {
                    source: RuleSource {
                        policy: name.clone(),
                        index: i,
                    },
                    peers,
                    ports,
                });
            }
        }
    }
    compiled(ingress, egress, problems)
}

/// A pod's directions as compiled: `None` is open, `Some` the isolating policies and their rules.
type Gathered = Option<(Vec<String>, Vec<Rule>)>;

fn compiled(ingress: Gathered, egress: Gathered, problems: Vec<String>) -> Compiled {
    let direction = |d: Gathered| match d {
        None => Direction::Open,
        Some((policies, rules)) => Direction::Isolated { policies, rules },
    };
    Compiled {
        ingress: direction(ingress),
        egress: direction(egress),
        problems,
    }
}

/// The peers of a rule; a peer that cannot be used is named and matches nothing.
fn peers(
    cluster: &Cluster,
    policy: &NetworkPolicy,
    list: Option<&[NetworkPolicyPeer]>,
    at: &str,
    problems: &mut Vec<String>,
) -> Peers {
    let Some(list) = list.filter(|l| !l.is_empty()) else {
        return Peers::Any;
    };
    let home = policy.metadata.namespace.as_deref().unwrap_or_default();
    let mut pods = BTreeSet::new();
    let mut blocks = Vec::new();
    for (j, peer) in list.iter().enumerate() {
        let at = format!("{at}.peers[{j}]");
        if let Some(b) = &peer.ip_block {
            match ip_block(&b.cidr, b.except.as_deref().unwrap_or_default()) {
                Ok(b) => blocks.push(b),
                Err(e) => problems.push(format!("{at}.ipBlock: {e}")),
            }
            continue;
        }
        let ns_ok = |ns: &str| -> Result<bool, String> {
            match &peer.namespace_selector {
                None => Ok(ns == home),
                Some(sel) => {
                    let labels = cluster.namespaces.get(ns).cloned().unwrap_or_default();
                    matches(sel, &labels).map_err(|e| format!("namespaceSelector: {e}"))
                }
            }
        };
        let any = LabelSelector::default();
        let pod_sel = peer.pod_selector.as_ref().unwrap_or(&any);
        for candidate in cluster.pods.iter().filter(|c| !c.host_network) {
            let ok = ns_ok(&candidate.namespace).and_then(|ns| {
                Ok(ns
                    && matches(pod_sel, &candidate.labels)
                        .map_err(|e| format!("podSelector: {e}"))?)
            });
            match ok {
                Ok(true) => pods.extend(candidate.ips.iter().copied()),
                Ok(false) => {}
                Err(e) => {
                    problems.push(format!("{at}: {e}"));
                    break;
                }
            }
        }
    }
    Peers::Listed { pods, blocks }
}

fn ip_block(cidr: &str, except: &[String]) -> Result<IpBlock, String> {
    let net = |s: &str| -> Result<IpNet, String> {
        s.parse::<IpNet>()
            .map_err(|_| format!("{s:?} is not a CIDR"))
    };
    let cidr = net(cidr)?;
    let except = except
        .iter()
        .map(|e| net(e))
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(e) = except.iter().find(|e| !cidr.contains(*e)) {
        return Err(format!("except {e} is not inside {cidr}"));
    }
    Ok(IpBlock { cidr, except })
}

/// Where a named port is looked up: the selected pod (ingress) or each peer pod (egress).
enum Target<'a> {
    Pod(&'a PodView),
    Peers(&'a Peers),
}

/// The ports of a rule; an entry that cannot be used is named and matches nothing.
fn ports(
    cluster: &Cluster,
    list: Option<&[NetworkPolicyPort]>,
    target: Target<'_>,
    at: &str,
    problems: &mut Vec<String>,
) -> Ports {
    let Some(list) = list.filter(|l| !l.is_empty()) else {
        return Ports::Any;
    };
    let mut ranges = Vec::new();
    let mut protocols = BTreeSet::new();
    let mut per_peer = BTreeSet::new();
    for (j, p) in list.iter().enumerate() {
        let at = format!("{at}.ports[{j}]");
        let protocol = match Protocol::parse(p.protocol.as_deref()) {
            Ok(pr) => pr,
            Err(e) => {
                problems.push(format!("{at}: {e}"));
                continue;
            }
        };
        match (&p.port, p.end_port) {
            (None, None) => {
                protocols.insert(protocol);
            }
            (None, Some(_)) => problems.push(format!("{at}: endPort without port")),
            (Some(IntOrString::Int(n)), end) => {
                let first = u16::try_from(*n).ok().filter(|n| *n > 0);
                let last = match end {
                    None => first,
                    Some(e) => u16::try_from(e)
                        .ok()
                        .filter(|e| first.is_some_and(|f| *e >= f)),
                };
                match (first, last) {
                    (Some(first), Some(last)) => ranges.push(PortRange {
                        protocol,
                        first,
                        last,
                    }),
                    _ => problems.push(format!(
                        "{at}: port {n}{} is not a port or range of 1 to 65535",
                        end.map(|e| format!(" endPort {e}")).unwrap_or_default()
                    )),
                }
            }
            (Some(IntOrString::String(_)), Some(_)) => {
                problems.push(format!("{at}: endPort with a named port"));
            }
            (Some(IntOrString::String(name)), None) => {
                let named = |pod: &PodView| {
                    pod.ports
                        .iter()
                        .find(|np| &np.name == name && np.protocol == protocol)
                        .map(|np| np.port)
                };
                match target {
                    Target::Pod(pod) => {
                        if let Some(port) = named(pod) {
                            ranges.push(PortRange {
                                protocol,
                                first: port,
                                last: port,
                            });
                        }
                    }
                    Target::Peers(peers) => {
                        for pod in cluster.pods.iter().filter(|c| !c.host_network) {
                            let Some(port) = named(pod) else { continue };
                            for ip in &pod.ips {
                                let is_peer = match peers {
                                    Peers::Any => true,
                                    Peers::Listed { pods, blocks } => {
                                        pods.contains(ip) || blocks.iter().any(|b| b.contains(*ip))
                                    }
                                };
                                if is_peer {
                                    per_peer.insert((*ip, protocol, port));
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    Ports::Listed {
        ranges,
        protocols,
        per_peer,
    }
}

/// Whether the policies allow `client` to open a connection to `server` on `protocol`/`port`: the
/// client's egress and the server's ingress must both allow it (replies then follow it).
pub fn connection_allowed(
    cluster: &Cluster,
    client: &PodView,
    server: &PodView,
    protocol: Protocol,
    port: u16,
) -> bool {
    let (Some(&client_ip), Some(&server_ip)) = (client.ips.first(), server.ips.first()) else {
        return false;
    };
    compile(cluster, client)
        .egress
        .verdict(server_ip, protocol, port)
        .is_allowed()
        && compile(cluster, server)
            .ingress
            .verdict(client_ip, protocol, port)
            .is_allowed()
}
