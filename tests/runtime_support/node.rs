//! A test "node": a network namespace plus a private mount namespace, held open by one `sleep` process
//! (the holder), in which the runtimes and the daemon run. Dropping it stops everything that was started
//! in it (by process id: the processes it started, then what remains in its mount namespace or its
//! cgroup parent), removes the cgroups, the network namespace and the temp dir, also when a test fails.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::{PATH, output_of, require_program, run_ok};

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A process started in the node.
struct Started {
    name: String,
    child: Child,
}

pub struct Node {
    /// The temp dir holding everything the node writes (removed on drop).
    pub dir: PathBuf,
    /// The network namespace's name (`/run/netns/<netns>` in the machine's mount namespace).
    pub netns: String,
    /// The cgroup under which the runtimes put pods and containers (relative to each hierarchy's root).
    pub cgroup_parent: String,
    holder: Child,
    started: Vec<Started>,
}

impl Node {
    /// Makes the namespaces: `/run` and `/var/lib` become fresh tmpfs in the mount namespace, with
    /// `/run/eniipam` ← `<dir>/run-eniipam` and `/var/lib/cni` ← `<dir>/var-lib-cni` bind-mounted, so
    /// the test can read the daemon's socket and the CNI caches from outside.
    pub fn start(tag: &str) -> Node {
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let unique = format!("{tag}-{}-{n}", std::process::id());
        let dir = std::env::temp_dir().join(format!("eniipam-{unique}"));
        let _ = std::fs::remove_dir_all(&dir);
        for sub in ["run-eniipam", "var-lib-cni", "logs"] {
            std::fs::create_dir_all(dir.join(sub)).expect("creating the node's temp dirs");
        }
        let netns = format!("eniipam-{unique}");
        let ip = require_program("ip");
        run_ok(Command::new(&ip).args(["netns", "add", &netns]));
        // From here on, failures still clean up: the guard owns the namespace and the dir.
        let guard = PartialNode {
            dir: dir.clone(),
            netns: netns.clone(),
        };
        run_ok(Command::new(&ip).args(["-n", &netns, "link", "set", "lo", "up"]));
        // A node forwards between its pods.
        run_ok(
            Command::new(require_program("nsenter"))
                .arg(format!("--net=/run/netns/{netns}"))
                .args(["sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"]),
        );

        let script = format!(
            "set -e
             mount -t tmpfs -o mode=0755 tmpfs /run
             mkdir -p /run/eniipam /run/netns
             mount --bind '{run}' /run/eniipam
             mount -t tmpfs -o mode=0755 tmpfs /var/lib
             mkdir -p /var/lib/cni
             mount --bind '{lib}' /var/lib/cni
             echo ready
             exec sleep infinity",
            run = dir.join("run-eniipam").display(),
            lib = dir.join("var-lib-cni").display(),
        );
        let mut holder = Command::new(require_program("unshare"))
            .args(["--mount", "--propagation", "private", "--"])
            .arg(require_program("nsenter"))
            .arg(format!("--net=/run/netns/{netns}"))
            .args(["--", "sh", "-c", &script])
            .env_clear()
            .env("PATH", PATH)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting the node's namespace holder (unshare, nsenter)");
        let mut line = String::new();
        let _ = BufReader::new(holder.stdout.take().expect("piped")).read_line(&mut line);
        if line.trim() != "ready" {
            let out = holder.wait_with_output().expect("holder output");
            panic!(
                "setting up the node's mount namespace failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        // The Node owns the namespace and the dir from here on.
        std::mem::forget(guard);
        Node {
            dir,
            netns,
            cgroup_parent: format!("eniipam-test-{unique}"),
            holder,
            started: Vec::new(),
        }
    }

    pub fn holder_pid(&self) -> u32 {
        self.holder.id()
    }

    /// `/run/netns/<netns>` as the machine sees it.
    pub fn netns_path(&self) -> String {
        format!("/run/netns/{}", self.netns)
    }

    /// A path inside the node's mount namespace, reachable from outside (`/proc/<holder>/root/...`).
    /// `/var/run` is a symlink to `/run`, and an absolute symlink under `/proc/<pid>/root` resolves
    /// against the reader's root, so it is resolved here.
    pub fn inside(&self, path: &str) -> PathBuf {
        let path = match path.strip_prefix("/var/run/") {
            Some(rest) => format!("/run/{rest}"),
            None => path.to_owned(),
        };
        Path::new(&format!("/proc/{}/root", self.holder.id())).join(path.trim_start_matches('/'))
    }

    /// A command that runs `program` inside the node (its mount and network namespaces), with a clean
    /// environment holding only PATH.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new(require_program("nsenter"));
        cmd.arg("-t")
            .arg(self.holder.id().to_string())
            .args(["-m", "-n", "--"])
            .arg(program)
            .env_clear()
            .env("PATH", PATH)
            .stdin(Stdio::null());
        cmd
    }

    /// A command that runs `program` in the node's network namespace only.
    pub fn net_command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new(require_program("nsenter"));
        cmd.arg(format!("--net={}", self.netns_path()))
            .arg("--")
            .arg(program)
            .env_clear()
            .env("PATH", PATH);
        cmd
    }

