//! A Service of the lab: a ClusterIP in a node's namespace sent on to one backend pod, the way
//! one of kube-proxy's modes does it ([`ServiceMode`]), TCP and UDP on the ports given.
//!
//! - [`ServiceMode::Dnat`] (kube-proxy's iptables and nftables modes): the ClusterIP is DNATed to
//!   the backend at prerouting, so the packet is routed on through the node's forward hook. A
//!   packet of the backend to itself is masqueraded, as kube-proxy does, so that its replies come
//!   back through the node.
//! - [`ServiceMode::LocalInOut`] (kube-proxy's IPVS mode): IPVS owns the ClusterIP as a local
//!   address (kube-proxy puts it on the `kube-ipvs0` dummy), takes the client's packet at
//!   local-in and sends it again through local-out to the backend, with the client's address as
//!   its source: it never traverses forward. The lab's kernel has no IPVS (`CONFIG_IP_VS` not
//!   set, and no module loading), so a transparent proxy in the node's namespace takes the same
//!   hooks: the ClusterIP is a local address (on `lo`: dummy links do not work here either), the
//!   proxy accepts the client's connection (or datagram) there, and opens its own to the backend
//!   from a socket with `IP_TRANSPARENT` bound to the client's address, which leaves through
//!   local-out with the pod's source. The backend's replies to that address would be routed to
//!   the client's veth; the TPROXY recipe delivers them to the proxy instead (`socket
//!   transparent 1 meta mark set` in prerouting, an `ip rule` for the mark, a `local` default
//!   route in its table). A packet of the backend to itself is masqueraded as in `Dnat` mode
//!   (kube-proxy's IPVS mode masquerades hairpin traffic too).
//!   What differs from IPVS: the proxy ends the client's TCP connection in the node (the
//!   client's handshake completes before the backend's; a probe must read the backend's answer),
//!   the backend sees a new source port, and the proxy's connection is its own conntrack entry.
//!   What a policy enforcer sees is the same: at input the client's packet to the ClusterIP, at
//!   output a new connection from the client's address to the backend's, no forward.
//!
//! Dropping a [`Service`] stops its proxy and removes what it added to the node.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use tokio::io::AsyncWriteExt;
use tokio::task::JoinHandle;

use crate::{LabError, NetNs};

/// How a [`Service`] reaches its backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServiceMode {
    /// DNAT at prerouting, then forward (kube-proxy's iptables and nftables modes).
    Dnat,
    /// Local-in, then a new packet through local-out with the client's source (IPVS).
    LocalInOut,
}

/// The mark and routing table of the TPROXY recipe ([`ServiceMode::LocalInOut`]).
const MARK: u32 = 0x1e1;
const TABLE: u32 = 481;

/// How long the proxy waits for the backend (a denied SYN or datagram gets no answer).
const BACKEND_WAIT: Duration = Duration::from_secs(2);

/// A ClusterIP of the lab, in one node. Removed when dropped.
pub struct Service {
    node: NetNs,
    mode: ServiceMode,
    cluster_ip: Ipv4Addr,
    table: String,
    tasks: Vec<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
}

impl Service {
    /// `cluster_ip` in `node`, sent to `backend` on `ports` (the same port numbers), TCP and UDP.
    /// Two Services of one node need distinct ClusterIPs.
    pub async fn start(
        node: &NetNs,
        mode: ServiceMode,
        cluster_ip: Ipv4Addr,
        backend: Ipv4Addr,
        ports: &[u16],
    ) -> Result<Service, LabError> {
        let table = format!("labsvc_{}", u32::from(cluster_ip));
        let mut service = Service {
            node: node.clone(),
            mode,
            cluster_ip,
            table: table.clone(),
            tasks: Vec::new(),
            stop: Arc::new(AtomicBool::new(false)),
        };
        let hairpin = format!(
            "chain hairpin {{
    type nat hook postrouting priority srcnat; policy accept;
    ip saddr {backend} ip daddr {backend} masquerade
  }}"
        );
        match mode {
            ServiceMode::Dnat => {
                node.nft(&format!(
                    "table ip {table} {{
  chain services {{
    type nat hook prerouting priority dstnat; policy accept;
    ip daddr {cluster_ip} dnat to {backend}
  }}
  {hairpin}
}}"
                ))
                .await?;
            }
            ServiceMode::LocalInOut => {
                node.ip(&["addr", "add", &format!("{cluster_ip}/32"), "dev", "lo"])
                    .await?;
                node.nft(&format!(
                    "table ip {table} {{
  chain divert {{
    type filter hook prerouting priority mangle; policy accept;
    socket transparent 1 meta mark set {MARK} accept
  }}
  {hairpin}
}}"
                ))
                .await?;
                // Shared by the node's Services: added once.
                let rules = node
                    .ip(&["rule", "list", "fwmark", &MARK.to_string()])
                    .await?;
                if rules.trim().is_empty() {
                    node.ip(&[
                        "rule",
                        "add",
                        "fwmark",
                        &MARK.to_string(),
                        "lookup",
                        &TABLE.to_string(),
                        "priority",
                        "100",
                    ])
                    .await?;
                    node.ip(&[
                        "route",
                        "replace",
                        "local",
                        "0.0.0.0/0",
                        "dev",
                        "lo",
                        "table",
                        &TABLE.to_string(),
                    ])
                    .await?;
                }
                for port in ports {
                    service.proxy(cluster_ip, backend, *port).await?;
                }
            }
        }
        Ok(service)
    }

    /// The Service's address.
    pub fn cluster_ip(&self) -> Ipv4Addr {
        self.cluster_ip
    }

    /// The proxy's TCP and UDP sockets on `port`, in the node.
    async fn proxy(
        &mut self,
        cluster_ip: Ipv4Addr,
        backend: Ipv4Addr,
        port: u16,
    ) -> Result<(), LabError> {
        let front = SocketAddr::from((cluster_ip, port));
        let (tcp, udp) = self
            .node
            .run_async(move || {
                let tcp = std::net::TcpListener::bind(front)?;
                tcp.set_nonblocking(true)?;
                let udp = std::net::UdpSocket::bind(front)?;
                udp.set_nonblocking(true)?;
                Ok::<_, std::io::Error>((tcp, udp))
            })
            .await?
            .map_err(|e| LabError::io(format!("the Service's proxy on {front}"), e))?;
        let tcp = tokio::net::TcpListener::from_std(tcp)
            .map_err(|e| LabError::io("the proxy's listener", e))?;
        let udp = Arc::new(
            tokio::net::UdpSocket::from_std(udp)
                .map_err(|e| LabError::io("the proxy's UDP socket", e))?,
        );
        let to = SocketAddrV4::new(backend, port);
        let node = self.node.clone();
        self.tasks.push(tokio::spawn(async move {
            while let Ok((client, from)) = tcp.accept().await {
                let node = node.clone();
                tokio::spawn(relay_tcp(node, client, from, to));
            }
        }));
        let node = self.node.clone();
        let stop = self.stop.clone();
        self.tasks.push(tokio::spawn(async move {
            let mut buf = [0u8; 2048];
            while let Ok((n, from)) = udp.recv_from(&mut buf).await {
                if stop.load(Ordering::Acquire) {
                    return;
                }
                let (node, udp, datagram) = (node.clone(), udp.clone(), buf[..n].to_vec());
                tokio::spawn(async move {
                    if let Some(reply) = relay_udp(&node, from, to, datagram).await {
                        let _ = udp.send_to(&reply, from).await;
                    }
                });
            }
        }));
        Ok(())
    }
}

