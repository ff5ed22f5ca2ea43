//! An assign costs one AssignPrivateIpAddresses and no describe; an ambiguous one (reply lost) is
//! settled from IMDS first, and from DescribeNetworkInterfaces only when IMDS lags past its bound.
//! What an ENI held before its first assign comes from a describe of this client's that no change
//! of its own may have outrun (the startup's look at the instance), else from one describe.
//! mockcloud with the real SDK clients, on loopback.

mod cloud_support;

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use eniipam::cloud::ec2::{AMBIGUOUS_IMDS_WAIT, Ec2Cloud};
use eniipam::cloud::{Cloud, EniFilter};
use eniipam::model::EniId;
use mockcloud::Fault;

use cloud_support::*;

const ASSIGN: &str = "AssignPrivateIpAddresses";
const DESCRIBE: &str = "DescribeNetworkInterfaces";

/// `env`'s client, settling ambiguous assigns from `env`'s IMDS for up to `settle`.
fn with_view(env: &Env, settle: Duration) -> Ec2Cloud {
    (*env.cloud)
        .clone()
        .with_instance_view(env.imds.clone(), settle)
}

async fn start() -> Env {
    Env::start_with(
        mockcloud::Config::fast(),
        fast_limiter(),
        Duration::from_millis(300),
    )
    .await
}

/// The answer is exactly what appeared on the ENI, and EC2 assigned once.
fn assert_exactly_new(env: &Env, eni: &EniId, before: &BTreeSet<Ipv4Addr>, got: &[Ipv4Addr]) {
    let after = ips_on(env, eni);
    let new: BTreeSet<Ipv4Addr> = after.difference(before).copied().collect();
    assert_eq!(new, got.iter().copied().collect::<BTreeSet<_>>());
    assert_eq!(after.len(), before.len() + got.len());
}

#[tokio::test]
async fn an_assign_is_one_call_and_no_describe() {
    let env = start().await;
    let cloud = with_view(&env, AMBIGUOUS_IMDS_WAIT);
    let lc = env.lifecycle(fast_lifecycle());
    let made = lc.create_and_attach(1, 1).await.unwrap();
    // An ENI this client did not create (eth0): one describe, the first time only.
    let eth0 = env
        .cloud
        .describe_instance(&env.instance.instance_id)
        .await
        .unwrap()
        .enis
        .into_iter()
        .find(|e| e.attachment.as_ref().is_some_and(|a| a.device_index == 0))
        .expect("eth0");
    env.mock.reset_counters();

    for eni in [&made.id, &made.id, &eth0.id, &eth0.id] {
        let before = ips_on(&env, eni);
        let got = cloud.assign_ips(eni, 2).await.unwrap();
        assert_eq!(got.len(), 2);
        assert_exactly_new(&env, eni, &before, &got);
    }
    // Given back, then assigned again: still no describe.
    let back: Vec<Ipv4Addr> = ips_on(&env, &made.id)
        .into_iter()
        .filter(|ip| *ip != made.primary_ip)
        .take(2)
        .collect();
    cloud.unassign_ips(&made.id, &back).await.unwrap();
    let before = ips_on(&env, &made.id);
    let got = cloud.assign_ips(&made.id, 1).await.unwrap();
    assert_exactly_new(&env, &made.id, &before, &got);

    let c = env.mock.counters();
    assert_eq!(c.calls(ASSIGN), 5);
    assert_eq!(c.calls(DESCRIBE), 1, "eth0's first assign only");
}

/// eth0 as a describe of the instance's ENIs shows it (the startup's look).
async fn eth0_described(env: &Env, cloud: &Ec2Cloud) -> EniId {
    let attached = cloud
        .describe_enis(&EniFilter {
            attached_to: Some(env.instance.instance_id.clone()),
            ..EniFilter::default()
        })
        .await
        .unwrap();
    attached
        .into_iter()
        .find(|e| e.attachment.as_ref().is_some_and(|a| a.device_index == 0))
        .expect("eth0")
        .id
}

