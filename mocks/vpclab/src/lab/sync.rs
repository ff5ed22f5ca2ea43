//! [`super::Lab::sync`]'s steps: read mockcloud, plan, and apply the difference to nodes, ENI
//! links, routes (both families), the source/destination check, the security groups, the subnet
//! routers, the IGW's
//! public set and the nodes' eth0 IPv6 addresses.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

use super::{
    ENI_NEXT_HOP, Egress, Inner, LinkRec, NAT_GATEWAY_PUBLIC_IP, NodeRec, SyncReport, sysctls,
};
use crate::error::LabError;
use crate::netns::{NetNs, RouteDst};
use crate::nft;
use crate::plan::{self, LinkPlan, NodePlan, Plan};

/// A new ENI's node end, waiting in the vpc namespace to be plugged into its node.
struct Staged {
    name: String,
    plan: LinkPlan,
    node_ns: NetNs,
}

/// The temporary name of the node end of the ENI veth `vif` (`e<N>`) while staged.
fn staged_name(vif: &str) -> String {
    format!("s{vif}")
}

impl Inner {
    pub(super) async fn sync(&self) -> Result<SyncReport, LabError> {
        let _one_at_a_time = self.sync_lock.lock().await;
        let state = self.source.fetch().await?;
        let plan = plan::plan(&state, &self.vpc_id)?;
        if plan.vpc_cidrs != self.vpc_cidrs {
            // The gateways' routes and the NAT gateway's rule are wired once, at the start.
            return Err(LabError::CloudState(format!(
                "VPC {}'s IPv4 blocks changed since the lab started ({:?} → {:?}): associate \
                 secondary blocks before Lab::start",
                self.vpc_id, self.vpc_cidrs, plan.vpc_cidrs
            )));
        }
        let mut report = SyncReport::default();
        self.remove_stale(&plan, &mut report).await?;
        self.add_nodes(&plan, &mut report).await?;
        // New ENIs' node ends are created in the vpc namespace and hot-plugged into their nodes
        // only once the VPC routes their addresses and the source/destination check knows them: EC2
        // makes an ENI's addresses routable before the guest sees the device, and the daemon
        // serves a new ENI's addresses as soon as its link shows up (with its route table).
        let staged = self.add_links(&plan, &mut report).await?;
        let vpc_side = async {
            self.apply_routes(&mut report).await?;
            self.apply_routes_v6(&mut report).await?;
            self.apply_srcdst().await?;
            // A new ENI's groups apply before its node sees the device, as EC2's do.
            self.apply_security_groups(&state).await
        }
        .await;
        self.plug_links(staged).await?;
        vpc_side?;
        self.apply_eth0_v6().await?;
        self.apply_routers(&plan).await?;
        self.apply_public(&plan).await?;
        if !report.is_empty() {
            tracing::debug!(lab = %self.name, ?report, "vpclab synced");
        }
        Ok(report)
    }

    /// Deletes the links of detached ENIs (and of ENIs whose attachment changed) and the nodes of
    /// instances no longer running. Links go first, so their routes vanish at once even if
    /// something still holds a node's namespace open.
    async fn remove_stale(&self, plan: &Plan, report: &mut SyncReport) -> Result<(), LabError> {
        let (gone_nodes, gone_links) = {
            let a = self.applied.lock().expect("applied lock");
            let gone_nodes: Vec<(String, NetNs)> = a
                .nodes
                .iter()
                .filter(|(id, rec)| plan.nodes.get(*id) != Some(&rec.plan))
                .map(|(id, rec)| (id.clone(), rec.ns.clone()))
                .collect();
            let gone_links: Vec<(String, String)> = a
                .links
                .iter()
                .filter(|(eni, rec)| {
                    gone_nodes.iter().any(|(id, _)| *id == rec.plan.instance_id)
                        || !plan
                            .links
                            .get(*eni)
                            .is_some_and(|p| p.same_device(&rec.plan))
                })
                .map(|(eni, rec)| (eni.clone(), rec.vif.clone()))
                .collect();
            (gone_nodes, gone_links)
        };
        {
            // Links that stay take the new plan (their addresses may have changed).
            let mut a = self.applied.lock().expect("applied lock");
            for (eni, rec) in a.links.iter_mut() {
                if let Some(p) = plan.links.get(eni)
                    && !gone_links.iter().any(|(e, _)| e == eni)
                {
                    rec.plan = p.clone();
                }
            }
        }
        if !gone_links.is_empty() {
            let vifs: Vec<String> = gone_links.iter().map(|(_, v)| v.clone()).collect();
            self.delete_vifs(&vifs).await?;
            let mut a = self.applied.lock().expect("applied lock");
            for (eni, _) in &gone_links {
                a.links.remove(eni);
                report.links_removed.push(eni.clone());
            }
        }
        for (id, ns) in gone_nodes {
            self.spaces.delete(&ns).await?;
            self.applied.lock().expect("applied lock").nodes.remove(&id);
            report.nodes_removed.push(id);
        }
        Ok(())
    }

