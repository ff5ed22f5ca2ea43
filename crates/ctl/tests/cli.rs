//! `eniipamctl` as an operator runs it, without a daemon: clear errors and exit codes. (Against a
//! running daemon: the workspace's `tests/daemon_simulate.rs`.)

use std::process::Command;

#[test]
fn a_missing_socket_is_named_with_what_to_do() {
    let out = Command::new(env!("CARGO_BIN_EXE_eniipamctl"))
        .args(["--socket", "/nonexistent/eniipam.sock", "status"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("/nonexistent/eniipam.sock"), "{err}");
    assert!(err.contains("is eniipamd running"), "{err}");
}

#[test]
fn unknown_subcommands_are_refused_by_clap() {
    let out = Command::new(env!("CARGO_BIN_EXE_eniipamctl"))
        .arg("frobnicate")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

fn ctl(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_eniipamctl"))
        .args(args)
        .output()
        .unwrap()
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn max_pods_prints_what_kubelet_should_get() {
    for (t, pd, want) in [
        ("m5.large", false, "29"),
        ("t3.micro", false, "4"),
        ("p5.48xlarge", false, "100"),
        ("m5.large", true, "110"),
        ("m5.24xlarge", true, "250"),
    ] {
        let mut args = vec!["max-pods", "--instance-type", t];
        if pd {
            args.push("--prefix-delegation");
        }
        let out = ctl(&args);
        assert!(out.status.success(), "{t}: {}", stderr(&out));
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            want,
            "{t} pd={pd}"
        );
        assert!(
            stderr(&out).contains("maxPodsExpression"),
            "{}",
            stderr(&out)
        );
    }
    let out = ctl(&["--json", "max-pods", "--instance-type", "m5.large"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["max_pods"], 29);
    assert_eq!(v["pod_ips"], 27);
    assert_eq!(v["vpc_cni_max_pods"], 29);
    assert_eq!(
        v["nodeadm_max_pods_expression"],
        "default_enis * (ips_per_eni - 1) + 2"
    );
}

#[test]
fn max_pods_for_an_unknown_type_says_what_to_pass() {
    let out = ctl(&["max-pods", "--instance-type", "z9.huge"]);
    assert_eq!(out.status.code(), Some(1));
    let e = stderr(&out);
    assert!(
        e.contains("z9.huge") && e.contains("--enis") && e.contains("describe-instance-types"),
        "{e}"
    );
    let out = ctl(&[
        "max-pods",
        "--instance-type",
        "z9.huge",
        "--enis",
        "4",
        "--ips-per-eni",
        "15",
        "--vcpus",
        "8",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "58");
    let out = ctl(&[
        "max-pods",
        "--instance-type",
        "z9.huge",
        "--enis",
        "0",
        "--ips-per-eni",
        "15",
        "--vcpus",
        "8",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("ENIs"), "{}", stderr(&out));
}

#[test]
fn iam_policy_is_scoped_to_the_cluster_and_partition() {
    let out = ctl(&[
        "iam-policy",
        "--cluster",
        "prod",
        "--vpc-id",
        "vpc-0a1b2c3d",
        "--partition",
        "aws-us-gov",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["Version"], "2012-10-17");
    assert!(text.contains("arn:aws-us-gov:ec2:*:*:network-interface/*"));
    assert!(text.contains("\"aws:ResourceTag/eniipam.io/cluster\": \"prod\""));
    assert!(text.contains("\"aws:RequestTag/eniipam.io/cluster\": \"prod\""));
    assert!(text.contains("\"ec2:Vpc\": \"arn:aws-us-gov:ec2:*:*:vpc/vpc-0a1b2c3d\""));
    let out = ctl(&["iam-policy", "--cluster", "", "--vpc-id", "vpc-0a1b2c3d"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("ENIIPAM_CLUSTER_NAME"));
    assert_eq!(
        ctl(&["iam-policy", "--vpc-id", "vpc-0a1b2c3d"])
            .status
            .code(),
        Some(2),
        "--cluster is required"
    );
    assert_eq!(
        ctl(&["iam-policy", "--cluster", "prod"]).status.code(),
        Some(2),
        "--vpc-id is required"
    );
    let out = ctl(&[
        "iam-policy",
        "--cluster",
        "prod",
        "--vpc-id",
        "subnet-0a1b2c3d",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("--vpc-id"), "{}", stderr(&out));
}

/// A host root and an image plugin dir, for the installer's refusals (none needs a daemon: each is
/// found before waiting for one).
struct Host {
    dir: tempfile::TempDir,
}

impl Host {
    fn new() -> Host {
        let dir = tempfile::tempdir().unwrap();
        for d in ["host/opt/cni/bin", "host/etc/cni/net.d", "image"] {
            std::fs::create_dir_all(dir.path().join(d)).unwrap();
        }
        for p in ["eniipam", "loopback", "portmap"] {
            std::fs::write(dir.path().join("image").join(p), p).unwrap();
        }
        std::fs::write(
            dir.path().join("image/10-eniipam.conflist"),
            r#"{"cniVersion":"1.0.0","name":"eniipam","plugins":[{"type":"eniipam"},{"type":"portmap"}]}"#,
        )
        .unwrap();
        Host { dir }
    }

    fn path(&self, p: &str) -> String {
        self.dir.path().join(p).display().to_string()
    }

    fn install(&self, extra: &[&str]) -> std::process::Output {
        let mut args = vec![
            "--socket".to_owned(),
            self.path("no-daemon.sock"),
            "install-cni".to_owned(),
            format!("--host-root={}", self.path("host")),
            format!("--plugins-from={}", self.path("image")),
            format!("--conflist={}", self.path("image/10-eniipam.conflist")),
            "--health-interval-secs=1".to_owned(),
            "--timeout-secs=1".to_owned(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        Command::new(env!("CARGO_BIN_EXE_eniipamctl"))
            .args(&args)
            .output()
            .unwrap()
    }
}

#[test]
fn install_cni_refuses_a_config_that_would_shadow_eniipams() {
    let h = Host::new();
    std::fs::write(h.path("host/etc/cni/net.d/10-aws.conflist"), "{}").unwrap();
    let out = h.install(&[]);
    assert_eq!(out.status.code(), Some(1));
    let e = stderr(&out);
    assert!(
        e.contains("10-aws.conflist") && e.contains("sorts before"),
        "{e}"
    );
    assert!(!std::path::Path::new(&h.path("host/etc/cni/net.d/10-eniipam.conflist")).exists());
    // A config that sorts after eniipam's is harmless: the refusal is then about the missing daemon.
    std::fs::remove_file(h.path("host/etc/cni/net.d/10-aws.conflist")).unwrap();
    std::fs::write(h.path("host/etc/cni/net.d/99-other.conflist"), "{}").unwrap();
    let e = stderr(&h.install(&[]));
    assert!(
        e.contains("not healthy within") && e.contains("conflist was not written"),
        "{e}"
    );
    // The plugins were installed meanwhile.
    assert_eq!(
        std::fs::read(h.path("host/opt/cni/bin/portmap")).unwrap(),
        b"portmap"
    );
}

#[test]
fn install_cni_checks_its_inputs_first() {
    let h = Host::new();
    std::fs::remove_file(h.path("image/loopback")).unwrap();
    let e = stderr(&h.install(&[]));
    assert!(
        e.contains("plugin loopback") && e.contains("--plugins-from"),
        "{e}"
    );

    let h = Host::new();
    std::fs::write(
        h.path("image/10-eniipam.conflist"),
        r#"{"cniVersion":"1.0.0","name":"eniipam","plugins":[{"type":"eniipam"},{"type":"bandwidth"}]}"#,
    )
    .unwrap();
    let e = stderr(&h.install(&[]));
    assert!(
        e.contains("\"bandwidth\"") && e.contains("neither installed"),
        "{e}"
    );

    let h = Host::new();
    std::fs::write(h.path("image/10-eniipam.conflist"), "not json").unwrap();
    let e = stderr(&h.install(&[]));
    assert!(e.contains("not valid JSON"), "{e}");

    let h = Host::new();
    let e = stderr(&h.install(&["--check"]));
    assert!(
        e.contains("not installed") && e.contains("10-eniipam.conflist"),
        "{e}"
    );
    assert_eq!(
        h.install(&["--check", "--wait"]).status.code(),
        Some(2),
        "clap refuses both"
    );
}

#[test]
fn uninstall_cni_removes_the_conflist_and_only_eniipams_plugin() {
    let h = Host::new();
    std::fs::write(h.path("host/etc/cni/net.d/10-eniipam.conflist"), "{}").unwrap();
    for p in ["eniipam", "portmap"] {
        std::fs::write(h.path(&format!("host/opt/cni/bin/{p}")), p).unwrap();
    }
    let host_root = format!("--host-root={}", h.path("host"));
    let out = ctl(&["uninstall-cni", &host_root]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!std::path::Path::new(&h.path("host/etc/cni/net.d/10-eniipam.conflist")).exists());
    assert!(std::path::Path::new(&h.path("host/opt/cni/bin/eniipam")).exists());
    let out = ctl(&["uninstall-cni", &host_root, "--remove-plugin"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!std::path::Path::new(&h.path("host/opt/cni/bin/eniipam")).exists());
    assert!(
        std::path::Path::new(&h.path("host/opt/cni/bin/portmap")).exists(),
        "the reference plugins are shared with other CNIs"
    );
}

#[test]
fn max_pods_for_ipv6_is_the_kubernetes_cap_and_dual_is_bound_by_ipv4() {
    // IPv6 pods come from the node's /80: ENIs and secondary IPs do not bound them.
    for (t, want) in [
        ("t3.micro", "110"),
        ("m5.large", "110"),
        ("m5.24xlarge", "250"),
    ] {
        let out = ctl(&["max-pods", "--instance-type", t, "--ip-family", "ipv6"]);
        assert!(out.status.success(), "{t}: {}", stderr(&out));
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), want, "{t}");
        assert!(stderr(&out).contains("/80"), "{}", stderr(&out));
    }
    let out = ctl(&[
        "--json",
        "max-pods",
        "--instance-type",
        "t3.micro",
        "--ip-family",
        "ipv6",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ip_family"], "ipv6");
    assert_eq!(v["max_pods"], 110);
    assert_eq!(v["nodeadm_max_pods_expression"], "110");
    // The VPC CNI's IPv6 nodes get its prefix-delegation figure: 2 × (2 − 1) × 16 + 2.
    assert_eq!(v["vpc_cni_max_pods"], 34);
    // A type not in the table needs only its vCPUs.
    let out = ctl(&[
        "max-pods",
        "--instance-type",
        "z9.huge",
        "--ip-family",
        "ipv6",
        "--vcpus",
        "64",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "250");
    let out = ctl(&[
        "max-pods",
        "--instance-type",
        "z9.huge",
        "--ip-family",
        "ipv6",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("pass --vcpus"), "{}", stderr(&out));
    // dual: every pod also takes an IPv4 from the pool, so the IPv4 figure stands.
    for (t, want) in [("m5.large", "29"), ("t3.micro", "4")] {
        let out = ctl(&["max-pods", "--instance-type", t, "--ip-family", "dual"]);
        assert!(out.status.success(), "{t}: {}", stderr(&out));
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            want,
            "{t} dual"
        );
    }
    let out = ctl(&[
        "max-pods",
        "--instance-type",
        "m5.large",
        "--ip-family",
        "ipv5",
    ]);
    assert_eq!(out.status.code(), Some(2), "clap names the valid families");
    assert!(stderr(&out).contains("ipv6"), "{}", stderr(&out));
}

#[test]
fn max_pods_with_custom_networking_leaves_eth0_out() {
    // eth0 serves no pods: one ENI fewer, as the VPC CNI's custom-networking figure.
    for (t, pd, want) in [
        ("m5.large", false, "20"),
        ("c5.4xlarge", false, "205"),
        ("t3.micro", false, "3"),
        ("m5.large", true, "110"),
    ] {
        let mut args = vec!["max-pods", "--instance-type", t, "--custom-networking"];
        if pd {
            args.push("--prefix-delegation");
        }
        let out = ctl(&args);
        assert!(out.status.success(), "{t}: {}", stderr(&out));
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            want,
            "{t} pd={pd}"
        );
        assert!(
            stderr(&out).contains("eth0 serves none"),
            "{}",
            stderr(&out)
        );
    }
    let out = ctl(&[
        "--json",
        "max-pods",
        "--instance-type",
        "m5.large",
        "--custom-networking",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["max_pods"], 20);
    assert_eq!(v["pod_ips"], 18);
    assert_eq!(v["enis"], 3);
    assert_eq!(v["pod_enis"], 2);
    assert_eq!(v["vpc_cni_max_pods"], 20);
    assert_eq!(v["custom_networking"], true);
    assert_eq!(
        v["nodeadm_max_pods_expression"],
        "(default_enis - 1) * (ips_per_eni - 1) + 2"
    );
    // IPv6 pods take no ENI addresses; a one-ENI type leaves none for pods.
    let out = ctl(&[
        "max-pods",
        "--instance-type",
        "m5.large",
        "--custom-networking",
        "--ip-family",
        "ipv6",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("--custom-networking"),
        "{}",
        stderr(&out)
    );
    let out = ctl(&[
        "max-pods",
        "--instance-type",
        "z9.tiny",
        "--enis",
        "1",
        "--ips-per-eni",
        "4",
        "--vcpus",
        "2",
        "--custom-networking",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("no ENI is left"), "{}", stderr(&out));
}
