//! Command dispatch: one function per `CNI_COMMAND`, and [`run`], which turns an invocation (environment +
//! stdin) into what the plugin prints and its exit code. Each command lives in its own file: `add`
//! (with the results it prints), `del` (with the pod end's teardown thread), `check`, `gc` and
//! `status`; this file holds the dispatch and what they share (the daemon connection, the release
//! call, the pod's namespaces, the netns error mapping).

use std::net::Ipv4Addr;

use serde_json::Value;

use eniipam_api::pb;
use eniipam_netlink::{Netlink, NetnsFile};

use crate::client::{DaemonClient, DaemonError};
use crate::env::{Command, Environment, RuntimeEnv};
use crate::netconf::{NetConf, peek_version};
use crate::spec::{CniError, CniVersion, ErrorCode, version_info};
use crate::wiring::NetnsError;

mod add;
mod check;
mod del;
mod gc;
mod status;
#[cfg(test)]
mod tests;

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
            Command::Add => add::add(&conf, &rt).await.map(Some),
            Command::Del => del::del(&conf, &rt).await.map(|()| None),
            Command::Check => check::check(&conf, &rt).await.map(|()| None),
            Command::Gc => gc::gc(&conf).await.map(|()| None),
            Command::Status => status::status(&conf).await.map(|()| None),
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
