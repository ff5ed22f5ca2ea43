//! The real `eniipamd` binary as a subprocess, configured by `ENIIPAM_*` variables against the soak's
//! mockcloud: started, waited for, SIGKILLed, stopped, restarted. Its stderr goes to a log file, one
//! section per life.

use std::fs::OpenOptions;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use eniipam_api::pb;
use mockcloud::MockCloud;
use tokio::process::{Child, Command};
use tokio::time::Instant;
use tonic::transport::Channel;

/// The daemon's knobs the soak sets (everything else is the default).
#[derive(Clone, Debug)]
pub struct DaemonKnobs {
    pub reuse_cooldown_secs: u64,
    pub reconcile_period_secs: u64,
    pub min_idle: u32,
    pub max_idle: u32,
    pub log_level: String,
    /// Set from [`super::SoakConfig::ip_family`] when the run starts.
    pub ip_family: super::IpFamily,
    /// More `ENIIPAM_*` variables (the network-profiles mode's API server, custom networking and
    /// profiles), set when the run starts.
    pub extra_env: Vec<(String, String)>,
}

impl Default for DaemonKnobs {
    fn default() -> Self {
        Self {
            reuse_cooldown_secs: 2,
            // The smallest the daemon accepts: the running reconcile is part of what is soaked.
            reconcile_period_secs: 5,
            min_idle: 2,
            max_idle: 6,
            log_level: "info".into(),
            ip_family: super::IpFamily::Ipv4,
            extra_env: Vec::new(),
        }
    }
}

/// How one life of the daemon ended, or why it did not start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StartError {
    /// The process exited during startup.
    Exited(String),
    /// Still not ready after the deadline.
    NotReady,
}

/// The daemon process and how to reach it.
pub struct DaemonProc {
    binary: PathBuf,
    env: Vec<(String, String)>,
    pub socket: PathBuf,
    pub log: PathBuf,
    child: Option<Child>,
    channel: Option<Channel>,
    lives: u32,
}

