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
//! Both growth structures are soaked: the IPv4 soak runs on a Xen m4.xlarge (single secondary IPs,
//! as every non-Nitro type keeps), the dual-stack one on a Nitro c5.xlarge with the shipped burst
//! prefixes (bursts take whole `/28`s on eth0, whose slots then hold every pod, so there is no
//! secondary ENI to detach there; the out-of-band unassign takes a `/28` whole).
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

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::OnceLock;

use soak::faults::FaultKind;

/// The schedule this test runs: any seed works; in this one the out-of-band detach, the lost state
/// file with hidden evidence and the full disk each get room to show their consequences.
const SEED: u64 = 8;

/// The four soaks of this file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Mode {
    Ipv4,
    Ipv6,
    Dual,
    Profiles,
}

const MODES: [Mode; 4] = [Mode::Ipv4, Mode::Ipv6, Mode::Dual, Mode::Profiles];

/// One soak's run: what it was told and what came of it.
struct Ran {
    steps: u64,
    /// The daemon's log, kept.
    log: PathBuf,
    enabled: BTreeSet<FaultKind>,
    out: soak::SoakOutcome,
}

/// The four soaks run side by side (issue 45): each is a real `eniipamd` process, the real plugin
/// and its own mockcloud, mostly waiting on the real time its faults and grace periods take (a
/// tenth of a core each), so together they take about as long as the longest alone rather than
/// the sum. Each has its own node (tmpfs, namespaces, socket) and daemon, and its own thread and
/// runtime, as each had as a test of its own: a soak's checks read the state file in place, and one
/// soak's blocking reads must not stall another's mockcloud. The first test to ask starts all four,
/// and each test then judges its own; a filtered run of one test therefore runs all four, in about
/// the same time.
static RUNS: OnceLock<BTreeMap<Mode, Result<Ran, String>>> = OnceLock::new();

fn ran(mode: Mode) -> &'static Ran {
    let runs = RUNS.get_or_init(|| {
        let running: Vec<_> = MODES
            .map(|m| {
                let t = std::thread::Builder::new()
                    .name(format!("soak-{m:?}"))
                    .spawn(move || {
                        tokio::runtime::Builder::new_multi_thread()
                            .worker_threads(2)
                            .enable_all()
                            .build()
                            .expect("a runtime")
                            .block_on(run(m))
                    })
                    .expect("a thread");
                (m, t)
            })
            .into();
        running
            .into_iter()
            .map(|(m, t)| {
                let r = match t.join() {
                    Ok(r) => r.map_err(|e| format!("{e:#}")),
                    Err(_) => Err("the soak panicked (its message is above)".to_owned()),
                };
                (m, r)
            })
            .collect()
    });
    match &runs[&mode] {
        Ok(r) => r,
        Err(e) => panic!("the {mode:?} soak did not run: {e}"),
    }
}

async fn run(mode: Mode) -> anyhow::Result<Ran> {
    let family = match mode {
        Mode::Ipv4 | Mode::Profiles => soak::IpFamily::Ipv4,
        Mode::Ipv6 => soak::IpFamily::Ipv6,
        Mode::Dual => soak::IpFamily::Dual,
    };
    let mut enabled: BTreeSet<FaultKind> = FaultKind::ALL
        .into_iter()
        .filter(|k| k.applies(family))
        .collect();
    if mode == Mode::Dual {
        // Burst prefixes (the default on this Nitro c5.xlarge): eth0's /28s hold every pod, so no
        // secondary ENI exists to detach. The IPv4 soak (a Xen m4.xlarge: single secondary IPs)
        // and the network-profiles soak (pods on secondary ENIs) detach theirs.
        enabled.remove(&FaultKind::OobDetach);
    }
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
    if mode == Mode::Profiles {
        // Room for the ENIConfig to change a few times.
        steps = steps.max(soak::profiles::SWITCH_EVERY * 4 + 1);
    }
    let mut cfg = soak::SoakConfig::new(
        SEED,
        soak::Budget::Steps(steps),
        PathBuf::from(env!("CARGO_BIN_EXE_eniipamd")),
        bins::target_bin("eniipam"),
    );
    match mode {
        Mode::Profiles => cfg = cfg.with_network_profiles(),
        // The same 4 ENIs × 15 IPs as the c5.xlarge, on Xen: the secondary-IP structure that
        // non-Nitro types keep, with secondary ENIs to detach out of band.
        Mode::Ipv4 => cfg.instance_type = "m4.xlarge".into(),
        Mode::Ipv6 | Mode::Dual => {}
    }
    cfg.ip_family = family;
    cfg.faults = enabled.clone();
    cfg.progress = true;
    // Kept after a run with violations, so each can be read against the daemon's own account.
    let log = daemon_log(&cfg);
    cfg.log_file = Some(log.clone());
    let out = soak::run(cfg).await?;
    if out.violations.is_empty() {
        let _ = std::fs::remove_file(&log);
    }
    Ok(Ran {
        steps,
        log,
        enabled,
        out,
    })
}

/// Where a soak's daemon log is kept.
fn daemon_log(cfg: &soak::SoakConfig) -> PathBuf {
    std::env::temp_dir().join(format!(
        "eniipam-soak-{}-{}-eniipamd.log",
        cfg.tag(),
        std::process::id()
    ))
}

#[test]
fn fault_soak_keeps_every_invariant() {
    fault_soak(Mode::Ipv4);
}

#[test]
fn fault_soak_keeps_every_invariant_ipv6() {
    fault_soak(Mode::Ipv6);
}

#[test]
fn fault_soak_keeps_every_invariant_dual_stack() {
    fault_soak(Mode::Dual);
}

fn fault_soak(mode: Mode) {
    let Ran {
        steps,
        log,
        enabled,
        out,
    } = ran(mode);
    let (steps, family) = (*steps, out.ip_family);
    let summary = out.summary(5);
    println!("{summary}");

    // The soak did what it says.
    let c = &out.counts;
    for k in enabled {
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
         `cargo run --release -p eniipam-bench -- soak --soak-steps {steps} --seed {SEED} --ip-family {family}`; the daemon's log: {}):\n{summary}",
        out.violations.len(),
        log.display()
    );
}

/// Issue 27: the soak with custom networking, two network profiles and ENIConfig changes
/// (`eniipam-bench soak --network-profiles`, IPv4): every fault of the schedule, pods of `db`,
/// `app` and the default network put in the API-server double before their ADD, and the profiles'
/// invariants (each IP on an ENI of its pod's network with exactly its groups, eth0 serving none,
/// no IP ever crossing networks, refusals only as error 11 naming the profile) after every step.
#[test]
fn fault_soak_keeps_every_invariant_with_network_profiles() {
    let Ran {
        steps,
        log,
        enabled,
        out,
    } = ran(Mode::Profiles);
    let steps = *steps;
    let summary = out.summary(5);
    println!("{summary}");

    let c = &out.counts;
    for k in enabled {
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
         `cargo run --release -p eniipam-bench -- soak --soak-steps {steps} --seed {SEED} --network-profiles`; the daemon's log: {}):\n{summary}",
        out.violations.len(),
        log.display()
    );
}
