//! The table's base chains, the hooks where packets meet the rules, and the sets they read of the
//! node's pods (issue 47, cases 1 and 2):
//!
//! - `prerouting` (hook prerouting, priority raw, before conntrack so a spoofed packet makes no
//!   connection entry): a packet that comes in on a local pod's host veth (`@pod_veths`) must carry
//!   one of that pod's own addresses as its source (`@pod_sources`, `@pod_sources6`: `veth .
//!   address` of every local attachment, isolated or not). Anything else is counted in `spoofed`
//!   and dropped, as Calico's per-workload RPF and Cilium's source check do: the peer sets match on
//!   the source address alone, so without this a pod with the default NET_RAW capability could
//!   send as an allowed peer. IPv6 link-local sources (`fe80::/10`) and `::` (duplicate address
//!   detection) pass, so neighbour discovery works; a veth whose IPv6 address the node does not
//!   know (`@pod_veths6` lacks it) is not checked for IPv6;
//! - `forward` (hook forward, priority filter): pod traffic the node routes (kube-proxy's
//!   iptables and nftables modes DNAT in prerouting, so Service traffic passes here with its
//!   backend as destination). A pod reaching itself (`iifname . oifname @hairpin`, its own veth
//!   both ways: its Service DNATed back to it) is accepted: a pod cannot block access to itself.
//!   Then `iifname vmap @egress_dispatch` jumps to the sending pod's egress chain and `oifname
//!   vmap @ingress_dispatch` to the receiving pod's ingress chain: one hash lookup each, whatever
//!   the number of pods (issue 47, "Scale": before, a linear list of two jumps per pod);
//! - `output` (hook output, priority filter): what leaves through local-out with a pod's source
//!   or to a pod's veth: kube-proxy's IPVS mode (and any proxy that sends with the client's
//!   address) schedules at local-in and re-sends the packet through local-out, so it never
//!   traverses forward. The node's own traffic (`fib saddr type local`: kubelet probes, host
//!   processes, masqueraded Service traffic) is not judged, nor are its neighbour discovery and
//!   MLD messages (some leave from `::`, [`NODE_LINK_ICMPV6`]). A pod reaching itself (`oifname . ip
//!   saddr @pod_sources`) is accepted; then `ip saddr vmap @egress_by_addr` jumps to the source
//!   pod's egress chain (by its address: sound only because `prerouting` ties each pod's
//!   addresses to its veth, so the address names the pod) and `oifname vmap @ingress_dispatch`
//!   to the destination pod's ingress chain.
//!
//! The judging chains accept `ct state established,related` first. Nothing is judged at input:
//! under IPVS a pod's packet to a ClusterIP passes input with the ClusterIP as its destination
//! (IPVS takes it after the filter, at priority 98-99), before the backend is known.

use std::net::IpAddr;

use super::text::comment;
use super::{LocalPod, PolicyType, Ruleset, Set, TABLE};

/// The counter of spoofed packets dropped (read with [`super::spoofed_packets`]).
pub const SPOOFED: &str = "spoofed";

/// A base chain of the table: its name and how it is hooked (the chain check compares the
/// kernel's with these).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BaseChain {
    pub name: &'static str,
    pub kind: &'static str,
    pub hook: &'static str,
    /// Its priority, as `nft -j` shows it.
    pub priority: i64,
    pub policy: &'static str,
}

/// The base chains, in the order they are declared.
pub const BASE_CHAINS: [BaseChain; 3] = [
    BaseChain {
        name: "prerouting",
        kind: "filter",
        hook: "prerouting",
        priority: -300,
        policy: "accept",
    },
    BaseChain {
        name: "forward",
        kind: "filter",
        hook: "forward",
        priority: 0,
        policy: "accept",
    },
    BaseChain {
        name: "output",
        kind: "filter",
        hook: "output",
        priority: 0,
        policy: "accept",
    },
];

impl BaseChain {
    /// Its `type … hook … priority …; policy …;` line.
    pub fn declaration(&self) -> String {
        format!(
            "type {} hook {} priority {}; policy {};",
            self.kind, self.hook, self.priority, self.policy
        )
    }
}

/// The rules of base chain `name`, in order (the same for every ruleset: what changes with the
/// pods is in the sets and maps).
pub(super) fn base_rules(name: &str) -> Vec<String> {
    let rules: &[&str] = match name {
        "prerouting" => return spoof_check(),
        "forward" => &[
            ESTABLISHED,
            "iifname . oifname @hairpin accept comment \"a pod reaching itself: a pod cannot block access to itself\"",
            "iifname vmap @egress_dispatch comment \"the sending pod's egress\"",
            "oifname vmap @ingress_dispatch comment \"the receiving pod's ingress\"",
        ],
        "output" => &[
            ESTABLISHED,
            NODE_LINK_ICMPV6,
            "fib saddr type local accept comment \"the node's own traffic\"",
            "oifname . ip saddr @pod_sources accept comment \"a pod reaching itself: a pod cannot block access to itself\"",
            "oifname . ip6 saddr @pod_sources6 accept comment \"a pod reaching itself: a pod cannot block access to itself\"",
            "ip saddr vmap @egress_by_addr comment \"the sending pod's egress, by its address\"",
            "ip6 saddr vmap @egress_by_addr6 comment \"the sending pod's egress, by its address\"",
            "oifname vmap @ingress_dispatch comment \"the receiving pod's ingress\"",
        ],
        _ => &[],
    };
    rules.iter().map(|r| (*r).to_owned()).collect()
}

