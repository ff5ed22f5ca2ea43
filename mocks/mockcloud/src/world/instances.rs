//! Instances: launch (with the primary ENI on card 0, device 0), terminate, DescribeInstances,
//! DescribeInstanceTypes over the catalog, and time passing (`settle`: attachments progress, IMDS
//! ghosts expire).

use std::collections::BTreeMap;

use tokio::time::Instant;

use super::views::InstanceView;
use super::{
    AttState, Attachment, CreateEniArgs, Ec2Error, Ec2Result, Filter, Instance, InstanceState,
    World, bad_filter, malformed, not_found, well_formed,
};
use crate::catalog::{self, InstanceType};

/// What RunInstances (or a launch template's first network interface) asks eth0 to carry beyond
/// its primary IP: `SecondaryPrivateIpAddressCount` or `Ipv4PrefixCount`. EC2 refuses both at once,
/// prefixes on a Xen type, and more than the instance type's addresses per interface.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LaunchAddresses {
    pub secondary_count: u32,
    pub prefix_count: u32,
}

impl World {
    /// Launches a running instance with its primary ENI (device 0 on card 0) in `subnet_id`.
    pub fn launch_instance(
        &mut self,
        instance_type: &str,
        subnet_id: &str,
        security_groups: &[String],
        now: Instant,
    ) -> Ec2Result<String> {
        self.launch_instance_carrying(
            instance_type,
            subnet_id,
            security_groups,
            LaunchAddresses::default(),
            now,
        )
    }

    /// [`World::launch_instance`] with eth0 carrying `addresses` from the launch, as RunInstances'
    /// `NetworkInterface.N` would: checked as EC2 checks them, before anything is created.
    pub fn launch_instance_carrying(
        &mut self,
        instance_type: &str,
        subnet_id: &str,
        security_groups: &[String],
        addresses: LaunchAddresses,
        now: Instant,
    ) -> Ec2Result<String> {
        let itype = catalog::lookup(instance_type).ok_or_else(|| {
            Ec2Error::client(
                "InvalidInstanceType",
                format!("The instance type '{instance_type}' is not supported."),
            )
        })?;
        if addresses.prefix_count > 0 && !itype.is_nitro() {
            return Err(super::enis::prefixes_unsupported(&itype));
        }
        let slots = 1 + addresses.secondary_count + addresses.prefix_count;
        if slots > itype.ipv4_per_eni {
            return Err(super::limit_exceeded(
                slots,
                itype.ipv4_per_eni,
                &format!(" (the primary network interface of a {instance_type})"),
            ));
        }
        let subnet = self
            .subnets
            .get(subnet_id)
            .ok_or_else(|| not_found("InvalidSubnetID.NotFound", "subnet", subnet_id))?;
        let (vpc_id, az) = (subnet.vpc_id.clone(), subnet.az.clone());
        let sgs = if security_groups.is_empty() {
            vec![self.default_group(&vpc_id).unwrap_or_default()]
        } else {
            security_groups.to_vec()
        };
        let id = self.new_id("i");
        let eni = self.create_eni_inner(
            &CreateEniArgs {
                subnet_id: subnet_id.to_owned(),
                security_groups: sgs.clone(),
                description: "Primary network interface".to_owned(),
                secondary_count: addresses.secondary_count,
                prefix_count: addresses.prefix_count,
                ..Default::default()
            },
            now,
        )?;
        let attachment_id = self.new_id("eni-attach");
        let e = self.enis.get_mut(&eni).expect("just created");
        e.attachment = Some(Attachment {
            id: attachment_id,
            instance_id: id.clone(),
            device_index: 0,
            network_card: 0,
            delete_on_termination: true,
            state: AttState::Attached { since: now },
            attached_by_call: None,
        });
        let (mac, ip) = (e.mac.clone(), e.primary_ip);
        self.instances.insert(
            id.clone(),
            Instance {
                instance_type: itype,
                subnet_id: subnet_id.to_owned(),
                vpc_id,
                az,
                security_groups: sgs,
                state: InstanceState::Running,
                primary_mac: mac,
                primary_ip: ip,
                tags: self.node_tags.clone(),
                gone: Vec::new(),
            },
        );
        Ok(id)
    }

    /// Tags every instance, running or launched later, with `tags` (added to its own), as a node
    /// group's launch template or Karpenter tags its nodes (`kubernetes.io/cluster/<name>=owned`).
    pub fn tag_nodes(&mut self, tags: &BTreeMap<String, String>) {
        self.node_tags.extend(tags.clone());
        for i in self.instances.values_mut() {
            i.tags.extend(tags.clone());
        }
    }

