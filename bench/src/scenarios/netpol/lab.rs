//! The scenario's network namespaces: a node (forwarding on) and two pods on host veths, wired as
//! the plugin wires pods (address /32, default route via 169.254.1.1), all deleted on drop; and
//! the traffic between the pods, sent by threads that enter the pods' namespaces.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use nix::sched::CloneFlags;

fn ip_binary() -> &'static str {
    ["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .unwrap_or("ip")
}

/// Runs a command; its stdout, or an error with its stderr.
pub fn run(program: &str, args: &[&str], stdin: Option<&str>) -> anyhow::Result<String> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot run {program}"))?;
    let mut pipe = child.stdin.take().context("stdin")?;
    if let Some(input) = stdin {
        pipe.write_all(input.as_bytes())?;
    }
    drop(pipe);
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "`{program} {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Enters the named network namespace on the current thread (its children and the processes it
/// spawns inherit it).
pub fn enter(name: &str) -> anyhow::Result<()> {
    let f = std::fs::File::open(format!("/var/run/netns/{name}"))
        .with_context(|| format!("opening netns {name}"))?;
    nix::sched::setns(&f, CloneFlags::CLONE_NEWNET).context("setns")?;
    Ok(())
}

/// The node and the two pods; every namespace deleted on drop.
pub struct Lab {
    pub node: String,
    pub client: String,
    pub server: String,
}

impl Lab {
    /// `client_veth`/`server_veth`: the host veths the ruleset names for the two pods.
    pub fn new(
        client_veth: &str,
        client_ip: Ipv4Addr,
        server_veth: &str,
        server_ip: Ipv4Addr,
    ) -> anyhow::Result<Self> {
        let base = format!("eniipam-bench-{}-netpol", std::process::id());
        let lab = Self {
            node: format!("{base}-node"),
            client: format!("{base}-client"),
            server: format!("{base}-server"),
        };
        run(ip_binary(), &["netns", "add", &lab.node], None).context(
            "scenario `netpol` creates network namespaces and must run as root (CAP_SYS_ADMIN)",
        )?;
        for ns in [&lab.client, &lab.server] {
            run(ip_binary(), &["netns", "add", ns], None)?;
        }
        let mut node = vec!["link set lo up".to_owned()];
        for (veth, ns, ip) in [
            (client_veth, &lab.client, client_ip),
            (server_veth, &lab.server, server_ip),
        ] {
            node.extend([
                format!("link add {veth} type veth peer name eth0 netns {ns}"),
                format!("addr add 169.254.1.1/32 dev {veth}"),
                format!("link set {veth} up"),
                format!("route add {ip}/32 dev {veth} scope link"),
            ]);
        }
        run(
            ip_binary(),
            &["-n", &lab.node, "-batch", "-"],
            Some(&node.join("\n")),
        )?;
        for (ns, ip) in [(&lab.client, client_ip), (&lab.server, server_ip)] {
            let pod = [
                "link set lo up".to_owned(),
                format!("addr add {ip}/32 dev eth0"),
                "link set eth0 up".to_owned(),
                "route add 169.254.1.1 dev eth0 scope link".to_owned(),
                "route add default via 169.254.1.1 dev eth0".to_owned(),
            ];
            run(
                ip_binary(),
                &["-n", ns, "-batch", "-"],
                Some(&pod.join("\n")),
            )?;
        }
        run(
            ip_binary(),
            &[
                "netns",
                "exec",
                &lab.node,
                "sh",
                "-c",
                "echo 1 > /proc/sys/net/ipv4/ip_forward",
            ],
            None,
        )?;
        // Short-lived connections by the thousand: the client's ports must not run out.
        run(
            ip_binary(),
            &[
                "netns",
                "exec",
                &lab.client,
                "sh",
                "-c",
                "echo 1024 65000 > /proc/sys/net/ipv4/ip_local_port_range; echo 1 > /proc/sys/net/ipv4/tcp_tw_reuse",
            ],
            None,
        )?;
        Ok(lab)
    }

    /// `nft <args>` inside the node.
    pub fn nft(&self, args: &[&str], stdin: Option<&str>) -> anyhow::Result<String> {
        let mut all = vec!["netns", "exec", &self.node, "nft"];
        all.extend_from_slice(args);
        run(ip_binary(), &all, stdin)
    }

