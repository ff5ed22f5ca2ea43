//! The fake container runtime: runs the real `eniipam` plugin binary in its IPAM role (under a
//! `calico` parent, as libcni hands a delegated IPAM plugin its parent's configuration) for ADD, DEL
//! and GC, the way libcni does: `CNI_*` environment, the network configuration on stdin, the result
//! or the spec's error object on stdout.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::AsyncWriteExt as _;
use tokio::process::Command;

/// Deadline of one daemon call inside the plugin (`timeout_ms`): a hung EC2 call behind an ADD makes
/// the plugin give up and cancel its RPC, which the daemon must survive.
pub const PLUGIN_TIMEOUT_MS: u64 = 4000;

/// How long the runtime waits for one plugin process before killing it.
const EXEC_DEADLINE: Duration = Duration::from_secs(30);

/// The plugin binary and what every invocation shares.
#[derive(Clone, Debug)]
pub struct Runtime {
    pub plugin: PathBuf,
    pub socket: PathBuf,
    pub cache_dir: PathBuf,
    pub cni_path: PathBuf,
    /// What an ADD must answer: an IPv4, an IPv6 or both.
    pub family: super::IpFamily,
}

/// The addresses an ADD gave an attachment: its IPv4 (ipv4, dual) and its IPv6 (ipv6, dual).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Addrs {
    pub v4: Option<Ipv4Addr>,
    pub v6: Option<Ipv6Addr>,
}

/// What one invocation printed and how it exited.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exec {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

impl Exec {
    /// The error object's code and message, for a failed invocation.
    pub fn error_text(&self) -> String {
        match serde_json::from_str::<Value>(&self.stdout) {
            Ok(v) => format!(
                "code {} {}",
                v.get("code").cloned().unwrap_or(Value::Null),
                v.get("msg").and_then(Value::as_str).unwrap_or_default()
            ),
            Err(_) => format!(
                "no error object (stdout {:?}, stderr {:?})",
                self.stdout.trim(),
                self.stderr.trim()
            ),
        }
    }
}

/// The pod identity an ADD or DEL carries.
#[derive(Clone, Debug)]
pub struct PodArgs {
    pub container_id: String,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub netns: PathBuf,
}

impl Runtime {
    /// The network configuration libcni hands the delegated IPAM plugin (its parent's), with the
    /// runtime-injected `name` and `cniVersion`.
    pub fn netconf(&self, network: &str) -> Value {
        json!({
            "cniVersion": "1.1.0",
            "name": network,
            "type": "calico",
            "ipam": {
                "type": "eniipam",
                "socket": self.socket,
                "cache_dir": self.cache_dir,
                "timeout_ms": PLUGIN_TIMEOUT_MS,
            },
        })
    }

