//! Issue 13: the edge cases a real node meets within weeks, each of which used to end with one IP on
//! two pods, an IP stranded, or a pod without a working route. The real daemon runs on mockcloud; where
//! the case involves the plugin, the real plugin binary drives it.

mod cni_support;
#[path = "daemon_support/mod.rs"]
mod daemon_support;

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::Path;

use cni_support::{Invocation, Netns, bins, can_use_netns};
use daemon_support::{TempDir, alloc_req, client, config, start};
use eniipam::model::AttachmentKey;
use eniipam::pool::snapshot::{EniPhaseSnapshot, IpState};
use eniipam_api::pb;
use serde_json::{Value, json};

async fn mock() -> mockcloud::MockCloud {
    mockcloud::MockCloud::start(mockcloud::Config {
        default_instance_type: "c5.4xlarge".into(),
        ..mockcloud::Config::fast()
    })
    .await
    .unwrap()
}

async fn plugin(inv: Invocation) -> cni_support::PluginRun {
    tokio::task::spawn_blocking(move || inv.run())
        .await
        .unwrap()
}

/// eniipam as IPAM (nothing wired) for network `name`, against the real daemon.
fn ipam_conf(name: &str, socket: &Path, cache: &Path, version: &str) -> Value {
    json!({
        "cniVersion": version,
        "name": name,
        "type": "calico",
        "ipam": {"type": "eniipam", "socket": socket, "cache_dir": cache, "timeout_ms": 10000},
    })
}

fn ip_of(add: &Value) -> Ipv4Addr {
    add["ips"][0]["address"]
        .as_str()
        .unwrap()
        .trim_end_matches("/32")
        .parse()
        .unwrap()
}

fn allocations(d: &eniipam::daemon::DaemonHandle) -> BTreeMap<String, Ipv4Addr> {
    d.pool
        .snapshot()
        .ips()
        .filter_map(|i| match &i.state {
            IpState::Assigned { attachment, .. } => Some((attachment.container_id.clone(), i.ip)),
            _ => None,
        })
        .collect()
}

/// The ENI `container`'s eth0 IP is on, per the pool.
fn eni_of(d: &eniipam::daemon::DaemonHandle, container: &str) -> Option<eniipam::model::EniId> {
    d.pool
        .allocation(&AttachmentKey::new(container, "eth0"))
        .map(|a| a.eni)
}

/// The attachment id EC2 shows for `eni` (to detach it out of band).
fn attachment_id(mock: &mockcloud::MockCloud, eni: &eniipam::model::EniId) -> String {
    mock.network_interfaces()
        .into_iter()
        .find(|e| e.id == eni.as_str())
        .and_then(|e| e.attachment)
        .unwrap()
        .id
}

/// Pods on secondary ENIs only (eth0 serves none), and no warm IPs: every IP is a pod's.
fn secondary_only(mock: &mockcloud::MockCloud, dir: &Path) -> eniipam::config::DaemonConfig {
    let mut cfg = config(mock, dir);
    cfg.use_primary_eni = false;
    cfg.min_idle = 0;
    cfg.max_idle = 0;
    // One address per assign, so each pod's ADD makes its own call (burst prefixes would bring a
    // /28 with the first pod and serve the next from it).
    cfg.burst_prefixes = false;
    cfg
}

