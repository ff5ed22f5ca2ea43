//! The module map is true (issue 24): the layers listed in `src/lib.rs`'s `//!` map (between the
//! `<!-- module-map -->` markers, the same block as in `docs/how-it-works.md`) are checked against
//! every `crate::…` path in `src/**` (and every `super::…` path that climbs to the crate root):
//!
//! - a module imports only from layers below its own (not its own layer, not above), so there is
//!   no upward arrow and no cycle (cycles are also looked for on their own);
//! - every module `src/lib.rs` declares (`mod x;`, or `pub use … as x;` like `model`) is in the
//!   map, and every module in the map exists;
//! - the block in `docs/how-it-works.md` is the same as in `src/lib.rs`;
//! - the docs' per-module table has a row for every module, features included, and names none that
//!   is gone (`module_map/table.rs`).
//!
//! And the crates: no shipped crate (`.`, `crates/*`) depends on anything under `mocks/` (except as a
//! dev-dependency, or optionally for the `simulate` feature alone); no crate under `crates/` depends
//! on the daemon; each room that is a crate (`crates/cloud`, `crates/netpol`, `crates/host`,
//! `crates/ipv6`, `crates/profiles`, `crates/custom_networking`) depends only on the workspace crates
//! listed for it.
//!
//! And no import circle between files, in `src/` and every other crate of the workspace (issue 45):
//! the rule is in `module_map/file_cycles.rs`, which holds that checker and its tests. The crates'
//! checks are in `module_map/crates.rs`; `module_map/lexer.rs` reads source as code for both.
//!
//! The checker's own tests feed it bad examples, so it is known to fail when it should.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

#[path = "module_map/crates.rs"]
mod crates;
#[path = "module_map/file_cycles.rs"]
mod file_cycles;
#[path = "module_map/lexer.rs"]
mod lexer;
#[path = "module_map/table.rs"]
mod table;

use lexer::{code_only, ident_at, is_ident};

const BEGIN: &str = "<!-- module-map";
const END: &str = "<!-- /module-map -->";

/// The layers of the map, top first: each a set of module names.
#[derive(Debug, Default)]
struct Map {
    layer_of: BTreeMap<String, usize>,
}

/// The marked block of `text` (lines of `src/lib.rs` are read without their `//!`).
fn map_block(text: &str, doc_comments: bool) -> Result<String, String> {
    let lines: Vec<String> = text
        .lines()
        .filter_map(|l| {
            if !doc_comments {
                return Some(l.trim_end().to_owned());
            }
            let rest = l.trim_start().strip_prefix("//!")?;
            Some(rest.strip_prefix(' ').unwrap_or(rest).trim_end().to_owned())
        })
        .collect();
    let start = lines
        .iter()
        .position(|l| l.starts_with(BEGIN))
        .ok_or_else(|| format!("no `{BEGIN} -->` marker"))?;
    let end = lines[start..]
        .iter()
        .position(|l| l.starts_with(END))
        .ok_or_else(|| format!("no `{END}` marker after `{BEGIN} -->`"))?;
    Ok(lines[start..=start + end].join("\n"))
}

/// Rows `| <layer number> | `a`, `b` | what they hold |` of the block.
fn parse_map(block: &str) -> Result<Map, String> {
    let mut map = Map::default();
    for row in block.lines().filter(|l| l.starts_with('|')) {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let Some(Ok(layer)) = cells.get(1).map(|c| c.parse::<usize>()) else {
            continue;
        };
        let modules = cells.get(2).copied().unwrap_or_default();
        let names: Vec<&str> = modules.split('`').skip(1).step_by(2).collect();
        if names.is_empty() {
            return Err(format!("map row `{row}` names no module"));
        }
        for name in names {
            if map.layer_of.insert(name.to_owned(), layer).is_some() {
                return Err(format!("the map lists `{name}` twice"));
            }
        }
    }
    if map.layer_of.is_empty() {
        return Err("the map has no rows".into());
    }
    Ok(map)
}

/// The first segments of the paths in a `{ … }` group at the start of `s`, e.g. `{a::b, c}` → a, c.
fn group_heads(s: &str) -> Vec<String> {
    let mut heads = Vec::new();
    let (mut depth, mut expect) = (0, true);
    for (i, c) in s.char_indices() {
        match c {
            '{' => {
                depth += 1;
                if depth == 1 {
                    expect = true;
                }
            }
            '}' => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            ',' if depth == 1 => expect = true,
            c if depth == 1 && expect && !c.is_whitespace() => {
                expect = false;
                let id = ident_at(&s[i..]);
                if !id.is_empty() {
                    heads.push(id.to_owned());
                }
            }
            _ => {}
        }
    }
    heads
}

