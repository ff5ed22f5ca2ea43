//! Validation: every knob checked, the error names the knob and the allowed range.

use super::{ConfigError, DaemonConfig, invalid};
use crate::cloud::limiter::EC2_APIS;

/// `knob` with `ip_family = dual` (issue 44): every pod's IPv6 comes from eth0's /80, so `what`
/// would not apply to a pod's IPv6 (eth0's groups would): refused rather than bypassed.
fn dual_stack_refused(knob: &str, what: &str) -> ConfigError {
    invalid(
        knob,
        format!(
            "true with ip_family = dual, which eniipam refuses: every pod's IPv6 comes from eth0's /80, \
             so {what} would not apply to its IPv6 (eth0's would); use ip_family = ipv4 with {knob}, \
             or turn {knob} off for dual stack"
        ),
    )
}

impl DaemonConfig {
    /// Checks every knob; the error names the knob and the allowed range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.cluster_name.len() > 128 || self.cluster_name.contains(char::is_whitespace) {
            return Err(invalid("cluster_name", "at most 128 characters, no spaces"));
        }
        if self.ip_family == crate::ipv6::IpFamily::Ipv6 && self.prefix_delegation {
            return Err(invalid(
                "prefix_delegation",
                "applies to the IPv4 pool, and with ip_family = ipv6 pods take no IPv4: turn it off, or use \
                 ip_family = dual",
            ));
        }
        self.validate_prefix_reservation()?;
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
        if self.add_wait_secs > 600 {
            return Err(invalid(
                "add_wait_secs",
                format!(
                    "{} is above 600 (allowed: 0 ..= 600; the kubelet gives the whole sandbox 120 s by default)",
                    self.add_wait_secs
                ),
            ));
        }
        if !(1..=3600).contains(&self.subnet_backoff_secs) {
            return Err(invalid("subnet_backoff_secs", "allowed: 1 ..= 3600"));
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
        for (api, rate) in &self.ec2_api_rates {
            let knob = format!("ec2_api_rates.{api}");
            if !EC2_APIS.contains(&api.as_str()) {
                return Err(invalid(
                    &knob,
                    format!(
                        "not an EC2 API eniipam calls (known: {})",
                        EC2_APIS.join(", ")
                    ),
                ));
            }
            if !(rate.qps > 0.0 && rate.qps <= 100.0) {
                return Err(invalid(
                    &knob,
                    format!("qps {} is outside (0, 100]", rate.qps),
                ));
            }
            if !(1..=1000).contains(&rate.burst) {
                return Err(invalid(
                    &knob,
                    format!("burst {} is outside 1 ..= 1000", rate.burst),
                ));
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
        self.validate_node_status()?;
        self.validate_custom_networking()?;
        self.validate_network_profiles()?;
        self.validate_network_policy()?;
        self.validate_decision_log()?;
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

    fn validate_custom_networking(&self) -> Result<(), ConfigError> {
        use crate::reconcile::api_server::node::check_taint_key as check_key;
        if let Err(problem) = check_key(&self.eni_config_label) {
            return Err(invalid(
                "eni_config_label",
                problem.replace("taint key", "label key"),
            ));
        }
        if let Err(problem) = check_key(&self.eni_config_annotation) {
            return Err(invalid(
                "eni_config_annotation",
                problem.replace("taint key", "annotation key"),
            ));
        }
        if !self.custom_networking {
            return Ok(());
        }
        if self.ip_family == crate::ipv6::IpFamily::Ipv6 {
            return Err(invalid(
                "custom_networking",
                "applies to the IPv4 pool's ENIs, and with ip_family = ipv6 pods take no IPv4 (their \
                 IPv6 comes from eth0's /80): turn it off, or use ip_family = ipv4",
            ));
        }
        if self.ip_family == crate::ipv6::IpFamily::Dual {
            return Err(dual_stack_refused(
                "custom_networking",
                "the ENIConfig's subnet and security groups",
            ));
        }
        if !self.subnet_ids.is_empty() {
            return Err(invalid(
                "subnet_ids",
                "set together with custom_networking: the node's ENIConfig chooses the subnet of new \
                 ENIs, so leave subnet_ids empty (or turn custom_networking off)",
            ));
        }
        if self.api_server_url.is_none() {
            return Err(invalid(
                "custom_networking",
                "true, but no API server is known to read the node's ENIConfig from: not running in a \
                 pod (KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are unset) and \
                 api_server_url is unset",
            ));
        }
        if self.node_name.is_empty() {
            return Err(invalid(
                "node_name",
                "empty, but custom_networking is on: set ENIIPAM_NODE_NAME to this node's Kubernetes \
                 name (the DaemonSet sets it from the downward API, fieldRef spec.nodeName); its label \
                 or annotation names the ENIConfig",
            ));
        }
        Ok(())
    }

    fn validate_network_profiles(&self) -> Result<(), ConfigError> {
        if !self.network_profiles {
            return Ok(());
        }
        if self.ip_family == crate::ipv6::IpFamily::Ipv6 {
            return Err(invalid(
                "network_profiles",
                "put pods on ENIs of the IPv4 pool, and with ip_family = ipv6 pods take no IPv4 \
                 (their IPv6 comes from eth0's /80): turn it off, or use ip_family = ipv4",
            ));
        }
        if self.ip_family == crate::ipv6::IpFamily::Dual {
            return Err(dual_stack_refused(
                "network_profiles",
                "a profile's security groups",
            ));
        }
        if self.api_server_url.is_none() {
            return Err(invalid(
                "network_profiles",
                "true, but no API server is known to read the NetworkProfiles and the pods' \
                 annotations from: not running in a pod (KUBERNETES_SERVICE_HOST and \
                 KUBERNETES_SERVICE_PORT are unset) and api_server_url is unset",
            ));
        }
        if self.node_name.is_empty() {
            return Err(invalid(
                "node_name",
                "empty, but network_profiles is on: set ENIIPAM_NODE_NAME to this node's Kubernetes \
                 name (the DaemonSet sets it from the downward API, fieldRef spec.nodeName); the \
                 node advertises each profile's total slots on itself",
            ));
        }
        if let Some(cap) = self.max_ips {
            return Err(invalid(
                "max_ips",
                format!(
                    "{cap}, but network_profiles is on: each profile's advertised total is the room \
                     of its ENIs and spare device index, which holds only while the node's capacity \
                     is what its ENIs hold; a lower cap would let the default network take tokens \
                     a profile's total promised. Unset max_ips (cap pods with the kubelet's \
                     max-pods and each profile's maxEnisPerNode instead)"
                ),
            ));
        }
        Ok(())
    }

    fn validate_network_policy(&self) -> Result<(), ConfigError> {
        if self.network_policy != Some(true) {
            return Ok(());
        }
        if !self.manage_eni_routes {
            return Err(invalid(
                "network_policy",
                "true, but manage_eni_routes is false: the daemon does not own the host's rules, \
                 so it cannot put the policy table in the kernel; turn manage_eni_routes on, or set \
                 network_policy = false",
            ));
        }
        if self.api_server_url.is_none() {
            return Err(invalid(
                "network_policy",
                "true, but no API server is known to read NetworkPolicies, pods and namespaces \
                 from: not running in a pod (KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT \
                 are unset) and api_server_url is unset",
            ));
        }
        Ok(())
    }

    fn validate_node_status(&self) -> Result<(), ConfigError> {
        if let Err(problem) =
            crate::reconcile::api_server::node::check_taint_key(&self.startup_taint)
        {
            return Err(invalid("startup_taint", problem));
        }
        if self.remove_startup_taint && self.api_server_url.is_none() {
            return Err(invalid(
                "remove_startup_taint",
                "true, but no API server is known: not running in a pod (KUBERNETES_SERVICE_HOST \
                 and KUBERNETES_SERVICE_PORT are unset) and api_server_url is unset",
            ));
        }
        if self.remove_startup_taint && self.node_name.is_empty() {
            return Err(invalid(
                "node_name",
                "empty, but remove_startup_taint is on: set ENIIPAM_NODE_NAME to this node's \
                 Kubernetes name (the DaemonSet sets it from the downward API, fieldRef spec.nodeName)",
            ));
        }
        if !(60..=3600).contains(&self.node_condition_heartbeat_secs) {
            return Err(invalid(
                "node_condition_heartbeat_secs",
                "allowed: 60 ..= 3600",
            ));
        }
        if !(1..=300).contains(&self.node_check_secs) {
            return Err(invalid("node_check_secs", "allowed: 1 ..= 300"));
        }
        Ok(())
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
        if self.service_cidrs.len() > 16 {
            return Err(invalid("service_cidrs", "allowed: at most 16 CIDRs"));
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
}

impl DaemonConfig {
    /// `prefix_reservation_percent`: at most a quarter of the subnet (the block is a power of two
    /// clear of the subnet's first and last blocks, which hold the addresses AWS reserves, so it
    /// cannot be more than a quarter), and only where pods take IPv4.
    fn validate_prefix_reservation(&self) -> Result<(), ConfigError> {
        let p = self.prefix_reservation_percent;
        if p > 25 {
            return Err(invalid(
                "prefix_reservation_percent",
                format!(
                    "{p} is above 25 (allowed: 0 = off, or 1 ..= 25: the reserved block is a \
                     power of two clear of the subnet's first and last blocks, at most a quarter)"
                ),
            ));
        }
        if p > 0 && self.ip_family == crate::ipv6::IpFamily::Ipv6 {
            return Err(invalid(
                "prefix_reservation_percent",
                format!(
                    "{p} keeps IPv4 blocks for prefixes, and with ip_family = ipv6 pods take no \
                     IPv4: set it to 0, or use ip_family = dual"
                ),
            ));
        }
        Ok(())
    }

    /// The decision log's knobs (`network_policy_log*`).
    fn validate_decision_log(&self) -> Result<(), ConfigError> {
        if !(1..=10_000).contains(&self.network_policy_log_rate) {
            return Err(invalid(
                "network_policy_log_rate",
                format!(
                    "{} is not in 1 ..= 10000 (turn logging off with network_policy_log = off)",
                    self.network_policy_log_rate
                ),
            ));
        }
        if !(1..=10_240).contains(&self.network_policy_log_file_max_mb) {
            return Err(invalid(
                "network_policy_log_file_max_mb",
                format!(
                    "{} is not in 1 ..= 10240",
                    self.network_policy_log_file_max_mb
                ),
            ));
        }
        if self.network_policy_log_file_keep > 100 {
            return Err(invalid(
                "network_policy_log_file_keep",
                format!("{} is not in 0 ..= 100", self.network_policy_log_file_keep),
            ));
        }
        if let Some(p) = &self.network_policy_log_file
            && (p.as_os_str().is_empty() || p.is_dir())
        {
            return Err(invalid(
                "network_policy_log_file",
                format!("{} is not a file path", p.display()),
            ));
        }
        Ok(())
    }
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
