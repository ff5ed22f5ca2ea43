//! `eniipamctl install-cni` / `uninstall-cni`: how a node gets eniipam's CNI files.
//!
//! install-cni, in order:
//! 1. checks its inputs: each plugin binary to ship, the conflist (JSON with a name and plugins,
//!    every plugin type of which is shipped or already in the host's bin dir), the host's dirs, and
//!    that no other CNI config in the conf dir sorts before eniipam's (the runtime uses the
//!    lexically first one, so eniipam's would be ignored);
//! 2. copies the plugins (`eniipam`, `loopback`, `portmap` by default) into the host's CNI bin dir,
//!    each ATOMICALLY: a temp file in the same directory, fsync, chmod 0755, rename(2) over the
//!    target. A runtime never execs a half-written plugin, and replacing a binary that is running
//!    never fails with ETXTBSY (running copies keep the old inode). Unchanged files are left alone;
//! 3. waits until eniipamd answers gRPC health SERVING on its socket (which it does only after its
//!    startup rebuild), so a node never advertises a network its daemon cannot serve: kubelet keeps
//!    the node NotReady until a conflist appears;
//! 4. writes the conflist the same atomic way (mode 0644).
//!
//! With `--wait` (the DaemonSet's sidecar) it then stays: every `--recheck-secs` it re-installs what
//! changed or vanished (a ConfigMap update reaches the node this way), the conflist only while the
//! daemon is healthy; on SIGTERM or SIGINT it removes the conflist (unless `--keep-conflist`) and
//! exits 0, so a node whose eniipam is gone turns NotReady instead of handing pods
//! to a plugin with no daemon behind it. The plugin binaries stay: pods that exist still need
//! `eniipam` for their DEL.
//!
//! `install-cni --check` changes nothing and says whether all of that is in place (the container's
//! readiness probe). uninstall-cni removes the conflist, and with `--remove-plugin` the `eniipam` binary (never the
//! shared reference plugins).

use std::io::Write as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;

use crate::introspect::check_health;

/// Where the image ships the plugins (deploy/Dockerfile).
const DEFAULT_PLUGINS_FROM: &str = "/opt/eniipam/cni-bin";
/// Where the DaemonSet mounts the `eniipam-cni` ConfigMap.
const DEFAULT_CONFLIST: &str = "/etc/eniipam-cni/10-eniipam.conflist";
const DEFAULT_CONFLIST_NAME: &str = "10-eniipam.conflist";

#[derive(Args, Debug)]
pub struct HostDirs {
    /// Where the host's root filesystem is mounted (`/host` in the DaemonSet; `/` on the node).
    #[arg(long, default_value = "/")]
    host_root: PathBuf,
    /// The runtime's CNI bin dir, on the host (containerd's `bin_dir`).
    #[arg(long, default_value = "/opt/cni/bin")]
    bin_dir: PathBuf,
    /// The runtime's CNI conf dir, on the host (containerd's `conf_dir`).
    #[arg(long, default_value = "/etc/cni/net.d")]
    conf_dir: PathBuf,
}

impl HostDirs {
    fn host(&self, path: &Path) -> PathBuf {
        let relative = path.strip_prefix("/").unwrap_or(path);
        self.host_root.join(relative)
    }

    fn bin(&self) -> PathBuf {
        self.host(&self.bin_dir)
    }

    fn conf(&self) -> PathBuf {
        self.host(&self.conf_dir)
    }
}

