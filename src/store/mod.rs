//! Durable state: what eniipamd knows about its ENIs and IPs, in one SQLite file.
//!
//! The file (default `/var/lib/eniipam/state.db`) survives daemon restarts, so a restarted daemon
//! does not forget which pod holds which IP. Its parts, one file each:
//!
//! - `schema`: the tables, the ordered list of migrations and the `meta` table's schema version.
//! - `open`: opening the file — creating it, moving a corrupt one aside, refusing a newer one,
//!   and the pragmas (WAL, `synchronous=NORMAL`, and why that is safe here).
//! - `queries`: one SQLite transaction per [`Store`] call; `demand`: those of the pool's learned
//!   demand ([`StoredDemand`]).
//! - `task`: the owner thread, the only code that touches the connection, fed by a bounded channel
//!   of commands that carry a oneshot for the reply.
//!
//! A [`Store`] is a cheap, cloneable async handle to that thread. Every write call is one transaction
//! committed before the call returns, and the tables themselves make it impossible to hold an IP
//! twice: `ips.ip` is the primary key, and `UNIQUE(container_id, ifname)` allows one IP per
//! attachment.
//!
//! Times are unix milliseconds of the wall clock, so they mean the same after a restart.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::{mpsc, oneshot};

mod changes;
mod demand;
mod ipv6;
mod open;
mod queries;
mod schema;
mod task;

pub use changes::{Ec2Address, Ec2Change, StoredEc2Change};
pub use ipv6::{StoredAssignment6, StoredIpv6, StoredPrefix6, StoredReservation6};
pub use schema::SCHEMA_VERSION;

use task::{Command, Request};

/// Where a request's answer goes: the owner thread ([`task`]) and the IPv6 tables' requests
/// ([`ipv6`]) both answer through it, so it lives here, above both.
type Reply<T> = oneshot::Sender<Result<T, StoreError>>;

/// How many commands may wait for the owner thread before callers wait to enqueue.
const QUEUE_DEPTH: usize = 256;

/// Whether store calls hold a paused tokio clock while they wait (see [`hold_the_clock_on_disk_waits`]).
static HOLD_THE_CLOCK: AtomicBool = AtomicBool::new(false);

/// For simulations on a paused clock (a `current_thread` runtime built with `start_paused(true)`, or
/// `tokio::time::pause`), process-wide; off by default.
///
/// The owner thread answers outside the runtime, so while a call waits for it the runtime sees no
/// work and a paused clock auto-advances to the next timer: simulated time jumps ahead by however
/// long that timer was away, once per disk write. When on, each call (and the open) waits for its answer inside
/// `tokio::task::spawn_blocking`, and tokio does not auto-advance a paused clock while a blocking
/// task runs. It costs a blocking-pool thread per call in flight; leave it off in the daemon.
pub fn hold_the_clock_on_disk_waits(on: bool) {
    HOLD_THE_CLOCK.store(on, Ordering::Relaxed);
}

/// A cloneable handle to the store's owner thread.
///
/// The thread ends, closing the database, when [`Store::close`] is called or the last handle is
/// dropped. Calls after that return [`StoreError::Closed`].
#[derive(Clone, Debug)]
pub struct Store {
    tx: mpsc::Sender<Command>,
}

/// What can go wrong with the state database.
#[derive(Clone, Debug, thiserror::Error)]
pub enum StoreError {
    /// The file was written by a newer eniipam; this build cannot read it and does not touch it.
    #[error(
        "the state database has schema version {found}, newer than version {supported} that this \
         eniipam supports; upgrade eniipam, or move the file away to start afresh (the startup \
         reconcile rebuilds the state from EC2 and the host)"
    )]
    NewerSchema {
        /// The version recorded in the file.
        found: u32,
        /// The newest version this build knows.
        supported: u32,
    },
    /// SQLite failed (disk I/O, locking, permissions, a value out of range…).
    #[error("state database: {0}")]
    Sqlite(String),
    /// A filesystem operation around the database failed (creating its directory, moving it aside).
    #[error("state database file: {0}")]
    Io(String),
    /// The store was closed, or its owner thread is gone.
    #[error("the state store is closed")]
    Closed,
    /// The write would hold an IP twice or give an attachment two IPs; nothing was changed.
    #[error("state conflict: {0}")]
    Conflict(String),
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        match e.sqlite_error_code() {
            Some(rusqlite::ErrorCode::ConstraintViolation) => StoreError::Conflict(e.to_string()),
            _ => StoreError::Sqlite(e.to_string()),
        }
    }
}

