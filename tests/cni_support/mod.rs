//! Test support for the CNI plugin: a fake eniipamd (an in-process tonic `Ipam` server on a unix
//! socket), a runner that executes the real plugin binary the way a runtime does, and network
//! namespaces that clean themselves up.

#![allow(dead_code)]

pub mod v6;

use std::collections::{HashMap, VecDeque};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use eniipam::rpc::pb;
use eniipam::rpc::pb::ipam_server::{Ipam, IpamServer};
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tonic::{Code, Request, Response, Status};

/// One call the fake daemon received.
#[derive(Clone, Debug, PartialEq)]
pub enum Call {
    Allocate(pb::AllocateRequest),
    Release(pb::ReleaseRequest),
    Check(pb::CheckRequest),
    GarbageCollect(pb::GarbageCollectRequest),
    Status(pb::StatusRequest),
}

/// What the fake daemon knows and how it should misbehave.
#[derive(Debug, Default)]
pub struct FakeState {
    /// IPs not handed out yet, in order.
    pub free: VecDeque<Ipv4Addr>,
    /// (container_id, ifname) → IP.
    pub held: HashMap<(String, String), Ipv4Addr>,
    /// Every call, in order.
    pub calls: Vec<Call>,
    /// Route table to report for allocations (0: primary ENI).
    pub route_table: u32,
    /// When set, every call fails with this status (and reason, as the real daemon sends one).
    pub fail_with: Option<(Code, String, pb::ErrorReason)>,
    /// Status reply overrides.
    pub ready: bool,
    /// The IPv6 side (family, `/80`, addresses).
    pub v6: v6::FakeV6,
}

#[derive(Clone)]
struct FakeIpam {
    state: Arc<Mutex<FakeState>>,
}

impl FakeIpam {
    fn record(&self, call: Call) -> Result<std::sync::MutexGuard<'_, FakeState>, Status> {
        let mut state = self.state.lock().unwrap();
        state.calls.push(call);
        if let Some((code, msg, reason)) = &state.fail_with {
            return Err(eniipam_api::status_with_reason(*code, msg.clone(), *reason));
        }
        Ok(state)
    }
}

#[tonic::async_trait]
impl Ipam for FakeIpam {
    async fn allocate(
        &self,
        request: Request<pb::AllocateRequest>,
    ) -> Result<Response<pb::AllocateReply>, Status> {
        let req = request.into_inner();
        let mut state = self.record(Call::Allocate(req.clone()))?;
        if req.container_id.is_empty() {
            return Err(Status::invalid_argument("empty container_id"));
        }
        let key = (req.container_id.clone(), req.ifname.clone());
        let ipv6 = if state.v6.has_v6() {
            state.v6.allocate(&key)?
        } else {
            String::new()
        };
        let egress_ipv4 = state.v6.egress(&key);
        let ip = match state.held.get(&key) {
            _ if !state.v6.has_v4() => Ipv4Addr::UNSPECIFIED,
            Some(ip) => *ip,
            None => {
                let ip = state.free.pop_front().ok_or_else(|| {
                    Status::resource_exhausted("subnet subnet-0abc has no free addresses")
                })?;
                state.held.insert(key, ip);
                ip
            }
        };
        let route_table = state.route_table;
        let (ip, ipv4_subnet) = if state.v6.has_v4() {
            (ip.to_string(), "10.10.0.0/24")
        } else {
            (String::new(), "")
        };
        Ok(Response::new(pb::AllocateReply {
            ip,
            ipv6,
            ipv6_prefix: state.v6.prefix.clone(),
            ip_family: state.v6.family.clone(),
            vpc_ipv6_cidrs: if state.v6.has_v6() {
                vec!["2600:1f18:6d00::/56".into()]
            } else {
                Vec::new()
            },
            prefix_length: 24,
            eni_id: "eni-0123abcd".into(),
            mac: "02:00:00:aa:bb:cc".into(),
            device_index: route_table.saturating_sub(1),
            route_table,
            subnet_cidr: ipv4_subnet.into(),
            gateway: "10.10.0.1".into(),
            vpc_cidrs: vec!["10.10.0.0/16".into()],
            egress_ipv4,
            own_eni_egress: false,
        }))
    }

