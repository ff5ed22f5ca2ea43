//! Issue 5's crash test: ADD/DEL churn through the real gRPC API against the real `eniipamd` binary,
//! killed with SIGKILL at random moments (50 times) and restarted. After every restart: no IP held by
//! two attachments, every ADD that succeeded and was not deleted still holds its IP, EC2 (mockcloud) and
//! the daemon agree; at the end, GC leaves exactly the live pods. Prints kills and operations survived.
//! Run four times: secondary IPs on a c5.4xlarge (eth0's included), prefix delegation on an m5.large
//! (every pod address inside a `/28` on eth0 or a secondary ENI), and (issue 26) `ip_family` ipv6 and
//! dual: every IPv6 inside the /80 EC2 shows on eth0, and no IPv6 ever handed to two pods in the whole
//! run, kills and restarts included (the /80's cursor is durable).
//!
//! Issue 45: the daemon is a real child process, so no paused clock; each life is counted in
//! operations, not milliseconds: the kill comes after a random number of ADD/DELs answered in that
//! life (plus a random sub-millisecond-to-milliseconds phase, so it lands inside the operations
//! still in flight), however slowly a loaded machine serves them. Waits are on events, with
//! [`HANG_GUARD`] only against a hang.

#[path = "daemon_support/mod.rs"]
mod daemon_support;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use daemon_support::*;
use eniipam::rpc::pb::introspect_client::IntrospectClient;
use eniipam::rpc::{API_VERSION, pb};
use mockcloud::{Config, MockCloud};
use rand::Rng;

const KILLS: usize = 50;

/// ADD/DELs answered in one life before its SIGKILL: at least the 6 the final check asks for on
/// average, a few dozen at most.
const OPS_PER_LIFE: std::ops::RangeInclusive<u64> = 6..=30;

/// How long any one awaited event (a start, a life's operations) may take before the test calls it
/// a hang: generous, since a loaded machine may be slow; it never decides an outcome.
const HANG_GUARD: Duration = Duration::from_secs(120);

fn spawn_daemon(
    mock: &MockCloud,
    dir: &std::path::Path,
    extra: &[(&str, &str)],
) -> tokio::process::Child {
    let inst = mock.default_instance();
    tokio::process::Command::new(env!("CARGO_BIN_EXE_eniipamd"))
        .env_clear()
        .envs(extra.iter().copied())
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("AWS_ACCESS_KEY_ID", "AKIDCRASH")
        .env("AWS_SECRET_ACCESS_KEY", "secret")
        .env("ENIIPAM_CLUSTER_NAME", "crash")
        .env("ENIIPAM_REGION", "us-east-1")
        .env("ENIIPAM_EC2_ENDPOINT", mock.ec2_url())
        .env("ENIIPAM_IMDS_ENDPOINT", &inst.imds_url)
        .env("ENIIPAM_SOCKET_PATH", dir.join("eniipam.sock"))
        .env("ENIIPAM_STATE_PATH", dir.join("state.db"))
        .env("ENIIPAM_METRICS_ADDR", "127.0.0.1:0")
        .env("ENIIPAM_EC2_MUTATING_QPS", "100")
        .env("ENIIPAM_EC2_MUTATING_BURST", "100")
        // Cooldown survival is tested in daemon_restart; here a short one keeps IPs flowing across 50 lives.
        .env("ENIIPAM_REUSE_COOLDOWN_SECS", "1")
        .env("ENIIPAM_MANAGE_ENI_ROUTES", "false")
        .env("ENIIPAM_LOG_LEVEL", "warn")
        .env("ENIIPAM_LOG_FORMAT", "text")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("eniipamd starts")
}

