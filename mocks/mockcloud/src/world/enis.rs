//! ENI lifecycle (DescribeNetworkInterfaces is `eni_describe`): CreateNetworkInterface (explicit or automatic
//! addresses, or /28 prefixes; ClientToken idempotency), AttachNetworkInterface on a network card
//! (device indexes and ENI limits per card), DetachNetworkInterface, DeleteNetworkInterface and
//! ModifyNetworkInterfaceAttribute.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use tokio::time::Instant;

use super::views::EniView;
use super::{
    AttState, Attachment, CreateEniArgs, Ec2Error, Ec2Result, Eni, InstanceState, ModifyArgs,
    World, check_tags, insufficient, insufficient_cidr_blocks, limit_exceeded, malformed,
    not_found, well_formed,
};
use crate::catalog::{InstanceType, MAX_IPV4_PER_ENI};

/// EC2's answer for prefix delegation on a Xen instance. EC2 documents PD as Nitro-only but not the
/// error; this follows the form EC2 uses for other features an instance type lacks
/// (`UnsupportedOperation: IPv6 addresses are not supported on m3.medium`).
pub(super) fn prefixes_unsupported(itype: &InstanceType) -> Ec2Error {
    Ec2Error::client(
        "UnsupportedOperation",
        format!(
            "IPv4 prefixes are not supported on {}: prefix delegation needs an instance built on the Nitro System.",
            itype.name
        ),
    )
}

impl World {
    /// Every ENI as it is at `now` (no describe lag): the control API's and tests' truth.
    pub fn network_interfaces(&mut self, now: Instant) -> Vec<EniView> {
        self.settle(now);
        self.enis.keys().map(|id| self.eni_view(id)).collect()
    }

    pub fn create_network_interface(
        &mut self,
        args: &CreateEniArgs,
        now: Instant,
    ) -> Ec2Result<EniView> {
        self.settle(now);
        let fingerprint = format!(
            "{}|{:?}|{}|{}|{:?}|{}|{:?}|{:?}",
            args.subnet_id,
            args.security_groups,
            args.description,
            args.secondary_count,
            args.addresses,
            args.prefix_count,
            args.prefixes,
            args.tags
        );
        if let Some(token) = &args.client_token
            && let Some((fp, view)) = self.client_tokens.get(token)
        {
            if *fp != fingerprint {
                return Err(Ec2Error::client(
                    "IdempotentParameterMismatch",
                    format!("The client token '{token}' was used with different parameters"),
                ));
            }
            return Ok(if self.enis.contains_key(&view.id) {
                self.eni_view(&view.id)
            } else {
                view.clone()
            });
        }
        let id = self.create_eni_inner(args, now)?;
        let refusals = self.timing.new_eni_lag.refusals_for(&id);
        let new = self.enis.get_mut(&id).expect("created");
        (new.created_by_call, new.refusals_left) = (Some(now), refusals);
        let view = self.eni_view(&id);
        if let Some(token) = &args.client_token {
            self.client_tokens
                .insert(token.clone(), (fingerprint, view.clone()));
        }
        Ok(view)
    }

