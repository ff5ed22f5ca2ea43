//! Support for the container-runtime tests (`tests/cri_containerd.rs`, `tests/podman_cni.rs`): the
//! kubelet's path, a real runtime executing the real `eniipam` plugin with a shipped conflist, against a
//! real `eniipamd` on mockcloud.
//!
//! Everything runs on a test "node" ([`node::Node`]): a network namespace the test makes plus a private
//! mount namespace in which `/run` and `/var/lib` are fresh tmpfs and `/run/eniipam` and `/var/lib/cni`
//! are bind mounts of temp dirs, so the conflist's shipped paths work unchanged and nothing on the machine
//! is touched. The runtimes and the daemon are started inside it with `nsenter` (not `ip netns exec`,
//! which remounts `/sys` and hides the cgroup mounts runc needs). The sandbox image is built locally
//! ([`image`]); no registry is involved.

#![allow(dead_code)]

pub mod containerd;
pub mod cri;
pub mod daemon;
pub mod image;
pub mod node;
pub mod podman;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// Where Debian's `containernetworking-plugins` (and the upstream tarball) put the reference plugins.
const REFERENCE_PLUGIN_DIRS: &[&str] = &["/usr/lib/cni", "/opt/cni/bin"];

/// Environment variable naming a conflist to test instead of the shipped one (to check the harness or
/// compare variants; the default is always the file in `deploy/`, read from disk).
pub const CONFLIST_OVERRIDE: &str = "ENIIPAM_TEST_CONFLIST";

/// A binary of this workspace next to the test executable (`target/<profile>/<name>`; the test runs
/// from `target/<profile>/deps/`). Works when the binary belongs to another package of the workspace.
pub fn target_bin(name: &str) -> PathBuf {
    let bin = target_profile_dir().join(name);
    assert!(
        bin.is_file(),
        "{} is missing: build it: cargo build --workspace --bins",
        bin.display()
    );
    bin
}

/// `target/<profile>/`, for caches shared by test runs.
pub fn target_profile_dir() -> PathBuf {
    std::env::current_exe()
        .expect("the test executable's path")
        .parent()
        .and_then(Path::parent)
        .expect("the test executable lives in target/<profile>/deps/")
        .to_path_buf()
}

/// A file of the repository (relative to the root package).
pub fn repo_file(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
}

/// The conflist a test runs: `shipped` (relative to the repository, e.g. `deploy/10-eniipam.conflist`)
/// unless [`CONFLIST_OVERRIDE`] names another file.
pub fn conflist_under_test(shipped: &str) -> PathBuf {
    let path = match std::env::var_os(CONFLIST_OVERRIDE) {
        Some(p) if !p.is_empty() => {
            let p = PathBuf::from(p);
            eprintln!(
                "NOTICE: {CONFLIST_OVERRIDE} is set: testing {} instead of {shipped}",
                p.display()
            );
            p
        }
        _ => repo_file(shipped),
    };
    assert!(path.is_file(), "no conflist at {}", path.display());
    path
}

/// Whether the effective user is root (from `/proc/self/status`, `Uid: real effective ...`).
pub fn is_root() -> bool {
    proc_status_field("Uid")
        .and_then(|v| v.split_whitespace().nth(1).map(|e| e == "0"))
        .unwrap_or(false)
}

/// Whether this process holds CAP_SYS_RESOURCE (some sandboxes drop it: then runc cannot lower
/// `oom_score_adj` nor raise rlimits above the inherited hard limit).
pub fn has_cap_sys_resource() -> bool {
    const CAP_SYS_RESOURCE: u32 = 24;
    proc_status_field("CapEff")
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_SYS_RESOURCE) != 0)
}

fn proc_status_field(field: &str) -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status.lines().find_map(|l| {
        l.strip_prefix(field)
            .and_then(|rest| rest.strip_prefix(':'))
            .map(|v| v.trim().to_owned())
    })
}

/// Prints why `test` is skipped and returns false when not root; true otherwise.
pub fn root_or_skip(test: &str) -> bool {
    if is_root() {
        return true;
    }
    mockcloud::ci::skip(
        test,
        "it needs root (network and mount namespaces, a container runtime)",
    );
    false
}

/// A reference CNI plugin binary (`portmap`, `loopback`, `ptp`, ...).
pub fn reference_plugin(name: &str) -> PathBuf {
    REFERENCE_PLUGIN_DIRS
        .iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "the reference CNI plugin {name} is not in {REFERENCE_PLUGIN_DIRS:?}: run .ci/install-runtimes.sh"
            )
        })
}

