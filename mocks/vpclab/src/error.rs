//! The lab's error type.

use std::io;

/// What can go wrong while building, syncing or reading the lab.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// A tool (`ip`, `nft`, `nsenter`) could not be started: most likely it is not installed.
    #[error("cannot run `{program}` (install Debian package `{package}`): {source}")]
    ToolMissing {
        program: String,
        package: &'static str,
        #[source]
        source: io::Error,
    },
    /// A tool ran and failed.
    #[error("`{command}` failed ({status}): {stderr}")]
    Command {
        command: String,
        status: String,
        stderr: String,
    },
    /// A tool's output was not what the lab expected.
    #[error("cannot parse the output of `{command}`: {reason}")]
    Output { command: String, reason: String },
    /// Entering a namespace, writing a sysctl file, spawning a thread.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
    /// mockcloud's state cannot be read or does not describe a usable VPC.
    #[error("mockcloud state: {0}")]
    CloudState(String),
    /// A background sync ([`crate::Lab::follow`]) failed; the message is its error.
    #[error("background sync failed: {0}")]
    SyncFailed(String),
    /// The caller asked for something the lab does not have.
    #[error("{0}")]
    NotFound(String),
    /// The caller passed something the lab cannot use.
    #[error("invalid argument: {0}")]
    Invalid(String),
}

impl LabError {
    pub(crate) fn io(what: impl Into<String>, source: io::Error) -> Self {
        Self::Io {
            what: what.into(),
            source,
        }
    }
}
