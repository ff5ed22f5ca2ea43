//! The node's IPv6 `/80`s: AssignIpv6Addresses with Ipv6PrefixCount and UnassignIpv6Addresses with
//! Ipv6Prefix.N, each on its own bucket (the limiter makes one per API name). They run the same
//! loops as the IPv4 prefixes (`mutate`): EC2 takes no ClientToken here either, so after an
//! ambiguous failure the assign looks (IMDS first, then a describe) at what appeared on the ENI
//! since its baseline, and a retry never leaves an unknown `/80` behind. The by-value assign (the
//! node's /80 taken back) looks instead whether the prefixes it named are on the ENI.

use ipnet::Ipv6Net;

use super::Ec2Cloud;
use super::classify;
use super::convert::{parse_ipv6_prefix, to_i32};
use crate::CloudResult;
use eniipam_api::model::EniId;

impl Ec2Cloud {
    pub(super) async fn assign_ipv6_prefix_count(
        &self,
        eni: &EniId,
        count: u32,
    ) -> CloudResult<Vec<Ipv6Net>> {
        const API: &str = "AssignIpv6Addresses";
        if count == 0 {
            return Ok(Vec::new());
        }
        let found = |new: &[Ipv6Net]| {
            tracing::info!(%eni, prefixes = ?new, "IPv6 prefix assign had succeeded despite the error; not assigning again");
        };
        let send = || async {
            let out = self
                .client
                .assign_ipv6_addresses()
                .network_interface_id(eni.as_str())
                .ipv6_prefix_count(to_i32(count))
                .send()
                .await
                .map_err(|e| classify(API, e))?;
            out.assigned_ipv6_prefixes()
                .iter()
                .map(|p| parse_ipv6_prefix(API, p))
                .collect::<CloudResult<Vec<Ipv6Net>>>()
        };
        self.assign_counted(API, eni, count, send, found).await
    }

    /// By value (`Ipv6Prefix.N`), as `assign_specific_ips` is for IPv4: after an ambiguous failure
    /// the ENI is described, and all of `prefixes` on it is the answer (the lost attempt landed), so
    /// a retry is never refused as "in use" by our own prefix.
    pub(super) async fn assign_ipv6_prefix_list(
        &self,
        eni: &EniId,
        prefixes: &[Ipv6Net],
    ) -> CloudResult<Vec<Ipv6Net>> {
        const API: &str = "AssignIpv6Addresses";
        if prefixes.is_empty() {
            return Ok(Vec::new());
        }
        let wanted: Vec<String> = prefixes.iter().map(Ipv6Net::to_string).collect();
        let send = || async {
            self.client
                .assign_ipv6_addresses()
                .network_interface_id(eni.as_str())
                .set_ipv6_prefixes(Some(wanted.clone()))
                .send()
                .await
                .map(|_| prefixes.to_vec())
                .map_err(|e| classify(API, e))
        };
        self.assign_named(API, eni, prefixes, send).await
    }

    pub(super) async fn unassign_ipv6_prefix_list(
        &self,
        eni: &EniId,
        prefixes: &[Ipv6Net],
    ) -> CloudResult<()> {
        const API: &str = "UnassignIpv6Addresses";
        if prefixes.is_empty() {
            return Ok(());
        }
        let gone: Vec<String> = prefixes.iter().map(Ipv6Net::to_string).collect();
        let send = || async {
            self.client
                .unassign_ipv6_addresses()
                .network_interface_id(eni.as_str())
                .set_ipv6_prefixes(Some(gone.clone()))
                .send()
                .await
                .map(|_| ())
                .map_err(|e| classify(API, e))
        };
        self.unassign_verified(API, eni, prefixes, send).await
    }
}
