//! Pods per node against the AWS VPC CNI, for every instance type mockcloud knows, with the limits read
//! through the real EC2 client (DescribeInstanceTypes: ENIs of the default network card, IPv4 per
//! ENI, vCPUs, hypervisor):
//!
//! - secondary IPs (`burst_prefixes` off, eth0 serving pods): exactly the VPC CNI's max-pods − 2
//!   (its +2 are host-network pods, which take no pod IP);
//! - burst prefixes (the default): on Nitro types every slot counts as a `/28` (16 × the above),
//!   elsewhere the same as secondary IPs;
//! - prefix delegation, on Nitro types: at least the VPC CNI's prefix max-pods − 2 (capped at 110,
//!   250 above 30 vCPUs);
//! - without eth0 (`use_primary_eni = false`): one ENI's worth fewer.

#[path = "cloud_support/mod.rs"]
mod cloud_support;

use cloud_support::Env;
use eniipam::cloud::Cloud;
use eniipam::pool::{PoolConfig, node_capacity};
use mockcloud::catalog::CATALOG;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capacity_matches_the_vpc_cni_for_every_type() {
    let env = Env::start().await;
    let secondary = PoolConfig {
        burst_prefixes: false,
        ..PoolConfig::default()
    };
    let shipped = PoolConfig::default();
    assert!(shipped.burst_prefixes, "burst prefixes are shipped");
    let prefixes = PoolConfig {
        prefix_delegation: true,
        ..PoolConfig::default()
    };
    let no_eth0 = PoolConfig {
        use_primary_eni: false,
        ..secondary.clone()
    };
    let mut lines = Vec::new();
    for t in CATALOG {
        let limits = env
            .cloud
            .instance_limits(t.name)
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", t.name));
        assert_eq!(limits.max_enis, t.default_card_max_enis(), "{}", t.name);
        assert_eq!(limits.nitro, t.is_nitro(), "{}", t.name);
        assert_eq!(limits.vcpus, t.vcpus, "{}", t.name);

        let vpc_cni = t.max_pods();
        let ours = node_capacity(limits, &secondary, 0);
        assert_eq!(ours + 2, vpc_cni, "{}: secondary IPs", t.name);
        let per_slot = if t.is_nitro() { 16 } else { 1 };
        assert_eq!(
            node_capacity(limits, &shipped, 0),
            ours * per_slot,
            "{}: burst prefixes count each slot as a /28 on Nitro types only",
            t.name
        );
        let without_eth0 = node_capacity(limits, &no_eth0, 0);
        assert_eq!(
            without_eth0 + t.ipv4_per_eni - 1,
            ours,
            "{}: one ENI fewer",
            t.name
        );

        if t.is_nitro() {
            let cap = if t.vcpus > 30 { 250 } else { 110 };
            let vpc_cni_pd = (t.default_card_max_enis() * (t.ipv4_per_eni - 1) * 16 + 2).min(cap);
            let ours_pd = node_capacity(limits, &prefixes, 0);
            assert!(
                ours_pd + 2 >= vpc_cni_pd,
                "{}: prefixes {ours_pd} < VPC CNI {vpc_cni_pd} - 2",
                t.name
            );
            assert_eq!(ours_pd % 16, 0, "{}: whole prefixes", t.name);
            lines.push(format!(
                "{:<16} secondary {ours:>4} (VPC CNI {vpc_cni:>4})  prefixes {ours_pd:>5} (VPC CNI {vpc_cni_pd:>3})",
                t.name
            ));
        } else {
            lines.push(format!(
                "{:<16} secondary {ours:>4} (VPC CNI {vpc_cni:>4})  prefixes: not Nitro",
                t.name
            ));
        }
    }
    println!("{}", lines.join("\n"));
}