    /// Validates everything, then creates: explicit addresses and prefixes first, then the automatic
    /// ones; if an automatic choice runs out midway, everything is given back.
    pub(super) fn create_eni_inner(
        &mut self,
        args: &CreateEniArgs,
        now: Instant,
    ) -> Ec2Result<String> {
        let subnet = self.subnet_ref(&args.subnet_id)?;
        let (vpc_id, az) = (subnet.vpc_id.clone(), subnet.az.clone());
        let (auto_free, auto_blocks) = (subnet.auto_free(), subnet.auto_block_count());
        let sgs = if args.security_groups.is_empty() {
            vec![self.default_group(&vpc_id).unwrap_or_default()]
        } else {
            args.security_groups.clone()
        };
        self.check_groups(&vpc_id, &sgs)?;
        if args.addresses.iter().filter(|(_, p)| *p).count() > 1 {
            return Err(Ec2Error::combination(
                "Only one private IP address can be designated as primary",
            ));
        }
        let wants_prefixes = args.prefix_count > 0 || !args.prefixes.is_empty();
        if args.prefix_count > 0 && !args.prefixes.is_empty() {
            return Err(Ec2Error::combination(
                "Specify either Ipv4PrefixCount or Ipv4Prefix, not both",
            ));
        }
        if wants_prefixes && (args.secondary_count > 0 || args.addresses.iter().any(|(_, p)| !*p)) {
            return Err(Ec2Error::combination(
                "IPv4 prefixes (Ipv4Prefix, Ipv4PrefixCount) cannot be combined with secondary private IP addresses (PrivateIpAddresses, SecondaryPrivateIpAddressCount)",
            ));
        }
        let auto_primary = !args.addresses.iter().any(|(_, p)| *p);
        let total = args.addresses.len() as u32
            + args.secondary_count
            + u32::from(auto_primary)
            + args.prefix_count
            + args.prefixes.len() as u32;
        if total > MAX_IPV4_PER_ENI {
            return Err(limit_exceeded(total, MAX_IPV4_PER_ENI, ""));
        }
        let mut seen = BTreeSet::new();
        for (ip, _) in &args.addresses {
            if !seen.insert(*ip) {
                return Err(Ec2Error::invalid_value(
                    "PrivateIpAddresses",
                    &ip.to_string(),
                    "Duplicate address.",
                ));
            }
            self.check_explicit(&args.subnet_id, *ip, None, false)?;
        }
        let mut seen_prefixes = BTreeSet::new();
        for net in &args.prefixes {
            if !seen_prefixes.insert(*net) {
                return Err(Ec2Error::invalid_value(
                    "Ipv4Prefix",
                    &net.to_string(),
                    "Duplicate prefix.",
                ));
            }
            self.check_explicit_prefix(&args.subnet_id, *net, None)?;
            if let Some((ip, _)) = args.addresses.iter().find(|(ip, _)| net.contains(ip)) {
                return Err(Ec2Error::invalid_value(
                    "Ipv4Prefix",
                    &net.to_string(),
                    &format!("The prefix overlaps the requested address {ip}."),
                ));
            }
        }
        if args.secondary_count + u32::from(auto_primary) > auto_free {
            return Err(insufficient(&args.subnet_id));
        }
        if args.prefix_count > auto_blocks {
            return Err(insufficient_cidr_blocks());
        }
        check_tags(&args.tags)?;
        // Validated: explicit claims cannot fail; automatic ones are undone if they run out.
        let id = self.new_id("eni");
        let mac = self.new_mac();
        let mut secondaries: Vec<Ipv4Addr> = Vec::new();
        let mut primary = args.addresses.iter().find(|(_, p)| *p).map(|(ip, _)| *ip);
        for (ip, _) in &args.addresses {
            self.claim_ip(&args.subnet_id, *ip, &id);
            if Some(*ip) != primary {
                secondaries.push(*ip);
            }
        }
        for net in &args.prefixes {
            self.claim_prefix(&args.subnet_id, *net, &id);
        }
        let automatic = self.take_automatic(args, &id, primary.is_none());
        let (auto_primary_ip, auto_secondaries, auto_prefixes) = match automatic {
            Ok(v) => v,
            Err(e) => {
                self.subnets
                    .get_mut(&args.subnet_id)
                    .expect("checked")
                    .release_held_by(&id);
                return Err(e);
            }
        };
        primary = primary.or(auto_primary_ip);
        secondaries.extend(auto_secondaries);
        let prefixes = args.prefixes.iter().copied().chain(auto_prefixes);
        self.enis.insert(
            id.clone(),
            Eni {
                mac,
                subnet_id: args.subnet_id.clone(),
                vpc_id,
                az,
                description: args.description.clone(),
                security_groups: sgs,
                primary_ip: primary.expect("explicit or automatic"),
                secondaries: secondaries.into_iter().map(|ip| (ip, now)).collect(),
                removed: Vec::new(),
                prefixes: prefixes.map(|net| (net, now)).collect(),
                removed_prefixes: Vec::new(),
                ipv6: Default::default(),
                tags: args.tags.clone(),
                attachment: None,
                requester_managed: false,
                created_by_call: None,
                refusals_left: 0,
            },
        );
        Ok(id)
    }

