//! How to reach EC2 ([`Ec2Config`]), and building the [`Ec2Cloud`] client from it.

use std::sync::Arc;
use std::time::Duration;

use aws_config::BehaviorVersion;
use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_sdk_ec2::Client;
use aws_sdk_ec2::config::{Credentials, Region};

use super::Ec2Cloud;
use super::convert::to_i32;
use crate::calls::CallStats;
use crate::limiter::{Limiter, LimiterConfig, LimiterConfigError};

/// Default page size of DescribeNetworkInterfaces (the API's maximum; EC2 accepts 5..=1000).
pub const DESCRIBE_PAGE_SIZE: u32 = 1000;

/// How to reach EC2.
#[derive(Clone, Debug)]
pub struct Ec2Config {
    /// AWS region; `None` uses the standard chain (`AWS_REGION`, profile, IMDS).
    pub region: Option<String>,
    /// Endpoint override (mockcloud, a VPC endpoint). Without it, aws-config's standard loading
    /// applies, including `AWS_ENDPOINT_URL_EC2` / `AWS_ENDPOINT_URL`.
    pub endpoint_url: Option<String>,
    /// Static credentials (tests, `--simulate`); `None` uses the standard credentials chain
    /// (environment, web identity / IRSA, profile, container, IMDS instance profile).
    pub credentials: Option<Credentials>,
    /// Time limit of one attempt, connect included. Default 10 s (the AWS VPC CNI's HTTP timeout):
    /// a timed-out attempt is retried like a 5xx.
    pub call_timeout: Duration,
    /// Time limit to open a connection. Default 3 s.
    pub connect_timeout: Duration,
    /// Page size (MaxResults) of filtered DescribeNetworkInterfaces calls, 5..=1000. Default 1000.
    pub describe_page_size: u32,
    /// Rates and retry policy.
    pub limiter: LimiterConfig,
}

impl Default for Ec2Config {
    fn default() -> Self {
        Self {
            region: None,
            endpoint_url: None,
            credentials: None,
            call_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(3),
            describe_page_size: DESCRIBE_PAGE_SIZE,
            limiter: LimiterConfig::default(),
        }
    }
}

/// Why an [`Ec2Cloud`] could not be built.
#[derive(Debug, thiserror::Error)]
pub enum Ec2BuildError {
    /// The rate or retry settings are invalid.
    #[error("EC2 rate limiter: {0}")]
    Limiter(#[from] LimiterConfigError),
    /// Neither the config nor the standard chain names a region.
    #[error("no AWS region: set it in the config, AWS_REGION, or run on EC2")]
    NoRegion,
}

impl Ec2Cloud {
    /// Load the SDK configuration (standard chain plus `config`'s overrides) and build the client.
    /// Calls are counted in `stats`.
    pub async fn new(config: &Ec2Config, stats: Arc<CallStats>) -> Result<Self, Ec2BuildError> {
        let limiter = Arc::new(Limiter::new(&config.limiter, stats)?);
        let mut loader = aws_config::defaults(BehaviorVersion::latest())
            .retry_config(RetryConfig::disabled())
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(config.connect_timeout)
                    .operation_attempt_timeout(config.call_timeout)
                    .operation_timeout(config.call_timeout)
                    .build(),
            );
        if let Some(region) = &config.region {
            loader = loader.region(Region::new(region.clone()));
        }
        if let Some(url) = &config.endpoint_url {
            loader = loader.endpoint_url(url.clone());
        }
        if let Some(creds) = &config.credentials {
            loader = loader.credentials_provider(creds.clone());
        }
        let sdk_config = loader.load().await;
        if sdk_config.region().is_none() {
            return Err(Ec2BuildError::NoRegion);
        }
        Ok(Self {
            client: Client::new(&sdk_config),
            limiter,
            page_size: to_i32(config.describe_page_size.clamp(5, 1000)),
            holdings: Default::default(),
            created: Default::default(),
            view: None,
        })
    }
}
