//! The daemon's configuration: an optional TOML file, then `ENIIPAM_*` environment overrides, then
//! validation with errors that name the knob and its allowed range. Nothing else reads the environment.
//!
//! Every knob, its default and its AWS VPC CNI equivalent is in `docs/config.md`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::cloud::limiter::{BucketConfig, LimiterConfig, RateLimitConfig};
use crate::host::{HostRulesConfig, Snat, SnatPorts};
use crate::pool::PoolConfig;
use crate::pool::config::WarmPolicy;
use crate::reconcile::api_server::ApiServerTarget;

/// The service account's token and CA bundle, as the kubelet mounts them in every pod.
pub const SERVICE_ACCOUNT_TOKEN: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";
pub const SERVICE_ACCOUNT_CA: &str = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";

/// Where environment variables come from (the process, or a map in tests).
pub trait Env {
    fn var(&self, name: &str) -> Option<String>;
}

/// The process environment.
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }
}

impl Env for BTreeMap<String, String> {
    fn var(&self, name: &str) -> Option<String> {
        self.get(name).cloned()
    }
}

/// How logs are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// JSON lines (the DaemonSet default).
    Json,
    /// Human-readable.
    Text,
    /// Text on a terminal, JSON otherwise.
    Auto,
}

/// A configuration value that cannot work.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("{knob}: {problem}")]
    Invalid { knob: String, problem: String },
    #[error("cannot read config file {path}: {message}")]
    File { path: String, message: String },
}

fn invalid(knob: &str, problem: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        knob: knob.to_owned(),
        problem: problem.into(),
    }
}

