//! [`RulesKeeper`]: keeps the node's SNAT and NodePort rules ([`super::rules`]) in step with the
//! configuration and the primary interface, re-reading the VPC's CIDRs from IMDS, and heals drift.
//!
//! Each round:
//! 1. every `imds_refresh` (and on the first round), reads eth0's MAC, primary IP and
//!    `vpc-ipv4-cidr-blocks` from IMDS; when that fails later on, the last good facts stay in use
//!    (a flaky IMDS never removes rules);
//! 2. finds the primary interface's name by its MAC;
//! 3. renders the wanted table; when it differs from what was last loaded (a new VPC CIDR, a
//!    renamed interface, the first round), loads it in one transaction; otherwise lists the kernel's
//!    table and, when the listing differs from the one read back after the last load (a rule
//!    deleted or added by hand, the table flushed), loads it again;
//! 4. keeps the `fwmark` rule and the primary interface's loose `rp_filter`. A `rp_filter` that
//!    cannot be written (a container whose `/proc/sys` is read-only) is a warning, not a failure:
//!    pods still get addresses; SNATed and NodePort traffic of pods on secondary ENIs suffers until
//!    the host sets it (the DaemonSet's init container does, `eniipamd --prepare-host`).
//!
//! The first round after a start always loads (no listing is known yet); the transaction is atomic,
//! so over a daemon restart pods see the same rules all along. Rules are **not** removed when the
//! daemon stops: a restart, a crash or a rolling update must not cut pod egress or NodePort replies,
//! and the rules stay right without the daemon (they change only with the VPC's CIDRs or the primary
//! IP). They go when the configuration turns them off (at the next start) or with
//! `eniipamd --uninstall-host-rules` when eniipam is removed from the node.

use std::sync::Arc;
use std::time::Duration;

use ipnet::Ipv4Net;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::netfilter::Table;
use super::rules::{HostRules, HostRulesConfig, PrimaryInterface, RulesError, desired_table};

/// What the keeper reads of the node's primary interface. The daemon answers from IMDS (its
/// `daemon::host::ImdsPrimary`); a trait of this crate, so the node's datapath needs no cloud crate.
#[async_trait::async_trait]
pub trait PrimaryFacts: Send + Sync + 'static {
    /// The primary interface's MAC.
    async fn primary_mac(&self) -> Result<String, String>;
    /// The interface with `mac`: its IPv4 addresses (its primary first) and its VPC's IPv4 CIDRs;
    /// `None` when it is not (yet) listed.
    async fn interface(&self, mac: &str) -> Result<Option<InterfaceFacts>, String>;
}

/// One interface as [`PrimaryFacts::interface`] lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InterfaceFacts {
    /// Its IPv4 addresses, the primary first.
    pub ips: Vec<std::net::Ipv4Addr>,
    /// Its VPC's IPv4 CIDRs.
    pub vpc_cidrs: Vec<Ipv4Net>,
}

/// What happened to the table in one round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TableChange {
    /// Nothing to do: the kernel's table is the one last loaded (or absent, as wanted).
    Unchanged,
    /// Loaded for the first time by this keeper; the kernel already held exactly this table
    /// (a restart).
    Kept,
    /// Loaded for the first time by this keeper (it was absent or different).
    Installed,
    /// Loaded again because what is wanted changed (VPC CIDRs, primary IP, interface name).
    Updated,
    /// Loaded again because the kernel's table drifted from what was loaded.
    Repaired,
    /// Removed because nothing is wanted any more.
    Removed,
}

/// What one [`RulesKeeper::sync`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RulesReport {
    pub table: TableChange,
    /// The `fwmark` rule was added or removed.
    pub fwmark_rule_changed: bool,
    /// The primary interface's `rp_filter` went from strict to loose.
    pub rp_filter_loosened: bool,
    /// Why it could not be read or loosened, if so.
    pub rp_filter_error: Option<String>,
    /// The facts the round used.
    pub primary: PrimaryInterface,
}

/// What was last loaded, and how the kernel listed it right after.
#[derive(Debug)]
struct Loaded {
    table: Option<Table>,
    listing: Option<String>,
}

