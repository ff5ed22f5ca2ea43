//! How a node grows for a burst beyond its idle IPs: which EC2 call, how big, on which bucket.
//! Pure decisions, no state: [`super::state`] asks them with what it knows and carries out the
//! answer.
//!
//! With burst prefixes (`PoolConfig::burst_prefixes`, a Nitro node in the secondary-IP mode), an
//! ENI's free slot holds single secondary IPs or a whole `/28` (EC2 lets both share an ENI), so a
//! burst beyond the idle pool is served by **one** call:
//!
//! - on an attached ENI with a free slot, one `AssignPrivateIpAddresses` of whole `/28`s sized to
//!   the pods waiting (its rounding up is the rest of the burst's IPs, waiting for the pods that
//!   follow); a small top-up of the warm posture stays single IPs, so the free IPs stay few;
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

/// A warm-up alone of at least this many addresses goes as a whole `/28` when prefixes may serve it:
/// from half a prefix up, the rounding up is at most as many addresses as the warm-up asked for.
/// Below it, single IPs (one call as well, and no free IPs beyond the level).
pub const PREFIX_MIN_BATCH: u32 = PREFIX_ADDRESSES / 2;

/// What one assign on an ENI asks EC2 for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AssignSize {
    /// Single secondary IPs: the batch as it is, cut by the caller to the ENI's free slots (the
    /// rest waits for the next call).
    Singles,
    /// `count` whole `/28`s; of their addresses, `warm` go to the idle pool (the rest to the
    /// batch's pods): more warm-ups than the batch had take tokens, fewer return theirs.
    Prefixes { count: u32, warm: u32 },
}

/// The size of an assign of `pods` waiting pods and `warm` warm-ups on an ENI with `free_slots`
/// slots, when prefixes may serve it (`prefixes_allowed`: burst prefixes on and the subnet not out
/// of free `/28`s) and the node has `tokens` capacity tokens left.
///
/// - Pods are waiting: the idle pool did not absorb them, so a burst is on. Whole `/28`s, as many
///   as the pods need, or more when the warm-ups fill more whole prefixes; warm-ups never start a
///   prefix of their own beyond that (a level between two prefixes would hold one and call for the
///   next). The rounding up waits for the burst's next pods, so they cost no call.
/// - Warm-ups alone during a burst or a node's boot (`in_burst`: pods started in a run, see
///   `pool::demand`, or no warm IP held yet since the start): as for waiting pods, at least one
///   whole prefix, so the burst's next pods (a booting node's first ones) need no call of their own.
/// - Warm-ups alone outside a burst: single IPs when fewer than [`PREFIX_MIN_BATCH`] and within
///   the free slots, so a top-up of a few keeps the free IPs few; else whole prefixes as above.
/// - Single IPs when the prefixes do not fit the free slots or the tokens.
pub fn assign_size(
    pods: u32,
    warm: u32,
    free_slots: u32,
    prefixes_allowed: bool,
    tokens: u32,
    in_burst: bool,
) -> AssignSize {
    let total = pods + warm;
    if !prefixes_allowed || total == 0 {
        return AssignSize::Singles;
    }
    if pods == 0 && !in_burst && total < PREFIX_MIN_BATCH && total <= free_slots {
        return AssignSize::Singles;
    }
    let k = pods
        .div_ceil(PREFIX_ADDRESSES)
        .max(total / PREFIX_ADDRESSES)
        .max(1);
    let new_warm = k * PREFIX_ADDRESSES - pods;
    let more_tokens = new_warm.saturating_sub(warm);
    if k > free_slots || more_tokens > tokens {
        return AssignSize::Singles;
    }
    AssignSize::Prefixes {
        count: k,
        warm: new_warm,
    }
}

