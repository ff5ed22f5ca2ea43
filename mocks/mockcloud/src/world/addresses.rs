//! Each subnet's address book: who holds every address (an ENI's /32, a /28 prefix, or an outside
//! user a test put there), the five addresses AWS reserves, subnet CIDR reservations, aligned /28
//! blocks, and EC2's random spread when it picks addresses or blocks itself.
//!
//! Addresses are unique VPC-wide: subnets of a VPC never overlap and an ENI only holds addresses of
//! its own subnet, so one book per subnet is enough. A prefix holds all 16 of its addresses, so no
//! /32 can be assigned inside it and it can never cover a used address.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use serde::{Deserialize, Serialize};

use super::rng::Rng;
use super::{Ec2Error, Ec2Result, World, insufficient, insufficient_cidr_blocks};

/// `ReservationType` of a subnet CIDR reservation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReservationType {
    /// Automatic prefix assignment draws from it first.
    Prefix,
    /// Only explicit requests (`PrivateIpAddress.N`, `Ipv4Prefix.N`) use it.
    Explicit,
}

impl ReservationType {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Prefix => "prefix",
            Self::Explicit => "explicit",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "prefix" => Some(Self::Prefix),
            "explicit" => Some(Self::Explicit),
            _ => None,
        }
    }
}

#[derive(Debug, Clone)]
pub(super) struct Reservation {
    pub cidr: Ipv4Net,
    pub kind: ReservationType,
    pub description: String,
    pub tags: BTreeMap<String, String>,
}

/// Who holds an address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Holder {
    /// A primary or secondary IP of this ENI.
    Ip(String),
    /// Part of a /28 prefix of this ENI.
    Prefix(String),
    /// Taken by something outside mockcloud's ENIs (a test building a fragmented subnet).
    Occupied,
}

impl Holder {
    pub(super) fn eni(&self) -> Option<&str> {
        match self {
            Self::Ip(e) | Self::Prefix(e) => Some(e),
            Self::Occupied => None,
        }
    }
}

#[derive(Debug)]
pub(super) struct Subnet {
    pub vpc_id: String,
    pub cidr: Ipv4Net,
    pub az: String,
    pub tags: BTreeMap<String, String>,
    /// Subnet CIDR reservations by id; they never overlap each other.
    pub reservations: BTreeMap<String, Reservation>,
    used: BTreeMap<u32, Holder>,
    /// The subnet's IPv6 /64 and who holds what in it (`None`: no IPv6 block).
    pub ipv6: Option<super::ipv6::Ipv6Book>,
}

/// Where an aligned /28 block stands relative to the subnet's reservations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BlockPlace {
    /// Inside one `prefix` reservation.
    InPrefixReservation,
    /// Overlapping some reservation otherwise.
    Reserved,
    /// Outside every reservation.
    Clear,
}

impl Subnet {
    pub(super) fn new(vpc_id: &str, cidr: Ipv4Net, az: &str) -> Self {
        Self {
            vpc_id: vpc_id.to_owned(),
            cidr,
            az: az.to_owned(),
            tags: BTreeMap::new(),
            reservations: BTreeMap::new(),
            used: BTreeMap::new(),
            ipv6: None,
        }
    }

    /// Lowest assignable address (network, router, DNS and the reserved fourth come before it).
    fn first(&self) -> u32 {
        u32::from(self.cidr.network()) + 4
    }

    /// Highest assignable address (the broadcast address comes after it).
    fn last(&self) -> u32 {
        u32::from(self.cidr.broadcast()) - 1
    }

    /// Addresses EC2 can hand out: the CIDR minus network, router, DNS, reserved and broadcast.
    pub(super) fn usable(&self) -> u32 {
        (1u32 << (32 - self.cidr.prefix_len())).saturating_sub(5)
    }

    pub(super) fn used_count(&self) -> u32 {
        self.used.len() as u32
    }

    /// `AvailableIpAddressCount`: every address not held (a prefix holds 16).
    pub(super) fn free(&self) -> u32 {
        self.usable() - self.used_count()
    }

