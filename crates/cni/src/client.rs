//! The plugin's side of the gRPC API: an `Ipam` client over the daemon's unix socket, with a deadline
//! on every call, and the one place where daemon failures become CNI error codes.

use std::future::Future;
use std::path::Path;
use std::time::Duration;

use tonic::Code;
use tonic::transport::Channel;

use eniipam_api::pb::ipam_client::IpamClient;
use eniipam_api::{API_VERSION, pb};

use crate::spec::{CniError, ErrorCode};

/// Why a daemon call failed.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// The socket could not be connected (daemon not running, socket missing, permission denied).
    #[error("eniipamd is unreachable at {socket}: {reason}")]
    Unreachable {
        /// The socket path.
        socket: String,
        /// What the connect reported.
        reason: String,
    },
    /// No answer within the configured deadline.
    #[error("eniipamd did not answer within {0:?}")]
    Timeout(Duration),
    /// The daemon answered with an error status.
    #[error("eniipamd: {}: {}", .0.code(), .0.message())]
    Status(tonic::Status),
}

impl DaemonError {
    /// Whether the daemon could not be reached at all (as opposed to answering with an error).
    pub fn is_unreachable(&self) -> bool {
        matches!(self, Self::Unreachable { .. } | Self::Timeout(_))
    }

    /// The CNI error for an ADD, CHECK or GC that failed on this: unreachable, busy or exhausted
    /// daemons are "try again later" (11), malformed requests "invalid network config" (7), an API
    /// version mismatch "incompatible version" (1).
    pub fn to_cni(&self) -> CniError {
        let msg = self.to_string();
        let code = match self {
            Self::Unreachable { .. } | Self::Timeout(_) => ErrorCode::TryAgainLater,
            Self::Status(s) => match s.code() {
                Code::ResourceExhausted
                | Code::Unavailable
                | Code::DeadlineExceeded
                | Code::Aborted => ErrorCode::TryAgainLater,
                Code::InvalidArgument => ErrorCode::InvalidNetworkConfig,
                Code::FailedPrecondition
                    if eniipam_api::reason_of(s) == Some(pb::ErrorReason::ApiVersionMismatch) =>
                {
                    ErrorCode::IncompatibleVersion
                }
                Code::FailedPrecondition => ErrorCode::InvalidNetworkConfig,
                Code::NotFound => ErrorCode::UnknownContainer,
                _ => ErrorCode::DaemonFailure,
            },
        };
        let cni = CniError::new(code, msg);
        match self {
            Self::Status(s) => cni.with_details(s.message().to_owned()),
            _ => cni,
        }
    }
}

/// Runs `fut` under `deadline`, turning expiry into [`DaemonError::Timeout`].
pub async fn with_deadline<T>(
    deadline: Duration,
    fut: impl Future<Output = Result<T, DaemonError>>,
) -> Result<T, DaemonError> {
    tokio::time::timeout(deadline, fut)
        .await
        .unwrap_or(Err(DaemonError::Timeout(deadline)))
}

/// A connected client of the daemon's `Ipam` service.
#[derive(Clone, Debug)]
pub struct DaemonClient {
    inner: IpamClient<Channel>,
    timeout: Duration,
}

impl DaemonClient {
    /// Connects to the daemon's unix socket within `timeout`.
    pub async fn connect(socket: &Path, timeout: Duration) -> Result<Self, DaemonError> {
        let shown = socket.display().to_string();
        let unreachable = |reason: String| DaemonError::Unreachable {
            socket: shown.clone(),
            reason,
        };
        if socket.to_str().is_none() {
            return Err(unreachable("socket path is not UTF-8".into()));
        }
        let endpoint = eniipam_api::endpoint(socket)
            .map_err(|e| unreachable(e.to_string()))?
            .connect_timeout(timeout);
        let channel = with_deadline(timeout, async {
            endpoint
                .connect()
                .await
                .map_err(|e| unreachable(eniipam_api::error_chain(&e)))
        })
        .await?;
        Ok(Self {
            inner: IpamClient::new(channel),
            timeout,
        })
    }

    /// `Allocate` (the request's `api_version` is filled in). The deadline travels with the call
    /// (`grpc-timeout`): an ADD that waits on EC2 is answered by the daemon before the plugin gives up.
    pub async fn allocate(
        &mut self,
        mut req: pb::AllocateRequest,
    ) -> Result<pb::AllocateReply, DaemonError> {
        req.api_version = API_VERSION;
        let mut req = tonic::Request::new(req);
        req.set_timeout(self.timeout);
        let inner = &mut self.inner;
        with_deadline(self.timeout, async move {
            inner
                .allocate(req)
                .await
                .map(|r| r.into_inner())
                .map_err(DaemonError::Status)
        })
        .await
    }

