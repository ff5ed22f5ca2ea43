//! What the world shows: ENIs, attachments, instances and subnets as Describe calls see them, each
//! instance's IMDS (lagging EC2), and the control API's state dump.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use ipnet::{Ipv4Net, Ipv6Net};
use serde::Serialize;
use tokio::time::Instant;

use super::{AttState, InstanceState, World};

/// An ENI as `DescribeNetworkInterfaces` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct EniView {
    pub id: String,
    pub mac: String,
    pub subnet_id: String,
    pub vpc_id: String,
    pub availability_zone: String,
    pub description: String,
    /// `available`, `attaching`, `in-use` or `detaching`.
    pub status: &'static str,
    pub primary_ip: Ipv4Addr,
    pub secondary_ips: Vec<Ipv4Addr>,
    /// `Ipv4Prefixes[].Ipv4Prefix`: /28 prefixes, in assignment order.
    pub ipv4_prefixes: Vec<Ipv4Net>,
    /// `Ipv6Addresses[].Ipv6Address`, in assignment order.
    pub ipv6_addresses: Vec<Ipv6Addr>,
    /// `Ipv6Prefixes[].Ipv6Prefix`: /80 prefixes, in assignment order.
    pub ipv6_prefixes: Vec<Ipv6Net>,
    pub security_groups: Vec<String>,
    pub tags: BTreeMap<String, String>,
    pub attachment: Option<AttachmentView>,
    pub requester_managed: bool,
}

/// An attachment as EC2 shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AttachmentView {
    pub id: String,
    pub instance_id: String,
    /// Device index on its network card.
    pub device_index: u32,
    /// `NetworkCardIndex` (0 unless attached to another card of a multi-card type).
    pub network_card_index: u32,
    /// `attaching`, `attached` or `detaching`.
    pub status: &'static str,
    pub delete_on_termination: bool,
}

/// An instance as `DescribeInstances` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct InstanceView {
    pub id: String,
    pub instance_type: String,
    pub availability_zone: String,
    pub subnet_id: String,
    pub vpc_id: String,
    pub private_ip: Ipv4Addr,
    /// `running` or `terminated`.
    pub state: &'static str,
    pub security_groups: Vec<String>,
    /// Attached ENIs by (network card, device index).
    pub enis: Vec<EniView>,
}

/// A subnet as `DescribeSubnets` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SubnetView {
    pub id: String,
    pub vpc_id: String,
    pub cidr: Ipv4Net,
    pub availability_zone: String,
    /// `AvailableIpAddressCount`: free addresses (a /28 prefix takes 16).
    pub available_ips: u32,
    /// The subnet's IPv6 /64 (`ipv6CidrBlockAssociationSet`), if it has one.
    pub ipv6_cidr: Option<Ipv6Net>,
    pub tags: BTreeMap<String, String>,
}

/// One interface in an instance's IMDS.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ImdsEni {
    pub mac: String,
    pub eni_id: String,
    pub device_number: u32,
    /// `network-card`: only on types with several network cards (EC2 answers 404 otherwise, which
    /// readers take as card 0).
    pub network_card: Option<u32>,
    pub subnet_id: String,
    pub vpc_id: String,
    pub subnet_cidr: Ipv4Net,
    /// The VPC's primary IPv4 block (`vpc-ipv4-cidr-block`).
    pub vpc_cidr: Ipv4Net,
    /// Every IPv4 block of the VPC, primary first (`vpc-ipv4-cidr-blocks`, one per line).
    pub vpc_cidrs: Vec<Ipv4Net>,
    pub security_groups: Vec<String>,
    /// Primary first.
    pub ips: Vec<Ipv4Addr>,
    /// `ipv4-prefix`, one CIDR per line (404 when empty).
    pub ipv4_prefixes: Vec<Ipv4Net>,
    /// `ipv6s`, one address per line (404 when empty); lagged like `local-ipv4s`.
    pub ipv6s: Vec<Ipv6Addr>,
    /// `ipv6-prefix`, one /80 per line (404 when empty); lagged like `ipv4-prefix`.
    pub ipv6_prefixes: Vec<Ipv6Net>,
    /// `subnet-ipv6-cidr-blocks` (404 when the subnet has no IPv6 block).
    pub subnet_ipv6_cidr: Option<Ipv6Net>,
    /// `vpc-ipv6-cidr-blocks`.
    pub vpc_ipv6_cidr: Ipv6Net,
}

