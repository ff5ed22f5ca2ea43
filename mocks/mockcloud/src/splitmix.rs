//! SplitMix64's mixing step: the one deterministic hash the fake world (ids, address picks) and the
//! new-ENI lag (which ENIs it picks) share. Its own file, so neither imports the other for it.

pub(crate) fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}
