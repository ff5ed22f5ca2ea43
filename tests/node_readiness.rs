//! Issue 25, item 5: node readiness that tells the truth. The startup taint is removed once the pool
//! holds warm IPs (and only that taint), and the `eniipam.io/PodNetworkReady` condition follows what
//! the pool and EC2 say.
//!
//! The API server is the loopback double `eniipam-kubeapi` (nodes GET and PATCH as kube-rs sends
//! them); the kube client is the daemon's own ([`api_server::client`]); the daemon is the real one on
//! mockcloud, whose subnet is filled and whose every action is made to fail.

#[path = "daemon_support/mod.rs"]
mod daemon_support;

use std::time::Duration;

use eniipam::config::DaemonConfig;
use eniipam::reconcile::api_server::node::{
    CONDITION_TYPE, DEFAULT_STARTUP_TAINT, TaintEffect, TaintRemoval, remove_taint,
};
use eniipam::reconcile::api_server::{self, ApiServerTarget};
use eniipam_kubeapi::FakeApiServer;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use mockcloud::Fault;
use mockcloud::world::OccupyPattern;
use serde_json::Value;

const NODE: &str = "ip-10-0-1-10.ec2.internal";
const OTHER: &str = "example.com/dedicated";

fn nodes(api: &FakeApiServer) -> Api<Node> {
    let client = api_server::client(&ApiServerTarget {
        url: api.url(),
        token_file: None,
        ca_file: None,
    })
    .expect("client");
    Api::all(client)
}

