//! The control API: JSON over HTTP under `/_mock/` on the EC2 listener, for tests, benchmarks and
//! people. See the README of mockcloud (`mocks/mockcloud/README.md`) for every route.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::{Json, Router};
use ipnet::Ipv4Net;
use serde::Deserialize;

use crate::config::LatencyProfile;
use crate::error::Ec2Error;
use crate::throttling::{Bucket, Throttling};
use crate::traffic::Fault;
use crate::world::{OccupyPattern, ReservationType};
use crate::{Inner, MockCloud};

fn err(status: StatusCode, message: impl std::fmt::Display) -> Response {
    (
        status,
        Json(serde_json::json!({ "error": message.to_string() })),
    )
        .into_response()
}

fn ec2_err(e: Ec2Error) -> Response {
    err(
        StatusCode::BAD_REQUEST,
        format!("{}: {}", e.code, e.message),
    )
}

/// Routes under `/_mock/`.
pub fn router() -> Router<Arc<Inner>> {
    Router::new()
        .route("/_mock/state", get(state))
        .route("/_mock/counters", get(counters).delete(reset_counters))
        .route("/_mock/calls", get(calls))
        .route("/_mock/vpcs", post(create_vpc))
        .route("/_mock/vpcs/{id}/cidrs", post(associate_vpc_cidr))
        .route("/_mock/subnets", post(create_subnet).get(list_subnets))
        .route("/_mock/subnets/{id}/usage", get(subnet_usage))
        .route(
            "/_mock/subnets/{id}/occupy",
            post(occupy).delete(release_occupied),
        )
        .route(
            "/_mock/subnets/{id}/reservations",
            post(create_reservation).get(list_reservations),
        )
        .route("/_mock/reservations/{id}", delete(delete_reservation))
        .route("/_mock/allocation", put(set_allocation))
        .route("/_mock/instances", post(launch).get(list_instances))
        .route("/_mock/instances/{id}", get(instance).delete(terminate))
        .route(
            "/_mock/faults",
            post(add_fault).get(list_faults).delete(clear_faults),
        )
        .route(
            "/_mock/throttling",
            put(set_throttling).post(set_one_bucket).get(get_throttling),
        )
        .route("/_mock/throttling/{bucket}", put(set_bucket))
        .route("/_mock/latency", put(set_latency).get(get_latency))
        .route("/_mock/imds-lag", put(set_imds_lag))
        .route("/_mock/describe-lag", put(set_describe_lag))
        .route("/_mock/new-eni-lag", put(set_new_eni_lag))
        .route("/_mock/deny/{action}", put(deny).delete(allow))
        .route(
            "/_mock/iam/policy",
            get(get_iam_policy)
                .put(put_iam_policy)
                .delete(delete_iam_policy),
        )
        .route(
            "/_mock/iam/denials",
            get(iam_denials).delete(clear_iam_denials),
        )
        .route("/_mock/iam/decode", post(iam_decode))
        .route("/_mock/default", get(default_world))
        .route("/_mock/healthz", get(|| async { "ok" }))
        .route(
            "/_mock/{*rest}",
            delete(not_found)
                .get(not_found)
                .post(not_found)
                .put(not_found),
        )
}

async fn not_found(Path(rest): Path<String>) -> Response {
    err(
        StatusCode::NOT_FOUND,
        format!("no control route /_mock/{rest}"),
    )
}

async fn state(State(m): State<Arc<Inner>>) -> Response {
    Json(MockCloud::from_inner(&m).dump()).into_response()
}

async fn counters(State(m): State<Arc<Inner>>) -> Response {
    Json(m.traffic.lock().expect("traffic lock").counters()).into_response()
}

async fn reset_counters(State(m): State<Arc<Inner>>) -> Response {
    MockCloud::from_inner(&m).reset_counters();
    StatusCode::NO_CONTENT.into_response()
}

async fn calls(State(m): State<Arc<Inner>>) -> Response {
    Json(m.traffic.lock().expect("traffic lock").log()).into_response()
}

#[derive(Deserialize)]
struct VpcReq {
    cidr: Ipv4Net,
}

async fn create_vpc(State(m): State<Arc<Inner>>, Json(r): Json<VpcReq>) -> Response {
    match MockCloud::from_inner(&m).create_vpc(r.cidr) {
        Ok((vpc_id, sg)) => {
            Json(serde_json::json!({"vpc_id": vpc_id, "security_group_id": sg})).into_response()
        }
        Err(e) => ec2_err(e),
    }
}

