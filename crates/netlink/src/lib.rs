//! The rtnetlink primitives eniipam's CNI plugin (pod wiring) and its daemon (the node's ENI route tables,
//! policy rules) share. It knows nothing about pods or the pool: links, addresses, routes and rules, in a
//! chosen network namespace, with the kernel's errors classified once.
//!
//! - [`conn`]: [`Netlink`], one rtnetlink connection bound to a network namespace ([`NetnsFile`]).
//! - [`msg`]: reading netlink messages back: a link's facts, a route's destination/gateway/table, the
//!   table of any route or rule message.
//! - [`rule`]: policy rules (`from`/`to <ip> lookup <table>`, `fwmark`) added, matched and removed.
//! - [`errno`]: "not there" and "already there" as the kernel says them; MAC formatting.

pub mod conn;
pub mod errno;
pub mod msg;
pub mod rule;

pub use conn::{Netlink, NetnsFile, write_sysctl};
pub use errno::{format_mac, is_exists, is_not_found, parse_mac};
pub use msg::{LinkFacts, MessageTable, TableRoute, TableRoute6};
pub use rule::{PolicyRule, RuleSelector, iif_of};

/// The main routing table.
pub const MAIN_TABLE: u32 = 254;

/// Why a netlink operation failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The namespace file could not be opened.
    #[error("network namespace {path}: {source}")]
    Open {
        /// The path.
        path: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// Switching namespaces or opening the socket failed.
    #[error("netlink socket in {path}: {reason}")]
    Socket {
        /// The namespace.
        path: String,
        /// What failed.
        reason: String,
    },
    /// A sysctl could not be written.
    #[error("sysctl {key} in {path}: {reason}")]
    Sysctl {
        /// The key, dotted.
        key: String,
        /// The namespace.
        path: String,
        /// What failed.
        reason: String,
    },
    /// A request failed.
    #[error("{what}: {source}")]
    Request {
        /// What was being done ("adding route 10.0.0.0/24 dev eth1 table 2", ...).
        what: String,
        /// The kernel's (or the library's) error.
        #[source]
        source: rtnetlink::Error,
    },
}

impl Error {
    /// Wraps a failed request with what it was doing.
    pub fn request(what: impl Into<String>) -> impl FnOnce(rtnetlink::Error) -> Self {
        let what = what.into();
        move |source| Self::Request { what, source }
    }

    /// The kernel said the object is not there.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::Request { source, .. } if is_not_found(source))
    }
}
