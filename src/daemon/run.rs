//! The modes of `eniipamd` besides `--simulate` (which is [`crate::simulate`]'s): serve this node
//! until SIGTERM or Ctrl-C ([`serve`]), prepare the host's kernel settings ([`prepare_host`], the
//! DaemonSet's init container) and remove the host rules ([`uninstall_host_rules`]). Each returns a
//! typed [`ModeError`]; the binary turns it into an exit code ([`ModeError::is_config`]: fix the
//! configuration, restarting won't help).

use std::path::Path;

use super::{CloudClients, Daemon, DaemonError};
use crate::cloud::CloudError;
use crate::config::{ConfigError, DaemonConfig, Env};
use crate::host::prepare::{self, Ipv6Forwarding, PrepareError, Prepared};
use crate::host::{RulesError, TABLE};

/// Why a mode of `eniipamd` failed.
#[derive(Debug, thiserror::Error)]
pub enum ModeError {
    /// The configuration (file, `ENIIPAM_*` variables) is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// No cluster name: a real node needs one.
    #[error(
        "cluster_name is empty: set ENIIPAM_CLUSTER_NAME (in the DaemonSet: the ENIIPAM_CLUSTER_NAME key of \
         the eniipam-config ConfigMap, deploy/configmap.yaml) or `cluster_name` in the config file. It tags \
         the ENIs eniipam creates, the IAM policy is scoped to it, and the leaked-ENI collector uses it \
         (use --simulate to try eniipam without a cluster)"
    )]
    NoClusterName,
    /// The configuration does not fit this node ([`DaemonError::Config`]).
    #[error(transparent)]
    Unfit(DaemonError),
    /// Starting the daemon failed (EC2 or IMDS unreachable, state file, socket in use...).
    #[error("eniipamd failed to start")]
    Start(#[source] DaemonError),
    /// The signal handlers could not be set up.
    #[error("cannot listen for {0}")]
    Signal(&'static str, #[source] std::io::Error),
    /// `--prepare-host` failed.
    #[error("preparing the host")]
    Prepare(#[source] PrepareStep),
    /// `--uninstall-host-rules` failed.
    #[error("removing the host rules")]
    Uninstall(#[source] RulesError),
}

impl ModeError {
    /// Whether the configuration is to blame (exit 78): restarting won't help until it is fixed.
    pub fn is_config(&self) -> bool {
        matches!(self, Self::Config(_) | Self::NoClusterName | Self::Unfit(_))
    }
}

/// The step of `--prepare-host` that failed.
#[derive(Debug, thiserror::Error)]
pub enum PrepareStep {
    #[error("building the IMDS client")]
    Clients(#[source] DaemonError),
    #[error("reading eth0's MAC from IMDS")]
    Identity(#[source] CloudError),
    #[error(transparent)]
    Host(#[from] PrepareError),
}

/// `eniipamd` on a real node: the configuration from `file` and `env`, logging set up, the daemon
/// started, served until SIGTERM or Ctrl-C, then shut down.
pub async fn serve(file: Option<&Path>, env: &dyn Env) -> Result<(), ModeError> {
    let config = DaemonConfig::load(file, env)?;
    if config.cluster_name.is_empty() {
        return Err(ModeError::NoClusterName);
    }
    crate::telemetry::init_logging(config.log_format, &config.log_level);
    let daemon = Daemon::start(config).await.map_err(|e| match e {
        e @ DaemonError::Config(_) => ModeError::Unfit(e),
        e => ModeError::Start(e),
    })?;
    let signal = wait_for_signal().await;
    daemon.shutdown().await;
    signal
}

/// Waits for SIGTERM or Ctrl-C.
pub async fn wait_for_signal() -> Result<(), ModeError> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).map_err(|e| ModeError::Signal("SIGTERM", e))?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r.map_err(|e| ModeError::Signal("Ctrl-C", e))?,
        _ = term.recv() => {}
    }
    tracing::info!("shutting down");
    Ok(())
}

/// What `--prepare-host` did: the primary interface's `rp_filter` (when the configuration needs a
/// loose one) and IPv6 forwarding (with `ip_family` ipv6 or dual).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostPrepared {
    pub rp_filter: Option<Prepared>,
    pub ipv6: Option<Ipv6Forwarding>,
    /// `ip_family = ipv6` with `ipv4_egress`: whether `net.ipv4.ip_forward` was turned on.
    pub ipv4_forwarding: Option<bool>,
}

impl std::fmt::Display for HostPrepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.rp_filter {
            None => f.write_str(
                "rp_filter left as it is (manage_eni_routes is off, or external_snat is on and \
                 node_port_support off)",
            )?,
            Some(p) => write!(
                f,
                "{} (primary interface): rp_filter {}",
                p.ifname,
                if p.changed {
                    "set to 2 (loose)"
                } else {
                    "already not strict, left as it is"
                }
            )?,
        }
        if let Some(v6) = &self.ipv6 {
            write!(
                f,
                "; IPv6 forwarding {}, {}'s accept_ra {}",
                if v6.forwarding_changed {
                    "turned on"
                } else {
                    "already on"
                },
                v6.ifname,
                if v6.accept_ra_changed {
                    "set to 2"
                } else {
                    "already 2"
                }
            )?;
        }
        if let Some(changed) = self.ipv4_forwarding {
            write!(
                f,
                "; IPv4 forwarding (IPv6-only pods' IPv4 egress) {}",
                if changed { "turned on" } else { "already on" }
            )?;
        }
        Ok(())
    }
}

