//! Named network namespaces (`/run/netns/<name>`), the tools run inside them (`ip -n`, `nsenter --net`)
//! and Rust code run inside them (a fresh thread that `setns`es, so no pooled thread ever changes
//! namespace).

use std::fs::File;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use ipnet::{Ipv4Net, Ipv6Net};
use nix::sched::{CloneFlags, setns};
use serde::Deserialize;
use tokio::io::AsyncWriteExt;
use tokio::process::Command;

use crate::error::LabError;

/// The Debian package that ships a tool, for error messages.
fn package_of(program: &str) -> &'static str {
    match program {
        "ip" => "iproute2",
        "nft" => "nftables",
        "nsenter" => "util-linux",
        _ => "?",
    }
}

/// Runs `program args`, feeding `stdin` when given; returns stdout.
pub(crate) async fn run_tool(
    program: &str,
    args: &[String],
    stdin: Option<&str>,
) -> Result<String, LabError> {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().map_err(|source| LabError::ToolMissing {
        program: program.to_owned(),
        package: package_of(program),
        source,
    })?;
    if let Some(input) = stdin {
        let mut pipe = child.stdin.take().expect("stdin is piped");
        pipe.write_all(input.as_bytes())
            .await
            .map_err(|e| LabError::io(format!("writing to `{program}`"), e))?;
        drop(pipe);
    }
    let out = child
        .wait_with_output()
        .await
        .map_err(|e| LabError::io(format!("waiting for `{program}`"), e))?;
    if !out.status.success() {
        let mut command = format!("{program} {}", args.join(" "));
        if let Some(input) = stdin {
            command.push_str(" <<< ");
            command.push_str(&input.replace('\n', "; "));
        }
        return Err(LabError::Command {
            command,
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A named network namespace made by a lab. Cloning is cheap; the namespace lives until the lab
/// that made it is dropped (or [`crate::Lab::remove_pod`] removes it).
#[derive(Clone, Debug)]
pub struct NetNs {
    name: String,
    /// Cleared when the owning lab tears the namespace down; threads serving inside it stop.
    alive: Arc<AtomicBool>,
}

/// One link as `ip -j link show` lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    pub name: String,
    pub mac: String,
    /// Administratively up (`UP` flag).
    pub up: bool,
    pub mtu: u32,
}

/// One IPv4 route of the main table as `ip -j route show` lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    pub dst: RouteDst,
    pub dev: Option<String>,
    pub via: Option<Ipv4Addr>,
}

/// A route's destination.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum RouteDst {
    Default,
    Net(Ipv4Net),
}

/// One IPv6 route of the main table as `ip -j -6 route show` lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route6 {
    /// `None` for the default route.
    pub dst: Option<Ipv6Net>,
    pub dev: Option<String>,
    pub via: Option<Ipv6Addr>,
}

#[derive(Deserialize)]
struct JsonRoute6 {
    dst: String,
    dev: Option<String>,
    gateway: Option<Ipv6Addr>,
}

#[derive(Deserialize)]
struct JsonLink {
    ifname: String,
    #[serde(default)]
    address: String,
    #[serde(default)]
    flags: Vec<String>,
    #[serde(default)]
    mtu: u32,
}

#[derive(Deserialize)]
struct JsonRoute {
    dst: String,
    dev: Option<String>,
    gateway: Option<Ipv4Addr>,
}

impl NetNs {
    /// `ip netns add <name>`.
    pub(crate) async fn create(name: String, alive: Arc<AtomicBool>) -> Result<Self, LabError> {
        run_tool("ip", &["netns".into(), "add".into(), name.clone()], None).await?;
        Ok(Self { name, alive })
    }

    /// The namespace's name (as `ip netns list` shows it).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `/run/netns/<name>`: what `nsenter --net=` and `setns` take.
    pub fn path(&self) -> PathBuf {
        PathBuf::from("/run/netns").join(&self.name)
    }

    /// False once the owning lab has torn the namespace down.
    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    pub(crate) fn alive_flag(&self) -> Arc<AtomicBool> {
        self.alive.clone()
    }

    /// Runs `f` on a fresh thread that entered this namespace, and waits for it. Sockets `f`
    /// creates belong to this namespace for their whole life, whichever thread uses them later.
    pub fn run<F, R>(&self, f: F) -> Result<R, LabError>
    where
        F: FnOnce() -> R + Send + 'static,
        R: Send + 'static,
    {
        self.spawn(f)?.join().map_err(|_| self.panicked())?
    }

    /// [`NetNs::run`] without blocking the async caller.
    pub async fn run_async<F, R>(&self, f: F) -> Result<R, LabError>
    where
        F: FnOnce() -> R + Send + 'static,
        R: Send + 'static,
    {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let handle = self.spawn(move || {
            let _ = tx.send(f());
        })?;
        let sent = rx.await;
        // The thread has sent its result, failed to enter the namespace, or panicked: it is
        // ending, so joining returns at once.
        let joined = handle.join();
        match (sent, joined) {
            (Ok(r), _) => Ok(r),
            (Err(_), Ok(Err(entering))) => Err(entering),
            (Err(_), _) => Err(self.panicked()),
        }
    }

