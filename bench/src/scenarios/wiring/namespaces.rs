//! The harness's network namespaces: named ones made with `ip netns` and deleted on drop, the
//! "node" every plugin process is spawned in (with eniipamd's host rules loaded) and its cleanliness
//! check after DEL, and the check of a pod's namespace after ADD.

use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;

use anyhow::{Context, bail, ensure};

use crate::cni::NodeNetns;

fn ip_binary() -> &'static str {
    ["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .unwrap_or("ip")
}

/// A named network namespace (`/var/run/netns/<name>`), deleted on drop, even on error.
pub(super) struct Netns {
    name: String,
}

impl Netns {
    pub(super) fn add(name: String) -> anyhow::Result<Self> {
        let out = Command::new(ip_binary())
            .args(["netns", "add", &name])
            .output()
            .context("cannot run `ip` (install iproute2)")?;
        if !out.status.success() {
            bail!(
                "`ip netns add {name}` failed ({}): {}; scenario `wiring` creates network namespaces and must run as root (CAP_SYS_ADMIN)",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(Self { name })
    }

    pub(super) fn path(&self) -> String {
        format!("/var/run/netns/{}", self.name)
    }

    /// `ip -n <name> <args>`; stdout.
    fn ip(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = Command::new(ip_binary())
            .args(["-n", &self.name])
            .args(args)
            .output()
            .context("cannot run `ip`")?;
        if !out.status.success() {
            bail!(
                "`ip -n {} {}` failed: {}",
                self.name,
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Runs a shell command inside the namespace (set-up only: `ip netns exec` adds processes).
    fn sh(&self, script: &str) -> anyhow::Result<()> {
        let out = Command::new(ip_binary())
            .args(["netns", "exec", &self.name, "sh", "-c", script])
            .output()
            .context("cannot run `ip netns exec`")?;
        ensure!(
            out.status.success(),
            "`{script}` in {}: {}",
            self.name,
            String::from_utf8_lossy(&out.stderr).trim()
        );
        Ok(())
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new(ip_binary())
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// A node namespace: loopback up, IPv4 forwarding on, opened for the plugins to enter.
pub(super) struct Node {
    ns: Netns,
    pub(super) entry: NodeNetns,
}

impl Node {
    pub(super) fn new(tag: &str) -> anyhow::Result<Self> {
        let ns = Netns::add(format!("eniipam-bench-{}-{tag}", std::process::id()))?;
        ns.ip(&["link", "set", "lo", "up"])?;
        ns.sh("echo 1 > /proc/sys/net/ipv4/ip_forward")?;
        host_rules(&ns)?;
        let entry = NodeNetns::open(Path::new(&ns.path()))?;
        Ok(Self { ns, entry })
    }

    /// After every DEL: no interface but lo, no route in the main table, only the three default
    /// rules. Anything else is wiring a DEL left behind.
    pub(super) fn check_clean(&self, who: &str) -> anyhow::Result<()> {
        let links = self.ns.ip(&["-o", "link", "show"])?;
        let extra: Vec<&str> = links
            .lines()
            .filter_map(|l| l.split(':').nth(1).map(str::trim))
            .filter(|name| *name != "lo")
            .collect();
        ensure!(
            extra.is_empty(),
            "{who}: interfaces left in the node namespace after DEL: {extra:?}"
        );
        let routes = self.ns.ip(&["-4", "route", "show"])?;
        ensure!(
            routes.trim().is_empty(),
            "{who}: routes left in the node namespace after DEL:\n{routes}"
        );
        let rules = self.ns.ip(&["-4", "rule", "show"])?;
        ensure!(
            rules.lines().count() == 4,
            "{who}: policy rules left in the node namespace after DEL (expected the 3 default ones and eniipamd's fwmark rule):\n{rules}"
        );
        Ok(())
    }
}

/// The SNAT and NodePort rules eniipamd keeps on a node with its defaults (nftables table `ip
/// eniipam`, rule `1024: fwmark 0x80/0x80 lookup main`), loaded into the node namespace as the daemon
/// loads them, so the wiring is measured with them in place (the in-process daemon runs in the
/// machine's namespace with `manage_eni_routes` off and must not install them there).
fn host_rules(ns: &Netns) -> anyhow::Result<()> {
    use eniipam::host::{HostRulesConfig, PrimaryInterface, desired_table};
    let table = desired_table(
        &HostRulesConfig::default(),
        &PrimaryInterface {
            ifname: "eth0".into(),
            primary_ip: Ipv4Addr::new(10, 0, 0, 4),
            vpc_cidrs: vec!["10.0.0.0/16".parse()?],
        },
    )
    .context("the default config wants host rules")?;
    let script = table.replace_script()?;
    ns.sh(&format!("nft -f - <<'EOF'\n{script}EOF"))
        .context("loading eniipamd's host rules (needs `nft`, package nftables)")?;
    ns.ip(&[
        "rule",
        "add",
        "priority",
        "1024",
        "fwmark",
        "0x80/0x80",
        "lookup",
        "main",
    ])?;
    Ok(())
}

/// `n` pod namespaces named after `tag`.
pub(super) fn pod_namespaces(tag: &str, n: usize) -> anyhow::Result<Vec<Netns>> {
    (0..n)
        .map(|i| Netns::add(format!("eniipam-bench-{}-{tag}-{i:03}", std::process::id())))
        .collect()
}

/// The pod namespace has eth0 with `ip/len` and a default route.
pub(super) fn check_pod(pod: &Netns, (ip, len): (Ipv4Addr, u8)) -> anyhow::Result<()> {
    let addrs = pod.ip(&["-o", "-4", "addr", "show", "dev", "eth0"])?;
    ensure!(
        addrs.contains(&format!("inet {ip}/{len} ")),
        "{}: eth0 does not carry {ip}/{len}: {addrs}",
        pod.name
    );
    let routes = pod.ip(&["-4", "route", "show", "default"])?;
    ensure!(
        routes.contains("default via"),
        "{}: no default route: {routes}",
        pod.name
    );
    Ok(())
}
