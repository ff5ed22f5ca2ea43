//! mockcloud driven by the real `aws-sdk-ec2` client and the real `aws-config` IMDS client: every
//! action, every enforced error (as the SDK surfaces it), IMDSv2 tokens, IMDS lag, throttling under a
//! burst, fault injection, ClientToken idempotency, pagination, fleets, bad requests and the binary.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::time::Duration;

use aws_config::BehaviorVersion;
use aws_sdk_ec2::Client;
use aws_sdk_ec2::config::{Credentials, Region};
use aws_sdk_ec2::types::{ResourceType, Tag, TagSpecification};
use mockcloud::{Bucket, Config, Fault, MockCloud, Throttling};

mod support;
use support::{code, ec2, ec2_with_timeout, fast, filter, imds};

fn tags(pairs: &[(&str, &str)]) -> TagSpecification {
    let mut b = TagSpecification::builder().resource_type(ResourceType::NetworkInterface);
    for (k, v) in pairs {
        b = b.tags(Tag::builder().key(*k).value(*v).build());
    }
    b.build()
}

/// Creates an ENI in the default subnet with `n` secondary IPs; returns its id.
async fn create_eni(c: &Client, mock: &MockCloud, n: i32) -> String {
    let d = mock.default_world().unwrap();
    c.create_network_interface()
        .subnet_id(&d.subnet_id)
        .groups(&d.security_group_id)
        .secondary_private_ip_address_count(n)
        .send()
        .await
        .expect("create")
        .network_interface
        .unwrap()
        .network_interface_id
        .unwrap()
}

#[tokio::test]
async fn describe_instance_types_subnets_and_instances() {
    let mock = fast().await;
    let c = ec2(&mock);
    let d = mock.default_world().unwrap();

    let types = c
        .describe_instance_types()
        .instance_types("c5.4xlarge".into())
        .instance_types("m5.24xlarge".into())
        .send()
        .await
        .unwrap();
    let got: Vec<(String, i32, i32)> = types
        .instance_types()
        .iter()
        .map(|t| {
            let n = t.network_info().unwrap();
            (
                t.instance_type().unwrap().as_str().to_owned(),
                n.maximum_network_interfaces().unwrap(),
                n.ipv4_addresses_per_interface().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![("c5.4xlarge".into(), 8, 30), ("m5.24xlarge".into(), 15, 50)]
    );
    let e = c
        .describe_instance_types()
        .instance_types("x9.mega".into())
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(e), "InvalidInstanceType");

    let subnets = c
        .describe_subnets()
        .subnet_ids(&d.subnet_id)
        .send()
        .await
        .unwrap();
    let s = &subnets.subnets()[0];
    assert_eq!(s.cidr_block(), Some("10.0.0.0/20"));
    assert_eq!(s.vpc_id(), Some(d.vpc_id.as_str()));
    // 4096 - 5 reserved - 1 for the instance's primary IP.
    assert_eq!(s.available_ip_address_count(), Some(4090));
    let by_vpc = c
        .describe_subnets()
        .filters(filter("vpc-id", &d.vpc_id))
        .send()
        .await
        .unwrap();
    assert_eq!(by_vpc.subnets().len(), 1);
    assert_eq!(
        code(
            c.describe_subnets()
                .subnet_ids("subnet-0000000000000000f")
                .send()
                .await
                .unwrap_err()
        ),
        "InvalidSubnetID.NotFound"
    );
    assert_eq!(
        code(
            c.describe_subnets()
                .subnet_ids("subnet-nope")
                .send()
                .await
                .unwrap_err()
        ),
        "InvalidSubnetID.Malformed"
    );

    let inst = c
        .describe_instances()
        .instance_ids(&d.instance.instance_id)
        .send()
        .await
        .unwrap();
    let i = &inst.reservations()[0].instances()[0];
    assert_eq!(i.instance_id(), Some(d.instance.instance_id.as_str()));
    assert_eq!(i.instance_type().unwrap().as_str(), "m5.large");
    assert_eq!(
        i.placement().unwrap().availability_zone(),
        Some("us-east-1a")
    );
    assert_eq!(i.state().unwrap().name().unwrap().as_str(), "running");
    let nics = i.network_interfaces();
    assert_eq!(nics.len(), 1);
    assert_eq!(nics[0].attachment().unwrap().device_index(), Some(0));
    assert_eq!(nics[0].mac_address(), Some(d.instance.mac.as_str()));
    assert_eq!(
        code(
            c.describe_instances()
                .instance_ids("i-0000000000000000f")
                .send()
                .await
                .unwrap_err()
        ),
        "InvalidInstanceID.NotFound"
    );
}

#[tokio::test]
async fn eni_lifecycle_through_the_sdk() {
    let mock = fast().await;
    let c = ec2(&mock);
    let d = mock.default_world().unwrap();
    let inst = &d.instance.instance_id;

    let created = c
        .create_network_interface()
        .subnet_id(&d.subnet_id)
        .groups(&d.security_group_id)
        .description("eniipam test")
        .secondary_private_ip_address_count(3)
        .tag_specifications(tags(&[
            ("eniipam.io/owner", "eniipam"),
            ("eniipam.io/cluster", "c1"),
        ]))
        .client_token("tok-1")
        .send()
        .await
        .unwrap();
    let eni = created.network_interface.unwrap();
    let id = eni.network_interface_id().unwrap().to_owned();
    assert!(id.starts_with("eni-") && id.len() == 21, "{id}");
    assert_eq!(eni.status().unwrap().as_str(), "available");
    assert_eq!(eni.private_ip_addresses().len(), 4);
    assert_eq!(
        eni.private_ip_addresses()
            .iter()
            .filter(|p| p.primary() == Some(true))
            .count(),
        1
    );
    assert_eq!(eni.tag_set().len(), 2);
    assert_eq!(eni.description(), Some("eniipam test"));
    assert_eq!(
        eni.groups()[0].group_id(),
        Some(d.security_group_id.as_str())
    );
    assert!(eni.mac_address().unwrap().starts_with("02:"));

    // Filters: tag:KEY, tag-key, status, subnet-id, vpc-id, network-interface-id.
    for f in [
        filter("tag:eniipam.io/cluster", "c1"),
        filter("tag-key", "eniipam.io/owner"),
        filter("status", "available"),
        filter("network-interface-id", &id),
    ] {
        let r = c
            .describe_network_interfaces()
            .filters(f.clone())
            .filters(filter("vpc-id", &d.vpc_id))
            .filters(filter("subnet-id", &d.subnet_id))
            .send()
            .await
            .unwrap();
        let ids: Vec<&str> = r
            .network_interfaces()
            .iter()
            .filter_map(|e| e.network_interface_id())
            .collect();
        assert_eq!(ids, vec![id.as_str()], "filter {f:?}");
    }
    let none = c
        .describe_network_interfaces()
        .filters(filter("tag:eniipam.io/cluster", "other"))
        .send()
        .await
        .unwrap();
    assert!(none.network_interfaces().is_empty());

    // Attach at device 1, then DeleteOnTermination.
    let att = c
        .attach_network_interface()
        .network_interface_id(&id)
        .instance_id(inst)
        .device_index(1)
        .send()
        .await
        .unwrap()
        .attachment_id
        .unwrap();
    assert!(att.starts_with("eni-attach-"));
    let by_instance = c
        .describe_network_interfaces()
        .filters(filter("attachment.instance-id", inst))
        .send()
        .await
        .unwrap();
    assert_eq!(by_instance.network_interfaces().len(), 2);
    c.modify_network_interface_attribute()
        .network_interface_id(&id)
        .attachment(
            aws_sdk_ec2::types::NetworkInterfaceAttachmentChanges::builder()
                .attachment_id(&att)
                .delete_on_termination(true)
                .build(),
        )
        .send()
        .await
        .unwrap();
    let now = c
        .describe_network_interfaces()
        .network_interface_ids(&id)
        .send()
        .await
        .unwrap();
    let a = now.network_interfaces()[0].attachment().unwrap();
    assert_eq!(a.delete_on_termination(), Some(true));
    assert_eq!(a.device_index(), Some(1));
    assert_eq!(
        now.network_interfaces()[0].status().unwrap().as_str(),
        "in-use"
    );

    // Assign by count: the reply lists only the new addresses.
    let before: BTreeSet<String> = now.network_interfaces()[0]
        .private_ip_addresses()
        .iter()
        .filter_map(|p| p.private_ip_address().map(str::to_owned))
        .collect();
    let assigned = c
        .assign_private_ip_addresses()
        .network_interface_id(&id)
        .secondary_private_ip_address_count(2)
        .send()
        .await
        .unwrap();
    let new: Vec<String> = assigned
        .assigned_private_ip_addresses()
        .iter()
        .filter_map(|a| a.private_ip_address().map(str::to_owned))
        .collect();
    assert_eq!(new.len(), 2);
    assert!(new.iter().all(|ip| !before.contains(ip)));

    // Assign explicit, then unassign it.
    let explicit = "10.0.15.200";
    c.assign_private_ip_addresses()
        .network_interface_id(&id)
        .private_ip_addresses(explicit)
        .send()
        .await
        .unwrap();
    c.unassign_private_ip_addresses()
        .network_interface_id(&id)
        .private_ip_addresses(explicit)
        .private_ip_addresses(&new[0])
        .send()
        .await
        .unwrap();
    let after = c
        .describe_network_interfaces()
        .network_interface_ids(&id)
        .send()
        .await
        .unwrap();
    let ips: BTreeSet<String> = after.network_interfaces()[0]
        .private_ip_addresses()
        .iter()
        .filter_map(|p| p.private_ip_address().map(str::to_owned))
        .collect();
    assert_eq!(ips.len(), 5);
    assert!(!ips.contains(explicit) && !ips.contains(&new[0]));

    // Tags.
    c.create_tags()
        .resources(&id)
        .tags(
            Tag::builder()
                .key("eniipam.io/created-at")
                .value("2026-11-22T00:00:00Z")
                .build(),
        )
        .send()
        .await
        .unwrap();
    c.delete_tags()
        .resources(&id)
        .tags(Tag::builder().key("eniipam.io/cluster").build())
        .send()
        .await
        .unwrap();
    let tagged = c
        .describe_network_interfaces()
        .network_interface_ids(&id)
        .send()
        .await
        .unwrap();
    let keys: Vec<&str> = tagged.network_interfaces()[0]
        .tag_set()
        .iter()
        .filter_map(|t| t.key())
        .collect();
    assert_eq!(keys, vec!["eniipam.io/created-at", "eniipam.io/owner"]);

    // Delete while attached is refused; detach, then delete.
    let e = c
        .delete_network_interface()
        .network_interface_id(&id)
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(e), "InvalidNetworkInterface.InUse");
    c.detach_network_interface()
        .attachment_id(&att)
        .force(true)
        .send()
        .await
        .unwrap();
    c.delete_network_interface()
        .network_interface_id(&id)
        .send()
        .await
        .unwrap();
    let e = c
        .describe_network_interfaces()
        .network_interface_ids(&id)
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(e), "InvalidNetworkInterfaceID.NotFound");
    // The addresses went back to the subnet.
    let s = c
        .describe_subnets()
        .subnet_ids(&d.subnet_id)
        .send()
        .await
        .unwrap();
    assert_eq!(s.subnets()[0].available_ip_address_count(), Some(4090));
}

