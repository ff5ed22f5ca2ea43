//! A released pod address's conntrack entries deleted (issue 47, case 9): an established flow to
//! or from a deleted pod's address must not carry over to the next pod given that address (the
//! NetworkPolicy table accepts `ct state established` before any chain, and a UDP flow's entry
//! lives 30-180 s). Over ctnetlink (`NETLINK_NETFILTER`, subsystem `NFNL_SUBSYS_CTNETLINK`): the
//! family's table dumped, and every entry whose original or reply direction has the address at
//! either end deleted by its original tuple (and zone). A Service's flow DNATed to the pod has
//! it in its reply tuple; a SNATed one in its original.

use std::collections::BTreeSet;
use std::io;
use std::net::IpAddr;

use netlink_sys::{AsyncSocket, AsyncSocketExt, TokioSocket, protocols::NETLINK_NETFILTER};

use super::nfnetlink::{
    NFGEN, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NLMSG_DONE, NLMSG_ERROR, attributes, error_code,
    message, messages, request,
};

/// `NFNL_SUBSYS_CTNETLINK << 8`.
const CT: u16 = 1 << 8;
const MSG_NEW: u16 = CT;
const MSG_GET: u16 = CT | 1;
const MSG_DELETE: u16 = CT | 2;
const TUPLE_ORIG: u16 = 1;
const TUPLE_REPLY: u16 = 2;
const ZONE: u16 = 18;
const TUPLE_IP: u16 = 1;
const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;
const ENOENT: i32 = 2;

/// An entry to delete: its family and the attributes that name it (original tuple, zone), as the
/// kernel wrote them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub family: u8,
    pub key: Vec<u8>,
}

