//! The journal of EC2's answers to the pool's own address changes (schema version 6).
//!
//! EC2's API is eventually consistent: a describe sent seconds after an assign may not list the new
//! addresses yet, and one sent after an unassign may still list what went back (AWS, *Eventual
//! consistency in the Amazon EC2 API*: "seconds to minutes"). The startup rebuild reads the ENIs
//! from such a describe. After a restart right after a change, it would drop the pods' records of
//! addresses the describe does not show yet, and take back as idle, soon handed out, addresses
//! already given back to EC2, which EC2 may have assigned to another node since.
//!
//! So each change is written here with EC2's answer: addresses an assign or a create gave an ENI
//! (`assigned`, after the answer; a crash before the write leaves an address on the ENI that the
//! pool does not know, never one it hands out twice), and addresses going back (`unassigning`,
//! before the call; a failed call writes them `assigned` again). One row per address or `/28`
//! prefix, the latest change winning. Rows older than [`crate::cloud::DESCRIBE_SETTLES`] are of no
//! use (a describe sent that long after a change shows it) and are pruned at each write.

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use rusqlite::{Connection, TransactionBehavior, params};

use super::StoreError;

/// What the pool last did to an address (or `/28` prefix) on an ENI, as EC2 answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Ec2Change {
    /// EC2 assigned it to the ENI (an assign's or a create's answer).
    Assigned,
    /// The pool is giving it back (written before the unassign is sent).
    Unassigned,
}

impl Ec2Change {
    fn as_str(self) -> &'static str {
        match self {
            Ec2Change::Assigned => "assigned",
            Ec2Change::Unassigned => "unassigned",
        }
    }
}

/// One address or `/28` prefix a change named.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Ec2Address {
    Ip(Ipv4Addr),
    Prefix(Ipv4Net),
}

impl std::fmt::Display for Ec2Address {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Ec2Address::Ip(ip) => ip.fmt(f),
            Ec2Address::Prefix(p) => p.fmt(f),
        }
    }
}

impl std::str::FromStr for Ec2Address {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s.contains('/') {
            s.parse()
                .map(Ec2Address::Prefix)
                .map_err(|e| format!("{s:?}: {e}"))
        } else {
            s.parse()
                .map(Ec2Address::Ip)
                .map_err(|e| format!("{s:?}: {e}"))
        }
    }
}

/// A journal row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredEc2Change {
    pub address: Ec2Address,
    pub eni_id: String,
    pub change: Ec2Change,
    pub at_ms: u64,
}

fn ms(v: u64) -> Result<i64, StoreError> {
    i64::try_from(v).map_err(|_| StoreError::Sqlite(format!("time {v} ms is out of range")))
}

/// Records `change` of `addresses` on `eni_id` at `at_ms` (each replacing the address's row), and
/// prunes rows older than `at_ms - keep_ms`; one transaction.
pub(super) fn record(
    conn: &mut Connection,
    eni_id: &str,
    addresses: &[Ec2Address],
    change: Ec2Change,
    at_ms: u64,
    keep_ms: u64,
) -> Result<(), StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    {
        let mut upsert = tx.prepare_cached(
            "INSERT OR REPLACE INTO ec2_changes (address, eni_id, change, at_ms)
             VALUES (?1, ?2, ?3, ?4)",
        )?;
        for a in addresses {
            upsert.execute(params![a.to_string(), eni_id, change.as_str(), ms(at_ms)?])?;
        }
    }
    tx.execute(
        "DELETE FROM ec2_changes WHERE at_ms < ?1",
        [ms(at_ms.saturating_sub(keep_ms))?],
    )?;
    tx.commit()?;
    Ok(())
}