    fn panicked(&self) -> LabError {
        LabError::io(
            format!("code run inside namespace {}", self.name),
            std::io::Error::other("panicked"),
        )
    }

    /// Spawns a thread that enters this namespace and runs `f`. The join handle yields the
    /// namespace-entry error, if any, or `f`'s result.
    pub(crate) fn spawn<F, R>(
        &self,
        f: F,
    ) -> Result<std::thread::JoinHandle<Result<R, LabError>>, LabError>
    where
        F: FnOnce() -> R + Send + 'static,
        R: Send + 'static,
    {
        let path = self.path();
        std::thread::Builder::new()
            .name(format!("netns-{}", self.name))
            .spawn(move || {
                enter(&path)?;
                Ok(f())
            })
            .map_err(|e| LabError::io("spawning a namespace thread", e))
    }

    /// Writes sysctl files (`/proc/sys/<key>`, key like `net/ipv4/ip_forward`) inside this namespace.
    pub async fn write_sysctls(&self, entries: &[(String, String)]) -> Result<(), LabError> {
        for (key, _) in entries {
            if key.starts_with('/') || key.split('/').any(|p| p.is_empty() || p == "..") {
                return Err(LabError::Invalid(format!(
                    "sysctl key {key:?}: expected a path under /proc/sys like net/ipv4/ip_forward"
                )));
            }
        }
        let entries = entries.to_vec();
        self.run_async(move || -> Result<(), LabError> {
            for (key, value) in &entries {
                let path = format!("/proc/sys/{key}");
                std::fs::write(&path, value)
                    .map_err(|e| LabError::io(format!("writing {value:?} to {path}"), e))?;
            }
            Ok(())
        })
        .await?
    }

    /// Reads one sysctl file inside this namespace.
    pub async fn read_sysctl(&self, key: &str) -> Result<String, LabError> {
        let path = format!("/proc/sys/{key}");
        self.run_async(move || {
            std::fs::read_to_string(&path)
                .map(|s| s.trim().to_owned())
                .map_err(|e| LabError::io(format!("reading {path}"), e))
        })
        .await?
    }

    /// `ip -n <name> <args>`; returns stdout.
    pub async fn ip(&self, args: &[&str]) -> Result<String, LabError> {
        let mut all = vec!["-n".to_owned(), self.name.clone()];
        all.extend(args.iter().map(|a| (*a).to_owned()));
        run_tool("ip", &all, None).await
    }

    /// `ip -n <name> -batch -` with one command per line (nothing to do for no lines).
    pub async fn ip_batch(&self, lines: &[String]) -> Result<(), LabError> {
        if lines.is_empty() {
            return Ok(());
        }
        let mut script = lines.join("\n");
        script.push('\n');
        run_tool(
            "ip",
            &["-n".into(), self.name.clone(), "-batch".into(), "-".into()],
            Some(&script),
        )
        .await
        .map(drop)
    }

    /// Runs any program inside this namespace with `nsenter --net=<path>`; returns stdout.
    pub async fn exec(&self, program: &str, args: &[&str]) -> Result<String, LabError> {
        self.exec_stdin(program, args, None).await
    }

