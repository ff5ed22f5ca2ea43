//! IP supply on the in-memory cloud (paused clock): eth0's secondary IPs serving pods, and prefix
//! delegation — whole `/28`s per call, given back only whole, and single addresses packed into
//! fragmented blocks when the subnet has no `/28` left, until prefixes can be had again.

mod pool_support;

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::time::Duration;

use crate::pool_support::memory_cloud::{Action, NodeSpec};
use eniipam::pool::{PREFIX_ADDRESSES, PoolConfig};
use ipnet::Ipv4Net;
use pool_support::{acquire_many, eth0_config, key, prefix_config, quiet_config, start};
use tokio::time::advance;

/// EC2 calls that change something (what the VPC CNI's warm-pool churn costs are counted in).
const MUTATING: [Action; 9] = [
    Action::CreateNetworkInterface,
    Action::AttachNetworkInterface,
    Action::ModifyNetworkInterfaceAttribute,
    Action::DetachNetworkInterface,
    Action::DeleteNetworkInterface,
    Action::AssignPrivateIpAddresses,
    Action::AssignSpecificPrivateIpAddresses,
    Action::UnassignPrivateIpAddresses,
    Action::AssignIpv4Prefixes,
];

fn mutating_calls(n: &pool_support::Node) -> usize {
    MUTATING
        .iter()
        .map(|a| n.cloud.call_count(*a))
        .sum::<usize>()
        + n.cloud.call_count(Action::UnassignIpv4Prefixes)
}

fn ips(results: &[Result<eniipam::pool::Allocation, eniipam::pool::PoolError>]) -> Vec<Ipv4Addr> {
    results
        .iter()
        .map(|r| r.as_ref().expect("acquired").ip)
        .collect()
}

#[tokio::test(start_paused = true)]
async fn eth0_serves_pods_by_default_and_counts_in_capacity() {
    let n = start(eth0_config(), NodeSpec::default()).await;
    // m5.large-like, 3 ENIs × 10 IPv4: eth0 included, each ENI's primary excluded: 27, the VPC
    // CNI's max-pods (29) − 2 host-network pods.
    assert_eq!(n.pool.snapshot().capacity, 3 * 9);
    assert!(
        PoolConfig::default().use_primary_eni,
        "eth0 serves by default"
    );
    let got = ips(&acquire_many(&n.pool, 0..5).await);
    assert_eq!(got.iter().collect::<BTreeSet<_>>().len(), 5);
    let assigns = n.cloud.calls_of(Action::AssignPrivateIpAddresses);
    assert_eq!(assigns.len(), 1, "{assigns:?}");
    let eth0 = n.cloud.attached_enis()[0].clone();
    assert!(
        assigns[0].args.contains(&eth0.id.to_string()),
        "{assigns:?}"
    );
    assert_eq!(n.cloud.call_count(Action::CreateNetworkInterface), 0);
    let a = n
        .pool
        .acquire(key(0), pool_support::pod(0), None, None)
        .await
        .unwrap();
    assert_eq!(a.device_index, 0, "served from eth0");
    assert_eq!(a.eni, eth0.id);
    n.pool.check_invariants().unwrap();
}

#[tokio::test(start_paused = true)]
async fn eth0_fills_first_then_a_secondary_eni_and_the_node_reaches_capacity() {
    let n = start(eth0_config(), NodeSpec::default()).await;
    let results = acquire_many(&n.pool, 0..30).await;
    let ok: Vec<_> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    assert_eq!(ok.len(), 27, "capacity 27");
    assert_eq!(
        ok.iter().map(|a| a.ip).collect::<BTreeSet<_>>().len(),
        27,
        "distinct"
    );
    assert_eq!(ok.iter().filter(|a| a.device_index == 0).count(), 9);
    assert_eq!(n.cloud.attached_enis().len(), 3);
    n.pool.check_invariants().unwrap();
}

