//! Command dispatch: one function per `CNI_COMMAND`, and [`run`], which turns an invocation (environment +
//! stdin) into what the plugin prints and its exit code.

use std::net::Ipv4Addr;

use ipnet::{IpNet, Ipv4Net};
use serde_json::{Map, Value};

use eniipam_api::AttachmentKey;
use eniipam_api::cache::{CACHE_FORMAT, CacheEntry, ResultCache};
use eniipam_api::pb;
use eniipam_netlink::{Netlink, NetnsFile};

use crate::client::{DaemonClient, DaemonError};
use crate::env::{Command, Environment, RuntimeEnv};
use crate::netconf::{NetConf, Role, peek_version};
use crate::spec::{
    CniError, CniResult, CniVersion, ErrorCode, Interface, IpConfig, Route, version_info,
};
use crate::wiring::{self, GATEWAY, NetnsError, Teardown, WiringPlan, host_veth_name};

/// What one invocation prints on stdout and how it exits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// The result, VERSION output or error object (empty for a successful DEL, GC or STATUS).
    pub stdout: String,
    /// 0 on success, 1 on error (the code is in the error object).
    pub exit_code: u8,
}

impl Outcome {
    /// The error object of `err` in `version`, exit 1.
    pub fn error(err: &CniError, version: CniVersion) -> Self {
        Self {
            stdout: err.to_json(version).to_string(),
            exit_code: 1,
        }
    }
}

/// An invocation whose environment and configuration were read and validated, ready to run.
#[derive(Debug)]
pub struct Job {
    command: Command,
    conf: NetConf,
    rt: RuntimeEnv,
}

/// What [`prepare`] made of an invocation.
#[derive(Debug)]
pub enum Prepared {
    /// Answered without any I/O: VERSION, or input refused before anything was touched.
    Answered(Outcome),
    /// Work for the daemon or the kernel: run it with [`Job::run`] on a tokio runtime.
    Job(Box<Job>),
}

/// Reads and validates an invocation, synchronously: VERSION and bad input are answered here, so the
/// binary starts no runtime for them (start-up time is paid on every invocation).
pub fn prepare(env: &dyn Environment, stdin: &[u8]) -> Prepared {
    let read = || -> Result<Option<Job>, CniError> {
        let command = Command::from_env(env)?;
        if command == Command::Version {
            return Ok(None);
        }
        let conf = NetConf::parse(stdin)?;
        let rt = RuntimeEnv::from_env(command, env)?;
        Ok(Some(Job { command, conf, rt }))
    };
    match read() {
        Ok(Some(job)) => Prepared::Job(Box::new(job)),
        // VERSION answers whatever the input: its cniVersion if supported, else the current one.
        Ok(None) => Prepared::Answered(success(Some(version_info(peek_version(stdin))))),
        Err(err) => Prepared::Answered(failure(&err, peek_version(stdin))),
    }
}

impl Job {
    /// Runs the command. Never panics on bad input: every failure becomes a spec error object.
    pub async fn run(self) -> Outcome {
        let Job { command, conf, rt } = self;
        let result = match command {
            Command::Add => add(&conf, &rt).await.map(Some),
            Command::Del => del(&conf, &rt).await.map(|()| None),
            Command::Check => check(&conf, &rt).await.map(|()| None),
            Command::Gc => gc(&conf).await.map(|()| None),
            Command::Status => status(&conf).await.map(|()| None),
            Command::Version => Ok(Some(version_info(conf.cni_version))),
        };
        match result {
            Ok(out) => success(out),
            Err(err) => failure(&err, conf.cni_version),
        }
    }
}

/// Runs one invocation ([`prepare`], then [`Job::run`]). Never panics on bad input: every failure
/// becomes a spec error object.
pub async fn run(env: &dyn Environment, stdin: &[u8]) -> Outcome {
    match prepare(env, stdin) {
        Prepared::Answered(outcome) => outcome,
        Prepared::Job(job) => job.run().await,
    }
}

fn success(out: Option<Value>) -> Outcome {
    Outcome {
        stdout: out.map(|v| v.to_string()).unwrap_or_default(),
        exit_code: 0,
    }
}

fn failure(err: &CniError, version: CniVersion) -> Outcome {
    tracing::warn!(code = err.code.code(), "{err}");
    Outcome::error(err, version)
}

