//! The VPC CNI's `ENIConfig` custom resource, as its CRD defines it (`deploy/eniconfig-crd.yaml`,
//! the same as the VPC CNI's `charts/aws-vpc-cni/crds/customresourcedefinition.yaml`): group
//! `crd.k8s.amazonaws.com`, version `v1alpha1`, cluster-scoped, `spec.subnet` (required by the
//! schema) and `spec.securityGroups` (a list of strings, optional).
//!
//! The type implements [`kube::Resource`] by hand rather than with kube's `CustomResource` derive:
//! the derive makes `spec` a required field and forbids `serde(default)` on the object, and an
//! ENIConfig without a spec is valid under the CRD (the schema requires `subnet` inside `spec`, not
//! `spec` itself). For the same reason the spec's fields are read leniently ([`Field`]): older VPC
//! CNI releases shipped the CRD with no schema at all (`x-kubernetes-preserve-unknown-fields` only,
//! v1.11 for one), so a cluster may hold an object whose `subnet` is a number. A type that refused
//! such an object would fail the whole list and leave every node without an answer; here it is read,
//! and judged [`NodeNetwork::Invalid`](super::NodeNetwork::Invalid) with the field named — and only
//! the nodes that name it are affected.

use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::ClusterResourceScope;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::PodNetwork;

/// A field as the object has it: of the expected type, or something else (kept to say what).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Field<T> {
    Typed(T),
    Other(Value),
}

/// An `ENIConfig` object.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ENIConfig {
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// Absent (or null) in an object that has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<Field<ENIConfigSpec>>,
}

impl kube::Resource for ENIConfig {
    type DynamicType = ();
    type Scope = ClusterResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "ENIConfig".into()
    }

    fn group(_: &()) -> Cow<'_, str> {
        "crd.k8s.amazonaws.com".into()
    }

    fn version(_: &()) -> Cow<'_, str> {
        "v1alpha1".into()
    }

    fn plural(_: &()) -> Cow<'_, str> {
        "eniconfigs".into()
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// `spec` of an `ENIConfig`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ENIConfigSpec {
    /// The subnet of the pod ENIs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subnet: Option<Field<String>>,
    /// Their security groups; none (absent, null or empty): the primary ENI's, as the VPC CNI does.
    #[serde(
        default,
        rename = "securityGroups",
        skip_serializing_if = "Option::is_none"
    )]
    pub security_groups: Option<Field<Vec<Field<String>>>>,
}

impl ENIConfig {
    /// An object named `name` with this spec, as an operator applies it.
    pub fn new(name: &str, spec: ENIConfigSpec) -> Self {
        Self {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            spec: Some(Field::Typed(spec)),
        }
    }
}

impl ENIConfigSpec {
    /// The spec an operator writes: this subnet and these groups.
    pub fn of(subnet: &str, groups: &[&str]) -> Self {
        Self {
            subnet: Some(Field::Typed(subnet.to_owned())),
            security_groups: Some(Field::Typed(
                groups
                    .iter()
                    .map(|g| Field::Typed((*g).to_owned()))
                    .collect(),
            )),
        }
    }
}

/// An EC2 id: `prefix` and 8 or 17 hex digits (the two lengths EC2 has issued), as
/// `eniipam_api::model::EniId` checks ENI ids.
fn is_id(s: &str, prefix: &str) -> bool {
    s.strip_prefix(prefix).is_some_and(|hex| {
        (hex.len() == 8 || hex.len() == 17) && hex.bytes().all(|b| b.is_ascii_hexdigit())
    })
}

