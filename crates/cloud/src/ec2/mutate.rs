//! [`mutate`]: every mutating EC2 call, with the ambiguous-retry logic written once.
//!
//! A mutating call whose answer is lost (a timeout, a 5xx: [`is_ambiguous`]) may have taken effect
//! on EC2's side. Retrying it blindly could assign twice the IPs, or fail on a resource the lost
//! attempt already changed; reporting the error could leak what the lost attempt made. So from the
//! first ambiguous failure on, each failure is followed by a look at EC2 ([`Verify`]) before the
//! call is retried or its error reported: when the look finds what the call was meant to do, that
//! is the answer. The looks the calls take are here too ([`Ec2Cloud::described`] and its kin): an
//! assign's is IMDS first (the instance's own view, which costs no EC2 budget), EC2 only when IMDS
//! does not settle it within [`AMBIGUOUS_IMDS_WAIT`].

use std::collections::BTreeSet;
use std::future::{Future, Ready};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use eniipam_api::model::EniId;
use tokio::time::Instant;

use super::Ec2Cloud;
use super::classify::is_ambiguous;
use super::holdings::{Held, Holdings, Ledger};
use crate::limiter::{CallClass, Limiter};
use crate::{CloudError, CloudResult, Eni, Metadata};

/// How a mutating call tells, after an ambiguous failure, whether its lost attempt took effect.
pub(super) enum Verify<T, F> {
    /// Nothing to look at: repeating the call is safe (EC2 makes it idempotent, like
    /// CreateNetworkInterface's ClientToken, or a repeat does no harm).
    Nothing,
    /// A describe after every failure from the first ambiguous one on; `Some` is what the lost
    /// attempt did, and the call's answer.
    Describe(F),
    /// A later attempt failing with not found means the lost attempt did it (a delete); this is
    /// the answer then.
    NotFoundAfter(T),
}

/// The type of [`Verify::Nothing`]'s (absent) describe.
pub(super) type NoDescribe<T> = fn() -> Ready<CloudResult<Option<T>>>;

impl<T> Verify<T, NoDescribe<T>> {
    /// [`Verify::Nothing`], with its describe's type named.
    pub(super) fn nothing() -> Self {
        Verify::Nothing
    }

    /// [`Verify::NotFoundAfter`], with its describe's type named.
    pub(super) fn not_found_after(answer: T) -> Self {
        Verify::NotFoundAfter(answer)
    }
}

/// Attempts of `send()` through the mutating bucket, retried per the limiter's policy; after an
/// ambiguous failure, `verify` decides whether the lost attempt's effect is the answer. The errors,
/// retries, metrics and log lines are the limiter's ([`Limiter::attempt`], [`crate::limiter::Retry`]).
pub(super) async fn mutate<T, S, SF, F, VF>(
    limiter: &Limiter,
    holdings: &Holdings,
    api: &'static str,
    mut send: S,
    mut verify: Verify<T, F>,
) -> CloudResult<T>
where
    S: FnMut() -> SF,
    SF: Future<Output = CloudResult<T>>,
    F: FnMut() -> VF,
    VF: Future<Output = CloudResult<Option<T>>>,
{
    // Counted as a change from before its first attempt to after its last look: a describe
    // around it may not show what it did (see `holdings`).
    let _change = holdings.change();
    let mut retry = limiter.retry(api);
    let mut ambiguous = false;
    loop {
        let e = match limiter.attempt(api, CallClass::Mutating, send()).await {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        if ambiguous && e.is_not_found() {
            // Our own lost attempt did it.
            if let Verify::NotFoundAfter(answer) = verify {
                return Ok(answer);
            }
        }
        ambiguous |= is_ambiguous(&e);
        let final_err: Option<CloudError> = retry.after_failure(e).await.err();
        if ambiguous
            && let Verify::Describe(describe) = &mut verify
            && let Some(answer) = describe().await?
        {
            return Ok(answer);
        }
        if let Some(e) = final_err {
            return Err(e);
        }
    }
}

/// How long, after an ambiguous assign, IMDS is given to show what the lost attempt assigned
/// before EC2 is asked (see [`Ec2Cloud::with_instance_view`]); about twice the IMDS lag seen on
/// EC2 after an assign.
pub const AMBIGUOUS_IMDS_WAIT: Duration = Duration::from_secs(2);

/// How often IMDS is read while it settles an ambiguous assign.
const IMDS_POLL: Duration = Duration::from_millis(100);

/// The instance's own view (IMDS), which settles an ambiguous assign without EC2's budget.
#[derive(Clone)]
pub(super) struct InstanceView {
    pub(super) metadata: Arc<dyn Metadata>,
    /// How long IMDS may take to show an assign before EC2 is asked.
    pub(super) settle: Duration,
}

impl std::fmt::Debug for InstanceView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InstanceView")
            .field("settle", &self.settle)
            .finish_non_exhaustive()
    }
}

