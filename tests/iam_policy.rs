//! Issue 14, IAM: the policy `eniipamctl iam-policy` prints grants exactly the EC2 actions eniipamd
//! calls, and its conditions hold for what eniipamd sends.
//!
//! - Static: every `aws_sdk_ec2` operation called in `crates/cloud/src/ec2/` (the only module that
//!   holds the SDK client) is an action of the policy, and the policy has no other action: actions reached
//!   only on rare paths (an ambiguous retry's describe, assigning a named IP) count too.
//! - Dynamic: the real daemon on mockcloud goes through create ENI, assign, unassign, release
//!   (detach + delete), the leaked-ENI collector (delete + stamping a creation tag) and a reconcile;
//!   every action mockcloud saw is in the policy, and the ENIs it created carry exactly the tag keys
//!   the policy's `aws:TagKeys` allows, with the owner and cluster values its conditions require.
//! - `deploy/iam-policy.json` is `eniipamctl iam-policy --cluster my-cluster --vpc-id
//!   vpc-0123456789abcdef0`.

mod bins;
#[path = "daemon_support/mod.rs"]
mod daemon_support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use daemon_support::*;
use eniipam::cloud::tags;
use mockcloud::MockCloud;
use serde_json::Value;

const CLUSTER: &str = "iam-test";

/// The VPC `deploy/iam-policy.json` is generated for.
const SHIPPED_VPC: &str = "vpc-0123456789abcdef0";

/// `eniipamctl iam-policy --cluster <cluster> --vpc-id vpc-0123456789abcdef0` as JSON.
fn policy(cluster: &str) -> Value {
    policy_in(cluster, SHIPPED_VPC)
}

/// `eniipamctl iam-policy --cluster <cluster> --vpc-id <vpc>` as JSON.
fn policy_in(cluster: &str, vpc: &str) -> Value {
    let out = std::process::Command::new(bins::target_bin("eniipamctl"))
        .args(["iam-policy", "--cluster", cluster, "--vpc-id", vpc])
        .output()
        .expect("eniipamctl runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the policy is JSON")
}

fn strings(v: &Value) -> Vec<String> {
    match v {
        Value::String(s) => vec![s.clone()],
        Value::Array(a) => a
            .iter()
            .map(|x| x.as_str().expect("a string").to_owned())
            .collect(),
        other => panic!("not a string or list: {other}"),
    }
}

fn statements(p: &Value) -> &Vec<Value> {
    p["Statement"].as_array().expect("Statement list")
}

/// The policy's actions without the `ec2:` prefix.
fn policy_actions(p: &Value) -> BTreeSet<String> {
    statements(p)
        .iter()
        .flat_map(|s| strings(&s["Action"]))
        .map(|a| {
            a.strip_prefix("ec2:")
                .unwrap_or_else(|| panic!("{a}: not an EC2 action"))
                .to_owned()
        })
        .collect()
}

fn statement<'a>(p: &'a Value, sid: &str) -> &'a Value {
    statements(p)
        .iter()
        .find(|s| s["Sid"] == sid)
        .unwrap_or_else(|| panic!("no statement {sid}"))
}

/// `snake_case` SDK operation → `PascalCase` EC2 action.
fn action_name(op: &str) -> String {
    op.split('_')
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect()
}

/// Every operation called on the SDK client (`<…>.client.<operation>()`, whitespace allowed) in
/// `crates/cloud/src/ec2/`.
fn sdk_calls_in_the_code() -> BTreeSet<String> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(CLOUD_EC2);
    let mut calls = BTreeSet::new();
    for entry in std::fs::read_dir(&dir).expect(CLOUD_EC2) {
        let path = entry.expect("entry").path();
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let code = std::fs::read_to_string(&path).expect("read");
        let mut rest = code.as_str();
        while let Some(i) = rest.find(".client") {
            rest = &rest[i + ".client".len()..];
            let after = rest.trim_start();
            let Some(after) = after.strip_prefix('.') else {
                continue;
            };
            let op: String = after
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if after[op.len()..].starts_with("()") && !op.is_empty() {
                calls.insert(action_name(&op));
            }
        }
    }
    calls
}

/// Where the EC2 client lives: the cloud crate's `ec2` module.
const CLOUD_EC2: &str = "crates/cloud/src/ec2";

