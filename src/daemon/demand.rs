//! The pool's learned demand and the pods seen before their ADD, wired to the state file and the
//! API-server watch (issue 25, item 3).
//!
//! - At startup the demand an earlier life learned is read back ([`restore_demand`]), with its ages.
//! - While running, it is written whenever it changed, at most every [`PERSIST_EVERY`]: pod starts
//!   come in bursts, and one write per start would cost the disk for nothing (a crash loses at most
//!   a few seconds of learning, which costs one unbatched warm-up, not a pod).
//! - At shutdown it is written once more ([`save_demand`]).
//! - With the API-server watch on, the lookahead feeds the pool the pods bound here, and the lead
//!   time each pod's ADD finds is recorded (`eniipam_demand_lead_seconds`).

use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::pool::Pool;
use crate::reconcile::api_server::{ApiServerGc, spawn_lookahead};
use crate::store::Store;

/// The shortest time between two writes of the learned demand.
pub const PERSIST_EVERY: Duration = Duration::from_secs(5);

/// Reads back the learned demand of an earlier life into `pool`. A failed read costs the memory,
/// not the start.
pub(super) async fn restore_demand(pool: &Pool, store: &Store) {
    match store.load_demand().await {
        Ok(Some(stored)) => pool.restore_demand(&stored),
        Ok(None) => tracing::debug!("no learned demand in the state file yet"),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the learned demand; the warm pool learns it again")
        }
    }
}

/// Writes the pool's learned demand if its generation moved past `written`; returns the generation
/// written (or `written` when nothing was, or the write failed).
pub(super) async fn save_demand(pool: &Pool, store: &Store, written: u64) -> u64 {
    let (generation, memory) = pool.demand_memory();
    if generation == written {
        return written;
    }
    match store.save_demand(memory).await {
        Ok(()) => generation,
        Err(e) => {
            tracing::warn!(error = %e, "cannot write the learned demand; trying again later");
            written
        }
    }
}

/// Writes the learned demand when it changed, at most every [`PERSIST_EVERY`], until `cancel`.
pub(super) fn spawn_demand_writer(
    pool: Pool,
    store: Store,
    cancel: CancellationToken,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut written = pool.demand_memory().0;
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(PERSIST_EVERY) => {}
            }
            written = save_demand(&pool, &store, written).await;
        }
    })
}

/// With the API-server watch on: the lookahead, and the lead-time metric.
pub(super) fn spawn_lookahead_on(
    api_server: &ApiServerGc,
    pool: &Pool,
    metrics: &Metrics,
    cancel: CancellationToken,
) -> JoinHandle<()> {
    let histogram = metrics.demand_lead_time.clone();
    pool.set_lead_time_observer(move |lead| histogram.observe(lead.as_secs_f64()));
    tracing::info!("lookahead on: pods bound to this node are demand before their ADDs");
    spawn_lookahead(api_server.watch().clone(), pool.clone(), cancel)
}