    /// Deletes vpc-side veths (their node ends go with them); fails only if one is still there.
    async fn delete_vifs(&self, vifs: &[String]) -> Result<(), LabError> {
        let lines: Vec<String> = vifs.iter().map(|v| format!("link del {v}")).collect();
        let deleted = self.vpc.ip_batch(&lines).await;
        let left: Vec<String> = self
            .vpc
            .links()
            .await?
            .into_iter()
            .map(|l| l.name)
            .filter(|n| vifs.contains(n))
            .collect();
        match (deleted, left.is_empty()) {
            (_, true) => Ok(()),
            (Err(e), false) => Err(e),
            (Ok(()), false) => Err(LabError::io(
                format!("deleting veths {left:?}"),
                std::io::Error::other("still present"),
            )),
        }
    }

    /// A namespace per new running instance, with the node sysctls, before any link appears.
    async fn add_nodes(&self, plan: &Plan, report: &mut SyncReport) -> Result<(), LabError> {
        let new: Vec<(String, NodePlan)> = {
            let a = self.applied.lock().expect("applied lock");
            plan.nodes
                .iter()
                .filter(|(id, _)| !a.nodes.contains_key(*id))
                .map(|(id, p)| (id.clone(), p.clone()))
                .collect()
        };
        for (id, p) in new {
            let idx = {
                let mut a = self.applied.lock().expect("applied lock");
                a.next_node += 1;
                a.next_node
            };
            let ns = self.spaces.create(format!("{}-n{idx}", self.name)).await?;
            let setup = async {
                ns.write_sysctls(&self.config.node_sysctls).await?;
                ns.ip(&["link", "set", "lo", "up"]).await.map(drop)
            };
            if let Err(e) = setup.await {
                let _ = self.spaces.delete(&ns).await;
                return Err(e);
            }
            self.applied
                .lock()
                .expect("applied lock")
                .nodes
                .insert(id.clone(), NodeRec { ns, plan: p });
            report.nodes_added.push(id);
        }
        Ok(())
    }

