//! The cloud clients a daemon uses: `aws-sdk-ec2` and the IMDS client, with one call-statistics sink.

use std::sync::Arc;

use aws_sdk_ec2::config::Credentials;

use super::DaemonError;
use crate::cloud::calls::CallStats;
use crate::cloud::ec2::{AMBIGUOUS_IMDS_WAIT, Ec2Cloud, Ec2Config};
use crate::cloud::imds::{ImdsConfig, ImdsMetadata};
use crate::cloud::{Cloud, Metadata};
use crate::config::DaemonConfig;

/// The cloud clients a daemon uses (real ones from [`CloudClients::from_config`], or any other).
#[derive(Clone)]
pub struct CloudClients {
    pub cloud: Arc<dyn Cloud>,
    pub metadata: Arc<dyn Metadata>,
    pub stats: Arc<CallStats>,
}

impl CloudClients {
    /// `aws-sdk-ec2` and the `aws-config` IMDS client, as configured; `credentials` overrides the
    /// standard chain (`--simulate` and tests).
    pub async fn from_config(
        config: &DaemonConfig,
        credentials: Option<Credentials>,
    ) -> Result<Self, DaemonError> {
        let stats = Arc::new(CallStats::new());
        let metadata: Arc<dyn Metadata> = Arc::new(ImdsMetadata::new(
            &ImdsConfig {
                endpoint: config.imds_endpoint.clone(),
                ..ImdsConfig::default()
            },
            stats.clone(),
        )?);
        // An ambiguous assign is settled from IMDS first: no describe from the account's budget.
        let cloud = Ec2Cloud::new(
            &Ec2Config {
                region: config.region.clone(),
                endpoint_url: config.ec2_endpoint.clone(),
                credentials,
                limiter: config.limiter_config(),
                ..Ec2Config::default()
            },
            stats.clone(),
        )
        .await
        .map_err(|e| DaemonError::Client(e.to_string()))?
        .with_instance_view(metadata.clone(), AMBIGUOUS_IMDS_WAIT);
        Ok(Self {
            cloud: Arc::new(cloud),
            metadata,
            stats,
        })
    }
}
