//! The watcher: one list + watch of this node (`fieldSelector=metadata.name=<node>`: its labels and
//! annotations name the ENIConfig) and one of the ENIConfigs (all of them: a cluster has a handful,
//! one per zone, and the node may be relabelled to any), kube's `watcher` for both (paged list,
//! watch from its resourceVersion, bookmarks, re-list on 410 Gone) with kube's default backoff.
//!
//! Each is kept as a [`View`] (`eniipam-kubeview`'s, the one every API-server watch shares): of the
//! node only the ENIConfig name it selects, of the ENIConfigs the objects. The view is replaced
//! whole at each (re-)list's end (`InitDone`), so an object deleted while the watch was down does
//! not linger. Errors (the API server away, RBAC refusing the list, the CRD not
//! installed: 404) are logged and retried; the published value stays at the last known one, since
//! the cluster's ENIConfigs did not change because the daemon stopped seeing them. Until both lists
//! have completed once, the value is [`NodeNetwork::Unknown`].

use eniipam_kubeview::View;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use tokio::sync::watch as notify;
use tokio::task::JoinHandle;

use super::eniconfig::ENIConfig;
use super::select::{config_name, judge};
use super::{NodeNetwork, Selector};

/// The node's [`NodeNetwork`] from the two views: of the node, the ENIConfig its labels and
/// annotations name ([`config_name`]; `None`: none named); the ENIConfigs whole.
fn network(node: &View<Option<String>>, configs: &View<ENIConfig>, node_name: &str) -> NodeNetwork {
    if !node.synced || !configs.synced {
        return NodeNetwork::Unknown;
    }
    // Not registered (or deleted: the node is going away): nothing to say yet.
    let Some(named) = node.objects.get(node_name) else {
        return NodeNetwork::Unknown;
    };
    judge(named.as_deref(), &configs.objects)
}

enum Update {
    /// Boxed: events are large (a Node is); one allocation per event is nothing at this rate.
    Node(Box<Result<Event<Node>, watcher::Error>>),
    Config(Box<Result<Event<ENIConfig>, watcher::Error>>),
}

/// Watches the node (labels, annotations) and the ENIConfigs; publishes the node's NodeNetwork on
/// every change that alters it (not on unrelated changes). Survives API-server restarts, 410s and
/// RBAC errors (stays at the last known value, logs, retries with backoff as kube's watcher does).
pub fn spawn(
    client: kube::Client,
    node_name: String,
    sel: Selector,
) -> (notify::Receiver<NodeNetwork>, JoinHandle<()>) {
    let (tx, rx) = notify::channel(NodeNetwork::Unknown);
    let nodes: Api<Node> = Api::all(client.clone());
    let configs: Api<ENIConfig> = Api::all(client);
    let node_events = watcher::watcher(
        nodes,
        watcher::Config::default().fields(&format!("metadata.name={node_name}")),
    )
    .default_backoff()
    .map(|e| Update::Node(Box::new(e)))
    .boxed();
    let config_events = watcher::watcher(configs, watcher::Config::default())
        .default_backoff()
        .map(|e| Update::Config(Box::new(e)))
        .boxed();
    let task = tokio::spawn(async move {
        let mut updates = futures::stream::select(node_events, config_events);
        let mut node = View::new();
        let mut configs = View::new();
        while let Some(update) = updates.next().await {
            let changed = match update {
                Update::Node(e) => match *e {
                    Ok(e) => node.apply(e, |n: &Node| config_name(n, &sel)),
                    Err(e) => {
                        tracing::warn!(node = %node_name, error = %e, "watching this node for its ENIConfig failed; retrying");
                        false
                    }
                },
                Update::Config(e) => match *e {
                    Ok(e) => configs.apply(e, ENIConfig::clone),
                    Err(e) => {
                        tracing::warn!(error = %e, "watching ENIConfigs (crd.k8s.amazonaws.com/v1alpha1) failed; retrying (is the CRD installed, and may the daemon list and watch eniconfigs?)");
                        false
                    }
                },
            };
            if !changed {
                continue;
            }
            let now = network(&node, &configs, &node_name);
            tx.send_if_modified(|old| {
                if *old == now {
                    return false;
                }
                tracing::info!(node = %node_name, was = ?old, now = ?now, "the node's custom networking changed");
                *old = now;
                true
            });
            if tx.is_closed() {
                return;
            }
        }
    });
    (rx, task)
}
