//! The network-profiles mode's invariants, held against one observation (issue 27), besides every
//! invariant of [`super::checker`]:
//!
//! - `profile-groups`: an IP a pod holds (live, or held for it by the pool) is on an ENI that is not
//!   its network's: for a pod of a profile, the ENI must carry exactly the profile's security groups,
//!   be in its subnet and be tagged `eniipam.io/network=<profile>`; for a pod of the default network,
//!   the ENI must carry no such tag and be in the subnet of one of the ENIConfigs with exactly its
//!   groups (the node's ENIConfig changes during the run, and old ENIs keep serving).
//! - `eni-network-disagree`: the pool says an ENI serves one network (`EniInfo.network`, empty for
//!   the default network) and EC2's `eniipam.io/network` tag another (after settling).
//! - `eth0-serving`: custom networking is on, so eth0 (device 0) serves no pod: the pool shows no IP
//!   on it, and no IP a pod holds is on it in EC2.
//! - `profile-egress-via-eth0` (issue 44): a live pod of a profile in the `strict` egress mode
//!   (`db`) whose ADD was not answered "egress by its own ENI" (the plugin's result cache keeps the
//!   answer; in the main role it puts the host veth in the link group the egress mark and SNAT
//!   skip): its traffic to outside the VPC would leave by eth0, SNATed, past its profile's groups.
//!   And `egress-mode-wrong`: a pod of the default network or of a `standard` profile (`app`)
//!   answered so: its internet traffic would leave unSNATed by an ENI. Together with
//!   `profile-groups` (the pod's IP on its profile's ENI) this is what keeps a strict pod's packets
//!   off eth0 under every fault; the packets themselves are the fabric's test
//!   (`tests/datapath_profiles.rs`), as the soak wires no pod.
//!
//! Judged from EC2's word (mockcloud's ENIs): what the daemon says of an ENI is what is being
//! checked. The run-long ones (no IP of one network ever handed to a pod of another; refusals only
//! as CNI error 11 naming the profile) are the driver's, at each ADD ([`super::pods`]).

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::Duration;

use super::findings::Found;
use super::model::{Key, Model};
use super::profiles::ProfileWorld;
use super::witnesses::Observation;

/// Holds `obs` against the profiles' rules, pushing what is broken onto `found`.
pub fn evaluate(
    obs: &Observation,
    model: &Model,
    world: &ProfileWorld,
    oob_window: Duration,
    eni_of: &dyn Fn(Ipv4Addr) -> Option<String>,
    found: &mut Vec<Found>,
) {
    // What pods hold: the live attachments' IPs, and what the pool holds for known attachments.
    let mut held: BTreeMap<Key, Ipv4Addr> = BTreeMap::new();
    for a in model.live() {
        if let Some(ip) = a.ip
            && model.oob_since(a, oob_window, eni_of).is_none()
        {
            held.insert(a.key.clone(), ip);
        }
    }
    for (k, ip) in &obs.held {
        held.entry(k.clone()).or_insert(*ip);
    }
    for (k, ip) in &held {
        let Some(a) = model.atts.get(k) else { continue };
        // An IP EC2 no longer has is the out-of-band checks' business.
        let Some(eni) = obs.ec2.all_ip_eni.get(ip) else {
            continue;
        };
        let Some(meta) = obs.ec2.eni_meta.get(eni) else {
            continue;
        };
        let profile = model.profile_of(a);
        let allowed = world.allowed(profile);
        let fits = meta.network.as_deref() == profile
            && allowed
                .iter()
                .any(|s| s.subnet == meta.subnet && s.groups == meta.groups);
        if !fits {
            let want = match profile {
                Some(p) => format!(
                    "profile {p}'s ENIs (tag eniipam.io/network={p}, {}, groups {:?})",
                    allowed.first().map_or("?", |s| s.subnet.as_str()),
                    allowed.first().map(|s| &s.groups)
                ),
                None => format!(
                    "an untagged ENI of an ENIConfig ({})",
                    allowed
                        .iter()
                        .map(|s| format!("{} with {:?}", s.subnet, s.groups))
                        .collect::<Vec<_>>()
                        .join(" or ")
                ),
            };
            found.push(Found {
                kind: "profile-groups",
                subject: format!("{}/{}@{ip}", k.0, k.1),
                text: format!(
                    "{}/{} (pod of {}, ADD at step {}) holds {ip}, which EC2 has on {eni} (subnet {}, \
                     groups {:?}, network tag {:?}); it must be on {want}",
                    k.0,
                    k.1,
                    profile.unwrap_or("the default network"),
                    a.added_step,
                    meta.subnet,
                    meta.groups,
                    meta.network
                ),
                settle: false,
            });
        }
    }

    // Each live pod's egress as the daemon answered its ADD.
    for a in model.live() {
        let Some(cached) = obs.cache.get(&a.key) else {
            continue;
        };
        let profile = model.profile_of(a);
        let strict = profile.is_some_and(|p| world.strict_egress.contains(p));
        if cached.own_eni_egress == strict {
            continue;
        }
        let (kind, what) = if strict {
            (
                "profile-egress-via-eth0",
                "was not answered egress by its own ENI: its traffic to outside the VPC would leave \
                 by eth0, SNATed, past its profile's security groups",
            )
        } else {
            (
                "egress-mode-wrong",
                "was answered egress by its own ENI, though its network SNATs via eth0",
            )
        };
        found.push(Found {
            kind,
            subject: format!("{}/{}", a.key.0, a.key.1),
            text: format!(
                "{}/{} (pod of {}, ADD at step {}) {what}",
                a.key.0,
                a.key.1,
                profile.map_or("the default network".to_owned(), |p| format!("profile {p}")),
                a.added_step
            ),
            settle: false,
        });
    }

    // The pool's word on each ENI's network against EC2's tag.
    for e in obs.pool.enis.iter().filter(|e| e.device_index > 0) {
        let Some(meta) = obs.ec2.eni_meta.get(&e.eni_id) else {
            continue;
        };
        let pool = Some(e.network.as_str()).filter(|n| !n.is_empty());
        if pool != meta.network.as_deref() {
            found.push(Found {
                kind: "eni-network-disagree",
                subject: e.eni_id.clone(),
                text: format!(
                    "the pool serves {} for {}, EC2 tags it eniipam.io/network={:?}",
                    e.eni_id,
                    pool.map_or("the default network".to_owned(), |p| format!("profile {p}")),
                    meta.network
                ),
                settle: true,
            });
        }
    }

    // eth0 serves no pod.
    for e in obs.pool.enis.iter().filter(|e| e.device_index == 0) {
        let holds = e.idle + e.assigned + e.cooling + e.sticky;
        if holds > 0 {
            found.push(Found {
                kind: "eth0-serving",
                subject: format!("pool {}", e.eni_id),
                text: format!(
                    "custom networking is on, yet the pool serves from eth0 {} ({} assigned, {} idle, \
                     {} cooling, {} sticky)",
                    e.eni_id, e.assigned, e.idle, e.cooling, e.sticky
                ),
                settle: false,
            });
        }
    }
    if let Some((eth0, ips)) = &obs.ec2.eth0 {
        for (k, ip) in held.iter().filter(|(_, ip)| ips.contains(ip)) {
            found.push(Found {
                kind: "eth0-serving",
                subject: format!("{}/{}@{ip}", k.0, k.1),
                text: format!(
                    "{}/{} holds {ip}, which EC2 has on eth0 {eth0}: custom networking is on, eth0 \
                     serves no pod",
                    k.0, k.1
                ),
                settle: false,
            });
        }
    }
}
