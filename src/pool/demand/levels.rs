//! The warm levels: what the maintainer tops up below, fills to, and gives back beyond, from the
//! configuration, the [`Demand`] and the node's load (see the parent module's docs for the policy).

use tokio::time::Instant;

use super::Demand;
use crate::pool::config::{PREFIX_ADDRESSES, PoolConfig, WarmPolicy};

/// The warm levels for one maintainer round (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WarmLevels {
    /// Top up when the idle IPs (and those arriving) fall below this.
    pub low: u32,
    /// What a top-up fills to.
    pub fill: u32,
    /// Give back idle IPs beyond this...
    pub keep: u32,
    /// ...down to this.
    pub down_to: u32,
}

/// What the node knows that the levels depend on, besides the configuration and the demand.
#[derive(Clone, Copy, Debug, Default)]
pub struct NodeLoad {
    /// Pods holding an IP now.
    pub in_use: u32,
    /// The subnet of new IPs has fewer than a tenth of its addresses free (at the last look).
    pub subnet_short: bool,
}

/// The warm levels of `config`'s policy for `demand` at `now`.
pub fn warm_levels(
    config: &PoolConfig,
    demand: &Demand,
    load: NodeLoad,
    now: Instant,
) -> WarmLevels {
    let (lo, hi) = (config.min_idle, config.max_idle);
    let levels = match config.warm_policy {
        WarmPolicy::Fixed => {
            // MINIMUM_IP_TARGET: IPs held, pods included.
            let floor = config.minimum_ips.saturating_sub(load.in_use);
            let low = lo.max(floor);
            let fill = config.refill_target().max(floor);
            let keep = hi.max(floor);
            return WarmLevels {
                low,
                fill,
                keep,
                down_to: keep,
            };
        }
        WarmPolicy::Adaptive if load.subnet_short => WarmLevels {
            low: lo,
            fill: lo,
            keep: lo,
            down_to: lo,
        },
        WarmPolicy::Adaptive => adaptive(config, demand, now),
    };
    if config.prefix_delegation {
        // Whole prefixes where max_idle leaves room for them: an assign brings a whole `/28` and a
        // give-back takes one whole, so a level between two prefixes would hold one and call for
        // the next. Below a prefix's worth, max_idle still rules (a whole free prefix beyond it
        // goes back).
        let up = |n: u32| n.div_ceil(PREFIX_ADDRESSES) * PREFIX_ADDRESSES;
        let whole = |n: u32| if up(n) <= hi { up(n) } else { n };
        let fill = whole(levels.fill).max(levels.low);
        let keep = whole(levels.keep.max(fill));
        return WarmLevels {
            low: levels.low,
            fill,
            keep,
            down_to: whole(levels.down_to).clamp(fill, keep),
        };
    }
    levels
}

