//! Condition operators as IAM evaluates them, over a request context.
//!
//! Within one operator block every key must hold (AND); within one key any policy value may match
//! (OR); blocks are ANDed. A key missing from the context makes a positive operator false and a
//! negated one (`StringNotEquals`, `ArnNotLike`, …) true; `…IfExists` makes any operator true on a
//! missing key. `ForAllValues:` is true when the key is missing or empty and otherwise needs every
//! context value to match; `ForAnyValue:` is false when missing or empty and needs one value to
//! match. Condition key names compare case-insensitively, values case-sensitively (except in the
//! `IgnoreCase` operators). An operator mockcloud does not know is an error, which the evaluator
//! turns into a denial.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::policy::ConditionBlock;

/// The request context: condition keys with their values (single-valued keys hold one).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Context(pub BTreeMap<String, Vec<String>>);

impl Context {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn set(&mut self, key: impl Into<String>, value: impl Into<String>) {
        self.0.insert(key.into(), vec![value.into()]);
    }

    pub fn set_many(&mut self, key: impl Into<String>, values: Vec<String>) {
        self.0.insert(key.into(), values);
    }

    /// The values of `key`, compared case-insensitively.
    pub fn get(&self, key: &str) -> Option<&[String]> {
        self.0
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(key))
            .map(|(_, v)| v.as_slice())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Base {
    StringEquals,
    StringNotEquals,
    StringEqualsIgnoreCase,
    StringNotEqualsIgnoreCase,
    StringLike,
    StringNotLike,
    ArnEquals,
    ArnLike,
    ArnNotEquals,
    ArnNotLike,
    NumericEquals,
    NumericNotEquals,
    NumericLessThan,
    NumericLessThanEquals,
    NumericGreaterThan,
    NumericGreaterThanEquals,
    Bool,
    Null,
}

impl Base {
    fn parse(s: &str) -> Option<Self> {
        use Base::*;
        Some(match s {
            "StringEquals" => StringEquals,
            "StringNotEquals" => StringNotEquals,
            "StringEqualsIgnoreCase" => StringEqualsIgnoreCase,
            "StringNotEqualsIgnoreCase" => StringNotEqualsIgnoreCase,
            "StringLike" => StringLike,
            "StringNotLike" => StringNotLike,
            "ArnEquals" => ArnEquals,
            "ArnLike" => ArnLike,
            "ArnNotEquals" => ArnNotEquals,
            "ArnNotLike" => ArnNotLike,
            "NumericEquals" => NumericEquals,
            "NumericNotEquals" => NumericNotEquals,
            "NumericLessThan" => NumericLessThan,
            "NumericLessThanEquals" => NumericLessThanEquals,
            "NumericGreaterThan" => NumericGreaterThan,
            "NumericGreaterThanEquals" => NumericGreaterThanEquals,
            "Bool" => Bool,
            "Null" => Null,
            _ => return None,
        })
    }

    fn negated(self) -> bool {
        use Base::*;
        matches!(
            self,
            StringNotEquals
                | StringNotEqualsIgnoreCase
                | StringNotLike
                | ArnNotEquals
                | ArnNotLike
                | NumericNotEquals
        )
    }

