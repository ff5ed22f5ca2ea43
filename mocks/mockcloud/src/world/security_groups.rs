//! Security groups as EC2 has them in a VPC: a name unique in the VPC, a description, tags, and
//! ingress and egress rules (`IpPermissions`: a protocol, a port range, and sources or
//! destinations that are IPv4/IPv6 CIDRs or groups of the same VPC).
//!
//! Each VPC gets AWS's default group on creation (`default`: all traffic in from its own members,
//! all out to 0.0.0.0/0 and ::/0, as AWS adds the IPv6 rule in a VPC with an IPv6 block, which
//! every mockcloud VPC has); a new group allows all traffic out and nothing in. Rules are kept one
//! per (protocol, ports, peer), as EC2 counts them against its 60-rules-per-direction quota, and
//! shown grouped into `IpPermissions` by (protocol, ports), as DescribeSecurityGroups does.
//! The emulated VPC (`mocks/vpclab`) reads the groups from the state dump and enforces them.

use std::collections::BTreeMap;

use ipnet::{Ipv4Net, Ipv6Net};
use serde::Serialize;

use super::{
    Ec2Error, Ec2Result, Filter, World, bad_filter, check_tags, malformed, not_found,
    tag_filter_matches, well_formed,
};

/// EC2's quota "inbound or outbound rules per security group" (default 60, counted per
/// direction and separately for IPv4 and IPv6; a group reference counts for both).
pub const RULES_PER_DIRECTION: usize = 60;

/// EC2's quota "security groups per network interface" (default 5).
pub const GROUPS_PER_INTERFACE: usize = 5;

/// Where a rule's traffic comes from (ingress) or goes to (egress).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Peer {
    Cidr(Ipv4Net),
    Cidr6(Ipv6Net),
    /// Every address held by an ENI that is a member of this group.
    Group(String),
}

/// One rule: a protocol, a port range, one peer.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Rule {
    /// `tcp`, `udp`, `icmp`, `icmpv6`, `-1` (all), or another IP protocol number.
    pub protocol: String,
    /// For tcp/udp the port range; for icmp the type and code (-1: any); none for the others.
    pub ports: Option<(i32, i32)>,
    pub peer: Peer,
}

/// One `IpPermissions` entry as EC2 shows it: the rules sharing a protocol and port range.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct IpPermission {
    pub ip_protocol: String,
    pub from_port: Option<i32>,
    pub to_port: Option<i32>,
    pub ip_ranges: Vec<Ipv4Net>,
    pub ipv6_ranges: Vec<Ipv6Net>,
    /// `UserIdGroupPairs[].GroupId`.
    pub groups: Vec<String>,
}

impl IpPermission {
    /// The rules this entry stands for (one per peer).
    pub fn rules(&self) -> Vec<Rule> {
        let ports = self.from_port.zip(self.to_port);
        let peers = self
            .ip_ranges
            .iter()
            .map(|c| Peer::Cidr(*c))
            .chain(self.ipv6_ranges.iter().map(|c| Peer::Cidr6(*c)))
            .chain(self.groups.iter().map(|g| Peer::Group(g.clone())));
        peers
            .map(|peer| Rule {
                protocol: self.ip_protocol.clone(),
                ports,
                peer,
            })
            .collect()
    }
}

/// A security group as `DescribeSecurityGroups` (and the state dump) shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SecurityGroupView {
    pub id: String,
    pub vpc_id: String,
    pub name: String,
    pub description: String,
    pub tags: BTreeMap<String, String>,
    pub ingress: Vec<IpPermission>,
    pub egress: Vec<IpPermission>,
}

#[derive(Clone, Debug)]
pub(super) struct SecurityGroup {
    vpc_id: String,
    name: String,
    description: String,
    pub(super) tags: BTreeMap<String, String>,
    ingress: Vec<Rule>,
    egress: Vec<Rule>,
}

/// Ingress or egress.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    Ingress,
    Egress,
}

fn all_traffic(peer: Peer) -> Rule {
    Rule {
        protocol: "-1".into(),
        ports: None,
        peer,
    }
}

/// AWS's egress rules of a new group in a VPC with an IPv6 block: everything, both families.
fn all_out() -> Vec<Rule> {
    vec![
        all_traffic(Peer::Cidr(Ipv4Net::default())),
        all_traffic(Peer::Cidr6(Ipv6Net::default())),
    ]
}

fn group_not_found(id: &str) -> Ec2Error {
    Ec2Error::client(
        "InvalidGroup.NotFound",
        format!("The security group '{id}' does not exist"),
    )
}

