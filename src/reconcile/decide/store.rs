//! Step 4 of the running reconcile, decided: the state file against the pool. Only holders matter,
//! and a row is repaired only when it disagreed the same way at the previous look too (a write in
//! flight is not drift). Pure: [`super::super::pass`] loads the file and takes the pool's snapshot
//! after the other drifts were applied, so the comparison sees them.

use std::collections::{BTreeMap, HashMap};
use std::net::Ipv4Addr;

use super::{Drift, Memory};
use crate::pool::snapshot::{IpState, PoolSnapshot};
use crate::store::{RowRepair, StoredAssignment, StoredIdle, StoredQuarantined, StoredState};

/// The rows of `stored` to rewrite from `pool` (a [`Drift::RepairStore`]), if any: those that
/// disagreed the same way at the previous look too. `now_ms` (unix ms) dates the rows. Remembers
/// the rest in `memory` for the next look.
pub fn decide_store(
    pool: &PoolSnapshot,
    stored: &StoredState,
    now_ms: u64,
    memory: &mut Memory,
) -> Option<Drift> {
    // What the pool says each IP's row should be (IPs being given back are in motion: skipped).
    let mut wanted: BTreeMap<Ipv4Addr, RowRepair> = BTreeMap::new();
    let mut moving: Vec<Ipv4Addr> = Vec::new();
    for e in &pool.enis {
        for i in &e.ips {
            let eni_id = e.id.to_string();
            let idle_row = |idle_for: std::time::Duration, reservation: Option<(String, u64)>| {
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
            .store_suspects
            .get(ip)
            .is_some_and(|seen| same_disagreement(seen, row))
    });
    memory.store_suspects = later.into_iter().collect();
    let rows: Vec<RowRepair> = now.into_iter().map(|(_, row)| row).collect();
    (!rows.is_empty()).then_some(Drift::RepairStore { rows })
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
