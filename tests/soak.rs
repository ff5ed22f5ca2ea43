//! Issue 13's fault soak, short version (about a minute): the real `eniipamd` binary against
//! an in-process mockcloud, the real `eniipam` plugin (IPAM role) doing ADD/DEL/GC churn on two
//! networks from a fake runtime, every fault kind of the schedule injected at least once (SIGKILLs,
//! EC2 errors, hangs and slow replies, throttling, IMDS lag, out-of-band unassign and detach, the state
//! file removed, a full disk, hidden network namespaces, pods dying without a DEL, an IAM policy edit
//! revoking one action), with mockcloud enforcing the shipped IAM policy throughout, and the invariant
//! checker after every step. Fails on any violation, printing each with its seed and step.
//!
//! The soak itself lives in the benchmark program (`bench/src/soak/`, `eniipam-bench soak --minutes
//! 30` for the long run) and is included here by path rather than through a shared crate: it is test
//! support with one other user, and a crate would be a workspace member for a few hundred lines. It
//! names only crates this package has as dependencies or dev-dependencies.
//!
//! Run three times (issue 26): `ip_family` ipv4, ipv6 and dual. In the IPv6 modes the checker adds the
//! /80's invariants (one /80 in the node's life, on eth0 in EC2 and in the state file; no IPv6 on two
//! attachments and none ever handed to a second one; every live pod's IPv6 inside the /80 and held;
//! the state file's IPv6 rows against the daemon; in dual both families or neither), and the faults
//! that do not apply are left out: the out-of-band unassign and detach take secondary IPv4s and ENIs,
//! which an ipv6 node does not have.
//!
//! Run a fourth time in the network-profiles mode (issue 27, IPv4): custom networking with the node's
//! ENIConfig switched every few steps, profiles `db` and `app` from an API-server double, pods of
//! both and of the default network; the checker adds the profiles' invariants (every IP on an ENI of
//! its pod's network with exactly its groups, eth0 serving none, no IP ever crossing networks,
//! refusals only as CNI error 11 naming the profile, both profiles advertised on the node).
//!
//! Needs root (it mounts tmpfs and creates network namespaces) and the plugin binary built next to
//! the test executable (`cargo build --workspace --bins`; `cargo test --workspace` does it).

#[path = "bins/mod.rs"]
mod bins;

// The benchmark program reads the parts of the soak's report this test does not.
#[allow(dead_code)]
#[path = "../bench/src/soak/mod.rs"]
mod soak;

use std::path::PathBuf;

use soak::faults::FaultKind;