impl ENIConfig {
    /// What this object (named `name`) gives the node's pod ENIs, or why it cannot be used: each
    /// reason names the ENIConfig and the field, so the operator knows what to fix.
    pub fn pod_network(&self, name: &str) -> Result<PodNetwork, String> {
        let at = |field: &str, what: String| format!("ENIConfig {name:?}: {field} {what}");
        let spec = match &self.spec {
            None => {
                return Err(at(
                    "spec.subnet",
                    "is missing (the object has no spec)".into(),
                ));
            }
            Some(Field::Other(v)) => return Err(at("spec", format!("is not an object: {v}"))),
            Some(Field::Typed(spec)) => spec,
        };
        let subnet = match &spec.subnet {
            None => return Err(at("spec.subnet", "is missing".into())),
            Some(Field::Other(v)) => {
                return Err(at("spec.subnet", format!("is not a string: {v}")));
            }
            Some(Field::Typed(s)) if !is_id(s, "subnet-") => {
                return Err(at(
                    "spec.subnet",
                    format!("{s:?} is not a subnet id (subnet- and 8 or 17 hex digits)"),
                ));
            }
            Some(Field::Typed(s)) => s.clone(),
        };
        let groups = match &spec.security_groups {
            None => Vec::new(),
            Some(Field::Other(v)) => {
                return Err(at("spec.securityGroups", format!("is not a list: {v}")));
            }
            Some(Field::Typed(list)) => {
                let mut groups = Vec::with_capacity(list.len());
                for (i, g) in list.iter().enumerate() {
                    let field = format!("spec.securityGroups[{i}]");
                    match g {
                        Field::Typed(g) if is_id(g, "sg-") => groups.push(g.clone()),
                        Field::Typed(g) => {
                            return Err(at(
                                &field,
                                format!(
                                    "{g:?} is not a security group id (sg- and 8 or 17 hex digits)"
                                ),
                            ));
                        }
                        Field::Other(v) => {
                            return Err(at(&field, format!("is not a string: {v}")));
                        }
                    }
                }
                groups
            }
        };
        Ok(PodNetwork {
            eni_config: name.to_owned(),
            subnet_id: subnet,
            security_groups: groups,
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn read(v: Value) -> Result<PodNetwork, String> {
        let c: ENIConfig = serde_json::from_value(v).expect("reads");
        c.pod_network(c.metadata.name.as_deref().unwrap())
    }

    #[test]
    fn a_good_object_gives_its_subnet_and_groups() {
        let net = read(json!({
            "apiVersion": "crd.k8s.amazonaws.com/v1alpha1", "kind": "ENIConfig",
            "metadata": {"name": "us-east-1a"},
            "spec": {"subnet": "subnet-0a1b2c3d4e5f60718", "securityGroups": ["sg-0123abcd", "sg-4567ef01"]},
        }))
        .unwrap();
        assert_eq!(net.subnet_id, "subnet-0a1b2c3d4e5f60718");
        assert_eq!(net.security_groups, ["sg-0123abcd", "sg-4567ef01"]);
        for groups in [json!(null), json!([])] {
            let net = read(json!({"metadata": {"name": "a"}, "spec": {"subnet": "subnet-0123abcd", "securityGroups": groups}})).unwrap();
            assert!(net.security_groups.is_empty(), "the primary ENI's groups");
        }
        let net = read(json!({"metadata": {"name": "a"}, "spec": {"subnet": "subnet-0123abcd"}}))
            .unwrap();
        assert!(net.security_groups.is_empty());
    }

    #[test]
    fn a_bad_object_is_refused_naming_the_object_and_the_field() {
        let cases = [
            (
                json!({"metadata": {"name": "a"}}),
                "ENIConfig \"a\": spec.subnet is missing",
            ),
            (
                json!({"metadata": {"name": "a"}, "spec": {}}),
                "spec.subnet is missing",
            ),
            (
                json!({"metadata": {"name": "a"}, "spec": null}),
                "spec.subnet is missing",
            ),
            (
                json!({"metadata": {"name": "a"}, "spec": "x"}),
                "ENIConfig \"a\": spec is not an object: \"x\"",
            ),
            (
                json!({"metadata": {"name": "a"}, "spec": {"subnet": 42}}),
                "spec.subnet is not a string: 42",
            ),
            (
                json!({"metadata": {"name": "a"}, "spec": {"subnet": "subnet-xyz"}}),
                "spec.subnet \"subnet-xyz\" is not a subnet id",
            ),
            (
                json!({"metadata": {"name": "a"}, "spec": {"subnet": "sg-0123abcd"}}),
                "spec.subnet \"sg-0123abcd\" is not a subnet id",
            ),
            (
                json!({"metadata": {"name": "a"}, "spec": {"subnet": "subnet-0123abcd", "securityGroups": "sg-0123abcd"}}),
                "spec.securityGroups is not a list",
            ),
            (
                json!({"metadata": {"name": "a"}, "spec": {"subnet": "subnet-0123abcd", "securityGroups": ["sg-0123abcd", "default"]}}),
                "ENIConfig \"a\": spec.securityGroups[1] \"default\" is not a security group id",
            ),
            (
                json!({"metadata": {"name": "a"}, "spec": {"subnet": "subnet-0123abcd", "securityGroups": [7]}}),
                "spec.securityGroups[0] is not a string: 7",
            ),
        ];
        for (object, want) in cases {
            let why = read(object.clone()).unwrap_err();
            assert!(why.contains(want), "{object}: {why}");
        }
    }
}
