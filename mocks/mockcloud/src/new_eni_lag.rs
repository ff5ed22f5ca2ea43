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
/// - Within `window` after the create, the first `refusals` calls naming the new ENI (attach, delete,
///   modify, assign and unassign of IPv4 and IPv6) answer `InvalidNetworkInterfaceID.NotFound`,
///   unperformed; later calls go through. `u32::MAX` refuses every call of the window (the strict
///   model); 1 (realistic) costs a cold burst one refused call per new ENI.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewEniLag {
    #[serde(with = "crate::config::millis")]
    pub window: Duration,
    pub refusals: u32,
}

impl NewEniLag {
    /// No lag (the `fast` profile).
    pub fn none() -> Self {
        Self::default()
    }

    /// The `realistic` profile's: describes lag a new ENI as long as they lag addresses (2 s), and
    /// the first call on it is refused.
    pub fn realistic() -> Self {
        Self {
            window: Duration::from_millis(2000),
            refusals: 1,
        }
    }
}

impl MockCloud {
    /// Sets what EC2 does not show yet of an ENI it has just created or attached ([`NewEniLag`]).
    pub fn set_new_eni_lag(&self, lag: NewEniLag) {
        self.inner.world.lock().expect("world lock").timing.new_eni_lag = lag;
        self.inner.latency.lock().expect("latency lock").new_eni_lag = lag;
    }
}
