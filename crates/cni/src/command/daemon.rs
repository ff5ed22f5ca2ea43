//! The daemon's side of a command: the connection (with the configuration's socket and deadline)
//! and the Release call that DEL and a failed ADD share.

use std::net::{Ipv4Addr, Ipv6Addr};

use eniipam_api::pb;

use crate::client::{DaemonClient, DaemonError};
use crate::env::RuntimeEnv;
use crate::netconf::NetConf;

pub(super) async fn connect(conf: &NetConf) -> Result<DaemonClient, DaemonError> {
    DaemonClient::connect(&conf.plugin.socket, conf.plugin.timeout).await
}

pub(super) async fn release(
    client: &mut DaemonClient,
    conf: &NetConf,
    rt: &RuntimeEnv,
    sticky: bool,
    cleaning: Option<Ipv4Addr>,
    cleaning_v6: Option<Ipv6Addr>,
) -> Result<pb::ReleaseReply, DaemonError> {
    client
        .release(pb::ReleaseRequest {
            api_version: 0,
            container_id: rt.container_id.clone(),
            ifname: rt.ifname.clone(),
            sticky,
            network: conf.name.clone(),
            ip: cleaning.map(|ip| ip.to_string()).unwrap_or_default(),
            ipv6: cleaning_v6.map(|ip| ip.to_string()).unwrap_or_default(),
        })
        .await
}
