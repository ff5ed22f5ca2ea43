//! The lab: its configuration, namespaces and teardown, the node view; submodules hold the fixed
//! wiring (`gateways`), [`Lab::sync`]'s steps (`sync`), the namespaces beyond the fabric: pods by
//! hand, IMDS inside a node (`extras`), what a test reads back: counters, routes (`observe`), and
//! the IPv6 side of the fabric (`ipv6`).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use ipnet::{Ipv4Net, Ipv6Net};

use crate::error::LabError;
use crate::netns::{self, NetNs};
use crate::nft;
use crate::plan::{self, LinkPlan, NodePlan};
use crate::state::StateSource;

/// The internet server's address (TEST-NET-2), reachable only through the IGW.
pub const INTERNET_SERVER: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 10);
/// The IGW's address on the internet side.
const IGW_INTERNET_IP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 1);
const INTERNET_PREFIX: u8 = 24;
/// The NAT gateway's public address (TEST-NET-3): the source the internet sees in the NAT variant.
pub const NAT_GATEWAY_PUBLIC_IP: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 10);
const IGW_NAT_SIDE_IP: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 1);
const NAT_PUBLIC_PREFIX: u8 = 24;
/// Transit /30s between the vpc namespace and its gateways (link-local, never a VPC address).
const VPC_TO_IGW: Ipv4Addr = Ipv4Addr::new(169, 254, 100, 1);
const IGW_TO_VPC: Ipv4Addr = Ipv4Addr::new(169, 254, 100, 2);
const VPC_TO_NAT: Ipv4Addr = Ipv4Addr::new(169, 254, 100, 5);
const NAT_TO_VPC: Ipv4Addr = Ipv4Addr::new(169, 254, 100, 6);
/// Where EC2's instance metadata service answers.
pub const IMDS_ADDR: Ipv4Addr = Ipv4Addr::new(169, 254, 169, 254);
/// The pod gateway the AWS VPC CNI (and eniipam) give pods.
pub const POD_GATEWAY: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);
/// The next hop of every route to an ENI, on its veth, with a permanent neighbour entry for the
/// ENI's MAC: the VPC delivers to the ENI's MAC (as EC2's hypervisor does), without asking the node
/// to answer ARP for a pod's address it does not hold itself.
const ENI_NEXT_HOP: Ipv4Addr = Ipv4Addr::new(169, 254, 0, 1);
/// The vpc namespace's sink for VPC addresses no ENI holds.
const SINK: &str = "sink";

/// How the VPC reaches the internet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Egress {
    /// Public subnet: the VPC's default route is the IGW, which forwards only packets from (and
    /// back to) a node's primary address, as EC2's IGW translates only addresses with a public IP.
    /// The lab's IGW filters but does not translate: the internet sees the primary address.
    InternetGateway,
    /// Private subnet: the VPC's default route is a NAT gateway that masquerades every VPC source
    /// to [`NAT_GATEWAY_PUBLIC_IP`], behind the IGW (which lets only that address through).
    NatGateway,
}

/// How to build a lab.
#[derive(Clone, Debug)]
pub struct LabConfig {
    /// The VPC to model; `None` takes the only VPC mockcloud has.
    pub vpc_id: Option<String>,
    pub egress: Egress,
    /// Sysctl files written in every node namespace before its links appear (keys relative to
    /// `/proc/sys`). The default: forwarding on (a Kubernetes node's requirement) and loose
    /// reverse-path filtering on `all` and `default` (upstream systemd's `50-default.conf`; what
    /// an AL2023 EKS AMI ships is unverified). Tests that need another value set it here.
    pub node_sysctls: Vec<(String, String)>,
    /// MTU of every ENI veth (EC2: 9001 inside the VPC).
    pub eni_mtu: u32,
}

impl Default for LabConfig {
    fn default() -> Self {
        Self {
            vpc_id: None,
            egress: Egress::InternetGateway,
            node_sysctls: sysctls(&[
                ("net/ipv4/ip_forward", "1"),
                ("net/ipv4/conf/all/rp_filter", "2"),
                ("net/ipv4/conf/default/rp_filter", "2"),
            ]),
            eni_mtu: 9001,
        }
    }
}

