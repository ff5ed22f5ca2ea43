//! The `CNI_*` environment of one invocation: the command, the attachment it names and the pod identity
//! in `CNI_ARGS`, validated with the spec's error codes.
//!
//! The environment is read through [`Environment`], so tests pass a map and never call `set_var`.

use std::collections::{BTreeMap, HashMap};

use eniipam_api::{AttachmentKey, PodRef};

use crate::spec::{CniError, ErrorCode};

/// Where the plugin reads `CNI_*` variables from.
pub trait Environment {
    /// The value of `name`, if set.
    fn var(&self, name: &str) -> Option<String>;
}

/// The process environment.
#[derive(Clone, Copy, Debug, Default)]
pub struct ProcessEnvironment;

impl Environment for ProcessEnvironment {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
    }
}

impl Environment for HashMap<String, String> {
    fn var(&self, name: &str) -> Option<String> {
        self.get(name).cloned()
    }
}

impl Environment for BTreeMap<String, String> {
    fn var(&self, name: &str) -> Option<String> {
        self.get(name).cloned()
    }
}

/// `CNI_COMMAND`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    /// Attach a container.
    Add,
    /// Detach a container (best effort, idempotent).
    Del,
    /// Verify an attachment.
    Check,
    /// Report supported versions.
    Version,
    /// Release everything not in `cni.dev/valid-attachments`.
    Gc,
    /// Report whether ADD can be served.
    Status,
}

impl Command {
    /// Reads `CNI_COMMAND`.
    pub fn from_env(env: &dyn Environment) -> Result<Self, CniError> {
        let raw = env.var("CNI_COMMAND").ok_or_else(|| {
            CniError::new(ErrorCode::InvalidEnvironment, "CNI_COMMAND is not set")
        })?;
        match raw.as_str() {
            "ADD" => Ok(Self::Add),
            "DEL" => Ok(Self::Del),
            "CHECK" => Ok(Self::Check),
            "VERSION" => Ok(Self::Version),
            "GC" => Ok(Self::Gc),
            "STATUS" => Ok(Self::Status),
            other => Err(CniError::new(
                ErrorCode::InvalidEnvironment,
                format!("unknown CNI_COMMAND {other:?}"),
            )),
        }
    }

    /// Whether the command names one attachment (needs `CNI_CONTAINERID`, `CNI_IFNAME`, `CNI_PATH`).
    pub fn is_per_attachment(self) -> bool {
        matches!(self, Self::Add | Self::Del | Self::Check)
    }
}

/// Pod identity and plugin options from `CNI_ARGS`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CniArgs {
    /// `K8S_POD_NAMESPACE` / `K8S_POD_NAME` / `K8S_POD_UID`, when the namespace and name are given.
    pub pod: Option<PodRef>,
    /// `ENIIPAM_STICKY=true|false`.
    pub sticky: Option<bool>,
}

impl CniArgs {
    /// Parses `KEY=VALUE;KEY=VALUE`. Unknown keys are ignored (as with `IgnoreUnknown=1`).
    pub fn parse(raw: &str) -> Result<Self, CniError> {
        let mut pairs = HashMap::new();
        for part in raw.split(';').filter(|p| !p.is_empty()) {
            let (k, v) = part.split_once('=').ok_or_else(|| {
                CniError::new(
                    ErrorCode::InvalidEnvironment,
                    format!("CNI_ARGS: {part:?} is not KEY=VALUE"),
                )
            })?;
            pairs.insert(k, v);
        }
        let pod = match (pairs.get("K8S_POD_NAMESPACE"), pairs.get("K8S_POD_NAME")) {
            (Some(ns), Some(name)) if !ns.is_empty() && !name.is_empty() => Some(PodRef {
                namespace: (*ns).to_owned(),
                name: (*name).to_owned(),
                uid: pairs
                    .get("K8S_POD_UID")
                    .map(|s| (*s).to_owned())
                    .unwrap_or_default(),
            }),
            _ => None,
        };
        let sticky = match pairs.get("ENIIPAM_STICKY") {
            None => None,
            Some(v) => Some(parse_bool(v).ok_or_else(|| {
                CniError::new(
                    ErrorCode::InvalidEnvironment,
                    format!("CNI_ARGS: ENIIPAM_STICKY={v:?} is not true/false"),
                )
            })?),
        };
        Ok(Self { pod, sticky })
    }
}

pub(crate) fn parse_bool(v: &str) -> Option<bool> {
    match v.to_ascii_lowercase().as_str() {
        "true" | "1" => Some(true),
        "false" | "0" => Some(false),
        _ => None,
    }
}

/// The `CNI_*` variables of one invocation, validated for its command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeEnv {
    /// `CNI_COMMAND`.
    pub command: Command,
    /// `CNI_CONTAINERID` (empty for VERSION/GC/STATUS).
    pub container_id: String,
    /// `CNI_NETNS` (required for ADD and CHECK, optional for DEL).
    pub netns: Option<String>,
    /// `CNI_IFNAME` (empty for VERSION/GC/STATUS).
    pub ifname: String,
    /// `CNI_ARGS`, parsed.
    pub args: CniArgs,
}

