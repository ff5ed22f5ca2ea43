//! `eniipamctl`: what the node's pool is doing, from eniipamd's Introspect service.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use eniipam_api::pb;
use serde_json::json;

/// Inspect eniipamd on this node: pool status, allocations, ENIs.
#[derive(Parser, Debug)]
#[command(name = "eniipamctl", version)]
struct Args {
    /// eniipamd's socket.
    #[arg(long, env = "ENIIPAM_SOCKET_PATH", default_value = eniipam_api::DEFAULT_SOCKET)]
    socket: PathBuf,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Capacity, ENIs, idle / assigned / cooling / sticky IPs, min/max idle, back-offs.
    Status,
    /// Every pod IP assignment.
    Allocations,
    /// The ENIs and their IPs.
    Enis,
    /// Exit 0 when eniipamd's gRPC health service reports SERVING (for liveness/readiness probes).
    Health,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("eniipamctl: {e}");
            ExitCode::from(1)
        }
    }
}

async fn run(args: &Args) -> Result<(), String> {
    let socket = &args.socket;
    if !socket.exists() {
        return Err(format!(
            "no socket at {}: is eniipamd running? (pass --socket or set ENIIPAM_SOCKET_PATH)",
            socket.display()
        ));
    }
    let channel = eniipam_api::connect(socket).await.map_err(|e| {
        let mut msg = format!("cannot connect to eniipamd at {}: {e}", socket.display());
        if let Err(io) = std::fs::File::open(socket)
            && io.kind() == std::io::ErrorKind::PermissionDenied
        {
            msg.push_str(" (permission denied: the socket is root-only, try sudo)");
        }
        msg
    })?;
    let status = |s: tonic::Status| format!("eniipamd answered {:?}: {}", s.code(), s.message());
    if let Command::Health = args.command {
        let mut h = tonic_health::pb::health_client::HealthClient::new(channel);
        let r = h
            .check(tonic_health::pb::HealthCheckRequest {
                service: "eniipam.v1.Ipam".into(),
            })
            .await
            .map_err(status)?
            .into_inner();
        let serving =
            r.status == tonic_health::pb::health_check_response::ServingStatus::Serving as i32;
        if args.json {
            println!("{}", json!({"serving": serving}));
        } else {
            println!("{}", if serving { "SERVING" } else { "NOT SERVING" });
        }
        return if serving {
            Ok(())
        } else {
            Err("eniipamd is not serving".into())
        };
    }
    let mut c = pb::introspect_client::IntrospectClient::new(channel);
    match args.command {
        Command::Health => unreachable!("answered above"),
        Command::Status => {
            let p = c
                .pool(pb::PoolRequest {})
                .await
                .map_err(status)?
                .into_inner();
            if args.json {
                println!("{}", pool_json(&p));
            } else {
                print_pool(&p);
            }
        }
        Command::Allocations => {
            let a = c
                .allocations(pb::AllocationsRequest {})
                .await
                .map_err(status)?
                .into_inner();
            if args.json {
                let v: Vec<_> = a
                    .allocations
                    .iter()
                    .map(|x| {
                        json!({"ip": x.ip, "container_id": x.container_id, "ifname": x.ifname, "netns": x.netns,
                               "pod_namespace": x.pod_namespace, "pod_name": x.pod_name, "eni_id": x.eni_id,
                               "sticky_key": x.sticky_key, "assigned_at_ms": x.assigned_at_ms})
                    })
                    .collect();
                println!("{}", serde_json::Value::Array(v));
            } else {
                println!(
                    "{:<16} {:<21} {:<32} {:<14} CONTAINER",
                    "IP", "ENI", "POD", "IFNAME"
                );
                for x in &a.allocations {
                    let pod = format!("{}/{}", x.pod_namespace, x.pod_name);
                    println!(
                        "{:<16} {:<21} {:<32} {:<14} {}",
                        x.ip, x.eni_id, pod, x.ifname, x.container_id
                    );
                }
                println!("{} allocations", a.allocations.len());
            }
        }
        Command::Enis => {
            let e = c
                .enis(pb::EnisRequest {})
                .await
                .map_err(status)?
                .into_inner();
            if args.json {
                println!(
                    "{}",
                    serde_json::Value::Array(e.enis.iter().map(eni_json).collect())
                );
            } else {
                print_enis(&e.enis);
            }
        }
    }
    Ok(())
}

fn eni_json(e: &pb::EniInfo) -> serde_json::Value {
    json!({"eni_id": e.eni_id, "mac": e.mac, "device_index": e.device_index, "subnet_id": e.subnet_id,
           "subnet_cidr": e.subnet_cidr, "primary_ip": e.primary_ip, "idle": e.idle, "assigned": e.assigned,
           "cooling": e.cooling, "sticky": e.sticky, "state": e.state, "backlog": e.backlog})
}

fn pool_json(p: &pb::PoolReply) -> serde_json::Value {
    json!({
        "instance_id": p.instance_id, "instance_type": p.instance_type, "ready": p.ready,
        "capacity": p.capacity, "tokens_in_use": p.tokens_in_use, "min_idle": p.min_idle, "max_idle": p.max_idle,
        "idle": p.idle, "assigned": p.assigned, "cooling": p.cooling, "sticky": p.sticky, "in_flight": p.in_flight,
        "exhausted": p.exhausted, "exhausted_reason": p.exhausted_reason,
        "backoffs": p.backoffs.iter().map(|b| json!({"scope": b.scope, "reason": b.reason, "remaining_ms": b.remaining_ms})).collect::<Vec<_>>(),
        "enis": p.enis.iter().map(eni_json).collect::<Vec<_>>(),
    })
}

fn print_enis(enis: &[pb::EniInfo]) {
    println!(
        "{:<4} {:<21} {:<26} {:<18} {:>5} {:>8} {:>7} {:>6} {:<12}",
        "DEV", "ENI", "SUBNET", "CIDR", "IDLE", "ASSIGNED", "COOLING", "STICKY", "STATE"
    );
    for e in enis {
        println!(
            "{:<4} {:<21} {:<26} {:<18} {:>5} {:>8} {:>7} {:>6} {:<12}",
            e.device_index,
            e.eni_id,
            e.subnet_id,
            e.subnet_cidr,
            e.idle,
            e.assigned,
            e.cooling,
            e.sticky,
            e.state
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
        "warm pool: min_idle {}, max_idle {}",
        p.min_idle, p.max_idle
    );
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
