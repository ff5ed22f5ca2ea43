//! What a test reads back from the lab's kernels: the drop counters of the source/destination check,
//! of unassigned destinations and of the IGW, and the routes the vpc namespace holds towards ENIs.

use std::collections::BTreeMap;

use ipnet::{Ipv4Net, Ipv6Net};

use super::Lab;
use crate::error::LabError;
use crate::netns::RouteDst;
use crate::nft;

/// The IGW's drop counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IgwDrops {
    /// Packets towards the internet from an address without a public IP.
    pub egress_not_public: u64,
    /// Packets from the internet to an address without a public IP.
    pub ingress_not_public: u64,
}

impl Lab {
    /// Packets dropped by the source/destination check, per ENI (those attached now).
    pub async fn src_dst_drops(&self) -> Result<BTreeMap<String, u64>, LabError> {
        let counters = self.vpc_counters().await?;
        let a = self.inner.applied.lock().expect("applied lock");
        Ok(a.links
            .iter()
            .filter_map(|(eni, rec)| {
                counters
                    .get(&nft::drop_counter(&rec.vif))
                    .map(|n| (eni.clone(), *n))
            })
            .collect())
    }

    /// Packets the VPC dropped because no ENI holds their destination (either family).
    pub async fn unassigned_drops(&self) -> Result<u64, LabError> {
        self.vpc_counters()
            .await?
            .get(nft::UNASSIGNED_COUNTER)
            .copied()
            .ok_or_else(|| LabError::NotFound("the vpc namespace lost its counters".into()))
    }

    /// Packets the IGW dropped.
    pub async fn igw_drops(&self) -> Result<IgwDrops, LabError> {
        let json = self
            .inner
            .igw
            .nft_json(&["list", "counters", "table", "ip", nft::IGW_TABLE])
            .await?;
        let c = nft::counters(&json)?;
        let get = |name: &str| {
            c.get(name)
                .copied()
                .ok_or_else(|| LabError::NotFound(format!("the IGW has no counter {name}")))
        };
        Ok(IgwDrops {
            egress_not_public: get(nft::IGW_EGRESS_COUNTER)?,
            ingress_not_public: get(nft::IGW_INGRESS_COUNTER)?,
        })
    }

    /// Packets from the internet the egress-only internet gateway dropped: IPv6 that belongs to
    /// no connection started inside the VPC.
    pub async fn eigw_drops(&self) -> Result<u64, LabError> {
        let json = self
            .inner
            .igw
            .nft_json(&["list", "counters", "table", "ip6", nft::EIGW_TABLE])
            .await?;
        nft::counters(&json)?
            .get(nft::EIGW_INGRESS_COUNTER)
            .copied()
            .ok_or_else(|| LabError::NotFound("the egress-only gateway lost its counter".into()))
    }

    async fn vpc_counters(&self) -> Result<BTreeMap<String, u64>, LabError> {
        let json = self
            .inner
            .vpc
            .nft_json(&["list", "counters", "table", "inet", nft::VPC_TABLE])
            .await?;
        nft::counters(&json)
    }

    /// The routes the vpc namespace's kernel holds towards ENIs, read back from the kernel:
    /// destination → ENI id.
    pub async fn vpc_routes(&self) -> Result<BTreeMap<Ipv4Net, String>, LabError> {
        let routes = self.inner.vpc.routes(None).await?;
        let a = self.inner.applied.lock().expect("applied lock");
        let by_vif: BTreeMap<&str, &str> = a
            .links
            .iter()
            .map(|(eni, rec)| (rec.vif.as_str(), eni.as_str()))
            .collect();
        Ok(routes
            .into_iter()
            .filter_map(
                |r| match (r.dst, r.dev.as_deref().and_then(|d| by_vif.get(d))) {
                    (RouteDst::Net(net), Some(eni)) => Some((net, (*eni).to_owned())),
                    _ => None,
                },
            )
            .collect())
    }

    /// The IPv6 routes the vpc namespace's kernel holds towards ENIs (addresses as /128s, /80
    /// prefixes), read back from the kernel: destination → ENI id.
    pub async fn vpc_routes_v6(&self) -> Result<BTreeMap<Ipv6Net, String>, LabError> {
        let routes = self.inner.vpc.routes_v6().await?;
        let a = self.inner.applied.lock().expect("applied lock");
        let by_vif: BTreeMap<&str, &str> = a
            .links
            .iter()
            .map(|(eni, rec)| (rec.vif.as_str(), eni.as_str()))
            .collect();
        Ok(routes
            .into_iter()
            .filter_map(|r| {
                let eni = r.dev.as_deref().and_then(|d| by_vif.get(d))?;
                // Each veth also has its link-local fe80::/64: not a route the VPC made.
                r.dst
                    .filter(|d| !d.network().is_unicast_link_local())
                    .map(|d| (d, (*eni).to_owned()))
            })
            .collect())
    }
}
