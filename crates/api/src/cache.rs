//! Cached ADD results: what a DEL (or GC) needs to tear an attachment down when the daemon cannot
//! tell it.
//!
//! One JSON file per attachment at `<cache_dir>/<network name>/<container_id>@<ifname>.json` (a
//! container id never contains `@`, so the name is unambiguous). Files are written atomically (write
//! to a temporary file in the same directory, then rename over the entry) after a successful ADD, and
//! removed after DEL. They are not fsynced: an entry only matters while its pod's network namespace
//! exists, and a machine crash — the only thing an fsync guards against — takes every namespace with
//! it (a plugin or daemon crash leaves the page cache, and so the entry, intact). The two fsyncs cost
//! milliseconds on every ADD; the reference plugins do not fsync their state either. The format is
//! [`CacheEntry`], versioned by its `format` field; the
//! daemon may read these files (read-only) to learn which netns and host veth an IP was wired to.

use std::io::{self, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::{AttachmentKey, PodRef};

/// Default root of the cache (`cache_dir` in the conflist, `cni_cache_dir` in the daemon's configuration).
pub const DEFAULT_CACHE_DIR: &str = "/var/lib/cni/eniipam";

/// The current cache file format.
pub const CACHE_FORMAT: u32 = 1;

/// The host end of a pod's veth pair, as ADD created it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostVeth {
    /// Interface name in the host netns.
    pub name: String,
    /// Interface index in the host netns.
    pub index: u32,
    /// MAC address; a DEL only deletes a host veth of this name whose MAC still matches (so a stale DEL
    /// never removes a newer sandbox's veth).
    pub mac: String,
}

/// What one successful ADD set up.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheEntry {
    /// [`CACHE_FORMAT`].
    pub format: u32,
    /// Network name from the configuration.
    pub network: String,
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// `CNI_IFNAME`.
    pub ifname: String,
    /// `CNI_NETNS` at ADD time.
    pub netns: String,
    /// The pod, when the runtime named it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodRef>,
    /// The sticky key ADD sent, if any (DEL releases with `sticky` set when present).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sticky_key: Option<String>,
    /// The pod's IP.
    pub ip: Ipv4Addr,
    /// Policy-routing table of the IP's ENI; 0 for the primary ENI (no rules were added).
    pub route_table: u32,
    /// The ENI the IP belongs to.
    #[serde(default)]
    pub eni_id: String,
    /// The host veth; absent for the IPAM role (nothing was wired).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_veth: Option<HostVeth>,
    /// An IPv6-only pod's node-local IPv4 for egress: wired, never reported in `result`, so it is
    /// kept here for a daemon whose state file is lost to take back with the pod's IPv6 (entries of
    /// older plugins lack it: the pod then keeps its wiring, and the daemon hands it a new one only
    /// on its next ADD).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_ipv4: Option<Ipv4Addr>,
    /// The daemon answered that the pod's egress leaves by its own ENI with its own address (a
    /// network profile in the `strict` egress mode): in the main role the plugin put the host
    /// veth in [`crate::OWN_ENI_EGRESS_LINK_GROUP`]. Absent (false) in entries of older plugins.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub own_eni_egress: bool,
    /// The CNI result ADD printed (in 1.1.0 form).
    pub result: serde_json::Value,
}

impl CacheEntry {
    /// The attachment this entry belongs to.
    pub fn attachment(&self) -> AttachmentKey {
        AttachmentKey::new(self.container_id.clone(), self.ifname.clone())
    }

    /// The pod's IPv6, read from the cached result's `ips` (the plugin reports one IPv6 per
    /// attachment): the IPv6 has no field of its own, so entries written before IPv6 existed and
    /// after read alike.
    pub fn ipv6(&self) -> Option<Ipv6Addr> {
        self.result
            .get("ips")?
            .as_array()?
            .iter()
            .filter_map(|ip| ip.get("address")?.as_str())
            .filter_map(|a| a.split('/').next()?.parse::<IpAddr>().ok())
            .find_map(|a| match a {
                IpAddr::V6(v6) => Some(v6),
                IpAddr::V4(_) => None,
            })
    }
}

