//! containerd (Debian's package) with its CRI plugin, inside a test node: its own root, state, socket and
//! runc root under the node's temp dir; the CRI plugin's `bin_dir` holding the `eniipam` binary under
//! test plus the reference `portmap`, `loopback` and `ptp`; `conf_dir` holding one conflist copied byte
//! for byte; the locally built sandbox image imported with `ctr`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use eniipam_cri_api::v1::runtime_service_client::RuntimeServiceClient;
use eniipam_cri_api::v1::{StatusRequest, VersionRequest};
use tonic::transport::Channel;

use super::node::Node;
use super::{
    grep, has_cap_sys_resource, image, reference_plugin, require_program, run_ok, tail, target_bin,
};

const NAME: &str = "containerd";

pub struct Containerd {
    pub socket: PathBuf,
    pub log: PathBuf,
    pub bin_dir: PathBuf,
    pub conf_dir: PathBuf,
    pub runtime: RuntimeServiceClient<Channel>,
    /// `containerd` and its version, as the CRI Version call reports them.
    pub version: String,
}

impl Containerd {
    /// Writes the config, starts containerd in `node`, waits until its CRI plugin reports the runtime
    /// and the network ready (the conflist loaded), and imports the sandbox image.
    pub async fn start(node: &mut Node, conflist: &Path) -> Containerd {
        let base = node.dir.join("containerd");
        let bin_dir = base.join("cni-bin");
        let conf_dir = base.join("cni-conf");
        for d in [&bin_dir, &conf_dir] {
            std::fs::create_dir_all(d).expect("containerd dirs");
        }
        std::fs::copy(target_bin("eniipam"), bin_dir.join("eniipam")).expect("copying eniipam");
        for plugin in ["portmap", "loopback", "ptp"] {
            std::fs::copy(reference_plugin(plugin), bin_dir.join(plugin))
                .unwrap_or_else(|e| panic!("copying {plugin}: {e}"));
        }
        let file_name = conflist.file_name().expect("conflist file name");
        std::fs::copy(conflist, conf_dir.join(file_name)).expect("copying the conflist");
        Self::start_with_dirs(node, &bin_dir, &conf_dir).await
    }

    /// Starts containerd with the CRI plugin's `bin_dir` and `conf_dir` as they are (e.g. what an
    /// installer produced), and waits as [`Containerd::start`] does.
    pub async fn start_with_dirs(node: &mut Node, bin_dir: &Path, conf_dir: &Path) -> Containerd {
        let base = node.dir.join("containerd");
        std::fs::create_dir_all(&base).expect("containerd dir");
        let (bin_dir, conf_dir) = (bin_dir.to_owned(), conf_dir.to_owned());
        let socket = base.join("containerd.sock");
        let config = config_toml(&base, &bin_dir, &conf_dir, &socket);
        let config_path = base.join("config.toml");
        std::fs::write(&config_path, config).expect("writing config.toml");

        let mut cmd = node.command(require_program("containerd"));
        cmd.arg("--config")
            .arg(&config_path)
            // The plugin logs to stderr, which containerd copies into its log on failure.
            .env("ENIIPAM_CNI_LOG", "debug");
        let log = node.spawn(NAME, cmd);

        let runtime = connect(node, &socket, &log).await;
        let mut containerd = Containerd {
            socket,
            log,
            bin_dir,
            conf_dir,
            runtime,
            version: String::new(),
        };
        let v = containerd
            .runtime
            .version(VersionRequest {
                version: "v1".into(),
            })
            .await
            .expect("CRI Version")
            .into_inner();
        containerd.version = format!(
            "{} {} (CRI {})",
            v.runtime_name, v.runtime_version, v.runtime_api_version
        );
        containerd.wait_ready().await;
        containerd.import_image(node);
        containerd
    }

    /// Waits until the CRI Status shows RuntimeReady and NetworkReady.
    async fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let status = self
                .runtime
                .status(StatusRequest { verbose: false })
                .await
                .expect("CRI Status")
                .into_inner();
            let conditions = status.status.map(|s| s.conditions).unwrap_or_default();
            if !conditions.is_empty() && conditions.iter().all(|c| c.status) {
                return;
            }
            if Instant::now() >= deadline {
                panic!(
                    "containerd's CRI plugin is not ready: {conditions:?}\n{}",
                    tail(&self.log, 30)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn import_image(&self, node: &Node) {
        let archive = image::pause_image();
        run_ok(
            node.command(require_program("ctr"))
                .arg("--address")
                .arg(&self.socket)
                .args([
                    "-n",
                    "k8s.io",
                    "images",
                    "import",
                    "--snapshotter",
                    "native",
                ])
                .arg(&archive),
        );
    }

    /// Lines of containerd's log about CNI (for failure messages and the report).
    pub fn cni_log(&self, max: usize) -> String {
        grep(
            &self.log,
            &[
                "level=error",
                "level=warning",
                "cni",
                "CNI",
                "eniipam",
                "portmap",
            ],
            max,
        )
    }
}

/// Stops containerd gracefully (it is otherwise stopped with the node).
pub fn stop(node: &mut Node) {
    node.stop(NAME, Duration::from_secs(10));
}

async fn connect(node: &mut Node, socket: &Path, log: &Path) -> RuntimeServiceClient<Channel> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = node.exited(NAME) {
            panic!("containerd exited ({status})\n{}", tail(log, 40));
        }
        if socket.exists()
            && let Ok(channel) = eniipam_cri_api::connect(socket).await
        {
            return RuntimeServiceClient::new(channel);
        }
        if Instant::now() >= deadline {
            panic!(
                "containerd did not open {}\n{}",
                socket.display(),
                tail(log, 40)
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn config_toml(base: &Path, bin_dir: &Path, conf_dir: &Path, socket: &Path) -> String {
    // runc cannot lower a process's oom_score_adj without CAP_SYS_RESOURCE (some sandboxes drop it);
    // containerd's sandbox asks for -998 unless told to keep the score at or above its own.
    let restrict_oom = !has_cap_sys_resource();
    let p = |p: &Path| p.display().to_string();
    format!(
        r#"version = 2
root = "{root}"
state = "{state}"
# /opt/containerd and the snapshotters that do not work or are not needed here.
disabled_plugins = [
  "io.containerd.internal.v1.opt",
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp",
]

[grpc]
  address = "{socket}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{image}"
  restrict_oom_score_adj = {restrict_oom}
  disable_apparmor = true
  enable_selinux = false
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "native"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{runc_root}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{bin_dir}"
    conf_dir = "{conf_dir}"
    max_conf_num = 1
"#,
        root = p(&base.join("root")),
        state = p(&base.join("state")),
        socket = p(socket),
        image = image::IMAGE,
        runc_root = p(&base.join("runc")),
        bin_dir = p(bin_dir),
        conf_dir = p(conf_dir),
    )
}