#[derive(Args, Debug)]
pub struct InstallArgs {
    #[command(flatten)]
    dirs: HostDirs,
    /// The plugin result cache dir, on the host (the conflist's `cache_dir`); created mode 0700.
    #[arg(long, default_value = eniipam_api::cache::DEFAULT_CACHE_DIR)]
    cache_dir: PathBuf,
    /// Directory holding the plugin binaries to install.
    #[arg(long, default_value = DEFAULT_PLUGINS_FROM)]
    plugins_from: PathBuf,
    /// The plugins to install from --plugins-from.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "eniipam,loopback,portmap"
    )]
    plugins: Vec<String>,
    /// The conflist to install; its file name is the name it gets in the conf dir.
    #[arg(long, default_value = DEFAULT_CONFLIST)]
    conflist: PathBuf,
    /// Stay running: re-install what changes, remove the conflist on SIGTERM/SIGINT.
    #[arg(long)]
    wait: bool,
    /// With --wait: leave the conflist in place on exit.
    #[arg(long, requires = "wait")]
    keep_conflist: bool,
    /// Seconds between health checks while waiting for eniipamd.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=300))]
    health_interval_secs: u64,
    /// Without --wait: give up when eniipamd is not healthy after this many seconds (0: never).
    #[arg(long, default_value_t = 0)]
    timeout_secs: u64,
    /// With --wait: seconds between re-checks of the installed files.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
    recheck_secs: u64,
    /// Change nothing: exit 0 when the plugins and the conflist on the host are exactly what this
    /// command would install (the install-cni container's readiness probe), 1 naming what is not.
    #[arg(long, conflicts_with = "wait")]
    check: bool,
}

#[derive(Args, Debug)]
pub struct UninstallArgs {
    #[command(flatten)]
    dirs: HostDirs,
    /// The conflist's file name in the conf dir.
    #[arg(long, default_value = DEFAULT_CONFLIST_NAME)]
    conflist_name: String,
    /// Also remove the `eniipam` plugin binary (only once no pod on the node uses eniipam: their
    /// DEL needs it).
    #[arg(long)]
    remove_plugin: bool,
}

fn log(msg: impl std::fmt::Display) {
    eprintln!("install-cni: {msg}");
}

/// The checked inputs of an install.
struct Plan {
    plugins: Vec<(PathBuf, PathBuf)>,
    conflist_bytes: Vec<u8>,
    conflist_dest: PathBuf,
    bin: PathBuf,
    conf: PathBuf,
}

impl Plan {
    fn read(a: &InstallArgs) -> Result<Plan, String> {
        let bin = a.dirs.bin();
        let conf = a.dirs.conf();
        if a.plugins.is_empty() || a.plugins.iter().any(|p| p.is_empty() || p.contains('/')) {
            return Err(format!(
                "--plugins must name plugin files, not {:?}",
                a.plugins
            ));
        }
        let mut plugins = Vec::new();
        for name in &a.plugins {
            let src = a.plugins_from.join(name);
            let meta = std::fs::metadata(&src).map_err(|e| {
                format!(
                    "plugin {name}: cannot read {}: {e} (is --plugins-from right?)",
                    src.display()
                )
            })?;
            if !meta.is_file() {
                return Err(format!("plugin {name}: {} is not a file", src.display()));
            }
            plugins.push((src, bin.join(name)));
        }
        let conflist_bytes = std::fs::read(&a.conflist).map_err(|e| {
            format!(
                "cannot read the conflist {}: {e} (is the eniipam-cni ConfigMap mounted?)",
                a.conflist.display()
            )
        })?;
        let name = a
            .conflist
            .file_name()
            .and_then(|n| n.to_str())
            .filter(|n| n.ends_with(".conflist"))
            .ok_or_else(|| {
                format!(
                    "the conflist {} must be named <something>.conflist",
                    a.conflist.display()
                )
            })?
            .to_owned();
        let types = conflist_types(&conflist_bytes)
            .map_err(|e| format!("the conflist {}: {e}", a.conflist.display()))?;
        for t in &types {
            if !a.plugins.contains(t) && !bin.join(t).is_file() {
                return Err(format!(
                    "the conflist {} uses the plugin {t:?}, which is neither installed by this command \
                     (--plugins {}) nor present in {}",
                    a.conflist.display(),
                    a.plugins.join(","),
                    bin.display()
                ));
            }
        }
        Ok(Plan {
            plugins,
            conflist_bytes,
            conflist_dest: conf.join(name),
            bin,
            conf,
        })
    }

    /// Other CNI configs that the runtime would pick before ours (it loads the lexically first).
    fn shadowing_configs(&self) -> Result<Vec<PathBuf>, String> {
        let ours = self
            .conflist_dest
            .file_name()
            .expect("a file name")
            .to_owned();
        let entries = std::fs::read_dir(&self.conf)
            .map_err(|e| format!("cannot list {}: {e}", self.conf.display()))?;
        let mut found: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| {
                let n = p.file_name().unwrap_or_default();
                let is_config = p
                    .extension()
                    .is_some_and(|x| x == "conf" || x == "conflist" || x == "json");
                is_config && n < ours.as_os_str()
            })
            .collect();
        found.sort();
        Ok(found)
    }
}

