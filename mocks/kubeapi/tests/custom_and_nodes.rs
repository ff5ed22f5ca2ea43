//! The double's custom resources and node list/watch, spoken to with kube's client as eniipamd
//! speaks: what a real API server answers (404s, 410s, bookmarks, timeouts, the shared
//! resourceVersion), so the daemon's tests against it mean something.

use std::time::Duration;

use eniipam_kubeapi::{Crd, FakeApiServer, eniconfig_json};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::{
    ApiResource, DynamicObject, GroupVersionKind, ListParams, WatchEvent, WatchParams,
};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use serde_json::json;

async fn client(api: &FakeApiServer) -> Client {
    let config = kube::Config::new(api.url().parse().unwrap());
    Client::try_from(config).unwrap()
}

fn resource(crd: &Crd) -> ApiResource {
    let gvk = GroupVersionKind::gvk(&crd.group, &crd.version, &crd.kind);
    ApiResource::from_gvk_with_plural(&gvk, &crd.plural)
}

fn profile_crd() -> Crd {
    Crd::namespaced(
        "eniipam.io",
        "v1alpha1",
        "NetworkProfile",
        "networkprofiles",
    )
}

fn code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

/// The next event of a raw watch stream, with a bound on how long the test waits for it.
async fn next<S, T>(s: &mut S) -> T
where
    S: futures::Stream<Item = T> + Unpin,
{
    tokio::time::timeout(Duration::from_secs(30), s.next())
        .await
        .expect("no event")
        .expect("the stream ended")
}