/// Groups rules into EC2's `IpPermissions` by (protocol, ports), in rule order.
fn permissions(rules: &[Rule]) -> Vec<IpPermission> {
    let mut out: Vec<IpPermission> = Vec::new();
    for r in rules {
        let (from_port, to_port) = (r.ports.map(|p| p.0), r.ports.map(|p| p.1));
        let i = match out.iter().position(|p| {
            p.ip_protocol == r.protocol && p.from_port == from_port && p.to_port == to_port
        }) {
            Some(i) => i,
            None => {
                out.push(IpPermission {
                    ip_protocol: r.protocol.clone(),
                    from_port,
                    to_port,
                    ip_ranges: vec![],
                    ipv6_ranges: vec![],
                    groups: vec![],
                });
                out.len() - 1
            }
        };
        match &r.peer {
            Peer::Cidr(c) => out[i].ip_ranges.push(*c),
            Peer::Cidr6(c) => out[i].ipv6_ranges.push(*c),
            Peer::Group(g) => out[i].groups.push(g.clone()),
        }
    }
    out
}

/// EC2's protocol names: `tcp`/`udp`/`icmp`/`icmpv6` (any case, or their numbers 6/17/1/58),
/// `-1` for all, or another protocol number 0..=255. Ports must fit the protocol.
pub fn normalize_rule(
    protocol: &str,
    from: Option<i32>,
    to: Option<i32>,
) -> Ec2Result<(String, Option<(i32, i32)>)> {
    let p = protocol.to_ascii_lowercase();
    let p = match p.as_str() {
        "6" => "tcp".to_owned(),
        "17" => "udp".to_owned(),
        "1" => "icmp".to_owned(),
        "58" => "icmpv6".to_owned(),
        "all" => "-1".to_owned(),
        _ => p,
    };
    let bad = |why: &str| Ec2Error::invalid_value("IpProtocol/FromPort/ToPort", protocol, why);
    match p.as_str() {
        "tcp" | "udp" => {
            let (Some(f), Some(t)) = (from, to) else {
                return Err(Ec2Error::client(
                    "InvalidParameterValue",
                    format!(
                        "Invalid value 'null' for portRange. Must specify both from and to ports with {p}."
                    ),
                ));
            };
            if !(0..=65535).contains(&f) || !(0..=65535).contains(&t) || f > t {
                return Err(Ec2Error::client(
                    "InvalidParameterValue",
                    format!(
                        "Invalid {p} port range: {f}-{t} (ports are 0..65535, FromPort <= ToPort)"
                    ),
                ));
            }
            Ok((p, Some((f, t))))
        }
        "icmp" | "icmpv6" => {
            let (f, t) = (from.unwrap_or(-1), to.unwrap_or(-1));
            if !(-1..=255).contains(&f) || !(-1..=255).contains(&t) {
                return Err(bad("ICMP type and code are -1 (any) or 0..255."));
            }
            Ok((p, Some((f, t))))
        }
        "-1" => Ok((p, None)),
        other => match other.parse::<u16>() {
            Ok(n) if n <= 255 => Ok((p, None)),
            _ => Err(Ec2Error::client(
                "InvalidParameterValue",
                format!(
                    "Invalid value '{protocol}' for IP protocol. Unknown protocol: use tcp, udp, icmp, icmpv6, -1 or a protocol number."
                ),
            )),
        },
    }
}

impl World {
    /// Registers `id` as `vpc_id`'s default group, as AWS makes it with the VPC.
    pub(super) fn add_default_group(&mut self, vpc_id: &str, id: &str) {
        let group = SecurityGroup {
            vpc_id: vpc_id.to_owned(),
            name: "default".into(),
            description: "default VPC security group".into(),
            tags: BTreeMap::new(),
            ingress: vec![all_traffic(Peer::Group(id.to_owned()))],
            egress: all_out(),
        };
        self.groups.insert(id.to_owned(), group);
    }

    /// The VPC's group named `default` (what an ENI or instance gets when given none).
    pub(super) fn default_group(&self, vpc_id: &str) -> Option<String> {
        self.groups
            .iter()
            .find(|(_, g)| g.vpc_id == vpc_id && g.name == "default")
            .map(|(id, _)| id.clone())
    }