/// Case 1: CNI GC of network A (CNI 1.1 lists only A's valid attachments) releases nothing of network
/// B, and nothing of A that was allocated after the runtime built its list. Through the real plugin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_is_scoped_to_its_network_and_its_moment() {
    let mock = mock().await;
    let dir = TempDir::new("gc-scope");
    let d = start(config(&mock, &dir.0)).await;
    let cache = dir.0.join("cni-cache");
    let a = ipam_conf("net-a", &d.socket_path, &cache, "1.1.0");
    let b = ipam_conf("net-b", &d.socket_path, &cache, "1.1.0");
    let netns = "/proc/self/ns/net";
    let a1 = ip_of(
        &plugin(
            Invocation::new("ADD", &a)
                .container("a1")
                .netns(Some(netns)),
        )
        .await
        .ok(),
    );
    let b1 = ip_of(
        &plugin(
            Invocation::new("ADD", &b)
                .container("b1")
                .netns(Some(netns)),
        )
        .await
        .ok(),
    );
    let a2 = ip_of(
        &plugin(
            Invocation::new("ADD", &a)
                .container("a2")
                .netns(Some(netns)),
        )
        .await
        .ok(),
    );
    // The runtime's GC of network A lists a1 only: a2 is stale, b1 is not A's to judge.
    let mut gc = a.clone();
    gc["cni.dev/valid-attachments"] = json!([{"containerID": "a1", "ifname": "eth0"}]);
    plugin(Invocation::new("GC", &gc)).await.ok();
    let held = allocations(&d);
    assert_eq!(held.get("a1"), Some(&a1));
    assert_eq!(
        held.get("b1"),
        Some(&b1),
        "network B's attachment survived A's GC"
    );
    assert_eq!(held.get("a2"), None, "A's stale attachment was released");
    let stored = d.store.load().await.unwrap();
    assert!(
        stored
            .assignments
            .iter()
            .any(|r| r.container_id == "b1" && r.network == "net-b")
    );
    assert!(stored.idle.iter().any(|i| i.ip == a2));

    // A GC whose list was built before an allocation was made cannot name it: it is kept.
    let listed_before = eniipam::clock::unix_ms_now() - 1;
    let mut c = client(&d.socket_path).await;
    let mut late = alloc_req("a3", "a-3");
    late.network = "net-a".into();
    c.allocate(late).await.unwrap();
    c.garbage_collect(pb::GarbageCollectRequest {
        api_version: eniipam_api::API_VERSION,
        valid: vec![pb::Attachment {
            container_id: "a1".into(),
            ifname: "eth0".into(),
        }],
        network: "net-a".into(),
        listed_before_ms: listed_before,
        cleaning: vec![],
    })
    .await
    .unwrap();
    assert!(
        allocations(&d).contains_key("a3"),
        "a newer allocation is kept"
    );
    // A GC without a network is refused: it cannot be scoped.
    let err = c
        .garbage_collect(pb::GarbageCollectRequest {
            api_version: eniipam_api::API_VERSION,
            valid: vec![],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert_eq!(allocations(&d).len(), 3, "the refused GC released nothing");
    d.shutdown().await;
}

/// Case 2: the state file is lost and the plugin's result cache is not visible (the DaemonSet did not
/// mount it): every IP on our ENIs is quarantined, not handed out again; it shows in the pool report
/// and the metrics; the cache becoming visible adopts the pods it names and frees the rest; an
/// operator can release the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_state_file_without_evidence_quarantines() {
    let mock = mock().await;
    let dir = TempDir::new("quarantine");
    let mut cfg = config(&mock, &dir.0);
    cfg.reuse_cooldown_secs = 0;
    cfg.min_idle = 0;
    let d = start(cfg.clone()).await;
    let mut c = client(&d.socket_path).await;
    let mut held = BTreeMap::new();
    for i in 0..3 {
        let r = c
            .allocate(alloc_req(&format!("p{i}"), &format!("pod-{i}")))
            .await
            .unwrap()
            .into_inner();
        held.insert(format!("p{i}"), r.ip.parse::<Ipv4Addr>().unwrap());
    }
    d.shutdown().await;

    // The file is gone, and the cache directory is not there (not mounted).
    std::fs::remove_file(&cfg.state_path).unwrap();
    let _ = std::fs::remove_dir_all(&cfg.cni_cache_dir);
    let d = start(cfg.clone()).await;
    let on_enis = daemon_support::ec2_pod_ips(&mock);
    assert!(on_enis.len() >= 3);
    assert_eq!(
        d.report.quarantined.len(),
        on_enis.len(),
        "every IP of ours"
    );
    let s = d.pool.snapshot();
    assert_eq!(s.quarantined as usize, on_enis.len());
    d.pool.check_invariants().unwrap();
    // New pods get new IPs, never a quarantined one.
    let mut c = client(&d.socket_path).await;
    for i in 0..3 {
        let r = c
            .allocate(alloc_req(&format!("new{i}"), &format!("new-{i}")))
            .await
            .unwrap()
            .into_inner();
        let ip: Ipv4Addr = r.ip.parse().unwrap();
        assert!(!on_enis.contains(&ip), "{ip} was quarantined");
    }
    let pool = pb::introspect_client::IntrospectClient::new(
        eniipam_api::connect(&d.socket_path).await.unwrap(),
    )
    .pool(pb::PoolRequest {})
    .await
    .unwrap()
    .into_inner();
    assert_eq!(pool.quarantined as usize, on_enis.len());
    assert!(pool.invariant_error.is_empty(), "{}", pool.invariant_error);
    let metrics = reqwest::get(format!("http://{}/metrics", d.metrics_addr))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains(&format!(
            "eniipam_quarantined_ip_addresses {}",
            on_enis.len()
        )),
        "{metrics}"
    );
    // A restart keeps the quarantine while there is still no evidence.
    d.shutdown().await;
    let d = start(cfg.clone()).await;
    assert_eq!(d.pool.snapshot().quarantined as usize, on_enis.len());

    // The cache becomes visible: it names two of the three pods (live netns). They are adopted; the
    // rest of the quarantined IPs go idle.
    let cache = eniipam_api::cache::ResultCache::new(&cfg.cni_cache_dir, "eniipam");
    let netns = dir.0.join("live-netns");
    std::fs::write(&netns, b"").unwrap();
    for name in ["p0", "p1"] {
        cache
            .write(&eniipam_api::cache::CacheEntry {
                format: eniipam_api::cache::CACHE_FORMAT,
                network: "eniipam".into(),
                container_id: name.into(),
                ifname: "eth0".into(),
                netns: netns.display().to_string(),
                pod: None,
                sticky_key: None,
                ip: held[name],
                route_table: 2,
                eni_id: String::new(),
                host_veth: None,
                egress_ipv4: None,
                own_eni_egress: false,
                result: json!({}),
            })
            .unwrap();
    }
    let r = d.reconcile_now().await.unwrap();
    let adopted: BTreeMap<String, Ipv4Addr> = r
        .quarantine_adopted
        .iter()
        .map(|(k, ip)| (k.container_id.clone(), *ip))
        .collect();
    assert_eq!(adopted.get("p0"), Some(&held["p0"]));
    assert_eq!(adopted.get("p1"), Some(&held["p1"]));
    assert_eq!(r.quarantine_lifted.len(), on_enis.len() - 2);
    let s = d.pool.snapshot();
    assert_eq!(s.quarantined, 0);
    assert!(
        d.pool
            .allocation(&AttachmentKey::new("p0", "eth0"))
            .is_some()
    );
    let stored = d.store.load().await.unwrap();
    assert!(stored.quarantined.is_empty());
    assert!(
        stored
            .assignments
            .iter()
            .any(|a| a.container_id == "p1" && a.ip == held["p1"])
    );
    d.pool.check_invariants().unwrap();
    d.shutdown().await;
}

