//! Issue 27, item 2: each profile's free slots advertised on the node as the extended resource
//! `eniipam.io/network-<profile>` (`network_profiles::resources`), against the API-server double's
//! node status PATCH, on tokio's paused clock.

use std::collections::BTreeMap;
use std::time::Duration;

use eniipam::network_profiles::resources::{self, Advertiser, VERIFY_EVERY};
use eniipam::reconcile::api_server::{self, ApiServerTarget};
use eniipam_kubeapi::{FakeApiServer, node_json};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const NODE: &str = "ip-10-0-1-10.ec2.internal";

fn client(api: &FakeApiServer) -> kube::Client {
    api_server::client(&ApiServerTarget {
        url: api.url(),
        token_file: None,
        ca_file: None,
    })
    .expect("client")
}

/// A node as the kubelet registers it: `cpu`, `pods` and a device plugin's resource in both maps.
fn registered_node() -> Value {
    let mut n = node_json(NODE, &[]);
    let kubelets = json!({"cpu": "4", "pods": "58", "vendor.example/gpu": "1"});
    n["status"]["capacity"] = kubelets.clone();
    n["status"]["allocatable"] = kubelets;
    n
}

fn free(slots: &[(&str, u32)]) -> BTreeMap<String, u32> {
    slots.iter().map(|(p, n)| ((*p).to_owned(), *n)).collect()
}

/// Our resources in `map` (`capacity` or `allocatable`) of the node now: profile → quantity.
fn ours(api: &FakeApiServer, map: &str) -> BTreeMap<String, String> {
    let node = api.node(NODE).unwrap();
    node["status"][map]
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| {
            Some((
                k.strip_prefix(resources::RESOURCE_PREFIX)?.to_owned(),
                v.as_str().unwrap().to_owned(),
            ))
        })
        .collect()
}

fn says(api: &FakeApiServer, want: &[(&str, &str)]) -> bool {
    let want: BTreeMap<String, String> = want
        .iter()
        .map(|(p, n)| ((*p).into(), (*n).into()))
        .collect();
    ours(api, "capacity") == want && ours(api, "allocatable") == want
}

fn kubelets_resources_untouched(api: &FakeApiServer) {
    let node = api.node(NODE).unwrap();
    for map in ["capacity", "allocatable"] {
        assert_eq!(node["status"][map]["cpu"], "4", "{map}");
        assert_eq!(node["status"][map]["vendor.example/gpu"], "1", "{map}");
    }
}

#[tokio::test(start_paused = true)]
async fn numbers_appear_change_drop_to_zero_and_a_removed_profile_disappears() {
    let api = FakeApiServer::start().await;
    api.put_node(registered_node());
    let mut adv = Advertiser::new(client(&api), NODE.into());

    assert!(
        adv.advertise(&free(&[("app", 3), ("db", 2)]))
            .await
            .unwrap()
    );
    assert!(says(&api, &[("app", "3"), ("db", "2")]));
    kubelets_resources_untouched(&api);
    assert_eq!(api.counts().status_patches, 1);

    // The same numbers again: nothing is sent.
    assert!(
        !adv.advertise(&free(&[("app", 3), ("db", 2)]))
            .await
            .unwrap()
    );
    assert_eq!(api.counts().status_patches, 1);

    // Changed, then 0 (the profile cannot get another ENI): 0 is advertised, not removed.
    assert!(
        adv.advertise(&free(&[("app", 1), ("db", 2)]))
            .await
            .unwrap()
    );
    assert!(says(&api, &[("app", "1"), ("db", "2")]));
    assert!(
        adv.advertise(&free(&[("app", 0), ("db", 2)]))
            .await
            .unwrap()
    );
    assert!(says(&api, &[("app", "0"), ("db", "2")]));

    // A profile gone: its resource is removed from both maps.
    assert!(adv.advertise(&free(&[("app", 0)])).await.unwrap());
    assert!(says(&api, &[("app", "0")]));
    kubelets_resources_untouched(&api);

    // A new advertiser (the daemon restarted) with a profile deleted while it was down: it reads
    // the node and removes the leftover.
    let mut again = Advertiser::new(client(&api), NODE.into());
    assert!(again.advertise(&free(&[("web", 5)])).await.unwrap());
    assert!(says(&api, &[("web", "5")]));
    // And one that finds the node already right sends nothing.
    let before = api.counts().status_patches;
    let mut third = Advertiser::new(client(&api), NODE.into());
    assert!(!third.advertise(&free(&[("web", 5)])).await.unwrap());
    assert_eq!(api.counts().status_patches, before);
}

#[tokio::test(start_paused = true)]
async fn the_advertiser_reasserts_after_errors_restarts_and_a_zeroing_kubelet() {
    let api = FakeApiServer::start().await;
    api.put_node(registered_node());
    let (tx, rx) = watch::channel(free(&[("db", 2)]));
    let cancel = CancellationToken::new();
    let task = resources::spawn(client(&api), NODE.into(), rx, cancel.clone());
    until(&api, "first", &[("db", "2")]).await;

    // A change while PATCHes fail (a 409, then a 503): retried until it lands.
    api.fail_node_requests(2, 409);
    tx.send_replace(free(&[("db", 1)]));
    until(&api, "after the failures", &[("db", "1")]).await;

    // The kubelet re-registers a re-created node and zeroes every extended resource; nothing tells
    // the daemon, which re-reads the node within VERIFY_EVERY and re-asserts.
    let mut zeroed = registered_node();
    zeroed["status"]["capacity"]["eniipam.io/network-db"] = json!("0");
    zeroed["status"]["allocatable"]["eniipam.io/network-db"] = json!("0");
    api.put_node(zeroed);
    tokio::time::sleep(VERIFY_EVERY + Duration::from_secs(1)).await;
    until(&api, "re-asserted", &[("db", "1")]).await;

    // The API server away: a change made meanwhile lands once it is back.
    api.stop().await;
    tx.send_replace(free(&[("db", 1), ("web", 4)]));
    tokio::time::sleep(Duration::from_secs(30)).await;
    api.restart().await;
    until(&api, "after the restart", &[("db", "1"), ("web", "4")]).await;

    // Steady state: re-reads every minute, no PATCH while nothing changes.
    let patches = api.counts().status_patches;
    tokio::time::sleep(VERIFY_EVERY * 5).await;
    assert_eq!(api.counts().status_patches, patches, "{:?}", api.counts());
    kubelets_resources_untouched(&api);
    cancel.cancel();
    task.await.unwrap();
}

async fn until(api: &FakeApiServer, what: &str, want: &[(&str, &str)]) {
    for _ in 0..6000 {
        if says(api, want) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "never {what}: capacity {:?}, allocatable {:?}",
        ours(api, "capacity"),
        ours(api, "allocatable")
    );
}
