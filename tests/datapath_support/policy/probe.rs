//! Probing the policy world's matrix: each probe a real connection attempt made from inside its
//! client pod's namespace, every probe of a round at once, and rounds until the matrix is the
//! model's.
//!
//! - **A sweep settles.** A denied cell is a SYN or datagram that gets no answer, so only a wait
//!   shows it. A sweep waits as long as its own answers say the path takes (as
//!   `network_policy_support::sweep` does): once the last answer has come, the silent probes get
//!   [`settle`] more, then count as denials. A cell wrongly allowed answers along the same paths as
//!   the allowed ones; a loaded machine slows the answers and so lengthens the wait with them.
//! - **A round starts once the daemons have synced** (issue 45). The daemons put a change in force
//!   asynchronously, so a round probed before they have is spent for nothing. [`synced_since`]
//!   waits for each daemon to count a sync after the change (its `/metrics`). That is no verdict,
//!   only when to look: the matrix probed is.
//! - **A round that cannot agree stops.** A cell the model denies that connects is a difference
//!   that no wait undoes, so the round ends there and the next starts (a daemon a change has not
//!   reached yet). The round that starts past the deadline is a whole one, and a failure names
//!   every cell it found differing.
//!
//! Each probe binds a source port of its own from its client's cycle of 40,000 ([`source_ports`]),
//! so no probe reuses a 5-tuple whose conntrack entry (30 s for UDP) a probe before a policy change
//! left: an entry of an allowed flow would let a now-denied one through as `established`.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Mutex;
use std::time::Duration;

use eniipam::network_policy::Protocol;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::io::AsyncReadExt;
use tokio::time::Instant;
use vpclab::NetNs;

use super::{PROBE_WAIT, PolicyDaemon, PolicyPod};

/// How long a one-shot probe to or from a pod just ADDed waits: the node resolves the new pod's
/// address on its host veth by ARP, and a first request sent while the veth comes up may go
/// unanswered until its retry (1 s), delaying the first packets of an allowed cell past
/// [`PROBE_WAIT`]. A denied cell has as long to leak.
pub const FIRST_PACKETS_WAIT: Duration = Duration::from_millis(2500);
/// How long [`synced_since`] waits at most for a daemon to count a sync: past it, the rounds
/// themselves wait for the change (a daemon whose sync the metrics do not show, say).
const SYNC_WAIT: Duration = Duration::from_secs(3);
/// How often [`synced_since`] reads the daemons' counters.
const SYNC_POLL: Duration = Duration::from_millis(40);
/// The pause after a round stopped on a difference, before the next: the daemons get the
/// machine's cores to put the change in force.
const RETRY_AFTER: Duration = Duration::from_millis(100);

/// The next `n` source ports of the client pod whose namespace is `ns`: each client has a cycle of
/// its own over 20000..60000, so it comes back to a 5-tuple only after 40,000 probes of its own,
/// however many labs probe side by side (a cycle shared by the process wrapped within the 30 s of
/// a UDP conntrack entry once labs ran together, issue 45).
fn source_ports(ns: &str, n: usize) -> Vec<u16> {
    static NEXT: Mutex<BTreeMap<String, u32>> = Mutex::new(BTreeMap::new());
    let mut next = NEXT.lock().unwrap_or_else(|p| p.into_inner());
    let at = next.entry(ns.to_owned()).or_default();
    (0..n)
        .map(|_| {
            let port = 20_000 + (*at % 40_000) as u16;
            *at += 1;
            port
        })
        .collect()
}

/// A client socket made in a pod's namespace, bound to its own source port.
enum ClientSocket {
    Tcp(tokio::net::TcpSocket),
    Udp(std::net::UdpSocket),
}

impl ClientSocket {
    /// Made on a thread inside the pod's namespace (the socket stays there).
    fn new(protocol: Protocol, port: u16) -> ClientSocket {
        let local = SocketAddr::from((Ipv4Addr::UNSPECIFIED, port));
        match protocol {
            Protocol::Tcp => {
                let s = tokio::net::TcpSocket::new_v4().expect("tcp socket");
                s.set_reuseaddr(true).expect("SO_REUSEADDR");
                s.bind(local).expect("tcp client bind");
                ClientSocket::Tcp(s)
            }
            Protocol::Udp => {
                let s = std::net::UdpSocket::bind(local).expect("udp client bind");
                s.set_nonblocking(true).expect("nonblocking");
                ClientSocket::Udp(s)
            }
            Protocol::Sctp => unreachable!("SCTP is not probed"),
        }
    }

