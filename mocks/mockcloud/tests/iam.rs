//! IAM through the real `aws-sdk-ec2` client: the shipped policy (deploy/iam-policy.json) for one
//! cluster and the default world's VPC, EC2's `UnauthorizedOperation` answer and its encoded message,
//! condition semantics, per-caller policies and run-time swaps through the control API.

use aws_sdk_ec2::Client;
use aws_sdk_ec2::config::{Credentials, Region};
use aws_sdk_ec2::error::ProvideErrorMetadata;
use aws_sdk_ec2::types::{ResourceType, Tag, TagSpecification};
use mockcloud::iam::{Policy, shipped_policy};
use mockcloud::{Bucket, Config, MockCloud, Throttling};

mod support;

const CLUSTER: &str = "c1";

fn client_as(mock: &MockCloud, access_key: &str) -> Client {
    let conf = aws_sdk_ec2::Config::builder()
        .behavior_version(aws_config::BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .endpoint_url(mock.ec2_url())
        .credentials_provider(Credentials::new(access_key, "secret", None, None, "test"))
        .retry_config(aws_config::retry::RetryConfig::disabled())
        .build();
    Client::from_conf(conf)
}

fn spec(pairs: &[(&str, &str)]) -> TagSpecification {
    let mut b = TagSpecification::builder().resource_type(ResourceType::NetworkInterface);
    for (k, v) in pairs {
        b = b.tags(Tag::builder().key(*k).value(*v).build());
    }
    b.build()
}

fn tag(k: &str, v: &str) -> Tag {
    Tag::builder().key(k).value(v).build()
}

const OURS: &[(&str, &str)] = &[
    ("eniipam.io/cluster", CLUSTER),
    ("eniipam.io/owner", "eniipam"),
    ("eniipam.io/instance-id", "i-0123"),
    ("eniipam.io/created-at", "2024-01-01T00:00:00Z"),
];

/// (code, message) of a failed call, panicking on success.
fn failure<T: std::fmt::Debug, E: ProvideErrorMetadata + std::fmt::Debug>(
    r: Result<T, E>,
) -> (String, String) {
    let e = r.expect_err("the call should fail");
    (
        e.code().unwrap_or("<no code>").to_owned(),
        e.message().unwrap_or_default().to_owned(),
    )
}

fn denied<T: std::fmt::Debug, E: ProvideErrorMetadata + std::fmt::Debug>(
    r: Result<T, E>,
) -> String {
    let (code, message) = failure(r);
    assert_eq!(code, "UnauthorizedOperation", "{message}");
    message
}

async fn create(c: &Client, subnet: &str, tags: &[(&str, &str)]) -> Result<String, String> {
    let mut req = c.create_network_interface().subnet_id(subnet);
    if !tags.is_empty() {
        req = req.tag_specifications(spec(tags));
    }
    req.send()
        .await
        .map(|o| o.network_interface.unwrap().network_interface_id.unwrap())
        .map_err(|e| {
            format!(
                "{}: {}",
                e.code().unwrap_or_default(),
                e.message().unwrap_or_default()
            )
        })
}

/// A world for the shipped policy: eth0 (untagged), one of our ENIs, one of another cluster's, and
/// an ENI in another VPC; then the shipped policy for `CLUSTER` and the default VPC, the instance
/// tagged as the cluster's node.
struct World {
    mock: MockCloud,
    c: Client,
    eth0: String,
    eth0_attachment: String,
    subnet: String,
    ours: String,
    foreign: String,
    elsewhere: String,
}

async fn world() -> World {
    let mock = support::fast().await;
    let d = mock.default_world().unwrap();
    let c = support::ec2(&mock);
    let ours = create(&c, &d.subnet_id, OURS).await.unwrap();
    let foreign = create(
        &c,
        &d.subnet_id,
        &[
            ("eniipam.io/cluster", "other"),
            ("eniipam.io/owner", "eniipam"),
        ],
    )
    .await
    .unwrap();
    let (vpc2, _) = mock.create_vpc("10.1.0.0/16".parse().unwrap()).unwrap();
    let subnet2 = mock
        .create_subnet(&vpc2, "10.1.0.0/20".parse().unwrap(), "us-east-1a")
        .unwrap();
    let elsewhere = create(&c, &subnet2, &[]).await.unwrap();
    let eth0 = d.instance.primary_eni.clone();
    let eth0_attachment = mock
        .network_interfaces()
        .into_iter()
        .find(|e| e.id == eth0)
        .and_then(|e| e.attachment)
        .unwrap()
        .id;
    mock.enforce_shipped_policy(CLUSTER).unwrap();
    World {
        c,
        eth0,
        eth0_attachment,
        subnet: d.subnet_id,
        ours,
        foreign,
        elsewhere,
        mock,
    }
}

#[tokio::test]
async fn shipped_policy_on_eth0_and_other_clusters_enis() {
    let w = world().await;
    let c = &w.c;
    // Assign and unassign on eth0 (no tags of ours, but in the cluster's VPC).
    let out = c
        .assign_private_ip_addresses()
        .network_interface_id(&w.eth0)
        .secondary_private_ip_address_count(1)
        .send()
        .await
        .expect("assign on eth0");
    let ip = out.assigned_private_ip_addresses()[0]
        .private_ip_address()
        .unwrap()
        .to_owned();
    c.unassign_private_ip_addresses()
        .network_interface_id(&w.eth0)
        .private_ip_addresses(&ip)
        .send()
        .await
        .expect("unassign on eth0");
    // Delete / detach / modify eth0: no statement allows them on an untagged ENI.
    let m = denied(
        c.delete_network_interface()
            .network_interface_id(&w.eth0)
            .send()
            .await,
    );
    assert!(
        m.contains("because no identity-based policy allows the ec2:DeleteNetworkInterface action"),
        "{m}"
    );
    let m = denied(
        c.detach_network_interface()
            .attachment_id(&w.eth0_attachment)
            .send()
            .await,
    );
    assert!(
        m.contains(&format!("network-interface/{}", w.eth0)),
        "the instance is allowed, the ENI not: {m}"
    );
    denied(support::set_description(c, &w.eth0).send().await);
    // Another cluster's ENI in the same VPC: the explicit Deny wins over the VPC-wide Allow.
    let m = denied(
        c.assign_private_ip_addresses()
            .network_interface_id(&w.foreign)
            .secondary_private_ip_address_count(1)
            .send()
            .await,
    );
    assert!(
        m.contains("with an explicit deny in an identity-based policy"),
        "{m}"
    );
    denied(
        c.delete_network_interface()
            .network_interface_id(&w.foreign)
            .send()
            .await,
    );
    // Our own ENI: everything the daemon does.
    c.assign_private_ip_addresses()
        .network_interface_id(&w.ours)
        .secondary_private_ip_address_count(2)
        .send()
        .await
        .expect("assign on ours");
    // An ENI in another VPC.
    denied(
        c.assign_private_ip_addresses()
            .network_interface_id(&w.elsewhere)
            .secondary_private_ip_address_count(1)
            .send()
            .await,
    );
    // Describe is allowed; a missing ENI is still EC2's NotFound, not hidden behind IAM.
    c.describe_network_interfaces()
        .send()
        .await
        .expect("describe");
    let (code, _) = failure(
        c.delete_network_interface()
            .network_interface_id("eni-0ffffffffffffffff")
            .send()
            .await,
    );
    assert_eq!(code, "InvalidNetworkInterfaceID.NotFound");
    c.delete_network_interface()
        .network_interface_id(&w.ours)
        .send()
        .await
        .expect("delete ours");
    // Denied calls are errors in the counters and the call log, and listed as denials.
    let counters = w.mock.counters();
    let errors = &counters.actions["DeleteNetworkInterface"].errors;
    assert_eq!(errors.get("UnauthorizedOperation"), Some(&2), "{errors:?}");
    assert!(
        w.mock
            .call_log()
            .iter()
            .any(|r| r.outcome == "UnauthorizedOperation")
    );
    let denials = w.mock.iam_denials();
    assert_eq!(denials.len(), 6, "{denials:#?}");
    let explicit: Vec<_> = denials
        .iter()
        .filter(|d| d.explicit)
        .map(|d| d.action.as_str())
        .collect();
    assert_eq!(
        explicit,
        ["ec2:AssignPrivateIpAddresses", "ec2:DeleteNetworkInterface"]
    );
    assert!(denials.iter().all(|d| d.access_key_id == "AKIDMOCKCLOUD"));
    // Nothing denied was performed: eth0 is still there, attached.
    assert!(
        w.mock
            .network_interfaces()
            .iter()
            .any(|e| e.id == w.eth0 && e.attachment.is_some())
    );
}

#[tokio::test]
async fn shipped_policy_on_creation_and_tags() {
    let w = world().await;
    let c = &w.c;
    let new = create(c, &w.subnet, OURS)
        .await
        .expect("create with our tags");
    for (bad, why) in [
        (
            vec![("eniipam.io/owner", "eniipam")],
            "without the cluster tag",
        ),
        (
            vec![
                ("eniipam.io/cluster", CLUSTER),
                ("eniipam.io/owner", "eniipam"),
                ("team", "blue"),
            ],
            "with a key not in the list",
        ),
        (
            vec![
                ("eniipam.io/cluster", "other"),
                ("eniipam.io/owner", "eniipam"),
            ],
            "for another cluster",
        ),
        (vec![], "untagged"),
    ] {
        let e = create(c, &w.subnet, &bad).await.expect_err(why);
        assert!(e.starts_with("UnauthorizedOperation: "), "{why}: {e}");
        assert!(e.contains("ec2:CreateNetworkInterface on resource: arn:aws:ec2:us-east-1:123456789012:network-interface/*"), "{why}: {e}");
    }
    // The stamp of created-at on our ENI; any other key is refused.
    c.create_tags()
        .resources(&new)
        .tags(tag("eniipam.io/created-at", "2024-02-02T00:00:00Z"))
        .send()
        .await
        .expect("stamp created-at");
    let m = denied(
        c.create_tags()
            .resources(&new)
            .tags(tag("team", "blue"))
            .send()
            .await,
    );
    assert!(m.contains("ec2:CreateTags"), "{m}");
    denied(
        c.create_tags()
            .resources(&w.foreign)
            .tags(tag("eniipam.io/created-at", "x"))
            .send()
            .await,
    );
    // Only the shipped policy's ENIs were created: the denied creations left nothing behind.
    let mine = w
        .mock
        .network_interfaces()
        .iter()
        .filter(|e| e.subnet_id == w.subnet)
        .count();
    assert_eq!(mine, 4, "eth0, ours, foreign and the new one");
}

/// Attaches `eni` to the default instance at `device_index`; the attachment id.
async fn attach(w: &World, eni: &str, device_index: i32) -> Result<String, String> {
    let instance = w.mock.default_instance().instance_id;
    w.c.attach_network_interface()
        .network_interface_id(eni)
        .instance_id(instance)
        .device_index(device_index)
        .send()
        .await
        .map(|o| o.attachment_id.unwrap())
        .map_err(|e| e.message().unwrap_or_default().to_owned())
}

async fn set_delete_on_termination(w: &World, eni: &str, attachment: &str) -> Result<(), String> {
    w.c.modify_network_interface_attribute()
        .network_interface_id(eni)
        .attachment(
            aws_sdk_ec2::types::NetworkInterfaceAttachmentChanges::builder()
                .attachment_id(attachment)
                .delete_on_termination(true)
                .build(),
        )
        .send()
        .await
        .map(|_| ())
        .map_err(|e| {
            format!(
                "{}: {}",
                e.code().unwrap_or_default(),
                e.message().unwrap_or_default()
            )
        })
}

fn delete_on_termination(mock: &MockCloud, eni: &str) -> bool {
    mock.network_interfaces()
        .into_iter()
        .find(|e| e.id == eni)
        .and_then(|e| e.attachment)
        .is_some_and(|a| a.delete_on_termination)
}

/// Issue 44: EC2 authorizes ModifyNetworkInterfaceAttribute with an attachment on the instance and
/// the ENI's subnet too (the service authorization reference lists both). The shipped policy
/// allows DeleteOnTermination on our ENI attached to a node of the cluster; a node without the
/// cluster's tag, or a policy without the subnet, is refused, and the flag stays unset. Attach
/// and detach are scoped to the cluster's nodes the same way.
#[tokio::test]
async fn delete_on_termination_needs_the_node_and_its_subnet() {
    let w = world().await;
    let instance = w.mock.default_instance().instance_id;
    let ours = attach(&w, &w.ours, 1)
        .await
        .expect("attach ours to our node");
    set_delete_on_termination(&w, &w.ours, &ours)
        .await
        .expect("DeleteOnTermination on ours, on our node");
    assert!(delete_on_termination(&w.mock, &w.ours));

    // Another cluster's ENI on this cluster's node, under the other cluster's policy: the ENI
    // passes, the node (not tagged for c2) does not.
    let vpc = w.mock.default_world().unwrap().vpc_id;
    w.mock.set_iam_policy(None);
    let theirs = create(
        &w.c,
        &w.subnet,
        &[
            ("eniipam.io/cluster", "c2"),
            ("eniipam.io/owner", "eniipam"),
        ],
    )
    .await
    .unwrap();
    w.mock.set_iam_policy(Some(shipped_policy("c2", &vpc)));
    let m = attach(&w, &theirs, 2)
        .await
        .expect_err("the node is not c2's");
    assert!(m.contains(&format!("ec2:AttachNetworkInterface on resource: arn:aws:ec2:us-east-1:123456789012:instance/{instance}")), "{m}");
    w.mock.set_iam_policy(None);
    let attachment = attach(&w, &theirs, 2).await.expect("attach, unrestricted");
    w.mock.set_iam_policy(Some(shipped_policy("c2", &vpc)));
    let e = set_delete_on_termination(&w, &theirs, &attachment)
        .await
        .expect_err("the node is not c2's");
    assert!(e.starts_with("UnauthorizedOperation: "), "{e}");
    assert!(
        e.contains(&format!(
            "ec2:ModifyNetworkInterfaceAttribute on resource: arn:aws:ec2:us-east-1:123456789012:instance/{instance}"
        )),
        "{e}"
    );
    assert!(!delete_on_termination(&w.mock, &theirs));
    let m = denied(
        w.c.detach_network_interface()
            .attachment_id(&attachment)
            .send()
            .await,
    );
    assert!(m.contains(&format!("instance/{instance}")), "{m}");

    // The node tagged for c2 as well: allowed; without the subnet statement: refused on the subnet.
    w.mock.tag_nodes(&std::collections::BTreeMap::from([
        mockcloud::iam::node_tag("c2"),
    ]));
    let mut no_subnet = shipped_policy("c2", &vpc);
    no_subnet
        .statements
        .retain(|s| s.sid.as_deref() != Some("ModifyEnisWithThisVpcsSubnetsAndGroups"));
    w.mock.set_iam_policy(Some(no_subnet));
    let e = set_delete_on_termination(&w, &theirs, &attachment)
        .await
        .expect_err("no statement allows the subnet");
    assert!(
        e.contains(&format!(
            "on resource: arn:aws:ec2:us-east-1:123456789012:subnet/{}",
            w.subnet
        )),
        "{e}"
    );
    w.mock.set_iam_policy(Some(shipped_policy("c2", &vpc)));
    set_delete_on_termination(&w, &theirs, &attachment)
        .await
        .expect("DeleteOnTermination on c2's node");
    assert!(delete_on_termination(&w.mock, &theirs));
}

#[tokio::test]
async fn tag_on_create_needs_create_tags_with_create_action() {
    let mock = support::fast().await;
    let d = mock.default_world().unwrap();
    let c = support::ec2(&mock);
    // CreateNetworkInterface allowed, CreateTags not: a tagged creation is refused on the tags.
    let policy = shipped_policy(CLUSTER, &d.vpc_id).without_action("CreateTags");
    mock.set_iam_policy(Some(policy));
    let e = create(&c, &d.subnet_id, OURS).await.unwrap_err();
    assert!(
        e.contains(
            "ec2:CreateTags on resource: arn:aws:ec2:us-east-1:123456789012:network-interface/*"
        ),
        "{e}"
    );
}

#[tokio::test]
async fn the_encoded_message_decodes_to_the_decision() {
    let w = world().await;
    let m = denied(
        w.c.assign_private_ip_addresses()
            .network_interface_id(&w.foreign)
            .secondary_private_ip_address_count(1)
            .send()
            .await,
    );
    assert!(
        m.starts_with(
            "You are not authorized to perform this operation. User: arn:aws:sts::123456789012:assumed-role/mockcloud-node/AKIDMOCKCLOUD is not authorized to perform: ec2:AssignPrivateIpAddresses on resource: arn:aws:ec2:us-east-1:123456789012:network-interface/"
        ),
        "{m}"
    );
    let encoded = m
        .split_once("Encoded authorization failure message: ")
        .expect("an encoded message")
        .1;
    let http = reqwest::Client::new();
    for body in [
        encoded.to_owned(),
        serde_json::json!({ "EncodedMessage": encoded }).to_string(),
    ] {
        let v: serde_json::Value = http
            .post(format!("{}/iam/decode", w.mock.control_url()))
            .body(body)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(v["allowed"], false);
        assert_eq!(v["explicitDeny"], true);
        assert_eq!(v["context"]["action"], "ec2:AssignPrivateIpAddresses");
        assert_eq!(
            v["context"]["resource"],
            format!(
                "arn:aws:ec2:us-east-1:123456789012:network-interface/{}",
                w.foreign
            )
        );
        let items = v["matchedStatements"]["items"].as_array().unwrap();
        assert!(
            items
                .iter()
                .any(|i| i["statementId"] == "NeverAnotherClustersEnis" && i["effect"] == "DENY"),
            "{v}"
        );
        let conds = v["context"]["conditions"]["items"].as_array().unwrap();
        assert!(
            conds
                .iter()
                .any(|c| c["key"] == "aws:ResourceTag/eniipam.io/cluster"
                    && c["values"]["items"][0]["value"] == "other"),
            "{v}"
        );
    }
    let r = http
        .post(format!("{}/iam/decode", w.mock.control_url()))
        .body("!!!")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let denials: Vec<mockcloud::iam::Denial> = http
        .get(format!("{}/iam/denials", w.mock.control_url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(denials.len(), 1);
    assert!(
        denials[0].reason.contains("NeverAnotherClustersEnis"),
        "{denials:?}"
    );
}

fn doc(statements: serde_json::Value) -> Policy {
    Policy::parse(
        &serde_json::json!({"Version": "2012-10-17", "Statement": statements}).to_string(),
    )
    .unwrap()
}

#[tokio::test]
async fn condition_semantics_through_the_sdk() {
    let w = world().await;
    let c = &w.c;
    // Unknown operator: a denial, said in the reason.
    w.mock.set_iam_policy(Some(doc(serde_json::json!([
        {"Effect": "Allow", "Action": "ec2:*", "Resource": "*"},
        {"Sid": "Typo", "Effect": "Allow", "Action": "ec2:CreateTags", "Resource": "*",
         "Condition": {"StringEqualz": {"aws:TagKeys": "a"}}}
    ]))));
    denied(
        c.create_tags()
            .resources(&w.ours)
            .tags(tag("a", "1"))
            .send()
            .await,
    );
    let last = w.mock.iam_denials().pop().unwrap();
    assert!(
        last.reason
            .contains("unknown condition operator \"StringEqualz\""),
        "{last:?}"
    );
    // IfExists: true on a missing tag, compared when present.
    w.mock.set_iam_policy(Some(doc(serde_json::json!([
        {"Effect": "Allow", "Action": "ec2:CreateTags", "Resource": "*",
         "Condition": {"StringEqualsIfExists": {"aws:ResourceTag/team": "blue"}}}
    ]))));
    c.create_tags()
        .resources(&w.ours)
        .tags(tag("team", "red"))
        .send()
        .await
        .expect("no team tag yet");
    denied(
        c.create_tags()
            .resources(&w.ours)
            .tags(tag("x", "1"))
            .send()
            .await,
    );
    // ForAnyValue: one of the request's keys is enough; none is not.
    w.mock.set_iam_policy(Some(doc(serde_json::json!([
        {"Effect": "Allow", "Action": "ec2:CreateTags", "Resource": "*",
         "Condition": {"ForAnyValue:StringEquals": {"aws:TagKeys": ["a"]}}}
    ]))));
    c.create_tags()
        .resources(&w.ours)
        .tags(tag("a", "1"))
        .tags(tag("b", "2"))
        .send()
        .await
        .expect("a among the keys");
    denied(
        c.create_tags()
            .resources(&w.ours)
            .tags(tag("b", "2"))
            .send()
            .await,
    );
    // Null: the statement applies only to ENIs without the cluster tag.
    w.mock.set_iam_policy(Some(doc(serde_json::json!([
        {"Effect": "Allow", "Action": "ec2:AssignPrivateIpAddresses", "Resource": "*",
         "Condition": {"Null": {"aws:ResourceTag/eniipam.io/cluster": "true"}}}
    ]))));
    c.assign_private_ip_addresses()
        .network_interface_id(&w.eth0)
        .secondary_private_ip_address_count(1)
        .send()
        .await
        .expect("eth0 untagged");
    denied(
        c.assign_private_ip_addresses()
            .network_interface_id(&w.ours)
            .secondary_private_ip_address_count(1)
            .send()
            .await,
    );
}

#[tokio::test]
async fn policies_swap_at_run_time_and_per_caller() {
    let w = world().await;
    let d = w.mock.default_world().unwrap();
    let http = reqwest::Client::new();
    let url = format!("{}/iam/policy", w.mock.control_url());
    let assign = |c: Client, eni: String| async move {
        c.assign_private_ip_addresses()
            .network_interface_id(eni)
            .secondary_private_ip_address_count(1)
            .send()
            .await
    };
    assign(w.c.clone(), w.eth0.clone()).await.expect("allowed");
    // Revoke one action through the control API: the next call is denied.
    let revoked = shipped_policy(CLUSTER, &d.vpc_id).without_action("ec2:AssignPrivateIpAddresses");
    let r = http
        .put(&url)
        .json(&revoked.to_json())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    denied(assign(w.c.clone(), w.eth0.clone()).await);
    let got: serde_json::Value = http.get(&url).send().await.unwrap().json().await.unwrap();
    assert_eq!(Policy::from_value(&got["policy"]).unwrap(), revoked);
    // A bad document is refused, saying why, and the policy stays.
    let r = http
        .put(&url)
        .body(r#"{"Statement":{"Effect":"Maybe","Action":"ec2:X","Resource":"*"}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let body = r.text().await.unwrap();
    assert!(body.contains("Effect must be"), "{body}");
    denied(assign(w.c.clone(), w.eth0.clone()).await);
    // Off again.
    assert_eq!(http.delete(&url).send().await.unwrap().status(), 204);
    assign(w.c.clone(), w.eth0.clone())
        .await
        .expect("no enforcement");
    // Per caller: node B gets the revoked policy, node A (account-wide: none) is unrestricted.
    let b = client_as(&w.mock, "AKIDNODEB");
    w.mock
        .set_iam_policy_for("AKIDNODEB", Some(revoked.clone()));
    assign(w.c.clone(), w.eth0.clone())
        .await
        .expect("A unrestricted");
    let m = denied(assign(b.clone(), w.eth0.clone()).await);
    assert!(m.contains("assumed-role/mockcloud-node/AKIDNODEB"), "{m}");
    // The account-wide shipped policy, with B's override still in force for B only.
    w.mock
        .set_iam_policy(Some(shipped_policy(CLUSTER, &d.vpc_id)));
    assign(w.c.clone(), w.eth0.clone())
        .await
        .expect("A under the shipped policy");
    denied(assign(b.clone(), w.eth0.clone()).await);
    let r = http
        .delete(format!("{url}?access_key_id=AKIDNODEB"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    assign(b.clone(), w.eth0.clone())
        .await
        .expect("B back on the account-wide policy");
    // PUT for one caller through the control API.
    let r = http
        .put(format!("{url}?access_key_id=AKIDNODEB"))
        .json(&revoked.to_json())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    denied(assign(b, w.eth0.clone()).await);
    assert_eq!(w.mock.iam_policy(Some("AKIDNODEB")), Some(revoked));
    assert!(
        w.mock
            .iam_denials()
            .iter()
            .any(|d| d.access_key_id == "AKIDNODEB")
    );
}

#[tokio::test]
async fn a_denied_call_still_spends_its_token_and_dry_run_asks_iam() {
    let mock = MockCloud::start(Config {
        throttling: Throttling::uniform(Bucket::new(2.0, 0.001), Bucket::new(100.0, 1.0)),
        iam_policy: Some(doc(serde_json::json!([
            {"Effect": "Allow", "Action": "ec2:Describe*", "Resource": "*"}
        ]))),
        ..Config::fast()
    })
    .await
    .unwrap();
    let c = support::ec2(&mock);
    let eni = mock.default_instance().primary_eni;
    let (code, _) = failure(
        c.delete_network_interface()
            .network_interface_id(&eni)
            .dry_run(true)
            .send()
            .await,
    );
    assert_eq!(code, "UnauthorizedOperation", "DryRun asks IAM first");
    denied(
        c.delete_network_interface()
            .network_interface_id(&eni)
            .send()
            .await,
    );
    let (code, _) = failure(
        c.delete_network_interface()
            .network_interface_id(&eni)
            .send()
            .await,
    );
    assert_eq!(
        code, "RequestLimitExceeded",
        "the two denied calls spent the bucket"
    );
    let (code, _) = failure(c.describe_subnets().dry_run(true).send().await);
    assert_eq!(code, "DryRunOperation");
}
