//! Namespaces: list and watch (all of them, or one by `metadata.name`), and what tests do to them
//! (create, annotate, delete). Stored with the custom objects (key `namespaces`, cluster-scoped), so
//! they share the one history, the resourceVersion counter and the watch machinery.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::custom::change;
use crate::stream::{self as watch, Kind};
use crate::{FakeApiServer, Inner};

/// The change log's key of namespaces (also their RBAC resource name).
const RESOURCE: &str = "namespaces";

fn kind() -> Kind {
    Kind {
        resource: RESOURCE.into(),
        api_version: "v1".into(),
        kind: "Namespace".into(),
    }
}

fn key(name: &str) -> (String, String, String) {
    (RESOURCE.into(), String::new(), name.into())
}

/// A namespace as the API server stores it: `annotations` as given, the label
/// `kubernetes.io/metadata.name` the server sets on every namespace, `status.phase` `Active`.
pub fn namespace_json(name: &str, annotations: &[(&str, &str)]) -> Value {
    namespace_with_labels(name, &[], annotations)
}

/// [`namespace_json`] with `labels` too (`kubernetes.io/metadata.name` is always the name: the
/// server overwrites it).
pub fn namespace_with_labels(
    name: &str,
    labels: &[(&str, &str)],
    annotations: &[(&str, &str)],
) -> Value {
    let map = |pairs: &[(&str, &str)]| -> serde_json::Map<String, Value> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), json!(v)))
            .collect()
    };
    let mut labels = map(labels);
    labels.insert("kubernetes.io/metadata.name".into(), json!(name));
    json!({
        "metadata": {"name": name, "uid": format!("uid-ns-{name}"), "labels": labels,
            "annotations": map(annotations)},
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": "Active"},
    })
}

impl FakeApiServer {
    /// Creates (or replaces) a namespace with these annotations: `ADDED` or `MODIFIED`.
    pub fn put_namespace(&self, name: &str, annotations: &[(&str, &str)]) {
        self.put_namespace_object(name, namespace_json(name, annotations));
    }

    /// Creates (or replaces) a namespace with these labels and no annotations.
    pub fn put_namespace_labels(&self, name: &str, labels: &[(&str, &str)]) {
        self.put_namespace_object(name, namespace_with_labels(name, labels, &[]));
    }

    fn put_namespace_object(&self, name: &str, object: Value) {
        let mut w = self.inner.world.lock().unwrap();
        let k = key(name);
        let verb = if w.objects.contains_key(&k) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        change(&self.inner, &mut w, k, verb, object);
    }

    /// Sets (`Some`) or removes (`None`) one annotation of an existing namespace, as
    /// `kubectl annotate` does; an update that changes nothing is no change (no event).
    pub fn set_namespace_annotation(&self, name: &str, annotation: &str, value: Option<&str>) {
        let mut w = self.inner.world.lock().unwrap();
        let k = key(name);
        let mut ns = w.objects.get(&k).cloned().expect("no such namespace");
        let before = ns.clone();
        let map = &mut ns["metadata"]["annotations"];
        if !map.is_object() {
            *map = json!({});
        }
        let map = map.as_object_mut().unwrap();
        match value {
            Some(v) => map.insert(annotation.to_owned(), json!(v)),
            None => map.remove(annotation),
        };
        if ns != before {
            change(&self.inner, &mut w, k, "MODIFIED", ns);
        }
    }

    /// Deletes a namespace (watches see its last state). False if absent.
    pub fn delete_namespace(&self, name: &str) -> bool {
        let mut w = self.inner.world.lock().unwrap();
        let k = key(name);
        let Some(ns) = w.objects.get(&k).cloned() else {
            return false;
        };
        change(&self.inner, &mut w, k, "DELETED", ns);
        true
    }
}

pub(crate) async fn list_or_watch(
    State(inner): State<Arc<Inner>>,
    headers: HeaderMap,
    Query(q): Query<BTreeMap<String, String>>,
) -> Response {
    watch::cluster_list_or_watch(inner, &headers, &q, kind(), |w| {
        w.objects
            .iter()
            .filter(|((r, _, _), _)| r == RESOURCE)
            .map(|(_, o)| o.clone())
            .collect()
    })
}

/// `GET /api/v1/namespaces/{name}`: one namespace (404 when it does not exist; 403 when RBAC forbids
/// `get namespaces`).
pub(crate) async fn get_namespace(
    State(inner): State<Arc<Inner>>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Response {
    if !crate::authorized(&inner, &headers) {
        return crate::status_response(401, "Unauthorized", "Unauthorized".into());
    }
    if let Some(r) = watch::forbidden(&inner, &kind(), "get") {
        return r;
    }
    inner.counts.lock().unwrap().gets += 1;
    let w = inner.world.lock().unwrap();
    match w.objects.get(&key(&name)) {
        Some(ns) => axum::Json(kind().stamp(ns.clone())).into_response(),
        None => crate::status_response(404, "NotFound", format!("namespaces \"{name}\" not found")),
    }
}
