//! Issue 27, item 2: network profiles through the real daemon. The cluster's `NetworkProfile`s, its
//! namespaces and pods are served by the API-server double (`eniipam-kubeapi`, listed and watched by
//! kube-rs); EC2 by mockcloud (real AWS SDK, the shipped IAM policy enforced). ADDs go through the
//! daemon's gRPC socket, as the plugin sends them.
//!
//! - A pod annotated `eniipam.io/network: db` (or in a namespace annotated `app`) gets its IP from an
//!   ENI created for that profile: in its subnet (by id, or by tags), with exactly its groups, tagged
//!   with the profile; pods without a profile (or opting out with an empty annotation) never get one.
//! - The node advertises each profile's total slots (`eniipam.io/network-<name>` in `status.capacity`
//!   and `status.allocatable`): what it can hold for the profile, not what is free, since the
//!   scheduler subtracts the bound pods itself; it does not move with ADDs and DELs. A profile at its
//!   `maxEnisPerNode` with its ENIs full refuses its next pod with CNI error 11 naming it. A full
//!   profile rolled one pod at a time never leaves a pod Pending the node could hold (issue 44,
//!   case 1), and the node's status is not PATCHed under that churn. Metrics are per profile.
//! - A pod naming a profile that does not exist, is invalid, or whose subnet or groups EC2 refuses for
//!   this node gets CNI error 11 naming the profile and why; nothing is created; once fixed, it works.

#[path = "daemon_support/mod.rs"]
mod daemon_support;

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use daemon_support::*;
use eniipam::config::DaemonConfig;
use eniipam::daemon::DaemonHandle;
use eniipam_kubeapi::{Crd, FakeApiServer};
use ipnet::Ipv4Net;
use mockcloud::{Config, MockCloud};
use serde_json::{Value, json};

const NODE: &str = "ip-10-0-1-10.ec2.internal";

/// Two profile subnets of the node's zone (one found by tags), one of another zone, three groups.
struct World {
    subnet_db: String,
    subnet_app: String,
    other_zone: String,
    sg_db: String,
    sg_app: String,
    sg_other: String,
}

fn world(mock: &MockCloud) -> World {
    let inst = mock.default_instance();
    mock.associate_vpc_cidr_block(&inst.vpc_id, "100.64.0.0/16".parse().unwrap())
        .expect("a second block");
    let zone = inst.availability_zone.clone();
    let tags = BTreeMap::from([("tier".to_owned(), "app".to_owned())]);
    let (sg_db, sg_app, sg_other) = mock.with_world(|w, _| {
        (
            w.create_security_group(&inst.vpc_id).unwrap(),
            w.create_security_group(&inst.vpc_id).unwrap(),
            w.create_security_group(&inst.vpc_id).unwrap(),
        )
    });
    World {
        subnet_db: mock
            .create_subnet(&inst.vpc_id, "100.64.0.0/20".parse().unwrap(), &zone)
            .unwrap(),
        subnet_app: mock
            .create_subnet_with_tags(
                &inst.vpc_id,
                "100.64.16.0/20".parse().unwrap(),
                &zone,
                &tags,
            )
            .unwrap(),
        other_zone: mock
            .create_subnet(
                &inst.vpc_id,
                "100.64.32.0/20".parse().unwrap(),
                "us-east-1f",
            )
            .unwrap(),
        sg_db,
        sg_app,
        sg_other,
    }
}

fn profile(name: &str, spec: Value) -> Value {
    json!({"metadata": {"name": name}, "spec": spec})
}

/// `db`: its subnet by id, its one group.
fn db_profile(w: &World) -> Value {
    profile(
        "db",
        json!({"subnet": w.subnet_db, "securityGroups": [w.sg_db]}),
    )
}

/// A pod bound to the node, with the profile annotation when given.
fn pod(ns: &str, name: &str, network: Option<&str>) -> Value {
    let mut p = eniipam_kubeapi::pod_json(ns, name, &format!("uid-{name}"), NODE, "Pending");
    if let Some(n) = network {
        p["metadata"]["annotations"] = json!({"eniipam.io/network": n});
    }
    p
}

