//! SCTP probes without an SCTP stack (issue 47, case 8).
//!
//! The lab's kernel has no SCTP sockets (`CONFIG_IP_SCTP` is not set, and it loads no modules), but
//! conntrack and nftables know SCTP (`sctp dport`, conntrack's SCTP state machine) and raw sockets
//! of protocol 132 work. So a probe is the first packet of an association, as a client's kernel
//! would send it, and the server's side is the packet's arrival:
//! - the client sends an SCTP `INIT` chunk (verification tag 0, a random initiate tag, a source
//!   port of its own; the CRC32c checksum right, since conntrack checks it on the way) on a raw
//!   `IPPROTO_SCTP` socket made in its namespace ([`send_init`]);
//! - each server namespace has a raw `IPPROTO_SCTP` socket ([`InitListener`]) that records every
//!   `INIT` it receives (a raw socket sees every packet of its protocol delivered to the
//!   namespace; with it open, the kernel sends no protocol-unreachable either);
//! - the probe connects when the listener of the server records that `INIT` (source port,
//!   destination port, initiate tag) within the probe's window, and is denied when it does not.
//!
//! A policy decides on a connection's first packet (`ct state new`); an `INIT` is that packet, so
//! what passes it is what an SCTP stack's association would have got. The replies an SCTP stack
//! would send (`INIT ACK`) follow the connection through conntrack, as TCP's and UDP's do.

#![allow(dead_code)] // each test binary uses its own part

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use nix::poll::{PollFd, PollFlags, poll};
use nix::sys::socket::{
    AddressFamily, MsgFlags, SockFlag, SockProtocol, SockType, SockaddrIn, SockaddrIn6, recv,
    sendto, socket,
};

/// One probe's `INIT`, as the listener knows it: (source port, destination port, initiate tag).
pub type InitKey = (u16, u16, u32);