#[tokio::test(start_paused = true)]
async fn eth0_gives_back_idle_ips_but_is_never_detached() {
    let config = PoolConfig {
        max_idle: 0,
        ..eth0_config()
    };
    let n = start(config, NodeSpec::default()).await;
    acquire_many(&n.pool, 0..4).await;
    for i in 0..4 {
        n.pool.release(&key(i), false).unwrap();
    }
    advance(Duration::from_secs(31)).await;
    n.pool.maintain_now().await.unwrap();
    n.pool.maintain_now().await.unwrap();
    assert_eq!(n.cloud.call_count(Action::UnassignPrivateIpAddresses), 1);
    assert_eq!(n.cloud.call_count(Action::DetachNetworkInterface), 0);
    let eth0 = &n.cloud.attached_enis()[0];
    assert!(eth0.secondary_ips.is_empty());
    let snap = n.pool.snapshot();
    assert_eq!(snap.tokens_used, 0);
    assert!(
        snap.enis
            .iter()
            .any(|e| e.device_index == 0 && e.serves_pods)
    );
    n.pool.check_invariants().unwrap();
}

#[tokio::test(start_paused = true)]
async fn without_use_primary_eni_eth0_holds_no_pod() {
    let n = start(quiet_config(), NodeSpec::default()).await;
    assert_eq!(n.pool.snapshot().capacity, 2 * 9);
    let results = acquire_many(&n.pool, 0..3).await;
    assert!(results.iter().all(|r| r.as_ref().unwrap().device_index > 0));
}

#[tokio::test(start_paused = true)]
async fn prefix_delegation_capacity_is_every_slot_as_a_prefix() {
    let n = start(prefix_config(), NodeSpec::default()).await;
    // 3 ENIs × 9 slots × 16 addresses; the kubelet's max-pods (110) caps the pods, not the pool.
    assert_eq!(n.pool.snapshot().capacity, 432);
}

#[tokio::test(start_paused = true)]
async fn a_cold_burst_of_100_pods_costs_one_prefix_call() {
    let n = start(prefix_config(), NodeSpec::default()).await;
    let got = ips(&acquire_many(&n.pool, 0..100).await);
    assert_eq!(got.iter().collect::<BTreeSet<_>>().len(), 100, "distinct");
    let prefix_calls = n.cloud.calls_of(Action::AssignIpv4Prefixes);
    assert_eq!(prefix_calls.len(), 1, "{prefix_calls:?}");
    assert!(
        prefix_calls[0].args.contains("prefix_count=7"),
        "{prefix_calls:?}"
    );
    assert!(mutating_calls(&n) <= 3, "{:?}", n.cloud.calls());
    // Every pod address is inside a prefix delegated to eth0.
    let eth0 = n.cloud.attached_enis()[0].clone();
    assert_eq!(eth0.ipv4_prefixes.len(), 7);
    for ip in &got {
        assert!(eth0.ipv4_prefixes.iter().any(|p| p.contains(ip)), "{ip}");
    }
    let snap = n.pool.snapshot();
    assert_eq!(snap.assigned, 100);
    assert_eq!(snap.idle, 12, "the rest of the seventh prefix is warm");
    assert_eq!(snap.tokens_used, 112, "seven prefixes");
    n.pool.check_invariants().unwrap();
}

#[tokio::test(start_paused = true)]
async fn prefixes_go_back_only_whole() {
    let config = PoolConfig {
        max_idle: 0,
        ..prefix_config()
    };
    let n = start(config, NodeSpec::default()).await;
    let got = ips(&acquire_many(&n.pool, 0..20).await);
    let eth0 = n.cloud.attached_enis()[0].clone();
    assert_eq!(eth0.ipv4_prefixes.len(), 2);
    // Release every pod of one prefix but one: nothing can go back.
    let first: Ipv4Net = eth0.ipv4_prefixes[0];
    let in_first: Vec<usize> = (0..20).filter(|i| first.contains(&got[*i])).collect();
    let (keep, drop) = in_first.split_first().expect("pods in the first prefix");
    for i in drop {
        n.pool.release(&key(*i), false).unwrap();
    }
    advance(Duration::from_secs(31)).await;
    n.pool.maintain_now().await.unwrap();
    assert_eq!(n.cloud.call_count(Action::UnassignIpv4Prefixes), 0);
    assert_eq!(
        n.cloud.call_count(Action::UnassignPrivateIpAddresses),
        0,
        "{:?}",
        n.cloud.calls()
    );
    // The last one goes: the whole /28 is idle past its cooldown and goes back in one call.
    n.pool.release(&key(*keep), false).unwrap();
    advance(Duration::from_secs(31)).await;
    n.pool.maintain_now().await.unwrap();
    let unassigns = n.cloud.calls_of(Action::UnassignIpv4Prefixes);
    assert_eq!(unassigns.len(), 1, "{unassigns:?}");
    assert!(unassigns[0].args.contains(&first.to_string()));
    assert_eq!(n.cloud.call_count(Action::UnassignPrivateIpAddresses), 0);
    let eth0 = n.cloud.attached_enis()[0].clone();
    assert_eq!(eth0.ipv4_prefixes.len(), 1);
    let snap = n.pool.snapshot();
    assert_eq!(snap.tokens_used, PREFIX_ADDRESSES);
    assert_eq!(snap.assigned + snap.idle, PREFIX_ADDRESSES);
    n.pool.check_invariants().unwrap();
}

