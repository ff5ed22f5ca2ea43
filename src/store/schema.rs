//! The tables, their migrations, and the schema version kept in `meta`.
//!
//! `MIGRATIONS[i]` takes a database from version `i` to `i + 1`; version 0 is an empty file. All
//! pending migrations run in ONE transaction together with the version bump, so a crash mid-way
//! leaves the file at its old version. Append new migrations, never edit a released one, and keep
//! `meta.schema_version` where it is: it is how every build, older or newer, tells versions apart.

use rusqlite::{Connection, TransactionBehavior};

use super::StoreError;

/// The ordered migrations; index `i` migrates from version `i` to `i + 1`.
const MIGRATIONS: &[&str] = &[V1, V2, V3, V4, V5, V6];

/// The schema version this build writes and understands.
pub const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

/// Version 1: the ENIs and the IPs of the pool, one row per IP whether idle or assigned.
///
/// Integrity lives in the tables, not just in the code: an IP is one row (`ip` is the primary
/// key), an attachment holds at most one IP (`UNIQUE(container_id, ifname)`; idle rows carry NULL
/// there and SQLite treats NULLs as distinct), and the CHECKs forbid a half-assigned row. IPs are
/// dotted-quad text (always written by `Ipv4Addr`'s `Display`, so one spelling per address) for
/// the benefit of whoever opens the file with `sqlite3` during an incident.
const V1: &str = "
CREATE TABLE meta (
    id             INTEGER PRIMARY KEY CHECK (id = 1),
    schema_version INTEGER NOT NULL,
    instance_id    TEXT
) STRICT;
INSERT INTO meta (id, schema_version) VALUES (1, 0);

CREATE TABLE enis (
    eni_id        TEXT PRIMARY KEY NOT NULL,
    mac           TEXT NOT NULL,
    device_index  INTEGER NOT NULL CHECK (device_index >= 0),
    subnet_id     TEXT NOT NULL,
    subnet_cidr   TEXT NOT NULL,
    primary_ip    TEXT NOT NULL,
    created_by_us INTEGER NOT NULL CHECK (created_by_us IN (0, 1)),
    created_at_ms INTEGER NOT NULL
) STRICT;

CREATE TABLE ips (
    ip                TEXT PRIMARY KEY NOT NULL,
    eni_id            TEXT NOT NULL,
    state             TEXT NOT NULL CHECK (state IN ('assigned', 'idle')),
    container_id      TEXT,
    ifname            TEXT,
    netns             TEXT,
    pod_namespace     TEXT,
    pod_name          TEXT,
    pod_uid           TEXT,
    sticky_key        TEXT,
    assigned_at_ms    INTEGER,
    idle_since_ms     INTEGER,
    reserved_for      TEXT,
    reserved_until_ms INTEGER,
    UNIQUE (container_id, ifname),
    CHECK ((reserved_for IS NULL) = (reserved_until_ms IS NULL)),
    CHECK (CASE state
        WHEN 'assigned' THEN
            container_id IS NOT NULL AND ifname IS NOT NULL AND netns IS NOT NULL
            AND pod_namespace IS NOT NULL AND pod_name IS NOT NULL AND pod_uid IS NOT NULL
            AND assigned_at_ms IS NOT NULL
            AND idle_since_ms IS NULL AND reserved_for IS NULL
        ELSE
            container_id IS NULL AND ifname IS NULL AND netns IS NULL
            AND pod_namespace IS NULL AND pod_name IS NULL AND pod_uid IS NULL
            AND sticky_key IS NULL AND assigned_at_ms IS NULL
            AND idle_since_ms IS NOT NULL
    END)
) STRICT;
CREATE INDEX ips_by_eni ON ips (eni_id);
";

