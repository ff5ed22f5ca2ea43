//! IPv6 as EC2 has it: every VPC carries an Amazon-provided /56, every subnet a /64 of it
//! (`assignIpv6AddressOnCreation` false), and an ENI holds IPv6 addresses and /80 prefixes from its
//! subnet's /64 through AssignIpv6Addresses / UnassignIpv6Addresses.
//!
//! The blocks are deterministic (the n-th VPC gets `2600:1f18:6d00:n00::/56` — the range AWS
//! allocates Amazon GUAs from in us-east-1 — and the k-th subnet of a VPC its k-th /64), so runs are
//! stable. Limits: an ENI holds as many IPv6 addresses as it can IPv4 addresses (its instance type's
//! `Ipv4AddressesPerInterface`, the catalog's largest when not attached), and each /80 counts as one
//! of them, as a /28 counts as one IPv4 address. The first four and the last address of the /64
//! are reserved, as EC2 reserves them.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv6Addr;

use ipnet::Ipv6Net;
use tokio::time::Instant;

use super::rng::Rng;
use super::{Ec2Error, Ec2Result, World};
use crate::catalog::MAX_IPV4_PER_ENI;

/// The length of the prefixes EC2 delegates to an ENI from a subnet's /64.
pub const IPV6_PREFIX_LEN: u8 = 80;

/// The /56 of the `n`-th VPC (0-based; 256 per `2600:1f18:6dxx::/40`, then the next /40).
pub(super) fn vpc_block(n: usize) -> Ipv6Net {
    let n = n as u128 & 0xffff;
    let base: u128 = 0x2600_1f18_6d00_0000 << 64;
    Ipv6Net::new(Ipv6Addr::from(base | (n << 72)), 56).expect("/56 is valid")
}

/// The `k`-th /64 of a VPC's /56 (`None` past the 256th: that subnet has no IPv6 block).
pub(super) fn subnet_block(vpc: Ipv6Net, k: usize) -> Option<Ipv6Net> {
    (k < 256).then(|| {
        let base = u128::from(vpc.network());
        Ipv6Net::new(Ipv6Addr::from(base | ((k as u128) << 64)), 64).expect("/64 is valid")
    })
}

/// A subnet's IPv6 block and who holds what in it.
#[derive(Debug, Clone)]
pub(super) struct Ipv6Book {
    pub cidr: Ipv6Net,
    /// Single addresses by value, with the ENI that holds them.
    addresses: BTreeMap<u128, String>,
    /// /80 prefixes by network, with the ENI that holds them.
    prefixes: BTreeMap<u128, String>,
}

fn prefix_of(a: u128) -> u128 {
    a & !((1u128 << (128 - IPV6_PREFIX_LEN)) - 1)
}

/// The last address of the /80 at `net`.
fn prefix_end(net: u128) -> u128 {
    net + (1u128 << (128 - IPV6_PREFIX_LEN)) - 1
}

impl Ipv6Book {
    pub(super) fn new(cidr: Ipv6Net) -> Self {
        Self {
            cidr,
            addresses: BTreeMap::new(),
            prefixes: BTreeMap::new(),
        }
    }

    fn first(&self) -> u128 {
        u128::from(self.cidr.network())
    }

    fn last(&self) -> u128 {
        u128::from(self.cidr.broadcast())
    }

    /// Inside the /64 and not one of the five reserved addresses.
    fn assignable(&self, a: u128) -> bool {
        a >= self.first() + 4 && a < self.last()
    }

    /// Whether `a` is held, alone or inside someone's /80.
    fn in_use(&self, a: u128) -> bool {
        self.addresses.contains_key(&a) || self.prefixes.contains_key(&prefix_of(a))
    }

    /// Whether the /80 at `net` is free: no prefix there, no single address inside, and it does not
    /// cover a reserved address.
    fn prefix_free(&self, net: u128) -> bool {
        let end = prefix_end(net);
        net > self.first() + 3
            && end < self.last()
            && !self.prefixes.contains_key(&net)
            && self.addresses.range(net..=end).next().is_none()
    }