/// Why the cache could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// A filesystem operation failed.
    #[error("result cache {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// A cache file is not a [`CacheEntry`].
    #[error("result cache {path}: corrupt entry: {source}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// The decode error.
        #[source]
        source: serde_json::Error,
    },
}

/// The cache directory of one network.
#[derive(Clone, Debug)]
pub struct ResultCache {
    dir: PathBuf,
}

impl ResultCache {
    /// The cache of network `network` under `root`.
    pub fn new(root: &Path, network: &str) -> Self {
        Self {
            dir: root.join(network),
        }
    }

    /// The directory holding this network's entries.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file of `key`.
    pub fn path(&self, key: &AttachmentKey) -> PathBuf {
        self.dir
            .join(format!("{}@{}.json", key.container_id, key.ifname))
    }

    /// Writes `entry` atomically (temporary file, then rename), replacing any previous one.
    pub fn write(&self, entry: &CacheEntry) -> Result<(), CacheError> {
        let io_err = |path: &Path| {
            let path = path.to_owned();
            move |source| CacheError::Io { path, source }
        };
        std::fs::create_dir_all(&self.dir).map_err(io_err(&self.dir))?;
        let path = self.path(&entry.attachment());
        let tmp = self.dir.join(format!(
            ".{}@{}.{}.tmp",
            entry.container_id,
            entry.ifname,
            std::process::id()
        ));
        let bytes = serde_json::to_vec_pretty(entry).map_err(|e| CacheError::Io {
            path: path.clone(),
            source: io::Error::other(e),
        })?;
        let written = (|| {
            let mut file = std::fs::File::create(&tmp)?;
            file.write_all(&bytes)?;
            drop(file);
            std::fs::rename(&tmp, &path)
        })();
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written.map_err(io_err(&path))
    }

    /// The entry of `key`, if there is one.
    pub fn read(&self, key: &AttachmentKey) -> Result<Option<CacheEntry>, CacheError> {
        read_entry(&self.path(key))
    }

    /// Removes the entry of `key` (absent is fine).
    pub fn remove(&self, key: &AttachmentKey) -> Result<(), CacheError> {
        let path = self.path(key);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(CacheError::Io { path, source }),
        }
    }

    /// Every readable entry, plus the errors of unreadable ones (the caller decides whether to go on).
    pub fn list(&self) -> (Vec<CacheEntry>, Vec<CacheError>) {
        let mut entries = Vec::new();
        let mut errors = Vec::new();
        let dir = match std::fs::read_dir(&self.dir) {
            Ok(dir) => dir,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return (entries, errors),
            Err(source) => {
                errors.push(CacheError::Io {
                    path: self.dir.clone(),
                    source,
                });
                return (entries, errors);
            }
        };
        for item in dir {
            let path = match item {
                Ok(item) => item.path(),
                Err(source) => {
                    errors.push(CacheError::Io {
                        path: self.dir.clone(),
                        source,
                    });
                    continue;
                }
            };
            let is_entry = path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.ends_with(".json") && !n.starts_with('.'));
            if !is_entry {
                continue;
            }
            match read_entry(&path) {
                Ok(Some(entry)) => entries.push(entry),
                Ok(None) => {}
                Err(e) => errors.push(e),
            }
        }
        entries.sort_by_key(CacheEntry::attachment);
        (entries, errors)
    }
}

