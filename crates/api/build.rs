//! Generates the gRPC code from the workspace's `proto/` with a vendored `protoc`, so a fresh machine
//! needs nothing installed beyond Rust.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut config = prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    tonic_prost_build::configure().compile_with_config(
        config,
        &[
            "../../proto/eniipam/v1/ipam.proto",
            "../../proto/eniipam/v1/introspect.proto",
        ],
        &["../../proto"],
    )?;
    println!("cargo:rerun-if-changed=../../proto");
    Ok(())
}
