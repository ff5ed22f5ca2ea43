//! `RulesKeeper` and `HostRules` against a real kernel and the real `nft`, without touching the
//! machine's own network namespace: each test makes a "node" namespace whose primary interface is a
//! veth named `ens5` (as on AL2023) with eth0's MAC, and runs the keeper on a thread that has
//! `setns`-ed into it, with its own current-thread runtime (its `nft` children inherit the
//! namespace). IMDS is an in-memory `Metadata` the test changes. No traffic is sent (the data path
//! is `tests/datapath.rs`). Needs root, `ip`, `nft`, `iptables` and `nsenter`; skipped with a notice
//! otherwise.

use std::future::Future;
use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use eniipam::cloud::{CloudError, CloudResult, InstanceIdentity, Metadata, MetadataEni};
use eniipam::daemon::ImdsPrimary;
use eniipam::host::{
    HostRules, HostRulesConfig, Nft, RulesError, RulesKeeper, Snat, SnatPorts, TableChange,
};
use ipnet::Ipv4Net;
use nix::sched::CloneFlags;

const MAC: &str = "02:0a:00:00:00:04";
const PRIMARY_IP: &str = "10.0.0.4";

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A named network namespace with `ens5` (eth0's MAC, strict rp_filter), deleted on drop.
struct Node {
    name: String,
}

impl Node {
    fn new(test: &str) -> Option<Node> {
        for tool in ["ip", "nft", "iptables-restore", "nsenter"] {
            if Command::new("which")
                .arg(tool)
                .output()
                .map_or(true, |o| !o.status.success())
            {
                mockcloud::ci::skip(test, &format!("`{tool}` is not installed"));
                return None;
            }
        }
        let name = format!(
            "eniipam-dpr-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::SeqCst)
        );
        let made = Command::new("ip")
            .args(["netns", "add", &name])
            .output()
            .is_ok_and(|o| o.status.success());
        if !made {
            mockcloud::ci::skip(test, "cannot create network namespaces (needs root)");
            return None;
        }
        let node = Node { name };
        for args in [
            vec!["link", "set", "lo", "up"],
            vec![
                "link", "add", "ens5", "address", MAC, "type", "veth", "peer", "name", "vpc0",
            ],
            vec!["addr", "add", "10.0.0.4/20", "dev", "ens5"],
            vec!["link", "set", "ens5", "up"],
            vec!["link", "set", "vpc0", "up"],
        ] {
            node.ip(&args);
        }
        node.sh("echo 1 > /proc/sys/net/ipv4/conf/ens5/rp_filter");
        Some(node)
    }

    fn path(&self) -> String {
        format!("/run/netns/{}", self.name)
    }

    fn ip(&self, args: &[&str]) -> String {
        let out = Command::new("ip")
            .args(["-n", &self.name])
            .args(args)
            .output()
            .expect("ip");
        assert!(
            out.status.success(),
            "ip {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs a program inside the namespace; (success, stdout + stderr).
    fn exec(&self, program: &str, args: &[&str], stdin: Option<&str>) -> (bool, String) {
        use std::io::Write;
        let mut child = Command::new("nsenter")
            .arg(format!("--net={}", self.path()))
            .arg("--")
            .arg(program)
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("nsenter");
        let mut pipe = child.stdin.take().expect("stdin");
        if let Some(input) = stdin {
            pipe.write_all(input.as_bytes()).expect("stdin");
        }
        drop(pipe);
        let out = child.wait_with_output().expect("wait");
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    }

    fn sh(&self, script: &str) -> String {
        let (ok, out) = self.exec("sh", &["-c", script], None);
        assert!(ok, "{script}: {out}");
        out
    }

    fn nft_list(&self) -> Option<String> {
        let (ok, out) = self.exec("nft", &["list", "table", "ip", "eniipam"], None);
        ok.then_some(out)
    }

    fn rp_filter(&self) -> String {
        self.sh("cat /proc/sys/net/ipv4/conf/ens5/rp_filter")
            .trim()
            .to_owned()
    }

    fn fwmark_rules(&self) -> usize {
        self.ip(&["rule", "show"])
            .lines()
            .filter(|l| {
                l.starts_with("1024:")
                    && l.contains("fwmark 0x80/0x80")
                    && l.contains("lookup main")
            })
            .count()
    }

    /// Runs `f` on a thread inside the namespace, on a current-thread runtime with a paused clock.
    fn run<F, Fut, R>(&self, f: F) -> R
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = R>,
        R: Send + 'static,
    {
        let path = self.path();
        std::thread::spawn(move || {
            let ns = std::fs::File::open(&path).expect("netns file");
            nix::sched::setns(&ns, CloneFlags::CLONE_NEWNET).expect("setns");
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .start_paused(true)
                .build()
                .expect("runtime")
                .block_on(f())
        })
        .join()
        .expect("the namespace thread panicked")
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// IMDS as the keeper reads it: eth0's MAC, its primary IP and the VPC's CIDRs; can be told to fail.
struct FakeImds {
    cidrs: Mutex<Vec<Ipv4Net>>,
    failing: Mutex<bool>,
}

impl FakeImds {
    fn new(cidrs: &[&str]) -> Arc<FakeImds> {
        Arc::new(FakeImds {
            cidrs: Mutex::new(cidrs.iter().map(|c| c.parse().expect("cidr")).collect()),
            failing: Mutex::new(false),
        })
    }

    fn set_cidrs(&self, cidrs: &[&str]) {
        *self.cidrs.lock().unwrap() = cidrs.iter().map(|c| c.parse().expect("cidr")).collect();
    }

    fn fail(&self, failing: bool) {
        *self.failing.lock().unwrap() = failing;
    }

    fn check(&self, api: &str) -> CloudResult<()> {
        if *self.failing.lock().unwrap() {
            return Err(CloudError::Transient {
                api: api.into(),
                message: "IMDS unreachable (test)".into(),
            });
        }
        Ok(())
    }

    fn eni(&self) -> MetadataEni {
        MetadataEni {
            mac: MAC.into(),
            eni_id: "eni-0000000a".parse().expect("eni id"),
            device_number: 0,
            subnet_id: "subnet-1".into(),
            vpc_id: "vpc-1".into(),
            subnet_cidr: "10.0.0.0/20".parse().expect("cidr"),
            vpc_cidrs: self.cidrs.lock().unwrap().clone(),
            security_groups: vec![],
            ips: vec![PRIMARY_IP.parse().expect("ip"), Ipv4Addr::new(10, 0, 0, 9)],
            ipv4_prefixes: vec![],
            ipv6s: vec![],
            ipv6_prefixes: vec![],
            subnet_ipv6_cidrs: vec![],
            vpc_ipv6_cidrs: vec![],
        }
    }
}

#[async_trait]
impl Metadata for FakeImds {
    async fn identity(&self) -> CloudResult<InstanceIdentity> {
        self.check("imds:identity")?;
        Ok(InstanceIdentity {
            instance_id: "i-0000000a".into(),
            instance_type: "m5.large".into(),
            availability_zone: "us-east-1a".into(),
            mac: MAC.into(),
        })
    }

    async fn interfaces(&self) -> CloudResult<Vec<MetadataEni>> {
        self.check("imds:interfaces")?;
        Ok(vec![self.eni()])
    }

    async fn interface(&self, mac: &str) -> CloudResult<Option<MetadataEni>> {
        self.check("imds:interface")?;
        Ok((mac == MAC).then(|| self.eni()))
    }
}

fn keeper(config: HostRulesConfig, imds: &Arc<FakeImds>) -> RulesKeeper {
    RulesKeeper::new(
        config,
        HostRules::new(Nft::default()).expect("netlink"),
        Arc::new(ImdsPrimary(imds.clone())),
        Duration::from_secs(30),
    )
}

#[test]
fn installs_once_keeps_over_a_restart_and_follows_the_vpc_cidrs() {
    let Some(node) = Node::new("installs_once_keeps_over_a_restart_and_follows_the_vpc_cidrs")
    else {
        return;
    };
    assert_eq!(node.rp_filter(), "1");
    let imds = FakeImds::new(&["10.0.0.0/16"]);
    let i = imds.clone();
    let first = node.run(move || async move {
        let mut k = keeper(HostRulesConfig::default(), &i);
        let r = k.sync().await.expect("first round");
        let again = k.sync().await.expect("second round");
        (r, again)
    });
    let (r, again) = first;
    assert_eq!(r.table, TableChange::Installed);
    assert!(r.fwmark_rule_changed && r.rp_filter_loosened);
    assert_eq!(r.rp_filter_error, None);
    assert_eq!(r.primary.ifname, "ens5", "found by eth0's MAC, not by name");
    assert_eq!(
        r.primary.primary_ip,
        PRIMARY_IP.parse::<Ipv4Addr>().unwrap()
    );
    assert_eq!(again.table, TableChange::Unchanged);
    assert!(!again.fwmark_rule_changed && !again.rp_filter_loosened);

    let listing = node.nft_list().expect("the table exists");
    for part in [
        "chain mark-primary",
        "type filter hook prerouting priority mangle; policy accept;",
        "iifname \"ens5\" fib daddr . iif type local ct mark set ct mark | 0x00000080",
        "type filter hook prerouting priority dstnat + 10; policy accept;",
        "iifname \"eni*\" ct state new ip daddr != 10.0.0.0/16 fib daddr type != local ct mark set ct mark | 0x00000080",
        "iifname \"eni*\" ct mark & 0x00000080 == 0x00000080 meta mark set meta mark | 0x00000080",
        "type nat hook postrouting priority srcnat + 10; policy accept;",
        "ip daddr 10.0.0.0/16 return",
        "snat to 10.0.0.4 fully-random",
    ] {
        assert!(listing.contains(part), "{part:?} missing from:\n{listing}");
    }
    assert_eq!(node.fwmark_rules(), 1);
    assert_eq!(node.rp_filter(), "2");

    // A restart: a new keeper finds exactly what it would load, and the kernel's table is the same.
    let i = imds.clone();
    let restarted = node.run(move || async move {
        let mut k = keeper(HostRulesConfig::default(), &i);
        let r = k.sync().await.expect("after a restart");
        // A VPC CIDR is added: seen at the next IMDS read (every 30 s), not before.
        i.set_cidrs(&["10.0.0.0/16", "100.64.0.0/16"]);
        let before_refresh = k.sync().await.expect("before the refresh");
        tokio::time::advance(Duration::from_secs(31)).await;
        let after_refresh = k.sync().await.expect("after the refresh");
        (r, before_refresh, after_refresh)
    });
    assert_eq!(restarted.0.table, TableChange::Kept);
    assert!(!restarted.0.fwmark_rule_changed);
    assert_eq!(restarted.1.table, TableChange::Unchanged);
    assert_eq!(restarted.2.table, TableChange::Updated);
    let listing = node.nft_list().expect("the table exists");
    assert!(
        listing.contains("ip daddr != { 10.0.0.0/16, 100.64.0.0/16 }")
            && listing.contains("ip daddr { 10.0.0.0/16, 100.64.0.0/16 } return"),
        "{listing}"
    );
    assert_eq!(node.fwmark_rules(), 1, "never duplicated");
}

#[test]
fn drift_is_healed_and_a_failing_imds_keeps_the_rules() {
    let Some(node) = Node::new("drift_is_healed_and_a_failing_imds_keeps_the_rules") else {
        return;
    };
    let imds = FakeImds::new(&["10.0.0.0/16"]);
    let i = imds.clone();
    let path = node.path();
    let (installed, repaired) = node.run(move || async move {
        let mut k = keeper(HostRulesConfig::default(), &i);
        k.sync().await.expect("install");
        let installed = HostRules::new(Nft::default())
            .unwrap()
            .listing()
            .await
            .unwrap()
            .expect("listed");
        let mut repaired = Vec::new();
        // Each break is done from outside (nsenter), as an operator or another agent would.
        for script in [
            "delete rule ip eniipam mark-primary handle HANDLE",
            "flush chain ip eniipam pod-snat",
            "add rule ip eniipam mark-pods counter accept",
            "delete table ip eniipam",
        ] {
            let script = if script.contains("HANDLE") {
                let h = handle_of_at(&path, "mark-primary", "fib daddr");
                script.replace("HANDLE", &h)
            } else {
                script.to_owned()
            };
            run_nft_at(&path, &script);
            repaired.push((script, k.sync().await.expect("repair").table));
        }
        // The fwmark rule deleted by hand comes back.
        run_ip_at(&path, &["rule", "del", "priority", "1024"]);
        let r = k.sync().await.expect("rule repair");
        assert!(r.fwmark_rule_changed);
        // IMDS failing after a success: the rules stay as they are.
        i.fail(true);
        tokio::time::advance(Duration::from_secs(31)).await;
        let r = k
            .sync()
            .await
            .expect("IMDS down is not a failure once facts are known");
        assert_eq!(r.table, TableChange::Unchanged);
        (installed, repaired)
    });
    for (script, change) in &repaired {
        assert_eq!(*change, TableChange::Repaired, "after `{script}`");
    }
    assert_eq!(node.nft_list().as_deref(), Some(installed.as_str()));
    assert_eq!(node.fwmark_rules(), 1);
    drop(node);

    // With no facts yet, a failing IMDS fails the round and installs nothing.
    let Some(node) = Node::new("drift_is_healed_and_a_failing_imds_keeps_the_rules (2)") else {
        return;
    };
    let i = FakeImds::new(&[]);
    let err = node.run(move || async move {
        keeper(HostRulesConfig::default(), &i)
            .sync()
            .await
            .expect_err("no VPC CIDRs")
    });
    assert!(
        matches!(&err, RulesError::Metadata(m) if m.contains("vpc-ipv4-cidr-blocks")),
        "{err}"
    );
    assert_eq!(node.nft_list(), None);
    assert_eq!(node.fwmark_rules(), 0);
}

#[test]
fn knobs_turned_off_remove_rules_and_uninstall_removes_everything() {
    let Some(node) = Node::new("knobs_turned_off_remove_rules_and_uninstall_removes_everything")
    else {
        return;
    };
    let imds = FakeImds::new(&["10.0.0.0/16"]);
    let i = imds.clone();
    node.run(move || async move {
        keeper(HostRulesConfig::default(), &i)
            .sync()
            .await
            .expect("install");
    });
    // External SNAT (a NAT gateway): the SNAT chain and the egress mark go, the NodePort marks stay.
    let i = imds.clone();
    let r = node.run(move || async move {
        keeper(
            HostRulesConfig {
                snat: Snat::External,
                ..HostRulesConfig::default()
            },
            &i,
        )
        .sync()
        .await
        .expect("external SNAT")
    });
    assert_eq!(r.table, TableChange::Installed);
    let listing = node.nft_list().expect("table");
    assert!(
        !listing.contains("snat") && !listing.contains("ct state new"),
        "{listing}"
    );
    assert!(
        listing.contains("chain mark-primary") && listing.contains("meta mark set"),
        "{listing}"
    );
    // SNAT with hashrandom ports and an exclusion, no NodePort support.
    let i = imds.clone();
    node.run(move || async move {
        keeper(
            HostRulesConfig {
                snat: Snat::Node {
                    ports: SnatPorts::Hashrandom,
                    exclude: vec!["192.168.0.0/16".parse().unwrap()],
                },
                node_port_support: false,
                ..HostRulesConfig::default()
            },
            &i,
        )
        .sync()
        .await
        .expect("SNAT only")
    });
    let listing = node.nft_list().expect("table");
    assert!(!listing.contains("mark-primary"), "{listing}");
    assert!(listing.contains("snat to 10.0.0.4 random"), "{listing}");
    assert!(
        listing.contains("{ 10.0.0.0/16, 192.168.0.0/16 }"),
        "{listing}"
    );
    // Both off: nothing at all.
    let i = imds.clone();
    let r = node.run(move || async move {
        keeper(
            HostRulesConfig {
                snat: Snat::External,
                node_port_support: false,
                ..HostRulesConfig::default()
            },
            &i,
        )
        .sync()
        .await
        .expect("both off")
    });
    assert_eq!(r.table, TableChange::Removed);
    assert!(r.fwmark_rule_changed);
    assert_eq!(node.nft_list(), None);
    assert_eq!(node.fwmark_rules(), 0);

    // Uninstall after a default install.
    let i = imds.clone();
    let removed = node.run(move || async move {
        keeper(HostRulesConfig::default(), &i)
            .sync()
            .await
            .expect("install");
        let rules = HostRules::new(Nft::default()).unwrap();
        let first = rules.uninstall(0x80).await.expect("uninstall");
        let second = rules.uninstall(0x80).await.expect("uninstall again");
        (first, second)
    });
    assert!(
        removed.0.table && removed.0.fwmark_rules == 1,
        "{:?}",
        removed.0
    );
    assert!(
        !removed.1.table && removed.1.fwmark_rules == 0,
        "idempotent: {:?}",
        removed.1
    );
    assert_eq!(node.nft_list(), None);
    assert_eq!(node.fwmark_rules(), 0);
}

#[test]
fn coexists_with_kube_proxy_and_portmap_iptables_rules() {
    let Some(node) = Node::new("coexists_with_kube_proxy_and_portmap_iptables_rules") else {
        return;
    };
    // kube-proxy (iptables mode, iptables-nft backend) and portmap's chains, before eniipam starts.
    let kube = "*nat
:KUBE-SERVICES - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-POSTROUTING - [0:0]
:CNI-HOSTPORT-DNAT - [0:0]
-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES
-A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING
-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-POSTROUTING -m mark --mark 0x4000/0x4000 -j MASQUERADE
COMMIT
";
    let (ok, out) = node.exec("iptables-restore", &["--noflush"], Some(kube));
    assert!(ok, "{out}");
    let kube_before = iptables_nat(&node);
    let i = FakeImds::new(&["10.0.0.0/16"]);
    node.run(move || async move {
        keeper(HostRulesConfig::default(), &i)
            .sync()
            .await
            .expect("install")
    });
    assert_eq!(
        iptables_nat(&node),
        kube_before,
        "eniipam left iptables' tables alone"
    );
    let ours = node.nft_list().expect("ours");
    // kube-proxy rewrites its chains (iptables-restore, as on every sync): ours stay.
    let (ok, out) = node.exec("iptables-restore", &["--noflush"], Some(kube));
    assert!(ok, "{out}");
    assert_eq!(node.nft_list().as_deref(), Some(ours.as_str()));
    // Our chains sit around iptables' own on the same hooks: mangle before its DNAT, ours after it,
    // our SNAT after its masquerade.
    let (ok, all) = node.exec("nft", &["list", "ruleset"], None);
    assert!(ok, "{all}");
    assert!(
        all.contains("table ip nat") && all.contains("table ip eniipam"),
        "{all}"
    );
}

#[test]
fn a_missing_nft_is_a_clear_error() {
    let Some(node) = Node::new("a_missing_nft_is_a_clear_error") else {
        return;
    };
    let i = FakeImds::new(&["10.0.0.0/16"]);
    let err = node.run(move || async move {
        RulesKeeper::new(
            HostRulesConfig::default(),
            HostRules::new(Nft::new("/nonexistent/nft")).unwrap(),
            Arc::new(ImdsPrimary(i)),
            Duration::from_secs(30),
        )
        .sync()
        .await
        .expect_err("no nft")
    });
    let text = err.to_string();
    assert!(
        text.contains("/nonexistent/nft") && text.contains("nftables"),
        "{text}"
    );
}

fn iptables_nat(node: &Node) -> String {
    let (ok, out) = node.exec("iptables-save", &["-t", "nat"], None);
    assert!(ok, "{out}");
    // Drop the comment lines with timestamps and the packet counters.
    out.lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split(" [").next().unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n")
}

fn run_at(path: &str, program: &str, args: &[&str]) -> String {
    let out = Command::new("nsenter")
        .arg(format!("--net={path}"))
        .arg("--")
        .arg(program)
        .args(args)
        .output()
        .expect("nsenter");
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn run_nft_at(path: &str, command: &str) {
    let args: Vec<&str> = command.split(' ').collect();
    run_at(path, "nft", &args);
}

fn run_ip_at(path: &str, args: &[&str]) {
    run_at(path, "ip", args);
}

fn handle_of_at(path: &str, chain: &str, needle: &str) -> String {
    let out = run_at(
        path,
        "nft",
        &["-a", "list", "chain", "ip", "eniipam", chain],
    );
    out.lines()
        .find(|l| l.contains(needle))
        .and_then(|l| l.rsplit("# handle ").next())
        .unwrap_or_else(|| panic!("no rule with {needle:?} in {chain}: {out}"))
        .trim()
        .to_owned()
}
