//! Custom resources: any group, version and plural, cluster-scoped or namespaced, served once a test
//! installs its CRD ([`FakeApiServer::install_crd`]); list, watch (shared with pods and nodes, see
//! [`crate::stream`]) and GET, and what tests do to the objects.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::stream::{self as watch, Kind};
use crate::{Change, FakeApiServer, Inner, World, authorized, status_response};

/// A custom resource definition, as far as the API server's routing needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Crd {
    pub group: String,
    pub version: String,
    pub kind: String,
    /// The path segment, lower case (`eniconfigs`).
    pub plural: String,
    /// Objects live in a namespace (`/apis/<g>/<v>/namespaces/<ns>/<plural>`), or not.
    pub namespaced: bool,
}

impl Crd {
    pub fn cluster_scoped(group: &str, version: &str, kind: &str, plural: &str) -> Self {
        Self {
            group: group.into(),
            version: version.into(),
            kind: kind.into(),
            plural: plural.into(),
            namespaced: false,
        }
    }

    pub fn namespaced(group: &str, version: &str, kind: &str, plural: &str) -> Self {
        Self {
            namespaced: true,
            ..Self::cluster_scoped(group, version, kind, plural)
        }
    }

    /// The VPC CNI's `ENIConfig` (`crd.k8s.amazonaws.com/v1alpha1`, cluster-scoped).
    pub fn eniconfig() -> Self {
        Self::cluster_scoped(
            "crd.k8s.amazonaws.com",
            "v1alpha1",
            "ENIConfig",
            "eniconfigs",
        )
    }

    /// eniipam's `NetworkProfile` (`eniipam.io/v1alpha1`, cluster-scoped).
    pub fn network_profile() -> Self {
        Self::cluster_scoped(
            "eniipam.io",
            "v1alpha1",
            "NetworkProfile",
            "networkprofiles",
        )
    }

    /// Kubernetes' `NetworkPolicy` (`networking.k8s.io/v1`, namespaced): built in, not a CRD, so
    /// the double serves it from the start.
    pub fn network_policy() -> Self {
        Self::namespaced(
            "networking.k8s.io",
            "v1",
            "NetworkPolicy",
            "networkpolicies",
        )
    }

    /// `<plural>.<group>`: the CRD's name, and the resource as RBAC names it.
    pub fn key(&self) -> String {
        format!("{}.{}", self.plural, self.group)
    }

    fn what(&self) -> Kind {
        Kind {
            resource: self.key(),
            api_version: format!("{}/{}", self.group, self.version),
            kind: self.kind.clone(),
        }
    }
}

/// An `ENIConfig` as `kubectl apply` stores it: `spec.subnet` and `spec.securityGroups` (left out
/// when `groups` is `None`).
pub fn eniconfig_json(name: &str, subnet: &str, groups: Option<&[&str]>) -> Value {
    let mut spec = json!({"subnet": subnet});
    if let Some(groups) = groups {
        spec["securityGroups"] = json!(groups);
    }
    json!({"metadata": {"name": name}, "spec": spec})
}

/// The (namespace or "", name) of `object`, checked against the CRD's scope.
fn place(crd: &Crd, object: &Value) -> (String, String) {
    let name = object["metadata"]["name"]
        .as_str()
        .expect("the object has no metadata.name")
        .to_owned();
    let ns = object["metadata"]["namespace"].as_str();
    match (crd.namespaced, ns) {
        (true, Some(ns)) => (ns.to_owned(), name),
        (true, None) => panic!(
            "{} is namespaced: the object needs metadata.namespace",
            crd.key()
        ),
        (false, None) => (String::new(), name),
        (false, Some(_)) => panic!(
            "{} is cluster-scoped: the object has a namespace",
            crd.key()
        ),
    }
}

impl FakeApiServer {
    /// Creates or replaces a NetworkPolicy (`metadata.namespace` and `metadata.name` set), as
    /// `kubectl apply` does.
    pub fn put_network_policy(&self, policy: Value) {
        self.put_object(&Crd::network_policy(), policy);
    }

    /// Deletes a NetworkPolicy; false when there was none.
    pub fn delete_network_policy(&self, namespace: &str, name: &str) -> bool {
        self.delete_object(&Crd::network_policy(), Some(namespace), name)
    }

    /// Serves `crd`'s objects from now on (none yet), as `kubectl apply -f <crd>.yaml` does.
    pub fn install_crd(&self, crd: Crd) {
        let mut w = self.inner.world.lock().unwrap();
        w.crds.insert(crd.key(), crd);
    }

    /// Creates or replaces a custom object (of an installed CRD): `ADDED` or `MODIFIED`, with the
    /// next resourceVersion. An unchanged object is no change (no event), as on a real server.
    pub fn put_object(&self, crd: &Crd, mut object: Value) {
        let mut w = self.inner.world.lock().unwrap();
        assert!(
            w.crds.contains_key(&crd.key()),
            "the CRD {} is not installed",
            crd.key()
        );
        let (ns, name) = place(crd, &object);
        let key = (crd.key(), ns, name);
        let old = w.objects.get(&key);
        if object["metadata"].get("uid").is_none() {
            let uid = old.map_or_else(
                || json!(format!("uid-{}", key.2)),
                |o| o["metadata"]["uid"].clone(),
            );
            object["metadata"]["uid"] = uid;
        }
        if let Some(old) = old {
            let mut same = object.clone();
            same["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"].clone();
            if &same == old {
                return;
            }
        }
        let kind = if old.is_some() { "MODIFIED" } else { "ADDED" };
        change(&self.inner, &mut w, key, kind, object);
    }

