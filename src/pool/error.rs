//! The pool's typed errors.
//!
//! Every error an acquire can end in is a [`PoolError`]; the RPC layer maps
//! [`PoolError::is_retryable`] errors to CNI error 11 ("try again later") with the message as the
//! reason, and the rest to the error the CNI spec has for them.

use std::net::Ipv4Addr;
use std::time::Duration;

use crate::cloud::CloudError;
use crate::model::EniId;

/// Why the node cannot get another IP right now.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum ExhaustionReason {
    /// Every capacity token is taken: the node holds as many IPs as it may.
    #[error(
        "all {capacity} IP slots of this node are in use ({cooling} idle but cooling down, {reserved} reserved for sticky pods)"
    )]
    CapacityReached {
        capacity: u32,
        cooling: u32,
        reserved: u32,
    },
    /// No device index is left for another ENI and no ENI is being created or released.
    #[error("no ENI slot left: the node may have {max_enis} interfaces and has them all")]
    NoEniSlot { max_enis: u32 },
    /// EC2 said the subnet is full or a limit is reached; the subnet backs off.
    #[error("subnet {subnet_id}: {error}")]
    Cloud {
        subnet_id: String,
        /// What EC2 said (boxed: errors stay small on the happy path).
        error: Box<CloudError>,
    },
}

/// What is backing off after failures.
/// Why a network profile cannot serve a pod ([`PoolError::ProfileUnavailable`]).
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum ProfileUnavailableReason {
    #[error("this node does not serve it")]
    Unknown,
    #[error("its {enis} ENIs are full and it may have at most {max_enis}")]
    MaxEnis { enis: u32, max_enis: u32 },
    #[error(
        "its {enis} ENIs are full and the node has no ENI slot left (at most {max_enis} interfaces)"
    )]
    NoEniSlot { enis: u32, max_enis: u32 },
    #[error("{0}")]
    Exhausted(Box<PoolError>),
    /// The daemon cannot use the profile (no such NetworkProfile, an invalid one, or one whose
    /// subnet or groups EC2 refuses for this node): why, naming the object and the field. Retryable:
    /// once the operator fixes the object, the runtime's next try works.
    #[error("{0}")]
    NotUsable(String),
}

impl ProfileUnavailableReason {
    /// Only an unknown profile is final; the rest is a matter of capacity.
    pub fn is_retryable(&self) -> bool {
        !matches!(self, Self::Unknown)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackoffTarget {
    /// One ENI's assign/unassign calls.
    Eni(EniId),
    /// Creating ENIs in a subnet.
    EniCreation { subnet_id: String },
}

impl std::fmt::Display for BackoffTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Eni(id) => write!(f, "ENI {id}"),
            Self::EniCreation { subnet_id } => write!(f, "ENI creation in {subnet_id}"),
        }
    }
}

/// Why a preferred IP was refused.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum PreferUnavailable {
    /// Another attachment holds it.
    #[error("it is assigned to another attachment")]
    Assigned,
    /// It was released recently and is still cooling down.
    #[error("it was released recently and cools down for {remaining:?} more")]
    Cooling { remaining: Duration },
    /// It is reserved for another sticky key.
    #[error("it is reserved for another pod for {remaining:?} more")]
    ReservedForOther { remaining: Duration },
    /// It is being given back to EC2.
    #[error("it is being given back to EC2")]
    BeingReleased,
    /// The pool does not hold it.
    #[error("it is not in this node's pool")]
    NotInPool,
    #[error("it belongs to another network (profile) than the pod's")]
    OtherNetwork,
}

