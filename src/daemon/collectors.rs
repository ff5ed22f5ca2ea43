//! The collectors: leaked ENIs (ours by cluster tag, `available`, past the grace period) and pods gone
//! from the Kubernetes API server.

use std::sync::Arc;
use std::time::Duration;

use super::{Building, CloudClients, DaemonError};
use crate::cloud::NodeContext;
use crate::cloud::leak::{LeakCollector, LeakConfig};
use crate::config::DaemonConfig;
use crate::pool::Pool;
use crate::reconcile::api_server::{self, ApiServerGc, PodWatch, node};

/// The leaked-ENI collector (ours by cluster tag, `available`, past the grace period).
pub(super) fn spawn_leak_collector(
    config: &DaemonConfig,
    clients: &CloudClients,
    node: &NodeContext,
    b: &mut Building,
) {
    let leak = Arc::new(LeakCollector::new(
        clients.cloud.clone(),
        config.cluster_name.clone(),
        node.vpc_id.clone(),
        LeakConfig {
            grace: Duration::from_secs(config.leaked_eni_grace_secs),
        },
    ));
    let _ = b.leak_cell.set(leak.clone());
    b.background.push(leak.spawn(
        Duration::from_secs(config.leaked_eni_period_secs),
        b.cancel.clone(),
    ));
}

/// The pods bound to this node from the Kubernetes API server, when that source is on
/// (`config.api_server_target()`): the watch starts now and syncs in the background (until it has,
/// pods are unknown and nothing is released); the running reconcile releases allocations whose pod is
/// gone from it.
pub(super) fn spawn_api_server_gc(
    config: &DaemonConfig,
    b: &mut Building,
) -> Result<Option<ApiServerGc>, DaemonError> {
    let Some(target) = config.api_server_target() else {
        if config.api_server_gc.is_none()
            && let Some(url) = &config.api_server_url
        {
            tracing::info!(api_server = %url, token_file = %config.api_server_token_file.display(),
                "API-server pod GC off: an API server is known but there is no service-account token \
                 (set api_server_gc = true to require it)");
        }
        return Ok(None);
    };
    let client = api_server::client(&target)?;
    let (watch, task) = PodWatch::spawn(
        client.clone(),
        config.node_name.clone(),
        b.metrics.clone(),
        b.cancel.clone(),
    );
    b.background.push(task);
    tracing::info!(api_server = %target.url, node = %config.node_name, grace_secs = config.api_server_grace_secs,
        "API-server pod GC on: watching the pods bound to this node");
    Ok(Some(ApiServerGc::new(
        watch,
        client,
        Duration::from_secs(config.api_server_grace_secs),
        b.metrics.clone(),
    )))
}

/// The node's startup taint and condition, when there is something to do and an API server to tell
/// (`config.node_status_target()`). With NetworkPolicy enforcement on, `policy_in_force` holds the
/// taint until the first sync is in the kernel.
pub(super) fn spawn_node_status(
    config: &DaemonConfig,
    clients: &CloudClients,
    (pool, policy_in_force): (&Pool, Option<tokio::sync::watch::Receiver<bool>>),
    b: &mut Building,
) -> Result<(), DaemonError> {
    let Some(target) = config.node_status_target() else {
        return Ok(());
    };
    let client = api_server::client(&target)?;
    let status = config.node_status_config();
    tracing::info!(api_server = %target.url, node = %status.node_name,
        startup_taint = ?status.startup_taint.as_ref().map(|(k, e)| format!("{k}:{e}")),
        condition = status.condition.then_some(node::CONDITION_TYPE),
        "node readiness: keeping this node's startup taint and condition");
    b.background.push(node::spawn(
        client,
        status,
        (pool.clone(), policy_in_force),
        clients.stats.clone(),
        b.cancel.clone(),
    ));
    Ok(())
}
