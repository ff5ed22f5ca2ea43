//! The startup rebuild's describe of the node's ENIs, asked again while EC2 does not show yet an ENI
//! the pool created moments before the restart (issue 44: EC2's eventual consistency about a new ENI).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tokio::time::Instant;

use crate::clock::unix_ms_now;
use crate::cloud::{Cloud, CloudError, DESCRIBE_SETTLES, Eni, EniFilter, MetadataEni};
use crate::model::EniId;
use crate::store::{Ec2Change, StoredEc2Change, StoredState};

/// How long after the pool gave a new ENI its first addresses EC2's describes may still list the
/// ENI without its attachment (they lag an attach as they lag a create: mockcloud's `realistic`
/// profile, 2 s). Past it, an ENI listed without this node's attachment was detached.
const ATTACH_SETTLES: Duration = Duration::from_secs(10);

/// The ENIs EC2 shows attached to `instance_id`, once it shows every ENI that pods hold addresses on
/// (per the file) and that the journal shows EC2 gave addresses to less than [`DESCRIBE_SETTLES`]
/// ago, or once such an ENI is known gone.
///
/// EC2's describes lag a new ENI and a new attachment (AWS, *Eventual consistency in the Amazon EC2
/// API*). A restart seconds after the pool created an ENI and handed out its addresses would read
/// the ENI as gone and drop the records of the pods on it (their IPs "on no ENI any more"); the
/// running reconcile would then adopt the ENI once the describe shows it, with those pods' IPs idle
/// and soon handed out a second time. The journal knows the ENI is recent: the create's answer
/// wrote its addresses. So the describe is asked again, with back-off, until it shows the ENI, and
/// each missing ENI is asked for by id: while EC2 does not list it (a new ENI) the wait lasts up to
/// that minute; listed without this node's attachment, it was detached (out of band) unless the
/// pool gave it its first addresses less than [`ATTACH_SETTLES`] ago, and the start goes on. An ENI
/// the pool deleted holds no pod and is not waited for.
pub(super) async fn describe(
    cloud: &dyn Cloud,
    instance_id: &str,
    imds: &[MetadataEni],
    stored: &StoredState,
    changes: &[StoredEc2Change],
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
    // Each such ENI: until when EC2 may not list it (its latest journalled assign + a minute), and
    // until when it may list it without the attachment (its first + ATTACH_SETTLES), in tokio time
    // (for paused-clock tests).
    let mut due: BTreeMap<&str, (Instant, Instant)> = BTreeMap::new();
    for c in changes.iter().filter(|c| {
        c.change == Ec2Change::Assigned
            && c.at_ms + settles_ms > now_ms
            && held.contains(c.eni_id.as_str())
    }) {
        let at = |ms: u64| started + Duration::from_millis(ms.saturating_sub(now_ms));
        let listed = at(c.at_ms + settles_ms);
        let attached = at(c.at_ms + ATTACH_SETTLES.as_millis() as u64);
        let e = due.entry(c.eni_id.as_str()).or_insert((listed, attached));
        *e = (e.0.max(listed), e.1.min(attached));
    }
    let mut delay = Duration::from_millis(250);
    let mut asked = 0u32;
    loop {
        let ec2 = attached(cloud, instance_id, vpc_id, &known).await?;
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
        due.retain(|id, (listed, _)| *listed > now && !shown(id));
        // Asked by id: unlisted, the ENI may be new; listed without this attachment, it was
        // detached (out of band) unless it was attached moments ago.
        let mut gone = Vec::new();
        for (id, (_, attached)) in &due {
            let by_id = EniFilter {
                ids: vec![id.parse().map_err(|e| CloudError::Rejected {
                    api: "DescribeNetworkInterfaces".into(),
                    code: "InvalidNetworkInterfaceID.Malformed".into(),
                    message: format!("the journal names ENI {id:?}: {e}"),
                })?],
                ..EniFilter::default()
            };
            match cloud.describe_enis(&by_id).await {
                Err(e) if e.is_not_found() => {}
                Ok(found)
                    if found.iter().any(|e| {
                        e.attachment
                            .as_ref()
                            .is_some_and(|a| a.instance_id == instance_id)
                    }) => {}
                Ok(_) if *attached > now => {}
                Ok(_) => gone.push(*id),
                Err(e) => return Err(e),
            }
        }
        for id in &gone {
            tracing::info!(eni = %id, "EC2 lists this ENI without its attachment here, long enough after the pool \
                last gave it addresses: detached (out of band), not lagging");
            due.remove(id);
        }
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
        tracing::info!(enis = ?ids, retry_ms = delay.as_millis() as u64,
            "pods hold addresses EC2 gave these ENIs less than a minute ago, but its describe does not \
             show them attached: EC2's describes lag a new ENI, asking again");
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(4));
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
    instance_id: &str,
    vpc_id: &str,
    known: &BTreeSet<EniId>,
) -> Result<Vec<Eni>, CloudError> {
    let instance = cloud.describe_instance(instance_id).await?;
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