/// On tokio's paused clock, which mockcloud's attach delay and IMDS lag follow (issue 45): on real
/// time a loaded machine could let the 300 ms pass between the attach and the describe after it.
#[tokio::test(start_paused = true)]
async fn attach_takes_time_and_imds_lags_ec2() {
    let mut config = Config::fast();
    config.latency.attach_delay = Duration::from_millis(300);
    let mock = MockCloud::start(config).await.unwrap();
    let c = ec2(&mock);
    let d = mock.default_world().unwrap();
    let id = create_eni(&c, &mock, 2).await;
    let attached = tokio::time::Instant::now();
    c.attach_network_interface()
        .network_interface_id(&id)
        .instance_id(&d.instance.instance_id)
        .device_index(1)
        .send()
        .await
        .unwrap();
    let r = c
        .describe_network_interfaces()
        .network_interface_ids(&id)
        .send()
        .await
        .unwrap();
    let e = &r.network_interfaces()[0];
    assert_eq!(e.status().unwrap().as_str(), "attaching");
    assert_eq!(
        e.attachment().unwrap().status().unwrap().as_str(),
        "attaching"
    );
    // Attaching ENIs are not in IMDS yet.
    let md = imds(&d.instance.imds_url);
    let macs = md
        .get("/latest/meta-data/network/interfaces/macs/")
        .await
        .unwrap();
    assert_eq!(macs.as_ref().lines().count(), 1);
    // Wait for the attachment (bounded; EC2 is the authority).
    let mut status = String::new();
    for _ in 0..100 {
        let r = c
            .describe_network_interfaces()
            .network_interface_ids(&id)
            .send()
            .await
            .unwrap();
        status = r.network_interfaces()[0]
            .status()
            .unwrap()
            .as_str()
            .to_owned();
        if status == "in-use" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(status, "in-use");
    // The attach delay, no less (and the poll's 20 ms at most more).
    let took = attached.elapsed();
    assert!(
        (Duration::from_millis(300)..Duration::from_millis(330)).contains(&took),
        "{took:?}"
    );
    let macs = md
        .get("/latest/meta-data/network/interfaces/macs/")
        .await
        .unwrap();
    assert_eq!(macs.as_ref().lines().count(), 2);

    // With a lag, a second ENI and its IPs are in EC2 at once but in IMDS only later.
    mock.set_imds_lag(Duration::from_secs(3600));
    mock.set_latency({
        let mut p = mockcloud::LatencyProfile::fast();
        p.imds_lag = Duration::from_secs(3600);
        p
    });
    let id2 = create_eni(&c, &mock, 1).await;
    c.attach_network_interface()
        .network_interface_id(&id2)
        .instance_id(&d.instance.instance_id)
        .device_index(2)
        .send()
        .await
        .unwrap();
    c.assign_private_ip_addresses()
        .network_interface_id(&id2)
        .secondary_private_ip_address_count(4)
        .send()
        .await
        .unwrap();
    let r = c
        .describe_network_interfaces()
        .network_interface_ids(&id2)
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.network_interfaces()[0].status().unwrap().as_str(),
        "in-use"
    );
    assert_eq!(
        r.network_interfaces()[0].private_ip_addresses().len(),
        6,
        "EC2 shows the new ENI and IPs"
    );
    let mac2 = r.network_interfaces()[0].mac_address().unwrap().to_owned();
    let macs = md
        .get("/latest/meta-data/network/interfaces/macs/")
        .await
        .unwrap();
    assert!(!macs.as_ref().contains(&mac2), "IMDS does not show it yet");
    mock.set_imds_lag(Duration::ZERO);
    let ips = md
        .get(format!(
            "/latest/meta-data/network/interfaces/macs/{mac2}/local-ipv4s"
        ))
        .await
        .unwrap();
    assert_eq!(ips.as_ref().lines().count(), 6);
    assert_eq!(
        md.get(format!(
            "/latest/meta-data/network/interfaces/macs/{mac2}/device-number"
        ))
        .await
        .unwrap()
        .as_ref(),
        "2"
    );
}