/// An assign of 2 on `eni`; the answer is exactly what appeared. Returns the describes it cost.
async fn describes_of_an_assign(env: &Env, cloud: &Ec2Cloud, eni: &EniId) -> u64 {
    env.mock.reset_counters();
    let before = ips_on(env, eni);
    let got = cloud.assign_ips(eni, 2).await.unwrap();
    assert_exactly_new(env, eni, &before, &got);
    let c = env.mock.counters();
    assert_eq!(c.calls(ASSIGN), 1);
    c.calls(DESCRIBE)
}

#[tokio::test]
async fn an_eni_a_quiet_describe_showed_costs_no_describe_at_its_first_assign() {
    let env = start().await;
    let cloud = with_view(&env, AMBIGUOUS_IMDS_WAIT);
    // No call of ours has changed anything yet: the startup's look is EC2's settled view.
    let eth0 = eth0_described(&env, &cloud).await;
    assert_eq!(describes_of_an_assign(&env, &cloud, &eth0).await, 0);
    // What it learned is right: an ambiguous assign after it is settled to exactly what appeared.
    env.mock
        .inject_fault(Fault::slow_reply(ASSIGN, Duration::from_millis(800), 1));
    let before = ips_on(&env, &eth0);
    let got = cloud.assign_ips(&eth0, 3).await.unwrap();
    assert_eq!(got.len(), 3);
    assert_exactly_new(&env, &eth0, &before, &got);
}

#[tokio::test]
async fn an_earlier_process_change_unteaches_what_describes_taught_for_a_minute() {
    let env = start().await;
    let cloud = with_view(&env, AMBIGUOUS_IMDS_WAIT);
    let eth0 = eth0_described(&env, &cloud).await;
    // The state file says the process before this one changed the ENIs a moment ago: what the
    // startup's describe taught may predate that change, and is forgotten.
    cloud.changed_before_start(tokio::time::Instant::now());
    let again = eth0_described(&env, &cloud).await;
    assert_eq!(again, eth0);
    assert_eq!(
        describes_of_an_assign(&env, &cloud, &eth0).await,
        1,
        "neither the earlier describe nor one within the minute teaches eth0"
    );
}

#[tokio::test]
async fn a_describe_right_after_a_change_of_ours_teaches_nothing() {
    let env = start().await;
    let cloud = with_view(&env, AMBIGUOUS_IMDS_WAIT);
    // A change just ended: EC2's API is eventually consistent, so a describe sent within a few
    // seconds of it may not show it, and is not taken as what the ENIs hold.
    env.lifecycle(fast_lifecycle())
        .create_and_attach(1, 1)
        .await
        .unwrap();
    let eth0 = eth0_described(&env, &cloud).await;
    assert_eq!(
        describes_of_an_assign(&env, &cloud, &eth0).await,
        1,
        "eth0's first assign describes it itself"
    );
}

