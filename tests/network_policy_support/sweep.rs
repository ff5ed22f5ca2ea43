//! Probing every cell of a matrix at once, and when to stop waiting for the silent ones.
//!
//! A denied cell is a SYN or datagram that gets no answer, so only a wait can show it. Waiting
//! [`PROBE_WAIT`] for every sweep made the wait most of the suite's time (issue 45): 1.5 s per
//! stage, hundreds of stages. A sweep instead waits as long as its own answers say the path
//! takes: all its probes start together, a pod's probe to itself always connects (the matrix
//! holds one per pod), and a cell the rules wrongly allowed would answer along the same path as
//! the allowed ones. So once the last answer has come, the sweep waits [`Sweep::settle`]: three
//! times as long as that answer took, and 250 ms more, at least 400 ms, never past [`PROBE_WAIT`];
//! then the probes still silent are denials. A loaded machine slows the answers and so lengthens
//! the wait with them; a sweep with no answer at all waits the whole [`PROBE_WAIT`]. The settle
//! counts from the last probe's first packet ([`Sweep::new`]): a probe whose thread a loaded
//! machine started late has had no chance to be answered before.

use std::collections::BTreeMap;
use std::io::{ErrorKind, Read};
use std::net::{IpAddr, SocketAddr, TcpStream, UdpSocket};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use tokio::time::Instant;

use eniipam::network_policy::Protocol;
use nix::poll::{PollFd, PollFlags, poll};
use socket2::{Domain, SockAddr, Socket, Type};

use super::PROBE_WAIT;
use super::sctp::{self, InitListener};

/// How often a waiting probe looks whether its sweep is over.
const SLICE: Duration = Duration::from_millis(20);

/// What the probes of one sweep share: when they started, how many have sent their first packet
/// and when the last of them did, and whether the sweep stopped waiting.
pub struct Sweep {
    start: Instant,
    over: AtomicBool,
    /// Probes that have not sent their first packet yet.
    unsent: AtomicUsize,
    /// When the latest probe sent its first packet, in µs after `start`.
    last_sent_us: AtomicU64,
}

impl Default for Sweep {
    fn default() -> Self {
        Self::new(0)
    }
}

impl Sweep {
    /// A sweep of `probes` probes. Its silence counts only once every one of them has sent: on a
    /// loaded machine a probe's thread may start late, and a probe not sent yet cannot have been
    /// answered (issue 45: labs side by side under a build left cells unsent past the settle).
    pub fn new(probes: usize) -> Self {
        Self {
            start: Instant::now(),
            over: AtomicBool::new(false),
            unsent: AtomicUsize::new(probes),
            last_sent_us: AtomicU64::new(0),
        }
    }

    /// A probe has sent its first packet: when, for [`Self::done`].
    fn sent(&self) -> Instant {
        let _ = self
            .unsent
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
        let at = u64::try_from(self.start.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.last_sent_us.fetch_max(at, Ordering::AcqRel);
        Instant::now()
    }

    /// Whether a probe that sent at `sent` and is still silent should give up: the sweep is over,
    /// or [`PROBE_WAIT`] passed since.
    fn done(&self, sent: Instant) -> bool {
        self.over.load(Ordering::Acquire) || sent.elapsed() >= PROBE_WAIT
    }

    /// How long after its last send a sweep waits when its last answer came `last` after the
    /// start (see the module docs).
    pub fn settle(last: Option<Duration>) -> Duration {
        match last {
            None => PROBE_WAIT,
            Some(t) => {
                (t * 3 + Duration::from_millis(250)).clamp(Duration::from_millis(400), PROBE_WAIT)
            }
        }
    }

    /// Collects the `total` results the sweep's probes send on `rx`, until all came or, once
    /// every probe has sent, the sweep has waited [`Self::settle`] after the last send; then ends
    /// the sweep (its silent probes give up within a [`SLICE`]) and runs `join`, which waits for
    /// every probe thread. A result that comes after the end is kept as it came: a probe that
    /// connected did connect.
    pub fn collect<K: Ord>(
        &self,
        rx: mpsc::Receiver<(K, bool)>,
        total: usize,
        join: impl FnOnce(),
    ) -> BTreeMap<K, bool> {
        let mut got = BTreeMap::new();
        let mut last = None;
        while got.len() < total {
            let unsent = self.unsent.load(Ordering::Acquire) > 0;
            let deadline = if unsent {
                Instant::now() + SLICE
            } else {
                let sent = Duration::from_micros(self.last_sent_us.load(Ordering::Acquire));
                self.start + sent + Self::settle(last)
            };
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                break;
            };
            match rx.recv_timeout(left) {
                Ok((key, ok)) => {
                    if ok {
                        last = Some(self.start.elapsed());
                    }
                    got.insert(key, ok);
                }
                Err(mpsc::RecvTimeoutError::Timeout) if unsent => {}
                Err(_) => break,
            }
        }
        self.over.store(true, Ordering::Release);
        join();
        got.extend(rx.try_iter());
        got
    }
}

