//! Evidence from the host: which pods the node still shows holding an IP (the plugin's result cache),
//! and whether each pod's network namespace is alive, gone, or something the daemon cannot see.
//!
//! Evidence the daemon cannot see means *unknown*, never *gone*: a pod is only released on the
//! host's word when its netns path lies in a directory the daemon sees the host's view of and the
//! file is absent there. containerd's `netns_mounts_under_state_dir`, cri-dockerd, or a DaemonSet
//! without the hostPath mounts put netns files where the daemon cannot look; those pods are kept
//! (CNI GC and the API-server source catch the ones that really died).

use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};

use crate::model::{AttachmentKey, PodRef};
use crate::pool::{AllocationSeed, AttachmentMeta};

/// What the host says about one pod network namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NetnsState {
    /// The netns file exists.
    Alive,
    /// The file is absent from a directory the daemon sees the host's view of.
    Gone,
    /// No path, or a path the daemon cannot see: nothing is concluded.
    Unknown,
}

/// The directories where the daemon sees the host's pod network namespaces.
#[derive(Clone, Debug, Default)]
pub struct NetnsView {
    visible: Vec<PathBuf>,
}

impl NetnsView {
    /// The view of `dirs` (configured; `/var/run/netns` and `/run/netns` by default): each counts when
    /// it exists and either holds an entry or lies on a mount other than the root filesystem (a
    /// hostPath mount in a container, the host's `/run` tmpfs on a node). An empty directory on the
    /// container's own root filesystem is what an unmounted hostPath looks like: not visible.
    pub fn of(dirs: &[PathBuf]) -> Self {
        let mounts = mount_points();
        let visible = dirs
            .iter()
            .filter(|d| d.is_dir())
            .filter(|d| {
                let non_empty = std::fs::read_dir(d).is_ok_and(|mut r| r.next().is_some());
                non_empty || on_non_root_mount(d, &mounts)
            })
            .cloned()
            .collect();
        Self { visible }
    }

    /// A view that sees every directory (tests of the pure merge).
    pub fn everything() -> Self {
        Self {
            visible: vec![PathBuf::from("/")],
        }
    }

    /// What the host says about `netns`.
    pub fn state(&self, netns: &str) -> NetnsState {
        if netns.is_empty() {
            return NetnsState::Unknown;
        }
        let path = Path::new(netns);
        if path.exists() {
            return NetnsState::Alive;
        }
        let seen = path
            .parent()
            .is_some_and(|parent| self.visible.iter().any(|d| parent.starts_with(d)));
        if seen {
            NetnsState::Gone
        } else {
            NetnsState::Unknown
        }
    }
}

/// Mount points of this process's mount namespace (`/proc/self/mountinfo`, field 5).
fn mount_points() -> Vec<PathBuf> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|s| {
            s.lines()
                .filter_map(|l| l.split(' ').nth(4))
                .map(|m| PathBuf::from(m.replace("\\040", " ")))
                .collect()
        })
        .unwrap_or_default()
}

/// Whether `dir` is on a mount other than `/` (its nearest mount point ancestor is not the root).
fn on_non_root_mount(dir: &Path, mounts: &[PathBuf]) -> bool {
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_owned());
    mounts
        .iter()
        .filter(|m| dir.starts_with(m))
        .max_by_key(|m| m.components().count())
        .is_some_and(|m| m != Path::new("/"))
}

/// A pod the host says holds an IP: one entry of the plugin's result cache whose netns is not known
/// to be gone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostClaim {
    /// `0.0.0.0` for an IPv6-only attachment (matches no pool address).
    pub ip: Ipv4Addr,
    /// The attachment's IPv6 (ip_family ipv6 or dual), from the cached result.
    pub ipv6: Option<Ipv6Addr>,
    /// An IPv6-only pod's node-local egress IPv4.
    pub egress_ipv4: Option<Ipv4Addr>,
    /// The CNI network (the cache directory the entry is in).
    pub network: String,
    pub attachment: AttachmentKey,
    pub pod: PodRef,
    pub sticky_key: Option<String>,
    pub netns: String,
    /// The ENI the daemon answered the IP from, as the plugin cached it (empty in entries of older
    /// plugins).
    pub eni_id: String,
}

