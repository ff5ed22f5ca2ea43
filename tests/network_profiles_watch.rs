//! Issue 27, item 2: the cluster's NetworkProfiles and the namespaces' `eniipam.io/network`
//! annotations, read from the API server by the daemon's watchers ([`network_profiles::spawn`],
//! [`network_profiles::spawn_namespaces`]) with the daemon's own kube client against the API-server
//! double (`mocks/kubeapi`), on tokio's paused clock (kube's backoff advances virtual time only).

use std::collections::BTreeMap;
use std::time::Duration;

use eniipam::network_profiles::{
    self, EgressMode, Namespaces, ProfileSpec, Profiles, SubnetChoice,
};
use eniipam::reconcile::api_server::{self, ApiServerTarget, BoundPod};
use eniipam_kubeapi::{Crd, FakeApiServer, pod_json};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::task::JoinHandle;

fn client(api: &FakeApiServer) -> kube::Client {
    api_server::client(&ApiServerTarget {
        url: api.url(),
        token_file: None,
        ca_file: None,
    })
    .expect("client")
}

struct Fixture {
    api: FakeApiServer,
    crd: Crd,
    rx: watch::Receiver<Profiles>,
    task: JoinHandle<()>,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn start(setup: impl FnOnce(&FakeApiServer, &Crd)) -> Fixture {
    let api = FakeApiServer::start().await;
    let crd = Crd::network_profile();
    api.install_crd(crd.clone());
    setup(&api, &crd);
    let (rx, task) = network_profiles::spawn(client(&api));
    Fixture { api, crd, rx, task }
}

fn profile(name: &str, spec: Value) -> Value {
    json!({"metadata": {"name": name}, "spec": spec})
}

fn db_spec(subnet: &str) -> Value {
    json!({"subnet": subnet, "securityGroups": ["sg-0123abcd"], "maxEnisPerNode": 2})
}

fn db(subnet: &str) -> ProfileSpec {
    ProfileSpec {
        name: "db".into(),
        subnet: SubnetChoice::Id(subnet.into()),
        security_groups: vec!["sg-0123abcd".into()],
        max_enis: Some(2),
        egress_mode: EgressMode::Strict,
    }
}

impl Fixture {
    fn put(&self, name: &str, spec: Value) {
        self.api.put_object(&self.crd, profile(name, spec));
    }

