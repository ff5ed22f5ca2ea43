//! Startup step "prefix reservation" (`prefix_reservation_percent`, issue 46): each pod subnet of
//! the default network gets one subnet CIDR reservation of type `prefix`, so that single addresses
//! coming and going cannot fragment all of it, and the node's `/28`s (burst prefixes,
//! `prefix_delegation`) keep finding a free block (`InsufficientCidrBlocks` is the VPC CNI's most
//! common prefix failure; a `prefix` reservation is AWS's answer to it).
//!
//! It runs in the background once the pool serves: pods never wait on it. Per subnet: read the
//! subnet's reservations; a `prefix` one already there (anyone's) is enough, nothing is made.
//! Otherwise reserve a block every node of the subnet chooses alike: the highest aligned block of
//! the size ([`reservation_blocks`]), and when EC2 says it holds addresses in use, the next lower
//! one, reading the reservations again before each. A fleet starting together so makes one
//! reservation: the first create wins, the others are refused as overlapping it and see it when
//! they read again. (Choosing by a describe of the subnet's addresses instead would let nodes
//! whose views differ by a moment's churn, or by a describe's lag, choose different blocks and
//! reserve both: `tests/prefix_reservation.rs` saw it.)
//! A throttled create is not retried at once: the node pauses (jittered, as the fleet is a herd)
//! and reads again first, when another node's reservation is likely there. A role without
//! `ec2:CreateSubnetCidrReservation` gets one warning and the step ends; pods are served as
//! before. Reservations are never deleted by eniipam (an operator's call: they are shared).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ipnet::Ipv4Net;
use rand::Rng;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::cloud::backoff::RetryPause;
use crate::cloud::{
    Cloud, CloudError, NodeContext, PrefixReservation, Purpose, ReserveError, tags, with_purpose,
    without_throttle_retries,
};
use crate::config::DaemonConfig;

/// Pause after a round that made no reservation: doubling from the first to the cap.
const RETRY: (Duration, Duration) = (Duration::from_secs(5), Duration::from_secs(300));

/// Creates tried in one round before the pause (each costs a token of the account's small
/// CreateSubnetCidrReservation bucket); the next round goes on from the next block.
const CREATES_PER_ROUND: usize = 4;

/// The blocks of `subnet` a reservation of `percent` of it may take, in the order every node tries
/// them: `percent` of the subnet's addresses rounded down to a power of two, at least one `/28`, at
/// most a quarter of the subnet; highest first; never the first or the last block of the subnet,
/// which hold the addresses AWS reserves (network, router, DNS, future use; broadcast). Empty
/// when `percent` is 0 or the subnet is smaller than a `/26` (no such block fits).
pub fn reservation_blocks(subnet: Ipv4Net, percent: u8) -> Vec<Ipv4Net> {
    let subnet = subnet.trunc();
    let total: u64 = 1 << (32 - u32::from(subnet.prefix_len()));
    if percent == 0 || total < 64 {
        return Vec::new();
    }
    let wanted = (total * u64::from(percent) / 100).clamp(16, total / 4);
    // The largest power of two within `wanted`.
    let size = 1u64 << (63 - wanted.leading_zeros());
    let len = u8::try_from(32 - size.trailing_zeros()).expect("a prefix length");
    let count = total / size;
    let base = u64::from(u32::from(subnet.network()));
    (1..count - 1)
        .rev()
        .map(|i| {
            let start = u32::try_from(base + i * size).expect("inside the subnet");
            Ipv4Net::new(start.into(), len).expect("a valid length")
        })
        .collect()
}

/// What the step does on this node, or `None` (off, or the node takes no prefixes: logged).
struct Plan {
    percent: u8,
    /// The default network's pod subnets: id and CIDR when known (the node's own subnet alone is
    /// described in the step).
    subnets: Vec<(String, Option<Ipv4Net>)>,
    description: String,
    tags: BTreeMap<String, String>,
}