/// Everything `eniipamd` can be told. Field names are the TOML keys; `ENIIPAM_<UPPER_NAME>` overrides.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DaemonConfig {
    /// Cluster name, written in ENI tags and used by the leaked-ENI collector. Required on a real node.
    pub cluster_name: String,
    /// gRPC unix socket for the plugin and eniipamctl.
    pub socket_path: PathBuf,
    /// SQLite state file.
    pub state_path: PathBuf,
    /// Metrics, /healthz and /readyz.
    pub metrics_addr: SocketAddr,
    /// The plugin's result cache (read at startup as evidence of pods the state file does not know).
    pub cni_cache_dir: PathBuf,
    /// Directories where the runtime puts pod network namespaces, as the daemon sees them (hostPath
    /// mounts). A pod is released as dead only when its netns path lies in one of these, the directory
    /// is visible, and the file is absent; anywhere else its netns is unknown, never gone.
    pub netns_dirs: Vec<PathBuf>,
    /// AWS region (default: the SDK chain, then IMDS).
    pub region: Option<String>,
    /// EC2 endpoint override (default: the SDK's, `AWS_ENDPOINT_URL_EC2`).
    pub ec2_endpoint: Option<String>,
    /// IMDS endpoint override (default: `AWS_EC2_METADATA_SERVICE_ENDPOINT`, then 169.254.169.254).
    pub imds_endpoint: Option<String>,
    /// Subnet for new ENIs when no others are found (default: eth0's).
    pub subnet_id: Option<String>,
    /// Pins the subnets new ENIs may go to (each must be in the node's VPC and availability zone).
    /// Empty: discovered by the `kubernetes.io/role/cni` tag in the node's availability zone, as the
    /// AWS VPC CNI does (`ENABLE_SUBNET_DISCOVERY`), with `subnet_id` (eth0's) always a candidate
    /// unless tagged `0`.
    pub subnet_ids: Vec<String>,
    /// Security groups for new ENIs (default: eth0's).
    pub security_groups: Vec<String>,
    /// How the warm pool's level is chosen: `adaptive` (default: learned from the node's pod starts
    /// and bursts, within `min_idle ..= max_idle`) or `fixed` (top up below `min_idle` to halfway
    /// to `max_idle`, give back above `max_idle`).
    pub warm_policy: WarmPolicy,
    /// Idle IPs always kept ready: the warm level's floor (AWS VPC CNI: WARM_IP_TARGET).
    pub min_idle: u32,
    /// The warm level's ceiling: idle IPs beyond it are given back.
    pub max_idle: u32,
    /// `fixed` policy: IPs held at least, pods included (VPC CNI: MINIMUM_IP_TARGET). Default 0.
    pub minimum_ips: u32,
    /// `adaptive` policy: seconds a burst's leftovers are held, and the node must be quiet before
    /// the pool shrinks to its fill level. Default 600.
    pub give_back_delay_secs: u64,
    /// Cap on pod IPs held by the node (VPC CNI: max pods).
    pub max_ips: Option<u32>,
    /// Cap on ENIs, eth0 included (VPC CNI: MAX_ENI).
    pub max_enis: Option<u32>,
    /// eth0's secondary IPs serve pods too, as with the AWS VPC CNI (default true).
    pub use_primary_eni: bool,
    /// Slots are `/28` prefixes of 16 addresses (VPC CNI: ENABLE_PREFIX_DELEGATION). Nitro instance
    /// types only. Default false.
    pub prefix_delegation: bool,
    /// Seconds before a released IP goes to another pod (VPC CNI: IP_COOLDOWN_PERIOD, 30 s).
    pub reuse_cooldown_secs: u64,
    /// Seconds a sticky IP stays reserved for its StatefulSet pod.
    pub ip_stick_time_secs: u64,
    /// Mutating EC2 calls per second and burst, per node.
    pub ec2_mutating_qps: f64,
    pub ec2_mutating_burst: u32,
    /// Describe EC2 calls per second and burst, per node.
    pub ec2_describe_qps: f64,
    pub ec2_describe_burst: u32,
    /// Grace period before an available ENI of ours counts as leaked.
    pub leaked_eni_grace_secs: u64,
    /// Period of the leaked-ENI collector (jittered ±20 %).
    pub leaked_eni_period_secs: u64,
    /// Period of the running reconcile (jittered ±20 %): releases pods whose netns is gone, measures
    /// drift against EC2.
    pub reconcile_period_secs: u64,
    /// This node's Kubernetes name (`ENIIPAM_NODE_NAME`; the DaemonSet sets it from the downward API,
    /// `spec.nodeName`). Required when the API-server pod GC is on.
    pub node_name: String,
    /// Release allocations whose pod is gone from the Kubernetes API server. Unset: on when in-cluster
    /// config is available (an API server is known: `api_server_url`, or `KUBERNETES_SERVICE_HOST`/
    /// `_PORT`; and for `https`, the token file exists); `true`: required (an error when no API server
    /// is known, or the token is missing); `false`: off.
    pub api_server_gc: Option<bool>,
    /// The API server (default in a pod: `https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT`).
    pub api_server_url: Option<String>,
    /// Bearer token for the API server (the service account's; re-read as the kubelet rotates it).
    /// Used when it exists; required for `https`.
    pub api_server_token_file: PathBuf,
    /// CA bundle of the API server's certificate (used for `https`).
    pub api_server_ca_file: PathBuf,
    /// Seconds a pod must have been gone from the API server before its allocation is released.
    pub api_server_grace_secs: u64,
    /// Keep each secondary ENI's route table on the host (link up, primary IP, subnet route and default
    /// via the subnet gateway in table device_index + 1). Off only where the daemon must not touch the
    /// host's routing (`--simulate`, tests).
    pub manage_eni_routes: bool,
    /// Pods keep their own address towards destinations outside the VPC: a NAT gateway translates
    /// (VPC CNI: AWS_VPC_K8S_CNI_EXTERNALSNAT). Off: SNAT to eth0's primary IP. Needs
    /// `manage_eni_routes`, like every host rule.
    pub external_snat: bool,
    /// Destinations never SNATed besides the VPC's CIDRs (VPC CNI: AWS_VPC_K8S_CNI_EXCLUDE_SNAT_CIDRS).
    pub snat_exclude_cidrs: Vec<ipnet::Ipv4Net>,
    /// Source ports of SNATed connections: `prng`, `hashrandom` or `none` (VPC CNI:
    /// AWS_VPC_K8S_CNI_RANDOMIZESNAT).
    pub snat_randomize: SnatPorts,
    /// Mark connections arriving on eth0 so replies of pods on secondary ENIs leave by eth0
    /// (NodePort, hostPort, instance targets; VPC CNI: AWS_VPC_CNI_NODE_PORT_SUPPORT).
    pub node_port_support: bool,
    /// The connection/packet mark bit(s) of those rules and of `fwmark` rule 1024 (VPC CNI:
    /// AWS_VPC_K8S_CNI_CONNMARK).
    pub connmark: u32,
    /// The plugin's host veth prefix (its `veth_prefix` in the conflist): the rules match pod
    /// traffic by it (VPC CNI: AWS_VPC_K8S_CNI_VETHPREFIX).
    pub veth_prefix: String,
    /// Seconds between checks of the host rules (drift is healed; IMDS's VPC CIDRs are re-read
    /// every 30 s).
    pub host_rules_check_secs: u64,
    /// Seconds a new ENI waits for its route table on the host before serving pods (with
    /// `manage_eni_routes`); past that, the ENI is given back and its pods get a retryable error
    /// (`eniipam_eni_route_table_timeouts_total`).
    pub eni_route_wait_secs: u64,
    /// Seconds in-flight requests get to finish on SIGTERM.
    pub shutdown_grace_secs: u64,
    pub log_format: LogFormat,
    /// `tracing` filter, e.g. `info` or `eniipam=debug`.
    pub log_level: String,
}

