//! The pool's [`ChangeJournal`] on the state file (`store::changes`): what EC2 answered to the pool's
//! own address changes, for the startup rebuild to read when a restart comes within a minute of
//! them (EC2's describes are eventually consistent). A write that fails is logged and dropped: the
//! rebuild then reads the describe alone, as before the journal.

use std::net::Ipv4Addr;

use async_trait::async_trait;
use ipnet::Ipv4Net;

use crate::clock::unix_ms_now;
use crate::cloud::DESCRIBE_SETTLES;
use crate::model::EniId;
use crate::pool::ChangeJournal;
use crate::store::{Ec2Address, Ec2Change, Store};

/// The state file's journal of the pool's address changes.
pub struct StoreJournal {
    store: Store,
}

impl StoreJournal {
    pub fn new(store: Store) -> Self {
        Self { store }
    }

    /// Whether the change is in the file (nothing to write counts as written).
    async fn write(&self, eni: &EniId, addresses: Vec<Ec2Address>, change: Ec2Change) -> bool {
        if addresses.is_empty() {
            return true;
        }
        let n = addresses.len();
        if let Err(e) = self
            .store
            .record_ec2_change(
                eni.to_string(),
                addresses,
                change,
                unix_ms_now(),
                DESCRIBE_SETTLES,
            )
            .await
        {
            tracing::warn!(%eni, addresses = n, ?change, error = %e,
                "cannot journal an address change: a restart within a minute reads EC2's describe alone");
            return false;
        }
        true
    }
}

fn addresses(ips: &[Ipv4Addr], prefixes: &[Ipv4Net]) -> Vec<Ec2Address> {
    ips.iter()
        .map(|ip| Ec2Address::Ip(*ip))
        .chain(prefixes.iter().map(|p| Ec2Address::Prefix(*p)))
        .collect()
}

#[async_trait]
impl ChangeJournal for StoreJournal {
    async fn assigned(&self, eni: &EniId, ips: &[Ipv4Addr], prefixes: &[Ipv4Net]) {
        self.write(eni, addresses(ips, prefixes), Ec2Change::Assigned)
            .await;
    }

    async fn unassigning(&self, eni: &EniId, ips: &[Ipv4Addr], prefixes: &[Ipv4Net]) -> bool {
        self.write(eni, addresses(ips, prefixes), Ec2Change::Unassigned)
            .await
    }
}
