//! IAM for mockcloud: identity-based policies evaluated on every EC2 call, the way IAM does it.
//!
//! - [`policy`]: the document model, parsing with IAM's validation, back to JSON.
//! - [`condition`]: condition operators over a request context.
//! - [`request`]: the authorization requests EC2 makes per action (one per resource it touches).
//! - `cloud`: [`crate::MockCloud`]'s IAM handles (policies in force, node tags, denials).
//! - here: evaluation (explicit Deny beats Allow beats the implicit deny), the decision, EC2's
//!   `UnauthorizedOperation` answer with its encoded authorization message, and the policy store
//!   (account-wide, or per caller by SigV4 access key id).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::error::{Ec2Error, Ec2Result};
use crate::query::Params;
use crate::world::World;

mod cloud;
pub mod condition;
pub mod policy;
pub mod request;

pub use condition::Context;
pub use policy::{Actions, ConditionBlock, Effect, Policy, PolicyError, Resources, Statement};
pub use request::AuthRequest;

/// The policy eniipam ships (`deploy/iam-policy.json`), with its placeholders `my-cluster` and
/// `vpc-0123456789abcdef0`.
pub const SHIPPED_POLICY: &str = include_str!("../../../../deploy/iam-policy.json");

/// The shipped policy for cluster `cluster` in VPC `vpc_id` (in values and in condition keys: the
/// nodes' tag key holds the cluster name).
pub fn shipped_policy(cluster: &str, vpc_id: &str) -> Policy {
    fn replace(v: &mut Value, cluster: &str, vpc_id: &str) {
        let text = |s: &str| {
            s.replace("my-cluster", cluster)
                .replace("vpc-0123456789abcdef0", vpc_id)
        };
        match v {
            Value::String(s) => *s = text(s),
            Value::Array(a) => a.iter_mut().for_each(|v| replace(v, cluster, vpc_id)),
            Value::Object(m) => {
                *m = std::mem::take(m)
                    .into_iter()
                    .map(|(k, mut v)| {
                        replace(&mut v, cluster, vpc_id);
                        (text(&k), v)
                    })
                    .collect();
            }
            _ => {}
        }
    }
    let mut v: Value = serde_json::from_str(SHIPPED_POLICY).expect("the shipped policy is JSON");
    replace(&mut v, cluster, vpc_id);
    Policy::from_value(&v).expect("the shipped policy is a valid policy")
}

/// The tag EKS's node groups, eksctl and Karpenter put on a cluster's nodes,
/// `kubernetes.io/cluster/<cluster>` = `owned`: the shipped policy, as the VPC CNI's scoped sample
/// policy, allows attach, detach and modify on an instance only when it carries it.
pub fn node_tag(cluster: &str) -> (String, String) {
    (
        format!("kubernetes.io/cluster/{cluster}"),
        "owned".to_owned(),
    )
}

/// The decision on one [`AuthRequest`] (what the encoded authorization message carries).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    pub allowed: bool,
    pub explicit_deny: bool,
    /// Statements that applied (action, resource and conditions), as `Sid` or `Statement[i]`.
    pub matched_allow: Vec<String>,
    pub matched_deny: Vec<String>,
    pub action: String,
    pub resource: String,
    pub context: Context,
    /// Why: the denying statement, the missing allow, or an unknown condition operator.
    pub reason: String,
}

fn action_matches(s: &Statement, action: &str) -> bool {
    let any = |list: &[String]| list.iter().any(|p| condition::glob(p, action, true));
    match &s.actions {
        Actions::Action(l) => any(l),
        Actions::NotAction(l) => !any(l),
    }
}

fn resource_matches(s: &Statement, arn: &str) -> bool {
    let any = |list: &[String]| {
        list.iter()
            .any(|p| p == "*" || p == arn || condition::arn_like(p, arn))
    };
    match &s.resources {
        Resources::Resource(l) => any(l),
        Resources::NotResource(l) => !any(l),
    }
}

