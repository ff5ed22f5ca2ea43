//! `EniRouting` and `RouteKeeper` against a real kernel, without touching the machine's own network
//! namespace: every test makes a "node" namespace holding veth pairs whose one end has a chosen MAC
//! (standing for an ENI's link), and runs the code on a thread that has `setns`-ed into it with its own
//! current-thread runtime. Results are read back with `ip -n <ns> -j`. No traffic is sent. Needs root;
//! skipped with a notice otherwise.

use std::fs::File;
use std::future::Future;
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use eniipam::host::{EniRoute, EniRouting, HostError, RouteKeeper};
use nix::sched::CloneFlags;
use serde_json::Value;

fn ip_binary() -> &'static str {
    for p in ["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"] {
        if Path::new(p).exists() {
            return p;
        }
    }
    "ip"
}

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A named network namespace, deleted on drop (even when the test fails).
struct Netns {
    name: String,
}

impl Netns {
    /// A fresh namespace, or `None` (with a notice) when this process may not create one.
    fn new(test: &str) -> Option<Self> {
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let name = format!("eniipam-hr-{}-{n}", std::process::id());
        let ok = Command::new(ip_binary())
            .args(["netns", "add", &name])
            .output()
            .is_ok_and(|o| o.status.success());
        if !ok {
            mockcloud::ci::skip(
                test,
                "cannot create network namespaces (needs root and iproute2)",
            );
            return None;
        }
        Some(Self { name })
    }

    fn path(&self) -> String {
        format!("/run/netns/{}", self.name)
    }

    /// `ip -n <ns> <args>`: (success, stdout, stderr).
    fn ip_raw(&self, args: &[&str]) -> (bool, String, String) {
        let out = Command::new(ip_binary())
            .args(["-n", &self.name])
            .args(args)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// `ip -n <ns> <args>`, asserting success.
    fn ip(&self, args: &[&str]) -> String {
        let (ok, out, err) = self.ip_raw(args);
        assert!(ok, "ip -n {} {args:?}: {err}", self.name);
        out
    }

    fn ip_json(&self, args: &[&str]) -> Vec<Value> {
        let mut full = vec!["-j"];
        full.extend_from_slice(args);
        let out = self.ip(&full);
        if out.trim().is_empty() {
            return Vec::new();
        }
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("ip -j {args:?}: {e}: {out}"))
    }

    /// See [`add_eni_link`].
    fn add_eni_link(&self, name: &str, mac: &str) {
        add_eni_link(&self.name, name, mac);
    }

    /// The routes of `table`, one `ip`-like line each, sorted.
    fn routes(&self, table: &str) -> Vec<String> {
        let (ok, out, err) = self.ip_raw(&["-j", "-4", "route", "show", "table", table]);
        if !ok {
            // A table that never held a route does not exist at all.
            assert!(
                err.contains("does not exist"),
                "ip route show table {table}: {err}"
            );
            return Vec::new();
        }
        let routes: Vec<Value> = if out.trim().is_empty() {
            Vec::new()
        } else {
            serde_json::from_str(&out).unwrap()
        };
        let mut lines: Vec<String> = routes
            .iter()
            .map(|r| {
                let mut line = r["dst"].as_str().unwrap().to_owned();
                if let Some(gw) = r["gateway"].as_str() {
                    line.push_str(&format!(" via {gw}"));
                }
                line.push_str(&format!(" dev {}", r["dev"].as_str().unwrap_or("?")));
                if let Some(scope) = r["scope"].as_str() {
                    line.push_str(&format!(" scope {scope}"));
                }
                for flag in r["flags"].as_array().into_iter().flatten() {
                    line.push_str(&format!(" {}", flag.as_str().unwrap()));
                }
                line
            })
            .collect();
        lines.sort();
        lines
    }

