//! Scenario `wiring`: full pod ADD+DEL (veth pair, address, routes) through the main plugin in
//! network namespaces, versus Debian's `ptp` + `host-local` doing the same job in the same harness;
//! then a burst of 30 concurrent ADDs.
//!
//! Every plugin process runs inside a "node" network namespace of its own (spawned from a thread
//! that entered it with `setns(2)`), so nothing touches the machine's own interfaces, routes or rules; each pod
//! gets a namespace made by the harness before its ADD and removed after its DEL, as a runtime does.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, ensure};
use eniipam::daemon::DaemonHandle;
use eniipam_api::{API_VERSION, pb};
use mockcloud::MockCloud;
use serde_json::json;

use crate::Ctx;
use crate::cni::Plugin;
use crate::report::ScenarioReport;
use crate::stats::ms;
use crate::support::{self, TempDir};

mod namespaces;
mod phases;
mod report;

use namespaces::Node;
use phases::{BurstTimes, SeqTimes, run_burst, run_pairs};

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

fn eniipam_plugin(program: &Path, socket: &Path, cache: &Path) -> Plugin {
    Plugin::new(
        program,
        &json!({
            "cniVersion": "1.0.0",
            "name": NETWORK,
            "type": "eniipam",
            "socket": socket,
            "cache_dir": cache,
            "timeout_ms": 10000,
            "mtu": MTU,
        }),
        "",
    )
}

/// ptp + host-local, or why it cannot run.
fn ptp_plugin(data_dir: &Path) -> Result<Plugin, String> {
    Plugin::installed(&[PTP, HOST_LOCAL])?;
    Ok(Plugin::new(
        PTP,
        &json!({
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
        }),
        "",
    ))
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
    report::report(ctx, &e, &p, &theirs, &floors, ec2_calls, &snapshot)
}