/// What [`Store::open`] found and did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenReport {
    /// The file did not exist (or was moved aside) and a new, empty database was created.
    pub created: bool,
    /// The file was corrupt and has been renamed to this path (`<path>.corrupt-<unix-ms>`) for
    /// inspection; the store starts empty. The daemon should log this loudly.
    pub moved_aside: Option<PathBuf>,
    /// The schema version of the database now open (always [`SCHEMA_VERSION`]).
    pub schema_version: u32,
}

/// How the open database writes to disk, as SQLite reports it (for startup logs and tests).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Durability {
    /// `PRAGMA journal_mode`: `wal` for a file, `memory` for [`Store::open_in_memory`].
    pub journal_mode: String,
    /// `PRAGMA synchronous` by name: `OFF`, `NORMAL`, `FULL` or `EXTRA`.
    pub synchronous: String,
}

/// Everything the store holds.
///
/// [`Store::load`] returns it sorted: ENIs by device index (then id), assignments and idle IPs by IP.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct StoredState {
    /// The EC2 instance the state belongs to, once the daemon has recorded it.
    pub instance_id: Option<String>,
    /// The ENIs attached to the node that the pool uses.
    pub enis: Vec<StoredEni>,
    /// IPs held by pod attachments.
    pub assignments: Vec<StoredAssignment>,
    /// IPs the pool holds with no attachment.
    pub idle: Vec<StoredIdle>,
    /// IPs held out of circulation: neither idle nor assigned (see [`StoredQuarantined`]).
    pub quarantined: Vec<StoredQuarantined>,
}

/// An IP held out of circulation because its history is unknown (the state file was lost) and the
/// host's evidence could not tell whether a pod holds it. It is neither handed out nor given back
/// until evidence, or an operator, clears it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredQuarantined {
    pub ip: Ipv4Addr,
    pub eni_id: String,
    /// Since when (unix ms).
    pub since_ms: u64,
    /// Why, for the operator.
    pub reason: String,
}

/// What [`Store::repair`] makes one IP's row be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RowRepair {
    /// Assigned to this attachment (any other row of the attachment goes).
    Assigned(StoredAssignment),
    Idle(StoredIdle),
    Quarantined(StoredQuarantined),
    /// No row at all.
    Absent(Ipv4Addr),
}

/// One ENI attached to the node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredEni {
    /// EC2's id (`eni-…`).
    pub eni_id: String,
    /// The interface's MAC address, as IMDS spells it.
    pub mac: String,
    /// The attachment's device index (0 is the primary ENI).
    pub device_index: u32,
    /// The subnet the ENI is in.
    pub subnet_id: String,
    /// That subnet's IPv4 CIDR block.
    pub subnet_cidr: String,
    /// The ENI's primary private IP (never handed to a pod).
    pub primary_ip: Ipv4Addr,
    /// Whether eniipam created the ENI (and so deletes it when it is no longer needed).
    pub created_by_us: bool,
    /// When eniipam created or first saw the ENI (unix ms).
    pub created_at_ms: u64,
}

/// One IP held by one pod attachment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredAssignment {
    /// The pod IP.
    pub ip: Ipv4Addr,
    /// The ENI the IP is a secondary address of.
    pub eni_id: String,
    /// The CNI network (the conflist's `name`); empty when unknown (rows older than schema v2).
    pub network: String,
    /// The CNI container id.
    pub container_id: String,
    /// The CNI interface name in the container.
    pub ifname: String,
    /// The path of the container's network namespace.
    pub netns: String,
    /// The pod's namespace.
    pub pod_namespace: String,
    /// The pod's name.
    pub pod_name: String,
    /// The pod's UID.
    pub pod_uid: String,
    /// The key a sticky (StatefulSet) pod keeps its IP under across restarts, if it is sticky.
    pub sticky_key: Option<String>,
    /// When the IP was assigned (unix ms).
    pub assigned_at_ms: u64,
}

