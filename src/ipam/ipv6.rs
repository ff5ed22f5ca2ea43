//! The IPv6 half of the service: an address from the node's /80 for an attachment, recorded
//! (with the /80's cursor) before it is answered, and released under the same rules as an IPv4.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use ipnet::Ipv6Net;

use super::{AllocateRequest, Ipam, IpamError};
use crate::clock::unix_ms_now;
use crate::ipv6::{Ipv6Error, Ipv6Pool, Meta, Reservation, stored_assignment, stored_reservation};
use crate::model::AttachmentKey;

/// A pod's IPv6 address and what the plugin needs to wire it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allocated6 {
    pub ip: Ipv6Addr,
    /// The node's /80 it comes from.
    pub prefix: Ipv6Net,
    /// The VPC's IPv6 CIDR blocks.
    pub vpc_cidrs: Vec<Ipv6Net>,
    /// The pod's node-local IPv4 for egress (ipv6 mode with `ipv4_egress`; `crate::ipv6::egress`).
    pub egress_ipv4: Option<Ipv4Addr>,
}

impl Ipam {
    /// The IPv6 part of an allocation, under the attachment's lock: the allocation and whether
    /// this call made it.
    pub(super) async fn allocate_v6(
        &self,
        p: &Arc<Ipv6Pool>,
        req: &AllocateRequest,
    ) -> Result<(Allocated6, bool), IpamError> {
        let a = &req.acquire;
        let meta = Meta {
            network: a.meta.network.clone(),
            netns: a.meta.netns.clone(),
        };
        let now_ms = unix_ms_now();
        let sticky = a.sticky_key.as_deref();
        let grant =
            p.with(
                |b| match b.acquire(&a.key, &a.pod, sticky, &meta, req.prefer6, now_ms) {
                    Err(Ipv6Error::PreferredUnavailable { .. }) if !req.require_preferred => {
                        b.acquire(&a.key, &a.pod, sticky, &meta, None, now_ms)
                    }
                    other => other,
                },
            )?;
        if grant.new {
            let row = p.with(|b| b.get(&a.key).map(|h| stored_assignment(&a.key, h)));
            let recorded = match row {
                Some(row) => {
                    self.store()
                        .record_assigned_ipv6(row, (grant.next_offset, grant.egress_next))
                        .await
                }
                None => Ok(()),
            };
            if let Err(e) = recorded {
                tracing::error!(error = %e, attachment = %a.key, ip = %grant.ip,
                    "cannot record the IPv6 assignment");
                // The IPv6 and the egress address both go back (`Book::undo_acquire`).
                p.with(|b| b.undo_acquire(&a.key, &grant));
                return Err(IpamError::Record(e));
            }
            self.metrics().ipv6_assigned.inc();
        }
        Ok((
            Allocated6 {
                ip: grant.ip,
                prefix: p.prefix(),
                vpc_cidrs: p.vpc_cidrs.clone(),
                egress_ipv4: grant.egress,
            },
            grant.new,
        ))
    }

    /// The IPv6 part of a release: the address and the reservation made (unix ms), or `None` when the
    /// attachment held none. A release whose record fails is undone.
    pub(super) async fn release_v6(
        &self,
        p: &Arc<Ipv6Pool>,
        key: &AttachmentKey,
        sticky: bool,
    ) -> Result<Option<(Ipv6Addr, Option<(String, u64)>)>, IpamError> {
        let now_ms = unix_ms_now();
        let Some(released) = p.with(|b| b.release(key, sticky, p.stick_ms, now_ms)) else {
            return Ok(None);
        };
        // The row of the reservation this release made (the book's, as `Book::release` wrote it).
        let reservation = released.reservation.as_ref().map(|(k, until_ms)| {
            stored_reservation(
                k,
                &Reservation {
                    ip: released.ip,
                    until_ms: *until_ms,
                    released_at_ms: now_ms,
                },
            )
        });
        if let Err(e) = self
            .store()
            .record_released_ipv6(&key.container_id, &key.ifname, reservation)
            .await
        {
            tracing::error!(error = %e, attachment = %key, ip = %released.ip,
                "cannot record the IPv6 release");
            // The IPv6 and its egress address are held again (`Book::undo_release`).
            p.with(|b| b.undo_release(&released));
            return Err(IpamError::Record(e));
        }
        self.metrics().ipv6_assigned.dec();
        Ok(Some((released.ip, released.reservation)))
    }
}
