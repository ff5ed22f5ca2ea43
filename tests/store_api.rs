//! The state store's API against real files: round trips, conflicts, durability settings,
//! corrupt and newer files, concurrency.

mod store_support;

use std::fs;
use std::path::{Path, PathBuf};

use eniipam::store::{
    SCHEMA_VERSION, Store, StoreError, StoredAssignment, StoredIdle, StoredQuarantined, StoredState,
};
use store_support::{assignment, eni, eni_id, idle, ip};

fn db_path(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("state").join("state.db")
}

/// The files next to `path` whose names start with `<name>.corrupt-`.
fn corrupt_siblings(path: &Path) -> Vec<PathBuf> {
    let prefix = format!("{}.corrupt-", path.file_name().unwrap().to_string_lossy());
    let mut found: Vec<PathBuf> = fs::read_dir(path.parent().unwrap())
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(&prefix)
        })
        .collect();
    found.sort();
    found
}

fn assert_conflict<T: std::fmt::Debug>(result: Result<T, StoreError>) -> String {
    match result {
        Err(StoreError::Conflict(msg)) => msg,
        other => panic!("expected a conflict, got {other:?}"),
    }
}

/// A state that uses every kind of row and field.
fn sample_state() -> StoredState {
    let mut sticky = assignment(ip(7), &eni_id(1), "c7");
    sticky.sticky_key = Some("db/db-0".to_owned());
    StoredState {
        instance_id: Some("i-0123456789abcdef0".to_owned()),
        enis: vec![eni(0), eni(1)],
        assignments: vec![assignment(ip(3), &eni_id(0), "c3"), sticky],
        idle: vec![
            idle(ip(4), &eni_id(0), 10),
            StoredIdle {
                reservation: Some(("db/db-1".to_owned(), 99)),
                ..idle(ip(9), &eni_id(1), 20)
            },
        ],
        quarantined: vec![StoredQuarantined {
            ip: ip(11),
            eni_id: eni_id(1),
            since_ms: 30,
            reason: "the state file was lost".to_owned(),
        }],
    }
}

#[tokio::test]
async fn open_creates_the_file_and_its_directory() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    let (store, report) = Store::open(&path).await.unwrap();
    assert!(report.created);
    assert_eq!(report.moved_aside, None);
    assert_eq!(report.schema_version, SCHEMA_VERSION);
    assert!(path.exists());
    assert_eq!(store.load().await.unwrap(), StoredState::default());
    store.close().await;

    let (store, report) = Store::open(&path).await.unwrap();
    assert!(!report.created, "an existing file is not created again");
    assert_eq!(report.moved_aside, None);
    store.close().await;
}

#[tokio::test]
async fn wal_and_synchronous_normal_are_set() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    let (store, _) = Store::open(&path).await.unwrap();
    let durability = store.durability().await.unwrap();
    assert_eq!(durability.journal_mode, "wal");
    assert_eq!(durability.synchronous, "NORMAL");

    // WAL is a property of the file: another connection sees it too.
    let other = rusqlite::Connection::open(&path).unwrap();
    let mode: String = other
        .pragma_query_value(None, "journal_mode", |row| row.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    drop(other);
    store.close().await;
}