#[tokio::test(start_paused = true)]
async fn imds_lag_follows_the_clock() {
    use mockcloud::world::{AssignArgs, CreateEniArgs};
    let mut config = Config::fast();
    config.latency.imds_lag = Duration::from_secs(2);
    config.latency.attach_delay = Duration::from_secs(1);
    let mock = MockCloud::start(config).await.unwrap();
    let d = mock.default_world().unwrap();
    let inst = d.instance.instance_id.clone();
    // The primary interface is in IMDS from boot.
    assert_eq!(mock.imds_view(&inst).unwrap().interfaces.len(), 1);
    let eni = mock.with_world(|w, now| {
        let e = w
            .create_network_interface(
                &CreateEniArgs {
                    subnet_id: d.subnet_id.clone(),
                    secondary_count: 2,
                    ..Default::default()
                },
                now,
            )
            .unwrap();
        w.attach_network_interface(&e.id, &inst, 1, now).unwrap();
        e
    });
    let seen = |mock: &MockCloud| {
        mock.imds_view(&inst)
            .unwrap()
            .interfaces
            .iter()
            .find(|i| i.eni_id == eni.id)
            .map(|i| i.ips.len())
    };
    assert_eq!(seen(&mock), None, "attaching");
    tokio::time::advance(Duration::from_millis(2900)).await;
    assert_eq!(seen(&mock), None, "attached at 1 s, visible at 3 s");
    tokio::time::advance(Duration::from_millis(200)).await;
    assert_eq!(seen(&mock), Some(3));
    mock.with_world(|w, now| {
        w.assign_private_ip_addresses(&eni.id, AssignArgs::Count(2), now)
            .unwrap()
    });
    assert_eq!(seen(&mock), Some(3), "new IPs lag");
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(seen(&mock), Some(5));
    // Detach: EC2 forgets the attachment at once, IMDS still lists the ENI until the lag passes.
    let att = mock.instance(&inst).unwrap().enis[1]
        .attachment
        .clone()
        .unwrap()
        .id;
    mock.with_world(|w, now| w.detach_network_interface(&att, false, now).unwrap());
    assert_eq!(mock.instance(&inst).unwrap().enis.len(), 1);
    assert_eq!(seen(&mock), Some(5));
    tokio::time::advance(Duration::from_millis(2100)).await;
    assert_eq!(seen(&mock), None);
}