/// The schedule this test runs: any seed works; in this one the out-of-band detach, the lost state
/// file with hidden evidence and the full disk each get room to show their consequences.
const SEED: u64 = 8;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_soak_keeps_every_invariant() {
    fault_soak(soak::IpFamily::Ipv4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_soak_keeps_every_invariant_ipv6() {
    fault_soak(soak::IpFamily::Ipv6).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_soak_keeps_every_invariant_dual_stack() {
    fault_soak(soak::IpFamily::Dual).await;
}

/// One soak at a time: each is timed against its own daemon's reconcile and the plugin's deadlines,
/// and three at once on a small machine would soak the machine instead.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn fault_soak(family: soak::IpFamily) {
    let _turn = ONE_AT_A_TIME.lock().await;
    let enabled: std::collections::BTreeSet<FaultKind> = FaultKind::ALL
        .into_iter()
        .filter(|k| k.applies(family))
        .collect();
    // Every scheduled kind once, then a dozen steps for the last ones' consequences to show (in the
    // IPv6 modes, more if the seed's schedule has fewer than two SIGKILLs by then: they are what a
    // durable /80 cursor and both-families records are about).
    let mut steps = soak::faults::first_cycle_steps(&enabled) + 12;
    let kills_by = |n: u64| {
        (0..n)
            .filter(|s| soak::faults::planned(SEED, *s, &enabled).contains(&FaultKind::Kill))
            .count()
    };
    while family != soak::IpFamily::Ipv4 && kills_by(steps) < 2 {
        steps += 1;
    }
    let mut cfg = soak::SoakConfig::new(
        SEED,
        soak::Budget::Steps(steps),
        PathBuf::from(env!("CARGO_BIN_EXE_eniipamd")),
        bins::target_bin("eniipam"),
    );
    cfg.ip_family = family;
    cfg.faults = enabled.clone();
    cfg.progress = true;
    let out = soak::run(cfg).await.expect("the soak ran");
    let summary = out.summary(5);
    println!("{summary}");

    // The soak did what it says.
    let c = &out.counts;
    for k in &enabled {
        assert!(
            c.faults.get(k.name()).copied().unwrap_or(0) > 0,
            "fault {k} was never injected\n{summary}"
        );
    }
    assert!(c.kills >= 2, "few SIGKILLs\n{summary}");
    assert!(
        c.adds_ok >= 50 && c.dels_ok >= 30,
        "little churn\n{summary}"
    );
    assert!(c.gcs_ok >= 3, "few GCs\n{summary}");
    assert!(
        c.iam_revocations >= 1,
        "the IAM policy was never edited\n{summary}"
    );
    assert!(c.checks >= steps / 2, "few checks\n{summary}");
    if family != soak::IpFamily::Ipv4 {
        assert!(
            c.distinct_ipv6 as u64 >= c.adds_ok,
            "every ADD gave a new IPv6\n{summary}"
        );
    }

    assert!(
        out.violations.is_empty(),
        "{} invariant violations (seed {SEED}; reproduce the long way with \
         `cargo run --release -p eniipam-bench -- soak --soak-steps {steps} --seed {SEED} --ip-family {family}`):\n{summary}",
        out.violations.len()
    );
}

/// Issue 27: the soak with custom networking, two network profiles and ENIConfig changes
/// (`eniipam-bench soak --network-profiles`, IPv4): every fault of the schedule, pods of `db`,
/// `app` and the default network put in the API-server double before their ADD, and the profiles'
/// invariants (each IP on an ENI of its pod's network with exactly its groups, eth0 serving none,
/// no IP ever crossing networks, refusals only as error 11 naming the profile) after every step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_soak_keeps_every_invariant_with_network_profiles() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let enabled: std::collections::BTreeSet<FaultKind> = FaultKind::ALL
        .into_iter()
        .filter(|k| k.applies(soak::IpFamily::Ipv4))
        .collect();
    // Every scheduled kind once, and room for the ENIConfig to change a few times.
    let steps =
        (soak::faults::first_cycle_steps(&enabled) + 12).max(soak::profiles::SWITCH_EVERY * 4 + 1);
    let cfg = soak::SoakConfig::new(
        SEED,
        soak::Budget::Steps(steps),
        PathBuf::from(env!("CARGO_BIN_EXE_eniipamd")),
        bins::target_bin("eniipam"),
    )
    .with_network_profiles();
    let cfg = soak::SoakConfig {
        faults: enabled.clone(),
        progress: true,
        ..cfg
    };
    let out = soak::run(cfg).await.expect("the soak ran");
    let summary = out.summary(5);
    println!("{summary}");

    let c = &out.counts;
    for k in &enabled {
        assert!(
            c.faults.get(k.name()).copied().unwrap_or(0) > 0,
            "fault {k} was never injected\n{summary}"
        );
    }
    assert!(
        c.adds_ok >= 50 && c.dels_ok >= 30,
        "little churn\n{summary}"
    );
    assert!(c.kills >= 2, "few SIGKILLs\n{summary}");
    assert!(
        c.eniconfig_switches >= 4,
        "few ENIConfig changes\n{summary}"
    );
    // Pods of each profile were placed, not only refused, and so were default-network pods.
    for net in ["db", "app", "default"] {
        assert!(
            c.network_adds_ok.get(net).copied().unwrap_or(0) >= 10,
            "few {net} pods placed: {:?}\n{summary}",
            c.network_adds_ok
        );
        assert!(
            c.network_enis.get(net).copied().unwrap_or(0) >= 1,
            "no ENI of {net} seen: {:?}\n{summary}",
            c.network_enis
        );
    }
    // Pods naming a profile no NetworkProfile defines were refused, each with error 11 naming it.
    assert!(
        c.profile_refusals
            .get(soak::profiles::MISSING)
            .copied()
            .unwrap_or(0)
            >= 1,
        "no refusal of a missing profile: {:?}\n{summary}",
        c.profile_refusals
    );
    assert!(c.checks >= steps / 2, "few checks\n{summary}");
    assert!(
        out.violations.is_empty(),
        "{} invariant violations (seed {SEED}; reproduce the long way with \
         `cargo run --release -p eniipam-bench -- soak --soak-steps {steps} --seed {SEED} --network-profiles`):\n{summary}",
        out.violations.len()
    );
}
