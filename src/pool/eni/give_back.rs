//! The ENI actor's give-back: `UnassignPrivateIpAddresses` for the single addresses, then for the
//! `/28` prefixes, each settled on its own.
//!
//! EC2 refuses a whole unassign when one address or prefix it names is no longer on the ENI ("not
//! assigned to interface"; taken out of band, not yet found by the running reconcile), and changes
//! nothing. Taken as a plain failure, every address of the call stayed idle in the pool while the
//! journal still said "going back" (written before the call), so a restart within the minute read
//! the ones EC2 kept as given back: a pod handed one of them meanwhile lost it (the profiles soak,
//! seed 27). So after such a refusal each address goes back in a call of its own: EC2 takes back
//! what it holds and refuses what is gone, and both leave the pool; only what a call failed for
//! another reason stays idle, journalled as EC2's again.

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use tokio::time::Instant;
use tracing::Instrument;

use super::EniActor;
use crate::cloud::CloudError;
use crate::pool::slots::{prefix_addresses, singles};
use crate::pool::types::{DoneReply, GiveBackOutcome};

/// What one kind's give-back came to: what EC2 no longer holds (given back, or gone), what it kept,
/// and why it kept it.
struct Settled<T> {
    back: Vec<T>,
    kept: Vec<T>,
    error: Option<CloudError>,
}

impl<T: Clone> Settled<T> {
    fn all_back(items: &[T]) -> Self {
        Self {
            back: items.to_vec(),
            kept: Vec::new(),
            error: None,
        }
    }

    fn all_kept(items: &[T], error: Option<CloudError>) -> Self {
        Self {
            back: Vec::new(),
            kept: items.to_vec(),
            error,
        }
    }
}

impl EniActor {
    pub(super) async fn unassign(
        &self,
        ips: Vec<Ipv4Addr>,
        prefixes: Vec<Ipv4Net>,
        replies: Vec<DoneReply>,
    ) {
        let span = tracing::info_span!("unassign_batch", eni = %self.eni, count = ips.len(), prefixes = prefixes.len());
        let singles = singles(&ips, &prefixes);
        let journal = self.shared.journal();
        let journalled = match &journal {
            Some(j) => j.unassigning(&self.eni, &singles, &prefixes).await,
            None => true,
        };
        let (singles, prefixes) = if journalled {
            // EC2 refuses a call naming nothing: each kind goes only when there is some; the
            // prefixes only once the singles went.
            let singles = self.give_back(&singles).instrument(span.clone()).await;
            let prefixes = if singles.kept.is_empty() {
                self.give_back(&prefixes).instrument(span.clone()).await
            } else {
                Settled::all_kept(&prefixes, None)
            };
            if let (Some(j), false) = (
                &journal,
                singles.kept.is_empty() && prefixes.kept.is_empty(),
            ) {
                j.assigned(&self.eni, &singles.kept, &prefixes.kept).await;
            }
            (singles, prefixes)
        } else {
            // Not sent: given back unjournalled, a restart within EC2's describe lag would take
            // them as still the node's and hand them out (the profiles soak, seed 27, a full disk).
            let error = CloudError::Transient {
                api: "UnassignPrivateIpAddresses".into(),
                message: "the state file could not journal the give-back (full disk?): not sent"
                    .into(),
            };
            (
                Settled {
                    back: Vec::new(),
                    kept: singles,
                    error: Some(error),
                },
                Settled::all_kept(&prefixes, None),
            )
        };
        let back: Vec<Ipv4Addr> = singles
            .back
            .iter()
            .copied()
            .chain(prefixes.back.iter().flat_map(|p| prefix_addresses(*p)))
            .collect();
        let kept: Vec<Ipv4Addr> = ips
            .iter()
            .copied()
            .filter(|ip| !back.contains(ip))
            .collect();
        let error = singles.error.or(prefixes.error);
        let mut outcome = Ok(());
        {
            let mut st = self.shared.lock();
            if !back.is_empty() || kept.is_empty() {
                span.in_scope(|| tracing::info!(addresses = back.len(), "gave IPs back to EC2"));
                outcome = st.settle_give_back(
                    &self.eni,
                    &back,
                    &prefixes.back,
                    GiveBackOutcome::Done,
                    Instant::now(),
                );
            }
            if let Some(error) = error.filter(|_| !kept.is_empty()) {
                span.in_scope(|| tracing::warn!(error = %error, kept = kept.len(), "unassign failed; what EC2 kept stays idle"));
                let failed = GiveBackOutcome::Failed {
                    error,
                    // Only prefixes are kept when the singles all went.
                    singles_gone: singles.kept.is_empty(),
                };
                outcome =
                    st.settle_give_back(&self.eni, &kept, &prefixes.kept, failed, Instant::now());
            }
        }
        self.shared.wake.notify_one();
        for r in replies {
            let _ = r.send(outcome.clone());
        }
    }

    /// One kind's give-back (single addresses or prefixes): one call; after a "not assigned"
    /// refusal, one call per item.
    async fn give_back<T: GiveBack>(&self, items: &[T]) -> Settled<T> {
        if items.is_empty() {
            return Settled::all_back(items);
        }
        match T::unassign(self, items).await {
            Ok(()) => Settled::all_back(items),
            Err(e) if e.is_not_assigned() && items.len() > 1 => {
                tracing::warn!(error = %e, items = items.len(),
                    "EC2 refused the give-back: some of it is no longer on the ENI (taken out of band); one call each");
                let mut settled = Settled::all_back(&[]);
                for (n, item) in items.iter().enumerate() {
                    match T::unassign(self, std::slice::from_ref(item)).await {
                        Ok(()) => settled.back.push(item.clone()),
                        // Gone: EC2 does not hold it either.
                        Err(e) if e.is_not_assigned() => settled.back.push(item.clone()),
                        Err(e) => {
                            settled.kept.extend(items[n..].iter().cloned());
                            settled.error = Some(e);
                            break;
                        }
                    }
                }
                settled
            }
            // A lone item EC2 says is not on the ENI is gone: nothing to keep.
            Err(e) if e.is_not_assigned() => Settled::all_back(items),
            Err(e) => Settled::all_kept(items, Some(e)),
        }
    }
}

/// What a give-back names: single addresses or `/28` prefixes, each with its call.
trait GiveBack: Clone + Send + Sync {
    async fn unassign(actor: &EniActor, items: &[Self]) -> Result<(), CloudError>;
}

impl GiveBack for Ipv4Addr {
    async fn unassign(actor: &EniActor, items: &[Self]) -> Result<(), CloudError> {
        actor.shared.cloud.unassign_ips(&actor.eni, items).await
    }
}

impl GiveBack for Ipv4Net {
    async fn unassign(actor: &EniActor, items: &[Self]) -> Result<(), CloudError> {
        actor
            .shared
            .cloud
            .unassign_prefixes(&actor.eni, items)
            .await
    }
}