fn netns_to_cni(err: NetnsError) -> CniError {
    let code = match &err {
        NetnsError::Netlink(eniipam_netlink::Error::Open { .. }) => ErrorCode::InvalidEnvironment,
        NetnsError::Mismatch(_) => ErrorCode::CheckFailed,
        NetnsError::Netlink(_) | NetnsError::Conflict(_) => ErrorCode::WiringFailed,
    };
    CniError::new(code, err.to_string())
}

async fn connect(conf: &NetConf) -> Result<DaemonClient, DaemonError> {
    DaemonClient::connect(&conf.plugin.socket, conf.plugin.timeout).await
}

/// Namespaces and netlink sockets of a main-role ADD or CHECK.
struct PodSide {
    ns: NetnsFile,
    host: Netlink,
    pod: Netlink,
}

impl PodSide {
    fn open(path: &str) -> Result<Self, CniError> {
        let nl = |e: eniipam_netlink::Error| netns_to_cni(e.into());
        let ns = NetnsFile::open(path).map_err(nl)?;
        let host = Netlink::current().map_err(nl)?;
        let pod = Netlink::in_netns(&ns).map_err(nl)?;
        Ok(Self { ns, host, pod })
    }
}

fn main_result(plan: &WiringPlan, wired: &wiring::Wired, netns_path: &str) -> CniResult {
    CniResult {
        interfaces: vec![
            Interface {
                name: wired.host.name.clone(),
                mac: wired.host.mac.clone(),
                sandbox: None,
                extra: Map::new(),
            },
            Interface {
                name: plan.ifname.clone(),
                mac: wired.pod_mac.clone(),
                sandbox: Some(netns_path.to_owned()),
                extra: Map::new(),
            },
        ],
        ips: vec![IpConfig {
            address: IpNet::V4(Ipv4Net::from(plan.ip)),
            gateway: Some(GATEWAY.into()),
            interface: Some(1),
            extra: Map::new(),
        }],
        routes: vec![default_route()],
        dns: Default::default(),
    }
}

fn default_route() -> Route {
    Route {
        dst: IpNet::V4(Ipv4Net::default()),
        gw: Some(GATEWAY.into()),
        extra: Map::new(),
    }
}

/// The IPAM role's result: the address as a `/32` with the link-local gateway and a default route
/// through it, for a delegating plugin that wires such an address itself (the VPC subnet's own
/// gateway must never be put on a host interface). The reference plugins cannot; see
/// [`crate::netconf::UNSUPPORTED_IPAM_PARENTS`].
fn ipam_result(ip: Ipv4Addr) -> CniResult {
    CniResult {
        interfaces: Vec::new(),
        ips: vec![IpConfig {
            address: IpNet::V4(Ipv4Net::from(ip)),
            gateway: Some(GATEWAY.into()),
            interface: None,
            extra: Map::new(),
        }],
        routes: vec![default_route()],
        dns: Default::default(),
    }
}

async fn release(
    client: &mut DaemonClient,
    conf: &NetConf,
    rt: &RuntimeEnv,
    sticky: bool,
    cleaning: Option<Ipv4Addr>,
) -> Result<pb::ReleaseReply, DaemonError> {
    client
        .release(pb::ReleaseRequest {
            api_version: 0,
            container_id: rt.container_id.clone(),
            ifname: rt.ifname.clone(),
            sticky,
            network: conf.name.clone(),
            ip: cleaning.map(|ip| ip.to_string()).unwrap_or_default(),
        })
        .await
}

