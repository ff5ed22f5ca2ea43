//! Policy rules: `from <ip> [iif <link>] lookup <table>`, `to <ip> lookup <table>`, `fwmark
//! <mark>/<mask> lookup <table>`; added idempotently, matched exactly, removed when present.

use std::net::{IpAddr, Ipv4Addr};

use netlink_packet_route::rule::{RuleAction, RuleAttribute, RuleMessage};

use crate::{Error, MessageTable, Netlink, is_exists, is_not_found};

/// What a rule selects packets by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RuleSelector {
    /// Source address (a `/32`).
    From(Ipv4Addr),
    /// Destination address (a `/32`).
    To(Ipv4Addr),
    /// Firewall mark under a mask.
    FwMark { mark: u32, mask: u32 },
}

/// One IPv4 policy rule: `<priority>: <selector> [iif <link>] lookup <table>`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PolicyRule {
    pub priority: u32,
    pub selector: RuleSelector,
    /// Only packets arriving on this link (`iif`): ties a pod's rule to its own host veth.
    pub iif: Option<String>,
    pub table: u32,
}

impl std::fmt::Display for PolicyRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.selector {
            RuleSelector::From(ip) => write!(f, "{}: from {ip}", self.priority)?,
            RuleSelector::To(ip) => write!(f, "{}: to {ip}", self.priority)?,
            RuleSelector::FwMark { mark, mask } => {
                write!(f, "{}: fwmark {mark:#x}/{mask:#x}", self.priority)?
            }
        }
        if let Some(iif) = &self.iif {
            write!(f, " iif {iif}")?;
        }
        write!(f, " lookup {}", self.table)
    }
}

impl PolicyRule {
    /// Whether `msg` is this rule's selector and `iif` at this priority (whatever its table).
    pub fn selects_like(&self, msg: &RuleMessage) -> bool {
        self.same_address_as(msg) && iif_of(msg) == self.iif.as_deref()
    }

    /// Whether `msg` selects the same address (or mark) at this priority, whatever its `iif` and
    /// table: every rule of this shape for the IP, whoever added it.
    pub fn same_address_as(&self, msg: &RuleMessage) -> bool {
        let mut prio = None;
        let mut from = None;
        let mut to = None;
        let mut mark = None;
        let mut mask = None;
        for attr in &msg.attributes {
            match attr {
                RuleAttribute::Priority(p) => prio = Some(*p),
                RuleAttribute::Source(a) if msg.header.src_len == 32 => from = Some(*a),
                RuleAttribute::Destination(a) if msg.header.dst_len == 32 => to = Some(*a),
                RuleAttribute::FwMark(m) => mark = Some(*m),
                RuleAttribute::FwMask(m) => mask = Some(*m),
                _ => {}
            }
        }
        if prio != Some(self.priority) {
            return false;
        }
        match self.selector {
            RuleSelector::From(ip) => from == Some(IpAddr::V4(ip)) && to.is_none(),
            RuleSelector::To(ip) => to == Some(IpAddr::V4(ip)) && from.is_none(),
            RuleSelector::FwMark { mark: m, mask: k } => {
                mark == Some(m) && mask.unwrap_or(u32::MAX) == k
            }
        }
    }

    /// Whether `msg` is exactly this rule (selector, `iif`, priority and table).
    pub fn matches(&self, msg: &RuleMessage) -> bool {
        self.selects_like(msg) && msg.table() == self.table
    }
}

/// The `iif` of a rule message, if it has one.
pub fn iif_of(msg: &RuleMessage) -> Option<&str> {
    msg.attributes.iter().find_map(|a| match a {
        RuleAttribute::Iifname(n) => Some(n.as_str()),
        _ => None,
    })
}

impl Netlink {
    /// Adds `rule` (already present is fine).
    pub async fn add_rule(&self, rule: &PolicyRule) -> Result<(), Error> {
        let req = self
            .handle()
            .rule()
            .add()
            .v4()
            .table_id(rule.table)
            .priority(rule.priority)
            .action(RuleAction::ToTable);
        let req = match &rule.iif {
            Some(iif) => req.input_interface(iif.clone()),
            None => req,
        };
        let req = match rule.selector {
            RuleSelector::From(ip) => req.source_prefix(ip, 32),
            RuleSelector::To(ip) => req.destination_prefix(ip, 32),
            RuleSelector::FwMark { mark, mask } => {
                let mut req = req;
                req.message_mut()
                    .attributes
                    .push(RuleAttribute::FwMark(mark));
                req.message_mut()
                    .attributes
                    .push(RuleAttribute::FwMask(mask));
                req
            }
        };
        match req.execute().await {
            Ok(()) => Ok(()),
            Err(e) if is_exists(&e) => Ok(()),
            Err(e) => Err(Error::request(format!("adding rule {rule}"))(e)),
        }
    }

    /// Removes every rule `candidate` picks; returns how many went.
    pub async fn remove_rules(
        &self,
        candidate: impl Fn(&RuleMessage) -> bool,
        what: &str,
    ) -> Result<usize, Error> {
        let mut removed = 0;
        for msg in self.rules_v4().await? {
            if !candidate(&msg) {
                continue;
            }
            match self.handle().rule().del(msg).execute().await {
                Ok(()) => removed += 1,
                Err(e) if is_not_found(&e) => {}
                Err(e) => return Err(Error::request(format!("deleting {what}"))(e)),
            }
        }
        Ok(removed)
    }

    /// Whether `rule` is present exactly.
    pub async fn has_rule(&self, rule: &PolicyRule) -> Result<bool, Error> {
        Ok(self.rules_v4().await?.iter().any(|m| rule.matches(m)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_display_like_ip_rule() {
        let ip = Ipv4Addr::new(10, 0, 0, 5);
        let r = PolicyRule {
            priority: 1536,
            selector: RuleSelector::From(ip),
            iif: None,
            table: 3,
        };
        assert_eq!(r.to_string(), "1536: from 10.0.0.5 lookup 3");
        let r = PolicyRule {
            iif: Some("eni0123".into()),
            ..r
        };
        assert_eq!(r.to_string(), "1536: from 10.0.0.5 iif eni0123 lookup 3");
        let m = PolicyRule {
            priority: 1024,
            selector: RuleSelector::FwMark {
                mark: 0x80,
                mask: 0x80,
            },
            iif: None,
            table: 254,
        };
        assert_eq!(m.to_string(), "1024: fwmark 0x80/0x80 lookup 254");
    }
}