/// Case 2, the operator's way out: `ReleaseQuarantined` frees what no evidence will explain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_releases_the_quarantine() {
    let mock = mock().await;
    let dir = TempDir::new("quarantine-op");
    let mut cfg = config(&mock, &dir.0);
    cfg.min_idle = 2;
    let d = start(cfg.clone()).await;
    let mut c = client(&d.socket_path).await;
    c.allocate(alloc_req("p0", "pod-0")).await.unwrap();
    d.pool.maintain_now().await.unwrap();
    d.shutdown().await;
    std::fs::remove_file(&cfg.state_path).unwrap();
    let _ = std::fs::remove_dir_all(&cfg.cni_cache_dir);
    let d = start(cfg.clone()).await;
    let n = d.pool.snapshot().quarantined;
    assert!(n >= 1);
    let mut introspect = pb::introspect_client::IntrospectClient::new(
        eniipam_api::connect(&d.socket_path).await.unwrap(),
    );
    let err = introspect
        .release_quarantined(pb::ReleaseQuarantinedRequest {
            ips: vec!["not-an-ip".into()],
            all: false,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert_eq!(
        d.pool.snapshot().quarantined,
        n,
        "bad input changed nothing"
    );
    // Through the operator's tool: an IP that is not quarantined is refused, naming it, and nothing
    // is released; `--all` releases every one.
    let ctl = |args: &[&str]| {
        std::process::Command::new(bins::target_bin("eniipamctl"))
            .arg("--socket")
            .arg(&d.socket_path)
            .args(args)
            .output()
            .unwrap()
    };
    let out = ctl(&["quarantine", "release", "--ip", "192.0.2.7"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not quarantined: 192.0.2.7"), "{stderr}");
    assert_eq!(
        d.pool.snapshot().quarantined,
        n,
        "bad input changed nothing"
    );
    let out = ctl(&["quarantine", "release"]);
    assert!(!out.status.success(), "neither --all nor --ip is refused");
    let out = ctl(&["--json", "quarantine", "release", "--all"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["released"].as_array().unwrap().len() as u32, n);
    assert_eq!(d.pool.snapshot().quarantined, 0);
    assert!(d.store.load().await.unwrap().quarantined.is_empty());
    d.pool.check_invariants().unwrap();
    d.shutdown().await;
}

/// Case 3: a release whose durable record fails (the disk is full) is undone: DEL answers an error (the
/// runtime retries it), the attachment keeps its IP in the pool and the file, nobody else gets it;
/// once the disk has room the retried DEL releases it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_release_record_leaves_no_poisoned_ip() {
    let Some(disk) = daemon_support::SmallDisk::mount("release-record") else {
        mockcloud::ci::skip(
            "a_failed_release_record_leaves_no_poisoned_ip",
            "needs root (tmpfs)",
        );
        return;
    };
    let mock = mock().await;
    let dir = TempDir::new("release-record");
    let mut cfg = config(&mock, &dir.0);
    cfg.state_path = disk.path().join("state.db");
    cfg.reuse_cooldown_secs = 0;
    let d = start(cfg.clone()).await;
    let mut c = client(&d.socket_path).await;
    let ip: Ipv4Addr = c
        .allocate(alloc_req("victim", "victim"))
        .await
        .unwrap()
        .into_inner()
        .ip
        .parse()
        .unwrap();
    disk.fill();
    let err = c
        .release(daemon_support::release_req("victim", false))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Internal, "{err:?}");
    assert_eq!(
        d.pool
            .allocation(&AttachmentKey::new("victim", "eth0"))
            .map(|a| a.ip),
        Some(ip),
        "the release was undone"
    );
    d.pool.check_invariants().unwrap();
    disk.free();
    // Nobody else got it meanwhile, and the file still says the victim holds it.
    let stored = d.store.load().await.unwrap();
    assert!(
        stored
            .assignments
            .iter()
            .any(|a| a.ip == ip && a.container_id == "victim")
    );
    // The retried DEL goes through, and the IP serves the next pod.
    let r = c
        .release(daemon_support::release_req("victim", false))
        .await
        .unwrap()
        .into_inner();
    assert!(r.released);
    let next: Ipv4Addr = c
        .allocate(alloc_req("next", "next"))
        .await
        .unwrap()
        .into_inner()
        .ip
        .parse()
        .unwrap();
    let stored = d.store.load().await.unwrap();
    assert!(
        stored
            .assignments
            .iter()
            .any(|a| a.ip == next && a.container_id == "next")
    );
    d.shutdown().await;
}

/// Case 3, the other half: the state file fell out of step with the pool (written to out of band):
/// the running reconcile repairs it from the pool once the disagreement is seen twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_running_reconcile_repairs_the_state_file() {
    let mock = mock().await;
    let dir = TempDir::new("repair");
    let cfg = config(&mock, &dir.0);
    let d = start(cfg.clone()).await;
    let mut c = client(&d.socket_path).await;
    let ip: Ipv4Addr = c
        .allocate(alloc_req("p0", "pod-0"))
        .await
        .unwrap()
        .into_inner()
        .ip
        .parse()
        .unwrap();
    // The file forgets the assignment (as after a lost write).
    d.store
        .repair(vec![eniipam::store::RowRepair::Absent(ip)])
        .await
        .unwrap();
    assert!(d.store.load().await.unwrap().assignments.is_empty());
    let r = d.reconcile_now().await.unwrap();
    assert_eq!(r.store_repairs, 0, "one look is not enough");
    let r = d.reconcile_now().await.unwrap();
    assert_eq!(r.store_repairs, 1);
    let stored = d.store.load().await.unwrap();
    assert!(
        stored
            .assignments
            .iter()
            .any(|a| a.ip == ip && a.container_id == "p0" && a.network == "eniipam")
    );
    d.shutdown().await;
}

/// Case 4a: an ENI whose detach succeeded but whose delete failed is not attached any more: the pool
/// stops serving from it (it is forgotten; the leaked-ENI collector deletes it later).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_detached_but_undeleted_eni_serves_nothing() {
    let mock = mock().await;
    let dir = TempDir::new("detach-delete");
    let mut cfg = config(&mock, &dir.0);
    cfg.min_idle = 0;
    cfg.max_idle = 0;
    // About secondary ENIs: eth0 serves no pod here.
    cfg.use_primary_eni = false;
    cfg.reuse_cooldown_secs = 0;
    let d = start(cfg.clone()).await;
    let mut c = client(&d.socket_path).await;
    c.allocate(alloc_req("p0", "pod-0")).await.unwrap();
    let eni = eni_of(&d, "p0").unwrap();
    // The delete is refused (an IAM policy without ec2:DeleteNetworkInterface, say); the detach worked.
    mock.inject_fault(mockcloud::Fault::error(
        "DeleteNetworkInterface",
        "UnauthorizedOperation",
        100,
    ));
    c.release(daemon_support::release_req("p0", false))
        .await
        .unwrap();
    // Give-back, then the empty ENI's release: detach succeeds, delete fails.
    for _ in 0..3 {
        d.pool.maintain_now().await.unwrap();
    }
    let s = d.pool.snapshot();
    assert!(
        s.eni(&eni).is_none(),
        "the detached ENI still serves: {:?}",
        s.eni(&eni)
    );
    let described = mock
        .network_interfaces()
        .into_iter()
        .find(|e| e.id == eni.as_str())
        .expect("the delete failed, so it still exists");
    assert!(described.attachment.is_none(), "{described:?}");
    mock.clear_faults();
    let r: Ipv4Addr = c
        .allocate(alloc_req("p1", "pod-1"))
        .await
        .unwrap()
        .into_inner()
        .ip
        .parse()
        .unwrap();
    assert!(!described.secondary_ips.contains(&r));
    assert_ne!(eni_of(&d, "p1").unwrap(), eni);
    d.pool.check_invariants().unwrap();
    d.shutdown().await;
}

