//! Nodes: list and watch (one node by `metadata.name`, or all), GET and PATCH of a node and of its
//! `status` subresource, and what tests do to nodes (see the crate docs).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

use crate::stream::{self as watch, Kind};
use crate::{Change, FakeApiServer, Inner, World, authorized, status_response};

/// A node as the API server stores it: `taints` as `(key, effect)`, and the kubelet's `Ready`
/// condition (so a test sees that a patch of eniipam's condition leaves the kubelet's alone).
pub fn node_json(name: &str, taints: &[(&str, &str)]) -> Value {
    let taints: Vec<Value> = taints
        .iter()
        .map(|(key, effect)| json!({"key": key, "effect": effect}))
        .collect();
    json!({
        "metadata": {"name": name, "uid": format!("uid-{name}"), "labels": {}},
        "spec": {"providerID": "aws:///us-east-1a/i-0123456789abcdef0", "taints": taints},
        "status": {"conditions": [{
            "type": "Ready",
            "status": "True",
            "reason": "KubeletReady",
            "message": "kubelet is posting ready status",
            "lastHeartbeatTime": "2026-01-01T00:00:00Z",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }]},
    })
}

fn node_kind() -> Kind {
    Kind {
        resource: "nodes".into(),
        api_version: "v1".into(),
        kind: "Node".into(),
    }
}

fn with_kind(node: Value) -> Value {
    node_kind().stamp(node)
}

/// A stored node changed (`kind`: `ADDED` or `MODIFIED`): a new resourceVersion (the shared
/// counter), and the change reaches node watches.
fn bump(inner: &Inner, w: &mut World, name: &str, kind: &'static str) {
    w.rv += 1;
    let rv = w.rv;
    let Some(n) = w.nodes.get_mut(name) else {
        return;
    };
    n["metadata"]["resourceVersion"] = json!(rv.to_string());
    let object = n.clone();
    w.publish(
        inner,
        Change {
            rv,
            resource: "nodes".into(),
            kind,
            object,
        },
    );
}

impl FakeApiServer {
    /// Creates (or replaces) a node.
    pub fn put_node(&self, node: Value) {
        let name = node["metadata"]["name"].as_str().unwrap().to_owned();
        let mut w = self.inner.world.lock().unwrap();
        let kind = if w.nodes.contains_key(&name) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        w.nodes.insert(name.clone(), node);
        bump(&self.inner, &mut w, &name, kind);
    }

    /// Deletes a node (watches see its last state with a new resourceVersion). False if absent.
    pub fn delete_node(&self, name: &str) -> bool {
        let mut w = self.inner.world.lock().unwrap();
        let Some(mut node) = w.nodes.remove(name) else {
            return false;
        };
        w.rv += 1;
        node["metadata"]["resourceVersion"] = json!(w.rv.to_string());
        let c = Change {
            rv: w.rv,
            resource: "nodes".into(),
            kind: "DELETED",
            object: node,
        };
        w.publish(&self.inner, c);
        true
    }

    /// Sets (`Some`) or removes (`None`) one of the node's labels, as `kubectl label` does.
    pub fn set_node_label(&self, name: &str, key: &str, value: Option<&str>) {
        self.set_node_meta(name, "labels", key, value);
    }

    /// Sets (`Some`) or removes (`None`) one of the node's annotations, as `kubectl annotate` does.
    pub fn set_node_annotation(&self, name: &str, key: &str, value: Option<&str>) {
        self.set_node_meta(name, "annotations", key, value);
    }

    fn set_node_meta(&self, name: &str, field: &str, key: &str, value: Option<&str>) {
        let mut w = self.inner.world.lock().unwrap();
        let n = w.nodes.get_mut(name).expect("no such node");
        let meta = &mut n["metadata"][field];
        if !meta.is_object() {
            *meta = json!({});
        }
        let map = meta.as_object_mut().unwrap();
        let before = map.get(key).cloned();
        match value {
            Some(v) => map.insert(key.to_owned(), json!(v)),
            None => map.remove(key),
        };
        // An update that changes nothing is no change: no new resourceVersion, no event.
        if map.get(key) != before.as_ref() {
            bump(&self.inner, &mut w, name, "MODIFIED");
        }
    }