impl RuntimeEnv {
    /// Reads and validates what `command` needs from `env`.
    pub fn from_env(command: Command, env: &dyn Environment) -> Result<Self, CniError> {
        let get = |name: &str| env.var(name).filter(|v| !v.is_empty());
        let require = |name: &str| {
            get(name).ok_or_else(|| {
                CniError::new(ErrorCode::InvalidEnvironment, format!("{name} is not set"))
            })
        };
        let mut out = Self {
            command,
            container_id: String::new(),
            netns: None,
            ifname: String::new(),
            args: CniArgs::default(),
        };
        if !command.is_per_attachment() {
            return Ok(out);
        }
        out.container_id = require("CNI_CONTAINERID")?;
        validate_container_id(&out.container_id)?;
        out.ifname = require("CNI_IFNAME")?;
        validate_ifname(&out.ifname)?;
        require("CNI_PATH")?;
        out.netns = match command {
            Command::Del => get("CNI_NETNS"),
            _ => Some(require("CNI_NETNS")?),
        };
        out.args = CniArgs::parse(&get("CNI_ARGS").unwrap_or_default())?;
        Ok(out)
    }

    /// The attachment this invocation is about.
    pub fn attachment(&self) -> AttachmentKey {
        AttachmentKey::new(self.container_id.clone(), self.ifname.clone())
    }
}

pub(crate) fn is_name_like(s: &str) -> bool {
    let mut bytes = s.bytes();
    bytes.next().is_some_and(|b| b.is_ascii_alphanumeric())
        && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// `CNI_CONTAINERID` under the rule the daemon applies too ([`eniipam_api::validate_container_id`]).
pub fn validate_container_id(id: &str) -> Result<(), CniError> {
    eniipam_api::validate_container_id(id).map_err(|e| {
        CniError::new(
            ErrorCode::InvalidEnvironment,
            format!("CNI_CONTAINERID: {e}"),
        )
    })
}

/// `CNI_IFNAME` under the rule the daemon applies too ([`eniipam_api::validate_ifname`]).
pub fn validate_ifname(name: &str) -> Result<(), CniError> {
    eniipam_api::validate_ifname(name)
        .map_err(|e| CniError::new(ErrorCode::InvalidEnvironment, format!("CNI_IFNAME: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn environment_is_validated_per_command() {
        let full = [
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "abc123"),
            ("CNI_NETNS", "/run/netns/x"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", "/opt/cni/bin"),
            (
                "CNI_ARGS",
                "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_UID=u1",
            ),
        ];
        let e = env(&full);
        let cmd = Command::from_env(&e).unwrap();
        let rt = RuntimeEnv::from_env(cmd, &e).unwrap();
        assert_eq!(rt.args.pod.as_ref().unwrap().sticky_key(), "default/web-0");
        assert_eq!(rt.args.pod.as_ref().unwrap().uid, "u1");

        for missing in ["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"] {
            let e = env(&full
                .iter()
                .copied()
                .filter(|(k, _)| *k != missing)
                .collect::<Vec<_>>());
            let err = RuntimeEnv::from_env(Command::Add, &e).unwrap_err();
            assert_eq!(err.code, ErrorCode::InvalidEnvironment, "{missing}");
            assert!(err.msg.contains(missing));
        }
        // DEL does not need a netns.
        let e = env(&full
            .iter()
            .copied()
            .filter(|(k, _)| *k != "CNI_NETNS")
            .collect::<Vec<_>>());
        assert!(
            RuntimeEnv::from_env(Command::Del, &e)
                .unwrap()
                .netns
                .is_none()
        );
        // VERSION, GC and STATUS need nothing.
        assert!(RuntimeEnv::from_env(Command::Status, &env(&[])).is_ok());

        for (k, v) in [
            ("CNI_CONTAINERID", "-bad"),
            ("CNI_CONTAINERID", "a/b"),
            ("CNI_IFNAME", "0123456789abcdef"),
            ("CNI_IFNAME", "a b"),
            ("CNI_IFNAME", ".."),
            ("CNI_ARGS", "novalue"),
            ("CNI_ARGS", "ENIIPAM_STICKY=maybe"),
        ] {
            let mut e = env(&full);
            e.insert(k.into(), v.into());
            let err = RuntimeEnv::from_env(Command::Add, &e).unwrap_err();
            assert_eq!(err.code, ErrorCode::InvalidEnvironment, "{k}={v}");
        }
        assert_eq!(
            Command::from_env(&env(&[("CNI_COMMAND", "FOO")]))
                .unwrap_err()
                .code,
            ErrorCode::InvalidEnvironment
        );
        assert_eq!(
            Command::from_env(&env(&[])).unwrap_err().code,
            ErrorCode::InvalidEnvironment
        );
    }
}