#[tokio::test]
async fn every_call_round_trips_through_load_and_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    let (store, _) = Store::open(&path).await.unwrap();

    store.set_instance_id("i-0abc").await.unwrap();
    store.upsert_eni(eni(2)).await.unwrap();
    store.upsert_eni(eni(0)).await.unwrap();
    let mut changed = eni(2);
    changed.subnet_cidr = "10.2.0.0/20".to_owned();
    store.upsert_eni(changed.clone()).await.unwrap();
    store
        .record_idle(vec![
            idle(ip(5), &eni_id(0), 100),
            idle(ip(2), &eni_id(2), 200),
            idle(ip(30), &eni_id(2), 300),
        ])
        .await
        .unwrap();
    // An idle IP is taken by a pod (the assignment replaces the idle row).
    let mut a = assignment(ip(5), &eni_id(0), "c1");
    a.sticky_key = Some("ns/web-0".to_owned());
    store.record_assigned(a.clone()).await.unwrap();
    store
        .record_assigned(assignment(ip(10), &eni_id(2), "c2"))
        .await
        .unwrap();
    // c2 goes away; its IP is reserved for its sticky key.
    let released = store
        .record_released("c2", "eth0", 400, Some(("ns/web-1".to_owned(), 900)))
        .await
        .unwrap();
    assert_eq!(released, Some(ip(10)));
    store.remove_ips(vec![ip(30), ip(200)]).await.unwrap();

    let expected = StoredState {
        instance_id: Some("i-0abc".to_owned()),
        enis: vec![eni(0), changed],
        assignments: vec![a],
        idle: vec![
            idle(ip(2), &eni_id(2), 200),
            StoredIdle {
                reservation: Some(("ns/web-1".to_owned(), 900)),
                ..idle(ip(10), &eni_id(2), 400)
            },
        ],
        quarantined: vec![],
    };
    assert_eq!(store.load().await.unwrap(), expected);
    store.close().await;

    let (store, report) = Store::open(&path).await.unwrap();
    assert!(!report.created);
    assert_eq!(store.load().await.unwrap(), expected);

    // remove_eni takes the ENI's IPs with it, and nothing else.
    store.remove_eni(&eni_id(2)).await.unwrap();
    let after = store.load().await.unwrap();
    assert_eq!(after.enis, vec![eni(0)]);
    assert_eq!(after.assignments, expected.assignments);
    assert!(after.idle.is_empty());
    store.remove_eni("eni-00000099").await.unwrap();
    store.close().await;
}

#[tokio::test]
async fn replace_all_replaces_everything() {
    let store = Store::open_in_memory().await.unwrap();
    store.set_instance_id("i-old").await.unwrap();
    store.upsert_eni(eni(5)).await.unwrap();
    store
        .record_assigned(assignment(ip(50), &eni_id(5), "old"))
        .await
        .unwrap();

    let state = sample_state();
    store.replace_all(state.clone()).await.unwrap();
    assert_eq!(store.load().await.unwrap(), state);

    store.replace_all(StoredState::default()).await.unwrap();
    assert_eq!(store.load().await.unwrap(), StoredState::default());
}

#[tokio::test]
async fn replace_all_with_duplicates_is_refused_and_changes_nothing() {
    let store = Store::open_in_memory().await.unwrap();
    let state = sample_state();
    store.replace_all(state.clone()).await.unwrap();

    let mut same_ip_twice = state.clone();
    same_ip_twice.idle.push(idle(ip(3), &eni_id(0), 1));
    assert_conflict(store.replace_all(same_ip_twice).await);

    let mut attachment_twice = state.clone();
    attachment_twice
        .assignments
        .push(assignment(ip(8), &eni_id(0), "c3"));
    assert_conflict(store.replace_all(attachment_twice).await);

    let mut eni_twice = state.clone();
    eni_twice.enis.push(eni(1));
    assert_conflict(store.replace_all(eni_twice).await);

    assert_eq!(store.load().await.unwrap(), state);
}

#[tokio::test]
async fn record_assigned_is_idempotent_for_the_same_attachment_and_ip() {
    let store = Store::open_in_memory().await.unwrap();
    let a = assignment(ip(1), &eni_id(0), "c1");
    store.record_assigned(a.clone()).await.unwrap();
    store.record_assigned(a.clone()).await.unwrap();
    // A retry may carry fresher details; they replace the old ones.
    let mut retried = a.clone();
    retried.netns = "/proc/123/ns/net".to_owned();
    store.record_assigned(retried.clone()).await.unwrap();
    assert_eq!(store.load().await.unwrap().assignments, vec![retried]);
}

