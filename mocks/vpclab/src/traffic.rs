//! Traffic tools usable in any lab namespace: a TCP echo server (a thread inside the namespace) and
//! a client whose socket is made inside the namespace. The server answers with the peer address it
//! saw, so a test observes SNAT: which source a packet had when it arrived.
//!
//! Both families: a server bound to `[::]` serves IPv6 (and IPv4, seen as `::ffff:a.b.c.d` peers);
//! the client's socket takes the server address's family.
//!
//! Protocol: the client sends `vpclab-echo <nonce>\n`; the server answers `<peer ip:port> <same
//! line>\n` and closes.

use std::io::{BufRead, BufReader, Read as _, Write};
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::poll::{PollFd, PollFlags, poll};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

use crate::error::LabError;
use crate::netns::NetNs;

const GREETING: &str = "vpclab-echo";
/// How long the server's accept loop waits for a connection before it looks at its stop flags
/// again, in milliseconds.
const POLL_MS: u16 = 10;

/// A TCP echo server running inside a namespace. Stops when dropped, or when the lab that owns the
/// namespace is torn down.
pub struct EchoServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    peers: Arc<Mutex<Vec<SocketAddr>>>,
    thread: Option<std::thread::JoinHandle<Result<(), LabError>>>,
}

impl EchoServer {
    /// Binds `bind` inside `ns` (port 0 picks one) and serves until dropped.
    pub fn start(ns: &NetNs, bind: SocketAddr) -> Result<Self, LabError> {
        let stop = Arc::new(AtomicBool::new(false));
        let peers = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let lab_alive = ns.alive_flag();
        let (stop2, peers2) = (stop.clone(), peers.clone());
        let thread = ns.spawn(move || {
            let listener = match TcpListener::bind(bind).and_then(|l| {
                l.set_nonblocking(true)?;
                Ok(l)
            }) {
                Ok(l) => l,
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            };
            let _ = tx.send(listener.local_addr());
            serve(&listener, &stop2, &lab_alive, &peers2);
        })?;
        match rx.recv() {
            Ok(Ok(addr)) => Ok(Self {
                addr,
                stop,
                peers,
                thread: Some(thread),
            }),
            Ok(Err(e)) => Err(LabError::io(
                format!("binding the echo server to {bind} in {}", ns.name()),
                e,
            )),
            Err(_) => Err(match thread.join() {
                Ok(Err(e)) => e,
                _ => LabError::io(
                    format!("the echo server thread in {} ended early", ns.name()),
                    std::io::Error::other("no address reported"),
                ),
            }),
        }
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The peer address of every connection served so far, in order.
    pub fn peers(&self) -> Vec<SocketAddr> {
        self.peers.lock().expect("peers lock").clone()
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(
    listener: &TcpListener,
    stop: &AtomicBool,
    lab_alive: &AtomicBool,
    peers: &Mutex<Vec<SocketAddr>>,
) {
    while !stop.load(Ordering::Acquire) && lab_alive.load(Ordering::Acquire) {
        // Wait (a bounded time) for a connection; the listener is non-blocking.
        let mut fds = [PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, POLL_MS) {
            Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "echo server poll failed");
                return;
            }
        }
        match listener.accept() {
            Ok((conn, peer)) => {
                peers.lock().expect("peers lock").push(peer);
                // A client that misbehaves only costs its own connection.
                let _ = answer(conn, peer);
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
                ) => {}
            Err(e) => tracing::warn!(error = %e, "echo server accept failed"),
        }
    }
}

fn answer(conn: std::net::TcpStream, peer: SocketAddr) -> std::io::Result<()> {
    conn.set_nonblocking(false)?;
    conn.set_read_timeout(Some(Duration::from_secs(2)))?;
    conn.set_write_timeout(Some(Duration::from_secs(2)))?;
    let mut line = String::new();
    BufReader::new(conn.try_clone()?)
        .take(1024)
        .read_line(&mut line)?;
    let mut conn = conn;
    conn.write_all(format!("{peer} {}\n", line.trim_end()).as_bytes())?;
    conn.flush()
}

/// How the client connects.
#[derive(Clone, Debug)]
pub struct EchoOptions {
    /// Source address to bind before connecting (it must be an address of the namespace, of the
    /// server address's family).
    pub bind: Option<IpAddr>,
    /// For the whole exchange: connect, send, answer.
    pub timeout: Duration,
}

impl Default for EchoOptions {
    fn default() -> Self {
        Self {
            bind: None,
            timeout: Duration::from_secs(2),
        }
    }
}

/// A successful exchange.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EchoReply {
    /// The client socket's own address.
    pub local: SocketAddr,
    /// The peer address the server saw: differs from `local` when something translated it.
    pub server_saw: SocketAddr,
}

