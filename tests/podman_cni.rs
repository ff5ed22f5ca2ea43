//! podman 4.3 with its CNI network backend executes the real `eniipam` plugin with the conflist exactly
//! as shipped in `deploy/10-eniipam.conflist` (read from disk, copied byte for byte into
//! `--network-config-dir`), chained with the reference `portmap` (one container publishes a port), against the real `eniipamd` binary on mockcloud: containers get distinct
//! pool IPs that the daemon and EC2 agree on, and removing them gives every IP back.
//!
//! Everything runs in a network namespace and a private mount namespace the test makes (see
//! `tests/runtime_support/`); needs root, and podman/runc/CNI plugins installed by
//! `.ci/install-runtimes.sh`. `ENIIPAM_TEST_CONFLIST=<file>` runs it with another conflist;
//! `ENIIPAM_TEST_KEEP=1` keeps the node's temp dir (logs) after the run.

// These tests drive real processes (containerd, runc, podman) that live on the wall clock: waiting
// for them uses std time, not tokio's pausable clock.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

mod runtime_support;

use std::collections::HashSet;
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use runtime_support::daemon::{self, Eniipamd, MockInNetns};
use runtime_support::image::IMAGE;
use runtime_support::node::{Node, describe};
use runtime_support::podman::Podman;
use runtime_support::{
    conflist_under_test, dir_entries, files_under, in_netns, require_program, root_or_skip,
    tcp_roundtrip, version_line,
};

const CONTAINERS: usize = 4;
const HOST_PORT: u16 = 30081;
const CONTAINER_PORT: u16 = 8080;

