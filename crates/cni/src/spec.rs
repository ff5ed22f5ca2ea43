//! What the CNI specification defines: versions, the error object and its codes, and the result types.
//!
//! The plugin implements spec 1.1.0 and accepts network configurations of 0.4.0, 1.0.0 and 1.1.0.
//! Results are written in the configuration's version: 0.4.0 results carry `"version": "4"` in each
//! `ips` entry, 1.x results do not.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A CNI specification version this plugin speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CniVersion {
    /// 0.4.0: the first version with CHECK; `ips` entries carry `version`.
    V0_4_0,
    /// 1.0.0: configuration lists only; `ips` entries lose `version`.
    V1_0_0,
    /// 1.1.0: adds GC and STATUS.
    V1_1_0,
}

impl CniVersion {
    /// Every version accepted, oldest first (the order VERSION prints).
    pub const SUPPORTED: [CniVersion; 3] = [Self::V0_4_0, Self::V1_0_0, Self::V1_1_0];

    /// The version this plugin implements.
    pub const CURRENT: CniVersion = Self::V1_1_0;

    /// The version as the spec spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::V0_4_0 => "0.4.0",
            Self::V1_0_0 => "1.0.0",
            Self::V1_1_0 => "1.1.0",
        }
    }

    /// Whether results of this version carry `version` in their `ips` entries.
    pub fn ips_carry_version(self) -> bool {
        self == Self::V0_4_0
    }
}

impl fmt::Display for CniVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for CniVersion {
    type Err = CniError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::SUPPORTED
            .into_iter()
            .find(|v| v.as_str() == s)
            .ok_or_else(|| {
                CniError::new(
                    ErrorCode::IncompatibleVersion,
                    format!("unsupported cniVersion {s:?}"),
                )
                .with_details(format!("supported versions: {}", supported_list()))
            })
    }
}

