//! The `NetworkProfile` custom resource (`deploy/networkprofile-crd.yaml`): group `eniipam.io`,
//! version `v1alpha1`, cluster-scoped, and its validation into a [`ProfileSpec`].
//!
//! As for the ENIConfig (the `eniipam-custom-networking` crate's type, whose reasons this follows), the type
//! implements [`kube::Resource`] by hand and keeps `spec` as raw JSON: the CRD's schema refuses bad
//! objects at `kubectl apply`, but an object stored before the schema was installed (or with the
//! schema changed by hand) must not fail the whole list: kube's watcher drops the entire list when
//! one item does not deserialize, which would leave every profile unknown. Here such an object is
//! read, judged invalid with the object and the field named, and only its pods are affected.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::ClusterResourceScope;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::resources::resource_name;

/// Most security groups an ENI may carry (EC2's default quota, "security groups per network
/// interface"; the CRD's schema has the same bound).
pub const MAX_SECURITY_GROUPS: usize = 5;

/// A `NetworkProfile` object.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NetworkProfile {
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// Kept as JSON and judged by [`NetworkProfile::spec`] (see the module docs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<Value>,
}

impl kube::Resource for NetworkProfile {
    type DynamicType = ();
    type Scope = ClusterResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "NetworkProfile".into()
    }

    fn group(_: &()) -> Cow<'_, str> {
        "eniipam.io".into()
    }

    fn version(_: &()) -> Cow<'_, str> {
        "v1alpha1".into()
    }

    fn plural(_: &()) -> Cow<'_, str> {
        "networkprofiles".into()
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// Where a profile's ENIs live.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SubnetChoice {
    /// `spec.subnet`: this subnet (the daemon checks its zone and VPC against the node's).
    Id(String),
    /// `spec.subnetSelector.tags`: the subnet of the node's zone that carries all these tags.
    Tags(BTreeMap<String, String>),
}

/// How a profile's pods reach destinations outside the VPC (`spec.egressMode`; the VPC CNI's
/// `POD_SECURITY_GROUP_ENFORCING_MODE` for security groups for pods, per profile here).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EgressMode {
    /// `strict` (the default): every packet of the pod leaves by its own ENI with its own address,
    /// so the profile's groups judge all of it; its internet egress needs a NAT gateway (its subnet's
    /// route), as with `external_snat`.
    #[default]
    Strict,
    /// `standard`: traffic outside the VPC is SNATed to eth0's primary IP and leaves by eth0, judged
    /// by eth0's groups, as for pods without a profile. Traffic inside the VPC is the profile's.
    Standard,
}

impl EgressMode {
    /// The value as written in `spec.egressMode`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Strict => "strict",
            Self::Standard => "standard",
        }
    }
}

/// A valid profile, as the pool uses it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProfileSpec {
    /// The object's name: what `eniipam.io/network` annotations name.
    pub name: String,
    pub subnet: SubnetChoice,
    /// `spec.securityGroups`: 1 to [`MAX_SECURITY_GROUPS`] group ids, in the object's order, no
    /// repeats. The profile's ENIs carry exactly these.
    pub security_groups: Vec<String>,
    /// `spec.maxEnisPerNode`: at most this many ENIs of the profile on one node (`None`: as many as
    /// the node's free ENI slots allow).
    pub max_enis: Option<u32>,
    /// `spec.egressMode`: `strict` when absent.
    pub egress_mode: EgressMode,
}

/// An EC2 id: `prefix` and 8 or 17 hex digits (the two lengths EC2 has issued).
fn is_id(s: &str, prefix: &str) -> bool {
    s.strip_prefix(prefix).is_some_and(|hex| {
        (hex.len() == 8 || hex.len() == 17) && hex.bytes().all(|b| b.is_ascii_hexdigit())
    })
}

/// EC2's tag limits: a key 1 to 128 characters, a value at most 256.
const TAG_KEY_MAX: usize = 128;
const TAG_VALUE_MAX: usize = 256;