/// Evaluates one request against one policy: an explicit Deny beats an Allow, which beats the
/// implicit deny. A statement that applies to the action and resource but holds a condition
/// operator mockcloud does not know denies the request (logged, and said in `reason`).
pub fn evaluate(policy: &Policy, req: &AuthRequest) -> Decision {
    let mut allow = Vec::new();
    let mut deny = Vec::new();
    let mut unknown = None;
    for (i, s) in policy.statements.iter().enumerate() {
        if !action_matches(s, &req.action) || !resource_matches(s, &req.resource) {
            continue;
        }
        let mut applies = true;
        for block in &s.conditions {
            match condition::eval_block(block, &req.context) {
                Ok(true) => {}
                Ok(false) => applies = false,
                Err(e) => {
                    tracing::warn!(
                        statement = %s.label(i), action = %req.action, resource = %req.resource,
                        "IAM: {e}; the request is denied"
                    );
                    unknown.get_or_insert_with(|| format!("{e} in statement {}", s.label(i)));
                    applies = false;
                    if s.effect == Effect::Deny {
                        deny.push(s.label(i));
                    }
                }
            }
            if !applies {
                break;
            }
        }
        if applies {
            match s.effect {
                Effect::Allow => allow.push(s.label(i)),
                Effect::Deny => deny.push(s.label(i)),
            }
        }
    }
    let explicit_deny = !deny.is_empty();
    let allowed = !explicit_deny && !allow.is_empty() && unknown.is_none();
    let reason = if let Some(u) = unknown {
        u
    } else if explicit_deny {
        format!("explicitly denied by statement {}", deny.join(", "))
    } else if allowed {
        format!("allowed by statement {}", allow.join(", "))
    } else {
        format!("no statement allows {} on {}", req.action, req.resource)
    };
    Decision {
        allowed,
        explicit_deny,
        matched_allow: allow,
        matched_deny: deny,
        action: req.action.clone(),
        resource: req.resource.clone(),
        context: req.context.clone(),
        reason,
    }
}

/// A call mockcloud refused for IAM.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Denial {
    /// `ec2:AssignPrivateIpAddresses`.
    pub action: String,
    /// The ARN the denial is about (the first one denied; an explicit deny is reported first).
    pub resource: String,
    pub reason: String,
    /// The SigV4 access key id of the caller ("" when the request carried none).
    pub access_key_id: String,
    /// An explicit Deny (rather than no Allow).
    pub explicit: bool,
}

/// Policies in force and the denials so far.
#[derive(Debug, Default)]
pub(crate) struct IamState {
    pub account: Option<Arc<Policy>>,
    pub callers: BTreeMap<String, Arc<Policy>>,
    pub denials: Vec<Denial>,
}

/// At most this many denials are kept; older ones are dropped first.
const MAX_DENIALS: usize = 10_000;

impl IamState {
    /// The policy that applies to `access_key_id`: its own, else the account-wide one.
    pub fn policy_for(&self, access_key_id: &str) -> Option<Arc<Policy>> {
        self.callers
            .get(access_key_id)
            .or(self.account.as_ref())
            .cloned()
    }

    pub fn record(&mut self, d: Denial) {
        if self.denials.len() >= MAX_DENIALS {
            self.denials.drain(..MAX_DENIALS / 10);
        }
        self.denials.push(d);
    }
}

/// The SigV4 access key id from an `Authorization` header (`… Credential=AKID/date/region/…`).
pub fn access_key_id(authorization: &str) -> String {
    authorization
        .split("Credential=")
        .nth(1)
        .and_then(|c| c.split(['/', ',', ' ']).next())
        .unwrap_or_default()
        .to_owned()
}

/// The principal EC2 names in its message: the caller's assumed role session.
pub fn principal_arn(account: &str, access_key_id: &str) -> String {
    let session = if access_key_id.is_empty() {
        "anonymous"
    } else {
        access_key_id
    };
    format!("arn:aws:sts::{account}:assumed-role/mockcloud-node/{session}")
}

/// The decision as `sts:DecodeAuthorizationMessage` shows one (mockcloud's `reason` added).
fn decoded(d: &Decision, principal: &str) -> Value {
    let items = |v: &[String], effect: &str| {
        v.iter()
            .map(|s| json!({"statementId": s, "effect": effect}))
            .collect::<Vec<_>>()
    };
    let mut matched = items(&d.matched_deny, "DENY");
    matched.extend(items(&d.matched_allow, "ALLOW"));
    let conditions: Vec<Value> = d
        .context
        .0
        .iter()
        .map(|(k, vs)| {
            json!({"key": k, "values": {"items": vs.iter().map(|v| json!({"value": v})).collect::<Vec<_>>()}})
        })
        .collect();
    json!({
        "allowed": d.allowed,
        "explicitDeny": d.explicit_deny,
        "matchedStatements": {"items": matched},
        "failures": {"items": []},
        "reason": d.reason,
        "context": {
            "principal": {"arn": principal},
            "action": d.action,
            "resource": d.resource,
            "conditions": {"items": conditions},
        },
    })
}