    /// `CreateSecurityGroup`: a new group of `vpc_id` with egress to everywhere and no ingress.
    pub fn create_security_group_named(
        &mut self,
        vpc_id: Option<&str>,
        name: &str,
        description: &str,
        tags: &BTreeMap<String, String>,
    ) -> Ec2Result<String> {
        let Some(vpc_id) = vpc_id.filter(|v| !v.is_empty()) else {
            // mockcloud's account has no default VPC, so EC2 wants the VPC named.
            return Err(Ec2Error::client(
                "VPCIdNotSpecified",
                "No default VPC for this user. GroupName is only supported for EC2-Classic and default VPC.",
            ));
        };
        if !well_formed(vpc_id, "vpc") {
            return Err(malformed("InvalidVpcID.Malformed", "vpc", vpc_id));
        }
        if !self.vpcs.contains_key(vpc_id) {
            return Err(not_found("InvalidVpcID.NotFound", "vpc", vpc_id));
        }
        for (what, v) in [("GroupName", name), ("GroupDescription", description)] {
            if v.is_empty() {
                return Err(Ec2Error::missing(what));
            }
            if v.len() > 255 {
                return Err(Ec2Error::invalid_value(
                    what,
                    v,
                    "Must be at most 255 characters.",
                ));
            }
        }
        if name.to_ascii_lowercase().starts_with("sg-") {
            return Err(Ec2Error::invalid_value(
                "GroupName",
                name,
                "Group names may not be in the format sg-*.",
            ));
        }
        if name == "default" {
            return Err(Ec2Error::client(
                "InvalidParameterValue",
                "Cannot use reserved security group name: default",
            ));
        }
        if self
            .groups
            .values()
            .any(|g| g.vpc_id == vpc_id && g.name == name)
        {
            return Err(Ec2Error::client(
                "InvalidGroup.Duplicate",
                format!("The security group '{name}' already exists for VPC '{vpc_id}'"),
            ));
        }
        check_tags(tags)?;
        let id = self.new_id("sg");
        self.vpcs
            .get_mut(vpc_id)
            .expect("checked")
            .security_groups
            .insert(id.clone());
        self.groups.insert(
            id.clone(),
            SecurityGroup {
                vpc_id: vpc_id.to_owned(),
                name: name.to_owned(),
                description: description.to_owned(),
                tags: tags.clone(),
                ingress: vec![],
                egress: all_out(),
            },
        );
        Ok(id)
    }

    fn group_ref(&self, id: &str) -> Ec2Result<&SecurityGroup> {
        if !well_formed(id, "sg") {
            return Err(malformed("InvalidGroupId.Malformed", "sg", id));
        }
        self.groups.get(id).ok_or_else(|| group_not_found(id))
    }

    /// The group's VPC (for IAM's `ec2:Vpc`) and tags.
    pub(super) fn group_vpc_and_tags(
        &self,
        id: &str,
    ) -> Ec2Result<(String, BTreeMap<String, String>)> {
        let g = self.group_ref(id)?;
        Ok((g.vpc_id.clone(), g.tags.clone()))
    }

    /// Whether `id` is a group and may be tagged (CreateTags / DeleteTags).
    pub(super) fn group_tags_mut(&mut self, id: &str) -> Ec2Result<&mut BTreeMap<String, String>> {
        self.group_ref(id)?;
        Ok(&mut self.groups.get_mut(id).expect("checked").tags)
    }