/// One connection attempt from the calling thread's namespace, given up when `sweep` is over: a
/// TCP handshake and the server's line, or a UDP datagram echoed back from a source port of
/// `ports`. (SCTP: [`sctp_in`].)
pub fn probe_in(sweep: &Sweep, protocol: Protocol, to: SocketAddr, ports: &SourcePorts) -> bool {
    match protocol {
        Protocol::Tcp => tcp(sweep, to),
        Protocol::Udp => udp(sweep, to, ports),
        Protocol::Sctp => unreachable!("SCTP is probed by its INIT: sweep::sctp_in"),
    }
}

/// One SCTP probe: its `INIT` sent, and seen by `listener` before `sweep` is over.
pub fn sctp_in(sweep: &Sweep, listener: &InitListener, to: SocketAddr) -> bool {
    let (src_port, tag) = sctp::next_probe();
    sctp::send_init(to, src_port, tag);
    let sent = sweep.sent();
    let key = (src_port, to.port(), tag);
    loop {
        if listener.received(key, SLICE) {
            return true;
        }
        if sweep.done(sent) {
            return false;
        }
    }
}

/// Waits until `socket` is ready for `flags` or, for a probe that sent at `sent`, the sweep is
/// over (false).
fn ready(sweep: &Sweep, sent: Instant, socket: &impl AsFd, flags: PollFlags) -> bool {
    loop {
        let mut fds = [PollFd::new(socket.as_fd(), flags)];
        if poll(&mut fds, SLICE.as_millis() as u16).unwrap_or(0) > 0 {
            return true;
        }
        if sweep.done(sent) {
            return false;
        }
    }
}

fn tcp(sweep: &Sweep, to: SocketAddr) -> bool {
    let socket = Socket::new(Domain::for_address(to), Type::STREAM, None).expect("a TCP socket");
    socket.set_nonblocking(true).expect("non-blocking");
    let connecting = socket.connect(&SockAddr::from(to));
    let sent = sweep.sent();
    match connecting {
        Ok(()) => {}
        Err(e)
            if e.kind() == ErrorKind::WouldBlock
                || e.raw_os_error() == Some(nix::errno::Errno::EINPROGRESS as i32) => {}
        Err(_) => return false,
    }
    if !ready(sweep, sent, &socket, PollFlags::POLLOUT) {
        return false;
    }
    if !matches!(socket.take_error(), Ok(None)) {
        return false;
    }
    let mut stream: TcpStream = socket.into();
    let mut line = Vec::new();
    let mut buf = [0u8; 8];
    while line.len() < 3 {
        if !ready(sweep, sent, &stream, PollFlags::POLLIN) {
            return false;
        }
        match stream.read(&mut buf) {
            Ok(0) => return false,
            Ok(n) => line.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(_) => return false,
        }
    }
    line == b"ok\n"
}

