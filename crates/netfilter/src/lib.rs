//! A typed wrapper over the system's `nft` binary (package `nftables`): the few nftables objects the
//! daemon owns (one table of base chains holding simple rules), rendered to `nft` syntax, loaded in one
//! atomic transaction (`nft -f -`), listed back and deleted. No hand-built netlink for netfilter: the
//! `nft` binary is the kernel's supported front end, and `nft -f` applies a whole script or nothing.
//!
//! Names and strings that reach a script are validated (interface names, wildcard prefixes, comments),
//! so no caller-supplied text can change a script's meaning.
//!
//! [`Nft`] runs the binary (load, list, delete); `script` holds the typed objects (tables, base
//! chains, rules, matches, actions) and their rendering to `nft` syntax; [`nfnetlink`] the framing
//! of netfilter's netlink messages.
//!
//! Its own crate because two rooms share it: the daemon's host rules (`eniipam`'s `host`, which
//! re-exports it as `host::netfilter`) and the NetworkPolicy enforcer (`eniipam-netpol`), which
//! must not depend on the daemon.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::io::AsyncWriteExt;
use tokio::process::Command;

pub mod nfnetlink;
mod script;
#[cfg(test)]
mod tests;

use script::check_name;
pub use script::{
    Action, Chain, ChainType, Family, Hook, Match, Priority, Rule, SnatPorts, Table, check_ifname,
};

#[derive(Debug, thiserror::Error)]
pub enum NftError {
    /// The binary could not be started.
    #[error("cannot run `{program}` (install the `nftables` package): {source}")]
    Missing {
        /// The program as configured.
        program: String,
        /// Why it could not be started.
        #[source]
        source: std::io::Error,
    },
    /// `nft` ran and failed.
    #[error("`{command}` failed ({status}): {stderr}")]
    Failed {
        /// The command line (with `-f -`: the script follows after `<<<`).
        command: String,
        /// Its exit status.
        status: String,
        /// What it printed on stderr.
        stderr: String,
    },
    /// Talking to the child process failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// A name or a string cannot be put in a script.
    #[error("{0}")]
    Invalid(String),
}

impl NftError {
    /// Whether `nft` said the object does not exist (`No such file or directory`).
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::Failed { stderr, .. } if stderr.contains("No such file or directory"))
    }
}

/// The system's `nft`, run as a child process in the daemon's own network namespace.
#[derive(Clone, Debug)]
pub struct Nft {
    program: PathBuf,
}

impl Default for Nft {
    fn default() -> Self {
        Self::new("nft")
    }
}

impl Nft {
    /// `nft` at `program` (a bare name is looked up in `PATH`).
    pub fn new(program: impl AsRef<Path>) -> Self {
        Self {
            program: program.as_ref().to_path_buf(),
        }
    }

    /// `nft <args>`, with `stdin` fed when given; returns stdout.
    pub async fn run(&self, args: &[&str], stdin: Option<&str>) -> Result<String, NftError> {
        let program = self.program.display().to_string();
        let mut child = Command::new(&self.program)
            .args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| NftError::Missing {
                program: program.clone(),
                source,
            })?;
        if let Some(input) = stdin {
            let mut pipe = child.stdin.take().expect("stdin is piped");
            pipe.write_all(input.as_bytes())
                .await
                .map_err(|source| NftError::Io {
                    what: format!("writing a script to `{program}`"),
                    source,
                })?;
            drop(pipe);
        }
        let out = child
            .wait_with_output()
            .await
            .map_err(|source| NftError::Io {
                what: format!("waiting for `{program}`"),
                source,
            })?;
        if !out.status.success() {
            let mut command = format!("{program} {}", args.join(" "));
            if let Some(input) = stdin {
                command.push_str(" <<< ");
                command.push_str(&input.replace('\n', "; "));
            }
            return Err(NftError::Failed {
                command,
                status: out.status.to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The version line (`nftables v1.0.6 (Lester Gooch #5)`).
    pub async fn version(&self) -> Result<String, NftError> {
        Ok(self.run(&["--version"], None).await?.trim().to_owned())
    }

    /// Loads `script` with `nft -f -`: every command in it applies, or none does.
    pub async fn apply(&self, script: &str) -> Result<(), NftError> {
        self.run(&["-f", "-"], Some(script)).await.map(drop)
    }

    /// Makes the kernel's table `table.name` exactly `table`, in one transaction (created if missing,
    /// replaced if present): no packet ever sees a half-built table, and connections keep their NAT
    /// bindings and marks (those live in conntrack, not in the rules).
    pub async fn replace_table(&self, table: &Table) -> Result<(), NftError> {
        self.apply(&table.replace_script()?).await
    }

    /// `nft list table <family> <name>`; `None` when there is no such table.
    pub async fn list_table(&self, family: Family, name: &str) -> Result<Option<String>, NftError> {
        check_name("table", name)?;
        match self
            .run(&["list", "table", family.keyword(), name], None)
            .await
        {
            Ok(listing) => Ok(Some(listing)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Deletes the table; `false` when it was not there.
    pub async fn delete_table(&self, family: Family, name: &str) -> Result<bool, NftError> {
        check_name("table", name)?;
        match self
            .run(&["delete", "table", family.keyword(), name], None)
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if e.is_not_found() => Ok(false),
            Err(e) => Err(e),
        }
    }
}
