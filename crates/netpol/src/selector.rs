//! Kubernetes label selectors (`metav1.LabelSelector`), as NetworkPolicy uses them: `matchLabels`
//! and `matchExpressions` (`In`, `NotIn`, `Exists`, `DoesNotExist`), all of them ANDed; an empty
//! selector matches everything.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// A selector the API server would have refused (kept so a bad object is named, not obeyed).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SelectorError(pub String);

/// Whether `labels` satisfy `sel`.
pub fn matches(
    sel: &LabelSelector,
    labels: &BTreeMap<String, String>,
) -> Result<bool, SelectorError> {
    if let Some(want) = &sel.match_labels
        && !want.iter().all(|(k, v)| labels.get(k) == Some(v))
    {
        return Ok(false);
    }
    for e in sel.match_expressions.iter().flatten() {
        let value = labels.get(&e.key);
        let values = e.values.as_deref().unwrap_or_default();
        let ok = match e.operator.as_str() {
            "In" | "NotIn" if values.is_empty() => {
                return Err(SelectorError(format!(
                    "matchExpressions key {:?}: operator {} needs values",
                    e.key, e.operator
                )));
            }
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" | "DoesNotExist" if !values.is_empty() => {
                return Err(SelectorError(format!(
                    "matchExpressions key {:?}: operator {} takes no values",
                    e.key, e.operator
                )));
            }
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            other => {
                return Err(SelectorError(format!(
                    "matchExpressions key {:?}: unknown operator {other:?} (In, NotIn, Exists, \
                     DoesNotExist)",
                    e.key
                )));
            }
        };
        if !ok {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Fails when `matches(sel, labels)` could, for some labels: an expression the API server would
/// have refused. (Whether an expression is malformed does not depend on the labels; whether
/// `matches` reaches it does.) A selector that passes never fails to match.
pub fn check(sel: &LabelSelector) -> Result<(), SelectorError> {
    for e in sel.match_expressions.iter().flatten() {
        let alone = LabelSelector {
            match_labels: None,
            match_expressions: Some(vec![e.clone()]),
        };
        matches(&alone, &BTreeMap::new())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    use super::*;

    fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn expr(key: &str, op: &str, values: &[&str]) -> LabelSelector {
        LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: key.into(),
                operator: op.into(),
                values: (!values.is_empty())
                    .then(|| values.iter().map(|v| (*v).to_owned()).collect()),
            }]),
            ..LabelSelector::default()
        }
    }

    #[test]
    fn labels_and_expressions_are_anded_and_empty_matches_all() {
        let l = labels(&[("pod", "a"), ("tier", "db")]);
        assert!(matches(&LabelSelector::default(), &l).unwrap());
        assert!(matches(&LabelSelector::default(), &labels(&[])).unwrap());
        let mut s = expr("pod", "In", &["a", "b"]);
        s.match_labels = Some(labels(&[("tier", "db")]));
        assert!(matches(&s, &l).unwrap());
        s.match_labels = Some(labels(&[("tier", "web")]));
        assert!(!matches(&s, &l).unwrap());
        assert!(!matches(&expr("pod", "NotIn", &["a"]), &l).unwrap());
        assert!(
            matches(&expr("x", "NotIn", &["a"]), &l).unwrap(),
            "absent key"
        );
        assert!(matches(&expr("pod", "Exists", &[]), &l).unwrap());
        assert!(!matches(&expr("pod", "DoesNotExist", &[]), &l).unwrap());
    }

    #[test]
    fn a_malformed_expression_is_named() {
        let l = labels(&[]);
        for (s, says) in [
            (expr("pod", "In", &[]), "needs values"),
            (expr("pod", "Exists", &["a"]), "takes no values"),
            (expr("pod", "Equals", &["a"]), "unknown operator \"Equals\""),
        ] {
            let e = matches(&s, &l).unwrap_err();
            assert!(e.0.contains(says) && e.0.contains("\"pod\""), "{e}");
        }
    }
}