impl Default for DaemonConfig {
    fn default() -> Self {
        let pool = PoolConfig::default();
        let rates = RateLimitConfig::default();
        Self {
            cluster_name: String::new(),
            socket_path: PathBuf::from(eniipam_api::DEFAULT_SOCKET),
            state_path: PathBuf::from("/var/lib/eniipam/state.db"),
            metrics_addr: SocketAddr::from(([127, 0, 0, 1], 61678)),
            cni_cache_dir: PathBuf::from(eniipam_api::cache::DEFAULT_CACHE_DIR),
            netns_dirs: vec![PathBuf::from("/var/run/netns"), PathBuf::from("/run/netns")],
            region: None,
            ec2_endpoint: None,
            imds_endpoint: None,
            subnet_id: None,
            subnet_ids: Vec::new(),
            security_groups: Vec::new(),
            warm_policy: pool.warm_policy,
            min_idle: pool.min_idle,
            max_idle: pool.max_idle,
            minimum_ips: pool.minimum_ips,
            give_back_delay_secs: pool.give_back_delay.as_secs(),
            max_ips: pool.max_ips,
            max_enis: pool.max_enis,
            use_primary_eni: pool.use_primary_eni,
            prefix_delegation: pool.prefix_delegation,
            reuse_cooldown_secs: pool.reuse_cooldown.as_secs(),
            ip_stick_time_secs: pool.ip_stick_time.as_secs(),
            ec2_mutating_qps: rates.mutating.qps,
            ec2_mutating_burst: rates.mutating.burst,
            ec2_describe_qps: rates.describe.qps,
            ec2_describe_burst: rates.describe.burst,
            leaked_eni_grace_secs: 300,
            leaked_eni_period_secs: 3600,
            reconcile_period_secs: 60,
            manage_eni_routes: true,
            node_name: String::new(),
            api_server_gc: None,
            api_server_url: None,
            api_server_token_file: PathBuf::from(SERVICE_ACCOUNT_TOKEN),
            api_server_ca_file: PathBuf::from(SERVICE_ACCOUNT_CA),
            api_server_grace_secs: 60,
            external_snat: false,
            snat_exclude_cidrs: Vec::new(),
            snat_randomize: SnatPorts::Prng,
            node_port_support: true,
            connmark: 0x80,
            veth_prefix: "eni".to_owned(),
            host_rules_check_secs: 10,
            eni_route_wait_secs: 30,
            shutdown_grace_secs: 20,
            log_format: LogFormat::Auto,
            log_level: "info".to_owned(),
        }
    }
}

/// A mark as the VPC CNI writes it: `0x80` (hex) or `128` (decimal).
fn parse_mark(v: &str) -> Result<u32, ConfigError> {
    let t = v.trim();
    let parsed = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16).ok(),
        None => t.parse().ok(),
    };
    parsed.ok_or_else(|| invalid("connmark", format!("{v:?} is not a mark like 0x80 or 128")))
}

