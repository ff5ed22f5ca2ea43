//! The network configuration on stdin, parsed and validated into typed values with the spec's error
//! codes: the role (main plugin or IPAM), the knobs, `prevResult`, pod annotations and GC's valid
//! attachments.
//!
//! ## Knobs (in the network configuration)
//!
//! For the main plugin (`"type": "eniipam"`) the knobs sit at the top level; for the IPAM role
//! (`"ipam": {"type": "eniipam"}` under bridge, ptp, ...) they sit in the `ipam` object.
//!
//! | knob | default | meaning |
//! | --- | --- | --- |
//! | `socket` | [`eniipam_api::DEFAULT_SOCKET`] | the daemon's gRPC unix socket |
//! | `timeout_ms` | 105000 | deadline of each daemon call (connect included); sent to the daemon, which answers an ADD waiting on EC2 before it |
//! | `mtu` | 9001 | MTU of both veth ends (EC2 jumbo frames) |
//! | `veth_prefix` | `eni` | host veth name prefix, 1–4 characters |
//! | `cache_dir` | `/var/lib/cni/eniipam` | where ADD results are cached for DEL/GC without the daemon |
//! | `sticky_statefulsets` | false | treat pods whose name ends in `-<ordinal>` as StatefulSet members |
//!
//! ## Sticky IPs (opt-in)
//!
//! A pod gets the sticky key `namespace/name` (its IP is kept reserved for it across restarts) when
//! any of these holds:
//! - the pod annotation `eniipam.io/sticky-ip: "true"`, delivered in `runtimeConfig` under the
//!   capability `io.kubernetes.cri.pod-annotations` (declare `"capabilities":
//!   {"io.kubernetes.cri.pod-annotations": true}` in the conflist);
//! - `ENIIPAM_STICKY=true` in `CNI_ARGS`;
//! - `sticky_statefulsets: true` and the pod name ends in `-<ordinal>` (decimal, no leading zeros).
//!   The runtime does not tell the plugin a pod's owner, so this is a name heuristic: a Deployment
//!   pod whose random suffix happens to be all digits would be treated as sticky too. It only
//!   delays reuse of that IP by the daemon's `ip_stick_time`; prefer the annotation when in doubt.
//!
//! The annotation `eniipam.io/ip: "<IPv4>"` asks for that IP and fails rather than falling back.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::Duration;

use eniipam_api::{AttachmentKey, PodRef};
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::env::{CniArgs, is_name_like, parse_bool};
use crate::spec::{CniError, CniResult, CniVersion, ErrorCode};

/// The largest network configuration accepted on stdin.
pub const MAX_STDIN_BYTES: usize = 1 << 20;

/// The plugin `type` this binary answers to.
pub const PLUGIN_TYPE: &str = "eniipam";

/// Default host veth prefix.
pub const DEFAULT_VETH_PREFIX: &str = "eni";

pub use eniipam_api::cache::DEFAULT_CACHE_DIR;

/// Default MTU of the veth pair.
pub const DEFAULT_MTU: u32 = 9001;

/// Default deadline of one daemon call.
pub const DEFAULT_TIMEOUT_MS: u64 = 105_000;

/// Pod annotation that opts a pod into sticky IPs.
pub const STICKY_ANNOTATION: &str = "eniipam.io/sticky-ip";

/// Pod annotation that names the IP a pod wants.
pub const IP_ANNOTATION: &str = "eniipam.io/ip";

/// The runtimeConfig key containerd and cri-o use to pass pod annotations.
pub const POD_ANNOTATIONS_CAPABILITY: &str = "io.kubernetes.cri.pod-annotations";

/// Which job this invocation has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// `"type": "eniipam"`: allocate and wire the pod (veth, address, routes, rules).
    Main,
    /// `"ipam": {"type": "eniipam"}` under another plugin: allocate and return the address only.
    Ipam,
}

/// The plugin's knobs, with defaults applied and validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginConfig {
    /// The daemon's socket.
    pub socket: PathBuf,
    /// Deadline of one daemon call.
    pub timeout: Duration,
    /// MTU of the veth pair.
    pub mtu: u32,
    /// Host veth name prefix.
    pub veth_prefix: String,
    /// Root of the result cache (entries live in `<cache_dir>/<network name>/`).
    pub cache_dir: PathBuf,
    /// Pods named `<name>-<ordinal>` get a sticky key.
    pub sticky_statefulsets: bool,
}

