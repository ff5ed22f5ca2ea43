//! The four witnesses, observed once: the daemon (Introspect `Pool`, and `Check` of every attachment
//! the soak tracks: what the pool holds), the store (the SQLite file, opened read-only), EC2
//! (mockcloud's world) and the host (the plugin's result cache). [`super::checker`] holds an
//! [`Observation`] against the runtime's model.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
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
            for ip in &e.secondary_ips {
                v.ip_eni.insert(*ip, e.id.clone());
            }
            if att.device_index > 0 {
                v.secondary_enis
                    .insert(e.id.clone(), (att.id.clone(), e.secondary_ips.clone()));
            }
        }
        for e in mock.network_interfaces() {
            for ip in &e.secondary_ips {
                v.all_ip_eni.insert(*ip, e.id.clone());
            }
        }
        Ok(v)
    }
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

/// Everything one check looks at.
#[derive(Clone, Debug)]
pub struct Observation {
    pub at: Instant,
    pub pool: pb::PoolReply,
    /// What the pool holds, per tracked attachment (`Check`).
    pub held: BTreeMap<Key, Ipv4Addr>,
    pub store: Vec<StoreRow>,
    pub ec2: Ec2View,
    /// The plugin's result cache: attachment → (network index, IP).
    pub cache: BTreeMap<Key, (usize, Ipv4Addr)>,
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
        let mut keys = tracked.clone();
        keys.extend(store.iter().map(|r| r.key.clone()));
        let mut ipam = pb::ipam_client::IpamClient::new(self.channel.clone());
        let mut held = BTreeMap::new();
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
            if r.ok {
                let ip: Ipv4Addr =
                    r.ip.parse()
                        .with_context(|| format!("Check {c}/{i} answered ip {:?}", r.ip))?;
                held.insert((c.clone(), i.clone()), ip);
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
                cache.insert((e.container_id.clone(), e.ifname.clone()), (n, e.ip));
            }
        }
        Ok(Observation {
            at: Instant::now(),
            pool,
            held,
            store,
            ec2,
            cache,
        })
    }
}