    async fn release(
        &self,
        request: Request<pb::ReleaseRequest>,
    ) -> Result<Response<pb::ReleaseReply>, Status> {
        let req = request.into_inner();
        let mut state = self.record(Call::Release(req.clone()))?;
        let key = (req.container_id, req.ifname);
        let (ipv6, ipv6_held_by_other) = state.v6.release(&key, &req.ipv6);
        let removed = state.held.remove(&key);
        if let Some(ip) = removed {
            state.free.push_back(ip);
        }
        // As the real daemon: the IP the caller is about to clean up is held by another attachment.
        let ip_held_by_other = state
            .held
            .values()
            .any(|ip| !req.ip.is_empty() && ip.to_string() == req.ip);
        Ok(Response::new(pb::ReleaseReply {
            released: removed.is_some(),
            ip: removed.map(|ip| ip.to_string()).unwrap_or_default(),
            ip_held_by_other,
            ipv6,
            ipv6_held_by_other,
        }))
    }

    async fn check(
        &self,
        request: Request<pb::CheckRequest>,
    ) -> Result<Response<pb::CheckReply>, Status> {
        let req = request.into_inner();
        let state = self.record(Call::Check(req.clone()))?;
        let key = (req.container_id, req.ifname);
        if state.v6.has_v6() {
            let held = state.v6.held.get(&key).cloned().unwrap_or_default();
            let ip = state
                .held
                .get(&key)
                .map(|ip| ip.to_string())
                .unwrap_or_default();
            let ok = !held.is_empty() && held == req.ipv6 && ip == req.ip;
            return Ok(Response::new(pb::CheckReply {
                ok,
                ip,
                message: if ok {
                    String::new()
                } else {
                    format!("attachment holds {held}")
                },
                ipv6: held,
                egress_ipv4: state.v6.egress_held.get(&key).cloned().unwrap_or_default(),
            }));
        }
        let held = state.held.get(&key).copied();
        Ok(Response::new(match held {
            Some(ip) if ip.to_string() == req.ip => pb::CheckReply {
                ok: true,
                ip: ip.to_string(),
                message: String::new(),
                ..Default::default()
            },
            Some(ip) => pb::CheckReply {
                ok: false,
                ip: ip.to_string(),
                message: format!("attachment holds {ip}"),
                ..Default::default()
            },
            None => pb::CheckReply {
                ok: false,
                ip: String::new(),
                message: "unknown attachment".into(),
                ..Default::default()
            },
        }))
    }

    async fn garbage_collect(
        &self,
        request: Request<pb::GarbageCollectRequest>,
    ) -> Result<Response<pb::GarbageCollectReply>, Status> {
        let req = request.into_inner();
        let mut state = self.record(Call::GarbageCollect(req.clone()))?;
        let valid: Vec<_> = req
            .valid
            .iter()
            .map(|a| (a.container_id.clone(), a.ifname.clone()))
            .collect();
        let stale: Vec<_> = state
            .held
            .keys()
            .filter(|k| !valid.contains(k))
            .cloned()
            .collect();
        let mut released = Vec::new();
        for key in stale {
            if let Some(ip) = state.held.remove(&key) {
                state.free.push_back(ip);
            }
            state.v6.held.remove(&key);
            released.push(pb::Attachment {
                container_id: key.0,
                ifname: key.1,
            });
        }
        let held_by_others = req
            .cleaning
            .iter()
            .filter(|c| {
                state.held.values().any(|ip| ip.to_string() == **c)
                    || state.v6.held.values().any(|ip| ip == *c)
            })
            .cloned()
            .collect();
        Ok(Response::new(pb::GarbageCollectReply {
            released,
            held_by_others,
        }))
    }