#[tokio::test]
async fn imds_v2_token_handling() {
    let mock = fast().await;
    let d = mock.default_world().unwrap();
    let url = &d.instance.imds_url;
    let md = imds(url);
    assert_eq!(
        md.get("/latest/meta-data/instance-id")
            .await
            .unwrap()
            .as_ref(),
        d.instance.instance_id
    );
    assert_eq!(
        md.get("/latest/meta-data/instance-type")
            .await
            .unwrap()
            .as_ref(),
        "m5.large"
    );
    assert_eq!(
        md.get("/latest/meta-data/placement/availability-zone")
            .await
            .unwrap()
            .as_ref(),
        "us-east-1a"
    );
    assert_eq!(
        md.get("/latest/meta-data/mac").await.unwrap().as_ref(),
        d.instance.mac
    );
    let base = format!(
        "/latest/meta-data/network/interfaces/macs/{}/",
        d.instance.mac
    );
    let get = |p: &str| {
        let md = md.clone();
        let path = format!("{base}{p}");
        async move { md.get(path).await.unwrap().as_ref().to_owned() }
    };
    assert_eq!(get("interface-id").await, d.instance.primary_eni);
    assert_eq!(get("device-number").await, "0");
    assert_eq!(get("subnet-id").await, d.subnet_id);
    assert_eq!(get("vpc-id").await, d.vpc_id);
    assert_eq!(get("subnet-ipv4-cidr-block").await, "10.0.0.0/20");
    assert_eq!(get("vpc-ipv4-cidr-blocks").await, "10.0.0.0/16");
    assert_eq!(get("security-group-ids").await, d.security_group_id);
    assert_eq!(get("local-ipv4s").await, d.instance.private_ip.to_string());
    assert!(md.get("/latest/meta-data/no-such-thing").await.is_err());

    // Raw HTTP: no token → 401; the token reply carries the TTL header.
    let http = reqwest::Client::new();
    let r = http
        .get(format!("{url}/latest/meta-data/instance-id"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = http
        .get(format!("{url}/latest/meta-data/instance-id"))
        .header("x-aws-ec2-metadata-token", "forged")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = http
        .put(format!("{url}/latest/api/token"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400, "a token request needs a TTL");
    let r = http
        .put(format!("{url}/latest/api/token"))
        .header("x-aws-ec2-metadata-token-ttl-seconds", "60")
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["x-aws-ec2-metadata-token-ttl-seconds"], "60");
    let token = r.text().await.unwrap();
    let r = http
        .get(format!("{url}/latest/meta-data/instance-id"))
        .header("x-aws-ec2-metadata-token", &token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), d.instance.instance_id);
    assert!(mock.counters().imds_unauthorized >= 2);
}

#[tokio::test]
async fn limits_are_enforced_with_ec2_codes() {
    let mut config = Config::fast();
    config.default_instance_type = "t3.medium".into(); // 3 ENIs x 6 IPs
    let mock = MockCloud::start(config).await.unwrap();
    let c = ec2(&mock);
    let d = mock.default_world().unwrap();
    let inst = &d.instance.instance_id;

    // PrivateIpAddressLimitExceeded: 6 per ENI on t3.medium.
    let a = create_eni(&c, &mock, 5).await;
    c.attach_network_interface()
        .network_interface_id(&a)
        .instance_id(inst)
        .device_index(1)
        .send()
        .await
        .unwrap();
    let e = c
        .assign_private_ip_addresses()
        .network_interface_id(&a)
        .secondary_private_ip_address_count(1)
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(e), "PrivateIpAddressLimitExceeded");
    // An ENI with too many IPs for the type cannot be attached.
    let big = create_eni(&c, &mock, 10).await;
    let e = c
        .attach_network_interface()
        .network_interface_id(&big)
        .instance_id(inst)
        .device_index(2)
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(e), "PrivateIpAddressLimitExceeded");

    // Device index taken; then AttachmentLimitExceeded once 3 are attached.
    let b = create_eni(&c, &mock, 1).await;
    let e = c
        .attach_network_interface()
        .network_interface_id(&b)
        .instance_id(inst)
        .device_index(1)
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(e), "InvalidParameterValue");
    c.attach_network_interface()
        .network_interface_id(&b)
        .instance_id(inst)
        .device_index(2)
        .send()
        .await
        .unwrap();
    let x = create_eni(&c, &mock, 1).await;
    let e = c
        .attach_network_interface()
        .network_interface_id(&x)
        .instance_id(inst)
        .device_index(3)
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(e), "AttachmentLimitExceeded");
    // Attaching an attached ENI is InUse.
    let e = c
        .attach_network_interface()
        .network_interface_id(&b)
        .instance_id(inst)
        .device_index(2)
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(e), "InvalidNetworkInterface.InUse");
    // The primary ENI cannot be detached.
    let primary_att = c
        .describe_network_interfaces()
        .network_interface_ids(&d.instance.primary_eni)
        .send()
        .await
        .unwrap()
        .network_interfaces()[0]
        .attachment()
        .unwrap()
        .attachment_id()
        .unwrap()
        .to_owned();
    let e = c
        .detach_network_interface()
        .attachment_id(primary_att)
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(e), "OperationNotPermitted");

    // Ids: malformed and unknown.
    let e = c
        .delete_network_interface()
        .network_interface_id("eni-xyz")
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(e), "InvalidNetworkInterfaceID.Malformed");
    let e = c
        .delete_network_interface()
        .network_interface_id("eni-0123456789abcdef0")
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(e), "InvalidNetworkInterfaceID.NotFound");
    let e = c
        .detach_network_interface()
        .attachment_id("eni-attach-0123456789abcdef0")
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(e), "InvalidAttachmentID.NotFound");
}

#[tokio::test]
async fn attachment_limit_exceeded_on_a_full_instance() {
    let mut config = Config::fast();
    config.default_instance_type = "t3.medium".into();
    let mock = MockCloud::start(config).await.unwrap();
    let c = ec2(&mock);
    let inst = mock.default_instance().instance_id;
    // Device indexes 1, 2 fill a 3-ENI instance; a 4th ENI at any index is refused.
    for idx in 1..=2 {
        let e = create_eni(&c, &mock, 0).await;
        c.attach_network_interface()
            .network_interface_id(&e)
            .instance_id(&inst)
            .device_index(idx)
            .send()
            .await
            .unwrap();
    }
    let e = create_eni(&c, &mock, 0).await;
    let err = c
        .attach_network_interface()
        .network_interface_id(&e)
        .instance_id(&inst)
        .device_index(2)
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(err), "AttachmentLimitExceeded", "the instance is full");
    let view = mock.instance(&inst).unwrap();
    assert_eq!(view.enis.len(), 3);
    let err = c
        .attach_network_interface()
        .network_interface_id(&e)
        .instance_id(&inst)
        .device_index(3)
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(err), "AttachmentLimitExceeded");
    // Detaching one frees a slot.
    let att = view.enis[2].attachment.clone().unwrap().id;
    c.detach_network_interface()
        .attachment_id(att)
        .send()
        .await
        .unwrap();
    c.attach_network_interface()
        .network_interface_id(&e)
        .instance_id(&inst)
        .device_index(2)
        .send()
        .await
        .unwrap();
    assert_eq!(mock.instance(&inst).unwrap().enis.len(), 3);
    // An index beyond the type's range on a non-full instance is a bad parameter.
    let d = mock.default_world().unwrap();
    let other = mock
        .launch_instance("t3.medium", &d.subnet_id)
        .await
        .unwrap();
    let err = c
        .attach_network_interface()
        .network_interface_id(&create_eni(&c, &mock, 0).await)
        .instance_id(&other.instance_id)
        .device_index(7)
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(err), "InvalidParameterValue");
}

