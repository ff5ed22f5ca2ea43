//! mockcloud's state as the lab reads it: the JSON of `GET /_mock/state` (or the in-process
//! [`mockcloud::MockCloud::dump`], the same document).
//!
//! `EniView::ipv4_prefixes` (/28 prefixes) and `AttachmentView::network_card_index` are read when
//! present and default to none / card 0 when absent, so the lab also reads the state of a mockcloud
//! built before prefix delegation and network cards. The IPv6 fields (a subnet's /64, an ENI's
//! IPv6 addresses and /80 prefixes, a VPC's /56) likewise default to none: such a VPC has no IPv6.

use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::{Ipv4Net, Ipv6Net};
use mockcloud::MockCloud;
use serde::Deserialize;

use crate::error::LabError;

/// Where the lab reads mockcloud's state from.
#[derive(Clone)]
pub enum StateSource {
    /// A mockcloud running in this process.
    InProcess(MockCloud),
    /// A mockcloud elsewhere: its control API URL, `http://HOST:PORT/_mock` (what
    /// [`MockCloud::control_url`] returns); the lab GETs `<url>/state`.
    ControlApi(String),
}

impl From<&MockCloud> for StateSource {
    fn from(m: &MockCloud) -> Self {
        Self::InProcess(m.clone())
    }
}

impl From<MockCloud> for StateSource {
    fn from(m: MockCloud) -> Self {
        Self::InProcess(m)
    }
}

impl StateSource {
    /// Reads the state now.
    pub async fn fetch(&self) -> Result<CloudState, LabError> {
        let json = match self {
            Self::InProcess(m) => m.dump(),
            Self::ControlApi(url) => {
                let url = format!("{}/state", url.trim_end_matches('/'));
                let resp = reqwest::get(&url)
                    .await
                    .map_err(|e| LabError::CloudState(format!("GET {url}: {e}")))?;
                if !resp.status().is_success() {
                    return Err(LabError::CloudState(format!(
                        "GET {url}: HTTP {}",
                        resp.status()
                    )));
                }
                resp.json::<serde_json::Value>()
                    .await
                    .map_err(|e| LabError::CloudState(format!("GET {url}: {e}")))?
            }
        };
        CloudState::from_json(json)
    }
}

/// The parts of mockcloud's state the lab routes by.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct CloudState {
    pub vpcs: Vec<VpcState>,
    pub subnets: Vec<SubnetState>,
    pub instances: Vec<InstanceState>,
    pub network_interfaces: Vec<EniState>,
    /// Security groups with their rules (absent in mockcloud builds without them: no filtering).
    #[serde(default)]
    pub security_groups: Vec<SecurityGroupState>,
}

/// A security group as the dump shows it: its rules grouped into EC2's `IpPermissions`.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct SecurityGroupState {
    pub id: String,
    pub vpc_id: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub ingress: Vec<PermissionState>,
    #[serde(default)]
    pub egress: Vec<PermissionState>,
}

/// One `IpPermissions` entry: a protocol (`tcp`, `udp`, `icmp`, `icmpv6`, `-1` or a number), a
/// port range (for ICMP: type and code, -1 any), and its peers.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct PermissionState {
    pub ip_protocol: String,
    #[serde(default)]
    pub from_port: Option<i32>,
    #[serde(default)]
    pub to_port: Option<i32>,
    #[serde(default)]
    pub ip_ranges: Vec<Ipv4Net>,
    #[serde(default)]
    pub ipv6_ranges: Vec<Ipv6Net>,
    /// Referenced groups (their members' addresses).
    #[serde(default)]
    pub groups: Vec<String>,
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct VpcState {
    pub id: String,
    /// The primary IPv4 block.
    pub cidr: Ipv4Net,
    /// Every IPv4 block, primary first (secondary blocks from AssociateVpcCidrBlock, e.g.
    /// 100.64.0.0/16 for custom networking). Absent in the dump of a mockcloud built before
    /// secondary blocks: [`VpcState::blocks`] then takes the primary alone.
    #[serde(default)]
    pub cidrs: Vec<Ipv4Net>,
    /// The VPC's IPv6 /56. mockcloud's dump does not carry it (yet): the plan then takes the /56
    /// that holds the subnets' /64s, as EC2 gives every VPC a /56.
    #[serde(default)]
    pub ipv6_cidr: Option<Ipv6Net>,
}

