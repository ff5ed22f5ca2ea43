//! The pool's configuration, with documented defaults and validation.

use std::time::Duration;

use crate::cloud::lifecycle::LifecycleConfig;

/// A configuration value the pool cannot work with, naming the field.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[error("invalid pool config: `{field}` {problem}")]
pub struct ConfigError {
    /// The offending field, as spelled in [`PoolConfig`].
    pub field: &'static str,
    /// What is wrong with it.
    pub problem: String,
}

/// How the pool behaves. Every field has a default (see [`PoolConfig::default`]).
///
/// Mapping for AWS VPC CNI users: `min_idle` is `WARM_IP_TARGET` (free IPs kept ready); `max_idle`
/// is the ceiling above which idle IPs are given back to EC2 (the VPC CNI derives it from
/// `WARM_IP_TARGET`/`WARM_ENI_TARGET`; here it is explicit, in terway's style `max_pool_size`);
/// `max_ips` is `MAX_PODS`-like hard cap on pod IPs; there is no `WARM_ENI_TARGET`: ENIs are created
/// when IPs are needed and deleted when they hold none.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolConfig {
    /// How the warm levels are chosen within `[min_idle, max_idle]`: learned from this node's
    /// demand (`adaptive`, the default) or fixed (see [`super::demand`]).
    pub warm_policy: WarmPolicy,
    /// Idle IPs always kept ready (cooling ones count, sticky-reserved ones do not): the floor of
    /// the warm level. With the `fixed` policy, below it the pool tops up to
    /// [`PoolConfig::refill_target`] in one batch. Default 2.
    pub min_idle: u32,
    /// Idle IPs the pool never holds more of for long: the ceiling of the warm level; beyond it the
    /// longest-idle IPs (past cooldown, not reserved) are given back. Default 16.
    pub max_idle: u32,
    /// `fixed` policy only: IPs the node holds at least, pods included (the VPC CNI's
    /// `MINIMUM_IP_TARGET`). Default 0.
    pub minimum_ips: u32,
    /// `adaptive` policy: how long after a burst its leftovers are held (up to its size), and how
    /// long the node must be quiet before idle IPs go back down to the fill level. Default 10 min.
    pub give_back_delay: Duration,
    /// Hard cap on the pod IPs the node holds; `None`: the instance type's limit. Default `None`.
    pub max_ips: Option<u32>,
    /// Cap on attached ENIs, eth0 included; `None`: the instance type's limit. Default `None`.
    pub max_enis: Option<u32>,
    /// A released IP goes to another pod only after this long. Default 30 s; zero disables it.
    pub reuse_cooldown: Duration,
    /// A sticky release keeps the IP reserved for its key this long. Default 5 min.
    pub ip_stick_time: Duration,
    /// How long an ENI actor waits for more requests before its one cloud call. Default 5 ms.
    pub batch_window: Duration,
    /// Depth of each ENI actor's ipBacklog (bounded mpsc). Default 256.
    pub backlog_depth: usize,
    /// How long a subnet backs off after EC2 says it is full or a limit is reached. Default 2 min.
    pub subnet_backoff: Duration,
    /// First back-off of an ENI (or of ENI creation) after a failed call; doubles with each
    /// consecutive failure up to `eni_backoff_max`. Default 1 s.
    pub eni_backoff: Duration,
    /// Longest ENI back-off. Default 1 min. After EC2 throttled a pods' assign the back-off stops
    /// at 10 s, the throttle gate's longest pause (`pool::state::assign`).
    pub eni_backoff_max: Duration,
    /// Period of the maintainer's tick (it also runs when notified). Default 5 s.
    pub maintainer_tick: Duration,
    /// ENI creations running at once. A burst of waiters that needs k new ENIs gets them in
    /// parallel, up to this many; warming up to `min_idle` alone creates one at a time. The node's
    /// mutating-call rate limit still paces the calls. Default 4 (a 100-pod burst on a c5.4xlarge
    /// needs 4 ENIs).
    pub max_concurrent_eni_creates: usize,
    /// After an assign, how long to wait for IMDS to list the new IPs before replying anyway (EC2 has
    /// them; IMDS lags). Zero disables the wait. Default 2 s.
    pub imds_wait: Duration,
    /// eth0's secondary IPs serve pods too, as with the AWS VPC CNI (eth0 itself is never detached,
    /// so only its secondary IPs grow and shrink). Default true.
    pub use_primary_eni: bool,
    /// Custom networking: the subnet and security groups of new ENIs come from the node's ENIConfig,
    /// given to the pool by [`super::Pool::set_pod_network`]; until then no ENI is created (the
    /// node's own subnet is never a fallback). Default false.
    pub custom_networking: bool,
    /// Slots are `/28` prefixes of 16 addresses instead of single secondary IPs (Nitro instance types
    /// only; the VPC CNI's `ENABLE_PREFIX_DELEGATION`). Counts (`min_idle`, `max_idle`, `max_ips`)
    /// stay in addresses. Default false.
    pub prefix_delegation: bool,
    /// Burst prefixes (Nitro instance types, without `prefix_delegation`): slots hold single
    /// secondary IPs, and a burst beyond the idle pool takes whole `/28`s in one assign on an ENI
    /// with free slots (EC2 lets both share an ENI), or falls over to one new ENI carrying it when
    /// the assign is throttled: one growth call per burst ([`super::growth`]). Counts stay in
    /// addresses; the node's capacity (tokens) counts every slot as a `/28`, as with prefix
    /// delegation (the kubelet's max-pods keeps the pods under its own limit). Ignored on other
    /// types. Default true (the fault soak's CI versions keep their invariants with it,
    /// `tests/soak.rs`; `docs/how-it-works.md` names the restart path a long run still finds).
    pub burst_prefixes: bool,
    /// With prefix delegation, after EC2 answers `InsufficientCidrBlocks` (no free `/28` in a
    /// subnet), new slots in that subnet are single addresses packed into blocks already fragmented,
    /// and prefixes are tried again after this long, doubling with each failure up to 30 min.
    /// Default 2 min.
    pub prefix_retry: Duration,
    /// How often the free-address count of the pod subnets is read again (one DescribeSubnets for
    /// all of them), jittered to between half and one and a half times this, so nodes that boot
    /// together do not ask together. Between reads the count follows what EC2 answers anyway (a
    /// subnet-full answer sets it to zero). Zero: read only at startup and before a create in a
    /// subnet not known yet.
    ///
    /// Default 30 min. DescribeSubnets shares the account's describe bucket (EC2's non-mutating
    /// bucket refills at about 20 calls per second per Region, shared by every node and every tool
    /// of the account): 5,000 nodes at one call per 30 min are about 2.8 calls per second, a small
    /// share that leaves the bucket to the calls pods wait on (DescribeNetworkInterfaces after an
    /// assign, the reconcile's). The count only steers the pick of a subnet for a new ENI and the
    /// short-subnet warm level; running out is still seen at once, from EC2's answers.
    pub subnet_refresh: Duration,
    /// The longest an acquire waits for EC2 when EC2 is slow to serve it (throttled, or an ENI or
    /// ENI creation backing off after transient failures, or its IP still on the way: an assign in
    /// flight or retried by the limiter, an ENI being created and attached) before it fails with
    /// [`super::PoolError::WaitedTooLong`]. While it waits, it keeps its capacity token and its place;
    /// the maintainer sends every waiter of the node in one batched call as soon as the ENI (or the
    /// API's throttle gate) takes calls again. A caller's own deadline (the CNI plugin's gRPC
    /// timeout) shortens it per request ([`super::Acquire::wait`]).
    ///
    /// Default 100 s. The runtime's bound is the kubelet's `runtimeRequestTimeout` (2 min by
    /// default) on RunPodSandbox, which covers the sandbox image, the netns and every CNI plugin of
    /// the chain; eniipam's plugin waits 105 s for the daemon by default (its 5 s margin for the
    /// answer makes this 100 s), which leaves 15 s for the pause container and the rest of the
    /// chain. A cold scale-up of 500 nodes on one account's refill has its last pods wait about
    /// that long; at 60 s, one pod in six failed once and was asked for again. A failed ADD costs
    /// the pod the kubelet's sync back-off (10 s, jittered up to 15 s) and the node a new request,
    /// so waiting within the budget is cheaper than failing and being asked again. Zero: fail at
    /// once (the earlier behaviour).
    pub add_wait: Duration,
    /// Timing of ENI create/attach/detach/delete.
    pub lifecycle: LifecycleConfig,
}

