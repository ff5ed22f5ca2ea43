//! `kill -9` loses no committed write.
//!
//! The test re-runs its own binary as a child (selecting the `crash_child` test, with
//! `STORE_CRASH_CHILD` naming the database). The child assigns and releases IPs in a loop and
//! prints each call after it returns. The parent SIGKILLs it at a random moment, reopens the file,
//! and checks that the state is exactly what the printed calls produced — or that plus the one
//! call in flight when the kill came.

mod store_support;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use eniipam::store::{Store, StoredState};
use rand::Rng;
use store_support::{assignment, eni_id, idle, ip};

/// Names the database file when this binary runs as the child.
const CHILD_ENV: &str = "STORE_CRASH_CHILD";
const ROUNDS: usize = 20;

/// What the child does at step `n`: even steps assign IP `n/2` to container `c<n/2>`, odd steps
/// release that container (so the IP goes idle since `n`). Every third container is released.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    Assign(u32),
    Release(u32),
}

/// The steps, in order: assign k, and for every third k, release k right after.
fn steps() -> impl Iterator<Item = Step> {
    (0u32..).flat_map(|k| {
        let release = (k % 3 == 0).then_some(Step::Release(k));
        std::iter::once(Step::Assign(k)).chain(release)
    })
}

/// The state the first `done` steps produce.
fn expected_after(done: usize) -> StoredState {
    let mut state = StoredState::default();
    for step in steps().take(done) {
        match step {
            Step::Assign(k) => {
                state
                    .assignments
                    .push(assignment(ip(k), &eni_id(0), &format!("c{k}")))
            }
            Step::Release(k) => {
                state.assignments.retain(|a| a.ip != ip(k));
                state
                    .idle
                    .push(idle(ip(k), &eni_id(0), u64::from(k) + 1_000));
            }
        }
    }
    state.assignments.sort_by_key(|a| a.ip);
    state.idle.sort_by_key(|i| i.ip);
    state
}

/// The child: runs steps until killed, printing `done <n>` after the n-th returns.
#[tokio::test]
async fn crash_child() {
    let Some(path) = std::env::var_os(CHILD_ENV) else {
        return; // Run as a normal test: nothing to do.
    };
    let (store, _) = Store::open(Path::new(&path)).await.unwrap();
    let mut out = std::io::stdout().lock();
    writeln!(out, "opened").unwrap();
    out.flush().unwrap();
    for (n, step) in steps().enumerate() {
        match step {
            Step::Assign(k) => store
                .record_assigned(assignment(ip(k), &eni_id(0), &format!("c{k}")))
                .await
                .unwrap(),
            Step::Release(k) => {
                let released = store
                    .record_released(&format!("c{k}"), "eth0", u64::from(k) + 1_000, None)
                    .await
                    .unwrap();
                assert_eq!(released, Some(ip(k)));
            }
        }
        writeln!(out, "done {}", n + 1).unwrap();
        out.flush().unwrap();
    }
}

#[tokio::test]
async fn kill_9_loses_no_committed_write() {
    let exe = std::env::current_exe().unwrap();
    let mut rng = rand::rng();
    for round in 0..ROUNDS {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let mut child = Command::new(&exe)
            .args(["--exact", "crash_child", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, &path)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();

        // Read the child's lines on a thread; the parent only needs the last `done`.
        let stdout = child.stdout.take().unwrap();
        let (lines_tx, lines) = mpsc::channel();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if lines_tx.send(line).is_err() {
                    break;
                }
            }
        });
        let opened = lines
            .iter()
            .find(|line| line.ends_with("opened") || line.starts_with("done"));
        assert!(
            opened.is_some(),
            "round {round}: the child never opened the store"
        );
        let delay = Duration::from_micros(rng.random_range(0..150_000));
        // A real wait: the child process writes on the wall clock, and is killed at a random moment.
        #[allow(clippy::disallowed_methods)]
        std::thread::sleep(delay);
        child.kill().unwrap();
        child.wait().unwrap();
        reader.join().unwrap();
        // The line that ended the wait counts too if it is a `done` (libtest's `--nocapture` prints
        // "opened" after "test crash_child ... " on one line; the wait used to miss it and take
        // "done 1" instead, so a kill right after step 2's commit looked like a lost write).
        let done = opened
            .into_iter()
            .chain(lines.try_iter())
            .filter_map(|line| line.strip_prefix("done ")?.parse::<usize>().ok())
            .max()
            .unwrap_or(0);

        let (store, report) = Store::open(&path).await.unwrap();
        assert_eq!(
            report.moved_aside, None,
            "round {round}: the file was damaged"
        );
        let state = store.load().await.unwrap();
        store.close().await;
        assert!(
            state == expected_after(done) || state == expected_after(done + 1),
            "round {round}: after {done} reported steps (killed after {delay:?}) the store holds \
             {} assignments and {} idle IPs",
            state.assignments.len(),
            state.idle.len()
        );
        eprintln!("round {round}: killed after {delay:?}, {done} steps reported and present");
    }
}