/// One address of every `/28` of the subnet on another node's ENI: the kind of spread EC2's own
/// picks leave behind.
fn fragment_every_block(n: &pool_support::Node) -> eniipam::model::EniId {
    let subnet = NodeSpec::default().subnet_cidr;
    let taken: Vec<Ipv4Addr> = subnet
        .subnets(28)
        .unwrap()
        .map(|b| Ipv4Addr::from(u32::from(b.network()) + 9))
        .collect();
    n.cloud.another_node_takes(&taken)
}

#[tokio::test(start_paused = true)]
async fn a_fragmented_subnet_serves_packed_single_addresses_then_prefixes_again() {
    let n = start(prefix_config(), NodeSpec::default()).await;
    let other = fragment_every_block(&n);
    let got = ips(&acquire_many(&n.pool, 0..5).await);
    assert_eq!(got.iter().collect::<BTreeSet<_>>().len(), 5, "pods served");
    assert_eq!(n.cloud.calls_of(Action::AssignIpv4Prefixes).len(), 1);
    let specific = n.cloud.calls_of(Action::AssignSpecificPrivateIpAddresses);
    assert_eq!(specific.len(), 1, "one packed assign: {specific:?}");
    // Packed: densest block first — the first /28 holds the 4 reserved addresses, eth0's primary
    // and the foreign one.
    let first_block: Ipv4Net = "10.0.1.0/28".parse().unwrap();
    assert!(got.iter().all(|ip| first_block.contains(ip)), "{got:?}");
    let snap = n.pool.snapshot();
    assert!(
        snap.subnets
            .iter()
            .any(|s| s.prefixes_blocked_for.is_some()),
        "{:?}",
        snap.subnets
    );
    // While blocked, more pods get packed addresses without asking for a prefix again.
    let more = ips(&acquire_many(&n.pool, 10..14).await);
    assert_eq!(n.cloud.calls_of(Action::AssignIpv4Prefixes).len(), 1);
    assert!(more.iter().all(|ip| first_block.contains(ip)), "{more:?}");

    // The other node goes away; after the back-off, prefixes come again.
    n.cloud.another_node_leaves(&other);
    advance(PoolConfig::default().prefix_retry + Duration::from_secs(1)).await;
    let later = ips(&acquire_many(&n.pool, 20..40).await);
    assert_eq!(later.iter().collect::<BTreeSet<_>>().len(), 20);
    // eth0's nine slots went to single addresses; the next ENI comes with prefixes.
    let prefixes: Vec<Ipv4Net> = n
        .cloud
        .attached_enis()
        .iter()
        .flat_map(|e| e.ipv4_prefixes.clone())
        .collect();
    assert!(
        !prefixes.is_empty(),
        "prefixes again: {:?}",
        n.cloud.calls()
    );
    for ip in &later {
        assert!(prefixes.iter().any(|p| p.contains(ip)), "{ip} in a prefix");
    }
    n.pool.check_invariants().unwrap();
}

