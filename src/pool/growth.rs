//! How a node grows for a burst beyond its idle IPs: which EC2 call, how big, on which bucket.
//! Pure decisions, no state: [`super::state`] asks them with what it knows and carries out the
//! answer.
//!
//! With burst prefixes (`PoolConfig::burst_prefixes`, a Nitro node in the secondary-IP mode), an
//! ENI's free slot holds single secondary IPs or a whole `/28` (EC2 lets both share an ENI), so a
//! burst beyond the idle pool is served by **one** call:
//!
//! - on an attached ENI with a free slot, one `AssignPrivateIpAddresses` of whole `/28`s sized to
//!   the burst (its rounding up is the rest of the burst's IPs, waiting for the pods that follow);
//!   a small batch (a trickle, the warm posture) stays single IPs, so the free IPs stay few;
//! - when that ENI's assigns are throttled (the `AssignPrivateIpAddresses` bucket is dry), one new
//!   ENI that carries the burst's addresses in its `CreateNetworkInterface`, on the create bucket,
//!   at once rather than after the ENI's back-off;
//! - never an assign plus a create for the same burst: the prefixes' room is counted for the
//!   routing, so the pods beyond eth0's single slots do not start an ENI.
//!
//! The account's buckets refill each at 5 calls a second: a fleet whose nodes each take one call,
//! on whichever bucket has tokens, grows about twice as fast as one whose nodes all queue on the
//! assign bucket, and several times as fast as one whose nodes spend an assign, a create, an attach
//! and a modify per burst (`bench/src/scenarios/fleet/bound.rs` bounds every such structure).

use super::config::PREFIX_ADDRESSES;

/// A batch of at least this many addresses goes as whole `/28`s when prefixes may serve it: from
/// half a prefix up, the rounding up is at most as many addresses as the batch uses, and they serve
/// the pods of the burst still to come without another call. Below it, single IPs (one call as
/// well, and no free IPs beyond the batch).
pub const PREFIX_MIN_BATCH: u32 = PREFIX_ADDRESSES / 2;

/// What one assign on an ENI asks EC2 for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AssignSize {
    /// Single secondary IPs: the batch's count, cut by the caller to the ENI's free slots (the
    /// rest waits for the next call).
    Singles(u32),
    /// `count` whole `/28`s; `extra` addresses beyond the batch join it as warm-ups (their tokens
    /// must be taken).
    Prefixes { count: u32, extra: u32 },
}

/// The size of an assign of `count` addresses on an ENI with `free_slots` slots, when prefixes may
/// serve it (`prefixes_allowed`: burst prefixes on and the subnet not out of free `/28`s) and the
/// node has `tokens` capacity tokens left for the rounding up.
///
/// Whole `/28`s when the batch is at least [`PREFIX_MIN_BATCH`] or beyond the single slots, and
/// they fit the free slots and the tokens; else single IPs.
pub fn assign_size(count: u32, free_slots: u32, prefixes_allowed: bool, tokens: u32) -> AssignSize {
    let k = count.div_ceil(PREFIX_ADDRESSES);
    let extra = k * PREFIX_ADDRESSES - count;
    let wanted = count >= PREFIX_MIN_BATCH || count > free_slots;
    if prefixes_allowed && wanted && k >= 1 && k <= free_slots && extra <= tokens {
        AssignSize::Prefixes { count: k, extra }
    } else {
        AssignSize::Singles(count)
    }
}

/// Whether a new ENI is created with whole `/28`s (`Some(k)`, `k * 16 - count` addresses of warm-ups
/// beyond the `count` it carries) or single addresses (`None`), on an ENI of `slots` slots with the
/// node's `tokens` left for the rounding up. The same rule as [`assign_size`].
pub fn create_prefixes(count: u32, slots: u32, prefixes_allowed: bool, tokens: u32) -> Option<u32> {
    match assign_size(count, slots, prefixes_allowed, tokens) {
        AssignSize::Prefixes { count, .. } => Some(count),
        AssignSize::Singles(_) => None,
    }
}

