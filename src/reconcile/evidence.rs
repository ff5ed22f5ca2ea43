//! Evidence from the host: which pods the node still shows holding an IP (the plugin's result cache,
//! and whether each pod's network namespace still exists).

use std::net::Ipv4Addr;
use std::path::Path;

use crate::model::{AttachmentKey, PodRef};

/// Whether a network namespace path still exists. Empty means "not known" (the IPAM-only role under a
/// runtime that gives none): kept.
pub fn netns_exists(netns: &str) -> bool {
    netns.is_empty() || Path::new(netns).exists()
}

/// A pod the host says holds an IP: one entry of the plugin's result cache whose netns still exists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostClaim {
    pub ip: Ipv4Addr,
    pub attachment: AttachmentKey,
    pub pod: PodRef,
    pub sticky_key: Option<String>,
    pub netns: String,
}

/// Reads every network's result cache under `root` (`<root>/<network>/<container>@<ifname>.json`) and
/// keeps the entries whose network namespace still exists. A missing root is no evidence, not an error.
pub fn host_claims(root: &Path, netns_alive: &(dyn Fn(&str) -> bool + Sync)) -> Vec<HostClaim> {
    let Ok(dirs) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    let mut claims = Vec::new();
    for d in dirs.flatten() {
        if !d.path().is_dir() {
            continue;
        }
        let network = d.file_name().to_string_lossy().into_owned();
        let (entries, errors) = eniipam_api::cache::ResultCache::new(root, &network).list();
        for e in errors {
            tracing::warn!(error = %e, "unreadable plugin cache entry: not used as evidence");
        }
        for e in entries {
            if e.netns.is_empty() || !netns_alive(&e.netns) {
                continue;
            }
            claims.push(HostClaim {
                ip: e.ip,
                attachment: e.attachment(),
                pod: e.pod.clone().unwrap_or_default(),
                sticky_key: e.sticky_key.clone(),
                netns: e.netns.clone(),
            });
        }
    }
    claims
}
