//! The crates' manifests: no shipped crate (`.`, `crates/*`) depends on anything under `mocks/`
//! (except as a dev-dependency, or optionally for the `simulate` feature alone); no crate under
//! `crates/` depends on the daemon; each room that is a crate depends only on the workspace crates
//! [`ROOMS`] lists for it (`crates/cloud`: `eniipam-api` and `eniipam-limits`; `crates/netpol`,
//! NetworkPolicy whole: `eniipam-api`, `eniipam-netfilter` and `eniipam-kubeview`; `crates/host`, the
//! node datapath whole: `eniipam-api`, `eniipam-netlink` and `eniipam-netfilter`; `crates/ipv6`, IPv6
//! pods' half outside the pool: `eniipam-api` and `eniipam-cloud`; `crates/profiles`, network
//! profiles with their controller: `eniipam-api`, `eniipam-cloud` and `eniipam-kubeview`;
//! `crates/custom_networking`, the node's ENIConfig and its controller: `eniipam-cloud` and
//! `eniipam-kubeview`), so a feature's
//! room never reaches into another's. With its bad examples.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::root;

/// The rooms that are crates, each with the only workspace crates it may depend on.
const ROOMS: &[(&str, &[&str])] = &[
    ("crates/cloud", &["crates/api", "crates/limits"]),
    (
        "crates/netpol",
        &["crates/api", "crates/netfilter", "crates/kubeview"],
    ),
    (
        "crates/host",
        &["crates/api", "crates/netlink", "crates/netfilter"],
    ),
    ("crates/ipv6", &["crates/api", "crates/cloud"]),
    (
        "crates/profiles",
        &["crates/api", "crates/cloud", "crates/kubeview"],
    ),
    (
        "crates/custom_networking",
        &["crates/cloud", "crates/kubeview"],
    ),
];

/// A dependency table's entries that are workspace crates: name → (package path, optional).
fn path_deps(
    table: Option<&toml::Value>,
    dir: &Path,
    workspace: &toml::Table,
    root: &Path,
) -> Vec<(String, PathBuf, bool)> {
    let Some(table) = table.and_then(toml::Value::as_table) else {
        return Vec::new();
    };
    let ws_deps = workspace
        .get("workspace")
        .and_then(|w| w.get("dependencies"))
        .and_then(toml::Value::as_table);
    let mut deps = Vec::new();
    for (name, spec) in table {
        let optional = spec
            .get("optional")
            .and_then(toml::Value::as_bool)
            .unwrap_or(false);
        let path = if spec.get("workspace").and_then(toml::Value::as_bool) == Some(true) {
            ws_deps
                .and_then(|w| w.get(name))
                .and_then(|d| d.get("path"))
                .and_then(toml::Value::as_str)
                .map(|p| root.join(p))
        } else {
            spec.get("path")
                .and_then(toml::Value::as_str)
                .map(|p| dir.join(p))
        };
        if let Some(p) = path {
            deps.push((name.clone(), normalize(&p), optional));
        }
    }
    deps
}

/// `a/b/../c` → `a/c` (without touching the file system).
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

/// The features of `manifest` that enable `dep` (`"dep:x"`, `"x"`, `"x/feature"`, `"x?/feature"`).
fn features_enabling(manifest: &toml::Table, dep: &str) -> Vec<String> {
    let Some(features) = manifest.get("features").and_then(toml::Value::as_table) else {
        return Vec::new();
    };
    features
        .iter()
        .filter(|(_, list)| {
            list.as_array().into_iter().flatten().any(|f| {
                let f = f.as_str().unwrap_or_default();
                let f = f.strip_prefix("dep:").unwrap_or(f);
                let f = f.split('/').next().unwrap_or_default();
                f.trim_end_matches('?') == dep
            })
        })
        .map(|(name, _)| name.clone())
        .collect()
}

/// The problems of one crate's manifest (`dir`, relative to the workspace `root`).
fn crate_problems(
    manifest: &toml::Table,
    dir: &Path,
    workspace: &toml::Table,
    root: &Path,
) -> Vec<String> {
    let rel = dir.strip_prefix(root).unwrap_or(dir);
    let name = if rel.as_os_str().is_empty() {
        ".".to_owned()
    } else {
        rel.display().to_string()
    };
    let shipped = name == "." || rel.starts_with("crates");
    let mut problems = Vec::new();
    let mut tables: Vec<Option<&toml::Value>> = vec![
        manifest.get("dependencies"),
        manifest.get("build-dependencies"),
    ];
    // `[target.'cfg(..)'.dependencies]` count as normal dependencies.
    if let Some(targets) = manifest.get("target").and_then(toml::Value::as_table) {
        for t in targets.values() {
            tables.push(t.get("dependencies"));
            tables.push(t.get("build-dependencies"));
        }
    }
    let mocks = normalize(&root.join("mocks"));
    for table in tables {
        for (dep, path, optional) in path_deps(table, dir, workspace, root) {
            let dep_rel = path
                .strip_prefix(root)
                .unwrap_or(&path)
                .display()
                .to_string();
            if shipped && path.starts_with(&mocks) {
                let features = features_enabling(manifest, &dep);
                if !(optional && features.iter().all(|f| f == "simulate")) {
                    problems.push(format!(
                        "{name}: depends on `{dep}` ({dep_rel}), test support under mocks/, outside \
                         dev-dependencies and the optional `simulate` feature (enabled by: {features:?})"
                    ));
                }
            }
            if rel.starts_with("crates") && path == normalize(root) {
                problems.push(format!("{name}: depends on the daemon (`{dep}`)"));
            }
            if let Some((_, allowed)) = ROOMS.iter().find(|(room, _)| rel == Path::new(room))
                && !allowed.iter().any(|ok| path == normalize(&root.join(ok)))
            {
                problems.push(format!(
                    "{name}: depends on `{dep}` ({dep_rel}); this room may depend on no workspace \
                     crate but {}",
                    allowed.join(", ")
                ));
            }
        }
    }
    problems
}

