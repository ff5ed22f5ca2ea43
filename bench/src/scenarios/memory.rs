//! Scenario `memory`: peak RSS of `eniipamd` (a subprocess configured by environment) with an
//! m5.24xlarge full of assignments, and of the plugin process per invocation.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use eniipam_api::{API_VERSION, pb};
use mockcloud::MockCloud;
use tokio::time::Instant;

use crate::Ctx;
use crate::report::{Anchor, Row, ScenarioReport, Target, Unit};
use crate::scenarios::ipam::{eniipam_plugin, host_local_plugin};
use crate::stats::AcrossRuns;
use crate::support::{self, TempDir};

pub const INSTANCE: &str = "m5.24xlarge";
const PLUGIN_INVOCATIONS: usize = 5;

/// Kills the daemon subprocess when dropped.
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_daemon(bin: &Path, mock: &MockCloud, dir: &Path) -> anyhow::Result<Daemon> {
    let inst = mock.default_instance();
    let log = std::fs::File::create(dir.join("eniipamd.log"))?;
    let child = Command::new(bin)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", dir)
        .env("AWS_ACCESS_KEY_ID", "BENCH")
        .env("AWS_SECRET_ACCESS_KEY", "bench")
        .env("AWS_CONFIG_FILE", dir.join("no-aws-config"))
        .env(
            "AWS_SHARED_CREDENTIALS_FILE",
            dir.join("no-aws-credentials"),
        )
        .env("ENIIPAM_CLUSTER_NAME", "bench")
        .env("ENIIPAM_SOCKET_PATH", dir.join("eniipam.sock"))
        .env("ENIIPAM_STATE_PATH", dir.join("state.db"))
        .env("ENIIPAM_METRICS_ADDR", "127.0.0.1:0")
        .env("ENIIPAM_CNI_CACHE_DIR", dir.join("daemon-cni-cache"))
        .env("ENIIPAM_REGION", "us-east-1")
        .env("ENIIPAM_EC2_ENDPOINT", mock.ec2_url())
        .env("ENIIPAM_IMDS_ENDPOINT", &inst.imds_url)
        .env("ENIIPAM_EC2_MUTATING_QPS", "100")
        .env("ENIIPAM_EC2_MUTATING_BURST", "100")
        .env("ENIIPAM_RECONCILE_PERIOD_SECS", "3600")
        // mockcloud's ENIs: no routing of them in the machine's namespace.
        .env("ENIIPAM_MANAGE_ENI_ROUTES", "false")
        // Released IPs reusable at once, so the churn at full occupancy can re-allocate.
        .env("ENIIPAM_REUSE_COOLDOWN_SECS", "0")
        .env("ENIIPAM_MAX_IDLE", "100")
        .env("ENIIPAM_LOG_FORMAT", "text")
        .env("ENIIPAM_LOG_LEVEL", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .with_context(|| format!("cannot run {}", bin.display()))?;
    Ok(Daemon(child))
}

/// Waits until the daemon answers Status ready.
async fn wait_ready(d: &mut Daemon, socket: &Path, dir: &Path) -> anyhow::Result<pb::StatusReply> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = d.0.try_wait()? {
            let log = std::fs::read_to_string(dir.join("eniipamd.log")).unwrap_or_default();
            bail!("eniipamd exited ({status}) before ready: {log}");
        }
        if socket.exists()
            && let Ok(mut c) = support::client(socket).await
            && let Ok(r) = c
                .status(pb::StatusRequest {
                    api_version: API_VERSION,
                })
                .await
            && r.get_ref().ready
        {
            return Ok(r.into_inner());
        }
        if Instant::now() > deadline {
            bail!("eniipamd not ready after 60 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

struct RunResult {
    ready_hwm_kib: u64,
    full_hwm_kib: u64,
    full_rss_kib: u64,
    plugin_kib: u64,
    host_local_kib: Option<u64>,
    filled: u32,
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

async fn one_run(r: usize, daemon_bin: &Path, plugin_bin: &Path) -> anyhow::Result<RunResult> {
    let dir = TempDir::new("memory")?;
    let mock = support::mock(INSTANCE, false).await?;
    let socket = dir.0.join("eniipam.sock");
    let mut d = spawn_daemon(daemon_bin, &mock, &dir.0)?;
    let pid = d.0.id();
    let status = wait_ready(&mut d, &socket, &dir.0).await?;
    let (ready_hwm_kib, _) = support::proc_rss_kib(pid)?;

    // The plugin, under the RSS wrapper: ADD and DEL a few times.
    let ours = eniipam_plugin(plugin_bin, &socket, &dir.0.join("cni-cache"));
    let theirs = host_local_plugin(&dir.0.join("host-local")).ok();
    let rss_file = dir.0.join("rss");
    let (plugin_kib, host_local_kib) = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
        let mut ours_max = 0;
        let mut theirs_max = None::<u64>;
        for i in 0..PLUGIN_INVOCATIONS {
            let c = format!("mem{r}-{i}");
            for cmd in ["ADD", "DEL"] {
                let run = ours.run_measured(cmd, &c, &rss_file)?;
                ours_max = ours_max.max(run.max_rss_kib.unwrap_or(0));
                if let Some(t) = &theirs {
                    let run = t.run_measured(cmd, &c, &rss_file)?;
                    theirs_max = Some(theirs_max.unwrap_or(0).max(run.max_rss_kib.unwrap_or(0)));
                }
            }
        }
        Ok((ours_max, theirs_max))
    })
    .await??;

    // Fill the node, then churn a little at full occupancy.
    let capacity = status.capacity;
    let (filled, err) = support::fill(&socket, "pod", capacity, 16).await?;
    anyhow::ensure!(
        filled == capacity,
        "filled {filled} of {capacity}: {}",
        err.unwrap_or_default()
    );
    let mut c = support::client(&socket).await?;
    for i in 0..64 {
        let id = format!("pod-{i}");
        c.release(support::release_req(&id)).await?;
    }
    let (refilled, _) = support::fill(&socket, "again", 64, 8).await?;
    let st = c
        .status(pb::StatusRequest {
            api_version: API_VERSION,
        })
        .await?
        .into_inner();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (full_hwm_kib, full_rss_kib) = support::proc_rss_kib(pid)?;
    eprintln!(
        "memory: run {}: {} assigned ({refilled} re-allocated after 64 releases), VmHWM {:.1} MiB",
        r + 1,
        st.assigned,
        mib(full_hwm_kib)
    );
    drop(d);
    Ok(RunResult {
        ready_hwm_kib,
        full_hwm_kib,
        full_rss_kib,
        plugin_kib,
        host_local_kib,
        filled,
    })
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<ScenarioReport> {
    let daemon_bin = support::sibling("eniipamd")?;
    let plugin_bin = support::sibling("eniipam")?;
    let mut runs = Vec::new();
    for r in 0..ctx.runs {
        runs.push(one_run(r, &daemon_bin, &plugin_bin).await?);
    }
    let across = |f: fn(&RunResult) -> f64| {
        AcrossRuns::of(&runs.iter().map(f).collect::<Vec<_>>()).context("no runs")
    };
    let host_local: Vec<f64> = runs
        .iter()
        .filter_map(|r| r.host_local_kib.map(mib))
        .collect();
    let plugin_anchor = match crate::stats::median(&host_local) {
        Some(v) => Anchor::Measured {
            name: "host-local".into(),
            value: v,
        },
        None => Anchor::None("host-local not installed".into()),
    };
    let filled = runs.first().map_or(0, |r| r.filled);
    let rows = vec![
        Row::new(
            format!("eniipamd peak RSS (VmHWM), {filled} assignments"),
            Unit::MiB,
            across(|r| mib(r.full_hwm_kib))?,
        )
        .anchor(Anchor::Reference {
            name: "AWS VPC CNI perf-CI failure threshold for aws-node".into(),
            value: 250.0,
        })
        .target(Target::AtMost(30.0)),
        Row::new(
            "eniipamd RSS at the end (VmRSS)",
            Unit::MiB,
            across(|r| mib(r.full_rss_kib))?,
        ),
        Row::new(
            "eniipamd peak RSS when ready, empty node",
            Unit::MiB,
            across(|r| mib(r.ready_hwm_kib))?,
        ),
        Row::new(
            "plugin peak RSS (max over ADD/DEL invocations)",
            Unit::MiB,
            across(|r| mib(r.plugin_kib))?,
        )
        .anchor(plugin_anchor)
        .target(Target::AtMost(10.0)),
    ];
    Ok(ScenarioReport {
        id: "memory",
        title: format!("peak RSS: eniipamd with a full {INSTANCE}, and the plugin"),
        reproduce: format!("cargo run --release -p eniipam-bench -- memory --runs {}", ctx.runs),
        setup: vec![
            format!(
                "each run: `target/release/eniipamd` as a subprocess configured only by `ENIIPAM_*` variables, against an in-process mockcloud (fast profile, {INSTANCE}); {filled} pods allocated over gRPC (the node's capacity: 14 ENIs × 49), then 64 released and 64 more allocated (reuse_cooldown 0, max_idle 100 so the released IPs stay); VmHWM and VmRSS read from /proc/<pid>/status"
            ),
            format!(
                "plugin: `target/release/eniipam` as IPAM plugin, {PLUGIN_INVOCATIONS} ADD + {PLUGIN_INVOCATIONS} DEL per run, each under `eniipam-bench __rusage`, a wrapper whose only child is the plugin and which reports `getrusage(RUSAGE_CHILDREN).ru_maxrss`; host-local measured the same way"
            ),
        ],
        rows,
        notes: vec![
            "The 250 MiB anchor is the AWS VPC CNI perf-CI threshold for aws-node (reference §7), a published limit, not a measurement of aws-node.".into(),
        ],
        plot_unit: "",
        series: vec![],
    })
}
