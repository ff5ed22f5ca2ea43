//! Security groups through the real `aws-sdk-ec2` client: the VPC's default group and a new group as
//! AWS makes them, CreateSecurityGroup / Authorize / Revoke (ingress and egress) with EC2's
//! errors and quotas, DescribeSecurityGroups with ids, filters and pagination, the 5-groups-per-ENI
//! quota, IAM on the group's ARN, the throttling buckets, and the state dump vpclab reads.

use aws_sdk_ec2::Client;
use aws_sdk_ec2::types::{
    IpPermission, IpRange, ResourceType, SecurityGroup, Tag, TagSpecification, UserIdGroupPair,
};
use mockcloud::iam::Policy;
use mockcloud::{Config, MockCloud};

mod support;
use support::{code, ec2, empty, filter};

async fn create_group(c: &Client, vpc: &str, name: &str) -> String {
    c.create_security_group()
        .vpc_id(vpc)
        .group_name(name)
        .description(format!("{name} tier"))
        .send()
        .await
        .expect("create group")
        .group_id
        .expect("group id")
}

async fn group(c: &Client, id: &str) -> SecurityGroup {
    let out = c
        .describe_security_groups()
        .group_ids(id)
        .send()
        .await
        .expect("describe");
    assert_eq!(out.security_groups().len(), 1);
    out.security_groups()[0].clone()
}

fn tcp(from: i32, to: i32) -> aws_sdk_ec2::types::builders::IpPermissionBuilder {
    IpPermission::builder()
        .ip_protocol("tcp")
        .from_port(from)
        .to_port(to)
}

fn from_group(g: &str) -> UserIdGroupPair {
    UserIdGroupPair::builder().group_id(g).build()
}

fn from_cidr(c: &str) -> IpRange {
    IpRange::builder().cidr_ip(c).build()
}

async fn vpc(mock: &MockCloud, cidr: &str) -> (String, String) {
    mock.create_vpc(cidr.parse().unwrap()).unwrap()
}

