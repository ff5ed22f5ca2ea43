//! Opening the database file: create, move a corrupt one aside, refuse a newer one, set the pragmas.
//!
//! # Why `synchronous=NORMAL` with WAL is safe here
//!
//! In WAL mode with `synchronous=NORMAL`, a commit appends its pages to the `-wal` file with
//! `write(2)` and returns; the fsync happens at checkpoints, not per commit. So:
//!
//! - **A crash of the process** (panic, OOM kill, `kill -9`) loses nothing: the committed frames
//!   were handed to the kernel before the call returned, they sit in the OS page cache, and the
//!   next open replays them from the `-wal` file. Only the kernel going away can drop them.
//! - **A power loss or kernel panic** can lose the last commits (never corrupt the file: WAL
//!   frames are checksummed and a torn tail is discarded). But the same event reboots the node and
//!   kills every pod on it, so the IPs those commits described belong to containers that no longer
//!   exist. The startup reconcile rebuilds the truth anyway — ENIs and IPs from IMDS and EC2
//!   (EC2 wins), assignments whose network namespace is gone are released — so a lost tail is
//!   indistinguishable from the state the reconcile would produce.
//!
//! `synchronous=FULL` would add an fsync to every pod ADD/DEL to protect against a case that
//! cannot leave a pod running with a forgotten IP.
//!
//! # What counts as corrupt
//!
//! A file SQLite says is not a database (`SQLITE_NOTADB`), that it finds malformed
//! (`SQLITE_CORRUPT`), or that fails `PRAGMA quick_check`. Such a file is renamed to
//! `<path>.corrupt-<unix-ms>` (with its `-wal`/`-journal` beside it), and a fresh database is
//! created. Other failures — permissions, a full disk, I/O errors, a lock held by another process
//! — are returned as errors and the file is left alone: moving a healthy database aside because
//! the disk is full would throw away good state.

use std::ffi::OsString;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, ErrorCode};

use super::{OpenReport, SCHEMA_VERSION, StoreError, schema};

/// How long a statement waits for a lock another connection holds (e.g. an operator's `sqlite3`).
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Opens the database file at `path`; see the module docs.
pub(super) fn open_file(path: &Path) -> Result<(Connection, OpenReport), StoreError> {
    if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
        fs::create_dir_all(dir)
            .map_err(|e| StoreError::Io(format!("creating {}: {e}", dir.display())))?;
    }
    let existed = path
        .try_exists()
        .map_err(|e| StoreError::Io(format!("looking for {}: {e}", path.display())))?;
    if !existed {
        // A `-wal` without its database would be replayed into the new, empty one.
        remove_orphan_sidecars(path)?;
    }

    let mut moved_aside = None;
    let mut conn = match inspect(path) {
        Ok(conn) => conn,
        Err(Inspection::Failed(e)) => return Err(e),
        Err(Inspection::Corrupt(reason)) => {
            let aside = move_aside(path)?;
            tracing::error!(
                path = %path.display(),
                moved_to = %aside.display(),
                %reason,
                "the state database is corrupt; moved it aside and starting from an empty one"
            );
            moved_aside = Some(aside);
            inspect(path).map_err(|inspection| match inspection {
                Inspection::Failed(e) => e,
                Inspection::Corrupt(reason) => StoreError::Sqlite(format!(
                    "the fresh database at {} is corrupt too: {reason}",
                    path.display()
                )),
            })?
        }
    };
    enable_wal(&conn)?;
    let schema_version = schema::migrate(&mut conn)?;
    let report = OpenReport {
        created: !existed || moved_aside.is_some(),
        moved_aside,
        schema_version,
    };
    Ok((conn, report))
}

/// Opens an empty database in memory with the current schema.
pub(super) fn open_memory() -> Result<(Connection, OpenReport), StoreError> {
    let mut conn = Connection::open_in_memory()?;
    let schema_version = schema::migrate(&mut conn)?;
    let report = OpenReport {
        created: true,
        moved_aside: None,
        schema_version,
    };
    Ok((conn, report))
}