    /// A free address at random over the /64 (EC2's spread; 2^64 addresses never run out here).
    fn pick_address(&self, rng: &mut Rng) -> u128 {
        loop {
            let a = self.first() | u128::from(rng.below(u64::MAX));
            if self.assignable(a) && !self.in_use(a) {
                return a;
            }
        }
    }

    /// A free /80 at random among the /64's 65,536.
    fn pick_prefix(&self, rng: &mut Rng) -> u128 {
        loop {
            let n = u128::from(rng.below(1 << 16));
            let net = self.first() | (n << (128 - IPV6_PREFIX_LEN));
            if self.prefix_free(net) {
                return net;
            }
        }
    }

    /// Drops everything `eni` holds (the ENI is deleted).
    pub(super) fn release_eni(&mut self, eni: &str) {
        self.addresses.retain(|_, h| h != eni);
        self.prefixes.retain(|_, h| h != eni);
    }

    pub(super) fn is_empty(&self) -> bool {
        self.addresses.is_empty() && self.prefixes.is_empty()
    }
}

/// What an ENI holds in IPv6, each with when it was assigned (IMDS shows it after the lag), and
/// what was unassigned recently (IMDS still shows it until the lag passes).
#[derive(Debug, Clone, Default)]
pub(super) struct EniIpv6 {
    pub addresses: Vec<(Ipv6Addr, Instant)>,
    pub removed: Vec<(Ipv6Addr, Instant)>,
    pub prefixes: Vec<(Ipv6Net, Instant)>,
    pub removed_prefixes: Vec<(Ipv6Net, Instant)>,
}

impl EniIpv6 {
    /// What counts against the per-interface limit: each address and each /80.
    fn count(&self) -> u32 {
        (self.addresses.len() + self.prefixes.len()) as u32
    }
}

/// What `AssignIpv6Addresses` asks for: addresses or /80 prefixes, by count or by value.
#[derive(Clone, Debug)]
pub enum Ipv6Args {
    /// `Ipv6AddressCount`.
    Count(u32),
    /// `Ipv6Addresses.N`.
    Addresses(Vec<Ipv6Addr>),
    /// `Ipv6PrefixCount`.
    PrefixCount(u32),
    /// `Ipv6Prefix.N`.
    Prefixes(Vec<Ipv6Net>),
}

/// What an assign gave: the new addresses and the new prefixes (the reply lists only those).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ipv6Assigned {
    pub addresses: Vec<Ipv6Addr>,
    pub prefixes: Vec<Ipv6Net>,
}

fn no_ipv6_block(subnet_id: &str) -> Ec2Error {
    Ec2Error::client(
        "InvalidParameterValue",
        format!(
            "The subnet {subnet_id} does not have an IPv6 CIDR block: associate one before assigning IPv6 addresses or prefixes."
        ),
    )
}

fn ipv6_limit(count: u32, limit: u32) -> Ec2Error {
    Ec2Error::client(
        "PrivateIpAddressLimitExceeded",
        format!(
            "Number of IPv6 addresses and prefixes ({count}) exceeds the limit of {limit} per interface"
        ),
    )
}

fn in_use(what: &str) -> Ec2Error {
    Ec2Error::client(
        "InvalidIPAddress.InUse",
        format!("Address {what} is in use."),
    )
}

impl World {
    /// The subnet's IPv6 book, or EC2's error for a subnet without an IPv6 block.
    fn ipv6_book(&self, subnet_id: &str) -> Ec2Result<&Ipv6Book> {
        self.subnets[subnet_id]
            .ipv6
            .as_ref()
            .ok_or_else(|| no_ipv6_block(subnet_id))
    }