/// The looks at EC2 (and at IMDS) the mutating calls verify with.
impl Ec2Cloud {
    /// An ENI as EC2 sees it now; not found (for `api`) when EC2 does not know it.
    pub(super) async fn described(&self, api: &'static str, eni: &EniId) -> CloudResult<Eni> {
        self.describe_one(eni)
            .await?
            .ok_or_else(|| CloudError::NotFound {
                api: api.to_owned(),
                code: "InvalidNetworkInterfaceID.NotFound".into(),
                message: format!("{eni} does not exist"),
            })
    }

    /// What an ENI holds of `T` as EC2 sees it now; the view is recorded in the holdings.
    pub(super) async fn held<T: Held>(
        &self,
        api: &'static str,
        eni: &EniId,
    ) -> CloudResult<BTreeSet<T>> {
        let described = self.described(api, eni).await?;
        self.holdings.record(&described);
        Ok(T::of_eni(&described))
    }

    /// The ENI's MAC and what it holds of `T` before an assign: from the holdings, or (the first
    /// time in this process, or after an uncertain call) from one describe.
    async fn baseline<T: Held>(
        &self,
        api: &'static str,
        eni: &EniId,
    ) -> CloudResult<(String, Ledger<T>)> {
        if let Some(known) = self.holdings.known::<T>(eni) {
            return Ok(known);
        }
        let described = self.described(api, eni).await?;
        self.holdings.record(&described);
        let now = T::of_eni(&described);
        Ok((
            described.mac,
            Ledger {
                now,
                gone: BTreeSet::new(),
            },
        ))
    }