/// One IP the pool holds with no attachment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredIdle {
    /// The IP.
    pub ip: Ipv4Addr,
    /// The ENI the IP is a secondary address of.
    pub eni_id: String,
    /// When the IP became idle (unix ms).
    pub idle_since_ms: u64,
    /// The sticky key the IP is reserved for, and when that reservation ends (unix ms).
    pub reservation: Option<(String, u64)>,
}

/// What the pool learned of this node's pods (see `pool::demand`): recent starts and bursts, in
/// unix ms so that they keep their ages across a restart.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct StoredDemand {
    /// When it was written.
    pub written_at_ms: u64,
    /// Recent pod starts, oldest first.
    pub starts_ms: Vec<u64>,
    /// The last pod start.
    pub last_start_ms: Option<u64>,
    /// The current run of starts close together, and whether it became a burst.
    pub run: Option<StoredBurst>,
    pub run_is_burst: bool,
    /// The last burst, and the one before it.
    pub last_burst: Option<StoredBurst>,
    pub previous_burst: Option<StoredBurst>,
}

/// A run of pod starts (unix ms).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoredBurst {
    pub first_ms: u64,
    pub last_ms: u64,
    pub starts: u32,
}

impl Store {
    /// Opens (or creates) the database at `path`, creating its parent directory.
    ///
    /// A corrupt file is moved aside to `<path>.corrupt-<unix-ms>` and replaced by an empty
    /// database; [`OpenReport::moved_aside`] says so. A file from a newer eniipam is refused with
    /// [`StoreError::NewerSchema`] and left as it is. Older schemas are migrated in one
    /// transaction.
    pub async fn open(path: &Path) -> Result<(Store, OpenReport), StoreError> {
        let path = path.to_owned();
        let (tx, report) = task::spawn(move || open::open_file(&path)).await?;
        Ok((Store { tx }, report))
    }

    /// An empty store in memory, for tests and dry runs. Nothing survives the last handle.
    pub async fn open_in_memory() -> Result<Store, StoreError> {
        let (tx, _report) = task::spawn(open::open_memory).await?;
        Ok(Store { tx })
    }

    /// Everything the store holds, sorted (see [`StoredState`]).
    pub async fn load(&self) -> Result<StoredState, StoreError> {
        self.call(|respond_to| Request::Load { respond_to }).await
    }

    /// The journal mode and `synchronous` setting of the open database.
    pub async fn durability(&self) -> Result<Durability, StoreError> {
        self.call(|respond_to| Request::Durability { respond_to })
            .await
    }

    /// Records the EC2 instance id the state belongs to.
    pub async fn set_instance_id(&self, instance_id: &str) -> Result<(), StoreError> {
        self.call(|respond_to| Request::SetInstanceId {
            instance_id: instance_id.to_owned(),
            respond_to,
        })
        .await
    }

    /// Inserts the ENI, or replaces what the store knew about the ENI with this id.
    pub async fn upsert_eni(&self, eni: StoredEni) -> Result<(), StoreError> {
        self.call(|respond_to| Request::UpsertEni { eni, respond_to })
            .await
    }

    /// Forgets the ENI and every IP row (assigned or idle) on it. Unknown ids are not an error.
    pub async fn remove_eni(&self, eni_id: &str) -> Result<(), StoreError> {
        self.call(|respond_to| Request::RemoveEni {
            eni_id: eni_id.to_owned(),
            respond_to,
        })
        .await
    }