async fn setup(
    test: &str,
    pod_watch: bool,
) -> (MockCloud, FakeApiServer, World, TempDir, DaemonConfig) {
    let mock = MockCloud::start(Config {
        default_instance_type: "m5.large".into(),
        ..Config::fast()
    })
    .await
    .unwrap();
    let w = world(&mock);
    let api = FakeApiServer::start().await;
    api.install_crd(Crd::network_profile());
    api.add_node(NODE, &[]);
    api.put_namespace("default", &[]);
    api.put_namespace("apps", &[("eniipam.io/network", "app")]);
    let dir = TempDir::new(test);
    let mut cfg = config(&mock, &dir.0);
    cfg.network_profiles = true;
    cfg.api_server_url = Some(api.url());
    // With the pod watch the annotation comes from it; without, from one GET per ADD.
    cfg.api_server_gc = Some(pod_watch);
    cfg.node_condition = false;
    cfg.node_name = NODE.into();
    cfg.warm_policy = eniipam::pool::config::WarmPolicy::Fixed;
    cfg.min_idle = 0;
    cfg.max_idle = 2;
    (mock, api, w, dir, cfg)
}

/// ADD of pod `name` in `ns` (container `c-<name>`), as the plugin sends it.
async fn add(d: &DaemonHandle, ns: &str, name: &str) -> Result<Ipv4Addr, tonic::Status> {
    let mut c = client(&d.socket_path).await;
    let mut req = alloc_req(&format!("c-{name}"), name);
    req.pod.as_mut().unwrap().namespace = ns.into();
    c.allocate(req)
        .await
        .map(|r| r.into_inner().ip.parse().unwrap())
}

/// `(subnet, groups, profile tag)` of the ENI holding `ip` in EC2.
fn eni_of(mock: &MockCloud, ip: Ipv4Addr) -> (String, Vec<String>, Option<String>) {
    let e = mock
        .network_interfaces()
        .into_iter()
        .find(|e| e.secondary_ips.contains(&ip) || e.primary_ip == ip)
        .unwrap_or_else(|| panic!("{ip} is on no ENI"));
    (
        e.subnet_id.clone(),
        e.security_groups.clone(),
        e.tags.get("eniipam.io/network").cloned(),
    )
}

