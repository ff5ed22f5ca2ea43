//! Addresses on an existing ENI: AssignPrivateIpAddresses (secondary IPs by count or by address,
//! AllowReassignment; /28 prefixes by count or by CIDR) and UnassignPrivateIpAddresses (IPs and
//! prefixes). Every prefix counts as one address against `Ipv4AddressesPerInterface`.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use tokio::time::Instant;

use super::enis::prefixes_unsupported;
use super::{
    AssignArgs, Ec2Error, Ec2Result, PrefixArgs, World, insufficient, insufficient_cidr_blocks,
    limit_exceeded,
};
use crate::catalog::MAX_IPV4_PER_ENI;

impl World {
    /// The per-interface address limit of an ENI: its instance type's when attached, the catalog's
    /// largest when not.
    fn address_limit(&self, eni_id: &str) -> u32 {
        self.attached_type(&self.enis[eni_id])
            .map_or(MAX_IPV4_PER_ENI, |t| t.ipv4_per_eni)
    }

    /// Secondary IPs; returns the new addresses (the reply lists only those).
    pub fn assign_private_ip_addresses(
        &mut self,
        eni_id: &str,
        args: AssignArgs,
        now: Instant,
    ) -> Ec2Result<Vec<Ipv4Addr>> {
        self.settle(now);
        self.refuse_while_new(eni_id, now)?;
        let eni = self.eni_ref(eni_id)?;
        let limit = self.address_limit(eni_id);
        let subnet_id = eni.subnet_id.clone();
        let have = eni.ip_count();
        let adding = match &args {
            AssignArgs::Count(n) => *n,
            AssignArgs::Addresses { ips, .. } => ips.len() as u32,
        };
        if adding == 0 {
            return Err(Ec2Error::invalid_value(
                "SecondaryPrivateIpAddressCount",
                "0",
                "Must be at least 1.",
            ));
        }
        if have + adding > limit {
            return Err(limit_exceeded(have + adding, limit, ""));
        }
        let new = match args {
            AssignArgs::Count(n) => {
                if n > self.subnets[&subnet_id].auto_free() {
                    return Err(insufficient(&subnet_id));
                }
                let mut new = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    new.push(self.take_ip(&subnet_id, eni_id)?);
                }
                new
            }
            AssignArgs::Addresses {
                ips,
                allow_reassignment,
            } => {
                let mut seen = BTreeSet::new();
                let mut moves = Vec::new();
                for ip in &ips {
                    if !seen.insert(*ip) {
                        return Err(Ec2Error::invalid_value(
                            "PrivateIpAddress",
                            &ip.to_string(),
                            "Duplicate address.",
                        ));
                    }
                    if let Some(owner) =
                        self.check_explicit(&subnet_id, *ip, Some(eni_id), allow_reassignment)?
                    {
                        moves.push((*ip, owner));
                    }
                }
                for (ip, owner) in moves {
                    if let Some(o) = self.enis.get_mut(&owner) {
                        o.secondaries.retain(|(x, _)| *x != ip);
                        o.removed.push((ip, now));
                    }
                    self.free_ip(&subnet_id, ip);
                }
                for ip in &ips {
                    self.claim_ip(&subnet_id, *ip, eni_id);
                }
                ips
            }
        };
        let e = self.enis.get_mut(eni_id).expect("checked");
        e.secondaries.extend(new.iter().map(|ip| (*ip, now)));
        e.removed.retain(|(ip, _)| !new.contains(ip));
        Ok(new)
    }

    /// /28 prefixes (Nitro only); returns the new prefixes (`AssignedIpv4Prefixes`).
    pub fn assign_ipv4_prefixes(
        &mut self,
        eni_id: &str,
        args: PrefixArgs,
        now: Instant,
    ) -> Ec2Result<Vec<Ipv4Net>> {
        self.settle(now);
        self.refuse_while_new(eni_id, now)?;
        let eni = self.eni_ref(eni_id)?;
        if let Some(t) = self.attached_type(eni).filter(|t| !t.is_nitro()) {
            return Err(prefixes_unsupported(&t));
        }
        let limit = self.address_limit(eni_id);
        let subnet_id = eni.subnet_id.clone();
        let have = eni.ip_count();
        let adding = match &args {
            PrefixArgs::Count(n) => *n,
            PrefixArgs::Prefixes(p) => p.len() as u32,
        };
        if adding == 0 {
            return Err(Ec2Error::invalid_value(
                "Ipv4PrefixCount",
                "0",
                "Must be at least 1.",
            ));
        }
        if have + adding > limit {
            return Err(limit_exceeded(have + adding, limit, ""));
        }
        let new = match args {
            PrefixArgs::Count(n) => {
                if n > self.subnets[&subnet_id].auto_block_count() {
                    return Err(insufficient_cidr_blocks());
                }
                let mut new = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    new.push(self.take_prefix(&subnet_id, eni_id)?);
                }
                new
            }
            PrefixArgs::Prefixes(nets) => {
                let mut seen = BTreeSet::new();
                for net in &nets {
                    if !seen.insert(*net) {
                        return Err(Ec2Error::invalid_value(
                            "Ipv4Prefix",
                            &net.to_string(),
                            "Duplicate prefix.",
                        ));
                    }
                    self.check_explicit_prefix(&subnet_id, *net, Some(eni_id))?;
                }
                for net in &nets {
                    self.claim_prefix(&subnet_id, *net, eni_id);
                }
                nets
            }
        };
        let e = self.enis.get_mut(eni_id).expect("checked");
        e.prefixes.extend(new.iter().map(|net| (*net, now)));
        e.removed_prefixes.retain(|(net, _)| !new.contains(net));
        Ok(new)
    }

    pub fn unassign_private_ip_addresses(
        &mut self,
        eni_id: &str,
        ips: &[Ipv4Addr],
        now: Instant,
    ) -> Ec2Result<()> {
        self.unassign_addresses(eni_id, ips, &[], now)
    }

    pub fn unassign_ipv4_prefixes(
        &mut self,
        eni_id: &str,
        prefixes: &[Ipv4Net],
        now: Instant,
    ) -> Ec2Result<()> {
        self.unassign_addresses(eni_id, &[], prefixes, now)
    }

    /// `UnassignPrivateIpAddresses` with `PrivateIpAddress.N` and/or `Ipv4Prefix.N`: all or nothing.
    pub fn unassign_addresses(
        &mut self,
        eni_id: &str,
        ips: &[Ipv4Addr],
        prefixes: &[Ipv4Net],
        now: Instant,
    ) -> Ec2Result<()> {
        self.settle(now);
        self.refuse_while_new(eni_id, now)?;
        let eni = self.eni_ref(eni_id)?;
        if ips.is_empty() && prefixes.is_empty() {
            return Err(Ec2Error::missing("PrivateIpAddress or Ipv4Prefix"));
        }
        for ip in ips {
            if *ip == eni.primary_ip {
                return Err(Ec2Error::client(
                    "InvalidParameterValue",
                    format!("The primary private IP address {ip} of {eni_id} cannot be unassigned"),
                ));
            }
            if !eni.secondaries.iter().any(|(x, _)| x == ip) {
                return Err(Ec2Error::client(
                    "InvalidParameterValue",
                    format!(
                        "Some of the specified addresses are not assigned to interface {eni_id}"
                    ),
                ));
            }
        }
        for net in prefixes {
            if !eni.prefixes.iter().any(|(x, _)| x == net) {
                return Err(Ec2Error::client(
                    "InvalidParameterValue",
                    format!(
                        "Some of the specified prefixes are not assigned to interface {eni_id}: {net}"
                    ),
                ));
            }
        }
        let subnet_id = eni.subnet_id.clone();
        let e = self.enis.get_mut(eni_id).expect("checked");
        e.secondaries.retain(|(x, _)| !ips.contains(x));
        e.removed.extend(ips.iter().map(|ip| (*ip, now)));
        e.prefixes.retain(|(x, _)| !prefixes.contains(x));
        e.removed_prefixes
            .extend(prefixes.iter().map(|net| (*net, now)));
        for ip in ips {
            self.free_ip(&subnet_id, *ip);
        }
        for net in prefixes {
            self.free_prefix(&subnet_id, *net);
        }
        Ok(())
    }
}