    /// Waits until the published value satisfies `f`.
    async fn until(&mut self, what: &str, f: impl Fn(&Profiles) -> bool) {
        let rx = &mut self.rx;
        let wait = async {
            loop {
                if f(&rx.borrow_and_update()) {
                    return;
                }
                rx.changed().await.expect("the watcher stopped");
            }
        };
        if tokio::time::timeout(Duration::from_secs(600), wait)
            .await
            .is_err()
        {
            panic!("never {what}: {:?}", *self.rx.borrow());
        }
    }
}

#[tokio::test(start_paused = true)]
async fn valid_invalid_changed_and_deleted_profiles() {
    let mut f = start(|api, crd| {
        api.put_object(crd, profile("db", db_spec("subnet-0a1b2c3d")));
        api.put_object(
            crd,
            profile("web", json!({"subnetSelector": {"tags": {"tier": "web"}}, "securityGroups": ["sg-0123abcd", "default"]})),
        );
    })
    .await;
    f.until("both listed", |p| p.known).await;
    let now = f.rx.borrow().clone();
    assert_eq!(
        now.valid,
        BTreeMap::from([("db".to_owned(), db("subnet-0a1b2c3d"))])
    );
    let why = &now.invalid["web"];
    assert!(
        why.contains(
            "NetworkProfile \"web\": spec.securityGroups[1] \"default\" is not a security group id"
        ),
        "{why}"
    );

    // Fixed: it becomes valid, with its tag selector.
    f.put(
        "web",
        json!({"subnetSelector": {"tags": {"tier": "web"}}, "securityGroups": ["sg-4567ef01"]}),
    );
    f.until("web fixed", |p| {
        p.valid.contains_key("web") && p.invalid.is_empty()
    })
    .await;
    assert_eq!(
        f.rx.borrow().valid["web"].subnet,
        SubnetChoice::Tags(BTreeMap::from([("tier".into(), "web".into())]))
    );

    // Changed: the new subnet is published.
    f.put("db", db_spec("subnet-0e1b2c3d"));
    f.until("db changed", |p| {
        p.valid.get("db") == Some(&db("subnet-0e1b2c3d"))
    })
    .await;

    // Deleted: gone from both maps.
    assert!(f.api.delete_object(&f.crd, None, "db"));
    f.until("db deleted", |p| !p.valid.contains_key("db")).await;
    assert_eq!(f.rx.borrow().valid.keys().collect::<Vec<_>>(), ["web"]);
}

#[tokio::test(start_paused = true)]
async fn the_api_server_restarted_and_changes_made_meanwhile_are_seen() {
    let mut f = start(|api, crd| {
        api.put_object(crd, profile("db", db_spec("subnet-0a1b2c3d")));
        api.put_object(crd, profile("old", db_spec("subnet-0b1b2c3d")));
    })
    .await;
    f.until("listed", |p| p.known && p.valid.len() == 2).await;

    f.api.stop().await;
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert_eq!(
        f.rx.borrow().valid.len(),
        2,
        "the last value stays while it is away"
    );
    f.put("db", db_spec("subnet-0f1b2c3d"));
    f.api.restart().await;
    f.until("db changed meanwhile", |p| {
        p.valid.get("db") == Some(&db("subnet-0f1b2c3d"))
    })
    .await;

    // Away again with history compacted: a re-list (410), and a profile deleted meanwhile goes.
    f.api.stop().await;
    assert!(f.api.delete_object(&f.crd, None, "old"));
    f.api.compact();
    f.api.restart().await;
    f.until("old gone", |p| !p.valid.contains_key("old")).await;
    assert!(f.api.counts().expired >= 1, "{:?}", f.api.counts());
}

#[tokio::test(start_paused = true)]
async fn without_the_crd_profiles_stay_unknown_until_it_is_installed() {
    let api = FakeApiServer::start().await;
    let (mut rx, task) = network_profiles::spawn(client(&api));
    let r = tokio::time::timeout(Duration::from_secs(60), rx.changed()).await;
    assert!(r.is_err(), "published {:?}", *rx.borrow());
    assert!(!rx.borrow().known);
    let crd = Crd::network_profile();
    api.install_crd(crd.clone());
    api.put_object(&crd, profile("db", db_spec("subnet-0a1b2c3d")));
    let mut f = Fixture { api, crd, rx, task };
    f.until("known", |p| p.known && p.valid.contains_key("db"))
        .await;
}

/// The pod's annotation (from the pod watch's `BoundPod`) wins over its namespace's, an empty one
/// means the default network, and namespace annotation changes are seen.
#[tokio::test(start_paused = true)]
async fn a_pod_selects_its_own_profile_else_its_namespaces() {
    const A: &str = network_profiles::ANNOTATION;
    let api = FakeApiServer::start().await;
    api.put_namespace("team-a", &[(A, "app")]);
    api.put_namespace("team-b", &[]);
    api.put_namespace("team-c", &[(A, "")]);
    let (ns, task) = network_profiles::spawn_namespaces(client(&api));
    wait(&ns, "synced", |ns| ns.synced()).await;
    assert_eq!(ns.profile_of("team-a").as_deref(), Some("app"));
    assert_eq!(ns.profile_of("team-b"), None);
    assert_eq!(ns.profile_of("team-c"), None, "empty: the default network");
    assert_eq!(ns.profile_of("nowhere"), None);

    // The pod's own annotation, as the pod watch keeps it.
    let mut pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value({
        let mut p = pod_json("team-a", "db-0", "uid-db-0", "node-1", "Pending");
        p["metadata"]["annotations"] = json!({A: "db"});
        p
    })
    .unwrap();
    let bound = BoundPod::from_pod(&pod).unwrap();
    assert_eq!(bound.network.as_deref(), Some("db"));
    assert_eq!(
        ns.pod_profile("team-a", bound.network.as_deref())
            .as_deref(),
        Some("db")
    );
    pod.metadata.annotations = Some(BTreeMap::from([(A.to_owned(), String::new())]));
    let opted_out = BoundPod::from_pod(&pod).unwrap();
    assert_eq!(opted_out.network.as_deref(), Some(""));
    assert_eq!(
        ns.pod_profile("team-a", opted_out.network.as_deref()),
        None,
        "the pod opts out"
    );
    pod.metadata.annotations = None;
    let plain = BoundPod::from_pod(&pod).unwrap();
    assert_eq!(
        ns.pod_profile("team-a", plain.network.as_deref())
            .as_deref(),
        Some("app")
    );

    // Namespace annotations change, a namespace comes and goes.
    api.set_namespace_annotation("team-b", A, Some("web"));
    wait(&ns, "team-b annotated", |ns| {
        ns.profile_of("team-b").as_deref() == Some("web")
    })
    .await;
    api.set_namespace_annotation("team-a", A, None);
    wait(&ns, "team-a cleared", |ns| {
        ns.profile_of("team-a").is_none()
    })
    .await;
    api.put_namespace("team-d", &[(A, "db")]);
    wait(&ns, "team-d", |ns| {
        ns.profile_of("team-d").as_deref() == Some("db")
    })
    .await;

    // After a restart with history compacted, a namespace deleted meanwhile is gone.
    api.stop().await;
    assert!(api.delete_namespace("team-d"));
    api.compact();
    api.restart().await;
    wait(&ns, "team-d gone", |ns| ns.profile_of("team-d").is_none()).await;
    assert_eq!(ns.profile_of("team-b").as_deref(), Some("web"));
    task.abort();
}

/// Polls `ns` (its view has no change channel: the daemon reads it on a CNI ADD) until `f` holds.
async fn wait(ns: &Namespaces, what: &str, f: impl Fn(&Namespaces) -> bool) {
    for _ in 0..6000 {
        if f(ns) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("never {what}: {ns:?}");
}

/// `deploy/networkprofile-crd.yaml` defines the resource the daemon reads, and the double serves it.
#[test]
fn the_shipped_crd_is_the_resource_the_daemon_reads() {
    use eniipam::network_profiles::NetworkProfile;
    use kube::Resource;

    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/networkprofile-crd.yaml"
    );
    let yaml = std::fs::read_to_string(path).unwrap();
    let lines: Vec<&str> = yaml
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .collect();
    let has = |line: String| {
        assert!(
            lines.contains(&line.as_str()),
            "{path} has no line {line:?}"
        )
    };
    has(format!(
        "name: {}.{}",
        NetworkProfile::plural(&()),
        NetworkProfile::group(&())
    ));
    has(format!("group: {}", NetworkProfile::group(&())));
    has(format!("- name: {}", NetworkProfile::version(&())));
    has(format!("plural: {}", NetworkProfile::plural(&())));
    has(format!("kind: {}", NetworkProfile::kind(&())));
    has("scope: Cluster".into());
    let crd = Crd::network_profile();
    assert_eq!(
        (
            crd.group.as_str(),
            crd.version.as_str(),
            crd.kind.as_str(),
            crd.plural.as_str(),
            crd.namespaced
        ),
        (
            "eniipam.io",
            "v1alpha1",
            "NetworkProfile",
            "networkprofiles",
            false
        ),
    );
}