    /// Whether `ip` is inside the subnet and not one of the five reserved addresses.
    pub(super) fn assignable(&self, ip: Ipv4Addr) -> bool {
        (self.first()..=self.last()).contains(&u32::from(ip))
    }

    pub(super) fn holder(&self, ip: Ipv4Addr) -> Option<&Holder> {
        self.used.get(&u32::from(ip))
    }

    pub(super) fn hold(&mut self, ip: u32, holder: Holder) {
        self.used.insert(ip, holder);
    }

    pub(super) fn release(&mut self, ip: u32) -> Option<Holder> {
        self.used.remove(&ip)
    }

    /// Frees everything `eni` holds here (undoing a half-done request).
    pub(super) fn release_held_by(&mut self, eni: &str) {
        self.used.retain(|_, h| h.eni() != Some(eni));
    }

    pub(super) fn occupied(&self) -> u32 {
        self.used
            .values()
            .filter(|h| **h == Holder::Occupied)
            .count() as u32
    }

    /// Held addresses inside `net`.
    pub(super) fn used_in(&self, net: Ipv4Net) -> impl Iterator<Item = (u32, &Holder)> {
        self.used
            .range(u32::from(net.network())..=u32::from(net.broadcast()))
            .map(|(ip, h)| (*ip, h))
    }

    fn in_reservation(&self, ip: u32) -> bool {
        self.reservations
            .values()
            .any(|r| r.cidr.contains(&Ipv4Addr::from(ip)))
    }

    /// Assignable addresses inside `net`.
    fn assignable_in(&self, net: Ipv4Net) -> u32 {
        let lo = u32::from(net.network()).max(self.first());
        let hi = u32::from(net.broadcast()).min(self.last());
        if lo > hi { 0 } else { hi - lo + 1 }
    }

    /// Free addresses automatic /32 assignment may draw from: outside every reservation.
    pub(super) fn auto_free(&self) -> u32 {
        let reserved_free: u32 = self
            .reservations
            .values()
            .map(|r| self.assignable_in(r.cidr) - self.used_in(r.cidr).count() as u32)
            .sum();
        self.free() - reserved_free
    }

    /// A free address outside every reservation, chosen at random over the whole subnet as EC2 does
    /// (so a churn of /32s fragments the subnet).
    pub(super) fn pick_ip(&self, rng: &mut Rng) -> Option<u32> {
        let (first, span) = (self.first(), u64::from(self.last() - self.first() + 1));
        let ok = |ip: u32| !self.used.contains_key(&ip) && !self.in_reservation(ip);
        for _ in 0..64 {
            let ip = first + rng.below(span) as u32;
            if ok(ip) {
                return Some(ip);
            }
        }
        // Nearly full: choose among what is left.
        let left: Vec<u32> = (first..=self.last()).filter(|ip| ok(*ip)).collect();
        (!left.is_empty()).then(|| left[rng.below(left.len() as u64) as usize])
    }