/// The `type` of every plugin in a conflist, after checking its shape.
fn conflist_types(bytes: &[u8]) -> Result<Vec<String>, String> {
    let v: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| format!("not valid JSON: {e}"))?;
    if v["name"].as_str().is_none_or(str::is_empty) {
        return Err("no \"name\"".into());
    }
    if v["cniVersion"].as_str().is_none_or(str::is_empty) {
        return Err("no \"cniVersion\"".into());
    }
    let plugins = v["plugins"]
        .as_array()
        .filter(|p| !p.is_empty())
        .ok_or("no \"plugins\" list: a .conflist needs one")?;
    plugins
        .iter()
        .enumerate()
        .map(|(i, p)| {
            p["type"]
                .as_str()
                .filter(|t| !t.is_empty() && !t.contains('/'))
                .map(str::to_owned)
                .ok_or_else(|| format!("plugins[{i}] has no valid \"type\""))
        })
        .collect()
}

/// Installs `bytes` as `dest` with `mode` unless `dest` already holds exactly them: a temp file in the
/// same directory, written, fsynced, chmoded, then renamed over `dest`. Returns whether it changed.
fn atomic_install(bytes: &[u8], dest: &Path, mode: u32) -> Result<bool, String> {
    if let Ok(current) = std::fs::read(dest) {
        let mode_ok = std::fs::metadata(dest)
            .map(|m| m.permissions().mode() & 0o7777 == mode)
            .unwrap_or(false);
        if current == bytes && mode_ok {
            return Ok(false);
        }
    }
    let dir = dest
        .parent()
        .ok_or_else(|| format!("{} has no parent directory", dest.display()))?;
    let name = dest.file_name().unwrap_or_default().to_string_lossy();
    let tmp = dir.join(format!(".{name}.eniipam-tmp.{}", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        f.sync_all()?;
        drop(f);
        // rename(2) within one directory: readers see the old file or the new one, never a part.
        std::fs::rename(&tmp, dest)?;
        // Make the rename itself durable.
        std::fs::File::open(dir)?.sync_all()
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        format!("cannot install {}: {e}", dest.display())
    })?;
    Ok(true)
}

