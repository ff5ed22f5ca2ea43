//! EC2's request throttling as mockcloud models it ("Request throttling for the Amazon EC2 API", EC2
//! developer guide, <https://docs.aws.amazon.com/ec2/latest/devguide/ec2-api-throttling.html>):
//! "each API is evaluated individually". Every API has its own token bucket for the whole account
//! (all instances of a fleet share it); a call takes one token from its API's bucket, so a call
//! throttled on one API spends nothing of another's. An empty bucket answers `RequestLimitExceeded`
//! (HTTP 503).
//!
//! A bucket's size and refill rate are EC2's table's: the APIs it lists one by one ("uncategorized
//! actions": the ENI and address actions, tags, CIDR reservations) have their own figures
//! ([`OWN_BUCKETS`]); every other API takes its category's (non-mutating 100 / 20 s⁻¹, mutating
//! 50 / 5 s⁻¹, resource-intensive 50 / 5 s⁻¹), in a bucket of its own. A `DescribeInstances` or
//! `DescribeNetworkInterfaces` with no filter, no IDs and no pagination draws from the API's second,
//! smaller bucket, `API:unfiltered` (50 / 10 s⁻¹).
//!
//! Every bucket is configurable: [`Throttling::set`] by API (or `API:unfiltered`) or by category.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::actions::{ACTIONS, ActionClass};

/// The suffix of an API's unfiltered-and-unpaginated bucket: `DescribeNetworkInterfaces:unfiltered`.
pub const UNFILTERED: &str = ":unfiltered";

/// EC2's "unfiltered and unpaginated non-mutating actions": asked with no filter, no IDs and no
/// pagination, they draw from a smaller bucket.
pub const UNFILTERED_APIS: &[&str] = &[
    "DescribeInstances",
    "DescribeInstanceStatus",
    "DescribeNetworkInterfaces",
    "DescribeSecurityGroups",
    "DescribeSnapshots",
    "DescribeSpotInstanceRequests",
    "DescribeVolumes",
];

/// EC2's "resource-intensive actions" (mockcloud serves Authorize/RevokeSecurityGroupIngress of
/// them; the others are listed so that the category reads as EC2's).
pub const RESOURCE_INTENSIVE: &[&str] = &[
    "AcceptVpcPeeringConnection",
    "AuthorizeSecurityGroupIngress",
    "CancelSpotInstanceRequests",
    "CreateKeyPair",
    "CreateVpcPeeringConnection",
    "DeleteVpcPeeringConnection",
    "RejectVpcPeeringConnection",
    "RevokeSecurityGroupIngress",
    "RequestSpotInstances",
];

/// EC2's "uncategorized actions" among the APIs mockcloud serves, with their own bucket:
/// (API, capacity, refill per second). `AttachNetworkInterface` and `DetachNetworkInterface` are not
/// in EC2's list: they take the mutating category's size. `AssignIpv6Addresses` and
/// `UnassignIpv6Addresses` take the mutating category's size too (each in its own bucket): no row
/// for them could be confirmed in the copy of the table this was built from, and the smaller
/// category size is never kinder than EC2.
pub const OWN_BUCKETS: &[(&str, f64, f64)] = &[
    ("AssignPrivateIpAddresses", 100.0, 5.0),
    ("CreateNetworkInterface", 100.0, 5.0),
    ("CreateSubnetCidrReservation", 5.0, 1.0),
    ("CreateTags", 100.0, 10.0),
    ("DeleteNetworkInterface", 100.0, 5.0),
    ("DeleteSubnetCidrReservation", 5.0, 1.0),
    ("DeleteTags", 100.0, 10.0),
    ("ModifyNetworkInterfaceAttribute", 100.0, 5.0),
    ("UnassignPrivateIpAddresses", 100.0, 5.0),
];

/// One token bucket: `capacity` requests at once, refilled at `refill_per_sec`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Bucket {
    pub capacity: f64,
    pub refill_per_sec: f64,
}