/// Case 4b: an ENI detached out of band is suspended at the first describe that misses it (no new IPs
/// from it, its idle IPs held back) and forgotten at the second, with its IPs (the pods on it are
/// reported lost); new pods get IPs from an attached ENI.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eni_detached_out_of_band_is_suspended_then_forgotten() {
    let mock = mock().await;
    let dir = TempDir::new("oob-detach");
    let mut cfg = config(&mock, &dir.0);
    // About secondary ENIs: eth0 serves no pod here.
    cfg.use_primary_eni = false;
    cfg.min_idle = 3;
    let d = start(cfg.clone()).await;
    let mut c = client(&d.socket_path).await;
    c.allocate(alloc_req("p0", "pod-0")).await.unwrap();
    d.pool.maintain_now().await.unwrap();
    let eni = eni_of(&d, "p0").unwrap();
    let attachment = attachment_id(&mock, &eni);
    mock.with_world(|w, now| w.detach_network_interface(&attachment, true, now))
        .unwrap();
    let r = d.reconcile_now().await.unwrap();
    assert_eq!(r.suspended_enis, vec![eni.clone()]);
    assert!(r.forgotten_enis.is_empty(), "one describe is not enough");
    let s = d.pool.snapshot();
    assert!(matches!(
        s.eni(&eni).unwrap().phase,
        EniPhaseSnapshot::Suspect { .. }
    ));
    assert_eq!(s.idle_eligible, 0, "its idle IPs are held back");
    assert!(s.held_back > 0);
    // A new pod does not get an IP from it.
    let ip: Ipv4Addr = c
        .allocate(alloc_req("p1", "pod-1"))
        .await
        .unwrap()
        .into_inner()
        .ip
        .parse()
        .unwrap();
    assert_ne!(eni_of(&d, "p1").unwrap(), eni);
    let r = d.reconcile_now().await.unwrap();
    assert_eq!(r.forgotten_enis, vec![eni.clone()]);
    assert!(
        r.lost.iter().any(|(k, _)| k.container_id == "p0"),
        "{:?}",
        r.lost
    );
    let s = d.pool.snapshot();
    assert!(s.eni(&eni).is_none());
    assert!(
        d.pool
            .allocation(&AttachmentKey::new("p0", "eth0"))
            .is_none()
    );
    assert_eq!(
        d.pool
            .allocation(&AttachmentKey::new("p1", "eth0"))
            .unwrap()
            .ip,
        ip
    );
    let stored = d.store.load().await.unwrap();
    assert!(stored.enis.iter().all(|e| e.eni_id != eni.as_str()));
    assert!(stored.assignments.iter().all(|a| a.container_id != "p0"));
    d.pool.check_invariants().unwrap();
    d.shutdown().await;
}

