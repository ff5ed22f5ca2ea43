//! The IPv6 tables (schema version 4, egress in 5): the node's /80 with its cursors, and the pods'
//! addresses with their IPv4 egress addresses.
//! One transaction per call, like `queries`; the tables refuse an address held twice or an
//! attachment holding two.

use std::net::Ipv6Addr;

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

pub use eniipam_ipv6::stored::{StoredAssignment6, StoredIpv6, StoredPrefix6, StoredReservation6};

use super::Reply;
use super::StoreError;
use super::queries::{conflict_or, text_column};

/// The IPv6 requests of the owner thread.
pub(super) enum Request6 {
    Load {
        respond_to: Reply<StoredIpv6>,
    },
    Assign {
        a: StoredAssignment6,
        next_offset: u64,
        egress_next: u64,
        respond_to: Reply<()>,
    },
    Release {
        container_id: String,
        ifname: String,
        reservation: Option<StoredReservation6>,
        respond_to: Reply<Option<Ipv6Addr>>,
    },
    ReplaceAll {
        state: StoredIpv6,
        respond_to: Reply<()>,
    },
}

impl Request6 {
    pub(super) fn name(&self) -> &'static str {
        match self {
            Request6::Load { .. } => "ipv6_load",
            Request6::Assign { .. } => "ipv6_assign",
            Request6::Release { .. } => "ipv6_release",
            Request6::ReplaceAll { .. } => "ipv6_replace_all",
        }
    }

    /// Runs the request in its own transaction and answers; false when the caller went away.
    pub(super) fn serve(self, conn: &mut Connection) -> bool {
        match self {
            Request6::Load { respond_to } => respond_to.send(load(conn)).is_ok(),
            Request6::Assign {
                a,
                next_offset,
                egress_next,
                respond_to,
            } => respond_to
                .send(assign(conn, &a, (next_offset, egress_next)))
                .is_ok(),
            Request6::Release {
                container_id,
                ifname,
                reservation,
                respond_to,
            } => respond_to
                .send(release(conn, &container_id, &ifname, reservation.as_ref()))
                .is_ok(),
            Request6::ReplaceAll { state, respond_to } => {
                respond_to.send(replace_all(conn, &state)).is_ok()
            }
        }
    }
}

const ASSIGNED_COLUMNS: &str = "ip, network, container_id, ifname, netns, pod_namespace, pod_name, \
                                pod_uid, sticky_key, assigned_at_ms, egress_ipv4";

