//! [`ImdsMetadata`]: the [`Metadata`] trait on the `aws-config` IMDS client (IMDSv2: the client
//! fetches and refreshes the session token itself).
//!
//! Paths read, under `/latest/meta-data/`: `instance-id`, `instance-type`,
//! `placement/availability-zone`, `mac`, `network/interfaces/macs/` and, per MAC, `interface-id`,
//! `device-number`, `subnet-id`, `vpc-id`, `subnet-ipv4-cidr-block`, `vpc-ipv4-cidr-blocks`,
//! `security-group-ids`, `local-ipv4s`, `ipv4-prefix`, and IPv6's `ipv6s`, `ipv6-prefix`,
//! `subnet-ipv6-cidr-blocks`, `vpc-ipv6-cidr-blocks` (each a 404 on an IPv4-only interface, read as
//! none, as EC2 serves them). Every read is counted and timed in [`CallStats`] as
//! `imds:<key>` (the MAC is left out of the name to keep the label set small).

use std::net::{Ipv4Addr, Ipv6Addr};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use aws_config::imds::client::Client;
use aws_config::imds::client::error::ImdsError;
use ipnet::{Ipv4Net, Ipv6Net};
use tokio::time::Instant;

use super::calls::{CallStats, Outcome};
use super::{CloudError, CloudResult, InstanceIdentity, Metadata, MetadataEni};

const PREFIX: &str = "/latest/meta-data/";

/// How to reach IMDS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImdsConfig {
    /// Endpoint override (`http://127.0.0.1:PORT` for mockcloud). Without it, the client's standard
    /// resolution applies: `AWS_EC2_METADATA_SERVICE_ENDPOINT`, the profile, then
    /// `http://169.254.169.254`.
    pub endpoint: Option<String>,
    /// Connect and read timeout of one attempt. Default 1 s (IMDS is link-local and fast; the SDK's
    /// own default).
    pub timeout: Duration,
    /// Attempts per read, the IMDS client's own retry (IMDS is local and not rate limited by us).
    /// Default 3.
    pub max_attempts: u32,
}

impl Default for ImdsConfig {
    fn default() -> Self {
        Self {
            endpoint: None,
            timeout: Duration::from_secs(1),
            max_attempts: 3,
        }
    }
}

/// The instance metadata service through the AWS SDK's IMDSv2 client.
#[derive(Clone, Debug)]
pub struct ImdsMetadata {
    client: Client,
    stats: Arc<CallStats>,
}

impl ImdsMetadata {
    /// A client for `config`; reads are counted in `stats`.
    pub fn new(config: &ImdsConfig, stats: Arc<CallStats>) -> CloudResult<Self> {
        let mut builder = Client::builder()
            .max_attempts(config.max_attempts.max(1))
            .connect_timeout(config.timeout)
            .read_timeout(config.timeout);
        if let Some(endpoint) = &config.endpoint {
            builder = builder.endpoint(endpoint).map_err(|e| {
                CloudError::Metadata(format!("bad IMDS endpoint {endpoint:?}: {e}"))
            })?;
        }
        Ok(Self {
            client: builder.build(),
            stats,
        })
    }

    /// The counters of this client's reads.
    pub fn stats(&self) -> &Arc<CallStats> {
        &self.stats
    }

    /// Read `path` (relative to `/latest/meta-data/`); `Ok(None)` on 404.
    async fn get_opt(&self, label: &'static str, path: String) -> CloudResult<Option<String>> {
        let start = Instant::now();
        let result = self.client.get(format!("{PREFIX}{path}")).await;
        let (outcome, mapped) = match result {
            Ok(v) => (Outcome::Ok, Ok(Some(v.as_ref().to_owned()))),
            Err(ImdsError::ErrorResponse(r)) if r.response().status().as_u16() == 404 => {
                (Outcome::NotFound, Ok(None))
            }
            Err(e) => {
                let outcome = match &e {
                    ImdsError::ErrorResponse(r) if r.response().status().is_server_error() => {
                        Outcome::Transient
                    }
                    ImdsError::ErrorResponse(r) if r.response().status().as_u16() == 429 => {
                        Outcome::Throttled
                    }
                    ImdsError::ErrorResponse(_) => Outcome::Rejected,
                    _ => Outcome::Transient,
                };
                (
                    outcome,
                    Err(CloudError::Metadata(format!(
                        "{path}: {}",
                        eniipam_api::error_chain(&e)
                    ))),
                )
            }
        };
        self.stats.record_call(label, outcome, start.elapsed());
        mapped
    }