impl Default for PluginConfig {
    fn default() -> Self {
        Self {
            socket: PathBuf::from(eniipam_api::DEFAULT_SOCKET),
            timeout: Duration::from_millis(DEFAULT_TIMEOUT_MS),
            mtu: DEFAULT_MTU,
            veth_prefix: DEFAULT_VETH_PREFIX.to_owned(),
            cache_dir: PathBuf::from(DEFAULT_CACHE_DIR),
            sticky_statefulsets: false,
        }
    }
}

#[derive(Deserialize)]
struct RawKnobs {
    socket: Option<String>,
    timeout_ms: Option<u64>,
    mtu: Option<u32>,
    veth_prefix: Option<String>,
    cache_dir: Option<String>,
    sticky_statefulsets: Option<bool>,
}

impl PluginConfig {
    fn from_object(obj: &Map<String, Value>, section: &str) -> Result<Self, CniError> {
        let raw: RawKnobs = serde_json::from_value(Value::Object(obj.clone()))
            .map_err(|e| invalid(format!("{section}: {e}")))?;
        let mut cfg = Self::default();
        if let Some(socket) = raw.socket {
            cfg.socket = absolute_path(section, "socket", socket)?;
        }
        if let Some(ms) = raw.timeout_ms {
            if !(1..=600_000).contains(&ms) {
                return Err(invalid(format!("{section}.timeout_ms must be 1..=600000")));
            }
            cfg.timeout = Duration::from_millis(ms);
        }
        if let Some(mtu) = raw.mtu {
            if !(68..=65535).contains(&mtu) {
                return Err(invalid(format!("{section}.mtu must be 68..=65535")));
            }
            cfg.mtu = mtu;
        }
        if let Some(prefix) = raw.veth_prefix {
            let ok = (1..=4).contains(&prefix.len())
                && prefix
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
            if !ok {
                return Err(invalid(format!(
                    "{section}.veth_prefix must be 1-4 characters of [A-Za-z0-9_-]"
                )));
            }
            cfg.veth_prefix = prefix;
        }
        if let Some(dir) = raw.cache_dir {
            cfg.cache_dir = absolute_path(section, "cache_dir", dir)?;
        }
        if let Some(sticky) = raw.sticky_statefulsets {
            cfg.sticky_statefulsets = sticky;
        }
        Ok(cfg)
    }
}

/// `value` as a path, refused unless absolute.
fn absolute_path(section: &str, knob: &str, value: String) -> Result<PathBuf, CniError> {
    if !value.starts_with('/') {
        return Err(invalid(format!(
            "{section}.{knob} must be an absolute path"
        )));
    }
    Ok(value.into())
}

fn invalid(msg: impl Into<String>) -> CniError {
    CniError::new(ErrorCode::InvalidNetworkConfig, msg)
}

/// A parsed network configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct NetConf {
    /// `cniVersion`: the version results and errors are written in.
    pub cni_version: CniVersion,
    /// `name` of the network.
    pub name: String,
    /// Main plugin or IPAM plugin.
    pub role: Role,
    /// The configuration's `type`: `eniipam` in the main role, the delegating plugin in the IPAM role.
    pub plugin_type: String,
    /// Knobs.
    pub plugin: PluginConfig,
    /// `prevResult` (chained plugins, CHECK, DEL).
    pub prev_result: Option<CniResult>,
    /// Pod annotations from `runtimeConfig`.
    pub pod_annotations: BTreeMap<String, String>,
    /// `cni.dev/valid-attachments` (GC only).
    pub valid_attachments: Option<Vec<AttachmentKey>>,
}

/// The best guess at the version to write an error in, for input that may not parse.
pub fn peek_version(stdin: &[u8]) -> CniVersion {
    serde_json::from_slice::<Value>(stdin)
        .ok()
        .and_then(|v| v.get("cniVersion")?.as_str()?.parse().ok())
        .unwrap_or(CniVersion::CURRENT)
}

