//! What the node's pool is doing, from eniipamd's Introspect service, and its gRPC health.

use std::path::Path;

use eniipam_api::pb;
use serde_json::json;
use tonic::transport::Channel;

/// Connects to eniipamd, with errors that say what to do.
async fn connect(socket: &Path) -> Result<Channel, String> {
    if !socket.exists() {
        return Err(format!(
            "no socket at {}: is eniipamd running? (pass --socket or set ENIIPAM_SOCKET_PATH)",
            socket.display()
        ));
    }
    eniipam_api::connect(socket).await.map_err(|e| {
        let mut msg = format!("cannot connect to eniipamd at {}: {e}", socket.display());
        if let Err(io) = std::fs::File::open(socket)
            && io.kind() == std::io::ErrorKind::PermissionDenied
        {
            msg.push_str(" (permission denied: the socket is root-only, try sudo)");
        }
        msg
    })
}

/// A client of eniipamd's Introspect service.
pub(crate) async fn introspect(
    socket: &Path,
) -> Result<pb::introspect_client::IntrospectClient<Channel>, String> {
    Ok(pb::introspect_client::IntrospectClient::new(
        connect(socket).await?,
    ))
}

pub(crate) fn status_err(s: tonic::Status) -> String {
    format!("eniipamd answered {:?}: {}", s.code(), s.message())
}

/// Ok when eniipamd's gRPC health service reports SERVING for the plugin's service; the reason
/// otherwise (no socket, cannot connect, not serving).
pub async fn check_health(socket: &Path) -> Result<(), String> {
    let channel = connect(socket).await?;
    let mut h = tonic_health::pb::health_client::HealthClient::new(channel);
    let r = h
        .check(tonic_health::pb::HealthCheckRequest {
            service: "eniipam.v1.Ipam".into(),
        })
        .await
        .map_err(status_err)?
        .into_inner();
    if r.status == tonic_health::pb::health_check_response::ServingStatus::Serving as i32 {
        Ok(())
    } else {
        Err("eniipamd is not serving".into())
    }
}

pub async fn health(socket: &Path, as_json: bool) -> Result<(), String> {
    let result = check_health(socket).await;
    // A daemon that answered "not serving" is a result to print; no daemon at all is an error.
    let serving = match &result {
        Ok(()) => true,
        Err(e) if e == "eniipamd is not serving" => false,
        Err(_) => return result,
    };
    if as_json {
        println!("{}", json!({"serving": serving}));
    } else {
        println!("{}", if serving { "SERVING" } else { "NOT SERVING" });
    }
    result
}

pub async fn status(socket: &Path, as_json: bool) -> Result<(), String> {
    let mut c = introspect(socket).await?;
    let p = c
        .pool(pb::PoolRequest {})
        .await
        .map_err(status_err)?
        .into_inner();
    if as_json {
        println!("{}", pool_json(&p));
    } else {
        print_pool(&p);
    }
    Ok(())
}

pub async fn allocations(socket: &Path, as_json: bool) -> Result<(), String> {
    let mut c = introspect(socket).await?;
    let a = c
        .allocations(pb::AllocationsRequest {})
        .await
        .map_err(status_err)?
        .into_inner();
    if as_json {
        let v: Vec<_> = a.allocations.iter().map(allocation_json).collect();
        println!("{}", serde_json::Value::Array(v));
    } else {
        print_allocations(&a.allocations);
    }
    Ok(())
}

/// An address field as JSON: `null` when the attachment has none of that family (an IPv6-only pod has
/// no IPv4), so a reader parsing addresses never meets an empty string.
fn addr_or_null(s: &str) -> serde_json::Value {
    if s.is_empty() {
        serde_json::Value::Null
    } else {
        json!(s)
    }
}

fn allocation_json(x: &pb::Allocation) -> serde_json::Value {
    json!({"ip": addr_or_null(&x.ip), "ipv6": addr_or_null(&x.ipv6), "container_id": x.container_id,
           "ifname": x.ifname, "netns": x.netns, "pod_namespace": x.pod_namespace, "pod_name": x.pod_name,
           "eni_id": x.eni_id, "sticky_key": x.sticky_key, "assigned_at_ms": x.assigned_at_ms,
           "network": x.network})
}

fn print_allocations(rows: &[pb::Allocation]) {
    // The IPv6 column only when some pod has an IPv6: an IPv4 node's table stays as it was.
    let v6 = rows.iter().any(|x| !x.ipv6.is_empty());
    let v6_col = |s: &str| {
        if v6 {
            format!("{s:<40} ")
        } else {
            String::new()
        }
    };
    println!(
        "{:<16} {}{:<21} {:<32} {:<14} CONTAINER",
        "IP",
        v6_col("IPV6"),
        "ENI",
        "POD",
        "IFNAME"
    );
    for x in rows {
        let pod = format!("{}/{}", x.pod_namespace, x.pod_name);
        let ip = if x.ip.is_empty() { "-" } else { &x.ip };
        println!(
            "{:<16} {}{:<21} {:<32} {:<14} {}",
            ip,
            v6_col(&x.ipv6),
            x.eni_id,
            pod,
            x.ifname,
            x.container_id
        );
    }
    println!("{} allocations", rows.len());
}

