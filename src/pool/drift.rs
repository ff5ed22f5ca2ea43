//! What the running reconcile changes in the pool when EC2 or the host disagree with it (and only the
//! running reconcile, through the IPAM service): IPs EC2 no longer shows, ENIs EC2 does not show
//! attached (suspended, then forgotten) or shows attached again, ENIs attached that the pool did not
//! know (adopted), quarantined IPs that evidence or an operator clears. Each takes the pool's lock
//! once, lets the state do the bookkeeping and wakes the maintainer when the idle IPs changed.

use std::net::Ipv4Addr;

use tokio::time::Instant;

use super::types::EniHandle;
use super::{Allocation, AllocationSeed, Pool};
use crate::cloud::{Eni, Subnet};
use crate::model::{AttachmentKey, EniId};

/// One IP the pool forgot, with the attachment that held it (that pod lost its IP).
pub type Forgotten = (Ipv4Addr, Option<AttachmentKey>);

impl Pool {
    /// Forgets IPs EC2 no longer shows on `eni` (changed out of band); see the running reconcile.
    /// Returns each IP forgotten with the attachment that held it, if any.
    pub fn forget_gone_ips(&self, eni: &EniId, ips: &[Ipv4Addr]) -> Vec<Forgotten> {
        let forgotten = self.shared().lock().forget_gone(eni, ips);
        if !forgotten.is_empty() {
            tracing::warn!(%eni, ips = ?forgotten, "IPs gone from EC2 were forgotten");
            self.shared().wake.notify_one();
        }
        forgotten
    }

    /// EC2 did not show `eni` attached to this instance (or answered NotFound for it): it takes no
    /// new work and its idle IPs are held back. Returns whether it was serving until now.
    pub fn suspend_eni(&self, eni: &EniId) -> bool {
        let suspended = self.shared().lock().suspend_eni(eni, Instant::now());
        if suspended {
            tracing::warn!(%eni, "EC2 does not show this ENI attached: it serves no new IPs until confirmed");
        }
        suspended
    }

    /// EC2 shows a suspected ENI attached again: it serves again.
    pub fn resume_eni(&self, eni: &EniId) -> bool {
        let resumed = self.shared().lock().resume_eni(eni);
        if resumed {
            tracing::info!(%eni, "EC2 shows this ENI attached again: serving");
            self.shared().wake.notify_one();
        }
        resumed
    }

    /// EC2 confirms `eni` is gone from this instance: the pool forgets it and every IP on it (their
    /// tokens return; its actor ends). Returns the IPs, each with the attachment that held it.
    pub fn forget_eni(&self, eni: &EniId) -> Vec<Forgotten> {
        let (forgotten, record) = self.shared().lock().forget_eni(eni);
        if record.is_some() {
            tracing::warn!(%eni, ips = forgotten.len(), "ENI no longer attached to this instance: forgotten");
            self.shared().wake.notify_one();
        }
        drop(record);
        forgotten
    }

    /// Takes on an ENI attached to this instance that the pool did not know: ours (`managed`) serves
    /// pods, its secondary IPs idle and cooling from now; any other only takes its device index.
    pub fn adopt_eni(&self, eni: &Eni, subnet: Subnet, managed: bool) -> bool {
        let shared = self.shared().clone();
        let serves = shared
            .lock()
            .adopt_eni(eni, subnet, managed, Instant::now());
        if serves {
            let (handle, task) = EniHandle::spawn(shared.clone(), eni.id.clone(), eni.mac.clone());
            let mut st = shared.lock();
            if let Some(r) = st.enis.get_mut(&eni.id) {
                r.handle = Some(handle);
                r.task = Some(task);
            }
            tracing::warn!(eni = %eni.id, "adopted an attached ENI of ours the pool did not know");
            shared.wake.notify_one();
        }
        serves
    }

    /// IPs the startup rebuild placed without EC2's describe showing them: none goes to a new pod
    /// until a describe shows it ([`Pool::confirm_shown`]); the running reconcile forgets one at its
    /// next miss.
    pub fn hold_unconfirmed(&self, ips: &[Ipv4Addr]) {
        if !ips.is_empty() {
            tracing::info!(ips = ?ips, "held from new pods until EC2's describe shows them");
            self.shared().lock().hold_unconfirmed(ips);
        }
    }

    /// EC2's describe shows `shown` on the node's ENIs: the IPs held unconfirmed among them serve
    /// again.
    pub fn confirm_shown(&self, shown: &std::collections::BTreeSet<Ipv4Addr>) {
        let confirmed = self.shared().lock().confirm_shown(shown);
        if !confirmed.is_empty() {
            tracing::info!(ips = ?confirmed, "EC2's describe shows them: confirmed");
            self.shared().wake.notify_one();
        }
    }

    /// Releases quarantined IPs into the idle queue (cooling from now). Returns those lifted.
    pub fn lift_quarantine(&self, ips: &[Ipv4Addr]) -> Vec<Ipv4Addr> {
        let lifted = self.shared().lock().lift_quarantine(ips, Instant::now());
        if !lifted.is_empty() {
            tracing::info!(ips = ?lifted, "quarantine lifted: the IPs are idle, cooling");
            self.shared().wake.notify_one();
        }
        lifted
    }

    /// A quarantined IP the host shows held by a live pod becomes that attachment's.
    pub fn adopt_quarantined(&self, held: AllocationSeed) -> Option<Allocation> {
        self.shared().lock().adopt_quarantined(held, Instant::now())
    }
}
