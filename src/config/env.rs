//! `ENIIPAM_<KNOB>` overrides of the configuration, and the API server a pod is given.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::{ConfigError, DaemonConfig, Env, LogFormat, invalid};
use crate::cloud::limiter::BucketConfig;

/// A mark as the VPC CNI writes it: `0x80` (hex) or `128` (decimal).
fn parse_mark(v: &str) -> Result<u32, ConfigError> {
    let t = v.trim();
    let parsed = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16).ok(),
        None => t.parse().ok(),
    };
    parsed.ok_or_else(|| invalid("connmark", format!("{v:?} is not a mark like 0x80 or 128")))
}

/// The items of a comma-separated list, trimmed, empty ones skipped (`a, b,` → `a`, `b`).
fn comma_list(v: &str) -> impl Iterator<Item = &str> {
    v.split(',').map(str::trim).filter(|s| !s.is_empty())
}

/// `API=qps/burst` items, comma-separated: `AssignPrivateIpAddresses=1/5, CreateTags=0.5/2`.
fn parse_api_rates(v: &str) -> Result<BTreeMap<String, BucketConfig>, ConfigError> {
    const KNOB: &str = "ec2_api_rates";
    let mut rates = BTreeMap::new();
    for item in comma_list(v) {
        let bad = || {
            invalid(
                KNOB,
                format!("{item:?} is not API=qps/burst, like CreateTags=0.5/2"),
            )
        };
        let (api, rate) = item.split_once('=').ok_or_else(bad)?;
        let (qps, burst) = rate.split_once('/').ok_or_else(bad)?;
        let rate = BucketConfig {
            qps: qps.trim().parse().map_err(|_| bad())?,
            burst: burst.trim().parse().map_err(|_| bad())?,
        };
        if rates.insert(api.trim().to_owned(), rate).is_some() {
            return Err(invalid(KNOB, format!("{} is given twice", api.trim())));
        }
    }
    Ok(rates)
}

fn parse<T: std::str::FromStr>(knob: &str, v: &str, what: &str) -> Result<T, ConfigError> {
    v.trim()
        .parse()
        .map_err(|_| invalid(knob, format!("{v:?} is not {what}")))
}

impl DaemonConfig {
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
            self.netns_dirs = comma_list(&v).map(PathBuf::from).collect();
        }
        set_opt!(region, "a region");
        set_opt!(ec2_endpoint, "a URL");
        set_opt!(imds_endpoint, "a URL");
        set_opt!(subnet_id, "a subnet id");
        if let Some(v) = get("subnet_ids") {
            self.subnet_ids = comma_list(&v).map(str::to_owned).collect();
        }
        if let Some(v) = get("security_groups") {
            self.security_groups = comma_list(&v).map(str::to_owned).collect();
        }
        set!(custom_networking, "true or false");
        set!(eni_config_label, "a label key");
        set!(eni_config_annotation, "an annotation key");
        set!(network_profiles, "true or false");
        set!(ip_family, "ipv4, ipv6 or dual");
        set!(ipv4_egress, "true or false");
        set!(warm_policy, "adaptive or fixed");
        set!(min_idle, "a whole number");
        set!(max_idle, "a whole number");
        set!(minimum_ips, "a whole number");
        set!(give_back_delay_secs, "a whole number of seconds");
        set_opt!(max_ips, "a whole number");
        set_opt!(max_enis, "a whole number");
        set!(use_primary_eni, "true or false");
        set!(prefix_delegation, "true or false");
        set!(burst_prefixes, "true or false");
        set!(prefix_reservation_percent, "a whole number of percent");
        set!(reuse_cooldown_secs, "a whole number of seconds");
        set!(ip_stick_time_secs, "a whole number of seconds");
        set!(add_wait_secs, "a whole number of seconds");
        set!(subnet_backoff_secs, "a whole number of seconds");
        set!(ec2_mutating_qps, "a number");
        set!(ec2_mutating_burst, "a whole number");
        set!(ec2_describe_qps, "a number");
        set!(ec2_describe_burst, "a whole number");
        if let Some(v) = get("ec2_api_rates") {
            self.ec2_api_rates = parse_api_rates(&v)?;
        }
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
        if let Some(v) = get("network_policy") {
            self.network_policy = match v.trim() {
                "" | "auto" => None,
                "true" => Some(true),
                "false" => Some(false),
                _ => {
                    return Err(invalid(
                        "network_policy",
                        format!("{v:?} is not true, false or auto"),
                    ));
                }
            };
        }
        if let Some(v) = get("network_policy_log") {
            self.network_policy_log = crate::network_policy::decisions::Logged::parse(&v)
                .map_err(|e| invalid("network_policy_log", e))?;
        }
        set!(network_policy_log_group, "an NFLOG group (0 ..= 65535)");
        set!(network_policy_log_rate, "a whole number");
        set_opt!(network_policy_log_file, "a path");
        set!(network_policy_log_file_max_mb, "a whole number");
        set!(network_policy_log_file_keep, "a whole number");
        set_opt!(api_server_url, "a URL");
        set!(api_server_token_file, "a path");
        set!(api_server_ca_file, "a path");
        set!(api_server_grace_secs, "a whole number of seconds");
        set!(remove_startup_taint, "true or false");
        set!(startup_taint, "a taint key");
        set!(
            startup_taint_effect,
            "a taint effect: NoSchedule, PreferNoSchedule or NoExecute"
        );
        set!(node_condition, "true or false");
        set!(node_condition_heartbeat_secs, "a whole number of seconds");
        set!(node_check_secs, "a whole number of seconds");
        if self.api_server_url.is_none() {
            self.api_server_url = in_cluster_url(env)?;
        }
        set!(external_snat, "true or false");
        if let Some(v) = get("service_cidrs") {
            self.service_cidrs = comma_list(&v)
                .map(|c| parse("service_cidrs", c, "a CIDR like 10.100.0.0/16"))
                .collect::<Result<_, _>>()?;
        }
        if let Some(v) = get("snat_exclude_cidrs") {
            self.snat_exclude_cidrs = comma_list(&v)
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
