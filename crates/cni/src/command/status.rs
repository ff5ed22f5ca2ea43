//! STATUS: whether the plugin can serve ADDs now.

use super::daemon::connect;
use crate::netconf::NetConf;
use crate::spec::{CniError, ErrorCode};

/// STATUS fails only when the plugin truly cannot serve ADDs: the daemon is unreachable or has not
/// finished rebuilding its state (50). containerd ≥ 2.0.1 turns a failing STATUS into NetworkReady=false,
/// the kubelet marks the node NotReady, and its pods are evicted after 300 s: a node whose pool is
/// full right now (normal at max-pods) must not be made NotReady for it. That case stays visible where
/// it belongs: ADD answers 11 (try again later) with the reason, and the daemon's metrics and
/// `eniipamctl status` report the exhaustion. Existing pods keep their connectivity either way, so 51
/// is never answered.
pub(super) async fn status(conf: &NetConf) -> Result<(), CniError> {
    let reply = match connect(conf).await {
        Ok(mut client) => client.status().await,
        Err(e) => Err(e),
    };
    match reply {
        Err(e) => Err(CniError::new(ErrorCode::PluginNotAvailable, e.to_string())),
        Ok(r) if !r.ready => Err(CniError::new(
            ErrorCode::PluginNotAvailable,
            "eniipamd is not ready (rebuilding its state)",
        )
        .with_details(r.reason)),
        Ok(r) => {
            if r.exhausted {
                tracing::info!(
                    reason = %r.reason, capacity = r.capacity, assigned = r.assigned,
                    "STATUS: the pool cannot hand out a new IP now; ADDs get 11 until it can"
                );
            }
            Ok(())
        }
    }
}
