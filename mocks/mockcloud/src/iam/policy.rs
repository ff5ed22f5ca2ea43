//! IAM policy documents: the model, parsing with IAM's own validation, and back to JSON.
//!
//! IAM accepts `Statement`, `Action`, `Resource` and condition values either as one value or as a
//! list; the model always holds lists. What IAM itself refuses (a bad `Effect`, no `Action`, both
//! `Action` and `NotAction`, a `Principal` in an identity policy, duplicate `Sid`s, …) is refused here
//! at load with an error that names the statement and the field. Policy variables (`${aws:username}`)
//! are valid IAM but not modelled: refused, saying so.

use std::collections::BTreeSet;
use std::fmt;

use serde_json::{Map, Value};

/// Why a document is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid IAM policy: {0}")]
pub struct PolicyError(pub String);

fn bad(msg: impl Into<String>) -> PolicyError {
    PolicyError(msg.into())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effect {
    Allow,
    Deny,
}

impl fmt::Display for Effect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Allow => "Allow",
            Self::Deny => "Deny",
        })
    }
}

/// `Action` or `NotAction` (patterns such as `ec2:Describe*`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Actions {
    Action(Vec<String>),
    NotAction(Vec<String>),
}

/// `Resource` or `NotResource` (ARN patterns or `*`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resources {
    Resource(Vec<String>),
    NotResource(Vec<String>),
}

/// One operator block of a `Condition`: `"StringEquals": {"key": ["v1", "v2"], …}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConditionBlock {
    /// As written (`ForAllValues:StringEquals`, `ArnLikeIfExists`, …); checked at evaluation.
    pub operator: String,
    /// Condition keys as written, each with its values (numbers and booleans as their text).
    pub keys: Vec<(String, Vec<String>)>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Statement {
    pub sid: Option<String>,
    pub effect: Effect,
    pub actions: Actions,
    pub resources: Resources,
    pub conditions: Vec<ConditionBlock>,
}

impl Statement {
    /// `Sid`, or `Statement[i]` when it has none.
    pub fn label(&self, index: usize) -> String {
        self.sid
            .clone()
            .unwrap_or_else(|| format!("Statement[{index}]"))
    }
}

/// An identity-based policy document.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    pub version: Option<String>,
    pub id: Option<String>,
    pub statements: Vec<Statement>,
}

fn strings(v: &Value, what: &str) -> Result<Vec<String>, PolicyError> {
    let one = |v: &Value| match v {
        Value::String(s) => Ok(s.clone()),
        other => Err(bad(format!(
            "{what} must be a string or a list of strings, found {other}"
        ))),
    };
    match v {
        Value::Array(items) if items.is_empty() => Err(bad(format!("{what} is an empty list"))),
        Value::Array(items) => items.iter().map(one).collect(),
        other => Ok(vec![one(other)?]),
    }
}

fn condition_values(v: &Value, what: &str) -> Result<Vec<String>, PolicyError> {
    let one = |v: &Value| match v {
        Value::String(s) => Ok(s.clone()),
        Value::Bool(b) => Ok(b.to_string()),
        Value::Number(n) => Ok(n.to_string()),
        other => Err(bad(format!(
            "{what}: a condition value must be a string, number or boolean, found {other}"
        ))),
    };
    match v {
        Value::Array(items) => items.iter().map(one).collect(),
        other => Ok(vec![one(other)?]),
    }
}

fn no_variables(s: &str, what: &str) -> Result<(), PolicyError> {
    if s.contains("${") {
        return Err(bad(format!(
            "{what} uses the policy variable in {s:?}: policy variables (${{...}}) are valid IAM but mockcloud does not support them"
        )));
    }
    Ok(())
}

fn check_action(a: &str, what: &str) -> Result<(), PolicyError> {
    if a == "*" {
        return Ok(());
    }
    match a.split_once(':') {
        Some((service, name))
            if !service.is_empty()
                && !name.is_empty()
                && service
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'*' || b == b'?') =>
        {
            Ok(())
        }
        _ => Err(bad(format!(
            "{what}: action {a:?} must be \"*\" or \"service:action\" (e.g. \"ec2:AssignPrivateIpAddresses\")"
        ))),
    }
}

fn check_resource(r: &str, what: &str) -> Result<(), PolicyError> {
    no_variables(r, what)?;
    if r == "*" || (r.starts_with("arn:") && r.split(':').count() >= 6) {
        return Ok(());
    }
    Err(bad(format!(
        "{what}: resource {r:?} must be \"*\" or an ARN (arn:partition:service:region:account:resource)"
    )))
}

