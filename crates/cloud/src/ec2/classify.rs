//! EC2's errors in domain terms: an SDK error is classified once, here, by the EC2 error code
//! (`ProvideErrorMetadata::code()`) and the raw HTTP status, into a [`CloudError`] callers decide on
//! by kind (throttled, capacity, not found, ...), never by text.

use aws_sdk_ec2::error::{ProvideErrorMetadata, SdkError};
use aws_smithy_runtime_api::http::Response as HttpResponse;
use eniipam_api::error_chain;

use crate::CloudError;

/// Transient failures may have taken effect on EC2's side (the request was possibly sent).
pub(super) fn is_ambiguous(err: &CloudError) -> bool {
    matches!(err, CloudError::Transient { .. })
}

impl CloudError {
    /// EC2 refused an unassign because an address or prefix it names is not on the ENI (gone out
    /// of band): the call changed nothing, and not every address it names is the ENI's.
    pub fn is_not_assigned(&self) -> bool {
        matches!(self, Self::Rejected { code, message, .. }
            if code == "InvalidParameterValue" && message.contains("not assigned to interface"))
    }
}

/// Classify an SDK error into a [`CloudError`] by EC2 error code and HTTP status.
pub fn classify<E>(api: &str, err: SdkError<E, HttpResponse>) -> CloudError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let api_s = api.to_owned();
    match &err {
        SdkError::TimeoutError(_) => {
            return CloudError::Transient {
                api: api_s,
                message: "timed out".into(),
            };
        }
        SdkError::DispatchFailure(d) => {
            let kind = if d.is_timeout() {
                "timed out connecting"
            } else if d.is_io() {
                "I/O failure"
            } else {
                "dispatch failure"
            };
            return CloudError::Transient {
                api: api_s,
                message: format!("{kind}: {}", error_chain(&err)),
            };
        }
        SdkError::ResponseError(_) => {
            return CloudError::Transient {
                api: api_s,
                message: format!("unreadable response: {}", error_chain(&err)),
            };
        }
        SdkError::ConstructionFailure(_) => {
            return CloudError::Rejected {
                api: api_s,
                code: "ConstructionFailure".into(),
                message: error_chain(&err),
            };
        }
        _ => {}
    }
    let status = err.raw_response().map(|r| r.status().as_u16());
    let code = err.code().unwrap_or_default().to_owned();
    let message = err.message().unwrap_or_default().to_owned();
    classify_code(api, &code, &message, status)
}

/// The action an `UnauthorizedOperation` message names as refused (`… is not authorized to perform:
/// ec2:CreateTags on resource: …`), when it names one.
fn refused_permission(message: &str) -> Option<String> {
    let rest = message.split("not authorized to perform: ").nth(1)?;
    let action = rest.split_whitespace().next()?.trim_end_matches([',', '.']);
    (action.contains(':') && !action.is_empty()).then(|| action.to_owned())
}

/// Whether a refusal's message says the subnet has no IPv6 CIDR block. EC2 has no code of its own
/// for it (`InvalidParameterValue`, like any bad value), so the message is read, here only: "The
/// subnet … does not have an IPv6 CIDR block", "… unless the subnet … has an IPv6 CIDR block
/// associated with it". A prefix outside the subnet's block ("… inside the subnet's IPv6 CIDR
/// block") is not it.
fn names_missing_ipv6_cidr(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    m.contains("ipv6 cidr block")
        && (m.contains("does not have")
            || m.contains("has no ipv6")
            || m.contains("unless the subnet"))
}