/// The dispatch of `pod`'s isolated direction `dir` to its chain: by its veth (`forward`, and
/// `output` for ingress), and for egress by its addresses (`output`).
pub(super) fn dispatch(out: &mut Ruleset, pod: &LocalPod, dir: PolicyType, chain: &str) {
    let element = |key: String| format!("{key} : jump {chain}");
    let veth = format!("\"{}\"", pod.veth);
    match dir {
        PolicyType::Ingress => out.map_element("ingress_dispatch", element(veth)),
        PolicyType::Egress => {
            out.map_element("egress_dispatch", element(veth));
            for ip in &pod.ips {
                let map = if ip.is_ipv4() {
                    "egress_by_addr"
                } else {
                    "egress_by_addr6"
                };
                out.map_element(map, element(ip.to_string()));
            }
        }
    }
}

/// The verdict maps, by name: their key types.
const MAPS: [(&str, &str); 4] = [
    ("egress_by_addr", "ipv4_addr"),
    ("egress_by_addr6", "ipv6_addr"),
    ("egress_dispatch", "ifname"),
    ("ingress_dispatch", "ifname"),
];

impl Ruleset {
    /// Adds `element` to verdict map `name` (declared by [`add_pod_sets`]).
    fn map_element(&mut self, name: &str, element: String) {
        if let Some(map) = self.maps.get_mut(name) {
            map.elements.push(element);
        }
    }

    /// The chain an element of a verdict map jumps to.
    pub(super) fn map_target(element: &str) -> Option<&str> {
        element.rsplit_once(" : jump ").map(|(_, chain)| chain)
    }
}

/// The node's own neighbour discovery and multicast-listener messages on a pod's veth. A link that
/// comes up sends its duplicate-address probes and first MLD reports from `::`, which `fib saddr
/// type local` does not call local, and conntrack leaves them untracked: without this rule they
/// reached the pod's ingress chain and counted as denied connections no pod made. Only the node
/// sends them at `output` (a pod's never pass there: they are link-local, not routed).
pub(super) const NODE_LINK_ICMPV6: &str = "icmpv6 type { nd-router-solicit, nd-router-advert, nd-neighbor-solicit, nd-neighbor-advert, mld-listener-query, mld-listener-report, mld-listener-done, mld2-listener-report } accept comment \"the node's neighbour discovery and multicast listener reports\"";

/// The first rule of the judging chains: replies of allowed connections pass before any jump.
pub(super) const ESTABLISHED: &str =
    "ct state established,related accept comment \"replies of allowed connections\"";

/// The `prerouting` chain: a pod's packets carry its own source (see the module docs). A pod's
/// own address is looked up first: every packet a pod sends then costs one set lookup (a packet
/// from elsewhere costs two; the IPv6 rule is skipped by its family check), where the veth test
/// first cost every pod packet two (issue 47, "Scale": new connections per second).
fn spoof_check() -> Vec<String> {
    [
        "iifname . ip saddr @pod_sources accept comment \"a pod's own IPv4 address\"".to_owned(),
        "iifname . ip6 saddr @pod_sources6 accept comment \"a pod's own IPv6 address\"".to_owned(),
        "iifname != @pod_veths accept comment \"not a local pod's veth\"".to_owned(),
        "ip6 saddr fe80::/10 accept comment \"IPv6 link-local: neighbour discovery\"".to_owned(),
        "ip6 saddr :: accept comment \"duplicate address detection\"".to_owned(),
        "meta nfproto ipv6 iifname != @pod_veths6 accept comment \"IPv6 of the pod not known to the node: not checked\"".to_owned(),
        format!(
            "counter name \"{SPOOFED}\" drop comment \"{}\"",
            comment("a source address that is not the pod's own")
        ),
    ]
    .into()
}

/// The sets and counter the base chains read, filled from `pods`' veths and addresses.
pub(super) fn add_pod_sets(out: &mut Ruleset, pods: &[LocalPod]) {
    let mut veths = Vec::new();
    let mut veths6 = Vec::new();
    let mut sources = Vec::new();
    let mut sources6 = Vec::new();
    for pod in pods {
        veths.push(format!("\"{}\"", pod.veth));
        for ip in &pod.ips {
            match ip {
                IpAddr::V4(a) => sources.push(format!("\"{}\" . {a}", pod.veth)),
                IpAddr::V6(a) => sources6.push(format!("\"{}\" . {a}", pod.veth)),
            }
        }
        if pod.ips.iter().any(IpAddr::is_ipv6) {
            veths6.push(format!("\"{}\"", pod.veth));
        }
    }
    for list in [&mut veths, &mut veths6, &mut sources, &mut sources6] {
        list.sort();
        list.dedup();
    }
    let hairpin = veths.iter().map(|v| format!("{v} . {v}")).collect();
    out.set("hairpin", "ifname . ifname", false, hairpin);
    out.set("pod_veths", "ifname", false, veths);
    out.set("pod_veths6", "ifname", false, veths6);
    out.set("pod_sources", "ifname . ipv4_addr", false, sources);
    out.set("pod_sources6", "ifname . ipv6_addr", false, sources6);
    for (name, key) in MAPS {
        out.maps.insert(
            name.to_owned(),
            Set {
                kind: format!("{key} : verdict"),
                interval: false,
                elements: Vec::new(),
            },
        );
    }
    out.counters.insert(
        SPOOFED.to_owned(),
        comment("packets from a pod's veth with a source not its own, dropped"),
    );
}

/// The packets `nft -j list counter inet eniipam_policy spoofed` counted.
pub fn spoofed_packets(json: &str) -> Result<u64, String> {
    let doc: serde_json::Value =
        serde_json::from_str(json).map_err(|e| format!("not JSON: {e}"))?;
    doc["nftables"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|i| &i["counter"])
        .find(|c| c["name"] == SPOOFED && c["table"] == TABLE)
        .and_then(|c| c["packets"].as_u64())
        .ok_or_else(|| format!("no counter {SPOOFED} of table inet {TABLE}"))
}
