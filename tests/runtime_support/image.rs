//! The sandbox image, built locally (no registry is reachable): `pause.c` compiled with `gcc -static`,
//! as the only file (`/pause`) of a one-layer image, written as a docker-archive tarball that both
//! `ctr images import` and `podman load` read. Cached under `target/<profile>/runtime-test-image/`,
//! keyed by the source's digest.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use serde_json::json;
use sha2::{Digest, Sha256};

use super::{require_program, run_ok, target_profile_dir};

/// The image's name, as `sandbox_image` and in `podman run`.
pub const IMAGE: &str = "localhost/eniipam-test/pause:1";

const PAUSE_C: &str = include_str!("pause.c");

/// The docker-archive tarball of [`IMAGE`], built once per source version.
pub fn pause_image() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(build).clone()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn sha256(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

fn build() -> PathBuf {
    let dir = target_profile_dir()
        .join("runtime-test-image")
        .join(&sha256(PAUSE_C.as_bytes())[..16]);
    let archive = dir.join("pause.tar");
    if archive.is_file() {
        return archive;
    }
    std::fs::create_dir_all(&dir).expect("image cache dir");
    // Build in a private temp dir, then rename into place (another test process may race us).
    let work = tempfile::tempdir_in(&dir).expect("image work dir");
    let source = work.path().join("pause.c");
    std::fs::write(&source, PAUSE_C).expect("writing pause.c");
    let binary = work.path().join("pause");
    run_ok(
        Command::new(require_program("gcc"))
            .args(["-static", "-O2", "-o"])
            .arg(&binary)
            .arg(&source),
    );
    let tar = work.path().join("pause.tar");
    std::fs::write(
        &tar,
        docker_archive(&std::fs::read(&binary).expect("reading pause")),
    )
    .expect("writing the image archive");
    std::fs::rename(&tar, &archive).expect("moving the image archive into the cache");
    archive
}

fn tar_file(builder: &mut tar::Builder<Vec<u8>>, path: &str, mode: u32, data: &[u8]) {
    let mut header = tar::Header::new_gnu();
    header.set_size(data.len() as u64);
    header.set_mode(mode);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(0);
    header.set_entry_type(tar::EntryType::Regular);
    builder
        .append_data(&mut header, path, data)
        .expect("appending to an in-memory tar");
}

/// `manifest.json` + config + one uncompressed layer holding `/pause`.
fn docker_archive(pause: &[u8]) -> Vec<u8> {
    let mut layer = tar::Builder::new(Vec::new());
    tar_file(&mut layer, "pause", 0o755, pause);
    let layer = layer.into_inner().expect("layer tar");
    let layer_digest = sha256(&layer);
    let config = serde_json::to_vec(&json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": ["/pause"]},
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{layer_digest}")]},
        "history": [{"created_by": "eniipam tests: tests/runtime_support/pause.c, gcc -static"}],
    }))
    .expect("config json");
    let config_name = format!("{}.json", sha256(&config));
    let layer_name = format!("{layer_digest}/layer.tar");
    let manifest = serde_json::to_vec(&json!([{
        "Config": config_name,
        "RepoTags": [IMAGE],
        "Layers": [layer_name],
    }]))
    .expect("manifest json");
    let mut archive = tar::Builder::new(Vec::new());
    tar_file(&mut archive, "manifest.json", 0o644, &manifest);
    tar_file(&mut archive, &config_name, 0o644, &config);
    tar_file(&mut archive, &layer_name, 0o644, &layer);
    archive.into_inner().expect("archive tar")
}
