//! The evaluator on the shipped policy and on small documents, without HTTP.

use std::collections::BTreeMap;

use super::*;

const VPC: &str = "vpc-0aaaaaaaaaaaaaaaa";
const ACCOUNT: &str = "123456789012";

fn arn(kind: &str, id: &str) -> String {
    format!("arn:aws:ec2:us-east-1:{ACCOUNT}:{kind}/{id}")
}

fn eni_req(action: &str, vpc: &str, tags: &[(&str, &str)]) -> AuthRequest {
    let mut r = AuthRequest::new(action, &arn("network-interface", "eni-01"), "us-east-1");
    r.context.set("ec2:Vpc", arn("vpc", vpc));
    for (k, v) in tags {
        r.context.set(format!("aws:ResourceTag/{k}"), *v);
    }
    r
}

fn create_req(tags: &[(&str, &str)]) -> AuthRequest {
    let t: BTreeMap<String, Option<String>> = tags
        .iter()
        .map(|(k, v)| (k.to_string(), Some(v.to_string())))
        .collect();
    AuthRequest::new(
        "CreateNetworkInterface",
        &arn("network-interface", "*"),
        "us-east-1",
    )
    .with_request_tags(&t)
}

fn shipped() -> Policy {
    shipped_policy("c1", VPC)
}

const OURS: &[(&str, &str)] = &[
    ("eniipam.io/cluster", "c1"),
    ("eniipam.io/owner", "eniipam"),
];

#[test]
fn shipped_policy_on_enis() {
    let p = shipped();
    let d = evaluate(&p, &eni_req("AssignPrivateIpAddresses", VPC, &[]));
    assert!(d.allowed, "{d:?}");
    assert!(evaluate(&p, &eni_req("UnassignPrivateIpAddresses", VPC, &[])).allowed);
    for a in [
        "DeleteNetworkInterface",
        "DetachNetworkInterface",
        "ModifyNetworkInterfaceAttribute",
    ] {
        let d = evaluate(&p, &eni_req(a, VPC, &[]));
        assert!(!d.allowed && !d.explicit_deny, "{a} on eth0: {d:?}");
        assert!(evaluate(&p, &eni_req(a, VPC, OURS)).allowed, "{a} on ours");
    }
    let other = [
        ("eniipam.io/cluster", "other"),
        ("eniipam.io/owner", "eniipam"),
    ];
    let d = evaluate(&p, &eni_req("AssignPrivateIpAddresses", VPC, &other));
    assert!(!d.allowed && d.explicit_deny, "{d:?}");
    assert_eq!(d.matched_deny, vec!["NeverAnotherClustersEnis"]);
    assert!(
        !evaluate(
            &p,
            &eni_req("AssignPrivateIpAddresses", "vpc-0bbbbbbbbbbbbbbbb", &[])
        )
        .allowed
    );
    // Describe needs Resource "*": an ARN-scoped statement does not cover it.
    assert!(evaluate(&p, &AuthRequest::new("DescribeSubnets", "*", "us-east-1")).allowed);
    assert!(!evaluate(&p, &AuthRequest::new("DescribeVpcs", "*", "us-east-1")).allowed);
}

/// Attach, detach and DeleteOnTermination on the instance: the cluster's nodes only (the tag key
/// holds the cluster name, rendered like the values).
#[test]
fn shipped_policy_on_nodes() {
    let p = shipped();
    let node = |action: &str, tag: Option<(String, String)>| {
        let mut r = AuthRequest::new(action, &arn("instance", "i-01"), "us-east-1");
        r.context.set("ec2:InstanceID", "i-01");
        if let Some((k, v)) = tag {
            r.context.set(format!("aws:ResourceTag/{k}"), v);
        }
        evaluate(&p, &r).allowed
    };
    for a in [
        "AttachNetworkInterface",
        "DetachNetworkInterface",
        "ModifyNetworkInterfaceAttribute",
    ] {
        assert!(node(a, Some(node_tag("c1"))), "{a} on a node of c1");
        assert!(!node(a, None), "{a} on an untagged instance");
        assert!(!node(a, Some(node_tag("c2"))), "{a} on a node of c2");
    }
    assert!(!node("DeleteNetworkInterface", Some(node_tag("c1"))));
    // The subnet of a DeleteOnTermination change: the cluster's VPC only.
    let subnet = |vpc: &str| {
        let mut r = AuthRequest::new(
            "ModifyNetworkInterfaceAttribute",
            &arn("subnet", "subnet-01"),
            "us-east-1",
        );
        r.context.set("ec2:Vpc", arn("vpc", vpc));
        evaluate(&p, &r).allowed
    };
    assert!(subnet(VPC));
    assert!(!subnet("vpc-0bbbbbbbbbbbbbbbb"));
}

