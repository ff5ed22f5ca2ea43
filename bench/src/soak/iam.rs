//! IAM in the soak (issue 23): mockcloud enforces the shipped policy (`deploy/iam-policy.json` for the
//! soak's cluster and the simulated VPC) for the whole run, and the `iam-revoke` fault edits it
//! mid-run to revoke one action the daemon needs, then grants it back.
//!
//! What is checked, besides the checker's invariants (which must hold through the revocation: the
//! daemon degrades and loses nothing):
//! - `iam-denied`: EC2 refused a call of an action that was not revoked at the time. The shipped
//!   policy must allow every call the daemon makes, under every other fault (restarts, lost state,
//!   out-of-band changes, the leaked-ENI collector, give-back).
//! - `iam-error-unnamed`: the daemon made calls of the revoked action, EC2 refused them, and its log
//!   of that window never says which permission is missing (`the IAM role needs ec2:<Action>`).

use std::collections::BTreeSet;
use std::io::{Read as _, Seek as _, SeekFrom};
use std::path::Path;

use mockcloud::iam::Policy;

use super::Soak;

/// The cluster name the soak's daemon runs with (`ENIIPAM_CLUSTER_NAME`).
pub const CLUSTER: &str = "soak";

/// Actions the fault may revoke: each one the daemon calls while serving pods. (Describe calls are
/// left alone: without DescribeNetworkInterfaces a restarted daemon cannot rebuild, which is a
/// start-up failure, not the degradation this fault is about.)
pub const REVOCABLE: [&str; 7] = [
    "AssignPrivateIpAddresses",
    "UnassignPrivateIpAddresses",
    "CreateNetworkInterface",
    "AttachNetworkInterface",
    "DetachNetworkInterface",
    "DeleteNetworkInterface",
    "CreateTags",
];

/// The soak's IAM state.
#[derive(Debug)]
pub struct IamState {
    /// The policy in force when nothing is revoked.
    pub shipped: Policy,
    /// The action revoked now (`CreateTags`), with where the daemon's log stood when it was.
    pub revoked: Option<Revocation>,
    /// Actions revoked at any moment since the last look at mockcloud's denials.
    revoked_since_check: BTreeSet<String>,
    /// Denials of the revoked action in its current window.
    pub denied_in_window: u64,
    /// Totals for the report.
    pub revocations: u64,
    pub denials_of_revoked: u64,
}

#[derive(Debug, Clone)]
pub struct Revocation {
    pub action: String,
    pub log_offset: u64,
    pub step: u64,
}

impl IamState {
    pub fn new(shipped: Policy) -> Self {
        Self {
            shipped,
            revoked: None,
            revoked_since_check: BTreeSet::new(),
            denied_in_window: 0,
            revocations: 0,
            denials_of_revoked: 0,
        }
    }
}

/// The size of the daemon's log now (where a window starts).
fn log_len(log: &Path) -> u64 {
    std::fs::metadata(log).map_or(0, |m| m.len())
}

/// The daemon's log from `offset` on (lossy).
fn log_since(log: &Path, offset: u64) -> String {
    let Ok(mut f) = std::fs::File::open(log) else {
        return String::new();
    };
    // The log starts over when the daemon restarts on a new file: read it all then.
    let start = if f.metadata().map_or(0, |m| m.len()) < offset {
        0
    } else {
        offset
    };
    let mut bytes = Vec::new();
    if f.seek(SeekFrom::Start(start)).is_ok() {
        let _ = f.read_to_end(&mut bytes);
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

impl Soak {
    /// The `iam-revoke` fault: the policy loses `action` (a policy edit, as an operator might make).
    pub(super) fn iam_revoke(&mut self, step: u64, action: &str) {
        self.iam_restore(step);
        let edited = self.iam.shipped.without_action(&format!("ec2:{action}"));
        self.mock.set_iam_policy(Some(edited));
        self.iam.revoked = Some(Revocation {
            action: action.to_owned(),
            log_offset: log_len(&self.daemon.log),
            step,
        });
        self.iam.revoked_since_check.insert(format!("ec2:{action}"));
        self.iam.denied_in_window = 0;
        self.iam.revocations += 1;
        self.model.impeded_by("iam-revoke", None);
    }

    /// Grants the revoked action back (the shipped policy again), and checks that the daemon named
    /// the missing permission if EC2 refused it any call meanwhile.
    pub(super) fn iam_restore(&mut self, step: u64) {
        self.iam_check(step);
        let Some(r) = self.iam.revoked.take() else {
            return;
        };
        self.mock.set_iam_policy(Some(self.iam.shipped.clone()));
        self.model.recovered_from("iam-revoke");
        if self.iam.denied_in_window == 0 {
            return;
        }
        let needle = format!("the IAM role needs ec2:{}", r.action);
        let log = log_since(&self.daemon.log, r.log_offset);
        if !log.contains(&needle) {
            self.violation(
                step,
                "iam-error-unnamed",
                r.action.clone(),
                format!(
                    "EC2 refused {} calls of ec2:{} (revoked at step {}) and the daemon's log never \
                     said `{needle}`",
                    self.iam.denied_in_window, r.action, r.step
                ),
            );
        } else {
            self.note(format!(
                "iam-revoke: ec2:{} revoked at step {}, {} calls refused, the daemon said `{needle}`",
                r.action, r.step, self.iam.denied_in_window
            ));
        }
    }

    /// Takes mockcloud's denials since the last look: a denial of anything not revoked meanwhile is
    /// a call the shipped policy does not allow.
    pub(super) fn iam_check(&mut self, step: u64) {
        let denials = self.mock.iam_denials();
        self.mock.clear_iam_denials();
        let revoked = std::mem::take(&mut self.iam.revoked_since_check);
        for d in denials {
            if revoked.contains(&d.action) {
                self.iam.denied_in_window += 1;
                self.iam.denials_of_revoked += 1;
                continue;
            }
            self.violation(
                step,
                "iam-denied",
                format!("{} {}", d.action, d.resource),
                format!(
                    "EC2 refused {} on {} under the shipped policy ({}{})",
                    d.action,
                    d.resource,
                    d.reason,
                    if d.explicit { ", explicit deny" } else { "" }
                ),
            );
        }
        if let Some(r) = &self.iam.revoked {
            self.iam
                .revoked_since_check
                .insert(format!("ec2:{}", r.action));
        }
    }
}