impl Plan {
    fn of(config: &DaemonConfig, node: &NodeContext) -> Option<Self> {
        let percent = config.prefix_reservation_percent;
        if percent == 0 {
            return None;
        }
        let prefixes = config.prefix_delegation || config.burst_prefixes;
        let why_not = if !config.ip_family.has_ipv4() {
            Some("pods take no IPv4 (ip_family)")
        } else if !prefixes {
            Some("prefix_delegation and burst_prefixes are off")
        } else if !node.limits.nitro {
            Some("the instance type is not Nitro")
        } else if config.custom_networking {
            Some("custom networking: the pod subnets are the ENIConfigs'")
        } else {
            None
        };
        if let Some(why) = why_not {
            tracing::info!(
                percent,
                why,
                "prefix reservation: not made, this node takes no /28 prefixes in its default network"
            );
            return None;
        }
        let subnets = if node.pod_subnets.is_empty() {
            vec![(node.subnet_id.clone(), None)]
        } else {
            let pods = node.pod_subnets.iter();
            pods.map(|s| (s.id.clone(), Some(s.cidr))).collect()
        };
        let mut tags = BTreeMap::from([(tags::OWNER.to_owned(), tags::OWNER_VALUE.to_owned())]);
        if !node.cluster_name.is_empty() {
            tags.insert(tags::CLUSTER.to_owned(), node.cluster_name.clone());
        }
        let description = format!(
            "eniipam: kept for /28 prefixes (prefix_reservation_percent = {percent}); made by \
             node {} of cluster {:?}; eniipam never deletes it",
            node.instance_id, node.cluster_name
        );
        Some(Self {
            percent,
            subnets,
            description,
            tags,
        })
    }
}

/// Starts the step in the background when it has something to do (see the module docs).
pub(super) fn spawn(
    config: &DaemonConfig,
    cloud: Arc<dyn Cloud>,
    node: &NodeContext,
    cancel: CancellationToken,
) -> Option<JoinHandle<()>> {
    let plan = Plan::of(config, node)?;
    Some(tokio::spawn(async move {
        tokio::select! {
            _ = cancel.cancelled() => {}
            _ = with_purpose(Purpose::Startup, run(plan, cloud.as_ref())) => {}
        }
    }))
}

/// Why a round ended without a reservation in place.
enum Stop {
    /// The role lacks a permission: the step ends (one warning).
    Unauthorized(CloudError),
    /// Try again after a pause; `throttled`: the pause is jittered.
    Later { why: String, throttled: bool },
}

impl From<CloudError> for Stop {
    fn from(e: CloudError) -> Self {
        match e {
            CloudError::Unauthorized { .. } => Stop::Unauthorized(e),
            e => Stop::Later {
                throttled: e.is_throttle(),
                why: e.to_string(),
            },
        }
    }
}

async fn run(plan: Plan, cloud: &dyn Cloud) {
    for (subnet_id, cidr) in &plan.subnets {
        let mut retry = RetryPause::new(RETRY.0, RETRY.1);
        let mut next = 0;
        loop {
            match round(&plan, cloud, subnet_id, *cidr, &mut next).await {
                Ok(()) => break,
                Err(Stop::Unauthorized(e)) => {
                    let CloudError::Unauthorized { permission, .. } = &e else {
                        unreachable!("Stop::Unauthorized holds an Unauthorized error")
                    };
                    tracing::warn!(
                        subnet = %subnet_id, %permission, error = %e,
                        "prefix reservation: the IAM role lacks {permission}; no prefix \
                         reservation made (pods are served as before; grant \
                         ec2:CreateSubnetCidrReservation as deploy/iam-policy.json does, or set \
                         prefix_reservation_percent = 0)"
                    );
                    return;
                }
                Err(Stop::Later { why, throttled }) => {
                    let mut pause = retry.failed();
                    if throttled {
                        // Every node of a fleet starting together is here at once: spread them.
                        pause = pause.mul_f64(rand::rng().random_range(0.5..=1.0));
                    }
                    tracing::info!(subnet = %subnet_id, why, ?pause, "prefix reservation: none in place yet; trying again");
                    tokio::time::sleep(pause).await;
                }
            }
        }
    }
}

