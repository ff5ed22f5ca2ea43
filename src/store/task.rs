//! The owner thread: the only code that touches the SQLite connection.
//!
//! SQLite calls block, so the owner is a dedicated OS thread rather than a tokio task: it cannot
//! stall a runtime worker, and it needs no `spawn_blocking` slot for its whole life. It takes
//! [`Command`]s from a bounded channel one at a time, runs each as one transaction (in `queries`),
//! and answers on the command's oneshot after the commit. Commands carry the caller's tracing span
//! and their enqueue time, so a slow disk shows up in the logs of the pods that waited on it.
//!
//! Durations here are the disk's, measured on the wall clock (`std::time::Instant`): the owner thread
//! runs outside the tokio runtime, so tokio's (pausable) clock would not mean the same thing on both
//! sides of the queue. Nothing here waits on them; they only decide what is logged as slow.
#![allow(clippy::disallowed_types)]

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use rusqlite::Connection;
use tokio::sync::{mpsc, oneshot};

use super::Reply;
use super::{
    Durability, OpenReport, QUEUE_DEPTH, RowRepair, StoreError, StoredAssignment, StoredDemand,
    StoredEni, StoredIdle, StoredState, demand, queries,
};

/// A queue wait or a transaction longer than this is logged as a warning.
const SLOW: Duration = Duration::from_millis(250);

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
    Repair {
        rows: Vec<RowRepair>,
        respond_to: Reply<()>,
    },
    SaveDemand {
        demand: StoredDemand,
        respond_to: Reply<()>,
    },
    LoadDemand {
        respond_to: Reply<Option<StoredDemand>>,
    },
    RecordEc2Change {
        eni_id: String,
        addresses: Vec<super::Ec2Address>,
        change: super::Ec2Change,
        at_ms: u64,
        keep_ms: u64,
        respond_to: Reply<()>,
    },
    LoadEc2Changes {
        respond_to: Reply<Vec<super::StoredEc2Change>>,
    },
    /// The IPv6 tables' requests (`store::ipv6`).
    Ipv6(super::ipv6::Request6),
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
            Request::Repair { .. } => "repair",
            Request::SaveDemand { .. } => "save_demand",
            Request::LoadDemand { .. } => "load_demand",
            Request::RecordEc2Change { .. } => "record_ec2_change",
            Request::LoadEc2Changes { .. } => "load_ec2_changes",
            Request::Ipv6(r) => r.name(),
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
    // The open is a disk wait like any call: hold a paused clock through it when asked
    // (`hold_the_clock_on_disk_waits`), or a simulation's clock races ahead while SQLite opens.
    let report = if super::HOLD_THE_CLOCK.load(std::sync::atomic::Ordering::Relaxed) {
        tokio::task::spawn_blocking(move || opened.blocking_recv())
            .await
            .map_err(|_| StoreError::Closed)?
    } else {
        opened.await
    };
    let report = report.map_err(|_| StoreError::Closed)??;
    Ok((tx, report))
}

/// Most assign/release requests one group commit takes.
const GROUP_MAX: usize = 128;

impl Request {
    /// Whether the request may share a transaction with others of its kind (a group commit).
    fn groupable(&self) -> bool {
        matches!(
            self,
            Request::RecordAssigned { .. } | Request::RecordReleased { .. }
        )
    }
}

/// Serves commands until `close` or until every handle is dropped, then closes the database.
///
/// Assign and release requests that are already queued together are written in one transaction
/// (a group commit): each in its own savepoint, so one refused request changes nothing and fails
/// alone, and every caller is answered only after the shared commit. Under load this turns many
/// small commits into few, without delaying a request that arrives alone.
fn serve(mut conn: Connection, mut rx: mpsc::Receiver<Command>) {
    let mut next: Option<Command> = None;
    while let Some(cmd) = next.take().or_else(|| rx.blocking_recv()) {
        if cmd.request.groupable() {
            let mut group = vec![cmd];
            while group.len() < GROUP_MAX {
                match rx.try_recv() {
                    Ok(c) if c.request.groupable() => group.push(c),
                    Ok(c) => {
                        next = Some(c);
                        break;
                    }
                    Err(_) => break,
                }
            }
            if group.len() > 1 {
                group_commit(&mut conn, group);
            } else if let Some(one) = group.pop() {
                serve_one(&mut conn, one);
            }
            continue;
        }
        if let Request::Close { respond_to } = cmd.request {
            let _entered = cmd.span.enter();
            // Refuse what is still queued (their callers get `Closed`), then close the file
            // before answering, so a caller may reopen it at once.
            rx.close();
            drop(rx);
            close(conn);
            let _ = respond_to.send(());
            return;
        }
        serve_one(&mut conn, cmd);
    }
    close(conn);
}

/// A grouped request's answer, sent once the shared commit is known: the request's own result, or
/// the commit's error when the commit failed.
type Deferred = Box<dyn FnOnce(Option<&StoreError>)>;

fn defer<T: 'static>(respond_to: Reply<T>, result: Result<T, StoreError>) -> Deferred {
    Box::new(move |commit_failed| {
        let _ = respond_to.send(match commit_failed {
            Some(e) => Err(e.clone()),
            None => result,
        });
    })
}