/// Version 2: each assignment records its CNI network (CNI GC is scoped to one network), and an IP
/// can be `quarantined`: held out of circulation, neither idle nor assigned, because its history is
/// unknown and the host's evidence could not tell whether a pod holds it (`quarantine_reason` says
/// why; `idle_since_ms` holds since when). SQLite cannot alter a CHECK, so the table is rebuilt with
/// its rows; the network of rows written before version 2 is NULL (unknown: never released by a
/// network-scoped GC).
const V2: &str = "
CREATE TABLE ips_v2 (
    ip                TEXT PRIMARY KEY NOT NULL,
    eni_id            TEXT NOT NULL,
    state             TEXT NOT NULL CHECK (state IN ('assigned', 'idle', 'quarantined')),
    network           TEXT,
    container_id      TEXT,
    ifname            TEXT,
    netns             TEXT,
    pod_namespace     TEXT,
    pod_name          TEXT,
    pod_uid           TEXT,
    sticky_key        TEXT,
    assigned_at_ms    INTEGER,
    idle_since_ms     INTEGER,
    reserved_for      TEXT,
    reserved_until_ms INTEGER,
    quarantine_reason TEXT,
    UNIQUE (container_id, ifname),
    CHECK ((reserved_for IS NULL) = (reserved_until_ms IS NULL)),
    CHECK (CASE state
        WHEN 'assigned' THEN
            container_id IS NOT NULL AND ifname IS NOT NULL AND netns IS NOT NULL
            AND pod_namespace IS NOT NULL AND pod_name IS NOT NULL AND pod_uid IS NOT NULL
            AND assigned_at_ms IS NOT NULL
            AND idle_since_ms IS NULL AND reserved_for IS NULL AND quarantine_reason IS NULL
        WHEN 'idle' THEN
            network IS NULL AND container_id IS NULL AND ifname IS NULL AND netns IS NULL
            AND pod_namespace IS NULL AND pod_name IS NULL AND pod_uid IS NULL
            AND sticky_key IS NULL AND assigned_at_ms IS NULL
            AND idle_since_ms IS NOT NULL AND quarantine_reason IS NULL
        ELSE
            network IS NULL AND container_id IS NULL AND ifname IS NULL AND netns IS NULL
            AND pod_namespace IS NULL AND pod_name IS NULL AND pod_uid IS NULL
            AND sticky_key IS NULL AND assigned_at_ms IS NULL
            AND idle_since_ms IS NOT NULL AND reserved_for IS NULL
            AND quarantine_reason IS NOT NULL
    END)
) STRICT;
INSERT INTO ips_v2 (ip, eni_id, state, network, container_id, ifname, netns, pod_namespace,
                    pod_name, pod_uid, sticky_key, assigned_at_ms, idle_since_ms, reserved_for,
                    reserved_until_ms, quarantine_reason)
    SELECT ip, eni_id, state, NULL, container_id, ifname, netns, pod_namespace, pod_name, pod_uid,
           sticky_key, assigned_at_ms, idle_since_ms, reserved_for, reserved_until_ms, NULL
    FROM ips;
DROP TABLE ips;
ALTER TABLE ips_v2 RENAME TO ips;
CREATE INDEX ips_by_eni ON ips (eni_id);
";

/// Version 3: the pool's learned demand (issue 25): recent pod starts and bursts, so a restarted
/// daemon warms for the node's pods as its earlier life learned to. One row of bursts
/// (`demand`, absent until first written) and the start times (`demand_starts`); times are unix
/// ms. Nothing before version 3 is touched: a file from an older build just has no learned demand
/// yet.
const V3: &str = "
CREATE TABLE demand (
    id                INTEGER PRIMARY KEY CHECK (id = 1),
    written_at_ms     INTEGER NOT NULL,
    last_start_ms     INTEGER,
    run_first_ms      INTEGER,
    run_last_ms       INTEGER,
    run_starts        INTEGER CHECK (run_starts > 0),
    run_is_burst      INTEGER NOT NULL CHECK (run_is_burst IN (0, 1)),
    burst_first_ms    INTEGER,
    burst_last_ms     INTEGER,
    burst_starts      INTEGER CHECK (burst_starts > 0),
    previous_first_ms INTEGER,
    previous_last_ms  INTEGER,
    previous_starts   INTEGER CHECK (previous_starts > 0),
    CHECK ((run_first_ms IS NULL) = (run_last_ms IS NULL)
           AND (run_first_ms IS NULL) = (run_starts IS NULL)),
    CHECK ((burst_first_ms IS NULL) = (burst_last_ms IS NULL)
           AND (burst_first_ms IS NULL) = (burst_starts IS NULL)),
    CHECK ((previous_first_ms IS NULL) = (previous_last_ms IS NULL)
           AND (previous_first_ms IS NULL) = (previous_starts IS NULL))
) STRICT;
CREATE TABLE demand_starts (
    at_ms INTEGER NOT NULL
) STRICT;
";

