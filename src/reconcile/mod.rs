//! Rebuilding the pool's state at startup from what is durable and what is true, and keeping it true
//! while running. Parts: [`evidence`] (what the host shows), [`rebuild`] (startup), the running
//! reconcile in three: [`pass`] (gathers a snapshot), [`decide`] (a pure function of it, returning
//! [`Drift`]s) and [`apply`] (acts on them through the IPAM service), and [`api_server`] (the pods
//! bound to this node from the Kubernetes API server).
//!
//! Sources, in order of authority: EC2 (which ENIs are attached and which IPs they hold; IMDS lags it),
//! the host (does the pod's network namespace still exist), then SQLite (who holds which IP, cooldowns
//! and sticky reservations). The result is a [`PoolSeed`] the pool starts from and the [`StoredState`]
//! written back so the file equals the truth before the first request is served.
//!
//! Rules (issue 5): an IP recorded as assigned but on no ENI any more is dropped with a warning; an IP
//! on our ENIs that the file does not know starts idle and cooling (never handed out at once: its
//! history is unknown) — unless the host still shows a pod holding it (the plugin's result cache names
//! the attachment and its network namespace, and the namespace exists), in which case it is adopted as
//! assigned; an assignment whose network namespace is gone is released into cooldown; cooldown and
//! sticky reservations survive the restart. Where the file has a record of an IP, the file wins: it is
//! written before every ADD reply, the cache only after.

pub mod api_server;
mod apply;
pub mod decide;
mod evidence;
mod pass;
mod quarantine;
mod rebuild;
mod report;

pub use apply::apply;
pub use decide::{Drift, Memory, Snapshot, decide, decide_store};
pub use evidence::{HostClaim, HostEvidence, NetnsState, NetnsView, host_evidence};
pub use pass::{HostView, NodeEnis, pass};
pub use quarantine::{QUARANTINE_NO_EVIDENCE, QUARANTINE_UNSETTLED};
pub use rebuild::{Inputs, Rebuilt, ReconcileReport, merge, rebuild};
pub use report::PassReport;
