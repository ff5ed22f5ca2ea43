//! The four witnesses, observed once: the daemon (Introspect `Pool`, and `Check` of every attachment
//! the soak tracks: what the pool holds), the store (the SQLite file, opened read-only), EC2
//! (mockcloud's world) and the host (the plugin's result cache). [`super::checker`] holds an
//! [`Observation`] against the runtime's model.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use eniipam_api::cache::ResultCache;
use eniipam_api::pb;
use mockcloud::MockCloud;
use rusqlite::{Connection, OpenFlags};
use tokio::time::Instant;
use tonic::transport::Channel;

use super::model::Key;
use super::runtime::{Addrs, result_addrs};

/// EC2's truth about the instance.
#[derive(Clone, Debug, Default)]
pub struct Ec2View {
    /// ENIs attached (or attaching) to the instance.
    pub attached: BTreeSet<String>,
    /// Secondary IP → its ENI, over the attached ENIs.
    pub ip_eni: BTreeMap<Ipv4Addr, String>,
    /// Attached secondary ENIs (device > 0): (attachment id, secondary IPs).
    pub secondary_enis: BTreeMap<String, (String, Vec<Ipv4Addr>)>,
    /// Secondary IP → its ENI, over every ENI in the account (attached or not).
    pub all_ip_eni: BTreeMap<Ipv4Addr, String>,
    /// The /80s on the instance's eth0 (device 0).
    pub eth0_prefixes6: Vec<ipnet::Ipv6Net>,
    /// The instance's eth0 (device 0) and its secondary IPs.
    pub eth0: Option<(String, Vec<Ipv4Addr>)>,
    /// Addresses inside the `/28`s of the instance's attached ENIs (burst prefixes, prefix
    /// delegation) → the ENI and the prefix. They also count among the ENI's IPs above.
    pub prefix_of: BTreeMap<Ipv4Addr, (String, ipnet::Ipv4Net)>,
    /// Every ENI in the account: its subnet, groups and network tag.
    pub eni_meta: BTreeMap<String, EniMeta>,
}

/// What EC2 says an ENI is made of (the network-profiles mode's checks).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EniMeta {
    pub subnet: String,
    /// Sorted.
    pub groups: Vec<String>,
    /// Its `eniipam.io/network` tag (the profile it was created for), if any.
    pub network: Option<String>,
}

impl Ec2View {
    pub fn read(mock: &MockCloud, instance_id: &str) -> anyhow::Result<Self> {
        let inst = mock
            .instance(instance_id)
            .context("the instance is gone from mockcloud")?;
        let mut v = Self::default();
        for e in &inst.enis {
            let Some(att) = &e.attachment else { continue };
            if att.instance_id != instance_id || att.status == "detaching" {
                continue;
            }
            v.attached.insert(e.id.clone());
            for p in &e.ipv4_prefixes {
                for ip in p.hosts().chain([p.network(), p.broadcast()]) {
                    v.prefix_of.insert(ip, (e.id.clone(), *p));
                }
            }
            let ips = addresses(&e.secondary_ips, &e.ipv4_prefixes);
            for ip in &ips {
                v.ip_eni.insert(*ip, e.id.clone());
            }
            if att.device_index == 0 {
                v.eth0_prefixes6.extend(e.ipv6_prefixes.iter().copied());
                v.eth0 = Some((e.id.clone(), ips.clone()));
            }
            if att.device_index > 0 {
                v.secondary_enis.insert(e.id.clone(), (att.id.clone(), ips));
            }
        }
        for e in mock.network_interfaces() {
            for ip in addresses(&e.secondary_ips, &e.ipv4_prefixes) {
                v.all_ip_eni.insert(ip, e.id.clone());
            }
            let mut groups = e.security_groups.clone();
            groups.sort();
            v.eni_meta.insert(
                e.id.clone(),
                EniMeta {
                    subnet: e.subnet_id.clone(),
                    groups,
                    network: e
                        .tags
                        .get(super::profiles::NETWORK_TAG)
                        .filter(|t| !t.is_empty())
                        .cloned(),
                },
            );
        }
        Ok(v)
    }
}

/// An ENI's IPv4 addresses besides its primary: its secondary IPs and every address of its `/28`s.
fn addresses(secondary: &[Ipv4Addr], prefixes: &[ipnet::Ipv4Net]) -> Vec<Ipv4Addr> {
    let mut out = secondary.to_vec();
    for p in prefixes {
        out.extend(p.hosts().chain([p.network(), p.broadcast()]));
    }
    out.sort();
    out.dedup();
    out
}

/// One assigned row of the state file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreRow {
    pub ip: Ipv4Addr,
    pub eni_id: String,
    pub key: Key,
}

/// The assigned rows of the state file, read through a read-only connection.
pub fn read_store(path: &Path) -> anyhow::Result<Vec<StoreRow>> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .with_context(|| format!("opening {} read-only", path.display()))?;
    conn.busy_timeout(Duration::from_secs(5))?;
    let mut stmt = conn.prepare(
        "SELECT ip, eni_id, container_id, ifname FROM ips WHERE state = 'assigned' ORDER BY ip",
    )?;
    let rows = stmt
        .query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, String>(3)?,
            ))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    rows.into_iter()
        .map(|(ip, eni_id, c, i)| {
            Ok(StoreRow {
                ip: ip
                    .parse()
                    .with_context(|| format!("state file row with ip {ip:?}"))?,
                eni_id,
                key: (c, i),
            })
        })
        .collect()
}

/// One assigned IPv6 row of the state file (`ipv6_ips`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreRow6 {
    pub ip: Ipv6Addr,
    pub key: Key,
}