/// Every row, oldest first.
pub(super) fn load(conn: &Connection) -> Result<Vec<StoredEc2Change>, StoreError> {
    let mut rows = conn
        .prepare_cached("SELECT address, eni_id, change, at_ms FROM ec2_changes")?
        .query_map([], |row| {
            let address: String = row.get(0)?;
            let change: String = row.get(2)?;
            let at: i64 = row.get(3)?;
            Ok((address, row.get::<_, String>(1)?, change, at))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?
        .into_iter()
        .map(|(address, eni_id, change, at)| {
            Ok(StoredEc2Change {
                address: address
                    .parse()
                    .map_err(|e| StoreError::Sqlite(format!("ec2_changes.address {e}")))?,
                eni_id,
                change: match change.as_str() {
                    "assigned" => Ec2Change::Assigned,
                    _ => Ec2Change::Unassigned,
                },
                at_ms: at.max(0) as u64,
            })
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    rows.sort_by_key(|r| (r.at_ms, r.address));
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn() -> Connection {
        let mut c = Connection::open_in_memory().unwrap();
        super::super::schema::migrate(&mut c).unwrap();
        c
    }

    #[test]
    fn the_latest_change_of_an_address_wins_and_old_rows_are_pruned() {
        let mut c = conn();
        let a = Ec2Address::Ip("10.0.0.5".parse().unwrap());
        let b = Ec2Address::Prefix("10.0.1.16/28".parse().unwrap());
        record(&mut c, "eni-1", &[a, b], Ec2Change::Assigned, 1_000, 60_000).unwrap();
        record(&mut c, "eni-1", &[a], Ec2Change::Unassigned, 2_000, 60_000).unwrap();
        let rows = load(&c).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!((rows[0].address, rows[0].change), (b, Ec2Change::Assigned));
        assert_eq!(
            (rows[1].address, rows[1].change),
            (a, Ec2Change::Unassigned)
        );
        let c2 = Ec2Address::Ip("10.0.0.6".parse().unwrap());
        record(&mut c, "eni-2", &[c2], Ec2Change::Assigned, 70_000, 60_000).unwrap();
        let rows = load(&c).unwrap();
        assert_eq!(rows.len(), 1, "the row of 1 s is past the minute: pruned");
        assert_eq!(rows[0].eni_id, "eni-2");
    }

    /// Issue 44 case 8: an address found gone, or an ENI gone from the node, no longer has the
    /// journal vouch for EC2 having assigned it; a give-back's row stays.
    #[test]
    fn a_lost_address_or_eni_loses_its_assign_row_not_its_give_back() {
        let mut c = conn();
        let ip = |s: &str| s.parse::<Ipv4Addr>().unwrap();
        let (a, b, d) = (ip("10.0.0.5"), ip("10.0.0.6"), ip("10.0.0.7"));
        let rows = [Ec2Address::Ip(a), Ec2Address::Ip(b)];
        record(&mut c, "eni-1", &rows, Ec2Change::Assigned, 1_000, 60_000).unwrap();
        record(
            &mut c,
            "eni-1",
            &[Ec2Address::Ip(d)],
            Ec2Change::Unassigned,
            1_000,
            60_000,
        )
        .unwrap();
        let other = [Ec2Address::Ip(ip("10.0.1.5"))];
        record(&mut c, "eni-2", &other, Ec2Change::Assigned, 1_000, 60_000).unwrap();
        // A /28 one address of which is found gone loses its row too (EC2 takes prefixes whole).
        let prefix = Ec2Address::Prefix("10.0.4.0/28".parse().unwrap());
        record(
            &mut c,
            "eni-1",
            &[prefix],
            Ec2Change::Assigned,
            1_000,
            60_000,
        )
        .unwrap();
        super::super::queries::remove_ips(&mut c, &[a, d, ip("10.0.4.2")]).unwrap();
        let left: Vec<_> = load(&c).unwrap().into_iter().map(|r| r.address).collect();
        assert!(!left.contains(&prefix), "{left:?}");
        assert_eq!(left.len(), 3, "{left:?}");
        assert!(!left.contains(&Ec2Address::Ip(a)), "{left:?}");
        assert!(
            left.contains(&Ec2Address::Ip(d)),
            "a give-back stays: {left:?}"
        );
        super::super::queries::remove_eni(&mut c, "eni-1").unwrap();
        let left: Vec<_> = load(&c)
            .unwrap()
            .into_iter()
            .map(|r| (r.address, r.change))
            .collect();
        assert_eq!(
            left,
            vec![
                (Ec2Address::Ip(d), Ec2Change::Unassigned),
                (other[0], Ec2Change::Assigned)
            ]
        );
    }

    #[test]
    fn a_bad_row_is_an_error_naming_it() {
        let c = conn();
        c.execute(
            "INSERT INTO ec2_changes (address, eni_id, change, at_ms) VALUES ('10.0.0.300', 'e', 'assigned', 1)",
            [],
        )
        .unwrap();
        let err = load(&c).unwrap_err().to_string();
        assert!(err.contains("10.0.0.300"), "{err}");
        assert!(
            c.execute(
                "INSERT INTO ec2_changes (address, eni_id, change, at_ms) VALUES ('10.0.0.1', 'e', 'taken', 1)",
                [],
            )
            .is_err(),
            "the CHECK refuses an unknown change"
        );
    }
}
