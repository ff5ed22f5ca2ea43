//! List and watch, shared by every resource the double serves: the list's envelope, and the watch
//! stream (backlog from `resourceVersion`, live changes, bookmarks, `timeoutSeconds`, 410 on a
//! compacted `resourceVersion`), as the real server answers them.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;

use crate::{Change, Inner, status, status_response};

/// What a list or watch is of: the resource's key in the change log (`pods`, `nodes`,
/// `<plural>.<group>`) and what its objects say they are.
#[derive(Clone, Debug)]
pub(crate) struct Kind {
    /// The change log's key, also the RBAC name in a 403 (`eniconfigs.crd.k8s.amazonaws.com`).
    pub resource: String,
    pub api_version: String,
    pub kind: String,
}

impl Kind {
    /// `object` with `apiVersion` and `kind`, as single objects and watch events carry them (list
    /// items do not).
    pub fn stamp(&self, mut object: Value) -> Value {
        object["apiVersion"] = json!(self.api_version);
        object["kind"] = json!(self.kind);
        object
    }
}

/// Whether the query asks for a watch.
pub(crate) fn is_watch(q: &BTreeMap<String, String>) -> bool {
    q.get("watch").is_some_and(|w| w == "true" || w == "1")
}

/// The 403 a service account without list/watch on the resource gets, if the test forbade it.
pub(crate) fn forbidden(inner: &Inner, what: &Kind, verb: &str) -> Option<Response> {
    if !inner
        .world
        .lock()
        .unwrap()
        .forbidden
        .contains(&what.resource)
    {
        return None;
    }
    let (plural, group) = what
        .resource
        .split_once('.')
        .unwrap_or((what.resource.as_str(), ""));
    Some(status_response(
        403,
        "Forbidden",
        format!(
            "{} is forbidden: User \"system:serviceaccount:kube-system:eniipam\" cannot {verb} \
             resource \"{plural}\" in API group \"{group}\" at the cluster scope",
            what.resource
        ),
    ))
}

/// A `<Kind>List` of `items` at the current resourceVersion.
pub(crate) fn list(
    inner: &Inner,
    what: &Kind,
    items: impl Fn(&crate::World) -> Vec<Value>,
) -> Response {
    inner.counts.lock().unwrap().lists += 1;
    let w = inner.world.lock().unwrap();
    axum::Json(json!({
        "apiVersion": what.api_version,
        "kind": format!("{}List", what.kind),
        "metadata": {"resourceVersion": w.rv.to_string()},
        "items": items(&w),
    }))
    .into_response()
}

/// One watch event line.
fn line(what: &Kind, c: &Change) -> Bytes {
    let object = match c.kind {
        "ADDED" | "MODIFIED" | "DELETED" => what.stamp(c.object.clone()),
        "BOOKMARK" => json!({
            "kind": what.kind,
            "apiVersion": what.api_version,
            "metadata": {"resourceVersion": c.rv.to_string()},
        }),
        _ => c.object.clone(),
    };
    let mut s = serde_json::to_string(&json!({"type": c.kind, "object": object})).unwrap();
    s.push('\n');
    Bytes::from(s)
}

/// A watch of `what`'s objects for which `wanted` holds, from the query's `resourceVersion`.
pub(crate) fn watch(
    inner: Arc<Inner>,
    what: Kind,
    q: &BTreeMap<String, String>,
    wanted: impl Fn(&Value) -> bool + Send + 'static,
) -> Response {
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
    let resource = what.resource.clone();
    let mine = move |c: &Change| c.resource == resource && wanted(&c.object);
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
                .filter(|c| mine(c))
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
            let c = Change {
                rv: 0,
                resource: String::new(),
                kind: "ERROR",
                object: s,
            };
            let _ = tx.send(line(&what, &c)).await;
            return;
        }
        for c in &backlog {
            if tx.send(line(&what, c)).await.is_err() {
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
                    Ok(c) if c.kind == "BOOKMARK" => {
                        if bookmarks && tx.send(line(&what, &c)).await.is_err() {
                            return;
                        }
                    }
                    Ok(c) if mine(&c) => {
                        if tx.send(line(&what, &c)).await.is_err() {
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

/// A list or watch of the cluster-scoped `what` (nodes, namespaces): the bearer token, then
/// `fieldSelector=metadata.name=<n>` narrowing it to one object (as kube-rs watches one node), the
/// injected RBAC refusal, then [`watch`] or a [`list`] of `all(world)`.
pub(crate) fn cluster_list_or_watch(
    inner: Arc<Inner>,
    headers: &HeaderMap,
    q: &BTreeMap<String, String>,
    what: Kind,
    all: impl Fn(&crate::World) -> Vec<Value>,
) -> Response {
    if !crate::authorized(&inner, headers) {
        return status_response(401, "Unauthorized", "Unauthorized".into());
    }
    let name = match name_selector(q) {
        Ok(n) => n,
        Err(r) => return *r,
    };
    let watching = is_watch(q);
    if let Some(r) = forbidden(&inner, &what, if watching { "watch" } else { "list" }) {
        return r;
    }
    let wanted = move |o: &Value| name.as_ref().is_none_or(|n| o["metadata"]["name"] == **n);
    if watching {
        return watch(inner, what, q, wanted);
    }
    list(&inner, &what, |w| {
        all(w).into_iter().filter(|o| wanted(o)).collect()
    })
}

/// The name of `fieldSelector=metadata.name=<n>`, `None` without a field selector; any other
/// selector is refused with a 400 (the double is strict: it serves only the selectors eniipamd
/// sends).
pub(crate) fn name_selector(q: &BTreeMap<String, String>) -> Result<Option<String>, Box<Response>> {
    if let Some(sel) = q.get("labelSelector") {
        return Err(Box::new(status_response(
            400,
            "BadRequest",
            format!("unsupported label selector {sel:?} (this double serves none)"),
        )));
    }
    let Some(sel) = q.get("fieldSelector") else {
        return Ok(None);
    };
    sel.strip_prefix("metadata.name=")
        .filter(|n| !n.is_empty() && !n.contains(','))
        .map(|n| Some(n.to_owned()))
        .ok_or_else(|| {
            Box::new(status_response(
                400,
                "BadRequest",
                format!(
                    "unsupported field selector {sel:?} (this double serves metadata.name=<n>)"
                ),
            ))
        })
}
