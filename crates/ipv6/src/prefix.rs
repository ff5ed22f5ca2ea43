//! Taking the node's /80 at startup: keep the one on record, take it back when it was unassigned
//! out of band, adopt one the primary ENI already has, or ask EC2 for one (`AssignIpv6Addresses`
//! with `Ipv6PrefixCount=1`, the node's one mutating call for IPv6).

use std::time::Duration;

use tokio::time::Instant;

use crate::stored::StoredPrefix6;
use eniipam_cloud::{ADDRESS_IN_USE, Cloud, CloudError, DESCRIBE_SETTLES, Eni, EniFilter};

use super::book::seed_offset;

/// How the startup came by the /80.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Taken {
    /// The state file's, still on the primary ENI.
    Kept,
    /// One the primary ENI already had (a lost state file, or a /80 given by hand or by another
    /// CNI); the cursor starts from the clock ([`seed_offset`]).
    Adopted,
    /// The one on record, gone from the primary ENI (unassigned out of band) and assigned back by
    /// value while it was still free in the subnet: its pods' addresses route again and are kept.
    Reclaimed,
    /// A new one from EC2.
    Assigned,
}

/// Whether EC2's answer to taking a /80 back by value is final: the /80 is in use by another ENI,
/// no longer inside the subnet's block, or the ENI has no room. Throttling and transient failures
/// are not (the caller's patience applies), nor a missing permission (an operator must fix it, and
/// a new /80 would need the same one).
pub fn refused_for_good(e: &CloudError) -> bool {
    matches!(
        e,
        CloudError::Rejected { .. }
            | CloudError::NoIpv6Cidr { .. }
            | CloudError::IpLimitExceeded { .. }
            | CloudError::NoFreePrefix { .. }
            | CloudError::SubnetFull { .. }
    )
}

/// How often, and how long at most, eth0 is described again when the recorded /80 is refused as in
/// use while the describe did not show it on eth0: EC2's describes lag its changes ("seconds to
/// minutes"), and a /80 assigned (back) to eth0 moments before a restart is in use by eth0 itself.
const SETTLE_POLL: Duration = Duration::from_secs(2);

/// Whether a describe of eth0 shows `recorded` on it within [`DESCRIBE_SETTLES`] (described every
/// [`SETTLE_POLL`]). A failed describe ends the wait: the /80 is then taken as another ENI's.
async fn on_eth0_once_settled(cloud: &dyn Cloud, eth0: &Eni, recorded: &StoredPrefix6) -> bool {
    let deadline = Instant::now() + DESCRIBE_SETTLES;
    tracing::info!(prefix = %recorded.prefix, eni = %eth0.id,
        "the /80 on record is in use but EC2's describe does not show it on eth0: describing eth0 again until it settles");
    while Instant::now() < deadline {
        tokio::time::sleep(SETTLE_POLL).await;
        let filter = EniFilter {
            ids: vec![eth0.id.clone()],
            ..EniFilter::default()
        };
        match cloud.describe_enis(&filter).await {
            Ok(enis)
                if enis
                    .iter()
                    .any(|e| e.ipv6_prefixes.contains(&recorded.prefix)) =>
            {
                return true;
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "cannot describe eth0 while its /80 settles");
                return false;
            }
        }
    }
    false
}

/// Why the /80 could not be had.
#[derive(Debug, thiserror::Error)]
pub enum PrefixError {
    /// The primary ENI's subnet has no IPv6 CIDR block: an operator must associate one (or run
    /// with `ip_family = ipv4`).
    #[error(
        "ip_family {family} needs an IPv6 CIDR block on subnet {subnet} (the primary ENI's), and it has \
         none: associate one (aws ec2 associate-subnet-cidr-block --ipv6-cidr-block …) or set \
         ip_family = ipv4"
    )]
    NoSubnetIpv6 { family: String, subnet: String },
    #[error(transparent)]
    Cloud(#[from] CloudError),
    /// EC2 answered the assign with no prefix.
    #[error("AssignIpv6Addresses on {0} returned no /80 prefix")]
    Empty(String),
}

