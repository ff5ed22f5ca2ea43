//! The third source of truth for pod GC (issue 13, case 7): the pods the Kubernetes API server says are
//! bound to this node, like terway's pod GC.
//!
//! Why: containerd 1.6/1.7 never calls CNI GC, a chained plugin that fails DEL stops the chain before
//! eniipam, and a network namespace path the daemon cannot see is "unknown", not "dead". A pod can vanish
//! without a DEL and without host evidence; the API server still knows it is gone.
//!
//! Parts:
//! - [`PodWatch`] ([`watch`]): one list + watch of `pods` with `fieldSelector=spec.nodeName=<node>`
//!   (kube-rs's `watcher`: paged list, watch from its resourceVersion, bookmarks, re-list on 410 Gone).
//!   It keeps a compact view ([`BoundPods`]: a cheap `Arc` snapshot, also read by the lookahead) and
//!   whether the view is *synced*: initial list
//!   done and no watch error since. Any error drops the view's authority until a fresh list completes.
//! - The lookahead ([`spawn_lookahead`], [`lookahead`]): the pods bound here and not ADDed yet are the
//!   pool's demand before their ADDs (issue 25, item 3).
//! - [`ApiServerGc`] ([`gc`]): the step the running reconcile calls ([`release_gone_pods`]). An allocation
//!   whose pod (namespace/name/uid of its record) is gone — deleted, replaced by a pod of the same name
//!   with another uid, or finished (`Succeeded`/`Failed`, whose sandbox the kubelet has stopped) — for
//!   longer than the grace period, and which a direct GET confirms gone, is released through
//!   [`crate::ipam::Ipam::release_dead`], logged and counted (`eniipam_api_server_released`) — unless
//!   the host still shows the pod's network namespace (a force-deleted pod whose sandbox runs on):
//!   then the release waits for the namespace to go (`eniipam_api_server_release_deferred`).
//!
//! Evidence it cannot see means "unknown", never "gone": nothing is released while the view is not
//! synced (API server unreachable, RBAC refused, re-listing), when the confirming GET fails, for
//! allocations without pod identity (the IPAM role without `K8S_POD_*`), or for a possible static pod
//! (name ending in `-<node name>`) whose mirror pod is missing from the API.
//!
//! - [`node`]: the node's own readiness told to the API server: the optional startup taint removed once
//!   the pool holds warm IPs, and the `eniipam.io/PodNetworkReady` condition (issue 25, item 5).
//!
//! The client is built here from explicit settings ([`ApiServerTarget`]): the URL (in a cluster
//! `config` derives it from `KUBERNETES_SERVICE_HOST`/`_PORT`, as client-go does), the service-account
//! token file (re-read by kube as the kubelet rotates it) and CA file (re-read on rotation too). Nothing
//! here reads the environment.

mod gc;
pub mod lookahead;
pub mod node;
mod watch;

use std::path::PathBuf;
use std::time::Duration;

pub use gc::{ApiServerGc, GoneReason, Verdict, judge, release_gone_pods};
pub use lookahead::{pods_wanting_ip, spawn_lookahead};
pub use watch::{BoundPod, BoundPods, PodKey, PodPhase, PodWatch};

/// Where the API server is and how to authenticate to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiServerTarget {
    /// `https://host:port` (or `http://` for a local test double).
    pub url: String,
    /// A bearer token file (the service account's, rotated by the kubelet); `None` for no token.
    pub token_file: Option<PathBuf>,
    /// The CA bundle that signs the API server's certificate; required for `https`.
    pub ca_file: Option<PathBuf>,
}

/// Why the API-server source could not start.
#[derive(Debug, thiserror::Error)]
pub enum ApiServerError {
    #[error("api_server_url {url:?} is not a URL: {message}")]
    Url { url: String, message: String },
    #[error(
        "cannot read the API server's CA bundle {path} (api_server_ca_file; in a pod it is the \
         service account's ca.crt): {message}"
    )]
    Ca { path: PathBuf, message: String },
    #[error("an https API server needs a CA bundle: set api_server_ca_file")]
    NoCa,
    #[error(
        "cannot read the API server token file {path} (api_server_token_file; mount the \
         service account token, or set api_server_gc = false)"
    )]
    Token { path: PathBuf },
    #[error(
        "the API server token file {path} is empty or has whitespace (a trailing newline?) around \
         the token (api_server_token_file)"
    )]
    TokenFormat { path: PathBuf },
    #[error("cannot build the Kubernetes client: {0}")]
    Client(String),
}

/// The Kubernetes client for `target`: rustls with aws-lc-rs (the stack the AWS SDK already links), a
/// bounded connect timeout, and kube's own retries for 429/503/504.
pub fn client(target: &ApiServerTarget) -> Result<kube::Client, ApiServerError> {
    let url_err = |message: String| ApiServerError::Url {
        url: target.url.clone(),
        message,
    };
    let uri: http::Uri = target.url.parse().map_err(|e| url_err(format!("{e}")))?;
    match uri.scheme_str() {
        Some("https") | Some("http") => {}
        _ => return Err(url_err("the scheme must be https (or http)".into())),
    }
    if uri.host().is_none() {
        return Err(url_err("no host".into()));
    }
    let https = uri.scheme_str() == Some("https");
    let mut config = kube::Config::new(uri);
    config.connect_timeout = Some(Duration::from_secs(10));
    if let Some(ca) = &target.ca_file {
        let ca_err = |message: String| ApiServerError::Ca {
            path: ca.clone(),
            message,
        };
        let pem = std::fs::read(ca).map_err(|e| ca_err(e.to_string()))?;
        let certs: Vec<Vec<u8>> = pem::parse_many(&pem)
            .map_err(|e| ca_err(e.to_string()))?
            .into_iter()
            .filter(|p| p.tag() == "CERTIFICATE")
            .map(pem::Pem::into_contents)
            .collect();
        if certs.is_empty() {
            return Err(ca_err("no PEM certificate in it".into()));
        }
        config.root_cert = Some(certs);
        // kube re-reads the file about every minute, so a rotated cluster CA is picked up.
        config.root_cert_file = Some(ca.clone());
    } else if https {
        return Err(ApiServerError::NoCa);
    }
    if let Some(token) = &target.token_file {
        let text = std::fs::read_to_string(token).map_err(|_| ApiServerError::Token {
            path: token.clone(),
        })?;
        // kube sends the file verbatim (client-go trims it): a stray newline would make every request
        // fail with an invalid header, so say so now. The kubelet's tokens have none.
        if text.is_empty() || text.trim() != text {
            return Err(ApiServerError::TokenFormat {
                path: token.clone(),
            });
        }
        // kube re-reads it before it expires: bound service-account tokens rotate hourly.
        config.auth_info.token_file = Some(token.display().to_string());
    }
    kube::Client::try_from(config).map_err(|e| ApiServerError::Client(e.to_string()))
}
