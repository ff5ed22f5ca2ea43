//! Issue 27, item 1: the node's ENIConfig, read from the API server as the VPC CNI reads it.
//!
//! The daemon's watcher ([`custom_networking::spawn`]) with the daemon's own kube client
//! ([`api_server::client`]) against the API-server double (`mocks/kubeapi`, which serves the
//! ENIConfig CRD and watches the node by name), on tokio's paused clock: kube's backoff and the
//! "nothing more comes" checks advance virtual time only when every task (the double included) is
//! idle. Virtual time also jumps while loopback bytes are in flight, so "nothing was published" is
//! never concluded from a quiet minute alone: the watcher logs each value it publishes, and a test
//! counts those lines up to a later change it does see ([`Logs`]).

#[path = "log_capture/mod.rs"]
mod log_capture;

use std::time::Duration;

use eniipam::custom_networking::{self, NodeNetwork, PodNetwork, Selector};
use eniipam::reconcile::api_server::{self, ApiServerTarget};
use eniipam_kubeapi::{Crd, FakeApiServer, eniconfig_json};
use log_capture::Logs;
use tokio::sync::watch;
use tokio::task::JoinHandle;

const NODE: &str = "ip-10-0-1-10.ec2.internal";
const KEY: &str = "k8s.amazonaws.com/eniConfig";
const ZONE: &str = "topology.kubernetes.io/zone";

/// How many values the watcher has published so far.
fn published(logs: &Logs) -> usize {
    logs.count("the node's custom networking changed")
}

struct Fixture {
    api: FakeApiServer,
    crd: Crd,
    rx: watch::Receiver<NodeNetwork>,
    task: JoinHandle<()>,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The double with the CRD installed and the node registered (no labels), `setup` applied, then
/// the watcher started.
async fn start(sel: Selector, setup: impl FnOnce(&FakeApiServer, &Crd)) -> Fixture {
    let api = FakeApiServer::start().await;
    let crd = Crd::eniconfig();
    api.install_crd(crd.clone());
    api.add_node(NODE, &[]);
    setup(&api, &crd);
    let client = api_server::client(&ApiServerTarget {
        url: api.url(),
        token_file: None,
        ca_file: None,
    })
    .expect("client");
    let (rx, task) = custom_networking::spawn(client, NODE.to_owned(), sel);
    Fixture { api, crd, rx, task }
}

fn ready(name: &str, subnet: &str, groups: &[&str]) -> NodeNetwork {
    NodeNetwork::Ready(PodNetwork {
        eni_config: name.into(),
        subnet_id: subnet.into(),
        security_groups: groups.iter().map(|g| g.to_string()).collect(),
    })
}

fn missing(name: &str) -> NodeNetwork {
    NodeNetwork::Missing { name: name.into() }
}

impl Fixture {
    fn put(&self, name: &str, subnet: &str, groups: &[&str]) {
        self.api
            .put_object(&self.crd, eniconfig_json(name, subnet, Some(groups)));
    }

    fn label(&self, key: &str, value: Option<&str>) {
        self.api.set_node_label(NODE, key, value);
    }

    /// Waits for the published value to be `want`.
    async fn becomes(&mut self, want: NodeNetwork) {
        let rx = &mut self.rx;
        let wait = async {
            loop {
                if *rx.borrow_and_update() == want {
                    return;
                }
                rx.changed().await.expect("the watcher stopped");
            }
        };
        if tokio::time::timeout(Duration::from_secs(600), wait)
            .await
            .is_err()
        {
            panic!("still {:?}, not {want:?}", *self.rx.borrow());
        }
    }