impl Bucket {
    pub const fn new(capacity: f64, refill_per_sec: f64) -> Self {
        Self {
            capacity,
            refill_per_sec,
        }
    }

    fn check(&self, name: &str) -> Result<(), ThrottlingError> {
        if self.capacity >= 1.0
            && self.capacity.is_finite()
            && self.refill_per_sec > 0.0
            && self.refill_per_sec.is_finite()
        {
            Ok(())
        } else {
            Err(ThrottlingError::BadBucket {
                name: name.to_owned(),
                bucket: *self,
            })
        }
    }
}

/// EC2's request-rate categories: the size of every API's bucket that EC2's table does not list one
/// by one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    /// Describe*, Get*, List*, Search*.
    NonMutating,
    /// The unfiltered and unpaginated calls of [`UNFILTERED_APIS`].
    Unfiltered,
    /// Everything else that changes something.
    Mutating,
    /// [`RESOURCE_INTENSIVE`].
    ResourceIntensive,
}

impl Category {
    pub const ALL: [Self; 4] = [
        Self::NonMutating,
        Self::Unfiltered,
        Self::Mutating,
        Self::ResourceIntensive,
    ];

    /// Its name in the control API and the `--throttle` flag.
    pub fn name(self) -> &'static str {
        match self {
            Self::NonMutating => "non_mutating",
            Self::Unfiltered => "unfiltered",
            Self::Mutating => "mutating",
            Self::ResourceIntensive => "resource_intensive",
        }
    }

    pub fn named(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.name() == name)
    }

    /// The category of a bucket (`API` or `API:unfiltered`).
    pub fn of(bucket: &str) -> Self {
        if bucket.ends_with(UNFILTERED) {
            Self::Unfiltered
        } else if RESOURCE_INTENSIVE.contains(&bucket) {
            Self::ResourceIntensive
        } else if ActionClass::of(bucket) == ActionClass::Describe {
            Self::NonMutating
        } else {
            Self::Mutating
        }
    }
}

/// The bucket a call of `action` draws from; `unfiltered`: it names no filter, no IDs and no
/// pagination.
pub fn bucket_for(action: &str, unfiltered: bool) -> String {
    if unfiltered && UNFILTERED_APIS.contains(&action) {
        format!("{action}{UNFILTERED}")
    } else {
        action.to_owned()
    }
}

/// Every bucket mockcloud has: one per API it serves, and the unfiltered one of each of
/// [`UNFILTERED_APIS`] it serves.
pub fn bucket_names() -> Vec<String> {
    let mut names = Vec::new();
    for a in ACTIONS {
        names.push((*a).to_owned());
        if UNFILTERED_APIS.contains(a) {
            names.push(format!("{a}{UNFILTERED}"));
        }
    }
    names
}

/// Whether `name` is a bucket mockcloud has (an API it serves, or `API:unfiltered` for one of
/// [`UNFILTERED_APIS`]).
pub(crate) fn is_bucket(name: &str) -> bool {
    match name.strip_suffix(UNFILTERED) {
        Some(api) => ACTIONS.contains(&api) && UNFILTERED_APIS.contains(&api),
        None => ACTIONS.contains(&name),
    }
}

/// A throttling setting mockcloud refuses, named.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ThrottlingError {
    #[error(
        "unknown throttling bucket {0:?}: name an API mockcloud serves ({apis}), `API{UNFILTERED}` for {unfiltered}, or a category ({categories})",
        apis = ACTIONS.join(", "),
        unfiltered = ACTIONS.iter().filter(|a| UNFILTERED_APIS.contains(a)).copied().collect::<Vec<_>>().join(", "),
        categories = Category::ALL.map(Category::name).join(", ")
    )]
    UnknownBucket(String),
    #[error(
        "throttling bucket {name:?}: capacity must be >= 1 and refill_per_sec > 0 (got capacity {}, refill_per_sec {})",
        bucket.capacity,
        bucket.refill_per_sec
    )]
    BadBucket { name: String, bucket: Bucket },
}

