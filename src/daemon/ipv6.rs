//! Startup step 4b (ip_family ipv6 or dual): the node's /80 taken or kept, and its address book
//! rebuilt from the state file, before anything is served.

use std::sync::Arc;

use super::{CloudClients, DaemonError};
use crate::clock::unix_ms_now;
use crate::cloud::{Eni, NodeContext};
use crate::config::DaemonConfig;
use crate::ipv6::prefix::{self, PrefixError, Taken};
use crate::ipv6::{IpFamily, Ipv6Pool};
use crate::metrics::Metrics;
use crate::reconcile;
use crate::store::{Store, StoredAssignment6, StoredIpv6, StoredPrefix6};

/// The /80 on the primary ENI (kept, adopted, or assigned by EC2: see [`prefix::ensure`]) and the
/// book of the addresses pods hold in it, written back to the state file as rebuilt. A lost state file
/// starts the book from the host's evidence ([`adopt_from_host`]) and its cursor from the clock, so
/// no address a pod held before is handed out again and the live pods keep theirs.
pub(super) async fn take_prefix(
    config: &DaemonConfig,
    clients: &CloudClients,
    node: &NodeContext,
    eth0: Option<Eni>,
    (store, state_lost): (&Store, bool),
    metrics: &Metrics,
) -> Result<Arc<Ipv6Pool>, DaemonError> {
    // The IPv6 half of a file whose IPv4 half is intact may still be empty: a life that wrote its
    // IPv4 rebuild and died (or hit a full disk) before recording the /80 (the dual soak, seed 8:
    // a lost file, a full disk, then a SIGKILL: every live pod lost its IPv6). A file with no /80
    // on record is as lost as a missing one for the /80's book: the host's evidence rebuilds it.
    let on_file = if state_lost {
        None
    } else {
        Some(store.load_ipv6().await?).filter(|s| s.prefix.is_some())
    };
    let state_lost = on_file.is_none();
    let stored = match on_file {
        Some(s) => s,
        None => adopt_from_host(config, unix_ms_now()),
    };
    // `eth0` as node discovery described it a moment before, so a node boot makes no second
    // DescribeInstances; `None` (a retry of this step) describes it afresh.
    let eth0 = match eth0 {
        Some(e) => e,
        None => {
            let instance = clients.cloud.describe_instance(&node.instance_id).await?;
            instance
                .enis
                .into_iter()
                .find(|e| e.attachment.as_ref().is_some_and(|a| a.device_index == 0))
                .ok_or_else(|| DaemonError::NoPrimaryEni(node.instance_id.clone()))?
        }
    };
    // EC2's describe lags its changes (eventually consistent): a /80 assigned (or assigned back)
    // moments before a restart may not be in it yet. IMDS lags too, but on its own clock: a /80
    // either shows is on eth0, and taking a new one instead would orphan every pod's address.
    let mut eth0 = eth0;
    match clients.metadata.interface(&eth0.mac).await {
        Ok(Some(md)) if md.eni_id == eth0.id => {
            for p in md.ipv6_prefixes {
                if !eth0.ipv6_prefixes.contains(&p) {
                    tracing::info!(prefix = %p, eni = %eth0.id,
                        "IMDS shows a /80 on eth0 that EC2's describe does not show yet: taken as eth0's");
                    eth0.ipv6_prefixes.push(p);
                }
            }
        }
        Ok(_) => {}
        Err(e) => tracing::debug!(error = %e, "IMDS not read for eth0's /80; EC2's describe alone"),
    }
    let now_ms = unix_ms_now();
    let mut stored = stored;
    if state_lost && stored.prefix.is_none() {
        // The /80 the live pods' addresses are in is the node's: if EC2 no longer shows it on eth0
        // (unassigned behind the daemon's back, its describe lagging the assign back), it is
        // assigned back rather than a new one taken, so those pods keep routable addresses.
        stored.prefix = evidence_prefix(&stored.assignments).map(|prefix| StoredPrefix6 {
            prefix,
            eni_id: eth0.id.to_string(),
            next_offset: crate::ipv6::book::seed_offset(now_ms),
            egress_next: 0,
            taken_at_ms: now_ms,
        });
    }
    let family = config.ip_family.to_string();
    let (taken, how, lost) = prefix::ensure(
        clients.cloud.as_ref(),
        &eth0,
        stored.prefix.clone(),
        &family,
        now_ms,
    )
    .await
    .map_err(|e| match e {
        PrefixError::Cloud(c) => DaemonError::Cloud(c),
        e @ PrefixError::NoSubnetIpv6 { .. } => DaemonError::Config(e.to_string()),
        e => DaemonError::Ipv6(e.to_string()),
    })?;
    if how == Taken::Reclaimed {
        tracing::warn!(
            prefix = %taken.prefix, eni = %taken.eni_id, pods = stored.assignments.len(),
            "the /80 on record was gone from the primary ENI (unassigned outside eniipam?) and is \
             assigned back: its pods keep their IPv6 addresses, which route again"
        );
    }
    if let Some(lost) = &lost {
        tracing::error!(
            recorded = %lost.prefix, eni = %lost.eni_id, now = %taken.prefix,
            pods = stored.assignments.len(),
            "the /80 on record is gone from the primary ENI (unassigned outside eniipam?): its pods' \
             IPv6 addresses no longer route; they are forgotten and new pods get addresses of the new /80"
        );
    }
    let vpc_cidrs = clients
        .metadata
        .primary_interface()
        .await?
        .map(|m| m.vpc_ipv6_cidrs)
        .unwrap_or_default();
    let stick_ms = config.ip_stick_time_secs.saturating_mul(1000);
    // Dual-stack pods have a VPC IPv4 of their own: only IPv6-only pods get an egress address.
    let egress = config.ip_family == IpFamily::Ipv6 && config.ipv4_egress;
    let (pool, restored) = Ipv6Pool::restore(taken, stored, (vpc_cidrs, egress), stick_ms, now_ms);
    for (ip, why) in &restored.dropped {
        tracing::warn!(%ip, why, "IPv6 row of the state file dropped at startup");
    }
    store.replace_ipv6(restored.state.clone()).await?;
    metrics.ipv6_prefixes.set(1);
    metrics
        .ipv6_assigned
        .set(restored.state.assignments.len() as i64);
    tracing::info!(
        prefix = %pool.prefix(), eni = %pool.eni_id, how = ?how,
        assigned = restored.state.assignments.len(), reserved = restored.state.reservations.len(),
        ipv4_egress = egress,
        "the node's IPv6 /80 is {}",
        match how {
            Taken::Kept => "the one on record",
            Taken::Reclaimed => "the one on record, assigned back",
            Taken::Adopted => "one the primary ENI already had",
            Taken::Assigned => "new from EC2",
        }
    );
    Ok(Arc::new(pool))
}