fn adaptive(config: &PoolConfig, demand: &Demand, now: Instant) -> WarmLevels {
    let (lo, hi) = (config.min_idle, config.max_idle);
    // During a burst: as many again as it has brought so far, or as the last burst brought.
    let burst = demand.ongoing_burst(now).map_or(0, |b| {
        let like_last = demand.previous_burst(now).map_or(0, |p| p.starts);
        b.starts.max(like_last)
    });
    // Pods bound here and not ADDed yet: one IP each, before they ask.
    let announced = demand.announced_waiting(now);
    let low = burst.max(announced).min(hi).max(lo);
    // A trickle: fill above `low` by half the last minute's starts (at least one), so a top-up
    // serves a few pods.
    let trickle = demand.starts_last_minute(now).div_ceil(2).max(1);
    let fill = (low + trickle).min(hi).max(low);
    let delay = config.give_back_delay;
    let quiet = demand.quiet_for(now).is_none_or(|q| q >= delay);
    let (keep, down_to) = if quiet {
        // Quiet: a band over `fill`, then down to it.
        let band = fill + (fill / 2).max(2);
        (band.min(hi).max(fill), fill)
    } else {
        // Pods keep starting (or a burst ended within the delay): only past max_idle, down to
        // halfway to it, or to the last burst's size if that is more (its leftovers are held for
        // a repeat).
        let keep = hi.max(fill);
        let halfway = fill + (keep - fill).div_ceil(2);
        let burst = demand
            .last_burst(now, delay)
            .map_or(0, |b| b.starts.min(keep));
        (keep, halfway.max(burst))
    };
    WarmLevels {
        low,
        fill,
        keep,
        down_to: down_to.min(keep),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn config() -> PoolConfig {
        PoolConfig {
            min_idle: 2,
            max_idle: 16,
            give_back_delay: Duration::from_secs(600),
            ..PoolConfig::default()
        }
    }

    fn starts(d: &mut Demand, t0: Instant, at_ms: &[u64]) {
        for ms in at_ms {
            d.record_start(t0 + Duration::from_millis(*ms));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_node_holds_min_idle_and_gives_back_above_a_band() {
        let d = Demand::default();
        let l = warm_levels(&config(), &d, NodeLoad::default(), Instant::now());
        assert_eq!(l.low, 2);
        assert_eq!(
            l.fill, 3,
            "one above low: even without demand a top-up brings two"
        );
        assert_eq!((l.keep, l.down_to), (5, 3));
    }

    #[tokio::test(start_paused = true)]
    async fn three_starts_are_not_a_burst_four_are() {
        let t0 = Instant::now();
        let mut d = Demand::default();
        starts(&mut d, t0, &[0, 1000, 2000]);
        assert_eq!(d.ongoing_burst(t0 + Duration::from_secs(2)), None);
        starts(&mut d, t0, &[3000]);
        let b = d
            .ongoing_burst(t0 + Duration::from_secs(3))
            .expect("a burst");
        assert_eq!(b.starts, 4);
        // A burst goes on while each start has another within the window.
        starts(&mut d, t0, &[12_000, 21_000]);
        assert_eq!(
            d.ongoing_burst(t0 + Duration::from_secs(21))
                .unwrap()
                .starts,
            6
        );
        assert_eq!(d.ongoing_burst(t0 + Duration::from_secs(32)), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_trickle_is_not_a_burst() {
        let t0 = Instant::now();
        let mut d = Demand::default();
        // One start every 9 s: within the gap, but never four within 10 s.
        starts(&mut d, t0, &[0, 9000, 18_000, 27_000, 36_000, 45_000]);
        assert_eq!(d.ongoing_burst(t0 + Duration::from_secs(45)), None);
        let l = warm_levels(
            &config(),
            &d,
            NodeLoad::default(),
            t0 + Duration::from_secs(45),
        );
        assert_eq!(l.low, 2);
        assert_eq!(
            l.fill,
            2 + 3,
            "6 starts in the last minute: fill by half of them"
        );
        assert_eq!(
            l.keep, 16,
            "pods keep starting: give back only past max_idle"
        );
        assert_eq!(
            l.down_to,
            5 + 6,
            "down to halfway between fill and max_idle"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn during_a_burst_the_pool_warms_for_as_many_again_bounded_by_max_idle() {
        let t0 = Instant::now();
        let mut d = Demand::default();
        starts(&mut d, t0, &[0, 100, 200, 300, 400, 500]);
        let now = t0 + Duration::from_millis(600);
        let l = warm_levels(&config(), &d, NodeLoad::default(), now);
        assert_eq!(l.low, 6);
        assert!(l.fill >= 6 && l.fill <= 16, "{l:?}");
        let many: Vec<u64> = (0..40).map(|i| 1000 + i * 10).collect();
        starts(&mut d, t0, &many);
        let l = warm_levels(
            &config(),
            &d,
            NodeLoad::default(),
            t0 + Duration::from_secs(2),
        );
        assert_eq!((l.low, l.fill), (16, 16), "bounded by max_idle");
    }

    #[tokio::test(start_paused = true)]
    async fn after_a_burst_leftovers_are_kept_for_the_delay_then_given_back_to_fill() {
        let t0 = Instant::now();
        let mut d = Demand::default();
        let at: Vec<u64> = (0..12).map(|i| i * 500).collect();
        starts(&mut d, t0, &at);
        let c = config();
        let after = t0 + Duration::from_secs(5 * 60);
        let l = warm_levels(&c, &d, NodeLoad::default(), after);
        assert_eq!((l.low, l.keep, l.down_to), (2, 16, 12), "{l:?}");
        let later = t0 + Duration::from_secs(11 * 60);
        let l = warm_levels(&c, &d, NodeLoad::default(), later);
        assert_eq!(l.down_to, l.fill, "quiet for the delay: back to fill");
        assert!(l.keep < 12, "{l:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_small_burst_in_steady_churn_does_not_lower_the_give_back_level() {
        let t0 = Instant::now();
        let mut d = Demand::default();
        // A trickle, then four starts within 10 s by chance (a Poisson churn does that).
        starts(
            &mut d,
            t0,
            &[0, 10_000, 20_000, 30_000, 31_000, 32_000, 33_000],
        );
        assert!(d.ongoing_burst(t0 + Duration::from_secs(33)).is_some());
        let l = warm_levels(
            &config(),
            &d,
            NodeLoad::default(),
            t0 + Duration::from_secs(60),
        );
        assert_eq!(l.keep, 16, "{l:?}");
        assert!(l.down_to > 4, "{l:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_short_subnet_holds_exactly_min_idle() {
        let t0 = Instant::now();
        let mut d = Demand::default();
        let at: Vec<u64> = (0..12).map(|i| i * 500).collect();
        starts(&mut d, t0, &at);
        let load = NodeLoad {
            in_use: 12,
            subnet_short: true,
        };
        let l = warm_levels(&config(), &d, load, t0 + Duration::from_secs(6));
        assert_eq!(
            l,
            WarmLevels {
                low: 2,
                fill: 2,
                keep: 2,
                down_to: 2
            }
        );
    }

    #[tokio::test(start_paused = true)]
    async fn prefix_delegation_reasons_in_whole_prefixes() {
        let c = PoolConfig {
            prefix_delegation: true,
            max_idle: 48,
            ..config()
        };
        let t0 = Instant::now();
        let mut d = Demand::default();
        let at: Vec<u64> = (0..20).map(|i| i * 100).collect();
        starts(&mut d, t0, &at);
        let l = warm_levels(&c, &d, NodeLoad::default(), t0 + Duration::from_secs(2));
        assert_eq!(l.low, 20);
        assert_eq!(l.fill % 16, 0, "{l:?}");
        assert_eq!(l.keep % 16, 0, "{l:?}");
        assert!(l.fill >= 20, "{l:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn fixed_is_the_old_policy_and_minimum_ips_counts_pods() {
        let c = PoolConfig {
            warm_policy: WarmPolicy::Fixed,
            min_idle: 5,
            max_idle: 5,
            minimum_ips: 10,
            ..PoolConfig::default()
        };
        let d = Demand::default();
        let now = Instant::now();
        let l = warm_levels(&c, &d, NodeLoad::default(), now);
        assert_eq!((l.low, l.fill, l.keep), (10, 10, 10));
        let busy = NodeLoad {
            in_use: 8,
            subnet_short: false,
        };
        let l = warm_levels(&c, &d, busy, now);
        assert_eq!((l.low, l.fill, l.keep), (5, 5, 5));
        let c = PoolConfig {
            warm_policy: WarmPolicy::Fixed,
            ..PoolConfig::default()
        };
        let l = warm_levels(&c, &d, NodeLoad::default(), now);
        assert_eq!((l.low, l.fill, l.keep), (2, c.refill_target(), 16));
    }
}