    /// One transaction: the IP becomes assigned to the attachment (insert or update the row). Conflict if the
    /// attachment already holds a different IP, or the IP is assigned to a different attachment.
    ///
    /// Recording the same attachment and IP again succeeds and updates the row's other fields
    /// (including `eni_id`). An idle IP loses its sticky reservation when it is assigned.
    pub async fn record_assigned(&self, a: StoredAssignment) -> Result<(), StoreError> {
        self.call(|respond_to| Request::RecordAssigned { a, respond_to })
            .await
    }

    /// One transaction: the attachment's IP becomes idle since `idle_since_ms`, with an optional sticky
    /// reservation. Returns the IP, or None if the attachment was unknown.
    pub async fn record_released(
        &self,
        container_id: &str,
        ifname: &str,
        idle_since_ms: u64,
        reservation: Option<(String, u64)>,
    ) -> Result<Option<Ipv4Addr>, StoreError> {
        self.call(|respond_to| Request::RecordReleased {
            container_id: container_id.to_owned(),
            ifname: ifname.to_owned(),
            idle_since_ms,
            reservation,
            respond_to,
        })
        .await
    }

    /// Idle IPs the pool holds (e.g. after assign from EC2, or found by reconcile).
    ///
    /// One transaction: an IP the store already knows as idle is updated. Conflict, and nothing
    /// changes, if any of the IPs is assigned to an attachment (release it first) or appears twice.
    pub async fn record_idle(&self, ips: Vec<StoredIdle>) -> Result<(), StoreError> {
        self.call(|respond_to| Request::RecordIdle { ips, respond_to })
            .await
    }

    /// IPs found gone from their ENI (EC2 no longer holds them there): delete their rows, and the
    /// journal's record of EC2 assigning them, which a restart within the minute would otherwise
    /// trust over a describe that no longer shows them (issue 44 case 8: an address no ENI has,
    /// holding a capacity token). A record of giving one back stays.
    ///
    /// One transaction; rows are deleted whether idle or assigned, and unknown IPs are ignored.
    pub async fn remove_ips(&self, ips: Vec<Ipv4Addr>) -> Result<(), StoreError> {
        self.call(|respond_to| Request::RemoveIps { ips, respond_to })
            .await
    }

    /// Makes each IP's row what the pool holds (the running reconcile's repair of a store that fell out
    /// of step, e.g. after a failed write). One transaction; a repair that would still conflict
    /// changes nothing.
    pub async fn repair(&self, rows: Vec<RowRepair>) -> Result<(), StoreError> {
        self.call(|respond_to| Request::Repair { rows, respond_to })
            .await
    }

    /// Replace everything (after a startup reconcile) in one transaction.
    ///
    /// Conflict, and nothing changes, if `state` holds an ENI or IP twice or gives an attachment
    /// two IPs.
    pub async fn replace_all(&self, state: StoredState) -> Result<(), StoreError> {
        self.call(|respond_to| Request::ReplaceAll { state, respond_to })
            .await
    }

    /// Replaces the learned demand (one transaction).
    pub async fn save_demand(&self, demand: StoredDemand) -> Result<(), StoreError> {
        self.call(|respond_to| Request::SaveDemand { demand, respond_to })
            .await
    }

    /// The learned demand last written, if any.
    pub async fn load_demand(&self) -> Result<Option<StoredDemand>, StoreError> {
        self.call(|respond_to| Request::LoadDemand { respond_to })
            .await
    }

    /// Journals EC2's answer to one of the pool's address changes on `eni_id` (see `store::changes`),
    /// pruning rows older than `keep`.
    pub async fn record_ec2_change(
        &self,
        eni_id: String,
        addresses: Vec<Ec2Address>,
        change: Ec2Change,
        at_ms: u64,
        keep: std::time::Duration,
    ) -> Result<(), StoreError> {
        self.call(|respond_to| Request::RecordEc2Change {
            eni_id,
            addresses,
            change,
            at_ms,
            keep_ms: keep.as_millis() as u64,
            respond_to,
        })
        .await
    }

    /// The journal of the pool's recent address changes, oldest first.
    pub async fn load_ec2_changes(&self) -> Result<Vec<StoredEc2Change>, StoreError> {
        self.call(|respond_to| Request::LoadEc2Changes { respond_to })
            .await
    }

