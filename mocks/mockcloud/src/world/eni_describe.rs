//! DescribeNetworkInterfaces as EC2 serves it: the ids, or the indexed filters, select what is paged
//! over; every other filter is applied to each page after it is cut.

use tokio::time::Instant;

use super::views::EniView;
use super::{CreateEniArgs, Ec2Result, Filter, World, bad_filter, glob, tag_filter_matches};

/// The `DescribeNetworkInterfaces` filters EC2 narrows by before it pages: the ones its reference
/// names as those a large account may describe by without pagination ("If you have a large number
/// of network interfaces, the operation fails unless you use pagination or one of the following
/// filters: group-id, mac-address, private-dns-name, private-ip-address, subnet-id, or vpc-id"; of
/// them, mockcloud serves these). Every other filter (`attachment.instance-id`, tags, `status`,
/// `network-interface-id`, …) is applied to each page after it is cut, so a describe filtered by
/// them alone walks every ENI of the region, 1,000 a page at most.
pub const SERVER_SIDE_ENI_FILTERS: &[&str] =
    &["vpc-id", "subnet-id", "mac-address", "private-ip-address"];

impl World {
    /// Every ENI `DescribeNetworkInterfaces` matches, in one list (the unpaginated call).
    pub fn describe_network_interfaces(
        &mut self,
        ids: &[String],
        filters: &[Filter],
        now: Instant,
    ) -> Ec2Result<Vec<EniView>> {
        let selected = self.eni_candidates(ids, filters, now)?;
        Ok(self.eni_page(&selected, filters, now))
    }

    /// The ENIs a `DescribeNetworkInterfaces` pages over, in id order: the ids it names (each must
    /// exist), else every ENI listed now, narrowed by the filters EC2 applies before it pages
    /// ([`SERVER_SIDE_ENI_FILTERS`]). The other filters are applied to each page after
    /// ([`Self::eni_page`]), as EC2 does, so a page may come back short or empty with a `NextToken`.
    pub fn eni_candidates(
        &mut self,
        ids: &[String],
        filters: &[Filter],
        now: Instant,
    ) -> Ec2Result<Vec<String>> {
        self.settle(now);
        for id in ids {
            self.eni_listed(id, now)?;
        }
        for f in filters {
            let known = [
                "network-interface-id",
                "attachment.instance-id",
                "attachment.status",
                "attachment.attachment-id",
                "status",
                "subnet-id",
                "vpc-id",
                "description",
                "tag-key",
                "mac-address",
                "private-ip-address",
                "addresses.private-ip-address",
                "ipv6-addresses.ipv6-address",
            ];
            if !known.contains(&f.name.as_str()) && !f.name.starts_with("tag:") {
                return Err(bad_filter(&f.name));
            }
        }
        let indexed: Vec<&Filter> = filters
            .iter()
            .filter(|f| SERVER_SIDE_ENI_FILTERS.contains(&f.name.as_str()))
            .collect();
        Ok(self
            .enis
            .keys()
            .filter(|id| ids.is_empty() || ids.contains(id))
            .filter(|id| self.eni_listed(id, now).is_ok())
            .filter(|id| {
                indexed.is_empty() || {
                    let v = self.eni_view(id);
                    indexed.iter().all(|f| eni_matches(&v, f))
                }
            })
            .cloned()
            .collect())
    }

    /// One page of [`Self::eni_candidates`] as described at `now`, every filter applied.
    pub fn eni_page(&self, page: &[String], filters: &[Filter], now: Instant) -> Vec<EniView> {
        page.iter()
            .map(|id| self.eni_described(id, now))
            .filter(|v| filters.iter().all(|f| eni_matches(v, f)))
            .collect()
    }

    /// An ENI made outside the API (another node's or another tenant's, for tests of what a describe
    /// costs in a region holding many): no new-ENI lag, no client token, not in the counters.
    pub fn create_network_interface_directly(
        &mut self,
        args: &CreateEniArgs,
        now: Instant,
    ) -> Ec2Result<String> {
        self.settle(now);
        self.create_eni_inner(args, now)
    }
}

fn eni_matches(v: &EniView, f: &Filter) -> bool {
    if let Some(m) = tag_filter_matches(f, &v.tags) {
        return m;
    }
    let any = |field: &str| f.values.iter().any(|p| glob(p, field));
    match f.name.as_str() {
        "network-interface-id" => any(&v.id),
        "attachment.instance-id" => v.attachment.as_ref().is_some_and(|a| any(&a.instance_id)),
        "attachment.status" => v.attachment.as_ref().is_some_and(|a| any(a.status)),
        "attachment.attachment-id" => v.attachment.as_ref().is_some_and(|a| any(&a.id)),
        "status" => any(v.status),
        "subnet-id" => any(&v.subnet_id),
        "vpc-id" => any(&v.vpc_id),
        "description" => any(&v.description),
        "mac-address" => any(&v.mac),
        "private-ip-address" | "addresses.private-ip-address" => std::iter::once(&v.primary_ip)
            .chain(&v.secondary_ips)
            .any(|ip| any(&ip.to_string())),
        "ipv6-addresses.ipv6-address" => v.ipv6_addresses.iter().any(|a| any(&a.to_string())),
        _ => false,
    }
}