    /// Nothing is published for a minute (virtual time: every task has gone idle by then).
    async fn quiet(&mut self) {
        self.rx.mark_unchanged();
        let r = tokio::time::timeout(Duration::from_secs(60), self.rx.changed()).await;
        assert!(r.is_err(), "published {:?}", *self.rx.borrow());
    }
}

#[tokio::test(start_paused = true)]
async fn the_label_names_the_object() {
    let mut f = start(Selector::default(), |api, crd| {
        api.set_node_label(NODE, KEY, Some("pods-a"));
        api.put_object(
            crd,
            eniconfig_json("pods-a", "subnet-0a1b2c3d", Some(&["sg-0123abcd"])),
        );
        api.put_object(
            crd,
            eniconfig_json("pods-b", "subnet-0b1b2c3d", Some(&["sg-0b23abcd"])),
        );
    })
    .await;
    assert_eq!(*f.rx.borrow(), NodeNetwork::Unknown, "before the lists");
    f.becomes(ready("pods-a", "subnet-0a1b2c3d", &["sg-0123abcd"]))
        .await;
}

#[tokio::test(start_paused = true)]
async fn the_annotation_wins_over_the_label() {
    let mut f = start(Selector::default(), |api, crd| {
        api.set_node_label(NODE, KEY, Some("by-label"));
        api.set_node_annotation(NODE, KEY, Some("by-annotation"));
        api.put_object(
            crd,
            eniconfig_json("by-label", "subnet-0a1b2c3d", Some(&[])),
        );
        api.put_object(
            crd,
            eniconfig_json("by-annotation", "subnet-0b1b2c3d", Some(&[])),
        );
    })
    .await;
    f.becomes(ready("by-annotation", "subnet-0b1b2c3d", &[]))
        .await;
    // The annotation removed: the label names it again.
    f.api.set_node_annotation(NODE, KEY, None);
    f.becomes(ready("by-label", "subnet-0a1b2c3d", &[])).await;
}

#[tokio::test(start_paused = true)]
async fn the_label_is_configurable_and_the_zone_names_the_object() {
    let sel = Selector {
        label: ZONE.into(),
        ..Selector::default()
    };
    let mut f = start(sel, |api, crd| {
        api.set_node_label(NODE, ZONE, Some("us-east-1a"));
        // The default key is no longer the label: only the annotation of that name would count.
        api.set_node_label(NODE, KEY, Some("us-east-1b"));
        for (zone, subnet) in [
            ("us-east-1a", "subnet-0a1b2c3d"),
            ("us-east-1b", "subnet-0b1b2c3d"),
        ] {
            api.put_object(crd, eniconfig_json(zone, subnet, None));
        }
    })
    .await;
    f.becomes(ready("us-east-1a", "subnet-0a1b2c3d", &[])).await;
}

#[tokio::test(start_paused = true)]
async fn a_missing_object_created_changed_and_deleted() {
    let mut f = start(Selector::default(), |api, _| {
        api.set_node_label(NODE, KEY, Some("pods-a"));
    })
    .await;
    f.becomes(missing("pods-a")).await;
    f.put("pods-a", "subnet-0a1b2c3d", &["sg-0123abcd"]);
    f.becomes(ready("pods-a", "subnet-0a1b2c3d", &["sg-0123abcd"]))
        .await;
    f.put("pods-a", "subnet-0c1b2c3d", &["sg-0123abcd", "sg-4567abcd"]);
    f.becomes(ready(
        "pods-a",
        "subnet-0c1b2c3d",
        &["sg-0123abcd", "sg-4567abcd"],
    ))
    .await;
    assert!(f.api.delete_object(&f.crd, None, "pods-a"));
    f.becomes(missing("pods-a")).await;
}

#[tokio::test(start_paused = true)]
async fn an_invalid_spec_says_why_and_a_fixed_one_is_used() {
    let mut f = start(Selector::default(), |api, crd| {
        api.set_node_label(NODE, KEY, Some("pods-a"));
        api.put_object(
            crd,
            eniconfig_json("pods-a", "subnet-0a1b2c3d", Some(&["sg-0123abcd", "web"])),
        );
    })
    .await;
    f.becomes(NodeNetwork::Invalid {
        name: "pods-a".into(),
        why: "ENIConfig \"pods-a\": spec.securityGroups[1] \"web\" is not a security group id \
              (sg- and 8 or 17 hex digits)"
            .into(),
    })
    .await;
    // No subnet at all (possible under a CRD without a schema).
    f.api.put_object(
        &f.crd,
        serde_json::json!({"metadata": {"name": "pods-a"}, "spec": {}}),
    );
    f.becomes(NodeNetwork::Invalid {
        name: "pods-a".into(),
        why: "ENIConfig \"pods-a\": spec.subnet is missing".into(),
    })
    .await;
    f.put("pods-a", "subnet-0a1b2c3d", &["sg-0123abcd"]);
    f.becomes(ready("pods-a", "subnet-0a1b2c3d", &["sg-0123abcd"]))
        .await;
}

#[tokio::test(start_paused = true)]
async fn a_relabelled_node_gets_the_other_object() {
    let mut f = start(Selector::default(), |api, crd| {
        api.set_node_label(NODE, KEY, Some("pods-a"));
        api.put_object(crd, eniconfig_json("pods-a", "subnet-0a1b2c3d", None));
        api.put_object(
            crd,
            eniconfig_json("pods-b", "subnet-0b1b2c3d", Some(&["sg-0b23abcd"])),
        );
    })
    .await;
    f.becomes(ready("pods-a", "subnet-0a1b2c3d", &[])).await;
    f.label(KEY, Some("pods-b"));
    f.becomes(ready("pods-b", "subnet-0b1b2c3d", &["sg-0b23abcd"]))
        .await;
    f.label(KEY, Some("pods-c"));
    f.becomes(missing("pods-c")).await;
}

#[tokio::test(start_paused = true)]
async fn an_unnamed_node_uses_the_default_object_if_there_is_one() {
    let mut f = start(Selector::default(), |_, _| {}).await;
    f.becomes(NodeNetwork::Unnamed).await;
    f.put("default", "subnet-0d1b2c3d", &[]);
    f.becomes(ready("default", "subnet-0d1b2c3d", &[])).await;
}

#[tokio::test(start_paused = true)]
async fn unrelated_changes_publish_nothing() {
    let (logs, _guard) = Logs::capture();
    let mut f = start(Selector::default(), |api, crd| {
        api.set_node_label(NODE, KEY, Some("pods-a"));
        api.put_object(crd, eniconfig_json("pods-a", "subnet-0a1b2c3d", None));
    })
    .await;
    f.becomes(ready("pods-a", "subnet-0a1b2c3d", &[])).await;
    let before = published(&logs);
    assert_eq!(before, 1, "Unknown to Ready");

    // Another zone's object comes, changes and goes; the node gets another label; another node
    // is relabelled.
    f.put("pods-b", "subnet-0b1b2c3d", &[]);
    f.put("pods-b", "subnet-0c1b2c3d", &["sg-0123abcd"]);
    assert!(f.api.delete_object(&f.crd, None, "pods-b"));
    f.label("team", Some("payments"));
    f.api.add_node("ip-10-0-1-11.ec2.internal", &[]);
    f.api
        .set_node_label("ip-10-0-1-11.ec2.internal", KEY, Some("pods-b"));

    // Then one change on each watch that does alter the value: each watch delivers in order, so
    // once both are seen, every unrelated change before them has been through the watcher.
    f.put("pods-a", "subnet-0e1b2c3d", &[]);
    f.becomes(ready("pods-a", "subnet-0e1b2c3d", &[])).await;
    f.label(KEY, Some("pods-c"));
    f.becomes(missing("pods-c")).await;
    assert_eq!(
        published(&logs) - before,
        2,
        "only the two changes that alter it"
    );
    assert_eq!(f.api.counts().lists, 2, "no re-list: {:?}", f.api.counts());
}

#[tokio::test(start_paused = true)]
async fn the_api_server_restarted_and_changes_made_meanwhile_are_seen() {
    let mut f = start(Selector::default(), |api, crd| {
        api.set_node_label(NODE, KEY, Some("pods-a"));
        api.put_object(crd, eniconfig_json("pods-a", "subnet-0a1b2c3d", None));
        api.put_object(crd, eniconfig_json("pods-b", "subnet-0b1b2c3d", None));
    })
    .await;
    f.becomes(ready("pods-a", "subnet-0a1b2c3d", &[])).await;

    f.api.stop().await;
    // While it is away the watcher fails, backs off, retries: the last value stays.
    tokio::time::sleep(Duration::from_secs(120)).await;
    f.quiet().await;
    assert_eq!(*f.rx.borrow(), ready("pods-a", "subnet-0a1b2c3d", &[]));
    f.put("pods-b", "subnet-0f1b2c3d", &["sg-0123abcd"]);
    f.label(KEY, Some("pods-b"));
    f.api.restart().await;
    f.becomes(ready("pods-b", "subnet-0f1b2c3d", &["sg-0123abcd"]))
        .await;

    // Away again, and history compacted: the watcher's resourceVersion is gone (410), so it
    // lists again, and an object deleted meanwhile does not linger.
    f.api.stop().await;
    assert!(f.api.delete_object(&f.crd, None, "pods-b"));
    f.api.compact();
    f.api.restart().await;
    f.becomes(missing("pods-b")).await;
    assert!(f.api.counts().expired >= 1, "{:?}", f.api.counts());
}

#[tokio::test(start_paused = true)]
async fn rbac_refusing_the_watch_keeps_the_last_value_until_it_is_allowed() {
    let (logs, _guard) = Logs::capture();
    let mut f = start(Selector::default(), |api, crd| {
        api.set_node_label(NODE, KEY, Some("pods-a"));
        api.put_object(crd, eniconfig_json("pods-a", "subnet-0a1b2c3d", None));
    })
    .await;
    f.becomes(ready("pods-a", "subnet-0a1b2c3d", &[])).await;
    let key = f.crd.key();
    f.api.forbid(&key, true);
    f.api.forbid("nodes", true);
    let tries = |api: &FakeApiServer| {
        api.requests()
            .iter()
            .filter(|r| r.contains("/eniconfigs?"))
            .count()
    };
    let before = tries(&f.api);
    f.api.end_watches();
    f.put("pods-a", "subnet-0b1b2c3d", &[]);
    f.quiet().await;
    assert_eq!(*f.rx.borrow(), ready("pods-a", "subnet-0a1b2c3d", &[]));
    let published_before = published(&logs);
    f.quiet().await;
    let retries = tries(&f.api) - before;
    assert!(retries > 2, "retried {retries} times");
    assert_eq!(
        published(&logs),
        published_before,
        "the refusals published nothing"
    );
    f.api.forbid(&key, false);
    f.api.forbid("nodes", false);
    f.becomes(ready("pods-a", "subnet-0b1b2c3d", &[])).await;
}

#[tokio::test(start_paused = true)]
async fn without_the_crd_the_value_stays_unknown_until_it_is_installed() {
    let api = FakeApiServer::start().await;
    api.add_node(NODE, &[]);
    api.set_node_label(NODE, KEY, Some("pods-a"));
    let client = api_server::client(&ApiServerTarget {
        url: api.url(),
        token_file: None,
        ca_file: None,
    })
    .unwrap();
    let (rx, task) = custom_networking::spawn(client, NODE.to_owned(), Selector::default());
    let mut f = Fixture {
        api,
        crd: Crd::eniconfig(),
        rx,
        task,
    };
    f.quiet().await;
    assert_eq!(*f.rx.borrow(), NodeNetwork::Unknown);
    f.api.install_crd(f.crd.clone());
    f.put("pods-a", "subnet-0a1b2c3d", &[]);
    f.becomes(ready("pods-a", "subnet-0a1b2c3d", &[])).await;
}

/// `deploy/eniconfig-crd.yaml` defines the resource the daemon reads (group, version, kind, plural,
/// cluster scope), so the watcher and the shipped CRD cannot drift apart.
#[test]
fn the_shipped_crd_is_the_resource_the_daemon_reads() {
    use eniipam::custom_networking::ENIConfig;
    use kube::Resource;

    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/eniconfig-crd.yaml");
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
        );
    };
    has(format!(
        "name: {}.{}",
        ENIConfig::plural(&()),
        ENIConfig::group(&())
    ));
    has(format!("group: {}", ENIConfig::group(&())));
    has(format!("- name: {}", ENIConfig::version(&())));
    has(format!("plural: {}", ENIConfig::plural(&())));
    has(format!("kind: {}", ENIConfig::kind(&())));
    has("scope: Cluster".into());
    let crd = Crd::eniconfig();
    assert_eq!(
        (
            crd.group.as_str(),
            crd.version.as_str(),
            crd.kind.as_str(),
            crd.plural.as_str(),
            crd.namespaced
        ),
        (
            "crd.k8s.amazonaws.com",
            "v1alpha1",
            "ENIConfig",
            "eniconfigs",
            false
        ),
        "the double serves the same resource"
    );
}
