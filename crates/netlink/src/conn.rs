//! One rtnetlink connection bound to one network namespace.
//!
//! Netlink sockets belong to the namespace they are opened in, so a connection for a pod is opened right
//! after `setns(2)` into the pod's namespace and the thread switches straight back
//! ([`Netlink::in_netns`]). `nix` wraps `setns` safely, so this crate needs no `unsafe`.

use std::fs::File;
use std::io::Write;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::Arc;

use futures::TryStreamExt;
use netlink_packet_route::address::AddressMessage;
use netlink_packet_route::link::LinkMessage;
use netlink_packet_route::route::RouteMessage;
use netlink_packet_route::rule::RuleMessage;
use nix::sched::CloneFlags;
use rtnetlink::{Handle, IpVersion, LinkUnspec, RouteMessageBuilder};

use crate::msg::LinkFacts;
use crate::{Error, is_not_found};

/// An open network namespace (the open file keeps it alive while we work in it).
#[derive(Debug)]
pub struct NetnsFile {
    path: String,
    file: File,
}

impl NetnsFile {
    /// Opens the namespace at `path` (`/run/netns/x`, `/proc/<pid>/ns/net`).
    pub fn open(path: &str) -> Result<Self, Error> {
        let file = File::open(path).map_err(|source| Error::Open {
            path: path.to_owned(),
            source,
        })?;
        Ok(Self {
            path: path.to_owned(),
            file,
        })
    }

    /// The path it was opened from.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The namespace's file descriptor (for `IFLA_NET_NS_FD`: creating a link straight inside it).
    pub fn raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
}

impl AsFd for NetnsFile {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
}

/// Aborts the connection task when the last [`Netlink`] clone goes.
#[derive(Debug)]
struct Connection(tokio::task::JoinHandle<()>);

impl Drop for Connection {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// An rtnetlink connection bound to one network namespace. Cheap to clone; usable from several tasks.
/// Must be created inside a tokio runtime: the connection runs as a task.
#[derive(Clone, Debug)]
pub struct Netlink {
    handle: Handle,
    _connection: Arc<Connection>,
}

impl Netlink {
    /// A connection in the calling thread's current namespace.
    pub fn current() -> Result<Self, Error> {
        Self::spawn("the current namespace")
    }