fn supported_list() -> String {
    CniVersion::SUPPORTED
        .iter()
        .map(|v| v.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The error codes of the CNI spec (0–99) and this plugin's own (100+).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// 1: incompatible CNI version.
    IncompatibleVersion,
    /// 2: unsupported field in the network configuration.
    UnsupportedField,
    /// 3: container unknown or does not exist.
    UnknownContainer,
    /// 4: invalid necessary environment variables (`CNI_COMMAND`, `CNI_CONTAINERID`, ...).
    InvalidEnvironment,
    /// 5: I/O failure (for example the result cache could not be written).
    IoFailure,
    /// 6: failed to decode content (malformed JSON, oversized input).
    DecodingFailure,
    /// 7: invalid network configuration.
    InvalidNetworkConfig,
    /// 11: try again later (pool exhausted, daemon starting or unreachable for ADD).
    TryAgainLater,
    /// 50: STATUS: the plugin is not available (daemon unreachable or not ready).
    PluginNotAvailable,
    /// 51: STATUS: not available, existing containers may have limited connectivity (pool exhausted).
    LimitedConnectivity,
    /// 100: setting up or tearing down the pod's interfaces, addresses, routes or rules failed.
    WiringFailed,
    /// 101: the daemon answered with an error that fits no spec code.
    DaemonFailure,
    /// 102: CHECK found the attachment not as ADD left it.
    CheckFailed,
}

impl ErrorCode {
    /// The numeric code written in the error object.
    pub fn code(self) -> u32 {
        match self {
            Self::IncompatibleVersion => 1,
            Self::UnsupportedField => 2,
            Self::UnknownContainer => 3,
            Self::InvalidEnvironment => 4,
            Self::IoFailure => 5,
            Self::DecodingFailure => 6,
            Self::InvalidNetworkConfig => 7,
            Self::TryAgainLater => 11,
            Self::PluginNotAvailable => 50,
            Self::LimitedConnectivity => 51,
            Self::WiringFailed => 100,
            Self::DaemonFailure => 101,
            Self::CheckFailed => 102,
        }
    }
}

/// A failed operation, as the spec's error object reports it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("CNI error {}: {msg}{}", code.code(), if details.is_empty() { String::new() } else { format!(" ({details})") })]
pub struct CniError {
    /// What kind of failure.
    pub code: ErrorCode,
    /// A short message.
    pub msg: String,
    /// Longer details (may be empty).
    pub details: String,
}

impl CniError {
    /// An error with a code and a message.
    pub fn new(code: ErrorCode, msg: impl Into<String>) -> Self {
        Self {
            code,
            msg: msg.into(),
            details: String::new(),
        }
    }

    /// The same error with details.
    pub fn with_details(mut self, details: impl Into<String>) -> Self {
        self.details = details.into();
        self
    }

    /// The error object `{"cniVersion","code","msg","details"}`.
    pub fn to_json(&self, version: CniVersion) -> Value {
        let mut obj = Map::new();
        obj.insert("cniVersion".into(), version.as_str().into());
        obj.insert("code".into(), self.code.code().into());
        obj.insert("msg".into(), self.msg.clone().into());
        if !self.details.is_empty() {
            obj.insert("details".into(), self.details.clone().into());
        }
        Value::Object(obj)
    }
}

/// The output of VERSION.
pub fn version_info(version: CniVersion) -> Value {
    serde_json::json!({
        "cniVersion": version.as_str(),
        "supportedVersions": CniVersion::SUPPORTED.iter().map(|v| v.as_str()).collect::<Vec<_>>(),
    })
}

/// One interface of a result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Interface {
    /// Interface name.
    pub name: String,
    /// Hardware address (`aa:bb:cc:dd:ee:ff`), empty when none.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mac: String,
    /// The netns path for interfaces inside a container; absent for host interfaces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
    /// Fields this plugin does not interpret (kept for pass-through: `mtu`, `socketPath`, ...).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// One IP configuration of a result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IpConfig {
    /// Address with prefix length (`10.0.1.5/32`).
    pub address: IpNet,
    /// Default gateway for this subnet, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<IpAddr>,
    /// Index into `interfaces` of the interface this address is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<usize>,
    /// Fields this plugin does not interpret.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// One route of a result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Route {
    /// Destination.
    pub dst: IpNet,
    /// Next hop; absent means the default gateway of the `ips`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gw: Option<IpAddr>,
    /// Fields this plugin does not interpret (1.1: `mtu`, `advmss`, `priority`, `table`, `scope`).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// The DNS section of a result (all optional).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Dns {
    /// Name servers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nameservers: Vec<String>,
    /// Local domain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    /// Search domains.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub search: Vec<String>,
    /// Resolver options.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

/// A successful ADD's result (also what arrives as `prevResult`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CniResult {
    /// Interfaces created (absent in an IPAM plugin's result).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<Interface>,
    /// Addresses assigned.
    #[serde(default)]
    pub ips: Vec<IpConfig>,
    /// Routes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<Route>,
    /// DNS settings.
    #[serde(default)]
    pub dns: Dns,
}

impl CniResult {
    /// Parses a result of any supported version (the `version` of 0.4.0 `ips` entries is dropped and
    /// re-derived on output; `cniVersion` is ignored).
    pub fn from_json(value: &Value) -> Result<Self, CniError> {
        let mut value = value.clone();
        if let Some(obj) = value.as_object_mut() {
            obj.remove("cniVersion");
            if let Some(Value::Array(ips)) = obj.get_mut("ips") {
                for ip in ips.iter_mut().filter_map(Value::as_object_mut) {
                    ip.remove("version");
                }
            }
        }
        serde_json::from_value(value).map_err(|e| {
            CniError::new(ErrorCode::InvalidNetworkConfig, "malformed prevResult")
                .with_details(e.to_string())
        })
    }

    /// The result as JSON in `version`.
    pub fn to_json(&self, version: CniVersion) -> Value {
        let mut value = serde_json::to_value(self).unwrap_or_else(|_| Value::Object(Map::new()));
        if let Some(obj) = value.as_object_mut() {
            if version.ips_carry_version()
                && let Some(Value::Array(ips)) = obj.get_mut("ips")
            {
                for (ip, cfg) in ips.iter_mut().zip(&self.ips) {
                    if let Some(ip) = ip.as_object_mut() {
                        let family = match cfg.address {
                            IpNet::V4(_) => "4",
                            IpNet::V6(_) => "6",
                        };
                        ip.insert("version".into(), family.into());
                    }
                }
            }
            obj.insert("cniVersion".into(), version.as_str().into());
        }
        value
    }

