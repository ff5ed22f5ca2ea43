//! EC2 errors as EC2 spells them: a code, a message and the HTTP status it comes with.

use std::fmt;

/// An EC2 error reply.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Ec2Error {
    pub code: String,
    pub message: String,
    pub status: u16,
}

impl Ec2Error {
    pub fn new(status: u16, code: &str, message: impl Into<String>) -> Self {
        Self {
            code: code.to_owned(),
            message: message.into(),
            status,
        }
    }

    /// A 400 client error.
    pub fn client(code: &str, message: impl Into<String>) -> Self {
        Self::new(400, code, message)
    }

    pub fn missing(param: &str) -> Self {
        Self::client(
            "MissingParameter",
            format!("The request must contain the parameter {param}"),
        )
    }

    pub fn invalid_value(param: &str, value: &str, why: &str) -> Self {
        Self::client(
            "InvalidParameterValue",
            format!("Value ({value}) for parameter {param} is invalid. {why}"),
        )
    }

    pub fn combination(message: impl Into<String>) -> Self {
        Self::client("InvalidParameterCombination", message)
    }

    pub fn throttled() -> Self {
        Self::new(503, "RequestLimitExceeded", "Request limit exceeded.")
    }

    pub fn internal() -> Self {
        Self::new(
            500,
            "InternalError",
            "An internal error has occurred. Retry your request, but if the problem persists, contact us.",
        )
    }
}

impl fmt::Display for Ec2Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}): {}", self.code, self.status, self.message)
    }
}

impl std::error::Error for Ec2Error {}

pub type Ec2Result<T> = Result<T, Ec2Error>;