    /// `Authorize…` (`add`) or `Revoke…` the rules of `perms` on group `id`, all or none.
    pub fn change_rules(
        &mut self,
        id: &str,
        direction: Direction,
        perms: &[IpPermission],
        add: bool,
    ) -> Ec2Result<()> {
        let vpc_id = self.group_ref(id)?.vpc_id.clone();
        if perms.is_empty() {
            return Err(Ec2Error::missing("IpPermissions"));
        }
        let mut rules = Vec::new();
        for p in perms {
            let (protocol, ports) = normalize_rule(&p.ip_protocol, p.from_port, p.to_port)?;
            let normalized = IpPermission {
                ip_protocol: protocol,
                from_port: ports.map(|p| p.0),
                to_port: ports.map(|p| p.1),
                ..p.clone()
            };
            let these = normalized.rules();
            if these.is_empty() {
                return Err(Ec2Error::client(
                    "InvalidParameterValue",
                    "An IpPermission must name at least one of IpRanges, Ipv6Ranges or UserIdGroupPairs",
                ));
            }
            for r in &these {
                if let Peer::Group(g) = &r.peer {
                    let peer = self.group_ref(g)?;
                    if peer.vpc_id != vpc_id {
                        return Err(Ec2Error::client(
                            "InvalidGroup.NotFound",
                            format!(
                                "You have specified two resources that belong to different networks: the security group '{g}' is not in VPC '{vpc_id}'"
                            ),
                        ));
                    }
                }
            }
            rules.extend(these);
        }
        let g = self.groups.get_mut(id).expect("checked");
        let list = match direction {
            Direction::Ingress => &mut g.ingress,
            Direction::Egress => &mut g.egress,
        };
        if add {
            for (i, r) in rules.iter().enumerate() {
                if list.contains(r) || rules[..i].contains(r) {
                    return Err(Ec2Error::client(
                        "InvalidPermission.Duplicate",
                        format!(
                            "the specified rule \"peer: {}, {}, {}\" already exists",
                            peer_text(&r.peer),
                            r.protocol.to_uppercase(),
                            ports_text(r.ports)
                        ),
                    ));
                }
            }
            let mut after = list.clone();
            after.extend(rules);
            let v4 = after
                .iter()
                .filter(|r| !matches!(r.peer, Peer::Cidr6(_)))
                .count();
            let v6 = after
                .iter()
                .filter(|r| !matches!(r.peer, Peer::Cidr(_)))
                .count();
            if v4 > RULES_PER_DIRECTION || v6 > RULES_PER_DIRECTION {
                return Err(Ec2Error::client(
                    "RulesPerSecurityGroupLimitExceeded",
                    "The maximum number of rules per security group has been reached.",
                ));
            }
            *list = after;
        } else {
            if rules.iter().any(|r| !list.contains(r)) {
                return Err(Ec2Error::client(
                    "InvalidPermission.NotFound",
                    "The specified rule does not exist in this security group.",
                ));
            }
            list.retain(|r| !rules.contains(r));
        }
        Ok(())
    }

    pub fn security_group_view(&self, id: &str) -> Option<SecurityGroupView> {
        let g = self.groups.get(id)?;
        Some(SecurityGroupView {
            id: id.to_owned(),
            vpc_id: g.vpc_id.clone(),
            name: g.name.clone(),
            description: g.description.clone(),
            tags: g.tags.clone(),
            ingress: permissions(&g.ingress),
            egress: permissions(&g.egress),
        })
    }

    /// Every group, for the state dump.
    pub(super) fn security_group_views(&self) -> Vec<SecurityGroupView> {
        self.groups
            .keys()
            .filter_map(|id| self.security_group_view(id))
            .collect()
    }

    /// `DescribeSecurityGroups` by `GroupId.N` and `Filter.N` (`GroupName.N` is EC2-Classic and
    /// default-VPC only, and mockcloud's account has no default VPC: EC2 then refuses it).
    pub fn describe_security_groups(
        &self,
        ids: &[String],
        names: &[String],
        filters: &[Filter],
    ) -> Ec2Result<Vec<SecurityGroupView>> {
        if let Some(n) = names.first() {
            return Err(Ec2Error::client(
                "InvalidGroup.NotFound",
                format!(
                    "The security group '{n}' does not exist in default VPC 'none' (for a group of a VPC, use Filter group-name)"
                ),
            ));
        }
        for id in ids {
            self.group_ref(id)?;
        }
        for f in filters {
            let known = ["vpc-id", "group-id", "group-name", "description", "tag-key"];
            if !known.contains(&f.name.as_str()) && !f.name.starts_with("tag:") {
                return Err(bad_filter(&f.name));
            }
        }
        Ok(self
            .groups
            .keys()
            .filter(|id| ids.is_empty() || ids.contains(id))
            .filter_map(|id| self.security_group_view(id))
            .filter(|v| filters.iter().all(|f| group_matches(v, f)))
            .collect())
    }
}

fn group_matches(v: &SecurityGroupView, f: &Filter) -> bool {
    if let Some(m) = tag_filter_matches(f, &v.tags) {
        return m;
    }
    let field = match f.name.as_str() {
        "vpc-id" => &v.vpc_id,
        "group-id" => &v.id,
        "group-name" => &v.name,
        "description" => &v.description,
        _ => return false,
    };
    f.values.iter().any(|p| super::glob(p, field))
}

fn peer_text(p: &Peer) -> String {
    match p {
        Peer::Cidr(c) => c.to_string(),
        Peer::Cidr6(c) => c.to_string(),
        Peer::Group(g) => g.clone(),
    }
}

fn ports_text(p: Option<(i32, i32)>) -> String {
    match p {
        Some((f, t)) => format!("fromPort: {f}, toPort: {t}"),
        None => "ALL".into(),
    }
}