/// Where the pods of a burst go when the ENI with room for them cannot take a call now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockedPath {
    /// Wait in line for the ENI to take calls again (its back-off, at most the throttle gate's
    /// longest pause), then one assign carries them and the pods that came meanwhile.
    Wait,
    /// A new ENI carries them in its create, on the create bucket, now.
    NewEni,
}

/// Why the ENI with room is not taking calls, as far as the choice of path goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Blockage {
    /// EC2 throttled its assign (`RequestLimitExceeded`): the assign bucket is dry.
    Throttled,
    /// Anything else: a transient failure's back-off, the subnet out of addresses. Another ENI would
    /// not fare better (the same subnet) or the fault is not the bucket's.
    Other,
}

/// The path for pods blocked by `blockage`: with burst prefixes on, a throttled assign falls over to
/// a create at once, unless the node's creates or attaches were throttled lately too
/// (`growth_contended`: that bucket is dry as well, and a create would wait longer than the
/// assign's back-off) or no device index is free for a new ENI.
pub fn blocked_path(
    burst_prefixes: bool,
    blockage: Blockage,
    growth_contended: bool,
    device_index_free: bool,
) -> BlockedPath {
    if burst_prefixes && blockage == Blockage::Throttled && !growth_contended && device_index_free {
        BlockedPath::NewEni
    } else {
        BlockedPath::Wait
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trickle_takes_single_ips() {
        assert_eq!(assign_size(1, 14, true, 50), AssignSize::Singles(1));
        assert_eq!(assign_size(7, 14, true, 50), AssignSize::Singles(7));
    }

    #[test]
    fn a_burst_takes_whole_prefixes_sized_to_it() {
        assert_eq!(
            assign_size(8, 14, true, 50),
            AssignSize::Prefixes { count: 1, extra: 8 }
        );
        assert_eq!(
            assign_size(16, 14, true, 50),
            AssignSize::Prefixes { count: 1, extra: 0 }
        );
        assert_eq!(
            assign_size(20, 14, true, 50),
            AssignSize::Prefixes {
                count: 2,
                extra: 12
            }
        );
    }

    #[test]
    fn beyond_the_single_slots_a_small_batch_takes_a_prefix_too() {
        // Three free slots, five addresses: singles do not fit, one /28 does.
        assert_eq!(
            assign_size(5, 3, true, 50),
            AssignSize::Prefixes {
                count: 1,
                extra: 11
            }
        );
    }

    #[test]
    fn without_prefixes_tokens_or_slots_it_stays_single_ips() {
        assert_eq!(assign_size(20, 14, false, 50), AssignSize::Singles(20));
        // 12 tokens short of the rounding up.
        assert_eq!(assign_size(20, 14, true, 11), AssignSize::Singles(20));
        // Two prefixes wanted, one slot free.
        assert_eq!(assign_size(20, 1, true, 50), AssignSize::Singles(20));
        assert_eq!(assign_size(0, 14, true, 50), AssignSize::Singles(0));
    }

    #[test]
    fn a_create_follows_the_same_rule() {
        assert_eq!(create_prefixes(20, 14, true, 50), Some(2));
        assert_eq!(create_prefixes(3, 14, true, 50), None);
        assert_eq!(create_prefixes(20, 14, false, 50), None);
    }

    #[test]
    fn a_throttled_assign_falls_over_to_a_create_only_when_that_bucket_is_not_dry_too() {
        use Blockage::*;
        assert_eq!(
            blocked_path(true, Throttled, false, true),
            BlockedPath::NewEni
        );
        assert_eq!(blocked_path(true, Throttled, true, true), BlockedPath::Wait);
        assert_eq!(blocked_path(true, Throttled, false, false), BlockedPath::Wait);
        assert_eq!(blocked_path(true, Other, false, true), BlockedPath::Wait);
        assert_eq!(blocked_path(false, Throttled, false, true), BlockedPath::Wait);
    }
}