    /// A veth pair per newly attached ENI: one end in the vpc namespace answering ARP by proxy, the
    /// other, with the ENI's MAC, staged in the vpc namespace under a temporary name until
    /// [`Self::plug_links`] moves it into its node as `eth<N>`. Returns the staged ends.
    async fn add_links(
        &self,
        plan: &Plan,
        report: &mut SyncReport,
    ) -> Result<Vec<Staged>, LabError> {
        let new: Vec<(String, LinkPlan, String, NetNs)> = {
            let mut a = self.applied.lock().expect("applied lock");
            let wanted: Vec<(String, LinkPlan)> = plan
                .links
                .iter()
                .filter(|(eni, _)| !a.links.contains_key(*eni))
                .map(|(eni, p)| (eni.clone(), p.clone()))
                .collect();
            let mut out = Vec::new();
            for (eni, p) in wanted {
                let Some(node_ns) = a.nodes.get(&p.instance_id).map(|n| n.ns.clone()) else {
                    continue;
                };
                a.next_link += 1;
                out.push((eni, p, format!("e{}", a.next_link), node_ns));
            }
            out
        };
        if new.is_empty() {
            return Ok(Vec::new());
        }
        let mtu = self.config.eni_mtu;
        let result = async {
            let creates: Vec<String> = new
                .iter()
                .map(|(_, p, vif, _)| {
                    format!(
                        "link add {vif} mtu {mtu} type veth peer name {} address {} mtu {mtu}",
                        staged_name(vif),
                        p.mac,
                    )
                })
                .collect();
            self.vpc.ip_batch(&creates).await?;
            let mut knobs = Vec::new();
            for (_, _, vif, _) in &new {
                knobs.extend(sysctls(&[
                    (&format!("net/ipv4/conf/{vif}/proxy_arp"), "1"),
                    (&format!("net/ipv4/conf/{vif}/rp_filter"), "0"),
                    // Answer broadcast ARP requests at once, not after up to 0.8 s.
                    (&format!("net/ipv4/neigh/{vif}/proxy_delay"), "0"),
                ]));
            }
            self.vpc.write_sysctls(&knobs).await?;
            let ups: Vec<String> = new
                .iter()
                .flat_map(|(_, p, vif, _)| {
                    [
                        format!("link set {vif} up"),
                        format!(
                            "neigh replace {ENI_NEXT_HOP} lladdr {} dev {vif} nud permanent",
                            p.mac
                        ),
                    ]
                    .into_iter()
                    .chain(super::ipv6::vif_lines(vif, &p.mac))
                })
                .collect();
            self.vpc.ip_batch(&ups).await?;
            Ok::<(), LabError>(())
        };
        if let Err(e) = result.await {
            let vifs: Vec<String> = new.iter().map(|(_, _, v, _)| v.clone()).collect();
            let _ = self.delete_vifs(&vifs).await;
            return Err(e);
        }
        let mut a = self.applied.lock().expect("applied lock");
        let mut staged = Vec::new();
        for (eni, p, vif, node_ns) in new {
            staged.push(Staged {
                name: staged_name(&vif),
                plan: p.clone(),
                node_ns,
            });
            a.links.insert(
                eni.clone(),
                LinkRec {
                    vif,
                    plan: p,
                    routes: BTreeSet::new(),
                    routes_v6: BTreeSet::new(),
                    eth0_v6: None,
                },
            );
            report.links_added.push(eni);
        }
        Ok(staged)
    }

    /// Hot-plugs staged ENI ends into their nodes as `eth<N>`. eth0 is configured as the OS's DHCP
    /// client would (primary IP with the subnet's prefix, default route via the VPC router; in an
    /// IPv6 subnet also the IPv6 routes a router advertisement gives, see `ipv6`);
    /// secondary ENI links stay down and bare: the daemon configures them.
    async fn plug_links(&self, staged: Vec<Staged>) -> Result<(), LabError> {
        if staged.is_empty() {
            return Ok(());
        }
        let moves: Vec<String> = staged
            .iter()
            .map(|s| format!("link set {} netns {}", s.name, s.node_ns.name()))
            .collect();
        self.vpc.ip_batch(&moves).await?;
        for s in &staged {
            let ifname = s.plan.node_ifname();
            s.node_ns
                .ip_batch(&[format!("link set {} name {ifname}", s.name)])
                .await?;
            // A node that has been up a while has a usable link-local address on every ENI link;
            // a fresh link would hold it tentative for a second of duplicate address detection,
            // during which the kernel cannot solicit the VPC router for forwarded (pod) traffic:
            // it sends a neighbour solicitation only from a usable link-local address.
            s.node_ns
                .write_sysctls(&[(format!("net/ipv6/conf/{ifname}/accept_dad"), "0".into())])
                .await?;
            let mut lines = Vec::new();
            if s.plan.is_primary() {
                lines.extend([
                    format!("link set {ifname} up"),
                    format!(
                        "addr add {}/{} dev {ifname}",
                        s.plan.primary_ip,
                        s.plan.subnet.prefix_len()
                    ),
                    format!(
                        "route add default via {} dev {ifname}",
                        plan::subnet_router(s.plan.subnet)
                    ),
                ]);
                lines.extend(super::ipv6::eth0_route_lines(&s.plan, &ifname));
            }
            s.node_ns.ip_batch(&lines).await?;
        }
        Ok(())
    }