    async fn exec_stdin(
        &self,
        program: &str,
        args: &[&str],
        stdin: Option<&str>,
    ) -> Result<String, LabError> {
        let mut all = vec![
            format!("--net={}", self.path().display()),
            "--".to_owned(),
            program.to_owned(),
        ];
        all.extend(args.iter().map(|a| (*a).to_owned()));
        match run_tool("nsenter", &all, stdin).await {
            // nsenter exits 127 when it cannot exec the program: name the package that is missing.
            Err(LabError::Command { status, stderr, .. })
                if stderr.contains("failed to execute") && stderr.contains(program) =>
            {
                Err(LabError::ToolMissing {
                    program: program.to_owned(),
                    package: package_of(program),
                    source: std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        format!("{stderr} ({status})"),
                    ),
                })
            }
            other => other,
        }
    }

    /// Loads an nftables script (`nft -f -`) inside this namespace: one atomic transaction.
    pub async fn nft(&self, script: &str) -> Result<(), LabError> {
        self.exec_stdin("nft", &["-f", "-"], Some(script))
            .await
            .map(drop)
    }

    /// `nft -j <args>` inside this namespace, parsed.
    pub async fn nft_json(&self, args: &[&str]) -> Result<serde_json::Value, LabError> {
        let mut all = vec!["-j"];
        all.extend_from_slice(args);
        let out = self.exec("nft", &all).await?;
        serde_json::from_str(&out).map_err(|e| LabError::Output {
            command: format!("nft {}", all.join(" ")),
            reason: e.to_string(),
        })
    }

    /// Every link in this namespace.
    pub async fn links(&self) -> Result<Vec<Link>, LabError> {
        let out = self.ip(&["-j", "link", "show"]).await?;
        let links: Vec<JsonLink> = serde_json::from_str(&out).map_err(|e| LabError::Output {
            command: format!("ip -n {} -j link show", self.name),
            reason: e.to_string(),
        })?;
        Ok(links
            .into_iter()
            .map(|l| Link {
                up: l.flags.iter().any(|f| f == "UP"),
                name: l.ifname,
                mac: l.address,
                mtu: l.mtu,
            })
            .collect())
    }

    /// The link with this MAC address (case-insensitive), if any.
    pub async fn link_by_mac(&self, mac: &str) -> Result<Option<Link>, LabError> {
        Ok(self
            .links()
            .await?
            .into_iter()
            .find(|l| l.mac.eq_ignore_ascii_case(mac)))
    }

    /// The IPv6 routes of the main table.
    pub async fn routes_v6(&self) -> Result<Vec<Route6>, LabError> {
        let args = ["-j", "-6", "route", "show"];
        let out = self.ip(&args).await?;
        let parse_err = |reason: String| LabError::Output {
            command: format!("ip -n {} {}", self.name, args.join(" ")),
            reason,
        };
        let routes: Vec<JsonRoute6> =
            serde_json::from_str(&out).map_err(|e| parse_err(e.to_string()))?;
        routes
            .into_iter()
            .map(|r| {
                let dst = match r.dst.as_str() {
                    "default" => None,
                    s if s.contains('/') => Some(
                        s.parse()
                            .map_err(|e| parse_err(format!("route destination {s:?}: {e}")))?,
                    ),
                    s => Some(Ipv6Net::from(s.parse::<Ipv6Addr>().map_err(|e| {
                        parse_err(format!("route destination {s:?}: {e}"))
                    })?)),
                };
                Ok(Route6 {
                    dst,
                    dev: r.dev,
                    via: r.gateway,
                })
            })
            .collect()
    }

    /// The IPv4 routes of the main table (or of `table` when given).
    pub async fn routes(&self, table: Option<u32>) -> Result<Vec<Route>, LabError> {
        let table = table.map(|t| t.to_string());
        let mut args = vec!["-j", "-4", "route", "show"];
        if let Some(t) = &table {
            args.extend(["table", t.as_str()]);
        }
        let out = self.ip(&args).await?;
        let parse_err = |reason: String| LabError::Output {
            command: format!("ip -n {} {}", self.name, args.join(" ")),
            reason,
        };
        let routes: Vec<JsonRoute> =
            serde_json::from_str(&out).map_err(|e| parse_err(e.to_string()))?;
        routes
            .into_iter()
            .map(|r| {
                let dst = match r.dst.as_str() {
                    "default" => RouteDst::Default,
                    s if s.contains('/') => RouteDst::Net(
                        s.parse()
                            .map_err(|e| parse_err(format!("route destination {s:?}: {e}")))?,
                    ),
                    s => RouteDst::Net(Ipv4Net::from(
                        s.parse::<Ipv4Addr>()
                            .map_err(|e| parse_err(format!("route destination {s:?}: {e}")))?,
                    )),
                };
                Ok(Route {
                    dst,
                    dev: r.dev,
                    via: r.gateway,
                })
            })
            .collect()
    }
}

/// Moves the calling thread into the namespace at `path`.
fn enter(path: &std::path::Path) -> Result<(), LabError> {
    let file =
        File::open(path).map_err(|e| LabError::io(format!("opening {}", path.display()), e))?;
    setns(&file, CloneFlags::CLONE_NEWNET).map_err(|e| {
        LabError::io(
            format!("entering {}", path.display()),
            std::io::Error::from(e),
        )
    })
}

/// Deletes namespaces by name, synchronously (for `Drop`). Missing ones are ignored.
pub(crate) fn delete_blocking(names: &[String]) -> Result<(), String> {
    use std::io::Write;
    if names.is_empty() {
        return Ok(());
    }
    let mut child = std::process::Command::new("ip")
        .args(["-force", "-batch", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run ip: {e}"))?;
    {
        let mut stdin = child.stdin.take().expect("stdin is piped");
        for n in names {
            writeln!(stdin, "netns del {n}").map_err(|e| format!("writing to ip: {e}"))?;
        }
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("waiting for ip: {e}"))?;
    // Lines for namespaces already gone fail harmlessly; anything else left behind is reported.
    let left: Vec<&String> = names
        .iter()
        .filter(|n| std::path::Path::new("/run/netns").join(n).exists())
        .collect();
    if left.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "namespaces left behind: {left:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}