/// The path of a program on the standard PATH, or a panic telling how to install it.
pub fn require_program(name: &str) -> PathBuf {
    for dir in [
        "/usr/local/sbin",
        "/usr/local/bin",
        "/usr/sbin",
        "/usr/bin",
        "/sbin",
        "/bin",
    ] {
        let p = Path::new(dir).join(name);
        if p.is_file() {
            return p;
        }
    }
    panic!("{name} is not installed: run .ci/install-runtimes.sh");
}

/// The PATH given to every process the tests start.
pub const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Runs `cmd`, panicking with its output unless it succeeds; returns stdout.
pub fn run_ok(cmd: &mut Command) -> String {
    let out = output_of(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn output_of(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

/// The first line of `program --version`-like output, for the report.
pub fn version_line(program: &str, args: &[&str]) -> String {
    match Command::new(program).args(args).output() {
        Ok(o) => {
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
            text.lines().next().unwrap_or("").trim().to_owned()
        }
        Err(e) => format!("{program}: {e}"),
    }
}

/// Polls `check` every 50 ms until it returns `Some`, for at most `timeout` (waiting on real processes:
/// a daemon's socket, a runtime's readiness). Panics with `what` and `context()` on time-out.
pub fn wait_for<T>(
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> Option<T>,
    context: impl Fn() -> String,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check() {
            return v;
        }
        if Instant::now() >= deadline {
            panic!(
                "timed out after {timeout:?} waiting for {what}\n{}",
                context()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The last `n` lines of a log file (for failure messages).
pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.len().saturating_sub(n);
    format!(
        "--- last {} lines of {} ---\n{}",
        lines.len() - start,
        path.display(),
        lines[start..].join("\n")
    )
}

/// Lines of a log file that contain any of `needles` (for failure messages and the report).
pub fn grep(path: &Path, needles: &[&str], max: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let found: Vec<&str> = text
        .lines()
        .filter(|l| needles.iter().any(|n| l.contains(n)))
        .collect();
    let start = found.len().saturating_sub(max);
    format!(
        "--- {} lines of {} matching {needles:?} ---\n{}",
        found.len() - start,
        path.display(),
        found[start..].join("\n")
    )
}

/// Runs `f` on a thread that joined the network namespace at `netns` (sockets it creates stay in that
/// namespace wherever they are used afterwards).
pub fn in_netns<T: Send + 'static>(
    netns: &Path,
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    let file = std::fs::File::open(netns)?;
    std::thread::spawn(move || {
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
            .map_err(std::io::Error::from)?;
        f()
    })
    .join()
    .map_err(|_| std::io::Error::other("the namespace thread panicked"))?
}

/// Opens a TCP connection from inside `from_netns` to `target` and checks that what `listener` (bound
/// in another namespace) accepts is that connection: a byte each way.
pub fn tcp_roundtrip(
    listener: std::net::TcpListener,
    from_netns: &Path,
    target: std::net::SocketAddr,
) -> std::io::Result<()> {
    use std::io::{Read, Write};
    let timeout = Duration::from_secs(5);
    listener.set_nonblocking(false)?;
    let server = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut conn, _) = listener.accept()?;
        conn.set_read_timeout(Some(timeout))?;
        let mut byte = [0u8; 1];
        conn.read_exact(&mut byte)?;
        conn.write_all(&[byte[0] + 1])
    });
    in_netns(from_netns, move || {
        let mut conn = std::net::TcpStream::connect_timeout(&target, timeout)?;
        conn.set_read_timeout(Some(timeout))?;
        conn.write_all(&[41])?;
        let mut byte = [0u8; 1];
        conn.read_exact(&mut byte)?;
        if byte[0] != 42 {
            return Err(std::io::Error::other(format!("echo answered {}", byte[0])));
        }
        Ok(())
    })?;
    server
        .join()
        .map_err(|_| std::io::Error::other("the server thread panicked"))?
}

/// Sorted file names in a directory (empty when it does not exist).
pub fn dir_entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = match std::fs::read_dir(dir) {
        Ok(d) => d
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect(),
        Err(_) => Vec::new(),
    };
    names.sort();
    names
}

/// Every file under `dir`, recursively, relative to it (empty when it does not exist).
pub fn files_under(dir: &Path) -> Vec<String> {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.filter_map(Result::ok) {
            let p = e.path();
            if p.is_dir() {
                walk(base, &p, out);
            } else {
                out.push(
                    p.strip_prefix(base)
                        .unwrap_or(&p)
                        .to_string_lossy()
                        .into_owned(),
                );
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}
