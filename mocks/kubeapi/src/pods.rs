//! Pods: node-scoped list and watch, GET, and what tests do to pods (see the crate docs).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;

use crate::{Change, FakeApiServer, Inner, World, authorized, status, status_response};

/// A pod as the API server stores it.
pub fn pod_json(ns: &str, name: &str, uid: &str, node: &str, phase: &str) -> Value {
    json!({
        "metadata": {
            "namespace": ns,
            "name": name,
            "uid": uid,
            "annotations": {},
        },
        "spec": {
            "nodeName": node,
            "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}],
        },
        "status": {"phase": phase},
    })
}

fn with_kind(mut pod: Value) -> Value {
    pod["apiVersion"] = json!("v1");
    pod["kind"] = json!("Pod");
    pod
}

fn node_of(pod: &Value) -> &str {
    pod["spec"]["nodeName"].as_str().unwrap_or_default()
}

impl FakeApiServer {
    fn change(&self, w: &mut World, kind: &'static str, mut object: Value) {
        w.rv += 1;
        object["metadata"]["resourceVersion"] = json!(w.rv.to_string());
        let key = (
            object["metadata"]["namespace"].as_str().unwrap().to_owned(),
            object["metadata"]["name"].as_str().unwrap().to_owned(),
        );
        if kind == "DELETED" {
            w.pods.remove(&key);
        } else {
            w.pods.insert(key, object.clone());
        }
        let c = Change {
            rv: w.rv,
            kind,
            object,
        };
        w.log.push(c.clone());
        if let Some(held) = w.held.as_mut() {
            held.push(c);
            return;
        }
        // Sent under the world lock: a watch subscribes under it too, so none misses or repeats one.
        let _ = self.inner.changes.send(c);
    }

    /// Watches stop receiving changes (lists and GETs still see them), as behind a lagging cache.
    pub fn hold_events(&self) {
        self.inner
            .world
            .lock()
            .unwrap()
            .held
            .get_or_insert_with(Vec::new);
    }

    /// Delivers the held changes, in order, and resumes delivery.
    pub fn release_events(&self) {
        let mut w = self.inner.world.lock().unwrap();
        for c in w.held.take().unwrap_or_default() {
            let _ = self.inner.changes.send(c);
        }
    }

    /// Lists and watches answer 403 Forbidden (or again work); GETs are not affected.
    pub fn forbid_list_watch(&self, forbid: bool) {
        self.inner.world.lock().unwrap().forbid_list_watch = forbid;
    }

    /// Creates (or replaces) a pod.
    pub fn put_pod(&self, pod: Value) {
        let mut w = self.inner.world.lock().unwrap();
        let key = (
            pod["metadata"]["namespace"].as_str().unwrap().to_owned(),
            pod["metadata"]["name"].as_str().unwrap().to_owned(),
        );
        let kind = if w.pods.contains_key(&key) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        self.change(&mut w, kind, pod);
    }

    pub fn add_pod(&self, ns: &str, name: &str, uid: &str, node: &str) {
        self.put_pod(pod_json(ns, name, uid, node, "Running"));
    }

    /// Deletes a pod (the watch sees its last state with a new resourceVersion). False if absent.
    pub fn delete_pod(&self, ns: &str, name: &str) -> bool {
        let mut w = self.inner.world.lock().unwrap();
        let Some(pod) = w.pods.get(&(ns.to_owned(), name.to_owned())).cloned() else {
            return false;
        };
        self.change(&mut w, "DELETED", pod);
        true
    }

    /// Sets a pod's `status.phase`.
    pub fn set_phase(&self, ns: &str, name: &str, phase: &str) {
        let mut w = self.inner.world.lock().unwrap();
        let mut pod = w.pods[&(ns.to_owned(), name.to_owned())].clone();
        pod["status"]["phase"] = json!(phase);
        self.change(&mut w, "MODIFIED", pod);
    }

    /// Forgets history: watches from any resourceVersion before now get 410 Gone.
    pub fn compact(&self) {
        let mut w = self.inner.world.lock().unwrap();
        w.compacted_to = w.rv;
        w.log.clear();
    }

    /// Ends every open watch cleanly, as the server-side timeout does.
    pub fn end_watches(&self) {
        self.inner.end_watches.send_modify(|g| *g += 1);
    }

    /// Sends a BOOKMARK with the current resourceVersion to open watches that asked for them.
    pub fn bookmark(&self) {
        let w = self.inner.world.lock().unwrap();
        let _ = self.inner.changes.send(Change {
            rv: w.rv,
            kind: "BOOKMARK",
            object: json!({"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": w.rv.to_string()}}),
        });
    }
}

/// The node of `fieldSelector=spec.nodeName=<n>`; anything else is refused (the double is strict).
fn node_selector(q: &BTreeMap<String, String>) -> Result<String, String> {
    match q.get("fieldSelector").map(String::as_str) {
        Some(sel) => sel
            .strip_prefix("spec.nodeName=")
            .filter(|n| !n.is_empty() && !n.contains(','))
            .map(str::to_owned)
            .ok_or_else(|| format!("unsupported field selector {sel:?}")),
        None => Err("this double only serves node-scoped pod lists".into()),
    }
}

