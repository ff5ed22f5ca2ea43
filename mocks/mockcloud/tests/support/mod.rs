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
    let conf = aws_sdk_ec2::Config::builder()
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
        .retry_config(RetryConfig::disabled())
        .build();
    Client::from_conf(conf)
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