fn parse<T: std::str::FromStr>(knob: &str, v: &str, what: &str) -> Result<T, ConfigError> {
    v.trim()
        .parse()
        .map_err(|_| invalid(knob, format!("{v:?} is not {what}")))
}

impl DaemonConfig {
    /// Reads the optional file, applies `ENIIPAM_*` overrides from `env`, and validates.
    pub fn load(file: Option<&Path>, env: &dyn Env) -> Result<Self, ConfigError> {
        let mut cfg = match file {
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|e| ConfigError::File {
                    path: p.display().to_string(),
                    message: e.to_string(),
                })?;
                toml::from_str(&text).map_err(|e| ConfigError::File {
                    path: p.display().to_string(),
                    message: e.to_string(),
                })?
            }
            None => Self::default(),
        };
        cfg.apply_env(env)?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Applies `ENIIPAM_<KNOB>` variables.
    pub fn apply_env(&mut self, env: &dyn Env) -> Result<(), ConfigError> {
        let get = |k: &str| env.var(&format!("ENIIPAM_{}", k.to_ascii_uppercase()));
        macro_rules! set {
            ($field:ident, $what:expr) => {
                if let Some(v) = get(stringify!($field)) {
                    self.$field = parse(stringify!($field), &v, $what)?;
                }
            };
        }
        macro_rules! set_opt {
            ($field:ident, $what:expr) => {
                if let Some(v) = get(stringify!($field)) {
                    self.$field = if v.is_empty() {
                        None
                    } else {
                        Some(parse(stringify!($field), &v, $what)?)
                    };
                }
            };
        }
        set!(cluster_name, "a name");
        set!(socket_path, "a path");
        set!(state_path, "a path");
        set!(metrics_addr, "an address like 127.0.0.1:61678");
        set!(cni_cache_dir, "a path");
        if let Some(v) = get("netns_dirs") {
            self.netns_dirs = v
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(PathBuf::from)
                .collect();
        }
        set_opt!(region, "a region");
        set_opt!(ec2_endpoint, "a URL");
        set_opt!(imds_endpoint, "a URL");
        set_opt!(subnet_id, "a subnet id");
        if let Some(v) = get("subnet_ids") {
            self.subnet_ids = v
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect();
        }
        if let Some(v) = get("security_groups") {
            self.security_groups = v
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect();
        }
        set!(warm_policy, "adaptive or fixed");
        set!(min_idle, "a whole number");
        set!(max_idle, "a whole number");
        set!(minimum_ips, "a whole number");
        set!(give_back_delay_secs, "a whole number of seconds");
        set_opt!(max_ips, "a whole number");
        set_opt!(max_enis, "a whole number");
        set!(use_primary_eni, "true or false");
        set!(prefix_delegation, "true or false");
        set!(reuse_cooldown_secs, "a whole number of seconds");
        set!(ip_stick_time_secs, "a whole number of seconds");
        set!(ec2_mutating_qps, "a number");
        set!(ec2_mutating_burst, "a whole number");
        set!(ec2_describe_qps, "a number");
        set!(ec2_describe_burst, "a whole number");
        set!(leaked_eni_grace_secs, "a whole number of seconds");
        set!(leaked_eni_period_secs, "a whole number of seconds");
        set!(reconcile_period_secs, "a whole number of seconds");
        set!(manage_eni_routes, "true or false");
        set!(node_name, "a node name");
        if let Some(v) = get("api_server_gc") {
            self.api_server_gc = match v.trim() {
                "" | "auto" => None,
                "true" => Some(true),
                "false" => Some(false),
                _ => {
                    return Err(invalid(
                        "api_server_gc",
                        format!("{v:?} is not true, false or auto"),
                    ));
                }
            };
        }
        set_opt!(api_server_url, "a URL");
        set!(api_server_token_file, "a path");
        set!(api_server_ca_file, "a path");
        set!(api_server_grace_secs, "a whole number of seconds");
        if self.api_server_url.is_none() {
            self.api_server_url = in_cluster_url(env)?;
        }
        set!(external_snat, "true or false");
        if let Some(v) = get("snat_exclude_cidrs") {
            self.snat_exclude_cidrs = v
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|c| parse("snat_exclude_cidrs", c, "an IPv4 CIDR like 10.1.0.0/16"))
                .collect::<Result<_, _>>()?;
        }
        set!(snat_randomize, "prng, hashrandom or none");
        set!(node_port_support, "true or false");
        if let Some(v) = get("connmark") {
            self.connmark = parse_mark(&v)?;
        }
        set!(veth_prefix, "a prefix");
        set!(host_rules_check_secs, "a whole number of seconds");
        set!(eni_route_wait_secs, "a whole number of seconds");
        set!(shutdown_grace_secs, "a whole number of seconds");
        if let Some(v) = get("log_format") {
            self.log_format = match v.as_str() {
                "json" => LogFormat::Json,
                "text" => LogFormat::Text,
                "auto" => LogFormat::Auto,
                _ => {
                    return Err(invalid(
                        "log_format",
                        format!("{v:?} is not json, text or auto"),
                    ));
                }
            };
        }
        set!(log_level, "a filter");
        Ok(())
    }

    /// Checks every knob; the error names the knob and the allowed range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.cluster_name.len() > 128 || self.cluster_name.contains(char::is_whitespace) {
            return Err(invalid("cluster_name", "at most 128 characters, no spaces"));
        }
        if self.min_idle > self.max_idle {
            return Err(invalid(
                "min_idle",
                format!(
                    "{} is above max_idle {} (allowed: 0 ..= max_idle)",
                    self.min_idle, self.max_idle
                ),
            ));
        }
        if self.max_idle > 10_000 {
            return Err(invalid("max_idle", "allowed: 0 ..= 10000"));
        }
        if self.minimum_ips > 10_000 {
            return Err(invalid("minimum_ips", "allowed: 0 ..= 10000"));
        }
        if self.give_back_delay_secs > 24 * 3600 {
            return Err(invalid("give_back_delay_secs", "allowed: 0 ..= 86400"));
        }
        if let Some(m) = self.max_enis
            && !(2..=32).contains(&m)
        {
            return Err(invalid(
                "max_enis",
                format!("{m} is outside 2 ..= 32 (eth0 counts)"),
            ));
        }
        if self.max_ips == Some(0) {
            return Err(invalid("max_ips", "allowed: 1 or more (or unset)"));
        }
        if self.reuse_cooldown_secs > 3600 {
            return Err(invalid("reuse_cooldown_secs", "allowed: 0 ..= 3600"));
        }
        if self.ip_stick_time_secs > 86_400 {
            return Err(invalid("ip_stick_time_secs", "allowed: 0 ..= 86400"));
        }
        for (knob, qps) in [
            ("ec2_mutating_qps", self.ec2_mutating_qps),
            ("ec2_describe_qps", self.ec2_describe_qps),
        ] {
            if !(qps > 0.0 && qps <= 100.0) {
                return Err(invalid(knob, format!("{qps} is outside (0, 100]")));
            }
        }
        for (knob, b) in [
            ("ec2_mutating_burst", self.ec2_mutating_burst),
            ("ec2_describe_burst", self.ec2_describe_burst),
        ] {
            if !(1..=1000).contains(&b) {
                return Err(invalid(knob, format!("{b} is outside 1 ..= 1000")));
            }
        }
        if self.leaked_eni_grace_secs < 60 {
            return Err(invalid(
                "leaked_eni_grace_secs",
                "allowed: 60 or more (an ENI between create and attach is not a leak)",
            ));
        }
        if self.leaked_eni_period_secs < 10 {
            return Err(invalid("leaked_eni_period_secs", "allowed: 10 or more"));
        }
        if !(5..=3600).contains(&self.reconcile_period_secs) {
            return Err(invalid("reconcile_period_secs", "allowed: 5 ..= 3600"));
        }
        if self.api_server_grace_secs > 86_400 {
            return Err(invalid("api_server_grace_secs", "allowed: 0 ..= 86400"));
        }
        if !self.node_name.is_empty() && !is_dns_subdomain(&self.node_name) {
            return Err(invalid(
                "node_name",
                format!(
                    "{:?} is not a Kubernetes node name (lowercase letters, digits, '-' and '.', at most 253)",
                    self.node_name
                ),
            ));
        }
        if let Some(url) = &self.api_server_url
            && !(url.starts_with("https://") || url.starts_with("http://"))
        {
            return Err(invalid(
                "api_server_url",
                format!("{url:?} is not an https:// (or http://) URL"),
            ));
        }
        if self.api_server_gc == Some(true) && self.api_server_url.is_none() {
            return Err(invalid(
                "api_server_gc",
                "true, but no API server is known: not running in a pod (KUBERNETES_SERVICE_HOST and \
                 KUBERNETES_SERVICE_PORT are unset) and api_server_url is unset",
            ));
        }
        if self.api_server_gc_enabled() && self.node_name.is_empty() {
            return Err(invalid(
                "node_name",
                "empty, but the API-server pod GC is on (in-cluster config found, or api_server_gc = true): \
                 set ENIIPAM_NODE_NAME to this node's Kubernetes name (the DaemonSet sets it from the \
                 downward API, fieldRef spec.nodeName), or set api_server_gc = false",
            ));
        }
        self.validate_host_rules()?;
        if self.shutdown_grace_secs > 600 {
            return Err(invalid("shutdown_grace_secs", "allowed: 0 ..= 600"));
        }
        if self.socket_path.as_os_str().is_empty() || self.state_path.as_os_str().is_empty() {
            return Err(invalid("socket_path/state_path", "must not be empty"));
        }
        if tracing_subscriber::EnvFilter::try_new(&self.log_level).is_err() {
            return Err(invalid(
                "log_level",
                format!("{:?} is not a tracing filter", self.log_level),
            ));
        }
        Ok(())
    }

    /// Whether the API-server pod GC runs: `api_server_gc`, or when unset, whether in-cluster config is
    /// available: an API server is known and, for `https`, the token file exists (a pod with
    /// `automountServiceAccountToken: false` still gets `KUBERNETES_SERVICE_HOST`, but no credentials).
    pub fn api_server_gc_enabled(&self) -> bool {
        self.api_server_gc.unwrap_or_else(|| {
            self.api_server_url.as_deref().is_some_and(|url| {
                !url.starts_with("https://") || self.api_server_token_file.exists()
            })
        })
    }

    /// Where the API-server pod GC connects, when it is on: the URL, the token file when it exists (it
    /// must for `https`) and the CA bundle for `https`.
    pub fn api_server_target(&self) -> Option<ApiServerTarget> {
        if !self.api_server_gc_enabled() {
            return None;
        }
        let url = self.api_server_url.clone()?;
        let https = url.starts_with("https://");
        Some(ApiServerTarget {
            token_file: (https || self.api_server_token_file.exists())
                .then(|| self.api_server_token_file.clone()),
            ca_file: https.then(|| self.api_server_ca_file.clone()),
            url,
        })
    }

    fn validate_host_rules(&self) -> Result<(), ConfigError> {
        if self.connmark == 0 {
            return Err(invalid(
                "connmark",
                "must not be 0 (the VPC CNI's default is 0x80)",
            ));
        }
        // Marks other node components set: kube-proxy's masquerade (0x4000) and drop (0x8000) bits,
        // portmap's masquerade bit (0x2000).
        const TAKEN: u32 = 0x2000 | 0x4000 | 0x8000;
        if self.connmark & TAKEN != 0 {
            return Err(invalid(
                "connmark",
                format!(
                    "{:#x} overlaps bits kube-proxy (0x4000, 0x8000) or portmap (0x2000) use",
                    self.connmark
                ),
            ));
        }
        let prefix_ok = (1..=4).contains(&self.veth_prefix.len())
            && self
                .veth_prefix
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !prefix_ok {
            return Err(invalid(
                "veth_prefix",
                format!(
                    "{:?}: 1-4 characters of [A-Za-z0-9_-], the conflist's veth_prefix",
                    self.veth_prefix
                ),
            ));
        }
        if self.snat_exclude_cidrs.len() > 256 {
            return Err(invalid("snat_exclude_cidrs", "allowed: at most 256 CIDRs"));
        }
        if !(1..=3600).contains(&self.host_rules_check_secs) {
            return Err(invalid("host_rules_check_secs", "allowed: 1 ..= 3600"));
        }
        if !(1..=600).contains(&self.eni_route_wait_secs) {
            return Err(invalid("eni_route_wait_secs", "allowed: 1 ..= 600"));
        }
        Ok(())
    }

    /// The host rules' knobs (kept when `manage_eni_routes` is on).
    pub fn host_rules_config(&self) -> HostRulesConfig {
        HostRulesConfig {
            snat: if self.external_snat {
                Snat::External
            } else {
                Snat::Node {
                    ports: self.snat_randomize,
                    exclude: self.snat_exclude_cidrs.clone(),
                }
            },
            node_port_support: self.node_port_support,
            connmark: self.connmark,
            veth_prefix: self.veth_prefix.clone(),
        }
    }

    /// The pool's knobs.
    pub fn pool_config(&self) -> PoolConfig {
        PoolConfig {
            warm_policy: self.warm_policy,
            min_idle: self.min_idle,
            max_idle: self.max_idle,
            minimum_ips: self.minimum_ips,
            give_back_delay: Duration::from_secs(self.give_back_delay_secs),
            max_ips: self.max_ips,
            max_enis: self.max_enis,
            use_primary_eni: self.use_primary_eni,
            prefix_delegation: self.prefix_delegation,
            reuse_cooldown: Duration::from_secs(self.reuse_cooldown_secs),
            ip_stick_time: Duration::from_secs(self.ip_stick_time_secs),
            ..PoolConfig::default()
        }
    }

    /// The EC2 rate limits and default retries.
    pub fn limiter_config(&self) -> LimiterConfig {
        LimiterConfig {
            rates: RateLimitConfig {
                mutating: BucketConfig {
                    qps: self.ec2_mutating_qps,
                    burst: self.ec2_mutating_burst,
                },
                describe: BucketConfig {
                    qps: self.ec2_describe_qps,
                    burst: self.ec2_describe_burst,
                },
            },
            ..LimiterConfig::default()
        }
    }
}

