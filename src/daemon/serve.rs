//! The daemon's two listeners: the metrics listener first (so probes get a clear "starting"), the
//! gRPC socket last (nothing is served before the rebuild).

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::task::JoinHandle;

use super::{Building, CloudClients, DaemonError};
use crate::cloud::NodeContext;
use crate::config::DaemonConfig;
use crate::ipam::Ipam;
use crate::network_policy::Enforcer;
use crate::rpc::{IntrospectService, IpamService, bind_socket, pb};
use crate::telemetry::{self, Sources};

/// Step 1: the metrics listener, so probes get a clear "starting" while the rest comes up.
pub(super) async fn serve_metrics(
    config: &DaemonConfig,
    clients: &CloudClients,
    b: &mut Building,
) -> Result<SocketAddr, DaemonError> {
    let err = |source| DaemonError::Metrics {
        addr: config.metrics_addr,
        source,
    };
    let listener = telemetry::bind(config.metrics_addr).await.map_err(err)?;
    let addr = listener.local_addr().map_err(err)?;
    let sources = Sources {
        metrics: b.metrics.clone(),
        pool: b.pool_cell.clone(),
        calls: clients.stats.clone(),
        leak: b.leak_cell.clone(),
        ready: b.ready.clone(),
    };
    b.background.push(tokio::spawn(telemetry::serve(
        listener,
        sources,
        b.cancel.clone(),
    )));
    Ok(addr)
}

/// Last step: the socket, with `Ipam`, `Introspect` and `grpc.health.v1`.
pub(super) async fn serve_grpc(
    config: &DaemonConfig,
    node: &NodeContext,
    (ipam, policy): (&Ipam, Option<Arc<Enforcer>>),
    b: &Building,
) -> Result<(tonic_health::server::HealthReporter, JoinHandle<()>), DaemonError> {
    let listener = bind_socket(&config.socket_path).await?;
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<pb::ipam_server::IpamServer<IpamService>>()
        .await;
    let ipam_service = IpamService {
        ipam: ipam.clone(),
        metrics: b.metrics.clone(),
    };
    let introspect = IntrospectService {
        ipam: ipam.clone(),
        instance_id: node.instance_id.clone(),
        instance_type: node.instance_type.clone(),
        service_cidrs: config.service_cidrs.clone(),
        policy,
    };
    let shutdown = b.cancel.clone();
    let grpc = tokio::spawn(async move {
        let result = tonic::transport::Server::builder()
            .add_service(health_service)
            .add_service(pb::ipam_server::IpamServer::new(ipam_service))
            .add_service(pb::introspect_server::IntrospectServer::new(introspect))
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::UnixListenerStream::new(listener),
                async move { shutdown.cancelled().await },
            )
            .await;
        if let Err(e) = result {
            tracing::error!(error = %e, "gRPC server stopped");
        }
    });
    Ok((health, grpc))
}
