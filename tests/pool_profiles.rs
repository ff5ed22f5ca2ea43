//! Network profiles in the pool (in-memory cloud, paused clock): a pod of profile `db` gets its IP
//! only from an ENI created for `db` (its subnet, its groups, tagged `eniipam.io/network=db`); a
//! pod of the default network never gets a profile's IP, nor a profile's pod another's; a profile
//! that may have no other ENI fails naming itself; `profile_capacity` says what each can take; a
//! profile removed keeps its pods; a restarted pool knows its ENIs' profiles from their tags.
//!
//! The in-memory cloud has one subnet: every profile uses it, and the groups are read from the
//! create call's record.

mod pool_support;

use std::collections::BTreeMap;
use std::time::Duration;

use eniipam::cloud::{Cloud, Subnet, SubnetFilter};
use eniipam::pool::{
    Acquire, Allocation, AttachmentMeta, Pool, PoolError, ProfileCapacity, ProfileNetwork,
    ProfileUnavailableReason,
};
use eniipam::reconcile::{HostEvidence, Inputs, NetnsView, rebuild};
use eniipam::store::StoredState;
use pool_support::memory_cloud::{Action, NodeSpec};
use pool_support::{Node, eth0_config, key, pod, quiet_config, settle, start};

async fn acquire_in(pool: &Pool, n: usize, network: Option<&str>) -> Result<Allocation, PoolError> {
    pool.acquire_with(Acquire {
        key: key(n),
        pod: pod(n),
        prefer: None,
        sticky_key: None,
        meta: AttachmentMeta::default(),
        wait: None,
        network: network.map(str::to_owned),
    })
    .await
}

async fn the_subnet(n: &Node) -> Subnet {
    n.cloud
        .describe_subnets(&SubnetFilter {
            ids: vec![n.node.subnet_id.clone()],
            ..SubnetFilter::default()
        })
        .await
        .unwrap()
        .remove(0)
}

/// Profiles `(name, group, max_enis)`, all in the one subnet.
async fn profiles(
    n: &Node,
    list: &[(&str, &str, Option<u32>)],
) -> BTreeMap<String, ProfileNetwork> {
    let subnet = the_subnet(n).await;
    list.iter()
        .map(|(name, group, max_enis)| {
            (
                (*name).to_owned(),
                ProfileNetwork {
                    subnet: subnet.clone(),
                    security_groups: vec![(*group).to_owned()],
                    max_enis: *max_enis,
                },
            )
        })
        .collect()
}

fn profile_unavailable(r: &Result<Allocation, PoolError>) -> (String, ProfileUnavailableReason) {
    match r {
        Err(PoolError::ProfileUnavailable { profile, reason }) => (profile.clone(), reason.clone()),
        other => panic!("expected ProfileUnavailable, got {other:?}"),
    }
}

fn cap(enis: u32, assigned: u32, idle: u32, free: u32, total: u32) -> ProfileCapacity {
    ProfileCapacity {
        enis,
        assigned,
        idle,
        free,
        total,
    }
}

