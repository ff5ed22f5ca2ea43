//! Issue 7: `eniipamd --simulate` as a subprocess; `eniipamctl status --json` and `/metrics` agree with
//! the pool; SIGTERM ends it cleanly with exit 0; bad flags and knobs are refused by name.
//!
//! Issue 45: a loaded machine cannot fail these. The subprocess tests wait on events (a line
//! printed, a metric or the pool reaching a value), with [`HANG_GUARD`] only against a hang; the
//! one that needs a minute of churn runs the simulation in-process on tokio's paused clock.

mod bins;
#[path = "daemon_support/mod.rs"]
mod daemon_support;

use std::process::Stdio;
use std::time::Duration;

use daemon_support::*;
use tokio::io::{AsyncBufReadExt, BufReader};

/// How long any one awaited event may take before the test calls it a hang: generous, since a
/// loaded machine may be slow; it never decides an outcome.
const HANG_GUARD: Duration = Duration::from_secs(120);

struct Sim {
    child: tokio::process::Child,
    socket: String,
    metrics: String,
    /// What eniipamd prints on stdout after where it serves (read on, so it never blocks).
    lines: tokio::sync::mpsc::UnboundedReceiver<String>,
    _dir: TempDir,
}

async fn start_sim(extra: &[&str]) -> Sim {
    start_sim_env(extra, &[]).await
}

async fn start_sim_env(extra: &[&str], env: &[(&str, &str)]) -> Sim {
    let dir = TempDir::new("sim");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_eniipamd"))
        .args(["--simulate", "--profile", "fast", "--state-dir"])
        .arg(&dir.0)
        .args(extra)
        .envs(env.iter().copied())
        .env("ENIIPAM_LOG_LEVEL", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let (mut socket, mut metrics) = (String::new(), String::new());
    while socket.is_empty() || metrics.is_empty() {
        let line = tokio::time::timeout(HANG_GUARD, lines.next_line())
            .await
            .expect("eniipamd prints where it serves")
            .unwrap()
            .expect("eniipamd exited early");
        if let Some(s) = line.trim().strip_prefix("socket:") {
            socket = s.trim().to_owned();
        }
        if let Some(m) = line.trim().strip_prefix("metrics:") {
            metrics = m.trim().to_owned();
        }
    }
    // Keep draining stdout so status lines never block the daemon.
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok(Some(l)) = lines.next_line().await {
            let _ = tx.send(l);
        }
    });
    Sim {
        child,
        socket,
        metrics,
        lines: rx,
        _dir: dir,
    }
}

/// SIGTERM, and its exit status (within [`HANG_GUARD`]).
async fn sigterm_and_wait(sim: &mut Sim) -> std::process::ExitStatus {
    let pid = sim.child.id().unwrap() as i32;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    tokio::time::timeout(HANG_GUARD, sim.child.wait())
        .await
        .expect("eniipamd ends on SIGTERM")
        .unwrap()
}

