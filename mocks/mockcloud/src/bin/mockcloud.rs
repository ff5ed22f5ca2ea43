//! `mockcloud`: serve a simulated EC2 + IMDSv2 on loopback and print where.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Parser;
use mockcloud::{Bucket, Config, LatencyProfile, MockCloud, Throttling};

/// An EC2 Query API + IMDSv2 stand-in for the real AWS SDK, with EC2's limits, latency, throttling and
/// faults. Prints the EC2, control and IMDS URLs, then serves until interrupted.
#[derive(Parser, Debug)]
#[command(name = "mockcloud", version)]
struct Args {
    /// Address for the EC2 endpoint and the control API (`/_mock/...`). Port 0 picks a free port.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Latency profile: `fast` (no latency, no lag) or `realistic` (EC2-like latency, 2 s attach,
    /// 1 s IMDS lag).
    #[arg(long, default_value = "realistic")]
    profile: String,
    /// Turn off account-level throttling (on by default: one bucket per API, sized as EC2's published
    /// table; see the README).
    #[arg(long)]
    no_throttling: bool,
    /// Size one throttling bucket: `API=CAPACITY/REFILL_PER_SEC` (e.g.
    /// `AssignPrivateIpAddresses=100/5`), `API:unfiltered=…` for an unfiltered describe, or a
    /// category's default (`mutating`, `non_mutating`, `unfiltered`, `resource_intensive`).
    /// Repeatable.
    #[arg(long, value_name = "BUCKET=CAPACITY/REFILL", value_parser = parse_throttle)]
    throttle: Vec<(String, Bucket)>,
    /// Override the IMDS lag of the profile, in milliseconds.
    #[arg(long)]
    imds_lag_ms: Option<u64>,
    /// Override the describe lag of the profile, in milliseconds: EC2's describes show addresses
    /// as they were this long ago (eventual consistency).
    #[arg(long)]
    describe_lag_ms: Option<u64>,
    /// Override the profile's new-ENI lag window, in milliseconds: describes do not list an ENI
    /// created (nor show an attachment made) this long ago.
    #[arg(long)]
    new_eni_lag_ms: Option<u64>,
    /// Override how many calls on a new ENI within its lag window answer
    /// InvalidNetworkInterfaceID.NotFound (4294967295: all of them).
    #[arg(long)]
    new_eni_refusals: Option<u32>,
    /// Override the share of new ENIs (0 to 1) whose calls are refused within the window.
    #[arg(long)]
    new_eni_refused_share: Option<f64>,
    /// Instance type of the default instance.
    #[arg(long, default_value = "m5.large")]
    instance_type: String,
    /// Start empty: no default VPC, subnet or instance (create them with the control API).
    #[arg(long)]
    no_default_world: bool,
    /// Region (the default availability zone is `<region>a`).
    #[arg(long, default_value = "us-east-1")]
    region: String,
    /// Print the URLs as one JSON line instead of text.
    #[arg(long)]
    json: bool,
    /// Seed of EC2's random choice of free addresses and /28 blocks (same seed, same addresses).
    #[arg(long, default_value_t = mockcloud::DEFAULT_ALLOCATION_SEED)]
    seed: u64,
    /// Enforce this IAM policy document (JSON) on every EC2 call, account-wide: a denied call answers
    /// `UnauthorizedOperation`.
    #[arg(long, value_name = "FILE", conflicts_with = "iam_shipped")]
    iam_policy: Option<std::path::PathBuf>,
    /// Enforce eniipam's shipped policy (deploy/iam-policy.json) for this cluster name and the
    /// default world's VPC.
    #[arg(long, value_name = "CLUSTER")]
    iam_shipped: Option<String>,
}

