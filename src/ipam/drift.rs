//! What the running reconcile changes through the service, so the pool and the state file change
//! together: quarantined IPs lifted or adopted, ENIs and IPs forgotten or adopted, and the state file
//! repaired where it fell out of step with the pool.

use std::collections::{BTreeMap, HashMap};
use std::net::Ipv4Addr;

use super::Ipam;
use crate::clock::unix_ms_now;
use crate::cloud::{Eni, Subnet};
use crate::model::{AttachmentKey, EniId, PodRef};
use crate::pool::snapshot::IpState;
use crate::pool::{Allocation, AttachmentMeta};
use crate::store::{
    RowRepair, StoreError, StoredAssignment, StoredEni, StoredIdle, StoredQuarantined,
};

/// Rows of the state file that disagreed with the pool at the last look: the running reconcile
/// repairs a row only when it disagrees twice in a row (a write in flight is not drift).
#[derive(Debug, Default)]
pub struct StoreRepairs {
    suspects: HashMap<Ipv4Addr, RowRepair>,
}

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
        ip: Ipv4Addr,
        key: AttachmentKey,
        pod: PodRef,
        sticky_key: Option<String>,
        meta: AttachmentMeta,
    ) -> Result<Option<Allocation>, StoreError> {
        let Some(alloc) = self
            .pool()
            .adopt_quarantined(ip, key.clone(), pod, sticky_key, meta)
        else {
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
    pub async fn forget_eni(
        &self,
        eni: &EniId,
    ) -> Result<Vec<(Ipv4Addr, Option<AttachmentKey>)>, StoreError> {
        let forgotten = self.pool().forget_eni(eni);
        self.store().remove_eni(eni.as_str()).await?;
        Ok(forgotten)
    }

    /// IPs EC2 confirms are gone from `eni`: gone from the pool and the file.
    pub async fn forget_ips(
        &self,
        eni: &EniId,
        ips: &[Ipv4Addr],
    ) -> Result<Vec<(Ipv4Addr, Option<AttachmentKey>)>, StoreError> {
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

    /// Compares the state file with the pool and repairs the rows that disagreed at the previous look
    /// too. Returns how many rows were repaired.
    pub async fn repair_store(&self, memory: &mut StoreRepairs) -> Result<usize, StoreError> {
        let stored = self.store().load().await?;
        let now_ms = unix_ms_now();
        let snapshot = self.pool().snapshot();
        // What the pool says each IP's row should be (IPs being given back are in motion: skipped).
        let mut wanted: BTreeMap<Ipv4Addr, RowRepair> = BTreeMap::new();
        let mut moving: Vec<Ipv4Addr> = Vec::new();
        for e in &snapshot.enis {
            for i in &e.ips {
                let eni_id = e.id.to_string();
                let idle_row = |idle_for: std::time::Duration,
                                reservation: Option<(String, u64)>| {
                    RowRepair::Idle(StoredIdle {
                        ip: i.ip,
                        eni_id: eni_id.clone(),
                        idle_since_ms: now_ms.saturating_sub(idle_for.as_millis() as u64),
                        reservation,
                    })
                };
                let row = match &i.state {
                    IpState::Assigned {
                        attachment,
                        pod,
                        sticky_key,
                        meta,
                        held_for,
                    } => RowRepair::Assigned(StoredAssignment {
                        ip: i.ip,
                        eni_id: eni_id.clone(),
                        network: meta.network.clone(),
                        container_id: attachment.container_id.clone(),
                        ifname: attachment.ifname.clone(),
                        netns: meta.netns.clone(),
                        pod_namespace: pod.namespace.clone(),
                        pod_name: pod.name.clone(),
                        pod_uid: pod.uid.clone(),
                        sticky_key: sticky_key.clone(),
                        assigned_at_ms: now_ms.saturating_sub(held_for.as_millis() as u64),
                    }),
                    IpState::Idle { idle_for } | IpState::Cooling { idle_for, .. } => {
                        idle_row(*idle_for, None)
                    }
                    IpState::Reserved {
                        key,
                        idle_for,
                        remaining,
                    } => idle_row(
                        *idle_for,
                        Some((key.clone(), now_ms + remaining.as_millis() as u64)),
                    ),
                    IpState::HeldBack {
                        idle_for,
                        reservation,
                    } => idle_row(
                        *idle_for,
                        reservation
                            .as_ref()
                            .map(|(k, left)| (k.clone(), now_ms + left.as_millis() as u64)),
                    ),
                    IpState::Quarantined { reason, held_for } => {
                        RowRepair::Quarantined(StoredQuarantined {
                            ip: i.ip,
                            eni_id: eni_id.clone(),
                            since_ms: now_ms.saturating_sub(held_for.as_millis() as u64),
                            reason: reason.clone(),
                        })
                    }
                    IpState::Releasing => {
                        moving.push(i.ip);
                        continue;
                    }
                };
                wanted.insert(i.ip, row);
            }
        }
        // What the file says, reduced to who holds each IP.
        #[derive(PartialEq)]
        enum Held {
            By(String, String),
            Idle,
            Quarantined,
        }
        let mut have: BTreeMap<Ipv4Addr, Held> = BTreeMap::new();
        for a in &stored.assignments {
            have.insert(a.ip, Held::By(a.container_id.clone(), a.ifname.clone()));
        }
        for i in &stored.idle {
            have.insert(i.ip, Held::Idle);
        }
        for q in &stored.quarantined {
            have.insert(q.ip, Held::Quarantined);
        }
        // Only holders matter: an assignment or a quarantine on either side that the other does not
        // share. (The file has no rows for IPs fresh from EC2 and keeps rows of IPs given back: the
        // rebuild treats both conservatively, so those are not drift.)
        let mut differs: HashMap<Ipv4Addr, RowRepair> = HashMap::new();
        for (ip, row) in &wanted {
            let agrees = match (row, have.get(ip)) {
                (RowRepair::Assigned(a), Some(Held::By(c, i))) => {
                    *c == a.container_id && *i == a.ifname
                }
                (RowRepair::Assigned(_), _) => false,
                (RowRepair::Quarantined(_), held) => held == Some(&Held::Quarantined),
                (_, Some(Held::By(..) | Held::Quarantined)) => false,
                _ => true,
            };
            if !agrees {
                differs.insert(*ip, row.clone());
            }
        }
        for (ip, held) in &have {
            if !wanted.contains_key(ip)
                && !moving.contains(ip)
                && matches!(held, Held::By(..) | Held::Quarantined)
            {
                differs.insert(*ip, RowRepair::Absent(*ip));
            }
        }
        // Repair what disagreed the same way twice in a row; remember the rest.
        let (now, later): (Vec<_>, Vec<_>) = differs.into_iter().partition(|(ip, row)| {
            memory
                .suspects
                .get(ip)
                .is_some_and(|seen| same_disagreement(seen, row))
        });
        memory.suspects = later.into_iter().collect();
        let rows: Vec<RowRepair> = now.into_iter().map(|(_, row)| row).collect();
        if rows.is_empty() {
            return Ok(0);
        }
        tracing::warn!(rows = ?rows, "the state file disagreed with the pool twice: repaired from the pool");
        let n = rows.len();
        self.store().repair(rows).await?;
        self.metrics().store_repairs.inc_by(n as u64);
        Ok(n)
    }
}

/// Whether two looks found the same disagreement: the same holder wanted for the IP. Timestamps are
/// left out: they are derived from the pool's monotonic clock at each look and may differ by a
/// millisecond.
fn same_disagreement(a: &RowRepair, b: &RowRepair) -> bool {
    match (a, b) {
        (RowRepair::Assigned(x), RowRepair::Assigned(y)) => {
            x.container_id == y.container_id && x.ifname == y.ifname && x.eni_id == y.eni_id
        }
        (RowRepair::Quarantined(x), RowRepair::Quarantined(y)) => x.reason == y.reason,
        (RowRepair::Idle(_), RowRepair::Idle(_)) | (RowRepair::Absent(_), RowRepair::Absent(_)) => {
            true
        }
        _ => false,
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