/// No module of the daemon (`src/`) or of its crates (`crates/`) but `crates/cloud/src/ec2/` names
/// the SDK client, so the scan above sees every call.
fn sdk_client_only_in_cloud_ec2() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let ec2 = root.join(CLOUD_EC2);
    let mut stack = vec![root.join("src"), root.join("crates")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") && !path.starts_with(&ec2) {
                let code = std::fs::read_to_string(&path).expect("read");
                assert!(
                    !code.contains("aws_sdk_ec2::Client"),
                    "{} uses the EC2 client directly: the static scan only reads {CLOUD_EC2}/",
                    path.display()
                );
            }
        }
    }
}

#[test]
fn the_policy_grants_exactly_the_sdk_calls_in_the_code() {
    sdk_client_only_in_cloud_ec2();
    let code = sdk_calls_in_the_code();
    assert!(
        code.contains("CreateNetworkInterface") && code.contains("DescribeInstances"),
        "the scan found the calls: {code:?}"
    );
    let granted = policy_actions(&policy(CLUSTER));
    assert_eq!(
        granted, code,
        "the policy must grant exactly what {CLOUD_EC2}/ calls"
    );
}

#[test]
fn the_shipped_policy_is_the_generated_one() {
    let shipped: Value = serde_json::from_str(
        &std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/iam-policy.json"),
        )
        .expect("deploy/iam-policy.json"),
    )
    .expect("JSON");
    assert_eq!(
        shipped,
        policy("my-cluster"),
        "regenerate it: cargo run -p eniipamctl -- iam-policy --cluster my-cluster \
         --vpc-id vpc-0123456789abcdef0 > deploy/iam-policy.json"
    );
}

#[test]
fn the_policy_tag_keys_are_the_daemons() {
    let p = policy(CLUSTER);
    let create = statement(&p, "CreateEniTaggedForThisCluster");
    let keys: BTreeSet<String> =
        strings(&create["Condition"]["ForAllValues:StringEquals"]["aws:TagKeys"])
            .into_iter()
            .collect();
    let daemon: BTreeSet<String> = [
        tags::OWNER,
        tags::CLUSTER,
        tags::INSTANCE_ID,
        tags::CREATED_AT,
        tags::AWS_VPC_CNI_NO_MANAGE,
        eniipam::cloud::lifecycle::NETWORK_TAG,
    ]
    .into_iter()
    .map(str::to_owned)
    .collect();
    assert_eq!(keys, daemon);
    let stamp = statement(&p, "StampCreatedAtOnThisClustersEnis");
    assert_eq!(
        strings(&stamp["Condition"]["ForAllValues:StringEquals"]["aws:TagKeys"]),
        [tags::CREATED_AT]
    );
}

async fn mock() -> MockCloud {
    // t3.small: 3 ENIs × 4 IPs, so a handful of pods needs a second secondary ENI.
    MockCloud::start(mockcloud::Config {
        default_instance_type: "t3.small".into(),
        ..mockcloud::Config::fast()
    })
    .await
    .expect("mockcloud")
}

/// A leaked ENI of this cluster (available, tagged as eniipam tags its own), created behind the
/// daemon's back (not through the EC2 API, so not in the call log).
fn leak(mock: &MockCloud, created_at: Option<&str>) -> String {
    let world = mock.default_world().expect("default world");
    let mut t = BTreeMap::from([
        (tags::OWNER.to_owned(), tags::OWNER_VALUE.to_owned()),
        (tags::CLUSTER.to_owned(), CLUSTER.to_owned()),
        (
            tags::INSTANCE_ID.to_owned(),
            world.instance.instance_id.clone(),
        ),
    ]);
    if let Some(at) = created_at {
        t.insert(tags::CREATED_AT.to_owned(), at.to_owned());
    }
    eni_behind_the_daemons_back(
        mock,
        &world.subnet_id,
        &world.security_group_id,
        "leaked",
        t,
    )
}

/// An ENI created in mockcloud's world directly (not through the EC2 API: no IAM check, not in the
/// call log), in `subnet` with `group`, tagged `tags`; its id.
fn eni_behind_the_daemons_back(
    mock: &MockCloud,
    subnet: &str,
    group: &str,
    description: &str,
    tags: BTreeMap<String, String>,
) -> String {
    mock.with_world(|w, now| {
        w.create_network_interface(
            &mockcloud::world::CreateEniArgs {
                subnet_id: subnet.to_owned(),
                security_groups: vec![group.to_owned()],
                description: description.into(),
                tags,
                ..Default::default()
            },
            now,
        )
    })
    .unwrap_or_else(|e| panic!("creating the {description} ENI: {e:?}"))
    .id
}