#[tokio::test]
async fn the_default_group_and_a_new_group_are_as_aws_makes_them() {
    let mock = empty(1).await;
    let c = ec2(&mock);
    let (vpc_id, default_id) = vpc(&mock, "10.50.0.0/16").await;

    let d = group(&c, &default_id).await;
    assert_eq!(d.group_name(), Some("default"));
    assert_eq!(d.vpc_id(), Some(vpc_id.as_str()));
    assert_eq!(d.ip_permissions().len(), 1);
    let inbound = &d.ip_permissions()[0];
    assert_eq!(inbound.ip_protocol(), Some("-1"));
    assert_eq!(inbound.from_port(), None);
    assert_eq!(
        inbound.user_id_group_pairs()[0].group_id(),
        Some(default_id.as_str())
    );
    let outbound = &d.ip_permissions_egress()[0];
    assert_eq!(outbound.ip_protocol(), Some("-1"));
    assert_eq!(outbound.ip_ranges()[0].cidr_ip(), Some("0.0.0.0/0"));
    // Every mockcloud VPC has an IPv6 block: AWS adds ::/0 out too.
    assert_eq!(outbound.ipv6_ranges()[0].cidr_ipv6(), Some("::/0"));

    let out = c
        .create_security_group()
        .vpc_id(&vpc_id)
        .group_name("app")
        .description("app tier")
        .tag_specifications(
            TagSpecification::builder()
                .resource_type(ResourceType::SecurityGroup)
                .tags(Tag::builder().key("team").value("web").build())
                .build(),
        )
        .send()
        .await
        .unwrap();
    let app = out.group_id().unwrap().to_owned();
    assert!(
        out.security_group_arn()
            .unwrap()
            .ends_with(&format!("security-group/{app}"))
    );
    let g = group(&c, &app).await;
    assert_eq!(g.description(), Some("app tier"));
    assert!(g.ip_permissions().is_empty(), "a new group lets nothing in");
    assert_eq!(
        g.ip_permissions_egress()[0].ip_ranges()[0].cidr_ip(),
        Some("0.0.0.0/0")
    );
    assert_eq!(g.tags()[0].key(), Some("team"));

    // The name is unique per VPC, `default` is reserved, another VPC may reuse it.
    let dup = c
        .create_security_group()
        .vpc_id(&vpc_id)
        .group_name("app")
        .description("again")
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(dup), "InvalidGroup.Duplicate");
    let reserved = c
        .create_security_group()
        .vpc_id(&vpc_id)
        .group_name("default")
        .description("x")
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(reserved), "InvalidParameterValue");
    let (other_vpc, _) = vpc(&mock, "10.51.0.0/16").await;
    create_group(&c, &other_vpc, "app").await;
    // No VPC named: mockcloud's account has no default VPC.
    let no_vpc = c
        .create_security_group()
        .group_name("loose")
        .description("x")
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(no_vpc), "VPCIdNotSpecified");

    // Filters: vpc-id, group-name, tag:KEY.
    let named =
        |out: aws_sdk_ec2::operation::describe_security_groups::DescribeSecurityGroupsOutput| {
            let mut v: Vec<String> = out
                .security_groups()
                .iter()
                .map(|g| format!("{}/{}", g.vpc_id().unwrap(), g.group_name().unwrap()))
                .collect();
            v.sort();
            v
        };
    let apps = c
        .describe_security_groups()
        .filters(filter("group-name", "app"))
        .send()
        .await
        .unwrap();
    let mut want = vec![format!("{vpc_id}/app"), format!("{other_vpc}/app")];
    want.sort();
    assert_eq!(named(apps), want);
    let tagged = c
        .describe_security_groups()
        .filters(filter("tag:team", "w*"))
        .filters(filter("vpc-id", &vpc_id))
        .send()
        .await
        .unwrap();
    assert_eq!(named(tagged), vec![format!("{vpc_id}/app")]);
    let bad = c
        .describe_security_groups()
        .filters(filter("ip-permission.nope", "x"))
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(bad), "InvalidParameterValue");
}

