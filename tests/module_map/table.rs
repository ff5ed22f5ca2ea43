//! The docs' per-module table of the daemon (`docs/how-it-works.md`, the table under
//! "**`eniipam`** (root package"), checked against `src/` (issue 45, item 5: the map stays true,
//! features included): every module `src/lib.rs` declares has a row of its own, and every module a
//! row names exists: its first segment declared in `src/lib.rs`, and, in a module of `src/`, each
//! further segment a file (`x.rs`) or folder (`x/mod.rs`) under the one before. With its bad examples.

use std::collections::BTreeSet;
use std::path::Path;

const TABLE: &str = "**`eniipam`** (root package";

/// The module names in the first cell of each row of the table (`bin/…` rows left out).
fn rows(docs: &str) -> Result<Vec<Vec<String>>, String> {
    let start = docs
        .find(TABLE)
        .ok_or_else(|| format!("no `{TABLE}` table"))?;
    let mut rows = Vec::new();
    for line in docs[start..].lines().skip(1) {
        if line.starts_with("**`") {
            break;
        }
        let Some(first) = line.strip_prefix('|').and_then(|l| l.split('|').next()) else {
            continue;
        };
        let names: Vec<String> = first
            .split('`')
            .skip(1)
            .step_by(2)
            .filter(|n| !n.starts_with("bin/"))
            .map(str::to_owned)
            .collect();
        if !names.is_empty() {
            rows.push(names);
        }
    }
    Ok(rows)
}

/// Whether `path` (`pool::state`) is a module file or folder under `src`.
fn exists_under(src: &Path, path: &[&str]) -> bool {
    let rel = path.join("/");
    src.join(format!("{rel}.rs")).is_file() || src.join(&rel).join("mod.rs").is_file()
}

/// What is wrong with the table: a declared module without a row of its own, a row naming a
/// module that does not exist (`exists` answers for the modules of `src/`, `in_src` says which
/// top-level modules are there rather than re-exported crates).
pub fn table_problems(
    docs: &str,
    declared: &BTreeSet<String>,
    in_src: impl Fn(&str) -> bool,
    exists: impl Fn(&[&str]) -> bool,
) -> Vec<String> {
    let rows = match rows(docs) {
        Ok(r) => r,
        Err(e) => return vec![format!("docs/how-it-works.md: {e}")],
    };
    let mut problems = Vec::new();
    let alone: BTreeSet<&str> = rows
        .iter()
        .flatten()
        .filter(|n| !n.contains("::"))
        .map(String::as_str)
        .collect();
    for m in declared.iter().filter(|m| !alone.contains(m.as_str())) {
        problems.push(format!(
            "docs/how-it-works.md: module `{m}` has no row in the per-module table"
        ));
    }
    for name in rows.iter().flatten() {
        let path: Vec<&str> = name.split("::").collect();
        let ok = declared.contains(path[0]) && (!in_src(path[0]) || exists(&path));
        if !ok {
            problems.push(format!(
                "docs/how-it-works.md: the per-module table names `{name}`, which is no module of src/"
            ));
        }
    }
    problems
}

#[test]
fn the_per_module_table_is_true() {
    let root = super::root();
    let src = root.join("src");
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    let docs = std::fs::read_to_string(root.join("docs/how-it-works.md")).unwrap();
    let declared = super::declared_modules(&lib);
    let problems = table_problems(
        &docs,
        &declared,
        |m| exists_under(&src, &[m]),
        |p| exists_under(&src, p),
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn a_table_that_misses_a_module_or_names_a_gone_one_is_refused() {
    let docs = "# Docs\n\n**`eniipam`** (root package)\n\n| module | what |\n| --- | --- |\n\
                | `bin/x.rs` | the main |\n| `pool` | the pool |\n| `pool::state`, `pool::gone` | parts |\n\
                | `cloud::ec2` | a crate's module |\n| `vanished` | not declared |\n\n\
                **`eniipam-cni`** (next)\n\n| `ipv6` | another crate's table |\n";
    let declared: BTreeSet<String> = ["pool", "ipv6", "cloud"].map(String::from).into();
    let problems = table_problems(
        docs,
        &declared,
        |m| m != "cloud",
        |p| matches!(p, ["pool"] | ["pool", "state"]),
    )
    .join("\n");
    assert!(
        problems.contains("module `ipv6` has no row in the per-module table"),
        "{problems}"
    );
    assert!(
        problems.contains("module `cloud` has no row"),
        "only a row of its own counts: {problems}"
    );
    assert!(problems.contains("names `pool::gone`"), "{problems}");
    assert!(problems.contains("names `vanished`"), "{problems}");
    assert_eq!(problems.lines().count(), 4, "{problems}");
}
