//! The instant by which the caller of a cloud call must have its answer, when it has one: the
//! earliest deadline of the pods an ENI actor's batch serves (each ADD waits only within its budget,
//! see the pool's `add_wait`). Like [`crate::purpose`], it travels as a tokio task-local set where
//! the work starts ([`with_deadline`]) and read by the limiter's retry loop ([`current_deadline`]):
//! no retry starts that could not end before it, so a throttled call answers its pods while they are
//! still waiting rather than after their runtime gave up. Calls without a deadline (refills, the
//! reconcile) keep the retry policy's own time budget.
//!
//! Work may also take EC2's throttle as its answer ([`without_throttle_retries`]): the pool's
//! assigns are not tried again as they are by the limiter but handed back to the pool. A pods'
//! batch comes back with the pods that arrived meanwhile (a retry would repeat the batch that was
//! first sent, and leave them for a call of their own); a warm-up alone is planned again later. A
//! throttle means the account's bucket for that API is dry, shared with every node of the account;
//! a warm-up that kept retrying would spend its next refill token, which a pod on another node is
//! waiting on.

use std::future::Future;

use tokio::time::Instant;

tokio::task_local! {
    static DEADLINE: Instant;
    static NO_THROTTLE_RETRIES: ();
}

/// Runs `f` with `deadline` as the deadline of its cloud calls.
pub async fn with_deadline<F: Future>(deadline: Instant, f: F) -> F::Output {
    DEADLINE.scope(deadline, f).await
}

/// The deadline of the current task's cloud calls, if it has one.
pub fn current_deadline() -> Option<Instant> {
    DEADLINE.try_with(|d| *d).ok()
}

/// Runs `f` so that a cloud call of it that EC2 throttles is not retried: the throttle is its
/// answer (`RetriesExhausted`, `throttled`). Transient failures are retried as usual.
pub async fn without_throttle_retries<F: Future>(f: F) -> F::Output {
    NO_THROTTLE_RETRIES.scope((), f).await
}

/// Whether the current task's cloud calls may be retried after EC2 throttles them.
pub fn throttle_retries_allowed() -> bool {
    NO_THROTTLE_RETRIES.try_with(|_| ()).is_err()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn the_deadline_is_seen_inside_its_scope_only() {
        assert_eq!(current_deadline(), None);
        let at = Instant::now() + Duration::from_secs(3);
        let seen = with_deadline(at, async { current_deadline() }).await;
        assert_eq!(seen, Some(at));
        assert_eq!(current_deadline(), None);
    }

    #[tokio::test]
    async fn throttle_retries_are_refused_inside_their_scope_only() {
        assert!(throttle_retries_allowed());
        assert!(!without_throttle_retries(async { throttle_retries_allowed() }).await);
        assert!(throttle_retries_allowed());
    }
}