/// Version 4: IPv6 (issue 26). The node's delegated /80 (`ipv6_prefix`, one row, absent until the
/// daemon runs with `ip_family` ipv6 or dual) with its cursor, the offset of the next never-used
/// address, written in the same transaction as each allocation so a crash cannot move it back; and the
/// pods' addresses (`ipv6_ips`): `assigned` rows, and `reserved` rows that keep a StatefulSet pod's
/// address while it is away. Released addresses are not kept (the cursor is past them: an address is
/// never handed out twice). IPv6 addresses are text in `Ipv6Addr`'s `Display` form (RFC 5952), one
/// spelling per address. Nothing before version 4 is touched.
const V4: &str = "
CREATE TABLE ipv6_prefix (
    id            INTEGER PRIMARY KEY CHECK (id = 1),
    prefix        TEXT NOT NULL,
    eni_id        TEXT NOT NULL,
    next_offset   INTEGER NOT NULL CHECK (next_offset > 0),
    taken_at_ms   INTEGER NOT NULL
) STRICT;
CREATE TABLE ipv6_ips (
    ip                TEXT PRIMARY KEY NOT NULL,
    state             TEXT NOT NULL CHECK (state IN ('assigned', 'reserved')),
    network           TEXT,
    container_id      TEXT,
    ifname            TEXT,
    netns             TEXT,
    pod_namespace     TEXT,
    pod_name          TEXT,
    pod_uid           TEXT,
    sticky_key        TEXT,
    assigned_at_ms    INTEGER,
    reserved_for      TEXT UNIQUE,
    reserved_until_ms INTEGER,
    released_at_ms    INTEGER,
    UNIQUE (container_id, ifname),
    CHECK (CASE state
        WHEN 'assigned' THEN
            network IS NOT NULL AND container_id IS NOT NULL AND ifname IS NOT NULL
            AND netns IS NOT NULL AND pod_namespace IS NOT NULL AND pod_name IS NOT NULL
            AND pod_uid IS NOT NULL AND assigned_at_ms IS NOT NULL
            AND reserved_for IS NULL AND reserved_until_ms IS NULL AND released_at_ms IS NULL
        ELSE
            network IS NULL AND container_id IS NULL AND ifname IS NULL AND netns IS NULL
            AND pod_namespace IS NULL AND pod_name IS NULL AND pod_uid IS NULL
            AND sticky_key IS NULL AND assigned_at_ms IS NULL
            AND reserved_for IS NOT NULL AND reserved_until_ms IS NOT NULL
            AND released_at_ms IS NOT NULL
    END)
) STRICT;
";

/// Version 5: IPv4 egress for IPv6-only pods (issue 26, `ipv6::egress`). An assigned row may carry
/// the pod's node-local IPv4 (`egress_ipv4`, dotted quad, one pod per address by the unique index;
/// never on a reserved row: the address is freed at release); the prefix row carries the egress
/// cursor, a count that only grows, written with each allocation. Existing rows keep everything
/// and have no egress address (their pods were wired without one); the cursor starts at 0.
const V5: &str = "
ALTER TABLE ipv6_ips ADD COLUMN egress_ipv4 TEXT
    CHECK (egress_ipv4 IS NULL OR state = 'assigned');
CREATE UNIQUE INDEX ipv6_ips_by_egress ON ipv6_ips (egress_ipv4);
ALTER TABLE ipv6_prefix ADD COLUMN egress_next INTEGER NOT NULL DEFAULT 0
    CHECK (egress_next >= 0);
";

/// Version 6: the journal of EC2's answers to the pool's own address changes (`store::changes`):
/// one row per address or `/28` prefix the pool was last told EC2 assigned to, or is taking back
/// from, an ENI, with when. EC2's describes are eventually consistent, so a restart within a minute
/// of a change reads the change from here rather than from a describe that may not show it yet.
/// Rows older than that are pruned as new ones are written.
const V6: &str = "
CREATE TABLE ec2_changes (
    address   TEXT PRIMARY KEY NOT NULL,
    eni_id    TEXT NOT NULL,
    change    TEXT NOT NULL CHECK (change IN ('assigned', 'unassigned')),
    at_ms     INTEGER NOT NULL CHECK (at_ms >= 0)
) STRICT;
";

/// The schema version recorded in the database; 0 for a file without a `meta` table.
pub(super) fn version(conn: &Connection) -> Result<u32, StoreError> {
    let found = recorded_version(conn)?;
    u32::try_from(found)
        .map_err(|_| StoreError::Sqlite(format!("meta.schema_version is {found}, not a version")))
}

