//! What the pool's tasks share ([`Shared`]: the configuration, the cloud seam, the state behind its
//! mutex) and the seams the pool is given from outside when it is built: the [`EniProvisioner`]
//! that creates and deletes ENIs, and its [`PoolSeams`]: the [`EniReadiness`] gate that says when
//! the host routes through a new ENI and the [`ChangeJournal`] of its address changes. Both are
//! given at construction (never set later), so no ENI the pool creates or address it assigns
//! escapes them.
//!
//! Below the pool handle, the ENI actors and the maintainer, which all hold an `Arc<Shared>`.

use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use ipnet::Ipv4Net;
use tokio::sync::Notify;

use super::config::PoolConfig;
use super::state::PoolState;
use crate::cloud::lifecycle::{EniLifecycle, NewEni};
use crate::cloud::{Cloud, CloudResult, Eni, Metadata};
use crate::model::EniId;

/// Creates/attaches and detaches/deletes the node's ENIs. [`EniLifecycle`] is the real one; the
/// trait lets the pool be tested against a scripted one.
#[async_trait]
pub trait EniProvisioner: Send + Sync + 'static {
    /// Creates the ENI `new` describes (its IPs or prefixes in the create call), attaches it, and
    /// returns it once usable.
    async fn create_and_attach(&self, new: &NewEni) -> CloudResult<Eni>;
    /// Detaches and deletes an ENI eniipam created.
    async fn detach_and_delete(&self, eni: &Eni) -> CloudResult<()>;
}

#[async_trait]
impl EniProvisioner for EniLifecycle {
    async fn create_and_attach(&self, new: &NewEni) -> CloudResult<Eni> {
        EniLifecycle::create(self, new).await
    }

    async fn detach_and_delete(&self, eni: &Eni) -> CloudResult<()> {
        EniLifecycle::detach_and_delete(self, eni).await
    }
}

/// A new ENI as the host needs it to route through it: see [`EniReadiness`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewEniFacts {
    pub id: EniId,
    pub mac: String,
    pub device_index: u32,
    /// Its subnet's CIDR (known: a create describes the subnet first when it is not).
    pub subnet_cidr: Option<Ipv4Net>,
    pub primary_ip: Ipv4Addr,
}

/// The readiness gate of new ENIs (issue 23): what must be in place on the host before any IP of a
/// new ENI is handed to a pod. The daemon installs one when it manages the ENIs' route tables
/// (`manage_eni_routes`): it returns once the host keeper has installed the ENI's table (link up,
/// address, MTU, routes), or fails after its bound. Without one (simulate, unit tests, routes kept
/// by someone else) nothing waits.
#[async_trait]
pub trait EniReadiness: Send + Sync + 'static {
    /// Returns when the host routes through `eni`; `Err(why)` when it does not within the gate's
    /// bound.
    async fn ready(&self, eni: &NewEniFacts) -> Result<(), String>;
}

/// Where the pool writes what EC2 answered to its own address changes (EC2's describes are
/// eventually consistent, and may not show them for a while). The daemon's is the state file's journal
/// (`store::changes`), which the startup rebuild reads so that a restart right after a change
/// does not take a describe that does not show it yet for the truth. Without one (simulate's
/// in-memory pools, unit tests) nothing is written.
#[async_trait]
pub trait ChangeJournal: Send + Sync + 'static {
    /// EC2 assigned these to `eni` (an assign's or a create's answer). Waited for before the
    /// addresses are handed out (one write per EC2 call).
    async fn assigned(&self, eni: &EniId, ips: &[Ipv4Addr], prefixes: &[Ipv4Net]);
    /// These go back to EC2: written before the unassign is sent. A give-back EC2 refuses is
    /// written [`ChangeJournal::assigned`] again: they stay on `eni`. False when the write failed
    /// (a full disk): the give-back is not sent, or a restart within EC2's describe lag would read
    /// them as still the node's.
    async fn unassigning(&self, eni: &EniId, ips: &[Ipv4Addr], prefixes: &[Ipv4Net]) -> bool;
}

/// The pool's extension points other than its provisioner, given when it is built
/// ([`crate::pool::Pool::start_with_seams`]; the daemon wires them). `None`: nothing waits, nothing
/// is journalled (simulate's in-memory pools, unit tests).
#[derive(Clone, Default)]
pub struct PoolSeams {
    /// The readiness gate of new ENIs (the daemon's when it keeps their route tables).
    pub readiness: Option<Arc<dyn EniReadiness>>,
    /// The journal of the pool's address changes (the daemon's: the state file's).
    pub journal: Option<Arc<dyn ChangeJournal>>,
}

/// What the pool's tasks share.
pub(crate) struct Shared {
    pub config: PoolConfig,
    pub cloud: Arc<dyn Cloud>,
    pub metadata: Arc<dyn Metadata>,
    pub provisioner: Arc<dyn EniProvisioner>,
    state: Mutex<PoolState>,
    /// The readiness gate of new ENIs and the journal of address changes, given at construction.
    seams: PoolSeams,
    /// Wakes the maintainer (idle shrank or grew, pods wait for an ENI, a call finished).
    pub wake: Notify,
}

impl Shared {
    pub(crate) fn new(
        config: PoolConfig,
        cloud: Arc<dyn Cloud>,
        metadata: Arc<dyn Metadata>,
        provisioner: Arc<dyn EniProvisioner>,
        seams: PoolSeams,
        state: PoolState,
    ) -> Self {
        Self {
            config,
            cloud,
            metadata,
            provisioner,
            state: Mutex::new(state),
            seams,
            wake: Notify::new(),
        }
    }

    /// The pool's state. Held only for short, non-awaiting sections.
    pub(crate) fn lock(&self) -> MutexGuard<'_, PoolState> {
        // A panic under the lock is a bug already reported; the bookkeeping stays usable.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The readiness gate of new ENIs, if any.
    pub(crate) fn readiness(&self) -> Option<Arc<dyn EniReadiness>> {
        self.seams.readiness.clone()
    }

    /// The journal of the pool's address changes, if any.
    pub(crate) fn journal(&self) -> Option<Arc<dyn ChangeJournal>> {
        self.seams.journal.clone()
    }

    /// Journals that EC2 assigned `ips` and `prefixes` to `eni` (the addresses of `prefixes` among
    /// `ips` are journalled as their prefix), before any of them is handed out: a restart then
    /// finds each address a pod holds that a lagging describe does not show in the journal, and
    /// the rebuild need not trust the plugin's cache for it (which also names addresses lost out of
    /// band since: issue 44 case 8). One store write per EC2 call, not per pod.
    pub(crate) async fn journal_assigned(
        &self,
        eni: &EniId,
        ips: &[Ipv4Addr],
        prefixes: &[Ipv4Net],
    ) {
        if let Some(j) = self.journal() {
            j.assigned(eni, &super::slots::singles(ips, prefixes), prefixes)
                .await;
        }
    }
}