/// `POST /_mock/vpcs/{id}/cidrs` `{"cidr": "100.64.0.0/16"}`: AssociateVpcCidrBlock.
async fn associate_vpc_cidr(
    State(m): State<Arc<Inner>>,
    Path(id): Path<String>,
    Json(r): Json<VpcReq>,
) -> Response {
    match MockCloud::from_inner(&m).associate_vpc_cidr_block(&id, r.cidr) {
        Ok(a) => Json(a).into_response(),
        Err(e) => ec2_err(e),
    }
}

#[derive(Deserialize)]
struct SubnetReq {
    vpc_id: String,
    cidr: Ipv4Net,
    availability_zone: Option<String>,
    #[serde(default)]
    tags: BTreeMap<String, String>,
}

async fn create_subnet(State(m): State<Arc<Inner>>, Json(r): Json<SubnetReq>) -> Response {
    let mc = MockCloud::from_inner(&m);
    let az = r.availability_zone.unwrap_or_else(|| mc.default_az());
    match mc.create_subnet_with_tags(&r.vpc_id, r.cidr, &az, &r.tags) {
        Ok(id) => Json(serde_json::json!({"subnet_id": id})).into_response(),
        Err(e) => ec2_err(e),
    }
}

async fn list_subnets(State(m): State<Arc<Inner>>) -> Response {
    Json(MockCloud::from_inner(&m).subnets()).into_response()
}

async fn subnet_usage(State(m): State<Arc<Inner>>, Path(id): Path<String>) -> Response {
    match MockCloud::from_inner(&m).subnet_usage(&id) {
        Ok(u) => Json(u).into_response(),
        Err(e) => ec2_err(e),
    }
}

async fn occupy(
    State(m): State<Arc<Inner>>,
    Path(id): Path<String>,
    Json(pattern): Json<OccupyPattern>,
) -> Response {
    let mc = MockCloud::from_inner(&m);
    match mc.occupy_addresses(&id, &pattern) {
        Ok(n) => Json(serde_json::json!({"occupied": n, "usage": mc.subnet_usage(&id).ok()}))
            .into_response(),
        Err(e) => ec2_err(e),
    }
}

async fn release_occupied(State(m): State<Arc<Inner>>, Path(id): Path<String>) -> Response {
    match MockCloud::from_inner(&m).release_occupied(&id) {
        Ok(n) => Json(serde_json::json!({"released": n})).into_response(),
        Err(e) => ec2_err(e),
    }
}

#[derive(Deserialize)]
struct ReservationReq {
    cidr: Ipv4Net,
    reservation_type: ReservationType,
    #[serde(default)]
    description: String,
}

async fn create_reservation(
    State(m): State<Arc<Inner>>,
    Path(id): Path<String>,
    Json(r): Json<ReservationReq>,
) -> Response {
    match MockCloud::from_inner(&m).create_subnet_cidr_reservation(
        &id,
        r.cidr,
        r.reservation_type,
        &r.description,
    ) {
        Ok(v) => Json(v).into_response(),
        Err(e) => ec2_err(e),
    }
}

async fn list_reservations(State(m): State<Arc<Inner>>, Path(id): Path<String>) -> Response {
    match MockCloud::from_inner(&m).subnet_cidr_reservations(&id) {
        Ok(v) => Json(v).into_response(),
        Err(e) => ec2_err(e),
    }
}

async fn delete_reservation(State(m): State<Arc<Inner>>, Path(id): Path<String>) -> Response {
    match MockCloud::from_inner(&m).delete_subnet_cidr_reservation(&id) {
        Ok(v) => Json(v).into_response(),
        Err(e) => ec2_err(e),
    }
}

#[derive(Deserialize)]
struct AllocationReq {
    seed: u64,
}

async fn set_allocation(State(m): State<Arc<Inner>>, Json(r): Json<AllocationReq>) -> Response {
    MockCloud::from_inner(&m).set_allocation_seed(r.seed);
    StatusCode::NO_CONTENT.into_response()
}

#[derive(Deserialize)]
struct LaunchReq {
    instance_type: String,
    subnet_id: String,
    #[serde(default)]
    security_groups: Vec<String>,
}

async fn launch(State(m): State<Arc<Inner>>, Json(r): Json<LaunchReq>) -> Response {
    match MockCloud::from_inner(&m)
        .launch_instance_with(&r.instance_type, &r.subnet_id, &r.security_groups)
        .await
    {
        Ok(i) => Json(i).into_response(),
        Err(e) => ec2_err(e),
    }
}

async fn list_instances(State(m): State<Arc<Inner>>) -> Response {
    Json(MockCloud::from_inner(&m).instances()).into_response()
}

async fn instance(State(m): State<Arc<Inner>>, Path(id): Path<String>) -> Response {
    match MockCloud::from_inner(&m).instance(&id) {
        Some(v) => Json(v).into_response(),
        None => err(StatusCode::NOT_FOUND, format!("no instance {id}")),
    }
}

