//! The network-profiles mode (issue 27): custom networking and two network profiles, served to the
//! real daemon by an in-process API-server double (`eniipam_kubeapi`), while the soak's faults run.
//!
//! mockcloud gets the VPC's secondary block (100.64.0.0/16) with two ENIConfig subnets, one subnet
//! per profile (`db` names its subnet, `app` selects its own by tag) and five security groups; the
//! double serves the node, two ENIConfigs, the two NetworkProfiles (different groups; `db` with
//! `maxEnisPerNode: 1`) and two namespaces, `apps` annotated `eniipam.io/network: app`. Every pod is
//! put in the double, bound to the node, before its first ADD, and deleted when it ends; its
//! profile is drawn at random ([`Choice`]). Every [`SWITCH_EVERY`] steps the node's ENIConfig
//! changes (by its annotation, which wins over its label), which steers new ENIs only.
//!
//! Each profile has its own subnet, and the default network its two: an IP can only come back to a
//! pod of another network by a wrong hand-out, never by EC2 reusing an address, so the checker may
//! hold "no IP of one profile ever held by a pod of another" over the whole run.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::Context;
use eniipam_kubeapi::{Crd, FakeApiServer, eniconfig_json, pod_json};
use mockcloud::MockCloud;
use rand::Rng as _;
use serde_json::json;

/// The node's name in the API server.
pub const NODE: &str = "ip-10-0-1-10.ec2.internal";
/// The VPC CNI's default ENIConfig label and annotation key (eniipam's default too).
pub const ENICONFIG_KEY: &str = "k8s.amazonaws.com/eniConfig";
/// The pod and namespace annotation that selects a profile.
pub const ANNOTATION: &str = "eniipam.io/network";
/// The ENI tag that names an ENI's profile.
pub const NETWORK_TAG: &str = "eniipam.io/network";
/// The namespace annotated with the `app` profile.
pub const APP_NAMESPACE: &str = "apps";
/// The namespace without an annotation.
pub const PLAIN_NAMESPACE: &str = "soak";
/// Steps between two changes of the node's ENIConfig.
pub const SWITCH_EVERY: u64 = 15;
/// The two ENIConfigs: the node's label names the first, its annotation the second when set.
pub const ENICONFIGS: [&str; 2] = ["cfg-a", "cfg-b"];
/// `db`'s cap on ENIs per node.
pub const DB_MAX_ENIS: u32 = 1;

/// A subnet and the security groups of ENIs there, as EC2 has them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetSpec {
    pub subnet: String,
    /// Sorted.
    pub groups: Vec<String>,
}

/// What the world is made of: which subnets and groups each network uses.
#[derive(Clone, Debug)]
pub struct ProfileWorld {
    /// ENIConfig name → its subnet and groups.
    pub eniconfigs: BTreeMap<String, NetSpec>,
    /// Profile name → its subnet and groups.
    pub profiles: BTreeMap<String, NetSpec>,
    /// The profiles in the `strict` egress mode (the default): their pods' egress leaves by their
    /// own ENI, never by eth0.
    pub strict_egress: BTreeSet<String>,
}

impl ProfileWorld {
    /// The subnet and groups pods of `profile` (`None`: the default network) must be on: one
    /// spec for a profile, the ENIConfigs' for the default network.
    pub fn allowed(&self, profile: Option<&str>) -> Vec<&NetSpec> {
        match profile {
            Some(p) => self.profiles.get(p).into_iter().collect(),
            None => self.eniconfigs.values().collect(),
        }
    }
}

/// How a new pod chooses its network.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice {
    /// In the plain namespace, the pod annotated `db`.
    PodDb,
    /// In `apps`, no pod annotation: the namespace's `app`.
    NamespaceApp,
    /// In `apps`, the pod annotated `db`: the pod's wins.
    PodOverridesNamespace,
    /// In the plain namespace, no annotation: the default network.
    None,
    /// In `apps`, the pod annotated with an empty value: the default network.
    OptOut,
    /// In the plain namespace, the pod annotated with a profile no NetworkProfile defines
    /// ([`MISSING`]): every ADD is refused with CNI error 11 naming it.
    Missing,
}

