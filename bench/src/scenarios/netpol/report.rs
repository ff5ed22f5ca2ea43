//! The `netpol` scenario's report: its rows, verdicts, series and notes from what was measured
//! (`Measured`, `Traffic`) on the cluster (`World`).

use crate::report::{Anchor, Row, ScenarioReport, Series, Target, Unit};
use crate::stats::percentile;

use super::cluster::World;
use super::{
    CHANGES, CONNECTIONS_TARGET, Measured, Steps, TARGET_MS, TRAFFIC_ROUNDS, TRAFFIC_SECS, Traffic,
};

fn median(xs: &[f64]) -> f64 {
    crate::stats::median(xs).unwrap_or(0.0)
}

pub(super) fn report(world: &World, m: &Measured, t: &Traffic) -> ScenarioReport {
    let none = || Anchor::None("no published figure (see notes)".into());
    let mut rows = Vec::new();
    let mut series = Vec::new();
    let mut verdicts = Vec::new();
    for k in &m.kinds {
        let total: Vec<f64> = k.steps.iter().map(Steps::total).collect();
        let p = |xs: &[f64], q| percentile(xs, q).unwrap_or(0.0);
        let p99 = p(&total, 99.0);
        rows.push(
            Row::single(
                format!("{}: change → in force, p50", k.name),
                Unit::Ms,
                p(&total, 50.0),
            )
            .anchor(none()),
        );
        rows.push(
            Row::single(format!("{}: change → in force, p99", k.name), Unit::Ms, p99)
                .anchor(none())
                .target(Target::AtMost(TARGET_MS)),
        );
        let part = |f: fn(&Steps) -> f64| k.steps.iter().map(f).collect::<Vec<f64>>();
        for (label, xs) in [
            ("API server → watch", part(|s| s.watch)),
            ("cluster copied out of the watch", part(|s| s.snapshot)),
            ("compile", part(|s| s.compile)),
            ("render", part(|s| s.render)),
            ("diff + nft load", part(|s| s.load)),
        ] {
            rows.push(Row::single(
                format!(
                    "{}: {label}, p50 (p99 {})",
                    k.name,
                    Unit::Ms.format(p(&xs, 99.0))
                ),
                Unit::Ms,
                p(&xs, 50.0),
            ));
        }
        verdicts.push(format!(
            "{}: p99 {} — {}",
            k.name,
            Unit::Ms.format(p99),
            if p99 <= TARGET_MS { "PASS" } else { "MISS" }
        ));
        series.push(Series {
            label: k.name.into(),
            samples: total,
        });
    }
    for (part, value) in [
        ("cluster copied out of the watch", m.first.snapshot),
        ("compile", m.first.compile),
        ("render", m.first.render),
        ("nft load", m.first.load),
        ("total", m.first.total),
    ] {
        rows.push(Row::single(
            format!("first load, whole table: {part}"),
            Unit::Ms,
            value,
        ));
    }
    rows.push(Row::single(
        "rules (all chains)",
        Unit::Count,
        m.rules as f64,
    ));
    rows.push(Row::single(
        "set elements (all sets)",
        Unit::Count,
        m.elements as f64,
    ));
    rows.push(Row::single(
        "whole-table script, KiB",
        Unit::Count,
        m.script.len() as f64 / 1024.0,
    ));
    rows.push(Row::single(
        "kernel's table as `nft list` prints it, KiB",
        Unit::Count,
        m.listing_bytes as f64 / 1024.0,
    ));
    rows.push(Row::single(
        "resident set grown by the compiled state",
        Unit::MiB,
        m.rss_delta_mib,
    ));
    // A packet's cost: each figure on the bare node and with kube-proxy's tables, then with
    // eniipam's table too, against kube-proxy's as its anchor (the target's comparison).
    let mut three_sides = |what: &str, suffix: &str, unit: Unit, bare: f64, off: f64, on: f64| {
        rows.push(Row::single(
            format!("{what}, bare node (no conntrack){suffix}"),
            unit,
            bare,
        ));
        rows.push(Row::single(
            format!("{what}, kube-proxy's tables (isolation off){suffix}"),
            unit,
            off,
        ));
        rows.push(
            Row::single(
                format!("{what}, kube-proxy's + eniipam's table (isolation on){suffix}"),
                unit,
                on,
            )
            .anchor(Anchor::Measured {
                name: "isolation off".into(),
                value: off,
            }),
        );
    };
    let gbit = |xs: &[f64]| median(xs) * 8e-9;
    let (bare, off, on) = (gbit(&t.bytes_bare), gbit(&t.bytes_off), gbit(&t.bytes_on));
    three_sides("TCP throughput", ", Gbit/s", Unit::Ratio, bare, off, on);
    let (cbare, coff, con) = (
        median(&t.conns_bare),
        median(&t.conns_off),
        median(&t.conns_on),
    );
    three_sides("new TCP connections", "", Unit::PerSec, cbare, coff, con);
    for (name, conns) in &t.designs {
        rows.push(
            Row::single(
                format!("new TCP connections, least table of design \"{name}\" (isolation on)"),
                Unit::PerSec,
                median(conns),
            )
            .anchor(Anchor::Measured {
                name: "isolation off".into(),
                value: coff,
            }),
        );
    }
    let pass = m.kinds.iter().all(|k| {
        percentile(&k.steps.iter().map(Steps::total).collect::<Vec<_>>(), 99.0).unwrap_or(f64::MAX)
            <= TARGET_MS
    });
    let mut notes = vec![
        format!(
            "Issue 28's target, p99 ≤ 1 s from a change to rules in force: {}. {}.",
            if pass { "PASS" } else { "MISS" },
            verdicts.join("; ")
        ),
        "Anchor: no figure found. shared/reference/ (the VPC CNI, terway and Cilium notes) publishes none for policy \
         enforcement latency, rule counts or per-packet cost; the VPC CNI's network policy agent (eBPF), Calico and \
         Cilium publish none comparable either, so every row stands alone."
            .into(),
        format!(
            "Each change is timed from its write to the API-server double (which holds every object of the \
             cluster) to `nft` returning, on the daemon's path: kube-rs's list+watch into the daemon's \
             `ClusterWatch`, then one `enforce::Engine::sync_watched` as the daemon's sync task runs it (the \
             cluster copied out of the watch, compile_all over the {} local pods, render, update_script against \
             what is loaded, `nft -f` of the difference in one transaction), from threads in the node's network \
             namespace. The double runs in the same process, on the same two cores. Every timed change of the \
             first four kinds was an in-place update (checked). The node's pods are the scenario's list where \
             the daemon reads its pool (a lock and a copy of ~110 entries).",
            world.local.len()
        ),
        format!(
            "Packet cost: {} rounds of {TRAFFIC_SECS} s each side, the three sides in turn; medians. Isolation off \
             is the node as kube-proxy leaves every Kubernetes node (its nftables mode's tables: nat chains, the \
             Services' verdict map, `ct state invalid` dropped), so conntrack is on as on any node; isolation on \
             adds eniipam's table with the server pod isolated and its client allowed (issue 47's target, ≥ ×0.95, \
             compares these two). The bare node (no table, no conntrack) shows what conntrack itself costs. The \
             server's `allowed` counter counted {} new connections during the rounds with the table (the \
             connections went through its chain).",
            TRAFFIC_ROUNDS, t.counted_allowed
        ),
        "Memory: the kernel's memory for one table cannot be read from user space; its size is given as `nft list` \
         prints it. The resident-set figure is this process's growth over the first compile and render (allocator \
         reuse can make it an underestimate)."
            .into(),
    ];
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
    let met = ratio(con, coff) >= CONNECTIONS_TARGET;
    notes.push(
        "Designs: each least table (bench/src/scenarios/netpol/designs.rs) holds only what its shape needs for \
         the two bench pods (one-element sets, no counters, no logs), so its figure is the floor of that shape: \
         `raw source check` is eniipam's shape (a pod's source checked before conntrack), `source check in \
         forward` moves the check after conntrack (a spoofed packet can then refresh or close another pod's \
         connection entry before it is dropped), `no source check` is forward judging alone (case 2's hole)."
            .into(),
    );
    notes.push(format!(
        "Isolation off → on: throughput {off:.2} → {on:.2} Gbit/s (×{:.2}); new connections {coff:.0} → {con:.0}/s \
         (×{:.2}, target ≥ ×{CONNECTIONS_TARGET}: {}). Bare node → isolation on: ×{:.2} and ×{:.2}.",
        ratio(on, off),
        ratio(con, coff),
        if met { "PASS" } else { "MISS" },
        ratio(on, bare),
        ratio(con, cbare)
    ));
    ScenarioReport {
        id: "netpol",
        title: format!(
            "NetworkPolicy at scale: {} pods, {} policies, {} local pods",
            world.cluster.pods.len(),
            world.cluster.policies.len(),
            world.local.len()
        ),
        reproduce: "cargo run --release -p eniipam-bench -- netpol".into(),
        setup: vec![
            "50 namespaces of 100 pods, 20 policies each in five shapes (see bench/src/scenarios/netpol/cluster.rs); \
             peer sets as large as the pods they name (addresses never merge into ranges)"
                .into(),
            format!(
                "{CHANGES} changes of each kind, each timed from its write to the API-server double to `nft` returning"
            ),
        ],
        rows,
        notes,
        plot_unit: "ms from a change to rules in force",
        series,
    }
}