    /// Starts of the aligned /28 blocks that hold no reserved address (the first block of a subnet
    /// holds the network, router and DNS addresses, the last one the broadcast address).
    fn blocks(&self) -> impl Iterator<Item = u32> + '_ {
        let start = self.first().next_multiple_of(16);
        let end = self.last().saturating_sub(15);
        (start..=end).step_by(16)
    }

    fn block_free(&self, start: u32) -> bool {
        self.used.range(start..start + 16).next().is_none()
    }

    fn block_place(&self, start: u32) -> BlockPlace {
        let block = Ipv4Net::new(Ipv4Addr::from(start), 28).expect("valid length");
        let mut place = BlockPlace::Clear;
        for r in self.reservations.values() {
            if r.cidr.contains(&block) && r.kind == ReservationType::Prefix {
                return BlockPlace::InPrefixReservation;
            }
            if r.cidr.contains(&block.network()) || block.contains(&r.cidr.network()) {
                place = BlockPlace::Reserved;
            }
        }
        place
    }

    /// Free aligned /28 blocks, wherever they are.
    pub(super) fn free_blocks(&self) -> u32 {
        self.blocks().filter(|b| self.block_free(*b)).count() as u32
    }

    /// Free blocks automatic prefix assignment may take: `prefix` reservations first, then blocks
    /// outside every reservation.
    fn auto_blocks(&self) -> (Vec<u32>, Vec<u32>) {
        let mut in_prefix = Vec::new();
        let mut clear = Vec::new();
        for b in self.blocks().filter(|b| self.block_free(*b)) {
            match self.block_place(b) {
                BlockPlace::InPrefixReservation => in_prefix.push(b),
                BlockPlace::Clear => clear.push(b),
                BlockPlace::Reserved => {}
            }
        }
        (in_prefix, clear)
    }

    pub(super) fn auto_block_count(&self) -> u32 {
        let (a, b) = self.auto_blocks();
        (a.len() + b.len()) as u32
    }

    /// A block for an automatic prefix: random among the free blocks of `prefix` reservations, else
    /// random among the free blocks outside every reservation.
    pub(super) fn pick_block(&self, rng: &mut Rng) -> Option<u32> {
        let (in_prefix, clear) = self.auto_blocks();
        let pool = if in_prefix.is_empty() {
            clear
        } else {
            in_prefix
        };
        (!pool.is_empty()).then(|| pool[rng.below(pool.len() as u64) as usize])
    }
}

/// A subnet's address accounting, for tests and benchmarks (`GET /_mock/subnets/{id}/usage`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubnetUsage {
    pub subnet_id: String,
    pub cidr: Ipv4Net,
    /// CIDR size minus the five reserved addresses.
    pub usable: u32,
    /// Held addresses: ENI IPs, 16 per prefix, and occupied ones.
    pub used: u32,
    /// `AvailableIpAddressCount`.
    pub free_addresses: u32,
    /// Free addresses outside every reservation: what automatic /32 assignment can draw.
    pub auto_free_addresses: u32,
    /// Aligned /28 blocks with no held or reserved address.
    pub free_prefix_blocks: u32,
    /// Of those, the ones automatic prefix assignment may take (`prefix` reservations or unreserved).
    pub auto_prefix_blocks: u32,
    /// Addresses occupied from outside (`occupy`).
    pub occupied: u32,
    /// Subnet CIDR reservations.
    pub reservations: u32,
}

/// Addresses a test marks as taken by something outside mockcloud's ENIs (`POST
/// /_mock/subnets/{id}/occupy`), e.g. to build a fragmented subnet.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum OccupyPattern {
    /// Exactly these addresses (each must be assignable and free).
    Addresses { addresses: Vec<Ipv4Addr> },
    /// Every free assignable address whose offset from the subnet's network address is `offset`
    /// modulo `stride` (`{"stride": 16, "offset": 8}` leaves no /28 free).
    Stride { stride: u32, offset: u32 },
    /// Every free assignable address inside `cidr`.
    Range { cidr: Ipv4Net },
}

impl World {
    fn subnet_mut(&mut self, subnet_id: &str) -> &mut Subnet {
        self.subnets
            .get_mut(subnet_id)
            .expect("subnet checked by caller")
    }

    /// Takes a random free address outside every reservation for `eni_id`.
    pub(super) fn take_ip(&mut self, subnet_id: &str, eni_id: &str) -> Ec2Result<Ipv4Addr> {
        let subnet = self
            .subnets
            .get(subnet_id)
            .expect("subnet checked by caller");
        let ip = subnet
            .pick_ip(&mut self.rng)
            .ok_or_else(|| insufficient(subnet_id))?;
        self.subnet_mut(subnet_id)
            .hold(ip, Holder::Ip(eni_id.to_owned()));
        Ok(Ipv4Addr::from(ip))
    }

    pub(super) fn claim_ip(&mut self, subnet_id: &str, ip: Ipv4Addr, eni_id: &str) {
        self.subnet_mut(subnet_id)
            .hold(u32::from(ip), Holder::Ip(eni_id.to_owned()));
    }

    pub(super) fn free_ip(&mut self, subnet_id: &str, ip: Ipv4Addr) {
        if let Some(s) = self.subnets.get_mut(subnet_id) {
            s.release(u32::from(ip));
        }
    }