/// Runs `group` (assigns and releases) in one transaction, a savepoint each; answers after commit.
fn group_commit(conn: &mut Connection, group: Vec<Command>) {
    let started = Instant::now();
    let size = group.len();
    let mut tx = match queries::begin_group(conn) {
        Ok(tx) => tx,
        Err(e) => {
            for c in group {
                answer_err(c.request, &e);
            }
            return;
        }
    };
    let mut answers: Vec<Deferred> = Vec::with_capacity(size);
    for Command {
        request,
        span,
        enqueued_at,
    } in group
    {
        let _entered = span.enter();
        warn_if_waited_long(request.name(), enqueued_at);
        let sp = match tx.savepoint() {
            Ok(sp) => sp,
            Err(e) => {
                answer_err(request, &StoreError::from(e));
                continue;
            }
        };
        let (ok, answer) = match request {
            Request::RecordAssigned { a, respond_to } => {
                let r = queries::assign_in(&sp, &a);
                (r.is_ok(), defer(respond_to, r))
            }
            Request::RecordReleased {
                container_id,
                ifname,
                idle_since_ms,
                reservation,
                respond_to,
            } => {
                let r = queries::release_in(
                    &sp,
                    &container_id,
                    &ifname,
                    idle_since_ms,
                    reservation.as_ref(),
                );
                (r.is_ok(), defer(respond_to, r))
            }
            other => {
                // Only groupable requests reach here.
                answer_err(other, &StoreError::Io("not a grouped request".into()));
                continue;
            }
        };
        // A refused request's savepoint rolls back when dropped; the others are kept. A savepoint
        // that cannot be released wrote nothing: its caller gets that error.
        if ok && let Err(e) = sp.commit() {
            let err = StoreError::from(e);
            answers.push(Box::new(move |_| answer(Some(&err))));
            continue;
        }
        answers.push(answer);
    }
    let committed = tx.commit().map_err(StoreError::from);
    for answer in answers {
        answer(committed.as_ref().err());
    }
    let took = started.elapsed();
    if took > SLOW {
        tracing::warn!(size, ?took, "state store group commit was slow");
    }
}

/// Logs a request that waited in the queue longer than [`SLOW`].
fn warn_if_waited_long(request: &'static str, enqueued_at: Instant) {
    let waited = enqueued_at.elapsed();
    if waited > SLOW {
        tracing::warn!(
            request,
            ?waited,
            "state store request waited long in the queue"
        );
    }
}

/// Answers a request with `err` (its write did not happen).
fn answer_err(request: Request, err: &StoreError) {
    match request {
        Request::RecordAssigned { respond_to, .. } => drop(respond_to.send(Err(err.clone()))),
        Request::RecordReleased { respond_to, .. } => drop(respond_to.send(Err(err.clone()))),
        other => tracing::error!(request = other.name(), "not a grouped request"),
    }
}

/// Serves one request (anything but `Close`) in its own transaction.
fn serve_one(conn: &mut Connection, cmd: Command) {
    let Command {
        request,
        span,
        enqueued_at,
    } = cmd;
    {
        let _entered = span.enter();
        let name = request.name();
        warn_if_waited_long(name, enqueued_at);
        let started = Instant::now();
        let delivered = match request {
            Request::Close { respond_to } => {
                // `serve` handles Close; never here.
                respond_to.send(()).is_ok()
            }
            Request::Load { respond_to } => respond_to.send(queries::load(conn)).is_ok(),
            Request::Durability { respond_to } => {
                respond_to.send(queries::durability(conn)).is_ok()
            }
            Request::SetInstanceId {
                instance_id,
                respond_to,
            } => respond_to
                .send(queries::set_instance_id(conn, &instance_id))
                .is_ok(),
            Request::UpsertEni { eni, respond_to } => {
                respond_to.send(queries::upsert_eni(conn, &eni)).is_ok()
            }
            Request::RemoveEni { eni_id, respond_to } => {
                respond_to.send(queries::remove_eni(conn, &eni_id)).is_ok()
            }
            Request::RecordAssigned { a, respond_to } => {
                respond_to.send(queries::record_assigned(conn, &a)).is_ok()
            }
            Request::RecordReleased {
                container_id,
                ifname,
                idle_since_ms,
                reservation,
                respond_to,
            } => respond_to
                .send(queries::record_released(
                    conn,
                    &container_id,
                    &ifname,
                    idle_since_ms,
                    reservation.as_ref(),
                ))
                .is_ok(),
            Request::RecordIdle { ips, respond_to } => {
                respond_to.send(queries::record_idle(conn, &ips)).is_ok()
            }
            Request::RemoveIps { ips, respond_to } => {
                respond_to.send(queries::remove_ips(conn, &ips)).is_ok()
            }
            Request::ReplaceAll { state, respond_to } => {
                respond_to.send(queries::replace_all(conn, &state)).is_ok()
            }
            Request::Repair { rows, respond_to } => {
                respond_to.send(queries::repair(conn, &rows)).is_ok()
            }
            Request::SaveDemand {
                demand: d,
                respond_to,
            } => respond_to.send(demand::save(conn, &d)).is_ok(),
            Request::LoadDemand { respond_to } => respond_to.send(demand::load(conn)).is_ok(),
            Request::RecordEc2Change {
                eni_id,
                addresses,
                change,
                at_ms,
                keep_ms,
                respond_to,
            } => respond_to
                .send(super::changes::record(
                    conn, &eni_id, &addresses, change, at_ms, keep_ms,
                ))
                .is_ok(),
            Request::LoadEc2Changes { respond_to } => {
                respond_to.send(super::changes::load(conn)).is_ok()
            }
            Request::Ipv6(r) => r.serve(conn),
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
}

/// Closes the connection; the last connection to a WAL database checkpoints it into the main file
/// and removes the `-wal` file.
fn close(conn: Connection) {
    if let Err((_conn, e)) = conn.close() {
        tracing::warn!(error = %e, "closing the state database failed; dropping the connection");
    }
}