#[tokio::test]
async fn conflicting_assignments_are_refused_and_change_nothing() {
    let store = Store::open_in_memory().await.unwrap();
    store.upsert_eni(eni(0)).await.unwrap();
    store
        .record_assigned(assignment(ip(1), &eni_id(0), "c1"))
        .await
        .unwrap();
    store
        .record_idle(vec![idle(ip(2), &eni_id(0), 5)])
        .await
        .unwrap();
    let before = store.load().await.unwrap();

    // The IP is held by another attachment.
    let msg = assert_conflict(
        store
            .record_assigned(assignment(ip(1), &eni_id(0), "c2"))
            .await,
    );
    assert!(msg.contains("10.0.0.1") && msg.contains("c1/eth0"), "{msg}");
    // The same container on another interface is another attachment.
    let mut other_if = assignment(ip(1), &eni_id(0), "c1");
    other_if.ifname = "net1".to_owned();
    assert_conflict(store.record_assigned(other_if).await);
    // The attachment already holds another IP (even an idle one cannot be added).
    let msg = assert_conflict(
        store
            .record_assigned(assignment(ip(2), &eni_id(0), "c1"))
            .await,
    );
    assert!(msg.contains("already holds 10.0.0.1"), "{msg}");
    // An assigned IP cannot be recorded idle, not even inside a batch of good ones.
    assert_conflict(
        store
            .record_idle(vec![idle(ip(3), &eni_id(0), 1), idle(ip(1), &eni_id(0), 1)])
            .await,
    );
    // Nor can a batch name an IP twice.
    assert_conflict(
        store
            .record_idle(vec![idle(ip(4), &eni_id(0), 1), idle(ip(4), &eni_id(0), 2)])
            .await,
    );

    assert_eq!(store.load().await.unwrap(), before);
}

#[tokio::test]
async fn releasing_an_unknown_attachment_is_none_and_changes_nothing() {
    let store = Store::open_in_memory().await.unwrap();
    store
        .record_assigned(assignment(ip(1), &eni_id(0), "c1"))
        .await
        .unwrap();
    let before = store.load().await.unwrap();
    assert_eq!(
        store
            .record_released("nope", "eth0", 1, None)
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        store.record_released("c1", "net1", 1, None).await.unwrap(),
        None
    );
    assert_eq!(store.load().await.unwrap(), before);

    // Released twice: the second time the attachment holds nothing.
    assert_eq!(
        store.record_released("c1", "eth0", 7, None).await.unwrap(),
        Some(ip(1))
    );
    assert_eq!(
        store.record_released("c1", "eth0", 8, None).await.unwrap(),
        None
    );
    assert_eq!(
        store.load().await.unwrap().idle,
        vec![idle(ip(1), &eni_id(0), 7)]
    );
}

#[tokio::test]
async fn recording_an_idle_ip_again_updates_it() {
    let store = Store::open_in_memory().await.unwrap();
    store
        .record_idle(vec![idle(ip(1), &eni_id(0), 5)])
        .await
        .unwrap();
    let reserved = StoredIdle {
        reservation: Some(("ns/a-0".to_owned(), 50)),
        ..idle(ip(1), &eni_id(1), 6)
    };
    store.record_idle(vec![reserved.clone()]).await.unwrap();
    assert_eq!(store.load().await.unwrap().idle, vec![reserved]);
}

#[tokio::test]
async fn times_beyond_sqlite_integers_are_refused() {
    let store = Store::open_in_memory().await.unwrap();
    let mut a = assignment(ip(1), &eni_id(0), "c1");
    a.assigned_at_ms = u64::MAX;
    assert!(matches!(
        store.record_assigned(a).await,
        Err(StoreError::Sqlite(_))
    ));
    assert_eq!(store.load().await.unwrap(), StoredState::default());
}

#[tokio::test]
async fn calls_after_close_are_refused() {
    let store = Store::open_in_memory().await.unwrap();
    let clone = store.clone();
    store.close().await;
    assert!(matches!(clone.load().await, Err(StoreError::Closed)));
    assert!(matches!(
        clone.record_assigned(assignment(ip(1), "eni-0", "c")).await,
        Err(StoreError::Closed)
    ));
    // Closing twice is harmless.
    clone.close().await;
}

#[tokio::test]
async fn close_flushes_the_wal_into_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    let (store, _) = Store::open(&path).await.unwrap();
    store.replace_all(sample_state()).await.unwrap();
    store.close().await;
    let wal = PathBuf::from(format!("{}-wal", path.display()));
    assert!(
        !wal.exists(),
        "the WAL was checkpointed and removed on close"
    );
}