    /// Takes a free aligned /28 for `eni_id` (`prefix` reservations first).
    pub(super) fn take_prefix(&mut self, subnet_id: &str, eni_id: &str) -> Ec2Result<Ipv4Net> {
        let subnet = self
            .subnets
            .get(subnet_id)
            .expect("subnet checked by caller");
        let start = subnet
            .pick_block(&mut self.rng)
            .ok_or_else(insufficient_cidr_blocks)?;
        let net = Ipv4Net::new(Ipv4Addr::from(start), 28).expect("valid length");
        self.claim_prefix(subnet_id, net, eni_id);
        Ok(net)
    }

    pub(super) fn claim_prefix(&mut self, subnet_id: &str, net: Ipv4Net, eni_id: &str) {
        let s = self.subnet_mut(subnet_id);
        let start = u32::from(net.network());
        for ip in start..start + 16 {
            s.hold(ip, Holder::Prefix(eni_id.to_owned()));
        }
    }

    pub(super) fn free_prefix(&mut self, subnet_id: &str, net: Ipv4Net) {
        if let Some(s) = self.subnets.get_mut(subnet_id) {
            let start = u32::from(net.network());
            for ip in start..start + 16 {
                s.release(ip);
            }
        }
    }

    /// Deletes an ENI and frees everything it held.
    pub(super) fn remove_eni(&mut self, eni_id: &str) {
        if let Some(e) = self.enis.remove(eni_id) {
            self.free_ip(&e.subnet_id, e.primary_ip);
            for (ip, _) in e.secondaries {
                self.free_ip(&e.subnet_id, ip);
            }
            for (net, _) in e.prefixes {
                self.free_prefix(&e.subnet_id, net);
            }
            if let Some(book) = self
                .subnets
                .get_mut(&e.subnet_id)
                .and_then(|s| s.ipv6.as_mut())
            {
                book.release_eni(eni_id);
            }
        }
    }

    /// Checks an explicit address for `subnet_id`: inside, not reserved, and free (or, with
    /// `allow_reassignment`, a secondary IP of another ENI, which is returned).
    pub(super) fn check_explicit(
        &self,
        subnet_id: &str,
        ip: Ipv4Addr,
        eni_id: Option<&str>,
        allow_reassignment: bool,
    ) -> Ec2Result<Option<String>> {
        let s = &self.subnets[subnet_id];
        if !s.assignable(ip) {
            return Err(Ec2Error::client(
                "InvalidParameterValue",
                format!(
                    "Address {ip} does not fall within the subnet's address range or is reserved"
                ),
            ));
        }
        match s.holder(ip) {
            None => Ok(None),
            Some(Holder::Ip(owner)) if Some(owner.as_str()) == eni_id => Err(Ec2Error::client(
                "InvalidParameterValue",
                format!("Address {ip} is already assigned to {owner}"),
            )),
            Some(Holder::Ip(owner))
                if allow_reassignment
                    && self.enis.get(owner).is_some_and(|e| e.primary_ip != ip) =>
            {
                Ok(Some(owner.clone()))
            }
            Some(Holder::Prefix(owner)) => Err(Ec2Error::client(
                "InvalidIPAddress.InUse",
                format!("Address {ip} is in use: it is inside a prefix of {owner}."),
            )),
            Some(_) => Err(Ec2Error::client(
                "InvalidIPAddress.InUse",
                format!("Address {ip} is in use."),
            )),
        }
    }

