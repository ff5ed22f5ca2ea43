//! One SQLite transaction per [`super::Store`] call.
//!
//! Every write opens an IMMEDIATE transaction, checks what it must, writes, and commits before
//! the owner thread answers; any error returns before the commit, and dropping the uncommitted
//! transaction rolls it back, so a refused call changes nothing.

use std::collections::HashSet;
use std::net::Ipv4Addr;

use rusqlite::{Connection, OptionalExtension, Row, Transaction, TransactionBehavior, params};

use super::{
    Durability, RowRepair, StoreError, StoredAssignment, StoredEni, StoredIdle, StoredQuarantined,
    StoredState,
};

/// Every column of an assigned row, in the order [`assignment_from_row`] reads them and
/// [`bind_assignment`] binds them.
const ASSIGNMENT_COLUMNS: &str = "ip, eni_id, network, container_id, ifname, netns, \
                                  pod_namespace, pod_name, pod_uid, sticky_key, assigned_at_ms";

/// Inserts an assigned row (as `ASSIGNMENT_COLUMNS`, ?1..?11).
const INSERT_ASSIGNED: &str = "
INSERT INTO ips (state, ip, eni_id, network, container_id, ifname, netns, pod_namespace, pod_name,
                 pod_uid, sticky_key, assigned_at_ms)
VALUES ('assigned', ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)";

/// Inserts or updates an assigned row; the caller has checked it conflicts with nothing.
const UPSERT_ASSIGNED: &str = "
INSERT INTO ips (state, ip, eni_id, network, container_id, ifname, netns, pod_namespace, pod_name,
                 pod_uid, sticky_key, assigned_at_ms)
VALUES ('assigned', ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)
ON CONFLICT (ip) DO UPDATE SET
    eni_id = excluded.eni_id, state = 'assigned', network = excluded.network,
    container_id = excluded.container_id, ifname = excluded.ifname, netns = excluded.netns,
    pod_namespace = excluded.pod_namespace, pod_name = excluded.pod_name,
    pod_uid = excluded.pod_uid, sticky_key = excluded.sticky_key,
    assigned_at_ms = excluded.assigned_at_ms,
    idle_since_ms = NULL, reserved_for = NULL, reserved_until_ms = NULL, quarantine_reason = NULL";

/// Inserts or updates an idle row; the caller has checked the IP is not assigned.
const UPSERT_IDLE: &str = "
INSERT INTO ips (ip, eni_id, state, idle_since_ms, reserved_for, reserved_until_ms)
VALUES (?1, ?2, 'idle', ?3, ?4, ?5)
ON CONFLICT (ip) DO UPDATE SET
    eni_id = excluded.eni_id, state = 'idle', idle_since_ms = excluded.idle_since_ms,
    reserved_for = excluded.reserved_for, reserved_until_ms = excluded.reserved_until_ms,
    quarantine_reason = NULL";

/// Inserts or updates a quarantined row; the caller has checked the IP is not assigned.
const UPSERT_QUARANTINED: &str = "
INSERT INTO ips (ip, eni_id, state, idle_since_ms, quarantine_reason)
VALUES (?1, ?2, 'quarantined', ?3, ?4)
ON CONFLICT (ip) DO UPDATE SET
    eni_id = excluded.eni_id, state = 'quarantined', idle_since_ms = excluded.idle_since_ms,
    reserved_for = NULL, reserved_until_ms = NULL, quarantine_reason = excluded.quarantine_reason";

/// Inserts or updates an ENI.
const UPSERT_ENI: &str = "
INSERT INTO enis (eni_id, mac, device_index, subnet_id, subnet_cidr, primary_ip, created_by_us,
                  created_at_ms)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
ON CONFLICT (eni_id) DO UPDATE SET
    mac = excluded.mac, device_index = excluded.device_index, subnet_id = excluded.subnet_id,
    subnet_cidr = excluded.subnet_cidr, primary_ip = excluded.primary_ip,
    created_by_us = excluded.created_by_us, created_at_ms = excluded.created_at_ms";