#[tokio::test]
async fn a_garbage_file_is_moved_aside_and_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    let garbage: Vec<u8> = (0..10_000u32).map(|i| (i * 7 + 3) as u8).collect();
    fs::write(&path, &garbage).unwrap();

    let (store, report) = Store::open(&path).await.unwrap();
    assert!(report.created);
    let aside = report.moved_aside.clone().expect("moved aside");
    assert_eq!(corrupt_siblings(&path), vec![aside.clone()]);
    let name = aside.file_name().unwrap().to_string_lossy().into_owned();
    let stamp = name.strip_prefix("state.db.corrupt-").unwrap();
    assert!(stamp.parse::<u64>().unwrap() > 1_600_000_000_000, "{name}");
    assert_eq!(fs::read(&aside).unwrap(), garbage, "kept for inspection");

    // The fresh database works and is durable.
    assert_eq!(store.load().await.unwrap(), StoredState::default());
    store.replace_all(sample_state()).await.unwrap();
    assert_eq!(store.durability().await.unwrap().journal_mode, "wal");
    store.close().await;
    let (store, report) = Store::open(&path).await.unwrap();
    assert_eq!(report.moved_aside, None);
    assert_eq!(store.load().await.unwrap(), sample_state());
    store.close().await;
}

#[tokio::test]
async fn a_truncated_database_is_moved_aside_and_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    let (store, _) = Store::open(&path).await.unwrap();
    // Enough rows for many pages, so the truncation cuts into the tables.
    let many: Vec<StoredIdle> = (0..3000).map(|n| idle(ip(n), &eni_id(n % 4), 1)).collect();
    store.record_idle(many).await.unwrap();
    store.close().await;
    let full = fs::read(&path).unwrap();
    assert!(full.len() > 8 * 4096, "{} bytes", full.len());
    fs::write(&path, &full[..full.len() / 2]).unwrap();

    let (store, report) = Store::open(&path).await.unwrap();
    let aside = report.moved_aside.expect("moved aside");
    assert!(report.created);
    assert_eq!(fs::read(&aside).unwrap(), &full[..full.len() / 2]);
    assert_eq!(store.load().await.unwrap(), StoredState::default());
    store.close().await;
}

#[tokio::test]
async fn an_empty_file_is_a_new_database() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(&path, b"").unwrap();
    let (store, report) = Store::open(&path).await.unwrap();
    assert_eq!(report.moved_aside, None);
    assert_eq!(report.schema_version, SCHEMA_VERSION);
    assert_eq!(store.load().await.unwrap(), StoredState::default());
    store.close().await;
}

#[tokio::test]
async fn a_leftover_wal_without_its_database_is_not_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    let (store, _) = Store::open(&path).await.unwrap();
    store.replace_all(sample_state()).await.unwrap();
    // Copy the live WAL (holding the commit) before closing, then delete the database.
    let wal = PathBuf::from(format!("{}-wal", path.display()));
    let wal_bytes = fs::read(&wal).unwrap();
    assert!(!wal_bytes.is_empty());
    store.close().await;
    fs::remove_file(&path).unwrap();
    fs::write(&wal, wal_bytes).unwrap();

    let (store, report) = Store::open(&path).await.unwrap();
    assert!(report.created);
    assert_eq!(store.load().await.unwrap(), StoredState::default());
    store.close().await;
}

#[tokio::test]
async fn a_newer_schema_is_refused_and_the_file_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    let (store, _) = Store::open(&path).await.unwrap();
    store.replace_all(sample_state()).await.unwrap();
    store.close().await;
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute("UPDATE meta SET schema_version = 999", [])
            .unwrap();
    }
    let before = fs::read(&path).unwrap();

    let err = Store::open(&path).await.unwrap_err();
    match &err {
        StoreError::NewerSchema { found, supported } => {
            assert_eq!((*found, *supported), (999, SCHEMA_VERSION));
        }
        other => panic!("expected NewerSchema, got {other:?}"),
    }
    let msg = err.to_string();
    assert!(msg.contains("upgrade eniipam"), "{msg}");
    assert!(msg.contains("move the file away"), "{msg}");

    assert_eq!(fs::read(&path).unwrap(), before, "the file is untouched");
    assert!(
        corrupt_siblings(&path).is_empty(),
        "nothing was moved aside"
    );
    let conn = rusqlite::Connection::open(&path).unwrap();
    let version: i64 = conn
        .query_row("SELECT schema_version FROM meta", [], |row| row.get(0))
        .unwrap();
    assert_eq!(version, 999);
}

