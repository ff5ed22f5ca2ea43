//! Subnet CIDR reservations of type `prefix` in the fake, with mockcloud's (and EC2's) rules: the
//! block must be canonical, inside the subnet, clear of the other reservations and of every
//! address in use, else `InvalidParameterValue` in mockcloud's words. Automatic single addresses
//! are never taken inside a reservation, and automatic prefixes come from a reservation's free
//! blocks first (`state.rs`).

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

use eniipam_cloud::{CloudError, CloudResult, PrefixReservation, ReserveError, ReserveResult};

use crate::state::{MemSubnet, rejected};
use crate::{Action, MemoryCloud};

/// A reservation of the subnet, as the fake keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemReservation {
    pub cidr: Ipv4Net,
    pub description: String,
    pub tags: BTreeMap<String, String>,
}

impl MemSubnet {
    /// Whether `ip` lies in one of the subnet's reservations.
    pub(crate) fn in_reservation(&self, ip: Ipv4Addr) -> bool {
        self.reservations.iter().any(|r| r.cidr.contains(&ip))
    }

    /// Whether `block` lies inside one of the subnet's reservations.
    pub(crate) fn inside_reservation(&self, block: Ipv4Net) -> bool {
        self.reservations.iter().any(|r| r.cidr.contains(&block))
    }

    /// The checks CreateSubnetCidrReservation makes of `cidr`.
    fn check_reservation(&self, api: &str, cidr: Ipv4Net) -> CloudResult<()> {
        let bad = |m: String| rejected(api, "InvalidParameterValue", m);
        if cidr.trunc() != cidr {
            return Err(bad(format!(
                "The CIDR {cidr} is not a network address: did you mean {}?",
                cidr.trunc()
            )));
        }
        if !self.cidr.contains(&cidr) {
            return Err(bad(format!(
                "The CIDR {cidr} must lie within the subnet's range ({}).",
                self.cidr
            )));
        }
        if let Some(r) = self
            .reservations
            .iter()
            .find(|r| r.cidr.contains(&cidr) || cidr.contains(&r.cidr))
        {
            return Err(bad(format!(
                "The CIDR {cidr} overlaps the reservation {}.",
                r.cidr
            )));
        }
        if let Some(ip) = self.used.iter().find(|ip| cidr.contains(*ip)) {
            return Err(bad(format!("The CIDR covers {ip}, which is in use.")));
        }
        Ok(())
    }
}

impl MemoryCloud {
    /// GetSubnetCidrReservations: the subnet's `prefix` reservations (the only type the fake makes).
    pub(crate) async fn prefix_reservations(&self, subnet_id: &str) -> CloudResult<Vec<Ipv4Net>> {
        let api = Action::GetSubnetCidrReservations;
        self.call(api, format!("subnet={subnet_id}"), |st| {
            Ok(if st.subnet.id == subnet_id {
                st.subnet.reservations.iter().map(|r| r.cidr).collect()
            } else {
                Vec::new()
            })
        })
        .await
    }

    /// CreateSubnetCidrReservation of type `prefix`.
    pub(crate) async fn create_prefix_reservation(&self, req: &PrefixReservation) -> ReserveResult {
        let api = Action::CreateSubnetCidrReservation;
        let args = format!(
            "subnet={} cidr={} tags={:?}",
            req.subnet_id, req.cidr, req.tags
        );
        self.call(api, args, |st| {
            if st.subnet.id != req.subnet_id {
                return Err(CloudError::NotFound {
                    api: api.as_str().into(),
                    code: "InvalidSubnetID.NotFound".into(),
                    message: format!("The subnet ID '{}' does not exist", req.subnet_id),
                });
            }
            st.subnet.check_reservation(api.as_str(), req.cidr)?;
            st.subnet.reservations.push(MemReservation {
                cidr: req.cidr,
                description: req.description.clone(),
                tags: req.tags.clone(),
            });
            Ok(req.cidr)
        })
        .await
        .map_err(|e| ReserveError::of(req.cidr, e))
    }

    /// The subnet's reservations, for tests.
    pub fn subnet_reservations(&self) -> Vec<MemReservation> {
        self.lock().subnet.reservations.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NodeSpec;
    use eniipam_cloud::Cloud;

    fn req(cidr: &str) -> PrefixReservation {
        PrefixReservation {
            subnet_id: NodeSpec::default().subnet_id,
            cidr: cidr.parse().unwrap(),
            description: "test".into(),
            tags: BTreeMap::new(),
        }
    }

    #[tokio::test]
    async fn reservations_follow_ec2s_rules() {
        let (cloud, node) = MemoryCloud::with_node(NodeSpec::default());
        // 10.0.1.0/24: the primary ENI took the lowest usable address, 10.0.1.4.
        assert_eq!(
            cloud
                .create_subnet_prefix_reservation(&req("10.0.1.128/26"))
                .await,
            Ok("10.0.1.128/26".parse().unwrap())
        );
        let e = cloud
            .create_subnet_prefix_reservation(&req("10.0.1.160/28"))
            .await;
        assert!(matches!(e, Err(ReserveError::Overlaps { .. })), "{e:?}");
        let e = cloud
            .create_subnet_prefix_reservation(&req("10.0.1.0/28"))
            .await;
        assert!(
            matches!(e, Err(ReserveError::AddressesInUse { .. })),
            "{e:?}"
        );
        for bad in ["10.0.1.65/26", "10.0.2.0/28"] {
            let e = cloud.create_subnet_prefix_reservation(&req(bad)).await;
            assert!(
                matches!(e, Err(ReserveError::Cloud(CloudError::Rejected { .. }))),
                "{e:?}"
            );
        }
        let got = cloud
            .subnet_prefix_reservations(&node.subnet_id)
            .await
            .unwrap();
        assert_eq!(got, vec!["10.0.1.128/26".parse::<Ipv4Net>().unwrap()]);
        // Singles stay out of the reservation; prefixes come from it first.
        let eni = cloud.enis()[0].id.clone();
        let ips = cloud.assign_ips(&eni, 5).await.unwrap();
        assert!(ips.iter().all(|ip| !got[0].contains(ip)), "{ips:?}");
        let prefixes = cloud.assign_prefixes(&eni, 1).await.unwrap();
        assert!(got[0].contains(&prefixes[0]), "{prefixes:?}");
    }
}