    async fn status(
        &self,
        request: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusReply>, Status> {
        let state = self.record(Call::Status(request.into_inner()))?;
        let idle = state.free.len() as u32;
        Ok(Response::new(pb::StatusReply {
            ready: state.ready,
            exhausted: idle == 0,
            reason: if idle == 0 {
                "subnet subnet-0abc has no free addresses".into()
            } else {
                String::new()
            },
            capacity: idle + state.held.len() as u32,
            idle,
            assigned: state.held.len() as u32,
            ..Default::default()
        }))
    }
}

/// A fake eniipamd serving `Ipam` on a unix socket in its own temp dir, on its own thread.
pub struct FakeDaemon {
    pub socket: PathBuf,
    pub state: Arc<Mutex<FakeState>>,
    dir: tempfile::TempDir,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl FakeDaemon {
    /// Serves `ips` (handed out in order).
    pub fn start(ips: &[Ipv4Addr]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("eniipam.sock");
        let state = Arc::new(Mutex::new(FakeState {
            free: ips.iter().copied().collect(),
            ready: true,
            ..FakeState::default()
        }));
        let (stop, stopped) = oneshot::channel::<()>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let service = FakeIpam {
            state: state.clone(),
        };
        let path = socket.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::UnixListener::bind(&path).unwrap();
                ready_tx.send(()).unwrap();
                tonic::transport::Server::builder()
                    .add_service(IpamServer::new(service))
                    .serve_with_incoming_shutdown(
                        tokio_stream::wrappers::UnixListenerStream::new(listener),
                        async {
                            let _ = stopped.await;
                        },
                    )
                    .await
                    .unwrap();
            });
        });
        ready_rx.recv().unwrap();
        Self {
            socket,
            state,
            dir,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// Stops serving and removes the socket (the daemon is "down").
    pub fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            thread.join().unwrap();
        }
        let _ = std::fs::remove_file(&self.socket);
    }

    /// A directory for the plugin's result cache, removed with the daemon.
    pub fn cache_dir(&self) -> PathBuf {
        self.dir.path().join("cache")
    }

    pub fn calls(&self) -> Vec<Call> {
        self.state.lock().unwrap().calls.clone()
    }

    pub fn releases(&self) -> Vec<pb::ReleaseRequest> {
        self.calls()
            .into_iter()
            .filter_map(|c| match c {
                Call::Release(r) => Some(r),
                _ => None,
            })
            .collect()
    }

    pub fn allocations(&self) -> usize {
        self.calls()
            .iter()
            .filter(|c| matches!(c, Call::Allocate(_)))
            .count()
    }

    pub fn held(&self) -> HashMap<(String, String), Ipv4Addr> {
        self.state.lock().unwrap().held.clone()
    }

    pub fn fail_with(&self, code: Code, msg: &str, reason: pb::ErrorReason) {
        self.state.lock().unwrap().fail_with = Some((code, msg.to_owned(), reason));
    }

    pub fn set_route_table(&self, table: u32) {
        self.state.lock().unwrap().route_table = table;
    }

    /// Answers `family` ("ipv6", "dual", or a bad value) with `prefix` as the node's `/80`, handing
    /// out `addresses` in order.
    pub fn set_ipv6(&self, family: &str, prefix: &str, addresses: &[&str]) {
        let v6 = &mut self.state.lock().unwrap().v6;
        v6.family = family.into();
        v6.prefix = prefix.into();
        v6.free = addresses.iter().map(|a| (*a).to_owned()).collect();
    }

    /// The IPv4 egress addresses the next IPv6-only allocations answer, in order.
    pub fn set_egress(&self, addresses: &[&str]) {
        self.state.lock().unwrap().v6.egress_free =
            addresses.iter().map(|a| (*a).to_owned()).collect();
    }

    pub fn held_v6(&self) -> HashMap<(String, String), String> {
        self.state.lock().unwrap().v6.held.clone()
    }

    pub fn set_ready(&self, ready: bool) {
        self.state.lock().unwrap().ready = ready;
    }
}

impl Drop for FakeDaemon {
    fn drop(&mut self) {
        self.stop();
    }
}

/// What one plugin run produced.
#[derive(Debug)]
pub struct PluginRun {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl PluginRun {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {self:?}"))
    }

    /// Asserts success and returns the JSON output (Null when empty).
    pub fn ok(&self) -> Value {
        assert_eq!(self.code, 0, "plugin failed: {self:?}");
        if self.stdout.trim().is_empty() {
            Value::Null
        } else {
            self.json()
        }
    }