/// Case 4d (found by the fault soak): an IP of an ENI that may be detached goes to no pod. After the
/// ENI is suspended, an IP released on it is held back, not idle; and an assign on an ENI detached
/// out of band (EC2 takes it: the ENI still exists) that IMDS does not list at all suspends the ENI
/// and hands its new IPs to nobody, so the pod is not given an IP the instance does not hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_ip_of_a_possibly_detached_eni_goes_to_a_pod() {
    let mock = mock().await;
    let dir = TempDir::new("suspect-eni");
    let d = start(secondary_only(&mock, &dir.0)).await;
    let mut c = client(&d.socket_path).await;

    // 1. Released on a suspended ENI: held back.
    c.allocate(alloc_req("p0", "pod-0")).await.unwrap();
    c.allocate(alloc_req("p1", "pod-1")).await.unwrap();
    let eni = eni_of(&d, "p0").unwrap();
    assert_eq!(eni_of(&d, "p1").as_ref(), Some(&eni));
    let p1_ip = d
        .pool
        .allocation(&AttachmentKey::new("p1", "eth0"))
        .unwrap()
        .ip;
    let att = attachment_id(&mock, &eni);
    mock.with_world(|w, now| w.detach_network_interface(&att, true, now))
        .unwrap();
    let r = d.reconcile_now().await.unwrap();
    assert_eq!(r.suspended_enis, vec![eni.clone()]);
    c.release(daemon_support::release_req("p1", false))
        .await
        .unwrap();
    let s = d.pool.snapshot();
    assert_eq!(s.idle, 0, "released IP held back, not idle");
    assert!(s.held_back >= 1);
    let got: Ipv4Addr = c
        .allocate(alloc_req("p2", "pod-2"))
        .await
        .unwrap()
        .into_inner()
        .ip
        .parse()
        .unwrap();
    assert_ne!(got, p1_ip, "the held-back IP went to a pod");
    assert_ne!(eni_of(&d, "p2").as_ref(), Some(&eni));
    d.pool.check_invariants().unwrap();
    d.shutdown().await;

    // 2. Detached out of band, not yet seen by a describe: the next assign on it finds the ENI
    //    missing from IMDS, and its IP goes to nobody.
    let dir = TempDir::new("suspect-eni-2");
    let d = start(secondary_only(&mock, &dir.0)).await;
    let mut c = client(&d.socket_path).await;
    c.allocate(alloc_req("q0", "pod-q0")).await.unwrap();
    let eni = eni_of(&d, "q0").unwrap();
    let att = attachment_id(&mock, &eni);
    mock.with_world(|w, now| w.detach_network_interface(&att, true, now))
        .unwrap();
    let first = c.allocate(alloc_req("q1", "pod-q1")).await;
    let held = d.pool.snapshot();
    assert!(
        matches!(
            held.eni(&eni).unwrap().phase,
            EniPhaseSnapshot::Suspect { .. }
        ),
        "the ENI IMDS does not list is suspended"
    );
    match first {
        Err(status) => assert!(
            status.message().contains("not shown attached"),
            "{status:?}"
        ),
        Ok(_) => assert_ne!(
            eni_of(&d, "q1").as_ref(),
            Some(&eni),
            "q1 got an IP of the detached ENI"
        ),
    }
    // The runtime retries the ADD: served from an attached ENI.
    c.allocate(alloc_req("q1", "pod-q1")).await.unwrap();
    assert_ne!(eni_of(&d, "q1").as_ref(), Some(&eni));
    d.pool.check_invariants().unwrap();
    d.shutdown().await;
}

