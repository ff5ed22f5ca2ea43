//! Automatic subnet CIDR reservations for prefixes (issue 46, item 1, `prefix_reservation_percent`)
//! through the real daemon and the real SDK on mockcloud, with the shipped IAM policy enforced:
//!
//! - four nodes of one subnet starting at once make exactly one `prefix` reservation, tagged for
//!   the cluster, and a burst's `/28`s come from inside it afterwards;
//! - a subnet that has a `prefix` reservation gets none more;
//! - the knob off makes no call;
//! - a role without `ec2:CreateSubnetCidrReservation` gets one warning naming it, and serves pods.
//!
//! The step logs when it ends on a node; the tests wait on those lines (captured by one global
//! subscriber, so the tests of this file take turns).

#[path = "daemon_support/mod.rs"]
mod daemon_support;
#[path = "log_capture/mod.rs"]
mod log_capture;

use std::collections::BTreeSet;
use std::sync::OnceLock;

use daemon_support::*;
use eniipam::config::DaemonConfig;
use ipnet::Ipv4Net;
use log_capture::Logs;
use mockcloud::MockCloud;
use mockcloud::world::{ReservationType, ReservationView};

const CREATE: &str = "CreateSubnetCidrReservation";

/// Nodes whose step ended with a reservation in place, by the logs of this binary (every
/// thread's: the capture is global).
fn ended(logs: &Logs) -> usize {
    [
        "prefix reservation: reserved for /28 prefixes",
        "prefix reservation: another node made it",
        "prefix reservation: the subnet has one already",
    ]
    .iter()
    .map(|l| logs.count(l))
    .sum()
}

/// The captured logs, emptied, and this test's turn (the capture is global).
async fn turn() -> (Logs, tokio::sync::MutexGuard<'static, ()>) {
    static LOGS: OnceLock<Logs> = OnceLock::new();
    static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let logs = LOGS
        .get_or_init(|| {
            let logs = Logs::default();
            tracing::subscriber::set_global_default(logs.subscriber())
                .expect("one global subscriber");
            logs
        })
        .clone();
    let guard = TURN.lock().await;
    logs.clear();
    (logs, guard)
}

/// mockcloud with Nitro nodes (m5.xlarge) in its /20 subnet.
async fn mock() -> MockCloud {
    MockCloud::start(mockcloud::Config {
        default_instance_type: "m5.xlarge".into(),
        ..mockcloud::Config::fast()
    })
    .await
    .unwrap()
}

/// The shipped burst prefixes, and `percent` of the /20 kept for prefixes (5 %: a /25, eight /28s).
fn reserving(mock: &MockCloud, dir: &std::path::Path, imds: &str, percent: u8) -> DaemonConfig {
    DaemonConfig {
        burst_prefixes: true,
        prefix_reservation_percent: percent,
        imds_endpoint: Some(imds.to_owned()),
        ..config(mock, dir)
    }
}

fn reservations(mock: &MockCloud, subnet: &str) -> Vec<ReservationView> {
    mock.with_world(|w, _| w.get_subnet_cidr_reservations(subnet, &[]))
        .unwrap()
}

fn calls(mock: &MockCloud, action: &str) -> u64 {
    mock.counters().calls(action)
}