    /// `AssignIpv6Addresses`: validates everything first, then assigns (all or nothing).
    pub fn assign_ipv6(
        &mut self,
        eni_id: &str,
        args: Ipv6Args,
        now: Instant,
    ) -> Ec2Result<Ipv6Assigned> {
        self.settle(now);
        self.refuse_while_new(eni_id, now)?;
        let eni = self.eni_ref(eni_id)?;
        let subnet_id = eni.subnet_id.clone();
        let have = eni.ipv6.count();
        let limit = self
            .attached_type(eni)
            .map_or(MAX_IPV4_PER_ENI, |t| t.ipv4_per_eni);
        let (adding, param) = match &args {
            Ipv6Args::Count(n) => (*n, "Ipv6AddressCount"),
            Ipv6Args::Addresses(v) => (v.len() as u32, "Ipv6Addresses"),
            Ipv6Args::PrefixCount(n) => (*n, "Ipv6PrefixCount"),
            Ipv6Args::Prefixes(v) => (v.len() as u32, "Ipv6Prefix"),
        };
        if adding == 0 {
            return Err(Ec2Error::invalid_value(param, "0", "Must be at least 1."));
        }
        let book = self.ipv6_book(&subnet_id)?;
        if have + adding > limit {
            return Err(ipv6_limit(have + adding, limit));
        }
        let mut out = Ipv6Assigned::default();
        match args {
            Ipv6Args::Count(n) => {
                let mut book = book.clone();
                for _ in 0..n {
                    let a = book.pick_address(&mut self.rng);
                    book.addresses.insert(a, eni_id.to_owned());
                    out.addresses.push(Ipv6Addr::from(a));
                }
                self.subnets.get_mut(&subnet_id).expect("checked").ipv6 = Some(book);
            }
            Ipv6Args::Addresses(list) => {
                let mut seen = BTreeSet::new();
                for ip in &list {
                    let a = u128::from(*ip);
                    if !seen.insert(a) {
                        return Err(Ec2Error::invalid_value(
                            "Ipv6Addresses",
                            &ip.to_string(),
                            "Duplicate address.",
                        ));
                    }
                    if !book.assignable(a) {
                        return Err(Ec2Error::client(
                            "InvalidParameterValue",
                            format!(
                                "Address {ip} is not in the IPv6 CIDR block {} of subnet {subnet_id}, or is one of its reserved addresses.",
                                book.cidr
                            ),
                        ));
                    }
                    if book.in_use(a) {
                        return Err(in_use(&ip.to_string()));
                    }
                }
                let book = self.subnets.get_mut(&subnet_id).expect("checked");
                let book = book.ipv6.as_mut().expect("checked");
                for ip in &list {
                    book.addresses.insert(u128::from(*ip), eni_id.to_owned());
                }
                out.addresses = list;
            }
            Ipv6Args::PrefixCount(n) => {
                let mut book = book.clone();
                for _ in 0..n {
                    let net = book.pick_prefix(&mut self.rng);
                    book.prefixes.insert(net, eni_id.to_owned());
                    out.prefixes.push(
                        Ipv6Net::new(Ipv6Addr::from(net), IPV6_PREFIX_LEN).expect("/80 is valid"),
                    );
                }
                self.subnets.get_mut(&subnet_id).expect("checked").ipv6 = Some(book);
            }
            Ipv6Args::Prefixes(list) => {
                let mut seen = BTreeSet::new();
                for net in &list {
                    let n = u128::from(net.network());
                    if net.prefix_len() != IPV6_PREFIX_LEN
                        || net.addr() != net.network()
                        || !book.cidr.contains(net)
                    {
                        return Err(Ec2Error::invalid_value(
                            "Ipv6Prefix",
                            &net.to_string(),
                            &format!(
                                "Expected an aligned /80 inside the subnet's IPv6 CIDR block {}.",
                                book.cidr
                            ),
                        ));
                    }
                    if !seen.insert(n) {
                        return Err(Ec2Error::invalid_value(
                            "Ipv6Prefix",
                            &net.to_string(),
                            "Duplicate prefix.",
                        ));
                    }
                    if !book.prefix_free(n) {
                        if book.prefixes.contains_key(&n)
                            || book.addresses.range(n..=prefix_end(n)).next().is_some()
                        {
                            return Err(in_use(&net.to_string()));
                        }
                        return Err(Ec2Error::invalid_value(
                            "Ipv6Prefix",
                            &net.to_string(),
                            "The prefix covers a reserved address of the subnet.",
                        ));
                    }
                }
                let book = self.subnets.get_mut(&subnet_id).expect("checked");
                let book = book.ipv6.as_mut().expect("checked");
                for net in &list {
                    book.prefixes
                        .insert(u128::from(net.network()), eni_id.to_owned());
                }
                out.prefixes = list;
            }
        }
        let e = &mut self.enis.get_mut(eni_id).expect("checked").ipv6;
        e.addresses.extend(out.addresses.iter().map(|a| (*a, now)));
        e.removed.retain(|(a, _)| !out.addresses.contains(a));
        e.prefixes.extend(out.prefixes.iter().map(|p| (*p, now)));
        e.removed_prefixes
            .retain(|(p, _)| !out.prefixes.contains(p));
        Ok(out)
    }