#[tokio::test]
async fn rules_are_authorized_and_revoked_with_ec2s_errors() {
    let mock = empty(2).await;
    let c = ec2(&mock);
    let (vpc_id, _) = vpc(&mock, "10.52.0.0/16").await;
    let app = create_group(&c, &vpc_id, "app").await;
    let db = create_group(&c, &vpc_id, "db").await;

    c.authorize_security_group_ingress()
        .group_id(&db)
        .ip_permissions(
            tcp(5432, 5432)
                .user_id_group_pairs(from_group(&app))
                .build(),
        )
        .ip_permissions(tcp(5432, 5432).ip_ranges(from_cidr("10.52.9.0/24")).build())
        .send()
        .await
        .unwrap();
    let g = group(&c, &db).await;
    // Grouped by (protocol, ports), as EC2 shows them.
    assert_eq!(g.ip_permissions().len(), 1);
    let p = &g.ip_permissions()[0];
    assert_eq!(
        (p.ip_protocol(), p.from_port(), p.to_port()),
        (Some("tcp"), Some(5432), Some(5432))
    );
    assert_eq!(p.user_id_group_pairs()[0].group_id(), Some(app.as_str()));
    assert_eq!(p.ip_ranges()[0].cidr_ip(), Some("10.52.9.0/24"));

    let again = c
        .authorize_security_group_ingress()
        .group_id(&db)
        .ip_permissions(
            tcp(5432, 5432)
                .user_id_group_pairs(from_group(&app))
                .build(),
        )
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(again), "InvalidPermission.Duplicate");
    let absent = c
        .revoke_security_group_ingress()
        .group_id(&db)
        .ip_permissions(tcp(22, 22).ip_ranges(from_cidr("0.0.0.0/0")).build())
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(absent), "InvalidPermission.NotFound");
    let bad_ports = c
        .authorize_security_group_ingress()
        .group_id(&db)
        .ip_permissions(tcp(90, 80).ip_ranges(from_cidr("0.0.0.0/0")).build())
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(bad_ports), "InvalidParameterValue");
    let bad_cidr = c
        .authorize_security_group_ingress()
        .group_id(&db)
        .ip_permissions(tcp(80, 80).ip_ranges(from_cidr("10.52.9.1/24")).build())
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(bad_cidr), "InvalidParameterValue");
    let malformed = c
        .authorize_security_group_ingress()
        .group_id("sg-nothex")
        .ip_permissions(tcp(80, 80).ip_ranges(from_cidr("0.0.0.0/0")).build())
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(malformed), "InvalidGroupId.Malformed");
    let missing = c
        .authorize_security_group_ingress()
        .group_id("sg-0123456789abcdef0")
        .ip_permissions(tcp(80, 80).ip_ranges(from_cidr("0.0.0.0/0")).build())
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(missing), "InvalidGroup.NotFound");
    // A group of another VPC cannot be a peer.
    let (other_vpc, _) = vpc(&mock, "10.53.0.0/16").await;
    let stranger = create_group(&c, &other_vpc, "stranger").await;
    let cross = c
        .authorize_security_group_ingress()
        .group_id(&db)
        .ip_permissions(
            tcp(80, 80)
                .user_id_group_pairs(from_group(&stranger))
                .build(),
        )
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(cross), "InvalidGroup.NotFound");

    // Revoking one peer leaves the other.
    c.revoke_security_group_ingress()
        .group_id(&db)
        .ip_permissions(tcp(5432, 5432).ip_ranges(from_cidr("10.52.9.0/24")).build())
        .send()
        .await
        .unwrap();
    let p = &group(&c, &db).await.ip_permissions()[0].clone();
    assert!(p.ip_ranges().is_empty());
    assert_eq!(p.user_id_group_pairs().len(), 1);

    // Egress: revoke the all-traffic rules (both families), allow only tcp 443 out.
    c.revoke_security_group_egress()
        .group_id(&app)
        .ip_permissions(
            IpPermission::builder()
                .ip_protocol("-1")
                .ip_ranges(from_cidr("0.0.0.0/0"))
                .ipv6_ranges(
                    aws_sdk_ec2::types::Ipv6Range::builder()
                        .cidr_ipv6("::/0")
                        .build(),
                )
                .build(),
        )
        .send()
        .await
        .unwrap();
    c.authorize_security_group_egress()
        .group_id(&app)
        .ip_permissions(tcp(443, 443).ip_ranges(from_cidr("0.0.0.0/0")).build())
        .send()
        .await
        .unwrap();
    let e = group(&c, &app).await;
    assert_eq!(e.ip_permissions_egress().len(), 1);
    assert_eq!(e.ip_permissions_egress()[0].from_port(), Some(443));

    // 60 rules per direction: the 61st is refused, and nothing of that call is kept.
    let web = create_group(&c, &vpc_id, "web").await;
    let mut call = c.authorize_security_group_ingress().group_id(&web);
    for i in 0..60 {
        call = call.ip_permissions(
            tcp(80, 80)
                .ip_ranges(from_cidr(&format!("10.60.{i}.0/24")))
                .build(),
        );
    }
    call.send().await.unwrap();
    let over = c
        .authorize_security_group_ingress()
        .group_id(&web)
        .ip_permissions(tcp(80, 80).ip_ranges(from_cidr("10.61.0.0/24")).build())
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(over), "RulesPerSecurityGroupLimitExceeded");
    assert_eq!(
        group(&c, &web).await.ip_permissions()[0].ip_ranges().len(),
        60
    );
}