async fn add(conf: &NetConf, rt: &RuntimeEnv) -> Result<Value, CniError> {
    let netns_path = rt.netns.clone().unwrap_or_default();
    let pod = rt.args.pod.clone();
    let sticky_key = conf.sticky_key(pod.as_ref(), &rt.args);
    let preferred = conf.preferred_ip()?;
    let cache = ResultCache::new(&conf.plugin.cache_dir, &conf.name);

    // Everything that can be checked before asking for an IP is checked first, so bad input changes
    // nothing.
    conf.check_ipam_parent()?;
    let side = match conf.role {
        Role::Main => {
            let side = PodSide::open(&netns_path)?;
            wiring::ensure_absent(&side.pod, &rt.ifname, &side.ns)
                .await
                .map_err(netns_to_cni)?;
            Some(side)
        }
        Role::Ipam => None,
    };

    let mut client = connect(conf).await.map_err(|e| e.to_cni())?;
    let reply = client
        .allocate(pb::AllocateRequest {
            api_version: 0,
            container_id: rt.container_id.clone(),
            ifname: rt.ifname.clone(),
            netns: netns_path.clone(),
            pod: pod.as_ref().map(|p| pb::Pod {
                namespace: p.namespace.clone(),
                name: p.name.clone(),
                uid: p.uid.clone(),
            }),
            preferred_ip: preferred.map(|ip| ip.to_string()).unwrap_or_default(),
            require_preferred: preferred.is_some(),
            sticky_key: sticky_key.clone().unwrap_or_default(),
            network: conf.name.clone(),
        })
        .await
        .map_err(|e| e.to_cni())?;
    let keep = sticky_key.is_some();

    let ip: Ipv4Addr = match reply.ip.parse() {
        Ok(ip) => ip,
        Err(_) => {
            let _ = release(&mut client, conf, rt, keep, None).await;
            return Err(CniError::new(
                ErrorCode::DaemonFailure,
                format!(
                    "eniipamd allocated {:?}, which is not an IPv4 address",
                    reply.ip
                ),
            ));
        }
    };

    let (ours, host_veth, teardown) = match &side {
        None => (ipam_result(ip), None, None),
        Some(side) => {
            let plan = WiringPlan {
                ifname: rt.ifname.clone(),
                host_veth: host_veth_name(&conf.plugin.veth_prefix, pod.as_ref(), &rt.attachment()),
                ip,
                route_table: reply.route_table,
                mtu: conf.plugin.mtu,
            };
            let teardown = Teardown {
                ifname: plan.ifname.clone(),
                ip: Some(ip),
                // Our own failed ADD: the daemon gave us this IP, nobody else holds it.
                ip_free: true,
                host_veth: None,
                created_host_veth: Some(plan.host_veth.clone()),
            };
            match wiring::wire(&side.host, &side.pod, &side.ns, &plan).await {
                Ok(wired) => (
                    main_result(&plan, &wired, &netns_path),
                    Some(wired.host),
                    Some(teardown),
                ),
                Err(err) => {
                    let cleanup = wiring::unwire(&side.host, Some(&side.pod), &teardown).await;
                    for e in &cleanup {
                        tracing::warn!("cleaning up after failed wiring: {e}");
                    }
                    let released = release(&mut client, conf, rt, keep, Some(ip)).await;
                    let mut cni = netns_to_cni(err);
                    if cni.code == ErrorCode::CheckFailed {
                        cni.code = ErrorCode::WiringFailed;
                    }
                    cni.details = match released {
                        Ok(_) => format!("{ip} was released"),
                        Err(e) => format!("releasing {ip} failed too: {e}"),
                    };
                    return Err(cni);
                }
            }
        }
    };

    let mut result = conf.prev_result.clone().unwrap_or_default();
    result.merge(ours.clone());

    let entry = CacheEntry {
        format: CACHE_FORMAT,
        network: conf.name.clone(),
        container_id: rt.container_id.clone(),
        ifname: rt.ifname.clone(),
        netns: netns_path,
        pod,
        sticky_key,
        ip,
        route_table: reply.route_table,
        eni_id: reply.eni_id.clone(),
        host_veth,
        result: ours.to_json(CniVersion::CURRENT),
    };
    if let Err(e) = cache.write(&entry) {
        if let (Some(side), Some(teardown)) = (&side, &teardown) {
            wiring::unwire(&side.host, Some(&side.pod), teardown).await;
        }
        let _ = release(&mut client, conf, rt, keep, Some(ip)).await;
        return Err(CniError::new(ErrorCode::IoFailure, e.to_string())
            .with_details(format!("{ip} was released")));
    }
    Ok(result.to_json(conf.cni_version))
}