    /// Asserts a spec error object with `code` and a non-zero exit, returns the object.
    pub fn err(&self, code: u64) -> Value {
        assert_ne!(
            self.code, 0,
            "plugin succeeded, expected error {code}: {self:?}"
        );
        let v = self.json();
        assert_eq!(v["code"].as_u64(), Some(code), "wrong error: {self:?}");
        assert!(v["msg"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
        assert!(v["cniVersion"].is_string(), "{v}");
        v
    }
}

#[path = "../bins/mod.rs"]
pub mod bins;

/// The plugin binary under test.
pub fn plugin_path() -> PathBuf {
    bins::target_bin("eniipam")
}

/// One invocation, as a runtime would make it.
#[derive(Clone, Debug)]
pub struct Invocation {
    pub command: String,
    pub container_id: Option<String>,
    pub netns: Option<String>,
    pub ifname: Option<String>,
    pub path: Option<String>,
    pub args: Option<String>,
    pub config: Vec<u8>,
    /// Run inside this (node) netns with `ip netns exec`.
    pub node: Option<String>,
    /// The binary (the plugin by default).
    pub binary: String,
}

impl Invocation {
    pub fn new(command: &str, config: &Value) -> Self {
        Self {
            command: command.into(),
            container_id: Some("c0ffee".into()),
            netns: Some("/var/run/netns/none".into()),
            ifname: Some("eth0".into()),
            path: Some("/usr/lib/cni".into()),
            args: Some(
                "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web;K8S_POD_UID=u-1".into(),
            ),
            config: config.to_string().into_bytes(),
            node: None,
            binary: plugin_path().display().to_string(),
        }
    }

    pub fn container(mut self, id: &str) -> Self {
        self.container_id = Some(id.into());
        self
    }

    pub fn netns(mut self, path: Option<&str>) -> Self {
        self.netns = path.map(Into::into);
        self
    }

    pub fn ifname(mut self, name: &str) -> Self {
        self.ifname = Some(name.into());
        self
    }

    pub fn pod(mut self, namespace: &str, name: &str) -> Self {
        self.args = Some(format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={name};K8S_POD_UID=uid-{name}"
        ));
        self
    }

    pub fn in_node(mut self, node: &Netns) -> Self {
        self.node = Some(node.name.clone());
        self
    }

    pub fn binary(mut self, binary: &str) -> Self {
        self.binary = binary.into();
        self
    }

    pub fn stdin(mut self, bytes: Vec<u8>) -> Self {
        self.config = bytes;
        self
    }

    pub fn run(&self) -> PluginRun {
        let mut cmd = match &self.node {
            Some(node) => {
                let mut c = Command::new(ip_binary());
                c.args(["netns", "exec", node, &self.binary]);
                c
            }
            None => Command::new(&self.binary),
        };
        cmd.env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("CNI_COMMAND", &self.command)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in [
            ("CNI_CONTAINERID", &self.container_id),
            ("CNI_NETNS", &self.netns),
            ("CNI_IFNAME", &self.ifname),
            ("CNI_PATH", &self.path),
            ("CNI_ARGS", &self.args),
        ] {
            if let Some(v) = v {
                cmd.env(k, v);
            }
        }
        let mut child = cmd.spawn().expect("spawning the plugin");
        let mut stdin = child.stdin.take().unwrap();
        let config = self.config.clone();
        // Write on a thread: the plugin may stop reading (oversized input) and exit.
        let writer = std::thread::spawn(move || {
            use std::io::Write;
            let _ = stdin.write_all(&config);
        });
        let out = child.wait_with_output().expect("waiting for the plugin");
        let _ = writer.join();
        PluginRun {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

/// A main-role network configuration for `daemon`.
pub fn main_config(daemon: &FakeDaemon, version: &str) -> Value {
    json!({
        "cniVersion": version,
        "name": "eniipam-test",
        "type": "eniipam",
        "socket": daemon.socket,
        "cache_dir": daemon.cache_dir(),
        "timeout_ms": 5000,
        "mtu": 1500,
    })
}

/// An IPAM-role network configuration (under bridge) for `daemon`.
pub fn ipam_config(daemon: &FakeDaemon, version: &str) -> Value {
    json!({
        "cniVersion": version,
        "name": "eniipam-test",
        // A main plugin that wires a /32 with its own link-local gateway, as Calico's does (the
        // reference plugins cannot, and are refused: see `ipam_role_refuses_reference_parents`).
        "type": "calico",
        "ipam": {
            "type": "eniipam",
            "socket": daemon.socket,
            "cache_dir": daemon.cache_dir(),
            "timeout_ms": 5000,
        },
    })
}

/// The cache files of the test network.
pub fn cache_files(daemon: &FakeDaemon) -> Vec<String> {
    let dir = daemon.cache_dir().join("eniipam-test");
    let mut names: Vec<String> = match std::fs::read_dir(&dir) {
        Ok(d) => d
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect(),
        Err(_) => Vec::new(),
    };
    names.sort();
    names
}

pub fn ip_binary() -> &'static str {
    for p in ["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"] {
        if Path::new(p).exists() {
            return p;
        }
    }
    "ip"
}

static NETNS_COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A named network namespace, deleted on drop (even when the test fails).
pub struct Netns {
    pub name: String,
}

impl Netns {
    pub fn new(tag: &str) -> Self {
        let n = NETNS_COUNTER.fetch_add(1, Ordering::SeqCst);
        let name = format!("eniipam-{tag}-{}-{n}", std::process::id());
        run_ok(ip_binary(), &["netns", "add", &name]);
        let ns = Self { name };
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    pub fn path(&self) -> String {
        format!("/run/netns/{}", self.name)
    }

    /// `ip -n <ns> <args>`, asserting success; returns stdout.
    pub fn ip(&self, args: &[&str]) -> String {
        let mut full = vec!["-n", &self.name];
        full.extend_from_slice(args);
        run_ok(ip_binary(), &full)
    }

    /// `ip -n <ns> -j <args>` parsed.
    pub fn ip_json(&self, args: &[&str]) -> Vec<Value> {
        let mut full = vec!["-j"];
        full.extend_from_slice(args);
        let out = self.ip(&full);
        if out.trim().is_empty() {
            return Vec::new();
        }
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("ip -j {args:?}: {e}: {out}"))
    }

    /// Runs a program inside the namespace; returns (success, combined output).
    pub fn exec(&self, program: &str, args: &[&str]) -> (bool, String) {
        let mut full = vec!["netns", "exec", &self.name, program];
        full.extend_from_slice(args);
        let out = Command::new(ip_binary()).args(&full).output().unwrap();
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    }

    /// Enables IPv6 forwarding inside the namespace (`net.ipv6.conf.all.forwarding`, this namespace
    /// only: eniipamd's job on a real node).
    pub fn enable_ipv6_forwarding(&self) {
        let (ok, out) = self.exec(
            "sh",
            &["-c", "echo 1 > /proc/sys/net/ipv6/conf/all/forwarding"],
        );
        assert!(ok, "enabling IPv6 forwarding: {out}");
    }

    /// Enables IPv4 forwarding inside the namespace (a node routes between its pods).
    pub fn enable_forwarding(&self) {
        let (ok, out) = self.exec("sh", &["-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"]);
        assert!(ok, "enabling forwarding: {out}");
    }

    /// Links (`ip -j link show`) by name.
    pub fn link_names(&self) -> Vec<String> {
        self.ip_json(&["link", "show"])
            .iter()
            .filter_map(|l| l["ifname"].as_str().map(str::to_owned))
            .collect()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new(ip_binary())
            .args(["netns", "del", &self.name])
            .output();
    }
}

pub fn run_ok(program: &str, args: &[&str]) -> String {
    let out = Command::new(program).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Whether this process may create network namespaces (root with `ip netns`).
pub fn can_use_netns() -> bool {
    let n = NETNS_COUNTER.fetch_add(1, Ordering::SeqCst);
    let probe = format!("eniipam-probe-{}-{n}", std::process::id());
    let ok = Command::new(ip_binary())
        .args(["netns", "add", &probe])
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        let _ = Command::new(ip_binary())
            .args(["netns", "del", &probe])
            .output();
    }
    ok
}

pub fn ips(list: &[&str]) -> Vec<Ipv4Addr> {
    list.iter().map(|s| s.parse().unwrap()).collect()
}
