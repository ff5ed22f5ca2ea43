//! The production daemon path on a test node: mockcloud served from inside the node's network
//! namespace (its listeners are bound by a thread that joined the namespace, so the EC2 and IMDS
//! endpoints are the node's 127.0.0.1), and the real `eniipamd` binary, configured only through
//! `ENIIPAM_*` variables as the DaemonSet does, with the shipped socket path `/run/eniipam/eniipam.sock`.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;
use std::process::Command;
use std::thread::JoinHandle;
use std::time::Duration;

use mockcloud::MockCloud;
use nix::sched::{CloneFlags, setns};
use serde::Deserialize;
use tokio::sync::oneshot;

use super::node::Node;

/// The cluster name of the runtime tests' daemons.
const CLUSTER: &str = "runtime-test";
use super::{output_of, tail, target_bin, wait_for};

/// mockcloud running on its own thread inside a network namespace.
pub struct MockInNetns {
    pub mock: MockCloud,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl MockInNetns {
    /// Starts mockcloud (no latency, no throttling) with a default `instance_type` node.
    pub fn start(netns_path: &str, instance_type: &str) -> MockInNetns {
        let config = mockcloud::Config {
            default_instance_type: instance_type.to_owned(),
            ..mockcloud::Config::fast()
        };
        let path = netns_path.to_owned();
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            // Only this thread (and the runtime's, all created from it) joins the namespace.
            let joined = std::fs::File::open(&path)
                .map_err(|e| format!("opening {path}: {e}"))
                .and_then(|f| {
                    setns(&f, CloneFlags::CLONE_NEWNET).map_err(|e| format!("setns {path}: {e}"))
                });
            if let Err(e) = joined {
                let _ = started_tx.send(Err(e));
                return;
            }
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("mockcloud runtime");
            rt.block_on(async move {
                match MockCloud::start(config).await {
                    Ok(mock) => {
                        // The shipped IAM policy for the test's cluster, as EC2 would enforce it.
                        mock.enforce_shipped_policy(CLUSTER);
                        let _ = started_tx.send(Ok(mock.clone()));
                        let _ = stopped.await;
                        drop(mock);
                    }
                    Err(e) => {
                        let _ = started_tx.send(Err(format!("mockcloud: {e}")));
                    }
                }
            });
        });
        let mock = started_rx
            .recv()
            .expect("mockcloud thread")
            .unwrap_or_else(|e| panic!("starting mockcloud in {netns_path}: {e}"));
        MockInNetns {
            mock,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// The default world's subnet (where every pod IP must come from).
    pub fn subnet(&self) -> ipnet::Ipv4Net {
        self.mock
            .default_world()
            .expect("mockcloud's default world")
            .subnet_cidr
    }

    /// The pod addresses EC2 shows on the node's attached ENIs, eth0 included: secondary IPs and
    /// the addresses of delegated prefixes.
    pub fn ec2_pod_ips(&self) -> Vec<Ipv4Addr> {
        let id = self.mock.default_instance().instance_id;
        let inst = self.mock.instance(&id).expect("the default instance");
        let mut ips: Vec<Ipv4Addr> = inst
            .enis
            .iter()
            .filter(|e| e.attachment.is_some())
            .flat_map(|e| {
                e.secondary_ips.iter().copied().chain(
                    e.ipv4_prefixes
                        .iter()
                        .flat_map(|p| eniipam::pool::slots::prefix_addresses(*p)),
                )
            })
            .collect();
        ips.sort();
        ips
    }
}

impl MockInNetns {
    /// The /80 prefixes EC2 shows on the node's eth0 (IPv6 pods' addresses come from there).
    pub fn ec2_eth0_ipv6_prefixes(&self) -> Vec<ipnet::Ipv6Net> {
        let id = self.mock.default_instance().instance_id;
        let inst = self.mock.instance(&id).expect("the default instance");
        inst.enis
            .iter()
            .find(|e| e.attachment.as_ref().is_some_and(|a| a.device_index == 0))
            .map(|e| e.ipv6_prefixes.clone())
            .unwrap_or_default()
    }
}

impl Drop for MockInNetns {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One allocation as `eniipamctl allocations --json` prints it: an IPv4 (ipv4 and dual) and an IPv6
/// (ipv6 and dual), `null` for the family the pod does not have.
#[derive(Clone, Debug, Deserialize)]
pub struct Allocation {
    pub ip: Option<Ipv4Addr>,
    pub ipv6: Option<Ipv6Addr>,
    pub container_id: String,
    pub ifname: String,
    pub netns: String,
    pub pod_namespace: String,
    pub pod_name: String,
    pub eni_id: String,
}

/// The real `eniipamd` running in a node.
pub struct Eniipamd {
    /// The socket as the machine sees it (`<node>/run-eniipam/eniipam.sock`, which is
    /// `/run/eniipam/eniipam.sock` inside the node).
    pub socket: PathBuf,
    pub log: PathBuf,
}

const NAME: &str = "eniipamd";

impl Eniipamd {
    /// Starts `eniipamd` (not `--simulate`) against `mock`, and waits until it serves.
    pub fn start(node: &mut Node, mock: &MockInNetns) -> Eniipamd {
        Self::start_with(node, mock, &[])
    }