/// `--prepare-host`: the primary interface (found by eth0's MAC from IMDS) gets `rp_filter` 2
/// (loose) when it is 1 (strict), when the configuration needs it. SNAT needs a loose rp_filter as
/// much as NodePort support does (issue 23): see `HostRulesConfig::needs_loose_rp_filter`. With
/// `ip_family` ipv6 or dual, IPv6 forwarding goes on, keeping the primary interface's router
/// advertisements ([`prepare::enable_ipv6_forwarding`]); with `ip_family` ipv6 and `ipv4_egress`,
/// IPv4 forwarding goes on too ([`prepare::enable_ipv4_forwarding`]).
pub async fn prepare_host(file: Option<&Path>, env: &dyn Env) -> Result<HostPrepared, ModeError> {
    let config = DaemonConfig::load(file, env)?;
    let rp = config.manage_eni_routes && config.host_rules_config().needs_loose_rp_filter();
    let v6 = config.ip_family.has_ipv6();
    if !rp && !v6 {
        return Ok(HostPrepared::default());
    }
    let step = async {
        let clients = CloudClients::from_config(&config, None)
            .await
            .map_err(PrepareStep::Clients)?;
        let mac = clients
            .metadata
            .identity()
            .await
            .map_err(PrepareStep::Identity)?
            .mac;
        let mut done = HostPrepared::default();
        if rp {
            done.rp_filter = Some(prepare::loosen_primary_rp_filter(&mac).await?);
        }
        if v6 {
            let ifname = prepare::primary_ifname(&mac).await?;
            done.ipv6 = Some(prepare::enable_ipv6_forwarding(
                Path::new("/proc/sys"),
                &ifname,
            )?);
        }
        if config.host_rules_config().ipv4_egress.is_some() {
            done.ipv4_forwarding = Some(prepare::enable_ipv4_forwarding(Path::new("/proc/sys"))?);
        }
        Ok::<_, PrepareStep>(done)
    };
    step.await.map_err(ModeError::Prepare)
}

/// What `--uninstall-host-rules` removed: the host rules, and whether the NetworkPolicy table
/// `inet eniipam_policy` was there and is gone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostRulesRemoved(pub crate::host::rules::Uninstalled, pub bool);

impl std::fmt::Display for HostRulesRemoved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let gone = |b: bool| if b { "deleted" } else { "absent" };
        write!(
            f,
            "host rules removed (nftables table ip {TABLE}: {}; table inet {}: {}; fwmark rules: {})",
            gone(self.0.table),
            crate::network_policy::nft::TABLE,
            gone(self.1),
            self.0.fwmark_rules
        )
    }
}

/// `--uninstall-host-rules`: removes the nftables tables `ip eniipam` and `inet eniipam_policy`
/// and the `fwmark` rule of the configured `connmark`.
pub async fn uninstall_host_rules(
    file: Option<&Path>,
    env: &dyn Env,
) -> Result<HostRulesRemoved, ModeError> {
    let config = DaemonConfig::load(file, env)?;
    let policy = crate::network_policy::enforce::Engine::new(crate::host::Nft::default())
        .remove()
        .await
        .map_err(|e| ModeError::Uninstall(e.into()))?;
    prepare::uninstall_host_rules(config.connmark)
        .await
        .map(|removed| HostRulesRemoved(removed, policy))
        .map_err(ModeError::Uninstall)
}