fn text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn podman_cni_backend_with_the_shipped_conflist() {
    if !root_or_skip("podman_cni_backend_with_the_shipped_conflist") {
        return;
    }
    let t0 = Instant::now();
    let conflist = conflist_under_test("deploy/10-eniipam.conflist");
    let network = serde_json::from_slice::<serde_json::Value>(
        &std::fs::read(&conflist).expect("reading the conflist"),
    )
    .expect("the conflist is JSON")["name"]
        .as_str()
        .expect("the conflist has a name")
        .to_owned();

    let mut node = Node::start("podman");
    let mock = MockInNetns::start(&node.netns_path(), "m5.xlarge");
    let eniipamd = Eniipamd::start(&mut node, &mock);
    let podman = Podman::setup(&node, &conflist);
    let setup = t0.elapsed();
    eprintln!(
        "{} | runc: {} | conflist {} (network {network:?})",
        version_line(
            require_program("podman").to_str().unwrap_or("podman"),
            &["--version"]
        ),
        version_line(
            require_program("runc").to_str().unwrap_or("runc"),
            &["--version"]
        ),
        conflist.display()
    );

    // podman only lists networks whose conflist it accepts.
    let networks = podman.run(&node, &["network", "ls", "--format", "{{.Name}}"]);
    assert!(
        String::from_utf8_lossy(&networks.stdout)
            .lines()
            .any(|l| l.trim() == network),
        "podman does not offer the network {network:?} from {}:\n{}",
        conflist.display(),
        text(&networks)
    );

    // Run the containers.
    let t_run = Instant::now();
    let subnet = mock.subnet();
    let mut started: Vec<(String, String, Ipv4Addr)> = Vec::new();
    let mut netns_paths = Vec::new();
    for i in 0..CONTAINERS {
        let name = format!("web-{i}");
        let cgroup_parent = format!("/{}", node.cgroup_parent);
        let publish = format!("{HOST_PORT}:{CONTAINER_PORT}");
        let mut args = vec![
            "run",
            "-d",
            "--name",
            &name,
            "--network",
            &network,
            "--cgroup-parent",
            &cgroup_parent,
            "--pull",
            "never",
        ];
        if i == 0 {
            // Through the chained portmap (podman passes the portMappings capability).
            args.extend(["--publish", &publish]);
        }
        args.push(IMAGE);
        let out = podman.run(&node, &args);
        if !out.status.success() {
            panic!(
                "podman run {name} failed: {}\neniipamd holds {} allocations afterwards",
                text(&out),
                eniipamd.allocations().len()
            );
        }
        let id = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        let inspect = podman.run(
            &node,
            &[
                "inspect",
                "--format",
                &format!("{{{{(index .NetworkSettings.Networks \"{network}\").IPAddress}}}}"),
                &name,
            ],
        );
        assert!(
            inspect.status.success(),
            "podman inspect: {}",
            text(&inspect)
        );
        let ip: Ipv4Addr = String::from_utf8_lossy(&inspect.stdout)
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("{name}: podman's IP: {e}: {}", text(&inspect)));
        started.push((name, id, ip));
    }
    let run_wall = t_run.elapsed();

    let held = eniipamd.allocations();
    assert_eq!(
        held.len(),
        CONTAINERS,
        "one allocation per container: {held:#?}"
    );
    let ec2 = mock.ec2_pod_ips();
    for (name, id, ip) in &started {
        let alloc = held
            .iter()
            .find(|a| &a.container_id == id)
            .unwrap_or_else(|| panic!("{name}: the daemon has no allocation for {id}: {held:#?}"));
        assert_eq!(alloc.ip, Some(*ip), "{name}: podman and eniipamd disagree");
        assert_eq!(alloc.ifname, "eth0");
        assert!(
            subnet.contains(ip),
            "{ip} is outside the VPC subnet {subnet}"
        );
        assert!(
            ec2.contains(ip),
            "{ip} is not on the node's ENIs in EC2: {ec2:?}"
        );
        let netns = node.inside(&alloc.netns);
        assert!(netns.exists(), "{name}: no netns {}", alloc.netns);
        let addrs = describe(
            Command::new(require_program("nsenter"))
                .arg(format!("--net={}", netns.display()))
                .args(["ip", "-o", "-4", "addr", "show", "dev", "eth0"]),
        );
        assert!(
            addrs.contains(&format!("inet {ip}/")),
            "{name}: eth0 in the container does not hold {ip}: {addrs}"
        );
        netns_paths.push(netns);
    }

    // The published port: a DNAT rule in the node, and a connection to the node's address on it
    // reaches a listener inside the container's namespace.
    let (_, _, port_ip) = started[0];
    let nat = node.nat_rules();
    assert!(
        nat.lines()
            .any(|l| l.contains(&format!("--dport {HOST_PORT}"))
                && l.contains(&format!("--to-destination {port_ip}:{CONTAINER_PORT}"))),
        "no DNAT {HOST_PORT} -> {port_ip}:{CONTAINER_PORT} in the node's nat table:\n{nat}"
    );
    let node_ip = mock.mock.default_instance().private_ip;
    node.add_local_address(node_ip);
    let listener = in_netns(&netns_paths[0], || {
        std::net::TcpListener::bind((Ipv4Addr::UNSPECIFIED, CONTAINER_PORT))
    })
    .expect("listening inside the container");
    tcp_roundtrip(
        listener,
        Path::new(&node.netns_path()),
        (node_ip, HOST_PORT).into(),
    )
    .unwrap_or_else(|e| {
        panic!("{node_ip}:{HOST_PORT} does not reach {port_ip}:{CONTAINER_PORT}: {e}")
    });
    let distinct: HashSet<_> = started.iter().map(|(_, _, ip)| ip).collect();
    assert_eq!(
        distinct.len(),
        CONTAINERS,
        "container IPs are not distinct: {started:?}"
    );

    // Remove them: every IP goes back, nothing is left.
    let t_down = Instant::now();
    for (name, _, _) in &started {
        let out = podman.run(&node, &["rm", "-f", "-t", "2", name]);
        assert!(out.status.success(), "podman rm {name}: {}", text(&out));
    }
    let down_wall = t_down.elapsed();
    let left = podman.run(&node, &["ps", "-a", "-q"]);
    assert!(
        String::from_utf8_lossy(&left.stdout).trim().is_empty(),
        "containers left: {}",
        text(&left)
    );
    let held = eniipamd.allocations();
    assert!(
        held.is_empty(),
        "the daemon still holds IPs after every container was removed (leaked): {held:#?}"
    );
    for netns in &netns_paths {
        assert!(
            !netns.exists(),
            "container netns {} is still there",
            netns.display()
        );
    }
    let netns_left = dir_entries(&node.inside("/run/netns"));
    let nat = node.nat_rules();
    assert!(
        !nat.contains(&format!("--dport {HOST_PORT}")),
        "the published port's rule outlived its container:\n{nat}"
    );
    assert!(
        netns_left.is_empty(),
        "container netns left: {netns_left:?}"
    );
    let cache = files_under(&node.dir.join("var-lib-cni"));
    assert!(cache.is_empty(), "CNI cache files left: {cache:?}");

    daemon::stop(&mut node);
    drop(mock);
    drop(node);
    eprintln!(
        "TIMING podman {} ({network}): setup {setup:?}; {CONTAINERS} podman run {run_wall:?}; \
         {CONTAINERS} podman rm {down_wall:?}; total {:?}",
        conflist.display(),
        t0.elapsed()
    );
}
