//! A Kubernetes API server double on loopback, for the requests eniipamd makes as kube-rs makes them.
//!
//! Pods ([`pods`]):
//! - `GET /api/v1/pods?fieldSelector=spec.nodeName=<n>` (list; without the selector, every pod of
//!   the cluster): a `PodList` with the current `metadata.resourceVersion`; items without
//!   `apiVersion`/`kind`, as the real server sends them.
//! - `GET /api/v1/pods?watch=true&resourceVersion=<rv>&timeoutSeconds=<s>&allowWatchBookmarks=true`:
//!   a chunked stream of JSON lines `{"type":"ADDED|MODIFIED|DELETED|BOOKMARK","object":...}` for every
//!   change after `rv`, ended by the server after `timeoutSeconds`; an `rv` older than the compaction
//!   point gets the real server's answer: HTTP 200 and one `ERROR` event with a 410 `Expired` Status.
//! - `GET /api/v1/namespaces/<ns>/pods/<name>`: the pod, or a 404 `NotFound` Status.
//!
//! Nodes ([`nodes`]):
//! - `GET /api/v1/nodes?fieldSelector=metadata.name=<n>` (or no selector: every node): list and
//!   watch as for pods, so a daemon sees its node's labels and annotations change.
//! - `GET /api/v1/nodes/<name>` (and `.../status`): the node, or a 404 `NotFound` Status.
//! - `PATCH /api/v1/nodes/<name>` (spec and metadata; `spec.taints` is what eniipamd changes) and
//!   `PATCH /api/v1/nodes/<name>/status` (status; `status.conditions`): JSON merge patch
//!   (`application/merge-patch+json`, RFC 7386: a list is replaced whole) and strategic merge patch
//!   (`application/strategic-merge-patch+json`: `status.conditions` merged by `type`, as the Node
//!   schema's patch strategy says). Any other content type gets 415, as the real server answers one
//!   it does not support. A patch carrying `metadata.resourceVersion` that is not the node's current
//!   one gets 409 `Conflict` (the server's optimistic concurrency); every change bumps it.
//!
//! Namespaces ([`namespaces`]):
//! - `GET /api/v1/namespaces` (optionally `fieldSelector=metadata.name=<n>`): list and watch as for
//!   pods, so a daemon sees namespace annotations change.
//!
//! Custom resources ([`custom`]), generic over group, version and plural, cluster-scoped or
//! namespaced, once a test installs the CRD ([`Crd`]); a resource that is not installed answers 404
//! as a server without the CRD does:
//! - `GET /apis/<group>/<version>/<plural>` (every namespace) and, namespaced,
//!   `/apis/<group>/<version>/namespaces/<ns>/<plural>`: list and watch as for pods
//!   (`fieldSelector=metadata.name=<n>` honoured).
//! - `GET /apis/<group>/<version>/[namespaces/<ns>/]<plural>/<name>`: the object, or a 404 Status.
//!
//! NetworkPolicies (`networking.k8s.io/v1`, namespaced) are served as a custom resource that is
//! always installed, as the real server always serves them ([`custom::Crd::network_policy`],
//! [`FakeApiServer::put_network_policy`]).
//!
//! Every change to pods, nodes, namespaces and custom objects bumps the one resourceVersion counter, joins the
//! one history (compacted together) and reaches the open watches of its resource.
//!
//! Every request: an optional bearer token (anything else gets a 401 Status); every request's path
//! and query is recorded, in order.
//!
//! Tests change pods and nodes (each change bumps the resourceVersion, shared by all objects as etcd's
//! revision is, and reaches open watches), end watches as a server-side timeout would, compact
//! history, send bookmarks, make another writer race a patch, make node requests fail, and stop the
//! server (listener and every connection closed: connection refused) and start it again on the same
//! port.

pub mod custom;
pub mod namespaces;
pub mod nodes;
pub mod pods;
mod stream;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::{broadcast, watch};
use tokio::task::{JoinHandle, JoinSet};

pub use custom::{Crd, eniconfig_json};
pub use namespaces::namespace_json;
pub use nodes::node_json;
pub use pods::pod_json;

/// One change, as the log and open watches see it.
#[derive(Clone, Debug)]
struct Change {
    rv: u64,
    /// The resource's key (`pods`, `nodes`, `<plural>.<group>`); empty for a bookmark, which every
    /// watch gets.
    resource: String,
    kind: &'static str,
    object: Value,
}

#[derive(Default)]
struct World {
    rv: u64,
    pods: BTreeMap<(String, String), Value>,
    log: Vec<Change>,
    /// Watches from a resourceVersion below this get 410 Gone.
    compacted_to: u64,
    /// While set, changes are not delivered to watches (a lagging watch cache): they wait here.
    held: Option<Vec<Change>>,
    /// Lists and watches of these resources (keys as in [`Change`]) answer 403 Forbidden (RBAC
    /// without list/watch); GETs still work.
    forbidden: BTreeSet<String>,
    nodes: BTreeMap<String, Value>,
    /// The custom resources served, by key (`<plural>.<group>`): the CRDs installed.
    crds: BTreeMap<String, Crd>,
    /// Custom objects by (resource key, namespace or "" when cluster-scoped, name).
    objects: BTreeMap<(String, String, String), Value>,
    /// The next this many node PATCHes are raced by another writer (the kubelet, say): the node
    /// changes (resourceVersion bumped) just before the patch is applied.
    racing_writes: u32,
    /// The next this many node requests (GET or PATCH) fail with this HTTP status.
    node_failures: Option<(u32, u16)>,
}