impl LabConfig {
    /// The default lab with a NAT gateway instead of direct IGW egress.
    pub fn nat_gateway() -> Self {
        Self {
            egress: Egress::NatGateway,
            ..Self::default()
        }
    }
}

/// A node (a running instance) as the lab built it.
#[derive(Clone, Debug)]
pub struct Node {
    pub instance_id: String,
    pub ns: NetNs,
    pub primary_ip: Ipv4Addr,
    pub subnet: Ipv4Net,
    /// The subnet's VPC router: eth0's default gateway.
    pub router: Ipv4Addr,
    /// Its ENIs' links, by device index.
    pub links: Vec<NodeLink>,
    /// The subnet's IPv6 /64, when it has one.
    pub subnet_v6: Option<Ipv6Net>,
    /// eth0's IPv6 address (the primary ENI's first), as of the last sync.
    pub ipv6: Option<Ipv6Addr>,
}

impl Node {
    pub fn link(&self, eni_id: &str) -> Option<&NodeLink> {
        self.links.iter().find(|l| l.eni_id == eni_id)
    }
}

/// One ENI as a link in its node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeLink {
    pub eni_id: String,
    /// `eth<device index>` (see [`crate::node_ifname`]).
    pub ifname: String,
    pub mac: String,
    pub device_index: u32,
    pub network_card_index: u32,
    pub primary_ip: Ipv4Addr,
    pub subnet: Ipv4Net,
    pub router: Ipv4Addr,
    /// The subnet's IPv6 /64, when it has one.
    pub subnet_v6: Option<Ipv6Net>,
}

/// A pod plumbed by hand, as the CNI plugin would: its own namespace, a veth whose node end is
/// `host_if`, `ip/32`, a default route via [`POD_GATEWAY`] with a static neighbour, and a `/32` route
/// to `host_if` in the node. Policy rules for secondary ENIs are the test's to add.
#[derive(Clone, Debug)]
pub struct Pod {
    pub instance_id: String,
    pub ns: NetNs,
    pub ip: Ipv4Addr,
    pub host_if: String,
}

/// What one [`Lab::sync`] changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SyncReport {
    pub nodes_added: Vec<String>,
    pub nodes_removed: Vec<String>,
    /// ENI ids whose link appeared in their node.
    pub links_added: Vec<String>,
    pub links_removed: Vec<String>,
    pub routes_added: Vec<Ipv4Net>,
    pub routes_removed: Vec<Ipv4Net>,
    pub routes_added_v6: Vec<Ipv6Net>,
    pub routes_removed_v6: Vec<Ipv6Net>,
}

impl SyncReport {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

#[derive(Clone)]
struct NodeRec {
    ns: NetNs,
    plan: NodePlan,
}

#[derive(Clone)]
struct LinkRec {
    /// The veth end in the vpc namespace.
    vif: String,
    plan: LinkPlan,
    /// The routes installed for it (and the source/destination check's set).
    routes: BTreeSet<Ipv4Net>,
    /// The IPv6 routes installed for it (and the check's IPv6 set).
    routes_v6: BTreeSet<Ipv6Net>,
    /// The IPv6 address the lab put on the node's eth0 (primary ENIs only).
    eth0_v6: Option<Ipv6Addr>,
}

#[derive(Default)]
struct Applied {
    nodes: BTreeMap<String, NodeRec>,
    links: BTreeMap<String, LinkRec>,
    routers: BTreeSet<Ipv4Addr>,
    public: BTreeSet<Ipv4Addr>,
    /// What the source/destination check was last loaded with: veth → addresses.
    srcdst: BTreeMap<String, nft::Held>,
    /// What the security-group table was last loaded with (`None`: not yet).
    sg: Option<security_groups::SgLoaded>,
    next_node: u32,
    next_link: u32,
    next_extra: u32,
}

/// Every namespace the lab made; deletes them all when dropped (also on panic).
struct Namespaces {
    made: Mutex<Vec<(String, Arc<AtomicBool>)>>,
}

impl Namespaces {
    async fn create(&self, name: String) -> Result<NetNs, LabError> {
        let alive = Arc::new(AtomicBool::new(true));
        let ns = NetNs::create(name.clone(), alive.clone()).await?;
        self.made
            .lock()
            .expect("namespaces lock")
            .push((name, alive));
        Ok(ns)
    }