    /// Read `path`; a 404 is an error naming the path.
    async fn get(&self, label: &'static str, path: &str) -> CloudResult<String> {
        self.get_opt(label, path.to_owned())
            .await?
            .ok_or_else(|| CloudError::Metadata(format!("{path}: not found (404)")))
    }

    /// Read and parse one interface; `None` when IMDS does not (fully) list it yet.
    async fn read_interface(&self, mac: &str) -> CloudResult<Option<MetadataEni>> {
        let base = format!("network/interfaces/macs/{mac}/");
        let p = |key: &str| format!("{base}{key}");
        let (id, device, subnet, vpc, subnet_cidr, vpc_cidrs, sgs, ips, prefixes) = tokio::try_join!(
            self.get_opt("imds:interface-id", p("interface-id")),
            self.get_opt("imds:device-number", p("device-number")),
            self.get_opt("imds:subnet-id", p("subnet-id")),
            self.get_opt("imds:vpc-id", p("vpc-id")),
            self.get_opt("imds:subnet-ipv4-cidr-block", p("subnet-ipv4-cidr-block")),
            self.get_opt("imds:vpc-ipv4-cidr-blocks", p("vpc-ipv4-cidr-blocks")),
            self.get_opt("imds:security-group-ids", p("security-group-ids")),
            self.get_opt("imds:local-ipv4s", p("local-ipv4s")),
            self.get_opt("imds:ipv4-prefix", p("ipv4-prefix")),
        )?;
        let (ipv6s, ipv6_prefixes, subnet_ipv6, vpc_ipv6) = tokio::try_join!(
            self.get_opt("imds:ipv6s", p("ipv6s")),
            self.get_opt("imds:ipv6-prefix", p("ipv6-prefix")),
            self.get_opt("imds:subnet-ipv6-cidr-blocks", p("subnet-ipv6-cidr-blocks")),
            self.get_opt("imds:vpc-ipv6-cidr-blocks", p("vpc-ipv6-cidr-blocks")),
        )?;
        // A 404 on any IPv6 key means none: EC2 serves them only when there is something to list.
        let v6 = |key: &str, doc: Option<String>| (p(key), doc.unwrap_or_default());
        let (Some(id), Some(device), Some(subnet), Some(vpc), Some(subnet_cidr)) =
            (id, device, subnet, vpc, subnet_cidr)
        else {
            tracing::debug!(mac, "interface not (fully) listed by IMDS yet");
            return Ok(None);
        };
        Ok(Some(MetadataEni {
            mac: mac.to_owned(),
            eni_id: parse_one(&p("interface-id"), &id)?,
            device_number: parse_one(&p("device-number"), &device)?,
            subnet_id: subnet.trim().to_owned(),
            vpc_id: vpc.trim().to_owned(),
            subnet_cidr: parse_one::<Ipv4Net>(&p("subnet-ipv4-cidr-block"), &subnet_cidr)?,
            vpc_cidrs: parse_lines(
                &p("vpc-ipv4-cidr-blocks"),
                vpc_cidrs.as_deref().unwrap_or(""),
            )?,
            security_groups: lines(sgs.as_deref().unwrap_or(""))
                .map(str::to_owned)
                .collect(),
            // A 404 on local-ipv4s means the interface has no IPv4 addresses (yet).
            ips: parse_lines::<Ipv4Addr>(&p("local-ipv4s"), ips.as_deref().unwrap_or(""))?,
            // A 404 means no delegated prefixes.
            ipv4_prefixes: parse_lines::<Ipv4Net>(
                &p("ipv4-prefix"),
                prefixes.as_deref().unwrap_or(""),
            )?,
            ipv6s: {
                let (path, doc) = v6("ipv6s", ipv6s);
                parse_lines::<Ipv6Addr>(&path, &doc)?
            },
            ipv6_prefixes: {
                let (path, doc) = v6("ipv6-prefix", ipv6_prefixes);
                parse_lines::<Ipv6Net>(&path, &doc)?
            },
            subnet_ipv6_cidrs: {
                let (path, doc) = v6("subnet-ipv6-cidr-blocks", subnet_ipv6);
                parse_lines::<Ipv6Net>(&path, &doc)?
            },
            vpc_ipv6_cidrs: {
                let (path, doc) = v6("vpc-ipv6-cidr-blocks", vpc_ipv6);
                parse_lines::<Ipv6Net>(&path, &doc)?
            },
        }))
    }
}

