//! Helpers shared by the SDK-level test files: a real `aws-sdk-ec2` client and a real IMDS client
//! pointed at a mockcloud, and error-code extraction.
#![allow(dead_code)]

use aws_config::BehaviorVersion;
use aws_config::retry::RetryConfig;
use aws_sdk_ec2::Client;
use aws_sdk_ec2::config::{Credentials, Region};
use aws_sdk_ec2::error::ProvideErrorMetadata;
use aws_sdk_ec2::types::Filter;
use mockcloud::{Config, MockCloud};

pub fn ec2(mock: &MockCloud) -> Client {
    ec2_with_timeout(mock, None)
}

/// The same client, each attempt given up after `timeout`.
pub fn ec2_with_timeout(mock: &MockCloud, timeout: Option<std::time::Duration>) -> Client {
    let mut b = aws_sdk_ec2::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .endpoint_url(mock.ec2_url())
        .credentials_provider(Credentials::new(
            "AKIDMOCKCLOUD",
            "secret",
            None,
            None,
            "test",
        ))
        .retry_config(RetryConfig::disabled());
    if let Some(t) = timeout {
        b = b.timeout_config(
            aws_sdk_ec2::config::timeout::TimeoutConfig::builder()
                .operation_attempt_timeout(t)
                .build(),
        );
    }
    Client::from_conf(b.build())
}

pub fn imds(url: &str) -> aws_config::imds::Client {
    aws_config::imds::Client::builder()
        .endpoint(url)
        .expect("valid IMDS url")
        .build()
}

/// The EC2 error code the SDK parsed.
pub fn code<E: ProvideErrorMetadata>(e: E) -> String {
    e.code().unwrap_or("<no code>").to_owned()
}

pub fn filter(name: &str, value: &str) -> Filter {
    Filter::builder().name(name).values(value).build()
}

pub async fn fast() -> MockCloud {
    MockCloud::start(Config::fast())
        .await
        .expect("mockcloud starts")
}

/// Without the default VPC, subnet and instance.
pub async fn empty(seed: u64) -> MockCloud {
    MockCloud::start_seeded(
        Config {
            seed_default_world: false,
            ..Config::fast()
        },
        seed,
    )
    .await
    .expect("mockcloud starts")
}

/// Creates an ENI in `subnet`; returns its id.
pub async fn create_eni(c: &Client, subnet: &str) -> String {
    c.create_network_interface()
        .subnet_id(subnet)
        .send()
        .await
        .expect("create")
        .network_interface
        .unwrap()
        .network_interface_id
        .unwrap()
}

/// The `Ipv4Prefix` strings of an SDK list.
pub fn prefixes(list: &[aws_sdk_ec2::types::Ipv4PrefixSpecification]) -> Vec<String> {
    list.iter()
        .filter_map(|p| p.ipv4_prefix().map(str::to_owned))
        .collect()
}

/// An IMDSv2 GET over raw HTTP (token first): the status and body, so a test can tell a 404.
pub async fn imds_raw(url: &str, path: &str) -> (u16, String) {
    let http = reqwest::Client::new();
    let token = http
        .put(format!("{url}/latest/api/token"))
        .header("x-aws-ec2-metadata-token-ttl-seconds", "60")
        .send()
        .await
        .expect("token")
        .text()
        .await
        .expect("token text");
    let r = http
        .get(format!("{url}{path}"))
        .header("x-aws-ec2-metadata-token", token)
        .send()
        .await
        .expect("imds get");
    (r.status().as_u16(), r.text().await.expect("imds body"))
}

/// Every address some ENI holds (primary, secondaries, all 16 of each prefix).
pub fn held_addresses(mock: &MockCloud) -> std::collections::BTreeSet<std::net::Ipv4Addr> {
    let mut held = std::collections::BTreeSet::new();
    for e in mock.network_interfaces() {
        held.insert(e.primary_ip);
        held.extend(e.secondary_ips.iter().copied());
        for p in &e.ipv4_prefixes {
            let start = u32::from(p.network());
            held.extend((start..start + 16).map(std::net::Ipv4Addr::from));
        }
    }
    held
}

/// The first aligned /28 of `subnet` (clear of its reserved addresses) that holds no used address.
pub fn free_block(mock: &MockCloud, subnet: ipnet::Ipv4Net) -> ipnet::Ipv4Net {
    let held = held_addresses(mock);
    let (lo, hi) = (u32::from(subnet.network()), u32::from(subnet.broadcast()));
    (lo + 16..hi - 15)
        .step_by(16)
        .map(|s| ipnet::Ipv4Net::new(std::net::Ipv4Addr::from(s), 28).unwrap())
        .find(|b| !held.iter().any(|ip| b.contains(ip)))
        .expect("a free block")
}

/// A ModifyNetworkInterfaceAttribute that sets the ENI's description, ready to send.
pub fn set_description(
    c: &Client,
    eni: &str,
) -> aws_sdk_ec2::operation::modify_network_interface_attribute::builders::ModifyNetworkInterfaceAttributeFluentBuilder
{
    c.modify_network_interface_attribute()
        .network_interface_id(eni)
        .description(
            aws_sdk_ec2::types::AttributeValue::builder()
                .value("x")
                .build(),
        )
}

/// Starts the `mockcloud` binary with `args` (`--json` added) and reads the URLs it prints.
pub async fn start_binary(args: &[&str]) -> (tokio::process::Child, serde_json::Value) {
    use tokio::io::AsyncBufReadExt;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_mockcloud"))
        .args(args)
        .arg("--json")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the mockcloud binary starts");
    let mut lines = tokio::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
    let line = tokio::time::timeout(std::time::Duration::from_secs(20), lines.next_line())
        .await
        .expect("the binary prints its URLs within 20 s")
        .expect("stdout readable")
        .expect("a line");
    (child, serde_json::from_str(&line).expect("one JSON line"))
}
