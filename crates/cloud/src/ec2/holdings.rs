//! [`Holdings`]: what each ENI holds as this client last learned it from EC2's own answers, so an
//! assign does not have to describe the ENI first.
//!
//! An assign by count needs to know what the ENI held before it: after an ambiguous failure
//! (timeout, 5xx) whatever appeared since is what the lost attempt assigned. Describing the ENI
//! before every assign costs one DescribeNetworkInterfaces per assign, from the same account
//! bucket every node of the fleet draws on. Instead, this client keeps the ENI's holdings from
//! the answers of its own calls: the create's reply, one describe the first time an ENI is
//! assigned to in the process's life, and every assign and unassign reply after that. The ENI actor
//! serialises every call on its ENI, so no other call changes the ENI between two of them; general
//! describes (reconcile) are never recorded here, since one sent before an assign and answered
//! after it would record an older state.
//!
//! Addresses given back are remembered as *gone* until EC2's own view (a describe) is recorded
//! again: IMDS lags, and may still list them for a while, which must not read as a new assign.
//! An ENI whose state became uncertain (a call failed after an ambiguous attempt) is forgotten,
//! and described again on its next assign.

use std::collections::{BTreeSet, HashMap};
use std::net::Ipv4Addr;
use std::sync::Mutex;

use eniipam_api::model::EniId;
use ipnet::{Ipv4Net, Ipv6Net};

use crate::{Eni, MetadataEni};

/// One kind of thing an ENI holds: single addresses, delegated `/28`s or delegated IPv6 `/80`s.
pub(super) trait Held: Ord + Copy + std::fmt::Debug + Send + Sync + 'static {
    /// This kind on an ENI as EC2 describes it.
    fn of_eni(e: &Eni) -> BTreeSet<Self>;
    /// This kind on an interface as IMDS lists it.
    fn of_imds(md: &MetadataEni) -> BTreeSet<Self>;
    /// This kind's ledger in an ENI's entry.
    fn ledger(entry: &mut Entry) -> &mut Ledger<Self>;
}

impl Held for Ipv4Addr {
    /// Every private IP, the primary included.
    fn of_eni(e: &Eni) -> BTreeSet<Self> {
        std::iter::once(e.primary_ip)
            .chain(e.secondary_ips.iter().copied())
            .collect()
    }
    fn of_imds(md: &MetadataEni) -> BTreeSet<Self> {
        md.ips.iter().copied().collect()
    }
    fn ledger(entry: &mut Entry) -> &mut Ledger<Self> {
        &mut entry.ips
    }
}

impl Held for Ipv4Net {
    fn of_eni(e: &Eni) -> BTreeSet<Self> {
        e.ipv4_prefixes.iter().copied().collect()
    }
    fn of_imds(md: &MetadataEni) -> BTreeSet<Self> {
        md.ipv4_prefixes.iter().copied().collect()
    }
    fn ledger(entry: &mut Entry) -> &mut Ledger<Self> {
        &mut entry.prefixes
    }
}

impl Held for Ipv6Net {
    fn of_eni(e: &Eni) -> BTreeSet<Self> {
        e.ipv6_prefixes.iter().copied().collect()
    }
    fn of_imds(md: &MetadataEni) -> BTreeSet<Self> {
        md.ipv6_prefixes.iter().copied().collect()
    }
    fn ledger(entry: &mut Entry) -> &mut Ledger<Self> {
        &mut entry.ipv6_prefixes
    }
}

/// What an ENI holds of one kind, and what it gave back since EC2's view was last recorded.
#[derive(Clone, Debug)]
pub(super) struct Ledger<T> {
    pub(super) now: BTreeSet<T>,
    pub(super) gone: BTreeSet<T>,
}

impl<T> Default for Ledger<T> {
    fn default() -> Self {
        Self {
            now: BTreeSet::new(),
            gone: BTreeSet::new(),
        }
    }
}

/// One ENI's holdings.
#[derive(Clone, Debug, Default)]
pub(super) struct Entry {
    /// The ENI's MAC: how IMDS names it.
    pub(super) mac: String,
    ips: Ledger<Ipv4Addr>,
    prefixes: Ledger<Ipv4Net>,
    ipv6_prefixes: Ledger<Ipv6Net>,
}

/// Every ENI's holdings (see the module docs).
#[derive(Debug, Default)]
pub(super) struct Holdings(Mutex<HashMap<EniId, Entry>>);

impl Holdings {
    fn with<R>(&self, f: impl FnOnce(&mut HashMap<EniId, Entry>) -> R) -> R {
        f(&mut self.0.lock().expect("holdings lock"))
    }

    /// EC2's own view of the ENI (a describe, a create's reply): what it holds, nothing gone.
    pub(super) fn record(&self, eni: &Eni) {
        let entry = Entry {
            mac: eni.mac.clone(),
            ips: Ledger {
                now: Ipv4Addr::of_eni(eni),
                gone: BTreeSet::new(),
            },
            prefixes: Ledger {
                now: Ipv4Net::of_eni(eni),
                gone: BTreeSet::new(),
            },
            ipv6_prefixes: Ledger {
                now: Ipv6Net::of_eni(eni),
                gone: BTreeSet::new(),
            },
        };
        self.with(|m| m.insert(eni.id.clone(), entry));
    }

    /// The ENI's MAC and its ledger of `T`, when known.
    pub(super) fn known<T: Held>(&self, eni: &EniId) -> Option<(String, Ledger<T>)> {
        self.with(|m| {
            m.get_mut(eni)
                .map(|e| (e.mac.clone(), T::ledger(e).clone()))
        })
    }

    /// EC2 assigned `new` to the ENI.
    pub(super) fn added<T: Held>(&self, eni: &EniId, new: &[T]) {
        self.with(|m| {
            if let Some(e) = m.get_mut(eni) {
                let l = T::ledger(e);
                for t in new {
                    l.gone.remove(t);
                    l.now.insert(*t);
                }
            }
        });
    }

    /// EC2 took `gone` back from the ENI.
    pub(super) fn removed<T: Held>(&self, eni: &EniId, gone: &[T]) {
        self.with(|m| {
            if let Some(e) = m.get_mut(eni) {
                let l = T::ledger(e);
                for t in gone {
                    l.now.remove(t);
                    l.gone.insert(*t);
                }
            }
        });
    }

    /// The ENI's state is uncertain (or it is deleted): its next assign describes it again.
    pub(super) fn forget(&self, eni: &EniId) {
        self.with(|m| m.remove(eni));
    }
}