/// Whether a new ENI is created with whole `/28`s (`Some(k)`) or single addresses (`None`), for
/// `pods` waiters and `warm` warm-ups, on an ENI of `slots` slots with the node's `tokens` left.
/// The same rule as [`assign_size`].
pub fn create_prefixes(
    pods: u32,
    warm: u32,
    slots: u32,
    prefixes_allowed: bool,
    tokens: u32,
    in_burst: bool,
) -> Option<u32> {
    match assign_size(pods, warm, slots, prefixes_allowed, tokens, in_burst) {
        AssignSize::Prefixes { count, .. } => Some(count),
        AssignSize::Singles => None,
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
    fn a_small_top_up_takes_single_ips() {
        assert_eq!(assign_size(0, 1, 14, true, 50, false), AssignSize::Singles);
        assert_eq!(assign_size(0, 7, 14, true, 50, false), AssignSize::Singles);
    }

    #[test]
    fn a_small_top_up_during_a_burst_takes_a_whole_prefix() {
        assert_eq!(
            assign_size(0, 3, 14, true, 50, true),
            AssignSize::Prefixes { count: 1, warm: 16 }
        );
    }

    #[test]
    fn waiting_pods_take_whole_prefixes_sized_to_them() {
        // One pod the idle pool did not absorb: a burst is on, one /28 serves its next 15 pods.
        assert_eq!(
            assign_size(1, 0, 14, true, 50, false),
            AssignSize::Prefixes { count: 1, warm: 15 }
        );
        assert_eq!(
            assign_size(16, 0, 14, true, 50, false),
            AssignSize::Prefixes { count: 1, warm: 0 }
        );
        assert_eq!(
            assign_size(20, 0, 14, true, 50, false),
            AssignSize::Prefixes { count: 2, warm: 12 }
        );
    }

    #[test]
    fn warm_ups_fill_whole_prefixes_and_never_start_one() {
        // 5 pods and 14 warm-ups: one /28 (19 would need a second, for warm-ups alone).
        assert_eq!(
            assign_size(5, 14, 14, true, 50, false),
            AssignSize::Prefixes { count: 1, warm: 11 }
        );
        // 5 pods and 27 warm-ups fill two.
        assert_eq!(
            assign_size(5, 27, 14, true, 50, false),
            AssignSize::Prefixes { count: 2, warm: 27 }
        );
        // A top-up of 10 alone: one /28.
        assert_eq!(
            assign_size(0, 10, 14, true, 50, false),
            AssignSize::Prefixes { count: 1, warm: 16 }
        );
    }

    #[test]
    fn beyond_the_single_slots_a_small_top_up_takes_a_prefix_too() {
        // Three free slots, five addresses: singles do not fit, one /28 does.
        assert_eq!(
            assign_size(0, 5, 3, true, 50, false),
            AssignSize::Prefixes { count: 1, warm: 16 }
        );
    }

    #[test]
    fn without_prefixes_tokens_or_slots_it_stays_single_ips() {
        assert_eq!(
            assign_size(20, 0, 14, false, 50, false),
            AssignSize::Singles
        );
        // 12 more tokens needed for the rounding up, 11 left.
        assert_eq!(assign_size(20, 0, 14, true, 11, false), AssignSize::Singles);
        // The warm-ups' own tokens count: 20 pods, 12 warm-ups held, none left.
        assert_eq!(
            assign_size(20, 12, 14, true, 0, false),
            AssignSize::Prefixes { count: 2, warm: 12 }
        );
        // Two prefixes wanted, one slot free.
        assert_eq!(assign_size(20, 0, 1, true, 50, false), AssignSize::Singles);
        assert_eq!(assign_size(0, 0, 14, true, 50, false), AssignSize::Singles);
    }

    #[test]
    fn a_create_follows_the_same_rule() {
        assert_eq!(create_prefixes(20, 0, 14, true, 50, false), Some(2));
        assert_eq!(create_prefixes(0, 3, 14, true, 50, false), None);
        assert_eq!(create_prefixes(20, 0, 14, false, 50, false), None);
    }

    #[test]
    fn a_throttled_assign_falls_over_to_a_create_only_when_that_bucket_is_not_dry_too() {
        use Blockage::*;
        assert_eq!(
            blocked_path(true, Throttled, false, true),
            BlockedPath::NewEni
        );
        assert_eq!(blocked_path(true, Throttled, true, true), BlockedPath::Wait);
        assert_eq!(
            blocked_path(true, Throttled, false, false),
            BlockedPath::Wait
        );
        assert_eq!(blocked_path(true, Other, false, true), BlockedPath::Wait);
        assert_eq!(
            blocked_path(false, Throttled, false, true),
            BlockedPath::Wait
        );
    }
}