    /// Loads (`on`) or deletes kube-proxy's tables in the node, as its nftables mode lays them out
    /// on every Kubernetes node: `nat` chains at prerouting, output and postrouting (which turn
    /// conntrack on for the namespace), the Services' verdict map, the masquerade mark, and the
    /// filter chains that drop `ct state invalid` and judge new flows against Services without
    /// endpoints. One Service (a ClusterIP DNATed to one backend) keeps the maps
    /// non-empty; the measured traffic goes pod to pod, as it would in a cluster.
    pub fn kube_proxy(&self, on: bool) -> anyhow::Result<()> {
        if !on {
            self.nft(&["delete", "table", "ip", "kube-proxy"], None)?;
            return Ok(());
        }
        let table = r#"
table ip kube-proxy {
  map service-ips {
    type ipv4_addr . inet_proto . inet_service : verdict
  }
  map no-endpoint-services {
    type ipv4_addr . inet_proto . inet_service : verdict
  }
  chain mark-for-masquerade {
    meta mark set meta mark | 0x4000
  }
  chain masquerading {
    meta mark & 0x4000 == 0 return
    meta mark set meta mark ^ 0x4000
    masquerade fully-random
  }
  chain svc-backend {
    ip saddr 10.1.0.7 jump mark-for-masquerade
    meta l4proto tcp dnat to 10.1.0.7:5202
  }
  chain services {
    ip daddr . meta l4proto . th dport vmap @service-ips
    fib daddr type local ip daddr != 127.0.0.0/8 jump nodeports
  }
  chain nodeports {
  }
  chain service-endpoints-check {
    ip daddr . meta l4proto . th dport vmap @no-endpoint-services
  }
  chain filter-forward {
    type filter hook forward priority -110; policy accept;
    ct state new jump service-endpoints-check
    ct state invalid drop
  }
  chain filter-output {
    type filter hook output priority -110; policy accept;
    ct state new jump service-endpoints-check
  }
  chain nat-prerouting {
    type nat hook prerouting priority -100; policy accept;
    jump services
  }
  chain nat-output {
    type nat hook output priority -100; policy accept;
    jump services
  }
  chain nat-postrouting {
    type nat hook postrouting priority 100; policy accept;
    jump masquerading
  }
}
add element ip kube-proxy service-ips { 10.96.0.10 . tcp . 80 : goto svc-backend }
add element ip kube-proxy no-endpoint-services { 10.96.0.11 . tcp . 80 : drop }
"#;
        self.nft(&["-f", "-"], Some(table))?;
        Ok(())
    }

    /// TCP throughput client → server for `secs`: bytes per second the server received.
    pub fn throughput(&self, server_ip: Ipv4Addr, secs: f64) -> anyhow::Result<f64> {
        let (server, client) = (self.server.clone(), self.client.clone());
        let (tx, rx) = std::sync::mpsc::channel();
        let receiver = std::thread::spawn(move || -> anyhow::Result<f64> {
            enter(&server)?;
            let l = TcpListener::bind(("0.0.0.0", 5201))?;
            tx.send(()).ok();
            let (mut conn, _) = l.accept()?;
            let mut buf = vec![0u8; 256 * 1024];
            let mut total = 0u64;
            let start = Instant::now();
            loop {
                let n = conn.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                total += n as u64;
            }
            Ok(total as f64 / start.elapsed().as_secs_f64())
        });
        rx.recv().context("the receiver did not start")?;
        let to = SocketAddr::from((server_ip, 5201));
        let sender = std::thread::spawn(move || -> anyhow::Result<()> {
            enter(&client)?;
            let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(2))?;
            let buf = vec![0x5au8; 128 * 1024];
            let until = Instant::now() + Duration::from_secs_f64(secs);
            while Instant::now() < until {
                s.write_all(&buf)?;
            }
            Ok(())
        });
        sender
            .join()
            .map_err(|_| anyhow::anyhow!("sender panicked"))??;
        receiver
            .join()
            .map_err(|_| anyhow::anyhow!("receiver panicked"))?
    }

    /// New TCP connections per second client → server over `secs` (each: handshake, one byte
    /// back from the server, close), at most `cap` of them.
    pub fn connection_rate(
        &self,
        server_ip: Ipv4Addr,
        secs: f64,
        cap: usize,
    ) -> anyhow::Result<f64> {
        let (server, client) = (self.server.clone(), self.client.clone());
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel();
        let done = stop.clone();
        let acceptor = std::thread::spawn(move || -> anyhow::Result<()> {
            enter(&server)?;
            let l = TcpListener::bind(("0.0.0.0", 5202))?;
            tx.send(()).ok();
            // Blocking: a spinning acceptor would take a core from what is measured. The
            // opener's last connection, after `stop`, ends it.
            loop {
                let (mut c, _) = l.accept()?;
                if done.load(Ordering::Acquire) {
                    return Ok(());
                }
                let _ = c.write_all(b"k");
            }
        });
        rx.recv().context("the acceptor did not start")?;
        let to = SocketAddr::from((server_ip, 5202));
        let opener = std::thread::spawn(move || -> anyhow::Result<f64> {
            enter(&client)?;
            let start = Instant::now();
            let until = start + Duration::from_secs_f64(secs);
            let mut n = 0usize;
            let mut opened = || -> anyhow::Result<()> {
                while Instant::now() < until && n < cap {
                    let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(2))?;
                    let mut b = [0u8; 1];
                    s.read_exact(&mut b)?;
                    n += 1;
                }
                Ok(())
            };
            let result = opened();
            let rate = n as f64 / start.elapsed().as_secs_f64();
            stop.store(true, Ordering::Release);
            TcpStream::connect_timeout(&to, Duration::from_secs(2))?;
            result.map(|()| rate)
        });
        // An opener that failed may not have woken the acceptor: it is left blocked then.
        let rate = opener
            .join()
            .map_err(|_| anyhow::anyhow!("opener panicked"))??;
        acceptor
            .join()
            .map_err(|_| anyhow::anyhow!("acceptor panicked"))??;
        ensure!(rate > 0.0, "no connection was made");
        Ok(rate)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for ns in [&self.client, &self.server, &self.node] {
            let _ = run(ip_binary(), &["netns", "del", ns], None);
        }
    }
}