    async fn delete(&self, ns: &NetNs) -> Result<(), LabError> {
        for (n, alive) in self.made.lock().expect("namespaces lock").iter() {
            if n == ns.name() {
                alive.store(false, Ordering::Release);
            }
        }
        netns::run_tool(
            "ip",
            &["netns".into(), "del".into(), ns.name().into()],
            None,
        )
        .await?;
        self.made
            .lock()
            .expect("namespaces lock")
            .retain(|(n, _)| n != ns.name());
        Ok(())
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        let made = std::mem::take(&mut *self.made.lock().unwrap_or_else(|e| e.into_inner()));
        for (_, alive) in &made {
            alive.store(false, Ordering::Release);
        }
        let names: Vec<String> = made.into_iter().map(|(n, _)| n).collect();
        if let Err(e) = netns::delete_blocking(&names) {
            eprintln!("vpclab teardown: {e}");
        }
    }
}

struct Inner {
    name: String,
    source: StateSource,
    config: LabConfig,
    vpc_id: String,
    vpc_cidr: Ipv4Net,
    /// Every IPv4 block of the VPC as of the start, primary first (routed, sunk and NATed).
    vpc_cidrs: Vec<Ipv4Net>,
    /// The VPC's IPv6 /56 as of the start (sunk and routed to the EIGW), if it had one.
    vpc_ipv6: Option<Ipv6Net>,
    vpc: NetNs,
    igw: NetNs,
    internet: NetNs,
    natgw: Option<NetNs>,
    applied: Mutex<Applied>,
    sync_lock: tokio::sync::Mutex<()>,
    /// Last: dropping it deletes every namespace above.
    spaces: Namespaces,
}

/// An emulated VPC in network namespaces that follows mockcloud's state. See the crate docs.
///
/// Dropping it removes every namespace (and so every veth) it made and stops every echo server
/// running in them.
pub struct Lab {
    inner: Arc<Inner>,
}

/// Keeps a background [`Lab::sync`] loop running; stops it when dropped.
pub struct Follower {
    task: tokio::task::JoinHandle<()>,
    progress: tokio::sync::watch::Receiver<Progress>,
}

/// What the follow loop publishes.
#[derive(Clone, Debug, Default)]
struct Progress {
    started: u64,
    finished: u64,
    /// The error of the last finished sync, if it failed.
    last_error: Option<String>,
}

impl Follower {
    /// Waits until a sync that started after this call has finished, so every cloud change made
    /// before the call is applied; that sync's error if it failed, or an error if the loop has
    /// stopped (its lab is gone).
    pub async fn synced(&mut self) -> Result<(), LabError> {
        let started = self.progress.borrow_and_update().started;
        let p = self
            .progress
            .wait_for(|p| p.finished > started)
            .await
            .map_err(|_| LabError::NotFound("the follower stopped (its lab is gone)".into()))?;
        match &p.last_error {
            None => Ok(()),
            Some(e) => Err(LabError::SyncFailed(e.clone())),
        }
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.task.abort();
    }
}

mod extras;
mod gateways;
mod ipv6;
mod observe;
mod security_groups;
mod sync;

pub use ipv6::{INTERNET_SERVER_V6, POD_GATEWAY_V6, Pod6, VPC_ROUTER_V6};

pub use observe::IgwDrops;

static LABS: AtomicU32 = AtomicU32::new(0);

/// `vpclab-<pid>-<n><random>`: unique across parallel tests and processes.
fn lab_name() -> String {
    format!(
        "vpclab-{}-{}{:04x}",
        std::process::id(),
        LABS.fetch_add(1, Ordering::Relaxed),
        rand::random::<u16>()
    )
}

fn sysctls(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// Forwarding on for both families, no reverse-path filtering (the gateways and the VPC route
/// asymmetric paths by design), no duplicate address detection (the lab's fixed addresses are
/// unique by construction; DAD would hold each one tentative for a second).
fn router_sysctls() -> Vec<(String, String)> {
    sysctls(&[
        ("net/ipv4/ip_forward", "1"),
        ("net/ipv4/conf/all/rp_filter", "0"),
        ("net/ipv4/conf/default/rp_filter", "0"),
        ("net/ipv6/conf/all/forwarding", "1"),
        ("net/ipv6/conf/default/accept_dad", "0"),
    ])
}

fn random_mac() -> String {
    let b: [u8; 5] = rand::random();
    // Locally administered, unicast.
    format!(
        "02:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        b[0], b[1], b[2], b[3], b[4]
    )
}

impl Lab {
    /// Builds the vpc, igw, internet (and NAT gateway) namespaces, then a node per running
    /// instance of the VPC with its ENIs: a first [`Lab::sync`].
    pub async fn start(source: impl Into<StateSource>, config: LabConfig) -> Result<Lab, LabError> {
        let source = source.into();
        if !(68..=65535).contains(&config.eni_mtu) {
            return Err(LabError::Invalid(format!(
                "eni_mtu {} is not between 68 and 65535",
                config.eni_mtu
            )));
        }
        let state = source.fetch().await?;
        let vpc = state.pick_vpc(config.vpc_id.as_deref())?.clone();
        let vpc_ipv6 = plan::plan(&state, &vpc.id)?.vpc_ipv6;
        let name = lab_name();
        let spaces = Namespaces {
            made: Mutex::new(Vec::new()),
        };
        // From here on an error drops `spaces`, which deletes whatever was made.
        let vpc_ns = spaces.create(format!("{name}-vpc")).await?;
        let igw = spaces.create(format!("{name}-igw")).await?;
        let internet = spaces.create(format!("{name}-inet")).await?;
        let natgw = match config.egress {
            Egress::NatGateway => Some(spaces.create(format!("{name}-nat")).await?),
            Egress::InternetGateway => None,
        };
        let mut vpc_sysctls = router_sysctls();
        vpc_sysctls.extend(sysctls(&[("net/ipv4/conf/default/proxy_arp", "1")]));
        vpc_ns.write_sysctls(&vpc_sysctls).await?;
        igw.write_sysctls(&router_sysctls()).await?;
        internet
            .write_sysctls(&sysctls(&[
                ("net/ipv4/conf/all/rp_filter", "0"),
                ("net/ipv4/conf/default/rp_filter", "0"),
                ("net/ipv6/conf/default/accept_dad", "0"),
            ]))
            .await?;
        if let Some(nat) = &natgw {
            nat.write_sysctls(&router_sysctls()).await?;
        }
        let vpc_cidrs = vpc.blocks();
        gateways::wire_gateways(&vpc_ns, &igw, &internet, natgw.as_ref(), &vpc_cidrs).await?;
        vpc_ns.nft(&nft::vpc_base(SINK)).await?;
        igw.nft(&nft::igw_base("to-inet")).await?;
        if let Some(block) = vpc_ipv6 {
            ipv6::wire_gateways(&vpc_ns, &igw, &internet, block).await?;
            igw.nft(&nft::eigw("to-inet")).await?;
        }
        if let Some(nat) = &natgw {
            nat.nft(&nft::natgw(&vpc_cidrs, "to-igw")).await?;
        }
        let lab = Lab {
            inner: Arc::new(Inner {
                name,
                source,
                config,
                vpc_id: vpc.id.clone(),
                vpc_cidr: vpc.cidr,
                vpc_cidrs,
                vpc_ipv6,
                vpc: vpc_ns,
                igw,
                internet,
                natgw,
                applied: Mutex::new(Applied::default()),
                sync_lock: tokio::sync::Mutex::new(()),
                spaces,
            }),
        };
        lab.sync().await?;
        Ok(lab)
    }

    /// Reads mockcloud's state and applies the difference: nodes for new running instances (gone
    /// for terminated ones), a veth pair for every newly attached ENI (removed when it detaches),
    /// routes for assigned / unassigned addresses and prefixes, the source/destination check's
    /// address sets and the IGW's public addresses.
    pub async fn sync(&self) -> Result<SyncReport, LabError> {
        self.inner.sync().await
    }

    /// Runs [`Lab::sync`] every `every` in a background task (on the current tokio runtime) until
    /// the returned guard or the lab is dropped. Failures are logged with `tracing`, reported by
    /// [`Follower::synced`], and retried at the next tick.
    pub fn follow(&self, every: Duration) -> Result<Follower, LabError> {
        if every.is_zero() {
            return Err(LabError::Invalid("follow: the period must be > 0".into()));
        }
        let weak: Weak<Inner> = Arc::downgrade(&self.inner);
        let (tx, progress) = tokio::sync::watch::channel(Progress::default());
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(inner) = weak.upgrade() else { break };
                tx.send_modify(|p| p.started += 1);
                let result = inner.sync().await;
                if let Err(e) = &result {
                    tracing::warn!(lab = %inner.name, error = %e, "vpclab sync failed");
                }
                tx.send_modify(|p| {
                    p.finished += 1;
                    p.last_error = result.err().map(|e| e.to_string());
                });
            }
        });
        Ok(Follower { task, progress })
    }

    /// `vpclab-<pid>-<n><random>`: the prefix of every namespace of this lab.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    pub fn vpc_id(&self) -> &str {
        &self.inner.vpc_id
    }

    /// The VPC's primary IPv4 block.
    pub fn vpc_cidr(&self) -> Ipv4Net {
        self.inner.vpc_cidr
    }

    /// Every IPv4 block the lab routes, primary first (fixed at the start).
    pub fn vpc_cidrs(&self) -> &[Ipv4Net] {
        &self.inner.vpc_cidrs
    }

    /// The VPC's IPv6 /56, if it had one when the lab started.
    pub fn vpc_ipv6(&self) -> Option<Ipv6Net> {
        self.inner.vpc_ipv6
    }

    pub fn egress(&self) -> Egress {
        self.inner.config.egress
    }

    /// The namespace playing the VPC's routers.
    pub fn vpc(&self) -> &NetNs {
        &self.inner.vpc
    }

    pub fn igw(&self) -> &NetNs {
        &self.inner.igw
    }

    /// The namespace holding [`INTERNET_SERVER`].
    pub fn internet(&self) -> &NetNs {
        &self.inner.internet
    }

    /// The NAT gateway's namespace ([`Egress::NatGateway`] labs only).
    pub fn nat_gateway(&self) -> Option<&NetNs> {
        self.inner.natgw.as_ref()
    }

    /// One node, as of the last sync.
    pub fn node(&self, instance_id: &str) -> Option<Node> {
        let a = self.inner.applied.lock().expect("applied lock");
        a.nodes
            .get(instance_id)
            .map(|rec| node_view(instance_id, rec, &a))
    }

    /// Every node, as of the last sync.
    pub fn nodes(&self) -> Vec<Node> {
        let a = self.inner.applied.lock().expect("applied lock");
        a.nodes
            .iter()
            .map(|(id, rec)| node_view(id, rec, &a))
            .collect()
    }
}