    /// (is up, MTU, `addr/prefix` list) of a link.
    fn link(&self, name: &str) -> (bool, u64, Vec<String>) {
        let link = self.ip_json(&["addr", "show", "dev", name]);
        let link = &link[0];
        let up = link["flags"].as_array().unwrap().iter().any(|f| f == "UP");
        let addrs = link["addr_info"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|a| a["family"] == "inet")
            .map(|a| format!("{}/{}", a["local"].as_str().unwrap(), a["prefixlen"]))
            .collect();
        (up, link["mtu"].as_u64().unwrap(), addrs)
    }

    /// Runs `f` on a thread inside this namespace, on its own current-thread runtime.
    fn run<T, F, Fut>(&self, f: F) -> T
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = T>,
        T: Send + 'static,
    {
        let path = self.path();
        std::thread::spawn(move || {
            let ns = File::open(&path).unwrap();
            nix::sched::setns(&ns, CloneFlags::CLONE_NEWNET).unwrap();
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(f())
        })
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new(ip_binary())
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// A veth pair in namespace `ns`: `name` (the "ENI", with `mac`) and its peer `<name>p`, the peer up
/// so that the ENI end has a carrier once it is brought up. Usable from any thread (`ip -n`).
fn add_eni_link(ns: &str, name: &str, mac: &str) {
    let peer = format!("{name}p");
    for args in [
        vec![
            "link", "add", name, "address", mac, "type", "veth", "peer", "name", &peer,
        ],
        vec!["link", "set", &peer, "up"],
    ] {
        let out = Command::new(ip_binary())
            .args(["-n", ns])
            .args(&args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "ip -n {ns} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

const MAC1: &str = "02:e1:00:00:00:01";
const MAC2: &str = "02:e1:00:00:00:02";

fn eni(mac: &str, device_index: u32, third_octet: u8) -> EniRoute {
    EniRoute {
        mac: mac.into(),
        device_index,
        subnet_cidr: format!("10.10.{third_octet}.0/24").parse().unwrap(),
        gateway: Ipv4Addr::new(10, 10, third_octet, 1),
        primary_ip: Ipv4Addr::new(10, 10, third_octet, 5),
        mtu: Some(9001),
    }
}

#[test]
fn ensure_installs_the_eni_table() {
    let Some(node) = Netns::new("ensure_installs_the_eni_table") else {
        return;
    };
    node.add_eni_link("eni1", MAC1);
    let want = eni(&MAC1.to_uppercase(), 2, 1);
    let read_back = node.run(move || async move {
        let routing = EniRouting::new().await.unwrap();
        routing.ensure(&want).await.unwrap();
        routing.table(2).await.unwrap()
    });

    let (up, mtu, addrs) = node.link("eni1");
    assert!(up, "eni1 is not up");
    assert_eq!(mtu, 9001);
    assert_eq!(addrs, vec!["10.10.1.5/24"]);
    assert_eq!(
        node.routes("3"),
        vec![
            "10.10.1.0/24 dev eni1 scope link",
            "default via 10.10.1.1 dev eni1 onlink",
        ]
    );
    // The address is noprefixroute: the main table gets no route through the ENI.
    assert!(
        node.routes("main").iter().all(|r| !r.contains("eni1")),
        "{:?}",
        node.routes("main")
    );
    let mut shown: Vec<String> = read_back.iter().map(ToString::to_string).collect();
    shown.sort();
    assert_eq!(shown.len(), 2, "{shown:?}");
    assert!(shown[0].starts_with("10.10.1.0/24 dev #"), "{shown:?}");
    assert!(shown[0].ends_with("scope link"), "{shown:?}");
    assert!(
        shown[1].starts_with("default via 10.10.1.1 dev #"),
        "{shown:?}"
    );
    assert!(shown[1].ends_with("onlink"), "{shown:?}");
}

#[test]
fn ensure_is_idempotent_and_converges() {
    let Some(node) = Netns::new("ensure_is_idempotent_and_converges") else {
        return;
    };
    node.add_eni_link("eni1", MAC1);
    // Someone (cloud-init, ec2-net-utils) already put the primary IP on the link, with its
    // main-table prefix route.
    node.ip(&["addr", "add", "10.10.1.5/24", "dev", "eni1"]);
    node.ip(&["link", "set", "eni1", "up"]);
    assert!(node.routes("main").iter().any(|r| r.contains("eni1")));

    let first = eni(MAC1, 2, 1);
    let expected = vec![
        "10.10.1.0/24 dev eni1 scope link",
        "default via 10.10.1.1 dev eni1 onlink",
    ];
    node.run({
        let first = first.clone();
        move || async move {
            let routing = EniRouting::new().await.unwrap();
            routing.ensure(&first).await.unwrap();
            routing.ensure(&first).await.unwrap();
        }
    });
    assert_eq!(node.routes("3"), expected);
    assert_eq!(node.link("eni1").2, vec!["10.10.1.5/24"]);
    assert!(
        node.routes("main").iter().all(|r| !r.contains("eni1")),
        "the main-table subnet route of the ENI stayed: {:?}",
        node.routes("main")
    );

    // Drift: a stray route in the table, the default route gone. The next ensure heals both.
    node.ip(&["route", "add", "192.0.2.0/24", "dev", "eni1", "table", "3"]);
    node.ip(&["route", "del", "default", "table", "3"]);
    node.run({
        let first = first.clone();
        move || async move {
            let routing = EniRouting::new().await.unwrap();
            routing.ensure(&first).await.unwrap();
        }
    });
    assert_eq!(node.routes("3"), expected);

    // A changed gateway replaces the default route rather than adding a second one.
    let mut moved = first.clone();
    moved.gateway = Ipv4Addr::new(10, 10, 1, 254);
    moved.mtu = None;
    node.run(move || async move {
        let routing = EniRouting::new().await.unwrap();
        routing.ensure(&moved).await.unwrap();
    });
    assert_eq!(
        node.routes("3"),
        vec![
            "10.10.1.0/24 dev eni1 scope link",
            "default via 10.10.1.254 dev eni1 onlink",
        ]
    );
    assert_eq!(node.link("eni1").1, 9001, "mtu None leaves the MTU alone");
}

#[test]
fn remove_flushes_only_that_table() {
    let Some(node) = Netns::new("remove_flushes_only_that_table") else {
        return;
    };
    node.add_eni_link("eni1", MAC1);
    node.add_eni_link("eni2", MAC2);
    node.run(move || async move {
        let routing = EniRouting::new().await.unwrap();
        routing.ensure(&eni(MAC1, 2, 1)).await.unwrap();
        routing.ensure(&eni(MAC2, 3, 2)).await.unwrap();
    });
    assert_eq!(node.routes("3").len(), 2);
    assert_eq!(node.routes("4").len(), 2);

    let left = node.run(move || async move {
        let routing = EniRouting::new().await.unwrap();
        routing.remove(2).await.unwrap();
        // Again: nothing left to remove is fine.
        routing.remove(2).await.unwrap();
        routing.table(2).await.unwrap()
    });
    assert!(left.is_empty(), "{left:?}");
    assert!(node.routes("3").is_empty(), "{:?}", node.routes("3"));
    assert_eq!(
        node.routes("4"),
        vec![
            "10.10.2.0/24 dev eni2 scope link",
            "default via 10.10.2.1 dev eni2 onlink",
        ]
    );
    // Routes only: the link keeps its address.
    assert_eq!(node.link("eni1").2, vec!["10.10.1.5/24"]);
}

#[test]
fn unknown_mac_and_primary_eni_are_refused() {
    let Some(node) = Netns::new("unknown_mac_and_primary_eni_are_refused") else {
        return;
    };
    node.add_eni_link("eni1", MAC1);
    let (missing, primary, primary_remove, outside) = node.run(move || async move {
        let routing = EniRouting::new().await.unwrap();
        let missing = routing.ensure(&eni("02:E1:00:00:00:99", 2, 1)).await;
        let primary = routing.ensure(&eni(MAC1, 0, 1)).await;
        let primary_remove = routing.remove(0).await;
        let mut bad = eni(MAC1, 2, 1);
        bad.primary_ip = Ipv4Addr::new(10, 99, 0, 5);
        let outside = routing.ensure(&bad).await;
        (missing, primary, primary_remove, outside)
    });
    match missing {
        Err(HostError::LinkNotFound { mac }) => assert_eq!(mac, "02:e1:00:00:00:99"),
        other => panic!("expected LinkNotFound, got {other:?}"),
    }
    assert!(matches!(primary, Err(HostError::PrimaryEni)), "{primary:?}");
    assert!(
        matches!(primary_remove, Err(HostError::PrimaryEni)),
        "{primary_remove:?}"
    );
    assert!(
        matches!(
            outside,
            Err(HostError::Invalid {
                device_index: 2,
                ..
            })
        ),
        "{outside:?}"
    );
    // Nothing was touched.
    let (up, mtu, addrs) = node.link("eni1");
    assert!(!up);
    assert_eq!(mtu, 1500);
    assert!(addrs.is_empty(), "{addrs:?}");
    assert!(node.routes("3").is_empty());
    assert!(node.routes("1").is_empty());
}

#[test]
fn keeper_follows_the_eni_list() {
    let Some(node) = Netns::new("keeper_follows_the_eni_list") else {
        return;
    };
    node.add_eni_link("eni1", MAC1);
    let a = eni(MAC1, 2, 1);
    let b = eni(MAC2, 3, 2);
    let ns_name = node.name.clone();
    node.run(move || async move {
        let routing = EniRouting::new().await.unwrap();
        let mut keeper = RouteKeeper::new(routing, Duration::from_secs(3600));

        // b's link has not appeared yet: a is installed, b is retried.
        let report = keeper.sync(&[a.clone(), b.clone()]).await;
        assert_eq!(report.ensured, vec![2]);
        assert!(report.removed.is_empty());
        assert_eq!(report.failed.len(), 1, "{report:?}");
        assert!(matches!(
            report.failed[0],
            (3, HostError::LinkNotFound { .. })
        ));

        // The link shows up; the next round installs b and leaves a alone (not due).
        add_eni_link(&ns_name, "eni2", MAC2);
        let report = keeper.sync(&[a.clone(), b.clone()]).await;
        assert_eq!(report.ensured, vec![3], "{report:?}");
        assert!(report.failed.is_empty(), "{report:?}");

        // A changed ENI is re-installed even before its resync is due.
        let mut a2 = a.clone();
        a2.gateway = Ipv4Addr::new(10, 10, 1, 254);
        let report = keeper.sync(&[a2.clone(), b.clone()]).await;
        assert_eq!(report.ensured, vec![2], "{report:?}");

        // a leaves the list: its table is flushed.
        let report = keeper.sync(std::slice::from_ref(&b)).await;
        assert!(report.ensured.is_empty(), "{report:?}");
        assert_eq!(report.removed, vec![2]);
        assert!(report.failed.is_empty(), "{report:?}");
    });
    assert!(node.routes("3").is_empty(), "{:?}", node.routes("3"));
    assert_eq!(
        node.routes("4"),
        vec![
            "10.10.2.0/24 dev eni2 scope link",
            "default via 10.10.2.1 dev eni2 onlink",
        ]
    );
}

#[test]
fn spawned_keeper_retries_until_the_link_appears() {
    let Some(node) = Netns::new("spawned_keeper_retries_until_the_link_appears") else {
        return;
    };
    let ns_name = node.name.clone();
    node.run(move || async move {
        let routing = EniRouting::new().await.unwrap();
        let cancel = tokio_util::sync::CancellationToken::new();
        let keeper = RouteKeeper::new(routing.clone(), Duration::from_secs(3600));
        let task = keeper.spawn(
            || vec![eni(MAC1, 2, 1)],
            Duration::from_millis(50),
            cancel.clone(),
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(routing.table(2).await.unwrap().is_empty());
        add_eni_link(&ns_name, "eni1", MAC1);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while routing.table(2).await.unwrap().len() < 2 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the keeper never installed the table"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        cancel.cancel();
        task.await.unwrap();
    });
    assert_eq!(
        node.routes("3"),
        vec![
            "10.10.1.0/24 dev eni1 scope link",
            "default via 10.10.1.1 dev eni1 onlink",
        ]
    );
}
