//! ADD: checks what can be checked before an IP is taken, allocates from the daemon, wires the pod
//! (main role) or returns the address (IPAM role), caches the result for DEL and GC; every failure
//! after the allocation gives the IP back.

use std::net::Ipv4Addr;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use serde_json::{Map, Value};

use eniipam_api::cache::{CACHE_FORMAT, CacheEntry, ResultCache};
use eniipam_api::pb;

use super::daemon::{connect, release};
use super::pod::{PodSide, netns_to_cni};
use crate::env::RuntimeEnv;
use crate::family::Assigned;
use crate::netconf::{NetConf, Role};
use crate::spec::{CniError, CniResult, CniVersion, ErrorCode, Interface, IpConfig, Route};
use crate::wiring::{self, GATEWAY, GATEWAY_V6, Teardown, WiringPlan, host_veth_name};

fn main_result(plan: &WiringPlan, wired: &wiring::Wired, netns_path: &str) -> CniResult {
    let (ips, routes) = addresses(plan.ip, plan.ipv6, Some(1));
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
        ips,
        routes,
        dns: Default::default(),
    }
}

/// The `ips` and `routes` of a result: per family, the address as a host route (`/32`, `/128`) with
/// its link-local gateway (`169.254.1.1`, `fe80::1`) and a default route through it, IPv4 first.
fn addresses(
    ip: Option<Ipv4Addr>,
    ipv6: Option<std::net::Ipv6Addr>,
    interface: Option<usize>,
) -> (Vec<IpConfig>, Vec<Route>) {
    let mut ips = Vec::new();
    let mut routes = Vec::new();
    let mut family = |address: IpNet, default: IpNet, gateway: std::net::IpAddr| {
        ips.push(IpConfig {
            address,
            gateway: Some(gateway),
            interface,
            extra: Map::new(),
        });
        routes.push(Route {
            dst: default,
            gw: Some(gateway),
            extra: Map::new(),
        });
    };
    if let Some(ip) = ip {
        family(
            IpNet::V4(Ipv4Net::from(ip)),
            IpNet::V4(Ipv4Net::default()),
            GATEWAY.into(),
        );
    }
    if let Some(ipv6) = ipv6 {
        family(
            IpNet::V6(Ipv6Net::from(ipv6)),
            IpNet::V6(Ipv6Net::default()),
            GATEWAY_V6.into(),
        );
    }
    (ips, routes)
}

/// The IPAM role's result: the addresses as a `/32` (and `/128`) with the link-local gateways and
/// default routes through them, for a delegating plugin that wires such addresses itself (the VPC
/// subnet's own gateway must never be put on a host interface). The reference plugins cannot; see
/// [`crate::netconf::UNSUPPORTED_IPAM_PARENTS`].
fn ipam_result(assigned: &Assigned) -> CniResult {
    let (ips, routes) = addresses(assigned.ip, assigned.ipv6, None);
    CniResult {
        interfaces: Vec::new(),
        ips,
        routes,
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
            ipam_role: matches!(conf.role, Role::Ipam),
        })
        .await
        .map_err(|e| e.to_cni())?;
    let keep = sticky_key.is_some();

    // A reply the plugin cannot wire as it stands is refused before anything is touched.
    let assigned = match Assigned::from_reply(&reply) {
        Ok(assigned) => assigned,
        Err(msg) => {
            let _ = release(&mut client, conf, rt, keep, None, None).await;
            return Err(CniError::new(ErrorCode::DaemonFailure, msg)
                .with_details("the allocation was released"));
        }
    };
    let what = assigned.describe();

    let (ours, host_veth, teardown) = match &side {
        None => (ipam_result(&assigned), None, None),
        Some(side) => {
            let plan = WiringPlan {
                ifname: rt.ifname.clone(),
                host_veth: host_veth_name(&conf.plugin.veth_prefix, pod.as_ref(), &rt.attachment()),
                ip: assigned.ip,
                ipv6: assigned.ipv6,
                // Wired, never reported: see `wiring::egress`.
                egress_ipv4: assigned.egress_ipv4,
                route_table: reply.route_table,
                mtu: conf.plugin.mtu,
                own_eni_egress: reply.own_eni_egress,
            };
            let teardown = Teardown {
                ifname: plan.ifname.clone(),
                ip: assigned.ip,
                // Our own failed ADD: the daemon gave us these addresses, nobody else holds them.
                ip_free: true,
                ipv6: assigned.ipv6,
                ipv6_free: true,
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
                    let released =
                        release(&mut client, conf, rt, keep, assigned.ip, assigned.ipv6).await;
                    let mut cni = netns_to_cni(err);
                    if cni.code == ErrorCode::CheckFailed {
                        cni.code = ErrorCode::WiringFailed;
                    }
                    cni.details = match released {
                        Ok(_) => format!("{what} was released"),
                        Err(e) => format!("releasing {what} failed too: {e}"),
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
        // The cache format has one IPv4 field; an IPv6-only attachment records 0.0.0.0 there (never
        // a pod IP, so the daemon's cache evidence matches no pool address) and its IPv6 lives in
        // `result`, as the `/128` DEL, CHECK and GC read back ([`CniResult::ipv6_for`]).
        ip: assigned.ip.unwrap_or(Ipv4Addr::UNSPECIFIED),
        route_table: reply.route_table,
        eni_id: reply.eni_id.clone(),
        host_veth,
        egress_ipv4: assigned.egress_ipv4,
        own_eni_egress: reply.own_eni_egress,
        result: ours.to_json(CniVersion::CURRENT),
    };
    if let Err(e) = cache.write(&entry) {
        if let (Some(side), Some(teardown)) = (&side, &teardown) {
            wiring::unwire(&side.host, Some(&side.pod), teardown).await;
        }
        let _ = release(&mut client, conf, rt, keep, assigned.ip, assigned.ipv6).await;
        return Err(CniError::new(ErrorCode::IoFailure, e.to_string())
            .with_details(format!("{what} was released")));
    }
    Ok(result.to_json(conf.cni_version))
}
