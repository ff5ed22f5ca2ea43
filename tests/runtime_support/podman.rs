//! podman (Debian's 4.3) with its CNI network backend, inside a test node: its own storage (vfs), run
//! root, tmp dir and events log under the node's temp dir; `--network-config-dir` holding one conflist
//! copied byte for byte and `cni_plugin_dirs` holding the `eniipam` binary under test plus the reference
//! `portmap` and `loopback`. Containers go under the node's cgroup parent.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use super::node::Node;
use super::{
    has_cap_sys_resource, image, output_of, reference_plugin, require_program, run_ok, target_bin,
};

pub struct Podman {
    pub dir: PathBuf,
    pub conf_dir: PathBuf,
    pub bin_dir: PathBuf,
    containers_conf: PathBuf,
    storage_conf: PathBuf,
    holder: u32,
}

impl Podman {
    /// Writes the configuration and loads the sandbox image.
    pub fn setup(node: &Node, conflist: &Path) -> Podman {
        let dir = node.dir.join("podman");
        let bin_dir = dir.join("cni-bin");
        let conf_dir = dir.join("cni-conf");
        for d in [&bin_dir, &conf_dir] {
            std::fs::create_dir_all(d).expect("podman dirs");
        }
        std::fs::copy(target_bin("eniipam"), bin_dir.join("eniipam")).expect("copying eniipam");
        for plugin in ["portmap", "loopback", "ptp"] {
            std::fs::copy(reference_plugin(plugin), bin_dir.join(plugin))
                .unwrap_or_else(|e| panic!("copying {plugin}: {e}"));
        }
        std::fs::copy(
            conflist,
            conf_dir.join(conflist.file_name().expect("conflist file name")),
        )
        .expect("copying the conflist");

        // Without CAP_SYS_RESOURCE runc cannot raise rlimits above the inherited hard limits, and
        // podman asks for the maximum nofile/nproc by default.
        let ulimits = if has_cap_sys_resource() {
            String::new()
        } else {
            "default_ulimits = [\"nofile=4096:4096\", \"nproc=4096:4096\"]\n".to_owned()
        };
        let p = |p: &Path| p.display().to_string();
        let containers_conf = dir.join("containers.conf");
        std::fs::write(
            &containers_conf,
            format!(
                r#"[containers]
{ulimits}
[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "{events}"
runtime = "runc"
tmp_dir = "{tmp}"

[network]
network_backend = "cni"
cni_plugin_dirs = ["{bin}"]
network_config_dir = "{conf}"
"#,
                events = p(&dir.join("events.log")),
                tmp = p(&dir.join("tmp")),
                bin = p(&bin_dir),
                conf = p(&conf_dir),
            ),
        )
        .expect("writing containers.conf");
        let storage_conf = dir.join("storage.conf");
        std::fs::write(
            &storage_conf,
            format!(
                "[storage]\ndriver = \"vfs\"\ngraphroot = \"{}\"\nrunroot = \"{}\"\n",
                p(&dir.join("storage")),
                p(&dir.join("storage-run")),
            ),
        )
        .expect("writing storage.conf");
        let podman = Podman {
            dir,
            conf_dir,
            bin_dir,
            containers_conf,
            storage_conf,
            holder: node.holder_pid(),
        };
        run_ok(
            podman
                .command(node)
                .arg("load")
                .arg("-i")
                .arg(image::pause_image()),
        );
        podman
    }

    /// `podman --network-backend cni --network-config-dir <conf> --root ... --runroot ...` in the node,
    /// with the plugin logging at debug level to podman's stderr.
    pub fn command(&self, node: &Node) -> Command {
        assert_eq!(
            node.holder_pid(),
            self.holder,
            "podman belongs to another node"
        );
        let mut cmd = node.command(require_program("podman"));
        cmd.env("CONTAINERS_CONF", &self.containers_conf)
            .env("CONTAINERS_STORAGE_CONF", &self.storage_conf)
            .env("ENIIPAM_CNI_LOG", "debug")
            .args(["--network-backend", "cni", "--network-config-dir"])
            .arg(&self.conf_dir)
            .arg("--root")
            .arg(self.dir.join("storage"))
            .arg("--runroot")
            .arg(self.dir.join("storage-run"))
            .args(["--cgroup-manager", "cgroupfs", "--events-backend", "file"]);
        cmd
    }

    /// Runs podman with `args` and returns its output (success or not).
    pub fn run(&self, node: &Node, args: &[&str]) -> Output {
        output_of(self.command(node).args(args))
    }
}