    fn spawn(path: &str) -> Result<Self, Error> {
        let (conn, handle, _) = rtnetlink::new_connection().map_err(|e| Error::Socket {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
        Ok(Self {
            handle,
            _connection: Arc::new(Connection(tokio::spawn(conn))),
        })
    }

    /// A connection inside `ns`: enter it, open the socket, and return to the original namespace
    /// before anything else runs on this thread.
    pub fn in_netns(ns: &NetnsFile) -> Result<Self, Error> {
        let fail = |reason: String| Error::Socket {
            path: ns.path.clone(),
            reason,
        };
        let original = File::open("/proc/thread-self/ns/net")
            .map_err(|e| fail(format!("opening this thread's netns: {e}")))?;
        nix::sched::setns(&ns.file, CloneFlags::CLONE_NEWNET)
            .map_err(|e| fail(format!("setns: {e}")))?;
        let conn = Self::spawn(&ns.path);
        nix::sched::setns(&original, CloneFlags::CLONE_NEWNET)
            .map_err(|e| fail(format!("returning to the original netns: {e}")))?;
        conn
    }

    /// The rtnetlink handle, for requests this crate does not wrap.
    pub fn handle(&self) -> &Handle {
        &self.handle
    }

    /// The link named `name`, if any.
    pub async fn link(&self, name: &str) -> Result<Option<LinkFacts>, Error> {
        let mut links = self
            .handle
            .link()
            .get()
            .match_name(name.to_owned())
            .execute();
        match links.try_next().await {
            Ok(Some(msg)) => Ok(Some(LinkFacts::of(&msg))),
            Ok(None) => Ok(None),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(Error::request(format!("looking up link {name}"))(e)),
        }
    }

    /// Every link.
    pub async fn links(&self) -> Result<Vec<LinkMessage>, Error> {
        self.handle
            .link()
            .get()
            .execute()
            .try_collect()
            .await
            .map_err(Error::request("listing links"))
    }

    /// The link with `mac` (lower case). Where several links share it (a VLAN or bond on top of a
    /// device), the one without a link kind (the physical device) wins.
    pub async fn link_by_mac(&self, mac: &str) -> Result<Option<LinkFacts>, Error> {
        let links = self.links().await?;
        let matching: Vec<LinkFacts> = links
            .iter()
            .map(LinkFacts::of)
            .filter(|l| l.mac == mac)
            .collect();
        Ok(matching
            .iter()
            .find(|l| l.kind.is_none())
            .or_else(|| matching.first())
            .cloned())
    }

    /// Sets the link up, with `mtu` when given.
    pub async fn set_up(&self, index: u32, name: &str, mtu: Option<u32>) -> Result<(), Error> {
        let mut msg = LinkUnspec::new_with_index(index).up();
        if let Some(mtu) = mtu {
            msg = msg.mtu(mtu);
        }
        self.handle
            .link()
            .set(msg.build())
            .execute()
            .await
            .map_err(Error::request(match mtu {
                Some(mtu) => format!("setting {name} up with mtu {mtu}"),
                None => format!("setting {name} up"),
            }))
    }

    /// Deletes the link (absent is fine).
    pub async fn delete_link(&self, index: u32, name: &str) -> Result<(), Error> {
        match self.handle.link().del(index).execute().await {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(Error::request(format!("deleting link {name}"))(e)),
        }
    }

    /// The addresses on link `index`.
    pub async fn addresses(&self, index: u32) -> Result<Vec<AddressMessage>, Error> {
        self.handle
            .address()
            .get()
            .set_link_index_filter(index)
            .execute()
            .try_collect()
            .await
            .map_err(Error::request(format!(
                "listing the addresses of link #{index}"
            )))
    }

    /// Every IPv4 route, all tables.
    pub async fn routes_v4(&self) -> Result<Vec<RouteMessage>, Error> {
        self.handle
            .route()
            .get(RouteMessageBuilder::<Ipv4Addr>::new().build())
            .execute()
            .try_collect()
            .await
            .map_err(Error::request("listing IPv4 routes"))
    }

    /// Every IPv6 route, all tables.
    pub async fn routes_v6(&self) -> Result<Vec<RouteMessage>, Error> {
        self.handle
            .route()
            .get(RouteMessageBuilder::<Ipv6Addr>::new().build())
            .execute()
            .try_collect()
            .await
            .map_err(Error::request("listing IPv6 routes"))
    }

    /// Adds or replaces a route (`NLM_F_REPLACE`).
    pub async fn replace_route(&self, route: RouteMessage, what: &str) -> Result<(), Error> {
        self.handle
            .route()
            .add(route)
            .replace()
            .execute()
            .await
            .map_err(Error::request(format!("adding route {what}")))
    }

    /// Deletes a route as read back (absent is fine).
    pub async fn delete_route(&self, route: RouteMessage, what: &str) -> Result<(), Error> {
        match self.handle.route().del(route).execute().await {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(Error::request(format!("deleting route {what}"))(e)),
        }
    }

    /// Every IPv4 policy rule.
    pub async fn rules_v4(&self) -> Result<Vec<RuleMessage>, Error> {
        self.handle
            .rule()
            .get(IpVersion::V4)
            .execute()
            .try_collect()
            .await
            .map_err(Error::request("listing IPv4 rules"))
    }
}

/// Writes `value` to the sysctl `key` (dotted, as `sysctl` spells it: `net.ipv6.conf.eth0.accept_dad`)
/// in `ns`, or in the calling thread's namespace for `None`. `/proc/sys/net` shows the namespace of
/// the thread that opens a file under it, so the thread enters `ns`, opens and writes, and switches
/// straight back, as [`Netlink::in_netns`] does. An interface name is one component of the key
/// even when it holds dots (`eth0.5`): pass it in `ifname` and `{if}` in `key` so its dots stay dots
/// in the path (the kernel's `/proc/sys` spelling) while the key's own dots become slashes.
pub fn write_sysctl(
    ns: Option<&NetnsFile>,
    key: &str,
    ifname: &str,
    value: &str,
) -> Result<(), Error> {
    let path = format!(
        "/proc/sys/{}",
        key.split('.')
            .map(|part| if part == "{if}" { ifname } else { part })
            .collect::<Vec<_>>()
            .join("/")
    );
    let shown = key.replace("{if}", ifname);
    let where_ = ns.map_or("the current namespace".to_owned(), |n| n.path.clone());
    let fail = |reason: String| Error::Sysctl {
        key: shown.clone(),
        path: where_.clone(),
        reason,
    };
    let write = || -> Result<(), Error> {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .map_err(|e| fail(format!("opening {path}: {e}")))?;
        file.write_all(value.as_bytes())
            .map_err(|e| fail(format!("writing {value:?} to {path}: {e}")))
    };
    let Some(ns) = ns else {
        return write();
    };
    let original = File::open("/proc/thread-self/ns/net")
        .map_err(|e| fail(format!("opening this thread's netns: {e}")))?;
    nix::sched::setns(&ns.file, CloneFlags::CLONE_NEWNET)
        .map_err(|e| fail(format!("setns: {e}")))?;
    let written = write();
    nix::sched::setns(&original, CloneFlags::CLONE_NEWNET)
        .map_err(|e| fail(format!("returning to the original netns: {e}")))?;
    written
}