    /// `UnassignIpv6Addresses` with `Ipv6Addresses.N` and/or `Ipv6Prefix.N`: all or nothing.
    pub fn unassign_ipv6(
        &mut self,
        eni_id: &str,
        addresses: &[Ipv6Addr],
        prefixes: &[Ipv6Net],
        now: Instant,
    ) -> Ec2Result<()> {
        self.settle(now);
        self.refuse_while_new(eni_id, now)?;
        let eni = self.eni_ref(eni_id)?;
        if addresses.is_empty() && prefixes.is_empty() {
            return Err(Ec2Error::missing("Ipv6Addresses or Ipv6Prefix"));
        }
        for a in addresses {
            if !eni.ipv6.addresses.iter().any(|(x, _)| x == a) {
                return Err(Ec2Error::client(
                    "InvalidParameterValue",
                    format!(
                        "Some of the specified IPv6 addresses are not assigned to interface {eni_id}: {a}"
                    ),
                ));
            }
        }
        for p in prefixes {
            if !eni.ipv6.prefixes.iter().any(|(x, _)| x == p) {
                return Err(Ec2Error::client(
                    "InvalidParameterValue",
                    format!(
                        "Some of the specified IPv6 prefixes are not assigned to interface {eni_id}: {p}"
                    ),
                ));
            }
        }
        let subnet_id = eni.subnet_id.clone();
        let e = &mut self.enis.get_mut(eni_id).expect("checked").ipv6;
        e.addresses.retain(|(x, _)| !addresses.contains(x));
        e.removed.extend(addresses.iter().map(|a| (*a, now)));
        e.prefixes.retain(|(x, _)| !prefixes.contains(x));
        e.removed_prefixes
            .extend(prefixes.iter().map(|p| (*p, now)));
        if let Some(book) = self
            .subnets
            .get_mut(&subnet_id)
            .and_then(|s| s.ipv6.as_mut())
        {
            for a in addresses {
                book.addresses.remove(&u128::from(*a));
            }
            for p in prefixes {
                book.prefixes.remove(&u128::from(p.network()));
            }
        }
        Ok(())
    }

    /// Takes a subnet's IPv6 block away (EC2's DisassociateSubnetCidrBlock), refused while an ENI
    /// holds an address or prefix of it. For tests of a subnet without IPv6.
    pub fn disassociate_subnet_ipv6(&mut self, subnet_id: &str) -> Ec2Result<()> {
        let s = self.subnet_ref(subnet_id)?;
        if s.ipv6.as_ref().is_some_and(|b| !b.is_empty()) {
            return Err(Ec2Error::client(
                "InvalidCidrBlock.InUse",
                format!(
                    "The IPv6 CIDR block of subnet {subnet_id} is in use by network interfaces."
                ),
            ));
        }
        self.subnets.get_mut(subnet_id).expect("checked").ipv6 = None;
        Ok(())
    }
}