/// What an instance's IMDS shows at one moment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ImdsInstance {
    pub instance_id: String,
    pub instance_type: String,
    pub availability_zone: String,
    pub region: String,
    pub mac: String,
    pub local_ipv4: Ipv4Addr,
    pub interfaces: Vec<ImdsEni>,
}

/// What a describe at `now` shows of one kind of address: those assigned at least `lag` ago, in
/// assignment order, then those unassigned less than `lag` ago (EC2 is eventually consistent).
fn described<T: Copy>(
    held: &[(T, Instant)],
    removed: &[(T, Instant)],
    seen: Option<(Duration, Instant)>,
) -> Vec<T> {
    match seen {
        None => held.iter().map(|(t, _)| *t).collect(),
        Some((lag, now)) => held
            .iter()
            .filter(|(_, since)| *since + lag <= now)
            .chain(removed.iter().filter(|(_, at)| *at + lag > now))
            .map(|(t, _)| *t)
            .collect(),
    }
}

impl World {
    /// The ENI as it is now (the control API, replies to the ENI's own calls).
    pub(super) fn eni_view(&self, id: &str) -> EniView {
        self.eni_view_as(id, None)
    }

    /// The ENI as EC2's describes show it at `now`: its addresses and prefixes as they were
    /// [`super::Timing::describe_lag`] ago.
    pub(super) fn eni_described(&self, id: &str, now: Instant) -> EniView {
        self.eni_view_as(id, Some((self.timing.describe_lag, now)))
    }

    fn eni_view_as(&self, id: &str, seen: Option<(Duration, Instant)>) -> EniView {
        let e = &self.enis[id];
        // A describe does not show an attachment made within the new-ENI lag (`settling`).
        let shown = e
            .attachment
            .as_ref()
            .filter(|a| seen.is_none_or(|(_, now)| self.attachment_shown(a, now)));
        let attachment = shown.map(|a| AttachmentView {
            id: a.id.clone(),
            instance_id: a.instance_id.clone(),
            device_index: a.device_index,
            network_card_index: a.network_card,
            status: match a.state {
                AttState::Attaching { .. } => "attaching",
                AttState::Attached { .. } => "attached",
                AttState::Detaching { .. } => "detaching",
            },
            delete_on_termination: a.delete_on_termination,
        });
        let status = match shown.map(|a| a.state) {
            None => "available",
            Some(AttState::Attaching { .. }) => "attaching",
            Some(AttState::Attached { .. }) => "in-use",
            Some(AttState::Detaching { .. }) => "detaching",
        };
        EniView {
            id: id.to_owned(),
            mac: e.mac.clone(),
            subnet_id: e.subnet_id.clone(),
            vpc_id: e.vpc_id.clone(),
            availability_zone: e.az.clone(),
            description: e.description.clone(),
            status,
            primary_ip: e.primary_ip,
            secondary_ips: described(&e.secondaries, &e.removed, seen),
            ipv4_prefixes: described(&e.prefixes, &e.removed_prefixes, seen),
            ipv6_addresses: described(&e.ipv6.addresses, &e.ipv6.removed, seen),
            ipv6_prefixes: described(&e.ipv6.prefixes, &e.ipv6.removed_prefixes, seen),
            security_groups: e.security_groups.clone(),
            tags: e.tags.clone(),
            attachment,
            requester_managed: e.requester_managed,
        }
    }

    /// The instance as it is now (the control API).
    pub(super) fn instance_view(&self, id: &str) -> InstanceView {
        self.instance_view_as(id, None)
    }

