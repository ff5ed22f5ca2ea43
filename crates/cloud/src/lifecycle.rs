//! The ENI lifecycle: create → attach → DeleteOnTermination → visible in IMDS, and back: detach →
//! `available` → delete. Written against the [`Cloud`] and [`Metadata`] traits, so it runs on EC2,
//! on mockcloud and on the in-memory fakes alike.
//!
//! What it guarantees:
//! - every ENI is created with its tags in the same call (cluster, instance id, created-at, owner),
//!   so nothing can leak untagged; the collector in [`super::leak`] finds what a crash leaves;
//! - one fresh ClientToken per ENI, reused by every retry of the create (the [`Cloud`]
//!   implementation retries with the request as given), so a timed-out create never makes two;
//! - if anything after the create fails, the ENI is detached (if needed) and deleted before the
//!   error is returned;
//! - IMDS lags EC2: we wait for IMDS with a bounded backoff, and after the bound EC2 is the authority
//!   (one DescribeNetworkInterfaces confirms the attachment and the IPs, and we proceed);
//! - only ENIs we created and that carry no opt-out tag are ever detached or deleted.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::backoff::BackoffPolicy;
use super::{
    AttachmentStatus, Cloud, CloudError, CloudResult, CreateEni, Eni, EniAttachment, EniFilter,
    EniStatus, Instance, InstanceLimits, LiveCount, Metadata, NodeContext, tags,
};
use eniipam_api::model::EniId;

/// Timing of the lifecycle's waits. Every wait is an exponential backoff with full jitter, bounded
/// in total time (see [`BackoffPolicy`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LifecycleConfig {
    /// Polling IMDS until a new ENI and all its IPs show up. Default 100 ms doubling to 1 s, for at
    /// most 15 s: IMDS normally catches up in a second or two; past 15 s we ask EC2 instead of
    /// keeping a pod waiting.
    pub imds_wait: BackoffPolicy,
    /// Polling DescribeNetworkInterfaces until a detached ENI is `available`. Default 200 ms
    /// doubling to 5 s, for at most 60 s (detach usually takes a few seconds).
    pub detach_wait: BackoffPolicy,
    /// Retrying DeleteNetworkInterface while EC2 still reports the ENI in use (its view of the detach
    /// lags). Default 500 ms doubling to 10 s, for at most 60 s.
    pub delete_wait: BackoffPolicy,
}

impl Default for LifecycleConfig {
    fn default() -> Self {
        Self {
            imds_wait: BackoffPolicy::polling(
                Duration::from_millis(100),
                Duration::from_secs(1),
                Duration::from_secs(15),
            ),
            detach_wait: BackoffPolicy::polling(
                Duration::from_millis(200),
                Duration::from_secs(5),
                Duration::from_secs(60),
            ),
            delete_wait: BackoffPolicy::polling(
                Duration::from_millis(500),
                Duration::from_secs(10),
                Duration::from_secs(60),
            ),
        }
    }
}

/// The description eniipam gives the ENIs it creates for `instance_id`.
pub fn eni_description(instance_id: &str) -> String {
    format!("eniipam-{instance_id}")
}

/// What a new ENI is created holding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Slots {
    /// This many secondary IPs, EC2 picking them.
    Ips(u32),
    /// This many `/28` prefixes.
    Prefixes(u32),
    /// These secondary IPs (packed by the pool into fragmented blocks).
    Addresses(Vec<Ipv4Addr>),
}

impl Slots {
    /// Addresses the ENI will hold for pods.
    pub fn addresses(&self) -> u32 {
        match self {
            Self::Ips(n) => *n,
            Self::Prefixes(k) => k * 16,
            Self::Addresses(a) => a.len() as u32,
        }
    }
}

/// One ENI to create and attach.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewEni {
    pub subnet_id: String,
    pub security_groups: Vec<String>,
    pub slots: Slots,
    pub device_index: u32,
    /// The network profile the ENI serves (tagged [`NETWORK_TAG`], so a restart knows it); `None`
    /// for the node's default pod network.
    pub network: Option<String>,
    /// With [`Slots::Ips`]: a count the caller may raise while the create waits out EC2's
    /// throttling ([`CreateEni::live_ip_count`]).
    pub live_ips: Option<LiveCount>,
}

/// The tag naming the network profile an ENI was created for (absent: the default pod network).
pub const NETWORK_TAG: &str = "eniipam.io/network";