/// One round for one subnet: done when the subnet has a `prefix` reservation (found or made).
/// `next` indexes the next block to try, kept across rounds: a refused block is not tried again
/// before the others.
async fn round(
    plan: &Plan,
    cloud: &dyn Cloud,
    subnet_id: &str,
    cidr: Option<Ipv4Net>,
    next: &mut usize,
) -> Result<(), Stop> {
    if let Some(found) = existing(cloud, subnet_id).await? {
        tracing::info!(subnet = %subnet_id, reservations = ?found, "prefix reservation: the subnet has one already");
        return Ok(());
    }
    let cidr = match cidr {
        Some(c) => c,
        None => cloud.describe_subnet(subnet_id).await?.cidr,
    };
    let blocks = reservation_blocks(cidr, plan.percent);
    if blocks.is_empty() {
        tracing::warn!(subnet = %subnet_id, %cidr, "prefix reservation: the subnet is smaller than a /26, too small to keep a block for prefixes; none made");
        return Ok(());
    }
    // Every node walks the same blocks in the same order, from where its last round stopped; each
    // try after a refusal reads the reservations first, so a node stops at another's reservation.
    for tried in 0..CREATES_PER_ROUND.min(blocks.len()) {
        if tried > 0
            && let Some(found) = existing(cloud, subnet_id).await?
        {
            tracing::info!(subnet = %subnet_id, reservations = ?found, "prefix reservation: another node made it");
            return Ok(());
        }
        let block = blocks[*next % blocks.len()];
        let req = PrefixReservation {
            subnet_id: subnet_id.to_owned(),
            cidr: block,
            description: plan.description.clone(),
            tags: plan.tags.clone(),
        };
        // A throttle is the answer: the pause and a fresh read come before the next try.
        match without_throttle_retries(cloud.create_subnet_prefix_reservation(&req)).await {
            Ok(made) => {
                tracing::info!(subnet = %subnet_id, block = %made, "prefix reservation: reserved for /28 prefixes");
                return Ok(());
            }
            Err(ReserveError::Overlaps { message, .. }) => {
                // Most likely another node's reservation of this very block.
                if let Some(found) = existing(cloud, subnet_id).await? {
                    tracing::info!(subnet = %subnet_id, reservations = ?found, "prefix reservation: another node made it");
                    return Ok(());
                }
                tracing::info!(subnet = %subnet_id, %block, message, "prefix reservation: the block overlaps another reservation; trying the next one");
                *next += 1;
            }
            Err(ReserveError::AddressesInUse { message, .. }) => {
                tracing::debug!(subnet = %subnet_id, %block, message, "prefix reservation: the block holds addresses in use; trying the next one");
                *next += 1;
            }
            Err(ReserveError::Cloud(e @ CloudError::Rejected { .. })) => {
                tracing::warn!(subnet = %subnet_id, %block, error = %e, "prefix reservation: EC2 refused the block; trying the next one");
                *next += 1;
            }
            Err(ReserveError::Cloud(e)) => return Err(e.into()),
        }
    }
    Err(Stop::Later {
        why: format!(
            "the blocks of {} addresses tried hold addresses in use ({} candidates): lower \
             prefix_reservation_percent if it stays so",
            1u64 << (32 - blocks[0].prefix_len()),
            blocks.len()
        ),
        throttled: false,
    })
}

