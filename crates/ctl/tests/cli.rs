//! `eniipamctl` as an operator runs it, without a daemon: clear errors and exit codes. (Against a
//! running daemon: the workspace's `tests/daemon_simulate.rs`.)

use std::process::Command;

#[test]
fn a_missing_socket_is_named_with_what_to_do() {
    let out = Command::new(env!("CARGO_BIN_EXE_eniipamctl"))
        .args(["--socket", "/nonexistent/eniipam.sock", "status"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("/nonexistent/eniipam.sock"), "{err}");
    assert!(err.contains("is eniipamd running"), "{err}");
}

#[test]
fn unknown_subcommands_are_refused_by_clap() {
    let out = Command::new(env!("CARGO_BIN_EXE_eniipamctl"))
        .arg("frobnicate")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}
