//! The timed phases: sequential ADD+DEL pairs, and a burst of concurrent ADDs then DELs (a wave of
//! threads released together), each checked inside its pods.

use std::collections::HashSet;
use std::net::Ipv4Addr;
use std::sync::Barrier;
use std::time::Instant;

use anyhow::{Context, bail, ensure};
use eniipam::pool::Pool;
use eniipam_api::AttachmentKey;
use serde_json::Value;

use super::namespaces::{Netns, Node, check_pod, pod_namespaces};
use super::{BURST, SETTLE};
use crate::cni::Plugin;
use crate::stats::ms;

/// The IPv4 address (and prefix length) of the first entry of a result's `ips`.
fn result_ip(stdout: &str) -> anyhow::Result<(Ipv4Addr, u8)> {
    let v: Value = serde_json::from_str(stdout)
        .with_context(|| format!("the ADD result is not JSON: {stdout}"))?;
    let addr = v["ips"][0]["address"]
        .as_str()
        .with_context(|| format!("the ADD result has no ips[0].address: {stdout}"))?;
    let (ip, len) = addr
        .split_once('/')
        .with_context(|| format!("{addr} is not an address/prefix"))?;
    Ok((
        ip.parse().with_context(|| format!("{addr}: bad IPv4"))?,
        len.parse().with_context(|| format!("{addr}: bad prefix"))?,
    ))
}

/// Per-invocation wall times of one sequential run, ms.
#[derive(Default)]
pub(super) struct SeqTimes {
    pub(super) add: Vec<f64>,
    pub(super) del: Vec<f64>,
}

impl SeqTimes {
    pub(super) fn all(&self) -> Vec<f64> {
        self.add.iter().chain(&self.del).copied().collect()
    }

    /// Each pod's ADD plus its DEL.
    pub(super) fn pairs(&self) -> Vec<f64> {
        self.add.iter().zip(&self.del).map(|(a, d)| a + d).collect()
    }
}

/// `pairs` sequential ADD+DEL in fresh pod namespaces (made before, removed after, untimed); every
/// ADD is checked inside its pod.
pub(super) fn run_pairs(
    plugin: &Plugin,
    node: &Node,
    tag: &str,
    pairs: usize,
) -> anyhow::Result<SeqTimes> {
    let pods = pod_namespaces(tag, pairs)?;
    let mut t = SeqTimes::default();
    for (i, pod) in pods.iter().enumerate() {
        let container = format!("w-{tag}-{i:03}");
        let netns = pod.path();
        let add = plugin.run_in("ADD", &container, &netns, &node.entry)?;
        check_pod(pod, result_ip(&add.stdout)?)?;
        t.add.push(ms(add.wall));
        let del = plugin.run_in("DEL", &container, &netns, &node.entry)?;
        t.del.push(ms(del.wall));
    }
    drop(pods);
    std::thread::sleep(SETTLE);
    Ok(t)
}

/// One concurrent wave: every invocation's wall time (spawn to exit, ms), the wave's span (first
/// spawn to last exit, ms) and the outputs, in pod order.
struct Wave {
    each: Vec<f64>,
    span: f64,
    stdout: Vec<String>,
}

/// Runs `command` for every pod at once: one thread per pod, released together by a barrier.
fn wave(
    plugin: &Plugin,
    node: &Node,
    command: &str,
    tag: &str,
    pods: &[Netns],
) -> anyhow::Result<Wave> {
    let barrier = Barrier::new(pods.len());
    let results: Vec<anyhow::Result<(Instant, Instant, crate::cni::Run)>> =
        std::thread::scope(|s| {
            let handles: Vec<_> = pods
                .iter()
                .enumerate()
                .map(|(i, pod)| {
                    let barrier = &barrier;
                    s.spawn(move || {
                        let container = format!("w-{tag}-{i:03}");
                        let netns = pod.path();
                        barrier.wait();
                        let start = Instant::now();
                        let run = plugin.run_in(command, &container, &netns, &node.entry)?;
                        Ok((start, Instant::now(), run))
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| bail!("a burst thread panicked"))
                })
                .collect()
        });
    let mut first = None::<Instant>;
    let mut last = None::<Instant>;
    let mut w = Wave {
        each: Vec::new(),
        span: 0.0,
        stdout: Vec::new(),
    };
    for r in results {
        let (start, end, run) = r?;
        first = Some(first.map_or(start, |f| f.min(start)));
        last = Some(last.map_or(end, |l| l.max(end)));
        w.each.push(ms(run.wall));
        w.stdout.push(run.stdout);
    }
    if let (Some(f), Some(l)) = (first, last) {
        w.span = ms(l - f);
    }
    Ok(w)
}

/// One burst's figures, ms.
pub(super) struct BurstTimes {
    pub(super) add: Vec<f64>,
    pub(super) add_span: f64,
    pub(super) del: Vec<f64>,
    pub(super) del_span: f64,
}

/// Makes `BURST` pod namespaces, ADDs them all at once, checks each pod and that the addresses are
/// distinct (and, for eniipam, that the daemon holds exactly what each ADD printed), DELs them all at
/// once, removes the namespaces.
pub(super) fn run_burst(
    plugin: &Plugin,
    node: &Node,
    tag: &str,
    daemon: Option<&Pool>,
) -> anyhow::Result<BurstTimes> {
    let pods = pod_namespaces(tag, BURST)?;
    let adds = wave(plugin, node, "ADD", tag, &pods)?;
    let mut seen = HashSet::new();
    for (i, (pod, out)) in pods.iter().zip(&adds.stdout).enumerate() {
        let addr = result_ip(out)?;
        check_pod(pod, addr)?;
        ensure!(
            seen.insert(addr.0),
            "burst {tag}: {} handed out twice",
            addr.0
        );
        if let Some(pool) = daemon {
            let key = AttachmentKey::new(format!("w-{tag}-{i:03}"), "eth0");
            let held = pool.allocation(&key).map(|a| a.ip);
            ensure!(
                held == Some(addr.0),
                "burst {tag}: the plugin printed {} for {key} but the daemon holds {held:?}",
                addr.0
            );
        }
    }
    let dels = wave(plugin, node, "DEL", tag, &pods)?;
    drop(pods);
    std::thread::sleep(SETTLE);
    Ok(BurstTimes {
        add: adds.each,
        add_span: adds.span,
        del: dels.each,
        del_span: dels.span,
    })
}
