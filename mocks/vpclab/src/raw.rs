//! Packets whose source is not the sender's: what a pod with the default `NET_RAW` capability can
//! send through a raw socket (`IPPROTO_RAW`, the IPv4 header written by the sender). Run it inside
//! the sending namespace ([`crate::NetNs::run_async`]).

use std::io;
use std::net::SocketAddrV4;

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

/// `IPPROTO_RAW`: the socket sends whole IPv4 packets, header included.
const IPPROTO_RAW: i32 = 255;

/// Sends one UDP datagram `payload` to `to` with the IPv4 source `from` (any address: the kernel
/// routes it by its destination and keeps the header as written, but for its checksum).
pub fn send_udp_from(from: SocketAddrV4, to: SocketAddrV4, payload: &[u8]) -> io::Result<()> {
    let socket = Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::from(IPPROTO_RAW)))?;
    let udp_len = u16::try_from(8 + payload.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "payload too long"))?;
    let total = udp_len + 20;
    let mut packet = Vec::with_capacity(usize::from(total));
    // IPv4: version 4, 5 words of header; total length; id 0 (the kernel fills it); don't
    // fragment; TTL 64; UDP; checksum 0 (the kernel fills it).
    packet.extend([0x45, 0]);
    packet.extend(total.to_be_bytes());
    packet.extend([0, 0, 0x40, 0, 64, 17, 0, 0]);
    packet.extend(from.ip().octets());
    packet.extend(to.ip().octets());
    // UDP: checksum 0, none (allowed over IPv4).
    packet.extend(from.port().to_be_bytes());
    packet.extend(to.port().to_be_bytes());
    packet.extend(udp_len.to_be_bytes());
    packet.extend([0, 0]);
    packet.extend(payload);
    socket.send_to(&packet, &SockAddr::from(to))?;
    Ok(())
}
