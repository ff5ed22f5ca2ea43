//! Issue 23, case 8: a test that cannot run its real parts fails under `CI=true` and only says so
//! outside CI. Runs this very test executable again as a child, as cargo would, with and without CI.

use std::process::Command;

/// Skips when asked to by the parent (`ENIIPAM_SKIP_PROBE`); does nothing otherwise.
#[test]
fn skip_probe() {
    if std::env::var_os("ENIIPAM_SKIP_PROBE").is_some() {
        mockcloud::ci::skip("skip_probe", "the probe cannot run here");
    }
}

fn run_probe(ci: Option<&str>) -> std::process::Output {
    let mut cmd = Command::new(std::env::current_exe().expect("the test executable"));
    cmd.args([
        "skip_probe",
        "--exact",
        "--nocapture",
        "--test-threads",
        "1",
    ])
    .env("ENIIPAM_SKIP_PROBE", "1")
    .env_remove("CI");
    if let Some(v) = ci {
        cmd.env("CI", v);
    }
    cmd.output().expect("the probe runs")
}

#[test]
fn a_skipped_test_fails_under_ci_and_only_says_so_outside() {
    for ci in ["true", "1", "yes"] {
        let out = run_probe(Some(ci));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "CI={ci}: a skip passed: {stderr}");
        assert!(
            stderr.contains("skip_probe cannot run its real parts: the probe cannot run here"),
            "CI={ci}: {stderr}"
        );
    }
    for ci in [None, Some("false"), Some("0"), Some("")] {
        let out = run_probe(ci);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "CI={ci:?}: {stderr}");
        assert!(
            stderr.contains("NOTICE: skip_probe skipped: the probe cannot run here"),
            "CI={ci:?}: {stderr}"
        );
    }
}
