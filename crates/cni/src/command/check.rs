//! CHECK: the daemon still holds the runtime's IP (and IPv6) for the attachment, and (main role) the pod's
//! wiring is as ADD left it.

use eniipam_api::cache::ResultCache;
use eniipam_api::pb;

use super::daemon::connect;
use super::pod::{PodSide, cached_addresses, netns_to_cni};
use crate::env::RuntimeEnv;
use crate::netconf::{NetConf, Role};
use crate::spec::{CniError, ErrorCode};
use crate::wiring::{self, WiringPlan, host_veth_name};

pub(super) async fn check(conf: &NetConf, rt: &RuntimeEnv) -> Result<(), CniError> {
    let key = rt.attachment();
    let cache = ResultCache::new(&conf.plugin.cache_dir, &conf.name);
    let cached = cache.read(&key).ok().flatten();
    let (cached_ip, cached_ipv6) = cached.as_ref().map(cached_addresses).unwrap_or_default();
    let prev = conf.prev_result.as_ref();
    let ip = prev.and_then(|r| r.ipv4_for(&rt.ifname)).or(cached_ip);
    let ipv6 = prev.and_then(|r| r.ipv6_for(&rt.ifname)).or(cached_ipv6);
    if ip.is_none() && ipv6.is_none() {
        return Err(CniError::new(
            ErrorCode::InvalidNetworkConfig,
            format!(
                "CHECK {key}: no prevResult with an IPv4 or IPv6 address for {}",
                rt.ifname
            ),
        ));
    }

    let mut client = connect(conf).await.map_err(|e| e.to_cni())?;
    let reply = client
        .check(pb::CheckRequest {
            api_version: 0,
            container_id: rt.container_id.clone(),
            ifname: rt.ifname.clone(),
            ip: ip.map(|ip| ip.to_string()).unwrap_or_default(),
            network: conf.name.clone(),
            ipv6: ipv6.map(|ip| ip.to_string()).unwrap_or_default(),
        })
        .await
        .map_err(|e| e.to_cni())?;
    let expected = [
        ("ip", ip.map(|ip| ip.to_string()), &reply.ip),
        ("ipv6", ipv6.map(|ip| ip.to_string()), &reply.ipv6),
    ];
    for (field, want, held) in expected {
        let want = want.unwrap_or_default();
        if !held.is_empty() && *held != want {
            return Err(CniError::new(
                ErrorCode::CheckFailed,
                format!(
                    "eniipamd holds {field} {held} for {key}, the runtime expects {}",
                    if want.is_empty() {
                        "none"
                    } else {
                        want.as_str()
                    }
                ),
            )
            .with_details(reply.message));
        }
    }
    let what = match (ip, ipv6) {
        (Some(v4), Some(v6)) => format!("{v4} and {v6}"),
        (Some(v4), None) => v4.to_string(),
        (None, Some(v6)) => v6.to_string(),
        (None, None) => String::new(),
    };
    if !reply.ok {
        return Err(CniError::new(
            ErrorCode::CheckFailed,
            format!("eniipamd does not hold {what} for {key}"),
        )
        .with_details(reply.message));
    }

    // The daemon says which egress address the pod has (it is not in the runtime's result).
    let egress_ipv4 = match reply.egress_ipv4.as_str() {
        "" => None,
        s => Some(s.parse::<std::net::Ipv4Addr>().map_err(|_| {
            CniError::new(
                ErrorCode::CheckFailed,
                format!("eniipamd's egress_ipv4 {s:?} for {key} is not an IPv4 address"),
            )
        })?),
    };

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
            ipv6,
            egress_ipv4,
            // Without a cache entry the table is unknown and the rules are not checked.
            route_table: cached.as_ref().map_or(0, |c| c.route_table),
            mtu: conf.plugin.mtu,
            // Set when the veth is made; CHECK does not read it back.
            own_eni_egress: false,
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
