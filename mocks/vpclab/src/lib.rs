//! vpclab: an emulated EC2 VPC in Linux network namespaces, for testing a node's data path
//! without EC2. Test support only: never a normal dependency of anything shipped.
//!
//! A [`Lab`] follows a mockcloud ([`mockcloud::MockCloud`] in process, or its control API):
//! - one **vpc** namespace playing the VPC's routers: it routes every address (primary, secondary,
//!   /28 prefix) to the veth of the ENI holding it in mockcloud, delivering to the ENI's MAC (a
//!   permanent neighbour, as EC2's hypervisor does: a node never has to answer ARP for a pod's
//!   address), answers ARP for each subnet's router
//!   (first address + 1) and, by proxy, for any VPC address, and enforces EC2's
//!   **source/destination check** with nftables (a drop counter per ENI: [`Lab::src_dst_drops`]);
//!   packets to VPC addresses no ENI holds are dropped and counted ([`Lab::unassigned_drops`]).
//!   Every IPv4 block of the VPC counts alike: secondary blocks (e.g. 100.64.0.0/16 for custom
//!   networking, associated before [`Lab::start`]) are routed, sunk and NATed as the primary;
//! - a **node** namespace per running instance; each attached ENI is a veth pair whose node end is
//!   `eth<device index>` with the ENI's MAC (EC2 names them `ens5`… on AL2023; the lab uses
//!   `eth<N>`). eth0 comes up configured as DHCP would leave it; secondary ENI links appear down and
//!   bare, for the daemon to configure;
//! - an **igw** namespace in front of an **internet** namespace holding [`INTERNET_SERVER`]; the IGW
//!   passes only addresses with a public IP. [`Egress::NatGateway`] puts a masquerading **natgw**
//!   namespace between the VPC and the IGW (the private-subnet variant);
//! - **IPv6** when the VPC's subnets have /64s: the same router routes every IPv6 address and /80
//!   prefix to its ENI, answers nodes at [`VPC_ROUTER_V6`], checks IPv6 sources and sinks
//!   unassigned IPv6 destinations; the igw namespace doubles as an **egress-only internet
//!   gateway** in front of [`INTERNET_SERVER_V6`] (see `lab/ipv6.rs`).
//!
//! [`Lab::sync`] (or [`Lab::follow`] in the background) applies mockcloud's changes: instances
//! launched or terminated, ENIs attached (the link appears in the node, as EC2 hot-plugs it) or
//! detached, addresses assigned or unassigned. [`traffic`] has a TCP echo server and client that
//! run inside any lab namespace and report the source address the server saw, and a port forward
//! that lets a process inside a node reach mockcloud ([`Lab::expose_imds`]). Dropping the lab
//! deletes every namespace, veth and echo server it made, also when a test panics;
//! [`remove_stale_namespaces`] sweeps what a killed test process left.
//!
//! Tools: `ip` (iproute2), `nft` (nftables), `nsenter` (util-linux); sysctls are written as files
//! from a thread inside the namespace. Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN for `setns`).
//!
//! Modules:
//! - [`lab`]: [`Lab`], its configuration, nodes, pods by hand, counters, sync and teardown;
//! - [`state`]: mockcloud's state as the lab reads it (the adapter for prefixes and network cards);
//! - `plan`: the fabric wanted for one state (pure);
//! - `nft`: the nftables rulesets;
//! - [`netns`]: named namespaces, tools and code run inside them;
//! - [`traffic`]: the echo server and client, the port forward into a namespace;
//! - [`raw`]: a datagram sent with a source that is not the sender's (a pod's raw socket);
//! - [`service`]: a ClusterIP in a node, in kube-proxy's DNAT way or IPVS's local-in/local-out
//!   way (a transparent proxy: the lab's kernel has no IPVS);
//! - [`error`]: the error type, [`LabError`].

pub mod error;
pub mod lab;
pub mod netns;
mod nft;
mod plan;
pub mod raw;
pub mod service;
pub mod state;
pub mod traffic;

pub use error::LabError;
pub use lab::{
    Egress, Follower, IMDS_ADDR, INTERNET_SERVER, INTERNET_SERVER_V6, IgwDrops, Lab, LabConfig,
    NAT_GATEWAY_PUBLIC_IP, Node, NodeLink, POD_GATEWAY, POD_GATEWAY_V6, Pod, Pod6, SyncReport,
    VPC_ROUTER_V6,
};
pub use netns::{Link, NetNs, Route, Route6, RouteDst};
pub use plan::{node_ifname, subnet_router};
pub use state::{CloudState, StateSource};
pub use traffic::{EchoError, EchoOptions, EchoReply, EchoServer, PortForward, echo};

/// Deletes namespaces left by labs whose process is gone (a test killed before its `Drop` ran):
/// every `/run/netns/vpclab-<pid>-…` whose `<pid>` no longer exists. Returns what it deleted.
pub fn remove_stale_namespaces() -> Result<Vec<String>, LabError> {
    let dir = match std::fs::read_dir("/run/netns") {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(LabError::io("listing /run/netns", e)),
    };
    let mut stale = Vec::new();
    for entry in dir {
        let name = entry
            .map_err(|e| LabError::io("listing /run/netns", e))?
            .file_name()
            .to_string_lossy()
            .into_owned();
        let Some(pid) = name
            .strip_prefix("vpclab-")
            .and_then(|r| r.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            stale.push(name);
        }
    }
    netns::delete_blocking(&stale)
        .map_err(|e| LabError::io("deleting stale namespaces", std::io::Error::other(e)))?;
    Ok(stale)
}