/// Account-level request throttling, as EC2 does it: one bucket per API for the whole account.
/// A JSON body may leave fields out: they keep EC2's defaults.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Throttling {
    pub enabled: bool,
    /// The size of each non-mutating API's bucket that `apis` does not size.
    #[serde(alias = "describe")]
    pub non_mutating: Bucket,
    /// The size of each `API:unfiltered` bucket that `apis` does not size.
    pub unfiltered: Bucket,
    /// The size of each mutating API's bucket that `apis` does not size.
    pub mutating: Bucket,
    /// The size of each resource-intensive API's bucket that `apis` does not size.
    pub resource_intensive: Bucket,
    /// Buckets sized one by one, by API (or `API:unfiltered`): EC2's [`OWN_BUCKETS`] by default.
    pub apis: BTreeMap<String, Bucket>,
}

impl Default for Throttling {
    /// EC2's published table.
    fn default() -> Self {
        Self {
            enabled: true,
            non_mutating: Bucket::new(100.0, 20.0),
            unfiltered: Bucket::new(50.0, 10.0),
            mutating: Bucket::new(50.0, 5.0),
            resource_intensive: Bucket::new(50.0, 5.0),
            apis: OWN_BUCKETS
                .iter()
                .map(|&(api, capacity, refill)| (api.to_owned(), Bucket::new(capacity, refill)))
                .collect(),
        }
    }
}

impl Throttling {
    pub fn disabled() -> Self {
        Self {
            enabled: false,
            ..Self::default()
        }
    }

    /// Every API's bucket (each its own) sized `mutating` or `describe` by the API's class, the
    /// unfiltered ones as `describe`: a small account for tests.
    pub fn uniform(mutating: Bucket, describe: Bucket) -> Self {
        Self {
            enabled: true,
            non_mutating: describe,
            unfiltered: describe,
            mutating,
            resource_intensive: mutating,
            apis: BTreeMap::new(),
        }
    }

    /// This with one bucket (or category) changed; panics on a bad name or size (for tests and
    /// benchmarks, whose names are constants).
    pub fn with(mut self, name: &str, bucket: Bucket) -> Self {
        if let Err(e) = self.set(name, bucket) {
            panic!("{e}");
        }
        self
    }

    /// Sizes one bucket (an API, or `API:unfiltered`), or a category's default.
    pub fn set(&mut self, name: &str, bucket: Bucket) -> Result<(), ThrottlingError> {
        bucket.check(name)?;
        if let Some(c) = Category::named(name) {
            *self.category_mut(c) = bucket;
        } else if is_bucket(name) {
            self.apis.insert(name.to_owned(), bucket);
        } else {
            return Err(ThrottlingError::UnknownBucket(name.to_owned()));
        }
        Ok(())
    }

    /// Every name known and every size sound.
    pub fn validate(&self) -> Result<(), ThrottlingError> {
        for c in Category::ALL {
            self.category(c).check(c.name())?;
        }
        for (name, b) in &self.apis {
            if !is_bucket(name) {
                return Err(ThrottlingError::UnknownBucket(name.clone()));
            }
            b.check(name)?;
        }
        Ok(())
    }

    /// The size of a bucket (`API` or `API:unfiltered`).
    pub fn bucket(&self, name: &str) -> Bucket {
        self.apis
            .get(name)
            .copied()
            .unwrap_or_else(|| self.category(Category::of(name)))
    }

    pub fn category(&self, c: Category) -> Bucket {
        match c {
            Category::NonMutating => self.non_mutating,
            Category::Unfiltered => self.unfiltered,
            Category::Mutating => self.mutating,
            Category::ResourceIntensive => self.resource_intensive,
        }
    }

