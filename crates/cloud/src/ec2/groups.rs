//! DescribeSecurityGroups by id: what the daemon checks before it creates ENIs with an ENIConfig's
//! groups (each exists, in the node's VPC). Ids are not paginated by EC2 (MaxResults with
//! GroupId.N is its error), so one call answers; a group missing from the reply that EC2 did not
//! refuse is a malformed reply, named.

use super::Ec2Cloud;
use super::classify;
use super::convert::malformed;
use crate::limiter::CallClass;
use crate::{CloudResult, SecurityGroup};

impl Ec2Cloud {
    pub(super) async fn security_groups(&self, ids: &[String]) -> CloudResult<Vec<SecurityGroup>> {
        const API: &str = "DescribeSecurityGroups";
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let out = self
            .limiter
            .call(API, CallClass::Describe, || async {
                self.client
                    .describe_security_groups()
                    .set_group_ids(Some(ids.to_vec()))
                    .send()
                    .await
                    .map_err(|e| classify(API, e))
            })
            .await?;
        let mut groups = Vec::with_capacity(ids.len());
        for g in out.security_groups() {
            let field = |v: Option<&str>, what: &str| {
                v.map(str::to_owned)
                    .ok_or_else(|| malformed(API, format!("a security group without {what}")))
            };
            groups.push(SecurityGroup {
                id: field(g.group_id(), "GroupId")?,
                vpc_id: field(g.vpc_id(), "VpcId")?,
                name: field(g.group_name(), "GroupName")?,
            });
        }
        if let Some(missing) = ids.iter().find(|id| !groups.iter().any(|g| &g.id == *id)) {
            return Err(malformed(
                API,
                format!("{missing} asked for but not in the reply"),
            ));
        }
        Ok(groups)
    }
}