pub(crate) async fn list_or_watch(
    State(inner): State<Arc<Inner>>,
    headers: HeaderMap,
    Query(q): Query<BTreeMap<String, String>>,
) -> Response {
    if !authorized(&inner, &headers) {
        return status_response(401, "Unauthorized", "Unauthorized".into());
    }
    let node = match node_selector(&q) {
        Ok(n) => n,
        Err(message) => return status_response(400, "BadRequest", message),
    };
    if inner.world.lock().unwrap().forbid_list_watch {
        return status_response(
            403,
            "Forbidden",
            "pods is forbidden: User \"system:serviceaccount:kube-system:eniipam\" cannot list \
             resource \"pods\" in API group \"\" at the cluster scope"
                .into(),
        );
    }
    if q.get("watch").is_some_and(|w| w == "true" || w == "1") {
        return watch_pods(inner, node, q);
    }
    inner.counts.lock().unwrap().lists += 1;
    let w = inner.world.lock().unwrap();
    let items: Vec<Value> = w
        .pods
        .values()
        .filter(|p| node_of(p) == node)
        .cloned()
        .collect();
    axum::Json(json!({
        "apiVersion": "v1",
        "kind": "PodList",
        "metadata": {"resourceVersion": w.rv.to_string()},
        "items": items,
    }))
    .into_response()
}

/// One watch event line; pod objects carry `apiVersion`/`kind` in watch events.
fn line(kind: &str, object: &Value) -> Bytes {
    let object = match kind {
        "ADDED" | "MODIFIED" | "DELETED" => with_kind(object.clone()),
        _ => object.clone(),
    };
    let mut s = serde_json::to_string(&json!({"type": kind, "object": object})).unwrap();
    s.push('\n');
    Bytes::from(s)
}

fn watch_pods(inner: Arc<Inner>, node: String, q: BTreeMap<String, String>) -> Response {
    let from: u64 = q
        .get("resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let timeout = Duration::from_secs(
        q.get("timeoutSeconds")
            .and_then(|v| v.parse().ok())
            .unwrap_or(1800),
    );
    let bookmarks = q.get("allowWatchBookmarks").is_some_and(|v| v == "true");
    let (tx, rx) = mpsc::channel::<Bytes>(256);
    let body = Body::from_stream(ReceiverStream::new(rx).map(Ok::<Bytes, Infallible>));
    // Subscribe and read the backlog under the world lock: no change is missed or sent twice.
    let (mut changes, backlog, expired) = {
        let w = inner.world.lock().unwrap();
        let changes = inner.changes.subscribe();
        let expired = from < w.compacted_to;
        let held_from = w.held.as_ref().and_then(|h| h.first()).map(|c| c.rv);
        let backlog: Vec<Change> = if expired {
            Vec::new()
        } else {
            w.log
                .iter()
                .filter(|c| c.rv > from && held_from.is_none_or(|h| c.rv < h))
                .cloned()
                .collect()
        };
        (changes, backlog, expired)
    };
    {
        let mut c = inner.counts.lock().unwrap();
        c.watches += 1;
        if expired {
            c.expired += 1;
        }
    }
    let mut end = inner.end_watches.subscribe();
    tokio::spawn(async move {
        if expired {
            let s = status(410, "Expired", format!("too old resource version: {from}"));
            let _ = tx.send(line("ERROR", &s)).await;
            return;
        }
        let wanted = |c: &Change| c.kind == "BOOKMARK" || node_of(&c.object) == node;
        for c in backlog.iter().filter(|c| wanted(c)) {
            if tx.send(line(c.kind, &c.object)).await.is_err() {
                return;
            }
        }
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                // Biased: a watch ended (or timed out) delivers nothing queued after that.
                biased;
                _ = &mut deadline => return,
                _ = end.changed() => return,
                _ = tx.closed() => return,
                c = changes.recv() => match c {
                    Ok(c) if c.kind == "BOOKMARK" && !bookmarks => {}
                    Ok(c) if wanted(&c) => {
                        if tx.send(line(c.kind, &c.object)).await.is_err() {
                            return;
                        }
                    }
                    Ok(_) => {}
                    Err(_) => return,
                },
            }
        }
    });
    Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .body(body)
        .unwrap()
}

pub(crate) async fn get_pod(
    State(inner): State<Arc<Inner>>,
    headers: HeaderMap,
    Path((ns, name)): Path<(String, String)>,
) -> Response {
    if !authorized(&inner, &headers) {
        return status_response(401, "Unauthorized", "Unauthorized".into());
    }
    inner.counts.lock().unwrap().gets += 1;
    let w = inner.world.lock().unwrap();
    match w.pods.get(&(ns, name.clone())) {
        Some(p) => axum::Json(with_kind(p.clone())).into_response(),
        None => status_response(404, "NotFound", format!("pods \"{name}\" not found")),
    }
}