    /// The instance as `DescribeInstances` shows it at `now` (its ENIs' addresses lag).
    pub(super) fn instance_described(&self, id: &str, now: Instant) -> InstanceView {
        self.instance_view_as(id, Some((self.timing.describe_lag, now)))
    }

    fn instance_view_as(&self, id: &str, seen: Option<(Duration, Instant)>) -> InstanceView {
        let i = &self.instances[id];
        let mut enis: Vec<EniView> = self
            .enis
            .iter()
            .filter(|(_, e)| e.attachment.as_ref().is_some_and(|a| a.instance_id == id))
            .map(|(eid, _)| self.eni_view_as(eid, seen))
            .filter(|v| v.attachment.is_some())
            .collect();
        enis.sort_by_key(|e| {
            e.attachment
                .as_ref()
                .map(|a| (a.network_card_index, a.device_index))
        });
        InstanceView {
            id: id.to_owned(),
            instance_type: i.instance_type.name.to_owned(),
            availability_zone: i.az.clone(),
            subnet_id: i.subnet_id.clone(),
            vpc_id: i.vpc_id.clone(),
            private_ip: i.primary_ip,
            state: match i.state {
                InstanceState::Running => "running",
                InstanceState::Terminated => "terminated",
            },
            security_groups: i.security_groups.clone(),
            enis,
        }
    }

    /// The ENI as IMDS would show it now; `ignore_lag` shows everything attached.
    pub(super) fn imds_eni(&self, id: &str, ignore_lag: bool, now: Instant) -> Option<ImdsEni> {
        let e = self.enis.get(id)?;
        let a = e.attachment.as_ref()?;
        let lag = self.timing.imds_lag;
        // The primary interface is there from boot.
        let visible = ignore_lag
            || a.is_primary()
            || match a.state {
                AttState::Attaching { .. } => false,
                AttState::Attached { since } | AttState::Detaching { since, .. } => {
                    since + lag <= now
                }
            };
        if !visible {
            return None;
        }
        let settled = |at: &Instant| ignore_lag || *at + lag <= now;
        let lingering = |at: &Instant| !ignore_lag && *at + lag > now;
        let mut ips = vec![e.primary_ip];
        ips.extend(
            e.secondaries
                .iter()
                .filter(|(_, at)| settled(at))
                .map(|(ip, _)| *ip),
        );
        ips.extend(
            e.removed
                .iter()
                .filter(|(_, at)| lingering(at))
                .map(|(ip, _)| *ip),
        );
        let mut ipv4_prefixes: Vec<Ipv4Net> = e
            .prefixes
            .iter()
            .filter(|(_, at)| settled(at))
            .map(|(net, _)| *net)
            .collect();
        ipv4_prefixes.extend(
            e.removed_prefixes
                .iter()
                .filter(|(_, at)| lingering(at))
                .map(|(net, _)| *net),
        );
        let lagged6 = |now_held: &[(Ipv6Addr, Instant)], gone: &[(Ipv6Addr, Instant)]| {
            let mut v: Vec<Ipv6Addr> = now_held
                .iter()
                .filter(|(_, at)| settled(at))
                .map(|(a, _)| *a)
                .collect();
            v.extend(gone.iter().filter(|(_, at)| lingering(at)).map(|(a, _)| *a));
            v
        };
        let ipv6s = lagged6(&e.ipv6.addresses, &e.ipv6.removed);
        let mut ipv6_prefixes: Vec<Ipv6Net> = e
            .ipv6
            .prefixes
            .iter()
            .filter(|(_, at)| settled(at))
            .map(|(net, _)| *net)
            .collect();
        ipv6_prefixes.extend(
            e.ipv6
                .removed_prefixes
                .iter()
                .filter(|(_, at)| lingering(at))
                .map(|(net, _)| *net),
        );
        let subnet = &self.subnets[&e.subnet_id];
        let multi_card = self.instances[&a.instance_id].instance_type.network_cards > 1;
        Some(ImdsEni {
            mac: e.mac.clone(),
            eni_id: id.to_owned(),
            device_number: a.device_index,
            network_card: multi_card.then_some(a.network_card),
            subnet_id: e.subnet_id.clone(),
            vpc_id: e.vpc_id.clone(),
            subnet_cidr: subnet.cidr,
            vpc_cidr: self.vpcs[&e.vpc_id].cidr,
            vpc_cidrs: self.vpc_ipv4_cidrs(&e.vpc_id),
            security_groups: e.security_groups.clone(),
            ips,
            ipv4_prefixes,
            ipv6s,
            ipv6_prefixes,
            subnet_ipv6_cidr: subnet.ipv6.as_ref().map(|b| b.cidr),
            vpc_ipv6_cidr: self.vpcs[&e.vpc_id].ipv6_cidr,
        })
    }

