//! The startup rebuild's describe of the node's ENIs, asked again while EC2 does not show yet an ENI
//! the pool created moments before the restart (issue 44: EC2's eventual consistency about a new ENI).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tokio::time::Instant;

use crate::clock::unix_ms_now;
use crate::cloud::backoff::RetryPause;
use crate::cloud::{Cloud, CloudError, DESCRIBE_SETTLES, Eni, Instance, MetadataEni};
use crate::model::EniId;
use crate::store::{Ec2Change, StoredEc2Change, StoredState};

/// How long after the pool gave an ENI its first addresses of the minute (a new ENI's: the create's
/// answer) EC2's describes may still not show it attached here: they lag a create and an attach by
/// seconds (mockcloud's `realistic` profile: 2 s; EC2 publishes no figure). Past it, an ENI the
/// describe does not show was detached or deleted, and the start goes on without it.
const NEW_ENI_SETTLES: Duration = Duration::from_secs(10);

/// The ENIs EC2 shows attached to `instance_id`, once it shows every ENI that pods hold addresses on
/// (per the file) and that the journal saw EC2 give addresses to moments ago, or once
/// [`NEW_ENI_SETTLES`] has passed since.
///
/// EC2's describes lag a new ENI and a new attachment (AWS, *Eventual consistency in the Amazon EC2
/// API*). A restart seconds after the pool created an ENI and handed out its addresses would read
/// the ENI as gone and drop the records of the pods on it (their IPs "on no ENI any more"); the
/// running reconcile would then adopt the ENI once the describe shows it, with those pods' IPs idle
/// and soon handed out a second time. The journal knows the ENI is recent: the create's answer
/// wrote its addresses. So the describe is asked again, with back-off, until it shows the ENI. An
/// ENI that really went (detached or deleted out of band, its pods still recorded) costs the start
/// [`NEW_ENI_SETTLES`] at most (a minute cost the soak's daemon its readiness deadline); an ENI
/// the pool deleted holds no pod and is not waited for.
pub(super) async fn describe(
    cloud: &dyn Cloud,
    instance_id: &str,
    imds: &[MetadataEni],
    (stored, changes): (&StoredState, &[StoredEc2Change]),
    mut described: Option<Instance>,
) -> Result<Vec<Eni>, CloudError> {
    // Every id the node knows of its ENIs: IMDS's, and the file's (its ENIs, and those pods hold
    // addresses on, the journal's new ENIs among them).
    let known: BTreeSet<EniId> = imds
        .iter()
        .map(|m| m.eni_id.clone())
        .chain(stored.enis.iter().filter_map(|e| e.eni_id.parse().ok()))
        .chain(
            stored
                .assignments
                .iter()
                .filter_map(|a| a.eni_id.parse().ok()),
        )
        .collect();
    let vpc_id = imds.first().map(|m| m.vpc_id.as_str()).unwrap_or_default();
    let settles_ms = DESCRIBE_SETTLES.as_millis() as u64;
    let started = Instant::now();
    let now_ms = unix_ms_now();
    let held: BTreeSet<&str> = stored
        .assignments
        .iter()
        .map(|a| a.eni_id.as_str())
        .collect();
    // Each such ENI, and until when EC2 may not show it yet: its first journalled assign of the
    // minute (the create's answer, for a new ENI) + NEW_ENI_SETTLES, in tokio time (for
    // paused-clock tests).
    let mut due: BTreeMap<&str, Instant> = BTreeMap::new();
    for c in changes.iter().filter(|c| {
        c.change == Ec2Change::Assigned
            && c.at_ms + settles_ms > now_ms
            && held.contains(c.eni_id.as_str())
    }) {
        let by = started
            + Duration::from_millis(
                (c.at_ms + NEW_ENI_SETTLES.as_millis() as u64).saturating_sub(now_ms),
            );
        let e = due.entry(c.eni_id.as_str()).or_insert(by);
        *e = (*e).min(by);
    }
    let mut retry = RetryPause::new(Duration::from_millis(250), Duration::from_secs(4));
    let mut asked = 0u32;
    loop {
        let ec2 = attached(cloud, (instance_id, described.take()), vpc_id, &known).await?;
        asked += 1;
        let shown = |id: &str| {
            ec2.iter().any(|e| {
                e.id.as_str() == id
                    && e.attachment
                        .as_ref()
                        .is_some_and(|a| a.instance_id == instance_id)
            })
        };
        let now = Instant::now();
        due.retain(|id, by| *by > now && !shown(id));
        if due.is_empty() {
            if asked > 1 {
                tracing::info!(
                    asked,
                    waited_ms = started.elapsed().as_millis() as u64,
                    "EC2's describe shows the ENIs it lagged (or they are gone): rebuilding"
                );
            }
            return Ok(ec2);
        }
        let ids: Vec<&str> = due.keys().copied().collect();
        tracing::info!(enis = ?ids, retry_ms = retry.pause().as_millis() as u64,
            "pods hold addresses EC2 gave these ENIs moments ago, but its describe does not show them \
             attached: EC2's describes lag a new ENI, asking again");
        let until = due.values().max().copied().unwrap_or(now);
        tokio::time::sleep(retry.failed().min(until - now)).await;
    }
}

/// The ENIs EC2 shows attached to the instance, in a few calls however many ENIs the region holds:
/// DescribeInstances lists the instance's interfaces (EC2's own view, so an ENI attached just before
/// a crash, in neither IMDS, which lags, nor the file, is found), described by their ids; an id the
/// node knows (`known`) that DescribeInstances did not list is asked for by id too (a third call,
/// only then). A describe filtered by the instance alone would walk every ENI of the region, a call
/// per 1,000.
async fn attached(
    cloud: &dyn Cloud,
    (instance_id, described): (&str, Option<Instance>),
    vpc_id: &str,
    known: &BTreeSet<EniId>,
) -> Result<Vec<Eni>, CloudError> {
    let instance = match described {
        Some(i) => i,
        None => cloud.describe_instance(instance_id).await?,
    };
    let mut enis = instance.enis;
    let extra: Vec<EniId> = known
        .iter()
        .filter(|id| !enis.iter().any(|e| &e.id == *id))
        .cloned()
        .collect();
    if !extra.is_empty() {
        let vpc_id = if instance.vpc_id.is_empty() {
            vpc_id
        } else {
            instance.vpc_id.as_str()
        };
        for e in cloud.describe_attached(instance_id, vpc_id, &extra).await? {
            if !enis.iter().any(|x| x.id == e.id) {
                enis.push(e);
            }
        }
    }
    Ok(enis)
}