fn read_entry(path: &Path) -> Result<Option<CacheEntry>, CacheError> {
    match std::fs::read(path) {
        Ok(bytes) => {
            serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|source| CacheError::Corrupt {
                    path: path.to_owned(),
                    source,
                })
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(CacheError::Io {
            path: path.to_owned(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(container: &str) -> CacheEntry {
        CacheEntry {
            format: CACHE_FORMAT,
            network: "net".into(),
            container_id: container.into(),
            ifname: "eth0".into(),
            netns: "/run/netns/x".into(),
            pod: Some(PodRef {
                namespace: "ns".into(),
                name: "p".into(),
                uid: "u".into(),
            }),
            sticky_key: None,
            ip: Ipv4Addr::new(10, 0, 0, 5),
            route_table: 2,
            eni_id: "eni-0123abcd".into(),
            host_veth: Some(HostVeth {
                name: "eni0123456789a".into(),
                index: 7,
                mac: "02:00:00:00:00:01".into(),
            }),
            egress_ipv4: None,
            own_eni_egress: false,
            result: serde_json::json!({"ips": []}),
        }
    }

    #[test]
    fn the_ipv6_is_read_from_the_result_and_old_entries_still_parse() {
        let mut e = entry("v6");
        assert_eq!(e.ipv6(), None, "an IPv4-only result");
        e.result = serde_json::json!({"ips": [
            {"address": "10.0.0.5/32", "interface": 0},
            {"address": "2600:1f18::5/128", "interface": 0},
        ]});
        assert_eq!(e.ipv6(), Some("2600:1f18::5".parse().unwrap()));
        e.result = serde_json::json!({"ips": [{"address": "not an address"}]});
        assert_eq!(e.ipv6(), None, "a malformed address is no IPv6");
        // An entry a plugin wrote before `egress_ipv4` existed.
        let mut old = serde_json::to_value(entry("old")).unwrap();
        old.as_object_mut().unwrap().remove("egress_ipv4");
        let parsed: CacheEntry = serde_json::from_value(old).unwrap();
        assert_eq!(parsed.egress_ipv4, None);
        assert!(!parsed.own_eni_egress, "absent: not own-ENI egress");
        // Own-ENI egress (a strict profile's pod) is written only when set, and read back.
        let mut strict = entry("strict");
        strict.own_eni_egress = true;
        let v = serde_json::to_value(&strict).unwrap();
        assert_eq!(v["own_eni_egress"], true);
        assert_eq!(serde_json::from_value::<CacheEntry>(v).unwrap(), strict);
        let plain = serde_json::to_value(entry("plain")).unwrap();
        assert!(plain.get("own_eni_egress").is_none(), "{plain}");
    }

    #[test]
    fn write_read_list_remove() {
        let root = tempfile::tempdir().unwrap();
        let cache = ResultCache::new(root.path(), "net");
        assert!(cache.list().0.is_empty());
        let a = entry("aaa");
        let b = entry("bbb");
        cache.write(&a).unwrap();
        cache.write(&b).unwrap();
        assert_eq!(cache.read(&a.attachment()).unwrap().unwrap(), a);
        assert_eq!(cache.list().0, vec![a.clone(), b.clone()]);
        cache.remove(&a.attachment()).unwrap();
        cache.remove(&a.attachment()).unwrap();
        assert!(cache.read(&a.attachment()).unwrap().is_none());
        assert_eq!(
            cache.path(&b.attachment()).file_name().unwrap(),
            "bbb@eth0.json"
        );
        // No temporary files are left behind.
        let names: Vec<_> = std::fs::read_dir(cache.dir())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn corrupt_entries_are_reported_not_fatal() {
        let root = tempfile::tempdir().unwrap();
        let cache = ResultCache::new(root.path(), "net");
        cache.write(&entry("good")).unwrap();
        std::fs::write(cache.dir().join("bad@eth0.json"), b"{not json").unwrap();
        let (entries, errors) = cache.list();
        assert_eq!(entries.len(), 1);
        assert_eq!(errors.len(), 1);
        assert!(matches!(
            cache.read(&AttachmentKey::new("bad", "eth0")),
            Err(CacheError::Corrupt { .. })
        ));
    }
}
