//! IMDSv2 for one simulated instance: `PUT /latest/api/token`, then `GET /latest/meta-data/...` with
//! the token. Each instance has its own listener (its own 169.254.169.254), and shows EC2's changes
//! only after the configured lag, as real instances do.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use rand::Rng;
use tokio::time::Instant;

use crate::Inner;
use crate::world::ImdsInstance;

const TTL_HEADER: &str = "x-aws-ec2-metadata-token-ttl-seconds";
const TOKEN_HEADER: &str = "x-aws-ec2-metadata-token";

#[derive(Clone)]
struct ImdsState {
    mock: Arc<Inner>,
    instance_id: String,
}

/// The router serving one instance's metadata.
pub fn router(mock: Arc<Inner>, instance_id: String) -> Router {
    Router::new()
        .route("/latest/api/token", put(token))
        .route("/latest/meta-data", get(root))
        .route("/latest/meta-data/", get(root))
        .route("/latest/meta-data/{*path}", get(meta))
        .route(
            "/latest/dynamic/instance-identity/document",
            get(identity_document),
        )
        .with_state(ImdsState { mock, instance_id })
}

async fn token(State(s): State<ImdsState>, headers: HeaderMap) -> Response {
    let ttl = headers
        .get(TTL_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let Some(ttl) = ttl.filter(|t| (1..=21600).contains(t)) else {
        return (
            StatusCode::BAD_REQUEST,
            "missing or invalid x-aws-ec2-metadata-token-ttl-seconds",
        )
            .into_response();
    };
    let token: String = {
        let mut rng = rand::rng();
        (0..56)
            .map(|_| {
                let c = rng.random_range(0..62u8);
                (match c {
                    0..=9 => b'0' + c,
                    10..=35 => b'a' + c - 10,
                    _ => b'A' + c - 36,
                }) as char
            })
            .collect()
    };
    s.mock.imds_tokens.lock().expect("token lock").insert(
        token.clone(),
        (
            s.instance_id.clone(),
            Instant::now() + Duration::from_secs(ttl),
        ),
    );
    ([(TTL_HEADER, ttl.to_string())], token).into_response()
}

/// Checks the token, applies IMDS latency, and returns the instance's current (lagged) view.
async fn view(s: &ImdsState, headers: &HeaderMap) -> Result<ImdsInstance, Response> {
    let now = Instant::now();
    let ok = headers
        .get(TOKEN_HEADER)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| {
            let mut tokens = s.mock.imds_tokens.lock().expect("token lock");
            tokens.retain(|_, (_, exp)| *exp > now);
            tokens
                .get(t)
                .is_some_and(|(inst, _)| *inst == s.instance_id)
        });
    s.mock.traffic.lock().expect("traffic lock").record_imds(ok);
    if !ok {
        return Err((StatusCode::UNAUTHORIZED, "Unauthorized").into_response());
    }
    let latency = s.mock.latency.lock().expect("latency lock").imds_latency;
    tokio::time::sleep(latency).await;
    s.mock
        .world
        .lock()
        .expect("world lock")
        .imds(&s.instance_id, Instant::now())
        .ok_or_else(|| (StatusCode::NOT_FOUND, "Not Found").into_response())
}

async fn root(State(s): State<ImdsState>, headers: HeaderMap) -> Response {
    match view(&s, &headers).await {
        Ok(_) => {
            "instance-id\ninstance-type\nlocal-ipv4\nmac\nnetwork/\nplacement/".into_response()
        }
        Err(r) => r,
    }
}

async fn identity_document(State(s): State<ImdsState>, headers: HeaderMap) -> Response {
    match view(&s, &headers).await {
        Ok(v) => serde_json::json!({
            "instanceId": v.instance_id, "instanceType": v.instance_type, "region": v.region,
            "availabilityZone": v.availability_zone, "privateIp": v.local_ipv4,
        })
        .to_string()
        .into_response(),
        Err(r) => r,
    }
}