async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    for _ in 0..300 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_daemon_calls_only_what_the_policy_grants() {
    let mock = mock().await;
    let dir = TempDir::new("iam");
    let old =
        humantime::format_rfc3339_seconds(std::time::SystemTime::now() - Duration::from_secs(3600))
            .to_string();
    let leaked_old = leak(&mock, Some(&old));
    let leaked_untimed = leak(&mock, None);
    let config = eniipam::config::DaemonConfig {
        cluster_name: CLUSTER.into(),
        min_idle: 0,
        max_idle: 0,
        reuse_cooldown_secs: 0,
        leaked_eni_grace_secs: 60,
        leaked_eni_period_secs: 10,
        // The ENI lifecycle is what is exercised: no pod on eth0.
        use_primary_eni: false,
        ..config(&mock, &dir.0)
    };
    // config() enforced the shipped policy for its own cluster name: this daemon's is CLUSTER.
    mock.enforce_shipped_policy(CLUSTER);
    let d = start(config).await;

    // Create ENIs and assign: 5 pods need both secondary ENIs (3 IPs each).
    let mut c = client(&d.socket_path).await;
    for i in 0..5 {
        c.allocate(alloc_req(&format!("c{i}"), &format!("p{i}")))
            .await
            .expect("allocate");
    }
    let ours = |m: &MockCloud| -> Vec<mockcloud::world::EniView> {
        m.network_interfaces()
            .into_iter()
            .filter(|e| e.tags.get(tags::OWNER).map(String::as_str) == Some(tags::OWNER_VALUE))
            .filter(|e| e.attachment.is_some())
            .collect()
    };
    assert_eq!(ours(&mock).len(), 2, "two ENIs created");
    // Issue 44: the shipped policy lets DeleteOnTermination through (EC2 authorizes the instance
    // and the subnet too), so the ENIs go with the node.
    for e in ours(&mock) {
        assert!(
            e.attachment.is_some_and(|a| a.delete_on_termination),
            "{} is attached without DeleteOnTermination: {:?}",
            e.id,
            mock.iam_denials()
        );
    }
    let created_tags: Vec<BTreeMap<String, String>> =
        ours(&mock).into_iter().map(|e| e.tags).collect();

    // Unassign and release ENIs: every pod goes, the pool gives everything back.
    for i in 0..5 {
        c.release(release_req(&format!("c{i}"), false))
            .await
            .expect("release");
    }
    for _ in 0..100 {
        d.pool.maintain_now().await.expect("maintain");
        if ours(&mock).is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        ours(&mock).is_empty(),
        "the empty ENIs were detached and deleted: {:?}",
        ours(&mock)
    );

    // The leaked-ENI collector: deletes the old one, stamps a creation time on the untimed one.
    eventually("the collector to delete the old leaked ENI", || {
        !mock.network_interfaces().iter().any(|e| e.id == leaked_old)
    })
    .await;
    eventually("the collector to stamp the untimed ENI", || {
        mock.network_interfaces()
            .iter()
            .any(|e| e.id == leaked_untimed && e.tags.contains_key(tags::CREATED_AT))
    })
    .await;

    d.reconcile_now().await.expect("reconcile");
    d.shutdown().await;

    let called: BTreeSet<String> = mock.call_log().into_iter().map(|r| r.action).collect();
    for needed in [
        "CreateNetworkInterface",
        "AttachNetworkInterface",
        "ModifyNetworkInterfaceAttribute",
        "DetachNetworkInterface",
        "DeleteNetworkInterface",
        "UnassignPrivateIpAddresses",
        "CreateTags",
        "DescribeNetworkInterfaces",
    ] {
        assert!(
            called.contains(needed),
            "the scenario did not reach {needed}: {called:?}"
        );
    }
    let p = policy(CLUSTER);
    let granted = policy_actions(&p);
    let denied: Vec<&String> = called.difference(&granted).collect();
    assert!(
        denied.is_empty(),
        "eniipamd called {denied:?}, which the policy does not grant"
    );
    let code = sdk_calls_in_the_code();
    assert!(
        called.is_subset(&code),
        "mockcloud saw calls the static scan missed: {:?}",
        called.difference(&code).collect::<Vec<_>>()
    );

    // The create condition holds for what eniipamd sent: only allowed keys, owner and cluster set.
    let create = statement(&p, "CreateEniTaggedForThisCluster");
    let allowed: BTreeSet<String> =
        strings(&create["Condition"]["ForAllValues:StringEquals"]["aws:TagKeys"])
            .into_iter()
            .collect();
    let required = create["Condition"]["StringEquals"]
        .as_object()
        .expect("StringEquals");
    for t in &created_tags {
        let keys: BTreeSet<String> = t.keys().cloned().collect();
        assert!(
            keys.is_subset(&allowed),
            "a created ENI has tag keys the policy refuses: {keys:?} vs {allowed:?}"
        );
        for (cond, want) in required {
            let key = cond
                .strip_prefix("aws:RequestTag/")
                .expect("a request-tag condition");
            assert_eq!(t.get(key).map(String::as_str), want.as_str(), "{cond}");
        }
    }
    // The stamp: only eniipam.io/created-at was added to an ENI tagged for this cluster.
    let stamped = mock
        .network_interfaces()
        .into_iter()
        .find(|e| e.id == leaked_untimed)
        .expect("the untimed ENI is still there (too young now)");
    assert_eq!(
        stamped.tags.get(tags::CLUSTER).map(String::as_str),
        Some(CLUSTER)
    );
}