    async fn exec(&self, env: &[(&str, String)], stdin: Value) -> Exec {
        let mut cmd = Command::new(&self.plugin);
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("ENIIPAM_CNI_LOG", "warn")
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                return Exec {
                    ok: false,
                    stdout: String::new(),
                    stderr: format!("cannot run {}: {e}", self.plugin.display()),
                };
            }
        };
        if let Some(mut input) = child.stdin.take() {
            let _ = input.write_all(stdin.to_string().as_bytes()).await;
        }
        match tokio::time::timeout(EXEC_DEADLINE, child.wait_with_output()).await {
            Ok(Ok(out)) => Exec {
                ok: out.status.success(),
                stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            },
            Ok(Err(e)) => Exec {
                ok: false,
                stdout: String::new(),
                stderr: format!("waiting for the plugin: {e}"),
            },
            Err(_) => Exec {
                ok: false,
                stdout: String::new(),
                stderr: format!("the plugin ran longer than {EXEC_DEADLINE:?} and was killed"),
            },
        }
    }

    fn attachment_env(
        &self,
        command: &str,
        ifname: &str,
        pod: &PodArgs,
    ) -> Vec<(&'static str, String)> {
        vec![
            ("CNI_COMMAND", command.to_owned()),
            ("CNI_CONTAINERID", pod.container_id.clone()),
            ("CNI_NETNS", pod.netns.display().to_string()),
            ("CNI_IFNAME", ifname.to_owned()),
            ("CNI_PATH", self.cni_path.display().to_string()),
            (
                "CNI_ARGS",
                format!(
                    "IgnoreUnknown=1;K8S_POD_NAMESPACE={};K8S_POD_NAME={};K8S_POD_UID={}",
                    pod.namespace, pod.name, pod.uid
                ),
            ),
        ]
    }

    /// ADD: the addresses on success (exactly the families of the run: a result missing one, or
    /// carrying one the run does not give, is a failure), the invocation on failure.
    pub async fn add(&self, network: &str, ifname: &str, pod: &PodArgs) -> Result<Addrs, Exec> {
        let out = self
            .exec(
                &self.attachment_env("ADD", ifname, pod),
                self.netconf(network),
            )
            .await;
        if !out.ok {
            return Err(out);
        }
        let got = parse_addrs(&out.stdout);
        let want = (self.family.has_ipv4(), self.family.has_ipv6());
        if (got.v4.is_some(), got.v6.is_some()) == want {
            return Ok(got);
        }
        Err(Exec {
            ok: false,
            stderr: format!(
                "ADD succeeded with {got:?}, not the addresses of ip_family {}: {}",
                self.family, out.stderr
            ),
            ..out
        })
    }

    /// DEL.
    pub async fn del(&self, network: &str, ifname: &str, pod: &PodArgs) -> Result<(), Exec> {
        let out = self
            .exec(
                &self.attachment_env("DEL", ifname, pod),
                self.netconf(network),
            )
            .await;
        if out.ok { Ok(()) } else { Err(out) }
    }

    /// GC of one network with its valid attachments (container id, ifname).
    pub async fn gc(&self, network: &str, valid: &[(String, String)]) -> Result<(), Exec> {
        let mut conf = self.netconf(network);
        conf["cni.dev/valid-attachments"] = Value::Array(
            valid
                .iter()
                .map(|(c, i)| json!({"containerID": c, "ifname": i}))
                .collect(),
        );
        let env = vec![
            ("CNI_COMMAND", "GC".to_owned()),
            ("CNI_PATH", self.cni_path.display().to_string()),
        ];
        let out = self.exec(&env, conf).await;
        if out.ok { Ok(()) } else { Err(out) }
    }
}

/// The first IPv4 and the first IPv6 address of a CNI result (or of a cached one).
pub fn result_addrs(v: &Value) -> Addrs {
    let mut out = Addrs::default();
    let ips = v.get("ips").and_then(Value::as_array);
    for ip in ips.into_iter().flatten() {
        let Some(addr) = ip.get("address").and_then(Value::as_str) else {
            continue;
        };
        let addr = addr.split('/').next().unwrap_or_default();
        if let Ok(a) = addr.parse::<Ipv4Addr>() {
            out.v4.get_or_insert(a);
        } else if let Ok(a) = addr.parse::<Ipv6Addr>() {
            out.v6.get_or_insert(a);
        }
    }
    out
}

fn parse_addrs(stdout: &str) -> Addrs {
    serde_json::from_str::<Value>(stdout)
        .map(|v| result_addrs(&v))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn result_ip() {
        let out =
            r#"{"cniVersion":"1.1.0","ips":[{"address":"10.0.3.7/32","gateway":"169.254.1.1"}]}"#;
        assert_eq!(parse_addrs(out).v4, Some(Ipv4Addr::new(10, 0, 3, 7)));
        assert_eq!(parse_addrs(out).v6, None);
        assert_eq!(parse_addrs(r#"{"code":11,"msg":"x"}"#), Addrs::default());
        let dual = r#"{"ips":[{"address":"10.0.3.7/32"},{"address":"2600:1f18::a:0:0:5/128"}]}"#;
        assert_eq!(
            parse_addrs(dual),
            Addrs {
                v4: Some(Ipv4Addr::new(10, 0, 3, 7)),
                v6: Some("2600:1f18::a:0:0:5".parse().unwrap()),
            }
        );
    }
}
