//! Generates the gRPC code from the workspace's `proto/` with a vendored `protoc`, so a fresh machine needs nothing
//! installed beyond Rust.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: the build script is single-threaded here; nothing else reads the environment concurrently.
    #[allow(unsafe_code)]
    unsafe {
        std::env::set_var("PROTOC", protoc)
    };
    tonic_prost_build::configure().compile_protos(
        &[
            "../../proto/eniipam/v1/ipam.proto",
            "../../proto/eniipam/v1/introspect.proto",
        ],
        &["../../proto"],
    )?;
    println!("cargo:rerun-if-changed=../../proto");
    Ok(())
}