// ---- Issue 23: the policy enforced (mockcloud evaluates every call as IAM does) ----

/// `eniipamctl iam-policy` for `cluster` in `mock`'s VPC, as mockcloud enforces it; the instances
/// are tagged as the cluster's nodes (`kubernetes.io/cluster/<cluster>=owned`), as the policy
/// requires for attach, detach and DeleteOnTermination.
fn enforced(mock: &MockCloud, cluster: &str) -> mockcloud::iam::Policy {
    mock.tag_nodes(&BTreeMap::from([mockcloud::iam::node_tag(cluster)]));
    let vpc = mock.default_world().expect("default world").vpc_id;
    mockcloud::iam::Policy::from_value(&policy_in(cluster, &vpc)).expect("the policy parses")
}

/// Pods on eth0 and on two new ENIs, all at once; every pod released; the pool gives every address
/// back and releases both ENIs; `policy` enforced throughout. Returns the actions mockcloud saw.
async fn burst_give_back_and_release(
    mock: &MockCloud,
    dir: &TempDir,
    policy: mockcloud::iam::Policy,
) -> BTreeSet<String> {
    let config = eniipam::config::DaemonConfig {
        cluster_name: CLUSTER.into(),
        // What this test changes from the defaults only lets give-back and ENI release happen
        // within the test: no warm pool to keep, no cooldown to wait out. use_primary_eni, the
        // default the shipped policy used to break, stays on.
        min_idle: 0,
        max_idle: 0,
        reuse_cooldown_secs: 0,
        ..config(mock, &dir.0)
    };
    mock.set_iam_policy(Some(policy));
    let d = start(config).await;
    assert!(
        eniipam::config::DaemonConfig::default().use_primary_eni,
        "eth0 serves pods by default"
    );
    // t3.small: eth0 and two secondary ENIs, 3 pod IPs each: 8 pods need all three.
    let mut set = tokio::task::JoinSet::new();
    for i in 0..8 {
        let mut c = client(&d.socket_path).await;
        set.spawn(async move {
            c.allocate(alloc_req(&format!("c{i}"), &format!("p{i}")))
                .await
                .map(|r| r.into_inner())
        });
    }
    let mut enis = BTreeSet::new();
    while let Some(r) = set.join_next().await {
        let reply = r.unwrap().expect("every pod of the burst is served");
        enis.insert(reply.eni_id);
    }
    let eth0 = mock.default_instance().primary_eni;
    assert!(enis.contains(&eth0), "eth0 served pods: {enis:?}");
    assert_eq!(enis.len(), 3, "eth0 and two new ENIs: {enis:?}");
    // Issue 44: both go with the node when it is terminated.
    for e in mock.network_interfaces() {
        if let Some(a) = e.attachment.filter(|_| enis.contains(&e.id)) {
            assert!(
                a.delete_on_termination,
                "{} is attached without DeleteOnTermination",
                e.id
            );
        }
    }

    let mut c = client(&d.socket_path).await;
    for i in 0..8 {
        c.release(release_req(&format!("c{i}"), false))
            .await
            .expect("release");
    }
    let secondary = |m: &MockCloud| -> usize {
        m.network_interfaces()
            .iter()
            .filter(|e| e.attachment.is_some())
            .map(|e| e.secondary_ips.len() + e.ipv4_prefixes.len())
            .sum()
    };
    for _ in 0..100 {
        d.pool.maintain_now().await.expect("maintain");
        if mock.network_interfaces().len() == 1 && secondary(mock) == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        mock.network_interfaces().len(),
        1,
        "both new ENIs released (detached and deleted)"
    );
    assert_eq!(secondary(mock), 0, "every address given back, eth0's too");
    d.reconcile_now().await.expect("reconcile");
    d.shutdown().await;
    mock.call_log().into_iter().map(|r| r.action).collect()
}

