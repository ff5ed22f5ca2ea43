//! The decision log's task (`docs/network-policy.md`, "Decision logs"): the NFLOG group
//! the table logs to is read, each packet mapped to its pod and policy rule through the
//! [`DecisionMap`] of the sync in force, and written, at most `network_policy_log_rate` a second,
//! to the daemon's log (target `eniipam::policy_decision`, level info) and, when configured, to
//! `network_policy_log_file` (JSON lines, size-rotated). What the rate leaves out is counted and
//! said once a second. The group cannot be bound (another program holds it, no
//! `CAP_NET_ADMIN`): a warning, and another try every [`REBIND`]; enforcement is not affected.
//!
//! The per-rule counters are read with the chains' (the enforcer's `count_verdicts`), through
//! [`per_rule`].

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::counters::rule_readings;
use super::file::RotatingFile;
use super::limit::RateLimit;
use super::nflog::NflogSocket;
use super::{Decision, DecisionMap, LogConfig, Logged, Tag};
use crate::metrics::{PolicyMetrics, RuleCount};

/// How long after a failed bind the group is tried again.
const REBIND: Duration = Duration::from_secs(30);

/// Reads the group until `cancel`, logging what it maps (nothing to do when logging is off).
pub(crate) async fn run(
    config: LogConfig,
    map: watch::Receiver<Arc<DecisionMap>>,
    metrics: PolicyMetrics,
    cancel: CancellationToken,
) {
    if config.logged == Logged::Off {
        return;
    }
    let mut file = config.file.as_ref().and_then(|path| {
        RotatingFile::open(path, config.file_max_bytes, config.file_keep)
            .inspect_err(|e| {
                tracing::warn!(path = %path.display(), error = %e,
                    "network policy: cannot open the decision log file; decisions go to the daemon's log only")
            })
            .ok()
    });
    let mut limit = RateLimit::new(config.per_second);
    let mut said = tokio::time::interval(Duration::from_secs(1));
    loop {
        let mut socket = tokio::select! {
            _ = cancel.cancelled() => return,
            s = NflogSocket::bind(config.group) => match s {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(group = config.group, error = %e,
                        "network policy: cannot bind the decision log's NFLOG group (is another program using it? see network_policy_log_group); trying again");
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = tokio::time::sleep(REBIND) => continue,
                    }
                }
            },
        };
        tracing::debug!(
            group = config.group,
            "network policy: decision log reading its NFLOG group"
        );
        loop {
            let batch = tokio::select! {
                _ = cancel.cancelled() => return,
                _ = said.tick() => {
                    let n = limit.take_suppressed();
                    if n > 0 {
                        metrics.decisions_suppressed(n);
                        tracing::info!(target: "eniipam::policy_decision", suppressed = n,
                            "network policy: {n} decision(s) not logged (network_policy_log_rate {}/s)", config.per_second);
                    }
                    continue;
                }
                b = socket.next() => b,
            };
            let packets = match batch {
                Ok(p) => p,
                Err(e) if e.raw_os_error() == Some(105) => {
                    // ENOBUFS: the socket overflowed, packets were lost; it reads on.
                    metrics.decision_unmapped();
                    continue;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "network policy: the decision log's socket failed; binding again");
                    break;
                }
            };
            let map = map.borrow().clone();
            for p in packets {
                let Some(tag) = Tag::parse(&p.prefix) else {
                    continue;
                };
                let Some(decision) = p.flow.and_then(|f| map.decide(&tag, &f)) else {
                    metrics.decision_unmapped();
                    continue;
                };
                if !limit.admit() {
                    continue;
                }
                metrics.decision_logged(decision.verdict);
                log(&decision);
                if let Some(f) = file.as_mut()
                    && let Err(e) = f.write(std::time::SystemTime::now(), &decision)
                {
                    tracing::warn!(error = %e, "network policy: cannot write the decision log file; decisions go to the daemon's log only");
                    file = None;
                }
            }
        }
    }
}

/// The decision as a line of the daemon's log.
fn log(d: &Decision) {
    let port = d.port.map(|p| p.to_string()).unwrap_or_default();
    let by = match &d.rule {
        Some(rule) => rule.clone(),
        None => format!("no rule of {}", d.policies.join(", ")),
    };
    tracing::info!(target: "eniipam::policy_decision", verdict = d.verdict, pod = %d.pod,
        direction = d.direction, peer = %d.peer, protocol = %d.protocol, port = %port,
        src = %d.src, dst = %d.dst, rule = %by,
        "network policy: {} {} {} {} {}/{}: {}", d.verdict, d.pod, d.direction, d.peer, d.protocol, port, by);
}

/// The per-rule readings of `nft -j list counters` for the metric.
pub(crate) fn per_rule(json: &str, map: &DecisionMap) -> Vec<RuleCount> {
    let Ok(readings) = rule_readings(json, map) else {
        return Vec::new();
    };
    readings
        .into_iter()
        .map(|r| RuleCount {
            key: r.key,
            namespace: r.namespace,
            policy: r.policy,
            direction: r.direction.word(),
            rule: r.rule.map_or_else(|| "none".to_owned(), |i| i.to_string()),
            verdict: if r.allowed { "allowed" } else { "denied" },
            packets: r.packets,
        })
        .collect()
}