/// The IPv6 tables of the state file: the /80 on record and the assigned rows.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Store6 {
    pub prefix: Option<ipnet::Ipv6Net>,
    pub rows: Vec<StoreRow6>,
}

/// The IPv6 tables, through a read-only connection (schema v4; empty before the daemon takes a /80).
pub fn read_store6(path: &Path) -> anyhow::Result<Store6> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .with_context(|| format!("opening {} read-only", path.display()))?;
    conn.busy_timeout(Duration::from_secs(5))?;
    let prefix: Option<String> = conn
        .prepare("SELECT prefix FROM ipv6_prefix WHERE id = 1")?
        .query_map([], |r| r.get::<_, String>(0))?
        .next()
        .transpose()?;
    let prefix = prefix
        .map(|p| {
            p.parse()
                .with_context(|| format!("state file ipv6_prefix {p:?}"))
        })
        .transpose()?;
    let mut stmt = conn.prepare(
        "SELECT ip, container_id, ifname FROM ipv6_ips WHERE state = 'assigned' ORDER BY ip",
    )?;
    let rows = stmt
        .query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
            ))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    let rows = rows
        .into_iter()
        .map(|(ip, c, i)| {
            Ok(StoreRow6 {
                ip: ip
                    .parse()
                    .with_context(|| format!("state file ipv6_ips row with ip {ip:?}"))?,
                key: (c, i),
            })
        })
        .collect::<anyhow::Result<_>>()?;
    Ok(Store6 { prefix, rows })
}

/// What the plugin's result cache says of one attachment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cached {
    pub network: usize,
    pub addrs: Addrs,
    /// The daemon answered that the pod's egress leaves by its own ENI (a strict profile's pod).
    pub own_eni_egress: bool,
}

/// Everything one check looks at.
#[derive(Clone, Debug)]
pub struct Observation {
    pub at: Instant,
    pub pool: pb::PoolReply,
    /// What the pool holds, per tracked attachment (`Check`).
    pub held: BTreeMap<Key, Ipv4Addr>,
    /// What the /80's book holds, per tracked attachment (`Check`'s `ipv6`).
    pub held6: BTreeMap<Key, Ipv6Addr>,
    pub store: Vec<StoreRow>,
    pub store6: Store6,
    pub ec2: Ec2View,
    /// The plugin's result cache.
    pub cache: BTreeMap<Key, Cached>,
}

/// Where the witnesses are.
pub struct Witnesses<'a> {
    pub channel: Channel,
    pub store_path: &'a Path,
    pub mock: &'a MockCloud,
    pub instance_id: &'a str,
    pub cache_dir: &'a Path,
    pub networks: &'a [String],
}

impl Witnesses<'_> {
    /// Observes everything, asking the pool about `tracked` (plus every attachment the store names).
    pub async fn observe(&self, tracked: &BTreeSet<Key>) -> anyhow::Result<Observation> {
        let pool = pb::introspect_client::IntrospectClient::new(self.channel.clone())
            .pool(pb::PoolRequest {})
            .await
            .context("Introspect.Pool")?
            .into_inner();
        let store = read_store(self.store_path)?;
        let store6 = read_store6(self.store_path)?;
        let mut keys = tracked.clone();
        keys.extend(store.iter().map(|r| r.key.clone()));
        keys.extend(store6.rows.iter().map(|r| r.key.clone()));
        let mut ipam = pb::ipam_client::IpamClient::new(self.channel.clone());
        let mut held = BTreeMap::new();
        let mut held6 = BTreeMap::new();
        for (c, i) in &keys {
            let r = ipam
                .check(pb::CheckRequest {
                    api_version: eniipam_api::API_VERSION,
                    container_id: c.clone(),
                    ifname: i.clone(),
                    ip: String::new(),
                    network: String::new(),
                    ..Default::default()
                })
                .await
                .with_context(|| format!("Ipam.Check {c}/{i}"))?
                .into_inner();
            // `ok` is false for a dual-stack attachment holding one family: what it holds is
            // still what it holds.
            if !r.ip.is_empty() {
                let ip: Ipv4Addr =
                    r.ip.parse()
                        .with_context(|| format!("Check {c}/{i} answered ip {:?}", r.ip))?;
                held.insert((c.clone(), i.clone()), ip);
            }
            if !r.ipv6.is_empty() {
                let ip: Ipv6Addr = r
                    .ipv6
                    .parse()
                    .with_context(|| format!("Check {c}/{i} answered ipv6 {:?}", r.ipv6))?;
                held6.insert((c.clone(), i.clone()), ip);
            }
        }
        let ec2 = Ec2View::read(self.mock, self.instance_id)?;
        let mut cache = BTreeMap::new();
        for (n, name) in self.networks.iter().enumerate() {
            let (entries, errors) = ResultCache::new(self.cache_dir, name).list();
            if let Some(e) = errors.first() {
                anyhow::bail!("reading the plugin's result cache: {e}");
            }
            for e in entries {
                // An IPv6-only entry keeps 0.0.0.0 as its IPv4; its IPv6 is in the result.
                let addrs = Addrs {
                    v4: Some(e.ip).filter(|ip| !ip.is_unspecified()),
                    v6: result_addrs(&e.result).v6,
                };
                cache.insert(
                    (e.container_id.clone(), e.ifname.clone()),
                    Cached {
                        network: n,
                        addrs,
                        own_eni_egress: e.own_eni_egress,
                    },
                );
            }
        }
        Ok(Observation {
            at: Instant::now(),
            pool,
            held,
            held6,
            store,
            store6,
            ec2,
            cache,
        })
    }
}
