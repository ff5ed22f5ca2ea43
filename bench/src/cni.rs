//! Runs a CNI plugin binary the way a container runtime does: `CNI_*` environment, the network
//! configuration on stdin, the result on stdout. Optionally under this binary's `__rusage` wrapper,
//! which reports the plugin's peak RSS.

use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use nix::sched::CloneFlags;
use nix::sys::resource::{UsageWho, getrusage};

/// The hidden subcommand of the RSS wrapper.
pub const RUSAGE_WRAPPER: &str = "__rusage";

/// `CNI_PATH` of every plugin the benchmarks run: where Debian's containernetworking-plugins puts the
/// reference plugins.
pub const CNI_PATH: &str = "/usr/lib/cni";

/// One plugin and its network configuration.
#[derive(Clone, Debug)]
pub struct Plugin {
    pub program: PathBuf,
    pub config: Vec<u8>,
    /// `CNI_PATH`.
    pub cni_path: String,
    /// `CNI_NETNS` (IPAM plugins do not enter it; it must be set for ADD).
    pub netns: String,
}

/// One invocation's outcome.
pub struct Run {
    pub wall: Duration,
    pub stdout: String,
    /// Peak RSS of the plugin process, KiB (only under the wrapper).
    pub max_rss_kib: Option<u64>,
}

/// An open network namespace (a "node") that a plugin process is spawned in, so the plugin runs there as if the runtime lived in it, with no extra process (`ip netns exec` would add
/// one to the timed path).
#[derive(Clone, Debug)]
pub struct NodeNetns {
    file: Arc<File>,
}

impl NodeNetns {
    /// Opens the namespace at `path` (`/var/run/netns/<name>`).
    pub fn open(path: &Path) -> anyhow::Result<Self> {
        let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        Ok(Self {
            file: Arc::new(file),
        })
    }
}

impl Plugin {
    /// `program`, given `config` on stdin, with `CNI_PATH` = [`CNI_PATH`] and `CNI_NETNS` = `netns`.
    pub fn new(program: impl Into<PathBuf>, config: &serde_json::Value, netns: &str) -> Self {
        Self {
            program: program.into(),
            config: config.to_string().into_bytes(),
            cni_path: CNI_PATH.into(),
            netns: netns.into(),
        }
    }

    /// Ok when every reference plugin in `programs` is installed, else why not (the first missing).
    pub fn installed(programs: &[&str]) -> Result<(), String> {
        match programs.iter().find(|p| !Path::new(p).is_file()) {
            Some(missing) => Err(format!(
                "{missing} not installed (apt-get install containernetworking-plugins)"
            )),
            None => Ok(()),
        }
    }

    fn command(&self, program: &Path, command: &str, container: &str) -> Command {
        self.command_in(program, command, container, &self.netns)
    }

    fn command_in(&self, program: &Path, command: &str, container: &str, netns: &str) -> Command {
        let mut cmd = Command::new(program);
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", container)
            .env("CNI_NETNS", netns)
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", &self.cni_path)
            .env(
                "CNI_ARGS",
                format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=bench;K8S_POD_NAME={container}"),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }

    /// Runs `command` (ADD, DEL, ...) for `container`; the wall time spans spawn to exit.
    pub fn run(&self, command: &str, container: &str) -> anyhow::Result<Run> {
        let cmd = self.command(&self.program, command, container);
        self.execute(cmd, command, None)
    }

    /// Runs `command` for `container` with `CNI_NETNS=netns`, the plugin running in `node`'s network
    /// namespace (as a runtime's plugins run in the node's). A fresh thread enters the namespace with
    /// `setns(2)` (namespaces are per thread) and spawns the plugin from there, so the child inherits
    /// it and std still spawns with `posix_spawn`, as for [`Plugin::run`]; the calling thread never
    /// changes namespace. The wall time spans spawn to exit.
    pub fn run_in(
        &self,
        command: &str,
        container: &str,
        netns: &str,
        node: &NodeNetns,
    ) -> anyhow::Result<Run> {
        let cmd = self.command_in(&self.program, command, container, netns);
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    nix::sched::setns(&*node.file, CloneFlags::CLONE_NEWNET)
                        .context("setns into the node's network namespace")?;
                    self.execute(cmd, command, None)
                })
                .join()
                .map_err(|_| anyhow::anyhow!("the spawning thread panicked"))?
        })
    }

    /// Like [`Plugin::run`], under the RSS wrapper (this binary), which adds a process.
    pub fn run_measured(
        &self,
        command: &str,
        container: &str,
        rss_file: &Path,
    ) -> anyhow::Result<Run> {
        let me = std::env::current_exe().context("cannot locate the running binary")?;
        let mut cmd = self.command(&me, command, container);
        cmd.arg(RUSAGE_WRAPPER).arg(rss_file).arg(&self.program);
        self.execute(cmd, command, Some(rss_file))
    }

    fn execute(
        &self,
        mut cmd: Command,
        command: &str,
        rss_file: Option<&Path>,
    ) -> anyhow::Result<Run> {
        let started = Instant::now();
        let mut child = cmd
            .spawn()
            .with_context(|| format!("cannot run {}", self.program.display()))?;
        let written = child
            .stdin
            .take()
            .context("no stdin")?
            .write_all(&self.config);
        // A program that does not read its stdin (the spawn-floor probe) may exit first.
        if let Err(e) = written
            && e.kind() != std::io::ErrorKind::BrokenPipe
        {
            return Err(e).context("writing the network configuration");
        }
        let out = child.wait_with_output()?;
        let wall = started.elapsed();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            bail!(
                "{} {command} failed ({}): {stdout} {}",
                self.program.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let max_rss_kib = match rss_file {
            Some(f) => Some(
                std::fs::read_to_string(f)
                    .with_context(|| format!("reading {}", f.display()))?
                    .trim()
                    .parse()
                    .context("the wrapper's RSS figure")?,
            ),
            None => None,
        };
        Ok(Run {
            wall,
            stdout,
            max_rss_kib,
        })
    }
}

/// `eniipam-bench __rusage <rss-file> <program> [args...]`: runs the program with this process's
/// stdio and environment, then writes its peak RSS (KiB, `getrusage(RUSAGE_CHILDREN).ru_maxrss`: the
/// only child this process ever had) to `rss-file`, and exits with the program's code.
pub fn rusage_wrapper(args: &[String]) -> anyhow::Result<i32> {
    let [rss_file, program, rest @ ..] = args else {
        bail!("usage: eniipam-bench {RUSAGE_WRAPPER} RSS_FILE PROGRAM [ARGS...]");
    };
    let status = Command::new(program)
        .args(rest)
        .status()
        .with_context(|| format!("cannot run {program}"))?;
    let usage = getrusage(UsageWho::RUSAGE_CHILDREN).context("getrusage")?;
    std::fs::write(rss_file, usage.max_rss().to_string())
        .with_context(|| format!("writing {rss_file}"))?;
    Ok(status.code().unwrap_or(128))
}
