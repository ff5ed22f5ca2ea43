//! The lab: its namespaces, their wiring, [`Lab::sync`] that follows mockcloud, counters, pods by
//! hand, and teardown.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use ipnet::Ipv4Net;

use crate::error::LabError;
use crate::netns::{self, NetNs, RouteDst};
use crate::nft;
use crate::plan::{self, LinkPlan, NodePlan, Plan};
use crate::state::StateSource;
use crate::traffic::PortForward;

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
            node_sysctls: [
                ("net/ipv4/ip_forward", "1"),
                ("net/ipv4/conf/all/rp_filter", "2"),
                ("net/ipv4/conf/default/rp_filter", "2"),
            ]
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
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

/// The IGW's drop counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IgwDrops {
    /// Packets towards the internet from an address without a public IP.
    pub egress_not_public: u64,
    /// Packets from the internet to an address without a public IP.
    pub ingress_not_public: u64,
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
}

#[derive(Default)]
struct Applied {
    nodes: BTreeMap<String, NodeRec>,
    links: BTreeMap<String, LinkRec>,
    routers: BTreeSet<Ipv4Addr>,
    public: BTreeSet<Ipv4Addr>,
    /// What the source/destination check was last loaded with: veth → addresses.
    srcdst: BTreeMap<String, BTreeSet<Ipv4Net>>,
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

/// Forwarding on, no reverse-path filtering (the gateways and the VPC route asymmetric paths by design).
fn router_sysctls() -> Vec<(String, String)> {
    sysctls(&[
        ("net/ipv4/ip_forward", "1"),
        ("net/ipv4/conf/all/rp_filter", "0"),
        ("net/ipv4/conf/default/rp_filter", "0"),
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
            ]))
            .await?;
        if let Some(nat) = &natgw {
            nat.write_sysctls(&router_sysctls()).await?;
        }
        wire_gateways(&vpc_ns, &igw, &internet, natgw.as_ref(), vpc.cidr).await?;
        vpc_ns.nft(&nft::vpc_base(SINK)).await?;
        igw.nft(&nft::igw_base("to-inet")).await?;
        if let Some(nat) = &natgw {
            nat.nft(&nft::natgw(vpc.cidr, "to-igw")).await?;
        }
        let lab = Lab {
            inner: Arc::new(Inner {
                name,
                source,
                config,
                vpc_id: vpc.id.clone(),
                vpc_cidr: vpc.cidr,
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

    pub fn vpc_cidr(&self) -> Ipv4Net {
        self.inner.vpc_cidr
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

    /// Packets dropped by the source/destination check, per ENI (those attached now).
    pub async fn src_dst_drops(&self) -> Result<BTreeMap<String, u64>, LabError> {
        let counters = self.vpc_counters().await?;
        let a = self.inner.applied.lock().expect("applied lock");
        Ok(a.links
            .iter()
            .filter_map(|(eni, rec)| {
                counters
                    .get(&nft::drop_counter(&rec.vif))
                    .map(|n| (eni.clone(), *n))
            })
            .collect())
    }

    /// Packets the VPC dropped because no ENI holds their destination.
    pub async fn unassigned_drops(&self) -> Result<u64, LabError> {
        self.vpc_counters()
            .await?
            .get(nft::UNASSIGNED_COUNTER)
            .copied()
            .ok_or_else(|| LabError::NotFound("the vpc namespace lost its counters".into()))
    }

    /// Packets the IGW dropped.
    pub async fn igw_drops(&self) -> Result<IgwDrops, LabError> {
        let json = self
            .inner
            .igw
            .nft_json(&["list", "counters", "table", "ip", nft::IGW_TABLE])
            .await?;
        let c = nft::counters(&json)?;
        let get = |name: &str| {
            c.get(name)
                .copied()
                .ok_or_else(|| LabError::NotFound(format!("the IGW has no counter {name}")))
        };
        Ok(IgwDrops {
            egress_not_public: get(nft::IGW_EGRESS_COUNTER)?,
            ingress_not_public: get(nft::IGW_INGRESS_COUNTER)?,
        })
    }

    async fn vpc_counters(&self) -> Result<BTreeMap<String, u64>, LabError> {
        let json = self
            .inner
            .vpc
            .nft_json(&["list", "counters", "table", "ip", nft::VPC_TABLE])
            .await?;
        nft::counters(&json)
    }

    /// The routes the vpc namespace's kernel holds towards ENIs, read back from the kernel:
    /// destination → ENI id.
    pub async fn vpc_routes(&self) -> Result<BTreeMap<Ipv4Net, String>, LabError> {
        let routes = self.inner.vpc.routes(None).await?;
        let a = self.inner.applied.lock().expect("applied lock");
        let by_vif: BTreeMap<&str, &str> = a
            .links
            .iter()
            .map(|(eni, rec)| (rec.vif.as_str(), eni.as_str()))
            .collect();
        Ok(routes
            .into_iter()
            .filter_map(
                |r| match (r.dst, r.dev.as_deref().and_then(|d| by_vif.get(d))) {
                    (RouteDst::Net(net), Some(eni)) => Some((net, (*eni).to_owned())),
                    _ => None,
                },
            )
            .collect())
    }

    /// Plumbs a pod with address `ip` on node `instance_id` (see [`Pod`]). The address is not
    /// assigned in mockcloud: that is the caller's choice.
    pub async fn add_pod(&self, instance_id: &str, ip: Ipv4Addr) -> Result<Pod, LabError> {
        let (node_ns, idx) = {
            let mut a = self.inner.applied.lock().expect("applied lock");
            let ns = a
                .nodes
                .get(instance_id)
                .map(|n| n.ns.clone())
                .ok_or_else(|| LabError::NotFound(format!("no node for instance {instance_id}")))?;
            a.next_extra += 1;
            (ns, a.next_extra)
        };
        let ns = self
            .inner
            .spaces
            .create(format!("{}-p{idx}", self.inner.name))
            .await?;
        let host_if = format!("vlp{idx}");
        let host_mac = random_mac();
        node_ns
            .ip_batch(&[
                format!(
                    "link add {host_if} address {host_mac} type veth peer name eth0 address {} netns {}",
                    random_mac(),
                    ns.name()
                ),
                format!("link set {host_if} up"),
            ])
            .await?;
        ns.ip_batch(&[
            "link set lo up".into(),
            "link set eth0 up".into(),
            format!("addr add {ip}/32 dev eth0"),
            format!("route add {POD_GATEWAY} dev eth0 scope link"),
            format!("route add default via {POD_GATEWAY} dev eth0"),
            format!("neigh add {POD_GATEWAY} lladdr {host_mac} dev eth0 nud permanent"),
        ])
        .await?;
        node_ns
            .ip_batch(&[format!("route add {ip}/32 dev {host_if} scope link")])
            .await?;
        Ok(Pod {
            instance_id: instance_id.to_owned(),
            ns,
            ip,
            host_if,
        })
    }

    /// Removes a pod made by [`Lab::add_pod`]: its veth, node route and namespace.
    pub async fn remove_pod(&self, pod: &Pod) -> Result<(), LabError> {
        // The node end is gone already if the node was; its deletion takes the route with it.
        if let Some(node) = self.node(&pod.instance_id)
            && node.ns.links().await?.iter().any(|l| l.name == pod.host_if)
        {
            node.ns.ip(&["link", "del", &pod.host_if]).await?;
        }
        self.inner.spaces.delete(&pod.ns).await
    }

    /// Makes instance `instance_id`'s IMDS reachable inside its node at `http://169.254.169.254`,
    /// as on EC2, for a daemon run in the node namespace (`nsenter --net=<node ns>`): the address
    /// goes on the node's loopback and a [`PortForward`] relays port 80 to the instance's IMDS
    /// listener. Needs an in-process mockcloud ([`StateSource::InProcess`]).
    pub async fn expose_imds(&self, instance_id: &str) -> Result<PortForward, LabError> {
        let StateSource::InProcess(mock) = &self.inner.source else {
            return Err(LabError::Invalid(
                "expose_imds needs an in-process mockcloud; use PortForward::start with the IMDS address".into(),
            ));
        };
        let url = mock.imds_url(instance_id).ok_or_else(|| {
            LabError::NotFound(format!("mockcloud has no IMDS for {instance_id}"))
        })?;
        let target: SocketAddr = url
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .parse()
            .map_err(|e| LabError::CloudState(format!("IMDS url {url:?}: {e}")))?;
        let node = self
            .node(instance_id)
            .ok_or_else(|| LabError::NotFound(format!("no node for instance {instance_id}")))?;
        node.ns
            .ip(&["addr", "replace", &format!("{IMDS_ADDR}/32"), "dev", "lo"])
            .await?;
        PortForward::start(&node.ns, SocketAddr::from((IMDS_ADDR, 80)), target).await
    }

    /// A further empty namespace owned by the lab (deleted with it), e.g. for a runtime's pods.
    pub async fn add_namespace(&self, tag: &str) -> Result<NetNs, LabError> {
        if tag.is_empty() || !tag.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
            return Err(LabError::Invalid(format!(
                "namespace tag {tag:?}: use letters, digits and '-'"
            )));
        }
        let idx = {
            let mut a = self.inner.applied.lock().expect("applied lock");
            a.next_extra += 1;
            a.next_extra
        };
        let ns = self
            .inner
            .spaces
            .create(format!("{}-x{idx}-{tag}", self.inner.name))
            .await?;
        ns.ip(&["link", "set", "lo", "up"]).await?;
        Ok(ns)
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
        })
        .collect();
    links.sort_by_key(|l| (l.network_card_index, l.device_index));
    Node {
        instance_id: instance_id.to_owned(),
        ns: rec.ns.clone(),
        primary_ip: rec.plan.primary_ip,
        subnet: rec.plan.subnet,
        router: rec.plan.router,
        links,
    }
}

/// The transit links and routes between vpc, gateways and internet.
async fn wire_gateways(
    vpc: &NetNs,
    igw: &NetNs,
    internet: &NetNs,
    natgw: Option<&NetNs>,
    vpc_cidr: Ipv4Net,
) -> Result<(), LabError> {
    let mut v = vec![
        "link set lo up".to_owned(),
        format!("link add {SINK} type veth peer name {SINK}-rx"),
        format!("link set {SINK} up"),
        format!("link set {SINK}-rx up"),
        format!(
            "link add to-igw type veth peer name to-vpc netns {}",
            igw.name()
        ),
        format!("addr add {VPC_TO_IGW}/30 dev to-igw"),
        "link set to-igw up".to_owned(),
    ];
    let mut g = vec![
        "link set lo up".to_owned(),
        format!("addr add {IGW_TO_VPC}/30 dev to-vpc"),
        "link set to-vpc up".to_owned(),
        format!(
            "link add to-inet type veth peer name eth0 netns {}",
            internet.name()
        ),
        format!("addr add {IGW_INTERNET_IP}/{INTERNET_PREFIX} dev to-inet"),
        "link set to-inet up".to_owned(),
    ];
    if let Some(nat) = natgw {
        v.extend([
            format!(
                "link add to-natgw type veth peer name to-vpc netns {}",
                nat.name()
            ),
            format!("addr add {VPC_TO_NAT}/30 dev to-natgw"),
            "link set to-natgw up".to_owned(),
        ]);
        g.extend([
            format!(
                "link add to-natgw type veth peer name to-igw netns {}",
                nat.name()
            ),
            format!("addr add {IGW_NAT_SIDE_IP}/{NAT_PUBLIC_PREFIX} dev to-natgw"),
            "link set to-natgw up".to_owned(),
        ]);
    }
    vpc.ip_batch(&v).await?;
    igw.ip_batch(&g).await?;
    internet
        .ip_batch(&[
            "link set lo up".into(),
            format!("addr add {INTERNET_SERVER}/{INTERNET_PREFIX} dev eth0"),
            "link set eth0 up".into(),
            format!("route add default via {IGW_INTERNET_IP}"),
        ])
        .await?;
    if let Some(nat) = natgw {
        nat.ip_batch(&[
            "link set lo up".into(),
            format!("addr add {NAT_TO_VPC}/30 dev to-vpc"),
            "link set to-vpc up".into(),
            format!("addr add {NAT_GATEWAY_PUBLIC_IP}/{NAT_PUBLIC_PREFIX} dev to-igw"),
            "link set to-igw up".into(),
            format!("route add {vpc_cidr} via {VPC_TO_NAT}"),
            format!("route add default via {IGW_NAT_SIDE_IP}"),
        ])
        .await?;
    }
    igw.ip_batch(&[format!("route add {vpc_cidr} via {VPC_TO_IGW}")])
        .await?;
    let default_via = if natgw.is_some() {
        NAT_TO_VPC
    } else {
        IGW_TO_VPC
    };
    vpc.ip_batch(&[
        // More specific /32 and /28 routes to ENIs win; the rest of the VPC is dropped and counted.
        format!("route add {vpc_cidr} dev {SINK}"),
        format!("route add default via {default_via}"),
    ])
    .await
}

impl Inner {
    async fn sync(&self) -> Result<SyncReport, LabError> {
        let _one_at_a_time = self.sync_lock.lock().await;
        let state = self.source.fetch().await?;
        let plan = plan::plan(&state, &self.vpc_id)?;
        let mut report = SyncReport::default();
        self.remove_stale(&plan, &mut report).await?;
        self.add_nodes(&plan, &mut report).await?;
        self.add_links(&plan, &mut report).await?;
        self.apply_routes(&mut report).await?;
        self.apply_srcdst().await?;
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

    /// A veth pair per newly attached ENI: `eth<N>` with the ENI's MAC in the node (as EC2 hot-plugs
    /// it), the other end in the vpc namespace answering ARP by proxy. eth0 is configured as the
    /// OS's DHCP client would (primary IP with the subnet's prefix, default route via the VPC
    /// router); secondary ENI links stay down and bare: the daemon configures them.
    async fn add_links(&self, plan: &Plan, report: &mut SyncReport) -> Result<(), LabError> {
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
            return Ok(());
        }
        let mtu = self.config.eni_mtu;
        let result = async {
            let creates: Vec<String> = new
                .iter()
                .map(|(_, p, vif, node_ns)| {
                    format!(
                        "link add {vif} mtu {mtu} type veth peer name {} address {} mtu {mtu} netns {}",
                        p.node_ifname(),
                        p.mac,
                        node_ns.name()
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
                })
                .collect();
            self.vpc.ip_batch(&ups).await?;
            for (_, p, _, node_ns) in &new {
                if p.network_card_index == 0 && p.device_index == 0 {
                    let ifname = p.node_ifname();
                    node_ns
                        .ip_batch(&[
                            format!("link set {ifname} up"),
                            format!(
                                "addr add {}/{} dev {ifname}",
                                p.primary_ip,
                                p.subnet.prefix_len()
                            ),
                            format!(
                                "route add default via {} dev {ifname}",
                                plan::subnet_router(p.subnet)
                            ),
                        ])
                        .await?;
                }
            }
            Ok::<(), LabError>(())
        };
        if let Err(e) = result.await {
            let vifs: Vec<String> = new.iter().map(|(_, _, v, _)| v.clone()).collect();
            let _ = self.delete_vifs(&vifs).await;
            return Err(e);
        }
        let mut a = self.applied.lock().expect("applied lock");
        for (eni, p, vif, _) in new {
            a.links.insert(
                eni.clone(),
                LinkRec {
                    vif,
                    plan: p,
                    routes: BTreeSet::new(),
                },
            );
            report.links_added.push(eni);
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
            let desired: BTreeMap<String, BTreeSet<Ipv4Net>> = a
                .links
                .values()
                .map(|l| (l.vif.clone(), l.routes.clone()))
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