async fn del(conf: &NetConf, rt: &RuntimeEnv) -> Result<(), CniError> {
    let key = rt.attachment();
    let cache = ResultCache::new(&conf.plugin.cache_dir, &conf.name);
    let cached = cache.read(&key).unwrap_or_else(|e| {
        tracing::warn!("DEL {key}: ignoring unreadable cache entry: {e}");
        None
    });
    let sticky = conf.sticky_key(rt.args.pod.as_ref(), &rt.args).is_some()
        || cached.as_ref().is_some_and(|c| c.sticky_key.is_some());

    // The IP this attachment was wired with, as far as the host knows.
    let known_ip = cached
        .as_ref()
        .map(|c| c.ip)
        .or_else(|| conf.prev_result.as_ref()?.ipv4_for(&rt.ifname));

    // The pod end of the veth pair goes at once, on a thread of its own: deleting it blocks in the
    // kernel for most of a DEL (RCU grace periods while the pair unregisters), and it needs nothing
    // from the daemon. Meanwhile this thread asks the daemon to release the IP. Only the policy rules
    // wait for the daemon's answer: an IP's rules are removed only when the daemon confirms no other
    // live attachment holds it now, because a late DEL (a retried one, or one for a stale cache entry)
    // must not take away the rules of the pod the IP went to since. Without the daemon's word the
    // rules stay; the next ADD of that IP replaces them. A missing or failing daemon never stops the
    // teardown: DEL must succeed. (The daemon keeps a released IP cooling, so the order of the two
    // does not matter to the next owner.)
    let pod_end = match conf.role {
        Role::Main => Some(PodEnd::start(&key, rt.netns.clone(), rt.ifname.clone())),
        Role::Ipam => None,
    };
    let (rules_ip, ip_free) = match connect(conf).await {
        Ok(mut client) => match release(&mut client, conf, rt, sticky, known_ip).await {
            Ok(reply) if reply.ip_held_by_other => {
                tracing::info!(
                    "DEL {key}: {known_ip:?} belongs to another pod now; only this pod's own rule goes"
                );
                (known_ip, false)
            }
            Ok(reply) => (known_ip.or_else(|| reply.ip.parse::<Ipv4Addr>().ok()), true),
            Err(e) => {
                tracing::warn!("DEL {key}: release failed, tearing down from the cache: {e}");
                (known_ip, false)
            }
        },
        Err(e) => {
            tracing::warn!("DEL {key}: tearing down from the cache: {e}");
            (known_ip, false)
        }
    };

    if let Some(pod_end) = pod_end {
        let mut errors = pod_end.join();
        // Without the daemon's word, only this attachment's own rule (by its host veth) goes.
        match Netlink::current() {
            Ok(host) => {
                let teardown = Teardown {
                    ifname: rt.ifname.clone(),
                    ip: rules_ip,
                    ip_free,
                    host_veth: cached.as_ref().and_then(|c| c.host_veth.clone()),
                    created_host_veth: None,
                };
                errors.extend(wiring::unwire_host(&host, &teardown).await);
            }
            Err(e) => errors.push(e.into()),
        }
        if let Some(first) = errors.into_iter().next() {
            // Keep the cache entry so a retried DEL still knows what to remove.
            return Err(netns_to_cni(first));
        }
    }
    if let Err(e) = cache.remove(&key) {
        tracing::warn!("DEL {key}: {e}");
    }
    Ok(())
}

/// A DEL's removal of the pod end of the veth pair, running on its own thread (with its own
/// single-threaded runtime for the netlink connection inside the pod's namespace).
enum PodEnd {
    /// No namespace, or it is gone: it took the pod end, and so the whole pair, with it.
    Gone,
    Running(std::thread::JoinHandle<Vec<NetnsError>>),
    /// The thread could not be started.
    Failed(NetnsError),
}

impl PodEnd {
    /// Starts deleting `ifname` inside the namespace at `netns`.
    fn start(key: &AttachmentKey, netns: Option<String>, ifname: String) -> Self {
        let Some(path) = netns else {
            return Self::Gone;
        };
        let ns = match NetnsFile::open(&path) {
            Ok(ns) => ns,
            Err(e) => {
                tracing::info!("DEL {key}: {e}; nothing to remove inside the pod");
                return Self::Gone;
            }
        };
        let socket_error = move |reason: String| -> NetnsError {
            eniipam_netlink::Error::Socket { path, reason }.into()
        };
        let work = {
            let socket_error = socket_error.clone();
            move || -> Vec<NetnsError> {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_io()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => return vec![socket_error(format!("starting a runtime: {e}"))],
                };
                runtime.block_on(async {
                    match Netlink::in_netns(&ns) {
                        Ok(pod) => wiring::unwire_pod(&pod, &ifname).await,
                        Err(e) => vec![e.into()],
                    }
                })
            }
        };
        match std::thread::Builder::new()
            .name("eniipam-pod-end".into())
            .spawn(work)
        {
            Ok(handle) => Self::Running(handle),
            Err(e) => Self::Failed(socket_error(format!("starting a thread: {e}"))),
        }
    }

    /// Waits for the deletion; its errors.
    fn join(self) -> Vec<NetnsError> {
        match self {
            Self::Gone => Vec::new(),
            Self::Failed(e) => vec![e],
            Self::Running(handle) => handle.join().unwrap_or_else(|_| {
                vec![NetnsError::Conflict(
                    "the thread removing the pod end panicked".into(),
                )]
            }),
        }
    }
}