/// `meta.schema_version` as stored, with SQLite's own error (and error code) on failure.
pub(super) fn recorded_version(conn: &Connection) -> rusqlite::Result<i64> {
    let has_meta: bool = conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = 'meta')",
        [],
        |row| row.get(0),
    )?;
    if !has_meta {
        return Ok(0);
    }
    conn.query_row("SELECT schema_version FROM meta", [], |row| row.get(0))
}

/// Brings the schema up to [`SCHEMA_VERSION`] in one transaction and returns it.
///
/// Refuses, changing nothing, a database newer than this build.
pub(super) fn migrate(conn: &mut Connection) -> Result<u32, StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let found = version(&tx)?;
    if found > SCHEMA_VERSION {
        return Err(StoreError::NewerSchema {
            found,
            supported: SCHEMA_VERSION,
        });
    }
    if found == SCHEMA_VERSION {
        return Ok(found);
    }
    for (from, sql) in MIGRATIONS.iter().enumerate().skip(found as usize) {
        tx.execute_batch(sql).map_err(|e| {
            StoreError::Sqlite(format!(
                "migrating the schema from version {from} to {}: {e}",
                from + 1
            ))
        })?;
    }
    tx.execute("UPDATE meta SET schema_version = ?1", [SCHEMA_VERSION])?;
    tx.commit()?;
    tracing::info!(
        from = found,
        to = SCHEMA_VERSION,
        "migrated the state database schema"
    );
    Ok(SCHEMA_VERSION)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_run_once_and_record_the_version() {
        let mut conn = Connection::open_in_memory().unwrap();
        assert_eq!(version(&conn).unwrap(), 0);
        assert_eq!(migrate(&mut conn).unwrap(), SCHEMA_VERSION);
        assert_eq!(version(&conn).unwrap(), SCHEMA_VERSION);
        // A second run is a no-op, not a "table already exists" failure.
        assert_eq!(migrate(&mut conn).unwrap(), SCHEMA_VERSION);
    }

    #[test]
    fn a_newer_schema_is_refused() {
        let mut conn = Connection::open_in_memory().unwrap();
        migrate(&mut conn).unwrap();
        conn.execute("UPDATE meta SET schema_version = 7", [])
            .unwrap();
        match migrate(&mut conn) {
            Err(StoreError::NewerSchema { found, supported }) => {
                assert_eq!((found, supported), (7, SCHEMA_VERSION));
            }
            other => panic!("expected NewerSchema, got {other:?}"),
        }
        assert_eq!(version(&conn).unwrap(), 7);
    }

    #[test]
    fn version_1_rows_survive_the_move_to_version_2() {
        let mut conn = Connection::open_in_memory().unwrap();
        let tx = conn.transaction().unwrap();
        tx.execute_batch(V1).unwrap();
        tx.execute("UPDATE meta SET schema_version = 1", [])
            .unwrap();
        tx.execute(
            "INSERT INTO ips (ip, eni_id, state, container_id, ifname, netns, pod_namespace,
                              pod_name, pod_uid, assigned_at_ms)
             VALUES ('10.0.0.1', 'eni-1', 'assigned', 'c1', 'eth0', '/run/netns/x', 'ns', 'p', 'u', 5)",
            [],
        )
        .unwrap();
        tx.execute(
            "INSERT INTO ips (ip, eni_id, state, idle_since_ms, reserved_for, reserved_until_ms)
             VALUES ('10.0.0.2', 'eni-1', 'idle', 7, 'ns/p', 9)",
            [],
        )
        .unwrap();
        tx.commit().unwrap();
        assert_eq!(migrate(&mut conn).unwrap(), SCHEMA_VERSION);
        let (network, container): (Option<String>, String) = conn
            .query_row(
                "SELECT network, container_id FROM ips WHERE ip = '10.0.0.1'",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!((network, container.as_str()), (None, "c1"));
        let reserved: String = conn
            .query_row(
                "SELECT reserved_for FROM ips WHERE ip = '10.0.0.2'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(reserved, "ns/p");
        // Quarantined rows need their reason, and carry no attachment.
        let err = conn
            .execute(
                "INSERT INTO ips (ip, eni_id, state, idle_since_ms) VALUES ('10.0.0.3', 'e', 'quarantined', 1)",
                [],
            )
            .unwrap_err();
        assert!(err.to_string().contains("CHECK"), "{err}");
    }

    #[test]
    fn version_2_files_move_to_version_3_with_their_rows_and_no_learned_demand() {
        let mut conn = Connection::open_in_memory().unwrap();
        let tx = conn.transaction().unwrap();
        tx.execute_batch(V1).unwrap();
        tx.execute_batch(V2).unwrap();
        tx.execute("UPDATE meta SET schema_version = 2", [])
            .unwrap();
        tx.execute(
            "INSERT INTO ips (ip, eni_id, state, network, container_id, ifname, netns, pod_namespace,
                              pod_name, pod_uid, assigned_at_ms)
             VALUES ('10.0.0.1', 'eni-1', 'assigned', 'net', 'c1', 'eth0', '/run/netns/x', 'ns', 'p', 'u', 5)",
            [],
        )
        .unwrap();
        tx.commit().unwrap();
        assert_eq!(migrate(&mut conn).unwrap(), SCHEMA_VERSION);
        let container: String = conn
            .query_row(
                "SELECT container_id FROM ips WHERE ip = '10.0.0.1'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(container, "c1");
        let rows: i64 = conn
            .query_row("SELECT COUNT(*) FROM demand", [], |r| r.get(0))
            .unwrap();
        assert_eq!(rows, 0, "no learned demand yet");
        // A burst is whole or absent.
        let err = conn
            .execute(
                "INSERT INTO demand (id, written_at_ms, run_is_burst, burst_first_ms) VALUES (1, 1, 0, 5)",
                [],
            )
            .unwrap_err();
        assert!(err.to_string().contains("CHECK"), "{err}");
    }

    #[test]
    fn version_3_files_move_to_version_4_with_their_rows_and_no_ipv6_yet() {
        let mut conn = Connection::open_in_memory().unwrap();
        let tx = conn.transaction().unwrap();
        for sql in [V1, V2, V3] {
            tx.execute_batch(sql).unwrap();
        }
        tx.execute("UPDATE meta SET schema_version = 3", [])
            .unwrap();
        tx.execute(
            "INSERT INTO ips (ip, eni_id, state, network, container_id, ifname, netns, pod_namespace,
                              pod_name, pod_uid, assigned_at_ms)
             VALUES ('10.0.0.1', 'eni-1', 'assigned', 'net', 'c1', 'eth0', '/run/netns/x', 'ns', 'p', 'u', 5)",
            [],
        )
        .unwrap();
        tx.execute(
            "INSERT INTO demand (id, written_at_ms, run_is_burst) VALUES (1, 9, 0)",
            [],
        )
        .unwrap();
        tx.commit().unwrap();
        assert_eq!(migrate(&mut conn).unwrap(), SCHEMA_VERSION);
        let (container, demand): (String, i64) = conn
            .query_row(
                "SELECT container_id, (SELECT written_at_ms FROM demand) FROM ips WHERE ip = '10.0.0.1'",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!((container.as_str(), demand), ("c1", 9));
        let rows: i64 = conn
            .query_row(
                "SELECT (SELECT COUNT(*) FROM ipv6_prefix) + (SELECT COUNT(*) FROM ipv6_ips)",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(rows, 0, "no IPv6 yet");
        // A reserved row carries no attachment; an assigned one no reservation.
        for bad in [
            "INSERT INTO ipv6_ips (ip, state, container_id, reserved_for, reserved_until_ms, released_at_ms)
             VALUES ('2600::1', 'reserved', 'c1', 'ns/p', 1, 1)",
            "INSERT INTO ipv6_ips (ip, state, network, container_id, ifname, netns, pod_namespace, pod_name,
                                   pod_uid, assigned_at_ms, reserved_for)
             VALUES ('2600::2', 'assigned', 'n', 'c', 'eth0', '/x', 'ns', 'p', 'u', 1, 'ns/p')",
            "INSERT INTO ipv6_prefix (id, prefix, eni_id, next_offset, taken_at_ms) VALUES (1, '2600::/80', 'e', 0, 1)",
        ] {
            let err = conn.execute(bad, []).unwrap_err();
            assert!(err.to_string().contains("CHECK"), "{bad}: {err}");
        }
    }

    #[test]
    fn version_4_files_move_to_version_5_with_their_ipv6_rows_and_no_egress_yet() {
        let mut conn = Connection::open_in_memory().unwrap();
        let tx = conn.transaction().unwrap();
        for sql in [V1, V2, V3, V4] {
            tx.execute_batch(sql).unwrap();
        }
        tx.execute("UPDATE meta SET schema_version = 4", [])
            .unwrap();
        tx.execute_batch(
            "INSERT INTO ipv6_prefix (id, prefix, eni_id, next_offset, taken_at_ms)
             VALUES (1, '2600:1f18::/80', 'eni-0', 42, 7);
             INSERT INTO ipv6_ips (ip, state, network, container_id, ifname, netns, pod_namespace,
                                   pod_name, pod_uid, sticky_key, assigned_at_ms)
             VALUES ('2600:1f18::5', 'assigned', 'net', 'c1', 'eth0', '/run/netns/x', 'ns', 'p',
                     'u', 'ns/p', 5);
             INSERT INTO ipv6_ips (ip, state, reserved_for, reserved_until_ms, released_at_ms)
             VALUES ('2600:1f18::6', 'reserved', 'ns/q', 99, 3);",
        )
        .unwrap();
        tx.commit().unwrap();
        assert_eq!(migrate(&mut conn).unwrap(), SCHEMA_VERSION);
        let prefix: (String, i64, i64, i64) = conn
            .query_row(
                "SELECT prefix, next_offset, taken_at_ms, egress_next FROM ipv6_prefix",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .unwrap();
        assert_eq!(prefix, ("2600:1f18::/80".into(), 42, 7, 0));
        let rows: Vec<(String, String, Option<String>, Option<String>)> = conn
            .prepare("SELECT ip, state, sticky_key, egress_ipv4 FROM ipv6_ips ORDER BY ip")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(
            rows,
            [
                (
                    "2600:1f18::5".into(),
                    "assigned".into(),
                    Some("ns/p".into()),
                    None
                ),
                ("2600:1f18::6".into(), "reserved".into(), None, None),
            ]
        );
        // One pod per egress address, and none on a reserved row.
        conn.execute(
            "UPDATE ipv6_ips SET egress_ipv4 = '169.254.172.1' WHERE ip = '2600:1f18::5'",
            [],
        )
        .unwrap();
        let err = conn
            .execute(
                "INSERT INTO ipv6_ips (ip, state, network, container_id, ifname, netns, pod_namespace,
                                       pod_name, pod_uid, assigned_at_ms, egress_ipv4)
                 VALUES ('2600:1f18::7', 'assigned', 'n', 'c2', 'eth0', '/x', 'ns', 'p', 'u', 1,
                         '169.254.172.1')",
                [],
            )
            .unwrap_err();
        assert!(err.to_string().contains("UNIQUE"), "{err}");
        let err = conn
            .execute(
                "UPDATE ipv6_ips SET egress_ipv4 = '169.254.172.2' WHERE ip = '2600:1f18::6'",
                [],
            )
            .unwrap_err();
        assert!(err.to_string().contains("CHECK"), "{err}");
    }

    #[test]
    fn the_tables_reject_half_assigned_rows() {
        let mut conn = Connection::open_in_memory().unwrap();
        migrate(&mut conn).unwrap();
        let err = conn
            .execute(
                "INSERT INTO ips (ip, eni_id, state, container_id, idle_since_ms)
                 VALUES ('10.0.0.1', 'eni-1', 'idle', 'c1', 1)",
                [],
            )
            .unwrap_err();
        assert!(err.to_string().contains("CHECK"), "{err}");
    }

    #[test]
    fn version_5_files_move_to_version_6_with_an_empty_journal_and_their_rows() {
        let mut conn = Connection::open_in_memory().unwrap();
        let tx = conn.transaction().unwrap();
        for sql in [V1, V2, V3, V4, V5] {
            tx.execute_batch(sql).unwrap();
        }
        tx.execute("UPDATE meta SET schema_version = 5", [])
            .unwrap();
        tx.execute_batch(
            "INSERT INTO ips (ip, eni_id, state, idle_since_ms) VALUES ('10.0.0.9', 'eni-1', 'idle', 4);",
        )
        .unwrap();
        tx.commit().unwrap();
        assert_eq!(migrate(&mut conn).unwrap(), 6);
        let journal: i64 = conn
            .query_row("SELECT COUNT(*) FROM ec2_changes", [], |r| r.get(0))
            .unwrap();
        assert_eq!(journal, 0);
        let idle: String = conn
            .query_row("SELECT ip FROM ips WHERE state = 'idle'", [], |r| r.get(0))
            .unwrap();
        assert_eq!(idle, "10.0.0.9");
        let err = conn
            .execute(
                "INSERT INTO ec2_changes (address, eni_id, change, at_ms) VALUES ('10.0.0.1', 'e', 'assigned', -1)",
                [],
            )
            .unwrap_err();
        assert!(err.to_string().contains("CHECK"), "{err}");
    }
}
