//! [`ApiBuckets`]: the node's own token bucket of each EC2 API.
//!
//! EC2 evaluates each API on its own bucket ("requests for other API are not affected", EC2
//! developer guide, *Request throttling for the Amazon EC2 API*), so one shared bucket per call
//! class would let a burst of `AssignPrivateIpAddresses` hold back the node's
//! `CreateNetworkInterface`, though EC2 would take it. Each API's bucket is made on the API's first
//! call: sized from [`LimiterConfig::per_api`] when the API is named there, from its class's rate
//! ([`RateLimitConfig`]) otherwise.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use super::{
    BucketConfig, CallClass, LimiterConfig, LimiterConfigError, RateLimitConfig, TokenBucket,
};

/// Every EC2 API eniipam calls: the names [`LimiterConfig::per_api`] accepts.
pub const EC2_APIS: [&str; 16] = [
    "AssignIpv6Addresses",
    "AssignPrivateIpAddresses",
    "AttachNetworkInterface",
    "CreateNetworkInterface",
    "CreateSubnetCidrReservation",
    "CreateTags",
    "DeleteNetworkInterface",
    "DescribeInstanceTypes",
    "DescribeInstances",
    "DescribeNetworkInterfaces",
    "DescribeSubnets",
    "DetachNetworkInterface",
    "GetSubnetCidrReservations",
    "ModifyNetworkInterfaceAttribute",
    "UnassignIpv6Addresses",
    "UnassignPrivateIpAddresses",
];

/// The node's buckets, one per EC2 API.
#[derive(Debug)]
pub(crate) struct ApiBuckets {
    classes: RateLimitConfig,
    configured: BTreeMap<&'static str, BucketConfig>,
    made: Mutex<HashMap<&'static str, Arc<TokenBucket>>>,
}

impl ApiBuckets {
    /// Checks every rate (the class defaults and each API's own) before any call is made.
    pub(crate) fn new(cfg: &LimiterConfig) -> Result<Self, LimiterConfigError> {
        TokenBucket::new("mutating", cfg.rates.mutating)?;
        TokenBucket::new("describe", cfg.rates.describe)?;
        let mut configured = BTreeMap::new();
        for (name, rate) in &cfg.per_api {
            let api = EC2_APIS
                .into_iter()
                .find(|a| a == name)
                .ok_or_else(|| LimiterConfigError::UnknownApi { api: name.clone() })?;
            TokenBucket::new(api, *rate)?;
            configured.insert(api, *rate);
        }
        Ok(Self {
            classes: cfg.rates,
            configured,
            made: Mutex::new(HashMap::new()),
        })
    }

    /// The rate `api`'s bucket has (or will have).
    pub(crate) fn rate(&self, api: &'static str, class: CallClass) -> BucketConfig {
        self.configured.get(api).copied().unwrap_or(match class {
            CallClass::Mutating => self.classes.mutating,
            CallClass::Describe => self.classes.describe,
        })
    }

    /// The bucket of `api`, made on its first call.
    pub(crate) fn of(&self, api: &'static str, class: CallClass) -> Arc<TokenBucket> {
        let mut made = self.made.lock().expect("buckets lock");
        made.entry(api)
            .or_insert_with(|| {
                let bucket = TokenBucket::new(api, self.rate(api, class));
                Arc::new(bucket.expect("every rate was checked when the limiter was built"))
            })
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::Instant;

    use super::super::{Limiter, RateLimitConfig};
    use super::*;
    use crate::calls::CallStats;

    fn limiter(per_api: &[(&str, BucketConfig)]) -> Limiter {
        let cfg = LimiterConfig {
            rates: RateLimitConfig {
                mutating: BucketConfig { qps: 1.0, burst: 2 },
                describe: BucketConfig { qps: 5.0, burst: 5 },
            },
            per_api: per_api.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect(),
            ..LimiterConfig::default()
        };
        Limiter::new(&cfg, Arc::new(CallStats::new())).unwrap()
    }

    async fn ok_call(l: &Limiter, api: &'static str, class: CallClass) -> Duration {
        let start = Instant::now();
        l.attempt(api, class, async { Ok(()) }).await.unwrap();
        start.elapsed()
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_of_one_api_does_not_spend_another_apis_bucket() {
        let l = limiter(&[]);
        // AssignPrivateIpAddresses empties its bucket (burst 2), then waits at 1/s.
        for _ in 0..2 {
            let w = ok_call(&l, "AssignPrivateIpAddresses", CallClass::Mutating).await;
            assert_eq!(w, Duration::ZERO);
        }
        let w = ok_call(&l, "AssignPrivateIpAddresses", CallClass::Mutating).await;
        assert_eq!(w, Duration::from_secs(1), "its own bucket is empty");
        // The same class's other APIs still have their whole burst: no wait at all.
        for api in ["CreateNetworkInterface", "AttachNetworkInterface"] {
            for _ in 0..2 {
                assert_eq!(ok_call(&l, api, CallClass::Mutating).await, Duration::ZERO);
            }
        }
        // The wait is labelled with the class; only the throttled API's third call waited.
        let snap = l.stats().snapshot();
        assert_eq!(snap.limiter_waits["mutating"].sum, Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_configured_api_gets_its_own_rate_and_the_rest_their_class() {
        let l = limiter(&[(
            "AssignPrivateIpAddresses",
            BucketConfig { qps: 4.0, burst: 4 },
        )]);
        assert_eq!(
            l.rate("AssignPrivateIpAddresses", CallClass::Mutating),
            BucketConfig { qps: 4.0, burst: 4 }
        );
        assert_eq!(
            l.rate("UnassignPrivateIpAddresses", CallClass::Mutating),
            BucketConfig { qps: 1.0, burst: 2 }
        );
        for _ in 0..4 {
            let w = ok_call(&l, "AssignPrivateIpAddresses", CallClass::Mutating).await;
            assert_eq!(w, Duration::ZERO);
        }
        let w = ok_call(&l, "AssignPrivateIpAddresses", CallClass::Mutating).await;
        assert_eq!(w, Duration::from_millis(250), "4/s");
    }

    #[test]
    fn bad_per_api_rates_are_refused_naming_the_api() {
        let stats = || Arc::new(CallStats::new());
        let typo = LimiterConfig {
            per_api: [(
                "AssignPrivateIpAdresses".to_owned(),
                BucketConfig { qps: 1.0, burst: 1 },
            )]
            .into(),
            ..LimiterConfig::default()
        };
        let e = Limiter::new(&typo, stats()).unwrap_err();
        assert_eq!(
            e,
            LimiterConfigError::UnknownApi {
                api: "AssignPrivateIpAdresses".into()
            }
        );
        assert!(e.to_string().contains("AssignPrivateIpAdresses"), "{e}");
        let zero = LimiterConfig {
            per_api: [("CreateTags".to_owned(), BucketConfig { qps: 1.0, burst: 0 })].into(),
            ..LimiterConfig::default()
        };
        assert_eq!(
            Limiter::new(&zero, stats()).unwrap_err(),
            LimiterConfigError::ZeroBurst {
                bucket: "CreateTags"
            }
        );
    }
}