    /// The automatic part of a create: the primary (if not given), secondaries, prefixes.
    #[allow(clippy::type_complexity)]
    fn take_automatic(
        &mut self,
        args: &CreateEniArgs,
        id: &str,
        primary: bool,
    ) -> Ec2Result<(Option<Ipv4Addr>, Vec<Ipv4Addr>, Vec<Ipv4Net>)> {
        let primary = if primary {
            Some(self.take_ip(&args.subnet_id, id)?)
        } else {
            None
        };
        let mut secondaries = Vec::new();
        for _ in 0..args.secondary_count {
            secondaries.push(self.take_ip(&args.subnet_id, id)?);
        }
        let mut prefixes = Vec::new();
        for _ in 0..args.prefix_count {
            prefixes.push(self.take_prefix(&args.subnet_id, id)?);
        }
        Ok((primary, secondaries, prefixes))
    }

    /// Attaches on network card 0.
    pub fn attach_network_interface(
        &mut self,
        eni_id: &str,
        instance_id: &str,
        device_index: u32,
        now: Instant,
    ) -> Ec2Result<String> {
        self.attach_network_interface_on_card(eni_id, instance_id, device_index, 0, now)
    }

    /// `AttachNetworkInterface` with `NetworkCardIndex`: device indexes and the ENI limit are per
    /// card; the instance-wide limit is every card's together.
    pub fn attach_network_interface_on_card(
        &mut self,
        eni_id: &str,
        instance_id: &str,
        device_index: u32,
        network_card: u32,
        now: Instant,
    ) -> Ec2Result<String> {
        self.settle(now);
        self.refuse_while_new(eni_id, now)?;
        let eni = self.eni_ref(eni_id)?;
        if !well_formed(instance_id, "i") {
            return Err(malformed("InvalidInstanceID.Malformed", "i", instance_id));
        }
        let inst = self
            .instances
            .get(instance_id)
            .ok_or_else(|| not_found("InvalidInstanceID.NotFound", "instance", instance_id))?;
        if inst.state != InstanceState::Running {
            return Err(Ec2Error::client(
                "IncorrectInstanceState",
                format!("The instance '{instance_id}' is not in the 'running' state."),
            ));
        }
        if eni.attachment.is_some() {
            return Err(Ec2Error::client(
                "InvalidNetworkInterface.InUse",
                format!("Interface: [{eni_id}] in use."),
            ));
        }
        if eni.az != inst.az {
            return Err(Ec2Error::combination(format!(
                "You may not attach a network interface to an instance if they are not in the same availability zone ({} vs {})",
                eni.az, inst.az
            )));
        }
        let limits = inst.instance_type;
        let card = limits.card(network_card).ok_or_else(|| {
            Ec2Error::invalid_value(
                "NetworkCardIndex",
                &network_card.to_string(),
                &format!(
                    "Instance type {} supports network card indexes 0 to {}.",
                    limits.name,
                    limits.network_cards - 1
                ),
            )
        })?;
        let attached: Vec<(u32, u32)> = self
            .enis
            .values()
            .filter_map(|e| {
                e.attachment
                    .as_ref()
                    .filter(|a| a.instance_id == instance_id)
            })
            .map(|a| (a.network_card, a.device_index))
            .collect();
        let on_card = attached.iter().filter(|(c, _)| *c == network_card).count() as u32;
        if attached.len() as u32 >= limits.max_enis || on_card >= card.max_enis {
            return Err(Ec2Error::client(
                "AttachmentLimitExceeded",
                format!(
                    "Interface count {} exceeds the limit for {} (network card {network_card} holds {})",
                    attached.len() + 1,
                    limits.name,
                    card.max_enis
                ),
            ));
        }
        if device_index >= card.max_enis {
            return Err(Ec2Error::invalid_value(
                "DeviceIndex",
                &device_index.to_string(),
                &format!(
                    "Instance type {} supports device indexes 0 to {} on network card {network_card}.",
                    limits.name,
                    card.max_enis - 1
                ),
            ));
        }
        if attached.contains(&(network_card, device_index)) {
            return Err(Ec2Error::client(
                "InvalidParameterValue",
                format!(
                    "Instance '{instance_id}' already has an interface attached at device index '{device_index}' on network card {network_card}."
                ),
            ));
        }
        if eni.ip_count() > limits.ipv4_per_eni {
            return Err(limit_exceeded(
                eni.ip_count(),
                limits.ipv4_per_eni,
                &format!(" for {}", limits.name),
            ));
        }
        if !eni.prefixes.is_empty() && !limits.is_nitro() {
            return Err(prefixes_unsupported(&limits));
        }
        let attachment_id = self.new_id("eni-attach");
        let delay = self.timing.attach_delay;
        self.enis.get_mut(eni_id).expect("checked").attachment = Some(Attachment {
            id: attachment_id.clone(),
            instance_id: instance_id.to_owned(),
            device_index,
            network_card,
            delete_on_termination: false,
            attached_by_call: Some(now),
            state: if delay.is_zero() {
                AttState::Attached { since: now }
            } else {
                AttState::Attaching { until: now + delay }
            },
        });
        Ok(attachment_id)
    }