fn node_view(instance_id: &str, rec: &NodeRec, a: &Applied) -> Node {
    let mut links: Vec<NodeLink> = a
        .links
        .iter()
        .filter(|(_, l)| l.plan.instance_id == instance_id)
        .map(|(eni, l)| NodeLink {
            eni_id: eni.clone(),
            ifname: l.plan.node_ifname(),
            mac: l.plan.mac.clone(),
            device_index: l.plan.device_index,
            network_card_index: l.plan.network_card_index,
            primary_ip: l.plan.primary_ip,
            subnet: l.plan.subnet,
            router: plan::subnet_router(l.plan.subnet),
            subnet_v6: l.plan.subnet_v6,
        })
        .collect();
    links.sort_by_key(|l| (l.network_card_index, l.device_index));
    let eth0 = a
        .links
        .values()
        .find(|l| l.plan.instance_id == instance_id && l.plan.is_primary());
    Node {
        instance_id: instance_id.to_owned(),
        ns: rec.ns.clone(),
        primary_ip: rec.plan.primary_ip,
        subnet: rec.plan.subnet,
        router: rec.plan.router,
        links,
        subnet_v6: eth0.and_then(|l| l.plan.subnet_v6),
        ipv6: eth0.and_then(|l| l.eth0_v6),
    }
}
