//! Scenario `wiring`: full pod ADD+DEL (veth pair, address, routes) through the main plugin in
//! network namespaces, versus Debian's `ptp` + `host-local` doing the same job in the same harness;
//! then a burst of 30 concurrent ADDs.
//!
//! Every plugin process runs inside a "node" network namespace of its own (spawned from a thread
//! that entered it with `setns(2)`), so nothing touches the machine's own interfaces, routes or rules; each pod
//! gets a namespace made by the harness before its ADD and removed after its DEL, as a runtime does.

use std::collections::HashSet;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use eniipam::daemon::DaemonHandle;
use eniipam::pool::{Pool, PoolSnapshot};
use eniipam_api::AttachmentKey;
use eniipam_api::{API_VERSION, pb};
use mockcloud::MockCloud;
use serde_json::{Value, json};

use crate::Ctx;
use crate::cni::{NodeNetns, Plugin};
use crate::report::{Anchor, Row, ScenarioReport, Series, Target, Unit};
use crate::stats::{AcrossRuns, median, percentile};
use crate::support::{self, TempDir};

/// Sequential ADD+DEL pairs per plugin per run.
pub const PAIRS: usize = 100;
/// Concurrent ADDs in the burst.
pub const BURST: usize = 30;
/// Invocations of each floor probe.
const FLOOR_N: usize = 200;
/// The warm pool: idle IPs kept, and the node's cap (so the pool never calls EC2 during the runs).
const POOL_IPS: u32 = 64;
/// The network name of both configurations.
const NETWORK: &str = "bench-wiring";
const PTP: &str = "/usr/lib/cni/ptp";
const HOST_LOCAL: &str = "/usr/lib/cni/host-local";
const MTU: u32 = 9001;
/// After namespaces are deleted the kernel tears them down on a workqueue; give it this long before
/// the next timed phase so the teardown does not run on the CPUs the next plugin is timed on.
const SETTLE: Duration = Duration::from_millis(300);

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn ip_binary() -> &'static str {
    ["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .unwrap_or("ip")
}

/// A named network namespace (`/var/run/netns/<name>`), deleted on drop, even on error.
struct Netns {
    name: String,
}

