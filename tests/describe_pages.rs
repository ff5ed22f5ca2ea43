//! Issue 46, item 4: describes that do not scale with the account. EC2 narrows a
//! DescribeNetworkInterfaces before it pages only by ids and a few indexed filters (`vpc-id`,
//! `subnet-id`, addresses); `attachment.instance-id` it applies to each page of 1,000 after, and
//! mockcloud does the same. In a region holding thousands of other nodes' ENIs, the daemon's start
//! and a running reconcile pass must cost a few describe calls, not one per 1,000 ENIs of the
//! region; and the start skips DescribeInstanceTypes for a type the shipped catalogue knows.

#[path = "daemon_support/mod.rs"]
mod daemon_support;

use std::collections::BTreeMap;
use std::time::Duration;

use aws_sdk_ec2::config::Credentials;
use daemon_support::*;
use eniipam::cloud::{EniFilter, tags};
use eniipam::config::DaemonConfig;
use eniipam::daemon::CloudClients;
use mockcloud::world::CreateEniArgs;
use mockcloud::{Config, MockCloud};

/// Other nodes' ENIs: in the node's VPC (another subnet) and in another VPC.
const IN_VPC: usize = 3000;
const ELSEWHERE: usize = 3000;
const DNI: &str = "DescribeNetworkInterfaces";

/// The default world (an m5.large in 10.0.0.0/20 of 10.0.0.0/16) and 6,000 other ENIs around it.
async fn crowded_region() -> MockCloud {
    let mock = MockCloud::start(Config::fast()).await.unwrap();
    let d = mock.default_world().unwrap();
    let others = mock
        .create_subnet(&d.vpc_id, "10.0.16.0/20".parse().unwrap(), "us-east-1a")
        .unwrap();
    let (vpc_b, _) = mock.create_vpc("10.60.0.0/16".parse().unwrap()).unwrap();
    let elsewhere = mock
        .create_subnet(&vpc_b, "10.60.16.0/20".parse().unwrap(), "us-east-1a")
        .unwrap();
    mock.create_enis_directly(&others, IN_VPC).unwrap();
    mock.create_enis_directly(&elsewhere, ELSEWHERE).unwrap();
    mock
}

fn quiet_config(mock: &MockCloud, dir: &std::path::Path) -> DaemonConfig {
    DaemonConfig {
        // The leaked-ENI collector's first run is at a random point of its period: not in the
        // windows these tests count.
        leaked_eni_period_secs: 30 * 24 * 3600,
        ..config(mock, dir)
    }
}

fn calls(mock: &MockCloud, action: &str) -> u64 {
    mock.counters().calls(action)
}

/// The pages a describe by the instance filter alone (what every filtered describe was before)
/// costs in this region: one per 1,000 ENIs.
fn region_pages(mock: &MockCloud) -> u64 {
    mock.network_interfaces().len().div_ceil(1000) as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_and_a_reconcile_pass_cost_a_few_describe_calls_in_a_crowded_region() {
    let mock = crowded_region().await;
    let dir = TempDir::new("describe-pages");
    let cfg = quiet_config(&mock, &dir.0);
    let inst = mock.default_instance();
    let region = region_pages(&mock);
    assert_eq!(region, 7, "6,001 ENIs in the region");

    // Before: a describe by the instance filter alone walks the region.
    let clients =
        CloudClients::from_config(&cfg, Some(Credentials::new("a", "b", None, None, "test")))
            .await
            .unwrap();
    mock.reset_counters();
    let enis = clients
        .cloud
        .describe_enis(&EniFilter {
            attached_to: Some(inst.instance_id.clone()),
            ..EniFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(enis.len(), 1);
    assert_eq!(
        calls(&mock, DNI),
        region,
        "one call per 1,000 ENIs of the region"
    );
    start(cfg.clone()).await.shutdown().await;

    // A start (the state file there): one DescribeInstances (the node's discovery, whose answer
    // the rebuild reads too) and describes by ids, whatever the region holds; no
    // DescribeInstanceTypes (m5.large is in the catalogue).
    mock.reset_counters();
    let d = start(cfg.clone()).await;
    let (start_dni, start_di, start_dit) = (
        calls(&mock, DNI),
        calls(&mock, "DescribeInstances"),
        calls(&mock, "DescribeInstanceTypes"),
    );

    // A running reconcile pass: one describe, by the ids IMDS and the pool know.
    mock.reset_counters();
    let pass = d.reconcile_now().await.unwrap();
    let (pass_dni, pass_di) = (calls(&mock, DNI), calls(&mock, "DescribeInstances"));
    println!(
        "region of {} ENIs: a describe by the instance filter alone {region} pages; a start \
         {start_dni} DescribeNetworkInterfaces + {start_di} DescribeInstances + {start_dit} \
         DescribeInstanceTypes; a reconcile pass {pass_dni} DescribeNetworkInterfaces + {pass_di} \
         DescribeInstances",
        mock.network_interfaces().len()
    );
    assert_eq!(start_dit, 0, "m5.large is in the catalogue");
    assert!(start_dni <= 2, "a start costs {start_dni} describe calls");
    assert_eq!(start_di, 1, "a start costs {start_di} DescribeInstances");
    assert!(pass.forgotten_enis.is_empty() && pass.suspended_enis.is_empty());
    assert_eq!(pass_dni, 1, "a pass costs one describe call");
    assert_eq!(pass_di, 0);
    d.shutdown().await;
}

/// An ENI of ours attached to the node just before a crash: in neither the state file nor IMDS
/// (which lags), but DescribeInstances lists it, so the rebuild keeps it (and its addresses), in a
/// few calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rebuild_finds_an_eni_attached_that_imds_does_not_list_yet() {
    let mock = crowded_region().await;
    let dir = TempDir::new("describe-imds-lag");
    let cfg = quiet_config(&mock, &dir.0);
    let inst = mock.default_instance();
    let d = start(cfg.clone()).await;
    d.shutdown().await;

    mock.set_imds_lag(Duration::from_secs(3600));
    let d0 = mock.default_world().unwrap();
    let eni = mock.with_world(|w, now| {
        let args = CreateEniArgs {
            subnet_id: d0.subnet_id.clone(),
            secondary_count: 3,
            tags: BTreeMap::from([
                (tags::OWNER.to_owned(), tags::OWNER_VALUE.to_owned()),
                (tags::CLUSTER.to_owned(), CLUSTER.to_owned()),
                (tags::INSTANCE_ID.to_owned(), inst.instance_id.clone()),
            ]),
            ..CreateEniArgs::default()
        };
        let id = w.create_network_interface_directly(&args, now).unwrap();
        w.attach_network_interface(&id, &inst.instance_id, 1, now)
            .unwrap();
        id
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let imds = mock.imds_view(&inst.instance_id).unwrap();
    assert!(
        !imds.interfaces.iter().any(|i| i.eni_id == eni),
        "IMDS lags the attach"
    );

    mock.reset_counters();
    let d = start(cfg.clone()).await;
    assert_eq!(
        d.report.enis, 2,
        "eth0 and the ENI attached before the crash"
    );
    assert!(
        d.pool.snapshot().enis.iter().any(|e| e.id.as_str() == eni),
        "the pool keeps {eni}"
    );
    assert!(
        calls(&mock, DNI) <= 3,
        "{} describe calls",
        calls(&mock, DNI)
    );
    d.shutdown().await;
}