/// CRC32c (Castagnoli, reflected 0x82F63B78), SCTP's checksum (RFC 9260, appendix A).
pub fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for byte in data {
        crc ^= u32::from(*byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// An SCTP packet of one `INIT` chunk from `src_port` to `dst_port` with initiate tag `tag`
/// (non-zero), its checksum filled in (stored little-endian, as Linux's `sctp_compute_cksum`).
pub fn init_packet(src_port: u16, dst_port: u16, tag: u32) -> Vec<u8> {
    assert_ne!(tag, 0, "an INIT's initiate tag is never 0");
    let mut p = Vec::with_capacity(32);
    // Common header: ports, verification tag 0 (an INIT's), checksum 0 until computed.
    p.extend_from_slice(&src_port.to_be_bytes());
    p.extend_from_slice(&dst_port.to_be_bytes());
    p.extend_from_slice(&0u32.to_be_bytes());
    p.extend_from_slice(&0u32.to_be_bytes());
    // INIT: type 1, flags 0, length 20; initiate tag, a_rwnd, streams out/in, initial TSN.
    p.extend_from_slice(&[1, 0]);
    p.extend_from_slice(&20u16.to_be_bytes());
    p.extend_from_slice(&tag.to_be_bytes());
    p.extend_from_slice(&65_535u32.to_be_bytes());
    p.extend_from_slice(&1u16.to_be_bytes());
    p.extend_from_slice(&1u16.to_be_bytes());
    p.extend_from_slice(&tag.wrapping_add(1).to_be_bytes());
    let sum = crc32c(&p);
    p[8..12].copy_from_slice(&sum.to_le_bytes());
    p
}

/// The `INIT` in an SCTP packet (no IP header): its key, when the packet is one `INIT` whose
/// checksum is right.
pub fn parse_init(sctp: &[u8]) -> Option<InitKey> {
    if sctp.len() < 32 || sctp[12] != 1 {
        return None;
    }
    let mut zeroed = sctp.to_vec();
    zeroed[8..12].fill(0);
    if crc32c(&zeroed).to_le_bytes() != sctp[8..12] {
        return None;
    }
    let port = |i: usize| u16::from_be_bytes([sctp[i], sctp[i + 1]]);
    let tag = u32::from_be_bytes([sctp[16], sctp[17], sctp[18], sctp[19]]);
    Some((port(0), port(2), tag))
}

/// A raw `IPPROTO_SCTP` socket in the calling thread's network namespace (it stays there).
pub fn raw_socket(v6: bool) -> OwnedFd {
    let family = if v6 {
        AddressFamily::Inet6
    } else {
        AddressFamily::Inet
    };
    socket(
        family,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::Sctp,
    )
    .expect("a raw IPPROTO_SCTP socket (CAP_NET_RAW)")
}

/// The next probe's source port and initiate tag: a cycle over 20000..60000 (no two probes of a
/// run share a conntrack entry) and a random tag.
pub fn next_probe() -> (u16, u32) {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let port = 20_000 + (NEXT.fetch_add(1, Ordering::Relaxed) % 40_000) as u16;
    (port, rand::random::<u32>() | 1)
}

/// Sends one `INIT` to `to` from `src_port` on a raw socket made in the calling thread's
/// namespace (the client's).
pub fn send_init(to: SocketAddr, src_port: u16, tag: u32) {
    let packet = init_packet(src_port, to.port(), tag);
    let fd = raw_socket(to.is_ipv6());
    // A raw socket's "port" is the protocol: the address alone says where.
    let sent = match to.ip() {
        IpAddr::V4(ip) => sendto(
            fd.as_raw_fd(),
            &packet,
            &SockaddrIn::from(std::net::SocketAddrV4::new(ip, 0)),
            MsgFlags::empty(),
        ),
        IpAddr::V6(ip) => sendto(
            fd.as_raw_fd(),
            &packet,
            &SockaddrIn6::from(std::net::SocketAddrV6::new(ip, 0, 0, 0)),
            MsgFlags::empty(),
        ),
    };
    sent.unwrap_or_else(|e| panic!("sending an SCTP INIT to {to}: {e}"));
}

/// Every `INIT` one server namespace receives, recorded by a thread reading its raw socket until
/// dropped.
pub struct InitListener {
    seen: Arc<(Mutex<HashSet<InitKey>>, Condvar)>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl InitListener {
    /// Listens on `fd`, a socket from [`raw_socket`] made in the server's namespace (`v6`: an
    /// IPv6 one, whose reads carry no IP header).
    pub fn start(fd: OwnedFd, v6: bool) -> InitListener {
        let seen: Arc<(Mutex<HashSet<InitKey>>, Condvar)> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (record, halt) = (seen.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut buf = [0u8; 2048];
            while !halt.load(Ordering::Acquire) {
                let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
                if poll(&mut fds, 20u16).unwrap_or(0) == 0 {
                    continue;
                }
                while let Ok(n) = recv(fd.as_raw_fd(), &mut buf, MsgFlags::MSG_DONTWAIT) {
                    // An IPv4 raw socket reads the IP header too.
                    let sctp = if v6 {
                        &buf[..n]
                    } else {
                        let ihl = usize::from(buf[0] & 0x0f) * 4;
                        &buf[ihl.min(n)..n]
                    };
                    if let Some(key) = parse_init(sctp) {
                        let (set, ready) = &*record;
                        set.lock().unwrap().insert(key);
                        ready.notify_all();
                    }
                }
            }
        });
        InitListener {
            seen,
            stop,
            thread: Some(thread),
        }
    }

    /// Whether the `INIT` `key` arrives within `wait` (or has arrived).
    pub fn received(&self, key: InitKey, wait: Duration) -> bool {
        let (set, ready) = &*self.seen;
        let guard = set.lock().unwrap();
        let (guard, _) = ready
            .wait_timeout_while(guard, wait, |s| !s.contains(&key))
            .unwrap();
        guard.contains(&key)
    }
}

impl Drop for InitListener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_is_castagnolis() {
        // RFC 3720, B.4: 32 bytes of zeros, and the ASCII digits' check value.
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    }

    #[test]
    fn an_init_parses_back_and_a_bad_checksum_does_not() {
        let mut p = init_packet(20_001, 80, 0xdead_beef);
        assert_eq!(parse_init(&p), Some((20_001, 80, 0xdead_beef)));
        p[20] ^= 1;
        assert_eq!(parse_init(&p), None);
    }
}