impl VpcState {
    /// The VPC's IPv4 blocks, primary first.
    pub fn blocks(&self) -> Vec<Ipv4Net> {
        if self.cidrs.is_empty() {
            vec![self.cidr]
        } else {
            self.cidrs.clone()
        }
    }
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct SubnetState {
    pub id: String,
    pub vpc_id: String,
    pub cidr: Ipv4Net,
    /// The subnet's IPv6 /64, if it has one.
    #[serde(default)]
    pub ipv6_cidr: Option<Ipv6Net>,
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct InstanceState {
    pub id: String,
    pub vpc_id: String,
    pub subnet_id: String,
    pub private_ip: Ipv4Addr,
    /// `running` or `terminated`.
    pub state: String,
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct EniState {
    pub id: String,
    pub mac: String,
    pub subnet_id: String,
    pub vpc_id: String,
    pub primary_ip: Ipv4Addr,
    #[serde(default)]
    pub secondary_ips: Vec<Ipv4Addr>,
    /// Delegated /28 prefixes (absent in mockcloud builds without prefix delegation).
    #[serde(default)]
    pub ipv4_prefixes: Vec<Ipv4Net>,
    /// IPv6 addresses, in assignment order (the first is the primary ENI's address the node's
    /// eth0 gets, as DHCPv6 would give it).
    #[serde(default)]
    pub ipv6_addresses: Vec<Ipv6Addr>,
    /// Delegated IPv6 /80 prefixes.
    #[serde(default)]
    pub ipv6_prefixes: Vec<Ipv6Net>,
    /// The ENI's security groups (absent in older mockcloud builds).
    #[serde(default)]
    pub security_groups: Vec<String>,
    pub attachment: Option<AttachmentState>,
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct AttachmentState {
    pub instance_id: String,
    pub device_index: u32,
    /// `attaching`, `attached` or `detaching`.
    pub status: String,
    /// Absent in mockcloud builds without network cards: card 0.
    #[serde(default)]
    pub network_card_index: u32,
}

impl CloudState {
    /// Parses the `/_mock/state` document.
    pub fn from_json(json: serde_json::Value) -> Result<Self, LabError> {
        serde_json::from_value(json).map_err(|e| LabError::CloudState(e.to_string()))
    }

    /// The one VPC to model: `wanted`, or the only VPC there is.
    pub fn pick_vpc(&self, wanted: Option<&str>) -> Result<&VpcState, LabError> {
        match wanted {
            Some(id) => self
                .vpcs
                .iter()
                .find(|v| v.id == id)
                .ok_or_else(|| LabError::CloudState(format!("no VPC {id}"))),
            None => match self.vpcs.as_slice() {
                [one] => Ok(one),
                [] => Err(LabError::CloudState(
                    "mockcloud has no VPC (start it with a default world or create one)".into(),
                )),
                many => Err(LabError::CloudState(format!(
                    "mockcloud has {} VPCs: set LabConfig::vpc_id",
                    many.len()
                ))),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_and_cards_are_read_when_present_and_default_when_absent() {
        let eni = |extra: serde_json::Value| {
            let mut v = serde_json::json!({
                "id": "eni-00000001", "mac": "02:00:00:00:00:01", "subnet_id": "subnet-00000001",
                "vpc_id": "vpc-00000001", "primary_ip": "10.0.0.4", "secondary_ips": ["10.0.0.5"],
                "status": "in-use",
                "attachment": {"id": "eni-attach-00000001", "instance_id": "i-00000001",
                               "device_index": 1, "status": "attached", "delete_on_termination": true}
            });
            for (k, val) in extra.as_object().expect("object") {
                if k == "network_card_index" {
                    v["attachment"][k] = val.clone();
                } else {
                    v[k] = val.clone();
                }
            }
            v
        };
        let doc = |e: serde_json::Value| {
            serde_json::json!({"vpcs": [], "subnets": [], "instances": [],
                               "network_interfaces": [e], "assigned_ips": 2})
        };
        let today = CloudState::from_json(doc(eni(serde_json::json!({})))).expect("parses");
        let e = &today.network_interfaces[0];
        assert!(e.ipv4_prefixes.is_empty());
        assert_eq!(
            e.attachment.as_ref().expect("attached").network_card_index,
            0
        );

        let later = CloudState::from_json(doc(eni(serde_json::json!({
            "ipv4_prefixes": ["10.0.1.16/28"], "network_card_index": 1
        }))))
        .expect("parses");
        let e = &later.network_interfaces[0];
        assert_eq!(
            e.ipv4_prefixes,
            vec!["10.0.1.16/28".parse::<Ipv4Net>().expect("cidr")]
        );
        assert_eq!(
            e.attachment.as_ref().expect("attached").network_card_index,
            1
        );
    }

    #[test]
    fn a_document_that_is_not_mockcloud_state_is_a_clear_error() {
        let err = CloudState::from_json(serde_json::json!({"vpcs": 3})).expect_err("bad doc");
        assert!(err.to_string().starts_with("mockcloud state:"), "{err}");
    }
}