/// The client's address as an IPv4 socket address (the lab's pods are IPv4 here).
fn client_v4(from: SocketAddr) -> Option<Ipv4Addr> {
    match from {
        SocketAddr::V4(a) => Some(*a.ip()),
        SocketAddr::V6(a) => a.ip().to_ipv4_mapped(),
    }
}

/// A socket in `node` with `IP_TRANSPARENT`, bound to `client`'s address (any port).
async fn transparent(node: &NetNs, client: Ipv4Addr, kind: Type) -> Option<Socket> {
    let protocol = if kind == Type::STREAM {
        Protocol::TCP
    } else {
        Protocol::UDP
    };
    node.run_async(move || {
        let s = Socket::new(Domain::IPV4, kind, Some(protocol))?;
        s.set_ip_transparent_v4(true)?;
        s.bind(&SockAddr::from(SocketAddrV4::new(client, 0)))?;
        Ok::<_, std::io::Error>(s)
    })
    .await
    .ok()?
    .ok()
}

/// One TCP connection: the backend's, from the client's address, joined to the client's.
async fn relay_tcp(
    node: NetNs,
    mut client: tokio::net::TcpStream,
    from: SocketAddr,
    to: SocketAddrV4,
) {
    let Some(ip) = client_v4(from) else {
        return;
    };
    let Some(socket) = transparent(&node, ip, Type::STREAM).await else {
        return;
    };
    let connected = tokio::task::spawn_blocking(move || {
        socket.connect_timeout(&SockAddr::from(to), BACKEND_WAIT)?;
        socket.set_nonblocking(true)?;
        Ok::<_, std::io::Error>(std::net::TcpStream::from(socket))
    })
    .await;
    let Ok(Ok(backend)) = connected else {
        // Denied (or refused): the client's connection ends without an answer.
        let _ = client.shutdown().await;
        return;
    };
    let Ok(mut backend) = tokio::net::TcpStream::from_std(backend) else {
        return;
    };
    let _ = tokio::io::copy_bidirectional(&mut client, &mut backend).await;
}

/// One datagram to the backend, from the client's address; its answer, if one comes.
async fn relay_udp(
    node: &NetNs,
    from: SocketAddr,
    to: SocketAddrV4,
    datagram: Vec<u8>,
) -> Option<Vec<u8>> {
    let socket = transparent(node, client_v4(from)?, Type::DGRAM).await?;
    socket.set_nonblocking(true).ok()?;
    let socket = tokio::net::UdpSocket::from_std(socket.into()).ok()?;
    socket.send_to(&datagram, SocketAddr::V4(to)).await.ok()?;
    let mut buf = [0u8; 2048];
    let (n, _) = tokio::time::timeout(BACKEND_WAIT, socket.recv_from(&mut buf))
        .await
        .ok()?
        .ok()?;
    Some(buf[..n].to_vec())
}

impl Drop for Service {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        for task in &self.tasks {
            task.abort();
        }
        if !self.node.is_alive() {
            return;
        }
        let table = self.table.clone();
        let lo = (self.mode == ServiceMode::LocalInOut).then(|| format!("{}/32", self.cluster_ip));
        // Best effort, as the lab's own teardown: the namespace goes with the lab anyway.
        let _ = self.node.run(move || {
            let _ = std::process::Command::new("nft")
                .args(["delete", "table", "ip", &table])
                .status();
            if let Some(addr) = lo {
                let _ = std::process::Command::new("ip")
                    .args(["addr", "del", &addr, "dev", "lo"])
                    .status();
            }
        });
    }
}