/// Requests served, by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub lists: u32,
    pub watches: u32,
    pub gets: u32,
    /// Watches answered with 410 Gone.
    pub expired: u32,
    /// Requests refused for a missing or wrong token.
    pub unauthorized: u32,
    /// `GET /api/v1/nodes/<name>`.
    pub node_gets: u32,
    /// `PATCH /api/v1/nodes/<name>` that changed the node (conflicts and failures not counted).
    pub node_patches: u32,
    /// `PATCH /api/v1/nodes/<name>/status` that were applied.
    pub status_patches: u32,
    /// Node PATCHes answered 409 Conflict.
    pub conflicts: u32,
}

struct Inner {
    world: Mutex<World>,
    changes: broadcast::Sender<Change>,
    end_watches: watch::Sender<u64>,
    token: Mutex<Option<String>>,
    counts: Mutex<Counts>,
    /// Every request's method, path and query, in order.
    requests: Mutex<Vec<String>>,
}

/// The double. Dropping it stops it.
pub struct FakeApiServer {
    inner: Arc<Inner>,
    addr: SocketAddr,
    serving: Mutex<Option<JoinHandle<()>>>,
}

fn status(code: u16, reason: &str, message: String) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    })
}

fn status_response(code: u16, reason: &str, message: String) -> Response {
    (
        StatusCode::from_u16(code).unwrap(),
        axum::Json(status(code, reason, message)),
    )
        .into_response()
}

impl FakeApiServer {
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (changes, _) = broadcast::channel(4096);
        let (end_watches, _) = watch::channel(0);
        let s = Self {
            inner: Arc::new(Inner {
                world: Mutex::new(World::default()),
                changes,
                end_watches,
                token: Mutex::new(None),
                counts: Mutex::new(Counts::default()),
                requests: Mutex::new(Vec::new()),
            }),
            addr,
            serving: Mutex::new(None),
        };
        s.install_crd(custom::Crd::network_policy());
        s.serve(listener);
        s
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn counts(&self) -> Counts {
        *self.inner.counts.lock().unwrap()
    }

    /// Every request served so far (path and query; node PATCHes as `PATCH <path>`), in order.
    pub fn requests(&self) -> Vec<String> {
        self.inner.requests.lock().unwrap().clone()
    }

    /// Requires `Authorization: Bearer <token>` from now on.
    pub fn require_token(&self, token: &str) {
        *self.inner.token.lock().unwrap() = Some(token.to_owned());
    }

    fn serve(&self, listener: TcpListener) {
        let router = Router::new()
            .route("/api/v1/pods", get(pods::list_or_watch))
            .route("/api/v1/namespaces/{ns}/pods/{name}", get(pods::get_pod))
            .route("/api/v1/nodes", get(nodes::list_or_watch))
            .route("/api/v1/namespaces", get(namespaces::list_or_watch))
            .route("/api/v1/namespaces/{name}", get(namespaces::get_namespace))
            .route("/apis/{*path}", get(custom::serve))
            .route(
                "/api/v1/nodes/{name}",
                get(nodes::get_node).patch(nodes::patch_node),
            )
            .route(
                "/api/v1/nodes/{name}/status",
                get(nodes::get_node).patch(nodes::patch_node_status),
            )
            .layer(axum::middleware::from_fn_with_state(
                self.inner.clone(),
                record,
            ))
            .with_state(self.inner.clone());
        let task = tokio::spawn(async move {
            // Every connection lives in this set: aborting the task closes them all.
            let mut conns = JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((stream, _)) = accepted else { continue };
                        let service = TowerToHyperService::new(router.clone());
                        conns.spawn(async move {
                            let _ = hyper::server::conn::http1::Builder::new()
                                .serve_connection(TokioIo::new(stream), service)
                                .await;
                        });
                    }
                    Some(_) = conns.join_next() => {}
                }
            }
        });
        *self.serving.lock().unwrap() = Some(task);
    }

    /// The API server goes away: the listener and every open connection (watches included) close, and
    /// new connections are refused.
    pub async fn stop(&self) {
        let task = self.serving.lock().unwrap().take();
        if let Some(t) = task {
            t.abort();
            let _ = t.await;
        }
    }

    /// The API server comes back on the same address, with the same pods, nodes and history.
    pub async fn restart(&self) {
        self.stop().await;
        let listener = TcpListener::bind(self.addr).await.unwrap();
        self.serve(listener);
    }
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        if let Some(t) = self.serving.lock().unwrap().take() {
            t.abort();
        }
    }
}

async fn record(
    axum::extract::State(inner): axum::extract::State<Arc<Inner>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let mut line = req
        .uri()
        .path_and_query()
        .map(|p| p.to_string())
        .unwrap_or_default();
    if req.method() != axum::http::Method::GET {
        line = format!("{} {line}", req.method());
    }
    inner.requests.lock().unwrap().push(line);
    next.run(req).await
}

impl World {
    /// Records a change: the resourceVersion it carries is the next of the shared counter (set by
    /// the caller on the object), it joins the history, and reaches open watches unless held.
    fn publish(&mut self, inner: &Inner, c: Change) {
        self.log.push(c.clone());
        if let Some(held) = self.held.as_mut() {
            held.push(c);
            return;
        }
        // Sent under the world lock: a watch subscribes under it too, so none misses or repeats one.
        let _ = inner.changes.send(c);
    }
}

fn authorized(inner: &Inner, headers: &HeaderMap) -> bool {
    let Some(token) = inner.token.lock().unwrap().clone() else {
        return true;
    };
    let ok = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v == format!("Bearer {token}"));
    if !ok {
        inner.counts.lock().unwrap().unauthorized += 1;
    }
    ok
}
