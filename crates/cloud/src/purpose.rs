//! What an EC2 call is for: a pod waiting on it, a warm-pool refill, a give-back, the reconcile, or
//! the startup rebuild.
//!
//! The purpose travels with the work as a tokio task-local, set where the work starts
//! ([`with_purpose`]) and read by the limiter on each attempt ([`current_purpose`]), so the cloud
//! trait's signatures stay as they are. It serves two ends: counting calls by purpose
//! (`eniipam_ec2_calls_total{purpose}`), and letting refills and give-backs yield to pod-driven
//! calls while EC2 throttles the node (see [`super::limiter`]).
//!
//! A task-local does not cross `tokio::spawn`: set it inside the task that awaits the cloud call.

use std::fmt;
use std::future::Future;

use serde::Serialize;

/// Why an EC2 call is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Purpose {
    /// A pod is waiting on it (an assign batch with a pod in it, a create carrying pods).
    Pod,
    /// Filling the warm pool, no pod waiting.
    Refill,
    /// Giving idle IPs or an empty ENI back to EC2.
    GiveBack,
    /// The running reconcile, the leaked-ENI collector, and any call made outside a scope.
    Reconcile,
    /// The startup rebuild (node discovery included).
    Startup,
}

tokio::task_local! {
    static PURPOSE: Purpose;
}

impl Purpose {
    /// Every purpose, in label order.
    pub const ALL: [Purpose; 5] = [
        Purpose::Pod,
        Purpose::Refill,
        Purpose::GiveBack,
        Purpose::Reconcile,
        Purpose::Startup,
    ];

    /// The label value (`pod`, `refill`, `give_back`, `reconcile`, `startup`).
    pub fn as_str(self) -> &'static str {
        match self {
            Purpose::Pod => "pod",
            Purpose::Refill => "refill",
            Purpose::GiveBack => "give_back",
            Purpose::Reconcile => "reconcile",
            Purpose::Startup => "startup",
        }
    }

    /// Whether calls of this purpose step aside for the others while EC2 throttles the node: no pod
    /// waits on a refill or a give-back.
    pub fn yields(self) -> bool {
        matches!(self, Purpose::Refill | Purpose::GiveBack)
    }
}

impl fmt::Display for Purpose {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Runs `f` with `p` as the purpose of every cloud call it makes (in this task).
pub async fn with_purpose<F: Future>(p: Purpose, f: F) -> F::Output {
    PURPOSE.scope(p, f).await
}

/// The purpose of the current task's cloud calls; [`Purpose::Reconcile`] outside any
/// [`with_purpose`] scope: unscoped calls are background bookkeeping, and counting them as such
/// never lets them jump ahead of pods nor hold back as a refill would.
pub fn current_purpose() -> Purpose {
    PURPOSE.try_with(|p| *p).unwrap_or(Purpose::Reconcile)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn scope_sets_and_nests_the_purpose() {
        assert_eq!(current_purpose(), Purpose::Reconcile);
        with_purpose(Purpose::Refill, async {
            assert_eq!(current_purpose(), Purpose::Refill);
            with_purpose(Purpose::Pod, async {
                assert_eq!(current_purpose(), Purpose::Pod);
            })
            .await;
            assert_eq!(current_purpose(), Purpose::Refill);
        })
        .await;
        assert_eq!(Purpose::GiveBack.as_str(), "give_back");
        assert!(Purpose::Refill.yields() && !Purpose::Pod.yields());
    }
}