/// The real daemon, default configuration, with the policy `eniipamctl iam-policy` prints enforced by
/// mockcloud: a cold burst on eth0 and two new ENIs, give-back and ENI release make no call the
/// policy refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_daemon_makes_no_call_the_enforced_policy_refuses() {
    let mock = mock().await;
    let dir = TempDir::new("iam-enforced");
    let called = burst_give_back_and_release(&mock, &dir, enforced(&mock, CLUSTER)).await;
    for needed in [
        "AssignPrivateIpAddresses",
        "UnassignPrivateIpAddresses",
        "CreateNetworkInterface",
        "AttachNetworkInterface",
        "ModifyNetworkInterfaceAttribute",
        "DetachNetworkInterface",
        "DeleteNetworkInterface",
    ] {
        assert!(
            called.contains(needed),
            "not exercised: {needed} ({called:?})"
        );
    }
    assert_eq!(
        mock.iam_denials(),
        vec![],
        "the enforced policy refused calls of the default daemon"
    );
}

/// What the fix is: without the VPC-scoped statement (the policy as shipped before issue 23), EC2
/// refuses the default daemon's assign on eth0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_vpc_statement_eth0_is_refused() {
    let mock = mock().await;
    let vpc = mock.default_world().unwrap().vpc_id;
    let mut p = policy_in(CLUSTER, &vpc);
    p["Statement"]
        .as_array_mut()
        .unwrap()
        .retain(|s| s["Sid"] != "AssignAndUnassignOnThisVpcsEnis");
    let dir = TempDir::new("iam-old");
    let config = eniipam::config::DaemonConfig {
        cluster_name: CLUSTER.into(),
        ..config(&mock, &dir.0)
    };
    mock.set_iam_policy(Some(mockcloud::iam::Policy::from_value(&p).unwrap()));
    let d = start(config).await;
    let mut c = client(&d.socket_path).await;
    let _ = tokio::time::timeout(Duration::from_secs(10), c.allocate(alloc_req("c0", "p0"))).await;
    let eth0 = mock.default_instance().primary_eni;
    let denied: Vec<_> = mock
        .iam_denials()
        .into_iter()
        .filter(|d| d.action == "ec2:AssignPrivateIpAddresses" && d.resource.ends_with(&eth0))
        .collect();
    assert!(!denied.is_empty(), "eth0's assign was not refused");
    d.shutdown().await;
}

/// An SDK client with the daemon's credentials.
async fn sdk(mock: &MockCloud) -> aws_sdk_ec2::Client {
    let conf = aws_sdk_ec2::Config::builder()
        .behavior_version(aws_sdk_ec2::config::BehaviorVersion::latest())
        .region(aws_sdk_ec2::config::Region::new("us-east-1"))
        .endpoint_url(mock.ec2_url())
        .credentials_provider(aws_sdk_ec2::config::Credentials::new(
            "a", "b", None, None, "test",
        ))
        .build();
    aws_sdk_ec2::Client::from_conf(conf)
}

/// The daemon's view of an EC2 error: `UnauthorizedOperation`, naming the missing permission.
fn refused<E>(
    api: &str,
    r: Result<
        impl std::fmt::Debug,
        aws_sdk_ec2::error::SdkError<E, aws_smithy_runtime_api::http::Response>,
    >,
) -> String
where
    E: aws_sdk_ec2::error::ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let err = r.expect_err("EC2 refuses it");
    let e = eniipam::cloud::ec2::classify(api, err);
    assert!(
        matches!(e, eniipam::cloud::CloudError::Unauthorized { .. }),
        "{api}: {e}"
    );
    let text = e.to_string();
    assert!(
        text.contains(&format!("the IAM role needs ec2:{api}")),
        "{text}"
    );
    text
}