    /// Checks an explicit prefix for `subnet_id`: a /28, aligned, inside the subnet, clear of the
    /// reserved addresses, and with none of its 16 addresses held.
    pub(super) fn check_explicit_prefix(
        &self,
        subnet_id: &str,
        net: Ipv4Net,
        eni_id: Option<&str>,
    ) -> Ec2Result<()> {
        if net.prefix_len() != 28 {
            return Err(Ec2Error::invalid_value(
                "Ipv4Prefix",
                &net.to_string(),
                "An IPv4 prefix must be a /28.",
            ));
        }
        if net.trunc() != net {
            return Err(Ec2Error::invalid_value(
                "Ipv4Prefix",
                &net.to_string(),
                &format!("The prefix is not aligned: did you mean {}?", net.trunc()),
            ));
        }
        let s = &self.subnets[subnet_id];
        if !s.assignable(net.network()) || !s.assignable(net.broadcast()) {
            return Err(Ec2Error::invalid_value(
                "Ipv4Prefix",
                &net.to_string(),
                &format!(
                    "The prefix must lie within the subnet's range ({}) and clear of its reserved addresses.",
                    s.cidr
                ),
            ));
        }
        if let Some((ip, h)) = s.used_in(net).next() {
            let ip = Ipv4Addr::from(ip);
            return Err(match h.eni() {
                Some(owner) if Some(owner) == eni_id && *h == Holder::Prefix(owner.to_owned()) => {
                    Ec2Error::client(
                        "InvalidParameterValue",
                        format!("Prefix {net} is already assigned to {owner}"),
                    )
                }
                _ => Ec2Error::client(
                    "InvalidIPAddress.InUse",
                    format!("Prefix {net} overlaps address {ip}, which is in use."),
                ),
            });
        }
        Ok(())
    }

    /// A subnet's address accounting.
    pub fn subnet_usage(&self, subnet_id: &str) -> Ec2Result<SubnetUsage> {
        let s = self.subnet_ref(subnet_id)?;
        Ok(SubnetUsage {
            subnet_id: subnet_id.to_owned(),
            cidr: s.cidr,
            usable: s.usable(),
            used: s.used_count(),
            free_addresses: s.free(),
            auto_free_addresses: s.auto_free(),
            free_prefix_blocks: s.free_blocks(),
            auto_prefix_blocks: s.auto_block_count(),
            occupied: s.occupied(),
            reservations: s.reservations.len() as u32,
        })
    }

    /// Marks addresses as taken from outside; returns how many were taken.
    pub fn occupy_addresses(&mut self, subnet_id: &str, pattern: &OccupyPattern) -> Ec2Result<u32> {
        let s = self.subnet_ref(subnet_id)?;
        let net = u32::from(s.cidr.network());
        let targets: Vec<u32> = match pattern {
            OccupyPattern::Addresses { addresses } => {
                for ip in addresses {
                    self.check_explicit(subnet_id, *ip, None, false)?;
                }
                let mut ips: Vec<u32> = addresses.iter().map(|ip| u32::from(*ip)).collect();
                ips.sort_unstable();
                ips.dedup();
                ips
            }
            OccupyPattern::Stride { stride, offset } => {
                if *stride == 0 {
                    return Err(Ec2Error::invalid_value(
                        "stride",
                        "0",
                        "Must be at least 1.",
                    ));
                }
                (s.first()..=s.last())
                    .filter(|ip| (ip - net) % stride == offset % stride)
                    .filter(|ip| s.holder(Ipv4Addr::from(*ip)).is_none())
                    .collect()
            }
            OccupyPattern::Range { cidr } => {
                if !s.cidr.contains(cidr) {
                    return Err(Ec2Error::invalid_value(
                        "cidr",
                        &cidr.to_string(),
                        &format!("Must lie within the subnet ({}).", s.cidr),
                    ));
                }
                let (lo, hi) = (u32::from(cidr.network()), u32::from(cidr.broadcast()));
                (lo.max(s.first())..=hi.min(s.last()))
                    .filter(|ip| s.holder(Ipv4Addr::from(*ip)).is_none())
                    .collect()
            }
        };
        let s = self.subnet_mut(subnet_id);
        for ip in &targets {
            s.hold(*ip, Holder::Occupied);
        }
        Ok(targets.len() as u32)
    }

    /// Frees every address occupied from outside; returns how many.
    pub fn release_occupied(&mut self, subnet_id: &str) -> Ec2Result<u32> {
        self.subnet_ref(subnet_id)?;
        let s = self.subnet_mut(subnet_id);
        let before = s.used_count();
        s.used.retain(|_, h| *h != Holder::Occupied);
        Ok(before - s.used_count())
    }
}