/// The /80 most of `assignments`' addresses are in (the live pods' /80, from the host's evidence).
fn evidence_prefix(assignments: &[StoredAssignment6]) -> Option<ipnet::Ipv6Net> {
    let mut count: std::collections::BTreeMap<ipnet::Ipv6Net, usize> = Default::default();
    for a in assignments {
        if let Ok(net) = ipnet::Ipv6Net::new(a.ip, 80) {
            *count.entry(net.trunc()).or_default() += 1;
        }
    }
    count.into_iter().max_by_key(|(_, n)| *n).map(|(p, _)| p)
}

/// A lost state file: every attachment the plugin's result cache shows with an IPv6 and a netns not
/// known to be gone becomes an assignment again, with its node-local egress IPv4 where the cache has
/// one, as the IPv4 rebuild takes back the pods' IPv4s from the same evidence. Without this the live
/// pods' IPv6 were forgotten (the soak's `live-lost-ipv6`): still wired, no longer the daemon's, so
/// CHECK failed and a StatefulSet pod lost its sticky address. Addresses outside the /80 the node
/// ends up with are dropped by [`Ipv6Pool::restore`] with a log line; the netns of an adopted pod that
/// is in fact dead is found by the running reconcile, which releases it.
fn adopt_from_host(config: &DaemonConfig, now_ms: u64) -> StoredIpv6 {
    let netns = reconcile::NetnsView::of(&config.netns_dirs);
    let host = reconcile::host_evidence(&config.cni_cache_dir, &netns);
    let assignments: Vec<StoredAssignment6> = host
        .claims
        .into_iter()
        .filter_map(|c| {
            Some(StoredAssignment6 {
                ip: c.ipv6?,
                network: c.network,
                container_id: c.attachment.container_id,
                ifname: c.attachment.ifname,
                netns: c.netns,
                pod_namespace: c.pod.namespace,
                pod_name: c.pod.name,
                pod_uid: c.pod.uid,
                sticky_key: c.sticky_key,
                assigned_at_ms: now_ms,
                egress_ipv4: c.egress_ipv4,
            })
        })
        .collect();
    if !assignments.is_empty() {
        tracing::warn!(
            pods = assignments.len(),
            cache = %config.cni_cache_dir.display(),
            "the state file was lost: the IPv6 addresses of the pods the plugin's cache shows alive \
             are theirs again"
        );
    }
    StoredIpv6 {
        assignments,
        ..StoredIpv6::default()
    }
}
