//! CHECK: the daemon still holds the runtime's IP for the attachment, and (main role) the pod's
//! wiring is as ADD left it.

use eniipam_api::cache::ResultCache;
use eniipam_api::pb;

use super::daemon::connect;
use super::pod::{PodSide, netns_to_cni};
use crate::env::RuntimeEnv;
use crate::netconf::{NetConf, Role};
use crate::spec::{CniError, ErrorCode};
use crate::wiring::{self, WiringPlan, host_veth_name};

pub(super) async fn check(conf: &NetConf, rt: &RuntimeEnv) -> Result<(), CniError> {
    let key = rt.attachment();
    let cache = ResultCache::new(&conf.plugin.cache_dir, &conf.name);
    let cached = cache.read(&key).ok().flatten();
    let ip = conf
        .prev_result
        .as_ref()
        .and_then(|r| r.ipv4_for(&rt.ifname))
        .or(cached.as_ref().map(|c| c.ip))
        .ok_or_else(|| {
            CniError::new(
                ErrorCode::InvalidNetworkConfig,
                format!(
                    "CHECK {key}: no prevResult with an IPv4 address for {}",
                    rt.ifname
                ),
            )
        })?;

    let mut client = connect(conf).await.map_err(|e| e.to_cni())?;
    let reply = client
        .check(pb::CheckRequest {
            api_version: 0,
            container_id: rt.container_id.clone(),
            ifname: rt.ifname.clone(),
            ip: ip.to_string(),
            network: conf.name.clone(),
            ..Default::default()
        })
        .await
        .map_err(|e| e.to_cni())?;
    if !reply.ip.is_empty() && reply.ip != ip.to_string() {
        return Err(CniError::new(
            ErrorCode::CheckFailed,
            format!(
                "eniipamd holds {} for {key}, the runtime expects {ip}",
                reply.ip
            ),
        )
        .with_details(reply.message));
    }
    if !reply.ok {
        return Err(CniError::new(
            ErrorCode::CheckFailed,
            format!("eniipamd does not hold {ip} for {key}"),
        )
        .with_details(reply.message));
    }

    if conf.role == Role::Main {
        let side = PodSide::open(rt.netns.as_deref().unwrap_or_default())?;
        let host_veth = cached
            .as_ref()
            .and_then(|c| c.host_veth.as_ref())
            .map(|h| h.name.clone())
            .unwrap_or_else(|| {
                host_veth_name(&conf.plugin.veth_prefix, rt.args.pod.as_ref(), &key)
            });
        let plan = WiringPlan {
            ifname: rt.ifname.clone(),
            host_veth,
            ip,
            // Without a cache entry the table is unknown and the rules are not checked.
            route_table: cached.as_ref().map_or(0, |c| c.route_table),
            mtu: conf.plugin.mtu,
        };
        let mac = cached
            .as_ref()
            .and_then(|c| c.host_veth.as_ref())
            .map(|h| h.mac.as_str());
        wiring::check(&side.host, &side.pod, &plan, mac)
            .await
            .map_err(|e| {
                let mut cni = netns_to_cni(e);
                if cni.code == ErrorCode::WiringFailed {
                    cni.code = ErrorCode::CheckFailed;
                }
                cni
            })?;
    }
    Ok(())
}