    /// [`Eniipamd::start`] with more `ENIIPAM_*` variables (e.g. `ENIIPAM_IP_FAMILY`), as a
    /// DaemonSet's env would set them.
    pub fn start_with(node: &mut Node, mock: &MockInNetns, env: &[(&str, &str)]) -> Eniipamd {
        let world = mock.mock.default_world().expect("default world");
        let state = node.dir.join("eniipamd-state");
        std::fs::create_dir_all(&state).expect("state dir");
        let ec2 = mock.mock.ec2_url();
        let state_path = state.join("state.db");
        let mut cmd = node.command(target_bin("eniipamd"));
        cmd.envs([
            ("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE"),
            ("AWS_SECRET_ACCESS_KEY", "test"),
            ("ENIIPAM_CLUSTER_NAME", CLUSTER),
            ("ENIIPAM_REGION", mock.mock.region()),
            ("ENIIPAM_EC2_ENDPOINT", ec2.as_str()),
            ("ENIIPAM_IMDS_ENDPOINT", world.instance.imds_url.as_str()),
            // The default socket and CNI cache paths, as shipped; only the state file is moved (the
            // node's /var/lib is a tmpfs the test cannot read from outside).
            (
                "ENIIPAM_STATE_PATH",
                state_path.to_str().expect("utf-8 path"),
            ),
            // No ENI links exist in the test's namespace (mockcloud's ENIs are not real devices).
            ("ENIIPAM_MANAGE_ENI_ROUTES", "false"),
            ("ENIIPAM_METRICS_ADDR", "127.0.0.1:0"),
            ("ENIIPAM_LOG_FORMAT", "text"),
            ("ENIIPAM_LOG_LEVEL", "info"),
            ("ENIIPAM_EC2_MUTATING_QPS", "100"),
            ("ENIIPAM_EC2_MUTATING_BURST", "100"),
            ("ENIIPAM_EC2_DESCRIBE_QPS", "100"),
            ("ENIIPAM_EC2_DESCRIBE_BURST", "100"),
            ("NO_COLOR", "1"),
        ]);
        cmd.envs(env.iter().copied());
        let log = node.spawn(NAME, cmd);
        let daemon = Eniipamd {
            socket: node.dir.join("run-eniipam").join("eniipam.sock"),
            log,
        };
        wait_for(
            "eniipamd to serve (eniipamctl health)",
            Duration::from_secs(30),
            || {
                if let Some(status) = node.exited(NAME) {
                    panic!("eniipamd exited ({status})\n{}", tail(&daemon.log, 40));
                }
                (daemon.socket.exists() && daemon.ctl(&["health"]).status.success()).then_some(())
            },
            || tail(&daemon.log, 40),
        );
        daemon
    }

    /// Runs `eniipamctl --socket <socket> <args>` from outside the node (a unix socket path works
    /// across network namespaces).
    pub fn ctl(&self, args: &[&str]) -> std::process::Output {
        output_of(
            Command::new(target_bin("eniipamctl"))
                .arg("--socket")
                .arg(&self.socket)
                .args(args),
        )
    }

    /// Every allocation the daemon holds.
    pub fn allocations(&self) -> Vec<Allocation> {
        let out = self.ctl(&["--json", "allocations"]);
        assert!(
            out.status.success(),
            "eniipamctl allocations: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "eniipamctl allocations --json: {e}: {}",
                String::from_utf8_lossy(&out.stdout)
            )
        })
    }

    /// `eniipamctl status --json`.
    pub fn status(&self) -> serde_json::Value {
        let out = self.ctl(&["--json", "status"]);
        assert!(
            out.status.success(),
            "eniipamctl status: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("eniipamctl status --json is JSON")
    }

    /// `eniipamctl status` (human form, for messages).
    pub fn status_text(&self) -> String {
        String::from_utf8_lossy(&self.ctl(&["status"]).stdout).into_owned()
    }
}

/// Stops the daemon gracefully (it is otherwise stopped with the node).
pub fn stop(node: &mut Node) {
    node.stop(NAME, Duration::from_secs(25));
}
