//! EC2's per-API throttling through the real `aws-sdk-ec2` client: each API spends only its own
//! bucket (issue 25's check), buckets refill at their rate, the unfiltered-and-unpaginated describe
//! rule, every bucket sized per API over HTTP and by the binary's flags, bad settings refused by name.

mod support;

use std::time::Duration;

use aws_sdk_ec2::Client;
use mockcloud::{Bucket, Config, MockCloud, Throttling};
use serde_json::{Value, json};

use support::{code, ec2, filter, set_description};

/// Default world, no latency, EC2's published buckets.
async fn ec2_buckets() -> MockCloud {
    MockCloud::start(Config {
        throttling: Throttling::default(),
        ..Config::fast()
    })
    .await
    .expect("mockcloud starts")
}

/// An ENI in the default subnet.
async fn an_eni(c: &Client, mock: &MockCloud) -> String {
    support::create_eni(c, &mock.default_world().unwrap().subnet_id).await
}

/// `ok` or the error code.
fn outcome<T, E: aws_sdk_ec2::error::ProvideErrorMetadata>(r: Result<T, E>) -> String {
    match r {
        Ok(_) => "ok".into(),
        Err(e) => code(e),
    }
}

async fn modify(c: &Client, eni: &str) -> String {
    outcome(set_description(c, eni).send().await)
}

async fn assign(c: &Client, eni: &str) -> String {
    outcome(
        c.assign_private_ip_addresses()
            .network_interface_id(eni)
            .secondary_private_ip_address_count(1)
            .send()
            .await,
    )
}

async fn describe_enis_unfiltered(c: &Client) -> String {
    outcome(c.describe_network_interfaces().send().await)
}