async fn check(conf: &NetConf, rt: &RuntimeEnv) -> Result<(), CniError> {
    let key = rt.attachment();
    let cache = ResultCache::new(&conf.plugin.cache_dir, &conf.name);
    let cached = cache.read(&key).ok().flatten();
    let ip = conf
        .prev_result
        .as_ref()
        .and_then(|r| r.ipv4_for(&rt.ifname))
        .or(cached.as_ref().map(|c| c.ip))
        .ok_or_else(|| {
            CniError::new(
                ErrorCode::InvalidNetworkConfig,
                format!(
                    "CHECK {key}: no prevResult with an IPv4 address for {}",
                    rt.ifname
                ),
            )
        })?;

    let mut client = connect(conf).await.map_err(|e| e.to_cni())?;
    let reply = client
        .check(pb::CheckRequest {
            api_version: 0,
            container_id: rt.container_id.clone(),
            ifname: rt.ifname.clone(),
            ip: ip.to_string(),
            network: conf.name.clone(),
        })
        .await
        .map_err(|e| e.to_cni())?;
    if !reply.ip.is_empty() && reply.ip != ip.to_string() {
        return Err(CniError::new(
            ErrorCode::CheckFailed,
            format!(
                "eniipamd holds {} for {key}, the runtime expects {ip}",
                reply.ip
            ),
        )
        .with_details(reply.message));
    }
    if !reply.ok {
        return Err(CniError::new(
            ErrorCode::CheckFailed,
            format!("eniipamd does not hold {ip} for {key}"),
        )
        .with_details(reply.message));
    }

    if conf.role == Role::Main {
        let side = PodSide::open(rt.netns.as_deref().unwrap_or_default())?;
        let host_veth = cached
            .as_ref()
            .and_then(|c| c.host_veth.as_ref())
            .map(|h| h.name.clone())
            .unwrap_or_else(|| {
                host_veth_name(&conf.plugin.veth_prefix, rt.args.pod.as_ref(), &key)
            });
        let plan = WiringPlan {
            ifname: rt.ifname.clone(),
            host_veth,
            ip,
            // Without a cache entry the table is unknown and the rules are not checked.
            route_table: cached.as_ref().map_or(0, |c| c.route_table),
            mtu: conf.plugin.mtu,
        };
        let mac = cached
            .as_ref()
            .and_then(|c| c.host_veth.as_ref())
            .map(|h| h.mac.as_str());
        wiring::check(&side.host, &side.pod, &plan, mac)
            .await
            .map_err(|e| {
                let mut cni = netns_to_cni(e);
                if cni.code == ErrorCode::WiringFailed {
                    cni.code = ErrorCode::CheckFailed;
                }
                cni
            })?;
    }
    Ok(())
}

async fn gc(conf: &NetConf) -> Result<(), CniError> {
    // The runtime built its list of valid attachments before it started this process.
    let listed_before_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let valid = conf.valid_attachments.clone().ok_or_else(|| {
        CniError::new(
            ErrorCode::InvalidNetworkConfig,
            "GC needs cni.dev/valid-attachments (an empty list releases everything)",
        )
    })?;

    let cache = ResultCache::new(&conf.plugin.cache_dir, &conf.name);
    let (entries, errors) = cache.list();
    for e in errors {
        tracing::warn!("GC: {e}");
    }
    let stale: Vec<_> = entries
        .into_iter()
        .filter(|e| !valid.contains(&e.attachment()))
        .collect();

    let daemon = async {
        let mut client = connect(conf).await?;
        client
            .garbage_collect(pb::GarbageCollectRequest {
                api_version: 0,
                valid: valid
                    .iter()
                    .map(|k| pb::Attachment {
                        container_id: k.container_id.clone(),
                        ifname: k.ifname.clone(),
                    })
                    .collect(),
                network: conf.name.clone(),
                listed_before_ms,
                cleaning: stale.iter().map(|e| e.ip.to_string()).collect(),
            })
            .await
    }
    .await;

    // Continue on errors: the local cleanup happens whatever the daemon said; an IP's rules go only
    // when the daemon confirms no live attachment holds it now (as in DEL).
    let keep_rules: Option<std::collections::BTreeSet<String>> = daemon
        .as_ref()
        .ok()
        .map(|r| r.held_by_others.iter().cloned().collect());
    let mut host = None;
    for entry in stale {
        if let Some(veth) = &entry.host_veth {
            if host.is_none() {
                host = Netlink::current().ok();
            }
            if let Some(host) = &host {
                let ip_free = keep_rules
                    .as_ref()
                    .is_some_and(|keep| !keep.contains(&entry.ip.to_string()));
                let teardown = Teardown {
                    ifname: entry.ifname.clone(),
                    ip: Some(entry.ip),
                    ip_free,
                    host_veth: Some(veth.clone()),
                    created_host_veth: None,
                };
                for e in wiring::unwire(host, None, &teardown).await {
                    tracing::warn!("GC {}: {e}", entry.attachment());
                }
            }
        }
        if let Err(e) = cache.remove(&entry.attachment()) {
            tracing::warn!("GC: {e}");
        }
    }

    match daemon {
        Ok(reply) => {
            for a in reply.released {
                tracing::info!("GC released {}/{}", a.container_id, a.ifname);
            }
            Ok(())
        }
        Err(e) => Err(e.to_cni()),
    }
}