impl NetConf {
    /// Parses the network configuration from stdin: 6 for undecodable input, 1 for an unsupported
    /// or missing `cniVersion`, 7 for a configuration that decodes but is not valid.
    pub fn parse(stdin: &[u8]) -> Result<Self, CniError> {
        if stdin.len() > MAX_STDIN_BYTES {
            return Err(CniError::new(
                ErrorCode::DecodingFailure,
                format!("network configuration larger than {MAX_STDIN_BYTES} bytes"),
            ));
        }
        let value: Value = serde_json::from_slice(stdin).map_err(|e| {
            CniError::new(
                ErrorCode::DecodingFailure,
                "network configuration is not valid JSON",
            )
            .with_details(e.to_string())
        })?;
        let Value::Object(obj) = value else {
            return Err(CniError::new(
                ErrorCode::DecodingFailure,
                "network configuration is not a JSON object",
            ));
        };
        let cni_version = match obj.get("cniVersion") {
            None => {
                return Err(CniError::new(
                    ErrorCode::IncompatibleVersion,
                    "cniVersion is missing (0.1.0 is not supported)",
                ));
            }
            Some(Value::String(v)) => v.parse::<CniVersion>()?,
            Some(_) => return Err(invalid("cniVersion must be a string")),
        };
        let name = match obj.get("name") {
            Some(Value::String(n)) if is_name_like(n) => n.clone(),
            Some(Value::String(n)) => {
                return Err(invalid(format!(
                    "name {n:?} must be alphanumerics followed by alphanumerics, '_', '.', '-'"
                )));
            }
            Some(_) => return Err(invalid("name must be a string")),
            None => return Err(invalid("name is missing")),
        };
        let plugin_type = match obj.get("type") {
            Some(Value::String(t)) => t.as_str(),
            Some(_) => return Err(invalid("type must be a string")),
            None => return Err(invalid("type is missing")),
        };
        let ipam = match obj.get("ipam") {
            None | Some(Value::Null) => None,
            Some(Value::Object(ipam)) => Some(ipam),
            Some(_) => return Err(invalid("ipam must be an object")),
        };
        let ipam_type = match ipam.map(|i| i.get("type")) {
            None | Some(None) => None,
            Some(Some(Value::String(t))) => Some(t.as_str()),
            Some(Some(_)) => return Err(invalid("ipam.type must be a string")),
        };
        let (role, plugin) = if plugin_type == PLUGIN_TYPE {
            if let Some(other) = ipam_type.filter(|t| *t != PLUGIN_TYPE) {
                return Err(CniError::new(
                    ErrorCode::UnsupportedField,
                    format!(
                        "eniipam allocates its own addresses; ipam.type {other:?} is not supported"
                    ),
                ));
            }
            (Role::Main, PluginConfig::from_object(&obj, "config")?)
        } else if ipam_type == Some(PLUGIN_TYPE) {
            let ipam = ipam.cloned().unwrap_or_default();
            (Role::Ipam, PluginConfig::from_object(&ipam, "ipam")?)
        } else {
            return Err(invalid(format!(
                "neither type nor ipam.type is {PLUGIN_TYPE:?} (type is {plugin_type:?})"
            )));
        };
        let prev_result = match obj.get("prevResult") {
            None | Some(Value::Null) => None,
            Some(v @ Value::Object(_)) => Some(CniResult::from_json(v)?),
            Some(_) => return Err(invalid("prevResult must be an object")),
        };
        let pod_annotations = match obj.get("runtimeConfig") {
            None | Some(Value::Null) => BTreeMap::new(),
            Some(Value::Object(rc)) => match rc.get(POD_ANNOTATIONS_CAPABILITY) {
                None | Some(Value::Null) => BTreeMap::new(),
                Some(v) => serde_json::from_value(v.clone()).map_err(|e| {
                    invalid(format!(
                        "runtimeConfig.{POD_ANNOTATIONS_CAPABILITY} must map strings to strings: {e}"
                    ))
                })?,
            },
            Some(_) => return Err(invalid("runtimeConfig must be an object")),
        };
        let valid_attachments = match obj.get("cni.dev/valid-attachments") {
            None | Some(Value::Null) => None,
            Some(v) => Some(parse_valid_attachments(v)?),
        };
        Ok(Self {
            cni_version,
            name,
            role,
            plugin_type: plugin_type.to_owned(),
            plugin,
            prev_result,
            pod_annotations,
            valid_attachments,
        })
    }