/// Keeps the node's rules. See the module docs.
pub struct RulesKeeper {
    config: HostRulesConfig,
    rules: HostRules,
    metadata: Arc<dyn PrimaryFacts>,
    imds_refresh: Duration,
    primary_mac: Option<String>,
    /// The last good IMDS facts: primary IP and VPC CIDRs.
    facts: Option<(std::net::Ipv4Addr, Vec<Ipv4Net>)>,
    /// When IMDS is read next (at once when a read failed).
    next_read: Option<Instant>,
    loaded: Option<Loaded>,
    /// The last `rp_filter` error logged as a warning (repeats go to debug).
    rp_filter_warned: Option<String>,
}

impl std::fmt::Debug for RulesKeeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RulesKeeper")
            .field("config", &self.config)
            .field("primary_mac", &self.primary_mac)
            .field("loaded", &self.loaded)
            .finish_non_exhaustive()
    }
}

impl RulesKeeper {
    /// A keeper that has loaded nothing yet; IMDS is re-read every `imds_refresh` (the VPC CNI:
    /// 30 s).
    pub fn new(
        config: HostRulesConfig,
        rules: HostRules,
        metadata: Arc<dyn PrimaryFacts>,
        imds_refresh: Duration,
    ) -> Self {
        Self {
            config,
            rules,
            metadata,
            imds_refresh,
            primary_mac: None,
            facts: None,
            next_read: None,
            loaded: None,
            rp_filter_warned: None,
        }
    }

    /// The configuration it keeps.
    pub fn config(&self) -> &HostRulesConfig {
        &self.config
    }

    /// Reads IMDS when due; keeps the last good facts when that fails after a first success.
    async fn facts(&mut self) -> Result<(String, std::net::Ipv4Addr, Vec<Ipv4Net>), RulesError> {
        let now = Instant::now();
        if self.facts.is_none() || self.next_read.is_none_or(|at| now >= at) {
            match self.read_imds().await {
                Ok((mac, ip, cidrs)) => {
                    if let Some((old_ip, old_cidrs)) = &self.facts
                        && (*old_ip != ip || *old_cidrs != cidrs)
                    {
                        tracing::info!(primary_ip = %ip, vpc_cidrs = ?cidrs, "the primary interface's facts changed");
                    }
                    self.primary_mac = Some(mac);
                    self.facts = Some((ip, cidrs));
                    self.next_read = Some(now + self.imds_refresh);
                }
                Err(e) if self.facts.is_some() => {
                    tracing::warn!(error = %e, "re-reading the VPC CIDRs from IMDS failed; keeping the last ones");
                    // Try again at the next round, not a whole period later.
                    self.next_read = None;
                }
                Err(e) => return Err(e),
            }
        }
        let (ip, cidrs) = self.facts.clone().expect("facts were read");
        let mac = self
            .primary_mac
            .clone()
            .expect("the MAC was read with the facts");
        Ok((mac, ip, cidrs))
    }

    async fn read_imds(&self) -> Result<(String, std::net::Ipv4Addr, Vec<Ipv4Net>), RulesError> {
        let mac = match &self.primary_mac {
            Some(m) => m.clone(),
            None => self
                .metadata
                .primary_mac()
                .await
                .map_err(RulesError::Metadata)?,
        };
        let eni = self
            .metadata
            .interface(&mac)
            .await
            .map_err(RulesError::Metadata)?
            .ok_or_else(|| {
                RulesError::Metadata(format!("IMDS does not list the primary interface {mac}"))
            })?;
        let ip = *eni.ips.first().ok_or_else(|| {
            RulesError::Metadata(format!(
                "IMDS lists no local-ipv4s for the primary interface {mac}"
            ))
        })?;
        if eni.vpc_cidrs.is_empty() {
            // SNAT with no VPC CIDR would translate traffic to other pods and nodes too.
            return Err(RulesError::Metadata(format!(
                "IMDS lists no vpc-ipv4-cidr-blocks for the primary interface {mac}"
            )));
        }
        let mut cidrs: Vec<Ipv4Net> = eni.vpc_cidrs.iter().map(|c| c.trunc()).collect();
        cidrs.sort();
        cidrs.dedup();
        Ok((mac, ip, cidrs))
    }