/// A bucket's tokens now, as `GET /_mock/throttling` reports them.
async fn tokens(mock: &MockCloud, bucket: &str) -> f64 {
    let v = get_throttling(mock).await;
    v["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["bucket"] == bucket)
        .unwrap_or_else(|| panic!("no bucket {bucket} in {v}"))["tokens"]
        .as_f64()
        .unwrap()
}

async fn get_throttling(mock: &MockCloud) -> Value {
    reqwest::get(format!("{}/throttling", mock.control_url()))
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// A control call: its status and its body (JSON, or null when empty).
async fn control(
    mock: &MockCloud,
    method: reqwest::Method,
    path: &str,
    body: Value,
) -> (u16, Value) {
    let r = reqwest::Client::new()
        .request(method, format!("{}{path}", mock.control_url()))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

#[tokio::test]
async fn a_throttled_modify_leaves_create_and_assign_alone() {
    let mock = ec2_buckets().await;
    let c = ec2(&mock);
    let eni = an_eni(&c, &mock).await;
    // Spend ModifyNetworkInterfaceAttribute's bucket (100, 5/s) until EC2 says no.
    let mut modifies = 0;
    while modify(&c, &eni).await != "RequestLimitExceeded" {
        modifies += 1;
        assert!(modifies < 5000, "Modify was never throttled");
    }
    assert!(modifies >= 100, "the bucket held its capacity: {modifies}");
    // The check, from outside: 10 creates and 4 assigns right after. EC2 throttles none.
    for _ in 0..10 {
        an_eni(&c, &mock).await;
    }
    for _ in 0..4 {
        assert_eq!(assign(&c, &eni).await, "ok");
    }
    let counters = mock.counters();
    assert!(counters.throttled("ModifyNetworkInterfaceAttribute") >= 1);
    assert_eq!(counters.throttled("CreateNetworkInterface"), 0);
    assert_eq!(counters.throttled("AssignPrivateIpAddresses"), 0);
    assert_eq!(
        counters.total_throttled(),
        counters.throttled("ModifyNetworkInterfaceAttribute")
    );
    // Each API's bucket spent only its own calls: 11 creates and 4 assigns of 100 (plus refill).
    let create = tokens(&mock, "CreateNetworkInterface").await;
    assert!((89.0..=100.0).contains(&create), "{create}");
    let assigned = tokens(&mock, "AssignPrivateIpAddresses").await;
    assert!((96.0..=100.0).contains(&assigned), "{assigned}");
    assert!(tokens(&mock, "ModifyNetworkInterfaceAttribute").await < 100.0);
}

#[tokio::test]
async fn another_tenants_spending_leaves_the_sdks_calls_throttled() {
    let mock = ec2_buckets().await;
    let c = ec2(&mock);
    let eni = an_eni(&c, &mock).await;
    mock.set_bucket("AssignPrivateIpAddresses", Bucket::new(4.0, 0.001))
        .unwrap();
    // The tenant takes 3 of 4: one assign goes through, the next finds the bucket empty.
    assert_eq!(mock.spend_tokens("AssignPrivateIpAddresses", 3), Ok(3));
    assert_eq!(assign(&c, &eni).await, "ok");
    assert_eq!(assign(&c, &eni).await, "RequestLimitExceeded");
    assert_eq!(mock.spend_tokens("AssignPrivateIpAddresses", 5), Ok(0));
    assert!(tokens(&mock, "AssignPrivateIpAddresses").await < 1.0);
    // Only the SDK's calls are counted; other APIs keep their tokens.
    assert_eq!(mock.counters().calls("AssignPrivateIpAddresses"), 2);
    assert_eq!(modify(&c, &eni).await, "ok");
    let e = mock.spend_tokens("Assign", 1).unwrap_err();
    assert!(e.to_string().contains("\"Assign\""), "{e}");
}

/// On tokio's paused clock, which mockcloud's buckets follow: the refill is the bucket's rate
/// however loaded the machine is (issue 45), and the 2.5 s wait costs no real time.
#[tokio::test(start_paused = true)]
async fn a_bucket_refills_at_its_rate() {
    let mock = ec2_buckets().await;
    let c = ec2(&mock);
    let eni = an_eni(&c, &mock).await;
    // Two tokens, one more every two seconds: the margins below are a second and more.
    mock.set_bucket("AssignPrivateIpAddresses", Bucket::new(2.0, 0.5))
        .unwrap();
    assert_eq!(assign(&c, &eni).await, "ok");
    assert_eq!(assign(&c, &eni).await, "ok");
    assert_eq!(assign(&c, &eni).await, "RequestLimitExceeded");
    assert!(tokens(&mock, "AssignPrivateIpAddresses").await < 1.0);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(tokens(&mock, "AssignPrivateIpAddresses").await >= 1.0);
    assert_eq!(assign(&c, &eni).await, "ok", "one token came back");
    assert_eq!(assign(&c, &eni).await, "RequestLimitExceeded", "only one");
    // Throttled calls are counted as such, not as done.
    let counters = mock.counters();
    assert_eq!(counters.ok("AssignPrivateIpAddresses"), 3);
    assert_eq!(counters.throttled("AssignPrivateIpAddresses"), 2);
}

#[tokio::test]
async fn an_unfiltered_describe_draws_from_the_smaller_bucket() {
    let mock = ec2_buckets().await;
    let c = ec2(&mock);
    let d = mock.default_world().unwrap();
    let eni = d.instance.primary_eni.clone();
    let (throttling, _) = mock.throttling();
    assert_eq!(
        throttling.bucket("DescribeNetworkInterfaces:unfiltered"),
        Bucket::new(50.0, 10.0),
        "EC2's unfiltered-and-unpaginated bucket"
    );
    mock.set_bucket(
        "DescribeNetworkInterfaces:unfiltered",
        Bucket::new(2.0, 0.001),
    )
    .unwrap();
    mock.set_bucket("DescribeInstances:unfiltered", Bucket::new(1.0, 0.001))
        .unwrap();
    assert_eq!(describe_enis_unfiltered(&c).await, "ok");
    assert_eq!(describe_enis_unfiltered(&c).await, "ok");
    assert_eq!(describe_enis_unfiltered(&c).await, "RequestLimitExceeded");
    // A filter, IDs or pagination: the API's standard bucket, untouched.
    let filtered = c
        .describe_network_interfaces()
        .filters(filter("attachment.instance-id", &d.instance.instance_id))
        .send()
        .await;
    assert_eq!(outcome(filtered), "ok");
    let by_id = c
        .describe_network_interfaces()
        .network_interface_ids(&eni)
        .send()
        .await;
    assert_eq!(outcome(by_id), "ok");
    let paginated = c.describe_network_interfaces().max_results(5).send().await;
    assert_eq!(outcome(paginated), "ok");
    // DescribeInstances has its own pair; DescribeSubnets is not in EC2's list: one bucket.
    assert_eq!(outcome(c.describe_instances().send().await), "ok");
    assert_eq!(
        outcome(c.describe_instances().send().await),
        "RequestLimitExceeded"
    );
    let by_id = c
        .describe_instances()
        .instance_ids(&d.instance.instance_id)
        .send()
        .await;
    assert_eq!(outcome(by_id), "ok");
    for _ in 0..5 {
        assert_eq!(outcome(c.describe_subnets().send().await), "ok");
    }
    let counters = mock.counters();
    assert_eq!(counters.ok("DescribeNetworkInterfaces"), 5);
    assert_eq!(counters.throttled("DescribeNetworkInterfaces"), 1);
    assert_eq!(counters.throttled("DescribeInstances"), 1);
    assert_eq!(counters.throttled("DescribeSubnets"), 0);
}

#[tokio::test]
async fn every_bucket_is_shown_and_set_over_http() {
    let mock = ec2_buckets().await;
    let c = ec2(&mock);
    let eni = an_eni(&c, &mock).await;
    let v = get_throttling(&mock).await;
    let buckets = v["buckets"].as_array().unwrap();
    // Three APIs have an unfiltered bucket too (DescribeInstances, DescribeNetworkInterfaces,
    // DescribeSecurityGroups).
    assert_eq!(buckets.len(), mockcloud::ec2::ACTIONS.len() + 3, "{v}");
    let attach = buckets
        .iter()
        .find(|b| b["bucket"] == "AttachNetworkInterface")
        .unwrap();
    assert_eq!(
        (
            &attach["category"],
            &attach["own"],
            &attach["capacity"],
            &attach["refill_per_sec"]
        ),
        (&json!("mutating"), &json!(false), &json!(50.0), &json!(5.0))
    );
    assert_eq!(
        v["apis"]["CreateTags"],
        json!({"capacity": 100.0, "refill_per_sec": 10.0})
    );

    // One bucket by PUT: Modify gets one token; Assign keeps its 100.
    let (status, _) = control(
        &mock,
        reqwest::Method::PUT,
        "/throttling/ModifyNetworkInterfaceAttribute",
        json!({"capacity": 1, "refill_per_sec": 0.001}),
    )
    .await;
    assert_eq!(status, 204);
    assert_eq!(modify(&c, &eni).await, "ok");
    assert_eq!(modify(&c, &eni).await, "RequestLimitExceeded");
    assert_eq!(assign(&c, &eni).await, "ok");

    // One bucket by POST, and a category's default: only the APIs it sizes change.
    let (status, _) = control(
        &mock,
        reqwest::Method::POST,
        "/throttling",
        json!({"bucket": "CreateTags", "capacity": 7, "refill_per_sec": 0.5}),
    )
    .await;
    assert_eq!(status, 204);
    let (status, _) = control(
        &mock,
        reqwest::Method::PUT,
        "/throttling/mutating",
        json!({"capacity": 3, "refill_per_sec": 1}),
    )
    .await;
    assert_eq!(status, 204);
    let (t, levels) = mock.throttling();
    assert_eq!(t.bucket("CreateTags"), Bucket::new(7.0, 0.5));
    assert_eq!(t.bucket("AttachNetworkInterface"), Bucket::new(3.0, 1.0));
    assert_eq!(
        t.bucket("AssignPrivateIpAddresses"),
        Bucket::new(100.0, 5.0)
    );
    let level = |name: &str| levels.iter().find(|l| l.bucket == name).unwrap().tokens;
    assert!(
        level("ModifyNetworkInterfaceAttribute") < 1.0,
        "a resize elsewhere left it alone"
    );

    // The whole settings by PUT: what GET shows goes back in as it is; fields left out are EC2's.
    let shown = get_throttling(&mock).await;
    let (status, _) = control(&mock, reqwest::Method::PUT, "/throttling", shown).await;
    assert_eq!(status, 204);
    assert_eq!(mock.throttling().0, t);
    let (status, _) = control(
        &mock,
        reqwest::Method::PUT,
        "/throttling",
        json!({"enabled": true, "mutating": {"capacity": 2, "refill_per_sec": 0.001}}),
    )
    .await;
    assert_eq!(status, 204);
    assert_eq!(
        mock.throttling().0,
        Throttling::default().with("mutating", Bucket::new(2.0, 0.001))
    );
}

#[tokio::test]
async fn bad_settings_are_refused_by_name() {
    let mock = ec2_buckets().await;
    let before = mock.throttling().0;
    let refused = [
        (
            reqwest::Method::PUT,
            "/throttling/AssignPrivateIpAdresses",
            json!({"capacity": 5, "refill_per_sec": 1}),
            "AssignPrivateIpAdresses",
        ),
        (
            reqwest::Method::PUT,
            "/throttling/DescribeSubnets:unfiltered",
            json!({"capacity": 5, "refill_per_sec": 1}),
            "DescribeSubnets:unfiltered",
        ),
        (
            reqwest::Method::PUT,
            "/throttling/CreateTags",
            json!({"capacity": 0, "refill_per_sec": 1}),
            "CreateTags",
        ),
        (
            reqwest::Method::POST,
            "/throttling",
            json!({"bucket": "RunInstances", "capacity": 5, "refill_per_sec": 1}),
            "RunInstances",
        ),
        (
            reqwest::Method::PUT,
            "/throttling",
            json!({"apis": {"Bogus": {"capacity": 5, "refill_per_sec": 1}}}),
            "Bogus",
        ),
        (
            reqwest::Method::PUT,
            "/throttling",
            json!({"non_mutating": {"capacity": 5, "refill_per_sec": -1}}),
            "non_mutating",
        ),
    ];
    for (method, path, body, name) in refused {
        let (status, v) = control(&mock, method, path, body).await;
        assert_eq!(status, 400, "{path}: {v}");
        let message = v["error"].as_str().unwrap();
        assert!(
            message.contains(&format!("\"{name}\"")),
            "{path}: {message}"
        );
    }
    assert_eq!(mock.throttling().0, before, "nothing changed");
}

#[tokio::test]
async fn the_binary_sizes_buckets_by_flag() {
    let (mut child, urls) = support::start_binary(&[
        "--profile",
        "fast",
        "--throttle",
        "AssignPrivateIpAddresses=3/0.5",
        "--throttle",
        "DescribeNetworkInterfaces:unfiltered=7/1",
        "--throttle",
        "mutating=20/2",
    ])
    .await;
    let v: Value = reqwest::get(format!("{}/throttling", urls["control"].as_str().unwrap()))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let size = |name: &str| {
        let b = v["buckets"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["bucket"] == name)
            .unwrap();
        (
            b["capacity"].as_f64().unwrap(),
            b["refill_per_sec"].as_f64().unwrap(),
        )
    };
    assert_eq!(size("AssignPrivateIpAddresses"), (3.0, 0.5));
    assert_eq!(size("DescribeNetworkInterfaces:unfiltered"), (7.0, 1.0));
    assert_eq!(size("DetachNetworkInterface"), (20.0, 2.0));
    assert_eq!(size("CreateNetworkInterface"), (100.0, 5.0), "EC2's own");
    child.kill().await.unwrap();

    for (flag, named) in [
        ("AssignPrivateIpAdresses=3/1", "AssignPrivateIpAdresses"),
        ("CreateTags=0/1", "CreateTags"),
        ("CreateTags=3", "CreateTags=3"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_mockcloud"))
            .args(["--profile", "fast", "--throttle", flag])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{flag}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(named), "{flag}: {stderr}");
    }
}
