//! The Kubernetes CRI v1 API (`runtime.v1`) as a tonic client, for the tests that drive containerd's CRI
//! plugin the way the kubelet does (`tests/cri_containerd.rs`).
//!
//! `proto/api.proto` is `k8s.io/cri-api/pkg/apis/runtime/v1/api.proto` (cri-api commit
//! 7d8ade91836419c9dd49d059bda1fe4a7dc283f5, Apache-2.0), unchanged. It is newer than what containerd
//! 1.6 serves; protobuf ignores the fields an older server does not know.

/// Generated types and the `RuntimeService` / `ImageService` clients.
#[allow(clippy::all, missing_docs, rust_2018_idioms)]
pub mod v1 {
    tonic::include_proto!("runtime.v1");
}

/// Connects to a CRI runtime's unix socket (`unix://` endpoint, as the kubelet's
/// `--container-runtime-endpoint`).
pub async fn connect(
    socket: &std::path::Path,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    tonic::transport::Endpoint::from_shared(format!("unix:{}", socket.display()))?
        .connect()
        .await
}