fn lines(s: &str) -> impl Iterator<Item = &str> {
    s.lines().map(str::trim).filter(|l| !l.is_empty())
}

/// Parse a single-value document.
pub fn parse_one<T: FromStr>(path: &str, s: &str) -> CloudResult<T>
where
    T::Err: std::fmt::Display,
{
    s.trim()
        .parse()
        .map_err(|e| CloudError::Metadata(format!("{path}: cannot parse {s:?}: {e}")))
}

/// Parse a newline-separated document.
pub fn parse_lines<T: FromStr>(path: &str, s: &str) -> CloudResult<Vec<T>>
where
    T::Err: std::fmt::Display,
{
    lines(s).map(|l| parse_one(path, l)).collect()
}

/// The MACs of a `network/interfaces/macs/` listing (entries end with `/`).
pub fn parse_mac_list(s: &str) -> Vec<String> {
    lines(s)
        .map(|l| l.trim_end_matches('/').to_owned())
        .collect()
}

#[async_trait]
impl Metadata for ImdsMetadata {
    async fn identity(&self) -> CloudResult<InstanceIdentity> {
        let (instance_id, instance_type, az, mac) = tokio::try_join!(
            self.get("imds:instance-id", "instance-id"),
            self.get("imds:instance-type", "instance-type"),
            self.get(
                "imds:placement/availability-zone",
                "placement/availability-zone"
            ),
            self.get("imds:mac", "mac"),
        )?;
        Ok(InstanceIdentity {
            instance_id: instance_id.trim().to_owned(),
            instance_type: instance_type.trim().to_owned(),
            availability_zone: az.trim().to_owned(),
            mac: mac.trim().to_owned(),
        })
    }

    async fn interfaces(&self) -> CloudResult<Vec<MetadataEni>> {
        let listing = self
            .get("imds:network/interfaces/macs", "network/interfaces/macs/")
            .await?;
        let reads = parse_mac_list(&listing)
            .into_iter()
            .map(|mac| async move { self.read_interface(&mac).await });
        let mut out: Vec<MetadataEni> = futures::future::try_join_all(reads)
            .await?
            .into_iter()
            .flatten()
            .collect();
        out.sort_by_key(|e| e.device_number);
        Ok(out)
    }

    async fn interface(&self, mac: &str) -> CloudResult<Option<MetadataEni>> {
        self.read_interface(mac).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use eniipam_api::model::EniId;

    #[test]
    fn mac_listing_strips_slashes() {
        assert_eq!(
            parse_mac_list("02:00:00:00:00:01/\n02:00:00:00:00:02/\n"),
            vec!["02:00:00:00:00:01", "02:00:00:00:00:02"]
        );
        assert!(parse_mac_list("").is_empty());
    }

    #[test]
    fn newline_lists_parse_and_errors_name_the_path() {
        let ips: Vec<Ipv4Addr> = parse_lines("x/local-ipv4s", "10.0.0.5\n10.0.0.6\n").unwrap();
        assert_eq!(
            ips,
            vec![Ipv4Addr::new(10, 0, 0, 5), Ipv4Addr::new(10, 0, 0, 6)]
        );
        let err =
            parse_lines::<Ipv4Net>("x/vpc-ipv4-cidr-blocks", "10.0.0.0/16\nbogus").unwrap_err();
        assert!(err.to_string().contains("x/vpc-ipv4-cidr-blocks"), "{err}");
        let err = parse_one::<EniId>("x/interface-id", "nope").unwrap_err();
        assert!(matches!(err, CloudError::Metadata(m) if m.contains("x/interface-id")));
        let d: u32 = parse_one("x/device-number", "2\n").unwrap();
        assert_eq!(d, 2);
    }
}