/// Waits until the daemon answers Status with ready.
async fn wait_ready(socket: &std::path::Path, child: &mut tokio::process::Child) {
    let deadline = tokio::time::Instant::now() + HANG_GUARD;
    while tokio::time::Instant::now() < deadline {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("eniipamd exited during startup: {status}");
        }
        if let Ok(ch) = eniipam::rpc::connect(socket).await {
            let mut c = pb::ipam_client::IpamClient::new(ch);
            if let Ok(r) = c
                .status(pb::StatusRequest {
                    api_version: API_VERSION,
                })
                .await
                && r.get_ref().ready
            {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("eniipamd did not become ready");
}

/// An attachment's addresses: its IPv4 (ipv4, dual) and its IPv6 (ipv6, dual).
type Addrs = (Option<Ipv4Addr>, Option<Ipv6Addr>);

/// The addresses of a reply or a row, by family (empty strings: none).
fn addrs(ip: &str, ipv6: &str) -> Addrs {
    (
        (!ip.is_empty()).then(|| ip.parse().expect("an IPv4")),
        (!ipv6.is_empty()).then(|| ipv6.parse().expect("an IPv6")),
    )
}

#[derive(Default)]
struct Model {
    /// Confirmed live attachments and their addresses.
    live: BTreeMap<String, Addrs>,
    /// Attachments whose last ADD or DEL was cut off by the kill: either outcome is allowed.
    uncertain: BTreeSet<String>,
    ops: u64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_at_random_moments_loses_nothing() {
    crash_run("c5.4xlarge", &[], KILLS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_at_random_moments_loses_nothing_with_prefixes() {
    crash_run(
        "m5.large",
        &[("ENIIPAM_PREFIX_DELEGATION", "true")],
        KILLS / 2,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_at_random_moments_loses_nothing_ipv6() {
    crash_run("c5.4xlarge", &[("ENIIPAM_IP_FAMILY", "ipv6")], KILLS / 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_at_random_moments_loses_nothing_dual_stack() {
    crash_run("c5.4xlarge", &[("ENIIPAM_IP_FAMILY", "dual")], KILLS / 2).await;
}

/// The /80s EC2 shows on the instance's eth0.
fn eth0_ipv6_prefixes(mock: &MockCloud) -> Vec<ipnet::Ipv6Net> {
    let inst = mock.instance(&mock.default_instance().instance_id).unwrap();
    inst.enis
        .iter()
        .filter(|e| e.attachment.as_ref().is_some_and(|a| a.device_index == 0))
        .flat_map(|e| e.ipv6_prefixes.clone())
        .collect()
}

async fn crash_run(instance_type: &str, extra: &[(&str, &str)], kills: usize) {
    let family = extra
        .iter()
        .find(|(k, _)| *k == "ENIIPAM_IP_FAMILY")
        .map_or("ipv4", |(_, v)| *v);
    // Every IPv6 handed out in the run, and to whom: never to a second pod.
    let mut ever_v6: BTreeMap<Ipv6Addr, String> = BTreeMap::new();
    let mock = MockCloud::start(Config {
        default_instance_type: instance_type.into(),
        ..Config::fast()
    })
    .await
    .unwrap();
    mock.enforce_shipped_policy("crash")
        .expect("a default world");
    let dir = TempDir::new("crash");
    let socket = dir.0.join("eniipam.sock");
    let model = Arc::new(Mutex::new(Model::default()));
    let mut rng = rand::rng();

    for kill in 0..=kills {
        let mut child = spawn_daemon(&mock, &dir.0, extra);
        wait_ready(&socket, &mut child).await;
        let ch = eniipam::rpc::connect(&socket).await.unwrap();
        let ipam = pb::ipam_client::IpamClient::new(ch.clone());

        // Checks after each (re)start.
        let allocs = IntrospectClient::new(ch.clone())
            .allocations(pb::AllocationsRequest {})
            .await
            .unwrap()
            .into_inner()
            .allocations;
        let mut held: BTreeMap<String, Addrs> = BTreeMap::new();
        let mut ips = BTreeSet::new();
        let mut ips6 = BTreeSet::new();
        let prefixes = eth0_ipv6_prefixes(&mock);
        // A dual-stack ADD cut off between its IPv4's record and its IPv6's leaves the IPv4 alone, and a
        // DEL cut off between its two releases leaves the IPv6 alone: the runtime never got an answer,
        // and retries (a repeated ADD completes the pair, a DEL releases what is left). Every ADD that
        // was answered holds both; every DEL that was answered released both.
        let cut_off = model.lock().unwrap().uncertain.clone();
        let mut halves: Vec<String> = Vec::new();
        for a in &allocs {
            let (v4, v6) = addrs(&a.ip, &a.ipv6);
            let whole = (v4.is_some(), v6.is_some()) == (family != "ipv6", family != "ipv4");
            assert!(
                whole || (family == "dual" && cut_off.contains(&a.container_id)),
                "after kill {kill}: {} holds {v4:?} {v6:?} with ip_family {family}",
                a.container_id
            );
            if let Some(ip) = v4 {
                assert!(
                    ips.insert(ip),
                    "after kill {kill}: {ip} held by two attachments"
                );
            }
            if let Some(ip) = v6 {
                assert!(
                    ips6.insert(ip),
                    "after kill {kill}: {ip} held by two attachments"
                );
                assert!(
                    prefixes.iter().any(|p| p.contains(&ip)),
                    "after kill {kill}: {ip} is in no /80 EC2 shows on eth0 ({prefixes:?})"
                );
                let first = ever_v6.entry(ip).or_insert_with(|| a.container_id.clone());
                assert_eq!(
                    first, &a.container_id,
                    "after kill {kill}: {ip} went to a second pod"
                );
            }
            held.insert(a.container_id.clone(), (v4, v6));
        }
        let ec2: BTreeSet<Ipv4Addr> = ec2_pod_ips(&mock).into_iter().collect();
        assert!(
            ips.is_subset(&ec2),
            "after kill {kill}: the daemon holds IPs EC2 does not"
        );
        if family != "ipv4" {
            assert_eq!(
                prefixes.len(),
                1,
                "one /80 on eth0, kills and restarts included"
            );
        }
        {
            let mut m = model.lock().unwrap();
            for (k, ip) in &m.live {
                if !m.uncertain.contains(k) {
                    assert_eq!(
                        held.get(k),
                        Some(ip),
                        "after kill {kill}: confirmed ADD {k} lost its IP"
                    );
                }
            }
            for k in held.keys() {
                assert!(
                    m.live.contains_key(k) || m.uncertain.contains(k),
                    "after kill {kill}: {k} holds an IP but was confirmed deleted"
                );
            }
            // Settle the uncertain ones with what the daemon says; a dual-stack attachment left with
            // one family is a sandbox whose ADD or DEL never answered: the runtime DELs it.
            let uncertain: Vec<String> = m.uncertain.iter().cloned().collect();
            for k in uncertain {
                match held.get(&k) {
                    Some((v4, v6)) if family == "dual" && (v4.is_none() || v6.is_none()) => {
                        halves.push(k.clone());
                        m.live.remove(&k);
                    }
                    Some(addrs) => {
                        m.live.insert(k.clone(), *addrs);
                    }
                    None => {
                        m.live.remove(&k);
                    }
                }
            }
            m.uncertain.clear();
        }
        for k in halves.drain(..) {
            let rel = ipam
                .clone()
                .release(release_req(&k, false))
                .await
                .expect("the runtime's DEL of a half-answered sandbox")
                .into_inner();
            assert!(rel.released, "{k}: the DEL released its one family");
        }
        if kill == kills {
            // Last life: GC with the model's live set; afterwards exactly those remain.
            let valid: Vec<pb::Attachment> = model
                .lock()
                .unwrap()
                .live
                .keys()
                .map(|k| pb::Attachment {
                    container_id: k.clone(),
                    ifname: "eth0".into(),
                })
                .collect();
            let mut c = ipam.clone();
            c.garbage_collect(pb::GarbageCollectRequest {
                api_version: API_VERSION,
                valid,
                network: "eniipam".into(),
                listed_before_ms: eniipam::clock::unix_ms_now(),
                ..Default::default()
            })
            .await
            .unwrap();
            let allocs = IntrospectClient::new(ch)
                .allocations(pb::AllocationsRequest {})
                .await
                .unwrap()
                .into_inner()
                .allocations;
            let after: BTreeSet<String> = allocs.iter().map(|a| a.container_id.clone()).collect();
            let live: BTreeSet<String> = model.lock().unwrap().live.keys().cloned().collect();
            assert_eq!(after, live, "after GC nothing leaks");
            child.kill().await.unwrap();
            let ops = model.lock().unwrap().ops;
            println!(
                "crash test ({instance_type} {extra:?}): {kills} SIGKILLs survived, {ops} ADD/DEL operations, {} pods live at the end, {} IPv6 addresses handed out (none twice)",
                live.len(),
                ever_v6.len()
            );
            assert!(ops >= 6 * kills as u64, "enough churn happened ({ops})");
            assert!(!live.is_empty(), "pods were live at the end");
            return;
        }

        // Churn: 4 workers doing ADD/DEL, then SIGKILL at a random moment: after a random number
        // of answered operations, at a random phase of the ones in flight.
        let (answered, mut answered_rx) = tokio::sync::watch::channel(0u64);
        let mut workers = Vec::new();
        for w in 0..4 {
            let mut c = ipam.clone();
            let model = model.clone();
            let answered = answered.clone();
            let base = kill as u64 * 10_000_000 + w * 1_000_000;
            workers.push(tokio::spawn(async move {
                let mut n = base;
                loop {
                    let del = {
                        let m = model.lock().unwrap();
                        let live: Vec<String> = m
                            .live
                            .keys()
                            .filter(|k| !m.uncertain.contains(*k))
                            .cloned()
                            .collect();
                        (live.len() > 60 || (n.is_multiple_of(3) && !live.is_empty()))
                            .then(|| live[(n as usize * 7) % live.len()].clone())
                    };
                    n += 1;
                    match del {
                        Some(k) => {
                            model.lock().unwrap().uncertain.insert(k.clone());
                            let r = c.release(release_req(&k, false)).await;
                            let mut m = model.lock().unwrap();
                            if r.is_err() {
                                return;
                            }
                            m.live.remove(&k);
                            m.uncertain.remove(&k);
                            m.ops += 1;
                            answered.send_modify(|n| *n += 1);
                        }
                        None => {
                            let k = format!("pod-{n}");
                            model.lock().unwrap().uncertain.insert(k.clone());
                            let r = c.allocate(alloc_req(&k, &k)).await;
                            let exhausted = {
                                let mut m = model.lock().unwrap();
                                match r {
                                    Ok(r) => {
                                        let r = r.into_inner();
                                        m.live.insert(k.clone(), addrs(&r.ip, &r.ipv6));
                                        m.uncertain.remove(&k);
                                        m.ops += 1;
                                        answered.send_modify(|n| *n += 1);
                                        false
                                    }
                                    Err(s) if s.code() == tonic::Code::ResourceExhausted => {
                                        m.uncertain.remove(&k);
                                        true
                                    }
                                    Err(_) => return,
                                }
                            };
                            if exhausted {
                                tokio::time::sleep(Duration::from_millis(10)).await;
                            }
                        }
                    }
                }
            }));
        }
        drop(answered);
        let target = rng.random_range(OPS_PER_LIFE);
        tokio::time::timeout(HANG_GUARD, answered_rx.wait_for(|n| *n >= target))
            .await
            .unwrap_or_else(|_| panic!("life {kill}: {target} operations never answered"))
            .unwrap_or_else(|_| {
                panic!("life {kill}: every worker stopped before {target} operations")
            });
        tokio::time::sleep(Duration::from_micros(rng.random_range(0..3_000))).await;
        child.start_kill().unwrap();
        let _ = child.wait().await;
        for w in workers {
            let _ = w.await;
        }
    }
}
