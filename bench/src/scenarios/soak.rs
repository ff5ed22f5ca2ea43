//! Scenario `soak` (issue 13): the fault soak of [`crate::soak`] for a number of minutes (or steps),
//! reported as a table of operations, kills, faults by kind and invariant violations by kind (each
//! must be 0), with the first violations of each kind described.

use std::time::Duration;

use crate::report::{Anchor, Row, ScenarioReport, Target, Unit};
use crate::soak::faults::FaultKind;
use crate::soak::{self, Budget, SoakConfig};
use crate::support;

/// What `eniipam-bench soak` is told.
#[derive(Clone, Debug)]
pub struct SoakArgs {
    pub minutes: f64,
    pub steps: Option<u64>,
    pub seed: u64,
    pub networks: usize,
    pub faults: std::collections::BTreeSet<FaultKind>,
    pub ip_family: soak::IpFamily,
    pub log: Option<std::path::PathBuf>,
    /// The network-profiles mode (`--network-profiles`).
    pub network_profiles: bool,
    /// The node's instance type (`--soak-instance-type`): a Nitro type soaks burst prefixes (the
    /// default), a Xen one single secondary IPs. None: the mode's own.
    pub instance_type: Option<String>,
}

/// Violations described in the report, per kind.
const DESCRIBED_PER_KIND: usize = 3;

/// Every violation kind the checker knows, so a clean run shows its zeros.
const KINDS: [&str; 29] = [
    "duplicate-ip",
    "detached-eni-serving",
    "eni-unknown-to-pool",
    "held-ip-not-in-ec2",
    "lost-ip-kept",
    "token-accounting",
    "live-lost-ip",
    "live-ip-not-in-ec2",
    "store-daemon-disagree",
    "leak-after-gc",
    "host-cache",
    "del-failed",
    "daemon-exited",
    "daemon-down",
    "iam-denied",
    "iam-error-unnamed",
    "ipv6-prefix",
    "duplicate-ipv6",
    "ipv6-reissued",
    "ipv6-outside-prefix",
    "live-lost-ipv6",
    "dual-half",
    "profile-groups",
    "profile-ip-crossed",
    "profile-refusal",
    "eth0-serving",
    "eni-network-disagree",
    "profile-not-advertised",
    "profiles-overcommitted",
];