async fn terminate(State(m): State<Arc<Inner>>, Path(id): Path<String>) -> Response {
    match MockCloud::from_inner(&m).terminate_instance(&id) {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => ec2_err(e),
    }
}

async fn add_fault(State(m): State<Arc<Inner>>, Json(f): Json<Fault>) -> Response {
    if !(0.0..=1.0).contains(&f.probability) {
        return err(
            StatusCode::BAD_REQUEST,
            "probability must be between 0 and 1",
        );
    }
    MockCloud::from_inner(&m).inject_fault(f);
    StatusCode::NO_CONTENT.into_response()
}

async fn list_faults(State(m): State<Arc<Inner>>) -> Response {
    Json(m.traffic.lock().expect("traffic lock").faults()).into_response()
}

async fn clear_faults(State(m): State<Arc<Inner>>) -> Response {
    MockCloud::from_inner(&m).clear_faults();
    StatusCode::NO_CONTENT.into_response()
}

/// `PUT /_mock/throttling`: every bucket at once (fields left out keep EC2's defaults).
async fn set_throttling(State(m): State<Arc<Inner>>, Json(t): Json<Throttling>) -> Response {
    if let Err(e) = t.validate() {
        return err(StatusCode::BAD_REQUEST, e);
    }
    MockCloud::from_inner(&m).set_throttling(t);
    StatusCode::NO_CONTENT.into_response()
}

/// `PUT /_mock/throttling/{bucket}` with `{"capacity","refill_per_sec"}`: one API's bucket
/// (`API`, `API:unfiltered`) or a category's default.
async fn set_bucket(
    State(m): State<Arc<Inner>>,
    Path(bucket): Path<String>,
    Json(size): Json<Bucket>,
) -> Response {
    match MockCloud::from_inner(&m).set_bucket(&bucket, size) {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => err(StatusCode::BAD_REQUEST, e),
    }
}

#[derive(Deserialize)]
struct OneBucketReq {
    bucket: String,
    #[serde(flatten)]
    size: Bucket,
}

/// `POST /_mock/throttling` with `{"bucket","capacity","refill_per_sec"}`: the same as
/// `PUT /_mock/throttling/{bucket}`.
async fn set_one_bucket(State(m): State<Arc<Inner>>, Json(r): Json<OneBucketReq>) -> Response {
    set_bucket(State(m), Path(r.bucket), Json(r.size)).await
}

/// `GET /_mock/throttling`: the settings (as `PUT` takes them) and `buckets`, every bucket with
/// its size and its tokens now.
async fn get_throttling(State(m): State<Arc<Inner>>) -> Response {
    let (throttling, buckets) = MockCloud::from_inner(&m).throttling();
    let mut v = serde_json::to_value(throttling).unwrap_or_default();
    v["buckets"] = serde_json::to_value(buckets).unwrap_or_default();
    Json(v).into_response()
}

#[derive(Deserialize)]
#[serde(untagged)]
enum LatencyReq {
    Named { profile: String },
    Full(LatencyProfile),
}

async fn set_latency(State(m): State<Arc<Inner>>, Json(r): Json<LatencyReq>) -> Response {
    let profile = match r {
        LatencyReq::Named { profile } => match LatencyProfile::named(&profile) {
            Some(p) => p,
            None => {
                return err(
                    StatusCode::BAD_REQUEST,
                    format!("unknown profile {profile:?} (fast, realistic)"),
                );
            }
        },
        LatencyReq::Full(p) => p,
    };
    if !(0.0..1.0).contains(&profile.jitter) {
        return err(StatusCode::BAD_REQUEST, "jitter must be in [0, 1)");
    }
    MockCloud::from_inner(&m).set_latency(profile);
    StatusCode::NO_CONTENT.into_response()
}

async fn get_latency(State(m): State<Arc<Inner>>) -> Response {
    Json(m.latency.lock().expect("latency lock").clone()).into_response()
}

#[derive(Deserialize)]
struct LagReq {
    ms: u64,
}

async fn set_imds_lag(State(m): State<Arc<Inner>>, Json(r): Json<LagReq>) -> Response {
    MockCloud::from_inner(&m).set_imds_lag(Duration::from_millis(r.ms));
    StatusCode::NO_CONTENT.into_response()
}

async fn set_describe_lag(State(m): State<Arc<Inner>>, Json(r): Json<LagReq>) -> Response {
    MockCloud::from_inner(&m).set_describe_lag(Duration::from_millis(r.ms));
    StatusCode::NO_CONTENT.into_response()
}