    /// A node with these `(key, effect)` taints.
    pub fn add_node(&self, name: &str, taints: &[(&str, &str)]) {
        self.put_node(node_json(name, taints));
    }

    /// The node as stored now.
    pub fn node(&self, name: &str) -> Option<Value> {
        self.inner.world.lock().unwrap().nodes.get(name).cloned()
    }

    /// The node's taint keys, in order.
    pub fn taint_keys(&self, name: &str) -> Vec<String> {
        self.node(name)
            .and_then(|n| n["spec"]["taints"].as_array().cloned())
            .unwrap_or_default()
            .iter()
            .filter_map(|t| t["key"].as_str().map(str::to_owned))
            .collect()
    }

    /// The node's condition of type `kind`.
    pub fn condition(&self, name: &str, kind: &str) -> Option<Value> {
        self.node(name)?["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == kind)
            .cloned()
    }

    /// Another writer changes the node's labels (its resourceVersion moves on).
    pub fn touch_node(&self, name: &str) {
        touch(&self.inner, name);
    }

    /// The next `n` node PATCHes race another writer: the node changes just before each is
    /// applied, so one that names the resourceVersion it read gets 409 Conflict.
    pub fn race_node_patches(&self, n: u32) {
        self.inner.world.lock().unwrap().racing_writes = n;
    }

    /// The next `n` node requests (GET or PATCH) fail with HTTP `code` (e.g. 500, 503, 403).
    pub fn fail_node_requests(&self, n: u32, code: u16) {
        self.inner.world.lock().unwrap().node_failures = Some((n, code));
    }
}

/// An injected failure for this request, if one is due.
fn injected_failure(w: &mut World) -> Option<Response> {
    let (left, code) = w.node_failures?;
    w.node_failures = (left > 1).then_some((left - 1, code));
    let reason = match code {
        403 => "Forbidden",
        429 => "TooManyRequests",
        503 => "ServiceUnavailable",
        _ => "InternalError",
    };
    Some(status_response(code, reason, format!("injected {code}")))
}

fn not_found(name: &str) -> Response {
    status_response(404, "NotFound", format!("nodes \"{name}\" not found"))
}

pub(crate) async fn list_or_watch(
    State(inner): State<Arc<Inner>>,
    headers: HeaderMap,
    Query(q): Query<BTreeMap<String, String>>,
) -> Response {
    watch::cluster_list_or_watch(inner, &headers, &q, node_kind(), |w| {
        w.nodes.values().cloned().collect()
    })
}

pub(crate) async fn get_node(
    State(inner): State<Arc<Inner>>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Response {
    if !authorized(&inner, &headers) {
        return status_response(401, "Unauthorized", "Unauthorized".into());
    }
    let mut w = inner.world.lock().unwrap();
    if let Some(r) = injected_failure(&mut w) {
        return r;
    }
    inner.counts.lock().unwrap().node_gets += 1;
    match w.nodes.get(&name) {
        Some(n) => axum::Json(with_kind(n.clone())).into_response(),
        None => not_found(&name),
    }
}

/// Which part of the node a PATCH may change: the main resource ignores `status`, the `status`
/// subresource ignores everything but `status`, as for every resource with a status subresource.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Part {
    Spec,
    Status,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum PatchKind {
    Merge,
    Strategic,
}

pub(crate) async fn patch_node(
    State(inner): State<Arc<Inner>>,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Bytes,
) -> Response {
    patch(&inner, &headers, &name, &body, Part::Spec)
}

pub(crate) async fn patch_node_status(
    State(inner): State<Arc<Inner>>,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Bytes,
) -> Response {
    patch(&inner, &headers, &name, &body, Part::Status)
}

fn patch(inner: &Inner, headers: &HeaderMap, name: &str, body: &[u8], part: Part) -> Response {
    if !authorized(inner, headers) {
        return status_response(401, "Unauthorized", "Unauthorized".into());
    }
    let media = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    let kind = match media.as_str() {
        "application/merge-patch+json" => PatchKind::Merge,
        "application/strategic-merge-patch+json" => PatchKind::Strategic,
        other => {
            return status_response(
                415,
                "UnsupportedMediaType",
                format!(
                    "the body of the request was in an unknown format ({other:?}) - accepted media \
                     types of this double: application/merge-patch+json, \
                     application/strategic-merge-patch+json"
                ),
            );
        }
    };
    let Ok(Value::Object(mut patch)) = serde_json::from_slice::<Value>(body) else {
        return status_response(400, "BadRequest", "the patch is not a JSON object".into());
    };
    let mut w = inner.world.lock().unwrap();
    if let Some(r) = injected_failure(&mut w) {
        return r;
    }
    if !w.nodes.contains_key(name) {
        return not_found(name);
    }
    if w.racing_writes > 0 {
        w.racing_writes -= 1;
        drop(w);
        // The racer is another client: its write lands first.
        touch(inner, name);
        w = inner.world.lock().unwrap();
    }
    let node = w.nodes.get(name).unwrap().clone();
    let wanted_rv = patch
        .get_mut("metadata")
        .and_then(Value::as_object_mut)
        .and_then(|m| m.remove("resourceVersion"));
    if let Some(rv) = wanted_rv
        && rv != node["metadata"]["resourceVersion"]
    {
        inner.counts.lock().unwrap().conflicts += 1;
        return status_response(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on nodes \"{name}\": the object has been modified; \
                 please apply your changes to the latest version and try again"
            ),
        );
    }
    match part {
        Part::Spec => {
            patch.remove("status");
        }
        Part::Status => patch.retain(|k, _| k == "status"),
    }
    let mut merged = node.clone();
    merge(&mut merged, &Value::Object(patch), kind, "");
    if merged != node {
        w.nodes.insert(name.to_owned(), merged);
        bump(inner, &mut w, name, "MODIFIED");
    }
    {
        let mut c = inner.counts.lock().unwrap();
        match part {
            Part::Spec => c.node_patches += 1,
            Part::Status => c.status_patches += 1,
        }
    }
    axum::Json(with_kind(w.nodes[name].clone())).into_response()
}

/// Another writer changes the node's labels (its resourceVersion moves on).
fn touch(inner: &Inner, name: &str) {
    let mut w = inner.world.lock().unwrap();
    let n = w.nodes.get_mut(name).expect("no such node");
    let touched = n["metadata"]["labels"]["touched"]
        .as_str()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(0);
    n["metadata"]["labels"]["touched"] = json!((touched + 1).to_string());
    bump(inner, &mut w, name, "MODIFIED");
}

/// The lists a strategic merge patch merges by a key rather than replaces (the Node schema's
/// `patchMergeKey`s for what eniipamd patches): `status.conditions` by `type`.
fn merge_key(path: &str) -> Option<&'static str> {
    (path == "/status/conditions").then_some("type")
}

/// RFC 7386 merge of `patch` into `target` (`null` deletes a field, a list replaces the list), and
/// for a strategic patch, lists with a merge key merged item by item.
fn merge(target: &mut Value, patch: &Value, kind: PatchKind, path: &str) {
    match patch {
        Value::Object(fields) => {
            if !target.is_object() {
                *target = Value::Object(Map::new());
            }
            let t = target.as_object_mut().unwrap();
            for (k, v) in fields {
                let sub = format!("{path}/{k}");
                if v.is_null() {
                    t.remove(k);
                    continue;
                }
                if kind == PatchKind::Strategic
                    && let (Some(key), Some(items)) = (merge_key(&sub), v.as_array())
                {
                    let list = t.entry(k.clone()).or_insert_with(|| json!([]));
                    if !list.is_array() {
                        *list = json!([]);
                    }
                    let list = list.as_array_mut().unwrap();
                    for item in items {
                        match list.iter_mut().find(|x| x[key] == item[key]) {
                            Some(x) => merge(x, item, kind, &sub),
                            None => list.push(item.clone()),
                        }
                    }
                    continue;
                }
                merge(t.entry(k.clone()).or_insert(Value::Null), v, kind, &sub);
            }
        }
        other => *target = other.clone(),
    }
}
