//! `eniipamctl iam-policy`: the least-privilege IAM policy for eniipamd in one cluster.
//!
//! Every EC2 action eniipamd calls (`crates/cloud/src/ec2/`; the workspace's `tests/iam_policy.rs` checks
//! the list against the code and against a real daemon's calls), and nothing more:
//! - Describe* on `*`: EC2 has no resource-level permissions for them;
//! - CreateNetworkInterface only when the request tags the new ENI `eniipam.io/owner=eniipam` and
//!   `eniipam.io/cluster=<cluster>` and carries no other tag keys than eniipam's own (so every ENI
//!   the role creates is findable by the leaked-ENI collector), plus the subnet and security groups
//!   it is created in;
//! - CreateTags only as part of that create (`ec2:CreateAction`), or to stamp `eniipam.io/created-at`
//!   on an ENI already tagged for this cluster (the leaked-ENI collector);
//! - every mutation of an ENI on ENIs tagged `eniipam.io/owner=eniipam` and
//!   `eniipam.io/cluster=<cluster>`;
//! - AssignPrivateIpAddresses and UnassignPrivateIpAddresses, and their IPv6 twins
//!   AssignIpv6Addresses and UnassignIpv6Addresses, also on the untagged ENIs of the cluster's VPC
//!   (`ec2:Vpc`): the node's eth0, created at launch without our tags, serves pods by default
//!   (`use_primary_eni`), and an IPv6 node's `/80` is delegated to eth0. EC2 offers no condition key naming the instance an ENI belongs to,
//!   so the VPC is the tightest scope; delete, detach and modify stay on our tagged ENIs only;
//! - an explicit Deny of every ENI mutation on an ENI tagged for another cluster, which no Allow
//!   (the VPC one included) can outweigh;
//! - the instance side of Attach, Detach and ModifyNetworkInterfaceAttribute (EC2 authorizes the
//!   instance too; for Modify, when the request changes the attachment, i.e. DeleteOnTermination),
//!   on the cluster's nodes only: instances tagged `kubernetes.io/cluster/<cluster>=owned`, as
//!   EKS node groups, eksctl and Karpenter tag them and as the VPC CNI's scoped policy requires
//!   (its `docs/iam-policy.md`);
//! - the subnet and security-group side of ModifyNetworkInterfaceAttribute, in the cluster's VPC:
//!   the service authorization reference lists both as resources of the action.
//! - CreateSubnetCidrReservation on the cluster's VPC's subnets (`prefix_reservation_percent`: one
//!   `prefix` reservation per pod subnet; never deleted, so no DeleteSubnetCidrReservation), and
//!   CreateTags on the new reservation only as part of that create, tagged for this cluster. A
//!   daemon whose role lacks it warns once naming `ec2:CreateSubnetCidrReservation` and goes on.

use clap::{Args, ValueEnum};
use serde::Serialize;
use serde_json::{Value, json};

/// Tags eniipamd writes on every ENI it creates (`eniipam::cloud::tags`; `tests/iam_policy.rs`
/// checks that this list is exactly the keys of a created ENI).
pub const OWNER_TAG: &str = "eniipam.io/owner";
pub const OWNER_VALUE: &str = "eniipam";
pub const CLUSTER_TAG: &str = "eniipam.io/cluster";
pub const CREATED_AT_TAG: &str = "eniipam.io/created-at";
pub const CREATE_TAG_KEYS: &[&str] = &[
    OWNER_TAG,
    CLUSTER_TAG,
    "eniipam.io/instance-id",
    CREATED_AT_TAG,
    // The network profile an ENI serves (network profiles only; a restart learns it from the tag).
    "eniipam.io/network",
    // So that an aws-node still running on the node never adopts our ENIs (during a migration).
    "node.k8s.amazonaws.com/no_manage",
];

