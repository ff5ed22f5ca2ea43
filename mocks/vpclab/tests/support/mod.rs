//! Helpers shared by the lab's tests: a mockcloud with two instances, cloud changes through its
//! world or the real SDK, echo traffic that must pass or must be dropped, free addresses.

#![allow(dead_code)] // each test binary uses its own subset

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use ipnet::Ipv4Net;
use mockcloud::world::{AssignArgs, CreateEniArgs};
use mockcloud::{Config, LaunchedInstance, MockCloud};
use vpclab::{EchoError, EchoOptions, EchoReply, EchoServer, NetNs, echo};

pub const PORT: u16 = 7000;

pub mod v6;

/// A fast mockcloud with its default instance (subnet 10.0.0.0/20) and a second one beside it.
pub async fn cloud() -> (MockCloud, LaunchedInstance, LaunchedInstance) {
    let mock = MockCloud::start(Config::fast()).await.expect("mockcloud");
    let a = mock.default_instance();
    let b = mock
        .launch_instance("m5.large", &a.subnet_id)
        .await
        .expect("second instance");
    (mock, a, b)
}

pub fn assign(mock: &MockCloud, eni: &str, count: u32) -> Vec<Ipv4Addr> {
    mock.with_world(|w, now| w.assign_private_ip_addresses(eni, AssignArgs::Count(count), now))
        .expect("assign")
}

pub fn unassign(mock: &MockCloud, eni: &str, ips: &[Ipv4Addr]) {
    mock.with_world(|w, now| w.unassign_private_ip_addresses(eni, ips, now))
        .expect("unassign")
}

/// Creates an ENI in the instance's subnet and attaches it at `device_index`; returns (ENI id,
/// MAC, primary IP, attachment id).
pub fn attach_new_eni(
    mock: &MockCloud,
    inst: &LaunchedInstance,
    device_index: u32,
) -> (String, String, Ipv4Addr, String) {
    mock.with_world(|w, now| {
        let eni = w
            .create_network_interface(
                &CreateEniArgs {
                    subnet_id: inst.subnet_id.clone(),
                    description: "vpclab test".into(),
                    ..Default::default()
                },
                now,
            )
            .expect("create ENI");
        let att = w
            .attach_network_interface(&eni.id, &inst.instance_id, device_index, now)
            .expect("attach ENI");
        (eni.id, eni.mac, eni.primary_ip, att)
    })
}

pub async fn serve(ns: &NetNs) -> EchoServer {
    EchoServer::start(ns, SocketAddr::from((Ipv4Addr::UNSPECIFIED, PORT))).expect("echo server")
}

pub async fn reaches(ns: &NetNs, to: impl Into<IpAddr>) -> EchoReply {
    let to = to.into();
    echo(
        ns,
        SocketAddr::from((to, PORT)),
        &EchoOptions {
            timeout: Duration::from_secs(5),
            ..Default::default()
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{} → {to}: {e}", ns.name()))
}

/// The exchange gets no answer: a dropped packet.
pub async fn dropped(ns: &NetNs, to: impl Into<IpAddr>) {
    let to = to.into();
    match echo(
        ns,
        SocketAddr::from((to, PORT)),
        &EchoOptions {
            timeout: Duration::from_millis(700),
            ..Default::default()
        },
    )
    .await
    {
        Err(EchoError::Timeout(_)) => {}
        other => panic!("{} → {to}: expected a drop, got {other:?}", ns.name()),
    }
}

pub fn lab_namespaces(lab_name: &str) -> Vec<String> {
    std::fs::read_dir("/run/netns")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&format!("{lab_name}-")))
                .collect()
        })
        .unwrap_or_default()
}

/// Every address and prefix any ENI holds now.
pub fn held(mock: &MockCloud) -> Vec<Ipv4Net> {
    mock.dump()["network_interfaces"]
        .as_array()
        .expect("enis")
        .iter()
        .flat_map(|e| {
            let ips = ["primary_ip"]
                .iter()
                .filter_map(|k| e[*k].as_str())
                .chain(
                    e["secondary_ips"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|v| v.as_str()),
                )
                .map(|s| Ipv4Net::from(s.parse::<Ipv4Addr>().expect("ip")));
            let prefixes = e["ipv4_prefixes"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str())
                .map(|s| s.parse::<Ipv4Net>().expect("cidr"));
            ips.chain(prefixes).collect::<Vec<_>>()
        })
        .collect()
}

/// A /28 of `subnet`, past its reserved first addresses, that holds no address of any ENI.
pub fn free_block(mock: &MockCloud, subnet: Ipv4Net) -> Ipv4Net {
    let held = held(mock);
    subnet
        .subnets(28)
        .expect("/28s")
        .skip(1)
        .find(|b| !held.iter().any(|h| b.contains(h) || h.contains(b)))
        .expect("a free /28")
}

pub fn net(ip: Ipv4Addr) -> Ipv4Net {
    Ipv4Net::from(ip)
}

pub fn sdk(mock: &MockCloud) -> aws_sdk_ec2::Client {
    use aws_sdk_ec2::config::{BehaviorVersion, Credentials, Region};
    aws_sdk_ec2::Client::from_conf(
        aws_sdk_ec2::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new("us-east-1"))
            .endpoint_url(mock.ec2_url())
            .credentials_provider(Credentials::new("AKIDVPCLAB", "secret", None, None, "test"))
            .build(),
    )
}

/// Sends one HTTP/1.1 request from a socket made inside `ns`; returns the body of a 200 answer.
pub async fn http_in(ns: &NetNs, to: SocketAddr, request: String) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let socket = ns
        .run_async(tokio::net::TcpSocket::new_v4)
        .await
        .expect("in the namespace")
        .expect("socket");
    let mut s = socket.connect(to).await.expect("connect");
    s.write_all(request.as_bytes()).await.expect("send");
    let mut out = String::new();
    s.read_to_string(&mut out).await.expect("answer");
    let (head, body) = out.split_once("\r\n\r\n").expect("an HTTP answer");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    body.to_owned()
}

pub async fn imds_get(ns: &NetNs, path: &str) -> String {
    let imds = SocketAddr::from((vpclab::IMDS_ADDR, 80));
    let token = http_in(
        ns,
        imds,
        "PUT /latest/api/token HTTP/1.1\r\nHost: 169.254.169.254\r\n\
         X-aws-ec2-metadata-token-ttl-seconds: 60\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            .into(),
    )
    .await;
    http_in(
        ns,
        imds,
        format!(
            "GET /latest/meta-data/{path} HTTP/1.1\r\nHost: 169.254.169.254\r\n\
             X-aws-ec2-metadata-token: {token}\r\nConnection: close\r\n\r\n"
        ),
    )
    .await
}