/// What the node advertises for `profile`, in `status.capacity` and `status.allocatable`.
fn advertised(api: &FakeApiServer, profile: &str) -> (Option<String>, Option<String>) {
    let node = api.node(NODE).expect("the node");
    let key = format!("eniipam.io/network-{profile}");
    let get = |map: &str| node["status"][map][&key].as_str().map(str::to_owned);
    (get("capacity"), get("allocatable"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn profile_pods_get_ips_only_from_their_profiles_enis_and_the_node_advertises_total_slots() {
    let (mock, api, w, _dir, cfg) = setup("np-place", true).await;
    let crd = Crd::network_profile();
    api.put_object(
        &crd,
        profile(
            "db",
            json!({"subnet": w.subnet_db, "securityGroups": [w.sg_db], "maxEnisPerNode": 1}),
        ),
    );
    api.put_object(
        &crd,
        profile(
            "app",
            json!({"subnetSelector": {"tags": {"tier": "app"}}, "securityGroups": [w.sg_app, w.sg_db]}),
        ),
    );
    let d = start(cfg).await;
    let db_block: Ipv4Net = "100.64.0.0/20".parse().unwrap();
    let app_block: Ipv4Net = "100.64.16.0/20".parse().unwrap();
    let node_subnet = mock.default_instance().subnet_id;

    // A db pod: its own ENI, in the profile's subnet, with exactly its group, tagged.
    api.put_pod(pod("default", "db-0", Some("db")));
    let ip = add(&d, "default", "db-0").await.expect("db-0");
    assert!(db_block.contains(&ip), "{ip}");
    assert_eq!(
        eni_of(&mock, ip),
        (
            w.subnet_db.clone(),
            vec![w.sg_db.clone()],
            Some("db".into())
        )
    );
    // A pod of the `apps` namespace: the namespace's profile, its subnet found by tags.
    api.put_pod(pod("apps", "web-0", None));
    let ip = add(&d, "apps", "web-0").await.expect("web-0");
    assert!(app_block.contains(&ip), "{ip}");
    assert_eq!(
        eni_of(&mock, ip),
        (
            w.subnet_app.clone(),
            vec![w.sg_app.clone(), w.sg_db.clone()],
            Some("app".into())
        )
    );
    // No profile, and a pod of `apps` opting out: the default network, never a profile's ENI.
    api.put_pod(pod("default", "plain-0", None));
    api.put_pod(pod("apps", "optout-0", Some("")));
    for (ns, name) in [("default", "plain-0"), ("apps", "optout-0")] {
        let ip = add(&d, ns, name).await.expect(name);
        let (subnet, _, tag) = eni_of(&mock, ip);
        assert_eq!(
            (subnet.as_str(), tag),
            (node_subnet.as_str(), None),
            "{name}"
        );
    }
    // eniipamctl's view: the ENI knows its profile.
    let snap = d.pool.snapshot();
    let db_enis: Vec<_> = snap
        .enis
        .iter()
        .filter(|e| e.network.as_deref() == Some("db"))
        .collect();
    assert_eq!(db_enis.len(), 1);
    assert_eq!(db_enis[0].subnet_id, w.subnet_db);

    // m5.large: 10 addresses per ENI, 9 for pods; db may have one ENI: 9 in all, whatever its
    // pods hold (the scheduler subtracts them).
    wait_until("db's total slots reach the node", || {
        advertised(&api, "db") == (Some("9".into()), Some("9".into()))
    })
    .await;
    assert!(advertised(&api, "app").0.is_some());
    let m = scrape(&d).await;
    assert_eq!(
        sample(&m, "eniipam_network_profile_enis{profile=\"db\"}"),
        Some(1.0),
        "{m}"
    );
    assert_eq!(
        sample(
            &m,
            "eniipam_network_profile_assigned_ip_addresses{profile=\"db\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(&m, "eniipam_network_profile_usable{profile=\"app\"}"),
        Some(1.0)
    );

    // Fill db's one ENI: the node still says 9 (the scheduler counts the 9 bound pods), and a
    // 10th db pod, which the scheduler would not bind here, is refused naming the profile.
    for i in 1..9 {
        let name = format!("db-{i}");
        api.put_pod(pod("default", &name, Some("db")));
        let ip = add(&d, "default", &name).await.expect("db fits");
        assert_eq!(eni_of(&mock, ip).2.as_deref(), Some("db"));
    }
    assert_eq!(advertised(&api, "db"), (Some("9".into()), Some("9".into())));
    api.put_pod(pod("default", "db-9", Some("db")));
    let e = add(&d, "default", "db-9").await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e}");
    assert!(
        e.message().contains("network profile db") && e.message().contains("at most 1"),
        "{e}"
    );
    let m = scrape(&d).await;
    assert_eq!(
        sample(&m, "eniipam_network_profile_free_slots{profile=\"db\"}"),
        Some(0.0),
        "{m}"
    );
    // A released db IP is db's again (after its cooldown): never another profile's or the default's.
    let mut c = client(&d.socket_path).await;
    c.release(release_req("c-db-3", false)).await.unwrap();
    d.pool.check_invariants().unwrap();
    // The profile deleted: its slots are no longer advertised, and its pods keep their IPs.
    api.delete_object(&crd, None, "db");
    wait_until("db's resource leaves the node", || {
        advertised(&api, "db").0.is_none()
    })
    .await;
    assert!(
        d.pool
            .allocation(&eniipam::model::AttachmentKey::new("c-db-0", "eth0"))
            .is_some()
    );
    d.pool.check_invariants().unwrap();
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_naming_a_profile_that_cannot_serve_it_gets_error_11_naming_it_until_fixed() {
    let (mock, api, w, _dir, cfg) = setup("np-refuse", false).await;
    let crd = Crd::network_profile();
    // Invalid (no groups), a subnet of another zone, a group EC2 does not have.
    api.put_object(&crd, profile("bad", json!({"subnet": w.subnet_db})));
    api.put_object(
        &crd,
        profile(
            "far",
            json!({"subnet": w.other_zone, "securityGroups": [w.sg_db]}),
        ),
    );
    api.put_object(
        &crd,
        profile(
            "ghost",
            json!({"subnet": w.subnet_db, "securityGroups": ["sg-0123456789abcdef0"]}),
        ),
    );
    api.put_object(
        &crd,
        profile(
            "ok",
            json!({"subnet": w.subnet_db, "securityGroups": [w.sg_other]}),
        ),
    );
    let d = start(cfg).await;
    let enis = || mock.network_interfaces().len();
    let before = enis();
    for (profile, says) in [
        ("nope", "no NetworkProfile of that name exists"),
        ("bad", "spec.securityGroups is missing"),
        ("far", "us-east-1f"),
        ("ghost", "sg-0123456789abcdef0"),
    ] {
        let name = format!("pod-{profile}");
        api.put_pod(pod("default", &name, Some(profile)));
        let e = add(&d, "default", &name).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{profile}: {e}");
        assert!(
            e.message().contains(&format!("network profile {profile}"))
                && e.message().contains(says),
            "{profile}: {e}"
        );
    }
    assert_eq!(enis(), before, "nothing created for a refused profile");
    // What cannot serve here is advertised as 0 (the scheduler sends its pods elsewhere).
    wait_until("the unusable profiles are advertised as 0", || {
        ["bad", "far", "ghost"]
            .iter()
            .all(|p| advertised(&api, p).1.as_deref() == Some("0"))
            && advertised(&api, "ok").1.is_some_and(|n| n != "0")
    })
    .await;
    let m = scrape(&d).await;
    assert_eq!(
        sample(&m, "eniipam_network_profile_usable{profile=\"far\"}"),
        Some(0.0),
        "{m}"
    );
    // A pod the API server does not know takes its namespace's word (none here): the default network.
    let ip = add(&d, "default", "not-in-api")
        .await
        .expect("default network");
    assert_eq!(eni_of(&mock, ip).2, None);
    // The missing profile created, the group fixed: the same pods' next tries work.
    api.put_object(
        &crd,
        profile(
            "nope",
            json!({"subnet": w.subnet_db, "securityGroups": [w.sg_app]}),
        ),
    );
    api.put_object(
        &crd,
        profile(
            "ghost",
            json!({"subnet": w.subnet_db, "securityGroups": [w.sg_db]}),
        ),
    );
    wait_until("the fixed profiles are usable", || {
        advertised(&api, "nope").1.is_some_and(|n| n != "0")
            && advertised(&api, "ghost").1.is_some_and(|n| n != "0")
    })
    .await;
    for (profile, sg) in [("nope", &w.sg_app), ("ghost", &w.sg_db)] {
        let ip = add(&d, "default", &format!("pod-{profile}"))
            .await
            .unwrap_or_else(|e| panic!("{profile}: {e}"));
        assert_eq!(
            eni_of(&mock, ip),
            (w.subnet_db.clone(), vec![sg.clone()], Some(profile.into()))
        );
    }
    d.pool.check_invariants().unwrap();
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_keeps_each_enis_profile_and_its_pods() {
    let (mock, api, w, _dir, cfg) = setup("np-restart", true).await;
    let crd = Crd::network_profile();
    api.put_object(&crd, db_profile(&w));
    let d = start(cfg.clone()).await;
    api.put_pod(pod("default", "db-0", Some("db")));
    api.put_pod(pod("default", "plain-0", None));
    let db0 = add(&d, "default", "db-0").await.expect("db-0");
    let plain = add(&d, "default", "plain-0").await.expect("plain-0");
    let db_eni = eni_of(&mock, db0);
    d.shutdown().await;

    // The rebuild learns the profile from the ENI's tag: the pods keep their IPs, and the ENI
    // still serves db only.
    let d = start(cfg).await;
    let key = |c: &str| eniipam::model::AttachmentKey::new(c, "eth0");
    assert_eq!(d.pool.allocation(&key("c-db-0")).map(|a| a.ip), Some(db0));
    assert_eq!(
        d.pool.allocation(&key("c-plain-0")).map(|a| a.ip),
        Some(plain)
    );
    let snap = d.pool.snapshot();
    let eni = snap
        .enis
        .iter()
        .find(|e| e.ips.iter().any(|i| i.ip == db0))
        .expect("db's ENI");
    assert_eq!(eni.network.as_deref(), Some("db"));
    api.put_pod(pod("default", "db-1", Some("db")));
    api.put_pod(pod("default", "plain-1", None));
    let db1 = add(&d, "default", "db-1").await.expect("db-1");
    assert_eq!(eni_of(&mock, db1), db_eni, "db's next pod: the same ENI");
    let plain1 = add(&d, "default", "plain-1").await.expect("plain-1");
    assert_eq!(eni_of(&mock, plain1).2, None, "never a profile's ENI");
    d.pool.check_invariants().unwrap();
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_profiles_changed_groups_reach_the_enis_of_its_running_pods() {
    let (mock, api, w, _dir, cfg) = setup("np-groups", true).await;
    let crd = Crd::network_profile();
    api.put_object(&crd, db_profile(&w));
    let d = start(cfg).await;
    api.put_pod(pod("default", "db-0", Some("db")));
    let ip = add(&d, "default", "db-0").await.expect("db-0");
    assert_eq!(eni_of(&mock, ip).1, vec![w.sg_db.clone()]);
    // The operator swaps db's groups: the running pod's ENI follows (the shipped IAM policy allows
    // setting groups of the VPC on the cluster's ENIs).
    api.put_object(
        &crd,
        profile(
            "db",
            json!({"subnet": w.subnet_db, "securityGroups": [w.sg_app, w.sg_other]}),
        ),
    );
    wait_until("the ENI carries the new groups", || {
        let mut groups = eni_of(&mock, ip).1;
        groups.sort();
        let mut want = vec![w.sg_app.clone(), w.sg_other.clone()];
        want.sort();
        groups == want
    })
    .await;
    assert_eq!(
        d.pool
            .allocation(&eniipam::model::AttachmentKey::new("c-db-0", "eth0"))
            .map(|a| a.ip),
        Some(ip),
        "the pod keeps its IP"
    );
    // The next ENI of db is created with them too; the pool's rules still hold.
    api.put_pod(pod("default", "db-1", Some("db")));
    let ip1 = add(&d, "default", "db-1").await.expect("db-1");
    assert_eq!(eni_of(&mock, ip1).2.as_deref(), Some("db"));
    d.pool.check_invariants().unwrap();
    d.shutdown().await;
}

/// What the scheduler's NodeResourcesFit says of one more pod requesting a slot of `profile` with
/// `bound` pods of it already bound to the node: `allocatable − Σ requests of the bound pods ≥ 1`.
fn scheduler_fits(api: &FakeApiServer, profile: &str, bound: u32) -> bool {
    advertised(api, profile)
        .1
        .and_then(|n| n.parse::<u32>().ok())
        .is_some_and(|allocatable| allocatable > bound)
}

/// ADD of a bound pod, retried as the kubelet retries a sandbox whose ADD failed with CNI error 11
/// (a released IP cooling down), up to 20 s.
async fn add_until_served(d: &DaemonHandle, ns: &str, name: &str) -> Ipv4Addr {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        match add(d, ns, name).await {
            Ok(ip) => return ip,
            Err(e) if e.code() == tonic::Code::ResourceExhausted => {
                assert!(tokio::time::Instant::now() < deadline, "{name}: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            Err(e) => panic!("{name}: {e}"),
        }
    }
}

/// Issue 44, case 1: the scheduler subtracts the requests of the bound pods from `allocatable`
/// itself. Before, the node advertised the profile's *free* slots, so with T slots and k pods the
/// scheduler saw T − 2k: a 9-slot profile filled at 5 pods, a rollout stalled Pending, and each
/// ADD and DEL moved the number (a status PATCH about once a second under churn). Now the node
/// advertises the total: it fills to 9, every pod of a one-at-a-time rollout fits as soon as its
/// predecessor is gone, and the churn sends no status PATCH.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_profile_rolled_one_pod_at_a_time_never_leaves_a_pod_pending() {
    let (_mock, api, w, _dir, mut cfg) = setup("np-roll", true).await;
    // A released IP cools 1 s before the next pod may have it (the kubelet retries meanwhile).
    cfg.reuse_cooldown_secs = 1;
    api.put_object(
        &Crd::network_profile(),
        profile(
            "db",
            json!({"subnet": w.subnet_db, "securityGroups": [w.sg_db], "maxEnisPerNode": 1}),
        ),
    );
    let d = start(cfg).await;
    wait_until("db is advertised", || advertised(&api, "db").1.is_some()).await;

    // Schedule db pods while the scheduler says they fit: the node's 9 (one ENI of an m5.large).
    let mut bound: Vec<String> = Vec::new();
    while scheduler_fits(&api, "db", bound.len() as u32) {
        let name = format!("db-{}", bound.len());
        api.put_pod(pod("default", &name, Some("db")));
        add_until_served(&d, "default", &name).await;
        bound.push(name);
        published(&api, &d).await;
        assert!(bound.len() <= 9, "more db pods than the node can hold");
    }
    assert_eq!(bound.len(), 9, "the scheduler fills the profile's slots");

    // Roll the workload one pod at a time: each replacement fits once its predecessor is gone.
    let patches_before = api.counts().status_patches;
    for round in 0..9 {
        let old = bound.remove(0);
        let mut c = client(&d.socket_path).await;
        c.release(release_req(&format!("c-{old}"), false))
            .await
            .unwrap();
        api.delete_pod("default", &old);
        published(&api, &d).await;
        assert!(
            scheduler_fits(&api, "db", bound.len() as u32),
            "round {round}: the replacement of {old} would stay Pending (advertised {:?})",
            advertised(&api, "db")
        );
        let name = format!("db-r{round}");
        api.put_pod(pod("default", &name, Some("db")));
        add_until_served(&d, "default", &name).await;
        bound.push(name);
    }
    published(&api, &d).await;
    assert!(!scheduler_fits(&api, "db", bound.len() as u32));
    let patches = api.counts().status_patches - patches_before;
    assert_eq!(
        patches, 0,
        "18 ADDs and DELs moved the advertised number {patches} times"
    );
    d.pool.check_invariants().unwrap();
    d.shutdown().await;
}

/// Waits until the node's `allocatable` says what the pool advertises for `db` now.
async fn published(api: &FakeApiServer, d: &DaemonHandle) {
    wait_until("the node says what the pool advertises for db", || {
        let want = d
            .pool
            .profile_capacity()
            .get("db")
            .map(|c| c.total.to_string());
        want.is_some() && advertised(api, "db").1 == want
    })
    .await;
}

/// Issue 44, case 4: every pod's IPv6 comes from eth0's /80, so with `ip_family = dual` neither a
/// profile's groups nor an ENIConfig's subnet and groups would apply to it. The real `eniipamd`
/// refuses both combinations at startup (exit 78), naming the knobs; each alone starts as before
/// (the unit test `dual_stack_is_refused_with_network_profiles_and_with_custom_networking`).
#[tokio::test]
async fn the_daemon_refuses_dual_stack_with_network_profiles_or_custom_networking() {
    let dir = TempDir::new("dual_stack_refused");
    for knob in ["NETWORK_PROFILES", "CUSTOM_NETWORKING"] {
        let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_eniipamd"))
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("ENIIPAM_CLUSTER_NAME", "dual-refused")
            .env("ENIIPAM_IP_FAMILY", "dual")
            .env(format!("ENIIPAM_{knob}"), "true")
            // Loopback only: a daemon that got past its configuration reaches nothing outside.
            .env("ENIIPAM_API_SERVER_URL", "http://127.0.0.1:9")
            .env("ENIIPAM_IMDS_ENDPOINT", "http://127.0.0.1:9")
            .env("ENIIPAM_EC2_ENDPOINT", "http://127.0.0.1:9")
            .env("ENIIPAM_NODE_NAME", NODE)
            .env("ENIIPAM_API_SERVER_GC", "false")
            .env("ENIIPAM_STATE_PATH", dir.0.join("state.db"))
            .env("ENIIPAM_SOCKET_PATH", dir.0.join("eniipam.sock"))
            .kill_on_drop(true)
            .output();
        // A daemon that accepted the configuration would wait for IMDS: bounded.
        let out = tokio::time::timeout(std::time::Duration::from_secs(30), run)
            .await
            .unwrap_or_else(|_| {
                panic!("{knob}: eniipamd accepted ip_family = dual and kept running")
            })
            .expect("eniipamd runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(78), "{knob}: {stderr}");
        assert!(
            stderr.contains(&knob.to_lowercase()) && stderr.contains("ip_family = dual"),
            "{knob}: {stderr}"
        );
    }
}
