//! The NFLOG group read over netlink (`NETLINK_NETFILTER`, subsystem `NFNL_SUBSYS_ULOG`): the
//! group bound ([`NflogSocket::bind`]), and each packet's log prefix and IP header read
//! ([`parse_packets`]), with `eniipam_netfilter::nfnetlink`'s framing.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use netlink_sys::{AsyncSocket, AsyncSocketExt, TokioSocket, protocols::NETLINK_NETFILTER};

use super::Flow;
use eniipam_netfilter::nfnetlink::{
    NFGEN, NLM_F_ACK, NLM_F_REQUEST, attr, attributes, message, messages, request,
};

/// `NFNL_SUBSYS_ULOG << 8`.
const ULOG: u16 = 4 << 8;
const MSG_PACKET: u16 = ULOG;
const MSG_CONFIG: u16 = ULOG | 1;
const ATTR_PAYLOAD: u16 = 9;
const ATTR_PREFIX: u16 = 10;
const CFG_CMD: u16 = 1;
const CFG_MODE: u16 = 2;
const CFG_QTHRESH: u16 = 5;
const CMD_BIND: u8 = 1;
const COPY_PACKET: u8 = 2;
/// Bytes of each packet copied: the IP header and the ports, with room for IPv6's.
const COPY_RANGE: u32 = 128;

/// One logged packet: its prefix and, when its IP header could be read, its flow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Logged {
    pub prefix: String,
    pub flow: Option<Flow>,
}

/// A netlink socket bound to one NFLOG group.
pub struct NflogSocket {
    socket: TokioSocket,
}

impl NflogSocket {
    /// Binds `group` (copying each packet's first bytes, each sent at once). Fails with the
    /// kernel's error: `EBUSY` when another process (another daemon, `ulogd`) holds the group,
    /// `EPERM` without `CAP_NET_ADMIN`.
    pub async fn bind(group: u16) -> io::Result<Self> {
        let mut socket = TokioSocket::new(NETLINK_NETFILTER)?;
        socket.socket_mut().bind_auto()?;
        // Bursts of denials must not overflow the socket between reads.
        socket.socket_mut().set_rx_buf_sz(4 << 20)?;
        let mut me = Self { socket };
        me.configure(group, 1, &attr(CFG_CMD, &[CMD_BIND])).await?;
        let mut mode = COPY_RANGE.to_be_bytes().to_vec();
        mode.extend([COPY_PACKET, 0]);
        me.configure(group, 2, &attr(CFG_MODE, &mode)).await?;
        me.configure(group, 3, &attr(CFG_QTHRESH, &1u32.to_be_bytes()))
            .await?;
        Ok(me)
    }

    async fn configure(&mut self, group: u16, seq: u32, attrs: &[u8]) -> io::Result<()> {
        // AF_UNSPEC, the group as the resource.
        let msg = message(
            MSG_CONFIG,
            NLM_F_REQUEST | NLM_F_ACK,
            seq,
            (0, group),
            attrs,
        );
        request(&mut self.socket, seq, &msg).await
    }

    /// The next batch of logged packets. `ENOBUFS` (the socket overflowed: packets were lost) is
    /// returned as an error the caller may count and go on from.
    pub async fn next(&mut self) -> io::Result<Vec<Logged>> {
        let (data, _) = self.socket.recv_from_full().await?;
        Ok(parse_packets(&data))
    }
}

/// The packets of an NFLOG datagram (others, and packets without a prefix, are skipped).
pub fn parse_packets(data: &[u8]) -> Vec<Logged> {
    let mut out = Vec::new();
    for (kind, _, body) in messages(data) {
        if kind != MSG_PACKET || body.len() < NFGEN {
            continue;
        }
        let mut prefix = None;
        let mut flow = None;
        for (kind, _, value) in attributes(&body[NFGEN..]) {
            match kind {
                ATTR_PREFIX => {
                    let text = value.split(|b| *b == 0).next().unwrap_or_default();
                    prefix = Some(String::from_utf8_lossy(text).into_owned());
                }
                ATTR_PAYLOAD => flow = read_flow(value),
                _ => {}
            }
        }
        if let Some(prefix) = prefix {
            out.push(Logged { prefix, flow });
        }
    }
    out
}

/// An IP packet's addresses, protocol and ports (`None`: not IPv4 or IPv6, or cut short).
pub fn read_flow(packet: &[u8]) -> Option<Flow> {
    let (src, dst, protocol, l4): (IpAddr, IpAddr, u8, Option<&[u8]>) = match packet.first()? >> 4 {
        4 => {
            let ihl = usize::from(packet[0] & 0x0f) * 4;
            let head = packet.get(..20)?;
            let src = Ipv4Addr::from(<[u8; 4]>::try_from(&head[12..16]).ok()?);
            let dst = Ipv4Addr::from(<[u8; 4]>::try_from(&head[16..20]).ok()?);
            // A later fragment carries no ports.
            let first_fragment = u16::from_be_bytes([head[6], head[7]]) & 0x1fff == 0;
            let l4 = first_fragment.then(|| packet.get(ihl..)).flatten();
            (src.into(), dst.into(), head[9], l4)
        }
        6 => {
            let head = packet.get(..40)?;
            let src = Ipv6Addr::from(<[u8; 16]>::try_from(&head[8..24]).ok()?);
            let dst = Ipv6Addr::from(<[u8; 16]>::try_from(&head[24..40]).ok()?);
            (src.into(), dst.into(), head[6], packet.get(40..))
        }
        _ => return None,
    };
    let ports = match (protocol, l4) {
        (6 | 17 | 132, Some(l4)) if l4.len() >= 4 => Some((
            u16::from_be_bytes([l4[0], l4[1]]),
            u16::from_be_bytes([l4[2], l4[3]]),
        )),
        _ => None,
    };
    Some(Flow {
        src,
        dst,
        protocol,
        ports,
    })
}

#[cfg(test)]
pub(super) mod wire {
    //! NFLOG datagrams as the kernel writes them, for the tests.
    use super::*;

    /// An IPv4 TCP/UDP packet's first bytes.
    pub fn ipv4(src: [u8; 4], dst: [u8; 4], protocol: u8, sport: u16, dport: u16) -> Vec<u8> {
        let mut p = vec![0x45, 0, 0, 40, 0, 0, 0x40, 0, 64, protocol, 0, 0];
        p.extend(src);
        p.extend(dst);
        p.extend(sport.to_be_bytes());
        p.extend(dport.to_be_bytes());
        p.extend([0u8; 16]);
        p
    }

    /// One NFLOG packet message.
    pub fn packet(prefix: &str, payload: &[u8]) -> Vec<u8> {
        let mut body = attr(1, &[8, 0, 2, 0]); // packet header: ETH_P_IP, hook forward
        let mut p = prefix.as_bytes().to_vec();
        p.push(0);
        body.extend(attr(ATTR_PREFIX, &p));
        body.extend(attr(ATTR_PAYLOAD, payload));
        let mut m = message(MSG_PACKET, 0, 0, (2, 100), &body); // AF_INET, group 100
        m.resize(m.len().next_multiple_of(4), 0);
        m
    }
}
