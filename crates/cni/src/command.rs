//! Command dispatch: one function per `CNI_COMMAND`, and [`run`], which turns an invocation (environment +
//! stdin) into what the plugin prints and its exit code. Each command lives in its own file: `add`
//! (with the results it prints), `del` (with the pod end's teardown thread), `check`, `gc` and
//! `status`; what they share sits below them: `daemon` (the connection, the Release call) and `pod`
//! (the pod's namespaces, the wiring-error mapping).

use serde_json::Value;

use crate::env::{Command, Environment, RuntimeEnv};
use crate::netconf::{NetConf, peek_version};
use crate::spec::{CniError, CniVersion, version_info};

mod add;
mod check;
mod daemon;
mod del;
mod gc;
mod pod;
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