impl NetworkProfile {
    /// An object named `name` with this `spec`, as an operator applies it.
    pub fn new(name: &str, spec: Value) -> Self {
        Self {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            spec: Some(spec),
        }
    }

    /// The profile, or why it cannot be used: each reason names the NetworkProfile and the field.
    pub fn spec(&self) -> Result<ProfileSpec, String> {
        let name = self.metadata.name.clone().unwrap_or_default();
        let at = |field: &str, what: String| format!("NetworkProfile {name:?}: {field} {what}");
        resource_name(&name).map_err(|why| at("metadata.name", why))?;
        let spec = match &self.spec {
            None | Some(Value::Null) => {
                return Err(at("spec", "is missing".into()));
            }
            Some(Value::Object(spec)) => spec,
            Some(v) => return Err(at("spec", format!("is not an object: {v}"))),
        };
        let subnet = match (spec.get("subnet"), spec.get("subnetSelector")) {
            (Some(_), Some(_)) => {
                return Err(at(
                    "spec.subnet",
                    "and spec.subnetSelector are both set: name one subnet, or select by tags"
                        .into(),
                ));
            }
            (None, None) => {
                return Err(at(
                    "spec.subnet",
                    "is missing (or spec.subnetSelector.tags): where the profile's ENIs go".into(),
                ));
            }
            (Some(Value::String(s)), None) if is_id(s, "subnet-") => SubnetChoice::Id(s.clone()),
            (Some(Value::String(s)), None) => {
                return Err(at(
                    "spec.subnet",
                    format!("{s:?} is not a subnet id (subnet- and 8 or 17 hex digits)"),
                ));
            }
            (Some(v), None) => return Err(at("spec.subnet", format!("is not a string: {v}"))),
            (None, Some(sel)) => SubnetChoice::Tags(tags(sel).map_err(|(f, w)| at(&f, w))?),
        };
        let security_groups = groups(spec.get("securityGroups")).map_err(|(f, w)| at(&f, w))?;
        let max_enis = match spec.get("maxEnisPerNode") {
            None | Some(Value::Null) => None,
            Some(v) => match v.as_u64().map(u32::try_from) {
                Some(Ok(n)) if n >= 1 => Some(n),
                _ => {
                    return Err(at(
                        "spec.maxEnisPerNode",
                        format!("{v} is not a whole number from 1 to {}", u32::MAX),
                    ));
                }
            },
        };
        let egress_mode = match spec.get("egressMode") {
            None | Some(Value::Null) => EgressMode::default(),
            Some(Value::String(s)) if s == "strict" => EgressMode::Strict,
            Some(Value::String(s)) if s == "standard" => EgressMode::Standard,
            Some(v) => {
                return Err(at(
                    "spec.egressMode",
                    format!("{v} is not \"strict\" (the default) or \"standard\""),
                ));
            }
        };
        Ok(ProfileSpec {
            name,
            subnet,
            security_groups,
            max_enis,
            egress_mode,
        })
    }
}

/// `spec.subnetSelector.tags`: a non-empty map of string values within EC2's tag limits.
fn tags(sel: &Value) -> Result<BTreeMap<String, String>, (String, String)> {
    let err = |f: &str, w: String| (f.to_owned(), w);
    let Value::Object(sel) = sel else {
        return Err(err(
            "spec.subnetSelector",
            format!("is not an object: {sel}"),
        ));
    };
    let tags = match sel.get("tags") {
        None | Some(Value::Null) => {
            return Err(err("spec.subnetSelector.tags", "is missing".into()));
        }
        Some(Value::Object(t)) => t,
        Some(v) => {
            return Err(err(
                "spec.subnetSelector.tags",
                format!("is not a map of tag keys to values: {v}"),
            ));
        }
    };
    if tags.is_empty() {
        return Err(err(
            "spec.subnetSelector.tags",
            "is empty: it would select every subnet of the zone".into(),
        ));
    }
    let mut out = BTreeMap::new();
    for (k, v) in tags {
        let field = format!("spec.subnetSelector.tags[{k:?}]");
        if k.is_empty() || k.chars().count() > TAG_KEY_MAX {
            return Err(err(
                &field,
                format!("the key is not 1 to {TAG_KEY_MAX} characters (EC2's tag key limit)"),
            ));
        }
        match v {
            Value::String(s) if s.chars().count() <= TAG_VALUE_MAX => {
                out.insert(k.clone(), s.clone());
            }
            Value::String(_) => {
                return Err(err(
                    &field,
                    format!("is longer than {TAG_VALUE_MAX} characters (EC2's tag value limit)"),
                ));
            }
            other => return Err(err(&field, format!("is not a string: {other}"))),
        }
    }
    Ok(out)
}