#[tokio::test]
async fn describe_pages_and_refuses_what_ec2_refuses() {
    let mock = empty(3).await;
    let c = ec2(&mock);
    let (vpc_id, default_id) = vpc(&mock, "10.54.0.0/16").await;
    for i in 0..6 {
        create_group(&c, &vpc_id, &format!("g{i}")).await;
    }
    let first = c
        .describe_security_groups()
        .max_results(5)
        .send()
        .await
        .unwrap();
    assert_eq!(first.security_groups().len(), 5);
    let token = first.next_token().expect("a second page").to_owned();
    let second = c
        .describe_security_groups()
        .max_results(5)
        .next_token(token)
        .send()
        .await
        .unwrap();
    assert_eq!(second.security_groups().len(), 2);
    assert_eq!(second.next_token(), None);

    let with_ids = c
        .describe_security_groups()
        .group_ids(&default_id)
        .max_results(5)
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(with_ids), "InvalidParameterCombination");
    let small = c
        .describe_security_groups()
        .max_results(4)
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(small), "InvalidParameterValue");
    let unknown = c
        .describe_security_groups()
        .group_ids("sg-0123456789abcdef0")
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(unknown), "InvalidGroup.NotFound");
    // GroupName.N addresses the default VPC only; a VPC's groups are found by the group-name filter.
    let by_name = c
        .describe_security_groups()
        .group_names("g1")
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(by_name), "InvalidGroup.NotFound");
}

#[tokio::test]
async fn an_eni_carries_at_most_five_groups_and_the_dump_shows_groups_and_rules() {
    let mock = empty(4).await;
    let c = ec2(&mock);
    let (vpc_id, default_id) = vpc(&mock, "10.55.0.0/16").await;
    let subnet = mock
        .create_subnet(&vpc_id, "10.55.0.0/24".parse().unwrap(), "us-east-1a")
        .unwrap();
    let mut groups = vec![default_id.clone()];
    for i in 0..5 {
        groups.push(create_group(&c, &vpc_id, &format!("g{i}")).await);
    }
    let six = c
        .create_network_interface()
        .subnet_id(&subnet)
        .set_groups(Some(groups.clone()))
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(six), "SecurityGroupsPerInterfaceLimitExceeded");
    let eni = c
        .create_network_interface()
        .subnet_id(&subnet)
        .set_groups(Some(groups[1..].to_vec()))
        .send()
        .await
        .unwrap()
        .network_interface
        .unwrap()
        .network_interface_id
        .unwrap();
    let six = c
        .modify_network_interface_attribute()
        .network_interface_id(&eni)
        .set_groups(Some(groups.clone()))
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(six), "SecurityGroupsPerInterfaceLimitExceeded");
    // Given no group, an ENI gets the VPC's group named `default`, whatever its id sorts as.
    let plain = c
        .create_network_interface()
        .subnet_id(&subnet)
        .send()
        .await
        .unwrap()
        .network_interface
        .unwrap();
    assert_eq!(plain.groups()[0].group_id(), Some(default_id.as_str()));

    c.authorize_security_group_ingress()
        .group_id(&groups[1])
        .ip_permissions(
            tcp(5432, 5432)
                .user_id_group_pairs(from_group(&groups[2]))
                .build(),
        )
        .send()
        .await
        .unwrap();
    let dump = mock.dump();
    let sgs = dump["security_groups"]
        .as_array()
        .expect("groups in the dump");
    assert_eq!(sgs.len(), 6);
    let g1 = sgs.iter().find(|g| g["id"] == groups[1].as_str()).unwrap();
    assert_eq!(g1["name"], "g0");
    assert_eq!(g1["ingress"][0]["ip_protocol"], "tcp");
    assert_eq!(g1["ingress"][0]["from_port"], 5432);
    assert_eq!(g1["ingress"][0]["groups"][0], groups[2].as_str());
    assert_eq!(g1["egress"][0]["ip_ranges"][0], "0.0.0.0/0");
    let e = dump["network_interfaces"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["id"] == eni.as_str())
        .unwrap();
    assert_eq!(e["security_groups"].as_array().unwrap().len(), 5);
}