pub async fn run(args: &SoakArgs) -> anyhow::Result<ScenarioReport> {
    anyhow::ensure!(
        args.minutes.is_finite() && args.minutes > 0.0,
        "--minutes must be a positive number, not {}",
        args.minutes
    );
    let budget = match args.steps {
        Some(n) => Budget::Steps(n),
        None => Budget::Time(Duration::from_secs_f64(args.minutes * 60.0)),
    };
    let mut cfg = SoakConfig::new(
        args.seed,
        budget,
        support::sibling("eniipamd")?,
        support::sibling("eniipam")?,
    );
    if args.network_profiles {
        cfg = cfg.with_network_profiles();
    }
    if let Some(t) = &args.instance_type {
        anyhow::ensure!(
            eniipam_limits::lookup(t).is_some(),
            "--soak-instance-type {t:?} is not in the instance-type catalogue"
        );
        cfg.instance_type = t.clone();
    }
    cfg.networks = args.networks;
    cfg.faults = args.faults.clone();
    cfg.ip_family = args.ip_family;
    cfg.log_file = args.log.clone();
    cfg.progress = true;
    let knobs = cfg.knobs.clone();
    let instance = cfg.instance_type.clone();
    // Ctrl-C or SIGTERM drops the soak, whose guards unmount what it mounted and kill what it started.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let out = tokio::select! {
        out = soak::run(cfg) => out?,
        _ = tokio::signal::ctrl_c() => anyhow::bail!("interrupted (SIGINT); cleaned up"),
        _ = term.recv() => anyhow::bail!("interrupted (SIGTERM); cleaned up"),
    };
    eprintln!("{}", out.summary(DESCRIBED_PER_KIND));

    let c = &out.counts;
    let info = |m: &str, u: Unit, v: f64| Row::single(m, u, v);
    let mut rows = vec![
        info("steps", Unit::Count, c.steps as f64),
        info("wall time", Unit::Secs, out.wall.as_secs_f64()),
        info("ADD ok", Unit::Count, c.adds_ok as f64),
        info(
            "ADD failed (the runtime DELs after)",
            Unit::Count,
            c.adds_failed as f64,
        ),
        info("DEL ok", Unit::Count, c.dels_ok as f64),
        info("GC ok", Unit::Count, c.gcs_ok as f64),
        info("GC failed", Unit::Count, c.gcs_failed as f64),
        info("SIGKILLs of eniipamd", Unit::Count, c.kills as f64),
        info(
            "IAM policy edits revoking an action (iam-revoke)",
            Unit::Count,
            c.iam_revocations as f64,
        ),
        info(
            "EC2 calls refused for the revoked action",
            Unit::Count,
            c.iam_refused as f64,
        ),
        info("restarts (ready again)", Unit::Count, c.restarts as f64),
        info("pods", Unit::Count, c.pods as f64),
        info("peak live pods", Unit::Count, c.peak_live_pods as f64),
        info(
            "distinct IPs handed out",
            Unit::Count,
            c.distinct_ips as f64,
        ),
        info(
            "distinct IPv6 addresses handed out",
            Unit::Count,
            c.distinct_ipv6 as f64,
        ),
        info("invariant checks", Unit::Count, c.checks as f64),
        info(
            "checks skipped (daemon down)",
            Unit::Count,
            c.checks_skipped as f64,
        ),
    ];
    for k in FaultKind::ALL
        .into_iter()
        .chain(FaultKind::OPT_IN)
        .filter(|k| k.applies(args.ip_family))
    {
        rows.push(info(
            &format!("fault `{}`", k.name()),
            Unit::Count,
            *c.faults.get(k.name()).unwrap_or(&0) as f64,
        ));
    }
    if args.network_profiles {
        rows.push(info(
            "changes of the node's ENIConfig",
            Unit::Count,
            c.eniconfig_switches as f64,
        ));
        for net in ["db", "app", "default"] {
            rows.push(info(
                &format!("ADD ok, network `{net}`"),
                Unit::Count,
                *c.network_adds_ok.get(net).unwrap_or(&0) as f64,
            ));
            rows.push(info(
                &format!("distinct ENIs serving `{net}`"),
                Unit::Count,
                *c.network_enis.get(net).unwrap_or(&0) as f64,
            ));
        }
        let refused = c.profile_refusals.get(soak::profiles::MISSING);
        rows.push(info(
            "ADD of a pod naming the missing profile `ghost` refused (error 11 naming it)",
            Unit::Count,
            refused.copied().unwrap_or(0) as f64,
        ));
        for p in ["db", "app"] {
            rows.push(info(
                &format!("ADD of a `{p}` pod refused (error 11 naming it)"),
                Unit::Count,
                *c.profile_refusals.get(p).unwrap_or(&0) as f64,
            ));
            rows.push(info(
                &format!("ADD of a `{p}` pod failed otherwise"),
                Unit::Count,
                *c.profile_other_failures.get(p).unwrap_or(&0) as f64,
            ));
        }
    }
    let by_kind = out.by_kind();
    let mut kinds: Vec<&str> = KINDS.to_vec();
    for k in by_kind.keys() {
        if !kinds.contains(k) {
            kinds.push(k);
        }
    }
    for k in kinds {
        rows.push(
            Row::single(
                format!("violations `{k}`"),
                Unit::Count,
                *by_kind.get(k).unwrap_or(&0) as f64,
            )
            .anchor(Anchor::None("invariant".into()))
            .target(Target::AtMost(0.0)),
        );
    }

    let mut notes = Vec::new();
    for v in out.first_of_each_kind(DESCRIBED_PER_KIND) {
        notes.push(format!("`{}`: {}", v.kind, escape(&v.to_string())));
    }
    if !c.add_errors.is_empty() {
        let list: Vec<String> = c
            .add_errors
            .iter()
            .map(|(k, n)| format!("{k}: {n}"))
            .collect();
        notes.push(format!("ADD failures by plugin error: {}", list.join(", ")));
    }
    if c.checks_skipped > 0 || c.starts_failed_disk_full > 0 {
        notes.push(format!(
            "{} checks skipped (daemon not ready or unreachable); {} startups failed while the state disk was full (expected)",
            c.checks_skipped, c.starts_failed_disk_full
        ));
    }
    for n in &out.notes {
        notes.push(escape(n));
    }

    let all: std::collections::BTreeSet<FaultKind> = FaultKind::ALL.into_iter().collect();
    let faults = if args.faults == all {
        String::new()
    } else {
        format!(
            " --soak-faults {}",
            args.faults
                .iter()
                .map(|k| k.name())
                .collect::<Vec<_>>()
                .join(",")
        )
    };
    let family = match args.ip_family {
        soak::IpFamily::Ipv4 => String::new(),
        f => format!(" --ip-family {f}"),
    };
    let mode = if args.network_profiles {
        " --network-profiles"
    } else {
        ""
    };
    let length = match args.steps {
        Some(n) => format!("--soak-steps {n}"),
        None => format!("--minutes {}", args.minutes),
    };
    Ok(ScenarioReport {
        id: "soak",
        title: format!(
            "fault soak: {} against the invariant checker (ip_family {}, seed {})",
            match args.steps {
                Some(n) => format!("{n} steps"),
                None => format!("{} minutes", args.minutes),
            },
            args.ip_family,
            args.seed
        ),
        reproduce: format!(
            "cargo run --release -p eniipam-bench -- soak {length} --seed {} --soak-networks {}{family}{mode}{faults}",
            args.seed, args.networks
        ),
        setup: vec![
            format!(
                "the real eniipamd binary (reuse cooldown {} s, reconcile every {} s, min/max idle {}/{}) on a mockcloud {instance} (EC2's latencies ÷ 5, attach 400 ms, IMDS lag 200 ms, EC2's describes lagging its changes by 2 s, EC2's account throttling), SIGKILLed and restarted at random moments",
                knobs.reuse_cooldown_secs, knobs.reconcile_period_secs, knobs.min_idle, knobs.max_idle
            ),
            format!(
                "the real eniipam plugin in its IPAM role under a calico parent, {} network(s) (soak-a; soak-b), pods in real network namespaces on one or both networks, living 2–30 steps; GC from a fake runtime (cniVersion 1.1.0) listing one network's live attachments",
                args.networks
            ),
            "mockcloud enforces the shipped IAM policy (deploy/iam-policy.json) for the whole run; the iam-revoke fault edits it to revoke one action for 2-5 steps; a refused call of any other action is an `iam-denied` violation, and a refused call the daemon's log never names (`the IAM role needs ec2:<Action>`) an `iam-error-unnamed` one".into(),
            "after every step: duplicates across pods, pool and store; the pool's ENIs and IPs against EC2; token accounting; every live attachment held with its IP; out-of-band-removed IPs reported lost; the store against the pool (settled); GC leaks; the plugin's cache".into(),
            format!(
                "ip_family {}{}",
                args.ip_family,
                if args.ip_family.has_ipv6() {
                    "; IPv6 after every step too: one /80 in the node's life, on eth0 in EC2 and in the state file; no IPv6 on two attachments, none ever handed to a second one (the /80's contract); every live pod's IPv6 inside the /80 and held by the daemon; the state file's IPv6 rows against the daemon (settled); GC leaks; in dual mode both families or neither, but for attachments the runtime still owes a DEL"
                } else {
                    ""
                }
            ),
            format!(
                "faults on a seeded schedule: one every {} steps after {} warm-up steps, each enabled kind in turn (all of them within the first {} steps; `state-file-removed` and `disk-full` only then), a SIGKILL in {:.0} % of the steps, {:.0} % of pods dying without a DEL",
                soak::faults::PERIOD,
                soak::faults::WARM_UP,
                soak::faults::first_cycle_steps(&args.faults),
                soak::faults::KILL_CHANCE * 100.0,
                soak::faults::DEATH_CHANCE * 100.0
            ),
            format!("capacity {} pod IPs", out.capacity),
        ]
        .into_iter()
        .chain(args.network_profiles.then(|| format!(
            "network profiles (issue 27): custom networking (eth0 serves no pods) with two ENIConfigs in the VPC's secondary block 100.64.0.0/16, the node's switched every {} steps (its annotation set, then removed back to its label's); NetworkProfiles `db` (a named subnet, two security groups, maxEnisPerNode {}) and `app` (a subnet selected by tag, one group), from an API-server double (node, CRDs, objects, namespaces, pods); each new pod put there bound to the node before its ADD and deleted when it ends: pod annotated `db` (28 %), in namespace `apps` annotated `app` (30 %), in `apps` but annotated `db` (7 %), no annotation (21 %), in `apps` opting out with an empty annotation (11 %), annotated with `ghost`, a profile no NetworkProfile defines (3 %: every ADD must be refused with CNI error 11 naming it); at most {} live pods; the API-server pod GC off (the runtime's DEL and GC end pods)",
            soak::profiles::SWITCH_EVERY,
            soak::profiles::DB_MAX_ENIS,
            soak::PROFILES_TARGET_POD_COUNT,
        )))
        .chain(args.network_profiles.then(|| "the profiles' invariants after every step: every IP a pod holds is on an ENI of its network per EC2 (a profile's: tagged with it, in its subnet, exactly its groups; the default network's: untagged, an ENIConfig's subnet with exactly its groups); the pool's network of each ENI is EC2's tag; eth0 serves no pod; at every ADD: no IP of one network ever handed to a pod of another over the run (each network has its own subnets), a refusal for a profile is CNI error 11 naming the pod's own profile and never reaches a default-network pod; the profiles' advertised totals never exceed the room of the ENI slots the default network's ENIs leave (a breach counts when the next check confirms it); at the end the node advertises both profiles' totals".to_owned()))
        .collect(),
        rows,
        notes,
        plot_unit: "",
        series: Vec::new(),
    })
}

/// Table cells and list items must not break the markdown.
fn escape(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}