    /// Routes every address (and prefix) an ENI holds to its veth, diffed against the kernel's
    /// table so a half-applied earlier sync heals. Deletions go first: an address that moved
    /// between ENIs is deleted from the old one, then added to the new.
    async fn apply_routes(&self, report: &mut SyncReport) -> Result<(), LabError> {
        let kernel = self.vpc.routes(None).await?;
        let (desired, vifs) = {
            let a = self.applied.lock().expect("applied lock");
            let desired: BTreeMap<Ipv4Net, String> = a
                .links
                .values()
                .flat_map(|l| l.plan.addresses.iter().map(|n| (*n, l.vif.clone())))
                .collect();
            let vifs: BTreeSet<String> = a.links.values().map(|l| l.vif.clone()).collect();
            (desired, vifs)
        };
        let current: BTreeMap<Ipv4Net, String> = kernel
            .into_iter()
            .filter_map(|r| match (r.dst, r.dev) {
                (RouteDst::Net(n), Some(dev)) if vifs.contains(&dev) => Some((n, dev)),
                _ => None,
            })
            .collect();
        let mut lines = Vec::new();
        for (net, dev) in &current {
            if desired.get(net) != Some(dev) {
                lines.push(format!("route del {net} dev {dev}"));
                report.routes_removed.push(*net);
            }
        }
        for (net, vif) in &desired {
            if current.get(net) != Some(vif) {
                lines.push(format!(
                    "route replace {net} via {ENI_NEXT_HOP} dev {vif} onlink"
                ));
                report.routes_added.push(*net);
            }
        }
        self.vpc.ip_batch(&lines).await?;
        let mut a = self.applied.lock().expect("applied lock");
        for l in a.links.values_mut() {
            l.routes = l.plan.addresses.clone();
        }
        Ok(())
    }

    /// EC2's source/destination check: per ENI veth, a set of its addresses and a drop counter.
    async fn apply_srcdst(&self) -> Result<(), LabError> {
        let (desired, loaded) = {
            let a = self.applied.lock().expect("applied lock");
            let desired: BTreeMap<String, nft::Held> = a
                .links
                .values()
                .map(|l| {
                    (
                        l.vif.clone(),
                        nft::Held {
                            v4: l.routes.clone(),
                            v6: l.routes_v6.clone(),
                        },
                    )
                })
                .collect();
            (desired, a.srcdst.clone())
        };
        if desired == loaded {
            return Ok(());
        }
        let added: BTreeSet<String> = desired
            .keys()
            .filter(|v| !loaded.contains_key(*v))
            .cloned()
            .collect();
        let removed: BTreeSet<String> = loaded
            .keys()
            .filter(|v| !desired.contains_key(*v))
            .cloned()
            .collect();
        self.vpc
            .nft(&nft::vpc_srcdst_update(&desired, &added, &removed))
            .await?;
        self.applied.lock().expect("applied lock").srcdst = desired;
        Ok(())
    }

    /// Each subnet's VPC router address, on the vpc namespace's loopback (answered to ARP from
    /// every ENI veth, as a local address).
    async fn apply_routers(&self, plan: &Plan) -> Result<(), LabError> {
        let have = self.applied.lock().expect("applied lock").routers.clone();
        let mut lines: Vec<String> = have
            .difference(&plan.routers)
            .map(|r| format!("addr del {r}/32 dev lo"))
            .collect();
        lines.extend(
            plan.routers
                .difference(&have)
                .map(|r| format!("addr add {r}/32 dev lo")),
        );
        self.vpc.ip_batch(&lines).await?;
        self.applied.lock().expect("applied lock").routers = plan.routers.clone();
        Ok(())
    }

    /// The addresses with a public IP, which the IGW lets through.
    async fn apply_public(&self, plan: &Plan) -> Result<(), LabError> {
        let public: BTreeSet<Ipv4Addr> = match self.config.egress {
            Egress::InternetGateway => plan.nodes.values().map(|n| n.primary_ip).collect(),
            Egress::NatGateway => [NAT_GATEWAY_PUBLIC_IP].into_iter().collect(),
        };
        if self.applied.lock().expect("applied lock").public == public {
            return Ok(());
        }
        self.igw.nft(&nft::igw_public_update(&public)).await?;
        self.applied.lock().expect("applied lock").public = public;
        Ok(())
    }
}