/// Case 4e (found by the fault soak): a restart right after a new ENI served its first pod, while
/// IMDS does not list the ENI yet and the file does not know it: the restart takes the subnet's CIDR
/// from EC2 and keeps the ENI and the pod on it. (It used to skip the ENI and drop the pod's record;
/// the pod's IP then went to another pod.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_eni_unknown_to_imds_and_the_file_keeps_its_pods_at_restart() {
    let mock = mock().await;
    let dir = TempDir::new("new-eni-restart");
    let cfg = secondary_only(&mock, &dir.0);
    let d = start(cfg.clone()).await;
    let mut c = client(&d.socket_path).await;
    let ip: Ipv4Addr = c
        .allocate(alloc_req("p0", "pod-0"))
        .await
        .unwrap()
        .into_inner()
        .ip
        .parse()
        .unwrap();
    let eni = eni_of(&d, "p0").unwrap();
    d.shutdown().await;
    // The file has the pod's row but not its ENI's (the file learns ENIs at a start or an adoption;
    // EC2 is the truth about them), and IMDS lags the attach (as after a crash right after it).
    let stored = eniipam::store::Store::open(&cfg.state_path)
        .await
        .unwrap()
        .0
        .load()
        .await
        .unwrap();
    assert!(stored.enis.iter().all(|e| e.eni_id != eni.as_str()));
    assert!(stored.assignments.iter().any(|a| a.ip == ip));
    mock.set_imds_lag(std::time::Duration::from_secs(3600));
    let d = start(cfg.clone()).await;
    assert_eq!(
        d.pool
            .allocation(&AttachmentKey::new("p0", "eth0"))
            .map(|a| (a.ip, a.eni)),
        Some((ip, eni.clone())),
        "the pod keeps its IP on its ENI"
    );
    assert!(d.pool.snapshot().eni(&eni).is_some(), "the ENI serves");
    let stored = d.store.load().await.unwrap();
    assert!(stored.enis.iter().any(|e| e.eni_id == eni.as_str()));
    assert!(
        stored
            .assignments
            .iter()
            .any(|a| a.container_id == "p0" && a.ip == ip)
    );
    // Nobody else gets it (IMDS caught up: an ENI IMDS does not list takes no assign).
    mock.set_imds_lag(std::time::Duration::ZERO);
    let mut c = client(&d.socket_path).await;
    for i in 1..4 {
        let other: Ipv4Addr = c
            .allocate(alloc_req(&format!("q{i}"), &format!("pod-q{i}")))
            .await
            .unwrap()
            .into_inner()
            .ip
            .parse()
            .unwrap();
        assert_ne!(other, ip);
    }
    d.pool.check_invariants().unwrap();
    d.shutdown().await;
}

/// Case 4c: an ENI of ours attached to the node that the pool does not know (a create whose answer
/// was lost) is adopted at the second sighting: its IPs serve pods, never twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_attached_eni_of_ours_is_adopted() {
    let mock = mock().await;
    let dir = TempDir::new("adopt-eni");
    let mut cfg = config(&mock, &dir.0);
    cfg.min_idle = 0;
    let d = start(cfg.clone()).await;
    let node = d.node.clone();
    let lifecycle_tags = eniipam::cloud::lifecycle::eni_tags(&node, std::time::SystemTime::now());
    let inst = mock.default_instance();
    let eni_id = mock
        .with_world(|w, now| {
            let view = w.create_network_interface(
                &mockcloud::world::CreateEniArgs {
                    subnet_id: inst.subnet_id.clone(),
                    security_groups: inst.security_groups.clone(),
                    description: "created by a lost eniipam call".into(),
                    secondary_count: 3,
                    addresses: vec![],
                    prefix_count: 0,
                    prefixes: vec![],
                    tags: lifecycle_tags.clone(),
                    client_token: None,
                },
                now,
            )?;
            w.attach_network_interface(&view.id, &inst.instance_id, 5, now)
                .map(|_| view.id)
        })
        .unwrap();
    let r = d.reconcile_now().await.unwrap();
    assert!(r.adopted_enis.is_empty(), "one sighting is not enough");
    let r = d.reconcile_now().await.unwrap();
    assert_eq!(
        r.adopted_enis
            .iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>(),
        vec![eni_id.clone()]
    );
    let s = d.pool.snapshot();
    let adopted = s
        .enis
        .iter()
        .find(|e| e.id.as_str() == eni_id)
        .expect("adopted");
    assert_eq!(adopted.ips.len(), 3);
    d.pool.check_invariants().unwrap();
    d.shutdown().await;
}

