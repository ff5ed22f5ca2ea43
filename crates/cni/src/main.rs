//! `eniipam`: the CNI plugin, executed by the container runtime once per ADD, DEL, CHECK, GC, STATUS
//! or VERSION. Reads the network configuration from stdin (at most 1 MiB), prints the result or the
//! spec's error object on stdout, and logs to stderr (`ENIIPAM_CNI_LOG`, default `warn`).
//!
//! Start-up is paid on every invocation, so this main does as little as it can before the command is
//! known: VERSION and refused input are answered without a tokio runtime; the runtime is
//! single-threaded. The shipped binary is linked statically and not position-independent (no dynamic
//! loader, no relocations at start-up): see `crates/cni/build-plugin.sh` and docs/performance.md,
//! "Plugin start-up".

use std::io::{IsTerminal, Read};
use std::process::ExitCode;

use eniipam_cni::netconf::MAX_STDIN_BYTES;
use eniipam_cni::{CniError, CniVersion, ErrorCode, Outcome, Prepared, ProcessEnvironment};
use tracing_subscriber::filter::LevelFilter;

fn main() -> ExitCode {
    // A plain level (`error`, `warn`, `info`, `debug`, `trace`, `off`), not an `EnvFilter`: parsing
    // directives costs start-up time on every invocation. Colour only on a terminal: the runtime puts
    // this stderr into its own log.
    let level = std::env::var("ENIIPAM_CNI_LOG")
        .ok()
        .and_then(|v| v.parse::<LevelFilter>().ok())
        .unwrap_or(LevelFilter::WARN);
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(level)
        .with_ansi(std::io::stderr().is_terminal())
        .without_time()
        .with_target(false)
        .init();
    let outcome = invoke();
    print!("{}", outcome.stdout);
    ExitCode::from(outcome.exit_code)
}

fn invoke() -> Outcome {
    // Read one byte past the cap so an oversized input is seen (and refused with code 6).
    let mut stdin = Vec::new();
    if let Err(e) = std::io::stdin()
        .take(MAX_STDIN_BYTES as u64 + 1)
        .read_to_end(&mut stdin)
    {
        let err = CniError::new(ErrorCode::IoFailure, format!("reading stdin: {e}"));
        return Outcome::error(&err, CniVersion::CURRENT);
    }
    let job = match eniipam_cni::prepare(&ProcessEnvironment, &stdin) {
        Prepared::Answered(outcome) => return outcome,
        Prepared::Job(job) => job,
    };
    // One thread: every command is a short sequence of requests; the one step that blocks in the
    // kernel for long (a DEL's veth deletion) runs on a thread of its own (see `command::del`).
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let err = CniError::new(ErrorCode::IoFailure, format!("starting the runtime: {e}"));
            return Outcome::error(&err, CniVersion::CURRENT);
        }
    };
    runtime.block_on(job.run())
}