/// A path in `src/` to another top-level module.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Import {
    from: String,
    to: String,
    at: String,
}

/// The top-level modules `code` (the file at `rel`, e.g. `pool/eni.rs`) names through `crate::` and
/// through `super::` chains that climb to the crate root.
fn imports_of(rel: &str, text: &str) -> Vec<Import> {
    let mut path: Vec<String> = rel
        .trim_end_matches(".rs")
        .split('/')
        .map(str::to_owned)
        .collect();
    if path.last().is_some_and(|l| l == "mod") {
        path.pop();
    }
    let Some(from) = path.first().cloned() else {
        return Vec::new();
    };
    let code = code_only(text);
    let b = code.as_bytes();
    let line_at = |i: usize| code[..i].bytes().filter(|&c| c == b'\n').count() + 1;
    let mut found = Vec::new();
    let mut push = |to: String, i: usize| {
        found.push(Import {
            from: from.clone(),
            to,
            at: format!("src/{rel}:{}", line_at(i)),
        })
    };
    // Inline `mod x { … }` blocks: their depth counts for `super::`.
    let mut open_mods: Vec<usize> = Vec::new();
    let mut braces = 0usize;
    let mut i = 0;
    while i < b.len() {
        let prev_ident = i > 0 && (is_ident(b[i - 1]) || b[i - 1] == b'$');
        let rest = &code[i..];
        if b[i] == b'{' {
            braces += 1;
        } else if b[i] == b'}' {
            braces = braces.saturating_sub(1);
            if open_mods.last() == Some(&braces) {
                open_mods.pop();
            }
        } else if !prev_ident && rest.starts_with("mod ") {
            let after = rest[4..].trim_start();
            let name = ident_at(after);
            if !name.is_empty() && after[name.len()..].trim_start().starts_with('{') {
                open_mods.push(braces);
            }
        } else if !prev_ident && rest.starts_with("crate::") {
            let after = rest["crate::".len()..].trim_start();
            if after.starts_with('{') {
                for head in group_heads(after) {
                    push(head, i);
                }
            } else {
                let id = ident_at(after);
                if !id.is_empty() {
                    push(id.to_owned(), i);
                }
            }
            i += "crate::".len();
            continue;
        } else if !prev_ident && rest.starts_with("super::") {
            let mut supers = 0;
            let mut tail = rest;
            while let Some(t) = tail.strip_prefix("super::") {
                supers += 1;
                tail = t.trim_start();
            }
            if supers == path.len() + open_mods.len() {
                if tail.starts_with('{') {
                    for head in group_heads(tail) {
                        push(head, i);
                    }
                } else {
                    let id = ident_at(tail);
                    if !id.is_empty() {
                        push(id.to_owned(), i);
                    }
                }
            }
            i += rest.len() - tail.len();
            continue;
        }
        i += 1;
    }
    found
}

/// The top-level modules `lib.rs` declares: `mod x;` (any visibility, any `cfg`) and re-exported
/// crates or modules (`pub use eniipam_api::model;`, `pub use eniipam_cloud as cloud;`).
fn declared_modules(lib: &str) -> BTreeSet<String> {
    let code = code_only(lib);
    let mut modules = BTreeSet::new();
    for stmt in code.split(';') {
        let words: Vec<&str> = stmt
            .split_whitespace()
            .filter(|w| !w.starts_with("#[") && !w.starts_with("pub"))
            .collect();
        let stmt = words.join(" ");
        let stmt = stmt.rsplit(']').next().unwrap_or_default().trim();
        if let Some(name) = stmt.strip_prefix("mod ") {
            modules.insert(name.trim().to_owned());
        } else if let Some(path) = stmt.strip_prefix("use ") {
            if path.contains('{') || path.ends_with('*') {
                continue;
            }
            let name = match path.split_once(" as ") {
                Some((_, alias)) => alias.trim(),
                None => path.rsplit("::").next().unwrap_or_default().trim(),
            };
            // A re-exported item (`pub use daemon::Daemon;`) is not a module.
            if name.starts_with(|c: char| c.is_ascii_uppercase()) {
                continue;
            }
            modules.insert(name.to_owned());
        }
    }
    modules
}

