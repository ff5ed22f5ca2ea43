use super::*;
use std::collections::HashMap;

fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[tokio::test]
async fn version_needs_no_config() {
    let out = run(&env(&[("CNI_COMMAND", "VERSION")]), b"").await;
    assert_eq!(out.exit_code, 0);
    let v: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(v["cniVersion"], "1.1.0");
    assert_eq!(v["supportedVersions"].as_array().unwrap().len(), 3);
    let out = run(
        &env(&[("CNI_COMMAND", "VERSION")]),
        br#"{"cniVersion":"0.4.0"}"#,
    )
    .await;
    let v: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(v["cniVersion"], "0.4.0");
}

#[tokio::test]
async fn errors_are_written_in_the_config_version() {
    let conf = br#"{"cniVersion":"0.4.0","name":"n","type":"eniipam"}"#;
    let out = run(&env(&[("CNI_COMMAND", "ADD")]), conf).await;
    assert_eq!(out.exit_code, 1);
    let v: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(v["cniVersion"], "0.4.0");
    assert_eq!(v["code"], 4);
}

#[tokio::test]
async fn status_without_a_daemon_is_not_available() {
    let dir = tempfile::tempdir().unwrap();
    let conf = serde_json::json!({"cniVersion": "1.1.0", "name": "n", "type": "eniipam",
        "socket": dir.path().join("absent.sock"), "timeout_ms": 500});
    let out = run(
        &env(&[("CNI_COMMAND", "STATUS")]),
        conf.to_string().as_bytes(),
    )
    .await;
    let v: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(v["code"], 50, "{v}");
}

#[tokio::test]
async fn gc_without_valid_attachments_is_refused() {
    let conf = br#"{"cniVersion":"1.1.0","name":"n","type":"eniipam"}"#;
    let out = run(&env(&[("CNI_COMMAND", "GC")]), conf).await;
    let v: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(v["code"], 7);
}