fn parse_throttle(s: &str) -> Result<(String, Bucket), String> {
    let (name, size) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not BUCKET=CAPACITY/REFILL"))?;
    let (capacity, refill) = size
        .split_once('/')
        .ok_or_else(|| format!("{size:?} is not CAPACITY/REFILL"))?;
    let number = |v: &str| {
        v.trim()
            .parse::<f64>()
            .map_err(|_| format!("{v:?} in {s:?} is not a number"))
    };
    Ok((
        name.trim().to_owned(),
        Bucket::new(number(capacity)?, number(refill)?),
    ))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let Some(mut latency) = LatencyProfile::named(&args.profile) else {
        bail!(
            "--profile must be `fast` or `realistic`, not {:?}",
            args.profile
        );
    };
    if mockcloud::catalog::lookup(&args.instance_type).is_none() {
        bail!(
            "--instance-type {:?} is not in the catalog (known: {})",
            args.instance_type,
            mockcloud::catalog::CATALOG
                .iter()
                .map(|t| t.name)
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    if let Some(ms) = args.imds_lag_ms {
        latency.imds_lag = Duration::from_millis(ms);
    }
    if let Some(ms) = args.describe_lag_ms {
        latency.describe_lag = Duration::from_millis(ms);
    }
    if let Some(ms) = args.new_eni_lag_ms {
        latency.new_eni_lag.window = Duration::from_millis(ms);
    }
    if let Some(n) = args.new_eni_refusals {
        latency.new_eni_lag.refusals = n;
    }
    if let Some(share) = args.new_eni_refused_share {
        anyhow::ensure!(
            (0.0..=1.0).contains(&share),
            "--new-eni-refused-share must be in [0, 1]"
        );
        latency.new_eni_lag.refused_share = share;
    }
    let iam_policy = match &args.iam_policy {
        None => None,
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read --iam-policy {}", path.display()))?;
            Some(
                mockcloud::iam::Policy::parse(&text)
                    .with_context(|| format!("--iam-policy {}", path.display()))?,
            )
        }
    };
    if args.iam_shipped.is_some() && args.no_default_world {
        bail!(
            "--iam-shipped needs the default world's VPC: drop --no-default-world or use --iam-policy"
        );
    }
    let mut throttling = if args.no_throttling {
        Throttling::disabled()
    } else {
        Throttling::default()
    };
    for (name, size) in &args.throttle {
        throttling
            .set(name, *size)
            .with_context(|| format!("--throttle {name}"))?;
    }
    let config = Config {
        latency,
        throttling,
        seed_default_world: !args.no_default_world,
        default_instance_type: args.instance_type.clone(),
        region: args.region.clone(),
        iam_policy,
    };
    let mock = MockCloud::start_on_seeded(config, args.listen, args.seed)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let default = mock.default_world();
    if let Some(cluster) = &args.iam_shipped {
        mock.enforce_shipped_policy(cluster);
    }
    let iam = match (&args.iam_policy, &args.iam_shipped) {
        (Some(p), _) => format!("policy {}", p.display()),
        (None, Some(c)) => format!("shipped policy for cluster {c}"),
        (None, None) => "off".to_owned(),
    };
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "ec2": mock.ec2_url(), "control": mock.control_url(), "region": mock.region(),
                "default": default, "iam": iam,
            })
        );
    } else {
        println!("mockcloud is serving");
        println!(
            "  EC2 endpoint:  {}   (AWS_ENDPOINT_URL_EC2)",
            mock.ec2_url()
        );
        println!(
            "  control API:   {}/state, /counters, /faults, ...",
            mock.control_url()
        );
        println!("  region:        {}", mock.region());
        println!("  IAM:           {iam}");
        if let Some(d) = default {
            println!(
                "  instance:      {} ({}) in {} / {}",
                d.instance.instance_id, d.instance.instance_type, d.subnet_id, d.subnet_cidr
            );
            println!(
                "  IMDS:          {}   (AWS_EC2_METADATA_SERVICE_ENDPOINT)",
                d.instance.imds_url
            );
        }
        println!("Press Ctrl-C to stop.");
    }
    tokio::signal::ctrl_c()
        .await
        .context("waiting for Ctrl-C")?;
    Ok(())
}