    /// Deletes a custom object (watches see its last state with a new resourceVersion). False if
    /// absent.
    pub fn delete_object(&self, crd: &Crd, namespace: Option<&str>, name: &str) -> bool {
        let mut w = self.inner.world.lock().unwrap();
        let key = (
            crd.key(),
            namespace.unwrap_or_default().to_owned(),
            name.to_owned(),
        );
        let Some(object) = w.objects.get(&key).cloned() else {
            return false;
        };
        change(&self.inner, &mut w, key, "DELETED", object);
        true
    }

    /// The custom object as stored now.
    pub fn object(&self, crd: &Crd, namespace: Option<&str>, name: &str) -> Option<Value> {
        let key = (
            crd.key(),
            namespace.unwrap_or_default().to_owned(),
            name.to_owned(),
        );
        self.inner.world.lock().unwrap().objects.get(&key).cloned()
    }
}

/// Records a change of a stored object (custom, or a namespace): the next resourceVersion, the
/// store updated, and the change published.
pub(crate) fn change(
    inner: &Inner,
    w: &mut World,
    key: (String, String, String),
    kind: &'static str,
    mut object: Value,
) {
    w.rv += 1;
    object["metadata"]["resourceVersion"] = json!(w.rv.to_string());
    let resource = key.0.clone();
    if kind == "DELETED" {
        w.objects.remove(&key);
    } else {
        w.objects.insert(key, object.clone());
    }
    let c = Change {
        rv: w.rv,
        resource,
        kind,
        object,
    };
    w.publish(inner, c);
}

/// What a path under `/apis/<group>/<version>/` asks for.
enum Request {
    /// A list or watch, in one namespace or all.
    Collection { namespace: Option<String> },
    Object {
        namespace: Option<String>,
        name: String,
    },
}

/// `<group>/<version>/[namespaces/<ns>/]<plural>[/<name>]` → (group, version, plural, request).
fn parse(path: &str) -> Option<(&str, &str, &str, Request)> {
    let parts: Vec<&str> = path.split('/').collect();
    if parts.iter().any(|p| p.is_empty()) {
        return None;
    }
    let (group, version) = (*parts.first()?, *parts.get(1)?);
    let (plural, request) = match &parts[2..] {
        [plural] => (*plural, Request::Collection { namespace: None }),
        [plural, name] => (
            *plural,
            Request::Object {
                namespace: None,
                name: (*name).into(),
            },
        ),
        ["namespaces", ns, plural] => (
            *plural,
            Request::Collection {
                namespace: Some((*ns).into()),
            },
        ),
        ["namespaces", ns, plural, name] => (
            *plural,
            Request::Object {
                namespace: Some((*ns).into()),
                name: (*name).into(),
            },
        ),
        _ => return None,
    };
    Some((group, version, plural, request))
}

/// The real server's 404 for a group/version it does not serve: plain text, not a Status.
fn page_not_found() -> Response {
    (StatusCode::NOT_FOUND, "404 page not found\n").into_response()
}

pub(crate) async fn serve(
    State(inner): State<Arc<Inner>>,
    headers: HeaderMap,
    Path(path): Path<String>,
    Query(q): Query<BTreeMap<String, String>>,
) -> Response {
    if !authorized(&inner, &headers) {
        return status_response(401, "Unauthorized", "Unauthorized".into());
    }
    let Some((group, version, plural, request)) = parse(&path) else {
        return page_not_found();
    };
    let crd = {
        let w = inner.world.lock().unwrap();
        if !w
            .crds
            .values()
            .any(|c| c.group == group && c.version == version)
        {
            return page_not_found();
        }
        w.crds
            .values()
            .find(|c| c.group == group && c.version == version && c.plural == plural)
            .cloned()
    };
    let namespace = match &request {
        Request::Collection { namespace } | Request::Object { namespace, .. } => namespace.clone(),
    };
    let Some(crd) = crd.filter(|c| c.namespaced || namespace.is_none()) else {
        return status_response(
            404,
            "NotFound",
            "the server could not find the requested resource".into(),
        );
    };
    let what = crd.what();
    match request {
        Request::Object { name, .. } => {
            inner.counts.lock().unwrap().gets += 1;
            let key = (crd.key(), namespace.unwrap_or_default(), name.clone());
            match inner.world.lock().unwrap().objects.get(&key) {
                Some(o) => axum::Json(what.stamp(o.clone())).into_response(),
                None => status_response(
                    404,
                    "NotFound",
                    format!("{}.{} \"{name}\" not found", crd.plural, crd.group),
                ),
            }
        }
        Request::Collection { .. } => {
            let name = match watch::name_selector(&q) {
                Ok(n) => n,
                Err(r) => return *r,
            };
            let watching = watch::is_watch(&q);
            if let Some(r) =
                watch::forbidden(&inner, &what, if watching { "watch" } else { "list" })
            {
                return r;
            }
            let wanted = move |o: &Value| {
                namespace
                    .as_ref()
                    .is_none_or(|ns| o["metadata"]["namespace"] == **ns)
                    && name.as_ref().is_none_or(|n| o["metadata"]["name"] == **n)
            };
            if watching {
                return watch::watch(inner, what, &q, wanted);
            }
            let resource = crd.key();
            watch::list(&inner, &what, |w| {
                w.objects
                    .iter()
                    .filter(|((r, _, _), o)| *r == resource && wanted(o))
                    .map(|(_, o)| o.clone())
                    .collect()
            })
        }
    }
}
