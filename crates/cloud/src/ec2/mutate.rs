//! [`mutate`]: every mutating EC2 call, with the ambiguous-retry logic written once.
//!
//! A mutating call whose answer is lost (a timeout, a 5xx: [`is_ambiguous`]) may have taken effect
//! on EC2's side. Retrying it blindly could assign twice the IPs, or fail on a resource the lost
//! attempt already changed; reporting the error could leak what the lost attempt made. So from the
//! first ambiguous failure on, each failure is followed by a look at EC2 ([`Verify`]) before the
//! call is retried or its error reported: when the look finds what the call was meant to do, that
//! is the answer.

use std::future::{Future, Ready};

use super::classify::is_ambiguous;
use crate::limiter::{CallClass, Limiter};
use crate::{CloudError, CloudResult};

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