    /// What the instance's IMDS shows at `now` (changes appear after the configured lag).
    pub fn imds(&mut self, instance_id: &str, now: Instant) -> Option<ImdsInstance> {
        self.settle(now);
        let inst = self.instances.get(instance_id)?;
        let mut interfaces: Vec<ImdsEni> = self
            .enis
            .iter()
            .filter(|(_, e)| {
                e.attachment
                    .as_ref()
                    .is_some_and(|a| a.instance_id == instance_id)
            })
            .filter_map(|(id, _)| self.imds_eni(id, false, now))
            .collect();
        for (ghost, _) in &inst.gone {
            if !interfaces.iter().any(|i| i.mac == ghost.mac) {
                interfaces.push(ghost.clone());
            }
        }
        interfaces.sort_by_key(|i| (i.network_card.unwrap_or(0), i.device_number));
        Some(ImdsInstance {
            instance_id: instance_id.to_owned(),
            instance_type: inst.instance_type.name.to_owned(),
            availability_zone: inst.az.clone(),
            region: self.region.clone(),
            mac: inst.primary_mac.clone(),
            local_ipv4: inst.primary_ip,
            interfaces,
        })
    }

    /// Everything, for the control API's state dump.
    pub fn dump(&mut self, now: Instant) -> serde_json::Value {
        self.settle(now);
        let subnets: Vec<SubnetView> = self.subnets.keys().map(|id| self.subnet_view(id)).collect();
        let instances: Vec<InstanceView> = self
            .instances
            .keys()
            .map(|id| self.instance_view(id))
            .collect();
        let enis: Vec<EniView> = self.enis.keys().map(|id| self.eni_view(id)).collect();
        let vpcs: Vec<serde_json::Value> = self
            .vpcs
            .iter()
            .map(|(id, v)| serde_json::json!({"id": id, "cidr": v.cidr, "cidrs": self.vpc_ipv4_cidrs(id), "security_groups": v.security_groups}))
            .collect();
        let this: &World = self;
        let reservations: Vec<super::ReservationView> = this
            .subnets
            .iter()
            .flat_map(|(sid, s)| {
                s.reservations
                    .keys()
                    .map(move |rid| this.reservation_view(sid, rid))
            })
            .collect();
        let assigned_ips: usize = self.enis.values().map(|e| 1 + e.secondaries.len()).sum();
        let assigned_prefixes: usize = self.enis.values().map(|e| e.prefixes.len()).sum();
        let security_groups = self.security_group_views();
        serde_json::json!({
            "vpcs": vpcs, "subnets": subnets, "instances": instances, "network_interfaces": enis,
            "security_groups": security_groups,
            "subnet_cidr_reservations": reservations,
            "assigned_ips": assigned_ips, "assigned_prefixes": assigned_prefixes,
        })
    }

    pub(super) fn subnet_view(&self, id: &str) -> SubnetView {
        let s = &self.subnets[id];
        SubnetView {
            id: id.to_owned(),
            vpc_id: s.vpc_id.clone(),
            cidr: s.cidr,
            availability_zone: s.az.clone(),
            available_ips: s.free(),
            ipv6_cidr: s.ipv6.as_ref().map(|b| b.cidr),
            tags: s.tags.clone(),
        }
    }
}