/// What the policy refuses: deleting, detaching or modifying eth0, and touching an ENI tagged for
/// another cluster in the same VPC (an explicit Deny), or any ENI of another VPC.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eth0_deletion_and_other_clusters_enis_are_refused() {
    let mock = mock().await;
    mock.set_iam_policy(Some(enforced(&mock, CLUSTER)));
    let ec2 = sdk(&mock).await;
    let world = mock.default_world().unwrap();
    let eth0 = world.instance.primary_eni.clone();

    refused(
        "DeleteNetworkInterface",
        ec2.delete_network_interface()
            .network_interface_id(&eth0)
            .send()
            .await,
    );
    refused(
        "ModifyNetworkInterfaceAttribute",
        ec2.modify_network_interface_attribute()
            .network_interface_id(&eth0)
            .source_dest_check(
                aws_sdk_ec2::types::AttributeBooleanValue::builder()
                    .value(false)
                    .build(),
            )
            .send()
            .await,
    );
    let attachment = mock
        .network_interfaces()
        .into_iter()
        .find(|e| e.id == eth0)
        .and_then(|e| e.attachment)
        .expect("eth0 is attached")
        .id;
    refused(
        "DetachNetworkInterface",
        ec2.detach_network_interface()
            .attachment_id(&attachment)
            .send()
            .await,
    );
    // eth0's assign is allowed: the VPC statement.
    ec2.assign_private_ip_addresses()
        .network_interface_id(&eth0)
        .secondary_private_ip_address_count(1)
        .send()
        .await
        .expect("assign on eth0 is allowed");
    // So is an IPv6 node's /80 (ip_family ipv6 or dual), and giving it back.
    let v6 = ec2
        .assign_ipv6_addresses()
        .network_interface_id(&eth0)
        .ipv6_prefix_count(1)
        .send()
        .await
        .expect("an IPv6 prefix on eth0 is allowed");
    ec2.unassign_ipv6_addresses()
        .network_interface_id(&eth0)
        .set_ipv6_prefixes(Some(v6.assigned_ipv6_prefixes().to_vec()))
        .send()
        .await
        .expect("giving eth0's IPv6 prefix back is allowed");

    // Another cluster's ENI in the same VPC, tagged as eniipam tags its own.
    let other = eni_behind_the_daemons_back(
        &mock,
        &world.subnet_id,
        &world.security_group_id,
        "another cluster's",
        BTreeMap::from([
            (tags::OWNER.to_owned(), tags::OWNER_VALUE.to_owned()),
            (tags::CLUSTER.to_owned(), "other-cluster".to_owned()),
        ]),
    );
    refused(
        "AssignPrivateIpAddresses",
        ec2.assign_private_ip_addresses()
            .network_interface_id(&other)
            .secondary_private_ip_address_count(1)
            .send()
            .await,
    );
    refused(
        "AssignIpv6Addresses",
        ec2.assign_ipv6_addresses()
            .network_interface_id(&other)
            .ipv6_prefix_count(1)
            .send()
            .await,
    );
    refused(
        "DeleteNetworkInterface",
        ec2.delete_network_interface()
            .network_interface_id(&other)
            .send()
            .await,
    );
    assert!(
        mock.iam_denials()
            .iter()
            .any(|d| d.resource.ends_with(&other) && d.explicit),
        "another cluster's ENI is refused by the explicit Deny: {:?}",
        mock.iam_denials()
    );

    // An untagged ENI in another VPC: eth0's statement does not reach it.
    let (vpc2, _) = mock.create_vpc("10.9.0.0/16".parse().unwrap()).unwrap();
    let sg2 = mock.create_security_group(&vpc2).unwrap();
    let subnet2 = mock
        .create_subnet(&vpc2, "10.9.0.0/24".parse().unwrap(), "us-east-1a")
        .unwrap();
    let foreign =
        eni_behind_the_daemons_back(&mock, &subnet2, &sg2, "another VPC's", BTreeMap::new());
    refused(
        "AssignPrivateIpAddresses",
        ec2.assign_private_ip_addresses()
            .network_interface_id(&foreign)
            .secondary_private_ip_address_count(1)
            .send()
            .await,
    );
    // Creating an ENI without our tags is refused too.
    refused(
        "CreateNetworkInterface",
        ec2.create_network_interface()
            .subnet_id(&world.subnet_id)
            .send()
            .await,
    );
}