/// Every problem of the map against the code: modules missing from it, entries with no module,
/// imports that go up or sideways, cycles, and a docs block that differs.
fn map_problems(lib: &str, docs: &str, files: &[(String, String)]) -> Vec<String> {
    let mut problems = Vec::new();
    let block = match map_block(lib, true) {
        Ok(b) => b,
        Err(e) => return vec![format!("src/lib.rs: {e}")],
    };
    match map_block(docs, false) {
        Ok(d) if d == block => {}
        Ok(d) => problems.push(format!(
            "the module map in docs/how-it-works.md differs from src/lib.rs's:\n--- src/lib.rs\n{block}\n--- docs\n{d}"
        )),
        Err(e) => problems.push(format!("docs/how-it-works.md: {e}")),
    }
    let map = match parse_map(&block) {
        Ok(m) => m,
        Err(e) => {
            problems.push(format!("src/lib.rs: {e}"));
            return problems;
        }
    };
    let declared = declared_modules(lib);
    for m in declared.difference(&map.layer_of.keys().cloned().collect()) {
        problems.push(format!(
            "module `{m}` (declared in src/lib.rs) is missing from the map"
        ));
    }
    for m in map.layer_of.keys().filter(|m| !declared.contains(*m)) {
        problems.push(format!(
            "the map lists `{m}`, which src/lib.rs does not declare"
        ));
    }
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (rel, text) in files {
        for imp in imports_of(rel, text) {
            if imp.from == imp.to || !declared.contains(&imp.to) {
                continue;
            }
            graph
                .entry(imp.from.clone())
                .or_default()
                .insert(imp.to.clone());
            let (Some(&from), Some(&to)) = (map.layer_of.get(&imp.from), map.layer_of.get(&imp.to))
            else {
                continue;
            };
            if to <= from {
                problems.push(format!(
                    "{}: `{}` (layer {from}) imports `{}` (layer {to}): {}",
                    imp.at,
                    imp.from,
                    imp.to,
                    if to == from {
                        "the same layer"
                    } else {
                        "an upward arrow"
                    }
                ));
            }
        }
    }
    problems.extend(cycles(&graph));
    problems
}

/// Cycles in the module graph, each as `a → b → a`.
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    fn visit<'a>(
        at: &'a str,
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        stack: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
        found: &mut BTreeSet<String>,
    ) {
        if let Some(pos) = stack.iter().position(|m| *m == at) {
            let mut cycle: Vec<&str> = stack[pos..].to_vec();
            // The same cycle from any start reads the same: start at its least module.
            let least = (0..cycle.len()).min_by_key(|&i| cycle[i]).unwrap_or(0);
            cycle.rotate_left(least);
            let first = cycle[0];
            cycle.push(first);
            found.insert(format!("import cycle: {}", cycle.join(" → ")));
            return;
        }
        if !done.insert(at) {
            return;
        }
        stack.push(at);
        for next in graph.get(at).into_iter().flatten() {
            visit(next, graph, stack, done, found);
        }
        stack.pop();
    }
    let mut found = BTreeSet::new();
    for start in graph.keys() {
        visit(
            start,
            graph,
            &mut Vec::new(),
            &mut BTreeSet::new(),
            &mut found,
        );
    }
    found.into_iter().collect()
}

fn rust_files(dir: &Path, under: &Path, out: &mut Vec<(String, String)>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, under, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let rel = path
                .strip_prefix(under)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            out.push((rel, std::fs::read_to_string(&path).unwrap()));
        }
    }
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn the_module_map_is_true() {
    let root = root();
    let src = root.join("src");
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    let docs = std::fs::read_to_string(root.join("docs/how-it-works.md")).unwrap();
    let mut files = Vec::new();
    rust_files(&src, &src, &mut files);
    // The library's modules; the binaries sit above all of them and use `eniipam::`, not `crate::`.
    files.retain(|(rel, _)| rel != "lib.rs" && !rel.starts_with("bin/"));
    assert!(files.len() > 50, "src/ read: {} files", files.len());
    let problems = map_problems(&lib, &docs, &files);
    assert!(
        problems.is_empty(),
        "the module map is not true:\n{}",
        problems.join("\n")
    );
}

#[test]
fn no_import_circle_between_files() {
    let crates = file_cycles::workspace_crates(&root());
    assert!(crates.len() >= 12, "crates read: {}", crates.len());
    let circles: Vec<String> = crates.iter().flat_map(file_cycles::file_circles).collect();
    assert!(circles.is_empty(), "{}", circles.join("\n"));
}

// ---------------------------------------------------------------------------------------------
// The checker fails when it should.

const GOOD_LIB: &str = "//! The crate.
//!
//! <!-- module-map: top to bottom -->
//! | layer | modules | what |
//! | --- | --- | --- |
//! | 1 | `top` | the top |
//! | 2 | `mid`, `side` | two beside each other |
//! | 3 | `low`, `model` | the bottom |
//! <!-- /module-map -->

pub mod top;
pub mod mid;
#[cfg(feature = \"x\")]
pub mod side;
mod low;
pub use other_crate::model;
";