fn ensure_dir(dir: &Path, mode: u32) -> Result<(), String> {
    if dir.is_dir() {
        return Ok(());
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
        .map_err(|e| format!("cannot chmod {}: {e}", dir.display()))
}

/// Step 2: the plugins.
fn install_plugins(plan: &Plan) -> Result<(), String> {
    ensure_dir(&plan.bin, 0o755)?;
    for (src, dest) in &plan.plugins {
        let bytes =
            std::fs::read(src).map_err(|e| format!("cannot read {}: {e}", src.display()))?;
        if atomic_install(&bytes, dest, 0o755)? {
            log(format_args!(
                "installed {} (from {})",
                dest.display(),
                src.display()
            ));
        }
    }
    Ok(())
}

/// Refuses when another CNI config would be used instead of eniipam's.
fn check_not_shadowed(plan: &Plan) -> Result<(), String> {
    let shadowing = plan.shadowing_configs()?;
    if !shadowing.is_empty() {
        return Err(format!(
            "{} sorts before {} in {}: the runtime uses the lexically first CNI config, so eniipam's \
             would be ignored. Is another CNI (aws-node) still configured on this node? Move it away \
             (see docs/install-eks.md, \"Migrating from aws-node\") or give eniipam's conflist a name \
             that sorts first",
            shadowing
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
            plan.conflist_dest
                .file_name()
                .unwrap_or_default()
                .to_string_lossy(),
            plan.conf.display()
        ));
    }
    Ok(())
}

/// Step 4: the conflist.
fn install_conflist(plan: &Plan) -> Result<(), String> {
    ensure_dir(&plan.conf, 0o755)?;
    check_not_shadowed(plan)?;
    if atomic_install(&plan.conflist_bytes, &plan.conflist_dest, 0o644)? {
        log(format_args!("installed {}", plan.conflist_dest.display()));
    }
    Ok(())
}

/// Polls eniipamd's health until SERVING; logs why not every 30 s. `None` timeout: forever.
async fn wait_healthy(
    socket: &Path,
    every: Duration,
    timeout: Option<Duration>,
) -> Result<(), String> {
    let start = tokio::time::Instant::now();
    let mut last_log: Option<tokio::time::Instant> = None;
    log(format_args!(
        "waiting for eniipamd to be healthy on {} (every {every:?})",
        socket.display()
    ));
    loop {
        let why = match check_health(socket).await {
            Ok(()) => {
                log(format_args!(
                    "eniipamd is healthy after {:.1?}",
                    start.elapsed()
                ));
                return Ok(());
            }
            Err(why) => why,
        };
        if let Some(t) = timeout
            && start.elapsed() >= t
        {
            return Err(format!(
                "eniipamd was not healthy within {t:?}: {why}; the conflist was not written"
            ));
        }
        if last_log.is_none_or(|l| l.elapsed() >= Duration::from_secs(30)) {
            log(format_args!(
                "still waiting after {:.0?}: {why}",
                start.elapsed()
            ));
            last_log = Some(tokio::time::Instant::now());
        }
        tokio::time::sleep(every).await;
    }
}

/// `--check`: whether every file is installed and current, without changing anything.
fn check_installed(plan: &Plan) -> Result<(), String> {
    let mut wrong = Vec::new();
    let mut compare = |src_bytes: &[u8], dest: &Path| match std::fs::read(dest) {
        Ok(b) if b == src_bytes => {}
        Ok(_) => wrong.push(format!(
            "{} differs from what would be installed",
            dest.display()
        )),
        Err(e) => wrong.push(format!("{}: {e}", dest.display())),
    };
    for (src, dest) in &plan.plugins {
        let bytes =
            std::fs::read(src).map_err(|e| format!("cannot read {}: {e}", src.display()))?;
        compare(&bytes, dest);
    }
    compare(&plan.conflist_bytes, &plan.conflist_dest);
    if let Err(e) = check_not_shadowed(plan) {
        wrong.push(e);
    }
    if wrong.is_empty() {
        println!("installed and current: {}", plan.conflist_dest.display());
        Ok(())
    } else {
        Err(format!("not installed: {}", wrong.join("; ")))
    }
}

fn remove_if_present(path: &Path) -> Result<bool, String> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(format!("cannot remove {}: {e}", path.display())),
    }
}

pub async fn install(a: &InstallArgs, socket: &Path) -> Result<(), String> {
    use tokio::signal::unix::{SignalKind, signal};
    // Signals are watched from the start: a SIGTERM while waiting for the daemon ends the wait.
    let mut term = signal(SignalKind::terminate()).map_err(|e| format!("SIGTERM: {e}"))?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| format!("SIGINT: {e}"))?;

    let plan = Plan::read(a)?;
    if a.check {
        return check_installed(&plan);
    }
    install_plugins(&plan)?;
    ensure_dir(&a.dirs.host(&a.cache_dir), 0o700)?;
    ensure_dir(&plan.conf, 0o755)?;
    // Fail before waiting when the conflist could not take effect anyway.
    check_not_shadowed(&plan)?;

    let every = Duration::from_secs(a.health_interval_secs);
    let timeout = (!a.wait && a.timeout_secs > 0).then(|| Duration::from_secs(a.timeout_secs));
    tokio::select! {
        r = wait_healthy(socket, every, timeout) => r?,
        _ = term.recv() => { log("SIGTERM before eniipamd was healthy: nothing written"); return Ok(()) }
        _ = int.recv() => { log("SIGINT before eniipamd was healthy: nothing written"); return Ok(()) }
    }
    install_conflist(&plan)?;
    log(format_args!(
        "done: {} and the plugins {} in {} are current",
        plan.conflist_dest.display(),
        a.plugins.join(", "),
        plan.bin.display()
    ));
    if !a.wait {
        return Ok(());
    }

    let recheck = Duration::from_secs(a.recheck_secs);
    let signal_name = loop {
        tokio::select! {
            _ = term.recv() => break "SIGTERM",
            _ = int.recv() => break "SIGINT",
            _ = tokio::time::sleep(recheck) => {}
        }
        if let Err(e) = recheck_once(a, socket).await {
            log(format_args!("re-check: {e}"));
        }
    };
    if a.keep_conflist {
        log(format_args!(
            "{signal_name}: leaving {} in place (--keep-conflist)",
            plan.conflist_dest.display()
        ));
    } else if remove_if_present(&plan.conflist_dest)? {
        log(format_args!(
            "{signal_name}: removed {} (the node is NotReady until eniipam is back); the plugins stay for the DEL of existing pods",
            plan.conflist_dest.display()
        ));
    }
    Ok(())
}

