//! Generates the CRI v1 client from `proto/api.proto` with a vendored `protoc` (nothing to install).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut config = prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    tonic_prost_build::configure()
        .build_server(false)
        .compile_with_config(config, &["proto/api.proto"], &["proto"])?;
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