#[tokio::test]
async fn an_unreadable_path_is_an_error_not_a_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    // A directory where the file should be: SQLite cannot open it, and it must not be moved.
    fs::create_dir_all(&path).unwrap();
    let err = Store::open(&path).await.unwrap_err();
    assert!(matches!(err, StoreError::Sqlite(_)), "{err:?}");
    assert!(path.is_dir());
    assert!(corrupt_siblings(&path).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_thousand_assignments_from_fifty_tasks_are_all_committed() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    let (store, _) = Store::open(&path).await.unwrap();
    let tasks: Vec<_> = (0..50u32)
        .map(|t| {
            let store = store.clone();
            tokio::spawn(async move {
                for i in 0..20u32 {
                    let n = t * 20 + i;
                    store
                        .record_assigned(assignment(ip(n), &eni_id(t % 3), &format!("c{n}")))
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    store.close().await;

    let (store, _) = Store::open(&path).await.unwrap();
    let loaded: Vec<StoredAssignment> = store.load().await.unwrap().assignments;
    assert_eq!(loaded.len(), 1000);
    for (n, a) in loaded.iter().enumerate() {
        assert_eq!(a.ip, ip(n as u32));
        assert_eq!(a.container_id, format!("c{n}"));
    }
    store.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_for_one_ip_exactly_one_attachment_wins() {
    let store = Store::open_in_memory().await.unwrap();
    let tasks: Vec<_> = (0..50u32)
        .map(|t| {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .record_assigned(assignment(ip(1), &eni_id(0), &format!("c{t}")))
                    .await
            })
        })
        .collect();
    let mut winners = 0;
    for task in tasks {
        match task.await.unwrap() {
            Ok(()) => winners += 1,
            Err(StoreError::Conflict(_)) => {}
            Err(e) => panic!("unexpected {e:?}"),
        }
    }
    assert_eq!(winners, 1);
    assert_eq!(store.load().await.unwrap().assignments.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_writes_share_a_commit_and_a_refused_one_fails_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    let (store, _) = Store::open(&path).await.unwrap();
    store
        .record_assigned(assignment(ip(500), &eni_id(0), "holder"))
        .await
        .unwrap();
    store
        .record_assigned(assignment(ip(501), &eni_id(0), "leaving"))
        .await
        .unwrap();
    // Rounds of many writes queued at once (a group commit takes what is queued together); in
    // each, one assignment wants an IP that is taken and one release frees an IP.
    for round in 0..5u32 {
        let writes = (0..40u32).map(|i| {
            let n = round * 40 + i;
            let store = store.clone();
            async move {
                match i {
                    7 => (
                        n,
                        store
                            .record_assigned(assignment(ip(500), &eni_id(0), &format!("c{n}")))
                            .await,
                    ),
                    13 if round == 0 => (
                        n,
                        store
                            .record_released("leaving", "eth0", 1, None)
                            .await
                            .map(|freed| assert_eq!(freed, Some(ip(501)))),
                    ),
                    _ => (
                        n,
                        store
                            .record_assigned(assignment(ip(n), &eni_id(0), &format!("c{n}")))
                            .await,
                    ),
                }
            }
        });
        for (n, result) in futures::future::join_all(writes).await {
            if n % 40 == 7 {
                assert_conflict(result);
            } else {
                result.unwrap();
            }
        }
    }
    store.close().await;

    let (store, _) = Store::open(&path).await.unwrap();
    let state = store.load().await.unwrap();
    // 5 rounds × 38 new assignments (the 7th of each was refused; round 0's 13th released), the
    // holder of .500 untouched, .501 idle.
    assert_eq!(state.assignments.len(), 5 * 39 - 1 + 1);
    let holder = state.assignments.iter().find(|a| a.ip == ip(500)).unwrap();
    assert_eq!(holder.container_id, "holder");
    assert!(state.idle.iter().any(|i| i.ip == ip(501)));
    assert!(!state.assignments.iter().any(|a| a.container_id == "c7"));
    store.close().await;
}
