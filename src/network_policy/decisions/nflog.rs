//! The NFLOG group read over netlink (`NETLINK_NETFILTER`, subsystem `NFNL_SUBSYS_ULOG`): the
//! group bound ([`NflogSocket::bind`]), and each packet's log prefix and IP header read
//! ([`parse_packets`]). The messages are few and fixed (`linux/netfilter/nfnetlink_log.h`), so
//! they are read here over `netlink-sys`'s socket rather than through another crate
//! (`netlink-packet-netfilter` is built on an older `netlink-packet-core` than the one the daemon
//! links).

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use netlink_sys::{AsyncSocket, AsyncSocketExt, TokioSocket, protocols::NETLINK_NETFILTER};

use super::Flow;

/// `NFNL_SUBSYS_ULOG << 8`.
const ULOG: u16 = 4 << 8;
const MSG_PACKET: u16 = ULOG;
const MSG_CONFIG: u16 = ULOG | 1;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const HEADER: usize = 16;
/// The netfilter header (`struct nfgenmsg`) after the netlink one.
const NFGEN: usize = 4;
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
        let mut body = vec![0u8, 0]; // AF_UNSPEC, NFNETLINK_V0
        body.extend(group.to_be_bytes());
        body.extend(attrs);
        let msg = message(MSG_CONFIG, NLM_F_REQUEST | NLM_F_ACK, seq, &body);
        self.socket.send(&msg).await?;
        loop {
            let (data, _) = self.socket.recv_from_full().await?;
            for (kind, _, payload) in messages(&data) {
                if kind == NLMSG_ERROR && payload.len() >= 4 {
                    let code = i32::from_ne_bytes(payload[..4].try_into().expect("4 bytes"));
                    return if code == 0 {
                        Ok(())
                    } else {
                        Err(io::Error::from_raw_os_error(-code))
                    };
                }
            }
        }
    }

    /// The next batch of logged packets. `ENOBUFS` (the socket overflowed: packets were lost) is
    /// returned as an error the caller may count and go on from.
    pub async fn next(&mut self) -> io::Result<Vec<Logged>> {
        let (data, _) = self.socket.recv_from_full().await?;
        Ok(parse_packets(&data))
    }
}

/// A netlink attribute, padded to 4 bytes.
fn attr(kind: u16, value: &[u8]) -> Vec<u8> {
    let len = 4 + value.len();
    let mut out = Vec::with_capacity(len.next_multiple_of(4));
    out.extend((len as u16).to_ne_bytes());
    out.extend(kind.to_ne_bytes());
    out.extend(value);
    out.resize(len.next_multiple_of(4), 0);
    out
}

/// A netlink message: header and body.
fn message(kind: u16, flags: u16, seq: u32, body: &[u8]) -> Vec<u8> {
    let len = (HEADER + body.len()) as u32;
    let mut out = Vec::with_capacity(len as usize);
    out.extend(len.to_ne_bytes());
    out.extend(kind.to_ne_bytes());
    out.extend(flags.to_ne_bytes());
    out.extend(seq.to_ne_bytes());
    out.extend(0u32.to_ne_bytes());
    out.extend(body);
    out
}

/// The messages of a datagram: type, flags, body (a truncated one ends the walk).
fn messages(data: &[u8]) -> impl Iterator<Item = (u16, u16, &[u8])> {
    let mut rest = data;
    std::iter::from_fn(move || {
        if rest.len() < HEADER {
            return None;
        }
        let len = u32::from_ne_bytes(rest[..4].try_into().ok()?) as usize;
        if len < HEADER || len > rest.len() {
            return None;
        }
        let kind = u16::from_ne_bytes(rest[4..6].try_into().ok()?);
        let flags = u16::from_ne_bytes(rest[6..8].try_into().ok()?);
        let body = &rest[HEADER..len];
        rest = &rest[len.next_multiple_of(4).min(rest.len())..];
        Some((kind, flags, body))
    })
}

/// The attributes of a body: type (flags masked off), value.
fn attributes(mut rest: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if rest.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes(rest[..2].try_into().ok()?) as usize;
        if len < 4 || len > rest.len() {
            return None;
        }
        let kind = u16::from_ne_bytes(rest[2..4].try_into().ok()?) & 0x3fff;
        let value = &rest[4..len];
        rest = &rest[len.next_multiple_of(4).min(rest.len())..];
        Some((kind, value))
    })
}

/// The packets of an NFLOG datagram (others, and packets without a prefix, are skipped).
pub fn parse_packets(data: &[u8]) -> Vec<Logged> {
    let mut out = Vec::new();
    for (kind, _, body) in messages(data) {
        if kind == NLMSG_DONE || kind != MSG_PACKET || body.len() < NFGEN {
            continue;
        }
        let mut prefix = None;
        let mut flow = None;
        for (kind, value) in attributes(&body[NFGEN..]) {
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
        let mut body = vec![2u8, 0, 0, 100]; // AF_INET, v0, group 100
        body.extend(attr(1, &[8, 0, 2, 0])); // packet header: ETH_P_IP, hook forward
        let mut p = prefix.as_bytes().to_vec();
        p.push(0);
        body.extend(attr(ATTR_PREFIX, &p));
        body.extend(attr(ATTR_PAYLOAD, payload));
        let mut m = message(MSG_PACKET, 0, 0, &body);
        m.resize(m.len().next_multiple_of(4), 0);
        m
    }
}