    pub(super) fn find_attachment(&self, attachment_id: &str) -> Ec2Result<String> {
        if !well_formed(attachment_id, "eni-attach") {
            return Err(malformed(
                "InvalidAttachmentID.Malformed",
                "eni-attach",
                attachment_id,
            ));
        }
        self.enis
            .iter()
            .find(|(_, e)| e.attachment.as_ref().is_some_and(|a| a.id == attachment_id))
            .map(|(id, _)| id.clone())
            .ok_or_else(|| {
                Ec2Error::client(
                    "InvalidAttachmentID.NotFound",
                    format!("The attachment ID '{attachment_id}' does not exist"),
                )
            })
    }

    pub fn detach_network_interface(
        &mut self,
        attachment_id: &str,
        _force: bool,
        now: Instant,
    ) -> Ec2Result<()> {
        self.settle(now);
        let eni_id = self.find_attachment(attachment_id)?;
        let delay = self.timing.detach_delay;
        let att = self
            .enis
            .get_mut(&eni_id)
            .and_then(|e| e.attachment.as_mut())
            .expect("found above");
        if att.is_primary() {
            return Err(Ec2Error::client(
                "OperationNotPermitted",
                "The network interface at device index 0 cannot be detached.",
            ));
        }
        let since = match att.state {
            AttState::Detaching { .. } => return Ok(()),
            AttState::Attaching { until } => until.min(now),
            AttState::Attached { since } => since,
        };
        att.state = AttState::Detaching {
            until: now + delay,
            since,
        };
        self.settle(now);
        Ok(())
    }

    pub fn delete_network_interface(&mut self, eni_id: &str, now: Instant) -> Ec2Result<()> {
        self.settle(now);
        self.refuse_while_new(eni_id, now)?;
        let eni = self.eni_ref(eni_id)?;
        if eni.attachment.is_some() {
            return Err(Ec2Error::client(
                "InvalidNetworkInterface.InUse",
                format!("The network interface '{eni_id}' is currently in use."),
            ));
        }
        self.remove_eni(eni_id);
        Ok(())
    }

    pub fn modify_network_interface_attribute(
        &mut self,
        eni_id: &str,
        change: ModifyArgs,
        now: Instant,
    ) -> Ec2Result<()> {
        self.settle(now);
        self.refuse_while_new(eni_id, now)?;
        let eni = self.eni_ref(eni_id)?;
        let vpc = eni.vpc_id.clone();
        match change {
            ModifyArgs::DeleteOnTermination {
                attachment_id,
                value,
            } => {
                if !well_formed(&attachment_id, "eni-attach") {
                    return Err(malformed(
                        "InvalidAttachmentID.Malformed",
                        "eni-attach",
                        &attachment_id,
                    ));
                }
                let att = self
                    .enis
                    .get_mut(eni_id)
                    .and_then(|e| e.attachment.as_mut())
                    .filter(|a| a.id == attachment_id)
                    .ok_or_else(|| {
                        Ec2Error::client(
                            "InvalidAttachmentID.NotFound",
                            format!(
                                "The attachment ID '{attachment_id}' does not exist for {eni_id}"
                            ),
                        )
                    })?;
                att.delete_on_termination = value;
            }
            ModifyArgs::Groups(groups) => {
                if groups.is_empty() {
                    return Err(Ec2Error::missing("SecurityGroupId"));
                }
                self.check_groups(&vpc, &groups)?;
                self.enis.get_mut(eni_id).expect("checked").security_groups = groups;
            }
            ModifyArgs::Description(d) => {
                self.enis.get_mut(eni_id).expect("checked").description = d;
            }
        }
        Ok(())
    }
}