fn parse_statement(v: &Value, index: usize) -> Result<Statement, PolicyError> {
    let Value::Object(m) = v else {
        return Err(bad(format!("Statement[{index}] must be an object")));
    };
    let sid = match m.get("Sid") {
        None => None,
        Some(Value::String(s)) => {
            if !s.bytes().all(|b| b.is_ascii_alphanumeric()) {
                return Err(bad(format!(
                    "Statement[{index}]: Sid {s:?} may hold only ASCII letters and digits"
                )));
            }
            Some(s.clone())
        }
        Some(other) => {
            return Err(bad(format!(
                "Statement[{index}]: Sid must be a string, found {other}"
            )));
        }
    };
    let what = match &sid {
        Some(s) => format!("statement {s:?}"),
        None => format!("Statement[{index}]"),
    };
    for key in m.keys() {
        match key.as_str() {
            "Sid" | "Effect" | "Action" | "NotAction" | "Resource" | "NotResource"
            | "Condition" => {}
            "Principal" | "NotPrincipal" => {
                return Err(bad(format!(
                    "{what} has the field {key}, which identity-based policies may not have"
                )));
            }
            other => return Err(bad(format!("{what} has an unknown field {other:?}"))),
        }
    }
    let effect = match m.get("Effect") {
        Some(Value::String(s)) if s == "Allow" => Effect::Allow,
        Some(Value::String(s)) if s == "Deny" => Effect::Deny,
        Some(other) => {
            return Err(bad(format!(
                "{what}: Effect must be \"Allow\" or \"Deny\", found {other}"
            )));
        }
        None => return Err(bad(format!("{what} is missing the required field Effect"))),
    };
    let actions = match (m.get("Action"), m.get("NotAction")) {
        (Some(_), Some(_)) => {
            return Err(bad(format!("{what} has both Action and NotAction")));
        }
        (None, None) => {
            return Err(bad(format!(
                "{what} is missing the required field Action (or NotAction)"
            )));
        }
        (Some(a), None) => Actions::Action(strings(a, &format!("{what}: Action"))?),
        (None, Some(a)) => Actions::NotAction(strings(a, &format!("{what}: NotAction"))?),
    };
    let (Actions::Action(list) | Actions::NotAction(list)) = &actions;
    for a in list {
        check_action(a, &what)?;
    }
    let resources = match (m.get("Resource"), m.get("NotResource")) {
        (Some(_), Some(_)) => {
            return Err(bad(format!("{what} has both Resource and NotResource")));
        }
        (None, None) => {
            return Err(bad(format!(
                "{what} is missing the required field Resource (or NotResource)"
            )));
        }
        (Some(r), None) => Resources::Resource(strings(r, &format!("{what}: Resource"))?),
        (None, Some(r)) => Resources::NotResource(strings(r, &format!("{what}: NotResource"))?),
    };
    let (Resources::Resource(list) | Resources::NotResource(list)) = &resources;
    for r in list {
        check_resource(r, &what)?;
    }
    let mut conditions = Vec::new();
    match m.get("Condition") {
        None => {}
        Some(Value::Object(ops)) => {
            for (op, body) in ops {
                let Value::Object(keys) = body else {
                    return Err(bad(format!(
                        "{what}: Condition operator {op:?} must map condition keys to values"
                    )));
                };
                if keys.is_empty() {
                    return Err(bad(format!(
                        "{what}: Condition operator {op:?} has no condition keys"
                    )));
                }
                let mut block = ConditionBlock {
                    operator: op.clone(),
                    keys: Vec::new(),
                };
                for (key, values) in keys {
                    if !key.contains(':') {
                        return Err(bad(format!(
                            "{what}: condition key {key:?} must be prefaced by a vendor (aws:, ec2:)"
                        )));
                    }
                    let vs = condition_values(values, &format!("{what}: {op} {key}"))?;
                    for v in &vs {
                        no_variables(v, &what)?;
                    }
                    block.keys.push((key.clone(), vs));
                }
                conditions.push(block);
            }
        }
        Some(other) => {
            return Err(bad(format!(
                "{what}: Condition must be an object of operators, found {other}"
            )));
        }
    }
    Ok(Statement {
        sid,
        effect,
        actions,
        resources,
        conditions,
    })
}

impl Policy {
    /// Parses and validates a policy document as IAM would when it is attached to a role.
    pub fn parse(json: &str) -> Result<Policy, PolicyError> {
        let v: Value =
            serde_json::from_str(json).map_err(|e| bad(format!("not valid JSON: {e}")))?;
        Self::from_value(&v)
    }

