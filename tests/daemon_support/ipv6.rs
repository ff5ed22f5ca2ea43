//! Shared setup of the IPv6 daemon tests (`daemon_ipv6*.rs`): the node type they run on, what
//! mockcloud saw, eth0's /80s, an operator's own EC2 client, the daemon's metrics.

use std::net::SocketAddr;

use ipnet::Ipv6Net;
use mockcloud::{Config, MockCloud};

/// mockcloud with the IPv6 tests' node type (a c5.4xlarge: 15 addresses per ENI, fast EC2).
pub async fn ipv6_mock() -> MockCloud {
    MockCloud::start(Config {
        default_instance_type: "c5.4xlarge".into(),
        ..Config::fast()
    })
    .await
    .unwrap()
}

/// Calls of `action` mockcloud answered with success.
pub fn action_ok(mock: &MockCloud, action: &str) -> u64 {
    mock.counters().actions.get(action).map_or(0, |c| c.ok)
}

/// Calls of `action` mockcloud refused.
pub fn action_refused(mock: &MockCloud, action: &str) -> u64 {
    mock.counters()
        .actions
        .get(action)
        .map_or(0, |c| c.errors.values().sum())
}

/// The /80s on the default instance's eth0, as EC2 has them.
pub fn eth0_prefixes(mock: &MockCloud) -> Vec<Ipv6Net> {
    let inst = mock.instance(&mock.default_instance().instance_id).unwrap();
    inst.enis
        .iter()
        .find(|e| e.attachment.as_ref().is_some_and(|a| a.device_index == 0))
        .unwrap()
        .ipv6_prefixes
        .clone()
}

/// An operator's client (the console, another tool): its own credentials, allowed everything.
pub fn operator_sdk(mock: &MockCloud) -> aws_sdk_ec2::Client {
    let admin = serde_json::json!({"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": "ec2:*", "Resource": "*"}]});
    mock.set_iam_policy_for(
        "operator",
        Some(mockcloud::iam::Policy::parse(&admin.to_string()).unwrap()),
    );
    aws_sdk_ec2::Client::from_conf(
        aws_sdk_ec2::Config::builder()
            .behavior_version(aws_sdk_ec2::config::BehaviorVersion::latest())
            .region(aws_sdk_ec2::config::Region::new("us-east-1"))
            .endpoint_url(mock.ec2_url())
            .credentials_provider(aws_sdk_ec2::config::Credentials::new(
                "operator", "b", None, None, "test",
            ))
            .build(),
    )
}

/// The daemon's /metrics text.
pub async fn metrics_text(addr: SocketAddr) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}