    /// The positive form's match of one context value against one policy value.
    fn matches_one(self, policy: &str, value: &str) -> bool {
        use Base::*;
        match self {
            StringEquals | StringNotEquals => policy == value,
            StringEqualsIgnoreCase | StringNotEqualsIgnoreCase => {
                policy.to_lowercase() == value.to_lowercase()
            }
            StringLike | StringNotLike => glob(policy, value, false),
            ArnEquals | ArnLike | ArnNotEquals | ArnNotLike => arn_like(policy, value),
            NumericEquals | NumericNotEquals => num(policy, value, |p, v| v == p),
            NumericLessThan => num(policy, value, |p, v| v < p),
            NumericLessThanEquals => num(policy, value, |p, v| v <= p),
            NumericGreaterThan => num(policy, value, |p, v| v > p),
            NumericGreaterThanEquals => num(policy, value, |p, v| v >= p),
            Bool => policy.eq_ignore_ascii_case(value),
            Null => false,
        }
    }
}

fn num(policy: &str, value: &str, f: impl Fn(f64, f64) -> bool) -> bool {
    match (policy.parse::<f64>(), value.parse::<f64>()) {
        (Ok(p), Ok(v)) => f(p, v),
        _ => false,
    }
}

/// `*` (any run) and `?` (one character) wildcards; `ignore_case` for action names.
pub fn glob(pattern: &str, value: &str, ignore_case: bool) -> bool {
    let (p, v): (Vec<char>, Vec<char>) = if ignore_case {
        (
            pattern.to_lowercase().chars().collect(),
            value.to_lowercase().chars().collect(),
        )
    } else {
        (pattern.chars().collect(), value.chars().collect())
    };
    // Iterative wildcard match with backtracking to the last `*`.
    let (mut i, mut j, mut star, mut mark) = (0usize, 0usize, None::<usize>, 0usize);
    while j < v.len() {
        if i < p.len() && (p[i] == '?' || p[i] == v[j]) {
            i += 1;
            j += 1;
        } else if i < p.len() && p[i] == '*' {
            star = Some(i);
            mark = j;
            i += 1;
        } else if let Some(s) = star {
            i = s + 1;
            mark += 1;
            j = mark;
        } else {
            return false;
        }
    }
    p[i..].iter().all(|c| *c == '*')
}

/// ARN matching as `ArnLike`/`ArnEquals` and `Resource` do it: the six `:`-separated parts are
/// matched one by one with wildcards (the resource part may itself hold `:`).
pub fn arn_like(pattern: &str, arn: &str) -> bool {
    if pattern == "*" {
        return true;
    }
    let p: Vec<&str> = pattern.splitn(6, ':').collect();
    let a: Vec<&str> = arn.splitn(6, ':').collect();
    p.len() == 6 && a.len() == 6 && p.iter().zip(&a).all(|(p, a)| glob(p, a, false))
}

/// A parsed operator: set qualifier, base operator, IfExists.
struct Operator {
    base: Base,
    for_all: bool,
    for_any: bool,
    if_exists: bool,
}

fn parse_operator(op: &str) -> Option<Operator> {
    let (for_all, for_any, rest) = if let Some(r) = op.strip_prefix("ForAllValues:") {
        (true, false, r)
    } else if let Some(r) = op.strip_prefix("ForAnyValue:") {
        (false, true, r)
    } else {
        (false, false, op)
    };
    let (if_exists, name) = match rest.strip_suffix("IfExists") {
        Some(n) => (true, n),
        None => (false, rest),
    };
    let base = Base::parse(name)?;
    if base == Base::Null && (if_exists || for_all || for_any) {
        return None;
    }
    Some(Operator {
        base,
        for_all,
        for_any,
        if_exists,
    })
}

/// Whether one context value satisfies the operator against the policy's values.
fn value_ok(base: Base, policy: &[String], value: &str) -> bool {
    let any = policy.iter().any(|p| base.matches_one(p, value));
    if base.negated() { !any } else { any }
}

/// Evaluates one operator block; `Err` names an operator mockcloud does not know.
pub fn eval_block(block: &ConditionBlock, ctx: &Context) -> Result<bool, String> {
    let Some(op) = parse_operator(&block.operator) else {
        return Err(format!(
            "unknown condition operator {:?} (mockcloud knows String*, Arn*, Numeric*, Bool, Null, with IfExists and ForAllValues:/ForAnyValue:)",
            block.operator
        ));
    };
    for (key, policy) in &block.keys {
        let values = ctx.get(key).unwrap_or(&[]);
        let present = ctx.get(key).is_some_and(|v| !v.is_empty());
        let ok = if op.base == Base::Null {
            // "true": the key is absent; "false": it is present. Values ORed.
            policy.iter().any(|p| {
                if p.eq_ignore_ascii_case("true") {
                    !present
                } else {
                    p.eq_ignore_ascii_case("false") && present
                }
            })
        } else if op.for_all {
            !present || values.iter().all(|v| value_ok(op.base, policy, v))
        } else if op.for_any {
            if present {
                values.iter().any(|v| value_ok(op.base, policy, v))
            } else {
                op.if_exists
            }
        } else if !present {
            op.if_exists || op.base.negated()
        } else if op.base.negated() {
            // No context value matches any policy value.
            values.iter().all(|v| value_ok(op.base, policy, v))
        } else {
            values.iter().any(|v| value_ok(op.base, policy, v))
        };
        if !ok {
            return Ok(false);
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(op: &str, key: &str, values: &[&str]) -> ConditionBlock {
        ConditionBlock {
            operator: op.into(),
            keys: vec![(key.into(), values.iter().map(|s| s.to_string()).collect())],
        }
    }

    fn ctx(pairs: &[(&str, &[&str])]) -> Context {
        let mut c = Context::new();
        for (k, v) in pairs {
            c.set_many(*k, v.iter().map(|s| s.to_string()).collect());
        }
        c
    }

    #[test]
    fn wildcards() {
        assert!(glob("ec2:Describe*", "ec2:describeSubnets", true));
        assert!(!glob("ec2:Describe*", "ec2:describeSubnets", false));
        assert!(glob("a?c*", "abcdef", false));
        assert!(!glob("a?c", "ac", false));
        assert!(glob("*", "", false));
        assert!(arn_like(
            "arn:aws:ec2:*:*:vpc/vpc-1",
            "arn:aws:ec2:us-east-1:123456789012:vpc/vpc-1"
        ));
        assert!(!arn_like(
            "arn:aws:ec2:*:*:vpc/vpc-1",
            "arn:aws:ec2:us-east-1:123456789012:vpc/vpc-2"
        ));
        assert!(!arn_like("arn:aws:ec2:*:*:vpc/*", "not-an-arn"));
    }

    #[test]
    fn strings_and_negation_on_missing_keys() {
        let c = ctx(&[("aws:ResourceTag/team", &["blue"])]);
        assert_eq!(
            eval_block(
                &block("StringEquals", "aws:resourcetag/TEAM", &["red", "blue"]),
                &c
            ),
            Ok(true),
            "key names case-insensitive, values ORed"
        );
        assert_eq!(
            eval_block(
                &block("StringEquals", "aws:ResourceTag/team", &["Blue"]),
                &c
            ),
            Ok(false),
            "values case-sensitive"
        );
        assert_eq!(
            eval_block(
                &block("StringEqualsIgnoreCase", "aws:ResourceTag/team", &["BLUE"]),
                &c
            ),
            Ok(true)
        );
        assert_eq!(
            eval_block(
                &block("StringNotEquals", "aws:ResourceTag/team", &["blue"]),
                &c
            ),
            Ok(false)
        );
        // Missing key: positive false, negated true, IfExists true.
        assert_eq!(
            eval_block(&block("StringEquals", "aws:ResourceTag/x", &["a"]), &c),
            Ok(false)
        );
        assert_eq!(
            eval_block(&block("StringNotEquals", "aws:ResourceTag/x", &["a"]), &c),
            Ok(true)
        );
        assert_eq!(
            eval_block(
                &block("StringEqualsIfExists", "aws:ResourceTag/x", &["a"]),
                &c
            ),
            Ok(true)
        );
        assert_eq!(
            eval_block(
                &block("StringEqualsIfExists", "aws:ResourceTag/team", &["a"]),
                &c
            ),
            Ok(false),
            "IfExists still compares a present key"
        );
        assert_eq!(
            eval_block(&block("StringLike", "aws:ResourceTag/team", &["bl*"]), &c),
            Ok(true)
        );
        assert_eq!(
            eval_block(
                &block("StringNotLike", "aws:ResourceTag/team", &["bl*"]),
                &c
            ),
            Ok(false)
        );
    }

    #[test]
    fn set_operators() {
        let empty = Context::new();
        let keys = ctx(&[("aws:TagKeys", &["a", "b"])]);
        let all = block("ForAllValues:StringEquals", "aws:TagKeys", &["a", "b", "c"]);
        let any = block("ForAnyValue:StringEquals", "aws:TagKeys", &["b", "z"]);
        assert_eq!(
            eval_block(&all, &empty),
            Ok(true),
            "ForAllValues on a missing key"
        );
        assert_eq!(
            eval_block(&any, &empty),
            Ok(false),
            "ForAnyValue on a missing key"
        );
        assert_eq!(eval_block(&all, &keys), Ok(true));
        assert_eq!(eval_block(&any, &keys), Ok(true));
        let narrow = block("ForAllValues:StringEquals", "aws:TagKeys", &["a"]);
        assert_eq!(eval_block(&narrow, &keys), Ok(false));
        let none = block("ForAnyValue:StringEquals", "aws:TagKeys", &["z"]);
        assert_eq!(eval_block(&none, &keys), Ok(false));
        let empty_list = ctx(&[("aws:TagKeys", &[])]);
        assert_eq!(eval_block(&all, &empty_list), Ok(true));
        assert_eq!(eval_block(&any, &empty_list), Ok(false));
    }

    #[test]
    fn null_bool_numeric_and_unknown() {
        let c = ctx(&[
            ("aws:ResourceTag/k", &["v"]),
            ("aws:SecureTransport", &["true"]),
            ("ec2:Count", &["5"]),
        ]);
        assert_eq!(
            eval_block(&block("Null", "aws:ResourceTag/k", &["false"]), &c),
            Ok(true)
        );
        assert_eq!(
            eval_block(&block("Null", "aws:ResourceTag/k", &["true"]), &c),
            Ok(false)
        );
        assert_eq!(
            eval_block(&block("Null", "aws:ResourceTag/z", &["true"]), &c),
            Ok(true)
        );
        assert_eq!(
            eval_block(&block("Bool", "aws:SecureTransport", &["TRUE"]), &c),
            Ok(true)
        );
        assert_eq!(
            eval_block(&block("NumericLessThan", "ec2:Count", &["6"]), &c),
            Ok(true)
        );
        assert_eq!(
            eval_block(&block("NumericGreaterThanEquals", "ec2:Count", &["6"]), &c),
            Ok(false)
        );
        assert_eq!(
            eval_block(&block("NumericEquals", "ec2:Count", &["x"]), &c),
            Ok(false)
        );
        assert!(eval_block(&block("StringEqualz", "ec2:Count", &["5"]), &c).is_err());
        assert!(
            eval_block(
                &block("DateLessThan", "aws:CurrentTime", &["2030-01-01"]),
                &c
            )
            .is_err()
        );
        assert!(eval_block(&block("NullIfExists", "ec2:Count", &["true"]), &c).is_err());
    }
}