#[test]
fn shipped_policy_on_creation() {
    let p = shipped();
    assert!(evaluate(&p, &create_req(OURS)).allowed);
    let mut with_all = OURS.to_vec();
    with_all.push(("eniipam.io/created-at", "2024"));
    with_all.push(("node.k8s.amazonaws.com/no_manage", "true"));
    assert!(evaluate(&p, &create_req(&with_all)).allowed);
    assert!(!evaluate(&p, &create_req(&[("eniipam.io/owner", "eniipam")])).allowed);
    let mut extra = OURS.to_vec();
    extra.push(("team", "blue"));
    assert!(!evaluate(&p, &create_req(&extra)).allowed);
    assert!(
        !evaluate(
            &p,
            &create_req(&[
                ("eniipam.io/cluster", "c2"),
                ("eniipam.io/owner", "eniipam")
            ])
        )
        .allowed
    );
    let mut subnet = AuthRequest::new(
        "CreateNetworkInterface",
        &arn("subnet", "subnet-01"),
        "us-east-1",
    );
    subnet.context.set("ec2:Vpc", arn("vpc", VPC));
    assert!(evaluate(&p, &subnet).allowed);
    subnet
        .context
        .set("ec2:Vpc", arn("vpc", "vpc-0bbbbbbbbbbbbbbbb"));
    assert!(!evaluate(&p, &subnet).allowed);
    // Tag on create needs ec2:CreateAction; a later CreateTags only the created-at stamp on ours.
    let mut tag = create_req(OURS);
    tag.action = "ec2:CreateTags".into();
    assert!(!evaluate(&p, &tag).allowed, "no CreateAction");
    tag.context
        .set("ec2:CreateAction", "CreateNetworkInterface");
    assert!(evaluate(&p, &tag).allowed);
    let stamp = |key: &str, resource_tags: &[(&str, &str)]| {
        let mut r = eni_req("CreateTags", VPC, resource_tags);
        let t: BTreeMap<String, Option<String>> = [(key.to_owned(), Some("x".to_owned()))].into();
        r = r.with_request_tags(&t);
        evaluate(&p, &r).allowed
    };
    assert!(stamp("eniipam.io/created-at", OURS));
    assert!(!stamp("team", OURS));
    assert!(!stamp("eniipam.io/created-at", &[]));
}

#[test]
fn unknown_operator_denies_even_with_an_allow() {
    let p = Policy::parse(
        r#"{"Version":"2012-10-17","Statement":[
            {"Effect":"Allow","Action":"ec2:*","Resource":"*"},
            {"Sid":"Odd","Effect":"Allow","Action":"ec2:CreateTags","Resource":"*",
             "Condition":{"StringEqualz":{"aws:TagKeys":"a"}}}]}"#,
    )
    .unwrap();
    let d = evaluate(&p, &AuthRequest::new("CreateTags", "*", "us-east-1"));
    assert!(!d.allowed, "{d:?}");
    assert!(
        d.reason.contains("StringEqualz") && d.reason.contains("Odd"),
        "{}",
        d.reason
    );
    // A statement for another action is not evaluated at all.
    assert!(evaluate(&p, &AuthRequest::new("DescribeSubnets", "*", "us-east-1")).allowed);
}

#[test]
fn not_action_not_resource_and_wildcards() {
    let p = Policy::parse(
        r#"{"Version":"2012-10-17","Statement":{"Effect":"Allow","NotAction":"ec2:Delete*",
            "NotResource":"arn:aws:ec2:*:*:subnet/*"}}"#,
    )
    .unwrap();
    let eni = arn("network-interface", "eni-01");
    assert!(evaluate(&p, &AuthRequest::new("ASSIGNPrivateIpAddresses", &eni, "r")).allowed);
    assert!(!evaluate(&p, &AuthRequest::new("DeleteNetworkInterface", &eni, "r")).allowed);
    assert!(
        !evaluate(
            &p,
            &AuthRequest::new("CreateTags", &arn("subnet", "s"), "r")
        )
        .allowed
    );
    let q = Policy::parse(
        r#"{"Statement":[{"Effect":"Allow","Action":"ec2:?ssign*","Resource":"arn:aws:ec2:us-east-1:*:network-interface/eni-0?"}]}"#,
    )
    .unwrap();
    assert!(evaluate(&q, &AuthRequest::new("AssignPrivateIpAddresses", &eni, "r")).allowed);
    assert!(
        !evaluate(
            &q,
            &AuthRequest::new(
                "AssignPrivateIpAddresses",
                &arn("network-interface", "eni-012"),
                "r"
            )
        )
        .allowed
    );
}