    /// Appends `other` (interfaces, ips, routes), shifting `other`'s interface indices past ours:
    /// how a chained plugin adds its result to `prevResult`.
    pub fn merge(&mut self, other: CniResult) {
        let offset = self.interfaces.len();
        self.interfaces.extend(other.interfaces);
        self.ips.extend(other.ips.into_iter().map(|mut ip| {
            ip.interface = ip.interface.map(|i| i + offset);
            ip
        }));
        self.routes.extend(other.routes);
    }

    /// The addresses assigned to the sandbox interface `ifname` (or, for a result without
    /// interfaces such as an IPAM plugin's, every address).
    fn addresses_for<'a>(&'a self, ifname: &str) -> impl Iterator<Item = IpAddr> + 'a {
        let sandbox_index = self
            .interfaces
            .iter()
            .position(|i| i.name == ifname && i.sandbox.is_some());
        self.ips
            .iter()
            .filter(move |ip| {
                self.interfaces.is_empty()
                    || sandbox_index.is_some() && ip.interface == sandbox_index
            })
            .map(|ip| ip.address.addr())
    }

    /// The IPv4 address assigned to the sandbox interface `ifname` (or, for a result without
    /// interfaces such as an IPAM plugin's, the first IPv4 address).
    pub fn ipv4_for(&self, ifname: &str) -> Option<Ipv4Addr> {
        self.addresses_for(ifname).find_map(|ip| match ip {
            IpAddr::V4(v4) => Some(v4),
            IpAddr::V6(_) => None,
        })
    }

    /// The IPv6 address assigned to the sandbox interface `ifname`, likewise.
    pub fn ipv6_for(&self, ifname: &str) -> Option<Ipv6Addr> {
        self.addresses_for(ifname).find_map(|ip| match ip {
            IpAddr::V6(v6) => Some(v6),
            IpAddr::V4(_) => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn versions_parse_and_print() {
        for v in CniVersion::SUPPORTED {
            assert_eq!(v.as_str().parse::<CniVersion>().unwrap(), v);
        }
        let err = "0.3.1".parse::<CniVersion>().unwrap_err();
        assert_eq!(err.code, ErrorCode::IncompatibleVersion);
        assert!(err.details.contains("1.1.0"));
    }

    #[test]
    fn error_object_has_the_spec_fields() {
        let err =
            CniError::new(ErrorCode::TryAgainLater, "pool exhausted").with_details("subnet full");
        assert_eq!(
            err.to_json(CniVersion::V1_0_0),
            json!({"cniVersion": "1.0.0", "code": 11, "msg": "pool exhausted", "details": "subnet full"})
        );
        let bare = CniError::new(ErrorCode::DecodingFailure, "bad").to_json(CniVersion::V1_1_0);
        assert!(bare.get("details").is_none());
    }

    #[test]
    fn codes_match_the_spec() {
        let pairs = [
            (ErrorCode::IncompatibleVersion, 1),
            (ErrorCode::InvalidEnvironment, 4),
            (ErrorCode::DecodingFailure, 6),
            (ErrorCode::InvalidNetworkConfig, 7),
            (ErrorCode::TryAgainLater, 11),
            (ErrorCode::PluginNotAvailable, 50),
            (ErrorCode::LimitedConnectivity, 51),
        ];
        for (code, n) in pairs {
            assert_eq!(code.code(), n);
        }
    }

    #[test]
    fn version_info_lists_every_supported_version() {
        assert_eq!(
            version_info(CniVersion::V1_1_0),
            json!({"cniVersion": "1.1.0", "supportedVersions": ["0.4.0", "1.0.0", "1.1.0"]})
        );
    }

    fn sample() -> CniResult {
        CniResult {
            interfaces: vec![
                Interface {
                    name: "eni0123456789a".into(),
                    mac: "02:00:00:00:00:01".into(),
                    sandbox: None,
                    extra: Map::new(),
                },
                Interface {
                    name: "eth0".into(),
                    mac: "02:00:00:00:00:02".into(),
                    sandbox: Some("/run/netns/p".into()),
                    extra: Map::new(),
                },
            ],
            ips: vec![IpConfig {
                address: "10.0.0.5/32".parse().unwrap(),
                gateway: Some("169.254.1.1".parse().unwrap()),
                interface: Some(1),
                extra: Map::new(),
            }],
            routes: vec![Route {
                dst: "0.0.0.0/0".parse().unwrap(),
                gw: Some("169.254.1.1".parse().unwrap()),
                extra: Map::new(),
            }],
            dns: Dns::default(),
        }
    }

    #[test]
    fn results_are_written_in_the_requested_version() {
        let r = sample();
        let old = r.to_json(CniVersion::V0_4_0);
        assert_eq!(old["cniVersion"], "0.4.0");
        assert_eq!(old["ips"][0]["version"], "4");
        let new = r.to_json(CniVersion::V1_1_0);
        assert_eq!(new["cniVersion"], "1.1.0");
        assert!(new["ips"][0].get("version").is_none());
        assert_eq!(new["ips"][0]["address"], "10.0.0.5/32");
        assert_eq!(new["interfaces"][1]["sandbox"], "/run/netns/p");
        assert!(new["interfaces"][0].get("sandbox").is_none());
    }

    #[test]
    fn results_round_trip_across_versions() {
        let r = sample();
        for v in CniVersion::SUPPORTED {
            assert_eq!(CniResult::from_json(&r.to_json(v)).unwrap(), r);
        }
    }

    #[test]
    fn unknown_fields_pass_through() {
        let v = json!({"cniVersion": "1.1.0", "interfaces": [{"name": "x", "mtu": 1500, "socketPath": "/s"}],
            "ips": [], "routes": [{"dst": "10.0.0.0/8", "priority": 5}], "dns": {"nameservers": ["1.1.1.1"]}});
        let r = CniResult::from_json(&v).unwrap();
        let out = r.to_json(CniVersion::V1_1_0);
        assert_eq!(out["interfaces"][0]["mtu"], 1500);
        assert_eq!(out["interfaces"][0]["socketPath"], "/s");
        assert_eq!(out["routes"][0]["priority"], 5);
        assert_eq!(out["dns"]["nameservers"][0], "1.1.1.1");
    }

    #[test]
    fn merge_shifts_interface_indices() {
        let mut prev = sample();
        let ours = sample();
        prev.merge(ours);
        assert_eq!(prev.interfaces.len(), 4);
        assert_eq!(prev.ips[1].interface, Some(3));
    }

    #[test]
    fn finds_the_sandbox_address() {
        let r = sample();
        assert_eq!(r.ipv4_for("eth0"), Some(Ipv4Addr::new(10, 0, 0, 5)));
        assert_eq!(r.ipv4_for("eth1"), None);
        let ipam = CniResult {
            interfaces: vec![],
            ..sample()
        };
        assert_eq!(ipam.ipv4_for("anything"), Some(Ipv4Addr::new(10, 0, 0, 5)));
    }

    fn dual_sample() -> CniResult {
        let mut r = sample();
        r.ips.push(IpConfig {
            address: "2600:1f18:6d00:100:a1b2::7/128".parse().unwrap(),
            gateway: Some("fe80::1".parse().unwrap()),
            interface: Some(1),
            extra: Map::new(),
        });
        r.routes.push(Route {
            dst: "::/0".parse().unwrap(),
            gw: Some("fe80::1".parse().unwrap()),
            extra: Map::new(),
        });
        r
    }

    #[test]
    fn dual_stack_results_carry_both_families_in_every_version() {
        let r = dual_sample();
        let old = r.to_json(CniVersion::V0_4_0);
        assert_eq!(old["ips"][0]["version"], "4");
        assert_eq!(
            old["ips"][1],
            json!({"version": "6", "address": "2600:1f18:6d00:100:a1b2::7/128",
                "gateway": "fe80::1", "interface": 1})
        );
        let new = r.to_json(CniVersion::V1_1_0);
        assert!(new["ips"][1].get("version").is_none());
        assert_eq!(new["routes"][1], json!({"dst": "::/0", "gw": "fe80::1"}));
        for v in CniVersion::SUPPORTED {
            let back = CniResult::from_json(&r.to_json(v)).unwrap();
            assert_eq!(back, r);
            assert_eq!(back.ipv4_for("eth0"), Some(Ipv4Addr::new(10, 0, 0, 5)));
            assert_eq!(
                back.ipv6_for("eth0"),
                Some("2600:1f18:6d00:100:a1b2::7".parse().unwrap())
            );
        }
        assert_eq!(sample().ipv6_for("eth0"), None);
        assert_eq!(r.ipv6_for("eth1"), None);
    }

    #[test]
    fn malformed_prev_result_is_invalid_config() {
        let err = CniResult::from_json(&json!({"ips": [{"address": "nope"}]})).unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidNetworkConfig);
    }
}
