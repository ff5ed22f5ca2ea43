//! IPv6 in the fake, as mockcloud and EC2 have it: the VPC carries a /56 and the subnet a /64 of it
//! (or none: [`MemoryCloud::disassociate_subnet_ipv6`]), and an ENI takes `/80` prefixes of the
//! subnet's /64 through [`eniipam_cloud::Cloud::assign_ipv6_prefixes`]. Each `/80` and each IPv6
//! address counts as one against the per-ENI limit, which is the IPv4 one (the instance type's
//! `Ipv4AddressesPerInterface`), apart from the IPv4 addresses. All or nothing, with the error
//! kinds mockcloud's codes classify to.

use std::collections::BTreeSet;

use ipnet::Ipv6Net;

use eniipam_api::model::EniId;
use eniipam_cloud::{CloudError, CloudResult, Eni};

use crate::MemoryCloud;
use crate::ipv6_block::IPV6_PREFIX_LEN;
use crate::state::{MemoryState, eni_not_found};

/// What an ENI holds against its IPv6 limit: each address and each `/80`.
fn ipv6_slots(e: &Eni) -> u32 {
    (e.ipv6_addresses.len() + e.ipv6_prefixes.len()) as u32
}

impl MemoryState {
    /// AssignIpv6Addresses with Ipv6PrefixCount, checked in mockcloud's order: the ENI, the
    /// subnet's block, the per-ENI limit; then all `count` prefixes or none.
    pub(crate) fn assign_ipv6_prefixes(
        &mut self,
        api: &str,
        eni: &EniId,
        count: u32,
    ) -> CloudResult<Vec<Ipv6Net>> {
        let held = ipv6_slots(self.enis.get(eni).ok_or_else(|| eni_not_found(api, eni))?);
        let subnet_id = self.subnet.id.clone();
        let Some(block) = self.subnet.ipv6.as_mut() else {
            return Err(CloudError::NoIpv6Cidr {
                api: api.into(),
                message: format!("the subnet {subnet_id} does not have an IPv6 CIDR block"),
            });
        };
        let per_eni = self.instance.spec.limits.ipv4_per_eni;
        if held + count > per_eni {
            return Err(CloudError::IpLimitExceeded {
                api: api.into(),
                message: format!(
                    "{eni} holds {held} IPv6 addresses and prefixes, {count} more would exceed the limit of {per_eni} per interface"
                ),
            });
        }
        let new = block
            .allocate(count)
            .ok_or_else(|| CloudError::NoFreePrefix {
                api: api.into(),
                message: format!("subnet {subnet_id} has fewer than {count} free /80 prefixes"),
            })?;
        self.eni_mut(api, eni)?
            .ipv6_prefixes
            .extend(new.iter().copied());
        Ok(new)
    }

    /// AssignIpv6Addresses with Ipv6Prefix.N, with mockcloud's (and EC2's) refusals: an empty list,
    /// a prefix that is not an aligned /80 of the subnet's /64 or covers a reserved address
    /// (`InvalidParameterValue`), one held by any ENI (`InvalidIPAddress.InUse`), the per-ENI limit.
    /// All or nothing.
    pub(crate) fn assign_specific_ipv6_prefixes(
        &mut self,
        api: &str,
        eni: &EniId,
        prefixes: &[Ipv6Net],
    ) -> CloudResult<Vec<Ipv6Net>> {
        let held = ipv6_slots(self.enis.get(eni).ok_or_else(|| eni_not_found(api, eni))?);
        let rejected = |code: &str, message: String| CloudError::Rejected {
            api: api.into(),
            code: code.into(),
            message,
        };
        if prefixes.is_empty() {
            return Err(rejected(
                "InvalidParameterValue",
                "Ipv6Prefix: must name at least 1 prefix".into(),
            ));
        }
        let subnet_id = self.subnet.id.clone();
        let Some(block) = self.subnet.ipv6.as_mut() else {
            return Err(CloudError::NoIpv6Cidr {
                api: api.into(),
                message: format!("the subnet {subnet_id} does not have an IPv6 CIDR block"),
            });
        };
        let per_eni = self.instance.spec.limits.ipv4_per_eni;
        let count = prefixes.len() as u32;
        if held + count > per_eni {
            return Err(CloudError::IpLimitExceeded {
                api: api.into(),
                message: format!(
                    "{eni} holds {held} IPv6 addresses and prefixes, {count} more would exceed the limit of {per_eni} per interface"
                ),
            });
        }
        let mut seen = BTreeSet::new();
        for p in prefixes {
            let aligned = p.prefix_len() == IPV6_PREFIX_LEN
                && p.addr() == p.network()
                && block.cidr.contains(p)
                && p.network() != block.cidr.network()
                && p.broadcast() != block.cidr.broadcast();
            if !aligned || !seen.insert(*p) {
                return Err(rejected(
                    "InvalidParameterValue",
                    format!(
                        "Ipv6Prefix {p}: expected a distinct aligned /80 inside the subnet's block {} that covers no reserved address",
                        block.cidr
                    ),
                ));
            }
            if block.held.contains(p) {
                return Err(rejected(
                    "InvalidIPAddress.InUse",
                    format!("Address {p} is in use."),
                ));
            }
        }
        block.held.extend(prefixes.iter().copied());
        self.eni_mut(api, eni)?
            .ipv6_prefixes
            .extend(prefixes.iter().copied());
        Ok(prefixes.to_vec())
    }

    /// UnassignIpv6Addresses with Ipv6Prefix.N: every one held by the ENI, or nothing changes.
    pub(crate) fn unassign_ipv6_prefixes(
        &mut self,
        api: &str,
        eni: &EniId,
        prefixes: &[Ipv6Net],
    ) -> CloudResult<()> {
        let e = self.eni_mut(api, eni)?;
        crate::state::remove_all(api, eni, &mut e.ipv6_prefixes, prefixes, "an IPv6 prefix")?;
        self.release_ipv6(prefixes);
        Ok(())
    }

    /// The subnet takes `prefixes` back (unassigned, or their ENI deleted).
    pub(crate) fn release_ipv6(&mut self, prefixes: &[Ipv6Net]) {
        if let Some(block) = self.subnet.ipv6.as_mut() {
            for p in prefixes {
                block.held.remove(p);
            }
        }
    }
}

impl MemoryCloud {
    /// Takes the subnet's IPv6 block away (EC2's DisassociateSubnetCidrBlock), as mockcloud's
    /// `disassociate_subnet_ipv6_cidr_block` does; refused (`Err` naming the holders) while an ENI
    /// holds a `/80` of it, as EC2 refuses.
    pub fn disassociate_subnet_ipv6(&self) -> Result<(), String> {
        let mut st = self.lock();
        let holders: Vec<String> = st
            .enis
            .values()
            .filter(|e| !e.ipv6_prefixes.is_empty() || !e.ipv6_addresses.is_empty())
            .map(|e| e.id.to_string())
            .collect();
        if !holders.is_empty() {
            return Err(format!(
                "the subnet's IPv6 block is in use by {}",
                holders.join(", ")
            ));
        }
        st.subnet.ipv6 = None;
        Ok(())
    }

    /// The `/80`s the subnet has delegated, to any ENI.
    pub fn ipv6_prefixes_held(&self) -> BTreeSet<Ipv6Net> {
        self.lock()
            .subnet
            .ipv6
            .as_ref()
            .map(|b| b.held.clone())
            .unwrap_or_default()
    }
}