/// `quarantine release`: every quarantined IP (`all`) or exactly `ips`.
pub async fn release_quarantined(
    socket: &Path,
    all: bool,
    ips: &[std::net::Ipv4Addr],
    as_json: bool,
) -> Result<(), String> {
    let mut c = introspect(socket).await?;
    let r = c
        .release_quarantined(pb::ReleaseQuarantinedRequest {
            ips: ips.iter().map(|ip| ip.to_string()).collect(),
            all,
        })
        .await
        .map_err(status_err)?
        .into_inner();
    if as_json {
        println!("{}", json!({"released": r.released}));
    } else {
        for ip in &r.released {
            println!("{ip}");
        }
        println!(
            "{} IPs released from quarantine (idle after the reuse cooldown)",
            r.released.len()
        );
    }
    Ok(())
}

pub async fn enis(socket: &Path, as_json: bool) -> Result<(), String> {
    let mut c = introspect(socket).await?;
    let e = c
        .enis(pb::EnisRequest {})
        .await
        .map_err(status_err)?
        .into_inner();
    if as_json {
        println!(
            "{}",
            serde_json::Value::Array(e.enis.iter().map(eni_json).collect())
        );
    } else {
        print_enis(&e.enis);
    }
    Ok(())
}

fn eni_json(e: &pb::EniInfo) -> serde_json::Value {
    json!({"eni_id": e.eni_id, "mac": e.mac, "device_index": e.device_index, "subnet_id": e.subnet_id,
           "subnet_cidr": e.subnet_cidr, "primary_ip": e.primary_ip, "idle": e.idle, "assigned": e.assigned,
           "cooling": e.cooling, "sticky": e.sticky, "state": e.state, "backlog": e.backlog,
           "prefixes": e.prefixes, "serves_pods": e.serves_pods,
           "network": (!e.network.is_empty()).then_some(&e.network)})
}

fn pool_json(p: &pb::PoolReply) -> serde_json::Value {
    json!({
        "instance_id": p.instance_id, "instance_type": p.instance_type, "ready": p.ready,
        "capacity": p.capacity, "tokens_in_use": p.tokens_in_use, "min_idle": p.min_idle, "max_idle": p.max_idle,
        "warm_policy": p.warm_policy, "warm_target": p.warm_target, "warm_fill": p.warm_fill, "warm_keep": p.warm_keep,
        "idle": p.idle, "assigned": p.assigned, "cooling": p.cooling, "sticky": p.sticky, "in_flight": p.in_flight,
        "quarantined": p.quarantined, "exhausted": p.exhausted, "exhausted_reason": p.exhausted_reason,
        "invariant_error": p.invariant_error,
        "ip_family": p.ip_family, "ipv6_prefix": addr_or_null(&p.ipv6_prefix), "ipv6_assigned": p.ipv6_assigned,
        "backoffs": p.backoffs.iter().map(|b| json!({"scope": b.scope, "reason": b.reason, "remaining_ms": b.remaining_ms})).collect::<Vec<_>>(),
        "enis": p.enis.iter().map(eni_json).collect::<Vec<_>>(),
    })
}

fn print_enis(enis: &[pb::EniInfo]) {
    println!(
        "{:<4} {:<21} {:<26} {:<18} {:>5} {:>8} {:>7} {:>6} {:>8} {:<12}",
        "DEV",
        "ENI",
        "SUBNET",
        "CIDR",
        "IDLE",
        "ASSIGNED",
        "COOLING",
        "STICKY",
        "PREFIXES",
        "STATE"
    );
    for e in enis {
        let state = if !e.serves_pods {
            format!("{} (no pods)", e.state)
        } else if !e.network.is_empty() {
            format!("{} (profile {})", e.state, e.network)
        } else {
            e.state.clone()
        };
        println!(
            "{:<4} {:<21} {:<26} {:<18} {:>5} {:>8} {:>7} {:>6} {:>8} {:<12}",
            e.device_index,
            e.eni_id,
            e.subnet_id,
            e.subnet_cidr,
            e.idle,
            e.assigned,
            e.cooling,
            e.sticky,
            e.prefixes.len(),
            state
        );
    }
}

fn print_pool(p: &pb::PoolReply) {
    println!(
        "node:      {} ({}){}",
        p.instance_id,
        p.instance_type,
        if p.ready { "" } else { "  NOT READY" }
    );
    println!(
        "capacity:  {} IP slots, {} in use",
        p.capacity, p.tokens_in_use
    );
    println!(
        "IPs:       {} assigned, {} idle, {} cooling, {} sticky, {} in flight",
        p.assigned, p.idle, p.cooling, p.sticky, p.in_flight
    );
    println!(
        "warm pool: {} policy, min_idle {}, max_idle {}; now: top up below {}, fill to {}, give back beyond {}",
        p.warm_policy, p.min_idle, p.max_idle, p.warm_target, p.warm_fill, p.warm_keep
    );
    if !p.ip_family.is_empty() {
        println!("family:    {}", p.ip_family);
    }
    if p.ip_family == "ipv6" || p.ip_family == "dual" {
        if p.ipv6_prefix.is_empty() {
            println!("IPv6:      no /80 yet");
        } else {
            println!(
                "IPv6:      {}, {} addresses held by pods",
                p.ipv6_prefix, p.ipv6_assigned
            );
        }
    }
    if p.exhausted {
        println!("EXHAUSTED: {}", p.exhausted_reason);
    }
    for b in &p.backoffs {
        println!(
            "backoff:   {} for {} ms: {}",
            b.scope, b.remaining_ms, b.reason
        );
    }
    println!();
    print_enis(&p.enis);
}
