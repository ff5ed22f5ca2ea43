//! ADD: checks what can be checked before an IP is taken, allocates from the daemon, wires the pod
//! (main role) or returns the address (IPAM role), caches the result for DEL and GC; every failure
//! after the allocation gives the IP back.

use std::net::Ipv4Addr;

use ipnet::{IpNet, Ipv4Net};
use serde_json::{Map, Value};

use eniipam_api::cache::{CACHE_FORMAT, CacheEntry, ResultCache};
use eniipam_api::pb;

use super::daemon::{connect, release};
use super::pod::{PodSide, netns_to_cni};
use crate::env::RuntimeEnv;
use crate::netconf::{NetConf, Role};
use crate::spec::{CniError, CniResult, CniVersion, ErrorCode, Interface, IpConfig, Route};
use crate::wiring::{self, GATEWAY, Teardown, WiringPlan, host_veth_name};

fn main_result(plan: &WiringPlan, wired: &wiring::Wired, netns_path: &str) -> CniResult {
    CniResult {
        interfaces: vec![
            Interface {
                name: wired.host.name.clone(),
                mac: wired.host.mac.clone(),
                sandbox: None,
                extra: Map::new(),
            },
            Interface {
                name: plan.ifname.clone(),
                mac: wired.pod_mac.clone(),
                sandbox: Some(netns_path.to_owned()),
                extra: Map::new(),
            },
        ],
        ips: vec![IpConfig {
            address: IpNet::V4(Ipv4Net::from(plan.ip)),
            gateway: Some(GATEWAY.into()),
            interface: Some(1),
            extra: Map::new(),
        }],
        routes: vec![default_route()],
        dns: Default::default(),
    }
}

fn default_route() -> Route {
    Route {
        dst: IpNet::V4(Ipv4Net::default()),
        gw: Some(GATEWAY.into()),
        extra: Map::new(),
    }
}

/// The IPAM role's result: the address as a `/32` with the link-local gateway and a default route
/// through it, for a delegating plugin that wires such an address itself (the VPC subnet's own
/// gateway must never be put on a host interface). The reference plugins cannot; see
/// [`crate::netconf::UNSUPPORTED_IPAM_PARENTS`].
fn ipam_result(ip: Ipv4Addr) -> CniResult {
    CniResult {
        interfaces: Vec::new(),
        ips: vec![IpConfig {
            address: IpNet::V4(Ipv4Net::from(ip)),
            gateway: Some(GATEWAY.into()),
            interface: None,
            extra: Map::new(),
        }],
        routes: vec![default_route()],
        dns: Default::default(),
    }
}

pub(super) async fn add(conf: &NetConf, rt: &RuntimeEnv) -> Result<Value, CniError> {
    let netns_path = rt.netns.clone().unwrap_or_default();
    let pod = rt.args.pod.clone();
    let sticky_key = conf.sticky_key(pod.as_ref(), &rt.args);
    let preferred = conf.preferred_ip()?;
    let cache = ResultCache::new(&conf.plugin.cache_dir, &conf.name);

    // Everything that can be checked before asking for an IP is checked first, so bad input changes
    // nothing.
    conf.check_ipam_parent()?;
    let side = match conf.role {
        Role::Main => {
            let side = PodSide::open(&netns_path)?;
            wiring::ensure_absent(&side.pod, &rt.ifname, &side.ns)
                .await
                .map_err(netns_to_cni)?;
            Some(side)
        }
        Role::Ipam => None,
    };

    let mut client = connect(conf).await.map_err(|e| e.to_cni())?;
    let reply = client
        .allocate(pb::AllocateRequest {
            api_version: 0,
            container_id: rt.container_id.clone(),
            ifname: rt.ifname.clone(),
            netns: netns_path.clone(),
            pod: pod.as_ref().map(|p| pb::Pod {
                namespace: p.namespace.clone(),
                name: p.name.clone(),
                uid: p.uid.clone(),
            }),
            preferred_ip: preferred.map(|ip| ip.to_string()).unwrap_or_default(),
            require_preferred: preferred.is_some(),
            sticky_key: sticky_key.clone().unwrap_or_default(),
            network: conf.name.clone(),
        })
        .await
        .map_err(|e| e.to_cni())?;
    let keep = sticky_key.is_some();

    let ip: Ipv4Addr = match reply.ip.parse() {
        Ok(ip) => ip,
        Err(_) => {
            let _ = release(&mut client, conf, rt, keep, None).await;
            return Err(CniError::new(
                ErrorCode::DaemonFailure,
                format!(
                    "eniipamd allocated {:?}, which is not an IPv4 address",
                    reply.ip
                ),
            ));
        }
    };

    let (ours, host_veth, teardown) = match &side {
        None => (ipam_result(ip), None, None),
        Some(side) => {
            let plan = WiringPlan {
                ifname: rt.ifname.clone(),
                host_veth: host_veth_name(&conf.plugin.veth_prefix, pod.as_ref(), &rt.attachment()),
                ip,
                route_table: reply.route_table,
                mtu: conf.plugin.mtu,
            };
            let teardown = Teardown {
                ifname: plan.ifname.clone(),
                ip: Some(ip),
                // Our own failed ADD: the daemon gave us this IP, nobody else holds it.
                ip_free: true,
                host_veth: None,
                created_host_veth: Some(plan.host_veth.clone()),
            };
            match wiring::wire(&side.host, &side.pod, &side.ns, &plan).await {
                Ok(wired) => (
                    main_result(&plan, &wired, &netns_path),
                    Some(wired.host),
                    Some(teardown),
                ),
                Err(err) => {
                    let cleanup = wiring::unwire(&side.host, Some(&side.pod), &teardown).await;
                    for e in &cleanup {
                        tracing::warn!("cleaning up after failed wiring: {e}");
                    }
                    let released = release(&mut client, conf, rt, keep, Some(ip)).await;
                    let mut cni = netns_to_cni(err);
                    if cni.code == ErrorCode::CheckFailed {
                        cni.code = ErrorCode::WiringFailed;
                    }
                    cni.details = match released {
                        Ok(_) => format!("{ip} was released"),
                        Err(e) => format!("releasing {ip} failed too: {e}"),
                    };
                    return Err(cni);
                }
            }
        }
    };

    let mut result = conf.prev_result.clone().unwrap_or_default();
    result.merge(ours.clone());

    let entry = CacheEntry {
        format: CACHE_FORMAT,
        network: conf.name.clone(),
        container_id: rt.container_id.clone(),
        ifname: rt.ifname.clone(),
        netns: netns_path,
        pod,
        sticky_key,
        ip,
        route_table: reply.route_table,
        eni_id: reply.eni_id.clone(),
        host_veth,
        result: ours.to_json(CniVersion::CURRENT),
    };
    if let Err(e) = cache.write(&entry) {
        if let (Some(side), Some(teardown)) = (&side, &teardown) {
            wiring::unwire(&side.host, Some(&side.pod), teardown).await;
        }
        let _ = release(&mut client, conf, rt, keep, Some(ip)).await;
        return Err(CniError::new(ErrorCode::IoFailure, e.to_string())
            .with_details(format!("{ip} was released")));
    }
    Ok(result.to_json(conf.cni_version))
}