    /// [`Policy::parse`] of an already decoded document.
    pub fn from_value(v: &Value) -> Result<Policy, PolicyError> {
        let Value::Object(m) = v else {
            return Err(bad("the document must be a JSON object"));
        };
        for key in m.keys() {
            if !matches!(key.as_str(), "Version" | "Id" | "Statement") {
                return Err(bad(format!(
                    "unknown top-level field {key:?} (Version, Id, Statement)"
                )));
            }
        }
        let version = match m.get("Version") {
            None => None,
            Some(Value::String(s)) if s == "2012-10-17" || s == "2008-10-17" => Some(s.clone()),
            Some(other) => {
                return Err(bad(format!(
                    "Version must be \"2012-10-17\" (or the old \"2008-10-17\"), found {other}"
                )));
            }
        };
        let id = match m.get("Id") {
            None => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(other) => return Err(bad(format!("Id must be a string, found {other}"))),
        };
        let statements = match m.get("Statement") {
            None => return Err(bad("missing the required field Statement")),
            Some(Value::Array(list)) if list.is_empty() => {
                return Err(bad("Statement is an empty list"));
            }
            Some(Value::Array(list)) => list
                .iter()
                .enumerate()
                .map(|(i, s)| parse_statement(s, i))
                .collect::<Result<Vec<_>, _>>()?,
            Some(one) => vec![parse_statement(one, 0)?],
        };
        let mut sids = BTreeSet::new();
        for s in &statements {
            if let Some(sid) = &s.sid
                && !sids.insert(sid.clone())
            {
                return Err(bad(format!(
                    "Sid {sid:?} is used twice: statement ids must be unique in a policy"
                )));
            }
        }
        Ok(Policy {
            version,
            id,
            statements,
        })
    }

    /// The document as JSON (lists everywhere; the same meaning as what was parsed).
    pub fn to_json(&self) -> Value {
        let mut doc = Map::new();
        if let Some(v) = &self.version {
            doc.insert("Version".into(), v.clone().into());
        }
        if let Some(id) = &self.id {
            doc.insert("Id".into(), id.clone().into());
        }
        let statements = self
            .statements
            .iter()
            .map(|s| {
                let mut m = Map::new();
                if let Some(sid) = &s.sid {
                    m.insert("Sid".into(), sid.clone().into());
                }
                m.insert("Effect".into(), s.effect.to_string().into());
                match &s.actions {
                    Actions::Action(a) => m.insert("Action".into(), a.clone().into()),
                    Actions::NotAction(a) => m.insert("NotAction".into(), a.clone().into()),
                };
                match &s.resources {
                    Resources::Resource(r) => m.insert("Resource".into(), r.clone().into()),
                    Resources::NotResource(r) => m.insert("NotResource".into(), r.clone().into()),
                };
                if !s.conditions.is_empty() {
                    let mut c = Map::new();
                    for b in &s.conditions {
                        let keys: Map<String, Value> = b
                            .keys
                            .iter()
                            .map(|(k, v)| (k.clone(), Value::from(v.clone())))
                            .collect();
                        c.insert(b.operator.clone(), Value::Object(keys));
                    }
                    m.insert("Condition".into(), Value::Object(c));
                }
                Value::Object(m)
            })
            .collect::<Vec<_>>();
        doc.insert("Statement".into(), Value::Array(statements));
        Value::Object(doc)
    }

    /// The policy with `action` (`ec2:X`, or just `X` for EC2) revoked: removed from every Allow
    /// statement's `Action` (statements left with no action are dropped), added to the `NotAction`
    /// of Allow statements written with `NotAction`. Deny statements are kept as they are.
    pub fn without_action(&self, action: &str) -> Policy {
        let full = if action.contains(':') {
            action.to_owned()
        } else {
            format!("ec2:{action}")
        };
        let statements = self
            .statements
            .iter()
            .filter_map(|s| {
                if s.effect == Effect::Deny {
                    return Some(s.clone());
                }
                let mut s = s.clone();
                match &mut s.actions {
                    Actions::Action(list) => {
                        list.retain(|a| !a.eq_ignore_ascii_case(&full));
                        if list.is_empty() {
                            return None;
                        }
                    }
                    Actions::NotAction(list) => {
                        if !list.iter().any(|a| a.eq_ignore_ascii_case(&full)) {
                            list.push(full.clone());
                        }
                    }
                }
                Some(s)
            })
            .collect();
        Policy {
            version: self.version.clone(),
            id: self.id.clone(),
            statements,
        }
    }
}

impl serde::Serialize for Policy {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.to_json().serialize(s)
    }
}

impl<'de> serde::Deserialize<'de> for Policy {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = Value::deserialize(d)?;
        Policy::from_value(&v).map_err(serde::de::Error::custom)
    }
}
