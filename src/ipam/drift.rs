//! What the running reconcile changes through the service, so the pool and the state file change
//! together: quarantined IPs lifted or adopted, ENIs suspended, resumed, forgotten or adopted, IPs
//! forgotten, and state-file rows repaired from the pool. The running reconcile decides; these
//! act.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use super::Ipam;
use crate::clock::unix_ms_now;
use crate::cloud::{Eni, Subnet};
use crate::model::EniId;
use crate::pool::{Allocation, AllocationSeed, Forgotten};
use crate::store::{RowRepair, StoreError, StoredAssignment, StoredEni, StoredIdle};

impl Ipam {
    /// Quarantined IPs that evidence (or an operator) clears: idle, cooling from now, in the pool and
    /// the file. Returns those lifted.
    pub async fn lift_quarantine(&self, ips: &[Ipv4Addr]) -> Result<Vec<Ipv4Addr>, StoreError> {
        let snapshot = self.pool().snapshot();
        let on: BTreeMap<Ipv4Addr, EniId> = snapshot
            .enis
            .iter()
            .flat_map(|e| e.ips.iter().map(move |i| (i.ip, e.id.clone())))
            .collect();
        let lifted = self.pool().lift_quarantine(ips);
        let now_ms = unix_ms_now();
        let rows: Vec<StoredIdle> = lifted
            .iter()
            .filter_map(|ip| {
                Some(StoredIdle {
                    ip: *ip,
                    eni_id: on.get(ip)?.to_string(),
                    idle_since_ms: now_ms,
                    reservation: None,
                })
            })
            .collect();
        if !rows.is_empty() {
            self.store().record_idle(rows).await?;
            self.metrics().quarantine_lifted.inc_by(lifted.len() as u64);
        }
        Ok(lifted)
    }

    /// A quarantined IP the host shows held by a live pod becomes that attachment's, in the pool and
    /// the file.
    pub async fn adopt_quarantined(
        &self,
        held: AllocationSeed,
    ) -> Result<Option<Allocation>, StoreError> {
        let (key, ip) = (held.attachment.clone(), held.ip);
        let Some(alloc) = self.pool().adopt_quarantined(held) else {
            return Ok(None);
        };
        self.store()
            .record_assigned(assignment_row(&alloc, unix_ms_now()))
            .await?;
        tracing::warn!(attachment = %key, %ip, "quarantined IP adopted: a live pod holds it");
        Ok(Some(alloc))
    }

    /// An ENI EC2 confirms is no longer attached here: gone from the pool and the file. Returns its
    /// IPs, each with the attachment that held it (those pods lost their IPs).
    pub async fn forget_eni(&self, eni: &EniId) -> Result<Vec<Forgotten>, StoreError> {
        let forgotten = self.pool().forget_eni(eni);
        self.store().remove_eni(eni.as_str()).await?;
        Ok(forgotten)
    }

    /// IPs EC2 confirms are gone from `eni`: gone from the pool, the file and the file's journal
    /// (its record of EC2 assigning them within the minute would otherwise put them back at a
    /// restart: an address no ENI has, holding a capacity token; issue 44 case 8).
    pub async fn forget_ips(
        &self,
        eni: &EniId,
        ips: &[Ipv4Addr],
    ) -> Result<Vec<Forgotten>, StoreError> {
        let forgotten = self.pool().forget_gone_ips(eni, ips);
        let gone: Vec<Ipv4Addr> = forgotten.iter().map(|(ip, _)| *ip).collect();
        if !gone.is_empty() {
            self.store().remove_ips(gone).await?;
        }
        Ok(forgotten)
    }

    /// An ENI attached here that the pool did not know: taken on (see [`crate::pool::Pool::adopt_eni`])
    /// and recorded.
    pub async fn adopt_eni(
        &self,
        eni: &Eni,
        subnet: Subnet,
        managed: bool,
    ) -> Result<bool, StoreError> {
        let cidr = subnet.cidr;
        let serves = self.pool().adopt_eni(eni, subnet, managed);
        let Some(att) = eni.attachment.as_ref() else {
            return Ok(serves);
        };
        let now_ms = unix_ms_now();
        self.store()
            .upsert_eni(StoredEni {
                eni_id: eni.id.to_string(),
                mac: eni.mac.clone(),
                device_index: att.device_index,
                subnet_id: eni.subnet_id.clone(),
                subnet_cidr: cidr.to_string(),
                primary_ip: eni.primary_ip,
                created_by_us: managed,
                created_at_ms: now_ms,
            })
            .await?;
        if serves {
            let snapshot = self.pool().snapshot();
            let rows: Vec<StoredIdle> = snapshot
                .eni(&eni.id)
                .map(|e| {
                    e.ips
                        .iter()
                        .map(|i| StoredIdle {
                            ip: i.ip,
                            eni_id: eni.id.to_string(),
                            idle_since_ms: now_ms,
                            reservation: None,
                        })
                        .collect()
                })
                .unwrap_or_default();
            if !rows.is_empty() {
                self.store().record_idle(rows).await?;
            }
        }
        Ok(serves)
    }

    /// Rewrites the rows of the state file that disagreed with the pool twice in a row (the running
    /// reconcile's comparison) from the pool. Returns how many rows were repaired.
    pub async fn repair_store(&self, rows: Vec<RowRepair>) -> Result<usize, StoreError> {
        if rows.is_empty() {
            return Ok(0);
        }
        tracing::warn!(rows = ?rows, "the state file disagreed with the pool twice: repaired from the pool");
        let n = rows.len();
        self.store().repair(rows).await?;
        self.metrics().store_repairs.inc_by(n as u64);
        Ok(n)
    }

    /// EC2 did not show `eni` attached here: no new IPs from it (see
    /// [`crate::pool::Pool::suspend_eni`]). Nothing to record: the file keeps the ENI and its rows.
    pub fn suspend_eni(&self, eni: &EniId) -> bool {
        self.pool().suspend_eni(eni)
    }

    /// EC2 shows a suspected ENI attached again: it serves again. Nothing to record.
    pub fn resume_eni(&self, eni: &EniId) -> bool {
        self.pool().resume_eni(eni)
    }
}

/// The state file's row of an allocation made at `assigned_at_ms`.
pub(crate) fn assignment_row(a: &Allocation, assigned_at_ms: u64) -> StoredAssignment {
    StoredAssignment {
        ip: a.ip,
        eni_id: a.eni.to_string(),
        network: a.meta.network.clone(),
        container_id: a.attachment.container_id.clone(),
        ifname: a.attachment.ifname.clone(),
        netns: a.meta.netns.clone(),
        pod_namespace: a.pod.namespace.clone(),
        pod_name: a.pod.name.clone(),
        pod_uid: a.pod.uid.clone(),
        sticky_key: a.sticky_key.clone(),
        assigned_at_ms,
    }
}