fn docs_of(lib: &str) -> String {
    format!(
        "# Docs\n\nText.\n\n{}\n\nMore.\n",
        map_block(lib, true).unwrap()
    )
}

fn files(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
        .collect()
}

#[test]
fn a_true_map_passes() {
    let src = files(&[
        (
            "top.rs",
            "use crate::mid::X;\nuse crate::{low::Y, model};\nfn f() { crate::side::g() }",
        ),
        ("mid/mod.rs", "use crate::low::Z;\nmod inner;\n"),
        (
            "mid/inner.rs",
            "use super::super::low::W;\n// use crate::top::Q;\nconst S: &str = \"crate::top\";\nmod tests { use super::*; }",
        ),
        ("side.rs", "use crate::model::M;\nuse super::low::V;\n"),
        ("low.rs", "macro_rules! m { () => { $crate::low::x() } }\n"),
    ]);
    let problems = map_problems(GOOD_LIB, &docs_of(GOOD_LIB), &src);
    assert!(problems.is_empty(), "{problems:#?}");
}

#[test]
fn upward_and_sideways_imports_and_cycles_are_refused() {
    let src = files(&[
        ("top.rs", "use crate::mid::X;\n"),
        // Up two layers, in a group, after a string holding a brace and a lifetime.
        (
            "low.rs",
            "fn f<'a>(s: &'a str) -> char { let _ = \"{\"; '{' }\nuse crate::{mid::M, top::T};\n",
        ),
        // Sideways, and a cycle mid → side → mid.
        ("mid/a.rs", "pub fn f() { crate::side::g() }\n"),
        ("side.rs", "mod tests {\n    use super::super::mid::X;\n}\n"),
    ]);
    let problems = map_problems(GOOD_LIB, &docs_of(GOOD_LIB), &src);
    let text = problems.join("\n");
    assert!(
        text.contains("src/low.rs:2: `low` (layer 3) imports `top` (layer 1): an upward arrow"),
        "{text}"
    );
    assert!(
        text.contains("src/mid/a.rs:1: `mid` (layer 2) imports `side` (layer 2): the same layer"),
        "{text}"
    );
    assert!(
        text.contains("src/side.rs:2: `side` (layer 2) imports `mid` (layer 2)"),
        "{text}"
    );
    assert!(
        text.contains("src/low.rs:2: `low` (layer 3) imports `mid` (layer 2): an upward arrow"),
        "{text}"
    );
    assert!(text.contains("import cycle: mid → side → mid"), "{text}");
    assert_eq!(problems.len(), 5, "{text}");
}

#[test]
fn a_map_that_misses_a_module_or_lists_a_gone_one_is_refused() {
    let lib = GOOD_LIB
        .replace(
            "//! | 3 | `low`, `model` | the bottom |",
            "//! | 3 | `low`, `model`, `gone` | the bottom |",
        )
        .replace(
            "pub mod top;",
            "pub mod top;\npub mod unlisted;\npub use eniipam_cloud as cloud;",
        );
    let problems = map_problems(&lib, &docs_of(&lib), &[]).join("\n");
    assert!(
        problems.contains("module `unlisted` (declared in src/lib.rs) is missing from the map"),
        "{problems}"
    );
    assert!(
        problems.contains("module `cloud` (declared in src/lib.rs) is missing from the map"),
        "{problems}"
    );
    assert!(
        problems.contains("the map lists `gone`, which src/lib.rs does not declare"),
        "{problems}"
    );
}

#[test]
fn docs_that_differ_from_the_map_are_refused() {
    let docs = docs_of(GOOD_LIB).replace("two beside each other", "two, one above the other");
    let problems = map_problems(GOOD_LIB, &docs, &[]).join("\n");
    assert!(problems.contains("differs from src/lib.rs's"), "{problems}");
    let problems = map_problems(GOOD_LIB, "# no map here", &[]).join("\n");
    assert!(
        problems.contains("docs/how-it-works.md: no `<!-- module-map -->` marker"),
        "{problems}"
    );
}

/// Not a test of the map: prints the import graph, for whoever redraws it.
#[test]
fn print_the_import_graph() {
    let src = root().join("src");
    let mut files = Vec::new();
    rust_files(&src, &src, &mut files);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (rel, text) in files
        .iter()
        .filter(|(r, _)| r != "lib.rs" && !r.starts_with("bin/"))
    {
        for imp in imports_of(rel, text) {
            if imp.from != imp.to {
                graph.entry(imp.from).or_default().insert(imp.to);
            }
        }
    }
    let mut out = String::new();
    for (from, to) in &graph {
        let _ = writeln!(
            out,
            "{from} → {}",
            to.iter().cloned().collect::<Vec<_>>().join(", ")
        );
    }
    println!("{out}");
}