/// Deletes the conntrack entries of `ips` in this network namespace; returns how many went. An
/// entry that expired meanwhile is not an error.
pub async fn forget(ips: &[IpAddr]) -> io::Result<usize> {
    let mut socket = TokioSocket::new(NETLINK_NETFILTER)?;
    socket.socket_mut().bind_auto()?;
    let mut gone = 0;
    let mut seq = 0;
    for family in [AF_INET, AF_INET6] {
        let wanted: BTreeSet<IpAddr> = ips
            .iter()
            .filter(|ip| ip.is_ipv4() == (family == AF_INET))
            .copied()
            .collect();
        if wanted.is_empty() {
            continue;
        }
        seq += 1;
        let dump = message(MSG_GET, NLM_F_REQUEST | NLM_F_DUMP, seq, (family, 0), &[]);
        socket.send(&dump).await?;
        let mut entries = Vec::new();
        'dump: loop {
            let (data, _) = socket.recv_from_full().await?;
            for (kind, _, body) in messages(&data) {
                match kind {
                    NLMSG_DONE => break 'dump,
                    NLMSG_ERROR => match error_code(body) {
                        Some(0) | None => {}
                        Some(code) => return Err(io::Error::from_raw_os_error(-code)),
                    },
                    _ => entries.extend(matching(kind, body, &wanted)),
                }
            }
        }
        for entry in entries {
            seq += 1;
            let msg = message(
                MSG_DELETE,
                NLM_F_REQUEST | NLM_F_ACK,
                seq,
                (entry.family, 0),
                &entry.key,
            );
            match request(&mut socket, seq, &msg).await {
                Ok(()) => gone += 1,
                Err(e) if e.raw_os_error() == Some(ENOENT) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(gone)
}

/// [`forget`] for a released attachment (`what` names it): how it went is logged; a failure
/// leaves the release standing (the entries time out on their own).
pub async fn forget_released(what: &str, ips: &[IpAddr]) {
    if ips.is_empty() {
        return;
    }
    match forget(ips).await {
        Ok(0) => {}
        Ok(n) => tracing::debug!(
            attachment = what,
            ?ips,
            entries = n,
            "conntrack entries of a released address deleted"
        ),
        Err(e) => tracing::warn!(attachment = what, ?ips, error = %e,
            "cannot delete the conntrack entries of a released address; they time out on their own"),
    }
}

/// The entry a dumped message describes, if an end of either of its tuples is in `wanted`.
pub fn matching(kind: u16, body: &[u8], wanted: &BTreeSet<IpAddr>) -> Option<Entry> {
    if kind != MSG_NEW || body.len() < NFGEN {
        return None;
    }
    let family = body[0];
    let mut key = Vec::new();
    let mut hit = false;
    for (kind, whole, value) in attributes(&body[NFGEN..]) {
        match kind {
            TUPLE_ORIG | TUPLE_REPLY => {
                hit |= tuple_ends(value).iter().any(|ip| wanted.contains(ip));
                if kind == TUPLE_ORIG {
                    key.extend(whole);
                    key.resize(key.len().next_multiple_of(4), 0);
                }
            }
            ZONE => {
                key.extend(whole);
                key.resize(key.len().next_multiple_of(4), 0);
            }
            _ => {}
        }
    }
    (hit && !key.is_empty()).then_some(Entry { family, key })
}

/// The addresses of a tuple (`CTA_TUPLE_IP`'s source and destination).
fn tuple_ends(tuple: &[u8]) -> Vec<IpAddr> {
    let mut out = Vec::new();
    for (kind, _, value) in attributes(tuple) {
        if kind != TUPLE_IP {
            continue;
        }
        for (_, _, addr) in attributes(value) {
            if let Ok(a) = <[u8; 4]>::try_from(addr) {
                out.push(IpAddr::from(a));
            } else if let Ok(a) = <[u8; 16]>::try_from(addr) {
                out.push(IpAddr::from(a));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::nfnetlink::attr;
    use super::*;

    /// A dumped entry's body: nfgenmsg, original and reply tuples, a zone.
    fn entry(orig: ([u8; 4], [u8; 4]), reply: ([u8; 4], [u8; 4])) -> Vec<u8> {
        let tuple = |(src, dst): ([u8; 4], [u8; 4])| {
            let mut ip = attr(1, &src);
            ip.extend(attr(2, &dst));
            let mut t = attr(TUPLE_IP | 0x8000, &ip);
            t.extend(attr(2 | 0x8000, &attr(1, &[17]))); // CTA_TUPLE_PROTO: udp
            t
        };
        let mut body = vec![AF_INET, 0, 0, 0];
        body.extend(attr(TUPLE_ORIG | 0x8000, &tuple(orig)));
        body.extend(attr(TUPLE_REPLY | 0x8000, &tuple(reply)));
        body.extend(attr(ZONE, &[0, 0]));
        body
    }

    #[test]
    fn entries_with_the_address_at_any_end_are_chosen_by_their_original_tuple() {
        let (pod, peer, vip) = ([10, 0, 1, 5], [10, 0, 2, 9], [172, 20, 0, 10]);
        let wanted = BTreeSet::from([IpAddr::from(pod)]);
        // The pod as client; as server; behind a Service (DNAT: only the reply names it).
        for e in [
            entry((pod, peer), (peer, pod)),
            entry((peer, pod), (pod, peer)),
            entry((peer, vip), (pod, peer)),
        ] {
            let got = matching(MSG_NEW, &e, &wanted).expect("chosen");
            assert_eq!(got.family, AF_INET);
            // The original tuple and the zone, as written.
            let orig_len = u16::from_ne_bytes([e[4], e[5]]) as usize;
            assert_eq!(&got.key[..orig_len], &e[4..4 + orig_len]);
            assert_eq!(got.key.len(), orig_len + 8);
        }
        assert_eq!(
            matching(MSG_NEW, &entry((peer, vip), (vip, peer)), &wanted),
            None
        );
        assert_eq!(
            matching(MSG_DELETE, &entry((pod, peer), (peer, pod)), &wanted),
            None
        );
    }
}