#[tokio::test]
async fn iam_and_throttling_cover_the_group_actions() {
    let mock = MockCloud::start(Config {
        throttling: mockcloud::Throttling::default(),
        seed_default_world: false,
        ..Config::fast()
    })
    .await
    .unwrap();
    let c = ec2(&mock);
    let (vpc_id, _) = vpc(&mock, "10.56.0.0/16").await;
    let db = create_group(&c, &vpc_id, "db").await;
    mock.set_iam_policy(Some(
        Policy::parse(
            &serde_json::json!({"Version": "2012-10-17", "Statement": [
                {"Effect": "Allow", "Action": "ec2:DescribeSecurityGroups", "Resource": "*"},
                {"Effect": "Allow", "Action": "ec2:AuthorizeSecurityGroupIngress",
                 "Resource": "*", "Condition": {"StringEquals": {"aws:ResourceTag/team": "db"}}}]})
            .to_string(),
        )
        .unwrap(),
    ));
    c.describe_security_groups().send().await.expect("allowed");
    let e = c
        .authorize_security_group_ingress()
        .group_id(&db)
        .ip_permissions(tcp(5432, 5432).ip_ranges(from_cidr("10.56.0.0/24")).build())
        .send()
        .await
        .unwrap_err()
        .into_service_error();
    assert_eq!(
        aws_sdk_ec2::error::ProvideErrorMetadata::code(&e),
        Some("UnauthorizedOperation")
    );
    let denial = mock.iam_denials().last().unwrap().clone();
    assert_eq!(denial.action, "ec2:AuthorizeSecurityGroupIngress");
    assert!(
        denial.resource.ends_with(&format!("security-group/{db}")),
        "{}",
        denial.resource
    );
    let create = c
        .create_security_group()
        .vpc_id(&vpc_id)
        .group_name("x")
        .description("x")
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(create), "UnauthorizedOperation");
    assert_eq!(
        mock.iam_denials().last().unwrap().action,
        "ec2:CreateSecurityGroup"
    );
    // Tagged as the condition asks, the group may be changed.
    mock.set_iam_policy(None);
    c.create_tags()
        .resources(&db)
        .tags(Tag::builder().key("team").value("db").build())
        .send()
        .await
        .unwrap();
    mock.set_iam_policy(Some(
        Policy::parse(
            &serde_json::json!({"Version": "2012-10-17", "Statement": [
                {"Effect": "Allow", "Action": "ec2:AuthorizeSecurityGroupIngress",
                 "Resource": "*", "Condition": {"StringEquals": {"aws:ResourceTag/team": "db"}}}]})
            .to_string(),
        )
        .unwrap(),
    ));
    c.authorize_security_group_ingress()
        .group_id(&db)
        .ip_permissions(tcp(5432, 5432).ip_ranges(from_cidr("10.56.0.0/24")).build())
        .send()
        .await
        .expect("the tag condition holds");
    mock.set_iam_policy(None);

    // Buckets: EC2's table puts Authorize/RevokeSecurityGroupIngress among the resource-intensive
    // actions; the others take their category's size; DescribeSecurityGroups has an unfiltered one.
    let (_, levels) = mock.throttling();
    let size = |api: &str| {
        let b = levels
            .iter()
            .find(|b| b.bucket == api)
            .unwrap_or_else(|| panic!("no bucket {api}"));
        (b.capacity, b.refill_per_sec)
    };
    assert_eq!(size("AuthorizeSecurityGroupIngress"), (50.0, 5.0));
    assert_eq!(size("RevokeSecurityGroupIngress"), (50.0, 5.0));
    assert_eq!(size("CreateSecurityGroup"), (50.0, 5.0));
    assert_eq!(size("DescribeSecurityGroups"), (100.0, 20.0));
    assert_eq!(size("DescribeSecurityGroups:unfiltered"), (50.0, 10.0));
    mock.set_bucket("DescribeSecurityGroups", mockcloud::Bucket::new(1.0, 0.001))
        .unwrap();
    let ids = || c.describe_security_groups().group_ids(&db).send();
    ids().await.unwrap();
    assert_eq!(code(ids().await.unwrap_err()), "RequestLimitExceeded");
    // The unfiltered call draws from its own bucket.
    c.describe_security_groups()
        .send()
        .await
        .expect("unfiltered bucket");
}