/// The opaque "Encoded authorization failure message" of one decision.
pub fn encode(d: &Decision, principal: &str) -> String {
    base64::encode(decoded(d, principal).to_string().as_bytes())
}

/// mockcloud's `sts:DecodeAuthorizationMessage`: the decision JSON back from the encoded message.
pub fn decode(encoded: &str) -> Result<Value, String> {
    let bytes = base64::decode(encoded.trim()).ok_or("not an encoded authorization message")?;
    serde_json::from_slice(&bytes).map_err(|e| format!("not an encoded authorization message: {e}"))
}

/// EC2's `UnauthorizedOperation` (403) for a denied decision.
pub fn unauthorized(d: &Decision, account: &str, access_key_id: &str) -> Ec2Error {
    let principal = principal_arn(account, access_key_id);
    let because = if d.explicit_deny {
        "with an explicit deny in an identity-based policy".to_owned()
    } else {
        format!(
            "because no identity-based policy allows the {} action",
            d.action
        )
    };
    Ec2Error::new(
        403,
        "UnauthorizedOperation",
        format!(
            "You are not authorized to perform this operation. User: {principal} is not authorized to perform: {} on resource: {} {because}. Encoded authorization failure message: {}",
            d.action,
            d.resource,
            encode(d, &principal)
        ),
    )
}

/// Authorizes one EC2 call: every request it makes must be allowed. `Ok(None)` lets it go ahead;
/// `Ok(Some(..))` is the denial and the error to answer; `Err` is the world's own error for a
/// resource that does not exist or a parameter that is missing (answered as the call would).
pub(crate) fn authorize(
    policy: &Policy,
    w: &mut World,
    action: &str,
    params: &Params,
    access_key_id: &str,
    now: Instant,
) -> Ec2Result<Option<(Denial, Ec2Error)>> {
    let requests = request::requests(w, action, params, now)?;
    let decisions: Vec<Decision> = requests.iter().map(|r| evaluate(policy, r)).collect();
    let Some(d) = decisions
        .iter()
        .find(|d| d.explicit_deny)
        .or_else(|| decisions.iter().find(|d| !d.allowed))
    else {
        return Ok(None);
    };
    tracing::debug!(action = %d.action, resource = %d.resource, reason = %d.reason, "IAM denied");
    let denial = Denial {
        action: d.action.clone(),
        resource: d.resource.clone(),
        reason: d.reason.clone(),
        access_key_id: access_key_id.to_owned(),
        explicit: d.explicit_deny,
    };
    Ok(Some((denial, unauthorized(d, w.owner_id(), access_key_id))))
}

mod base64 {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

    pub fn encode(bytes: &[u8]) -> String {
        let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
        for chunk in bytes.chunks(3) {
            let b = [
                chunk[0],
                chunk.get(1).copied().unwrap_or(0),
                chunk.get(2).copied().unwrap_or(0),
            ];
            let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
            for i in 0..4 {
                if i <= chunk.len() {
                    out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
                } else {
                    out.push('=');
                }
            }
        }
        out
    }

    pub fn decode(text: &str) -> Option<Vec<u8>> {
        let text = text.trim_end_matches('=');
        let mut out = Vec::with_capacity(text.len() * 3 / 4);
        let (mut acc, mut bits) = (0u32, 0u32);
        for c in text.bytes() {
            let v = ALPHABET.iter().position(|a| *a == c)? as u32;
            acc = (acc << 6) | v;
            bits += 6;
            if bits >= 8 {
                bits -= 8;
                out.push((acc >> bits) as u8);
                acc &= (1 << bits) - 1;
            }
        }
        Some(out)
    }

    #[cfg(test)]
    #[test]
    fn round_trip() {
        for s in ["", "a", "ab", "abc", "abcd", "{\"allowed\":false}"] {
            assert_eq!(decode(&encode(s.as_bytes())).unwrap(), s.as_bytes());
        }
        assert_eq!(encode(b"Man"), "TWFu");
        assert_eq!(encode(b"Ma"), "TWE=");
    }
}

#[cfg(test)]
mod tests;
