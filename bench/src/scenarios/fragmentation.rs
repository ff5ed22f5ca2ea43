//! Scenario `fragmentation`: how many whole `/28`s a subnet keeps for prefixes after a long churn of
//! single-address assigns and unassigns — EC2's own picks (what the VPC CNI and Cilium's fallback
//! ask for) against eniipam's packing (`pool::slots::pack_in_subnet` + assign by address). Both
//! run the same seeded workload through the real EC2 client on mockcloud, whose automatic picks are
//! spread over the subnet at random as EC2's are.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use anyhow::Context;
use eniipam::cloud::{CreateEni, EniFilter};
use eniipam::model::EniId;
use eniipam::pool::slots::{free_blocks, pack_in_subnet};
use ipnet::Ipv4Net;

use crate::Ctx;
use crate::report::{Anchor, Row, ScenarioReport, Target, Unit};
use crate::stats::AcrossRuns;
use crate::support::{self, TempDir};

/// A /22: 64 blocks of 16.
const SUBNET: &str = "10.0.64.0/22";
const ENIS: usize = 12;
const STEPS: usize = 1500;
/// Addresses the workload keeps held on average (about half the subnet).
const TARGET_HELD: usize = 480;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Policy {
    Ec2Picks,
    Packed,
}

/// A small deterministic generator (xorshift64*), the same sequence for both policies.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

struct Outcome {
    free_blocks: usize,
    held: usize,
    calls: usize,
}

async fn one_run(policy: Policy, seed: u64) -> anyhow::Result<Outcome> {
    let dir = TempDir::new("fragmentation")?;
    let mock = support::mock("m5.24xlarge", false).await?;
    let inst = mock.default_instance();
    let cidr: Ipv4Net = SUBNET.parse().expect("literal");
    let subnet_id = mock
        .with_world(|w, _| w.create_subnet(&inst.vpc_id, cidr, &inst.availability_zone))
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let mut config = support::daemon_config(&mock, &dir.0);
    config.ec2_mutating_qps = 1000.0;
    config.ec2_mutating_burst = 1000;
    config.ec2_describe_qps = 1000.0;
    config.ec2_describe_burst = 1000;
    let clients = support::clients(&config).await?;
    let cloud = clients.cloud;
    let subnet = cloud.describe_subnet(&subnet_id).await?;
    let mut enis: Vec<EniId> = Vec::new();
    for i in 0..ENIS {
        let eni = cloud
            .create_eni(&CreateEni {
                subnet_id: subnet_id.clone(),
                security_groups: inst.security_groups.clone(),
                description: format!("fragmentation bench {i}"),
                secondary_ip_count: 0,
                prefix_count: 0,
                private_ips: Vec::new(),
                tags: Default::default(),
                client_token: format!("frag-{seed}-{i}-{policy:?}"),
                live_ip_count: None,
            })
            .await?;
        enis.push(eni.id);
    }
    let mut rng = Rng(seed | 1);
    let mut held: Vec<(usize, Ipv4Addr)> = Vec::new();
    let mut calls = 0;
    for _ in 0..STEPS {
        let grow =
            held.len() < TARGET_HELD / 2 || (held.len() < TARGET_HELD && rng.below(100) < 55);
        if grow {
            let e = rng.below(ENIS);
            let n = 1 + rng.below(4) as u32;
            let on_eni = held.iter().filter(|(i, _)| *i == e).count();
            if on_eni + n as usize > 45 {
                continue;
            }
            let got = match policy {
                Policy::Ec2Picks => cloud.assign_ips(&enis[e], n).await?,
                Policy::Packed => {
                    let picked =
                        pack_in_subnet(cloud.as_ref(), &subnet, n, &BTreeSet::new()).await?;
                    calls += 1; // the describe behind the packing
                    cloud.assign_specific_ips(&enis[e], &picked).await?
                }
            };
            calls += 1;
            held.extend(got.into_iter().map(|ip| (e, ip)));
        } else if !held.is_empty() {
            let (e, ip) = held.swap_remove(rng.below(held.len()));
            cloud.unassign_ips(&enis[e], &[ip]).await?;
            calls += 1;
        }
    }
    let used: BTreeSet<Ipv4Addr> = cloud
        .describe_enis(&EniFilter {
            subnet_id: Some(subnet_id.clone()),
            ..EniFilter::default()
        })
        .await?
        .iter()
        .flat_map(|e| std::iter::once(e.primary_ip).chain(e.pod_addresses()))
        .collect();
    Ok(Outcome {
        free_blocks: free_blocks(cidr, &used, &[]),
        held: held.len(),
        calls,
    })
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<ScenarioReport> {
    let mut ec2 = Vec::new();
    let mut packed = Vec::new();
    for r in 0..ctx.runs {
        let seed = 0x5eed_0000 + r as u64;
        let a = one_run(Policy::Ec2Picks, seed).await?;
        let b = one_run(Policy::Packed, seed).await?;
        eprintln!(
            "fragmentation: run {}/{}: free /28s after churn: EC2's picks {} ({} held, {} calls), packed {} ({} held, {} calls)",
            r + 1,
            ctx.runs,
            a.free_blocks,
            a.held,
            a.calls,
            b.free_blocks,
            b.held,
            b.calls
        );
        ec2.push(a);
        packed.push(b);
    }
    let of = |v: &[Outcome]| {
        AcrossRuns::of(&v.iter().map(|o| o.free_blocks as f64).collect::<Vec<_>>())
            .context("no runs")
    };
    let ec2_blocks = of(&ec2)?;
    let packed_blocks = of(&packed)?;
    let ratio = packed_blocks.median / ec2_blocks.median.max(1.0);
    let rows = vec![
        Row::new(
            "free /28 blocks left for prefixes",
            Unit::Count,
            packed_blocks,
        )
        .anchor(Anchor::Measured {
            name: "EC2's own picks (VPC CNI, Cilium fallback)".into(),
            value: ec2_blocks.median,
        })
        .target(Target::Info),
        Row::single("  packed / EC2's picks (free /28s)", Unit::Ratio, ratio)
            .target(Target::AtLeast(2.0)),
    ];
    Ok(ScenarioReport {
        id: "fragmentation",
        title: "whole /28s kept free under single-address churn".into(),
        reproduce: format!("cargo run --release -p eniipam-bench -- fragmentation --runs {}", ctx.runs),
        setup: vec![
            format!(
                "a {SUBNET} subnet (64 blocks), {ENIS} ENIs, {STEPS} steps of 1-4-address assigns \
                 and single unassigns around {TARGET_HELD} held, the same seeded sequence for both"
            ),
            "EC2's picks: AssignPrivateIpAddresses by count (mockcloud spreads them at random, as EC2 \
             does); packed: eniipam's pack_in_subnet then AssignPrivateIpAddresses by address"
                .into(),
        ],
        rows,
        notes: vec![
            "Packing costs one DescribeNetworkInterfaces of the subnet per assign; eniipam packs only \
             while the subnet has no free /28 for a prefix."
                .into(),
        ],
        plot_unit: "",
        series: Vec::new(),
    })
}