fn udp(sweep: &Sweep, to: SocketAddr, ports: &SourcePorts) -> bool {
    let s = ports.bind(to.is_ipv6());
    s.set_read_timeout(Some(SLICE)).unwrap();
    s.connect(to).expect("udp connect");
    let _ = s.send(b"probe");
    let sent = sweep.sent();
    let mut buf = [0u8; 16];
    loop {
        match s.recv(&mut buf) {
            Ok(n) => return &buf[..n] == b"probe",
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                if sweep.done(sent) {
                    return false;
                }
            }
            Err(_) => return false,
        }
    }
}

/// A cycle of UDP source ports over 20000..60000, so no probe reuses a 5-tuple whose conntrack
/// entry (30 s for UDP) an earlier probe left, which would let a now-denied datagram through as
/// `established` (an ephemeral port can repeat within a run). A lab keeps one per client pod
/// ([`super::Lab`]): a client comes back to a port only after 40,000 probes of its own, however
/// fast the probes of all labs together go (labs run side by side, issue 45).
#[derive(Default)]
pub struct SourcePorts(AtomicUsize);

impl SourcePorts {
    pub const fn new() -> Self {
        Self(AtomicUsize::new(0))
    }

    /// A UDP client socket on the cycle's next free port.
    fn bind(&self, v6: bool) -> UdpSocket {
        let any: IpAddr = if v6 {
            std::net::Ipv6Addr::UNSPECIFIED.into()
        } else {
            std::net::Ipv4Addr::UNSPECIFIED.into()
        };
        for _ in 0..100 {
            let port = 20_000 + (self.0.fetch_add(1, Ordering::Relaxed) % 40_000) as u16;
            if let Ok(s) = UdpSocket::bind((any, port)) {
                return s;
            }
        }
        panic!("no free UDP source port in 100 tries")
    }
}

/// How long the node tries for a pod's first answer when a lab is made ([`warm_up`]); a
/// datagram held for an unanswered ARP or neighbour solicitation goes out with its retry (1 s).
const FIRST_CONTACT: Duration = Duration::from_secs(5);

/// Makes the node namespace `node` reach every one of `pods`' addresses once (a UDP echo, sent
/// again every 250 ms until answered), all at once, before any sweep: its first neighbour
/// resolution of a pod may wait for a retry (1 s), which would have a lab's first sweep count that
/// pod's cells as denied. UDP, so that no packet of it (a TCP close, a reset) is still on its way
/// once a test loads its table and reads its counters. Panics naming an address that did not
/// answer within [`FIRST_CONTACT`].
pub fn warm_up(node: &str, pods: Vec<SocketAddr>) {
    let node = node.to_owned();
    std::thread::spawn(move || {
        super::enter(&node);
        let reached: Vec<_> = pods
            .into_iter()
            .map(|to| std::thread::spawn(move || (to, echoed(to))))
            .collect();
        for r in reached {
            let (to, echoed) = r.join().expect("a first contact");
            assert!(echoed, "the node cannot reach pod address {to}");
        }
    })
    .join()
    .unwrap_or_else(|e| std::panic::resume_unwind(e));
}

/// Whether `to` echoes a datagram within [`FIRST_CONTACT`], from the calling thread's namespace.
fn echoed(to: SocketAddr) -> bool {
    let any: IpAddr = if to.is_ipv6() {
        std::net::Ipv6Addr::UNSPECIFIED.into()
    } else {
        std::net::Ipv4Addr::UNSPECIFIED.into()
    };
    let s = UdpSocket::bind((any, 0)).expect("a UDP socket in the node");
    s.set_read_timeout(Some(Duration::from_millis(250)))
        .unwrap();
    s.connect(to).expect("udp connect");
    let start = Instant::now();
    let mut buf = [0u8; 16];
    while start.elapsed() < FIRST_CONTACT {
        let _ = s.send(b"warm");
        if matches!(s.recv(&mut buf), Ok(n) if &buf[..n] == b"warm") {
            return true;
        }
    }
    false
}