/// Read-only EC2 actions eniipamd calls (GetSubnetCidrReservations: with prefix delegation, so packed
/// single addresses stay out of `prefix` reservations; DescribeSecurityGroups: an ENIConfig's groups
/// are checked to exist in the node's VPC before ENIs are created with them).
pub const DESCRIBE_ACTIONS: &[&str] = &[
    "ec2:DescribeInstanceTypes",
    "ec2:DescribeInstances",
    "ec2:DescribeNetworkInterfaces",
    "ec2:DescribeSecurityGroups",
    "ec2:DescribeSubnets",
    "ec2:GetSubnetCidrReservations",
];

/// Mutations of an existing ENI eniipamd makes (on its own ENIs only). AssignIpv6Addresses and
/// UnassignIpv6Addresses: the node's `/80` in `ip_family` ipv6 or dual.
pub const ENI_MUTATIONS: &[&str] = &[
    "ec2:AssignIpv6Addresses",
    "ec2:AssignPrivateIpAddresses",
    "ec2:AttachNetworkInterface",
    "ec2:DeleteNetworkInterface",
    "ec2:DetachNetworkInterface",
    "ec2:ModifyNetworkInterfaceAttribute",
    "ec2:UnassignIpv6Addresses",
    "ec2:UnassignPrivateIpAddresses",
];

/// What eniipamd does on the untagged ENIs of the cluster's VPC (the node's eth0): assign and
/// unassign, IPv4 addresses and prefixes, and the IPv6 `/80` that is taken from eth0.
pub const VPC_ENI_MUTATIONS: &[&str] = &[
    "ec2:AssignIpv6Addresses",
    "ec2:AssignPrivateIpAddresses",
    "ec2:UnassignIpv6Addresses",
    "ec2:UnassignPrivateIpAddresses",
];

/// The tag of a cluster's nodes, `kubernetes.io/cluster/<cluster>` = `owned` (the Kubernetes cloud
/// provider's convention, set by EKS node groups, eksctl and Karpenter).
pub const NODE_TAG_PREFIX: &str = "kubernetes.io/cluster/";
pub const NODE_TAG_VALUE: &str = "owned";

/// EC2's longest tag key: the node tag's key holds the cluster name.
const MAX_TAG_KEY: usize = 128;

/// Actions EC2 also authorizes on the instance (Modify: when the request changes the attachment).
pub const INSTANCE_ACTIONS: &[&str] = &[
    "ec2:AttachNetworkInterface",
    "ec2:DetachNetworkInterface",
    "ec2:ModifyNetworkInterfaceAttribute",
];

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Partition {
    /// Commercial regions.
    Aws,
    /// China (Beijing, Ningxia).
    AwsCn,
    /// AWS GovCloud (US).
    AwsUsGov,
}

impl Partition {
    fn arn(self) -> &'static str {
        match self {
            Partition::Aws => "aws",
            Partition::AwsCn => "aws-cn",
            Partition::AwsUsGov => "aws-us-gov",
        }
    }
}

#[derive(Args, Debug)]
pub struct IamPolicyArgs {
    /// The cluster name: the same value as eniipamd's cluster_name (ENIIPAM_CLUSTER_NAME).
    #[arg(long)]
    cluster: String,
    /// The cluster's VPC (vpc-…): assigning and unassigning IPs on the node's eth0, which carries
    /// none of eniipam's tags, is allowed on this VPC's ENIs only.
    #[arg(long)]
    vpc_id: String,
    /// The AWS partition the cluster runs in.
    #[arg(long, value_enum, default_value = "aws")]
    partition: Partition,
}

pub fn run(a: &IamPolicyArgs) -> Result<(), String> {
    let policy = policy(&a.cluster, &a.vpc_id, a.partition)?;
    let text = serde_json::to_string_pretty(&policy).map_err(|e| e.to_string())?;
    println!("{text}");
    Ok(())
}

/// A policy document, fields in the order IAM's examples use.
#[derive(Serialize)]
pub struct Policy {
    #[serde(rename = "Version")]
    version: &'static str,
    #[serde(rename = "Statement")]
    statement: Vec<Statement>,
}