    /// `Release`.
    pub async fn release(
        &mut self,
        mut req: pb::ReleaseRequest,
    ) -> Result<pb::ReleaseReply, DaemonError> {
        req.api_version = API_VERSION;
        let inner = &mut self.inner;
        with_deadline(self.timeout, async move {
            inner
                .release(req)
                .await
                .map(|r| r.into_inner())
                .map_err(DaemonError::Status)
        })
        .await
    }

    /// `Check`.
    pub async fn check(
        &mut self,
        mut req: pb::CheckRequest,
    ) -> Result<pb::CheckReply, DaemonError> {
        req.api_version = API_VERSION;
        let inner = &mut self.inner;
        with_deadline(self.timeout, async move {
            inner
                .check(req)
                .await
                .map(|r| r.into_inner())
                .map_err(DaemonError::Status)
        })
        .await
    }

    /// `GarbageCollect`.
    pub async fn garbage_collect(
        &mut self,
        mut req: pb::GarbageCollectRequest,
    ) -> Result<pb::GarbageCollectReply, DaemonError> {
        req.api_version = API_VERSION;
        let inner = &mut self.inner;
        with_deadline(self.timeout, async move {
            inner
                .garbage_collect(req)
                .await
                .map(|r| r.into_inner())
                .map_err(DaemonError::Status)
        })
        .await
    }

    /// `Status`.
    pub async fn status(&mut self) -> Result<pb::StatusReply, DaemonError> {
        let req = pb::StatusRequest {
            api_version: API_VERSION,
        };
        let inner = &mut self.inner;
        with_deadline(self.timeout, async move {
            inner
                .status(req)
                .await
                .map(|r| r.into_inner())
                .map_err(DaemonError::Status)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: Code, msg: &str) -> DaemonError {
        DaemonError::Status(tonic::Status::new(code, msg))
    }

    #[test]
    fn daemon_errors_map_to_spec_codes() {
        let cases = [
            (
                status(Code::ResourceExhausted, "subnet full"),
                ErrorCode::TryAgainLater,
            ),
            (
                status(Code::Unavailable, "starting"),
                ErrorCode::TryAgainLater,
            ),
            (
                status(Code::InvalidArgument, "empty container_id"),
                ErrorCode::InvalidNetworkConfig,
            ),
            (
                DaemonError::Status(eniipam_api::status_with_reason(
                    Code::FailedPrecondition,
                    "client API version 2, daemon speaks 1",
                    pb::ErrorReason::ApiVersionMismatch,
                )),
                ErrorCode::IncompatibleVersion,
            ),
            // The reason decides, not the words of the message.
            (
                status(Code::FailedPrecondition, "the version annotation is wrong"),
                ErrorCode::InvalidNetworkConfig,
            ),
            (
                status(
                    Code::FailedPrecondition,
                    "preferred IP 10.0.0.9 is not available",
                ),
                ErrorCode::InvalidNetworkConfig,
            ),
            (status(Code::Internal, "boom"), ErrorCode::DaemonFailure),
            (
                DaemonError::Unreachable {
                    socket: "/x".into(),
                    reason: "no such file".into(),
                },
                ErrorCode::TryAgainLater,
            ),
            (
                DaemonError::Timeout(Duration::from_secs(1)),
                ErrorCode::TryAgainLater,
            ),
        ];
        for (err, code) in cases {
            assert_eq!(err.to_cni().code, code, "{err}");
        }
        // The daemon's reason travels in the CNI error.
        let cni = status(
            Code::ResourceExhausted,
            "subnet subnet-1 has no free addresses",
        )
        .to_cni();
        assert!(cni.msg.contains("subnet-1"));
        assert_eq!(cni.details, "subnet subnet-1 has no free addresses");
    }

    #[tokio::test(start_paused = true)]
    async fn deadline_expires_on_the_paused_clock() {
        let started = tokio::time::Instant::now();
        let result: Result<(), _> =
            with_deadline(Duration::from_secs(30), std::future::pending()).await;
        assert!(matches!(result, Err(DaemonError::Timeout(d)) if d == Duration::from_secs(30)));
        assert_eq!(started.elapsed(), Duration::from_secs(30));
        assert!(DaemonError::Timeout(Duration::ZERO).is_unreachable());
    }

    #[tokio::test(start_paused = true)]
    async fn answers_inside_the_deadline_pass_through() {
        let ok = with_deadline(Duration::from_secs(1), async {
            tokio::time::sleep(Duration::from_millis(999)).await;
            Ok::<_, DaemonError>(7)
        })
        .await;
        assert_eq!(ok.unwrap(), 7);
    }

    #[tokio::test]
    async fn missing_socket_is_unreachable() {
        let dir = std::env::temp_dir().join(format!("eniipam-cni-client-{}", std::process::id()));
        let err = DaemonClient::connect(&dir.join("none.sock"), Duration::from_secs(2))
            .await
            .unwrap_err();
        assert!(err.is_unreachable(), "{err}");
        assert_eq!(err.to_cni().code, ErrorCode::TryAgainLater);
    }
}