/// One `--wait` re-check: the inputs again (the ConfigMap may have changed), the plugins, and the
/// conflist while the daemon is healthy.
async fn recheck_once(a: &InstallArgs, socket: &Path) -> Result<(), String> {
    let plan = Plan::read(a)?;
    install_plugins(&plan)?;
    match check_health(socket).await {
        Ok(()) => install_conflist(&plan)?,
        Err(why) => log(format_args!(
            "eniipamd is not healthy ({why}); leaving {} as it is",
            plan.conflist_dest.display()
        )),
    }
    Ok(())
}

pub fn uninstall(a: &UninstallArgs) -> Result<(), String> {
    if a.conflist_name.is_empty() || a.conflist_name.contains('/') {
        return Err(format!(
            "--conflist-name must be a file name, not {:?}",
            a.conflist_name
        ));
    }
    let conflist = a.dirs.conf().join(&a.conflist_name);
    if remove_if_present(&conflist)? {
        log(format_args!("removed {}", conflist.display()));
    } else {
        log(format_args!("{} was not there", conflist.display()));
    }
    if a.remove_plugin {
        let plugin = a.dirs.bin().join("eniipam");
        if remove_if_present(&plugin)? {
            log(format_args!("removed {}", plugin.display()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conflists_are_checked_for_shape() {
        let ok = br#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"eniipam"},{"type":"portmap"}]}"#;
        assert_eq!(conflist_types(ok).unwrap(), ["eniipam", "portmap"]);
        assert!(conflist_types(b"{").unwrap_err().contains("JSON"));
        assert!(
            conflist_types(br#"{"cniVersion":"1.0.0","plugins":[{"type":"x"}]}"#)
                .unwrap_err()
                .contains("name")
        );
        assert!(
            conflist_types(br#"{"cniVersion":"1.0.0","name":"n","type":"eniipam"}"#)
                .unwrap_err()
                .contains("plugins")
        );
        assert!(
            conflist_types(br#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"../x"}]}"#)
                .unwrap_err()
                .contains("plugins[0]")
        );
    }

    #[test]
    fn atomic_install_replaces_only_what_differs() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("eniipam");
        assert!(atomic_install(b"v1", &dest, 0o755).unwrap());
        assert_eq!(std::fs::read(&dest).unwrap(), b"v1");
        assert_eq!(
            std::fs::metadata(&dest).unwrap().permissions().mode() & 0o7777,
            0o755
        );
        assert!(!atomic_install(b"v1", &dest, 0o755).unwrap(), "unchanged");
        // A running copy keeps its inode: the new file is a new inode.
        let old = std::fs::File::open(&dest).unwrap();
        assert!(atomic_install(b"v2", &dest, 0o755).unwrap());
        use std::os::unix::fs::MetadataExt as _;
        assert_ne!(
            old.metadata().unwrap().ino(),
            std::fs::metadata(&dest).unwrap().ino()
        );
        assert!(
            atomic_install(b"v2", &dest, 0o644).unwrap(),
            "a mode change"
        );
        let leftovers: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(leftovers, ["eniipam"], "no temp files left");
    }

    #[test]
    fn host_paths_are_under_the_host_root() {
        let d = HostDirs {
            host_root: "/host".into(),
            bin_dir: "/opt/cni/bin".into(),
            conf_dir: "etc/cni/net.d".into(),
        };
        assert_eq!(d.bin(), Path::new("/host/opt/cni/bin"));
        assert_eq!(d.conf(), Path::new("/host/etc/cni/net.d"));
    }
}
