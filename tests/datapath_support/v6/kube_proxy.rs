//! An emulated kube-proxy (iptables mode) for both families: NodePort services written as
//! kube-proxy writes them into the nat table of `iptables` (IPv4) and `ip6tables` (IPv6), with
//! either external traffic policy. [`Daemon::add_node_port`] in the parent module is the IPv4,
//! `Local`-only original the IPv4 matrix uses.

use std::net::{IpAddr, SocketAddr};
use std::process::Stdio;

use tokio::io::AsyncWriteExt;
use tokio::process::Command;

use crate::datapath_support::{Daemon, ECHO_PORT, PATH};

/// A service's `externalTrafficPolicy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TrafficPolicy {
    /// Endpoints on this node only, the client's address kept (no masquerade).
    Local,
    /// Any endpoint, in the cluster: kube-proxy marks the connection and masquerades it to the
    /// node's address, so the endpoint's reply comes back through this node to be un-DNATed.
    Cluster,
}

/// One NodePort service with one endpoint (`endpoint:ECHO_PORT`).
#[derive(Clone, Copy, Debug)]
pub struct NodePortService {
    pub node_port: u16,
    pub endpoint: IpAddr,
    pub policy: TrafficPolicy,
}

/// The nat table's rules for `services` (all of one family), as one `*-restore --noflush` input:
/// kube-proxy's KUBE-SERVICES → KUBE-NODEPORTS → KUBE-EXT → KUBE-SEP chains, and its
/// KUBE-MARK-MASQ / KUBE-POSTROUTING masquerade (mark 0x4000) for `Cluster` services.
fn nat_rules(services: &[NodePortService]) -> String {
    let mut chains = vec![
        "KUBE-SERVICES".to_owned(),
        "KUBE-NODEPORTS".to_owned(),
        "KUBE-MARK-MASQ".to_owned(),
        "KUBE-POSTROUTING".to_owned(),
    ];
    let mut rules = vec![
        "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES"
            .to_owned(),
        "-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING"
            .to_owned(),
        "-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS".to_owned(),
        "-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000".to_owned(),
        "-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN".to_owned(),
        "-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0".to_owned(),
        "-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully".to_owned(),
    ];
    for (i, s) in services.iter().enumerate() {
        let (ext, sep) = (
            format!("KUBE-EXT-DATAPATH{i}"),
            format!("KUBE-SEP-DATAPATH{i}"),
        );
        let comment = format!("-m comment --comment \"default/echo-{i}\"");
        let to = SocketAddr::new(s.endpoint, ECHO_PORT);
        rules.push(format!(
            "-A KUBE-NODEPORTS -p tcp {comment} -m tcp --dport {} -j {ext}",
            s.node_port
        ));
        if s.policy == TrafficPolicy::Cluster {
            rules.push(format!(
                "-A {ext} {comment} -m comment --comment \"masquerade traffic for default/echo-{i} external destinations\" -j KUBE-MARK-MASQ"
            ));
        }
        rules.push(format!("-A {ext} {comment} -j {sep}"));
        rules.push(format!(
            "-A {sep} -p tcp {comment} -m tcp -j DNAT --to-destination {to}"
        ));
        chains.extend([ext, sep]);
    }
    let mut text = "*nat\n".to_owned();
    for c in &chains {
        text.push_str(&format!(":{c} - [0:0]\n"));
    }
    for r in &rules {
        text.push_str(r);
        text.push('\n');
    }
    text.push_str("COMMIT\n");
    text
}

impl Daemon {
    /// Adds kube-proxy's NodePort rules for `services` in the node, IPv4 endpoints with
    /// `iptables-restore`, IPv6 ones with `ip6tables-restore`. Call it once per node: as with
    /// kube-proxy's own restores, declaring a chain again flushes it.
    pub async fn add_node_ports(&self, services: &[NodePortService]) {
        let (v4, v6): (Vec<NodePortService>, Vec<NodePortService>) =
            services.iter().partition(|s| s.endpoint.is_ipv4());
        for (tool, list) in [("iptables-restore", v4), ("ip6tables-restore", v6)] {
            if list.is_empty() {
                continue;
            }
            let rules = nat_rules(&list);
            let mut child = Command::new("nsenter")
                .arg(format!("--net={}", self.ns.path().display()))
                .args(["--", tool, "--noflush"])
                .env_clear()
                .env("PATH", PATH)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| panic!("{tool}: {e}"));
            let mut stdin = child.stdin.take().expect("stdin");
            stdin.write_all(rules.as_bytes()).await.expect("stdin");
            drop(stdin);
            let out = child.wait_with_output().await.expect(tool);
            assert!(
                out.status.success(),
                "{tool}: {}\n{rules}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}