#[tokio::test(start_paused = true)]
async fn a_profile_pod_gets_an_ip_on_a_new_eni_of_its_profile_and_the_next_reuses_it() {
    let n = start(quiet_config(), NodeSpec::default()).await;
    n.pool
        .set_profiles(profiles(&n, &[("db", "sg-db", None)]).await);
    // m5.large-like: 3 ENIs (eth0 serves no pods here) × 9 slots: 2 free device indexes, one
    // spare for db and one for the default network, which no ENI serves yet: db's total is 9.
    assert_eq!(n.pool.profile_capacity()["db"], cap(0, 0, 0, 9, 9));

    let a = acquire_in(&n.pool, 0, Some("db")).await.unwrap();
    assert_eq!(a.network.as_deref(), Some("db"));
    assert_ne!(a.device_index, 0);
    let creates = n.cloud.calls_of(Action::CreateNetworkInterface);
    assert_eq!(creates.len(), 1, "{creates:?}");
    assert!(
        creates[0].args.contains("groups=sg-db "),
        "{}",
        creates[0].args
    );
    assert!(
        creates[0].args.contains(r#""eniipam.io/network": "db""#),
        "tagged with its profile: {}",
        creates[0].args
    );
    assert!(
        creates[0].args.contains("secondary_ip_count=1 "),
        "no warm IPs for a profile: {}",
        creates[0].args
    );

    let b = acquire_in(&n.pool, 1, Some("db")).await.unwrap();
    assert_eq!(b.eni, a.eni, "the profile's ENI had room");
    assert_eq!(n.cloud.call_count(Action::CreateNetworkInterface), 1);
    // Its ENI: 7 slots left; the last free index is the default network's spare: db's total is
    // its one ENI's 9.
    assert_eq!(n.pool.profile_capacity()["db"], cap(1, 2, 0, 7, 9));
    n.pool.check_invariants().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_default_pod_never_gets_a_profile_ip() {
    let n = start(quiet_config(), NodeSpec::default()).await;
    n.pool
        .set_profiles(profiles(&n, &[("db", "sg-db", None)]).await);
    let db = acquire_in(&n.pool, 0, Some("db")).await.unwrap();
    acquire_in(&n.pool, 1, Some("db")).await.unwrap();
    n.pool.release(&key(0), false).unwrap();
    tokio::time::sleep(Duration::from_secs(31)).await;
    // `db`'s ENI has an idle IP past its cooldown and 7 free slots; the default network has
    // nothing: its pod gets an ENI of its own, with the node's groups and no network tag.
    let d = acquire_in(&n.pool, 2, None).await.unwrap();
    assert_ne!(d.eni, db.eni);
    assert_ne!(d.ip, db.ip);
    assert_eq!(d.network, None);
    let creates = n.cloud.calls_of(Action::CreateNetworkInterface);
    assert_eq!(creates.len(), 2, "{creates:?}");
    assert!(!creates[1].args.contains("sg-db"), "{}", creates[1].args);
    assert!(
        !creates[1].args.contains("eniipam.io/network"),
        "{}",
        creates[1].args
    );
    // The idle `db` IP is not the default network's warm pool (the invariant says so too).
    assert_eq!(n.pool.profile_capacity()["db"].idle, 1);
    n.pool.check_invariants().unwrap();
    // And the next default pod takes the default ENI's room, not `db`'s idle IP.
    let e = acquire_in(&n.pool, 3, None).await.unwrap();
    assert_eq!(e.eni, d.eni);
    n.pool.check_invariants().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_cooled_profile_ip_goes_to_the_next_pod_of_that_profile_only_then_back_to_ec2() {
    // eth0 serves the default network, so the two free indexes are the two profiles' spares.
    let n = start(eth0_config(), NodeSpec::default()).await;
    n.pool
        .set_profiles(profiles(&n, &[("db", "sg-db", None), ("app", "sg-app", None)]).await);
    let db = acquire_in(&n.pool, 0, Some("db")).await.unwrap();
    n.pool.release(&key(0), false).unwrap();
    tokio::time::sleep(Duration::from_secs(31)).await;
    let app = acquire_in(&n.pool, 1, Some("app")).await.unwrap();
    assert_ne!(app.ip, db.ip, "an app pod never gets a db IP");
    assert_ne!(app.eni, db.eni);
    let creates = n.cloud.calls_of(Action::CreateNetworkInterface);
    assert_eq!(creates.len(), 2);
    assert!(
        creates[1].args.contains("groups=sg-app "),
        "{}",
        creates[1].args
    );
    let again = acquire_in(&n.pool, 2, Some("db")).await.unwrap();
    assert_eq!(again.ip, db.ip, "the cooled db IP serves the next db pod");
    assert_eq!(n.cloud.call_count(Action::AssignPrivateIpAddresses), 0);
    n.pool.check_invariants().unwrap();

    // Released again: a profile keeps no warm IPs; once held for `give_back_delay` the IP goes
    // back to EC2, and the empty ENI is released.
    n.pool.release(&key(2), false).unwrap();
    n.pool.maintain_now().await.unwrap();
    settle().await;
    assert_eq!(
        n.cloud.call_count(Action::UnassignPrivateIpAddresses),
        0,
        "held a while"
    );
    tokio::time::sleep(Duration::from_secs(601)).await;
    n.pool.maintain_now().await.unwrap();
    settle().await;
    assert_eq!(n.cloud.call_count(Action::UnassignPrivateIpAddresses), 1);
    for _ in 0..3 {
        n.pool.maintain_now().await.unwrap();
        settle().await;
    }
    assert_eq!(n.cloud.call_count(Action::DeleteNetworkInterface), 1);
    assert_eq!(n.pool.profile_capacity()["db"].enis, 0);
    // app's ENI, and the spare index db left (db has fewer ENIs now: the spare is db's).
    assert_eq!(n.pool.profile_capacity()["app"], cap(1, 1, 0, 8, 9));
    n.pool.check_invariants().unwrap();
}

#[tokio::test(start_paused = true)]
async fn max_enis_and_no_device_index_fail_naming_the_profile() {
    let n = start(quiet_config(), NodeSpec::default()).await;
    n.pool
        .set_profiles(profiles(&n, &[("db", "sg-db", Some(1)), ("web", "sg-web", None)]).await);
    let d = acquire_in(&n.pool, 0, None).await.unwrap();
    let db = acquire_in(&n.pool, 1, Some("db")).await.unwrap();
    assert_ne!(d.eni, db.eni);
    // Both secondary device indexes are taken: `web` can get no ENI.
    assert_eq!(n.pool.profile_capacity()["web"], cap(0, 0, 0, 0, 0));
    let r = acquire_in(&n.pool, 2, Some("web")).await;
    let (profile, reason) = profile_unavailable(&r);
    assert_eq!(profile, "web");
    assert!(
        matches!(
            reason,
            ProfileUnavailableReason::NoEniSlot {
                enis: 0,
                max_enis: 3
            }
        ),
        "{reason:?}"
    );
    let err = r.unwrap_err();
    assert!(err.is_retryable(), "CNI 11: a matter of capacity");
    assert!(err.to_string().contains("network profile web"), "{err}");

    // `db` fills its one ENI, then may have no other.
    for i in 3..11 {
        let a = acquire_in(&n.pool, i, Some("db")).await.unwrap();
        assert_eq!(a.eni, db.eni);
    }
    assert_eq!(n.pool.profile_capacity()["db"], cap(1, 9, 0, 0, 9));
    let r = acquire_in(&n.pool, 11, Some("db")).await;
    let (profile, reason) = profile_unavailable(&r);
    assert_eq!(profile, "db");
    assert_eq!(
        reason,
        ProfileUnavailableReason::MaxEnis {
            enis: 1,
            max_enis: 1
        }
    );
    assert!(r.unwrap_err().to_string().contains("at most 1"));
    assert_eq!(n.cloud.call_count(Action::CreateNetworkInterface), 2);
    n.pool.check_invariants().unwrap();
}

#[tokio::test(start_paused = true)]
async fn an_unknown_profile_is_refused_and_not_retryable() {
    let n = start(quiet_config(), NodeSpec::default()).await;
    n.pool
        .set_profiles(profiles(&n, &[("db", "sg-db", None)]).await);
    let r = acquire_in(&n.pool, 0, Some("nope")).await;
    let (profile, reason) = profile_unavailable(&r);
    assert_eq!(
        (profile.as_str(), reason),
        ("nope", ProfileUnavailableReason::Unknown)
    );
    let err = r.unwrap_err();
    assert!(!err.is_retryable());
    assert!(
        err.to_string().contains("nope") && err.to_string().contains("does not serve"),
        "{err}"
    );
    assert_eq!(n.cloud.call_count(Action::CreateNetworkInterface), 0);
    n.pool.check_invariants().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_removed_profile_keeps_its_pods_and_gets_no_new_eni() {
    let n = start(quiet_config(), NodeSpec::default()).await;
    n.pool
        .set_profiles(profiles(&n, &[("db", "sg-db", None)]).await);
    let a = acquire_in(&n.pool, 0, Some("db")).await.unwrap();
    acquire_in(&n.pool, 1, Some("db")).await.unwrap();
    n.pool.set_profiles(BTreeMap::new());
    assert!(n.pool.profile_capacity().is_empty());
    // Its pods keep their IPs (an ADD retried gets the same answer).
    assert_eq!(n.pool.allocation(&key(0)).unwrap().ip, a.ip);
    assert_eq!(acquire_in(&n.pool, 0, Some("db")).await.unwrap(), a);
    // A new pod of it is refused, though its ENI has room; no ENI is created.
    let r = acquire_in(&n.pool, 2, Some("db")).await;
    assert_eq!(profile_unavailable(&r).1, ProfileUnavailableReason::Unknown);
    assert_eq!(n.cloud.call_count(Action::CreateNetworkInterface), 1);
    n.pool.check_invariants().unwrap();
    // Once its pods are gone, its IPs and then its ENI go back.
    n.pool.release(&key(0), false).unwrap();
    n.pool.release(&key(1), false).unwrap();
    tokio::time::sleep(Duration::from_secs(601)).await;
    for _ in 0..4 {
        n.pool.maintain_now().await.unwrap();
        settle().await;
    }
    assert_eq!(n.cloud.call_count(Action::DeleteNetworkInterface), 1);
    n.pool.check_invariants().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_pool_restarted_from_the_rebuilt_seed_knows_its_enis_profiles() {
    let n = start(quiet_config(), NodeSpec::default()).await;
    let served = profiles(&n, &[("db", "sg-db", None)]).await;
    n.pool.set_profiles(served.clone());
    let db = acquire_in(&n.pool, 0, Some("db")).await.unwrap();
    let d = acquire_in(&n.pool, 1, None).await.unwrap();
    n.pool.release(&key(0), false).unwrap();
    n.pool.release(&key(1), false).unwrap();
    n.pool.shutdown().await;

    // The rebuild from EC2 (as the daemon's startup does): the profile from the ENI's tag.
    let host = HostEvidence::default();
    let netns = NetnsView::default();
    let rebuilt = rebuild(
        n.cloud.as_ref(),
        n.cloud.as_ref(),
        &n.node.instance_id,
        Inputs {
            stored: StoredState::default(),
            state_lost: false,
            first_start: false,
            host: &host,
            netns: &netns,
            use_primary_eni: false,
            ec2_changes: Vec::new(),
            described: None,
        },
    )
    .await
    .unwrap();
    let seeded: BTreeMap<String, Option<String>> = rebuilt
        .seed
        .enis
        .iter()
        .map(|e| (e.id.to_string(), e.profile.clone()))
        .collect();
    assert_eq!(seeded[&db.eni.to_string()], Some("db".to_owned()));
    assert_eq!(seeded[&d.eni.to_string()], None);

    let pool = Pool::start(
        quiet_config(),
        n.cloud.clone(),
        n.cloud.clone(),
        n.node.clone(),
        rebuilt.seed,
    )
    .unwrap();
    pool.set_profiles(served);
    n.cloud.reset_calls();
    let d2 = acquire_in(&pool, 5, None).await.unwrap();
    assert_eq!(d2.eni, d.eni, "the default pod stays off db's ENI");
    let db2 = acquire_in(&pool, 6, Some("db")).await.unwrap();
    assert_eq!(db2.eni, db.eni);
    assert_eq!(db2.network.as_deref(), Some("db"));
    assert_eq!(n.cloud.call_count(Action::CreateNetworkInterface), 0);
    assert_eq!(pool.profile_capacity()["db"].enis, 1);
    pool.check_invariants().unwrap();
}

#[tokio::test(start_paused = true)]
async fn sticky_and_preferred_ips_stay_within_their_network() {
    let n = start(quiet_config(), NodeSpec::default()).await;
    n.pool
        .set_profiles(profiles(&n, &[("db", "sg-db", None)]).await);
    let sticky = |k: usize, network: Option<&str>, prefer: Option<std::net::Ipv4Addr>| Acquire {
        key: key(k),
        pod: pod(0),
        prefer,
        sticky_key: Some("default/web-0".into()),
        meta: AttachmentMeta::default(),
        wait: None,
        network: network.map(str::to_owned),
    };
    let db = n
        .pool
        .acquire_with(sticky(0, Some("db"), None))
        .await
        .unwrap();
    n.pool.release(&key(0), true).unwrap();
    // The same StatefulSet pod, now without a profile: its reservation is on `db`'s ENI, so it is
    // not given; a preferred IP of `db`'s is refused as another network's.
    let r = n.pool.acquire_with(sticky(1, None, Some(db.ip))).await;
    match r {
        Err(PoolError::PreferredUnavailable { ip, reason }) => {
            assert_eq!(ip, db.ip);
            assert_eq!(reason, eniipam::pool::PreferUnavailable::OtherNetwork);
        }
        other => panic!("expected PreferredUnavailable, got {other:?}"),
    }
    let d = n.pool.acquire_with(sticky(2, None, None)).await.unwrap();
    assert_ne!(d.ip, db.ip);
    assert_ne!(d.eni, db.eni);
    n.pool.release(&key(2), false).unwrap();
    // Back in `db`: its reservation serves it.
    let again = n
        .pool
        .acquire_with(sticky(3, Some("db"), None))
        .await
        .unwrap();
    assert_eq!(again.ip, db.ip);
    n.pool.check_invariants().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_burst_of_one_profile_gets_its_enis_in_parallel_within_max_enis() {
    // eth0 serves the default network, so no spare is held for it: db may have both indexes.
    let n = start(eth0_config(), NodeSpec::default()).await;
    n.pool
        .set_profiles(profiles(&n, &[("db", "sg-db", Some(2))]).await);
    // 12 pods: more than one ENI's 9 slots, so two `db` ENIs; the 19th could have none.
    let got = futures::future::join_all((0..12).map(|i| acquire_in(&n.pool, i, Some("db")))).await;
    assert!(got.iter().all(Result::is_ok), "{got:?}");
    let enis: std::collections::BTreeSet<_> = got
        .iter()
        .map(|a| a.as_ref().unwrap().eni.clone())
        .collect();
    assert_eq!(enis.len(), 2);
    let creates = n.cloud.calls_of(Action::CreateNetworkInterface);
    assert_eq!(creates.len(), 2, "{creates:?}");
    assert!(creates.iter().all(|c| c.args.contains("groups=sg-db ")));
    assert_eq!(n.pool.profile_capacity()["db"], cap(2, 12, 0, 6, 18));
    n.pool.check_invariants().unwrap();
}

/// Issue 44, case 2: the node's last free device index is promised once. Before, `db` and `app`
/// each advertised a whole ENI on it (18 pods where 9 fit) and the loser's bound pods got CNI
/// error 11 forever; now one holds it as its spare (fewest ENIs first, then by name), the totals
/// add up to what the node can create, every pod the totals promise is served, and the default
/// network may not take the spare either.
#[tokio::test(start_paused = true)]
async fn the_last_free_device_index_is_promised_to_one_network_not_two() {
    let n = start(quiet_config(), NodeSpec::default()).await;
    // The default network's pod takes index 1 (eth0 serves no pods here): index 2 is left.
    let d = acquire_in(&n.pool, 0, None).await.unwrap();
    assert_eq!(d.device_index, 1);
    n.pool
        .set_profiles(profiles(&n, &[("db", "sg-db", None), ("app", "sg-app", None)]).await);
    let caps = n.pool.profile_capacity();
    assert_eq!(
        (caps["app"].total, caps["db"].total),
        (9, 0),
        "one ENI's worth (9 addresses), promised once: {caps:?}"
    );
    // The default network fills its ENI, then may not take app's spare.
    for i in 1..9 {
        let a = acquire_in(&n.pool, i, None).await.unwrap();
        assert_eq!(a.eni, d.eni);
    }
    let e = acquire_in(&n.pool, 9, None).await.unwrap_err();
    assert!(e.is_retryable(), "CNI 11: {e}");
    // A db pod the scheduler would not have placed here: refused naming db, no ENI created.
    let (profile, reason) = profile_unavailable(&acquire_in(&n.pool, 10, Some("db")).await);
    assert_eq!(profile, "db");
    assert!(
        matches!(reason, ProfileUnavailableReason::NoEniSlot { .. }),
        "{reason:?}"
    );
    // Every app pod its total promised is served, on one new ENI.
    let got =
        futures::future::join_all((11..20).map(|i| acquire_in(&n.pool, i, Some("app")))).await;
    assert!(got.iter().all(Result::is_ok), "{got:?}");
    assert_eq!(n.cloud.call_count(Action::CreateNetworkInterface), 2);
    // The total did not move with the pods: the scheduler subtracts them itself.
    assert_eq!(n.pool.profile_capacity()["app"].total, 9);
    assert_eq!(n.pool.profile_capacity()["app"].free, 0);
    n.pool.check_invariants().unwrap();
}