/// While the subnet has no free `/28`, new IPs come as single packed addresses, one per slot: an ENI's
/// room is its free slots, not a prefix's worth per slot. A burst larger than eth0's remaining slots
/// is split between eth0 and a new ENI instead of asking eth0 for more addresses than an interface
/// may hold (which EC2 refuses, failing every pod of the batch). Found by the fleet branch's warm-ups.
#[tokio::test(start_paused = true)]
async fn a_fragmented_subnet_counts_an_enis_room_in_single_addresses() {
    let n = start(prefix_config(), NodeSpec::default()).await;
    fragment_every_block(&n);
    let first = acquire_many(&n.pool, 0..5).await;
    assert!(first.iter().all(|r| r.is_ok()), "{first:?}");
    let burst = acquire_many(&n.pool, 10..30).await;
    let failed: Vec<_> = burst.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(failed.is_empty(), "pods failed: {failed:?}");
    let got = ips(&burst);
    assert_eq!(got.iter().collect::<BTreeSet<_>>().len(), 20);
    let limit = n.node.limits.ipv4_per_eni;
    for e in n.cloud.attached_enis() {
        assert!(
            (e.secondary_ips.len() as u32) < limit, // plus the primary address
            "{} holds {} addresses, more than {limit}",
            e.id,
            1 + e.secondary_ips.len()
        );
    }
    n.pool.check_invariants().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_new_eni_in_a_fragmented_subnet_comes_with_packed_addresses() {
    // eth0 left out, so the first pods need a new ENI.
    let config = PoolConfig {
        use_primary_eni: false,
        ..prefix_config()
    };
    let n = start(config, NodeSpec::default()).await;
    fragment_every_block(&n);
    let got = ips(&acquire_many(&n.pool, 0..3).await);
    assert_eq!(got.len(), 3);
    let creates = n.cloud.calls_of(Action::CreateNetworkInterface);
    assert!(!creates.is_empty());
    let eni = n
        .cloud
        .attached_enis()
        .into_iter()
        .find(|e| e.attachment.as_ref().is_some_and(|a| a.device_index > 0))
        .expect("a new ENI");
    assert!(eni.ipv4_prefixes.is_empty());
    for ip in &got {
        assert!(eni.secondary_ips.contains(ip), "{ip}");
    }
    n.pool.check_invariants().unwrap();
}

#[tokio::test(start_paused = true)]
async fn packed_addresses_taken_meanwhile_leave_the_batch_to_ec2() {
    let n = start(prefix_config(), NodeSpec::default()).await;
    fragment_every_block(&n);
    // Addresses another node took that no describe shows yet: every packing pick collides.
    let hidden: Vec<Ipv4Addr> = NodeSpec::default()
        .subnet_cidr
        .hosts()
        .filter(|ip| {
            u32::from(*ip) & 0xf != 9 && u32::from(*ip) % 256 < 32 && u32::from(*ip) % 256 > 4
        })
        .collect();
    n.cloud.take_specific_hidden(&hidden);
    let got = ips(&acquire_many(&n.pool, 0..3).await);
    assert_eq!(got.iter().collect::<BTreeSet<_>>().len(), 3, "pods served");
    assert_eq!(
        n.cloud
            .calls_of(Action::AssignSpecificPrivateIpAddresses)
            .len(),
        3,
        "packed three times, each without the addresses tried before"
    );
    assert_eq!(
        n.cloud.call_count(Action::AssignPrivateIpAddresses),
        1,
        "then EC2 picks"
    );
    n.pool.check_invariants().unwrap();
}

/// A burst that finds the last free slots already taken by warm-ups in flight waits for those IPs
/// instead of failing while the node still has room for it.
#[tokio::test(start_paused = true)]
async fn acquires_beyond_free_tokens_take_the_warm_ips_in_flight() {
    let config = PoolConfig {
        min_idle: 2,
        max_idle: 4,
        ..eth0_config()
    };
    // eth0 alone: 5 pod slots.
    let spec = NodeSpec {
        limits: eniipam::cloud::InstanceLimits::new(1, 6),
        ..NodeSpec::default()
    };
    let n = start(config, spec).await;
    assert_eq!(n.pool.snapshot().capacity, 5);
    n.cloud
        .set_latency(Action::AssignPrivateIpAddresses, Duration::from_secs(2));
    let warm = {
        let pool = n.pool.clone();
        tokio::spawn(async move { pool.maintain_now().await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let snap = n.pool.snapshot();
    assert!(snap.in_flight >= 3, "warm-ups in flight: {snap:?}");
    let got = ips(&acquire_many(&n.pool, 0..5).await);
    assert_eq!(got.iter().collect::<BTreeSet<_>>().len(), 5);
    // One more: the node is full, refused at once.
    let err = n
        .pool
        .acquire(key(9), pool_support::pod(9), None, None)
        .await
        .unwrap_err();
    assert!(
        matches!(err, eniipam::pool::PoolError::Exhausted { .. }),
        "{err:?}"
    );
    warm.await.unwrap().unwrap();
    n.pool.check_invariants().unwrap();
}

/// Issue 23, case 3a: the FIRST burst after the subnet runs out of free `/28`s. eth0 is routed the
/// burst while prefixes still look available (its room counted in prefixes, 9 × 16); the prefix
/// assign finds no free `/28`, and the fallback to single addresses must not ask eth0 for more than
/// its free slots: the rest of the batch goes on (to a new ENI) instead of the whole batch failing
/// with PrivateIpAddressLimitExceeded and eth0 backing off for minutes.
#[tokio::test(start_paused = true)]
async fn the_first_burst_after_the_subnet_runs_out_of_prefixes_fits_eth0_in_single_addresses() {
    let n = start(prefix_config(), NodeSpec::default()).await;
    fragment_every_block(&n);
    let burst = acquire_many(&n.pool, 0..20).await;
    let failed: Vec<_> = burst.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(failed.is_empty(), "pods failed: {failed:?}");
    assert_eq!(ips(&burst).iter().collect::<BTreeSet<_>>().len(), 20);
    let limit = n.node.limits.ipv4_per_eni;
    for e in n.cloud.attached_enis() {
        assert!(
            (e.secondary_ips.len() as u32) < limit,
            "{} holds {} addresses, more than {limit}",
            e.id,
            1 + e.secondary_ips.len()
        );
    }
    let snap = n.pool.snapshot();
    assert!(
        snap.enis.iter().all(|e| !matches!(
            e.phase,
            eniipam::pool::snapshot::EniPhaseSnapshot::BackingOff { .. }
        )),
        "no ENI backs off: {:?}",
        snap.enis
    );
    n.pool.check_invariants().unwrap();
}

/// Issue 23, case 3b: a new ENI whose create falls back to single addresses because the node has
/// too few tokens for whole prefixes (`Slots::Ips(count)`) is created with at most its slots' worth
/// of addresses; the waiters beyond go to the next ENI, not into a create EC2 refuses.
#[tokio::test(start_paused = true)]
async fn a_new_eni_short_of_tokens_for_prefixes_is_created_with_one_address_per_slot() {
    let config = PoolConfig {
        max_ips: Some(32),
        ..prefix_config()
    };
    let n = start(config, NodeSpec::default()).await;
    assert_eq!(n.pool.snapshot().capacity, 32);
    // eth0's nine slots go to single addresses while the subnet has no free /28.
    let other = fragment_every_block(&n);
    assert!(acquire_many(&n.pool, 0..5).await.iter().all(|r| r.is_ok()));
    assert!(acquire_many(&n.pool, 5..9).await.iter().all(|r| r.is_ok()));
    n.cloud.another_node_leaves(&other);
    advance(PoolConfig::default().prefix_retry + Duration::from_secs(1)).await;
    // 17 more: two prefixes would need 32 - 9 - 17 = 6 < 15 spare tokens: single addresses.
    let burst = acquire_many(&n.pool, 10..27).await;
    let failed: Vec<_> = burst.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(failed.is_empty(), "pods failed: {failed:?}");
    assert_eq!(ips(&burst).iter().collect::<BTreeSet<_>>().len(), 17);
    let limit = n.node.limits.ipv4_per_eni;
    assert_eq!(
        n.cloud
            .calls_of(Action::CreateNetworkInterface)
            .iter()
            .filter(|c| c.error.is_some())
            .count(),
        0,
        "no create refused: {:?}",
        n.cloud.calls_of(Action::CreateNetworkInterface)
    );
    for e in n.cloud.attached_enis() {
        assert!(
            (e.secondary_ips.len() as u32) < limit,
            "{} holds {} addresses, more than {limit}",
            e.id,
            1 + e.secondary_ips.len()
        );
    }
    n.pool.check_invariants().unwrap();
}
