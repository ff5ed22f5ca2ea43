//! The pool's learned demand (schema version 3): one row of bursts and the recent start times,
//! replaced whole at each write (a few hundred rows at most: the starts of the last hour's minute
//! windows), read once at startup.

use rusqlite::{Connection, OptionalExtension, Row, TransactionBehavior, params};

use super::{StoreError, StoredBurst, StoredDemand};

fn ms(v: u64) -> Result<i64, StoreError> {
    i64::try_from(v).map_err(|_| StoreError::Sqlite(format!("time {v} ms is out of range")))
}

fn opt_ms(v: Option<u64>) -> Result<Option<i64>, StoreError> {
    v.map(ms).transpose()
}

/// A burst's three columns (first, last, starts), all NULL for none.
type BurstColumns = (Option<i64>, Option<i64>, Option<u32>);

fn burst_columns(b: Option<&StoredBurst>) -> Result<BurstColumns, StoreError> {
    Ok(match b {
        Some(b) => (Some(ms(b.first_ms)?), Some(ms(b.last_ms)?), Some(b.starts)),
        None => (None, None, None),
    })
}

fn burst_from(row: &Row<'_>, at: usize) -> rusqlite::Result<Option<StoredBurst>> {
    let first: Option<i64> = row.get(at)?;
    let last: Option<i64> = row.get(at + 1)?;
    let starts: Option<u32> = row.get(at + 2)?;
    Ok(match (first, last, starts) {
        (Some(f), Some(l), Some(s)) => Some(StoredBurst {
            first_ms: f.max(0) as u64,
            last_ms: l.max(0) as u64,
            starts: s,
        }),
        _ => None,
    })
}

/// Replaces the learned demand with `d`, in one transaction.
pub(super) fn save(conn: &mut Connection, d: &StoredDemand) -> Result<(), StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let run = burst_columns(d.run.as_ref())?;
    let last = burst_columns(d.last_burst.as_ref())?;
    let prev = burst_columns(d.previous_burst.as_ref())?;
    tx.execute(
        "INSERT OR REPLACE INTO demand (id, written_at_ms, last_start_ms, run_first_ms, run_last_ms,
             run_starts, run_is_burst, burst_first_ms, burst_last_ms, burst_starts,
             previous_first_ms, previous_last_ms, previous_starts)
         VALUES (1, ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
        params![
            ms(d.written_at_ms)?,
            opt_ms(d.last_start_ms)?,
            run.0,
            run.1,
            run.2,
            d.run_is_burst,
            last.0,
            last.1,
            last.2,
            prev.0,
            prev.1,
            prev.2,
        ],
    )?;
    tx.execute("DELETE FROM demand_starts", [])?;
    {
        let mut insert = tx.prepare("INSERT INTO demand_starts (at_ms) VALUES (?1)")?;
        for at in &d.starts_ms {
            insert.execute([ms(*at)?])?;
        }
    }
    tx.commit()?;
    Ok(())
}

/// The learned demand, if any was written.
pub(super) fn load(conn: &Connection) -> Result<Option<StoredDemand>, StoreError> {
    let row = conn
        .query_row(
            "SELECT written_at_ms, last_start_ms, run_first_ms, run_last_ms, run_starts, run_is_burst,
                    burst_first_ms, burst_last_ms, burst_starts,
                    previous_first_ms, previous_last_ms, previous_starts
             FROM demand WHERE id = 1",
            [],
            |r| {
                let written: i64 = r.get(0)?;
                let last_start: Option<i64> = r.get(1)?;
                Ok(StoredDemand {
                    written_at_ms: written.max(0) as u64,
                    starts_ms: Vec::new(),
                    last_start_ms: last_start.map(|v| v.max(0) as u64),
                    run: burst_from(r, 2)?,
                    run_is_burst: r.get(5)?,
                    last_burst: burst_from(r, 6)?,
                    previous_burst: burst_from(r, 9)?,
                })
            },
        )
        .optional()?;
    let Some(mut d) = row else {
        return Ok(None);
    };
    let mut stmt = conn.prepare("SELECT at_ms FROM demand_starts ORDER BY at_ms")?;
    d.starts_ms = stmt
        .query_map([], |r| r.get::<_, i64>(0))?
        .map(|v| v.map(|v| v.max(0) as u64))
        .collect::<rusqlite::Result<_>>()?;
    Ok(Some(d))
}