/// Everything in the database, sorted.
pub(super) fn load(conn: &Connection) -> Result<StoredState, StoreError> {
    let instance_id = conn.query_row("SELECT instance_id FROM meta", [], |row| row.get(0))?;
    let mut enis = conn
        .prepare_cached(
            "SELECT eni_id, mac, device_index, subnet_id, subnet_cidr, primary_ip, created_by_us,
                    created_at_ms
             FROM enis",
        )?
        .query_map([], |row| {
            Ok(StoredEni {
                eni_id: row.get(0)?,
                mac: row.get(1)?,
                device_index: row.get(2)?,
                subnet_id: row.get(3)?,
                subnet_cidr: row.get(4)?,
                primary_ip: ip_column(row, 5)?,
                created_by_us: row.get(6)?,
                created_at_ms: row.get(7)?,
            })
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    enis.sort_by(|a, b| (a.device_index, &a.eni_id).cmp(&(b.device_index, &b.eni_id)));

    let mut assignments = conn
        .prepare_cached(&format!(
            "SELECT {ASSIGNMENT_COLUMNS} FROM ips WHERE state = 'assigned'"
        ))?
        .query_map([], assignment_from_row)?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    assignments.sort_by_key(|a| a.ip);

    let mut idle = conn
        .prepare_cached(
            "SELECT ip, eni_id, idle_since_ms, reserved_for, reserved_until_ms
             FROM ips WHERE state = 'idle'",
        )?
        .query_map([], |row| {
            let reserved_for: Option<String> = row.get(3)?;
            let reserved_until_ms: Option<u64> = row.get(4)?;
            Ok(StoredIdle {
                ip: ip_column(row, 0)?,
                eni_id: row.get(1)?,
                idle_since_ms: row.get(2)?,
                reservation: reserved_for.zip(reserved_until_ms),
            })
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    idle.sort_by_key(|i| i.ip);

    let mut quarantined = conn
        .prepare_cached(
            "SELECT ip, eni_id, idle_since_ms, quarantine_reason FROM ips WHERE state = 'quarantined'",
        )?
        .query_map([], |row| {
            Ok(StoredQuarantined {
                ip: ip_column(row, 0)?,
                eni_id: row.get(1)?,
                since_ms: row.get(2)?,
                reason: row.get(3)?,
            })
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    quarantined.sort_by_key(|q| q.ip);

    Ok(StoredState {
        instance_id,
        enis,
        assignments,
        idle,
        quarantined,
    })
}

/// The connection's journal mode and `synchronous` level.
pub(super) fn durability(conn: &Connection) -> Result<Durability, StoreError> {
    let journal_mode: String = conn.pragma_query_value(None, "journal_mode", |row| row.get(0))?;
    let level: i64 = conn.pragma_query_value(None, "synchronous", |row| row.get(0))?;
    let synchronous = match level {
        0 => "OFF".to_owned(),
        1 => "NORMAL".to_owned(),
        2 => "FULL".to_owned(),
        3 => "EXTRA".to_owned(),
        other => other.to_string(),
    };
    Ok(Durability {
        journal_mode: journal_mode.to_ascii_lowercase(),
        synchronous,
    })
}

/// Records the instance id.
pub(super) fn set_instance_id(conn: &mut Connection, instance_id: &str) -> Result<(), StoreError> {
    let tx = begin(conn)?;
    tx.execute("UPDATE meta SET instance_id = ?1", [instance_id])?;
    tx.commit()?;
    Ok(())
}

/// Inserts or replaces an ENI.
pub(super) fn upsert_eni(conn: &mut Connection, eni: &StoredEni) -> Result<(), StoreError> {
    let tx = begin(conn)?;
    insert_eni(&tx, UPSERT_ENI, eni)?;
    tx.commit()?;
    Ok(())
}

/// Deletes an ENI and every IP row on it.
pub(super) fn remove_eni(conn: &mut Connection, eni_id: &str) -> Result<(), StoreError> {
    let tx = begin(conn)?;
    let ips = tx.execute("DELETE FROM ips WHERE eni_id = ?1", [eni_id])?;
    let enis = tx.execute("DELETE FROM enis WHERE eni_id = ?1", [eni_id])?;
    // Gone from the node: the journal no longer vouches for what EC2 assigned it.
    tx.execute(
        "DELETE FROM ec2_changes WHERE eni_id = ?1 AND change = 'assigned'",
        [eni_id],
    )?;
    tx.commit()?;
    tracing::debug!(eni_id, enis, ips, "removed an ENI from the state database");
    Ok(())
}

/// Makes `a.ip` assigned to `a`'s attachment, unless either is taken by another.
pub(super) fn record_assigned(
    conn: &mut Connection,
    a: &StoredAssignment,
) -> Result<(), StoreError> {
    let tx = begin(conn)?;
    assign_in(&tx, a)?;
    tx.commit()?;
    Ok(())
}

/// [`record_assigned`]'s writes, inside the caller's transaction or savepoint.
pub(super) fn assign_in(tx: &Connection, a: &StoredAssignment) -> Result<(), StoreError> {
    if let Some(held) = ip_of_attachment(tx, &a.container_id, &a.ifname)?
        && held != a.ip
    {
        return Err(StoreError::Conflict(format!(
            "attachment {}/{} already holds {held}, so it cannot take {}",
            a.container_id, a.ifname, a.ip
        )));
    }
    if let Some(Holder::Attachment {
        container_id,
        ifname,
    }) = holder_of(tx, a.ip)?
        && (container_id != a.container_id || ifname != a.ifname)
    {
        return Err(StoreError::Conflict(format!(
            "{} is assigned to attachment {container_id}/{ifname}, so it cannot go to {}/{}",
            a.ip, a.container_id, a.ifname
        )));
    }
    bind_assignment(tx, UPSERT_ASSIGNED, a)?;
    Ok(())
}

/// Makes the attachment's IP idle; `None` (and no write) if the attachment holds none.
pub(super) fn record_released(
    conn: &mut Connection,
    container_id: &str,
    ifname: &str,
    idle_since_ms: u64,
    reservation: Option<&(String, u64)>,
) -> Result<Option<Ipv4Addr>, StoreError> {
    let tx = begin(conn)?;
    let ip = release_in(&tx, container_id, ifname, idle_since_ms, reservation)?;
    tx.commit()?;
    Ok(ip)
}

/// [`record_released`]'s writes, inside the caller's transaction or savepoint.
pub(super) fn release_in(
    tx: &Connection,
    container_id: &str,
    ifname: &str,
    idle_since_ms: u64,
    reservation: Option<&(String, u64)>,
) -> Result<Option<Ipv4Addr>, StoreError> {
    let Some(ip) = ip_of_attachment(tx, container_id, ifname)? else {
        return Ok(None);
    };
    tx.prepare_cached(
        "UPDATE ips SET state = 'idle', network = NULL, container_id = NULL, ifname = NULL, netns = NULL,
             pod_namespace = NULL, pod_name = NULL, pod_uid = NULL, sticky_key = NULL,
             assigned_at_ms = NULL, idle_since_ms = ?2, reserved_for = ?3, reserved_until_ms = ?4
         WHERE ip = ?1",
    )?
    .execute(params![
        ip.to_string(),
        idle_since_ms,
        reservation.map(|(key, _)| key),
        reservation.map(|(_, until)| until),
    ])?;
    Ok(Some(ip))
}

/// Opens the write transaction a group commit runs its requests in (each in a savepoint).
pub(super) fn begin_group(conn: &mut Connection) -> Result<Transaction<'_>, StoreError> {
    Ok(begin(conn)?)
}

/// Inserts or updates idle rows, refusing the whole batch if any IP is assigned or repeated.
pub(super) fn record_idle(conn: &mut Connection, ips: &[StoredIdle]) -> Result<(), StoreError> {
    let tx = begin(conn)?;
    let mut seen = HashSet::with_capacity(ips.len());
    for idle in ips {
        if !seen.insert(idle.ip) {
            return Err(StoreError::Conflict(format!(
                "{} appears twice in one record_idle batch",
                idle.ip
            )));
        }
        if let Some(Holder::Attachment {
            container_id,
            ifname,
        }) = holder_of(&tx, idle.ip)?
        {
            return Err(StoreError::Conflict(format!(
                "{} is assigned to attachment {container_id}/{ifname}; release it before \
                 recording it idle",
                idle.ip
            )));
        }
        insert_idle(&tx, UPSERT_IDLE, idle)?;
    }
    tx.commit()?;
    Ok(())
}

/// Deletes the rows of these IPs, idle or assigned; unknown IPs are ignored.
pub(super) fn remove_ips(conn: &mut Connection, ips: &[Ipv4Addr]) -> Result<(), StoreError> {
    let tx = begin(conn)?;
    {
        let mut delete = tx.prepare_cached("DELETE FROM ips WHERE ip = ?1")?;
        // The journal no longer vouches for EC2 having assigned them (issue 44 case 8), nor the
        // `/28` an address of which is gone: EC2 takes a prefix back whole (a restart within the
        // minute read the journal's row of it and put the lost `/28` back, with a dead pod's
        // address in it: the 30-minute soak, seed 46).
        let mut unjournal = tx
            .prepare_cached("DELETE FROM ec2_changes WHERE address = ?1 AND change = 'assigned'")?;
        for ip in ips {
            delete.execute([ip.to_string()])?;
            unjournal.execute([ip.to_string()])?;
            let block = ipnet::Ipv4Net::new(*ip, 28)
                .expect("28 is a prefix length")
                .trunc();
            unjournal.execute([block.to_string()])?;
        }
    }
    tx.commit()?;
    Ok(())
}

/// Replaces every row with `state`.
pub(super) fn replace_all(conn: &mut Connection, state: &StoredState) -> Result<(), StoreError> {
    let tx = begin(conn)?;
    tx.execute_batch("DELETE FROM ips; DELETE FROM enis;")?;
    tx.execute("UPDATE meta SET instance_id = ?1", [&state.instance_id])?;
    const INSERT_ENI: &str = "INSERT INTO enis (eni_id, mac, device_index, subnet_id, subnet_cidr,
        primary_ip, created_by_us, created_at_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)";
    for eni in &state.enis {
        insert_eni(&tx, INSERT_ENI, eni)
            .map_err(|e| conflict_or(e, format!("ENI {} appears twice", eni.eni_id)))?;
    }
    for a in &state.assignments {
        bind_assignment(&tx, INSERT_ASSIGNED, a).map_err(|e| {
            conflict_or(
                e,
                format!(
                    "{} or attachment {}/{} appears twice",
                    a.ip, a.container_id, a.ifname
                ),
            )
        })?;
    }
    const INSERT_IDLE: &str = "INSERT INTO ips (ip, eni_id, state, idle_since_ms, reserved_for,
        reserved_until_ms) VALUES (?1, ?2, 'idle', ?3, ?4, ?5)";
    for idle in &state.idle {
        insert_idle(&tx, INSERT_IDLE, idle).map_err(|e| {
            conflict_or(
                e,
                format!("{} appears twice (idle, or idle and assigned)", idle.ip),
            )
        })?;
    }
    for q in &state.quarantined {
        insert_quarantined(&tx, UPSERT_QUARANTINED, q)
            .map_err(|e| conflict_or(e, format!("quarantined {} is also held otherwise", q.ip)))?;
    }
    tx.commit()?;
    Ok(())
}

/// Makes each IP's row what `rows` say, in one transaction: an assigned row first drops any other
/// row of its attachment; idle and quarantined rows replace whatever the IP's row was.
pub(super) fn repair(conn: &mut Connection, rows: &[RowRepair]) -> Result<(), StoreError> {
    let tx = begin(conn)?;
    for row in rows {
        match row {
            RowRepair::Assigned(a) => {
                tx.prepare_cached(
                    "DELETE FROM ips WHERE container_id = ?1 AND ifname = ?2 AND ip <> ?3",
                )?
                .execute(params![a.container_id, a.ifname, a.ip.to_string()])?;
                bind_assignment(&tx, UPSERT_ASSIGNED, a)?;
            }
            RowRepair::Idle(i) => {
                clear_attachment(&tx, i.ip)?;
                insert_idle(&tx, UPSERT_IDLE, i)?;
            }
            RowRepair::Quarantined(q) => {
                clear_attachment(&tx, q.ip)?;
                insert_quarantined(&tx, UPSERT_QUARANTINED, q)?;
            }
            RowRepair::Absent(ip) => {
                tx.prepare_cached("DELETE FROM ips WHERE ip = ?1")?
                    .execute([ip.to_string()])?;
            }
        }
    }
    tx.commit()?;
    Ok(())
}

/// Turns an assigned row of `ip` into a bare one the upserts can overwrite (the attachment columns
/// must be NULL for an idle or quarantined row).
fn clear_attachment(tx: &Connection, ip: Ipv4Addr) -> rusqlite::Result<()> {
    tx.prepare_cached("DELETE FROM ips WHERE ip = ?1 AND state = 'assigned'")?
        .execute([ip.to_string()])?;
    Ok(())
}

/// Binds `a` as `ASSIGNMENT_COLUMNS` (?1..?11) to `sql` and runs it: the one place the assignment
/// columns are bound.
fn bind_assignment(tx: &Connection, sql: &str, a: &StoredAssignment) -> rusqlite::Result<()> {
    tx.prepare_cached(sql)?.execute(params![
        a.ip.to_string(),
        a.eni_id,
        (!a.network.is_empty()).then_some(&a.network),
        a.container_id,
        a.ifname,
        a.netns,
        a.pod_namespace,
        a.pod_name,
        a.pod_uid,
        a.sticky_key,
        a.assigned_at_ms,
    ])?;
    Ok(())
}

/// Runs `sql` (an insert of the four quarantine columns) for `q`.
fn insert_quarantined(tx: &Connection, sql: &str, q: &StoredQuarantined) -> rusqlite::Result<()> {
    tx.prepare_cached(sql)?
        .execute(params![q.ip.to_string(), q.eni_id, q.since_ms, q.reason,])?;
    Ok(())
}

/// Starts a write transaction.
fn begin(conn: &mut Connection) -> rusqlite::Result<Transaction<'_>> {
    conn.transaction_with_behavior(TransactionBehavior::Immediate)
}

/// Runs `sql` (an insert of the eight ENI columns) for `eni`.
fn insert_eni(tx: &Connection, sql: &str, eni: &StoredEni) -> rusqlite::Result<()> {
    tx.prepare_cached(sql)?.execute(params![
        eni.eni_id,
        eni.mac,
        eni.device_index,
        eni.subnet_id,
        eni.subnet_cidr,
        eni.primary_ip.to_string(),
        eni.created_by_us,
        eni.created_at_ms,
    ])?;
    Ok(())
}

/// Runs `sql` (an insert of the five idle columns) for `idle`.
fn insert_idle(tx: &Connection, sql: &str, idle: &StoredIdle) -> rusqlite::Result<()> {
    tx.prepare_cached(sql)?.execute(params![
        idle.ip.to_string(),
        idle.eni_id,
        idle.idle_since_ms,
        idle.reservation.as_ref().map(|(key, _)| key),
        idle.reservation.as_ref().map(|(_, until)| until),
    ])?;
    Ok(())
}

/// Who holds an IP the database knows.
enum Holder {
    /// The pool holds it idle.
    Pool,
    /// A pod attachment holds it.
    Attachment {
        container_id: String,
        ifname: String,
    },
}

/// Who holds `ip`, or `None` if the database does not know it.
fn holder_of(tx: &Connection, ip: Ipv4Addr) -> Result<Option<Holder>, StoreError> {
    let holder = tx
        .prepare_cached("SELECT container_id, ifname FROM ips WHERE ip = ?1")?
        .query_row([ip.to_string()], |row| {
            let container_id: Option<String> = row.get(0)?;
            let ifname: Option<String> = row.get(1)?;
            Ok(match container_id.zip(ifname) {
                Some((container_id, ifname)) => Holder::Attachment {
                    container_id,
                    ifname,
                },
                None => Holder::Pool,
            })
        })
        .optional()?;
    Ok(holder)
}

/// The IP an attachment holds, if any.
fn ip_of_attachment(
    tx: &Connection,
    container_id: &str,
    ifname: &str,
) -> Result<Option<Ipv4Addr>, StoreError> {
    let ip = tx
        .prepare_cached("SELECT ip FROM ips WHERE container_id = ?1 AND ifname = ?2")?
        .query_row([container_id, ifname], |row| ip_column(row, 0))
        .optional()?;
    Ok(ip)
}

/// Reads an assigned row selected with [`ASSIGNMENT_COLUMNS`].
fn assignment_from_row(row: &Row<'_>) -> rusqlite::Result<StoredAssignment> {
    let network: Option<String> = row.get(2)?;
    Ok(StoredAssignment {
        ip: ip_column(row, 0)?,
        eni_id: row.get(1)?,
        network: network.unwrap_or_default(),
        container_id: row.get(3)?,
        ifname: row.get(4)?,
        netns: row.get(5)?,
        pod_namespace: row.get(6)?,
        pod_name: row.get(7)?,
        pod_uid: row.get(8)?,
        sticky_key: row.get(9)?,
        assigned_at_ms: row.get(10)?,
    })
}

/// Reads a dotted-quad column as an IP.
fn ip_column(row: &Row<'_>, idx: usize) -> rusqlite::Result<Ipv4Addr> {
    text_column(row, idx)
}

/// Reads a text column as whatever parses from it (an address, a prefix), failing as a conversion
/// error that names the column.
pub(super) fn text_column<T: std::str::FromStr>(row: &Row<'_>, idx: usize) -> rusqlite::Result<T>
where
    T::Err: std::error::Error + Send + Sync + 'static,
{
    let text: String = row.get(idx)?;
    text.parse().map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(idx, rusqlite::types::Type::Text, Box::new(e))
    })
}

/// A constraint violation becomes a [`StoreError::Conflict`] saying `what`; other errors stay.
pub(super) fn conflict_or(e: rusqlite::Error, what: String) -> StoreError {
    match StoreError::from(e) {
        StoreError::Conflict(detail) => StoreError::Conflict(format!("{what} ({detail})")),
        other => other,
    }
}