    /// Starts a long-running process (built with [`Node::command`]) with stdout and stderr to
    /// `<dir>/logs/<name>.log`; it is stopped on drop, last started first. Returns the log's path.
    pub fn spawn(&mut self, name: &str, mut cmd: Command) -> PathBuf {
        let log = self.dir.join("logs").join(format!("{name}.log"));
        let file = std::fs::File::create(&log).expect("log file");
        let child = cmd
            .stdout(file.try_clone().expect("log file"))
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name} ({cmd:?}): {e}"));
        self.started.push(Started {
            name: name.to_owned(),
            child,
        });
        log
    }

    /// Whether the started process `name` has exited (and how).
    pub fn exited(&mut self, name: &str) -> Option<String> {
        let s = self.started.iter_mut().find(|s| s.name == name)?;
        s.child
            .try_wait()
            .ok()
            .flatten()
            .map(|status| status.to_string())
    }

    /// SIGTERM to the started process `name`, SIGKILL after `grace`; waits for it.
    pub fn stop(&mut self, name: &str, grace: Duration) {
        if let Some(i) = self.started.iter().position(|s| s.name == name) {
            let mut s = self.started.remove(i);
            terminate(&mut s.child, grace);
        }
    }

    /// Puts `ip`/32 on the node's loopback (the node's own address, as eth0's would be).
    pub fn add_local_address(&self, ip: std::net::Ipv4Addr) {
        run_ok(Command::new(require_program("ip")).args([
            "-n",
            &self.netns,
            "addr",
            "add",
            &format!("{ip}/32"),
            "dev",
            "lo",
        ]));
    }

    /// Adds `ip/128` to the node's loopback (a node address for IPv6 hostPort checks).
    pub fn add_local_address6(&self, ip: std::net::Ipv6Addr) {
        run_ok(Command::new(require_program("ip")).args([
            "-n",
            &self.netns,
            "-6",
            "addr",
            "add",
            &format!("{ip}/128"),
            "dev",
            "lo",
            "nodad",
        ]));
    }

    /// Turns IPv6 forwarding on in the node (what `eniipamd --prepare-host` does on a real node; the
    /// test's node is prepared by the test). IPv4 forwarding is on from [`Node::start`].
    pub fn enable_ipv6_forwarding(&self) {
        run_ok(
            Command::new(require_program("nsenter"))
                .arg(format!("--net={}", self.netns_path()))
                .args([
                    "sh",
                    "-c",
                    "echo 1 > /proc/sys/net/ipv6/conf/all/forwarding",
                ]),
        );
    }

    /// `ip6tables-save -t nat` in the node's network namespace.
    pub fn nat6_rules(&self) -> String {
        run_ok(
            self.net_command(require_program("ip6tables-save"))
                .args(["-t", "nat"]),
        )
    }

    /// `iptables-save -t nat` in the node's network namespace.
    pub fn nat_rules(&self) -> String {
        run_ok(
            self.net_command(require_program("iptables-save"))
                .args(["-t", "nat"]),
        )
    }

    /// Every process in the node's mount namespace except the holder (shims, conmon, ...).
    fn processes_in_mount_ns(&self) -> Vec<i32> {
        let holder = self.holder.id() as i32;
        let Ok(ns) = std::fs::read_link(format!("/proc/{holder}/ns/mnt")) else {
            return Vec::new();
        };
        all_pids()
            .into_iter()
            .filter(|&p| p != holder)
            .filter(|p| std::fs::read_link(format!("/proc/{p}/ns/mnt")).is_ok_and(|l| l == ns))
            .collect()
    }

    /// The cgroup directories of `cgroup_parent` in every mounted hierarchy.
    fn cgroup_dirs(&self) -> Vec<PathBuf> {
        cgroup_mounts()
            .into_iter()
            .map(|m| m.join(&self.cgroup_parent))
            .filter(|p| p.is_dir())
            .collect()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // 1. What the test started, last first (the runtimes before the daemon).
        while let Some(mut s) = self.started.pop() {
            terminate(&mut s.child, Duration::from_secs(5));
        }
        // 2. What the runtimes started: containers (in our cgroup parent) and shims / conmon (in our
        //    mount namespace).
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let mut pids: Vec<i32> = self
                .cgroup_dirs()
                .iter()
                .flat_map(|d| procs_under(d))
                .collect();
            pids.extend(self.processes_in_mount_ns());
            pids.sort_unstable();
            pids.dedup();
            if pids.is_empty() || Instant::now() >= deadline {
                break;
            }
            for p in pids {
                let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // 3. The holder: with it the mount namespace (and every mount in it) goes.
        let _ = self.holder.kill();
        let _ = self.holder.wait();
        // 4. Cgroups, deepest first.
        for dir in self.cgroup_dirs() {
            remove_cgroup_tree(&dir);
        }
        // 5. The network namespace and the files.
        drop(PartialNode {
            dir: std::mem::take(&mut self.dir),
            netns: std::mem::take(&mut self.netns),
        });
    }
}