    fn category_mut(&mut self, c: Category) -> &mut Bucket {
        match c {
            Category::NonMutating => &mut self.non_mutating,
            Category::Unfiltered => &mut self.unfiltered,
            Category::Mutating => &mut self.mutating,
            Category::ResourceIntensive => &mut self.resource_intensive,
        }
    }
}

/// One bucket as it stands: its size and its tokens now.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BucketLevel {
    pub bucket: String,
    pub category: Category,
    /// Sized one by one (in `apis`), not by its category.
    pub own: bool,
    pub capacity: f64,
    pub refill_per_sec: f64,
    pub tokens: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_ec2s_table() {
        let t = Throttling::default();
        let size = |name: &str| {
            let b = t.bucket(name);
            (b.capacity, b.refill_per_sec)
        };
        assert_eq!(size("AssignPrivateIpAddresses"), (100.0, 5.0));
        assert_eq!(size("CreateNetworkInterface"), (100.0, 5.0));
        assert_eq!(size("ModifyNetworkInterfaceAttribute"), (100.0, 5.0));
        assert_eq!(size("CreateTags"), (100.0, 10.0));
        assert_eq!(size("CreateSubnetCidrReservation"), (5.0, 1.0));
        assert_eq!(size("AttachNetworkInterface"), (50.0, 5.0), "mutating");
        assert_eq!(size("DescribeSubnets"), (100.0, 20.0), "non-mutating");
        assert_eq!(size("DescribeNetworkInterfaces"), (100.0, 20.0));
        assert_eq!(size("DescribeNetworkInterfaces:unfiltered"), (50.0, 10.0));
        assert_eq!(
            Category::of("RequestSpotInstances"),
            Category::ResourceIntensive
        );
        t.validate().unwrap();
    }

    #[test]
    fn unfiltered_buckets_only_for_ec2s_list() {
        assert_eq!(
            bucket_for("DescribeInstances", true),
            "DescribeInstances:unfiltered"
        );
        assert_eq!(bucket_for("DescribeInstances", false), "DescribeInstances");
        assert_eq!(bucket_for("DescribeSubnets", true), "DescribeSubnets");
        let names = bucket_names();
        // DescribeInstances, DescribeNetworkInterfaces and DescribeSecurityGroups have a second one.
        assert_eq!(names.len(), ACTIONS.len() + 3, "{names:?}");
        assert!(names.iter().all(|n| is_bucket(n)));
    }

    #[test]
    fn bad_settings_are_refused_by_name() {
        let mut t = Throttling::default();
        let e = t
            .set("AssignPrivateIpAdresses", Bucket::new(10.0, 1.0))
            .unwrap_err();
        assert!(e.to_string().contains("\"AssignPrivateIpAdresses\""), "{e}");
        let e = t
            .set("DescribeSubnets:unfiltered", Bucket::new(10.0, 1.0))
            .unwrap_err();
        assert_eq!(
            e,
            ThrottlingError::UnknownBucket("DescribeSubnets:unfiltered".into())
        );
        let e = t.set("CreateTags", Bucket::new(0.5, 1.0)).unwrap_err();
        assert!(e.to_string().contains("\"CreateTags\""), "{e}");
        assert!(t.set("mutating", Bucket::new(10.0, 0.0)).is_err());
        assert_eq!(t, Throttling::default(), "nothing changed");
        t.apis.insert("Nope".into(), Bucket::new(1.0, 1.0));
        assert_eq!(
            t.validate(),
            Err(ThrottlingError::UnknownBucket("Nope".into()))
        );
    }

    #[test]
    fn a_category_sizes_only_the_apis_it_does_not_list() {
        let t = Throttling::default().with("mutating", Bucket::new(3.0, 1.0));
        assert_eq!(t.bucket("DetachNetworkInterface"), Bucket::new(3.0, 1.0));
        assert_eq!(
            t.bucket("AssignPrivateIpAddresses"),
            Bucket::new(100.0, 5.0)
        );
    }
}
