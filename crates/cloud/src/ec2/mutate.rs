//! [`mutate`]: every mutating EC2 call, with the ambiguous-retry logic written once.
//!
//! A mutating call whose answer is lost (a timeout, a 5xx: [`is_ambiguous`]) may have taken effect
//! on EC2's side. Retrying it blindly could assign twice the IPs, or fail on a resource the lost
//! attempt already changed; reporting the error could leak what the lost attempt made. So from the
//! first ambiguous failure on, each failure is followed by a look at EC2 ([`Verify`]) before the
//! call is retried or its error reported: when the look finds what the call was meant to do, that
//! is the answer. The looks the calls take are here too ([`Ec2Cloud::described`] and its kin).

use std::collections::BTreeSet;
use std::future::{Future, Ready};
use std::net::Ipv4Addr;

use eniipam_api::model::EniId;
use ipnet::Ipv4Net;

use super::Ec2Cloud;
use super::classify::is_ambiguous;
use crate::limiter::{CallClass, Limiter};
use crate::{CloudError, CloudResult, Eni};

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

/// The looks at EC2 the mutating calls verify with.
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

    /// What an ENI holds as EC2 sees it now, read by `of` ([`ips_of`], [`prefixes_of`]).
    pub(super) async fn held<T>(
        &self,
        api: &'static str,
        eni: &EniId,
        of: fn(Eni) -> BTreeSet<T>,
    ) -> CloudResult<BTreeSet<T>> {
        Ok(of(self.described(api, eni).await?))
    }

    /// An assign by count (IPs or prefixes: `of` reads which from an ENI): what the ENI held
    /// before the first attempt, so that after an ambiguous failure whatever appeared since is what
    /// the lost attempt assigned (`found` logs it), and is not assigned again. A reply that does not
    /// list what it assigned (older API shape) is read from EC2's view too. Callers serialise calls
    /// per ENI (the ENI actor owns all of them), so nothing else adds to this ENI meanwhile.
    pub(super) async fn assign_counted<T, S, SF>(
        &self,
        api: &'static str,
        eni: &EniId,
        of: fn(Eni) -> BTreeSet<T>,
        send: S,
        found: impl Fn(&[T]),
    ) -> CloudResult<Vec<T>>
    where
        T: Ord + Copy,
        S: FnMut() -> SF,
        SF: Future<Output = CloudResult<Vec<T>>>,
    {
        let before = self.held(api, eni, of).await?;
        let appeared = |now: BTreeSet<T>| -> Vec<T> { now.difference(&before).copied().collect() };
        let assigned = || async {
            let new = appeared(self.held(api, eni, of).await?);
            if !new.is_empty() {
                found(&new);
            }
            Ok((!new.is_empty()).then_some(new))
        };
        let got = mutate(&self.limiter, api, send, Verify::Describe(assigned)).await?;
        if got.is_empty() {
            return Ok(appeared(self.held(api, eni, of).await?));
        }
        Ok(got)
    }

    /// An unassign (IPs or prefixes: `of` reads which from an ENI) that, after an ambiguous
    /// failure, is done when EC2 shows none of `gone` on the ENI any more.
    pub(super) async fn unassign_verified<T, S, SF>(
        &self,
        api: &'static str,
        eni: &EniId,
        of: fn(Eni) -> BTreeSet<T>,
        gone: &[T],
        send: S,
    ) -> CloudResult<()>
    where
        T: Ord,
        S: FnMut() -> SF,
        SF: Future<Output = CloudResult<()>>,
    {
        let unassigned = || async {
            let now = self.held(api, eni, of).await?;
            Ok(gone.iter().all(|g| !now.contains(g)).then_some(()))
        };
        mutate(&self.limiter, api, send, Verify::Describe(unassigned)).await
    }
}

/// Every private IP of an ENI, its primary included.
pub(super) fn ips_of(e: Eni) -> BTreeSet<Ipv4Addr> {
    std::iter::once(e.primary_ip)
        .chain(e.secondary_ips)
        .collect()
}

/// The delegated prefixes of an ENI.
pub(super) fn prefixes_of(e: Eni) -> BTreeSet<Ipv4Net> {
    e.ipv4_prefixes.into_iter().collect()
}
