//! Which ENIConfig a node names, by the VPC CNI's rule (`GetNodeSpecificENIConfigName` in its
//! `pkg/eniconfig/eniconfig.go`, and the `ENI_CONFIG_ANNOTATION_DEF`/`ENI_CONFIG_LABEL_DEF` entries
//! of its README: "annotations take precedence over labels"), in this order:
//!
//! 1. the label `vpc.amazonaws.com/externalEniConfig` ([`EXTERNAL_LABEL`]): set by whoever manages
//!    ENIConfigs out of band (on the kubelet's command line, say), it overrides everything;
//! 2. the annotation [`Selector::annotation`];
//! 3. the value of the label [`Selector::label`] (with `topology.kubernetes.io/zone`, the node's
//!    zone, so the objects are named after zones);
//! 4. none of these: the VPC CNI then uses the ENIConfig named `default` ([`DEFAULT_CONFIG`]);
//!    [`judge`] does the same when that object exists, and says [`NodeNetwork::Unnamed`] when not.
//!
//! One difference, on purpose: an empty value names nothing here and the next rule applies (the VPC
//! CNI would look for an object named "", which cannot exist).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;

use super::eniconfig::ENIConfig;
use super::{NodeNetwork, Selector};

/// The VPC CNI's default annotation and label key (`ENI_CONFIG_ANNOTATION_DEF`,
/// `ENI_CONFIG_LABEL_DEF`).
pub const DEFAULT_KEY: &str = "k8s.amazonaws.com/eniConfig";
/// The VPC CNI's out-of-band label, which wins over the annotation and the label.
pub const EXTERNAL_LABEL: &str = "vpc.amazonaws.com/externalEniConfig";
/// The ENIConfig a node that names none uses (the VPC CNI's `EniConfigDefault`).
pub const DEFAULT_CONFIG: &str = "default";

/// The ENIConfig `node` names, if it names one (see the module docs for the order).
pub fn config_name(node: &Node, sel: &Selector) -> Option<String> {
    let meta = &node.metadata;
    let get = |map: &Option<BTreeMap<String, String>>, key: &str| {
        map.as_ref()
            .and_then(|m| m.get(key))
            .filter(|v| !v.is_empty())
            .cloned()
    };
    get(&meta.labels, EXTERNAL_LABEL)
        .or_else(|| get(&meta.annotations, &sel.annotation))
        .or_else(|| get(&meta.labels, &sel.label))
}

/// The node's [`NodeNetwork`], given the name it gives (from [`config_name`]) and the ENIConfigs
/// that exist, by name.
pub fn judge(named: Option<&str>, configs: &BTreeMap<String, ENIConfig>) -> NodeNetwork {
    let name = match named {
        Some(n) => n,
        None if configs.contains_key(DEFAULT_CONFIG) => DEFAULT_CONFIG,
        None => return NodeNetwork::Unnamed,
    };
    match configs.get(name) {
        None => NodeNetwork::Missing { name: name.into() },
        Some(c) => match c.pod_network(name) {
            Ok(net) => NodeNetwork::Ready(net),
            Err(why) => NodeNetwork::Invalid {
                name: name.into(),
                why,
            },
        },
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;
    use crate::PodNetwork;

    fn node(labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> Node {
        let map = |kv: &[(&str, &str)]| {
            Some(
                kv.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            )
        };
        Node {
            metadata: ObjectMeta {
                name: Some("n".into()),
                labels: map(labels),
                annotations: map(annotations),
                ..ObjectMeta::default()
            },
            ..Node::default()
        }
    }

    #[test]
    fn the_external_label_then_the_annotation_then_the_label_name_the_object() {
        let sel = Selector::default();
        assert_eq!(config_name(&node(&[], &[]), &sel), None);
        assert_eq!(
            config_name(&node(&[(DEFAULT_KEY, "by-label")], &[]), &sel).as_deref(),
            Some("by-label")
        );
        let both = node(
            &[(DEFAULT_KEY, "by-label")],
            &[(DEFAULT_KEY, "by-annotation")],
        );
        assert_eq!(config_name(&both, &sel).as_deref(), Some("by-annotation"));
        let external = node(
            &[(DEFAULT_KEY, "by-label"), (EXTERNAL_LABEL, "external")],
            &[(DEFAULT_KEY, "by-annotation")],
        );
        assert_eq!(config_name(&external, &sel).as_deref(), Some("external"));
        // An empty annotation names nothing: the label applies.
        let empty = node(&[(DEFAULT_KEY, "by-label")], &[(DEFAULT_KEY, "")]);
        assert_eq!(config_name(&empty, &sel).as_deref(), Some("by-label"));
        // The zone label, configured, names the zone's object; the default key no longer counts.
        let zone = Selector {
            label: "topology.kubernetes.io/zone".into(),
            ..Selector::default()
        };
        let n = node(
            &[
                ("topology.kubernetes.io/zone", "us-east-1a"),
                (DEFAULT_KEY, "x"),
            ],
            &[],
        );
        assert_eq!(config_name(&n, &zone).as_deref(), Some("us-east-1a"));
    }

    #[test]
    fn an_unnamed_node_uses_the_default_object_when_there_is_one() {
        let mut configs = BTreeMap::new();
        assert_eq!(judge(None, &configs), NodeNetwork::Unnamed);
        assert_eq!(
            judge(Some("a"), &configs),
            NodeNetwork::Missing { name: "a".into() }
        );
        configs.insert(
            DEFAULT_CONFIG.to_owned(),
            ENIConfig::new(
                DEFAULT_CONFIG,
                ENIConfigSpec::of("subnet-0123abcd", &["sg-0123abcd"]),
            ),
        );
        assert_eq!(
            judge(None, &configs),
            NodeNetwork::Ready(PodNetwork {
                eni_config: "default".into(),
                subnet_id: "subnet-0123abcd".into(),
                security_groups: vec!["sg-0123abcd".into()],
            })
        );
    }

    use crate::ENIConfigSpec;
}