/// Case 6: one describe that misses an IP is not enough to forget it (EC2 is eventually consistent);
/// the second is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ip_is_forgotten_only_at_the_second_missing_describe() {
    let mock = mock().await;
    let dir = TempDir::new("two-describes");
    let d = start(config(&mock, &dir.0)).await;
    let mut c = client(&d.socket_path).await;
    let ip: Ipv4Addr = c
        .allocate(alloc_req("p0", "pod-0"))
        .await
        .unwrap()
        .into_inner()
        .ip
        .parse()
        .unwrap();
    let eni = eni_of(&d, "p0").unwrap();
    mock.with_world(|w, now| w.unassign_private_ip_addresses(eni.as_str(), &[ip], now))
        .unwrap();
    let r = d.reconcile_now().await.unwrap();
    assert_eq!(r.missing_in_ec2, vec![ip]);
    assert!(r.lost.is_empty());
    assert!(
        d.pool
            .allocation(&AttachmentKey::new("p0", "eth0"))
            .is_some()
    );
    let r = d.reconcile_now().await.unwrap();
    assert_eq!(
        r.lost,
        vec![(AttachmentKey::new("p0", "eth0"), ip)],
        "gone twice: the pod lost its IP"
    );
    d.pool.check_invariants().unwrap();
    d.shutdown().await;
}

/// Case 6: a netns path the daemon cannot see (containerd's `netns_mounts_under_state_dir`,
/// cri-dockerd, a DaemonSet without the mount) is unknown, not dead: the pod keeps its IP. One in a
/// directory the daemon sees, and absent there, is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invisible_netns_is_unknown_not_dead() {
    let mock = mock().await;
    let dir = TempDir::new("netns-unknown");
    let d = start(config(&mock, &dir.0)).await;
    let mut c = client(&d.socket_path).await;
    let mut invisible = alloc_req("hidden", "hidden");
    invisible.netns = "/run/containerd/io.containerd.grpc.v1.cri/sandboxes/x/netns".into();
    c.allocate(invisible).await.unwrap();
    let mut visible = alloc_req("dead", "dead");
    visible.netns = dir.0.join("dead-netns").display().to_string();
    c.allocate(visible).await.unwrap();
    let r = d.reconcile_now().await.unwrap();
    let released: Vec<&str> = r
        .released_dead
        .iter()
        .map(|(k, _)| k.container_id.as_str())
        .collect();
    assert_eq!(released, vec!["dead"]);
    assert!(
        d.pool
            .allocation(&AttachmentKey::new("hidden", "eth0"))
            .is_some()
    );
    d.shutdown().await;
}

/// Case 6: two concurrent first ADDs of one attachment (a runtime retrying while the first is in
/// flight) get the same IP, recorded once; an ADD racing its own DEL leaves the pool and the file
/// agreeing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_adds_of_one_attachment_agree() {
    let mock = mock().await;
    let dir = TempDir::new("concurrent");
    let d = start(config(&mock, &dir.0)).await;
    let c = client(&d.socket_path).await;
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let mut c = c.clone();
        tasks.push(tokio::spawn(async move {
            c.allocate(alloc_req("same", "same"))
                .await
                .unwrap()
                .into_inner()
                .ip
        }));
    }
    let mut ips = Vec::new();
    for t in tasks {
        ips.push(t.await.unwrap());
    }
    ips.dedup();
    assert_eq!(ips.len(), 1, "{ips:?}");
    let stored = d.store.load().await.unwrap();
    assert_eq!(
        stored
            .assignments
            .iter()
            .filter(|a| a.container_id == "same")
            .count(),
        1
    );
    // ADD and DEL of another attachment at once, many times: whatever the order, the pool and the file
    // say the same.
    for i in 0..20 {
        let id = format!("race{i}");
        let (mut a, mut b) = (c.clone(), c.clone());
        let add_id = id.clone();
        let add = tokio::spawn(async move { a.allocate(alloc_req(&add_id, &add_id)).await });
        let del =
            tokio::spawn(async move { b.release(daemon_support::release_req(&id, false)).await });
        let _ = add.await.unwrap();
        del.await.unwrap().unwrap();
    }
    let pool: BTreeMap<String, Ipv4Addr> = allocations(&d);
    let stored: BTreeMap<String, Ipv4Addr> = d
        .store
        .load()
        .await
        .unwrap()
        .assignments
        .into_iter()
        .map(|a| (a.container_id, a.ip))
        .collect();
    assert_eq!(pool, stored);
    d.pool.check_invariants().unwrap();
    d.shutdown().await;
}

