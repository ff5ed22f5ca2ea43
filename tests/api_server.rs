//! Issue 13.7: pods from the Kubernetes API server as a third source of truth for pod GC.
//!
//! The API server is a protocol double on loopback (`eniipam-kubeapi`, under `mocks/kubeapi`) that speaks list + watch as
//! kube-rs uses it (resourceVersions, chunked watch events, bookmarks, 410 Gone, GET, bearer tokens);
//! the kube client under test is the daemon's own ([`api_server::client`]). The GC runs over a real
//! `Ipam` (pool on the in-memory cloud, SQLite store) on tokio's paused clock, and through the real
//! daemon against mockcloud.

#[path = "daemon_support/mod.rs"]
mod daemon_support;
mod pool_support;

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use eniipam::config::DaemonConfig;
use eniipam::ipam::{AllocateRequest, Ipam};
use eniipam::metrics::Metrics;
use eniipam::model::{AttachmentKey, PodRef};
use eniipam::pool::{Acquire, AttachmentMeta};
use eniipam::reconcile::NetnsView;
use eniipam::reconcile::api_server::{
    self, ApiServerError, ApiServerGc, ApiServerTarget, PodPhase, PodWatch, release_gone_pods,
};
use eniipam::store::Store;
use eniipam_kubeapi::{FakeApiServer, pod_json};
use pool_support::memory_cloud::NodeSpec;
use tokio::time::advance;
use tokio_util::sync::CancellationToken;

const NODE: &str = "ip-10-0-1-10.ec2.internal";
const GRACE: Duration = Duration::from_secs(60);

/// A real `Ipam` (pool on the in-memory cloud, store in memory), the double, and the GC under test.
struct Fixture {
    api: FakeApiServer,
    ipam: Ipam,
    gc: ApiServerGc,
    metrics: Metrics,
    cancel: CancellationToken,
    _node: pool_support::Node,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

fn target(url: String) -> ApiServerTarget {
    ApiServerTarget {
        url,
        token_file: None,
        ca_file: None,
    }
}

async fn fixture_with(api: FakeApiServer, target: ApiServerTarget) -> Fixture {
    let node =
        pool_support::start_with_enis(pool_support::quiet_config(), NodeSpec::default(), &[8])
            .await;
    let store = Store::open_in_memory().await.expect("store");
    let metrics = Metrics::default();
    let ipam = Ipam::new(
        node.pool.clone(),
        store,
        Arc::new(AtomicBool::new(true)),
        Vec::new(),
        metrics.clone(),
    );
    let client = api_server::client(&target).expect("client");
    let cancel = CancellationToken::new();
    let (watch, _task) = PodWatch::spawn(
        client.clone(),
        NODE.to_owned(),
        metrics.clone(),
        cancel.clone(),
    );
    let gc = ApiServerGc::new(watch, client, GRACE, metrics.clone());
    Fixture {
        api,
        ipam,
        gc,
        metrics,
        cancel,
        _node: node,
    }
}

async fn fixture() -> Fixture {
    let api = FakeApiServer::start().await;
    let url = api.url();
    fixture_with(api, target(url)).await
}

fn key(container: &str) -> AttachmentKey {
    AttachmentKey::new(container, "eth0")
}

fn pod_ref(ns: &str, name: &str, uid: &str) -> PodRef {
    PodRef {
        namespace: ns.into(),
        name: name.into(),
        uid: uid.into(),
    }
}

impl Fixture {
    async fn allocate(&self, container: &str, pod: PodRef) -> Ipv4Addr {
        self.allocate_in(container, pod, "").await
    }

    async fn allocate_in(&self, container: &str, pod: PodRef, netns: &str) -> Ipv4Addr {
        self.ipam
            .allocate(AllocateRequest {
                acquire: Acquire {
                    key: key(container),
                    pod,
                    prefer: None,
                    sticky_key: None,
                    meta: AttachmentMeta {
                        network: "eniipam".into(),
                        netns: netns.into(),
                    },
                    wait: None,
                    network: None,
                },
                require_preferred: false,
                prefer6: None,
                ipam_role: false,
            })
            .await
            .expect("allocate")
            .allocation
            .expect("an IPv4 node")
            .ip
    }