fn load(conn: &Connection) -> Result<StoredIpv6, StoreError> {
    let prefix = conn
        .query_row(
            "SELECT prefix, eni_id, next_offset, taken_at_ms, egress_next FROM ipv6_prefix",
            [],
            |row| {
                Ok(StoredPrefix6 {
                    prefix: text_column(row, 0)?,
                    eni_id: row.get(1)?,
                    next_offset: row.get(2)?,
                    taken_at_ms: row.get(3)?,
                    egress_next: row.get(4)?,
                })
            },
        )
        .optional()?;
    let mut assignments = conn
        .prepare_cached(&format!(
            "SELECT {ASSIGNED_COLUMNS} FROM ipv6_ips WHERE state = 'assigned'"
        ))?
        .query_map([], |row| {
            Ok(StoredAssignment6 {
                ip: text_column(row, 0)?,
                network: row.get(1)?,
                container_id: row.get(2)?,
                ifname: row.get(3)?,
                netns: row.get(4)?,
                pod_namespace: row.get(5)?,
                pod_name: row.get(6)?,
                pod_uid: row.get(7)?,
                sticky_key: row.get(8)?,
                assigned_at_ms: row.get(9)?,
                egress_ipv4: match row.get_ref(10)? {
                    rusqlite::types::ValueRef::Null => None,
                    _ => Some(text_column(row, 10)?),
                },
            })
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    assignments.sort_by_key(|a| a.ip);
    let mut reservations = conn
        .prepare_cached(
            "SELECT ip, reserved_for, reserved_until_ms, released_at_ms FROM ipv6_ips
             WHERE state = 'reserved'",
        )?
        .query_map([], |row| {
            Ok(StoredReservation6 {
                ip: text_column(row, 0)?,
                sticky_key: row.get(1)?,
                until_ms: row.get(2)?,
                released_at_ms: row.get(3)?,
            })
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    reservations.sort_by_key(|r| r.ip);
    Ok(StoredIpv6 {
        prefix,
        assignments,
        reservations,
    })
}

fn insert_assigned(tx: &Connection, a: &StoredAssignment6) -> Result<(), StoreError> {
    tx.prepare_cached(&format!(
        "INSERT INTO ipv6_ips (state, {ASSIGNED_COLUMNS})
         VALUES ('assigned', ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)"
    ))?
    .execute(params![
        a.ip.to_string(),
        a.network,
        a.container_id,
        a.ifname,
        a.netns,
        a.pod_namespace,
        a.pod_name,
        a.pod_uid,
        a.sticky_key,
        a.assigned_at_ms,
        a.egress_ipv4.map(|ip| ip.to_string()),
    ])
    .map_err(|e| {
        let egress = a
            .egress_ipv4
            .map(|ip| format!(" (egress {ip})"))
            .unwrap_or_default();
        conflict_or(
            e,
            format!("{}{egress} for {}/{}", a.ip, a.container_id, a.ifname),
        )
    })?;
    Ok(())
}

fn insert_reserved(tx: &Connection, r: &StoredReservation6) -> Result<(), StoreError> {
    tx.prepare_cached(
        "INSERT INTO ipv6_ips (state, ip, reserved_for, reserved_until_ms, released_at_ms)
         VALUES ('reserved', ?1, ?2, ?3, ?4)",
    )?
    .execute(params![
        r.ip.to_string(),
        r.sticky_key,
        r.until_ms,
        r.released_at_ms
    ])
    .map_err(|e| conflict_or(e, format!("{} reserved for {}", r.ip, r.sticky_key)))?;
    Ok(())
}

/// The attachment holds `a.ip` and `a.egress_ipv4` (a repeated record of the same pair is a no-op);
/// the reservation of the address, if any, is used up; the cursors move to `next_offset` and
/// `egress_next` if those are further. Conflict, and nothing changes, when the attachment holds
/// another address or the address or egress address is another's.
fn assign(
    conn: &mut Connection,
    a: &StoredAssignment6,
    (next_offset, egress_next): (u64, u64),
) -> Result<(), StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let held: Option<String> = tx
        .query_row(
            "SELECT ip FROM ipv6_ips WHERE container_id = ?1 AND ifname = ?2",
            params![a.container_id, a.ifname],
            |r| r.get(0),
        )
        .optional()?;
    match held {
        Some(ip) if ip == a.ip.to_string() => return Ok(()),
        Some(ip) => {
            return Err(StoreError::Conflict(format!(
                "attachment {}/{} already holds {ip}, so it cannot take {}",
                a.container_id, a.ifname, a.ip
            )));
        }
        None => {}
    }
    tx.execute(
        "DELETE FROM ipv6_ips WHERE ip = ?1 AND state = 'reserved'",
        [a.ip.to_string()],
    )?;
    insert_assigned(&tx, a)?;
    let moved = tx.execute(
        "UPDATE ipv6_prefix SET next_offset = MAX(next_offset, ?1),
                                egress_next = MAX(egress_next, ?2)",
        [next_offset, egress_next],
    )?;
    if moved != 1 {
        return Err(StoreError::Conflict(format!(
            "no IPv6 prefix is recorded, so {} cannot be assigned",
            a.ip
        )));
    }
    tx.commit()?;
    Ok(())
}

/// The attachment's address goes; with a reservation it stays, reserved. `None` when the attachment
/// held none.
fn release(
    conn: &mut Connection,
    container_id: &str,
    ifname: &str,
    reservation: Option<&StoredReservation6>,
) -> Result<Option<Ipv6Addr>, StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let held: Option<String> = tx
        .query_row(
            "DELETE FROM ipv6_ips WHERE container_id = ?1 AND ifname = ?2 RETURNING ip",
            params![container_id, ifname],
            |r| r.get(0),
        )
        .optional()?;
    let Some(held) = held else {
        return Ok(None);
    };
    let ip: Ipv6Addr = held
        .parse()
        .map_err(|e| StoreError::Sqlite(format!("ipv6_ips.ip {held:?}: {e}")))?;
    if let Some(r) = reservation {
        if r.ip != ip {
            return Err(StoreError::Conflict(format!(
                "{container_id}/{ifname} held {ip}, not the reserved {}",
                r.ip
            )));
        }
        // A key reserves one address: an older reservation of the same key goes.
        tx.execute(
            "DELETE FROM ipv6_ips WHERE reserved_for = ?1",
            [&r.sticky_key],
        )?;
        insert_reserved(&tx, r)?;
    }
    tx.commit()?;
    Ok(Some(ip))
}

fn replace_all(conn: &mut Connection, state: &StoredIpv6) -> Result<(), StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute_batch("DELETE FROM ipv6_ips; DELETE FROM ipv6_prefix;")?;
    if let Some(p) = &state.prefix {
        tx.execute(
            "INSERT INTO ipv6_prefix (id, prefix, eni_id, next_offset, taken_at_ms, egress_next)
             VALUES (1, ?1, ?2, ?3, ?4, ?5)",
            params![
                p.prefix.to_string(),
                p.eni_id,
                p.next_offset,
                p.taken_at_ms,
                p.egress_next
            ],
        )?;
    } else if !state.assignments.is_empty() || !state.reservations.is_empty() {
        return Err(StoreError::Conflict(
            "IPv6 addresses without a recorded prefix".to_owned(),
        ));
    }
    for a in &state.assignments {
        insert_assigned(&tx, a)?;
    }
    for r in &state.reservations {
        insert_reserved(&tx, r)?;
    }
    tx.commit()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    fn conn() -> Connection {
        let mut c = Connection::open_in_memory().unwrap();
        super::super::schema::migrate(&mut c).unwrap();
        c
    }

    fn a(ip: &str, container: &str) -> StoredAssignment6 {
        StoredAssignment6 {
            ip: ip.parse().unwrap(),
            network: "net".into(),
            container_id: container.into(),
            ifname: "eth0".into(),
            netns: "/run/netns/x".into(),
            pod_namespace: "ns".into(),
            pod_name: "p".into(),
            pod_uid: "u".into(),
            sticky_key: Some("ns/p".into()),
            assigned_at_ms: 5,
            egress_ipv4: None,
        }
    }

    fn with_prefix(c: &mut Connection) {
        replace_all(
            c,
            &StoredIpv6 {
                prefix: Some(StoredPrefix6 {
                    prefix: "2600:1f18:6d00:100:a::/80".parse().unwrap(),
                    eni_id: "eni-0".into(),
                    next_offset: 1,
                    egress_next: 0,
                    taken_at_ms: 1,
                }),
                ..Default::default()
            },
        )
        .unwrap();
    }

    #[test]
    fn an_assignment_moves_the_cursor_in_its_own_transaction_and_never_back() {
        let mut c = conn();
        with_prefix(&mut c);
        assign(&mut c, &a("2600:1f18:6d00:100:a::5", "c1"), (6, 0)).unwrap();
        assign(&mut c, &a("2600:1f18:6d00:100:a::2", "c2"), (3, 0)).unwrap();
        let s = load(&c).unwrap();
        assert_eq!(s.prefix.unwrap().next_offset, 6);
        assert_eq!(s.assignments.len(), 2);
        // Repeating the same pair is a no-op; another address for c1 or c1's address for c3 is not.
        assign(&mut c, &a("2600:1f18:6d00:100:a::5", "c1"), (7, 0)).unwrap();
        let e = assign(&mut c, &a("2600:1f18:6d00:100:a::9", "c1"), (10, 0)).unwrap_err();
        assert!(
            matches!(e, StoreError::Conflict(ref m) if m.contains("already holds")),
            "{e}"
        );
        let e = assign(&mut c, &a("2600:1f18:6d00:100:a::5", "c3"), (10, 0)).unwrap_err();
        assert!(matches!(e, StoreError::Conflict(_)), "{e}");
        assert_eq!(
            load(&c).unwrap().prefix.unwrap().next_offset,
            6,
            "refused calls change nothing"
        );
    }

    #[test]
    fn no_address_is_recorded_without_a_prefix() {
        let mut c = conn();
        let e = assign(&mut c, &a("2600::5", "c1"), (6, 0)).unwrap_err();
        assert!(
            matches!(e, StoreError::Conflict(ref m) if m.contains("no IPv6 prefix")),
            "{e}"
        );
        assert!(load(&c).unwrap().assignments.is_empty());
    }

    #[test]
    fn a_sticky_release_keeps_the_address_reserved_and_the_next_assign_uses_it_up() {
        let mut c = conn();
        with_prefix(&mut c);
        let ip: Ipv6Addr = "2600:1f18:6d00:100:a::5".parse().unwrap();
        assign(&mut c, &a("2600:1f18:6d00:100:a::5", "c1"), (6, 0)).unwrap();
        let r = StoredReservation6 {
            ip,
            sticky_key: "ns/p".into(),
            until_ms: 100,
            released_at_ms: 50,
        };
        assert_eq!(release(&mut c, "c1", "eth0", Some(&r)).unwrap(), Some(ip));
        assert_eq!(
            release(&mut c, "c1", "eth0", None).unwrap(),
            None,
            "unknown: no-op"
        );
        let s = load(&c).unwrap();
        assert_eq!((s.assignments.len(), s.reservations), (0, vec![r]));
        assign(&mut c, &a("2600:1f18:6d00:100:a::5", "c9"), (6, 0)).unwrap();
        let s = load(&c).unwrap();
        assert_eq!((s.assignments.len(), s.reservations.len()), (1, 0));
        // A plain release forgets the address.
        release(&mut c, "c9", "eth0", None).unwrap();
        let s = load(&c).unwrap();
        assert!(s.assignments.is_empty() && s.reservations.is_empty());
    }

    #[test]
    fn the_egress_address_is_recorded_with_the_ipv6_and_goes_with_its_release() {
        let mut c = conn();
        with_prefix(&mut c);
        let egress: Ipv4Addr = "169.254.172.9".parse().unwrap();
        let with_egress = |ip: &str, container: &str| StoredAssignment6 {
            egress_ipv4: Some(egress),
            ..a(ip, container)
        };
        assign(
            &mut c,
            &with_egress("2600:1f18:6d00:100:a::5", "c1"),
            (6, 9),
        )
        .unwrap();
        let s = load(&c).unwrap();
        assert_eq!(s.assignments[0].egress_ipv4, Some(egress));
        assert_eq!(s.prefix.as_ref().unwrap().egress_next, 9);
        // Another pod with the same egress address: refused whole, nothing moves.
        let e = assign(
            &mut c,
            &with_egress("2600:1f18:6d00:100:a::6", "c2"),
            (7, 10),
        )
        .unwrap_err();
        assert!(
            matches!(e, StoreError::Conflict(ref m) if m.contains("169.254.172.9")),
            "{e}"
        );
        let s = load(&c).unwrap();
        assert_eq!(s.assignments.len(), 1);
        let p = s.prefix.unwrap();
        assert_eq!(
            (p.next_offset, p.egress_next),
            (6, 9),
            "the refused record moved nothing"
        );
        // The egress cursor never moves back either.
        assign(&mut c, &a("2600:1f18:6d00:100:a::7", "c3"), (8, 2)).unwrap();
        assert_eq!(load(&c).unwrap().prefix.unwrap().egress_next, 9);
        // Released: the egress address goes with the row, so another pod may record it.
        release(&mut c, "c1", "eth0", None).unwrap();
        assign(
            &mut c,
            &with_egress("2600:1f18:6d00:100:a::8", "c4"),
            (9, 10),
        )
        .unwrap();
        let s = load(&c).unwrap();
        let held: Vec<_> = s
            .assignments
            .iter()
            .map(|x| (x.container_id.as_str(), x.egress_ipv4))
            .collect();
        assert_eq!(held, [("c3", None), ("c4", Some(egress))]);
    }
}
