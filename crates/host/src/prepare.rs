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
    /// Writing an IPv6 sysctl failed (the interface name is not one).
    #[error("setting {path}")]
    Ipv6Sysctl {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// Reading or writing a forwarding sysctl failed.
    #[error("setting {path}")]
    Sysctl {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// Writes `want` to `sys/rel` unless it holds it already; returns whether it wrote.
fn set_sysctl(sys: &std::path::Path, rel: &str, want: &str) -> Result<bool, PrepareError> {
    let path = sys.join(rel);
    let err = |source| PrepareError::Sysctl {
        path: path.display().to_string(),
        source,
    };
    let now = std::fs::read_to_string(&path).map_err(err)?;
    if now.trim() == want {
        return Ok(false);
    }
    std::fs::write(&path, want).map_err(err)?;
    Ok(true)
}

/// IPv6-only pods' IPv4 egress (`ipv4_egress`) is forwarded from their veths to the primary
/// interface, so the node needs `net.ipv4.ip_forward = 1`. EKS AMIs set it for kube-proxy already;
/// an IPv6 node built otherwise may not. Returns whether it changed it.
pub fn enable_ipv4_forwarding(sys: &std::path::Path) -> Result<bool, PrepareError> {
    set_sysctl(sys, "net/ipv4/ip_forward", "1")
}

/// What [`enable_ipv6_forwarding`] changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ipv6Forwarding {
    pub ifname: String,
    /// The primary interface's `accept_ra` was set to 2 (it was not).
    pub accept_ra_changed: bool,
    /// `net.ipv6.conf.all.forwarding` was set to 1 (it was not).
    pub forwarding_changed: bool,
}

/// IPv6 pods (ip_family ipv6 or dual) need the node to forward IPv6 between the pods' veths and the
/// primary interface: `net.ipv6.conf.all.forwarding = 1`. A forwarding interface ignores router
/// advertisements unless its `accept_ra` is 2, and on EC2 the node's own IPv6 default route comes
/// from the VPC router's advertisements on the primary interface: so `accept_ra = 2` there first, then
/// forwarding on (the order the VPC CNI's init container uses too). `sys` is `/proc/sys` (a test gives
/// a directory of its own). Changes only what differs; returns what it changed.
pub fn enable_ipv6_forwarding(
    sys: &std::path::Path,
    ifname: &str,
) -> Result<Ipv6Forwarding, PrepareError> {
    if ifname.is_empty() || ifname == "." || ifname == ".." || ifname.contains('/') {
        return Err(PrepareError::Ipv6Sysctl {
            path: format!("net/ipv6/conf/{ifname}/accept_ra"),
            source: std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{ifname:?} is not an interface name"),
            ),
        });
    }
    let set = |rel: String, want: &str| set_sysctl(sys, &rel, want);
    let accept_ra_changed = set(format!("net/ipv6/conf/{ifname}/accept_ra"), "2")?;
    let forwarding_changed = set("net/ipv6/conf/all/forwarding".to_owned(), "1")?;
    Ok(Ipv6Forwarding {
        ifname: ifname.to_owned(),
        accept_ra_changed,
        forwarding_changed,
    })
}

/// The primary interface's name: the link with eth0's MAC.
pub async fn primary_ifname(mac: &str) -> Result<String, PrepareError> {
    Ok(HostRules::new(Nft::default())?
        .primary_link(mac)
        .await?
        .name)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv6_forwarding_keeps_router_advertisements_and_changes_only_what_differs() {
        let sys = std::env::temp_dir().join(format!("eniipam-sys-{}", std::process::id()));
        let eth = sys.join("net/ipv6/conf/ens5");
        let all = sys.join("net/ipv6/conf/all");
        std::fs::create_dir_all(&eth).unwrap();
        std::fs::create_dir_all(&all).unwrap();
        std::fs::write(eth.join("accept_ra"), "1\n").unwrap();
        std::fs::write(all.join("forwarding"), "0\n").unwrap();
        let done = enable_ipv6_forwarding(&sys, "ens5").unwrap();
        assert!(done.accept_ra_changed && done.forwarding_changed);
        assert_eq!(std::fs::read_to_string(eth.join("accept_ra")).unwrap(), "2");
        assert_eq!(
            std::fs::read_to_string(all.join("forwarding")).unwrap(),
            "1"
        );
        let again = enable_ipv6_forwarding(&sys, "ens5").unwrap();
        assert!(!again.accept_ra_changed && !again.forwarding_changed);
        // A name that is not an interface, or one the kernel does not have: an error naming it.
        assert!(
            enable_ipv6_forwarding(&sys, "../x")
                .unwrap_err()
                .to_string()
                .contains("accept_ra")
        );
        let e = enable_ipv6_forwarding(&sys, "ens9").unwrap_err();
        assert!(e.to_string().contains("ens9/accept_ra"), "{e}");
        std::fs::remove_dir_all(&sys).unwrap();
    }

    #[test]
    fn ipv4_forwarding_goes_on_once() {
        let sys = std::env::temp_dir().join(format!("eniipam-sys4-{}", std::process::id()));
        std::fs::create_dir_all(sys.join("net/ipv4")).unwrap();
        std::fs::write(sys.join("net/ipv4/ip_forward"), "0\n").unwrap();
        assert!(enable_ipv4_forwarding(&sys).unwrap());
        assert!(!enable_ipv4_forwarding(&sys).unwrap());
        assert_eq!(
            std::fs::read_to_string(sys.join("net/ipv4/ip_forward")).unwrap(),
            "1"
        );
        std::fs::remove_dir_all(&sys).unwrap();
        let e = enable_ipv4_forwarding(&sys).unwrap_err();
        assert!(e.to_string().contains("net/ipv4/ip_forward"), "{e}");
    }
}
