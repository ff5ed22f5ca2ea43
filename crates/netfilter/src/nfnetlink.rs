//! The framing of netfilter's netlink messages (`NETLINK_NETFILTER`): a message, its attributes,
//! and the walk over a datagram's messages and a body's attributes. Shared by the daemon's `host::conntrack`
//! and the decision log's NFLOG reader (`eniipam-netpol`'s `decisions`); the messages are few
//! and fixed, so they are written here over `netlink-sys`'s socket rather than through another
//! crate (`netlink-packet-netfilter` is built on an older `netlink-packet-core` than the one the
//! daemon links, and has no conntrack messages).

use std::io;

use netlink_sys::{AsyncSocketExt, TokioSocket};

/// `struct nlmsghdr`'s size.
pub const HEADER: usize = 16;
/// `struct nfgenmsg`'s size (family, version, resource id), after the netlink header.
pub const NFGEN: usize = 4;
pub const NLMSG_ERROR: u16 = 2;
pub const NLMSG_DONE: u16 = 3;
pub const NLM_F_REQUEST: u16 = 1;
pub const NLM_F_ACK: u16 = 4;
pub const NLM_F_DUMP: u16 = 0x300;

/// A netlink attribute, padded to 4 bytes.
pub fn attr(kind: u16, value: &[u8]) -> Vec<u8> {
    let len = 4 + value.len();
    let mut out = Vec::with_capacity(len.next_multiple_of(4));
    out.extend((len as u16).to_ne_bytes());
    out.extend(kind.to_ne_bytes());
    out.extend(value);
    out.resize(len.next_multiple_of(4), 0);
    out
}

/// A netlink message of netfilter: header, `nfgenmsg` (`family`, version 0, `res_id`), body.
pub fn message(
    kind: u16,
    flags: u16,
    seq: u32,
    (family, res_id): (u8, u16),
    body: &[u8],
) -> Vec<u8> {
    let len = (HEADER + NFGEN + body.len()) as u32;
    let mut out = Vec::with_capacity(len as usize);
    out.extend(len.to_ne_bytes());
    out.extend(kind.to_ne_bytes());
    out.extend(flags.to_ne_bytes());
    out.extend(seq.to_ne_bytes());
    out.extend(0u32.to_ne_bytes());
    out.extend([family, 0]);
    out.extend(res_id.to_be_bytes());
    out.extend(body);
    out
}

/// The messages of a datagram: type, flags, body (a truncated one ends the walk).
pub fn messages(data: &[u8]) -> impl Iterator<Item = (u16, u16, &[u8])> {
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

/// The attributes of a body: type (flags masked off), the whole attribute's bytes, its value.
pub fn attributes(mut rest: &[u8]) -> impl Iterator<Item = (u16, &[u8], &[u8])> {
    std::iter::from_fn(move || {
        if rest.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes(rest[..2].try_into().ok()?) as usize;
        if len < 4 || len > rest.len() {
            return None;
        }
        let kind = u16::from_ne_bytes(rest[2..4].try_into().ok()?) & 0x3fff;
        let whole = &rest[..len];
        let value = &rest[4..len];
        rest = &rest[len.next_multiple_of(4).min(rest.len())..];
        Some((kind, whole, value))
    })
}

/// The error code of an `NLMSG_ERROR` body (0: an acknowledgement).
pub fn error_code(body: &[u8]) -> Option<i32> {
    Some(i32::from_ne_bytes(body.get(..4)?.try_into().ok()?))
}

/// Sends `msg` (asking for an acknowledgement) and waits for the answer to `seq`: `Ok` or the
/// kernel's error.
pub async fn request(socket: &mut TokioSocket, seq: u32, msg: &[u8]) -> io::Result<()> {
    socket.send(msg).await?;
    loop {
        let (data, _) = socket.recv_from_full().await?;
        for (kind, _, body) in messages(&data) {
            let answered = body.len() >= 4 + 12
                && u32::from_ne_bytes(body[4 + 8..4 + 12].try_into().expect("4 bytes")) == seq;
            if kind == NLMSG_ERROR && answered {
                return match error_code(body) {
                    Some(0) => Ok(()),
                    Some(code) => Err(io::Error::from_raw_os_error(-code)),
                    None => Err(io::Error::other("a short netlink error message")),
                };
            }
        }
    }
}