/// Case 5: a late DEL (a retried one, or one from a stale cache entry) after the IP went to a new pod
/// does not remove the new pod's policy rules: the daemon says the IP is held by another, and the
/// plugin leaves them. Real plugin (main role) and real daemon, in namespaces the test makes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_del_keeps_the_new_owners_rules() {
    if !can_use_netns() {
        mockcloud::ci::skip(
            "a_late_del_keeps_the_new_owners_rules",
            "needs root and iproute2",
        );
        return;
    }
    let mock = mock().await;
    let dir = TempDir::new("late-del");
    let mut cfg = config(&mock, &dir.0);
    // About secondary ENIs: eth0 serves no pod here.
    cfg.use_primary_eni = false;
    // Single addresses: B must get A's IP back as the only idle one.
    cfg.burst_prefixes = false;
    cfg.reuse_cooldown_secs = 0;
    cfg.min_idle = 0;
    cfg.max_idle = 100;
    let d = start(cfg.clone()).await;
    let cache = dir.0.join("cni-cache");
    let conf = json!({
        "cniVersion": "1.0.0",
        "name": "eniipam",
        "type": "eniipam",
        "socket": d.socket_path,
        "cache_dir": cache,
        "timeout_ms": 10000,
    });
    let node = Netns::new("node");
    let pod_a = Netns::new("pod");
    let add_a = plugin(
        Invocation::new("ADD", &conf)
            .container("ctr-a")
            .pod("default", "a")
            .netns(Some(&pod_a.path()))
            .in_node(&node),
    )
    .await
    .ok();
    let ip = ip_of(&add_a);
    let rules = |node: &Netns| -> Vec<String> {
        node.ip(&["rule", "show"])
            .lines()
            .filter(|l| l.contains(&ip.to_string()))
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(rules(&node).len(), 2, "secondary-ENI IP: to/from rules");
    // A's DEL happens; keep its cache entry to replay a stale DEL later.
    let entry = std::fs::read(cache.join("eniipam/ctr-a@eth0.json")).unwrap();
    plugin(
        Invocation::new("DEL", &conf)
            .container("ctr-a")
            .netns(Some(&pod_a.path()))
            .in_node(&node),
    )
    .await
    .ok();
    assert!(rules(&node).is_empty());
    // B gets the same IP (cooldown 0, the only idle IP).
    let pod_b = Netns::new("pod");
    let add_b = plugin(
        Invocation::new("ADD", &conf)
            .container("ctr-b")
            .pod("default", "b")
            .netns(Some(&pod_b.path()))
            .in_node(&node),
    )
    .await
    .ok();
    assert_eq!(ip_of(&add_b), ip, "the test needs the IP reused");
    let before = rules(&node);
    assert_eq!(before.len(), 2);
    // A's late DEL, from its stale cache entry.
    std::fs::write(cache.join("eniipam/ctr-a@eth0.json"), &entry).unwrap();
    plugin(
        Invocation::new("DEL", &conf)
            .container("ctr-a")
            .netns(Some(&pod_a.path()))
            .in_node(&node),
    )
    .await
    .ok();
    assert_eq!(rules(&node), before, "B's rules survived A's late DEL");
    assert_eq!(
        d.pool
            .allocation(&AttachmentKey::new("ctr-b", "eth0"))
            .map(|a| a.ip),
        Some(ip)
    );
    // B's own DEL removes them.
    plugin(
        Invocation::new("DEL", &conf)
            .container("ctr-b")
            .netns(Some(&pod_b.path()))
            .in_node(&node),
    )
    .await
    .ok();
    assert!(rules(&node).is_empty());
    d.shutdown().await;
}

/// Case 6: logs written to a file or a pipe (the container runtime's log, `--simulate` piped) are plain
/// text, without the ANSI colour a terminal gets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_to_a_pipe_have_no_colour() {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
    let dir = TempDir::new("ansi");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_eniipamd"))
        .args(["--simulate", "--profile", "fast", "--state-dir"])
        .arg(&dir.0)
        .env("ENIIPAM_LOG_LEVEL", "info")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    loop {
        let line = tokio::time::timeout(std::time::Duration::from_secs(60), lines.next_line())
            .await
            .expect("eniipamd prints where it serves")
            .unwrap()
            .expect("eniipamd exited early");
        if line.trim().starts_with("socket:") {
            break;
        }
    }
    child.start_kill().unwrap();
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .await
        .unwrap();
    let _ = child.wait().await;
    assert!(stderr.contains("eniipamd ready"), "{stderr}");
    assert!(
        !stderr.contains('\u{1b}'),
        "ANSI escapes in piped logs: {stderr:?}"
    );
}