/// STATUS fails only when the plugin truly cannot serve ADDs: the daemon is unreachable or has not
/// finished rebuilding its state (50). containerd ≥ 2.0.1 turns a failing STATUS into NetworkReady=false,
/// the kubelet marks the node NotReady, and its pods are evicted after 300 s: a node whose pool is
/// full right now (normal at max-pods) must not be made NotReady for it. That case stays visible where
/// it belongs: ADD answers 11 (try again later) with the reason, and the daemon's metrics and
/// `eniipamctl status` report the exhaustion. Existing pods keep their connectivity either way, so 51
/// is never answered.
async fn status(conf: &NetConf) -> Result<(), CniError> {
    let reply = match connect(conf).await {
        Ok(mut client) => client.status().await,
        Err(e) => Err(e),
    };
    match reply {
        Err(e) => Err(CniError::new(ErrorCode::PluginNotAvailable, e.to_string())),
        Ok(r) if !r.ready => Err(CniError::new(
            ErrorCode::PluginNotAvailable,
            "eniipamd is not ready (rebuilding its state)",
        )
        .with_details(r.reason)),
        Ok(r) => {
            if r.exhausted {
                tracing::info!(
                    reason = %r.reason, capacity = r.capacity, assigned = r.assigned,
                    "STATUS: the pool cannot hand out a new IP now; ADDs get 11 until it can"
                );
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[tokio::test]
    async fn version_needs_no_config() {
        let out = run(&env(&[("CNI_COMMAND", "VERSION")]), b"").await;
        assert_eq!(out.exit_code, 0);
        let v: Value = serde_json::from_str(&out.stdout).unwrap();
        assert_eq!(v["cniVersion"], "1.1.0");
        assert_eq!(v["supportedVersions"].as_array().unwrap().len(), 3);
        let out = run(
            &env(&[("CNI_COMMAND", "VERSION")]),
            br#"{"cniVersion":"0.4.0"}"#,
        )
        .await;
        let v: Value = serde_json::from_str(&out.stdout).unwrap();
        assert_eq!(v["cniVersion"], "0.4.0");
    }

    #[tokio::test]
    async fn errors_are_written_in_the_config_version() {
        let conf = br#"{"cniVersion":"0.4.0","name":"n","type":"eniipam"}"#;
        let out = run(&env(&[("CNI_COMMAND", "ADD")]), conf).await;
        assert_eq!(out.exit_code, 1);
        let v: Value = serde_json::from_str(&out.stdout).unwrap();
        assert_eq!(v["cniVersion"], "0.4.0");
        assert_eq!(v["code"], 4);
    }

    #[tokio::test]
    async fn status_without_a_daemon_is_not_available() {
        let dir = tempfile::tempdir().unwrap();
        let conf = serde_json::json!({"cniVersion": "1.1.0", "name": "n", "type": "eniipam",
            "socket": dir.path().join("absent.sock"), "timeout_ms": 500});
        let out = run(
            &env(&[("CNI_COMMAND", "STATUS")]),
            conf.to_string().as_bytes(),
        )
        .await;
        let v: Value = serde_json::from_str(&out.stdout).unwrap();
        assert_eq!(v["code"], 50, "{v}");
    }

    #[tokio::test]
    async fn gc_without_valid_attachments_is_refused() {
        let conf = br#"{"cniVersion":"1.1.0","name":"n","type":"eniipam"}"#;
        let out = run(&env(&[("CNI_COMMAND", "GC")]), conf).await;
        let v: Value = serde_json::from_str(&out.stdout).unwrap();
        assert_eq!(v["code"], 7);
    }
}
