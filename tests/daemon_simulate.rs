//! Issue 7: `eniipamd --simulate` as a subprocess; `eniipamctl status --json` and `/metrics` agree with
//! the pool; SIGTERM ends it cleanly with exit 0; bad flags and knobs are refused by name.

mod bins;
#[path = "daemon_support/mod.rs"]
mod daemon_support;

use std::process::Stdio;
use std::time::Duration;

use daemon_support::*;
use tokio::io::{AsyncBufReadExt, BufReader};

struct Sim {
    child: tokio::process::Child,
    socket: String,
    metrics: String,
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
        let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
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
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Sim {
        child,
        socket,
        metrics,
        _dir: dir,
    }
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
        8 * 29,
        "c5.4xlarge: 8 ENIs (eth0 included) x 29 IPs: the VPC CNI's max-pods 234 - 2"
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
    // EC2 calls by purpose: node discovery and the rebuild are the startup's; pods waited on calls.
    assert!(text.contains("eniipam_ec2_calls_total{purpose=\"startup\",api=\"DescribeInstances\""));
    assert!(
        text.contains("eniipam_ec2_calls_total{purpose=\"pod\""),
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
    let pid = sim.child.id().unwrap() as i32;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = tokio::time::timeout(Duration::from_secs(30), sim.child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "exit status {status}");
    assert!(!std::path::Path::new(&sim.socket).exists());
    // With the daemon gone, eniipamctl says so clearly.
    let out = ctl(&["--socket", &sim.socket, "status"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is eniipamd running"));
}

/// Issue 15: on an m5.large the daemon serves the VPC CNI's pods per node: 27 pod IPs with secondary
/// IPs (max-pods 29 − 2 host-network pods, eth0 included), and with prefix delegation the kubelet's
/// 110 pods, all handed out, each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulate_m5_large_serves_the_vpc_cnis_pods_per_node() {
    for (env, pods, min_capacity) in [
        (vec![], 27, 27),
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
        if env.is_empty() {
            // One more has no room: refused with a clear reason, nothing changes.
            let err = c
                .allocate(alloc_req("one-more", "one-more"))
                .await
                .unwrap_err();
            assert!(err.message().contains("all 27 IP slots"), "{err:?}");
        }
        let pid = sim.child.id().unwrap() as i32;
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        let _ = tokio::time::timeout(Duration::from_secs(30), sim.child.wait()).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn churn_drives_pods_through_the_pool() {
    // 50 pods/s outgrow any node within seconds: --exhaust asks for it.
    let sim = start_sim(&["--churn", "50", "--exhaust"]).await;
    let http = reqwest::Client::new();
    let mut adds = 0.0;
    for _ in 0..200 {
        let text = http
            .get(&sim.metrics)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        adds = text
            .lines()
            .find_map(|l| l.strip_prefix("eniipam_add_ip_req_total{outcome=\"ok\"} "))
            .map_or(0.0, |v| v.trim().parse().unwrap());
        if adds >= 10.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(adds >= 10.0, "churn made {adds} successful ADDs");
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
            "m5.large",
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
