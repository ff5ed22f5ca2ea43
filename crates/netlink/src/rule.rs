//! Policy rules: `from <ip> lookup <table>`, `to <ip> lookup <table>`, `fwmark <mark>/<mask> lookup
//! <table>`; added idempotently, matched exactly, removed when present.

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

/// One IPv4 policy rule: `<priority>: <selector> lookup <table>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PolicyRule {
    pub priority: u32,
    pub selector: RuleSelector,
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
        write!(f, " lookup {}", self.table)
    }
}

impl PolicyRule {
    /// Whether `msg` is this rule's selector at this priority (whatever its table).
    pub fn selects_like(&self, msg: &RuleMessage) -> bool {
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

    /// Whether `msg` is exactly this rule (selector, priority and table).
    pub fn matches(&self, msg: &RuleMessage) -> bool {
        self.selects_like(msg) && msg.table() == self.table
    }
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
            table: 3,
        };
        assert_eq!(r.to_string(), "1536: from 10.0.0.5 lookup 3");
        let m = PolicyRule {
            priority: 1024,
            selector: RuleSelector::FwMark {
                mark: 0x80,
                mask: 0x80,
            },
            table: 254,
        };
        assert_eq!(m.to_string(), "1024: fwmark 0x80/0x80 lookup 254");
    }
}