#[derive(Deserialize)]
struct NewEniLagReq {
    ms: u64,
    #[serde(default)]
    refusals: u32,
    /// The share of new ENIs whose calls are refused (default: every one).
    refused_share: Option<f64>,
}

async fn set_new_eni_lag(State(m): State<Arc<Inner>>, Json(r): Json<NewEniLagReq>) -> Response {
    let share = r.refused_share.unwrap_or(1.0);
    if !(0.0..=1.0).contains(&share) {
        return err(StatusCode::BAD_REQUEST, "refused_share must be in [0, 1]");
    }
    MockCloud::from_inner(&m).set_new_eni_lag(crate::NewEniLag {
        window: Duration::from_millis(r.ms),
        refusals: r.refusals,
        refused_share: share,
    });
    StatusCode::NO_CONTENT.into_response()
}

async fn deny(State(m): State<Arc<Inner>>, Path(action): Path<String>) -> Response {
    MockCloud::from_inner(&m).deny(&action, true);
    StatusCode::NO_CONTENT.into_response()
}

async fn allow(State(m): State<Arc<Inner>>, Path(action): Path<String>) -> Response {
    MockCloud::from_inner(&m).deny(&action, false);
    StatusCode::NO_CONTENT.into_response()
}

async fn default_world(State(m): State<Arc<Inner>>) -> Response {
    match MockCloud::from_inner(&m).default_world() {
        Some(d) => Json(d).into_response(),
        None => err(
            StatusCode::NOT_FOUND,
            "mockcloud was started without a default world",
        ),
    }
}

#[derive(Deserialize)]
struct CallerQuery {
    access_key_id: Option<String>,
}

/// `GET /_mock/iam/policy[?access_key_id=]`: the policy in force (account-wide, or for that caller).
async fn get_iam_policy(State(m): State<Arc<Inner>>, Query(q): Query<CallerQuery>) -> Response {
    let policy = MockCloud::from_inner(&m).iam_policy(q.access_key_id.as_deref());
    Json(serde_json::json!({
        "access_key_id": q.access_key_id,
        "policy": policy.map(|p| p.to_json()),
    }))
    .into_response()
}

/// `PUT /_mock/iam/policy[?access_key_id=]` with a policy document: enforce it from the next call.
async fn put_iam_policy(
    State(m): State<Arc<Inner>>,
    Query(q): Query<CallerQuery>,
    body: Bytes,
) -> Response {
    let text = match std::str::from_utf8(&body) {
        Ok(t) => t,
        Err(_) => return err(StatusCode::BAD_REQUEST, "the policy must be UTF-8 JSON"),
    };
    let policy = match crate::iam::Policy::parse(text) {
        Ok(p) => p,
        Err(e) => return err(StatusCode::BAD_REQUEST, e),
    };
    let mc = MockCloud::from_inner(&m);
    match q.access_key_id {
        Some(k) => mc.set_iam_policy_for(&k, Some(policy)),
        None => mc.set_iam_policy(Some(policy)),
    }
    StatusCode::NO_CONTENT.into_response()
}

/// `DELETE /_mock/iam/policy[?access_key_id=]`: no enforcement (or drop that caller's override).
async fn delete_iam_policy(State(m): State<Arc<Inner>>, Query(q): Query<CallerQuery>) -> Response {
    let mc = MockCloud::from_inner(&m);
    match q.access_key_id {
        Some(k) => mc.set_iam_policy_for(&k, None),
        None => mc.set_iam_policy(None),
    }
    StatusCode::NO_CONTENT.into_response()
}

async fn iam_denials(State(m): State<Arc<Inner>>) -> Response {
    Json(MockCloud::from_inner(&m).iam_denials()).into_response()
}

async fn clear_iam_denials(State(m): State<Arc<Inner>>) -> Response {
    MockCloud::from_inner(&m).clear_iam_denials();
    StatusCode::NO_CONTENT.into_response()
}

/// `POST /_mock/iam/decode`: mockcloud's `sts:DecodeAuthorizationMessage`. The body is the encoded
/// message, raw or as `{"EncodedMessage": "..."}`; the answer is the decision as JSON.
async fn iam_decode(body: Bytes) -> Response {
    let text = String::from_utf8_lossy(&body);
    let encoded = match serde_json::from_str::<serde_json::Value>(&text) {
        Ok(serde_json::Value::Object(o)) => o
            .get("EncodedMessage")
            .or_else(|| o.get("encoded_message"))
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_owned(),
        Ok(serde_json::Value::String(s)) => s,
        _ => text.trim().to_owned(),
    };
    match crate::iam::decode(&encoded) {
        Ok(v) => Json(v).into_response(),
        Err(e) => err(StatusCode::BAD_REQUEST, e),
    }
}