/// The profile the [`Choice::Missing`] pods name, which does not exist.
pub const MISSING: &str = "ghost";

impl Choice {
    pub fn draw(rng: &mut rand::rngs::StdRng) -> Self {
        match rng.random_range(0.0..1.0) {
            x if x < 0.28 => Self::PodDb,
            x if x < 0.58 => Self::NamespaceApp,
            x if x < 0.65 => Self::PodOverridesNamespace,
            x if x < 0.86 => Self::None,
            x if x < 0.97 => Self::OptOut,
            _ => Self::Missing,
        }
    }

    pub fn namespace(self) -> &'static str {
        match self {
            Self::PodDb | Self::None | Self::Missing => PLAIN_NAMESPACE,
            Self::NamespaceApp | Self::PodOverridesNamespace | Self::OptOut => APP_NAMESPACE,
        }
    }

    /// The pod's own annotation, if it has one.
    pub fn pod_annotation(self) -> Option<&'static str> {
        match self {
            Self::PodDb | Self::PodOverridesNamespace => Some("db"),
            Self::OptOut => Some(""),
            Self::Missing => Some(MISSING),
            Self::NamespaceApp | Self::None => None,
        }
    }

    /// The profile the pod selects (`None`: the default network).
    pub fn profile(self) -> Option<&'static str> {
        match self {
            Self::PodDb | Self::PodOverridesNamespace => Some("db"),
            Self::NamespaceApp => Some("app"),
            Self::Missing => Some(MISSING),
            Self::None | Self::OptOut => None,
        }
    }
}

/// The API-server double and what the soak does to it.
pub struct ProfileCluster {
    pub api: FakeApiServer,
    pub world: ProfileWorld,
    /// The ENIConfig the node names now.
    pub current: usize,
}

/// Builds the EC2 side (block, subnets, groups) and the API side (node, CRDs, objects,
/// namespaces) of the mode.
pub async fn setup(mock: &MockCloud) -> anyhow::Result<ProfileCluster> {
    let inst = mock.default_instance();
    let vpc = inst.vpc_id.clone();
    let zone = inst.availability_zone.clone();
    mock.associate_vpc_cidr_block(&vpc, "100.64.0.0/16".parse()?)
        .map_err(|e| anyhow::anyhow!("associating 100.64.0.0/16: {e:?}"))?;
    let made = mock.with_world(|w, _| {
        let mut sg = || w.create_security_group(&vpc);
        let groups = [sg()?, sg()?, sg()?, sg()?, sg()?];
        let subnet = |w: &mut mockcloud::world::World, cidr: &str, tags: &[(&str, &str)]| {
            let tags = tags
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            w.create_subnet_with_tags(&vpc, cidr.parse().expect("a CIDR"), &zone, &tags)
        };
        let cfg_a = subnet(w, "100.64.0.0/19", &[])?;
        let cfg_b = subnet(w, "100.64.32.0/19", &[])?;
        let db = subnet(w, "100.64.64.0/19", &[])?;
        let app = subnet(w, "100.64.96.0/19", &[("eniipam.io/profile", "app")])?;
        Ok::<_, mockcloud::Ec2Error>((groups, [cfg_a, cfg_b, db, app]))
    });
    let ([g_a, g_b, g_db1, g_db2, g_app], [cfg_a, cfg_b, db, app]) =
        made.map_err(|e| anyhow::anyhow!("creating the profiles' subnets and groups: {e:?}"))?;
    let spec = |subnet: &str, groups: &[&String]| {
        let mut groups: Vec<String> = groups.iter().map(|g| (*g).clone()).collect();
        groups.sort();
        NetSpec {
            subnet: subnet.to_owned(),
            groups,
        }
    };
    let world = ProfileWorld {
        eniconfigs: [
            (ENICONFIGS[0].to_owned(), spec(&cfg_a, &[&g_a])),
            (ENICONFIGS[1].to_owned(), spec(&cfg_b, &[&g_b])),
        ]
        .into(),
        profiles: [
            ("db".to_owned(), spec(&db, &[&g_db1, &g_db2])),
            ("app".to_owned(), spec(&app, &[&g_app])),
        ]
        .into(),
        strict_egress: ["db".to_owned()].into(),
    };

    let api = FakeApiServer::start().await;
    api.add_node(NODE, &[]);
    api.set_node_label(NODE, ENICONFIG_KEY, Some(ENICONFIGS[0]));
    let eniconfig = Crd::eniconfig();
    api.install_crd(eniconfig.clone());
    api.put_object(
        &eniconfig,
        eniconfig_json(ENICONFIGS[0], &cfg_a, Some(&[&g_a])),
    );
    api.put_object(
        &eniconfig,
        eniconfig_json(ENICONFIGS[1], &cfg_b, Some(&[&g_b])),
    );
    let profile = Crd::network_profile();
    api.install_crd(profile.clone());
    api.put_object(
        &profile,
        json!({"metadata": {"name": "db"}, "spec": {
            "subnet": db,
            "securityGroups": [g_db1, g_db2],
            "maxEnisPerNode": DB_MAX_ENIS,
        }}),
    );
    api.put_object(
        &profile,
        json!({"metadata": {"name": "app"}, "spec": {
            "subnetSelector": {"tags": {"eniipam.io/profile": "app"}},
            "securityGroups": [g_app],
            // db keeps the default (strict): the checker holds both modes' answers.
            "egressMode": "standard",
        }}),
    );
    api.put_namespace(PLAIN_NAMESPACE, &[]);
    api.put_namespace(APP_NAMESPACE, &[(ANNOTATION, "app")]);
    Ok(ProfileCluster {
        api,
        world,
        current: 0,
    })
}