/// Why a file could not be used as it is.
enum Inspection {
    /// The file is not a sound SQLite database; it may be moved aside.
    Corrupt(String),
    /// Anything else; the file must be left alone.
    Failed(StoreError),
}

impl From<rusqlite::Error> for Inspection {
    fn from(e: rusqlite::Error) -> Self {
        match e.sqlite_error_code() {
            Some(ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt) => {
                Inspection::Corrupt(e.to_string())
            }
            _ => Inspection::Failed(e.into()),
        }
    }
}

impl From<StoreError> for Inspection {
    fn from(e: StoreError) -> Self {
        Inspection::Failed(e)
    }
}

/// Opens the file and checks it without writing to it: integrity, then schema version.
fn inspect(path: &Path) -> Result<Connection, Inspection> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    let mut verdict = Vec::new();
    {
        let mut stmt = conn.prepare("PRAGMA quick_check")?;
        let mut rows = stmt.query([])?;
        while let Some(row) = rows.next()? {
            verdict.push(row.get::<_, String>(0)?);
        }
    }
    if verdict != ["ok"] {
        return Err(Inspection::Corrupt(format!(
            "quick_check: {}",
            verdict.join("; ")
        )));
    }
    // A damaged page can also first show up here, as SQLITE_CORRUPT.
    let found = schema::recorded_version(&conn)?;
    let found = u32::try_from(found).map_err(|_| {
        Inspection::Failed(StoreError::Sqlite(format!(
            "meta.schema_version is {found}, not a version"
        )))
    })?;
    if found > SCHEMA_VERSION {
        return Err(Inspection::Failed(StoreError::NewerSchema {
            found,
            supported: SCHEMA_VERSION,
        }));
    }
    Ok(conn)
}

/// Switches the file to WAL journaling with `synchronous=NORMAL` (see the module docs for why).
fn enable_wal(conn: &Connection) -> Result<(), StoreError> {
    let mode: String =
        conn.pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::Sqlite(format!(
            "could not switch the database to WAL mode (journal_mode is {mode})"
        )));
    }
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    Ok(())
}

/// Renames the corrupt file (and its `-wal`/`-journal`) to `<path>.corrupt-<unix-ms>` and drops
/// its `-shm` index; returns the new path of the file.
fn move_aside(path: &Path) -> Result<PathBuf, StoreError> {
    let mut stamp = unix_ms_now();
    let aside = loop {
        let candidate = with_suffix(path, &format!(".corrupt-{stamp}"));
        if !candidate.exists() {
            break candidate;
        }
        stamp += 1;
    };
    fs::rename(path, &aside).map_err(|e| {
        StoreError::Io(format!(
            "moving the corrupt {} aside to {}: {e}",
            path.display(),
            aside.display()
        ))
    })?;
    for suffix in ["-wal", "-journal"] {
        let sidecar = with_suffix(path, suffix);
        match fs::rename(&sidecar, with_suffix(&aside, suffix)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(StoreError::Io(format!(
                    "moving {} aside: {e}",
                    sidecar.display()
                )));
            }
        }
    }
    remove_if_present(&with_suffix(path, "-shm"))?;
    Ok(aside)
}

/// Removes the `-wal`, `-shm` and `-journal` files of a database that does not exist.
fn remove_orphan_sidecars(path: &Path) -> Result<(), StoreError> {
    for suffix in ["-wal", "-shm", "-journal"] {
        let sidecar = with_suffix(path, suffix);
        if remove_if_present(&sidecar)? {
            tracing::warn!(path = %sidecar.display(), "removed a leftover file of a missing state database");
        }
    }
    Ok(())
}

/// Removes a file; `Ok(false)` if there was none.
fn remove_if_present(path: &Path) -> Result<bool, StoreError> {
    match fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(StoreError::Io(format!("removing {}: {e}", path.display()))),
    }
}

/// `path` with `suffix` appended to its file name.
fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = OsString::from(path.as_os_str());
    name.push(suffix);
    PathBuf::from(name)
}

/// The wall clock in unix milliseconds.
fn unix_ms_now() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}