/// Security groups for new ENIs in a subnet that names its own (tag `eniipam.io/security-groups`,
/// comma-separated): used instead of the node's.
pub const SECURITY_GROUPS_TAG: &str = "eniipam.io/security-groups";

/// The tags of a new ENI for `node`, created at `now`.
pub fn eni_tags(node: &NodeContext, now: SystemTime) -> BTreeMap<String, String> {
    BTreeMap::from([
        (tags::OWNER.to_owned(), tags::OWNER_VALUE.to_owned()),
        (tags::CLUSTER.to_owned(), node.cluster_name.clone()),
        (tags::INSTANCE_ID.to_owned(), node.instance_id.clone()),
        (tags::AWS_VPC_CNI_NO_MANAGE.to_owned(), "true".to_owned()),
        (
            tags::CREATED_AT.to_owned(),
            humantime::format_rfc3339_seconds(now).to_string(),
        ),
    ])
}

/// The lowest device index in `1..max_enis` that no ENI of `instance` is attached at, or `None`
/// when the instance has as many ENIs as its type allows. Index 0 is the primary ENI's.
pub fn next_free_device_index(instance: &Instance, limits: &InstanceLimits) -> Option<u32> {
    let used: BTreeSet<u32> = instance
        .enis
        .iter()
        .filter_map(|e| e.attachment.as_ref())
        .filter(|a| a.instance_id == instance.id)
        .map(|a| a.device_index)
        .collect();
    (1..limits.max_enis).find(|i| !used.contains(i))
}

/// Creates, attaches, detaches and deletes this node's ENIs.
#[derive(Clone)]
pub struct EniLifecycle {
    cloud: Arc<dyn Cloud>,
    metadata: Arc<dyn Metadata>,
    node: NodeContext,
    config: LifecycleConfig,
}

