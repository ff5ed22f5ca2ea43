//! CreateSubnetCidrReservation of type `prefix` ([`crate::reservation`]), on its own bucket.
//!
//! EC2 takes no ClientToken for it; a repeat of a lost attempt that had landed is refused as an
//! overlap with itself. So after an ambiguous failure (timeout, 5xx) the subnet's `prefix`
//! reservations are read after each failure: the block there is the answer. It runs the limiter's
//! attempts and retries as every mutating call, but not the ENI holdings' change guard of `mutate`:
//! it changes no ENI, and the describes around it may teach the holdings as usual.

use aws_sdk_ec2::types::{ResourceType, SubnetCidrReservationType, TagSpecification};

use super::Ec2Cloud;
use super::classify::{classify, is_ambiguous};
use super::convert::{parse_prefix, sdk_tags};
use crate::limiter::CallClass;
use crate::{CloudError, PrefixReservation, ReserveError, ReserveResult};

impl Ec2Cloud {
    pub(super) async fn create_prefix_reservation(&self, req: &PrefixReservation) -> ReserveResult {
        const API: &str = "CreateSubnetCidrReservation";
        // EC2 refuses a tag specification without tags: none then.
        let tags = (!req.tags.is_empty()).then(|| {
            vec![
                TagSpecification::builder()
                    .resource_type(ResourceType::SubnetCidrReservation)
                    .set_tags(Some(sdk_tags(&req.tags)))
                    .build(),
            ]
        });
        let send = || async {
            let out = self
                .client
                .create_subnet_cidr_reservation()
                .subnet_id(&req.subnet_id)
                .cidr(req.cidr.to_string())
                .reservation_type(SubnetCidrReservationType::Prefix)
                .description(&req.description)
                .set_tag_specifications(tags.clone())
                .send()
                .await
                .map_err(|e| classify(API, e))?;
            match out.subnet_cidr_reservation().and_then(|r| r.cidr()) {
                Some(c) => parse_prefix(API, c),
                // An older reply shape: the block asked for is the one made.
                None => Ok(req.cidr),
            }
        };
        let mut retry = self.limiter.retry(API);
        let mut ambiguous = false;
        loop {
            let e: CloudError = match self.limiter.attempt(API, CallClass::Mutating, send()).await {
                Ok(cidr) => return Ok(cidr),
                Err(e) => e,
            };
            ambiguous |= is_ambiguous(&e);
            let final_err = retry.after_failure(e).await.err();
            if ambiguous
                && self
                    .prefix_reservations(&req.subnet_id)
                    .await?
                    .contains(&req.cidr)
            {
                tracing::info!(subnet = %req.subnet_id, cidr = %req.cidr, "the reservation had been made despite the error");
                return Ok(req.cidr);
            }
            if let Some(e) = final_err {
                return Err(ReserveError::of(req.cidr, e));
            }
        }
    }
}