/// The API server as client-go finds it in a pod: `https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT`
/// (both set, or none).
fn in_cluster_url(env: &dyn Env) -> Result<Option<String>, ConfigError> {
    let host = env
        .var("KUBERNETES_SERVICE_HOST")
        .filter(|h| !h.trim().is_empty());
    let port = env
        .var("KUBERNETES_SERVICE_PORT")
        .filter(|p| !p.trim().is_empty());
    let (host, port) = match (host, port) {
        (Some(h), Some(p)) => (h, p),
        _ => return Ok(None),
    };
    let port: u16 = parse("KUBERNETES_SERVICE_PORT", &port, "a port")?;
    let host = host.trim();
    Ok(Some(match host.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V6(ip)) => format!("https://[{ip}]:{port}"),
        _ => format!("https://{host}:{port}"),
    }))
}

/// A DNS subdomain (RFC 1123), which node names are.
fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn defaults_are_valid() {
        DaemonConfig::default().validate().unwrap();
    }

    #[test]
    fn env_overrides_and_names_bad_knobs() {
        let c = DaemonConfig::load(
            None,
            &env(&[
                ("ENIIPAM_MIN_IDLE", "4"),
                ("ENIIPAM_MAX_ENIS", "3"),
                ("ENIIPAM_SECURITY_GROUPS", "sg-1, sg-2"),
            ]),
        )
        .unwrap();
        assert_eq!((c.min_idle, c.max_enis), (4, Some(3)));
        assert_eq!(c.security_groups, vec!["sg-1", "sg-2"]);
        let e = DaemonConfig::load(None, &env(&[("ENIIPAM_MIN_IDLE", "lots")])).unwrap_err();
        assert!(e.to_string().starts_with("min_idle:"), "{e}");
        let e = DaemonConfig::load(
            None,
            &env(&[("ENIIPAM_MIN_IDLE", "50"), ("ENIIPAM_MAX_IDLE", "5")]),
        )
        .unwrap_err();
        assert!(e.to_string().contains("max_idle"), "{e}");
        let e = DaemonConfig::load(None, &env(&[("ENIIPAM_MAX_ENIS", "1")])).unwrap_err();
        assert!(e.to_string().contains("2 ..= 32"), "{e}");
        let e = DaemonConfig::load(None, &env(&[("ENIIPAM_EC2_MUTATING_QPS", "0")])).unwrap_err();
        assert!(e.to_string().starts_with("ec2_mutating_qps"), "{e}");
        let e = DaemonConfig::load(None, &env(&[("ENIIPAM_LOG_FORMAT", "xml")])).unwrap_err();
        assert!(e.to_string().starts_with("log_format"), "{e}");
    }

    #[test]
    fn host_rule_knobs_read_like_the_vpc_cni() {
        let c = DaemonConfig::load(None, &env(&[])).unwrap();
        assert_eq!(
            c.host_rules_config(),
            HostRulesConfig::default(),
            "SNAT with prng ports and NodePort support by default"
        );
        let c = DaemonConfig::load(
            None,
            &env(&[
                ("ENIIPAM_EXTERNAL_SNAT", "true"),
                ("ENIIPAM_NODE_PORT_SUPPORT", "false"),
                ("ENIIPAM_CONNMARK", "0x100"),
                ("ENIIPAM_VETH_PREFIX", "pod"),
            ]),
        )
        .unwrap();
        let h = c.host_rules_config();
        assert_eq!(h.snat, Snat::External);
        assert!(!h.node_port_support && !h.wants_rules());
        assert_eq!((h.connmark, h.veth_prefix.as_str()), (0x100, "pod"));
        let c = DaemonConfig::load(
            None,
            &env(&[
                ("ENIIPAM_SNAT_EXCLUDE_CIDRS", "10.1.0.0/16, 192.168.0.0/24"),
                ("ENIIPAM_SNAT_RANDOMIZE", "hashrandom"),
                ("ENIIPAM_CONNMARK", "64"),
            ]),
        )
        .unwrap();
        assert_eq!(
            c.host_rules_config().snat,
            Snat::Node {
                ports: SnatPorts::Hashrandom,
                exclude: vec![
                    "10.1.0.0/16".parse().unwrap(),
                    "192.168.0.0/24".parse().unwrap()
                ],
            }
        );
        assert_eq!(c.connmark, 64);
        for (var, value, knob) in [
            (
                "ENIIPAM_SNAT_EXCLUDE_CIDRS",
                "10.1.0.0/16,nope",
                "snat_exclude_cidrs",
            ),
            ("ENIIPAM_SNAT_RANDOMIZE", "random", "snat_randomize"),
            ("ENIIPAM_CONNMARK", "0", "connmark"),
            ("ENIIPAM_CONNMARK", "0x4000", "connmark"),
            ("ENIIPAM_CONNMARK", "0xzz", "connmark"),
            ("ENIIPAM_VETH_PREFIX", "toolong", "veth_prefix"),
            (
                "ENIIPAM_HOST_RULES_CHECK_SECS",
                "0",
                "host_rules_check_secs",
            ),
            ("ENIIPAM_ENI_ROUTE_WAIT_SECS", "0", "eni_route_wait_secs"),
        ] {
            let e = DaemonConfig::load(None, &env(&[(var, value)])).unwrap_err();
            assert!(e.to_string().starts_with(knob), "{var}={value}: {e}");
        }
        // The TOML spelling of the same knobs.
        let c: DaemonConfig = toml::from_str(
            "external_snat = true\nsnat_randomize = \"none\"\nsnat_exclude_cidrs = [\"10.9.0.0/16\"]\nconnmark = 0x200\n",
        )
        .unwrap();
        c.validate().unwrap();
        assert_eq!(
            (c.external_snat, c.snat_randomize, c.connmark),
            (true, SnatPorts::None, 0x200)
        );
    }

    #[test]
    fn file_then_env() {
        let dir = std::env::temp_dir().join(format!("eniipam-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("c.toml");
        std::fs::write(&f, "cluster_name = \"prod\"\nmin_idle = 1\nmax_idle = 3\n").unwrap();
        let c = DaemonConfig::load(Some(&f), &env(&[("ENIIPAM_MAX_IDLE", "7")])).unwrap();
        assert_eq!(
            (c.cluster_name.as_str(), c.min_idle, c.max_idle),
            ("prod", 1, 7)
        );
        std::fs::write(&f, "no_such_knob = 1\n").unwrap();
        let e = DaemonConfig::load(Some(&f), &env(&[])).unwrap_err();
        assert!(e.to_string().contains("no_such_knob"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
