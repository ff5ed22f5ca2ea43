//! The owner thread: the only code that touches the SQLite connection.
//!
//! SQLite calls block, so the owner is a dedicated OS thread rather than a tokio task: it cannot
//! stall a runtime worker, and it needs no `spawn_blocking` slot for its whole life. It takes
//! [`Command`]s from a bounded channel one at a time, runs each as one transaction (in `queries`),
//! and answers on the command's oneshot after the commit. Commands carry the caller's tracing span
//! and their enqueue time, so a slow disk shows up in the logs of the pods that waited on it.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use rusqlite::Connection;
use tokio::sync::{mpsc, oneshot};

use super::{
    Durability, OpenReport, QUEUE_DEPTH, StoreError, StoredAssignment, StoredEni, StoredIdle,
    StoredState, queries,
};

/// A queue wait or a transaction longer than this is logged as a warning.
const SLOW: Duration = Duration::from_millis(250);

/// Where a request's answer goes.
pub(super) type Reply<T> = oneshot::Sender<Result<T, StoreError>>;

/// One request, with the context of the caller that sent it.
pub(super) struct Command {
    request: Request,
    span: tracing::Span,
    enqueued_at: Instant,
}

impl Command {
    /// Wraps `request` with the current span and time.
    pub(super) fn new(request: Request) -> Self {
        Self {
            request,
            span: tracing::Span::current(),
            enqueued_at: Instant::now(),
        }
    }
}

/// What the owner thread is asked to do; one variant per [`super::Store`] method.
pub(super) enum Request {
    Load {
        respond_to: Reply<StoredState>,
    },
    Durability {
        respond_to: Reply<Durability>,
    },
    SetInstanceId {
        instance_id: String,
        respond_to: Reply<()>,
    },
    UpsertEni {
        eni: StoredEni,
        respond_to: Reply<()>,
    },
    RemoveEni {
        eni_id: String,
        respond_to: Reply<()>,
    },
    RecordAssigned {
        a: StoredAssignment,
        respond_to: Reply<()>,
    },
    RecordReleased {
        container_id: String,
        ifname: String,
        idle_since_ms: u64,
        reservation: Option<(String, u64)>,
        respond_to: Reply<Option<Ipv4Addr>>,
    },
    RecordIdle {
        ips: Vec<StoredIdle>,
        respond_to: Reply<()>,
    },
    RemoveIps {
        ips: Vec<Ipv4Addr>,
        respond_to: Reply<()>,
    },
    ReplaceAll {
        state: StoredState,
        respond_to: Reply<()>,
    },
    Close {
        respond_to: oneshot::Sender<()>,
    },
}

impl Request {
    /// The name logs use for the request.
    fn name(&self) -> &'static str {
        match self {
            Request::Load { .. } => "load",
            Request::Durability { .. } => "durability",
            Request::SetInstanceId { .. } => "set_instance_id",
            Request::UpsertEni { .. } => "upsert_eni",
            Request::RemoveEni { .. } => "remove_eni",
            Request::RecordAssigned { .. } => "record_assigned",
            Request::RecordReleased { .. } => "record_released",
            Request::RecordIdle { .. } => "record_idle",
            Request::RemoveIps { .. } => "remove_ips",
            Request::ReplaceAll { .. } => "replace_all",
            Request::Close { .. } => "close",
        }
    }
}

/// Starts the owner thread, which opens the database with `opener` and then serves commands.
///
/// Returns once the database is open (or failed to open).
pub(super) async fn spawn<F>(opener: F) -> Result<(mpsc::Sender<Command>, OpenReport), StoreError>
where
    F: FnOnce() -> Result<(Connection, OpenReport), StoreError> + Send + 'static,
{
    let (tx, rx) = mpsc::channel(QUEUE_DEPTH);
    let (opened_tx, opened) = oneshot::channel();
    let span = tracing::Span::current();
    std::thread::Builder::new()
        .name("eniipam-store".to_owned())
        .spawn(move || {
            let opened = span.in_scope(opener);
            match opened {
                Ok((conn, report)) => {
                    // If the opener's caller has gone away, nobody can send commands: just close.
                    if opened_tx.send(Ok(report)).is_ok() {
                        serve(conn, rx);
                    } else {
                        close(conn);
                    }
                }
                Err(e) => {
                    let _ = opened_tx.send(Err(e));
                }
            }
        })
        .map_err(|e| StoreError::Io(format!("starting the store thread: {e}")))?;
    let report = opened.await.map_err(|_| StoreError::Closed)??;
    Ok((tx, report))
}

/// Serves commands until `close` or until every handle is dropped, then closes the database.
fn serve(mut conn: Connection, mut rx: mpsc::Receiver<Command>) {
    while let Some(Command {
        request,
        span,
        enqueued_at,
    }) = rx.blocking_recv()
    {
        let _entered = span.enter();
        let name = request.name();
        let waited = enqueued_at.elapsed();
        if waited > SLOW {
            tracing::warn!(
                request = name,
                ?waited,
                "state store request waited long in the queue"
            );
        }
        let started = Instant::now();
        let delivered = match request {
            Request::Close { respond_to } => {
                // Refuse what is still queued (their callers get `Closed`), then close the file
                // before answering, so a caller may reopen it at once.
                rx.close();
                drop(rx);
                close(conn);
                let _ = respond_to.send(());
                return;
            }
            Request::Load { respond_to } => respond_to.send(queries::load(&conn)).is_ok(),
            Request::Durability { respond_to } => {
                respond_to.send(queries::durability(&conn)).is_ok()
            }
            Request::SetInstanceId {
                instance_id,
                respond_to,
            } => respond_to
                .send(queries::set_instance_id(&mut conn, &instance_id))
                .is_ok(),
            Request::UpsertEni { eni, respond_to } => respond_to
                .send(queries::upsert_eni(&mut conn, &eni))
                .is_ok(),
            Request::RemoveEni { eni_id, respond_to } => respond_to
                .send(queries::remove_eni(&mut conn, &eni_id))
                .is_ok(),
            Request::RecordAssigned { a, respond_to } => respond_to
                .send(queries::record_assigned(&mut conn, &a))
                .is_ok(),
            Request::RecordReleased {
                container_id,
                ifname,
                idle_since_ms,
                reservation,
                respond_to,
            } => respond_to
                .send(queries::record_released(
                    &mut conn,
                    &container_id,
                    &ifname,
                    idle_since_ms,
                    reservation.as_ref(),
                ))
                .is_ok(),
            Request::RecordIdle { ips, respond_to } => respond_to
                .send(queries::record_idle(&mut conn, &ips))
                .is_ok(),
            Request::RemoveIps { ips, respond_to } => respond_to
                .send(queries::remove_ips(&mut conn, &ips))
                .is_ok(),
            Request::ReplaceAll { state, respond_to } => respond_to
                .send(queries::replace_all(&mut conn, &state))
                .is_ok(),
        };
        let took = started.elapsed();
        if took > SLOW {
            tracing::warn!(request = name, ?took, "state store transaction was slow");
        }
        if !delivered {
            // The write (if any) is committed all the same; only the answer is lost.
            tracing::debug!(
                request = name,
                "state store caller went away before the answer"
            );
        }
    }
    close(conn);
}

/// Closes the connection; the last connection to a WAL database checkpoints it into the main file
/// and removes the `-wal` file.
fn close(conn: Connection) {
    if let Err((_conn, e)) = conn.close() {
        tracing::warn!(error = %e, "closing the state database failed; dropping the connection");
    }
}