    /// One round (see the module docs).
    pub async fn sync(&mut self) -> Result<RulesReport, RulesError> {
        let (mac, primary_ip, vpc_cidrs) = self.facts().await?;
        let link = self.rules.primary_link(&mac).await?;
        let primary = PrimaryInterface {
            ifname: link.name.clone(),
            primary_ip,
            vpc_cidrs,
        };
        let wanted = desired_table(&self.config, &primary);
        let change = match &self.loaded {
            None => {
                let before = self.rules.listing().await?;
                let after = self.rules.load(wanted.as_ref()).await?;
                let change = match (&wanted, before == after) {
                    (Some(_), true) => TableChange::Kept,
                    (Some(_), false) => TableChange::Installed,
                    (None, true) => TableChange::Unchanged,
                    (None, false) => TableChange::Removed,
                };
                self.loaded = Some(Loaded {
                    table: wanted,
                    listing: after,
                });
                change
            }
            Some(loaded) if loaded.table != wanted => {
                let listing = self.rules.load(wanted.as_ref()).await?;
                let change = if wanted.is_some() {
                    TableChange::Updated
                } else {
                    TableChange::Removed
                };
                self.loaded = Some(Loaded {
                    table: wanted,
                    listing,
                });
                change
            }
            Some(loaded) => {
                let now = self.rules.listing().await?;
                if now == loaded.listing {
                    TableChange::Unchanged
                } else {
                    tracing::warn!(
                        table = super::rules::TABLE,
                        expected = ?loaded.listing, found = ?now,
                        "the host's netfilter rules drifted; loading them again"
                    );
                    let listing = self.rules.load(wanted.as_ref()).await?;
                    self.loaded = Some(Loaded {
                        table: wanted,
                        listing,
                    });
                    TableChange::Repaired
                }
            }
        };
        let wants = self.config.wants_rules();
        let fwmark_rule_changed = self
            .rules
            .ensure_fwmark_rule(self.config.connmark, wants)
            .await?;
        let (rp_filter_loosened, rp_filter_error) = match self.config.needs_loose_rp_filter() {
            false => (false, None),
            true => match self.rules.loosen_rp_filter(&primary.ifname) {
                Ok(changed) => {
                    self.rp_filter_warned = None;
                    (changed, None)
                }
                Err(e) => (false, Some(e.to_string())),
            },
        };
        let report = RulesReport {
            table: change,
            fwmark_rule_changed,
            rp_filter_loosened,
            rp_filter_error,
            primary,
        };
        self.log(&report);
        Ok(report)
    }

    fn log(&mut self, r: &RulesReport) {
        let p = &r.primary;
        match r.table {
            TableChange::Installed | TableChange::Kept | TableChange::Updated => tracing::info!(
                change = ?r.table, primary_if = %p.ifname, primary_ip = %p.primary_ip,
                vpc_cidrs = ?p.vpc_cidrs, snat = self.config.snat.is_on(),
                node_port_support = self.config.node_port_support,
                connmark = format!("{:#x}", self.config.connmark),
                "host netfilter rules in place (nft table ip {})", super::rules::TABLE
            ),
            TableChange::Removed => tracing::info!(
                "host netfilter rules removed: SNAT and NodePort support are both off"
            ),
            TableChange::Repaired | TableChange::Unchanged => {}
        }
        if r.fwmark_rule_changed {
            tracing::info!(
                rule = %super::nodeport::fwmark_rule(self.config.connmark),
                present = self.config.wants_rules(),
                "fwmark policy rule changed"
            );
        }
        if let Some(e) = &r.rp_filter_error {
            if self.rp_filter_warned.as_ref() != Some(e) {
                tracing::warn!(
                    interface = %p.ifname, error = %e,
                    "cannot set the primary interface's rp_filter to 2 (loose): SNATed and NodePort replies to \
                     pods on secondary ENIs are dropped while it is 1; run `eniipamd --prepare-host` as a \
                     privileged init container (the DaemonSet does) or set net.ipv4.conf.{}.rp_filter=2 on the host",
                    p.ifname
                );
                self.rp_filter_warned = Some(e.clone());
            } else {
                tracing::debug!(interface = %p.ifname, error = %e, "rp_filter still not writable");
            }
        }
        if r.rp_filter_loosened {
            tracing::info!(interface = %p.ifname, "rp_filter of the primary interface set to 2 (loose)");
        }
    }

    /// Runs [`Self::sync`] every `period` until `cancel`; failures are logged and retried next round.
    pub fn spawn(
        mut self,
        period: Duration,
        cancel: CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            // The first tick fires at once: the daemon ran the first round already.
            tick.tick().await;
            loop {
                tokio::select! {
                    _ = cancel.cancelled() => break,
                    _ = tick.tick() => {}
                }
                if let Err(e) = self.sync().await {
                    tracing::warn!(error = %e, "keeping the host's netfilter rules failed; trying again next round");
                }
            }
        })
    }
}