impl ProfileCluster {
    /// The daemon's environment for the mode.
    pub fn daemon_env(&self) -> Vec<(String, String)> {
        [
            ("ENIIPAM_CUSTOM_NETWORKING", "true".to_owned()),
            ("ENIIPAM_NETWORK_PROFILES", "true".to_owned()),
            ("ENIIPAM_API_SERVER_URL", self.api.url()),
            ("ENIIPAM_NODE_NAME", NODE.to_owned()),
            // The pods the soak ends are DELed (or GCed) by the runtime: the API-server pod GC
            // would be a second hand releasing them, which is not what this mode soaks.
            ("ENIIPAM_API_SERVER_GC", "false".to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }

    /// The pod in the API server, bound to the node, before its ADD.
    pub fn put_pod(&self, choice: Choice, name: &str, uid: &str) {
        let mut pod = pod_json(choice.namespace(), name, uid, NODE, "Running");
        if let Some(v) = choice.pod_annotation() {
            pod["metadata"]["annotations"][ANNOTATION] = json!(v);
        }
        self.api.put_pod(pod);
    }

    pub fn delete_pod(&self, namespace: &str, name: &str) {
        self.api.delete_pod(namespace, name);
    }

    /// Names the other ENIConfig: by the node's annotation (cfg-b), or by removing it (the label's
    /// cfg-a again). Returns what the node names now.
    pub fn switch(&mut self) -> &'static str {
        self.current = 1 - self.current;
        let value = (self.current == 1).then_some(ENICONFIGS[1]);
        self.api.set_node_annotation(NODE, ENICONFIG_KEY, value);
        ENICONFIGS[self.current]
    }

    /// The node's `eniipam.io/network-<profile>` capacity, as the daemon advertised it.
    pub fn advertised(&self) -> anyhow::Result<BTreeMap<String, String>> {
        let node = self.api.node(NODE).context("the node is gone")?;
        Ok(node["status"]["capacity"]
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(k, _)| k.starts_with("eniipam.io/network-"))
            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
            .collect())
    }
}