    /// Terminates an instance: ENIs with DeleteOnTermination are deleted, the others detached.
    pub fn terminate_instance(&mut self, instance_id: &str, now: Instant) -> Ec2Result<()> {
        self.settle(now);
        let inst = self
            .instances
            .get_mut(instance_id)
            .ok_or_else(|| not_found("InvalidInstanceID.NotFound", "instance", instance_id))?;
        inst.state = InstanceState::Terminated;
        let attached: Vec<(String, bool)> = self
            .enis
            .iter()
            .filter_map(|(id, e)| {
                e.attachment
                    .as_ref()
                    .filter(|a| a.instance_id == instance_id)
                    .map(|a| (id.clone(), a.delete_on_termination))
            })
            .collect();
        for (eni, delete) in attached {
            self.enis.get_mut(&eni).expect("listed").attachment = None;
            if delete {
                self.remove_eni(&eni);
            }
        }
        Ok(())
    }

    /// Moves attachments along (attaching → attached, detaching → gone) and forgets IMDS ghosts.
    pub fn settle(&mut self, now: Instant) {
        let lag = self.timing.imds_lag;
        let linger = self.timing.linger();
        let mut gone = Vec::new();
        for (id, eni) in &mut self.enis {
            if let Some(att) = &mut eni.attachment {
                match att.state {
                    AttState::Attaching { until } if now >= until => {
                        att.state = AttState::Attached { since: until };
                    }
                    AttState::Detaching { until, .. } if now >= until => {
                        gone.push((id.clone(), att.instance_id.clone(), until));
                    }
                    _ => {}
                }
            }
            eni.removed.retain(|(_, at)| *at + linger > now);
            eni.removed_prefixes.retain(|(_, at)| *at + linger > now);
            eni.ipv6.removed.retain(|(_, at)| *at + linger > now);
            eni.ipv6
                .removed_prefixes
                .retain(|(_, at)| *at + linger > now);
        }
        for (eni_id, instance_id, at) in gone {
            let view = self.imds_eni(&eni_id, true, now);
            self.enis.get_mut(&eni_id).expect("listed").attachment = None;
            if let (Some(inst), Some(view)) = (self.instances.get_mut(&instance_id), view) {
                inst.gone.push((view, at));
            }
        }
        for inst in self.instances.values_mut() {
            inst.gone.retain(|(_, at)| *at + lag > now);
        }
    }

    /// Ids of every instance (running or not).
    pub fn instance_ids(&self) -> Vec<String> {
        self.instances.keys().cloned().collect()
    }

    /// One instance's view (control API and tests).
    pub fn instance(&mut self, id: &str, now: Instant) -> Option<InstanceView> {
        self.settle(now);
        self.instances
            .contains_key(id)
            .then(|| self.instance_view(id))
    }

    pub fn describe_instances(
        &mut self,
        ids: &[String],
        filters: &[Filter],
        now: Instant,
    ) -> Ec2Result<Vec<InstanceView>> {
        self.settle(now);
        for id in ids {
            if !well_formed(id, "i") {
                return Err(malformed("InvalidInstanceID.Malformed", "i", id));
            }
            if !self.instances.contains_key(id) {
                return Err(not_found("InvalidInstanceID.NotFound", "instance", id));
            }
        }
        for f in filters {
            if ![
                "instance-id",
                "instance-type",
                "vpc-id",
                "subnet-id",
                "instance-state-name",
            ]
            .contains(&f.name.as_str())
            {
                return Err(bad_filter(&f.name));
            }
        }
        let views = self
            .instances
            .keys()
            .filter(|id| ids.is_empty() || ids.contains(id))
            .map(|id| self.instance_described(id, now))
            .filter(|v| {
                filters.iter().all(|f| {
                    let field = match f.name.as_str() {
                        "instance-id" => &v.id,
                        "instance-type" => &v.instance_type,
                        "vpc-id" => &v.vpc_id,
                        "subnet-id" => &v.subnet_id,
                        _ => v.state,
                    };
                    f.values.iter().any(|x| x == field)
                })
            })
            .collect();
        Ok(views)
    }

    /// `DescribeInstanceTypes`: the whole catalog, or the named types.
    pub fn describe_instance_types(&self, names: &[String]) -> Ec2Result<Vec<InstanceType>> {
        if names.is_empty() {
            return Ok(catalog::CATALOG.to_vec());
        }
        names
            .iter()
            .map(|n| {
                catalog::lookup(n).ok_or_else(|| {
                    Ec2Error::client(
                        "InvalidInstanceType",
                        format!("The following supplied instance types do not exist: [{n}]"),
                    )
                })
            })
            .collect()
    }
}