/// How the warm levels are chosen (see [`super::demand`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WarmPolicy {
    /// Learned from the node's pod starts and bursts, within `[min_idle, max_idle]`; given back
    /// slowly after a burst and at once when the subnet is short.
    #[default]
    Adaptive,
    /// Below `min_idle` top up to halfway to `max_idle`; give back above `max_idle` (and hold
    /// `minimum_ips`, pods included).
    Fixed,
}

impl WarmPolicy {
    /// The name used in configuration and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            WarmPolicy::Adaptive => "adaptive",
            WarmPolicy::Fixed => "fixed",
        }
    }
}

impl std::fmt::Display for WarmPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for WarmPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "adaptive" => Ok(WarmPolicy::Adaptive),
            "fixed" => Ok(WarmPolicy::Fixed),
            other => Err(format!("{other:?} is not adaptive or fixed")),
        }
    }
}

/// Addresses in one delegated prefix (`/28`): `eniipam-limits`' figure, the one the capacity formula uses.
pub const PREFIX_ADDRESSES: u32 = eniipam_limits::ADDRESSES_PER_PREFIX;

impl PoolConfig {
    /// How long an acquire may wait for EC2: `add_wait`, or less by the caller's own budget `wait`
    /// ([`super::Acquire::wait`]).
    pub fn add_budget(&self, wait: Option<Duration>) -> Duration {
        wait.map_or(self.add_wait, |w| w.min(self.add_wait))
    }

