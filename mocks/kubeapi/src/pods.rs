//! Pods: node-scoped list and watch, GET, and what tests do to pods (see the crate docs).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::stream::{self as watch, Kind};
use crate::{Change, FakeApiServer, Inner, World, authorized, status_response};

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
            resource: "pods".into(),
            kind,
            object,
        };
        w.publish(&self.inner, c);
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

    /// Lists and watches of pods answer 403 Forbidden (or again work); GETs are not affected.
    pub fn forbid_list_watch(&self, forbid: bool) {
        self.forbid("pods", forbid);
    }

    /// Lists and watches of `resource` (`pods`, `nodes`, or a custom resource's `<plural>.<group>`,
    /// as RBAC names it) answer 403 Forbidden (or again work); GETs are not affected.
    pub fn forbid(&self, resource: &str, forbid: bool) {
        let mut w = self.inner.world.lock().unwrap();
        if forbid {
            w.forbidden.insert(resource.to_owned());
        } else {
            w.forbidden.remove(resource);
        }
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

    /// Sends a BOOKMARK with the current resourceVersion to open watches (of every resource) that
    /// asked for them.
    pub fn bookmark(&self) {
        let w = self.inner.world.lock().unwrap();
        // Each watch renders it with its own kind.
        let _ = self.inner.changes.send(Change {
            rv: w.rv,
            resource: String::new(),
            kind: "BOOKMARK",
            object: Value::Null,
        });
    }
}

/// The node of `fieldSelector=spec.nodeName=<n>`, or `None` without a field selector (every
/// pod of the cluster, as a NetworkPolicy enforcer lists them); any other selector is refused (the
/// double is strict).
fn node_selector(q: &BTreeMap<String, String>) -> Result<Option<String>, String> {
    match q.get("fieldSelector").map(String::as_str) {
        Some(sel) => sel
            .strip_prefix("spec.nodeName=")
            .filter(|n| !n.is_empty() && !n.contains(','))
            .map(|n| Some(n.to_owned()))
            .ok_or_else(|| format!("unsupported field selector {sel:?}")),
        None => Ok(None),
    }
}

fn pod_kind() -> Kind {
    Kind {
        resource: "pods".into(),
        api_version: "v1".into(),
        kind: "Pod".into(),
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
    let what = pod_kind();
    let watching = watch::is_watch(&q);
    if let Some(r) = watch::forbidden(&inner, &what, if watching { "watch" } else { "list" }) {
        return r;
    }
    let wanted = move |p: &Value| node.as_deref().is_none_or(|n| node_of(p) == n);
    if watching {
        return watch::watch(inner, what, &q, wanted);
    }
    watch::list(&inner, &what, |w| {
        w.pods.values().filter(|p| wanted(p)).cloned().collect()
    })
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
        Some(p) => axum::Json(pod_kind().stamp(p.clone())).into_response(),
        None => status_response(404, "NotFound", format!("pods \"{name}\" not found")),
    }
}