#[derive(Serialize)]
struct Statement {
    #[serde(rename = "Sid")]
    sid: &'static str,
    #[serde(rename = "Effect")]
    effect: &'static str,
    #[serde(rename = "Action")]
    action: Value,
    #[serde(rename = "Resource")]
    resource: Value,
    #[serde(rename = "Condition", skip_serializing_if = "Option::is_none")]
    condition: Option<Value>,
}

fn allow(sid: &'static str, action: Value, resource: Value, condition: Option<Value>) -> Statement {
    Statement {
        sid,
        effect: "Allow",
        action,
        resource,
        condition,
    }
}

fn deny(sid: &'static str, action: Value, resource: Value, condition: Value) -> Statement {
    Statement {
        effect: "Deny",
        ..allow(sid, action, resource, Some(condition))
    }
}

/// Checks a VPC id (`vpc-` and 8 or 17 lowercase hex digits, as EC2 issues them).
pub fn validate_vpc_id(vpc: &str) -> Result<(), String> {
    let ok = vpc.strip_prefix("vpc-").is_some_and(|h| {
        (h.len() == 8 || h.len() == 17)
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    });
    if ok {
        Ok(())
    } else {
        Err(format!(
            "--vpc-id {vpc:?} is not a VPC id: expected vpc- and 8 or 17 hex digits \
             (aws ec2 describe-instances --instance-ids <node> --query 'Reservations[].Instances[].VpcId')"
        ))
    }
}

/// Checks a cluster name for use as a tag value in the policy: what eniipamd accepts (≤ 128
/// characters, no whitespace), limited to the characters EC2 allows in tag values, and nothing IAM
/// would read as a policy variable or a wildcard.
pub fn validate_cluster(cluster: &str) -> Result<(), String> {
    if cluster.is_empty() {
        return Err(
            "--cluster is empty: give the cluster name eniipamd tags its ENIs with \
                    (ENIIPAM_CLUSTER_NAME in deploy/configmap.yaml)"
                .into(),
        );
    }
    if cluster.chars().count() > 128 {
        return Err(format!(
            "--cluster is {} characters long; eniipamd accepts at most 128",
            cluster.chars().count()
        ));
    }
    if let Some(c) = cluster
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "_.:/=+-@".contains(*c)))
    {
        return Err(format!(
            "--cluster {cluster:?} contains {c:?}: use letters, digits and _ . : / = + - @ \
             (EC2 tag values; `*`, `?` and `$` would mean something else in an IAM policy)"
        ));
    }
    Ok(())
}