    /// What appeared on the ENI since `before`, after an ambiguous assign of `count`: read from
    /// IMDS while it settles (exactly `count` new ones: EC2 assigns all or nothing), else from EC2.
    async fn appeared<T: Held>(
        &self,
        api: &'static str,
        eni: &EniId,
        mac: &str,
        before: &Ledger<T>,
        count: usize,
    ) -> CloudResult<Vec<T>> {
        if let Some(view) = &self.view {
            let deadline = Instant::now() + view.settle;
            loop {
                match view.metadata.interface(mac).await {
                    Ok(Some(md)) if md.eni_id == *eni => {
                        let new: Vec<T> = T::of_imds(&md)
                            .into_iter()
                            .filter(|t| !before.now.contains(t) && !before.gone.contains(t))
                            .collect();
                        if new.len() == count {
                            tracing::debug!(%eni, "IMDS settles the ambiguous assign");
                            return Ok(new);
                        }
                        if new.len() > count {
                            break; // more than one assign could explain: EC2 decides
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::debug!(%eni, error = %e, "IMDS read failed while settling an assign")
                    }
                }
                if Instant::now() + IMDS_POLL > deadline {
                    break;
                }
                tokio::time::sleep(IMDS_POLL).await;
            }
            tracing::info!(%eni, "IMDS does not settle the ambiguous assign; asking EC2");
        }
        let now: BTreeSet<T> = self.held(api, eni).await?;
        Ok(now.difference(&before.now).copied().collect())
    }

    /// An assign of `count` (IPs or prefixes, by `T`): one call on the normal path, EC2's reply
    /// naming what it assigned. What the ENI held before comes from the holdings, so that after an
    /// ambiguous failure whatever appeared since is what the lost attempt assigned (`found` logs it),
    /// and is not assigned again; IMDS is read for it first ([`Ec2Cloud::appeared`]). A reply that
    /// does not list what it assigned (older API shape) is read from EC2's view. Callers serialise
    /// calls per ENI (the ENI actor owns all of them), so nothing else adds to this ENI meanwhile.
    pub(super) async fn assign_counted<T, S, SF>(
        &self,
        api: &'static str,
        eni: &EniId,
        count: u32,
        send: S,
        found: impl Fn(&[T]),
    ) -> CloudResult<Vec<T>>
    where
        T: Held,
        S: FnMut() -> SF,
        SF: Future<Output = CloudResult<Vec<T>>>,
    {
        let (mac, before) = self.baseline::<T>(api, eni).await?;
        let uncertain = AtomicBool::new(false);
        let assigned = || async {
            uncertain.store(true, Ordering::Relaxed);
            let new = self
                .appeared(api, eni, &mac, &before, count as usize)
                .await?;
            if !new.is_empty() {
                found(&new);
            }
            Ok((!new.is_empty()).then_some(new))
        };
        let got = match mutate(
            &self.limiter,
            &self.holdings,
            api,
            send,
            Verify::Describe(assigned),
        )
        .await
        {
            Ok(got) if got.is_empty() => {
                let now: BTreeSet<T> = self.held(api, eni).await?;
                now.difference(&before.now).copied().collect()
            }
            Ok(got) => got,
            Err(e) => {
                if uncertain.load(Ordering::Relaxed) {
                    self.holdings.forget(eni);
                }
                return Err(e);
            }
        };
        self.holdings.added(eni, &got);
        Ok(got)
    }

    /// An assign by value (IPv4 addresses, IPv6 prefixes, by `T`) that, after an ambiguous failure,
    /// is done when EC2 shows all of `wanted` on the ENI (the lost attempt landed), so a retry is
    /// never refused as "in use" by our own address. The holdings learn what was assigned; after a
    /// failure, not knowing which part of the story EC2 saw, the next assign describes the ENI.
    pub(super) async fn assign_named<T, S, SF>(
        &self,
        api: &'static str,
        eni: &EniId,
        wanted: &[T],
        send: S,
    ) -> CloudResult<Vec<T>>
    where
        T: Held,
        S: FnMut() -> SF,
        SF: Future<Output = CloudResult<Vec<T>>>,
    {
        let assigned = || async {
            let now: BTreeSet<T> = self.held(api, eni).await?;
            let landed = wanted.iter().all(|w| now.contains(w));
            if landed {
                tracing::info!(%eni, api, ?wanted, "assign had succeeded despite the error; not assigning again");
            }
            Ok(landed.then(|| wanted.to_vec()))
        };
        let result = mutate(
            &self.limiter,
            &self.holdings,
            api,
            send,
            Verify::Describe(assigned),
        )
        .await;
        match &result {
            Ok(got) => self.holdings.added(eni, got),
            Err(_) => self.holdings.forget(eni),
        }
        result
    }

    /// An unassign (IPs or prefixes, by `T`) that, after an ambiguous failure, is done when EC2
    /// shows none of `gone` on the ENI any more. (IMDS cannot settle it: its lag may show an older
    /// state in which the addresses were not assigned yet.)
    pub(super) async fn unassign_verified<T, S, SF>(
        &self,
        api: &'static str,
        eni: &EniId,
        gone: &[T],
        send: S,
    ) -> CloudResult<()>
    where
        T: Held,
        S: FnMut() -> SF,
        SF: Future<Output = CloudResult<()>>,
    {
        let uncertain = AtomicBool::new(false);
        let unassigned = || async {
            uncertain.store(true, Ordering::Relaxed);
            let now: BTreeSet<T> = self.held(api, eni).await?;
            Ok(gone.iter().all(|g| !now.contains(g)).then_some(()))
        };
        match mutate(
            &self.limiter,
            &self.holdings,
            api,
            send,
            Verify::Describe(unassigned),
        )
        .await
        {
            Ok(()) => {
                self.holdings.removed(eni, gone);
                Ok(())
            }
            Err(e) => {
                if uncertain.load(Ordering::Relaxed) {
                    self.holdings.forget(eni);
                }
                Err(e)
            }
        }
    }
}
