//! The daemon's configuration: an optional TOML file, then `ENIIPAM_*` environment overrides, then
//! validation with errors that name the knob and its allowed range. Nothing else reads the environment.
//!
//! Every knob, its default and its AWS VPC CNI equivalent is in `docs/config.md`.
//!
//! [`DaemonConfig`] and its defaults are here, with what each part of the daemon is given of it
//! (`pool_config`, `host_rules_config`, `limiter_config`, `api_server_target`); `env` reads the
//! `ENIIPAM_*` overrides, `validate` checks every knob.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::cloud::limiter::{BucketConfig, LimiterConfig, RateLimitConfig};
use crate::host::{HostRulesConfig, Snat, SnatPorts};
use crate::ipv6::IpFamily;
use crate::pool::{PoolConfig, config::WarmPolicy};
use crate::reconcile::api_server::ApiServerTarget;
use crate::reconcile::api_server::node::{NodeStatusConfig, TaintEffect};

mod env;
#[cfg(test)]
mod tests;
mod validate;

/// The service account's token and CA bundle, as the kubelet mounts them in every pod.
pub const SERVICE_ACCOUNT_TOKEN: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";
pub const SERVICE_ACCOUNT_CA: &str = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";
/// The VPC CNI's default for both the label and the annotation that name a node's ENIConfig.
pub const DEFAULT_ENI_CONFIG_KEY: &str = "k8s.amazonaws.com/eniConfig";

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
    /// Custom networking, as the AWS VPC CNI's `AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG`: the node's
    /// `ENIConfig` (`crd.k8s.amazonaws.com/v1alpha1`, named by `eni_config_annotation` or the value
    /// of `eni_config_label` on the Node) gives the subnet and security groups of every new ENI, and
    /// eth0 serves no pods. Needs the API-server connection and `node_name`; IPv4 pools only
    /// (`ip_family` ipv4 or dual); replaces subnet discovery, so `subnet_ids` must be empty. A
    /// changed ENIConfig applies to new ENIs only. Default false.
    pub custom_networking: bool,
    /// The Node label whose value names the node's ENIConfig (the VPC CNI's `ENI_CONFIG_LABEL_DEF`;
    /// often `topology.kubernetes.io/zone`, with one ENIConfig per zone named after it). Default
    /// `k8s.amazonaws.com/eniConfig`.
    pub eni_config_label: String,
    /// The Node annotation naming the node's ENIConfig; it wins over the label (the VPC CNI's
    /// `ENI_CONFIG_ANNOTATION_DEF`). Default `k8s.amazonaws.com/eniConfig`.
    pub eni_config_annotation: String,
    /// Network profiles (`docs/network-profiles.md`): security groups per workload without trunking.
    /// A pod whose annotation `eniipam.io/network` (on itself, else on its namespace) names a
    /// `NetworkProfile` (`eniipam.io/v1alpha1`) gets its IP only from an ENI created for that profile,
    /// in its subnet and with exactly its groups; each profile's total slots are advertised on the
    /// node as the extended resource `eniipam.io/network-<name>`. Needs the API-server connection
    /// and `node_name`; IPv4 pools only. Default false.
    pub network_profiles: bool,
    /// Kubernetes NetworkPolicy enforcement (`docs/network-policy.md`): this node's pods get the
    /// ingress and egress the cluster's NetworkPolicies allow, in nftables (table
    /// `inet eniipam_policy`, keyed by each pod's host veth), in force before a pod's ADD returns.
    /// Unset (`auto`): on when an API server is known (as for `api_server_gc`) and
    /// `manage_eni_routes` is on, whatever `ip_family` (IPv4, IPv6 and dual-stack pods alike; the
    /// daemon logs why at startup when it is off); `true`: the same, required (an error otherwise);
    /// `false`: off, for clusters whose NetworkPolicy is enforced by Calico or Cilium, and a table
    /// an earlier run left is deleted.
    pub network_policy: Option<bool>,
    /// The cluster's Service CIDRs (EKS: `kubernetesNetworkConfig.serviceIpv4Cidr` and
    /// `serviceIpv6Cidr` of `aws eks describe-cluster`). Read only by `eniipamctl policy`, which
    /// warns of an `ipBlock` inside one: eniipam judges egress after kube-proxy's DNAT (the backend
    /// pod's address), where aws-node judged the Service's address (`docs/network-policy.md`,
    /// migrating). Default empty: no such warning.
    pub service_cidrs: Vec<ipnet::IpNet>,
    /// Decision logs (`docs/network-policy.md`, "Decision logs"): `denied` (default) logs the new
    /// connections the rules deny, `all` allowed ones too, `off` none; at most
    /// `network_policy_log_rate` a second, to the daemon's log and `network_policy_log_file`.
    pub network_policy_log: crate::network_policy::decisions::Logged,
    /// The NFLOG group the table logs to (default 47; no other program on the node may use it).
    pub network_policy_log_group: u16,
    /// Decisions logged per second on the node, and denied packets copied per second per pod
    /// direction in the kernel, at most (default 10; the rest are counted and said).
    pub network_policy_log_rate: u32,
    /// A file the decisions are written to as JSON lines, for a log shipper (default: none).
    pub network_policy_log_file: Option<PathBuf>,
    /// That file is rotated at this many MiB (default 50), keeping
    /// `network_policy_log_file_keep` rotated files (default 2).
    pub network_policy_log_file_max_mb: u64,
    pub network_policy_log_file_keep: u32,
    /// Which addresses pods get: `ipv4` (default: from the ENI pool), `ipv6` (from one /80 the node
    /// takes on eth0 at startup; no IPv4 pool) or `dual` (both). The VPC CNI's `ENABLE_IPV6`.
    pub ip_family: IpFamily,
    /// With `ip_family = ipv6`, each pod also gets a node-local IPv4 from 169.254.172.0/22 that the
    /// node SNATs to its primary IPv4, so IPv6-only pods reach IPv4-only destinations (default on;
    /// the VPC CNI's `ENABLE_V4_EGRESS`). Off: no egress address and no SNAT rule for it. Ignored in
    /// `ipv4` and `dual` mode, where pods have a VPC IPv4 of their own.
    pub ipv4_egress: bool,
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
    /// Burst prefixes on Nitro types without `prefix_delegation`: a burst beyond the idle pool takes
    /// whole `/28`s in one assign, or one new ENI when assigns are throttled. See
    /// `PoolConfig::burst_prefixes`. Default true.
    pub burst_prefixes: bool,
    /// Percent of each pod subnet a `prefix` CIDR reservation keeps for `/28`s (0: off; `docs/config.md`).
    pub prefix_reservation_percent: u8,
    /// Seconds before a released IP goes to another pod (VPC CNI: IP_COOLDOWN_PERIOD, 30 s).
    pub reuse_cooldown_secs: u64,
    /// Seconds a sticky IP stays reserved for its StatefulSet pod.
    pub ip_stick_time_secs: u64,
    /// Seconds an ADD may wait for EC2 (throttled, backing off, or its IP still on the way) before it
    /// fails; the plugin's own timeout shortens it per request. Default 100; 0 fails at once when EC2
    /// is slow. See `PoolConfig::add_wait`.
    pub add_wait_secs: u64,
    /// Seconds a subnet EC2 called full (or at a limit) is left alone before it is tried again.
    pub subnet_backoff_secs: u64,
    /// Mutating EC2 calls per second and burst, per node.
    pub ec2_mutating_qps: f64,
    pub ec2_mutating_burst: u32,
    /// Describe EC2 calls per second and burst, per node.
    pub ec2_describe_qps: f64,
    pub ec2_describe_burst: u32,
    /// The node's bucket of one EC2 API when it is not its class's (mutating or describe, above):
    /// EC2 gives each API its own bucket, and so does the node. Keys: the API names of
    /// [`crate::cloud::limiter::EC2_APIS`].
    pub ec2_api_rates: BTreeMap<String, BucketConfig>,
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
    /// Remove `startup_taint` from this node once the pool holds its first warm IPs (default false).
    /// The node group puts the taint on the node at registration (Karpenter's `startupTaints`, a
    /// managed node group's `taints`), so no pod is scheduled before the node can give it an IP.
    /// Needs the API-server connection (as `api_server_gc`).
    pub remove_startup_taint: bool,
    /// The startup taint's key (default `eniipam.io/not-ready`).
    pub startup_taint: String,
    /// The startup taint's effect: `NoSchedule` (default), `PreferNoSchedule` or `NoExecute`.
    pub startup_taint_effect: TaintEffect,
    /// Publish the node condition `eniipam.io/PodNetworkReady` (IPs available or to be had, EC2
    /// reachable, pod subnet not short). Default true; takes effect with the API-server connection.
    pub node_condition: bool,
    /// Seconds between re-publications of an unchanged condition (its `lastHeartbeatTime`).
    pub node_condition_heartbeat_secs: u64,
    /// Seconds between looks at the pool for the taint and the condition.
    pub node_check_secs: u64,
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
            custom_networking: false,
            network_profiles: false,
            network_policy: None,
            service_cidrs: Vec::new(),
            network_policy_log: crate::network_policy::decisions::Logged::Denied,
            network_policy_log_group: 47,
            network_policy_log_rate: 10,
            network_policy_log_file: None,
            network_policy_log_file_max_mb: 50,
            network_policy_log_file_keep: 2,
            eni_config_label: DEFAULT_ENI_CONFIG_KEY.to_owned(),
            eni_config_annotation: DEFAULT_ENI_CONFIG_KEY.to_owned(),
            ip_family: IpFamily::Ipv4,
            ipv4_egress: true,
            warm_policy: pool.warm_policy,
            min_idle: pool.min_idle,
            max_idle: pool.max_idle,
            minimum_ips: pool.minimum_ips,
            give_back_delay_secs: pool.give_back_delay.as_secs(),
            max_ips: pool.max_ips,
            max_enis: pool.max_enis,
            use_primary_eni: pool.use_primary_eni,
            prefix_delegation: pool.prefix_delegation,
            burst_prefixes: pool.burst_prefixes,
            prefix_reservation_percent: 0,
            reuse_cooldown_secs: pool.reuse_cooldown.as_secs(),
            ip_stick_time_secs: pool.ip_stick_time.as_secs(),
            add_wait_secs: pool.add_wait.as_secs(),
            subnet_backoff_secs: pool.subnet_backoff.as_secs(),
            ec2_mutating_qps: rates.mutating.qps,
            ec2_mutating_burst: rates.mutating.burst,
            ec2_describe_qps: rates.describe.qps,
            ec2_describe_burst: rates.describe.burst,
            ec2_api_rates: BTreeMap::new(),
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
            remove_startup_taint: false,
            startup_taint: crate::reconcile::api_server::node::DEFAULT_STARTUP_TAINT.to_owned(),
            startup_taint_effect: TaintEffect::NoSchedule,
            node_condition: true,
            node_condition_heartbeat_secs: 300,
            node_check_secs: 5,
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
        self.api_server_connection()
    }

    /// Where the node's taint and condition keeper connects, when it has something to do: the
    /// startup taint is on, or the condition is and in-cluster config is available (as for the GC:
    /// an API server is known and, for `https`, the token file exists) and the node's name is known.
    pub fn node_status_target(&self) -> Option<ApiServerTarget> {
        let url = self.api_server_url.as_deref()?;
        let credentials = !url.starts_with("https://") || self.api_server_token_file.exists();
        let condition = self.node_condition && credentials && !self.node_name.is_empty();
        (self.remove_startup_taint || condition)
            .then(|| self.api_server_connection())
            .flatten()
    }

    /// Whether eth0's secondary IPs serve pods: `use_primary_eni`, except with custom networking,
    /// where eth0 sits in the node's subnet and not the ENIConfig's (as with the VPC CNI).
    pub fn eth0_serves_pods(&self) -> bool {
        self.use_primary_eni && !self.custom_networking
    }

    /// Where the node's ENIConfig is read from, with custom networking on (validation has made sure
    /// an API server is known).
    pub fn custom_networking_target(&self) -> Option<ApiServerTarget> {
        self.custom_networking
            .then(|| self.api_server_connection())
            .flatten()
    }

    /// Where the cluster's network profiles, namespaces and this node's pods are read from (and the
    /// node's extended resources written), with network profiles on (validation has made sure an
    /// API server is known).
    pub fn network_profiles_target(&self) -> Option<ApiServerTarget> {
        self.network_profiles
            .then(|| self.api_server_connection())
            .flatten()
    }

    /// Whether NetworkPolicy is enforced here (`network_policy`; see its docs for `auto`).
    pub fn network_policy_enabled(&self) -> bool {
        self.network_policy_off().is_none()
    }

    /// Why NetworkPolicy is not enforced here, for the startup log; `None` when it is.
    pub fn network_policy_off(&self) -> Option<String> {
        match self.network_policy {
            Some(true) => None,
            Some(false) => Some("network_policy = false".into()),
            None if !self.manage_eni_routes => Some(
                "network_policy is auto and manage_eni_routes is false: the daemon does not own \
                 the host's rules"
                    .into(),
            ),
            None => match self.api_server_url.as_deref() {
                None => Some(
                    "network_policy is auto and no API server is known (not in a pod, \
                     api_server_url unset): nothing to read policies from"
                        .into(),
                ),
                Some(url)
                    if url.starts_with("https://") && !self.api_server_token_file.exists() =>
                {
                    Some(format!(
                        "network_policy is auto and the API server {url} needs a token, but {} \
                         does not exist",
                        self.api_server_token_file.display()
                    ))
                }
                Some(_) => None,
            },
        }
    }

    /// Where NetworkPolicies, pods and namespaces are read from, with enforcement on.
    pub fn network_policy_target(&self) -> Option<ApiServerTarget> {
        self.network_policy_enabled()
            .then(|| self.api_server_connection())
            .flatten()
    }

    /// The API server's URL, the token file when it exists (it must for `https`) and the CA bundle
    /// for `https`.
    fn api_server_connection(&self) -> Option<ApiServerTarget> {
        let url = self.api_server_url.clone()?;
        let https = url.starts_with("https://");
        Some(ApiServerTarget {
            token_file: (https || self.api_server_token_file.exists())
                .then(|| self.api_server_token_file.clone()),
            ca_file: https.then(|| self.api_server_ca_file.clone()),
            url,
        })
    }

    /// What the node's taint and condition keeper is given (with the API-server connection).
    pub fn node_status_config(&self) -> NodeStatusConfig {
        NodeStatusConfig {
            node_name: self.node_name.clone(),
            startup_taint: self
                .remove_startup_taint
                .then(|| (self.startup_taint.clone(), self.startup_taint_effect)),
            condition: self.node_condition,
            heartbeat: Duration::from_secs(self.node_condition_heartbeat_secs),
            check: Duration::from_secs(self.node_check_secs),
        }
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
            ipv4_egress: (self.ip_family == IpFamily::Ipv6 && self.ipv4_egress)
                .then_some(self.snat_randomize),
            own_eni_egress: self.network_profiles,
        }
    }

    /// The pool's knobs. With `ip_family = ipv6` pods take no IPv4, so the pool is held empty: fixed
    /// warm levels of zero, eth0's secondaries not used (any left from an earlier life are given back),
    /// and no ENI created (nothing ever asks it for an IP).
    pub fn pool_config(&self) -> PoolConfig {
        if self.ip_family == IpFamily::Ipv6 {
            return PoolConfig {
                warm_policy: WarmPolicy::Fixed,
                min_idle: 0,
                max_idle: 0,
                minimum_ips: 0,
                use_primary_eni: false,
                ip_stick_time: Duration::from_secs(self.ip_stick_time_secs),
                add_wait: Duration::from_secs(self.add_wait_secs),
                ..PoolConfig::default()
            };
        }
        PoolConfig {
            warm_policy: self.warm_policy,
            min_idle: self.min_idle,
            max_idle: self.max_idle,
            minimum_ips: self.minimum_ips,
            give_back_delay: Duration::from_secs(self.give_back_delay_secs),
            max_ips: self.max_ips,
            max_enis: self.max_enis,
            // With custom networking eth0 is in the node's subnet, not the ENIConfig's: it serves
            // no pods (as with the VPC CNI).
            use_primary_eni: self.eth0_serves_pods(),
            custom_networking: self.custom_networking,
            prefix_delegation: self.prefix_delegation,
            burst_prefixes: self.burst_prefixes,
            reuse_cooldown: Duration::from_secs(self.reuse_cooldown_secs),
            ip_stick_time: Duration::from_secs(self.ip_stick_time_secs),
            add_wait: Duration::from_secs(self.add_wait_secs),
            subnet_backoff: Duration::from_secs(self.subnet_backoff_secs),
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
            per_api: self.ec2_api_rates.clone(),
            ..LimiterConfig::default()
        }
    }
}