#[tokio::test]
async fn subnet_capacity_and_address_rules() {
    let mock = MockCloud::start(Config {
        seed_default_world: false,
        ..Config::fast()
    })
    .await
    .unwrap();
    let (vpc, sg) = mock.create_vpc("10.1.0.0/16".parse().unwrap()).unwrap();
    let subnet = mock
        .create_subnet(&vpc, "10.1.0.0/28".parse().unwrap(), "us-east-1a")
        .unwrap(); // 11 usable
    let c = ec2(&mock);
    // More than the subnet holds fails fast, and changes nothing.
    let e = c
        .create_network_interface()
        .subnet_id(&subnet)
        .groups(&sg)
        .secondary_private_ip_address_count(11)
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(e), "InsufficientFreeAddressesInSubnet");
    assert!(mock.network_interfaces().is_empty());
    let a = c
        .create_network_interface()
        .subnet_id(&subnet)
        .groups(&sg)
        .secondary_private_ip_address_count(9)
        .send()
        .await
        .unwrap()
        .network_interface
        .unwrap()
        .network_interface_id
        .unwrap();
    let e = c
        .assign_private_ip_addresses()
        .network_interface_id(&a)
        .secondary_private_ip_address_count(2)
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(e), "InsufficientFreeAddressesInSubnet");
    c.assign_private_ip_addresses()
        .network_interface_id(&a)
        .secondary_private_ip_address_count(1)
        .send()
        .await
        .unwrap();
    let eni = &mock.network_interfaces()[0];
    let mut all: Vec<Ipv4Addr> = std::iter::once(eni.primary_ip)
        .chain(eni.secondary_ips.clone())
        .collect();
    all.sort();
    assert_eq!(all.len(), 11);
    assert_eq!(
        all.first().unwrap().octets()[3],
        4,
        "first four addresses are reserved"
    );
    assert_eq!(
        all.last().unwrap().octets()[3],
        14,
        "the broadcast address is reserved"
    );
    let e = c
        .assign_private_ip_addresses()
        .network_interface_id(&a)
        .secondary_private_ip_address_count(1)
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(e), "InsufficientFreeAddressesInSubnet");

    // Explicit addresses: in use, reserved, outside.
    let subnet2 = mock
        .create_subnet(&vpc, "10.1.1.0/24".parse().unwrap(), "us-east-1a")
        .unwrap();
    let b = c
        .create_network_interface()
        .subnet_id(&subnet2)
        .groups(&sg)
        .send()
        .await
        .unwrap()
        .network_interface
        .unwrap()
        .network_interface_id
        .unwrap();
    let cc = c
        .create_network_interface()
        .subnet_id(&subnet2)
        .groups(&sg)
        .send()
        .await
        .unwrap()
        .network_interface
        .unwrap()
        .network_interface_id
        .unwrap();
    c.assign_private_ip_addresses()
        .network_interface_id(&b)
        .private_ip_addresses("10.1.1.50")
        .send()
        .await
        .unwrap();
    let e = c
        .assign_private_ip_addresses()
        .network_interface_id(&cc)
        .private_ip_addresses("10.1.1.50")
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(e), "InvalidIPAddress.InUse");
    // AllowReassignment moves it.
    c.assign_private_ip_addresses()
        .network_interface_id(&cc)
        .private_ip_addresses("10.1.1.50")
        .allow_reassignment(true)
        .send()
        .await
        .unwrap();
    let views = mock.network_interfaces();
    let holder: Vec<&str> = views
        .iter()
        .filter(|e| e.secondary_ips.contains(&"10.1.1.50".parse().unwrap()))
        .map(|e| e.id.as_str())
        .collect();
    assert_eq!(holder, vec![cc.as_str()]);
    for bad in ["10.1.1.1", "10.1.1.255", "10.1.2.9"] {
        let e = c
            .assign_private_ip_addresses()
            .network_interface_id(&b)
            .private_ip_addresses(bad)
            .send()
            .await
            .unwrap_err();
        assert_eq!(code(e), "InvalidParameterValue", "{bad}");
    }
    let e = c
        .create_network_interface()
        .subnet_id(&subnet2)
        .groups(&sg)
        .private_ip_address("10.1.1.50")
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(e), "InvalidIPAddress.InUse");
    // Unassigning an address the ENI does not hold, or its primary, is refused.
    let e = c
        .unassign_private_ip_addresses()
        .network_interface_id(&b)
        .private_ip_addresses("10.1.1.77")
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(e), "InvalidParameterValue");
    // Unknown subnet / group.
    let e = c
        .create_network_interface()
        .subnet_id("subnet-0123456789abcdef0")
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(e), "InvalidSubnetID.NotFound");
    let e = c
        .create_network_interface()
        .subnet_id(&subnet2)
        .groups("sg-0123456789abcdef0")
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(e), "InvalidGroup.NotFound");
    // Addresses are unique VPC-wide.
    let mut seen = BTreeSet::new();
    for e in mock.network_interfaces() {
        for ip in std::iter::once(e.primary_ip).chain(e.secondary_ips) {
            assert!(seen.insert(ip), "{ip} twice");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn client_token_makes_create_idempotent() {
    let mock = fast().await;
    let d = mock.default_world().unwrap();
    // The first attempt is performed but its reply arrives after the client gave up.
    mock.inject_fault(Fault::slow_reply(
        "CreateNetworkInterface",
        Duration::from_millis(800),
        1,
    ));
    let impatient = ec2_with_timeout(&mock, Some(Duration::from_millis(200)));
    let create = |c: Client| {
        let d = d.clone();
        async move {
            c.create_network_interface()
                .subnet_id(&d.subnet_id)
                .secondary_private_ip_address_count(2)
                .client_token("retry-me")
                .send()
                .await
        }
    };
    let e = create(impatient.clone()).await.unwrap_err();
    assert!(
        matches!(e, aws_sdk_ec2::error::SdkError::TimeoutError(_)),
        "{e:?}"
    );
    let second = create(impatient.clone())
        .await
        .unwrap()
        .network_interface
        .unwrap();
    let third = create(ec2(&mock)).await.unwrap().network_interface.unwrap();
    assert_eq!(second.network_interface_id(), third.network_interface_id());
    assert_eq!(
        mock.network_interfaces().len(),
        2,
        "the primary ENI and exactly one created ENI"
    );
    // Same token, other parameters.
    let e = ec2(&mock)
        .create_network_interface()
        .subnet_id(&d.subnet_id)
        .secondary_private_ip_address_count(5)
        .client_token("retry-me")
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(e), "IdempotentParameterMismatch");
}

#[tokio::test]
async fn throttling_under_a_burst() {
    let mock = fast().await;
    mock.set_throttling(Throttling::uniform(
        Bucket::new(10.0, 0.5),
        Bucket::new(100.0, 20.0),
    ));
    let c = ec2(&mock);
    let id = mock.default_instance().primary_eni;
    let calls = (0..40).map(|i| {
        let c = c.clone();
        let id = id.clone();
        async move {
            c.create_tags()
                .resources(id)
                .tags(Tag::builder().key(format!("k{i}")).value("v").build())
                .send()
                .await
        }
    });
    let results = futures_join(calls).await;
    let ok = results.iter().filter(|r| r.is_ok()).count();
    let throttled: Vec<String> = results
        .into_iter()
        .filter_map(|r| r.err())
        .map(code)
        .collect();
    assert!(
        (10..=11).contains(&ok),
        "about the bucket's capacity gets through, got {ok}"
    );
    assert!(
        throttled.iter().all(|c| c == "RequestLimitExceeded"),
        "{throttled:?}"
    );
    let counters = mock.counters();
    assert_eq!(counters.calls("CreateTags"), 40);
    assert_eq!(counters.throttled("CreateTags") as usize, throttled.len());
    // Describe calls draw from their own bucket and are not throttled.
    c.describe_network_interfaces().send().await.unwrap();
}

async fn futures_join<F>(fs: impl IntoIterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = fs.into_iter().map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}

#[tokio::test(start_paused = true)]
async fn injected_faults_errors_hangs_and_denials() {
    let mock = fast().await;
    let c = ec2(&mock);
    let id = mock.default_instance().primary_eni;
    mock.inject_fault(Fault::error("AssignPrivateIpAddresses", "InternalError", 2));
    for _ in 0..2 {
        let e = c
            .assign_private_ip_addresses()
            .network_interface_id(&id)
            .secondary_private_ip_address_count(1)
            .send()
            .await
            .unwrap_err();
        let status = e.raw_response().map(|r| r.status().as_u16());
        assert_eq!((code(e), status), ("InternalError".to_owned(), Some(500)));
    }
    c.assign_private_ip_addresses()
        .network_interface_id(&id)
        .secondary_private_ip_address_count(1)
        .send()
        .await
        .unwrap();
    assert_eq!(
        mock.instance(&mock.default_instance().instance_id)
            .unwrap()
            .enis[0]
            .secondary_ips
            .len(),
        1,
        "failed calls changed nothing"
    );

    // A hang past the client's timeout: nothing performed.
    mock.inject_fault(Fault::hang(
        "AssignPrivateIpAddresses",
        Duration::from_millis(600),
        1,
    ));
    let impatient = ec2_with_timeout(&mock, Some(Duration::from_millis(150)));
    let e = impatient
        .assign_private_ip_addresses()
        .network_interface_id(&id)
        .secondary_private_ip_address_count(1)
        .send()
        .await
        .unwrap_err();
    assert!(
        matches!(e, aws_sdk_ec2::error::SdkError::TimeoutError(_)),
        "{e:?}"
    );
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(
        mock.instance(&mock.default_instance().instance_id)
            .unwrap()
            .enis[0]
            .secondary_ips
            .len(),
        1
    );

    // Random error rate on every action.
    mock.inject_fault(Fault::rate(None, "ServiceUnavailable", 1.0));
    let e = c.describe_subnets().send().await.unwrap_err();
    assert_eq!(code(e), "ServiceUnavailable");
    mock.clear_faults();
    c.describe_subnets().send().await.unwrap();

    // A missing IAM permission.
    mock.deny("CreateNetworkInterface", true);
    let d = mock.default_world().unwrap();
    let e = c
        .create_network_interface()
        .subnet_id(&d.subnet_id)
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(e), "UnauthorizedOperation");
    mock.deny("CreateNetworkInterface", false);
    c.create_network_interface()
        .subnet_id(&d.subnet_id)
        .send()
        .await
        .unwrap();
}

