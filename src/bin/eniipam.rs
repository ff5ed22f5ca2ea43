//! `eniipam`: the CNI plugin, executed by the container runtime once per ADD, DEL, CHECK, GC, STATUS
//! or VERSION. Reads the network configuration from stdin (at most 1 MiB), prints the result or the
//! spec's error object on stdout, and logs to stderr (`ENIIPAM_CNI_LOG`, default `warn`).

use std::io::Read;
use std::process::ExitCode;

use eniipam::cni::config::MAX_STDIN_BYTES;
use eniipam::cni::{CniError, CniVersion, ErrorCode, Outcome, ProcessEnvironment};

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("ENIIPAM_CNI_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
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
    runtime.block_on(eniipam::cni::run(&ProcessEnvironment, &stdin))
}