impl std::fmt::Debug for EniLifecycle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EniLifecycle")
            .field("instance_id", &self.node.instance_id)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl EniLifecycle {
    /// A lifecycle for the node described by `node`.
    pub fn new(
        cloud: Arc<dyn Cloud>,
        metadata: Arc<dyn Metadata>,
        node: NodeContext,
        config: LifecycleConfig,
    ) -> Self {
        Self {
            cloud,
            metadata,
            node,
            config,
        }
    }

    /// The node this lifecycle works for.
    pub fn node(&self) -> &NodeContext {
        &self.node
    }

    /// The next free device index on this instance, from a fresh DescribeInstances.
    pub async fn next_device_index(&self) -> CloudResult<Option<u32>> {
        let instance = self.cloud.describe_instance(&self.node.instance_id).await?;
        Ok(next_free_device_index(&instance, &self.node.limits))
    }

    /// Create an ENI with `secondary_ip_count` secondary IPs in the node's subnet, attach it at
    /// `device_index`, set DeleteOnTermination, and wait until IMDS shows it with its IPs (or EC2
    /// confirms it after the IMDS bound). Returns the attached ENI with its IPs.
    ///
    /// If any step after the create fails, the ENI is cleaned up (detached if attached, deleted)
    /// before the error is returned; if even the cleanup fails, the ENI carries our tags and the
    /// leaked-ENI collector deletes it after its grace period.
    pub async fn create_and_attach(
        &self,
        secondary_ip_count: u32,
        device_index: u32,
    ) -> CloudResult<Eni> {
        self.create(&NewEni {
            subnet_id: self.node.subnet_id.clone(),
            security_groups: self.node.security_groups.clone(),
            slots: Slots::Ips(secondary_ip_count),
            device_index,
            network: None,
            live_ips: None,
        })
        .await
    }

    /// Creates the ENI `new` describes (tagged in the same call), attaches it, sets
    /// DeleteOnTermination and waits until IMDS lists it; cleans up if any step fails.
    pub async fn create(&self, new: &NewEni) -> CloudResult<Eni> {
        let (secondary_ip_count, prefix_count, private_ips) = match &new.slots {
            Slots::Ips(n) => (*n, 0, Vec::new()),
            Slots::Prefixes(k) => (0, *k, Vec::new()),
            Slots::Addresses(a) => (0, 0, a.clone()),
        };
        let req = CreateEni {
            prefix_count,
            private_ips,
            subnet_id: new.subnet_id.clone(),
            security_groups: new.security_groups.clone(),
            description: eni_description(&self.node.instance_id),
            secondary_ip_count,
            tags: {
                let mut tags = eni_tags(&self.node, SystemTime::now());
                if let Some(network) = &new.network {
                    tags.insert(NETWORK_TAG.to_owned(), network.clone());
                }
                tags
            },
            client_token: uuid::Uuid::new_v4().to_string(),
            live_ip_count: match new.slots {
                Slots::Ips(_) => new.live_ips.clone(),
                _ => None,
            },
        };
        let device_index = new.device_index;
        let created = self.cloud.create_eni(&req).await?;
        tracing::info!(
            eni = %created.id,
            subnet = %created.subnet_id,
            ips = created.secondary_ips.len(),
            device_index,
            "created ENI"
        );
        let mut attached = None;
        match self
            .attach_and_settle(&created, device_index, &mut attached)
            .await
        {
            Ok(eni) => Ok(eni),
            Err(err) => {
                tracing::warn!(eni = %created.id, error = %err, "ENI setup failed, cleaning up");
                if let Err(cleanup) = self.cleanup(&created.id, attached).await {
                    tracing::error!(
                        eni = %created.id,
                        error = %cleanup,
                        "could not clean up ENI; the leaked-ENI collector will delete it"
                    );
                }
                Err(err)
            }
        }
    }

    /// Attaches `created` and waits until it is visible; `attached` is the attachment once EC2 has
    /// answered the attach (for the cleanup, should a later step fail).
    async fn attach_and_settle(
        &self,
        created: &Eni,
        device_index: u32,
        attached: &mut Option<EniAttachment>,
    ) -> CloudResult<Eni> {
        // The ENI exists and holds its IPs: while EC2 is only throttling (retries ran out), keep
        // trying rather than delete it and start over, which would cost more calls in the storm.
        let mut rounds = 1;
        let attach = loop {
            match self
                .cloud
                .attach_eni(&created.id, &self.node.instance_id, device_index)
                .await
            {
                Err(CloudError::RetriesExhausted {
                    throttled: true, ..
                }) if rounds < ATTACH_ROUNDS => {
                    tracing::warn!(eni = %created.id, rounds, "attach still throttled; keeping the ENI and trying again");
                    rounds += 1;
                }
                other => break other,
            }
        };
        let (attachment_id, device_index) = match attach {
            Ok(id) => (id, device_index),
            // Something this pool does not know sits at that index (an attachment whose outcome
            // was lost, another agent's ENI): ask EC2 which indexes are free and use the lowest.
            Err(e) if device_index_taken(&e) => {
                let instance = self.cloud.describe_instance(&self.node.instance_id).await?;
                let used: BTreeSet<u32> = instance
                    .enis
                    .iter()
                    .filter_map(|e| e.attachment.as_ref().map(|a| a.device_index))
                    .chain(std::iter::once(device_index))
                    .collect();
                let free = (1..=MAX_DEVICE_INDEX)
                    .find(|i| !used.contains(i))
                    .ok_or(e)?;
                tracing::warn!(
                    eni = %created.id,
                    taken = device_index,
                    using = free,
                    "device index already taken on the instance; attaching at the next free one"
                );
                let id = self
                    .cloud
                    .attach_eni(&created.id, &self.node.instance_id, free)
                    .await?;
                (id, free)
            }
            Err(e) => return Err(e),
        };
        // The ENI is attached and holds its IPs: a failure to set DeleteOnTermination (a throttling
        // storm outlasting the retries) is not worth tearing it down for, which would cost more
        // calls and leave the pods waiting. Left unset, the ENI outlives a terminated instance as
        // `available`, tagged ours, where the leaked-ENI collector deletes it. The call goes while
        // IMDS catches up with the attach, not before: the pods' wait is the longer of the two,
        // not their sum.
        let delete_on_termination = async {
            match self
                .cloud
                .set_delete_on_termination(&created.id, &attachment_id)
                .await
            {
                Ok(()) => true,
                // Denied, it is denied for every ENI of every node: a terminated node's ENIs then
                // hold their addresses until another node's collector runs, or for good once the
                // group scales to zero. An operator has to see it.
                Err(CloudError::Unauthorized {
                    permission,
                    message,
                    ..
                }) => {
                    tracing::error!(
                        eni = %created.id,
                        instance = %self.node.instance_id,
                        %permission,
                        %message,
                        "DeleteOnTermination denied: the IAM role needs {permission} on the ENI, \
                         the instance (tagged kubernetes.io/cluster/<cluster>=owned) and the subnet \
                         (eniipamctl iam-policy); a terminated node will leave this ENI behind"
                    );
                    false
                }
                Err(e) => {
                    tracing::warn!(
                        eni = %created.id,
                        error = %e,
                        "could not set DeleteOnTermination; keeping the attached ENI"
                    );
                    false
                }
            }
        };
        let mut eni = created.clone();
        eni.status = EniStatus::InUse;
        eni.attachment = Some(EniAttachment {
            attachment_id: attachment_id.clone(),
            instance_id: self.node.instance_id.clone(),
            device_index,
            status: AttachmentStatus::Attached,
            delete_on_termination: false,
        });
        attached.clone_from(&eni.attachment);
        let (delete_on_termination, visible) =
            tokio::join!(delete_on_termination, self.wait_visible(eni));
        let mut eni = visible?;
        if let Some(a) = eni.attachment.as_mut() {
            a.delete_on_termination = delete_on_termination;
        }
        Ok(eni)
    }

    /// Wait until IMDS lists the ENI with every IP EC2 gave it; after the bound, confirm with EC2.
    async fn wait_visible(&self, eni: Eni) -> CloudResult<Eni> {
        let want: BTreeSet<Ipv4Addr> = std::iter::once(eni.primary_ip)
            .chain(eni.secondary_ips.iter().copied())
            .collect();
        let mut backoff = self.config.imds_wait.start();
        let mut last_seen = None;
        loop {
            match self.metadata.interface(&eni.mac).await {
                Ok(Some(md)) if md.eni_id == eni.id => {
                    let seen: BTreeSet<Ipv4Addr> = md.ips.iter().copied().collect();
                    if want.is_subset(&seen) {
                        tracing::debug!(eni = %eni.id, waited_ms = backoff.elapsed().as_millis() as u64, "ENI visible in IMDS");
                        return Ok(eni);
                    }
                    last_seen = Some(seen.len());
                }
                Ok(_) => {}
                // IMDS hiccups are ridden out like lag; EC2 is asked after the bound either way.
                Err(e) => {
                    tracing::debug!(eni = %eni.id, error = %e, "IMDS read failed while waiting for ENI")
                }
            }
            if !backoff.wait().await {
                break;
            }
        }
        tracing::warn!(
            eni = %eni.id,
            waited_ms = backoff.elapsed().as_millis() as u64,
            ips_seen = ?last_seen,
            ips_wanted = want.len(),
            "IMDS still does not show the ENI; confirming with EC2"
        );
        self.confirm_with_ec2(eni).await
    }

    /// EC2 is the authority: the ENI must be attached to this instance; its IPs are EC2's.
    async fn confirm_with_ec2(&self, eni: Eni) -> CloudResult<Eni> {
        let described = self
            .describe_one(&eni.id)
            .await?
            .ok_or_else(|| CloudError::NotFound {
                api: "DescribeNetworkInterfaces".into(),
                code: "InvalidNetworkInterfaceID.NotFound".into(),
                message: format!("{} vanished after attach", eni.id),
            })?;
        match &described.attachment {
            Some(a)
                if a.instance_id == self.node.instance_id
                    && matches!(
                        a.status,
                        AttachmentStatus::Attached | AttachmentStatus::Attaching
                    ) =>
            {
                Ok(described)
            }
            other => Err(CloudError::Rejected {
                api: "DescribeNetworkInterfaces".into(),
                code: "NotAttached".into(),
                message: format!(
                    "{} is not attached to {} after attach (attachment: {:?})",
                    eni.id, self.node.instance_id, other
                ),
            }),
        }
    }

    async fn describe_one(&self, id: &EniId) -> CloudResult<Option<Eni>> {
        let filter = EniFilter {
            ids: vec![id.clone()],
            ..Default::default()
        };
        match self.cloud.describe_enis(&filter).await {
            Ok(enis) => Ok(enis.into_iter().find(|e| &e.id == id)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Undo a failed create: detach if EC2 says it is attached (an ambiguous attach may have
    /// succeeded) or answered our attach (`attached`: EC2's describes may not show an attachment
    /// made moments ago), then delete.
    async fn cleanup(&self, id: &EniId, attached: Option<EniAttachment>) -> CloudResult<()> {
        let Some(mut eni) = self.describe_one(id).await? else {
            return Ok(());
        };
        if eni.attachment.is_none() {
            eni.attachment = attached;
        }
        self.detach_and_delete_unchecked(&eni).await
    }

    /// Detach (if attached), wait until `available`, delete. Refuses with
    /// [`CloudError::NotOurs`] unless the ENI carries our owner tag and no opt-out tag (checked on
    /// the given ENI and again on EC2's current view of it). A not-found at any step means the ENI
    /// is already gone: done.
    pub async fn detach_and_delete(&self, eni: &Eni) -> CloudResult<()> {
        check_ours(eni)?;
        let current = match self.describe_one(&eni.id).await? {
            Some(current) => current,
            None => {
                tracing::info!(eni = %eni.id, "ENI already gone");
                return Ok(());
            }
        };
        check_ours(&current)?;
        self.detach_and_delete_unchecked(&current).await
    }

    async fn detach_and_delete_unchecked(&self, eni: &Eni) -> CloudResult<()> {
        if let Some(att) = &eni.attachment
            && !matches!(att.status, AttachmentStatus::Detached)
        {
            match self.cloud.detach_eni(&att.attachment_id, false).await {
                Ok(()) => {
                    tracing::info!(eni = %eni.id, attachment = %att.attachment_id, "detaching ENI")
                }
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e),
            }
            if !self.wait_available(&eni.id).await? {
                return Ok(());
            }
        }
        self.delete_with_backoff(&eni.id).await
    }

    /// Poll until EC2 reports the ENI `available`. `Ok(false)` when it no longer exists.
    async fn wait_available(&self, id: &EniId) -> CloudResult<bool> {
        let mut backoff = self.config.detach_wait.start();
        loop {
            let status = match self.describe_one(id).await? {
                None => return Ok(false),
                Some(e) => e.status,
            };
            if status == EniStatus::Available {
                return Ok(true);
            }
            if !backoff.wait().await {
                return Err(CloudError::Transient {
                    api: "DetachNetworkInterface".into(),
                    message: format!("{id} still {status:?} after {:?}", backoff.elapsed()),
                });
            }
        }
    }

    /// DeleteNetworkInterface, retried while EC2 still considers the ENI in use.
    async fn delete_with_backoff(&self, id: &EniId) -> CloudResult<()> {
        let mut backoff = self.config.delete_wait.start();
        loop {
            match self.cloud.delete_eni(id).await {
                Ok(()) => {
                    tracing::info!(eni = %id, "deleted ENI");
                    return Ok(());
                }
                Err(e) if e.is_not_found() => return Ok(()),
                // `InvalidNetworkInterface.InUse` right after a detach, or exhausted retries of a
                // throttling storm: try again within the bound.
                Err(e @ (CloudError::Rejected { .. } | CloudError::RetriesExhausted { .. })) => {
                    let started = Instant::now();
                    if !backoff.wait().await {
                        return Err(e);
                    }
                    tracing::debug!(eni = %id, error = %e, slept_ms = started.elapsed().as_millis() as u64, "delete retry");
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// `NotOurs` unless eniipam created the ENI and it carries no opt-out tag.
fn check_ours(eni: &Eni) -> CloudResult<()> {
    if eni.is_managed_by_us() {
        return Ok(());
    }
    let reason = if eni.tags.get(tags::NO_MANAGE).map(String::as_str) == Some("true") {
        format!("it carries {}=true", tags::NO_MANAGE)
    } else {
        format!("it lacks {}={}", tags::OWNER, tags::OWNER_VALUE)
    };
    Err(CloudError::NotOurs {
        eni: eni.id.to_string(),
        reason,
    })
}

/// Rounds of the limiter's retry budget an attach gets while EC2 keeps throttling it.
const ATTACH_ROUNDS: u32 = 5;

/// Highest device index tried when the planned one is taken (EC2's largest instances have 15 network
/// cards' worth of indexes well below this).
const MAX_DEVICE_INDEX: u32 = 31;

/// Whether `e` is EC2 refusing an attach because the instance already has an ENI at that index.
fn device_index_taken(e: &CloudError) -> bool {
    matches!(e, CloudError::Rejected { code, message, .. }
        if code == "InvalidParameterValue" && message.contains("already has an interface attached at device index"))
}

#[cfg(test)]
mod tests;