    /// One attempt: a TCP handshake and the server's line, or a datagram echoed back, within `wait`.
    async fn probe(self, to: SocketAddr, wait: Duration) -> bool {
        let attempt = async move {
            match self {
                ClientSocket::Tcp(s) => {
                    let mut conn = s.connect(to).await?;
                    let mut line = [0u8; 3];
                    conn.read_exact(&mut line).await?;
                    Ok::<bool, std::io::Error>(&line == b"ok\n")
                }
                ClientSocket::Udp(s) => {
                    let s = tokio::net::UdpSocket::from_std(s)?;
                    s.connect(to).await?;
                    s.send(b"probe").await?;
                    let mut buf = [0u8; 16];
                    let n = s.recv(&mut buf).await?;
                    Ok(&buf[..n] == b"probe")
                }
            }
        };
        matches!(tokio::time::timeout(wait, attempt).await, Ok(Ok(true)))
    }
}

/// One probe from the pod whose namespace is `from` to any address (a Service's, say): the
/// handshake or the echo within [`PROBE_WAIT`].
pub async fn probe_address(from: &NetNs, to: SocketAddr, protocol: Protocol) -> bool {
    let port = source_ports(from.name(), 1)[0];
    let socket = from
        .run_async(move || ClientSocket::new(protocol, port))
        .await
        .expect("a client socket in the pod");
    socket.probe(to, PROBE_WAIT).await
}

/// One probe to run: from a client (its key), to a server (its key and address).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Cell {
    pub client: String,
    pub server: String,
    pub protocol: Protocol,
    pub port: u16,
}

/// One cell's probe under way: whether it connected. Dropped unfinished when its sweep ends.
pub type Probe = Pin<Box<dyn Future<Output = bool> + Send>>;

/// The TCP and UDP probes of `cells`, each waiting `wait` at most; the sockets are made per
/// client, on one thread inside its namespace, before any probe starts.
pub async fn socket_probes(
    pods: &BTreeMap<String, PolicyPod>,
    cells: &[Cell],
    wait: Duration,
) -> Vec<(Cell, Probe)> {
    let mut by_client: BTreeMap<&str, Vec<&Cell>> = BTreeMap::new();
    for cell in cells {
        by_client.entry(&cell.client).or_default().push(cell);
    }
    let made = futures::future::join_all(by_client.into_iter().map(|(client, cells)| {
        let ns = pods[client].cni.ns.clone();
        let protocols: Vec<(Protocol, u16)> = cells
            .iter()
            .map(|c| c.protocol)
            .zip(source_ports(ns.name(), cells.len()))
            .collect();
        async move {
            let sockets = ns
                .run_async(move || {
                    protocols
                        .into_iter()
                        .map(|(protocol, port)| ClientSocket::new(protocol, port))
                        .collect::<Vec<_>>()
                })
                .await
                .expect("client sockets in the pod");
            cells.into_iter().zip(sockets).collect::<Vec<_>>()
        }
    }))
    .await;
    made.into_iter()
        .flatten()
        .map(|(cell, socket)| {
            let to = SocketAddr::from((pods[&cell.server].cni.ip, cell.port));
            let probe: Probe = Box::pin(socket.probe(to, wait));
            (cell.clone(), probe)
        })
        .collect()
}

/// What one sweep found.
pub struct Swept {
    /// Each cell: connected or not (a probe the sweep did not wait out counts as not).
    pub got: BTreeMap<Cell, bool>,
    /// The sweep stopped at a cell the model denies that connected: the round cannot agree, and
    /// its other cells were not all waited out.
    pub cut: bool,
}

/// Runs `probes` at once as one sweep: until every one has finished, or the sweep has waited
/// [`settle`] after its last answer (`wait` when nothing answers). With `stop_on`, it stops as
/// soon as a cell connects that `stop_on` denies.
pub async fn sweep(
    probes: Vec<(Cell, Probe)>,
    wait: Duration,
    stop_on: Option<&BTreeMap<Cell, bool>>,
) -> Swept {
    let mut got: BTreeMap<Cell, bool> = probes.iter().map(|(c, _)| (c.clone(), false)).collect();
    let mut pending: FuturesUnordered<_> = probes
        .into_iter()
        .map(|(cell, probe)| async move { (cell, probe.await) })
        .collect();
    let start = Instant::now();
    let mut last = None;
    loop {
        let deadline = start + settle(last, wait);
        tokio::select! {
            next = pending.next() => match next {
                Some((cell, ok)) => {
                    if ok {
                        last = Some(start.elapsed());
                        if stop_on.is_some_and(|want| want.get(&cell) == Some(&false)) {
                            got.insert(cell, true);
                            return Swept { got, cut: true };
                        }
                    }
                    got.insert(cell, ok);
                }
                None => break,
            },
            _ = tokio::time::sleep_until(deadline) => break,
        }
    }
    Swept { got, cut: false }
}