    /// What a top-up fills the idle IPs to once they fall below `min_idle`: halfway between
    /// `min_idle` and `max_idle` (rounded up). Refilling in one batch to the middle keeps a trickle
    /// of pods from costing an EC2 call each, and leaves room below `max_idle` for released IPs.
    pub fn refill_target(&self) -> u32 {
        self.min_idle + self.max_idle.saturating_sub(self.min_idle).div_ceil(2)
    }

    /// Addresses one slot holds: 16 with prefix delegation, else 1.
    pub fn addresses_per_slot(&self) -> u32 {
        if self.prefix_delegation {
            PREFIX_ADDRESSES
        } else {
            1
        }
    }

    /// The back-off before prefixes are tried again in a subnet after `failures` consecutive
    /// `InsufficientCidrBlocks`.
    pub fn prefix_retry_after(&self, failures: u32) -> Duration {
        let factor = 1u32
            .checked_shl(failures.saturating_sub(1).min(16))
            .unwrap_or(u32::MAX);
        self.prefix_retry
            .saturating_mul(factor)
            .min(Duration::from_secs(30 * 60))
    }
}

impl Default for PoolConfig {
    fn default() -> Self {
        Self {
            warm_policy: WarmPolicy::Adaptive,
            min_idle: 2,
            max_idle: 16,
            minimum_ips: 0,
            give_back_delay: Duration::from_secs(10 * 60),
            max_ips: None,
            max_enis: None,
            reuse_cooldown: Duration::from_secs(30),
            ip_stick_time: Duration::from_secs(5 * 60),
            batch_window: Duration::from_millis(5),
            backlog_depth: 256,
            subnet_backoff: Duration::from_secs(2 * 60),
            eni_backoff: Duration::from_secs(1),
            eni_backoff_max: Duration::from_secs(60),
            maintainer_tick: Duration::from_secs(5),
            max_concurrent_eni_creates: 4,
            imds_wait: Duration::from_secs(2),
            use_primary_eni: true,
            custom_networking: false,
            prefix_delegation: false,
            burst_prefixes: true,
            prefix_retry: Duration::from_secs(2 * 60),
            subnet_refresh: Duration::from_secs(30 * 60),
            add_wait: Duration::from_secs(100),
            lifecycle: LifecycleConfig::default(),
        }
    }
}

