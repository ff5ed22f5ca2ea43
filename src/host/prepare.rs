//! What the node needs before (and after) the daemon: `eniipamd --prepare-host` loosens the primary
//! interface's `rp_filter` (a privileged init container: the daemon's own container sees `/proc/sys`
//! read-only), `eniipamd --uninstall-host-rules` removes the rules the daemon keeps.

use super::netfilter::Nft;
use super::nodeport;
use super::rules::{HostRules, RulesError, Uninstalled};

/// Why the primary interface could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    /// Finding the primary interface (netlink) failed.
    #[error(transparent)]
    Rules(#[from] RulesError),
    /// Writing its `rp_filter` failed.
    #[error("setting {ifname}'s rp_filter")]
    RpFilter {
        ifname: String,
        #[source]
        source: std::io::Error,
    },
}

/// The primary interface as prepared: its name, and whether its `rp_filter` was changed (it was 1,
/// strict, and is 2, loose, now) or left as it was (not strict).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prepared {
    pub ifname: String,
    pub changed: bool,
}

/// Gives the primary interface (the link with eth0's MAC, `mac`) a loose `rp_filter` (2) when it is
/// strict (1), so the SNATed replies of pods on secondary ENIs and their NodePort and load-balancer
/// traffic are not dropped.
pub async fn loosen_primary_rp_filter(mac: &str) -> Result<Prepared, PrepareError> {
    let rules = HostRules::new(Nft::default())?;
    let link = rules.primary_link(mac).await?;
    let changed =
        nodeport::loosen_rp_filter(&link.name).map_err(|source| PrepareError::RpFilter {
            ifname: link.name.clone(),
            source,
        })?;
    Ok(Prepared {
        ifname: link.name,
        changed,
    })
}

/// Removes the host rules the daemon keeps (the nftables table `ip eniipam`, the `fwmark` policy
/// rule of `connmark`). A stopping daemon leaves them in place so pod egress and NodePort replies
/// survive restarts: this is for a node eniipam is being removed from.
pub async fn uninstall_host_rules(connmark: u32) -> Result<Uninstalled, RulesError> {
    HostRules::new(Nft::default())?.uninstall(connmark).await
}