    fn holds(&self, container: &str) -> bool {
        self.ipam.pool().allocation(&key(container)).is_some()
    }

    /// Waits (no time passes) until the watch's view satisfies `f`.
    async fn view(&self, f: impl FnMut(&api_server::BoundPods) -> bool) {
        self.gc.watch().wait_for(f).await;
    }

    async fn synced_with(&self, names: &[&str]) {
        self.view(|v| {
            v.synced
                && v.pods.len() == names.len()
                && names.iter().all(|n| v.get("default", n).is_some())
        })
        .await;
    }

    async fn gc_pass(&self) -> Vec<AttachmentKey> {
        self.gc_pass_seeing(&NetnsView::default()).await
    }

    /// A pass where the host's pod network namespaces are seen through `netns`.
    async fn gc_pass_seeing(&self, netns: &NetnsView) -> Vec<AttachmentKey> {
        release_gone_pods(&self.ipam, Some(&self.gc), netns)
            .await
            .into_iter()
            .map(|(k, _)| k)
            .collect()
    }

    fn released_metric(&self) -> u64 {
        self.metrics.api_server_released.get()
    }
}

#[tokio::test(start_paused = true)]
async fn a_pod_deleted_from_the_api_server_is_released_after_the_grace_period() {
    let f = fixture().await;
    f.api.add_pod("default", "web-1", "uid-1", NODE);
    f.api.add_pod("default", "web-2", "uid-2", NODE);
    f.api
        .add_pod("default", "elsewhere", "uid-9", "another-node");
    f.synced_with(&["web-1", "web-2"]).await;
    let ip1 = f.allocate("c1", pod_ref("default", "web-1", "uid-1")).await;
    f.allocate("c2", pod_ref("default", "web-2", "uid-2")).await;
    advance(GRACE * 2).await;
    assert!(f.gc_pass().await.is_empty(), "both pods are there");

    // A bookmark moves the watch's resourceVersion; the watch goes on.
    f.api.bookmark();
    f.api.delete_pod("default", "web-1");
    f.view(|v| v.get("default", "web-1").is_none()).await;
    assert!(f.gc_pass().await.is_empty(), "gone for 0 s");
    advance(GRACE - Duration::from_secs(1)).await;
    assert!(
        f.gc_pass().await.is_empty(),
        "gone for less than the grace period"
    );
    assert!(f.holds("c1"));
    let gets = f.api.counts().gets;
    advance(Duration::from_secs(2)).await;
    assert_eq!(f.gc_pass().await, vec![key("c1")]);
    assert!(!f.holds("c1") && f.holds("c2"));
    assert_eq!(f.api.counts().gets, gets + 1, "confirmed with one GET");
    assert_eq!(f.released_metric(), 1);
    // The release went through the service: the state file says released (idle, cooling).
    let state = f.ipam.store().load().await.unwrap();
    assert!(state.assignments.iter().all(|a| a.ip != ip1));
    assert!(state.idle.iter().any(|i| i.ip == ip1));
    assert!(f.gc_pass().await.is_empty(), "released once");
}

/// Issue 23, case 6: a pod force-deleted from the API server whose sandbox still runs (its network
/// namespace is still on the host) keeps its IP past the grace period — a new pod must not get an
/// address the old sandbox still uses — and the skip is counted; once the netns is gone, the next pass
/// releases it. The netns is a file in a directory the daemon sees, which is what the host evidence
/// checks ([`NetnsView::state`]: the path exists).
#[tokio::test(start_paused = true)]
async fn a_force_deleted_pod_keeps_its_ip_while_its_netns_is_alive() {
    let f = fixture().await;
    let dir = tempfile::tempdir().unwrap();
    let netns_dir = dir.path().join("netns");
    std::fs::create_dir(&netns_dir).unwrap();
    let netns = netns_dir.join("cni-1234");
    std::fs::write(&netns, b"").unwrap();
    let view = NetnsView::of(std::slice::from_ref(&netns_dir));
    f.api.add_pod("default", "web-1", "uid-1", NODE);
    f.synced_with(&["web-1"]).await;
    let ip = f
        .allocate_in(
            "c1",
            pod_ref("default", "web-1", "uid-1"),
            &netns.display().to_string(),
        )
        .await;
    advance(GRACE * 2).await;
    f.api.delete_pod("default", "web-1");
    f.view(|v| v.get("default", "web-1").is_none()).await;
    for _ in 0..3 {
        advance(GRACE).await;
        assert!(
            f.gc_pass_seeing(&view).await.is_empty(),
            "the sandbox still runs"
        );
        assert!(f.holds("c1"), "{ip} stays with the pod");
    }
    assert_eq!(f.released_metric(), 0);
    assert_eq!(
        f.metrics.api_server_release_deferred.get(),
        3,
        "each skip counted"
    );

    // The sandbox is gone (the netns file removed): the next pass releases the IP.
    std::fs::remove_file(&netns).unwrap();
    advance(Duration::from_secs(1)).await;
    assert_eq!(f.gc_pass_seeing(&view).await, vec![key("c1")]);
    assert!(!f.holds("c1"));
    assert_eq!(f.released_metric(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_pod_recreated_with_the_same_name_and_a_new_uid_releases_the_old_allocation() {
    let f = fixture().await;
    f.api.add_pod("default", "db-0", "uid-old", NODE);
    f.synced_with(&["db-0"]).await;
    f.allocate("c-old", pod_ref("default", "db-0", "uid-old"))
        .await;
    advance(GRACE).await;
    // The StatefulSet controller deletes and recreates db-0; the old sandbox's DEL never came.
    f.api.delete_pod("default", "db-0");
    f.api.add_pod("default", "db-0", "uid-new", NODE);
    f.view(|v| v.get("default", "db-0").is_some_and(|p| p.uid == "uid-new"))
        .await;
    f.allocate("c-new", pod_ref("default", "db-0", "uid-new"))
        .await;
    advance(GRACE + Duration::from_secs(1)).await;
    assert_eq!(f.gc_pass().await, vec![key("c-old")]);
    assert!(f.holds("c-new"), "the new pod keeps its IP");
}

#[tokio::test(start_paused = true)]
async fn a_finished_pod_is_released() {
    let f = fixture().await;
    f.api.add_pod("batch", "job-abc", "uid-j", NODE);
    f.view(|v| v.synced && v.get("batch", "job-abc").is_some())
        .await;
    f.allocate("c-job", pod_ref("batch", "job-abc", "uid-j"))
        .await;
    advance(GRACE).await;
    f.api.set_phase("batch", "job-abc", "Succeeded");
    f.view(|v| {
        v.get("batch", "job-abc")
            .is_some_and(|p| p.phase == PodPhase::Succeeded)
    })
    .await;
    assert!(f.gc_pass().await.is_empty());
    advance(GRACE).await;
    assert_eq!(f.gc_pass().await, vec![key("c-job")]);
}

#[tokio::test(start_paused = true)]
async fn pods_still_present_or_without_identity_are_kept() {
    let f = fixture().await;
    f.api.add_pod("default", "web-1", "uid-1", NODE);
    // Terminating: still running until the kubelet stops it.
    let mut terminating = pod_json("default", "slow-stop", "uid-s", NODE, "Running");
    terminating["metadata"]["deletionTimestamp"] = serde_json::json!("2026-01-01T00:00:00Z");
    f.api.put_pod(terminating);
    // A static pod's mirror: the record holds the static pod's uid (its config hash).
    let mirror_name = format!("kube-proxy-{NODE}");
    let mut mirror = pod_json("kube-system", &mirror_name, "api-uid", NODE, "Running");
    mirror["metadata"]["annotations"]["kubernetes.io/config.mirror"] =
        serde_json::json!("config-hash");
    f.api.put_pod(mirror);
    f.view(|v| v.synced && v.pods.len() == 3).await;
    f.allocate("c1", pod_ref("default", "web-1", "uid-1")).await;
    f.allocate("c-stop", pod_ref("default", "slow-stop", "uid-s"))
        .await;
    f.allocate(
        "c-static",
        pod_ref("kube-system", &mirror_name, "config-hash"),
    )
    .await;
    // A static pod whose mirror pod is not in the API at all: unknown, not gone.
    f.allocate(
        "c-static-nomirror",
        pod_ref("kube-system", &format!("etcd-{NODE}"), "hash-2"),
    )
    .await;
    // IPAM role without K8S_POD_*: no pod identity, never this source's to release.
    f.allocate("c-anon", PodRef::default()).await;
    for _ in 0..10 {
        advance(GRACE).await;
        assert!(f.gc_pass().await.is_empty());
    }
    for c in ["c1", "c-stop", "c-static", "c-static-nomirror", "c-anon"] {
        assert!(f.holds(c), "{c} kept");
    }
    let view = f.gc.watch().bound_pods();
    assert!(view.get("default", "web-1").unwrap().wants_ip());
    assert!(!view.get("default", "slow-stop").unwrap().wants_ip());
    assert_eq!(f.released_metric(), 0);
}

#[tokio::test(start_paused = true)]
async fn while_the_api_server_is_down_nothing_is_released() {
    let f = fixture().await;
    f.api.add_pod("default", "web-1", "uid-1", NODE);
    f.api.add_pod("default", "web-2", "uid-2", NODE);
    f.synced_with(&["web-1", "web-2"]).await;
    f.allocate("c1", pod_ref("default", "web-1", "uid-1")).await;
    f.allocate("c2", pod_ref("default", "web-2", "uid-2")).await;
    advance(GRACE).await;

    f.api.stop().await;
    // Deleted while eniipam cannot see the API server.
    f.api.delete_pod("default", "web-1");
    f.view(|v| !v.synced).await;
    for _ in 0..10 {
        advance(GRACE).await;
        assert!(f.gc_pass().await.is_empty(), "unknown, never gone");
    }
    assert!(f.holds("c1") && f.holds("c2"));
    assert!(!f.gc.watch().is_synced());
    assert!(f.metrics.api_server_watch_errors.get() >= 1);
    // The pods it knew stay visible (a lookahead may still use them), marked not synced.
    assert_eq!(f.gc.watch().bound_pods().pods.len(), 2);

    // Back: a fresh list shows web-1 gone; released a grace period later.
    f.api.restart().await;
    f.view(|v| v.synced && v.get("default", "web-1").is_none())
        .await;
    assert!(f.gc_pass().await.is_empty());
    advance(GRACE + Duration::from_secs(1)).await;
    assert_eq!(f.gc_pass().await, vec![key("c1")]);
    assert!(f.holds("c2"));
}

#[tokio::test(start_paused = true)]
async fn a_watch_that_never_synced_releases_nothing_even_if_get_works() {
    let api = FakeApiServer::start().await;
    // RBAC grants get but not list/watch: the view never syncs.
    api.forbid_list_watch(true);
    let url = api.url();
    let f = fixture_with(api, target(url)).await;
    // Allocations from before (the state file), for pods the API server no longer has.
    f.allocate("c1", pod_ref("default", "web-1", "uid-1")).await;
    let mut changes = f.gc.watch().subscribe();
    while f.metrics.api_server_watch_errors.get() < 2 {
        changes.changed().await.unwrap();
    }
    for _ in 0..10 {
        advance(GRACE).await;
        assert!(f.gc_pass().await.is_empty(), "unknown, never gone");
    }
    assert!(f.holds("c1"));
    assert_eq!(
        f.api.counts().gets,
        0,
        "not even asked: the view is not synced"
    );

    // Allowed again: the first complete list shows web-1 absent; released a grace period later.
    f.api.forbid_list_watch(false);
    f.view(|v| v.synced).await;
    assert!(f.gc_pass().await.is_empty());
    advance(GRACE).await;
    assert_eq!(f.gc_pass().await, vec![key("c1")]);
}

#[tokio::test(start_paused = true)]
async fn a_pod_the_watch_has_not_seen_yet_is_kept_after_a_get() {
    let f = fixture().await;
    f.view(|v| v.synced).await;
    // The watch lags (the API server's cache is behind): a pod bound and ADDed is not in the view.
    f.api.hold_events();
    f.api.add_pod("default", "new-1", "uid-n", NODE);
    f.allocate("c-new", pod_ref("default", "new-1", "uid-n"))
        .await;
    advance(GRACE).await;
    for _ in 0..3 {
        // Seen missing: the grace period starts (the watch never saw it depart).
        let gets = f.api.counts().gets;
        assert!(f.gc_pass().await.is_empty());
        assert_eq!(f.api.counts().gets, gets);
        // Missing for the grace period: the API server is asked, has it, and it is kept.
        advance(GRACE).await;
        assert!(f.gc_pass().await.is_empty());
        assert_eq!(
            f.api.counts().gets,
            gets + 1,
            "asked the API server, which has it"
        );
    }
    assert!(f.holds("c-new"));
    f.api.release_events();
    f.view(|v| v.get("default", "new-1").is_some()).await;
    let gets = f.api.counts().gets;
    advance(GRACE).await;
    assert!(f.gc_pass().await.is_empty());
    assert_eq!(f.api.counts().gets, gets, "in the view: no GET needed");
}

#[tokio::test(start_paused = true)]
async fn an_expired_watch_relists_and_sees_what_it_missed() {
    let f = fixture().await;
    f.api.add_pod("default", "web-1", "uid-1", NODE);
    f.api.add_pod("default", "web-2", "uid-2", NODE);
    f.synced_with(&["web-1", "web-2"]).await;
    f.allocate("c1", pod_ref("default", "web-1", "uid-1")).await;
    advance(GRACE).await;
    let before = f.api.counts();
    // The watch ends (server-side timeout) and, before kube re-watches, history moves on and is
    // compacted: the re-watch from the old resourceVersion gets 410 Gone, and the deletion is only
    // learned from the re-list.
    f.api.end_watches();
    f.api.add_pod("default", "other", "uid-o", "another-node");
    f.api.delete_pod("default", "web-1");
    f.api.compact();
    f.view(|v| v.synced && v.get("default", "web-1").is_none())
        .await;
    // (On the paused clock kube may also abandon a watch request on its idle timeout and send it
    // again: at least one 410, and a re-list.)
    let after = f.api.counts();
    assert!(after.expired > before.expired, "{after:?}");
    assert!(after.lists > before.lists, "re-listed: {after:?}");
    // Lists are served from the watch cache (resourceVersion=0), not paged.
    let requests = f.api.requests();
    let lists: Vec<&String> = requests
        .iter()
        .filter(|r| !r.contains("watch=true"))
        .collect();
    assert!(
        lists
            .iter()
            .all(|r| r.contains("resourceVersion=0") && !r.contains("limit=")),
        "{lists:?}"
    );
    advance(GRACE + Duration::from_secs(1)).await;
    assert_eq!(f.gc_pass().await, vec![key("c1")]);
}

#[tokio::test(start_paused = true)]
async fn the_service_account_token_is_sent_and_a_refusal_keeps_pods_unknown() {
    let dir = daemon_support::TempDir::new("api-token");
    let token = dir.0.join("token");
    std::fs::write(&token, "s3cret").unwrap();
    let api = FakeApiServer::start().await;
    api.require_token("s3cret");
    api.add_pod("default", "web-1", "uid-1", NODE);
    let url = api.url();
    let f = fixture_with(
        api,
        ApiServerTarget {
            url: url.clone(),
            token_file: Some(token.clone()),
            ca_file: None,
        },
    )
    .await;
    f.synced_with(&["web-1"]).await;
    assert_eq!(f.api.counts().unauthorized, 0);

    // Another client with a wrong token: refused, never synced, so nothing is gone.
    let bad = dir.0.join("bad-token");
    std::fs::write(&bad, "wrong").unwrap();
    let client = api_server::client(&ApiServerTarget {
        url,
        token_file: Some(bad),
        ca_file: None,
    })
    .unwrap();
    let metrics = Metrics::default();
    let (watch, _t) = PodWatch::spawn(client, NODE.into(), metrics.clone(), f.cancel.clone());
    // Every refusal is a watch error (and a view update); the retries back off on the paused clock.
    let mut changes = watch.subscribe();
    while metrics.api_server_watch_errors.get() < 3 {
        changes.changed().await.unwrap();
    }
    assert!(!watch.is_synced() && watch.bound_pods().pods.is_empty());
    assert!(f.api.counts().unauthorized >= 3);
    assert!(f.gc.watch().is_synced(), "the right token still works");
}

#[test]
fn config_in_a_cluster_needs_the_node_name() {
    let env = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };
    // A pod with its service-account token mounted.
    let dir = daemon_support::TempDir::new("api-config");
    let token = dir.0.join("token");
    std::fs::write(&token, "t").unwrap();
    let token = token.to_str().unwrap();
    let in_cluster = [
        ("KUBERNETES_SERVICE_HOST", "10.100.0.1"),
        ("KUBERNETES_SERVICE_PORT", "443"),
        ("ENIIPAM_API_SERVER_TOKEN_FILE", token),
    ];
    // In a pod without ENIIPAM_NODE_NAME: a clear error that names the variable.
    let e = DaemonConfig::load(None, &env(&in_cluster)).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.starts_with("node_name:") && msg.contains("ENIIPAM_NODE_NAME"),
        "{msg}"
    );
    // Asked for explicitly, outside a cluster, without a node name: the same.
    let e = DaemonConfig::load(
        None,
        &env(&[
            ("ENIIPAM_API_SERVER_GC", "true"),
            ("ENIIPAM_API_SERVER_URL", "https://api.example:6443"),
        ]),
    )
    .unwrap_err();
    assert!(e.to_string().contains("ENIIPAM_NODE_NAME"), "{e}");
    // Asked for without any API server.
    let e = DaemonConfig::load(
        None,
        &env(&[
            ("ENIIPAM_API_SERVER_GC", "true"),
            ("ENIIPAM_NODE_NAME", "n"),
        ]),
    )
    .unwrap_err();
    assert!(
        e.to_string().starts_with("api_server_gc:")
            && e.to_string().contains("KUBERNETES_SERVICE_HOST"),
        "{e}"
    );
    // In a pod with the node name: on, with the service account's token and CA.
    let mut vars = env(&in_cluster);
    vars.insert("ENIIPAM_NODE_NAME".into(), NODE.into());
    let c = DaemonConfig::load(None, &vars).unwrap();
    assert!(c.api_server_gc_enabled());
    let t = c.api_server_target().unwrap();
    assert_eq!(t.url, "https://10.100.0.1:443");
    assert_eq!(t.token_file.as_deref(), Some(std::path::Path::new(token)));
    assert_eq!(
        t.ca_file.as_deref(),
        Some(std::path::Path::new(eniipam::config::SERVICE_ACCOUNT_CA))
    );
    // IPv6 service host.
    let c = DaemonConfig::load(
        None,
        &env(&[
            ("KUBERNETES_SERVICE_HOST", "fd00::1"),
            ("KUBERNETES_SERVICE_PORT", "443"),
            ("ENIIPAM_API_SERVER_TOKEN_FILE", token),
            ("ENIIPAM_NODE_NAME", "n"),
        ]),
    )
    .unwrap();
    assert_eq!(c.api_server_url.as_deref(), Some("https://[fd00::1]:443"));
    // A pod without a service-account token (automountServiceAccountToken: false) still has
    // KUBERNETES_SERVICE_HOST: no in-cluster config, so off, and no node name needed.
    let no_token = dir.0.join("no-token");
    let c = DaemonConfig::load(
        None,
        &env(&[
            ("KUBERNETES_SERVICE_HOST", "10.100.0.1"),
            ("KUBERNETES_SERVICE_PORT", "443"),
            ("ENIIPAM_API_SERVER_TOKEN_FILE", no_token.to_str().unwrap()),
        ]),
    )
    .unwrap();
    assert!(!c.api_server_gc_enabled() && c.api_server_target().is_none());
    // ... unless asked for: then the node name is required, and the missing token is an error when
    // the daemon starts (client_settings_that_cannot_work_are_clear_errors).
    let e = DaemonConfig::load(
        None,
        &env(&[
            ("KUBERNETES_SERVICE_HOST", "10.100.0.1"),
            ("KUBERNETES_SERVICE_PORT", "443"),
            ("ENIIPAM_API_SERVER_TOKEN_FILE", no_token.to_str().unwrap()),
            ("ENIIPAM_API_SERVER_GC", "true"),
        ]),
    )
    .unwrap_err();
    assert!(e.to_string().contains("ENIIPAM_NODE_NAME"), "{e}");
    // Turned off: no node name needed.
    let mut vars = env(&in_cluster);
    vars.insert("ENIIPAM_API_SERVER_GC".into(), "false".into());
    let c = DaemonConfig::load(None, &vars).unwrap();
    assert!(!c.api_server_gc_enabled() && c.api_server_target().is_none());
    // Outside a cluster: off by default.
    let c = DaemonConfig::load(None, &env(&[])).unwrap();
    assert!(!c.api_server_gc_enabled());
    // Bad values name their knob.
    for (k, v, knob) in [
        ("ENIIPAM_NODE_NAME", "Node_A", "node_name:"),
        ("ENIIPAM_API_SERVER_GC", "maybe", "api_server_gc:"),
        (
            "ENIIPAM_API_SERVER_GRACE_SECS",
            "100000",
            "api_server_grace_secs:",
        ),
        (
            "ENIIPAM_API_SERVER_URL",
            "api.example:6443",
            "api_server_url:",
        ),
        (
            "KUBERNETES_SERVICE_PORT",
            "https",
            "KUBERNETES_SERVICE_PORT:",
        ),
    ] {
        let mut vars = env(&in_cluster);
        vars.insert("ENIIPAM_NODE_NAME".into(), "n".into());
        vars.insert(k.into(), v.into());
        let e = DaemonConfig::load(None, &vars).unwrap_err();
        assert!(e.to_string().starts_with(knob), "{k}={v}: {e}");
    }
}

fn client_err(t: &ApiServerTarget) -> ApiServerError {
    match api_server::client(t) {
        Ok(_) => panic!("{t:?} should be refused"),
        Err(e) => e,
    }
}

#[test]
fn client_settings_that_cannot_work_are_clear_errors() {
    let dir = daemon_support::TempDir::new("api-client");
    let https =
        |ca: Option<std::path::PathBuf>, token: Option<std::path::PathBuf>| ApiServerTarget {
            url: "https://10.100.0.1:443".into(),
            token_file: token,
            ca_file: ca,
        };
    let missing = dir.0.join("missing");
    let e = client_err(&https(Some(missing.clone()), None));
    assert!(matches!(e, ApiServerError::Ca { .. }), "{e}");
    assert!(e.to_string().contains("api_server_ca_file"), "{e}");
    let not_pem = dir.0.join("ca.crt");
    std::fs::write(&not_pem, "not a certificate").unwrap();
    let e = client_err(&https(Some(not_pem), None));
    assert!(e.to_string().contains("no PEM certificate"), "{e}");
    let e = client_err(&https(None, None));
    assert!(matches!(e, ApiServerError::NoCa), "{e}");
    let e = client_err(&ApiServerTarget {
        url: "http://127.0.0.1:1".into(),
        token_file: Some(missing),
        ca_file: None,
    });
    assert!(e.to_string().contains("api_server_token_file"), "{e}");
    // kube sends the token file verbatim: a trailing newline is refused up front, clearly.
    let newline = dir.0.join("token");
    std::fs::write(&newline, "abc\n").unwrap();
    let e = client_err(&ApiServerTarget {
        url: "http://127.0.0.1:1".into(),
        token_file: Some(newline),
        ca_file: None,
    });
    assert!(matches!(e, ApiServerError::TokenFormat { .. }), "{e}");
    let e = client_err(&target("ftp://x".into()));
    assert!(matches!(e, ApiServerError::Url { .. }), "{e}");
}

/// `fut`, or a panic naming `what` after 30 s (real time).
async fn within<F: std::future::Future>(what: &str, fut: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(30), fut)
        .await
        .unwrap_or_else(|_| panic!("timed out: {what}"))
}

/// The main case through the real daemon on mockcloud: ADD over gRPC, the pod deleted from the API
/// server without a DEL, the running reconcile releases it; with the API server down, nothing is.
#[tokio::test]
async fn the_daemon_releases_pods_gone_from_the_api_server() {
    use daemon_support::*;
    let mock = mockcloud::MockCloud::start(mockcloud::Config::fast())
        .await
        .unwrap();
    let api = FakeApiServer::start().await;
    api.add_pod("default", "p1", "uid-p1", NODE);
    api.add_pod("default", "p2", "uid-p2", NODE);
    let dir = TempDir::new("api-server-daemon");
    let mut config = config(&mock, &dir.0);
    config.node_name = NODE.into();
    config.api_server_url = Some(api.url());
    // Released at the first pass that sees the pod gone (after a confirming GET): this test drives
    // the reconcile with `reconcile_now` on real time; the grace period itself is tested above.
    config.api_server_grace_secs = 0;
    config.validate().unwrap();
    assert!(config.api_server_gc_enabled(), "on: an API server is known");
    let d = start(config).await;
    let watch = d.api_server().expect("API-server GC on").watch().clone();
    within(
        "the watch syncs",
        watch.wait_for(|v| v.synced && v.pods.len() == 2),
    )
    .await;

    let mut c = client(&d.socket_path).await;
    c.allocate(alloc_req("c1", "p1")).await.unwrap();
    c.allocate(alloc_req("c2", "p2")).await.unwrap();
    let r = d.reconcile_now().await.unwrap();
    assert!(r.released_gone_from_api.is_empty(), "{r:?}");

    api.delete_pod("default", "p1");
    within(
        "the watch sees the deletion",
        watch.wait_for(|v| v.get("default", "p1").is_none()),
    )
    .await;
    let r = d.reconcile_now().await.unwrap();
    let k1 = AttachmentKey::new("c1", "eth0");
    let k2 = AttachmentKey::new("c2", "eth0");
    assert_eq!(
        r.released_gone_from_api
            .iter()
            .map(|(k, _)| k.clone())
            .collect::<Vec<_>>(),
        vec![k1.clone()]
    );
    assert!(d.pool.allocation(&k1).is_none() && d.pool.allocation(&k2).is_some());
    let metrics = reqwest::get(format!("http://{}/metrics", d.metrics_addr))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("eniipam_api_server_released_total 1"),
        "{metrics}"
    );
    assert!(metrics.contains("eniipam_api_server_synced 1"), "{metrics}");
    assert!(
        metrics.contains("eniipam_api_server_bound_pods 1"),
        "{metrics}"
    );
    // The snapshot a lookahead reads.
    let bound = d.bound_pods().unwrap();
    assert!(bound.synced && bound.get("default", "p2").is_some_and(|p| p.wants_ip()));

    // The API server goes away; p2 is deleted meanwhile: unknown, kept.
    api.stop().await;
    api.delete_pod("default", "p2");
    within(
        "the watch notices the API server is gone",
        watch.wait_for(|v| !v.synced),
    )
    .await;
    let r = d.reconcile_now().await.unwrap();
    assert!(r.released_gone_from_api.is_empty(), "{r:?}");
    assert!(d.pool.allocation(&k2).is_some());
    d.shutdown().await;
}