impl PoolConfig {
    /// Checks the values against each other; the error names the field to fix.
    pub fn validate(&self) -> Result<(), ConfigError> {
        fn bad(field: &'static str, problem: impl Into<String>) -> Result<(), ConfigError> {
            Err(ConfigError {
                field,
                problem: problem.into(),
            })
        }
        if self.min_idle > self.max_idle {
            return bad(
                "min_idle",
                format!(
                    "({}) must not exceed max_idle ({})",
                    self.min_idle, self.max_idle
                ),
            );
        }
        if self.minimum_ips > 10_000 {
            return bad(
                "minimum_ips",
                format!("({}) must be at most 10000", self.minimum_ips),
            );
        }
        if self.give_back_delay > Duration::from_secs(24 * 3600) {
            return bad(
                "give_back_delay",
                format!("({:?}) must be at most 24h", self.give_back_delay),
            );
        }
        if self.max_ips == Some(0) {
            return bad(
                "max_ips",
                "must be at least 1 (or unset for the instance limit)",
            );
        }
        if let Some(n) = self.max_enis
            && n < 2
        {
            return bad(
                "max_enis",
                format!("({n}) must be at least 2: eth0 is not used for pods"),
            );
        }
        if self.batch_window > Duration::from_secs(1) {
            return bad(
                "batch_window",
                format!(
                    "({:?}) must be at most 1s: every pod waits for it",
                    self.batch_window
                ),
            );
        }
        if self.backlog_depth == 0 {
            return bad("backlog_depth", "must be at least 1");
        }
        if self.maintainer_tick.is_zero() {
            return bad("maintainer_tick", "must be positive");
        }
        if self.max_concurrent_eni_creates == 0 {
            return bad("max_concurrent_eni_creates", "must be at least 1");
        }
        if self.eni_backoff.is_zero() {
            return bad("eni_backoff", "must be positive");
        }
        if self.eni_backoff > self.eni_backoff_max {
            return bad(
                "eni_backoff",
                format!(
                    "({:?}) must not exceed eni_backoff_max ({:?})",
                    self.eni_backoff, self.eni_backoff_max
                ),
            );
        }
        if self.subnet_backoff.is_zero() {
            return bad("subnet_backoff", "must be positive");
        }
        if self.add_wait > Duration::from_secs(600) {
            return bad(
                "add_wait",
                format!(
                    "({:?}) must be at most 10 min: the runtime gives up on the ADD long before",
                    self.add_wait
                ),
            );
        }
        Ok(())
    }

    /// Back-off after `failures` consecutive failures (1-based): `eni_backoff × 2^(failures−1)`,
    /// capped at `eni_backoff_max`.
    pub fn backoff_after(&self, failures: u32) -> Duration {
        let exp = failures.saturating_sub(1).min(20);
        self.eni_backoff
            .saturating_mul(1u32 << exp)
            .min(self.eni_backoff_max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_errors_name_the_field() {
        assert_eq!(PoolConfig::default().validate(), Ok(()));
        let err = PoolConfig {
            min_idle: 5,
            max_idle: 4,
            ..PoolConfig::default()
        }
        .validate()
        .unwrap_err();
        assert_eq!(err.field, "min_idle");
        assert!(err.to_string().contains("max_idle (4)"), "{err}");
        let err = PoolConfig {
            max_enis: Some(1),
            ..PoolConfig::default()
        }
        .validate()
        .unwrap_err();
        assert_eq!(err.field, "max_enis");
        let err = PoolConfig {
            backlog_depth: 0,
            ..PoolConfig::default()
        }
        .validate()
        .unwrap_err();
        assert_eq!(err.field, "backlog_depth");
    }

    #[test]
    fn backoff_doubles_and_caps() {
        let c = PoolConfig::default();
        assert_eq!(c.backoff_after(1), Duration::from_secs(1));
        assert_eq!(c.backoff_after(3), Duration::from_secs(4));
        assert_eq!(c.backoff_after(30), Duration::from_secs(60));
    }
}
