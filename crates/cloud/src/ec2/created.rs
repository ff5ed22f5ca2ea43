//! ENIs this client created lately, and EC2's eventual consistency about them.
//!
//! Right after CreateNetworkInterface, EC2 may answer `InvalidNetworkInterfaceID.NotFound` to a
//! describe, attach, modify, assign or delete of the new ENI: AWS's *Eventual consistency in the
//! Amazon EC2 API* says the ID of a resource just created "might not have propagated throughout the
//! system", and advises retrying with exponential back-off, from a couple of seconds up to minutes.
//! A not-found there is not the ENI being gone: taken as final, the create failed and its cleanup
//! read the ENI as gone, so it leaked with its addresses until the leaked-ENI collector's grace
//! period passed.
//!
//! So for [`DESCRIBE_SETTLES`] after this client's own create of an ENI (the time the client gives
//! EC2's describes to show any change), a call about it that answers not found is made again after a
//! back-off ([`Ec2Cloud::settling`]); when the back-off or the caller's deadline runs out first,
//! the answer is [`CloudError::RetriesExhausted`], never a not-found. Past the window a not-found
//! is final, as for an ENI this client did not create.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;

use eniipam_api::model::EniId;
use tokio::time::Instant;

use super::Ec2Cloud;
use crate::backoff::BackoffPolicy;
use crate::{CloudError, CloudResult, DESCRIBE_SETTLES};

/// When this client created each ENI it created less than [`DESCRIBE_SETTLES`] ago.
#[derive(Debug, Default)]
pub(super) struct CreatedEnis {
    at: Mutex<HashMap<EniId, Instant>>,
}

impl CreatedEnis {
    /// This client's create of `eni` answered now.
    pub(super) fn record(&self, eni: &EniId) {
        let now = Instant::now();
        let mut at = self.at.lock().expect("created ENIs lock");
        at.retain(|_, created| now.duration_since(*created) < DESCRIBE_SETTLES);
        at.insert(eni.clone(), now);
    }

    /// This client deleted `eni`: a not-found about it is the truth from now on.
    pub(super) fn forget(&self, eni: &EniId) {
        self.at.lock().expect("created ENIs lock").remove(eni);
    }

    /// Whether EC2 may not show yet one of `enis`: this client created it less than
    /// [`DESCRIBE_SETTLES`] ago.
    pub(super) fn settling<'a>(&self, enis: impl IntoIterator<Item = &'a EniId>) -> bool {
        let at = self.at.lock().expect("created ENIs lock");
        enis.into_iter().any(|eni| {
            at.get(eni)
                .is_some_and(|created| created.elapsed() < DESCRIBE_SETTLES)
        })
    }
}

impl Ec2Cloud {
    /// `call()` (a whole call of `api`, with the limiter's own retries), made again while it answers
    /// not found and one of `enis` is an ENI this client created less than [`DESCRIBE_SETTLES`]
    /// ago. The back-off is the limiter's retry policy's (base and cap), polling for the window.
    pub(super) async fn settling<'a, T, F, Fut>(
        &self,
        api: &'static str,
        enis: impl IntoIterator<Item = &'a EniId> + Clone,
        mut call: F,
    ) -> CloudResult<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = CloudResult<T>>,
    {
        let retry = self.limiter.retry_policy();
        let mut backoff = BackoffPolicy::polling(retry.base, retry.cap, DESCRIBE_SETTLES).start();
        loop {
            let err = match call().await {
                Err(e) if e.is_not_found() => e,
                other => return other,
            };
            if !self.created.settling(enis.clone()) {
                return Err(err);
            }
            let deadline = crate::current_deadline();
            match backoff
                .next_delay()
                .filter(|delay| deadline.is_none_or(|d| Instant::now() + *delay < d))
            {
                Some(delay) => {
                    tracing::debug!(
                        api,
                        attempt = backoff.attempts(),
                        delay_ms = delay.as_millis() as u64,
                        error = %err,
                        "not found right after our create: EC2 may not show the ENI yet; retrying"
                    );
                    self.limiter.stats().record_retry(api);
                    tokio::time::sleep(delay).await;
                }
                None => {
                    tracing::warn!(api, attempts = backoff.attempts(), error = %err, "ENI still not found after our create; giving up for now");
                    self.limiter.stats().record_retries_exhausted(api);
                    return Err(CloudError::RetriesExhausted {
                        api: api.to_owned(),
                        attempts: backoff.attempts(),
                        last: err.to_string(),
                        throttled: false,
                    });
                }
            }
        }
    }
}
