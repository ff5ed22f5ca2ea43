//! The node's IPv6 /80 in the running reconcile (ip_family ipv6 and dual): what a pass does when
//! EC2's describe does not show it on an ENI attached here, and what it remembers of EC2's answers.
//!
//! EC2's describes lag its changes (eventually consistent): a /80 assigned back to eth0 moments ago
//! (by the startup or by the pass before) may not be in the describe yet, and taking it back then is
//! answered "in use" — by eth0 itself. That answer is not taken as final until a describe has had
//! [`DESCRIBE_SETTLES`] to show the /80 on eth0 (the startup's rule, `ipv6::prefix::ensure`);
//! meanwhile nothing is asked. Once the describe shows the /80 again, whatever was remembered is
//! forgotten, so a later real loss is taken back as the first one was.

use ipnet::Ipv6Net;
use tokio::time::Instant;

use crate::cloud::DESCRIBE_SETTLES;

/// What a pass does about the node's /80.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prefix6Step {
    /// EC2 shows it on an ENI attached here: nothing.
    InPlace,
    /// Gone from eth0, which has no other /80: assign it back by value.
    AssignBack,
    /// The last assign back was answered "in use" while the describe did not show the /80 on eth0,
    /// less than [`DESCRIBE_SETTLES`] ago: taken as eth0's own, not described yet; nothing asked.
    Settling,
    /// EC2 refused it for good, or eth0 has another /80 or is not attached here: reported only.
    Missing,
}

/// What EC2 answered an assign back of the /80.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AssignBackAnswer {
    Assigned,
    /// `InvalidIPAddress.InUse`: another ENI's, or eth0's own while the describe lags.
    InUse,
    /// Any other definitive refusal (`ipv6::prefix::refused_for_good`).
    Refused,
    /// Throttled, transient, unauthorized: asked again next pass.
    Failed,
}

/// What the passes remember of the /80.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Prefix6Memory {
    /// Refused for good: not asked again while the describe does not show it.
    refused: Option<Ipv6Net>,
    /// Answered "in use" while the describe did not show it on eth0, first at this instant.
    in_use_since: Option<(Ipv6Net, Instant)>,
}

impl Prefix6Memory {
    /// The step for `prefix`, which EC2's describe shows on an ENI attached here (`shown`) or not;
    /// `eth0_free`: eth0 is attached here and has no /80 in the describe.
    pub fn step(
        &mut self,
        prefix: Ipv6Net,
        shown: bool,
        eth0_free: bool,
        now: Instant,
    ) -> Prefix6Step {
        if shown {
            *self = Self::default();
            return Prefix6Step::InPlace;
        }
        if self.refused == Some(prefix) || !eth0_free {
            return Prefix6Step::Missing;
        }
        match self.in_use_since {
            Some((p, since)) if p == prefix && now < since + DESCRIBE_SETTLES => {
                Prefix6Step::Settling
            }
            _ => Prefix6Step::AssignBack,
        }
    }

    /// Remembers EC2's answer to an assign back of `prefix` at `now`. Returns whether the /80 is now
    /// taken as refused for good.
    pub fn answered(&mut self, prefix: Ipv6Net, answer: AssignBackAnswer, now: Instant) -> bool {
        match answer {
            AssignBackAnswer::Assigned => *self = Self::default(),
            AssignBackAnswer::InUse => match self.in_use_since {
                // In use a describe's settling time after the first answer: not eth0's.
                Some((p, _)) if p == prefix => self.refuse(prefix),
                _ => self.in_use_since = Some((prefix, now)),
            },
            AssignBackAnswer::Refused => self.refuse(prefix),
            AssignBackAnswer::Failed => {}
        }
        self.refused == Some(prefix)
    }

    fn refuse(&mut self, prefix: Ipv6Net) {
        self.refused = Some(prefix);
        self.in_use_since = None;
    }
}