/// The policy for `cluster` in `vpc_id` (`deploy/iam-policy.json` is `my-cluster` in
/// `vpc-0123456789abcdef0`).
pub fn policy(cluster: &str, vpc_id: &str, partition: Partition) -> Result<Policy, String> {
    validate_cluster(cluster)?;
    validate_vpc_id(vpc_id)?;
    let node_tag = format!("{NODE_TAG_PREFIX}{cluster}");
    if node_tag.chars().count() > MAX_TAG_KEY {
        return Err(format!(
            "--cluster {cluster:?} is too long for the nodes' tag {node_tag:?}: EC2 tag keys hold \
             at most {MAX_TAG_KEY} characters (EKS cluster names at most 100)"
        ));
    }
    let p = partition.arn();
    let eni = format!("arn:{p}:ec2:*:*:network-interface/*");
    let in_vpc = json!({"ArnEquals": {"ec2:Vpc": format!("arn:{p}:ec2:*:*:vpc/{vpc_id}")}});
    let ours = json!({
        format!("aws:ResourceTag/{OWNER_TAG}"): OWNER_VALUE,
        format!("aws:ResourceTag/{CLUSTER_TAG}"): cluster,
    });
    Ok(Policy {
        version: "2012-10-17",
        statement: vec![
            allow("Describe", json!(DESCRIBE_ACTIONS), json!("*"), None),
            allow(
                "CreateEniTaggedForThisCluster",
                json!("ec2:CreateNetworkInterface"),
                json!(eni),
                Some(json!({
                    "StringEquals": {
                        format!("aws:RequestTag/{OWNER_TAG}"): OWNER_VALUE,
                        format!("aws:RequestTag/{CLUSTER_TAG}"): cluster,
                    },
                    "ForAllValues:StringEquals": {"aws:TagKeys": CREATE_TAG_KEYS},
                })),
            ),
            allow(
                "CreateEniInSubnetWithGroups",
                json!("ec2:CreateNetworkInterface"),
                json!([
                    format!("arn:{p}:ec2:*:*:subnet/*"),
                    format!("arn:{p}:ec2:*:*:security-group/*"),
                ]),
                Some(in_vpc.clone()),
            ),
            allow(
                "ModifyEnisWithThisVpcsSubnetsAndGroups",
                json!("ec2:ModifyNetworkInterfaceAttribute"),
                json!([
                    format!("arn:{p}:ec2:*:*:subnet/*"),
                    format!("arn:{p}:ec2:*:*:security-group/*"),
                ]),
                Some(in_vpc.clone()),
            ),
            allow(
                "TagEniOnlyWhileCreatingIt",
                json!("ec2:CreateTags"),
                json!(eni),
                Some(json!({
                    "StringEquals": {
                        "ec2:CreateAction": "CreateNetworkInterface",
                        format!("aws:RequestTag/{CLUSTER_TAG}"): cluster,
                    },
                })),
            ),
            allow(
                "StampCreatedAtOnThisClustersEnis",
                json!("ec2:CreateTags"),
                json!(eni),
                Some(json!({
                    "StringEquals": ours,
                    "ForAllValues:StringEquals": {"aws:TagKeys": [CREATED_AT_TAG]},
                })),
            ),
            allow(
                "ManageThisClustersEnisOnly",
                json!(ENI_MUTATIONS),
                json!(eni),
                Some(json!({"StringEquals": ours})),
            ),
            allow(
                "ReservePrefixBlocksInThisVpcsSubnets",
                json!("ec2:CreateSubnetCidrReservation"),
                json!(format!("arn:{p}:ec2:*:*:subnet/*")),
                Some(in_vpc.clone()),
            ),
            allow(
                "TagPrefixReservationOnlyWhileCreatingIt",
                json!("ec2:CreateTags"),
                json!(format!("arn:{p}:ec2:*:*:subnet-cidr-reservation/*")),
                Some(json!({
                    "StringEquals": {
                        "ec2:CreateAction": "CreateSubnetCidrReservation",
                        format!("aws:RequestTag/{OWNER_TAG}"): OWNER_VALUE,
                        format!("aws:RequestTag/{CLUSTER_TAG}"): cluster,
                    },
                    "ForAllValues:StringEquals": {"aws:TagKeys": [OWNER_TAG, CLUSTER_TAG]},
                })),
            ),
            allow(
                "AssignAndUnassignOnThisVpcsEnis",
                json!(VPC_ENI_MUTATIONS),
                json!(eni),
                Some(in_vpc),
            ),
            deny(
                "NeverAnotherClustersEnis",
                json!(ENI_MUTATIONS),
                json!(eni),
                json!({
                    "StringNotEquals": {format!("aws:ResourceTag/{CLUSTER_TAG}"): cluster},
                    "Null": {format!("aws:ResourceTag/{CLUSTER_TAG}"): "false"},
                }),
            ),
            allow(
                "AttachDetachModifyOnThisClustersNodes",
                json!(INSTANCE_ACTIONS),
                json!(format!("arn:{p}:ec2:*:*:instance/*")),
                Some(json!({
                    "StringEquals": {format!("aws:ResourceTag/{node_tag}"): NODE_TAG_VALUE},
                })),
            ),
        ],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The statement `sid` of policy document `v`.
    fn statement(v: &Value, sid: &str) -> Value {
        v["Statement"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["Sid"] == sid)
            .unwrap_or_else(|| panic!("no statement {sid}"))
            .clone()
    }

    const VPC: &str = "vpc-0a1b2c3d";

    fn doc(cluster: &str, p: Partition) -> Value {
        serde_json::to_value(policy(cluster, VPC, p).unwrap()).unwrap()
    }

    /// Every action with its statements' resources, for the assertions below.
    fn actions(v: &Value) -> std::collections::BTreeSet<String> {
        v["Statement"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|s| match &s["Action"] {
                Value::String(a) => vec![a.clone()],
                Value::Array(a) => a.iter().map(|x| x.as_str().unwrap().to_owned()).collect(),
                other => panic!("Action {other}"),
            })
            .collect()
    }

    #[test]
    fn every_mutation_is_scoped_to_the_cluster_tag() {
        let v = doc("prod-1", Partition::Aws);
        for s in v["Statement"].as_array().unwrap() {
            let sid = s["Sid"].as_str().unwrap();
            let resources: Vec<&str> = match &s["Resource"] {
                Value::String(r) => vec![r.as_str()],
                Value::Array(r) => r.iter().map(|x| x.as_str().unwrap()).collect(),
                other => panic!("{sid}: Resource {other}"),
            };
            if sid == "Describe" {
                assert_eq!(resources, ["*"]);
                continue;
            }
            assert!(
                resources.iter().all(|r| r.starts_with("arn:aws:ec2:")),
                "{sid}: {resources:?}"
            );
            if resources.iter().any(|r| r.ends_with(":instance/*")) {
                assert_eq!(
                    s["Condition"],
                    json!({"StringEquals": {"aws:ResourceTag/kubernetes.io/cluster/prod-1": "owned"}}),
                    "{sid} reaches instances that are not the cluster's nodes"
                );
            }
            if resources
                .iter()
                .any(|r| r.ends_with(":network-interface/*"))
            {
                let cond = s["Condition"].to_string();
                assert!(
                    cond.contains("\"aws:ResourceTag/eniipam.io/cluster\":\"prod-1\"")
                        || cond.contains("\"aws:RequestTag/eniipam.io/cluster\":\"prod-1\"")
                        || cond.contains("\"ec2:Vpc\":\"arn:aws:ec2:*:*:vpc/vpc-0a1b2c3d\""),
                    "{sid} touches ENIs without the cluster or VPC condition: {cond}"
                );
            }
        }
        let all = actions(&v);
        assert_eq!(all.len(), 17, "{all:?}");
        assert!(all.iter().all(|a| a.starts_with("ec2:")));
    }

    /// Only assign and unassign reach untagged ENIs (eth0), and only in the cluster's VPC; an ENI
    /// tagged for another cluster is denied outright.
    #[test]
    fn eth0_gets_assign_and_unassign_in_the_vpc_only() {
        let v = doc("prod-1", Partition::Aws);
        let st = |sid: &str| statement(&v, sid);
        let vpc = st("AssignAndUnassignOnThisVpcsEnis");
        assert_eq!(
            vpc["Action"],
            json!([
                "ec2:AssignIpv6Addresses",
                "ec2:AssignPrivateIpAddresses",
                "ec2:UnassignIpv6Addresses",
                "ec2:UnassignPrivateIpAddresses"
            ])
        );
        assert_eq!(
            vpc["Condition"],
            json!({"ArnEquals": {"ec2:Vpc": "arn:aws:ec2:*:*:vpc/vpc-0a1b2c3d"}})
        );
        let deny = st("NeverAnotherClustersEnis");
        assert_eq!(deny["Effect"], "Deny");
        assert_eq!(deny["Action"], json!(ENI_MUTATIONS));
        assert_eq!(
            deny["Condition"]["StringNotEquals"]["aws:ResourceTag/eniipam.io/cluster"],
            "prod-1"
        );
        assert_eq!(
            deny["Condition"]["Null"]["aws:ResourceTag/eniipam.io/cluster"],
            "false"
        );
    }

    /// The prefix reservation: made in the VPC's subnets only, tagged for this cluster only.
    #[test]
    fn prefix_reservations_are_made_in_the_vpc_and_tagged_for_the_cluster() {
        let v = doc("prod-1", Partition::Aws);
        let st = |sid: &str| statement(&v, sid);
        let reserve = st("ReservePrefixBlocksInThisVpcsSubnets");
        assert_eq!(reserve["Action"], "ec2:CreateSubnetCidrReservation");
        assert_eq!(reserve["Resource"], "arn:aws:ec2:*:*:subnet/*");
        assert_eq!(
            reserve["Condition"],
            json!({"ArnEquals": {"ec2:Vpc": "arn:aws:ec2:*:*:vpc/vpc-0a1b2c3d"}})
        );
        let tag = st("TagPrefixReservationOnlyWhileCreatingIt");
        assert_eq!(tag["Resource"], "arn:aws:ec2:*:*:subnet-cidr-reservation/*");
        let eq = &tag["Condition"]["StringEquals"];
        assert_eq!(eq["ec2:CreateAction"], "CreateSubnetCidrReservation");
        assert_eq!(eq["aws:RequestTag/eniipam.io/cluster"], "prod-1");
    }

    #[test]
    fn bad_vpc_ids_are_refused() {
        for bad in [
            "",
            "vpc-",
            "vpc-0A1B2C3D",
            "subnet-0a1b2c3d",
            "vpc-0a1b2c3",
            "vpc-*",
        ] {
            let e = policy("c", bad, Partition::Aws).err().unwrap();
            assert!(e.contains("--vpc-id"), "{bad}: {e}");
        }
        policy("c", "vpc-0123456789abcdef0", Partition::Aws).unwrap();
    }

    /// The nodes' tag key holds the cluster name: one EC2 cannot store is refused.
    #[test]
    fn a_cluster_name_too_long_for_the_node_tag_is_refused() {
        let longest = "x".repeat(MAX_TAG_KEY - NODE_TAG_PREFIX.len());
        policy(&longest, VPC, Partition::Aws).unwrap();
        let e = policy(&format!("{longest}x"), VPC, Partition::Aws)
            .err()
            .unwrap();
        assert!(
            e.contains("kubernetes.io/cluster/") && e.contains("128"),
            "{e}"
        );
    }

    /// DeleteOnTermination: EC2 authorizes the instance and the subnet of the ENI as well.
    #[test]
    fn modify_reaches_the_nodes_and_the_vpcs_subnets() {
        let v = doc("prod-1", Partition::Aws);
        let modify_on = |kind: &str| {
            v["Statement"].as_array().unwrap().iter().any(|s| {
                s["Effect"] == "Allow"
                    && s["Action"]
                        .to_string()
                        .contains("ec2:ModifyNetworkInterfaceAttribute")
                    && s["Resource"].to_string().contains(&format!(":{kind}/*"))
            })
        };
        for kind in ["network-interface", "instance", "subnet", "security-group"] {
            assert!(modify_on(kind), "no Allow of Modify on {kind}");
        }
    }

    #[test]
    fn partitions_change_only_the_arns() {
        let cn = doc("c", Partition::AwsCn).to_string();
        assert!(cn.contains("arn:aws-cn:ec2:*:*:network-interface/*"));
        assert!(!cn.contains("arn:aws:"));
        let gov = doc("c", Partition::AwsUsGov).to_string();
        assert!(gov.contains("arn:aws-us-gov:ec2:*:*:instance/*"));
        assert_eq!(
            actions(&doc("c", Partition::AwsCn)),
            actions(&doc("c", Partition::Aws))
        );
    }

    #[test]
    fn bad_cluster_names_are_refused_with_the_reason() {
        assert!(
            validate_cluster("")
                .unwrap_err()
                .contains("ENIIPAM_CLUSTER_NAME")
        );
        assert!(validate_cluster("a b").unwrap_err().contains("' '"));
        assert!(
            validate_cluster("${aws:username}")
                .unwrap_err()
                .contains("'$'")
        );
        assert!(validate_cluster("prod*").is_err());
        assert!(
            validate_cluster(&"x".repeat(129))
                .unwrap_err()
                .contains("128")
        );
        validate_cluster("my-cluster_2.eu:prod/a=b+c@d").unwrap();
    }
}