fn ctl(args: &[&str]) -> std::process::Output {
    std::process::Command::new(bins::target_bin("eniipamctl"))
        .args(args)
        .output()
        .unwrap()
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("metric {name} missing"))
        .trim()
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulate_status_metrics_and_sigterm() {
    let mut sim = start_sim(&["--instance-type", "c5.4xlarge"]).await;
    let http = reqwest::Client::new();
    let base = sim.metrics.trim_end_matches("/metrics").to_owned();
    assert_eq!(
        http.get(format!("{base}/readyz"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        http.get(format!("{base}/healthz"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );

    // Five pods through the real gRPC API.
    let mut c = client(std::path::Path::new(&sim.socket)).await;
    for i in 0..5 {
        c.allocate(alloc_req(&format!("c{i}"), &format!("p{i}")))
            .await
            .unwrap();
    }
    c.release(release_req("c4", false)).await.unwrap();

    let out = ctl(&["--socket", &sim.socket, "status", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let text = http
        .get(&sim.metrics)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(status["instance_type"], "c5.4xlarge");
    assert_eq!(status["ready"], true);
    assert_eq!(status["assigned"], 4);
    assert_eq!(
        status["capacity"],
        8 * 29 * 16,
        "c5.4xlarge: 8 ENIs (eth0 included) x 29 slots (the VPC CNI's max-pods 234 - 2), each a /28 \
         with burst prefixes"
    );
    assert_eq!(metric(&text, "eniipam_assigned_ip_addresses"), 4.0);
    assert_eq!(
        metric(&text, "eniipam_ip_max"),
        status["capacity"].as_f64().unwrap()
    );
    assert_eq!(
        metric(&text, "eniipam_eni_allocated"),
        status["enis"].as_array().unwrap().len() as f64
    );
    assert_eq!(
        metric(&text, "eniipam_add_ip_req_total{outcome=\"ok\"}"),
        5.0
    );
    assert_eq!(
        metric(&text, "eniipam_del_ip_req_total{outcome=\"ok\"}"),
        1.0
    );
    assert_eq!(
        metric(&text, "eniipam_cooling_ip_addresses"),
        status["cooling"].as_f64().unwrap()
    );
    assert_eq!(metric(&text, "eniipam_ready"), 1.0);
    // The first pods are served from eth0's secondary IPs: an assign, no new ENI.
    assert!(text.contains(
        "eniipam_aws_api_latency_seconds_count{api=\"AssignPrivateIpAddresses\",outcome=\"ok\"}"
    ));
    // EC2 calls by purpose: node discovery and the rebuild are the startup's; the pods were served
    // by calls made for them or by warm-ups they waited for (an acquire waits for warm IPs already
    // on the wire rather than make a call of its own).
    assert!(text.contains("eniipam_ec2_calls_total{purpose=\"startup\",api=\"DescribeInstances\""));
    assert!(
        text.contains("eniipam_ec2_calls_total{purpose=\"pod\"")
            || text.contains(
                "eniipam_ec2_calls_total{purpose=\"refill\",api=\"AssignPrivateIpAddresses\""
            ),
        "{text}"
    );
    assert!(text.trim_end().ends_with("# EOF"));
    let allocs = ctl(&["--socket", &sim.socket, "allocations", "--json"]);
    let allocs: Vec<serde_json::Value> = serde_json::from_slice(&allocs.stdout).unwrap();
    assert_eq!(allocs.len(), 4);
    let enis = ctl(&["--socket", &sim.socket, "enis"]);
    assert!(String::from_utf8_lossy(&enis.stdout).contains("DEV"));
    assert!(ctl(&["--socket", &sim.socket, "health"]).status.success());

    // SIGTERM: clean exit 0, socket removed.
    let status = sigterm_and_wait(&mut sim).await;
    assert!(status.success(), "exit status {status}");
    assert!(!std::path::Path::new(&sim.socket).exists());
    // With the daemon gone, eniipamctl says so clearly.
    let out = ctl(&["--socket", &sim.socket, "status"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is eniipamd running"));
}

/// Issue 15: on an m5.large the daemon serves the VPC CNI's pods per node: 27 pod IPs with secondary
/// IPs (`burst_prefixes` off: max-pods 29 − 2 host-network pods, eth0 included), and with burst
/// prefixes (the default) or prefix delegation the kubelet's 110 pods, all handed out, each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulate_m5_large_serves_the_vpc_cnis_pods_per_node() {
    for (env, pods, min_capacity) in [
        (vec![("ENIIPAM_BURST_PREFIXES", "false")], 27, 27),
        (vec![], 110, 110),
        (vec![("ENIIPAM_PREFIX_DELEGATION", "true")], 110, 110),
    ] {
        let mut sim = start_sim_env(&["--instance-type", "m5.large"], &env).await;
        let mut c = client(std::path::Path::new(&sim.socket)).await;
        let allocs = (0..pods).map(|i| {
            let mut c = c.clone();
            async move {
                c.allocate(alloc_req(&format!("c{i}"), &format!("p{i}")))
                    .await
                    .map(|r| r.into_inner().ip)
            }
        });
        let ips: Vec<String> = futures::future::join_all(allocs)
            .await
            .into_iter()
            .map(|r| r.unwrap_or_else(|e| panic!("{env:?}: {e}")))
            .collect();
        let distinct: std::collections::BTreeSet<&String> = ips.iter().collect();
        assert_eq!(distinct.len(), pods, "{env:?}: every pod its own IP");
        let out = ctl(&["--socket", &sim.socket, "status", "--json"]);
        let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(
            status["capacity"].as_u64().unwrap() >= min_capacity,
            "{env:?}: {status}"
        );
        assert_eq!(status["assigned"], pods as u64);
        if pods == 27 {
            // One more has no room: refused with a clear reason, nothing changes.
            let err = c
                .allocate(alloc_req("one-more", "one-more"))
                .await
                .unwrap_err();
            assert!(err.message().contains("all 27 IP slots"), "{err:?}");
        }
        sigterm_and_wait(&mut sim).await;
    }
}

/// `eniipamctl status --json` of a running simulation.
fn status(sim: &Sim) -> serde_json::Value {
    let out = ctl(&["--socket", &sim.socket, "status", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Allocate requests by outcome, from the `/metrics` at `url`.
async fn add_outcomes(url: &str) -> std::collections::BTreeMap<String, f64> {
    let text = reqwest::get(url).await.unwrap().text().await.unwrap();
    text.lines()
        .filter_map(|l| l.strip_prefix("eniipam_add_ip_req_total{outcome=\""))
        .filter_map(|l| l.split_once("\"} "))
        .map(|(o, v)| (o.to_owned(), v.trim().parse().unwrap()))
        .collect()
}

/// What the README's churn test reads of the pool: the `Introspect.Pool` reply `eniipamctl status
/// --json` prints, as that JSON.
async fn pool_status(socket: &std::path::Path) -> serde_json::Value {
    let p = eniipam::rpc::pb::introspect_client::IntrospectClient::new(
        eniipam::rpc::connect(socket).await.expect("connect"),
    )
    .pool(eniipam::rpc::pb::PoolRequest {})
    .await
    .expect("Introspect.Pool")
    .into_inner();
    serde_json::json!({
        "capacity": p.capacity, "max_idle": p.max_idle, "idle": p.idle, "assigned": p.assigned,
        "cooling": p.cooling, "exhausted": p.exhausted, "invariant_error": p.invariant_error,
        "enis": p.enis.len(),
    })
}

/// Runs `scenario` on simulated time: a `current_thread` runtime with a paused clock on its own
/// thread (the SDK's futures are deep: a big stack, as the fleet bench gives them), with the store's
/// disk waits holding the clock. The clock moves only when nothing is runnable, so the scenario's
/// seconds are the daemon's, however loaded the machine is.
fn on_simulated_time<F: std::future::Future<Output = ()>>(
    scenario: impl FnOnce() -> F + Send + 'static,
) {
    eniipam::store::hold_the_clock_on_disk_waits(true);
    std::thread::Builder::new()
        .stack_size(32 << 20)
        .spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .start_paused(true)
                .build()
                .unwrap()
                .block_on(scenario())
        })
        .unwrap()
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p));
}

/// The README's first command, `--churn 1` on the default node (an m5.4xlarge: 232 slots), does what
/// the README says a healthy node looks like: every ADD succeeds, never EXHAUSTED, the pool settles
/// on eth0 and one secondary ENI with about 17 pods alive (1/s × 5-30 s lifetimes), the released IPs
/// cooling for 30 s and a few idle, and the accounting holds throughout. The simulation `eniipamd
/// --simulate --profile fast --churn 1` runs (embedded mockcloud, daemon, synthetic pods over gRPC),
/// in-process on simulated time (issue 45: on real time a loaded machine served fewer pods in the
/// window and the figures drifted; it took 76 s). The cooling count is the releases of the last 30 s,
/// and releases reach their steady rate only once the first pods' longest lifetime (30 s) has passed,
/// so cooling levels off after 30 + 30 = 60 s (at 35 s its expectation is only 17.5). This test
/// samples from 60 s to 76 s and judges the medians; single samples only have to stay inside the
/// loose bounds. `the_readme_churn_command_starts_its_churn` checks the command line itself.
#[test]
fn the_readme_churn_settles_as_promised() {
    on_simulated_time(|| async {
        let dir = TempDir::new("sim-churn");
        let env: std::collections::BTreeMap<String, String> =
            [("ENIIPAM_LOG_LEVEL".to_owned(), "warn".to_owned())].into();
        let sim = eniipam::simulate::Simulation::start(eniipam::simulate::SimulationOptions {
            instance_type: eniipam::simulate::DEFAULT_INSTANCE_TYPE.to_owned(),
            state_dir: dir.0.clone(),
            metrics_addr: "127.0.0.1:0".parse().unwrap(),
            profile: "fast".to_owned(),
            base: eniipam::config::DaemonConfig::load(None, &env).unwrap(),
        })
        .await
        .expect("the simulation starts");
        let socket = sim.daemon.socket_path.clone();
        let churn = eniipam::simulate::spawn_churn(socket.clone(), sim.cni_cache_dir.clone(), 1.0);
        let started = tokio::time::Instant::now();
        let (mut assigned, mut cooled) = (Vec::new(), Vec::new());
        while started.elapsed() < Duration::from_secs(76) {
            tokio::time::sleep(Duration::from_secs(2)).await;
            let st = pool_status(&socket).await;
            assert_eq!(
                st["exhausted"], false,
                "EXHAUSTED under the README's churn: {st}"
            );
            assert_eq!(st["invariant_error"], "", "{st}");
            // Burst prefixes (the default on this Nitro type): each of the 232 slots counts as a
            // /28, and eth0's /28s hold the churn.
            assert_eq!(st["capacity"], 232 * 16, "{st}");
            let enis = st["enis"].as_u64().unwrap();
            assert_eq!(enis, 1, "the churn needs eth0 alone, not {enis} ENIs: {st}");
            if started.elapsed() >= Duration::from_secs(60) {
                let a = st["assigned"].as_u64().unwrap();
                let cooling = st["cooling"].as_u64().unwrap();
                let idle = st["idle"].as_u64().unwrap();
                // Steady state: ~17.5 pods alive (sd ~2), ~30 released IPs cooling, up to max_idle idle.
                assert!((8..=28).contains(&a), "assigned {a} (README: 15-21): {st}");
                assert!(
                    (10..=50).contains(&cooling),
                    "cooling {cooling} (README: 25-35): {st}"
                );
                // A /28 goes back to EC2 whole: up to 15 idle addresses of a partly used one
                // may sit beyond max_idle.
                assert!(
                    idle <= st["max_idle"].as_u64().unwrap().max(3) + 15,
                    "idle {idle} above max_idle and a /28's remainder: {st}"
                );
                assigned.push(a);
                cooled.push(cooling);
            }
        }
        cooled.sort_unstable();
        let median = cooled[cooled.len() / 2];
        assert!(
            (20..=40).contains(&median),
            "median cooling {median} over the last 16 s (README: 25-35): {cooled:?}"
        );
        assigned.sort_unstable();
        let median = assigned[assigned.len() / 2];
        assert!(
            (13..=23).contains(&median),
            "median assigned {median} over the last 16 s (README: 15-21): {assigned:?}"
        );
        let outcomes = add_outcomes(&format!("http://{}/metrics", sim.daemon.metrics_addr)).await;
        let ok = outcomes.get("ok").copied().unwrap_or(0.0);
        assert!(ok >= 70.0, "one ADD per second: {outcomes:?}");
        assert_eq!(
            outcomes.values().sum::<f64>(),
            ok,
            "every ADD of the README's churn succeeds: {outcomes:?}"
        );
        churn.abort();
        sim.daemon.shutdown().await;
    });
}

/// The README's first command line, `eniipamd --simulate --churn 1` on the default node: accepted
/// (the node holds it), says it settles into a steady state, and its synthetic pods get IPs. Waits
/// on those events only; how the churn settles is `the_readme_churn_settles_as_promised`'s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_churn_command_starts_its_churn() {
    let mut sim = start_sim(&["--churn", "1"]).await;
    let said = tokio::time::timeout(HANG_GUARD, async {
        while let Some(line) = sim.lines.recv().await {
            if line.trim_start().starts_with("churn:") {
                return line;
            }
        }
        panic!("eniipamd exited without describing its churn");
    })
    .await
    .expect("eniipamd describes its churn");
    assert!(said.contains("settles into a steady state"), "{said}");
    let mut outcomes = add_outcomes(&sim.metrics).await;
    let deadline = tokio::time::Instant::now() + HANG_GUARD;
    while outcomes.get("ok").copied().unwrap_or(0.0) < 2.0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no churn pod got an IP: {outcomes:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        outcomes = add_outcomes(&sim.metrics).await;
    }
    assert_eq!(
        outcomes.values().sum::<f64>(),
        outcomes["ok"],
        "{outcomes:?}"
    );
    sigterm_and_wait(&mut sim).await;
}

/// The README's way to watch a node run out: `--instance-type m4.large --exhaust` (a Xen type, so
/// single secondary IPs: 18 slots). The
/// node fills to its capacity and no further, says EXHAUSTED with a reason, refuses the excess ADDs
/// as retryable (gRPC RESOURCE_EXHAUSTED, the plugin's CNI error 11), and hands no IP out twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_node_says_so_and_hands_out_nothing_twice() {
    // 50 pods/s outgrow any node within seconds: --exhaust asks for it.
    let sim = start_sim(&["--instance-type", "m4.large", "--churn", "50", "--exhaust"]).await;
    // Until the node is full: EXHAUSTED, and the ADDs that were waiting on EC2 answered.
    let deadline = tokio::time::Instant::now() + HANG_GUARD;
    let mut st = status(&sim);
    while !(st["exhausted"] == true && st["assigned"].as_u64().unwrap() >= 14) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "never EXHAUSTED and full: {st}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        st = status(&sim);
    }
    assert!(
        !st["exhausted_reason"].as_str().unwrap().is_empty(),
        "EXHAUSTED without a reason: {st}"
    );
    assert_eq!(
        st["capacity"], 18,
        "m4.large (Xen: single secondary IPs): 2 ENIs x 9 IPs, the VPC CNI's 20 - 2"
    );
    assert_eq!(st["invariant_error"], "", "{st}");
    let held = ["assigned", "idle", "cooling", "in_flight", "quarantined"]
        .iter()
        .map(|k| st[k].as_u64().unwrap())
        .sum::<u64>();
    assert!(held <= 18, "more IPs held than the node's capacity: {st}");

    // The churn keeps coming at 50/s: the next ADDs find the node full.
    let deadline = tokio::time::Instant::now() + HANG_GUARD;
    let mut outcomes = add_outcomes(&sim.metrics).await;
    while !outcomes.keys().any(|o| o != "ok") {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no ADD was refused: {outcomes:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        outcomes = add_outcomes(&sim.metrics).await;
    }
    assert!(
        outcomes.get("ok").copied().unwrap_or(0.0) >= 14.0,
        "the node filled before running out: {outcomes:?}"
    );
    let refused: f64 = outcomes
        .iter()
        .filter(|(o, _)| o.as_str() != "ok")
        .map(|(_, v)| v)
        .sum();
    assert!(refused > 0.0, "no ADD was refused: {outcomes:?}");
    assert_eq!(
        refused,
        outcomes.get("ResourceExhausted").copied().unwrap_or(0.0),
        "an exhausted node refuses ADDs as retryable (CNI error 11), nothing else: {outcomes:?}"
    );

    let allocs = ctl(&["--socket", &sim.socket, "allocations", "--json"]);
    let allocs: Vec<serde_json::Value> = serde_json::from_slice(&allocs.stdout).unwrap();
    let ips: std::collections::BTreeSet<&str> =
        allocs.iter().map(|a| a["ip"].as_str().unwrap()).collect();
    assert_eq!(ips.len(), allocs.len(), "an IP on two pods: {allocs:?}");
    assert!(
        allocs.len() <= 18,
        "{} allocations on 18 slots",
        allocs.len()
    );
}

#[test]
fn bad_flags_and_knobs_are_refused_by_name() {
    let run = |args: &[&str], env: &[(&str, &str)]| {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_eniipamd"));
        c.args(args);
        for (k, v) in env {
            c.env(k, v);
        }
        let out = c.output().unwrap();
        assert!(!out.status.success(), "{args:?} {env:?} should fail");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    assert!(run(&["--simulate", "--churn", "-5"], &[]).contains("--churn"));
    assert!(
        run(
            &[
                "--simulate",
                "--instance-type",
                "x9.mega",
                "--state-dir",
                "/tmp/eniipam-bad"
            ],
            &[]
        )
        .contains("x9.mega")
    );
    assert!(run(&["--churn", "5"], &[]).contains("--simulate"));
    // A churn the node cannot hold is refused unless --exhaust asks for it, with what would fit.
    let e = run(
        &[
            "--simulate",
            "--profile",
            "fast",
            "--instance-type",
            "m4.large",
            "--churn",
            "1",
            "--state-dir",
            "/tmp/eniipam-bad",
        ],
        &[("ENIIPAM_LOG_LEVEL", "warn")],
    );
    assert!(
        e.contains("would run out of IPs") && e.contains("--exhaust") && e.contains("m5.4xlarge"),
        "{e}"
    );
    let e = run(
        &[],
        &[("ENIIPAM_MIN_IDLE", "50"), ("ENIIPAM_MAX_IDLE", "5")],
    );
    assert!(e.contains("min_idle"), "{e}");
    let e = run(&[], &[("ENIIPAM_EC2_MUTATING_QPS", "fast")]);
    assert!(e.contains("ec2_mutating_qps"), "{e}");
    let e = run(&[], &[("ENIIPAM_CLUSTER_NAME", "")]);
    assert!(e.contains("ENIIPAM_CLUSTER_NAME"), "{e}");
    let e = run(&[], &[("ENIIPAM_PREFIX_DELEGATION", "yes please")]);
    assert!(e.contains("prefix_delegation"), "{e}");
    // Prefix delegation on a Xen type: refused by name at startup (exit 78), as EC2 would refuse
    // every prefix.
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_eniipamd"));
    c.args([
        "--simulate",
        "--instance-type",
        "t2.medium",
        "--state-dir",
        "/tmp/eniipam-bad-pd",
    ])
    .env("ENIIPAM_PREFIX_DELEGATION", "true");
    let out = c.output().unwrap();
    assert_eq!(out.status.code(), Some(78));
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("Nitro") && e.contains("t2.medium"), "{e}");
    let _ = std::fs::remove_dir_all("/tmp/eniipam-bad-pd");
    let _ = std::fs::remove_dir_all("/tmp/eniipam-bad");
}