#[test]
fn bad_documents_are_refused_with_what_is_wrong() {
    let cases = [
        ("{", "not valid JSON"),
        ("[]", "JSON object"),
        (r#"{"Version":"2012-10-17"}"#, "Statement"),
        (r#"{"Version":"2013-01-01","Statement":[]}"#, "Version"),
        (r#"{"Statement":[]}"#, "empty"),
        (
            r#"{"Statement":{"Effect":"Permit","Action":"ec2:X","Resource":"*"}}"#,
            "Effect",
        ),
        (
            r#"{"Statement":{"Action":"ec2:X","Resource":"*"}}"#,
            "Effect",
        ),
        (
            r#"{"Statement":{"Effect":"Allow","Resource":"*"}}"#,
            "Action",
        ),
        (
            r#"{"Statement":{"Effect":"Allow","Action":"ec2:X"}}"#,
            "Resource",
        ),
        (
            r#"{"Statement":{"Effect":"Allow","Action":"ec2:X","NotAction":"ec2:Y","Resource":"*"}}"#,
            "both Action and NotAction",
        ),
        (
            r#"{"Statement":{"Effect":"Allow","Action":"AssignPrivateIpAddresses","Resource":"*"}}"#,
            "service:action",
        ),
        (
            r#"{"Statement":{"Effect":"Allow","Action":"ec2:X","Resource":"eni-1"}}"#,
            "ARN",
        ),
        (
            r#"{"Statement":{"Effect":"Allow","Principal":"*","Action":"ec2:X","Resource":"*"}}"#,
            "Principal",
        ),
        (
            r#"{"Statement":[{"Sid":"A","Effect":"Allow","Action":"ec2:X","Resource":"*"},{"Sid":"A","Effect":"Deny","Action":"ec2:X","Resource":"*"}]}"#,
            "unique",
        ),
        (
            r#"{"Statement":{"Sid":"a-b","Effect":"Allow","Action":"ec2:X","Resource":"*"}}"#,
            "Sid",
        ),
        (
            r#"{"Statement":{"Effect":"Allow","Action":"ec2:X","Resource":"arn:aws:ec2:*:*:network-interface/${aws:username}"}}"#,
            "policy variable",
        ),
        (
            r#"{"Statement":{"Effect":"Allow","Action":"ec2:X","Resource":"*","Condition":{"StringEquals":{"aws:RequestTag/o":"${aws:username}"}}}}"#,
            "not support",
        ),
        (
            r#"{"Statement":{"Effect":"Allow","Action":"ec2:X","Resource":"*","Condition":{"StringEquals":{"owner":"x"}}}}"#,
            "vendor",
        ),
        (
            r#"{"Statement":{"Effect":"Allow","Action":[],"Resource":"*"}}"#,
            "empty",
        ),
        (
            r#"{"Statement":{"Effect":"Allow","Action":"ec2:X","Resource":"*","Extra":1}}"#,
            "unknown field",
        ),
    ];
    for (doc, needle) in cases {
        let e = Policy::parse(doc).expect_err(doc).to_string();
        assert!(e.contains(needle), "{doc}: {e} (wanted {needle:?})");
    }
}

#[test]
fn json_round_trip_and_without_action() {
    let p = shipped();
    assert_eq!(Policy::from_value(&p.to_json()).unwrap(), p);
    let q = p.without_action("ec2:AssignPrivateIpAddresses");
    assert!(!evaluate(&q, &eni_req("AssignPrivateIpAddresses", VPC, &[])).allowed);
    assert!(!evaluate(&q, &eni_req("AssignPrivateIpAddresses", VPC, OURS)).allowed);
    assert!(evaluate(&q, &eni_req("UnassignPrivateIpAddresses", VPC, &[])).allowed);
    // The Deny statement keeps the action.
    let deny = q
        .statements
        .iter()
        .find(|s| s.effect == Effect::Deny)
        .unwrap();
    assert!(
        matches!(&deny.actions, Actions::Action(a) if a.iter().any(|a| a == "ec2:AssignPrivateIpAddresses"))
    );
    let r = p.without_action("CreateNetworkInterface");
    assert!(
        !r.statements
            .iter()
            .any(|s| s.sid.as_deref() == Some("CreateEniTaggedForThisCluster"))
    );
    assert!(!evaluate(&r, &create_req(OURS)).allowed);
}

#[test]
fn access_key_and_encoded_message() {
    assert_eq!(
        access_key_id(
            "AWS4-HMAC-SHA256 Credential=AKIDNODE1/20240101/us-east-1/ec2/aws4_request, SignedHeaders=host, Signature=ab"
        ),
        "AKIDNODE1"
    );
    assert_eq!(access_key_id("Bearer x"), "");
    let d = evaluate(&shipped(), &eni_req("DeleteNetworkInterface", VPC, &[]));
    let e = unauthorized(&d, ACCOUNT, "AKIDNODE1");
    assert_eq!((e.status, e.code.as_str()), (403, "UnauthorizedOperation"));
    let (head, encoded) = e
        .message
        .split_once("Encoded authorization failure message: ")
        .unwrap();
    assert!(head.contains("User: arn:aws:sts::123456789012:assumed-role/mockcloud-node/AKIDNODE1 is not authorized to perform: ec2:DeleteNetworkInterface on resource: arn:aws:ec2:us-east-1:123456789012:network-interface/eni-01 because no identity-based policy allows the ec2:DeleteNetworkInterface action."), "{head}");
    let v = decode(encoded).unwrap();
    assert_eq!(v["allowed"], false);
    assert_eq!(v["context"]["action"], "ec2:DeleteNetworkInterface");
}