fn eth0_prefixes(mock: &MockCloud, instance_id: &str) -> BTreeSet<Ipv4Net> {
    eth0_in_ec2(mock, instance_id)
        .ipv4_prefixes
        .into_iter()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_starting_together_makes_one_reservation_and_bursts_take_prefixes_from_it() {
    let (logs, _turn) = turn().await;
    let mock = mock().await;
    let subnet = mock.default_world().unwrap().subnet_id;
    let mut nodes = vec![mock.default_instance()];
    for _ in 0..3 {
        nodes.push(mock.launch_instance("m5.xlarge", &subnet).await.unwrap());
    }
    let dirs: Vec<TempDir> = (0..nodes.len())
        .map(|i| TempDir::new(&format!("prefix-reservation-{i}")))
        .collect();
    let mut starting = tokio::task::JoinSet::new();
    for (i, (node, dir)) in nodes.iter().zip(&dirs).enumerate() {
        let cfg = reserving(&mock, &dir.0, &node.imds_url, 5);
        starting.spawn(async move { (i, start(cfg).await) });
    }
    let mut daemons: Vec<_> = starting.join_all().await;
    daemons.sort_by_key(|(i, _)| *i);
    wait_until("every node's reservation step ended", || ended(&logs) == 4).await;

    let made = reservations(&mock, &subnet);
    assert_eq!(made.len(), 1, "one reservation for the fleet: {made:?}");
    let r = &made[0];
    assert_eq!(r.reservation_type, ReservationType::Prefix);
    assert_eq!(r.cidr.prefix_len(), 25, "5 % of a /20 is a /25: {r:?}");
    assert_eq!(
        r.tags.get("eniipam.io/cluster").map(String::as_str),
        Some(CLUSTER)
    );
    assert!(r.description.starts_with("eniipam:"), "{r:?}");
    let counters = mock.counters();
    assert_eq!(counters.ok(CREATE), 1, "{:?}", counters.actions.get(CREATE));
    assert_eq!(
        logs.count("prefix reservation: reserved for /28 prefixes"),
        1
    );
    assert_eq!(
        logs.count("the IAM role lacks"),
        0,
        "the shipped policy allows it"
    );

    // A burst on one node: its new /28s come from the reservation.
    let (_, d) = &daemons[0];
    let before = eth0_prefixes(&mock, &nodes[0].instance_id);
    let ips = allocate_all(&d.socket_path, 0..24).await;
    assert_eq!(ips.iter().collect::<BTreeSet<_>>().len(), 24);
    let new: Vec<Ipv4Net> = eth0_prefixes(&mock, &nodes[0].instance_id)
        .difference(&before)
        .copied()
        .collect();
    assert!(!new.is_empty(), "the burst took /28s");
    // EC2 takes automatic prefixes from the reservation while it has a free block (the fleet's
    // warm-ups took some of its eight already): outside it only once it is full.
    let held: BTreeSet<Ipv4Net> = mock
        .network_interfaces()
        .iter()
        .flat_map(|e| e.ipv4_prefixes.iter().copied())
        .filter(|p| r.cidr.contains(p))
        .collect();
    assert!(
        new.iter().any(|p| r.cidr.contains(p)),
        "the burst's /28s come from {}: {new:?} (eth0 had {before:?})",
        r.cidr
    );
    assert!(
        new.iter().all(|p| r.cidr.contains(p)) || held.len() == 8,
        "a /28 outside {} only once its eight are held: new {new:?}, held there {held:?}",
        r.cidr
    );
    for (_, d) in daemons {
        d.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subnet_with_a_prefix_reservation_gets_none_more() {
    let (logs, _turn) = turn().await;
    let mock = mock().await;
    let world = mock.default_world().unwrap();
    // A /24 of the /20 clear of the node's primary address (the only one in use yet).
    let operators: Ipv4Net = ["10.0.8.0/24", "10.0.9.0/24"]
        .iter()
        .map(|c| c.parse::<Ipv4Net>().unwrap())
        .find(|c| !c.contains(&world.instance.private_ip))
        .unwrap();
    mock.with_world(|w, _| {
        w.create_subnet_cidr_reservation(
            &world.subnet_id,
            operators,
            ReservationType::Prefix,
            "the operator's",
            &Default::default(),
        )
    })
    .unwrap();
    let dir = TempDir::new("prefix-reservation-present");
    let d = start(reserving(&mock, &dir.0, &world.instance.imds_url, 2)).await;
    wait_until("the step ended", || ended(&logs) == 1).await;
    assert_eq!(logs.count("the subnet has one already"), 1);
    assert_eq!(calls(&mock, CREATE), 0, "no create");
    let all = reservations(&mock, &world.subnet_id);
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].cidr, operators);
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_knob_off_makes_no_call() {
    let (logs, _turn) = turn().await;
    let mock = mock().await;
    let world = mock.default_world().unwrap();
    let dir = TempDir::new("prefix-reservation-off");
    assert_eq!(
        DaemonConfig::default().prefix_reservation_percent,
        0,
        "off by default"
    );
    let d = start(reserving(&mock, &dir.0, &world.instance.imds_url, 0)).await;
    let mut c = client(&d.socket_path).await;
    add_ip(&mut c, "c0", "p0").await;
    // The step is not started at all when off: nothing to wait for.
    assert_eq!(calls(&mock, CREATE), 0);
    assert_eq!(calls(&mock, "GetSubnetCidrReservations"), 0);
    assert_eq!(logs.count("prefix reservation"), 0);
    assert!(reservations(&mock, &world.subnet_id).is_empty());
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_without_the_action_warns_once_and_serves_pods() {
    let (logs, _turn) = turn().await;
    let mock = mock().await;
    let world = mock.default_world().unwrap();
    let dir = TempDir::new("prefix-reservation-denied");
    let cfg = reserving(&mock, &dir.0, &world.instance.imds_url, 2);
    mock.deny(CREATE, true);
    let d = start(cfg).await;
    wait_until("the warning", || {
        logs.count("the IAM role lacks ec2:CreateSubnetCidrReservation") > 0
    })
    .await;
    let mut c = client(&d.socket_path).await;
    let ip = add_ip(&mut c, "c0", "p0").await;
    assert!(world.subnet_cidr.contains(&ip), "the pod is served: {ip}");
    assert_eq!(
        logs.count("the IAM role lacks ec2:CreateSubnetCidrReservation"),
        1
    );
    assert_eq!(calls(&mock, CREATE), 1, "one try, no retry");
    assert!(reservations(&mock, &world.subnet_id).is_empty());
    d.shutdown().await;
}