fn read_toml(path: &Path) -> toml::Table {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.parse()
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn shipped_crates_do_not_depend_on_test_support() {
    let root = normalize(&root());
    let workspace = read_toml(&root.join("Cargo.toml"));
    let members: Vec<String> = workspace["workspace"]["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap().to_owned())
        .collect();
    // Every shipped crate is checked, whether or not the workspace lists it yet (crates/cloud).
    let mut dirs: BTreeSet<PathBuf> = members.iter().map(|m| normalize(&root.join(m))).collect();
    for entry in std::fs::read_dir(root.join("crates")).unwrap() {
        let dir = entry.unwrap().path();
        if dir.join("Cargo.toml").exists() {
            dirs.insert(normalize(&dir));
        }
    }
    let mut problems = Vec::new();
    for dir in &dirs {
        let manifest = read_toml(&dir.join("Cargo.toml"));
        problems.extend(crate_problems(&manifest, dir, &workspace, &root));
    }
    assert!(dirs.len() >= 6, "crates read: {dirs:?}");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn a_shipped_crate_on_test_support_is_refused() {
    let root = Path::new("/ws");
    let workspace: toml::Table = "[workspace]\nmembers = []\n[workspace.dependencies]\nvpclab = { path = \"mocks/vpclab\" }\n"
        .parse()
        .unwrap();
    let check = |dir: &str, manifest: &str| {
        let manifest: toml::Table = manifest.parse().unwrap();
        crate_problems(&manifest, &root.join(dir), &workspace, root).join("\n")
    };
    // The daemon's way: an optional dependency for `simulate` alone, and dev-dependencies.
    assert_eq!(
        check(
            ".",
            "[features]\ndefault = [\"simulate\"]\nsimulate = [\"dep:mockcloud\"]\n\
             [dependencies]\nmockcloud = { path = \"mocks/mockcloud\", optional = true }\n\
             [dev-dependencies]\nvpclab = { path = \"mocks/vpclab\" }\n"
        ),
        ""
    );
    // A plain dependency, one enabled by another feature, one through the workspace table.
    let p = check(
        "crates/cni",
        "[features]\nextra = [\"mockcloud/x\"]\n[dependencies]\n\
         mockcloud = { path = \"../../mocks/mockcloud\", optional = true }\n\
         vpclab.workspace = true\neniipam = { path = \"../..\" }\n",
    );
    assert!(
        p.contains("crates/cni: depends on `mockcloud` (mocks/mockcloud)"),
        "{p}"
    );
    assert!(
        p.contains("crates/cni: depends on `vpclab` (mocks/vpclab)"),
        "{p}"
    );
    assert!(
        p.contains("crates/cni: depends on the daemon (`eniipam`)"),
        "{p}"
    );
    // Test support itself may depend on test support.
    assert_eq!(
        check(
            "mocks/vpclab",
            "[dependencies]\nmockcloud = { path = \"../mockcloud\" }\n"
        ),
        ""
    );
    // The cloud crate: the model and the limits only.
    let p = check(
        "crates/cloud",
        "[dependencies]\neniipam-api = { path = \"../api\" }\neniipam-limits = { path = \"../limits\" }\n\
         eniipam-netlink = { path = \"../netlink\" }\n",
    );
    assert!(
        p.contains("crates/cloud: depends on `eniipam-netlink` (crates/netlink)"),
        "{p}"
    );
    assert_eq!(p.lines().count(), 1, "{p}");
    // The NetworkPolicy crate: the model, the netfilter primitives and the list + watch view only.
    let p = check(
        "crates/netpol",
        "[dependencies]\neniipam-api = { path = \"../api\" }\n\
         eniipam-netfilter = { path = \"../netfilter\" }\n\
         eniipam-kubeview = { path = \"../kubeview\" }\neniipam-cloud = { path = \"../cloud\" }\n",
    );
    assert!(
        p.contains("crates/netpol: depends on `eniipam-cloud` (crates/cloud)"),
        "{p}"
    );
    assert_eq!(p.lines().count(), 1, "{p}");
}