impl Netns {
    fn add(name: String) -> anyhow::Result<Self> {
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

    fn path(&self) -> String {
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
struct Node {
    ns: Netns,
    entry: NodeNetns,
}

impl Node {
    fn new(tag: &str) -> anyhow::Result<Self> {
        let ns = Netns::add(format!("eniipam-bench-{}-{tag}", std::process::id()))?;
        ns.ip(&["link", "set", "lo", "up"])?;
        ns.sh("echo 1 > /proc/sys/net/ipv4/ip_forward")?;
        host_rules(&ns)?;
        let entry = NodeNetns::open(Path::new(&ns.path()))?;
        Ok(Self { ns, entry })
    }

    /// After every DEL: no interface but lo, no route in the main table, only the three default
    /// rules. Anything else is wiring a DEL left behind.
    fn check_clean(&self, who: &str) -> anyhow::Result<()> {
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
fn pod_namespaces(tag: &str, n: usize) -> anyhow::Result<Vec<Netns>> {
    (0..n)
        .map(|i| Netns::add(format!("eniipam-bench-{}-{tag}-{i:03}", std::process::id())))
        .collect()
}

/// The IPv4 address (and prefix length) of the first entry of a result's `ips`.
fn result_ip(stdout: &str) -> anyhow::Result<(Ipv4Addr, u8)> {
    let v: Value = serde_json::from_str(stdout)
        .with_context(|| format!("the ADD result is not JSON: {stdout}"))?;
    let addr = v["ips"][0]["address"]
        .as_str()
        .with_context(|| format!("the ADD result has no ips[0].address: {stdout}"))?;
    let (ip, len) = addr
        .split_once('/')
        .with_context(|| format!("{addr} is not an address/prefix"))?;
    Ok((
        ip.parse().with_context(|| format!("{addr}: bad IPv4"))?,
        len.parse().with_context(|| format!("{addr}: bad prefix"))?,
    ))
}

/// The pod namespace has eth0 with `ip/len` and a default route.
fn check_pod(pod: &Netns, (ip, len): (Ipv4Addr, u8)) -> anyhow::Result<()> {
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

/// Per-invocation wall times of one sequential run, ms.
#[derive(Default)]
struct SeqTimes {
    add: Vec<f64>,
    del: Vec<f64>,
}

impl SeqTimes {
    fn all(&self) -> Vec<f64> {
        self.add.iter().chain(&self.del).copied().collect()
    }

    /// Each pod's ADD plus its DEL.
    fn pairs(&self) -> Vec<f64> {
        self.add.iter().zip(&self.del).map(|(a, d)| a + d).collect()
    }
}

/// `pairs` sequential ADD+DEL in fresh pod namespaces (made before, removed after, untimed); every
/// ADD is checked inside its pod.
fn run_pairs(plugin: &Plugin, node: &Node, tag: &str, pairs: usize) -> anyhow::Result<SeqTimes> {
    let pods = pod_namespaces(tag, pairs)?;
    let mut t = SeqTimes::default();
    for (i, pod) in pods.iter().enumerate() {
        let container = format!("w-{tag}-{i:03}");
        let netns = pod.path();
        let add = plugin.run_in("ADD", &container, &netns, &node.entry)?;
        check_pod(pod, result_ip(&add.stdout)?)?;
        t.add.push(ms(add.wall));
        let del = plugin.run_in("DEL", &container, &netns, &node.entry)?;
        t.del.push(ms(del.wall));
    }
    drop(pods);
    std::thread::sleep(SETTLE);
    Ok(t)
}

/// One concurrent wave: every invocation's wall time (spawn to exit, ms), the wave's span (first
/// spawn to last exit, ms) and the outputs, in pod order.
struct Wave {
    each: Vec<f64>,
    span: f64,
    stdout: Vec<String>,
}

/// Runs `command` for every pod at once: one thread per pod, released together by a barrier.
fn wave(
    plugin: &Plugin,
    node: &Node,
    command: &str,
    tag: &str,
    pods: &[Netns],
) -> anyhow::Result<Wave> {
    let barrier = Barrier::new(pods.len());
    let results: Vec<anyhow::Result<(Instant, Instant, crate::cni::Run)>> =
        std::thread::scope(|s| {
            let handles: Vec<_> = pods
                .iter()
                .enumerate()
                .map(|(i, pod)| {
                    let barrier = &barrier;
                    s.spawn(move || {
                        let container = format!("w-{tag}-{i:03}");
                        let netns = pod.path();
                        barrier.wait();
                        let start = Instant::now();
                        let run = plugin.run_in(command, &container, &netns, &node.entry)?;
                        Ok((start, Instant::now(), run))
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| bail!("a burst thread panicked"))
                })
                .collect()
        });
    let mut first = None::<Instant>;
    let mut last = None::<Instant>;
    let mut w = Wave {
        each: Vec::new(),
        span: 0.0,
        stdout: Vec::new(),
    };
    for r in results {
        let (start, end, run) = r?;
        first = Some(first.map_or(start, |f| f.min(start)));
        last = Some(last.map_or(end, |l| l.max(end)));
        w.each.push(ms(run.wall));
        w.stdout.push(run.stdout);
    }
    if let (Some(f), Some(l)) = (first, last) {
        w.span = ms(l - f);
    }
    Ok(w)
}

/// One burst's figures, ms.
struct BurstTimes {
    add: Vec<f64>,
    add_span: f64,
    del: Vec<f64>,
    del_span: f64,
}

/// Makes `BURST` pod namespaces, ADDs them all at once, checks each pod and that the addresses are
/// distinct (and, for eniipam, that the daemon holds exactly what each ADD printed), DELs them all at
/// once, removes the namespaces.
fn run_burst(
    plugin: &Plugin,
    node: &Node,
    tag: &str,
    daemon: Option<&Pool>,
) -> anyhow::Result<BurstTimes> {
    let pods = pod_namespaces(tag, BURST)?;
    let adds = wave(plugin, node, "ADD", tag, &pods)?;
    let mut seen = HashSet::new();
    for (i, (pod, out)) in pods.iter().zip(&adds.stdout).enumerate() {
        let addr = result_ip(out)?;
        check_pod(pod, addr)?;
        ensure!(
            seen.insert(addr.0),
            "burst {tag}: {} handed out twice",
            addr.0
        );
        if let Some(pool) = daemon {
            let key = AttachmentKey::new(format!("w-{tag}-{i:03}"), "eth0");
            let held = pool.allocation(&key).map(|a| a.ip);
            ensure!(
                held == Some(addr.0),
                "burst {tag}: the plugin printed {} for {key} but the daemon holds {held:?}",
                addr.0
            );
        }
    }
    let dels = wave(plugin, node, "DEL", tag, &pods)?;
    drop(pods);
    std::thread::sleep(SETTLE);
    Ok(BurstTimes {
        add: adds.each,
        add_span: adds.span,
        del: dels.each,
        del_span: dels.span,
    })
}

fn eniipam_plugin(program: &Path, socket: &Path, cache: &Path) -> Plugin {
    Plugin {
        program: program.to_owned(),
        config: json!({
            "cniVersion": "1.0.0",
            "name": NETWORK,
            "type": "eniipam",
            "socket": socket,
            "cache_dir": cache,
            "timeout_ms": 10000,
            "mtu": MTU,
        })
        .to_string()
        .into_bytes(),
        cni_path: "/usr/lib/cni".into(),
        netns: String::new(),
    }
}

/// ptp + host-local, or why it cannot run.
fn ptp_plugin(data_dir: &Path) -> Result<Plugin, String> {
    for bin in [PTP, HOST_LOCAL] {
        if !Path::new(bin).is_file() {
            return Err(format!(
                "{bin} not installed (apt-get install containernetworking-plugins)"
            ));
        }
    }
    Ok(Plugin {
        program: PTP.into(),
        config: json!({
            "cniVersion": "1.0.0",
            "name": NETWORK,
            "type": "ptp",
            "mtu": MTU,
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": "10.244.0.0/16"}]],
                "routes": [{"dst": "0.0.0.0/0"}],
                "dataDir": data_dir,
            },
        })
        .to_string()
        .into_bytes(),
        cni_path: "/usr/lib/cni".into(),
        netns: String::new(),
    })
}

/// Files in `dir` other than host-local's bookkeeping (`lock`, `last_reserved_ip.*`): addresses still
/// reserved, or (for eniipam's cache) entries still cached.
fn leftovers(dir: &Path) -> Vec<String> {
    match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n != "lock" && !n.starts_with("last_reserved_ip"))
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// The daemon holds no IP for any pod (asked over gRPC, as eniipamctl would).
async fn check_daemon_empty(socket: &Path, after: &str) -> anyhow::Result<()> {
    let mut c = support::client(socket).await?;
    let s = c
        .status(pb::StatusRequest {
            api_version: API_VERSION,
        })
        .await
        .map_err(|s| anyhow::anyhow!("Status: {:?} {}", s.code(), s.message()))?
        .into_inner();
    ensure!(
        s.assigned == 0,
        "after {after}: the daemon still holds {} assigned IPs (a DEL did not release)",
        s.assigned
    );
    Ok(())
}

/// What one plugin produced over all runs.
#[derive(Default)]
struct Side {
    seq: Vec<SeqTimes>,
    burst: Vec<BurstTimes>,
}

/// Which plugin a phase is for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Who {
    Ours,
    Theirs,
}

impl Who {
    fn name(self) -> &'static str {
        match self {
            Who::Ours => "eniipam",
            Who::Theirs => "ptp + host-local",
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Sequential,
    Burst,
}

/// The probes of the decomposition, ms.
#[derive(Default)]
struct Floors {
    /// `/bin/true`, this harness (a thread in the node's netns spawns it, waits).
    true_setns: Vec<f64>,
    /// `/bin/true` spawned from the calling thread, in the machine's namespace.
    true_spawn: Vec<f64>,
    /// `eniipam` answering VERSION (process start-up, no daemon call, no netlink), this harness.
    eniipam_version: Vec<f64>,
    /// `ptp` answering VERSION (Go runtime start-up), this harness.
    ptp_version: Vec<f64>,
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<ScenarioReport> {
    let plugin_bin = support::sibling("eniipam")?;
    let dir = TempDir::new("wiring")?;
    // Fail early and clearly when namespaces cannot be made (not root).
    drop(Node::new("probe")?);
    let mock = support::mock("c5.4xlarge", false).await?;
    let mut config = support::daemon_config(&mock, &dir.0);
    // The daemon must not touch the machine's routing: the plugin's rules and routes land in the node
    // namespace (the plugin runs there); the daemon's ENI route tables would land in the machine's.
    config.manage_eni_routes = false;
    // A warm pool that never calls EC2 during the runs: 64 idle IPs with the node capped at 64 (so the
    // burst taking 30 does not start a refill), released IPs reusable at once.
    config.min_idle = POOL_IPS;
    config.max_idle = POOL_IPS;
    config.max_ips = Some(POOL_IPS);
    config.reuse_cooldown_secs = 0;
    let d = support::start_daemon(config).await?;
    let result = measure(ctx, &d, &mock, &dir.0, &plugin_bin).await;
    d.shutdown().await;
    result
}

async fn measure(
    ctx: &Ctx,
    d: &DaemonHandle,
    mock: &MockCloud,
    dir: &Path,
    plugin_bin: &Path,
) -> anyhow::Result<ScenarioReport> {
    support::wait_idle(d, POOL_IPS, Duration::from_secs(30)).await?;
    let cache = dir.join("cni-cache");
    let host_local_dir = dir.join("host-local");
    let ours = eniipam_plugin(plugin_bin, &d.socket_path, &cache);
    let theirs = ptp_plugin(&host_local_dir);
    if let Err(why) = &theirs {
        eprintln!("NOTICE: wiring: anchor skipped: {why}");
    }
    let state_dirs: [(PathBuf, &str); 2] = [
        (cache.join(NETWORK), "eniipam's result cache"),
        (host_local_dir.join(NETWORK), "host-local's data dir"),
    ];

    // Warm-up (not recorded): binaries into the page cache, the daemon's paths exercised.
    {
        let node = Node::new("warm")?;
        let (o, t) = (ours.clone(), theirs.clone().ok());
        tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
            run_pairs(&o, &node, "we", 5)?;
            if let Some(t) = t {
                run_pairs(&t, &node, "wp", 5)?;
            }
            node.check_clean("warm-up")
        })
        .await??;
        check_daemon_empty(&d.socket_path, "the warm-up").await?;
    }
    mock.reset_counters();

    let mut e = Side::default();
    let mut p = Side::default();
    for r in 0..ctx.runs {
        let mut node = Some(Node::new(&format!("node{r}"))?);
        // Alternate which plugin goes first, so neither always runs right after the other's teardown.
        let order = if r % 2 == 0 {
            [Who::Ours, Who::Theirs]
        } else {
            [Who::Theirs, Who::Ours]
        };
        for phase in [Phase::Sequential, Phase::Burst] {
            for who in order {
                let plugin = match (who, &theirs) {
                    (Who::Ours, _) => ours.clone(),
                    (Who::Theirs, Ok(t)) => t.clone(),
                    (Who::Theirs, Err(_)) => continue,
                };
                let tag = format!(
                    "{}{r}{}",
                    if who == Who::Ours { 'e' } else { 'p' },
                    if phase == Phase::Sequential { 's' } else { 'b' }
                );
                let what = format!(
                    "run {r}, {}, {}",
                    who.name(),
                    if phase == Phase::Sequential {
                        "sequential pairs"
                    } else {
                        "burst"
                    }
                );
                let n = node.take().context("node namespace")?;
                let pool = (who == Who::Ours).then(|| d.pool.clone());
                let (n, out) = tokio::task::spawn_blocking(move || {
                    let out = match phase {
                        Phase::Sequential => {
                            run_pairs(&plugin, &n, &tag, PAIRS).map(|s| (Some(s), None))
                        }
                        Phase::Burst => {
                            run_burst(&plugin, &n, &tag, pool.as_ref()).map(|b| (None, Some(b)))
                        }
                    };
                    let out = out.and_then(|o| n.check_clean(&tag).map(|()| o));
                    (n, out)
                })
                .await?;
                node = Some(n);
                let (seq, burst) = out.with_context(|| what.clone())?;
                if who == Who::Ours {
                    check_daemon_empty(&d.socket_path, &what).await?;
                }
                for (dir, held) in &state_dirs {
                    let left = leftovers(dir);
                    ensure!(left.is_empty(), "after {what}: {held} still holds {left:?}");
                }
                let side = if who == Who::Ours { &mut e } else { &mut p };
                side.seq.extend(seq);
                side.burst.extend(burst);
            }
        }
        drop(node);
        eprintln!("wiring: run {}/{} done", r + 1, ctx.runs);
    }

    // Where the time goes.
    let floors = {
        let node = Node::new("floor")?;
        let o = ours.clone();
        let t = theirs.clone().ok();
        tokio::task::spawn_blocking(move || -> anyhow::Result<Floors> {
            let truth = Plugin {
                program: "/bin/true".into(),
                ..o.clone()
            };
            let netns = "/var/run/netns/none";
            let mut f = Floors::default();
            for i in 0..FLOOR_N {
                let c = format!("floor-{i}");
                f.true_setns
                    .push(ms(truth.run_in("ADD", &c, netns, &node.entry)?.wall));
                f.true_spawn.push(ms(truth.run("ADD", &c)?.wall));
                f.eniipam_version
                    .push(ms(o.run_in("VERSION", &c, netns, &node.entry)?.wall));
                if let Some(t) = &t {
                    f.ptp_version
                        .push(ms(t.run_in("VERSION", &c, netns, &node.entry)?.wall));
                }
            }
            Ok(f)
        })
        .await??
    };
    let ec2_calls = mock.counters().total_calls();
    let snapshot = d.pool.snapshot();
    report(ctx, &e, &p, &theirs, &floors, ec2_calls, &snapshot)
}

fn stat_of(runs: &[Vec<f64>], p: f64) -> Option<AcrossRuns> {
    AcrossRuns::of_runs(runs, |xs| {
        if p == 50.0 {
            median(xs)
        } else {
            percentile(xs, p)
        }
    })
}

fn report(
    ctx: &Ctx,
    e: &Side,
    p: &Side,
    theirs: &Result<Plugin, String>,
    floors: &Floors,
    ec2_calls: u64,
    snapshot: &PoolSnapshot,
) -> anyhow::Result<ScenarioReport> {
    let anchor_of = |v: Option<AcrossRuns>| match (v, theirs) {
        (Some(h), _) => Anchor::Measured {
            name: "ptp + host-local".into(),
            value: h.median,
        },
        (None, Err(why)) => Anchor::None(why.clone()),
        (None, Ok(_)) => Anchor::None("ptp + host-local: no runs".into()),
    };
    type Pick = fn(&Side) -> Vec<Vec<f64>>;
    let metrics: [(&str, Pick, f64, Unit, Target); 11] = [
        (
            "per invocation (ADD and DEL), p50",
            |s| s.seq.iter().map(SeqTimes::all).collect(),
            50.0,
            Unit::Ms,
            // Reported, not the target: ADDs and DELs are two modes, and this median falls between
            // them (see the notes). The target is one pod's ADD + DEL, below.
            Target::Info,
        ),
        (
            "ADD, p50",
            |s| s.seq.iter().map(|t| t.add.clone()).collect(),
            50.0,
            Unit::Ms,
            Target::RatioAtMost(0.7),
        ),
        (
            "ADD, p99",
            |s| s.seq.iter().map(|t| t.add.clone()).collect(),
            99.0,
            Unit::Ms,
            Target::Info,
        ),
        (
            "DEL, p50",
            |s| s.seq.iter().map(|t| t.del.clone()).collect(),
            50.0,
            Unit::Ms,
            // Not slower than the anchor's DEL.
            Target::RatioAtMost(1.0),
        ),
        (
            "DEL, p99",
            |s| s.seq.iter().map(|t| t.del.clone()).collect(),
            99.0,
            Unit::Ms,
            Target::Info,
        ),
        (
            "one pod's ADD + DEL (sum), p50",
            |s| s.seq.iter().map(SeqTimes::pairs).collect(),
            50.0,
            Unit::Ms,
            Target::RatioAtMost(0.7),
        ),
        (
            "burst of 30 concurrent ADDs: each ADD, p50",
            |s| s.burst.iter().map(|b| b.add.clone()).collect(),
            50.0,
            Unit::Ms,
            Target::Info,
        ),
        (
            "burst of 30 concurrent ADDs: each ADD, p99",
            |s| s.burst.iter().map(|b| b.add.clone()).collect(),
            99.0,
            Unit::Ms,
            Target::Info,
        ),
        (
            "burst of 30: all 30 wired (first spawn to last exit)",
            |s| s.burst.iter().map(|b| vec![b.add_span]).collect(),
            50.0,
            Unit::Ms,
            Target::Info,
        ),
        (
            "burst of 30 concurrent DELs: each DEL, p50",
            |s| s.burst.iter().map(|b| b.del.clone()).collect(),
            50.0,
            Unit::Ms,
            Target::Info,
        ),
        (
            "burst of 30: all 30 torn down (first spawn to last exit)",
            |s| s.burst.iter().map(|b| vec![b.del_span]).collect(),
            50.0,
            Unit::Ms,
            Target::Info,
        ),
    ];
    let mut rows = Vec::new();
    for (name, pick, pct, unit, target) in metrics {
        let ours = stat_of(&pick(e), pct).context("no runs")?;
        rows.push(
            Row::new(name, unit, ours)
                .anchor(anchor_of(stat_of(&pick(p), pct)))
                .target(target),
        );
    }
    let m = |xs: &[f64]| median(xs).unwrap_or(f64::NAN);
    rows.push(
        Row::single(
            "process start-up: the plugin answering VERSION, same harness, p50",
            Unit::Ms,
            m(&floors.eniipam_version),
        )
        .anchor(if floors.ptp_version.is_empty() {
            anchor_of(None)
        } else {
            Anchor::Measured {
                name: "ptp".into(),
                value: m(&floors.ptp_version),
            }
        }),
    );
    rows.push(Row::single(
        "floor: /bin/true, same harness (spawned in the node netns), p50",
        Unit::Ms,
        m(&floors.true_setns),
    ));
    rows.push(Row::single(
        "floor: /bin/true, spawned in the machine's netns, p50",
        Unit::Ms,
        m(&floors.true_spawn),
    ));

    let flat = |runs: &[SeqTimes]| runs.iter().flat_map(SeqTimes::all).collect::<Vec<f64>>();
    let flat_burst = |b: &[BurstTimes]| b.iter().flat_map(|b| b.add.clone()).collect::<Vec<f64>>();
    let mut series = vec![Series {
        label: "eniipam (main plugin), sequential ADD/DEL".into(),
        samples: flat(&e.seq),
    }];
    if !p.seq.is_empty() {
        series.push(Series {
            label: "ptp + host-local, sequential ADD/DEL".into(),
            samples: flat(&p.seq),
        });
    }
    series.push(Series {
        label: "eniipam, burst ADD".into(),
        samples: flat_burst(&e.burst),
    });
    if !p.burst.is_empty() {
        series.push(Series {
            label: "ptp + host-local, burst ADD".into(),
            samples: flat_burst(&p.burst),
        });
    }

    let ours_inv = rows[0].ours.median;
    let ours_add = rows[1].ours.median;
    let ours_del = rows[3].ours.median;
    let ev = m(&floors.eniipam_version);
    let mut notes = vec![format!(
        "Decomposition ({FLOOR_N} probes each, same harness): spawning /bin/true in the node netns and waiting for it costs {:.2} ms (in the machine's netns: {:.2} ms), eniipam answering VERSION {ev:.2} ms. So of eniipam's ADD median {ours_add:.2} ms about {:.2} ms is the gRPC Allocate plus the netlink wiring and the cache write, and of its DEL median {ours_del:.2} ms about {:.2} ms is the Release plus the teardown.",
        m(&floors.true_setns),
        m(&floors.true_spawn),
        ours_add - ev,
        ours_del - ev,
    )];
    notes.push(
        "A DEL is dominated by the kernel, for both plugins: deleting a veth (RTM_DELLINK) blocks in unregister_netdevice (synchronize_rcu_expedited, twice) and netdev_run_todo (rcu_barrier), 10 to 25 ms on the 2-CPU machine this scenario was written on (perf sched_switch stacks of an eniipam DEL; the same 15 to 20 ms sendto(2) in an strace of a ptp DEL). ADDs and DELs are thus two separate modes, and the per-invocation median of 100 ADDs and 100 DELs falls between the slowest ADDs and the fastest DELs; the ADD, DEL and per-pod sum rows are the steadier comparison.".into(),
    );
    notes.push(
        "eniipam's DEL overlaps its two slow steps: the pod end of the veth is deleted on a thread of its own while the main thread's Release round trip to the daemon is in flight; only the policy rules wait for the daemon's answer (a late DEL must not remove the rules of the IP's new owner). ptp + host-local's DEL runs host-local (a second Go process) and then deletes the veth, in sequence.".into(),
    );
    if let Anchor::Measured {
        value: theirs_inv, ..
    } = rows[0].anchor
    {
        let pv = m(&floors.ptp_version);
        notes.push(format!(
            "ptp + host-local is two processes per invocation (ptp execs host-local for the address), both Go binaries: ptp answering VERSION alone costs {pv:.2} ms here. The harness floor is {:.0} % of the anchor's per-invocation median ({theirs_inv:.2} ms) and {:.0} % of eniipam's ({ours_inv:.2} ms).",
            100.0 * m(&floors.true_setns) / theirs_inv,
            100.0 * m(&floors.true_setns) / ours_inv,
        ));
    }
    Ok(ScenarioReport {
        id: "wiring",
        title: "Full pod ADD+DEL with wiring in network namespaces, vs ptp + host-local".into(),
        reproduce: format!(
            "cargo run --release -p eniipam-bench -- wiring --runs {}",
            ctx.runs
        ),
        setup: vec![
            format!(
                "{} runs; per run and plugin: {PAIRS} sequential ADD+DEL pairs, then a burst of {BURST} concurrent ADDs (one thread per pod, released by a barrier) followed by {BURST} concurrent DELs; plugins alternate which goes first from run to run; wall time per invocation from spawn to exit, as a runtime sees it",
                ctx.runs
            ),
            "namespaces: per run a fresh \"node\" netns (lo up, ip_forward on) in which every plugin process is spawned (from a thread that entered it with setns(2); no `ip netns exec` in the timed path), so veths, routes and rules land there and the machine's own routing is never touched; per pod a fresh netns made by the harness, untimed: all of a phase's pod namespaces are made before its first ADD and removed after its last DEL, then 300 ms of settling, so the kernel's namespace teardown (RCU callbacks a veth deletion's rcu_barrier would wait for) stays out of the timed invocations (CNI_NETNS=/var/run/netns/<pod>, CNI_IFNAME=eth0, K8S_POD_NAME=<container id>)".into(),
            format!(
                "eniipam: `target/release/eniipam` (built as shipped: `crates/cni/build-plugin.sh`) as the main plugin (`\"type\": \"eniipam\"`, mtu {MTU}: veth pair, pod /32 with default via 169.254.1.1, host /32 route and the ENI table's policy rules) talking gRPC to a real in-process eniipamd on mockcloud (fast profile, c5.4xlarge), every Allocate/Release committed to SQLite before the reply; manage_eni_routes off, eniipamd's default SNAT and NodePort rules (nftables table ip eniipam, rule 1024) loaded in every node netns"
            ),
            format!(
                "warm pool: min_idle = max_idle = max_ips = {POOL_IPS}, reuse_cooldown 0, so neither the pairs nor the burst ever waits on (or triggers) EC2; EC2 calls during the runs: {ec2_calls}; at the end the pool held {} idle, {} assigned",
                snapshot.idle, snapshot.assigned
            ),
            format!(
                "anchor: Debian's `{PTP}` (containernetworking-plugins) with `\"ipam\": {{\"type\": \"host-local\"}}` (10.244.0.0/16, a default route, its own dataDir), mtu {MTU}, CNI_PATH=/usr/lib/cni, same harness, same node and pod namespace handling"
            ),
            "checked in every run: each ADD's printed address is on the pod's eth0 with a default route; the burst's 30 addresses are distinct and (eniipam) exactly what the daemon holds; after each phase the node netns has no interface but lo, no route and only the default rules, the daemon reports 0 assigned IPs over gRPC Status, eniipam's result cache and host-local's data dir hold nothing".into(),
        ],
        rows,
        notes,
        plot_unit: "ms per invocation",
        series,
    })
}
