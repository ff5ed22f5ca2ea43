//! The workspace's binaries, for tests of the daemon package that run the plugin (`eniipam`, package
//! `eniipam-cni`) or `eniipamctl` (package `eniipamctl`): cargo only hands a test the paths of its own
//! package's binaries, so they are found beside the test executable (`target/<profile>/deps/..`).
//! `cargo test --workspace` builds them before any test runs.
#![allow(dead_code)]

use std::path::PathBuf;

/// The path of the workspace binary `name`; panics with what to run when it has not been built.
pub fn target_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable's path");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("the test executable lives in target/<profile>/deps");
    let path = dir.join(name);
    assert!(
        path.is_file(),
        "{} is not built: run `cargo build --workspace --bins` (or `cargo test --workspace`, which builds it)",
        path.display()
    );
    path
}