/// Why an exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum EchoError {
    /// No answer in time: what a dropped packet looks like.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("connection refused")]
    Refused,
    #[error("unreachable: {0}")]
    Unreachable(std::io::Error),
    #[error("{0}")]
    Io(std::io::Error),
    #[error("the server answered something else: {0:?}")]
    Protocol(String),
    #[error(transparent)]
    Lab(#[from] LabError),
}

impl EchoError {
    fn from_io(e: std::io::Error) -> Self {
        use std::io::ErrorKind::*;
        match e.kind() {
            ConnectionRefused => Self::Refused,
            HostUnreachable | NetworkUnreachable | AddrNotAvailable => Self::Unreachable(e),
            _ => Self::Io(e),
        }
    }
}

/// Connects from inside `ns` to `server`, exchanges one line and reports what the server saw.
///
/// The timeout runs on tokio's clock: under a paused clock (`start_paused`) it would fire as soon
/// as the runtime idles, so lab traffic belongs in tests on the real clock.
pub async fn echo(
    ns: &NetNs,
    server: SocketAddr,
    opts: &EchoOptions,
) -> Result<EchoReply, EchoError> {
    let bind = opts.bind;
    // The socket is made (and bound) inside the namespace; connecting it from this task is fine.
    let socket = ns
        .run_async(move || -> std::io::Result<tokio::net::TcpSocket> {
            let s = if server.is_ipv6() {
                tokio::net::TcpSocket::new_v6()?
            } else {
                tokio::net::TcpSocket::new_v4()?
            };
            if let Some(ip) = bind {
                s.bind(SocketAddr::new(ip, 0))?;
            }
            Ok(s)
        })
        .await?
        .map_err(EchoError::from_io)?;
    let nonce: u64 = rand::random();
    let exchange = async move {
        let mut stream = socket.connect(server).await.map_err(EchoError::from_io)?;
        let local = stream.local_addr().map_err(EchoError::Io)?;
        let line = format!("{GREETING} {nonce:016x}");
        stream
            .write_all(format!("{line}\n").as_bytes())
            .await
            .map_err(EchoError::from_io)?;
        let mut answer = String::new();
        tokio::io::BufReader::new(stream)
            .read_line(&mut answer)
            .await
            .map_err(EchoError::from_io)?;
        let answer = answer.trim_end();
        let (saw, rest) = answer
            .split_once(' ')
            .ok_or_else(|| EchoError::Protocol(answer.to_owned()))?;
        if rest != line {
            return Err(EchoError::Protocol(answer.to_owned()));
        }
        let server_saw = saw
            .parse()
            .map_err(|_| EchoError::Protocol(answer.to_owned()))?;
        Ok(EchoReply { local, server_saw })
    };
    tokio::time::timeout(opts.timeout, exchange)
        .await
        .map_err(|_| EchoError::Timeout(opts.timeout))?
}

/// A TCP port forward from inside a lab namespace to an address of the process's own namespace
/// (e.g. mockcloud's IMDS or EC2 listener on 127.0.0.1), without any route between the two: the
/// listening socket is made inside the namespace, the outgoing ones by the tokio runtime's threads,
/// which never leave the process's namespace. Stops when dropped.
pub struct PortForward {
    listen: SocketAddr,
    task: tokio::task::AbortHandle,
}

impl PortForward {
    /// Listens on `listen` inside `ns` (the address must exist there; port 0 picks one) and relays
    /// every connection to `target`. Needs a tokio runtime.
    pub async fn start(
        ns: &NetNs,
        listen: SocketAddr,
        target: SocketAddr,
    ) -> Result<Self, LabError> {
        let std_listener = ns
            .run_async(move || -> std::io::Result<TcpListener> {
                let l = TcpListener::bind(listen)?;
                l.set_nonblocking(true)?;
                Ok(l)
            })
            .await?
            .map_err(|e| LabError::io(format!("binding {listen} in {}", ns.name()), e))?;
        let listener = tokio::net::TcpListener::from_std(std_listener)
            .map_err(|e| LabError::io("registering the forward's listener", e))?;
        let listen = listener
            .local_addr()
            .map_err(|e| LabError::io("reading the forward's address", e))?;
        let task = tokio::spawn(async move {
            loop {
                let (mut inbound, _) = match listener.accept().await {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(error = %e, "port forward accept failed");
                        continue;
                    }
                };
                tokio::spawn(async move {
                    match tokio::net::TcpStream::connect(target).await {
                        Ok(mut outbound) => {
                            let _ =
                                tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                        }
                        Err(e) => {
                            tracing::warn!(%target, error = %e, "port forward connect failed")
                        }
                    }
                });
            }
        });
        Ok(Self {
            listen,
            task: task.abort_handle(),
        })
    }

    /// Where it listens (inside the namespace).
    pub fn listen_addr(&self) -> SocketAddr {
        self.listen
    }
}

impl Drop for PortForward {
    fn drop(&mut self) {
        self.task.abort();
    }
}