/// `(key, effect)` of the node's taints, in order.
fn taints(api: &FakeApiServer) -> Vec<(String, String)> {
    api.node(NODE).unwrap()["spec"]["taints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["key"].as_str().unwrap().to_owned(),
                t["effect"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[tokio::test]
async fn only_the_startup_taint_goes_and_an_absent_one_is_fine() {
    let api = FakeApiServer::start().await;
    api.add_node(
        NODE,
        &[
            (OTHER, "NoSchedule"),
            (DEFAULT_STARTUP_TAINT, "NoSchedule"),
            // Same key, another effect: another taint, not ours.
            (DEFAULT_STARTUP_TAINT, "NoExecute"),
        ],
    );
    let nodes = nodes(&api);
    let r = remove_taint(&nodes, NODE, DEFAULT_STARTUP_TAINT, TaintEffect::NoSchedule)
        .await
        .unwrap();
    assert_eq!(r, TaintRemoval::Removed { conflicts: 0 });
    assert_eq!(
        taints(&api),
        vec![
            (OTHER.to_owned(), "NoSchedule".to_owned()),
            (DEFAULT_STARTUP_TAINT.to_owned(), "NoExecute".to_owned()),
        ]
    );
    let r = remove_taint(&nodes, NODE, DEFAULT_STARTUP_TAINT, TaintEffect::NoSchedule)
        .await
        .unwrap();
    assert_eq!(r, TaintRemoval::Absent);
    assert_eq!(
        api.counts().node_patches,
        1,
        "nothing to patch the second time"
    );
}

#[tokio::test]
async fn a_conflict_is_read_again_and_retried_and_keeps_the_other_writers_change() {
    let api = FakeApiServer::start().await;
    api.add_node(NODE, &[(DEFAULT_STARTUP_TAINT, "NoSchedule")]);
    api.race_node_patches(2);
    let r = remove_taint(
        &nodes(&api),
        NODE,
        DEFAULT_STARTUP_TAINT,
        TaintEffect::NoSchedule,
    )
    .await
    .unwrap();
    assert_eq!(r, TaintRemoval::Removed { conflicts: 2 });
    assert_eq!(api.counts().conflicts, 2);
    assert!(taints(&api).is_empty());
    let node = api.node(NODE).unwrap();
    assert_eq!(
        node["metadata"]["labels"]["touched"], "2",
        "the racing writes are kept"
    );
}

#[tokio::test]
async fn an_unknown_node_is_an_error_not_a_success() {
    let api = FakeApiServer::start().await;
    let e = remove_taint(
        &nodes(&api),
        NODE,
        DEFAULT_STARTUP_TAINT,
        TaintEffect::NoSchedule,
    )
    .await
    .unwrap_err();
    assert!(matches!(&e, kube::Error::Api(s) if s.is_not_found()), "{e}");
}

/// The double answers patches as the real server does: a content type it does not serve gets 415,
/// a merge patch replaces a list whole, a strategic one merges `status.conditions` by `type`, and
/// the main resource ignores `status`.
#[tokio::test]
async fn the_double_patches_as_the_api_server_does() {
    let api = FakeApiServer::start().await;
    api.add_node(NODE, &[]);
    let http = reqwest::Client::new();
    let patch = |path: &str, ctype: &str, body: &str| {
        http.patch(format!("{}/api/v1/nodes/{NODE}{path}", api.url()))
            .header("content-type", ctype)
            .body(body.to_owned())
            .send()
    };
    let ours = r#"{"status":{"conditions":[{"type":"X","status":"True"}]}}"#;
    let r = patch("/status", "application/json-patch+json", "[]")
        .await
        .unwrap();
    assert_eq!(r.status(), 415);
    let r = patch("/status", "application/strategic-merge-patch+json", ours)
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(api.condition(NODE, "Ready").is_some() && api.condition(NODE, "X").is_some());
    let r = patch(
        "",
        "application/strategic-merge-patch+json",
        r#"{"status":{"conditions":[]},"spec":{"unschedulable":true}}"#,
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 200);
    let node = api.node(NODE).unwrap();
    assert_eq!(node["spec"]["unschedulable"], true);
    assert!(api.condition(NODE, "Ready").is_some(), "status ignored");
    let r = patch("/status", "application/merge-patch+json", ours)
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(
        api.condition(NODE, "Ready").is_none(),
        "a merge patch replaces the list"
    );
    let r = patch(
        "",
        "application/merge-patch+json",
        r#"{"metadata":{"resourceVersion":"1"},"spec":{"taints":[]}}"#,
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 409, "a stale resourceVersion");
    api.fail_node_requests(1, 503);
    let r = patch("", "application/merge-patch+json", "{}")
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    let r = http
        .get(format!("{}/api/v1/nodes/nope", api.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    api.require_token("t");
    let r = patch("", "application/merge-patch+json", "{}")
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
}

/// `cond`, polled every 100 ms, or a panic naming `what` after `secs` seconds (real time).
async fn until(what: &str, secs: u64, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    while !cond() {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn condition(api: &FakeApiServer) -> Option<(String, String)> {
    let c: Value = api.condition(NODE, CONDITION_TYPE)?;
    Some((
        c["status"].as_str()?.to_owned(),
        c["reason"].as_str()?.to_owned(),
    ))
}

fn is(api: &FakeApiServer, status: &str, reason: &str) -> bool {
    condition(api) == Some((status.to_owned(), reason.to_owned()))
}

/// The real daemon: a full subnet keeps the taint on and the condition `False`/`SubnetShort`; room in
/// the subnet gives warm IPs, the taint goes (the other stays) and the condition turns `True`; EC2
/// failing every call turns it `False`/`Ec2Unreachable`, and `True` again once EC2 answers. The
/// condition is patched on changes only.
#[tokio::test]
async fn the_daemon_removes_its_startup_taint_once_warm_and_reports_the_truth() {
    use daemon_support::*;
    let mock = mockcloud::MockCloud::start(mockcloud::Config::fast())
        .await
        .unwrap();
    let world = mock.default_world().unwrap();
    mock.with_world(|w, _| {
        w.occupy_addresses(
            &world.subnet_id,
            &OccupyPattern::Range {
                cidr: world.subnet_cidr,
            },
        )
        .unwrap();
    });
    let api = FakeApiServer::start().await;
    api.add_node(
        NODE,
        &[(OTHER, "NoSchedule"), (DEFAULT_STARTUP_TAINT, "NoSchedule")],
    );
    let dir = TempDir::new("node-readiness");
    let mut config = config(&mock, &dir.0);
    config.node_name = NODE.into();
    config.api_server_url = Some(api.url());
    config.api_server_gc = Some(false);
    config.remove_startup_taint = true;
    config.node_check_secs = 1;
    config.subnet_backoff_secs = 2;
    config.validate().unwrap();
    let d = start(config).await;

    until("the condition says the subnet is short", 30, || {
        is(&api, "False", "SubnetShort")
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(d.pool.snapshot().idle_eligible, 0);
    assert_eq!(
        taints(&api).len(),
        2,
        "no warm IP yet: the startup taint stays"
    );

    mock.with_world(|w, _| w.release_occupied(&world.subnet_id).unwrap());
    until("the startup taint goes", 30, || taints(&api).len() == 1).await;
    assert!(d.pool.snapshot().idle_eligible > 0);
    assert_eq!(
        taints(&api),
        vec![(OTHER.to_owned(), "NoSchedule".to_owned())]
    );
    until("the condition turns True", 30, || {
        is(&api, "True", "IpsAvailable")
    })
    .await;
    assert!(
        api.condition(NODE, "Ready").is_some(),
        "the kubelet's condition is left alone"
    );

    let mut down = Fault::error("DescribeNetworkInterfaces", "Unavailable", u32::MAX);
    down.action = None;
    down.count = None;
    mock.inject_fault(down);
    let _ = d.reconcile_now().await;
    until("the condition says EC2 is unreachable", 30, || {
        is(&api, "False", "Ec2Unreachable")
    })
    .await;
    mock.clear_faults();
    d.reconcile_now().await.unwrap();
    until("the condition turns True again", 30, || {
        is(&api, "True", "IpsAvailable")
    })
    .await;
    let c = api.condition(NODE, CONDITION_TYPE).unwrap();
    assert!(c["lastTransitionTime"].is_string() && c["lastHeartbeatTime"].is_string());
    // Four changes (perhaps a first True before the pool tried the subnet): patched on change only,
    // not at every one-second look.
    let patches = api.counts().status_patches;
    assert!((4..=5).contains(&patches), "{patches} status patches");
    d.shutdown().await;
}

/// A node that holds all the IPs it may and has no idle one left says `NoIpCapacity`; a pod's DEL
/// gives it one back and the condition is `True` again. Without the startup taint on, no taint is
/// touched.
#[tokio::test]
async fn a_full_node_says_no_ip_capacity_until_an_ip_comes_back() {
    use daemon_support::*;
    let mock = mockcloud::MockCloud::start(mockcloud::Config::fast())
        .await
        .unwrap();
    let api = FakeApiServer::start().await;
    api.add_node(NODE, &[(DEFAULT_STARTUP_TAINT, "NoSchedule")]);
    let dir = TempDir::new("node-capacity");
    let mut config = config(&mock, &dir.0);
    config.node_name = NODE.into();
    config.api_server_url = Some(api.url());
    config.api_server_gc = Some(false);
    config.node_check_secs = 1;
    config.max_ips = Some(2);
    config.reuse_cooldown_secs = 0;
    let d = start(config).await;
    until("the condition turns True", 30, || {
        is(&api, "True", "IpsAvailable")
    })
    .await;
    let mut c = client(&d.socket_path).await;
    c.allocate(alloc_req("c1", "p1")).await.unwrap();
    c.allocate(alloc_req("c2", "p2")).await.unwrap();
    until("the condition says the node is full", 30, || {
        is(&api, "False", "NoIpCapacity")
    })
    .await;
    c.release(release_req("c1", false)).await.unwrap();
    until("the condition turns True again", 30, || {
        is(&api, "True", "IpsAvailable")
    })
    .await;
    assert_eq!(
        taints(&api).len(),
        1,
        "remove_startup_taint is off: the taint is not touched"
    );
    assert_eq!(api.counts().node_patches, 0);
    d.shutdown().await;
}

#[test]
fn startup_taint_settings_that_cannot_work_are_refused() {
    let base = DaemonConfig {
        remove_startup_taint: true,
        api_server_gc: Some(false),
        node_name: NODE.into(),
        api_server_url: Some("http://127.0.0.1:1".into()),
        ..DaemonConfig::default()
    };
    base.validate().unwrap();
    let e = DaemonConfig {
        startup_taint: String::new(),
        ..base.clone()
    }
    .validate()
    .unwrap_err();
    assert!(e.to_string().starts_with("startup_taint: empty"), "{e}");
    let e = DaemonConfig {
        startup_taint: "eniipam.io/not ready".into(),
        ..base.clone()
    }
    .validate()
    .unwrap_err();
    assert!(e.to_string().contains("is not a taint key"), "{e}");
    let e = DaemonConfig {
        node_name: String::new(),
        ..base.clone()
    }
    .validate()
    .unwrap_err();
    assert!(
        e.to_string()
            .starts_with("node_name: empty, but remove_startup_taint"),
        "{e}"
    );
    let e = DaemonConfig {
        api_server_url: None,
        ..base.clone()
    }
    .validate()
    .unwrap_err();
    assert!(e.to_string().starts_with("remove_startup_taint:"), "{e}");

    let vars = |pairs: &[(&str, &str)]| -> std::collections::BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };
    let e = DaemonConfig::load(
        None,
        &vars(&[("ENIIPAM_STARTUP_TAINT_EFFECT", "NoScheduling")]),
    )
    .unwrap_err();
    assert!(
        e.to_string().starts_with("startup_taint_effect:") && e.to_string().contains("NoExecute"),
        "{e}"
    );
    let c = DaemonConfig::load(
        None,
        &vars(&[
            ("ENIIPAM_STARTUP_TAINT", "example.com/warming"),
            ("ENIIPAM_STARTUP_TAINT_EFFECT", "NoExecute"),
        ]),
    )
    .unwrap();
    assert_eq!(
        (c.startup_taint.as_str(), c.startup_taint_effect),
        ("example.com/warming", TaintEffect::NoExecute)
    );
    // A TOML file with an effect Kubernetes does not have.
    let dir = daemon_support::TempDir::new("taint-config");
    let file = dir.0.join("eniipamd.toml");
    std::fs::write(&file, "startup_taint_effect = \"noschedule\"\n").unwrap();
    let e = DaemonConfig::load(Some(&file), &vars(&[])).unwrap_err();
    assert!(e.to_string().contains("startup_taint_effect"), "{e}");
}