/// Runs every `cells` probe at once, `wait` each, as one sweep; each cell's outcome (connected or
/// not).
pub async fn probe_cells(
    pods: &BTreeMap<String, PolicyPod>,
    cells: &[Cell],
    wait: Duration,
) -> BTreeMap<Cell, bool> {
    sweep(socket_probes(pods, cells, wait).await, wait, None)
        .await
        .got
}

/// How long after its start a sweep of probes waits when its last answer came `last` after the
/// start: three times as long, and 250 ms more, at least 400 ms, never past `wait` (all of `wait`
/// when nothing answered). A loaded machine slows the answers and lengthens the wait with them.
fn settle(last: Option<Duration>, wait: Duration) -> Duration {
    match last {
        None => wait,
        Some(t) => (t * 3 + Duration::from_millis(250))
            .max(Duration::from_millis(400))
            .min(wait),
    }
}

/// Each daemon's policy syncs that reached the kernel, as its `/metrics` counts them now: read
/// before a change, for [`synced_since`].
pub async fn syncs(daemons: &[&PolicyDaemon]) -> Vec<f64> {
    let mut counts = Vec::new();
    for d in daemons {
        counts.push(d.syncs().await.in_force());
    }
    counts
}

/// Waits until every daemon has counted a sync since `before` ([`syncs`] read before a change), or
/// [`SYNC_WAIT`] has passed: when a round of probes can find the change in force.
pub async fn synced_since(daemons: &[&PolicyDaemon], before: &[f64]) {
    let start = Instant::now();
    for (d, before) in daemons.iter().zip(before) {
        while d.syncs().await.in_force() <= *before && start.elapsed() < SYNC_WAIT {
            tokio::time::sleep(SYNC_POLL).await;
        }
    }
}

pub fn verb(allowed: bool) -> &'static str {
    if allowed { "connects" } else { "is denied" }
}

/// The cells where `got` differs from `want`, in words.
pub fn differences(
    pods: &BTreeMap<String, PolicyPod>,
    got: &BTreeMap<Cell, bool>,
    want: &BTreeMap<Cell, bool>,
) -> Vec<String> {
    want.iter()
        .filter(|(cell, w)| got.get(*cell) != Some(*w))
        .map(|(cell, w)| {
            let (c, s) = (&pods[&cell.client], &pods[&cell.server]);
            format!(
                "{} ({}, {}) → {} ({}, {}) {:?}/{}: kernel {}, model {}",
                cell.client,
                c.cni.ip,
                c.node,
                cell.server,
                s.cni.ip,
                s.node,
                cell.protocol,
                cell.port,
                got.get(cell).map_or("unprobed", |g| verb(*g)),
                verb(*w)
            )
        })
        .collect()
}

/// Runs rounds of probes, `round(may_stop)` each ([`sweep`]: `may_stop` lets it stop at a
/// difference), until one gives what `want` says, for up to `within`: the daemons put a change in
/// force asynchronously, and the matrix itself is what must come out. Returns how many rounds it
/// took; panics naming every differing cell of the last round, a whole one.
pub async fn until_agreed<F, R>(
    what: &str,
    pods: &BTreeMap<String, PolicyPod>,
    want: &BTreeMap<Cell, bool>,
    within: Duration,
    logs: impl Fn() -> String,
    mut round: F,
) -> u32
where
    F: FnMut(bool) -> R,
    R: Future<Output = Swept>,
{
    let deadline = Instant::now() + within;
    let mut rounds = 0;
    loop {
        rounds += 1;
        let last = Instant::now() >= deadline;
        let swept = round(!last).await;
        if swept.cut {
            tokio::time::sleep(RETRY_AFTER).await;
            continue;
        }
        let wrong = differences(pods, &swept.got, want);
        if wrong.is_empty() {
            return rounds;
        }
        if last {
            panic!(
                "{what}: {} of {} cells differ from the model after {rounds} rounds ({within:?}):\n{}\n{}",
                wrong.len(),
                want.len(),
                wrong.join("\n"),
                logs()
            );
        }
    }
}

/// Probes `cells` (TCP and UDP) in rounds until every one gives what `want` says, for up to
/// `within` ([`until_agreed`]); the rounds it took.
pub async fn until_matrix(
    what: &str,
    pods: &BTreeMap<String, PolicyPod>,
    cells: &[Cell],
    want: &BTreeMap<Cell, bool>,
    within: Duration,
    logs: impl Fn() -> String,
) -> u32 {
    until_agreed(what, pods, want, within, logs, |may_stop| async move {
        let probes = socket_probes(pods, cells, PROBE_WAIT).await;
        sweep(probes, PROBE_WAIT, may_stop.then_some(want)).await
    })
    .await
}