#[tokio::test]
async fn a_cluster_scoped_custom_object_is_listed_got_and_watched() {
    let api = FakeApiServer::start().await;
    let crd = Crd::eniconfig();
    api.install_crd(crd.clone());
    api.put_object(
        &crd,
        eniconfig_json("us-east-1a", "subnet-0a1b2c3d", Some(&["sg-0123abcd"])),
    );
    let eni: Api<DynamicObject> = Api::all_with(client(&api).await, &resource(&crd));

    let got = eni.get("us-east-1a").await.unwrap();
    assert_eq!(got.data["spec"]["subnet"], "subnet-0a1b2c3d");
    assert_eq!(
        got.types.unwrap().api_version,
        "crd.k8s.amazonaws.com/v1alpha1"
    );
    let missing = eni.get("us-east-1b").await.unwrap_err();
    assert_eq!(code(&missing), Some(404), "{missing}");
    assert!(
        missing.to_string().contains("\"us-east-1b\" not found"),
        "{missing}"
    );

    let list = eni.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);
    let rv = list.metadata.resource_version.unwrap();
    let by_name = eni
        .list(&ListParams::default().fields("metadata.name=us-east-1b"))
        .await
        .unwrap();
    assert!(by_name.items.is_empty(), "the field selector filters");

    let mut events = eni
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    api.put_object(
        &crd,
        eniconfig_json("us-east-1a", "subnet-0a1b2c3d", Some(&["sg-0123abcd"])),
    );
    api.put_object(&crd, eniconfig_json("us-east-1b", "subnet-0b1b2c3d", None));
    match next(&mut events).await.unwrap() {
        WatchEvent::Added(o) => {
            assert_eq!(
                o.metadata.name.as_deref(),
                Some("us-east-1b"),
                "an unchanged put is no event"
            )
        }
        other => panic!("{other:?}"),
    }
    api.put_object(&crd, eniconfig_json("us-east-1b", "subnet-0c1b2c3d", None));
    match next(&mut events).await.unwrap() {
        WatchEvent::Modified(o) => assert_eq!(o.data["spec"]["subnet"], "subnet-0c1b2c3d"),
        other => panic!("{other:?}"),
    }
    assert!(api.delete_object(&crd, None, "us-east-1b"));
    assert!(!api.delete_object(&crd, None, "us-east-1b"), "already gone");
    match next(&mut events).await.unwrap() {
        WatchEvent::Deleted(o) => assert_eq!(o.metadata.name.as_deref(), Some("us-east-1b")),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_resource_without_its_crd_is_not_found() {
    let api = FakeApiServer::start().await;
    let c = client(&api).await;
    let eni: Api<DynamicObject> = Api::all_with(c.clone(), &resource(&Crd::eniconfig()));
    let e = eni.list(&ListParams::default()).await.unwrap_err();
    assert_eq!(code(&e), Some(404), "no such group: {e}");
    assert_eq!(code(&eni.get("x").await.unwrap_err()), Some(404));

    // The group is served (another CRD in it), the plural is not: a NotFound Status.
    api.install_crd(Crd::cluster_scoped(
        "crd.k8s.amazonaws.com",
        "v1alpha1",
        "Other",
        "others",
    ));
    let e = eni.list(&ListParams::default()).await.unwrap_err();
    assert_eq!(code(&e), Some(404), "{e}");
    assert!(
        e.to_string()
            .contains("could not find the requested resource"),
        "{e}"
    );

    // A cluster-scoped resource has no namespaced path.
    api.install_crd(Crd::eniconfig());
    let in_ns: Api<DynamicObject> =
        Api::namespaced_with(c, "default", &resource(&Crd::eniconfig()));
    assert_eq!(
        code(&in_ns.list(&ListParams::default()).await.unwrap_err()),
        Some(404)
    );
    assert!(
        eni.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
}

#[tokio::test]
async fn a_namespaced_custom_object_lives_in_its_namespace() {
    let api = FakeApiServer::start().await;
    let crd = profile_crd();
    api.install_crd(crd.clone());
    for (ns, name) in [("team-a", "db"), ("team-b", "db"), ("team-b", "web")] {
        api.put_object(
            &crd,
            json!({"metadata": {"namespace": ns, "name": name}, "spec": {"securityGroups": ["sg-1"]}}),
        );
    }
    let c = client(&api).await;
    let ar = resource(&crd);
    let b: Api<DynamicObject> = Api::namespaced_with(c.clone(), "team-b", &ar);
    let names: Vec<String> = b
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|o| o.metadata.name.unwrap())
        .collect();
    assert_eq!(names, ["db", "web"]);
    assert_eq!(
        b.get("web").await.unwrap().metadata.namespace.as_deref(),
        Some("team-b")
    );
    let a: Api<DynamicObject> = Api::namespaced_with(c.clone(), "team-a", &ar);
    assert_eq!(code(&a.get("web").await.unwrap_err()), Some(404));
    let all: Api<DynamicObject> = Api::all_with(c, &ar);
    assert_eq!(
        all.list(&ListParams::default()).await.unwrap().items.len(),
        3
    );

    // A watch of one namespace sees that namespace only.
    let rv = b
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut events = b.watch(&WatchParams::default(), &rv).await.unwrap().boxed();
    api.put_object(
        &crd,
        json!({"metadata": {"namespace": "team-a", "name": "x"}, "spec": {}}),
    );
    api.delete_object(&crd, Some("team-b"), "web");
    match next(&mut events).await.unwrap() {
        WatchEvent::Deleted(o) => assert_eq!(o.metadata.name.as_deref(), Some("web")),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn custom_watches_get_410_after_compaction_bookmarks_and_the_server_timeout() {
    let api = FakeApiServer::start().await;
    let crd = Crd::eniconfig();
    api.install_crd(crd.clone());
    api.put_object(&crd, eniconfig_json("a", "subnet-0a", None));
    let eni: Api<DynamicObject> = Api::all_with(client(&api).await, &resource(&crd));
    let rv = eni
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();

    api.put_object(&crd, eniconfig_json("b", "subnet-0b", None));
    api.compact();
    let mut old = eni
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    match next(&mut old).await.unwrap() {
        WatchEvent::Error(e) => assert_eq!((e.code, e.reason.as_str()), (410, "Expired")),
        other => panic!("{other:?}"),
    }
    assert_eq!(api.counts().expired, 1);

    let now = eni
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let params = WatchParams::default().timeout(60);
    let mut events = eni.watch(&params, &now).await.unwrap().boxed();
    api.bookmark();
    match next(&mut events).await.unwrap() {
        WatchEvent::Bookmark(b) => {
            assert_eq!(b.types.kind, "ENIConfig");
            assert_eq!(b.metadata.resource_version, now);
        }
        other => panic!("{other:?}"),
    }
    // The server ends the watch after timeoutSeconds (the double's clock jumps ahead).
    tokio::time::pause();
    tokio::time::advance(Duration::from_secs(61)).await;
    let end = tokio::time::timeout(Duration::from_secs(120), events.next())
        .await
        .unwrap();
    assert!(end.is_none(), "{end:?}");
}

#[tokio::test]
async fn forbidden_custom_lists_answer_403_and_gets_still_work() {
    let api = FakeApiServer::start().await;
    let crd = Crd::eniconfig();
    api.install_crd(crd.clone());
    api.put_object(&crd, eniconfig_json("a", "subnet-0a", None));
    api.forbid(&crd.key(), true);
    let eni: Api<DynamicObject> = Api::all_with(client(&api).await, &resource(&crd));
    let e = eni.list(&ListParams::default()).await.unwrap_err();
    assert_eq!(code(&e), Some(403), "{e}");
    assert!(
        e.to_string()
            .contains("resource \"eniconfigs\" in API group \"crd.k8s.amazonaws.com\""),
        "{e}"
    );
    assert!(eni.get("a").await.is_ok());
    api.forbid(&crd.key(), false);
    assert!(eni.list(&ListParams::default()).await.is_ok());
}

#[tokio::test]
async fn one_node_is_watched_by_name_and_its_label_and_annotation_changes_are_seen() {
    let api = FakeApiServer::start().await;
    api.add_node("node-a", &[]);
    api.add_node("node-b", &[]);
    let nodes: Api<Node> = Api::all(client(&api).await);
    let config = watcher::Config::default().fields("metadata.name=node-a");
    let mut w = watcher::watcher(nodes.clone(), config).boxed();
    let mut seen = Vec::new();
    loop {
        match next(&mut w).await.unwrap() {
            Event::InitApply(n) => seen.push(n.metadata.name.unwrap()),
            Event::InitDone => break,
            _ => {}
        }
    }
    assert_eq!(seen, ["node-a"], "the field selector names one node");

    api.set_node_label("node-b", "topology.kubernetes.io/zone", Some("us-east-1b"));
    api.set_node_label("node-a", "topology.kubernetes.io/zone", Some("us-east-1a"));
    let Event::Apply(n) = next(&mut w).await.unwrap() else {
        panic!("not an apply")
    };
    assert_eq!(
        n.metadata.name.as_deref(),
        Some("node-a"),
        "node-b's change is not node-a's"
    );
    assert_eq!(
        n.metadata.labels.unwrap()["topology.kubernetes.io/zone"],
        "us-east-1a"
    );
    let label_rv: u64 = n.metadata.resource_version.unwrap().parse().unwrap();

    // Custom objects and nodes share the one resourceVersion counter.
    let crd = Crd::eniconfig();
    api.install_crd(crd.clone());
    api.put_object(&crd, eniconfig_json("us-east-1a", "subnet-0a", None));
    let object_rv: u64 =
        api.object(&crd, None, "us-east-1a").unwrap()["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
    assert!(object_rv > label_rv);

    api.set_node_label("node-a", "topology.kubernetes.io/zone", Some("us-east-1a"));
    api.set_node_annotation("node-a", "k8s.amazonaws.com/eniConfig", Some("pods-a"));
    let Event::Apply(n) = next(&mut w).await.unwrap() else {
        panic!("not an apply")
    };
    assert_eq!(
        n.metadata.annotations.unwrap()["k8s.amazonaws.com/eniConfig"],
        "pods-a"
    );
    assert!(n.metadata.resource_version.unwrap().parse::<u64>().unwrap() > object_rv);
    api.set_node_label("node-a", "topology.kubernetes.io/zone", None);
    let Event::Apply(n) = next(&mut w).await.unwrap() else {
        panic!("not an apply")
    };
    assert!(
        !n.metadata
            .labels
            .unwrap_or_default()
            .contains_key("topology.kubernetes.io/zone")
    );
    assert!(api.delete_node("node-a"));
    let Event::Delete(n) = next(&mut w).await.unwrap() else {
        panic!("not a delete")
    };
    assert_eq!(n.metadata.name.as_deref(), Some("node-a"));

    // Another selector than metadata.name is refused, not silently ignored.
    let e = nodes
        .list(&ListParams::default().fields("spec.unschedulable=false"))
        .await
        .unwrap_err();
    assert_eq!(code(&e), Some(400), "{e}");
    let e = nodes
        .list(&ListParams::default().labels("a=b"))
        .await
        .unwrap_err();
    assert_eq!(code(&e), Some(400), "{e}");
    let all = nodes.list(&ListParams::default()).await.unwrap();
    assert_eq!(all.items.len(), 1, "node-b is left");
}

/// What a NetworkPolicy enforcer lists and watches: every pod of the cluster (no field selector),
/// every namespace with the `kubernetes.io/metadata.name` label the server sets, and
/// NetworkPolicies, served without any CRD installed (they are built in).
#[tokio::test]
async fn network_policies_and_every_pod_of_the_cluster_are_served() {
    use k8s_openapi::api::core::v1::{Namespace, Pod};
    use k8s_openapi::api::networking::v1::NetworkPolicy;

    let api = FakeApiServer::start().await;
    let c = client(&api).await;
    api.add_pod("x", "a", "u1", "node-1");
    api.add_pod("y", "b", "u2", "node-2");
    api.put_namespace_labels("x", &[("team", "blue")]);
    api.put_network_policy(json!({
        "metadata": {"namespace": "x", "name": "deny"},
        "spec": {"podSelector": {}, "policyTypes": ["Ingress"]},
    }));

    let pods: Api<Pod> = Api::all(c.clone());
    let mut names: Vec<String> = pods
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|p| p.metadata.name.unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["a", "b"], "both nodes' pods");
    let ns: Api<Namespace> = Api::all(c.clone());
    let x = ns
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .remove(0);
    let labels = x.metadata.labels.unwrap();
    assert_eq!(labels["team"], "blue");
    assert_eq!(labels["kubernetes.io/metadata.name"], "x");

    let policies: Api<NetworkPolicy> = Api::all(c.clone());
    let mut events = watcher::watcher(policies.clone(), watcher::Config::default()).boxed();
    let mut listed = Vec::new();
    loop {
        match next(&mut events).await.unwrap() {
            Event::InitApply(p) => listed.push(p.metadata.name.unwrap()),
            Event::InitDone => break,
            _ => {}
        }
    }
    assert_eq!(listed, ["deny"]);
    assert!(api.delete_network_policy("x", "deny"));
    loop {
        if let Event::Delete(p) = next(&mut events).await.unwrap() {
            assert_eq!(p.metadata.name.as_deref(), Some("deny"));
            break;
        }
    }
    let inx: Api<NetworkPolicy> = Api::namespaced(c, "x");
    let err = inx.get("deny").await.unwrap_err();
    assert_eq!(code(&err), Some(404));
}