    /// The IPv6 tables: the node's /80 and the pods' addresses.
    pub async fn load_ipv6(&self) -> Result<StoredIpv6, StoreError> {
        self.call(|respond_to| Request::Ipv6(ipv6::Request6::Load { respond_to }))
            .await
    }

    /// One transaction: the attachment holds the IPv6 address (and its egress IPv4, if any), its
    /// reservation (if any) is used up, and the /80's cursor and the egress cursor move to
    /// `next_offset` and `egress_next` if those are further. Conflict, and nothing changes, if the
    /// attachment holds another address or the address (or egress address) is another attachment's.
    pub async fn record_assigned_ipv6(
        &self,
        a: StoredAssignment6,
        (next_offset, egress_next): (u64, u64),
    ) -> Result<(), StoreError> {
        self.call(|respond_to| {
            Request::Ipv6(ipv6::Request6::Assign {
                a,
                next_offset,
                egress_next,
                respond_to,
            })
        })
        .await
    }

    /// One transaction: the attachment's IPv6 address is released, kept reserved when
    /// `reservation` says so. Returns the address, or `None` if the attachment held none.
    pub async fn record_released_ipv6(
        &self,
        container_id: &str,
        ifname: &str,
        reservation: Option<StoredReservation6>,
    ) -> Result<Option<std::net::Ipv6Addr>, StoreError> {
        self.call(|respond_to| {
            Request::Ipv6(ipv6::Request6::Release {
                container_id: container_id.to_owned(),
                ifname: ifname.to_owned(),
                reservation,
                respond_to,
            })
        })
        .await
    }

    /// Replaces the IPv6 tables (the startup rebuild) in one transaction.
    pub async fn replace_ipv6(&self, state: StoredIpv6) -> Result<(), StoreError> {
        self.call(|respond_to| Request::Ipv6(ipv6::Request6::ReplaceAll { state, respond_to }))
            .await
    }

    /// Checkpoints the WAL into the database file, closes it and stops the owner thread; later
    /// calls (on any clone) return [`StoreError::Closed`]. Calls enqueued before this one are
    /// answered first. Closing a closed store does nothing.
    pub async fn close(&self) {
        let (respond_to, done) = oneshot::channel();
        if self
            .tx
            .send(Command::new(Request::Close { respond_to }))
            .await
            .is_ok()
        {
            // An error means the thread is gone already, which is what we want.
            let _ = done.await;
        }
    }

    /// Sends one request to the owner thread and waits for its answer (holding a paused clock while
    /// it waits when [`hold_the_clock_on_disk_waits`] is on).
    async fn call<T: Send + 'static>(
        &self,
        request: impl FnOnce(oneshot::Sender<Result<T, StoreError>>) -> Request,
    ) -> Result<T, StoreError> {
        let (respond_to, response) = oneshot::channel();
        self.tx
            .send(Command::new(request(respond_to)))
            .await
            .map_err(|_| StoreError::Closed)?;
        if HOLD_THE_CLOCK.load(Ordering::Relaxed) {
            return tokio::task::spawn_blocking(move || response.blocking_recv())
                .await
                .map_err(|_| StoreError::Closed)?
                .map_err(|_| StoreError::Closed)?;
        }
        response.await.map_err(|_| StoreError::Closed)?
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// With the switch on, a paused clock stays put while the owner thread answers: a timer an hour
    /// ahead is not reached because a call waited on the disk.
    #[test]
    fn a_held_clock_does_not_move_while_the_store_answers() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("runtime");
        rt.block_on(async {
            let _far = tokio::spawn(tokio::time::sleep(Duration::from_secs(3600)));
            hold_the_clock_on_disk_waits(true);
            let before = tokio::time::Instant::now();
            // Opening waits on the owner thread too.
            let store = Store::open_in_memory().await.expect("store");
            for _ in 0..50 {
                store.load().await.expect("load");
            }
            let after = tokio::time::Instant::now();
            hold_the_clock_on_disk_waits(false);
            assert_eq!(after, before);
        });
    }
}