/// The text IMDS answers for `path` (without `/latest/meta-data/`), or None for a 404.
pub fn lookup(v: &ImdsInstance, path: &str) -> Option<String> {
    let path = path.trim_start_matches('/');
    let simple = match path {
        "instance-id" => Some(v.instance_id.clone()),
        "instance-type" => Some(v.instance_type.clone()),
        "mac" => Some(v.mac.clone()),
        "local-ipv4" => Some(v.local_ipv4.to_string()),
        "placement" | "placement/" => Some("availability-zone\nregion".to_owned()),
        "placement/availability-zone" => Some(v.availability_zone.clone()),
        "placement/region" => Some(v.region.clone()),
        "network" | "network/" => Some("interfaces/".to_owned()),
        "network/interfaces" | "network/interfaces/" => Some("macs/".to_owned()),
        "network/interfaces/macs" | "network/interfaces/macs/" => Some(
            v.interfaces
                .iter()
                .map(|i| format!("{}/", i.mac))
                .collect::<Vec<_>>()
                .join("\n"),
        ),
        _ => None,
    };
    if simple.is_some() {
        return simple;
    }
    let rest = path.strip_prefix("network/interfaces/macs/")?;
    let (mac, field) = rest.split_once('/').unwrap_or((rest, ""));
    let i = v.interfaces.iter().find(|i| i.mac == mac)?;
    let join = |xs: Vec<String>| xs.join("\n");
    Some(match field {
        "" => {
            let mut names = vec![
                "device-number",
                "interface-id",
                "local-ipv4s",
                "mac",
                "security-group-ids",
                "subnet-id",
                "subnet-ipv4-cidr-block",
                "vpc-id",
                "vpc-ipv4-cidr-block",
                "vpc-ipv4-cidr-blocks",
            ];
            if !i.ipv4_prefixes.is_empty() {
                names.push("ipv4-prefix");
            }
            if i.network_card.is_some() {
                names.push("network-card");
            }
            // As on EC2, the IPv6 keys are listed only when they have content.
            if !i.ipv6s.is_empty() {
                names.push("ipv6s");
            }
            if !i.ipv6_prefixes.is_empty() {
                names.push("ipv6-prefix");
            }
            if i.subnet_ipv6_cidr.is_some() {
                names.push("subnet-ipv6-cidr-blocks");
            }
            names.push("vpc-ipv6-cidr-blocks");
            names.sort_unstable();
            join(names.into_iter().map(str::to_owned).collect())
        }
        "device-number" => i.device_number.to_string(),
        // Absent on single-card types (EC2 answers 404; readers take card 0).
        "network-card" => i.network_card?.to_string(),
        // One CIDR per line; 404 when the interface has none.
        "ipv4-prefix" if !i.ipv4_prefixes.is_empty() => {
            join(i.ipv4_prefixes.iter().map(|p| p.to_string()).collect())
        }
        // One address per line, lagged like `local-ipv4s`; 404 when the interface has none.
        "ipv6s" if !i.ipv6s.is_empty() => join(i.ipv6s.iter().map(|a| a.to_string()).collect()),
        // One /80 per line, lagged like `ipv4-prefix`; 404 when the interface has none.
        "ipv6-prefix" if !i.ipv6_prefixes.is_empty() => {
            join(i.ipv6_prefixes.iter().map(|p| p.to_string()).collect())
        }
        "subnet-ipv6-cidr-blocks" => i.subnet_ipv6_cidr?.to_string(),
        "vpc-ipv6-cidr-blocks" => i.vpc_ipv6_cidr.to_string(),
        "interface-id" => i.eni_id.clone(),
        "mac" => i.mac.clone(),
        "local-ipv4s" => join(i.ips.iter().map(|ip| ip.to_string()).collect()),
        "security-group-ids" => join(i.security_groups.clone()),
        "subnet-id" => i.subnet_id.clone(),
        "subnet-ipv4-cidr-block" => i.subnet_cidr.to_string(),
        "vpc-id" => i.vpc_id.clone(),
        "vpc-ipv4-cidr-block" => i.vpc_cidr.to_string(),
        // Every block of the VPC, primary first, one per line.
        "vpc-ipv4-cidr-blocks" => join(i.vpc_cidrs.iter().map(|c| c.to_string()).collect()),
        _ => return None,
    })
}

async fn meta(
    State(s): State<ImdsState>,
    Path(path): Path<String>,
    headers: HeaderMap,
) -> Response {
    match view(&s, &headers).await {
        Ok(v) => match lookup(&v, &path) {
            Some(text) => text.into_response(),
            None => (StatusCode::NOT_FOUND, "Not Found").into_response(),
        },
        Err(r) => r,
    }
}
