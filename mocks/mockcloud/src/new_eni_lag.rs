//! EC2's eventual consistency right after it creates or attaches an ENI ([`NewEniLag`]), and the
//! run-time knob for it. The world's side of it is `world/settling.rs`.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::MockCloud;

/// What EC2 does not show yet of an ENI it has just created or attached. AWS's *Eventual
/// consistency in the Amazon EC2 API*: "if you run a command to modify or describe the resource
/// that you just created, its ID might not have propagated throughout the system, and you will get
/// an error responding that the resource does not exist".
///
/// - For `window` after CreateNetworkInterface, describes do not list the new ENI (asked for by id:
///   `InvalidNetworkInterfaceID.NotFound`), and for `window` after AttachNetworkInterface they show
///   the ENI without that attachment (`available`). Deterministic: a describe inside the window never
///   shows it.
/// - Of the new ENIs, a `refused_share` is picked (by a hash of the ENI's id, so a run is
///   reproducible): within `window` after its create, the first `refusals` calls naming a picked ENI
///   (attach, delete, modify, assign and unassign of IPv4 and IPv6) answer
///   `InvalidNetworkInterfaceID.NotFound`, unperformed; later calls go through. `refusals: u32::MAX`
///   with `refused_share: 1.0` refuses every call of the window on every new ENI (the strict model
///   tests use).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct NewEniLag {
    #[serde(with = "crate::config::millis")]
    pub window: Duration,
    pub refusals: u32,
    #[serde(default = "every_eni")]
    pub refused_share: f64,
}

fn every_eni() -> f64 {
    1.0
}

impl Default for NewEniLag {
    fn default() -> Self {
        Self::none()
    }
}

impl NewEniLag {
    /// No lag (the `fast` profile).
    pub fn none() -> Self {
        Self {
            window: Duration::ZERO,
            refusals: 0,
            refused_share: every_eni(),
        }
    }

    /// The strict model: for `window` after its create a new ENI is not listed, and every call
    /// naming it is refused as not found.
    pub fn strict(window: Duration) -> Self {
        Self {
            window,
            refusals: u32::MAX,
            refused_share: every_eni(),
        }
    }

    /// The `realistic` profile's: describes lag a new ENI as long as they lag addresses (2 s), and
    /// the first call on one new ENI in four is refused. EC2 publishes no rate; the refusal is an
    /// occasional event in the field (the AWS VPC CNI retries it), and one refused call per new ENI
    /// would cost a cold burst (create + attach + DeleteOnTermination per ENI) a third more
    /// mutating calls on every run.
    pub fn realistic() -> Self {
        Self {
            window: Duration::from_millis(2000),
            refusals: 1,
            refused_share: 0.25,
        }
    }

    /// How many calls on the new ENI `id` are refused within the window.
    pub(crate) fn refusals_for(&self, id: &str) -> u32 {
        let hash = id
            .bytes()
            .fold(0u64, |h, b| crate::splitmix::splitmix(h ^ u64::from(b)));
        let picked =
            self.refused_share >= 1.0 || (hash as f64 / u64::MAX as f64) < self.refused_share;
        if picked { self.refusals } else { 0 }
    }
}

impl MockCloud {
    /// Sets what EC2 does not show yet of an ENI it has just created or attached ([`NewEniLag`]).
    pub fn set_new_eni_lag(&self, lag: NewEniLag) {
        self.inner
            .world
            .lock()
            .expect("world lock")
            .timing
            .new_eni_lag = lag;
        self.inner.latency.lock().expect("latency lock").new_eni_lag = lag;
    }
}
