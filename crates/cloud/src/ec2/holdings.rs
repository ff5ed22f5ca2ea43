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
//!
//! A general describe does teach the holdings of an ENI they do not know when nothing of this
//! client's could have made its answer stale ([`Holdings::quiet`]): no mutating call ran between
//! its sending and its answer, and the last one ended [`SETTLED`] (a minute) before it was sent
//! (EC2's API is eventually consistent). The startup's describe of the instance's ENIs, before the
//! pool makes a call, is such a one. Without it each ENI this client did not create cost a
//! describe of its own at its first assign, drawn from the account's describe bucket right when a
//! booting fleet drains it (500 nodes joining within 30 s: 1,300 describe attempts, 800
//! throttled, and on a tenth of the nodes eth0's first assign held up 20 s or more).

use std::collections::{BTreeSet, HashMap};
use std::net::Ipv4Addr;
use std::sync::Mutex;
use std::time::Duration;

use eniipam_api::model::EniId;
use ipnet::{Ipv4Net, Ipv6Net};
use tokio::time::Instant;

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

impl Entry {
    /// EC2's own view of the ENI: what it holds, nothing gone.
    fn of(eni: &Eni) -> Self {
        Self {
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
        }
    }
}

/// How long after this client's last mutating call a describe sent is taken as EC2's settled
/// view ([`crate::DESCRIBE_SETTLES`]). A minute leaves the startup's describe (no change of this
/// process before it) and a quiet node's reconcile (which re-learns an ENI forgotten after a lost
/// answer) their use.
pub(super) const SETTLED: Duration = crate::DESCRIBE_SETTLES;

/// Every ENI's holdings (see the module docs).
#[derive(Debug, Default)]
pub(super) struct Holdings(Mutex<State>);

#[derive(Debug, Default)]
struct State {
    enis: HashMap<EniId, Entry>,
    /// Mutating calls started and ended: a describe whose count is the same at its answer as at
    /// its sending saw no change of ours start or end meanwhile.
    changes: u64,
    /// Mutating calls running now.
    running: u32,
    /// When the last mutating call ended.
    last_ended: Option<Instant>,
}

/// A describe's sending, as [`Holdings::quiet`] needs it at the answer.
#[derive(Clone, Copy, Debug)]
pub(super) struct Sent {
    changes: u64,
    /// No mutating call ran at the sending, nor within [`SETTLED`] before it.
    settled: bool,
}

/// A mutating call of this client, counted until dropped (see [`Holdings::change`]).
pub(super) struct Change<'a>(&'a Holdings);

impl Drop for Change<'_> {
    fn drop(&mut self) {
        let mut st = self.0.lock();
        st.running -= 1;
        st.changes += 1;
        st.last_ended = Some(Instant::now());
    }
}

impl Holdings {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().expect("holdings lock")
    }

    fn with<R>(&self, f: impl FnOnce(&mut HashMap<EniId, Entry>) -> R) -> R {
        f(&mut self.lock().enis)
    }

    /// A mutating call starts; it ends when the guard drops. Any of them counts, whatever it
    /// changes: a describe around one is not recorded.
    pub(super) fn change(&self) -> Change<'_> {
        let mut st = self.lock();
        st.running += 1;
        st.changes += 1;
        Change(self)
    }

    /// An earlier process changed the ENIs at `at`: the describes this client learned from may
    /// predate the change's showing (EC2 is eventually consistent), so all they taught is forgotten,
    /// and a describe teaches again only once [`SETTLED`] has passed since `at`. Each ENI is
    /// described at its first assign until then.
    pub(super) fn changed_before_start(&self, at: Instant) {
        let mut st = self.lock();
        st.enis.clear();
        st.changes += 1;
        st.last_ended = Some(st.last_ended.map_or(at, |t| t.max(at)));
    }

    /// A general describe is being sent now.
    pub(super) fn sending(&self) -> Sent {
        let st = self.lock();
        let now = Instant::now();
        Sent {
            changes: st.changes,
            settled: st.running == 0 && st.last_ended.is_none_or(|t| t + SETTLED <= now),
        }
    }

    /// The answer of the describe `sent`: each ENI in it the holdings do not know is recorded,
    /// when no mutating call of this client could have made the answer stale (module docs).
    /// Returns how many were recorded.
    pub(super) fn quiet(&self, sent: Sent, enis: &[Eni]) -> usize {
        let mut st = self.lock();
        if !sent.settled || st.changes != sent.changes {
            return 0;
        }
        let mut learned = 0;
        for eni in enis {
            if !st.enis.contains_key(&eni.id) {
                st.enis.insert(eni.id.clone(), Entry::of(eni));
                learned += 1;
            }
        }
        learned
    }

    /// EC2's own view of the ENI (a describe, a create's reply): what it holds, nothing gone.
    pub(super) fn record(&self, eni: &Eni) {
        let entry = Entry::of(eni);
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
