//! What one pass of the running reconcile found and did: filled by [`super::pass`] and by
//! [`super::apply`], which the pass calls, so it lives beside both rather than in either.

use std::net::Ipv4Addr;

use super::decide::Drift;
use crate::model::{AttachmentKey, EniId};

/// What one pass of the running reconcile found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PassReport {
    /// Assignments released because their pod's network namespace is gone.
    pub released_dead: Vec<(AttachmentKey, Ipv4Addr)>,
    /// Assignments released because the API server says their pod is gone ([`super::api_server`]).
    pub released_gone_from_api: Vec<(AttachmentKey, Ipv4Addr)>,
    /// Pool IPs on managed ENIs that EC2 no longer shows there (this pass).
    pub missing_in_ec2: Vec<Ipv4Addr>,
    /// IPs EC2 shows on our managed ENIs that the pool does not hold (reported; a restart adopts them).
    pub unknown_to_pool: Vec<Ipv4Addr>,
    /// Pods whose IP is gone from EC2 (out of band, or with its ENI): forgotten by the pool and the
    /// state file.
    pub lost: Vec<(AttachmentKey, Ipv4Addr)>,
    /// ENIs EC2 did not show attached here for the first time: no new IPs from them for now.
    pub suspended_enis: Vec<EniId>,
    /// Suspended ENIs EC2 shows attached again.
    pub resumed_enis: Vec<EniId>,
    /// ENIs EC2 did not show attached twice in a row: forgotten with their IPs.
    pub forgotten_enis: Vec<EniId>,
    /// ENIs attached here that the pool did not know, taken on.
    pub adopted_enis: Vec<EniId>,
    /// Quarantined IPs the evidence adopted for a live pod.
    pub quarantine_adopted: Vec<(AttachmentKey, Ipv4Addr)>,
    /// Quarantined IPs released into the idle queue.
    pub quarantine_lifted: Vec<Ipv4Addr>,
    /// State-file rows repaired from the pool.
    pub store_repairs: usize,
    /// What the pass decided, in the order it applied it (the fields above say what came of it).
    pub decided: Vec<Drift>,
    /// IPv6-only attachments (ip_family ipv6) released because their pod's network namespace is gone.
    pub released_dead_ipv6: Vec<(AttachmentKey, std::net::Ipv6Addr)>,
    /// The node's /80 is not on its ENI in EC2's answer (unassigned out of band): its pods' addresses
    /// no longer route, and the pass could not assign it back. Reported loudly; a restart takes a
    /// new /80.
    pub ipv6_prefix_missing: bool,
    /// The node's /80 was gone from its ENI and this pass assigned it back by value.
    pub ipv6_prefix_reclaimed: bool,
    /// EC2's describe does not show the node's /80 on its ENI, and EC2 answered it in use less than a
    /// minute ago: taken as the ENI's own, assigned (back) moments before and not described yet.
    pub ipv6_prefix_settling: bool,
}
