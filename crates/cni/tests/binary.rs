//! The `eniipam` binary as a runtime executes it, without a daemon: VERSION, the spec's error object
//! for bad input, DEL that succeeds with nothing to do, and its exit codes. (With a daemon, in network
//! namespaces and under containerd: the workspace's `tests/`.)

use std::io::Write;
use std::process::{Command, Stdio};

fn run(env: &[(&str, &str)], stdin: &str) -> (serde_json::Value, i32) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_eniipam"))
        .env_clear()
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the plugin");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let json = if stdout.is_empty() {
        serde_json::Value::Null
    } else {
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("stdout {stdout:?}: {e}"))
    };
    (json, out.status.code().unwrap())
}

#[test]
fn version_lists_the_supported_versions() {
    let (v, code) = run(&[("CNI_COMMAND", "VERSION")], r#"{"cniVersion":"1.0.0"}"#);
    assert_eq!(code, 0);
    assert_eq!(v["cniVersion"], "1.0.0");
    let supported: Vec<&str> = v["supportedVersions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    for want in ["0.4.0", "1.0.0", "1.1.0"] {
        assert!(supported.contains(&want), "{supported:?}");
    }
}

#[test]
fn bad_input_gets_the_spec_error_object_and_exit_1() {
    // Not JSON: decoding failure (6).
    let (v, code) = run(
        &[
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "c1"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_NETNS", "/proc/self/ns/net"),
            ("CNI_PATH", "/opt/cni/bin"),
        ],
        "{not json",
    );
    assert_eq!(code, 1);
    assert_eq!(v["code"], 6, "{v}");
    assert!(v["msg"].as_str().is_some_and(|m| !m.is_empty()));
    // Unknown command: bad environment (4).
    let (v, code) = run(
        &[("CNI_COMMAND", "FROB")],
        r#"{"cniVersion":"1.0.0","name":"n","type":"eniipam"}"#,
    );
    assert_eq!(code, 1);
    assert_eq!(v["code"], 4, "{v}");
    assert!(v["msg"].as_str().unwrap().contains("FROB"), "{v}");
}

#[test]
fn del_with_neither_daemon_nor_cache_succeeds() {
    let dir = tempfile::tempdir().unwrap();
    let conf = serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "n",
        "type": "ptp",
        "ipam": {
            "type": "eniipam",
            "socket": dir.path().join("none.sock"),
            "cache_dir": dir.path().join("cache"),
            "timeout_ms": 500,
        },
    });
    let (v, code) = run(
        &[
            ("CNI_COMMAND", "DEL"),
            ("CNI_CONTAINERID", "gone"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", "/opt/cni/bin"),
        ],
        &conf.to_string(),
    );
    assert_eq!(code, 0, "{v}");
    assert_eq!(v, serde_json::Value::Null);
}

#[test]
fn its_log_to_the_runtime_is_plain_text() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_eniipam"))
        .env_clear()
        .env("CNI_COMMAND", "FROB")
        .env("ENIIPAM_CNI_LOG", "debug")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(br#"{"cniVersion":"1.0.0","name":"n","type":"eniipam"}"#)
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("FROB"), "{stderr}");
    assert!(
        !stderr.contains('\u{1b}'),
        "ANSI escapes in piped logs: {stderr:?}"
    );
}