/// Cleans up a node's network namespace and dir (also used while a node is being built).
struct PartialNode {
    dir: PathBuf,
    netns: String,
}

impl Drop for PartialNode {
    fn drop(&mut self) {
        if !self.netns.is_empty() {
            let _ = Command::new(require_program("ip"))
                .args(["netns", "del", &self.netns])
                .output();
        }
        if !self.dir.as_os_str().is_empty() && std::env::var_os("ENIIPAM_TEST_KEEP").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn terminate(child: &mut Child, grace: Duration) {
    if child.try_wait().ok().flatten().is_some() {
        return;
    }
    let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if child.try_wait().ok().flatten().is_some() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

fn all_pids() -> Vec<i32> {
    std::fs::read_dir("/proc")
        .map(|d| {
            d.filter_map(Result::ok)
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Mount points of every cgroup (v1) or cgroup2 hierarchy.
fn cgroup_mounts() -> Vec<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_dev, at, fstype) = (f.next()?, f.next()?, f.next()?);
            (fstype == "cgroup" || fstype == "cgroup2").then(|| PathBuf::from(at))
        })
        .collect()
}

fn procs_under(dir: &Path) -> Vec<i32> {
    let mut pids: Vec<i32> = std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.filter_map(Result::ok) {
            if e.path().is_dir() {
                pids.extend(procs_under(&e.path()));
            }
        }
    }
    pids
}

fn remove_cgroup_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.filter_map(Result::ok) {
            if e.path().is_dir() {
                remove_cgroup_tree(&e.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// Output of a command, for use in messages.
pub fn describe(cmd: &mut Command) -> String {
    let out = output_of(cmd);
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}