/// The classification of a service error by its `code`, `message` and HTTP `status`.
pub fn classify_code(api: &str, code: &str, message: &str, status: Option<u16>) -> CloudError {
    let api = api.to_owned();
    let message = message.to_owned();
    match code {
        "RequestLimitExceeded" | "Throttling" | "ThrottlingException" => CloudError::Throttled {
            api,
            code: code.to_owned(),
        },
        "InsufficientFreeAddressesInSubnet" => CloudError::SubnetFull { api, message },
        "PrivateIpAddressLimitExceeded" => CloudError::IpLimitExceeded { api, message },
        "AttachmentLimitExceeded" => CloudError::AttachmentLimitExceeded { api, message },
        "InsufficientCidrBlocks" => CloudError::NoFreePrefix { api, message },
        "InvalidParameterValue" | "InvalidParameterCombination"
            if names_missing_ipv6_cidr(&message) =>
        {
            CloudError::NoIpv6Cidr { api, message }
        }
        "UnauthorizedOperation" => CloudError::Unauthorized {
            permission: refused_permission(&message).unwrap_or_else(|| format!("ec2:{api}")),
            api,
            message,
        },
        c if c.ends_with(".NotFound") => CloudError::NotFound {
            api,
            code: code.to_owned(),
            message,
        },
        "InternalError" | "InternalFailure" | "ServiceUnavailable" | "Unavailable" => {
            CloudError::Transient {
                api,
                message: format!("{code}: {message}"),
            }
        }
        _ => match status {
            Some(s) if s >= 500 => CloudError::Transient {
                api,
                message: format!("HTTP {s} {code}: {message}"),
            },
            Some(429) => CloudError::Throttled {
                api,
                code: if code.is_empty() {
                    "HTTP 429".into()
                } else {
                    code.to_owned()
                },
            },
            Some(s) if (400..500).contains(&s) => CloudError::Rejected {
                api,
                code: if code.is_empty() {
                    format!("HTTP {s}")
                } else {
                    code.to_owned()
                },
                message,
            },
            other => CloudError::Transient {
                api,
                message: format!("unexpected reply (status {other:?}) {code}: {message}"),
            },
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_classified() {
        let c = |code, status| classify_code("Op", code, "msg", status);
        assert!(matches!(
            c("RequestLimitExceeded", Some(503)),
            CloudError::Throttled { .. }
        ));
        assert!(matches!(
            c("Throttling", Some(400)),
            CloudError::Throttled { .. }
        ));
        assert!(matches!(
            c("InsufficientFreeAddressesInSubnet", Some(400)),
            CloudError::SubnetFull { .. }
        ));
        assert!(matches!(
            c("PrivateIpAddressLimitExceeded", Some(400)),
            CloudError::IpLimitExceeded { .. }
        ));
        assert!(matches!(
            c("AttachmentLimitExceeded", Some(400)),
            CloudError::AttachmentLimitExceeded { .. }
        ));
        assert!(matches!(
            c("InvalidNetworkInterfaceID.NotFound", Some(400)),
            CloudError::NotFound { .. }
        ));
        assert!(matches!(
            c("InvalidAttachmentID.NotFound", Some(400)),
            CloudError::NotFound { .. }
        ));
        assert!(matches!(
            c("InternalError", Some(500)),
            CloudError::Transient { .. }
        ));
        assert!(matches!(
            c("Whatever", Some(502)),
            CloudError::Transient { .. }
        ));
        assert!(matches!(
            c("InvalidParameterValue", Some(400)),
            CloudError::Rejected { .. }
        ));
        assert!(matches!(c("", None), CloudError::Transient { .. }));
        // A subnet without IPv6 (mockcloud's words, and EC2's for the same refusal elsewhere) is
        // its own kind; another bad IPv6 value stays a rejection.
        for missing in [
            "The subnet subnet-1 does not have an IPv6 CIDR block: associate one before assigning IPv6 addresses or prefixes.",
            "Invalid value 'true' for assign-ipv6-address-on-creation. Cannot set assign-ipv6-address-on-creation to true unless the subnet (subnet-1) has an IPv6 CIDR block associated with it.",
        ] {
            let e = classify_code(
                "AssignIpv6Addresses",
                "InvalidParameterValue",
                missing,
                Some(400),
            );
            assert!(matches!(e, CloudError::NoIpv6Cidr { .. }), "{e}");
            assert!(!e.is_capacity() && !e.is_retryable());
        }
        let outside = classify_code(
            "AssignIpv6Addresses",
            "InvalidParameterValue",
            "Value (2600::/80) for parameter Ipv6Prefix is invalid. Expected an aligned /80 inside the subnet's IPv6 CIDR block 2600:1f18::/64.",
            Some(400),
        );
        assert!(matches!(outside, CloudError::Rejected { .. }), "{outside}");
        assert!(!outside.is_not_assigned());
        // An unassign naming an address the ENI no longer has (gone out of band): nothing changed.
        for gone in [
            "Some of the specified addresses are not assigned to interface eni-1",
            "Some of the specified prefixes are not assigned to interface eni-1: 10.0.0.16/28",
        ] {
            let e = classify_code(
                "UnassignPrivateIpAddresses",
                "InvalidParameterValue",
                gone,
                Some(400),
            );
            assert!(e.is_not_assigned(), "{e}");
        }
        let unauthorized = c("UnauthorizedOperation", Some(403));
        assert!(matches!(unauthorized, CloudError::Unauthorized { .. }));
        // The permission EC2 names, which may be another action's than the call's.
        let named = classify_code(
            "CreateNetworkInterface",
            "UnauthorizedOperation",
            "You are not authorized to perform this operation. User: arn:aws:sts::1:assumed-role/r/s \
             is not authorized to perform: ec2:CreateTags on resource: arn:aws:ec2:us-east-1:1:network-interface/* \
             because no identity-based policy allows the ec2:CreateTags action. Encoded authorization failure message: x",
            Some(403),
        );
        assert!(
            named.to_string().starts_with(
                "CreateNetworkInterface: not authorized: the IAM role needs ec2:CreateTags: "
            ),
            "{named}"
        );
        let bare = classify_code(
            "AssignPrivateIpAddresses",
            "UnauthorizedOperation",
            "",
            Some(403),
        );
        assert!(
            bare.to_string()
                .contains("the IAM role needs ec2:AssignPrivateIpAddresses"),
            "{bare}"
        );
        assert!(
            unauthorized.to_string().contains("ec2:Op"),
            "{unauthorized}"
        );
    }
}