#[tokio::test]
async fn a_describe_a_change_of_ours_ran_during_teaches_nothing() {
    let env = start().await;
    let cloud = with_view(&env, AMBIGUOUS_IMDS_WAIT);
    // eth0 and its attachment from mockcloud's side: any describe of ours would teach eth0.
    let eth0: EniId = env.instance.primary_eni.parse().expect("ENI id");
    let attachment = env
        .mock
        .network_interfaces()
        .into_iter()
        .find(|e| e.id == env.instance.primary_eni)
        .and_then(|e| e.attachment)
        .expect("eth0 is attached")
        .id;
    // The describe is answered late; a change of ours runs meanwhile (any mutating call counts).
    env.mock
        .inject_fault(Fault::slow_reply(DESCRIBE, Duration::from_millis(200), 1));
    let describe = {
        let (cloud, env_instance) = (cloud.clone(), env.instance.instance_id.clone());
        tokio::spawn(async move {
            cloud
                .describe_enis(&EniFilter {
                    attached_to: Some(env_instance),
                    ..EniFilter::default()
                })
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    cloud
        .set_delete_on_termination(&eth0, &attachment)
        .await
        .unwrap();
    let seen = describe.await.unwrap().unwrap();
    assert!(seen.iter().any(|e| e.id == eth0));
    assert_eq!(
        describes_of_an_assign(&env, &cloud, &eth0).await,
        1,
        "eth0's first assign describes it itself"
    );
}

#[tokio::test]
async fn an_ambiguous_assign_is_settled_from_imds_without_a_describe() {
    let env = start().await;
    let cloud = with_view(&env, AMBIGUOUS_IMDS_WAIT);
    let lc = env.lifecycle(fast_lifecycle());
    let eni = lc.create_and_attach(1, 1).await.unwrap();
    // IMDS lags a little: read again until it shows the lost attempt's IPs.
    env.mock.set_imds_lag(Duration::from_millis(400));
    env.mock.reset_counters();

    // Performed, reply lost to the timeout.
    env.mock
        .inject_fault(Fault::slow_reply(ASSIGN, Duration::from_millis(800), 1));
    let before = ips_on(&env, &eni.id);
    let got = cloud.assign_ips(&eni.id, 3).await.unwrap();
    assert_eq!(got.len(), 3);
    assert_exactly_new(&env, &eni.id, &before, &got);
    let c = env.mock.counters();
    assert_eq!(c.calls(ASSIGN), 1, "assigned once");
    assert_eq!(c.calls(DESCRIBE), 0, "IMDS settled it");

    // Not performed (a hang that ends in a 500): IMDS shows nothing new for its bound, EC2 is
    // asked once, and the retry assigns exactly once.
    env.mock.reset_counters();
    env.mock
        .inject_fault(Fault::hang(ASSIGN, Duration::from_millis(10), 1));
    let before = ips_on(&env, &eni.id);
    let got = with_view(&env, Duration::from_millis(300))
        .assign_ips(&eni.id, 2)
        .await
        .unwrap();
    assert_eq!(got.len(), 2);
    assert_exactly_new(&env, &eni.id, &before, &got);
    let c = env.mock.counters();
    assert_eq!(c.calls(ASSIGN), 2, "the hung call and its retry");
    assert_eq!(c.calls(DESCRIBE), 1, "IMDS could not tell; EC2 did");
}

#[tokio::test]
async fn when_imds_lags_past_its_bound_ec2_settles_the_ambiguous_assign() {
    let env = start().await;
    let cloud = with_view(&env, Duration::from_millis(300));
    let lc = env.lifecycle(fast_lifecycle());
    let eni = lc.create_and_attach(1, 1).await.unwrap();
    env.mock.set_imds_lag(Duration::from_secs(30));
    env.mock.reset_counters();

    env.mock
        .inject_fault(Fault::slow_reply(ASSIGN, Duration::from_millis(800), 1));
    let before = ips_on(&env, &eni.id);
    let got = cloud.assign_ips(&eni.id, 2).await.unwrap();
    assert_eq!(got.len(), 2);
    assert_exactly_new(&env, &eni.id, &before, &got);
    let c = env.mock.counters();
    assert_eq!(c.calls(ASSIGN), 1, "assigned once");
    assert_eq!(c.calls(DESCRIBE), 1, "EC2 asked once, after IMDS's bound");

    // The next assign knows the ENI again: one call, no describe.
    env.mock.reset_counters();
    let before = ips_on(&env, &eni.id);
    let got = cloud.assign_ips(&eni.id, 1).await.unwrap();
    assert_exactly_new(&env, &eni.id, &before, &got);
    assert_eq!(env.mock.counters().calls(DESCRIBE), 0);
}

/// A client without IMDS (as before this change) still settles from EC2.
#[tokio::test]
async fn without_an_instance_view_ec2_settles_the_ambiguous_assign() {
    let env = start().await;
    let cloud: Arc<Ec2Cloud> = env.cloud.clone();
    let lc = env.lifecycle(fast_lifecycle());
    let eni = lc.create_and_attach(1, 1).await.unwrap();
    env.mock.reset_counters();
    env.mock
        .inject_fault(Fault::slow_reply(ASSIGN, Duration::from_millis(800), 1));
    let before = ips_on(&env, &eni.id);
    let got = cloud.assign_ips(&eni.id, 2).await.unwrap();
    assert_exactly_new(&env, &eni.id, &before, &got);
    let c = env.mock.counters();
    assert_eq!((c.calls(ASSIGN), c.calls(DESCRIBE)), (1, 1));
}