impl DaemonProc {
    pub fn new(
        binary: &Path,
        mock: &MockCloud,
        state_dir: &Path,
        cache_dir: &Path,
        run_dir: &Path,
        log: &Path,
        knobs: &DaemonKnobs,
    ) -> Self {
        let inst = mock.default_instance();
        let socket = run_dir.join("eniipam.sock");
        let env = [
            ("AWS_ACCESS_KEY_ID", "AKIDSOAK".to_owned()),
            ("AWS_SECRET_ACCESS_KEY", "soak".to_owned()),
            ("ENIIPAM_CLUSTER_NAME", super::iam::CLUSTER.to_owned()),
            ("ENIIPAM_REGION", "us-east-1".to_owned()),
            ("ENIIPAM_EC2_ENDPOINT", mock.ec2_url()),
            ("ENIIPAM_IMDS_ENDPOINT", inst.imds_url.clone()),
            ("ENIIPAM_SOCKET_PATH", socket.display().to_string()),
            (
                "ENIIPAM_STATE_PATH",
                state_dir.join("state.db").display().to_string(),
            ),
            ("ENIIPAM_CNI_CACHE_DIR", cache_dir.display().to_string()),
            ("ENIIPAM_METRICS_ADDR", "127.0.0.1:0".to_owned()),
            (
                "ENIIPAM_REUSE_COOLDOWN_SECS",
                knobs.reuse_cooldown_secs.to_string(),
            ),
            (
                "ENIIPAM_RECONCILE_PERIOD_SECS",
                knobs.reconcile_period_secs.to_string(),
            ),
            ("ENIIPAM_MIN_IDLE", knobs.min_idle.to_string()),
            ("ENIIPAM_MAX_IDLE", knobs.max_idle.to_string()),
            // An ENI the soak detaches out of band is collected a minute later, as on a real node.
            ("ENIIPAM_LEAKED_ENI_GRACE_SECS", "60".to_owned()),
            ("ENIIPAM_LEAKED_ENI_PERIOD_SECS", "10".to_owned()),
            ("ENIIPAM_SHUTDOWN_GRACE_SECS", "5".to_owned()),
            // mockcloud's ENIs are not on this machine: no host routing.
            ("ENIIPAM_MANAGE_ENI_ROUTES", "false".to_owned()),
            ("ENIIPAM_IP_FAMILY", knobs.ip_family.as_str().to_owned()),
            ("ENIIPAM_LOG_LEVEL", knobs.log_level.clone()),
            ("ENIIPAM_LOG_FORMAT", "text".to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .chain(knobs.extra_env.iter().cloned())
        .collect();
        Self {
            binary: binary.to_owned(),
            env,
            socket,
            log: log.to_owned(),
            child: None,
            channel: None,
            lives: 0,
        }
    }

    /// Starts a new life (the previous one must be over).
    pub fn spawn(&mut self) -> anyhow::Result<()> {
        self.lives += 1;
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("opening {}", self.log.display()))?;
        writeln!(log, "\n===== eniipamd life {} =====", self.lives)?;
        let mut cmd = Command::new(&self.binary);
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .kill_on_drop(true);
        self.child = Some(
            cmd.spawn()
                .with_context(|| format!("starting {}", self.binary.display()))?,
        );
        self.channel = None;
        Ok(())
    }

    /// Waits until the daemon answers Status with ready.
    pub async fn wait_ready(&mut self, deadline: Duration) -> Result<(), StartError> {
        let until = Instant::now() + deadline;
        loop {
            if let Some(child) = self.child.as_mut() {
                match child.try_wait() {
                    Ok(Some(status)) => {
                        self.child = None;
                        return Err(StartError::Exited(format!(
                            "{status}; last log lines: {}",
                            self.log_tail(6)
                        )));
                    }
                    Ok(None) => {}
                    Err(e) => return Err(StartError::Exited(e.to_string())),
                }
            } else {
                return Err(StartError::Exited("not running".into()));
            }
            if let Ok(ch) = eniipam_api::connect(&self.socket).await {
                let mut c = pb::ipam_client::IpamClient::new(ch.clone());
                if let Ok(r) = c
                    .status(pb::StatusRequest {
                        api_version: eniipam_api::API_VERSION,
                    })
                    .await
                    && r.get_ref().ready
                {
                    self.channel = Some(ch);
                    return Ok(());
                }
            }
            if Instant::now() > until {
                return Err(StartError::NotReady);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// SIGKILL, and reap.
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
        self.channel = None;
    }

    /// SIGTERM (a clean stop: the state file is closed, its WAL checkpointed away), then wait.
    pub async fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            if let Some(pid) = child.id() {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGTERM,
                );
            }
            if tokio::time::timeout(Duration::from_secs(15), child.wait())
                .await
                .is_err()
            {
                let _ = child.start_kill();
                let _ = child.wait().await;
            }
        }
        self.channel = None;
    }

    /// Whether a life is running; reaps one that ended by itself and says how.
    pub fn exited(&mut self) -> Option<String> {
        let child = self.child.as_mut()?;
        match child.try_wait() {
            Ok(Some(status)) => {
                self.child = None;
                self.channel = None;
                Some(status.to_string())
            }
            _ => None,
        }
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// The gRPC channel of the current life, once ready.
    pub fn channel(&self) -> Option<Channel> {
        self.channel.clone()
    }

    pub fn lives(&self) -> u32 {
        self.lives
    }

    /// The last `n` lines of the daemon's log, joined with " | ", without colours.
    pub fn log_tail(&self, n: usize) -> String {
        let text = strip_ansi(&std::fs::read_to_string(&self.log).unwrap_or_default());
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        lines[lines.len().saturating_sub(n)..].join(" | ")
    }
}

/// Removes terminal colour sequences (`ESC [ ... m`).
fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}