/// `spec.securityGroups`: 1 to [`MAX_SECURITY_GROUPS`] distinct group ids.
fn groups(v: Option<&Value>) -> Result<Vec<String>, (String, String)> {
    let field = "spec.securityGroups".to_owned();
    let list = match v {
        None | Some(Value::Null) => {
            return Err((
                field,
                "is missing: a profile is the security groups its pods get".into(),
            ));
        }
        Some(Value::Array(list)) => list,
        Some(v) => return Err((field, format!("is not a list: {v}"))),
    };
    if list.is_empty() || list.len() > MAX_SECURITY_GROUPS {
        return Err((
            field,
            format!(
                "has {} groups: an ENI carries 1 to {MAX_SECURITY_GROUPS}",
                list.len()
            ),
        ));
    }
    let mut out: Vec<String> = Vec::with_capacity(list.len());
    for (i, g) in list.iter().enumerate() {
        let field = format!("spec.securityGroups[{i}]");
        match g {
            Value::String(g) if !is_id(g, "sg-") => {
                return Err((
                    field,
                    format!("{g:?} is not a security group id (sg- and 8 or 17 hex digits)"),
                ));
            }
            Value::String(g) if out.contains(g) => {
                return Err((field, format!("{g:?} is listed twice")));
            }
            Value::String(g) => out.push(g.clone()),
            other => return Err((field, format!("is not a string: {other}"))),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn read(name: &str, spec: Value) -> Result<ProfileSpec, String> {
        let p: NetworkProfile = serde_json::from_value(json!({
            "apiVersion": "eniipam.io/v1alpha1", "kind": "NetworkProfile",
            "metadata": {"name": name}, "spec": spec,
        }))
        .expect("any object reads");
        p.spec()
    }

    #[test]
    fn a_good_profile_gives_its_subnet_groups_and_limit() {
        let p = read(
            "db",
            json!({"subnet": "subnet-0a1b2c3d4e5f60718", "securityGroups": ["sg-0123abcd", "sg-4567ef01"], "maxEnisPerNode": 2}),
        )
        .unwrap();
        assert_eq!(
            p,
            ProfileSpec {
                name: "db".into(),
                subnet: SubnetChoice::Id("subnet-0a1b2c3d4e5f60718".into()),
                security_groups: vec!["sg-0123abcd".into(), "sg-4567ef01".into()],
                max_enis: Some(2),
                egress_mode: EgressMode::Strict,
            }
        );
        let p = read(
            "app",
            json!({"subnetSelector": {"tags": {"tier": "app", "kubernetes.io/role/cni": "1"}}, "securityGroups": ["sg-0123abcd"]}),
        )
        .unwrap();
        assert_eq!(
            p.subnet,
            SubnetChoice::Tags(BTreeMap::from([
                ("kubernetes.io/role/cni".into(), "1".into()),
                ("tier".into(), "app".into())
            ]))
        );
        assert_eq!(p.max_enis, None);
    }

    #[test]
    fn the_egress_mode_is_strict_unless_the_profile_asks_for_standard() {
        let mode = |v: Value| {
            read(
                "db",
                json!({"subnet": "subnet-0123abcd", "securityGroups": ["sg-0123abcd"], "egressMode": v}),
            )
            .map(|p| p.egress_mode)
        };
        assert_eq!(mode(json!(null)), Ok(EgressMode::Strict));
        assert_eq!(mode(json!("strict")), Ok(EgressMode::Strict));
        assert_eq!(mode(json!("standard")), Ok(EgressMode::Standard));
        for bad in [json!("Standard"), json!("loose"), json!(""), json!(true)] {
            let why = mode(bad.clone()).unwrap_err();
            assert!(
                why.starts_with("NetworkProfile \"db\": spec.egressMode ")
                    && why.contains("is not \"strict\" (the default) or \"standard\""),
                "{bad}: {why}"
            );
        }
    }

    #[test]
    fn a_bad_profile_is_refused_naming_the_object_and_the_field() {
        let sg = json!(["sg-0123abcd"]);
        let long = "a".repeat(56);
        let cases = [
            ("db", json!(null), "NetworkProfile \"db\": spec is missing"),
            ("db", json!("x"), "spec is not an object: \"x\""),
            (
                "db",
                json!({"securityGroups": sg}),
                "NetworkProfile \"db\": spec.subnet is missing",
            ),
            (
                "db",
                json!({"subnet": "subnet-0123abcd", "subnetSelector": {"tags": {"a": "b"}}, "securityGroups": sg}),
                "spec.subnet and spec.subnetSelector are both set",
            ),
            (
                "db",
                json!({"subnet": "subnet-xyz", "securityGroups": sg}),
                "spec.subnet \"subnet-xyz\" is not a subnet id",
            ),
            (
                "db",
                json!({"subnet": 7, "securityGroups": sg}),
                "spec.subnet is not a string: 7",
            ),
            (
                "db",
                json!({"subnetSelector": {}, "securityGroups": sg}),
                "spec.subnetSelector.tags is missing",
            ),
            (
                "db",
                json!({"subnetSelector": {"tags": {}}, "securityGroups": sg}),
                "spec.subnetSelector.tags is empty",
            ),
            (
                "db",
                json!({"subnetSelector": {"tags": {"tier": 1}}, "securityGroups": sg}),
                "spec.subnetSelector.tags[\"tier\"] is not a string: 1",
            ),
            (
                "db",
                json!({"subnet": "subnet-0123abcd"}),
                "spec.securityGroups is missing",
            ),
            (
                "db",
                json!({"subnet": "subnet-0123abcd", "securityGroups": []}),
                "spec.securityGroups has 0 groups: an ENI carries 1 to 5",
            ),
            (
                "db",
                json!({"subnet": "subnet-0123abcd", "securityGroups": ["sg-00000001", "sg-00000002", "sg-00000003", "sg-00000004", "sg-00000005", "sg-00000006"]}),
                "spec.securityGroups has 6 groups",
            ),
            (
                "db",
                json!({"subnet": "subnet-0123abcd", "securityGroups": ["sg-0123abcd", "default"]}),
                "NetworkProfile \"db\": spec.securityGroups[1] \"default\" is not a security group id",
            ),
            (
                "db",
                json!({"subnet": "subnet-0123abcd", "securityGroups": ["sg-0123abcd", "sg-0123abcd"]}),
                "spec.securityGroups[1] \"sg-0123abcd\" is listed twice",
            ),
            (
                "db",
                json!({"subnet": "subnet-0123abcd", "securityGroups": sg, "maxEnisPerNode": 0}),
                "spec.maxEnisPerNode 0 is not a whole number from 1",
            ),
            (
                "db",
                json!({"subnet": "subnet-0123abcd", "securityGroups": sg, "maxEnisPerNode": "2"}),
                "spec.maxEnisPerNode \"2\" is not a whole number",
            ),
            (
                &long,
                json!({"subnet": "subnet-0123abcd", "securityGroups": sg}),
                "metadata.name",
            ),
        ];
        for (name, spec, want) in cases {
            let why = read(name, spec.clone()).unwrap_err();
            assert!(why.contains(want), "{name} {spec}: {why}");
        }
    }
}