/// The node's /80 on `eth0` (as EC2 describes the primary ENI now): the recorded one when it is still
/// there; else, when eth0 has no /80, the recorded one assigned back by value (its pods keep their
/// addresses; a definitive refusal, [`refused_for_good`], falls through, any other failure is the
/// caller's to retry); else the first the ENI has, else a new one. Returns the prefix to record, how it was come by,
/// and the recorded one that is gone from the ENI, if any (its pods' addresses no longer route).
pub async fn ensure(
    cloud: &dyn Cloud,
    eth0: &Eni,
    recorded: Option<StoredPrefix6>,
    family: &str,
    now_ms: u64,
) -> Result<(StoredPrefix6, Taken, Option<StoredPrefix6>), PrefixError> {
    let (kept, lost) = match recorded {
        Some(r) if r.eni_id == eth0.id.as_str() && eth0.ipv6_prefixes.contains(&r.prefix) => {
            (Some(r), None)
        }
        other => (None, other),
    };
    if let Some(r) = kept {
        return Ok((r, Taken::Kept, None));
    }
    let lost = match lost {
        // Gone from eth0, which has no other /80: while it is still free in the subnet, assigning it
        // back makes every pod's address route again and nothing is lost.
        Some(r) if r.eni_id == eth0.id.as_str() && eth0.ipv6_prefixes.is_empty() => match cloud
            .assign_specific_ipv6_prefixes(&eth0.id, &[r.prefix])
            .await
        {
            Ok(_) => return Ok((r, Taken::Reclaimed, None)),
            Err(CloudError::Rejected { code, .. })
                if code == ADDRESS_IN_USE && on_eth0_once_settled(cloud, eth0, &r).await =>
            {
                // In use by eth0 itself: assigned (back) moments before, and EC2's describe lagged.
                return Ok((r, Taken::Kept, None));
            }
            Err(e) if refused_for_good(&e) => {
                tracing::warn!(prefix = %r.prefix, eni = %eth0.id, error = %e,
                        "EC2 refused to give the node's /80 back; taking another");
                Some(r)
            }
            Err(e) => return Err(e.into()),
        },
        other => other,
    };
    if let Some(p) = eth0.ipv6_prefixes.first() {
        let taken = StoredPrefix6 {
            prefix: *p,
            eni_id: eth0.id.to_string(),
            next_offset: seed_offset(now_ms),
            // The egress addresses are the node's, not the /80's: their cursor carries on.
            egress_next: lost.as_ref().map_or(0, |r| r.egress_next),
            taken_at_ms: now_ms,
        };
        return Ok((taken, Taken::Adopted, lost));
    }
    let subnet = cloud.describe_subnet(&eth0.subnet_id).await?;
    if subnet.ipv6_cidrs.is_empty() {
        return Err(PrefixError::NoSubnetIpv6 {
            family: family.to_owned(),
            subnet: eth0.subnet_id.clone(),
        });
    }
    let got = cloud.assign_ipv6_prefixes(&eth0.id, 1).await?;
    let prefix = *got
        .first()
        .ok_or_else(|| PrefixError::Empty(eth0.id.to_string()))?;
    let taken = StoredPrefix6 {
        prefix,
        eni_id: eth0.id.to_string(),
        next_offset: seed_offset(now_ms),
        egress_next: lost.as_ref().map_or(0, |r| r.egress_next),
        taken_at_ms: now_ms,
    };
    Ok((taken, Taken::Assigned, lost))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use eniipam_memcloud::{Action, MemoryCloud, NodeSpec};
    use ipnet::Ipv6Net;

    use super::*;
    use eniipam_cloud::CreateEni;

    const NOW: u64 = 1_700_000_000_000;

    async fn eth0(cloud: &MemoryCloud, instance: &str) -> Eni {
        cloud
            .describe_instance(instance)
            .await
            .unwrap()
            .enis
            .into_iter()
            .find(|e| e.attachment.as_ref().is_some_and(|a| a.device_index == 0))
            .unwrap()
    }

    fn record(prefix: Ipv6Net, eni: &Eni) -> StoredPrefix6 {
        StoredPrefix6 {
            prefix,
            eni_id: eni.id.to_string(),
            next_offset: 42,
            egress_next: 7,
            taken_at_ms: NOW - 1000,
        }
    }

    /// A node whose recorded /80 was unassigned out of band; returns the cloud, eth0 as described
    /// now (no /80) and the record.
    async fn lost_slash_80() -> (std::sync::Arc<MemoryCloud>, Eni, StoredPrefix6) {
        let (cloud, node) = MemoryCloud::with_node(NodeSpec::default());
        let e = eth0(&cloud, &node.instance_id).await;
        let (first, how, _) = ensure(cloud.as_ref(), &e, None, "ipv6", NOW).await.unwrap();
        assert_eq!(how, Taken::Assigned);
        let p = first.prefix;
        cloud.unassign_ipv6_prefixes(&e.id, &[p]).await.unwrap();
        let e = eth0(&cloud, &node.instance_id).await;
        assert!(e.ipv6_prefixes.is_empty());
        (cloud, e.clone(), record(p, &e))
    }

    #[tokio::test(start_paused = true)]
    async fn a_recorded_slash_80_unassigned_out_of_band_is_taken_back_with_its_cursor() {
        let (cloud, e, rec) = lost_slash_80().await;
        let (taken, how, lost) = ensure(cloud.as_ref(), &e, Some(rec.clone()), "ipv6", NOW)
            .await
            .unwrap();
        assert_eq!((how, lost), (Taken::Reclaimed, None));
        // The record as it was: the cursor and the egress count carry on, no address is reissued.
        assert_eq!(taken, rec);
        assert_eq!(cloud.eni(&e.id).unwrap().ipv6_prefixes, vec![rec.prefix]);
        assert_eq!(cloud.call_count(Action::AssignSpecificIpv6Prefixes), 1);
        assert_eq!(
            cloud.call_count(Action::AssignIpv6Prefixes),
            1,
            "no new /80"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_slash_80_another_eni_took_meanwhile_gives_a_new_one_and_the_pods_are_lost() {
        let (cloud, e, rec) = lost_slash_80().await;
        let other = cloud
            .create_eni(&CreateEni {
                subnet_id: e.subnet_id.clone(),
                security_groups: vec![],
                description: "someone else".into(),
                secondary_ip_count: 0,
                prefix_count: 0,
                private_ips: Vec::new(),
                tags: BTreeMap::new(),
                client_token: "other".into(),
                live_ip_count: None,
            })
            .await
            .unwrap();
        cloud
            .assign_specific_ipv6_prefixes(&other.id, &[rec.prefix])
            .await
            .unwrap();
        let (taken, how, lost) = ensure(cloud.as_ref(), &e, Some(rec.clone()), "ipv6", NOW)
            .await
            .unwrap();
        assert_eq!(how, Taken::Assigned);
        assert_eq!(lost, Some(rec.clone()));
        assert_ne!(taken.prefix, rec.prefix);
        assert_eq!(
            taken.egress_next, rec.egress_next,
            "the egress count goes on"
        );
        assert_eq!(cloud.eni(&e.id).unwrap().ipv6_prefixes, vec![taken.prefix]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_retryable_failure_to_take_it_back_is_the_callers_to_retry() {
        let (cloud, e, rec) = lost_slash_80().await;
        let slow = CloudError::Throttled {
            api: "AssignIpv6Addresses".into(),
            code: "RequestLimitExceeded".into(),
        };
        cloud.fail_next(Action::AssignSpecificIpv6Prefixes, 1, slow.clone());
        let err = ensure(cloud.as_ref(), &e, Some(rec.clone()), "ipv6", NOW)
            .await
            .unwrap_err();
        assert!(
            matches!(err, PrefixError::Cloud(ref c) if *c == slow),
            "{err}"
        );
        assert_eq!(
            cloud.call_count(Action::AssignIpv6Prefixes),
            1,
            "no new /80"
        );
        // The step's next try takes it back.
        let (_, how, _) = ensure(cloud.as_ref(), &e, Some(rec), "ipv6", NOW)
            .await
            .unwrap();
        assert_eq!(how, Taken::Reclaimed);
    }

    #[tokio::test(start_paused = true)]
    async fn eth0_with_another_slash_80_adopts_it_without_asking_for_the_old_one() {
        let (cloud, e, rec) = lost_slash_80().await;
        let now = Ipv6Net::new(
            std::net::Ipv6Addr::from(u128::from(rec.prefix.network()) + (1 << 48)),
            80,
        )
        .unwrap();
        cloud
            .assign_specific_ipv6_prefixes(&e.id, &[now])
            .await
            .unwrap();
        let e = cloud.eni(&e.id).unwrap();
        let (taken, how, lost) = ensure(cloud.as_ref(), &e, Some(rec.clone()), "ipv6", NOW)
            .await
            .unwrap();
        assert_eq!((taken.prefix, how, lost), (now, Taken::Adopted, Some(rec)));
        assert_eq!(
            cloud.call_count(Action::AssignSpecificIpv6Prefixes),
            1,
            "only ours"
        );
    }
}
