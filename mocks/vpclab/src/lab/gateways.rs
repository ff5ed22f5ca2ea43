//! The fixed part of the fabric: the vpc namespace's sink, the transit links between the vpc,
//! the IGW, the NAT gateway and the internet, and their routes.

use ipnet::Ipv4Net;

use super::{
    IGW_INTERNET_IP, IGW_NAT_SIDE_IP, IGW_TO_VPC, INTERNET_PREFIX, INTERNET_SERVER,
    NAT_GATEWAY_PUBLIC_IP, NAT_PUBLIC_PREFIX, NAT_TO_VPC, SINK, VPC_TO_IGW, VPC_TO_NAT,
};
use crate::error::LabError;
use crate::netns::NetNs;

/// The transit links and routes between vpc, gateways and internet.
pub(super) async fn wire_gateways(
    vpc: &NetNs,
    igw: &NetNs,
    internet: &NetNs,
    natgw: Option<&NetNs>,
    vpc_cidrs: &[Ipv4Net],
) -> Result<(), LabError> {
    let mut v = vec![
        "link set lo up".to_owned(),
        format!("link add {SINK} type veth peer name {SINK}-rx"),
        format!("link set {SINK} up"),
        format!("link set {SINK}-rx up"),
        format!(
            "link add to-igw type veth peer name to-vpc netns {}",
            igw.name()
        ),
        format!("addr add {VPC_TO_IGW}/30 dev to-igw"),
        "link set to-igw up".to_owned(),
    ];
    let mut g = vec![
        "link set lo up".to_owned(),
        format!("addr add {IGW_TO_VPC}/30 dev to-vpc"),
        "link set to-vpc up".to_owned(),
        format!(
            "link add to-inet type veth peer name eth0 netns {}",
            internet.name()
        ),
        format!("addr add {IGW_INTERNET_IP}/{INTERNET_PREFIX} dev to-inet"),
        "link set to-inet up".to_owned(),
    ];
    if let Some(nat) = natgw {
        v.extend([
            format!(
                "link add to-natgw type veth peer name to-vpc netns {}",
                nat.name()
            ),
            format!("addr add {VPC_TO_NAT}/30 dev to-natgw"),
            "link set to-natgw up".to_owned(),
        ]);
        g.extend([
            format!(
                "link add to-natgw type veth peer name to-igw netns {}",
                nat.name()
            ),
            format!("addr add {IGW_NAT_SIDE_IP}/{NAT_PUBLIC_PREFIX} dev to-natgw"),
            "link set to-natgw up".to_owned(),
        ]);
    }
    vpc.ip_batch(&v).await?;
    igw.ip_batch(&g).await?;
    internet
        .ip_batch(&[
            "link set lo up".into(),
            format!("addr add {INTERNET_SERVER}/{INTERNET_PREFIX} dev eth0"),
            "link set eth0 up".into(),
            format!("route add default via {IGW_INTERNET_IP}"),
        ])
        .await?;
    if let Some(nat) = natgw {
        nat.ip_batch(&[
            "link set lo up".into(),
            format!("addr add {NAT_TO_VPC}/30 dev to-vpc"),
            "link set to-vpc up".into(),
            format!("addr add {NAT_GATEWAY_PUBLIC_IP}/{NAT_PUBLIC_PREFIX} dev to-igw"),
            "link set to-igw up".into(),
            format!("route add default via {IGW_NAT_SIDE_IP}"),
        ])
        .await?;
        // Every block of the VPC (a secondary 100.64.0.0/16 too) is VPC-internal to the gateway.
        nat.ip_batch(
            &vpc_cidrs
                .iter()
                .map(|c| format!("route add {c} via {VPC_TO_NAT}"))
                .collect::<Vec<_>>(),
        )
        .await?;
    }
    igw.ip_batch(
        &vpc_cidrs
            .iter()
            .map(|c| format!("route add {c} via {VPC_TO_IGW}"))
            .collect::<Vec<_>>(),
    )
    .await?;
    let default_via = if natgw.is_some() {
        NAT_TO_VPC
    } else {
        IGW_TO_VPC
    };
    // More specific /32 and /28 routes to ENIs win; the rest of every VPC block is dropped and
    // counted.
    let mut routes: Vec<String> = vpc_cidrs
        .iter()
        .map(|c| format!("route add {c} dev {SINK}"))
        .collect();
    routes.push(format!("route add default via {default_via}"));
    vpc.ip_batch(&routes).await
}