/// The subnet's `prefix` reservations, `None` when it has none.
async fn existing(cloud: &dyn Cloud, subnet_id: &str) -> Result<Option<Vec<Ipv4Net>>, Stop> {
    let found = cloud.subnet_prefix_reservations(subnet_id).await?;
    Ok((!found.is_empty()).then_some(found))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blocks(subnet: &str, percent: u8) -> Vec<String> {
        reservation_blocks(subnet.parse().unwrap(), percent)
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn the_block_is_a_power_of_two_share_of_the_subnet_highest_first() {
        // 10 % of a /24 (25.6 addresses) is a /28 (16): blocks 14 down to 1 of 16.
        let b = blocks("10.0.1.0/24", 10);
        assert_eq!(b.len(), 14);
        assert_eq!(
            b[0], "10.0.1.224/28",
            "the last block holds the broadcast address"
        );
        assert_eq!(b[1], "10.0.1.208/28");
        assert_eq!(
            b[13], "10.0.1.16/28",
            "the first block holds AWS's reserved addresses"
        );
        // 20 % of a /19 (1638) rounds down to 1024, a /22: the 8 blocks but the first and last.
        assert_eq!(
            blocks("10.0.32.0/19", 20),
            [
                "10.0.56.0/22",
                "10.0.52.0/22",
                "10.0.48.0/22",
                "10.0.44.0/22",
                "10.0.40.0/22",
                "10.0.36.0/22"
            ]
        );
        // 25 % of a /24 is a quarter: the two middle quarters.
        assert_eq!(blocks("10.0.1.0/24", 25), ["10.0.1.128/26", "10.0.1.64/26"]);
        // 1 % of a /24 still reserves one /28; 1 % of a /16 (655) is a /23 (512).
        assert_eq!(blocks("10.0.1.0/24", 1)[0], "10.0.1.224/28");
        assert_eq!(blocks("10.1.0.0/16", 1)[0], "10.1.252.0/23");
    }

    #[test]
    fn small_subnets_and_zero_reserve_nothing() {
        assert!(blocks("10.0.1.0/24", 0).is_empty());
        assert!(
            blocks("10.0.1.0/27", 25).is_empty(),
            "a /27's two /28s hold AWS's addresses"
        );
        assert_eq!(blocks("10.0.1.0/26", 25), ["10.0.1.32/28", "10.0.1.16/28"]);
    }

    #[test]
    fn every_node_computes_the_same_blocks_from_any_address_of_the_subnet() {
        assert_eq!(blocks("10.0.1.77/24", 10), blocks("10.0.1.0/24", 10));
    }

    use eniipam_memcloud::{Action, MemoryCloud, NodeSpec};

    use crate::cloud::InstanceLimits;

    /// A Nitro node of memcloud's 10.0.1.0/24, and 10 % of it (one /28) to reserve.
    fn nitro() -> (Arc<MemoryCloud>, Plan) {
        let (cloud, node) = MemoryCloud::with_node(NodeSpec {
            limits: InstanceLimits {
                nitro: true,
                ..InstanceLimits::new(3, 10)
            },
            ..NodeSpec::default()
        });
        let config = DaemonConfig {
            prefix_reservation_percent: 10,
            ..DaemonConfig::default()
        };
        (
            cloud,
            Plan::of(&config, &node).expect("a Nitro node with burst prefixes"),
        )
    }

    fn reservation_calls(cloud: &MemoryCloud) -> Vec<Action> {
        let ours = [
            Action::GetSubnetCidrReservations,
            Action::CreateSubnetCidrReservation,
        ];
        let calls = cloud.calls().into_iter().map(|c| c.action);
        calls.filter(|a| ours.contains(a)).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_throttle_pauses_and_reads_again_and_a_block_in_use_sends_to_the_next() {
        let (cloud, plan) = nitro();
        // Another node's address in the highest block.
        cloud.another_node_takes(&["10.0.1.230".parse().unwrap()]);
        let throttled = CloudError::Throttled {
            api: "CreateSubnetCidrReservation".into(),
            code: "RequestLimitExceeded".into(),
        };
        cloud.fail_next(Action::CreateSubnetCidrReservation, 1, throttled);
        let started = tokio::time::Instant::now();
        run(plan, cloud.as_ref()).await;
        let paused = started.elapsed();
        assert!(
            (RETRY.0 / 2..=RETRY.0).contains(&paused),
            "one jittered pause after the throttle: {paused:?}"
        );
        use Action::{CreateSubnetCidrReservation as Create, GetSubnetCidrReservations as Get};
        assert_eq!(
            reservation_calls(&cloud),
            [Get, Create, Get, Create, Get, Create],
            "throttled; after the pause a read, the highest block (in use), a read, the next"
        );
        let made = cloud.subnet_reservations();
        assert_eq!(made.len(), 1);
        assert_eq!(made[0].cidr.to_string(), "10.0.1.208/28");
        assert_eq!(made[0].tags[tags::CLUSTER], "test-cluster");
        assert_eq!(made[0].tags[tags::OWNER], tags::OWNER_VALUE);
    }

    #[tokio::test(start_paused = true)]
    async fn a_role_without_the_permission_stops_the_step_at_once() {
        let (cloud, plan) = nitro();
        let denied = CloudError::Unauthorized {
            api: "CreateSubnetCidrReservation".into(),
            permission: "ec2:CreateSubnetCidrReservation".into(),
            message: String::new(),
        };
        cloud.fail_next(Action::CreateSubnetCidrReservation, 1, denied);
        let started = tokio::time::Instant::now();
        run(plan, cloud.as_ref()).await;
        assert_eq!(started.elapsed(), Duration::ZERO, "no pause, no retry");
        assert_eq!(cloud.call_count(Action::CreateSubnetCidrReservation), 1);
        assert!(cloud.subnet_reservations().is_empty());
    }

    #[test]
    fn only_a_node_that_takes_prefixes_plans_the_step() {
        let (_, node) = MemoryCloud::with_node(NodeSpec::default());
        let on = DaemonConfig {
            prefix_reservation_percent: 10,
            ..DaemonConfig::default()
        };
        assert!(Plan::of(&on, &node).is_none(), "not Nitro");
        let (_, plan) = nitro();
        assert_eq!(plan.subnets, [(NodeSpec::default().subnet_id, None)]);
        let mut nitro_node = node.clone();
        nitro_node.limits.nitro = true;
        let singles = DaemonConfig {
            burst_prefixes: false,
            ..on.clone()
        };
        assert!(
            Plan::of(&singles, &nitro_node).is_none(),
            "no prefixes taken"
        );
        let off = DaemonConfig::default();
        assert!(Plan::of(&off, &nitro_node).is_none(), "off by default");
    }
}