    /// The sticky key for `pod`, if it opted in (see the module docs).
    pub fn sticky_key(&self, pod: Option<&PodRef>, args: &CniArgs) -> Option<String> {
        let pod = pod?;
        let annotated = self
            .pod_annotations
            .get(STICKY_ANNOTATION)
            .and_then(|v| parse_bool(v))
            .unwrap_or(false);
        let by_name = self.plugin.sticky_statefulsets && has_ordinal_suffix(&pod.name);
        (annotated || args.sticky == Some(true) || by_name).then(|| pod.sticky_key())
    }

    /// The IP the pod's annotation asks for, if any.
    pub fn preferred_ip(&self) -> Result<Option<Ipv4Addr>, CniError> {
        match self.pod_annotations.get(IP_ANNOTATION) {
            None => Ok(None),
            Some(v) => v.parse().map(Some).map_err(|_| {
                invalid(format!(
                    "annotation {IP_ANNOTATION}={v:?} is not an IPv4 address"
                ))
            }),
        }
    }
}

/// Reference plugins (containernetworking/plugins) that apply an IPAM result with
/// `ipam.ConfigureIface`, which adds the result's default route before anything makes the gateway
/// reachable, and expects the address's prefix to hold a connected route it can replace. eniipam
/// hands out VPC `/32` addresses with a link-local gateway (`169.254.1.1`), which none of them can
/// configure: `ptp` fails every ADD with "failed to add route 0.0.0.0/0 via 169.254.1.1: network is
/// unreachable" (seen through containerd's CRI in `tests/cri_containerd.rs`). The IPAM role refuses
/// them up front, before an IP is taken.
pub const UNSUPPORTED_IPAM_PARENTS: &[&str] = &[
    "ptp",
    "bridge",
    "macvlan",
    "ipvlan",
    "host-device",
    "vlan",
    "dummy",
    "tap",
];

impl NetConf {
    /// In the IPAM role, refuses a delegating plugin that cannot configure eniipam's `/32` with a
    /// link-local gateway ([`UNSUPPORTED_IPAM_PARENTS`]): error 7 naming what to use instead.
    pub fn check_ipam_parent(&self) -> Result<(), CniError> {
        if self.role == Role::Ipam && UNSUPPORTED_IPAM_PARENTS.contains(&self.plugin_type.as_str())
        {
            return Err(invalid(format!(
                "eniipam as IPAM under the reference {:?} plugin cannot work: eniipam hands out VPC /32 addresses \
                 with the link-local gateway 169.254.1.1, which {:?} cannot configure in the pod; use \
                 \"type\": \"eniipam\" as the main plugin (deploy/10-eniipam.conflist)",
                self.plugin_type, self.plugin_type
            )));
        }
        Ok(())
    }
}

/// Whether a pod name ends in `-<ordinal>` (StatefulSet naming: decimal, no leading zeros).
pub fn has_ordinal_suffix(name: &str) -> bool {
    match name.rsplit_once('-') {
        Some((base, ord)) => {
            !base.is_empty()
                && !ord.is_empty()
                && ord.bytes().all(|b| b.is_ascii_digit())
                && (ord == "0" || !ord.starts_with('0'))
        }
        None => false,
    }
}

fn parse_valid_attachments(v: &Value) -> Result<Vec<AttachmentKey>, CniError> {
    #[derive(Deserialize)]
    struct Raw {
        #[serde(rename = "containerID")]
        container_id: String,
        ifname: String,
    }
    let raw: Vec<Raw> = serde_json::from_value(v.clone()).map_err(|e| {
        invalid(format!(
            "cni.dev/valid-attachments must be a list of {{containerID, ifname}}: {e}"
        ))
    })?;
    Ok(raw
        .into_iter()
        .map(|r| AttachmentKey::new(r.container_id, r.ifname))
        .collect())
}

#[cfg(test)]
mod tests;
