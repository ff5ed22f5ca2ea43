//! GC: releases every attachment of the network the runtime did not list as valid, in the daemon
//! and on the host (the cached wiring), continuing on errors.

use eniipam_api::cache::ResultCache;
use eniipam_api::pb;
use eniipam_netlink::Netlink;

use super::daemon::connect;
use super::pod::cached_addresses;
use crate::netconf::NetConf;
use crate::spec::{CniError, ErrorCode};
use crate::wiring::{self, Teardown};

pub(super) async fn gc(conf: &NetConf) -> Result<(), CniError> {
    // The runtime built its list of valid attachments before it started this process.
    let listed_before_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let valid = conf.valid_attachments.clone().ok_or_else(|| {
        CniError::new(
            ErrorCode::InvalidNetworkConfig,
            "GC needs cni.dev/valid-attachments (an empty list releases everything)",
        )
    })?;

    let cache = ResultCache::new(&conf.plugin.cache_dir, &conf.name);
    let (entries, errors) = cache.list();
    for e in errors {
        tracing::warn!("GC: {e}");
    }
    let stale: Vec<_> = entries
        .into_iter()
        .filter(|e| !valid.contains(&e.attachment()))
        .collect();

    let daemon = async {
        let mut client = connect(conf).await?;
        client
            .garbage_collect(pb::GarbageCollectRequest {
                api_version: 0,
                valid: valid
                    .iter()
                    .map(|k| pb::Attachment {
                        container_id: k.container_id.clone(),
                        ifname: k.ifname.clone(),
                    })
                    .collect(),
                network: conf.name.clone(),
                listed_before_ms,
                cleaning: stale
                    .iter()
                    .flat_map(|e| {
                        let (ip, ipv6) = cached_addresses(e);
                        [ip.map(|a| a.to_string()), ipv6.map(|a| a.to_string())]
                    })
                    .flatten()
                    .collect(),
            })
            .await
    }
    .await;

    // Continue on errors: the local cleanup happens whatever the daemon said; an IP's rules go only
    // when the daemon confirms no live attachment holds it now (as in DEL).
    let keep_rules: Option<std::collections::BTreeSet<String>> = daemon
        .as_ref()
        .ok()
        .map(|r| r.held_by_others.iter().cloned().collect());
    let mut host = None;
    for entry in stale {
        if let Some(veth) = &entry.host_veth {
            if host.is_none() {
                host = Netlink::current().ok();
            }
            if let Some(host) = &host {
                let (ip, ipv6) = cached_addresses(&entry);
                let free = |addr: String| {
                    keep_rules
                        .as_ref()
                        .is_some_and(|keep| !keep.contains(&addr))
                };
                let teardown = Teardown {
                    ifname: entry.ifname.clone(),
                    ip,
                    ip_free: ip.is_some_and(|a| free(a.to_string())),
                    ipv6,
                    ipv6_free: ipv6.is_some_and(|a| free(a.to_string())),
                    host_veth: Some(veth.clone()),
                    created_host_veth: None,
                };
                for e in wiring::unwire(host, None, &teardown).await {
                    tracing::warn!("GC {}: {e}", entry.attachment());
                }
            }
        }
        if let Err(e) = cache.remove(&entry.attachment()) {
            tracing::warn!("GC: {e}");
        }
    }

    match daemon {
        Ok(reply) => {
            for a in reply.released {
                tracing::info!("GC released {}/{}", a.container_id, a.ifname);
            }
            Ok(())
        }
        Err(e) => Err(e.to_cni()),
    }
}