/// Everything an acquire (or the pool's start) can fail with.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum PoolError {
    /// No IP can be had now: capacity reached, subnet full, limits reached. CNI error 11.
    #[error("no IP available: {reason}")]
    Exhausted {
        reason: ExhaustionReason,
        /// When trying again may help, if the pool knows.
        retry_after: Option<Duration>,
    },
    /// The request named an IP the pool cannot give this caller. Never answered with another IP.
    #[error("preferred IP {ip} is not available: {reason}")]
    PreferredUnavailable {
        ip: Ipv4Addr,
        reason: PreferUnavailable,
    },
    /// The ENI (or ENI creation) that would serve this request is backing off after failures.
    #[error("{target} is backing off for {retry_after:?} after: {last_error}")]
    BackingOff {
        target: BackoffTarget,
        retry_after: Duration,
        /// The failure that started the back-off (boxed: errors stay small on the happy path).
        last_error: Box<CloudError>,
    },
    /// The cloud call made for this request failed.
    #[error("cloud call failed: {0}")]
    Cloud(#[from] CloudError),
    /// The request waited its whole budget for EC2 (throttled, or backing off after failures) and
    /// is answered before the caller's own deadline; the runtime retries the ADD. CNI error 11.
    #[error("waited {waited:?} for EC2 to serve a new IP, the most this request may: {last_error}")]
    WaitedTooLong {
        waited: Duration,
        /// The EC2 failure it was waiting out (boxed: errors stay small on the happy path).
        last_error: Box<PoolError>,
    },
    /// What a request whose budget ran out was still waiting for, when it was not a back-off: its IP
    /// was on the way from EC2 (a call in flight or being retried, or a new ENI being created and
    /// attached). Only ever inside [`PoolError::WaitedTooLong`].
    #[error(
        "its IP was still on the way from EC2 (a call in flight or retried, or a new ENI being created and attached)"
    )]
    StillComing,
    /// The attachment was released while its IP was still being fetched.
    #[error("attachment released while its IP was being assigned")]
    ReleasedWhilePending,
    /// The request that was fetching this attachment's IP was cancelled before it reached an ENI;
    /// a repeated request gets a fresh one.
    #[error("the request fetching this attachment's IP was cancelled; try again")]
    Abandoned,
    /// The pool is shutting down.
    #[error("the IP pool is shutting down")]
    ShuttingDown,
    /// Custom networking is on and the node's ENIConfig cannot be used, so no ENI can be created
    /// for this pod (CNI error 11: the ADD is tried again once the operator fixes the ENIConfig).
    #[error("no new ENI can be created for pods: {reason}")]
    NoPodNetwork { reason: String },
    /// A pod's network profile cannot serve it: the node does not serve the profile (not
    /// retryable: retrying here cannot help), or the profile's ENIs are full and it may not have
    /// another (retryable: an IP may free up).
    #[error("network profile {profile} cannot serve this pod: {reason}")]
    ProfileUnavailable {
        profile: String,
        reason: ProfileUnavailableReason,
    },
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] super::ConfigError),
    /// The startup seed is inconsistent.
    #[error(transparent)]
    Seed(#[from] super::SeedError),
}

impl PoolError {
    /// Whether the caller should try again later (CNI error 11).
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Exhausted { .. }
            | Self::BackingOff { .. }
            | Self::ReleasedWhilePending
            | Self::Abandoned
            | Self::WaitedTooLong { .. }
            | Self::StillComing
            | Self::NoPodNetwork { .. }
            | Self::ShuttingDown => true,
            Self::ProfileUnavailable { reason, .. } => reason.is_retryable(),
            Self::Cloud(e) => e.is_transient() || e.is_capacity(),
            Self::PreferredUnavailable { .. } | Self::Config(_) | Self::Seed(_) => false,
        }
    }

    /// Whether an acquire that met this error may wait, within its budget, for the pool to try
    /// again rather than fail now: EC2 throttled the call or it failed transiently (retries ran out
    /// or not), or the ENI (or ENI creation) serving it backs off after such a failure. Not for
    /// capacity, permissions, rejections or a vanished ENI: waiting would not change those.
    pub fn is_worth_waiting(&self) -> bool {
        match self {
            Self::BackingOff { last_error, .. } => last_error.is_transient(),
            Self::Cloud(e) => e.is_transient(),
            _ => false,
        }
    }

    /// How long the failure says it lasts at least, when it says: a back-off's time left.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::BackingOff { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }

    /// Whether this is an exhaustion (capacity, subnet, limits).
    pub fn is_exhausted(&self) -> bool {
        matches!(self, Self::Exhausted { .. })
    }
}