impl HostClaim {
    /// The allocation this claim proves: the IP is the attachment's.
    pub fn allocation(&self) -> AllocationSeed {
        AllocationSeed {
            ip: self.ip,
            attachment: self.attachment.clone(),
            pod: self.pod.clone(),
            sticky_key: self.sticky_key.clone(),
            meta: AttachmentMeta {
                network: self.network.clone(),
                netns: self.netns.clone(),
            },
        }
    }
}

/// What the host shows.
#[derive(Clone, Debug, Default)]
pub struct HostEvidence {
    /// The plugin's result cache is visible (its root directory exists and is readable). When it is
    /// not, the absence of a claim proves nothing.
    pub cache_visible: bool,
    pub claims: Vec<HostClaim>,
}

/// Reads every network's result cache under `root` (`<root>/<network>/<container>@<ifname>.json`) and
/// keeps the entries whose network namespace is not known to be gone. A missing root is no
/// evidence (`cache_visible` false), not an error.
pub fn host_evidence(root: &Path, netns: &NetnsView) -> HostEvidence {
    let Ok(dirs) = std::fs::read_dir(root) else {
        tracing::warn!(
            path = %root.display(),
            "the plugin's result cache is not visible: no evidence of which pods hold IPs"
        );
        return HostEvidence::default();
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
            if netns.state(&e.netns) == NetnsState::Gone {
                continue;
            }
            claims.push(HostClaim {
                ip: e.ip,
                ipv6: e.ipv6(),
                egress_ipv4: e.egress_ipv4,
                network: network.clone(),
                attachment: e.attachment(),
                pod: e.pod.clone().unwrap_or_default(),
                sticky_key: e.sticky_key.clone(),
                netns: e.netns.clone(),
                eni_id: e.eni_id.clone(),
            });
        }
    }
    HostEvidence {
        cache_visible: true,
        claims,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_netns_is_gone_only_where_the_daemon_sees_the_host() {
        let dir = tempfile::tempdir().unwrap();
        let seen = dir.path().join("netns");
        std::fs::create_dir(&seen).unwrap();
        std::fs::write(seen.join("alive"), b"").unwrap();
        let view = NetnsView::of(std::slice::from_ref(&seen));
        let at = |name: &str| seen.join(name).display().to_string();
        assert_eq!(view.state(&at("alive")), NetnsState::Alive);
        assert_eq!(view.state(&at("dead")), NetnsState::Gone);
        // Elsewhere (containerd's state dir, not mounted): unknown, never gone.
        assert_eq!(
            view.state("/run/containerd/io.containerd.grpc.v1.cri/sandboxes/x/netns"),
            NetnsState::Unknown
        );
        assert_eq!(view.state(""), NetnsState::Unknown);
        // An empty directory on the root filesystem is what an unmounted hostPath looks like.
        let empty = dir.path().join("empty");
        std::fs::create_dir(&empty).unwrap();
        let on_root = !on_non_root_mount(&empty, &mount_points());
        let view = NetnsView::of(std::slice::from_ref(&empty));
        let expected = if on_root {
            NetnsState::Unknown
        } else {
            NetnsState::Gone
        };
        assert_eq!(view.state(&empty.join("x").display().to_string()), expected);
        // A directory that does not exist is not visible.
        let view = NetnsView::of(&[dir.path().join("missing")]);
        assert_eq!(
            view.state(&dir.path().join("missing/x").display().to_string()),
            NetnsState::Unknown
        );
    }

    #[test]
    fn a_missing_cache_is_no_evidence() {
        let dir = tempfile::tempdir().unwrap();
        let ev = host_evidence(&dir.path().join("nope"), &NetnsView::everything());
        assert!(!ev.cache_visible);
        let ev = host_evidence(dir.path(), &NetnsView::everything());
        assert!(ev.cache_visible);
        assert!(ev.claims.is_empty());
    }
}
