//! Subnet CIDR reservations of type `prefix`, made by eniipam for its `/28` prefixes.
//!
//! Single addresses that come and go fragment a subnet until no aligned `/28` is free
//! (`InsufficientCidrBlocks`), and a node that takes prefixes then gets none. A `prefix`
//! reservation keeps a block of the subnet for prefixes: EC2 takes automatic prefixes from it first
//! and never hands out an automatic single address inside any reservation. EC2 checks a new
//! reservation against the others of the subnet and against the addresses in use, and refuses with
//! `InvalidParameterValue` for both; the daemon decides on which ([`ReserveError`]): an overlap may
//! be another node's reservation of the same block (a fleet starting together picks the same
//! block), addresses in use send it to the next block.

use std::collections::BTreeMap;

use ipnet::Ipv4Net;

use crate::CloudError;

/// A `CreateSubnetCidrReservation` of type `prefix`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrefixReservation {
    pub subnet_id: String,
    /// A canonical block inside the subnet.
    pub cidr: Ipv4Net,
    /// Who made it and why (EC2 shows it in the console and in GetSubnetCidrReservations).
    pub description: String,
    /// Tags given in the create (tag-on-create, `ec2:CreateAction = CreateSubnetCidrReservation`).
    pub tags: BTreeMap<String, String>,
}

/// Why a reservation was not made.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum ReserveError {
    /// The block overlaps a reservation the subnet has already (another node's, maybe of this very
    /// block: read the reservations again).
    #[error("{cidr} overlaps a reservation of the subnet: {message}")]
    Overlaps { cidr: Ipv4Net, message: String },
    /// The block covers addresses in use (try another block).
    #[error("{cidr} covers addresses in use: {message}")]
    AddressesInUse { cidr: Ipv4Net, message: String },
    /// Anything else, classified as every EC2 error is (throttled, unauthorized, ...).
    #[error(transparent)]
    Cloud(#[from] CloudError),
}

/// The answer of [`crate::Cloud::create_subnet_prefix_reservation`]: the block reserved.
pub type ReserveResult = Result<Ipv4Net, ReserveError>;

impl ReserveError {
    /// Reads a refusal of `cidr`: EC2 names both an overlap and addresses in use with
    /// `InvalidParameterValue`, told apart by the message ("… has overlap with existing reserved
    /// CIDR block", mockcloud's "overlaps the reservation …"; "… in use"), here only.
    pub fn of(cidr: Ipv4Net, e: CloudError) -> Self {
        match e {
            CloudError::Rejected { code, message, .. } if code == "InvalidParameterValue" => {
                let m = message.to_ascii_lowercase();
                if m.contains("overlap") {
                    Self::Overlaps { cidr, message }
                } else if m.contains("in use") || m.contains("in-use") {
                    Self::AddressesInUse { cidr, message }
                } else {
                    Self::Cloud(CloudError::Rejected {
                        api: "CreateSubnetCidrReservation".into(),
                        code,
                        message,
                    })
                }
            }
            other => Self::Cloud(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rejected(message: &str) -> CloudError {
        CloudError::Rejected {
            api: "CreateSubnetCidrReservation".into(),
            code: "InvalidParameterValue".into(),
            message: message.into(),
        }
    }

    #[test]
    fn refusals_are_told_apart_by_their_words() {
        let cidr: Ipv4Net = "10.0.1.64/26".parse().unwrap();
        for overlap in [
            "Reservation CIDR 10.0.1.64/26 has overlap with existing reserved CIDR block",
            "The CIDR overlaps the reservation scr-1 (10.0.1.64/26).",
        ] {
            let e = ReserveError::of(cidr, rejected(overlap));
            assert!(matches!(e, ReserveError::Overlaps { .. }), "{e}");
        }
        let e = ReserveError::of(
            cidr,
            rejected("The CIDR covers 10.0.1.70, which is in use."),
        );
        assert!(matches!(e, ReserveError::AddressesInUse { .. }), "{e}");
        let e = ReserveError::of(
            cidr,
            rejected("The CIDR must lie within the subnet's range"),
        );
        assert!(
            matches!(e, ReserveError::Cloud(CloudError::Rejected { .. })),
            "{e}"
        );
        let denied = CloudError::Unauthorized {
            api: "CreateSubnetCidrReservation".into(),
            permission: "ec2:CreateSubnetCidrReservation".into(),
            message: String::new(),
        };
        assert_eq!(
            ReserveError::of(cidr, denied.clone()),
            ReserveError::Cloud(denied)
        );
    }
}
