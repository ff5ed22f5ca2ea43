//! Datagrams to and from pods for the data-path policy tests: a recorder in a pod, a sender from
//! one of its addresses, and what the recorder got within a wait.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use vpclab::NetNs;

/// A UDP socket on `port` in `ns` whose datagrams' payloads are sent to the receiver.
pub async fn record_udp(
    ns: &NetNs,
    port: u16,
) -> (
    tokio::task::JoinHandle<()>,
    tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>,
) {
    let socket = ns
        .run_async(move || std::net::UdpSocket::bind(("0.0.0.0", port)).expect("udp bind"))
        .await
        .expect("a socket in the pod");
    socket.set_nonblocking(true).expect("nonblocking");
    let socket = tokio::net::UdpSocket::from_std(socket).expect("tokio socket");
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        let mut buf = [0u8; 64];
        while let Ok((n, _)) = socket.recv_from(&mut buf).await {
            let _ = tx.send(buf[..n].to_vec());
        }
    });
    (task, rx)
}

/// Sends `count` datagrams `payload` from `from` (an address of `ns`) to `to`.
pub async fn send_udp(
    ns: &NetNs,
    from: Ipv4Addr,
    to: SocketAddr,
    payload: &'static [u8],
    count: u32,
) {
    ns.run_async(move || {
        let s = std::net::UdpSocket::bind((from, 0)).expect("udp bind");
        for _ in 0..count {
            s.send_to(payload, to).expect("send");
        }
    })
    .await
    .expect("a socket in the pod");
}

/// What datagrams `rx` holds within `wait`.
pub async fn received(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>,
    wait: Duration,
) -> Vec<Vec<u8>> {
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + wait;
    while let Ok(Some(d)) = tokio::time::timeout_at(deadline, rx.recv()).await {
        got.push(d);
    }
    got
}