#[tokio::test]
async fn describe_network_interfaces_paginates() {
    let mock = fast().await;
    let c = ec2(&mock);
    for _ in 0..11 {
        create_eni(&c, &mock, 0).await;
    }
    let first = c
        .describe_network_interfaces()
        .max_results(5)
        .send()
        .await
        .unwrap();
    assert_eq!(first.network_interfaces().len(), 5);
    assert!(first.next_token().is_some());
    let all: Vec<String> = c
        .describe_network_interfaces()
        .max_results(5)
        .into_paginator()
        .items()
        .send()
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .map(|e| e.unwrap().network_interface_id.unwrap())
        .collect();
    assert_eq!(all.len(), 12);
    assert_eq!(all.iter().collect::<BTreeSet<_>>().len(), 12);
    let e = c
        .describe_network_interfaces()
        .max_results(2)
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(e), "InvalidParameterValue");
    let e = c
        .describe_network_interfaces()
        .next_token("garbage")
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(e), "InvalidParameterValue");
    let e = c
        .describe_network_interfaces()
        .filters(filter("bogus-filter", "x"))
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(e), "InvalidParameterValue");
}

#[tokio::test]
async fn a_fleet_each_with_its_own_imds() {
    let mock = fast().await;
    let d = mock.default_world().unwrap();
    let c = ec2(&mock);
    let mut nodes = Vec::new();
    for t in ["t3.medium", "c5.4xlarge", "m5.24xlarge"] {
        nodes.push(mock.launch_instance(t, &d.subnet_id).await.unwrap());
    }
    for n in &nodes {
        let md = imds(&n.imds_url);
        assert_eq!(
            md.get("/latest/meta-data/instance-id")
                .await
                .unwrap()
                .as_ref(),
            n.instance_id
        );
        assert_eq!(
            md.get("/latest/meta-data/instance-type")
                .await
                .unwrap()
                .as_ref(),
            n.instance_type
        );
        let eni = create_eni(&c, &mock, 1).await;
        c.attach_network_interface()
            .network_interface_id(&eni)
            .instance_id(&n.instance_id)
            .device_index(1)
            .send()
            .await
            .unwrap();
        let macs = md
            .get("/latest/meta-data/network/interfaces/macs/")
            .await
            .unwrap();
        assert_eq!(
            macs.as_ref().lines().count(),
            2,
            "each instance sees only its own ENIs"
        );
    }
    // A token from one instance is not valid on another.
    let http = reqwest::Client::new();
    let token = http
        .put(format!("{}/latest/api/token", nodes[0].imds_url))
        .header("x-aws-ec2-metadata-token-ttl-seconds", "60")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let r = http
        .get(format!(
            "{}/latest/meta-data/instance-id",
            nodes[1].imds_url
        ))
        .header("x-aws-ec2-metadata-token", token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    // Terminating one: DeleteOnTermination ENIs go, others become available.
    mock.terminate_instance(&nodes[0].instance_id).unwrap();
    let left: Vec<_> = mock
        .network_interfaces()
        .into_iter()
        .filter(|e| e.primary_ip == nodes[0].private_ip)
        .collect();
    assert!(
        left.is_empty(),
        "the primary ENI was deleted with the instance"
    );
}

#[tokio::test]
async fn bad_requests_get_ec2_errors_and_change_nothing() {
    let mock = fast().await;
    let before = mock.dump();
    let http = reqwest::Client::new();
    let url = mock.ec2_url();
    let post = |body: &'static str, auth: bool| {
        let mut r = http
            .post(&url)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body);
        if auth {
            r = r.header("authorization", "AWS4-HMAC-SHA256 Credential=x");
        }
        async move {
            let r = r.send().await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    let cases: &[(&str, bool, u16, &str)] = &[
        ("Version=2016-11-15", true, 400, "MissingAction"),
        (
            "Action=LaunchMissiles&Version=2016-11-15",
            true,
            400,
            "InvalidAction",
        ),
        ("Action=DescribeSubnets", true, 400, "MissingParameter"),
        (
            "Action=DescribeSubnets&Version=2016-11-15",
            false,
            401,
            "AuthFailure",
        ),
        (
            "Action=CreateNetworkInterface&Version=2016-11-15",
            true,
            400,
            "MissingParameter",
        ),
        (
            "Action=AttachNetworkInterface&Version=2016-11-15&NetworkInterfaceId=eni-12345678&InstanceId=i-12345678",
            true,
            400,
            "MissingParameter",
        ),
        (
            "Action=AttachNetworkInterface&Version=2016-11-15&NetworkInterfaceId=eni-12345678&InstanceId=i-12345678&DeviceIndex=banana",
            true,
            400,
            "InvalidParameterValue",
        ),
        (
            "Action=AssignPrivateIpAddresses&Version=2016-11-15&NetworkInterfaceId=eni-12345678",
            true,
            400,
            "MissingParameter",
        ),
        (
            "Action=AssignPrivateIpAddresses&Version=2016-11-15&NetworkInterfaceId=eni-12345678&SecondaryPrivateIpAddressCount=1&PrivateIpAddress.1=10.0.0.9",
            true,
            400,
            "InvalidParameterCombination",
        ),
        (
            "Action=UnassignPrivateIpAddresses&Version=2016-11-15&NetworkInterfaceId=eni-zz",
            true,
            400,
            "InvalidNetworkInterfaceID.Malformed",
        ),
        (
            "Action=DescribeNetworkInterfaces&Version=2016-11-15&Filter.1.Name=status",
            true,
            400,
            "InvalidParameterValue",
        ),
        (
            "Action=DescribeNetworkInterfaces&Version=2016-11-15&DryRun=true",
            true,
            412,
            "DryRunOperation",
        ),
        (
            "Action=CreateTags&Version=2016-11-15&ResourceId.1=eni-12345678&Tag.1.Key=aws:reserved&Tag.1.Value=x",
            true,
            400,
            "InvalidParameterValue",
        ),
        ("%%%garbage", true, 400, "MissingAction"),
    ];
    for (body, auth, status, expected) in cases {
        let (s, text) = post(body, *auth).await;
        assert_eq!(s, *status, "{body}: {text}");
        assert!(
            text.contains(&format!("<Code>{expected}</Code>")),
            "{body}: {text}"
        );
        assert!(
            text.starts_with("<?xml") && text.contains("<Response><Errors><Error>"),
            "{text}"
        );
    }
    // A huge body is refused without harm.
    let big = "A=".to_owned() + &"x".repeat(3 << 20);
    let r = http.post(&url).body(big).send().await.unwrap();
    assert!(r.status().is_client_error());
    assert_eq!(mock.dump(), before, "no bad request changed the state");
    // Still serving.
    ec2(&mock).describe_subnets().send().await.unwrap();
}

#[tokio::test]
async fn control_api_over_http() {
    let mock = MockCloud::start(Config {
        seed_default_world: false,
        ..Config::fast()
    })
    .await
    .unwrap();
    let http = reqwest::Client::new();
    let ctl = mock.control_url();
    let vpc: serde_json::Value = http
        .post(format!("{ctl}/vpcs"))
        .json(&serde_json::json!({"cidr": "10.9.0.0/16"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let vpc_id = vpc["vpc_id"].as_str().unwrap();
    let subnet: serde_json::Value = http
        .post(format!("{ctl}/subnets"))
        .json(&serde_json::json!({"vpc_id": vpc_id, "cidr": "10.9.0.0/24"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let inst: serde_json::Value = http
        .post(format!("{ctl}/instances"))
        .json(&serde_json::json!({"instance_type": "c5.4xlarge", "subnet_id": subnet["subnet_id"]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let imds_url = inst["imds_url"].as_str().unwrap();
    assert_eq!(
        imds(imds_url)
            .get("/latest/meta-data/instance-type")
            .await
            .unwrap()
            .as_ref(),
        "c5.4xlarge"
    );
    let r = http
        .post(format!("{ctl}/instances"))
        .json(&serde_json::json!({"instance_type": "nope.big", "subnet_id": subnet["subnet_id"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let r = http
        .post(format!("{ctl}/faults"))
        .json(&serde_json::json!({"action": "DescribeSubnets", "kind": "error", "code": "InternalError", "status": 500, "count": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let e = ec2(&mock).describe_subnets().send().await.unwrap_err();
    assert_eq!(code(e), "InternalError");
    ec2(&mock).describe_subnets().send().await.unwrap();
    let counters: serde_json::Value = http
        .get(format!("{ctl}/counters"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(counters["actions"]["DescribeSubnets"]["calls"], 2);
    assert_eq!(
        counters["actions"]["DescribeSubnets"]["errors"]["InternalError"],
        1
    );
    let r = http
        .put(format!("{ctl}/latency"))
        .json(&serde_json::json!({"profile": "warp"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let r = http
        .put(format!("{ctl}/latency"))
        .json(&serde_json::json!({"profile": "realistic"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let r = http
        .get(format!("{ctl}/nothing-here"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let state: serde_json::Value = http
        .get(format!("{ctl}/state"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(state["instances"].as_array().unwrap().len(), 1);
    let calls: Vec<serde_json::Value> = http
        .get(format!("{ctl}/calls"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(calls.len(), 2);
}

#[tokio::test]
async fn the_binary_prints_its_urls_and_serves() {
    let (mut child, urls) = support::start_binary(&["--profile", "fast"]).await;
    let ec2_url = urls["ec2"].as_str().unwrap();
    let imds_url = urls["default"]["instance"]["imds_url"].as_str().unwrap();
    assert!(ec2_url.starts_with("http://127.0.0.1:"));
    let conf = aws_sdk_ec2::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .endpoint_url(ec2_url)
        .credentials_provider(Credentials::new("a", "b", None, None, "test"))
        .build();
    let c = Client::from_conf(conf);
    let r = c.describe_instances().send().await.unwrap();
    assert_eq!(r.reservations().len(), 1);
    let id = imds(imds_url)
        .get("/latest/meta-data/instance-id")
        .await
        .unwrap();
    assert_eq!(
        id.as_ref(),
        urls["default"]["instance"]["instance_id"].as_str().unwrap()
    );
    child.kill().await.unwrap();

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mockcloud"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    for flag in [
        "--listen",
        "--profile",
        "--no-throttling",
        "--imds-lag-ms",
        "--instance-type",
        "--no-default-world",
    ] {
        assert!(help.contains(flag), "--help documents {flag}");
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mockcloud"))
        .args(["--profile", "warp"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--profile"));
}

/// EC2 is eventually consistent: the SDK's describes show what a change did only after the describe
/// lag, while the change's own reply is exact. The lag is set over the control API.
#[tokio::test]
async fn describes_lag_the_changes_they_follow() {
    let mock = MockCloud::start(Config::fast()).await.unwrap();
    let c = ec2(&mock);
    let http = reqwest::Client::new();
    let set_lag = |ms: u64| {
        let http = http.clone();
        let url = format!("{}/describe-lag", mock.control_url());
        async move {
            let r = http
                .put(url)
                .json(&serde_json::json!({ "ms": ms }))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 204);
        }
    };
    set_lag(3_600_000).await;
    let d = mock.default_world().unwrap();
    let created = c
        .create_network_interface()
        .subnet_id(&d.subnet_id)
        .groups(&d.security_group_id)
        .secondary_private_ip_address_count(2)
        .send()
        .await
        .unwrap()
        .network_interface
        .unwrap();
    let id = created.network_interface_id.clone().unwrap();
    let secondaries: Vec<String> = created
        .private_ip_addresses()
        .iter()
        .filter(|a| a.primary() == Some(false))
        .filter_map(|a| a.private_ip_address().map(str::to_owned))
        .collect();
    assert_eq!(secondaries.len(), 2, "the create's reply is exact");
    let described = |c: Client, id: String| async move {
        let r = c
            .describe_network_interfaces()
            .network_interface_ids(id)
            .send()
            .await
            .unwrap();
        let mut ips: Vec<String> = r.network_interfaces()[0]
            .private_ip_addresses()
            .iter()
            .filter(|a| a.primary() == Some(false))
            .filter_map(|a| a.private_ip_address().map(str::to_owned))
            .collect();
        ips.sort();
        ips
    };
    assert!(
        described(c.clone(), id.clone()).await.is_empty(),
        "a describe within the lag does not show the new addresses"
    );
    let assigned = c
        .assign_private_ip_addresses()
        .network_interface_id(&id)
        .secondary_private_ip_address_count(1)
        .send()
        .await
        .unwrap();
    assert_eq!(assigned.assigned_private_ip_addresses().len(), 1);
    c.unassign_private_ip_addresses()
        .network_interface_id(&id)
        .private_ip_addresses(&secondaries[0])
        .send()
        .await
        .unwrap();
    assert_eq!(
        described(c.clone(), id.clone()).await,
        vec![secondaries[0].clone()],
        "a describe within the lag still shows the address unassigned"
    );
    let truth = mock.network_interfaces();
    let truth = truth.iter().find(|e| e.id == id).unwrap();
    assert_eq!(truth.secondary_ips.len(), 2, "the truth");
    set_lag(0).await;
    let mut now: Vec<String> = vec![
        secondaries[1].clone(),
        assigned.assigned_private_ip_addresses()[0]
            .private_ip_address()
            .unwrap()
            .to_owned(),
    ];
    now.sort();
    assert_eq!(described(c.clone(), id.clone()).await, now);
}

/// EC2's eventual consistency right after a create (AWS's *Eventual consistency in the Amazon EC2
/// API*): a new ENI is not listed by describes, and its first call is refused as not found; an
/// attachment does not show in describes for as long.
#[tokio::test]
async fn a_new_eni_lags_in_describes_and_its_first_call_is_refused() {
    let mock = fast().await;
    let c = ec2(&mock);
    let http = reqwest::Client::new();
    let set_lag = |ms: u64, refusals: u32| {
        let http = http.clone();
        let url = format!("{}/new-eni-lag", mock.control_url());
        async move {
            let r = http
                .put(url)
                .json(&serde_json::json!({ "ms": ms, "refusals": refusals }))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 204);
        }
    };
    set_lag(3_600_000, 1).await;
    let inst = mock.default_instance().instance_id;
    let id = create_eni(&c, &mock, 1).await;
    assert!(
        mock.network_interfaces().iter().any(|e| e.id == id),
        "the truth has it at once"
    );
    let e = c
        .describe_network_interfaces()
        .network_interface_ids(&id)
        .send()
        .await
        .unwrap_err();
    assert_eq!(code(e), "InvalidNetworkInterfaceID.NotFound");
    let listed = c.describe_network_interfaces().send().await.unwrap();
    assert!(
        !listed
            .network_interfaces()
            .iter()
            .any(|n| n.network_interface_id() == Some(id.as_str())),
        "an unfiltered describe does not list it either"
    );
    let attach = || {
        c.attach_network_interface()
            .network_interface_id(&id)
            .instance_id(&inst)
            .device_index(1)
            .send()
    };
    let e = attach().await.unwrap_err();
    assert_eq!(
        code(e),
        "InvalidNetworkInterfaceID.NotFound",
        "the first call is refused"
    );
    let truth = mock.network_interfaces();
    let truth = truth.iter().find(|e| e.id == id).unwrap();
    assert!(truth.attachment.is_none(), "refused unperformed");
    attach().await.expect("the second call goes through");
    let attached_in_describes = || async {
        let r = c
            .describe_instances()
            .instance_ids(&inst)
            .send()
            .await
            .unwrap();
        r.reservations()[0].instances()[0]
            .network_interfaces()
            .iter()
            .any(|n| n.network_interface_id() == Some(id.as_str()))
    };
    assert!(
        !attached_in_describes().await,
        "DescribeInstances does not show the attachment within the lag"
    );
    set_lag(0, 0).await;
    assert!(attached_in_describes().await, "after it, it does");
    let shown = c
        .describe_network_interfaces()
        .network_interface_ids(&id)
        .send()
        .await
        .unwrap();
    let shown = &shown.network_interfaces()[0];
    assert_eq!(
        shown.status().map(|s| s.as_str()),
        Some("in-use"),
        "and DescribeNetworkInterfaces its attachment"
    );
}
