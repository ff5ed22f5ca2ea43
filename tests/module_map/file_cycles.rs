//! No import circle between files (issue 45), in every crate of the workspace: the daemon (`src/`),
//! `crates/*/src`, `mocks/*/src` and `bench/src`. The top-level check in `module_map.rs` sees only
//! `src/`'s first level; this one sees every file.
//!
//! The rule, precisely:
//!
//! - The nodes are the crate's files, each a module of the tree its roots declare (`lib.rs`,
//!   `main.rs`, `bin/*.rs`: each root is checked as its own tree, following `mod x;` and
//!   `#[path = "…"] mod x;`). An inline `mod x { … }` belongs to its file.
//! - A file imports another when it names it through a path that starts with `crate::`, `super::`
//!   or `self::` (in `use`, in expressions, in groups `{a::X, b::{Y, Z}}`): the path is resolved
//!   from the module it stands in (inline modules count for `super::`) to the deepest file module it
//!   goes through, e.g. `super::rebuild::Plan` in `reconcile/decide.rs` → `reconcile/rebuild.rs`.
//!   A path through a parent's re-export (`super::Plan`, where `reconcile/mod.rs` says
//!   `pub use rebuild::Plan;`) is a path to the parent.
//! - A module's arrows into its own subtree (a parent using or re-exporting its children) are the
//!   ordinary Rust tree and are not arrows here. Every other arrow counts, arrows up to an ancestor
//!   included (a child using its parent's items).
//! - A circle is a cycle of such arrows: two files beside each other (siblings, cousins, or a file
//!   and its uncle) that reach each other, directly or through a chain. So a child using its
//!   parent's items is not a circle by itself; it is in one only if the parent leads back to the
//!   child through files outside the parent's subtree.
//! - Not arrows: paths in comments and strings, `$crate::` in macros, paths without a
//!   `crate`/`super`/`self` head (a parent naming its child `x::Y`, or another crate by name).

use super::lexer::{code_only, ident_at, is_ident};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// One crate's files (path relative to its `src/` → text) and the roots of its trees.
pub struct Crate {
    pub name: String,
    pub files: BTreeMap<String, String>,
}

impl Crate {
    /// The files that root a tree: `lib.rs`, `main.rs`, `bin/x.rs`, `bin/x/main.rs`.
    fn roots(&self) -> Vec<&str> {
        self.files
            .keys()
            .map(String::as_str)
            .filter(|f| {
                matches!(*f, "lib.rs" | "main.rs")
                    || f.strip_prefix("bin/")
                        .is_some_and(|b| !b.contains('/') || b.split('/').nth(1) == Some("main.rs"))
            })
            .collect()
    }
}

fn dir_of(file: &str) -> &str {
    file.rsplit_once('/').map_or("", |(d, _)| d)
}

fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_owned()
    } else {
        format!("{dir}/{name}")
    }
}

/// Inline `mod x { … }` blocks open at each byte of `code`: (brace depth where it opened, name).
struct InlineMods {
    open: Vec<(usize, String)>,
    braces: usize,
}

impl InlineMods {
    fn new() -> Self {
        Self {
            open: Vec::new(),
            braces: 0,
        }
    }

    /// Steps over byte `i` of `code`; returns a `mod name;` declared there, if one is.
    fn step<'c>(&mut self, code: &'c str, i: usize) -> Option<&'c str> {
        let b = code.as_bytes();
        match b[i] {
            b'{' => self.braces += 1,
            b'}' => {
                self.braces = self.braces.saturating_sub(1);
                if self.open.last().is_some_and(|(d, _)| *d == self.braces) {
                    self.open.pop();
                }
            }
            _ => {
                let prev_ident = i > 0 && (is_ident(b[i - 1]) || b[i - 1] == b'$');
                let rest = &code[i..];
                if !prev_ident && rest.starts_with("mod ") {
                    let after = rest[4..].trim_start();
                    let name = ident_at(after);
                    let tail = after[name.len()..].trim_start();
                    if !name.is_empty() && tail.starts_with('{') {
                        self.open.push((self.braces, name.to_owned()));
                    } else if !name.is_empty() && tail.starts_with(';') {
                        return Some(name);
                    }
                }
            }
        }
        None
    }

    fn names(&self) -> impl Iterator<Item = &str> {
        self.open.iter().map(|(_, n)| n.as_str())
    }
}

/// The `#[path = "…"]` attribute of the item that starts at byte `at` of `text`, if it has one.
fn path_attr(text: &str, code: &str, at: usize) -> Option<String> {
    let start = code[..at].rfind([';', '{', '}']).map_or(0, |p| p + 1);
    let attrs = &text[start..at];
    let after = &attrs[attrs.find("#[path")? + "#[path".len()..];
    let value = after
        .trim_start()
        .strip_prefix('=')?
        .trim_start()
        .strip_prefix('"')?;
    Some(value[..value.find('"')?].to_owned())
}

/// The module tree rooted at `root`: file → its module path (`["reconcile", "decide"]`).
fn module_tree(krate: &Crate, root: &str) -> BTreeMap<String, Vec<String>> {
    let mut tree = BTreeMap::new();
    let mut todo = vec![(root.to_owned(), Vec::<String>::new(), true)];
    while let Some((file, path, mod_rs)) = todo.pop() {
        let Some(text) = krate.files.get(&file) else {
            continue;
        };
        if tree.insert(file.clone(), path.clone()).is_some() {
            continue;
        }
        let stem = file
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .trim_end_matches(".rs");
        let children = if mod_rs {
            dir_of(&file).to_owned()
        } else {
            join(dir_of(&file), stem)
        };
        let code = code_only(text);
        let mut mods = InlineMods::new();
        for i in 0..code.len() {
            let Some(name) = mods.step(&code, i) else {
                continue;
            };
            let inline: Vec<&str> = mods.names().collect();
            let mut child_path = path.clone();
            child_path.extend(inline.iter().map(|s| (*s).to_owned()));
            child_path.push(name.to_owned());
            let dir = inline.iter().fold(children.clone(), |d, m| join(&d, m));
            let child = match path_attr(text, &code, i) {
                Some(p) if inline.is_empty() => join(dir_of(&file), &p),
                Some(p) => join(&dir, &p),
                None if krate.files.contains_key(&join(&dir, &format!("{name}.rs"))) => {
                    join(&dir, &format!("{name}.rs"))
                }
                None => join(&dir, &format!("{name}/mod.rs")),
            };
            let child_mod_rs = child.ends_with("/mod.rs") || child == "mod.rs";
            todo.push((child, child_path, child_mod_rs));
        }
    }
    tree
}

/// The paths of a use tree at the start of `s` (`a::b::{c, d::{e, self}}`), as segment lists, and
/// how many bytes it spans. `self` inside a group stands for the group's prefix.
fn use_tree(s: &str) -> (Vec<Vec<String>>, usize) {
    let lead = s.len() - s.trim_start().len();
    let t = &s[lead..];
    if let Some(inner) = t.strip_prefix('{') {
        let mut paths = Vec::new();
        let mut at = 1;
        let mut rest = inner;
        loop {
            let (mut sub, n) = use_tree(rest);
            for p in &mut sub {
                if p.first().is_some_and(|s| s == "self") {
                    p.remove(0);
                }
            }
            paths.extend(sub);
            // Skip to the next `,` or the closing `}` at this depth (past `as x`, `*`).
            let mut k = n;
            let mut depth = 0usize;
            let bytes = rest.as_bytes();
            while k < bytes.len() {
                match bytes[k] {
                    b'{' => depth += 1,
                    b'}' if depth == 0 => break,
                    b'}' => depth -= 1,
                    b',' if depth == 0 => break,
                    _ => {}
                }
                k += 1;
            }
            at += k + 1;
            if k >= bytes.len() || bytes[k] == b'}' {
                break;
            }
            rest = &rest[k + 1..];
        }
        return (paths, lead + at.min(t.len()));
    }
    let id = ident_at(t);
    if id.is_empty() {
        return (vec![Vec::new()], lead);
    }
    let after = &t[id.len()..];
    let gap = after.len() - after.trim_start().len();
    if let Some(next) = after.trim_start().strip_prefix("::") {
        let next_t = next.trim_start();
        if next_t.starts_with('{') || !ident_at(next_t).is_empty() {
            let (subs, n) = use_tree(next);
            let used = lead + id.len() + gap + 2 + n;
            let paths = subs
                .into_iter()
                .map(|mut p| {
                    p.insert(0, id.to_owned());
                    p
                })
                .collect();
            return (paths, used);
        }
    }
    (vec![vec![id.to_owned()]], lead + id.len())
}

/// `segments` (starting with `crate`, `super` or `self`) as an absolute module path, seen from the
/// module `here`; `None` when `super` climbs past the root.
fn absolute(here: &[String], segments: &[String]) -> Option<Vec<String>> {
    let mut abs = here.to_vec();
    let mut rest = segments;
    if rest.first().is_some_and(|s| s == "crate") {
        abs.clear();
        rest = &rest[1..];
    }
    while let Some(first) = rest.first() {
        match first.as_str() {
            "self" => {}
            "super" => {
                abs.pop()?;
            }
            _ => break,
        }
        rest = &rest[1..];
    }
    abs.extend(rest.iter().cloned());
    Some(abs)
}

/// An arrow from one file to another, with where it is written.
#[derive(Debug)]
struct Arrow {
    to: String,
    at: String,
}

/// The arrows of `file` (module path `here`) into other files of `tree` (see the module doc).
fn arrows_of(
    krate: &Crate,
    tree: &BTreeMap<String, Vec<String>>,
    by_path: &BTreeMap<&[String], &str>,
    file: &str,
) -> Vec<Arrow> {
    let here = &tree[file];
    let code = code_only(&krate.files[file]);
    let b = code.as_bytes();
    let mut mods = InlineMods::new();
    let mut arrows = Vec::new();
    let mut i = 0;
    while i < b.len() {
        mods.step(&code, i);
        let prev = i > 0 && (is_ident(b[i - 1]) || matches!(b[i - 1], b'$' | b':'));
        let rest = &code[i..];
        let is_path = ["crate", "super", "self"]
            .into_iter()
            .any(|k| rest.starts_with(k) && rest[k.len()..].trim_start().starts_with("::"));
        if prev || !is_path {
            i += 1;
            continue;
        }
        let (paths, used) = use_tree(rest);
        let mut inside = here.clone();
        inside.extend(mods.names().map(str::to_owned));
        let line = code[..i].bytes().filter(|&c| c == b'\n').count() + 1;
        for segs in paths {
            let Some(abs) = absolute(&inside, &segs) else {
                continue;
            };
            let Some(to) = (0..=abs.len())
                .rev()
                .find_map(|n| by_path.get(&abs[..n]).copied())
            else {
                continue;
            };
            let there = &tree[to];
            // Into its own subtree (itself included): the ordinary tree, not an arrow.
            if there.starts_with(here) {
                continue;
            }
            arrows.push(Arrow {
                to: to.to_owned(),
                at: format!("{}/{file}:{line}", krate.name),
            });
        }
        // Step over the whole tree (its braces still counted for inline modules).
        let end = i + used.max(1);
        i += 1;
        while i < end {
            mods.step(&code, i);
            i += 1;
        }
    }
    arrows
}

/// Every import circle between the files of `krate`, each as `a.rs → b.rs → a.rs (where: …)`.
pub fn file_circles(krate: &Crate) -> Vec<String> {
    let mut found = BTreeSet::new();
    for root in krate.roots() {
        let tree = module_tree(krate, root);
        let by_path: BTreeMap<&[String], &str> = tree
            .iter()
            .map(|(f, p)| (p.as_slice(), f.as_str()))
            .collect();
        let mut graph: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
        for file in tree.keys() {
            for arrow in arrows_of(krate, &tree, &by_path, file) {
                graph
                    .entry(file.clone())
                    .or_default()
                    .entry(arrow.to)
                    .or_insert(arrow.at);
            }
        }
        let names: BTreeMap<String, BTreeSet<String>> = graph
            .iter()
            .map(|(f, to)| (f.clone(), to.keys().cloned().collect()))
            .collect();
        for cycle in super::cycles(&names) {
            let chain = cycle.trim_start_matches("import cycle: ");
            let files: Vec<&str> = chain.split(" → ").collect();
            let sites: Vec<&str> = files
                .windows(2)
                .map(|w| graph[w[0]][w[1]].as_str())
                .collect();
            let at = |f: &str| format!("{}/{f}", krate.name);
            found.insert(format!(
                "import circle: {} (at {})",
                files.iter().map(|f| at(f)).collect::<Vec<_>>().join(" → "),
                sites.join(", ")
            ));
        }
    }
    found.into_iter().collect()
}

/// The workspace's crates: `src/` (the daemon), `crates/*/src`, `mocks/*/src`, `bench/src`.
pub fn workspace_crates(root: &Path) -> Vec<Crate> {
    let mut dirs = vec![root.join("src"), root.join("bench/src")];
    for group in ["crates", "mocks"] {
        for entry in std::fs::read_dir(root.join(group)).unwrap() {
            let src = entry.unwrap().path().join("src");
            if src.is_dir() {
                dirs.push(src);
            }
        }
    }
    dirs.sort();
    dirs.into_iter()
        .map(|src| {
            let mut list = Vec::new();
            super::rust_files(&src, &src, &mut list);
            let name = src.strip_prefix(root).unwrap_or(&src).display().to_string();
            Crate {
                name,
                files: list.into_iter().collect(),
            }
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The checker fails when it should.

fn krate(list: &[(&str, &str)]) -> Crate {
    Crate {
        name: "c/src".into(),
        files: list
            .iter()
            .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
            .collect(),
    }
}

#[test]
fn the_ordinary_tree_is_no_circle() {
    let c = krate(&[
        (
            "lib.rs",
            "mod a;\nmod b;\npub use a::X;\nuse crate::b::Y;\n",
        ),
        // The parent uses and re-exports its children; they use its items.
        (
            "a/mod.rs",
            "mod x;\nmod y;\npub use x::X;\nuse self::y::Y;\npub struct P;\n",
        ),
        (
            "a/x.rs",
            "use super::P;\nuse super::y::Y;\npub struct X;\nmod tests { use super::*; use super::super::P; }\n",
        ),
        (
            "a/y.rs",
            "use super::*;\nuse crate::b::B;\nfn f() -> crate::a::P { todo!() }\npub struct Y;\n",
        ),
        // Strings and comments name no module.
        (
            "b.rs",
            "// use crate::a::x::X;\nconst S: &str = \"crate::a::y\";\npub struct B;\n",
        ),
    ]);
    assert_eq!(file_circles(&c), Vec::<String>::new());
}

#[test]
fn siblings_that_import_each_other_are_a_circle() {
    let c = krate(&[
        ("lib.rs", "mod reconcile;\n"),
        ("reconcile/mod.rs", "mod decide;\nmod rebuild;\n"),
        (
            "reconcile/decide.rs",
            "use super::rebuild::Plan;\npub struct Step;\n",
        ),
        // Through a group, in a test module.
        (
            "reconcile/rebuild.rs",
            "pub struct Plan;\n#[cfg(test)]\nmod tests {\n    use crate::reconcile::{decide::Step, self};\n}\n",
        ),
    ]);
    assert_eq!(
        file_circles(&c),
        [
            "import circle: c/src/reconcile/decide.rs → c/src/reconcile/rebuild.rs → \
          c/src/reconcile/decide.rs (at c/src/reconcile/decide.rs:1, c/src/reconcile/rebuild.rs:4)"
        ]
    );
}

#[test]
fn cousins_and_chains_through_a_parent_are_circles() {
    let c = krate(&[
        ("main.rs", "mod soak;\nmod scenarios;\n"),
        (
            "soak/mod.rs",
            "mod world;\npub struct Report;\nuse crate::scenarios::fleet::Fleet;\n",
        ),
        (
            "soak/world.rs",
            "pub fn f() { super::super::scenarios::fleet::run() }\n",
        ),
        ("scenarios/mod.rs", "pub mod fleet;\n"),
        // `fleet` names `soak/mod.rs`, which names `fleet`: a circle. `soak/world.rs` names `fleet`
        // too, but nothing leads back to it (its parent's arrow into its subtree is the tree).
        (
            "scenarios/fleet.rs",
            "pub struct Fleet;\npub fn run() {}\nfn g(_: crate::soak::Report) {}\n",
        ),
    ]);
    let found = file_circles(&c).join("\n");
    assert!(
        found.contains(
            "import circle: c/src/scenarios/fleet.rs → c/src/soak/mod.rs → c/src/scenarios/fleet.rs"
        ),
        "{found}"
    );
    assert_eq!(found.lines().count(), 1, "{found}");
    // Three files in a ring, one through `self::super::` and a `#[path]` module.
    let c = krate(&[
        ("lib.rs", "mod store;\n"),
        (
            "store/mod.rs",
            "mod task;\nmod ipv6;\n#[cfg(test)]\n#[path = \"store_tests.rs\"]\nmod tests;\n",
        ),
        ("store/task.rs", "use super::ipv6::V6;\npub struct Task;\n"),
        (
            "store/ipv6.rs",
            "pub struct V6;\nfn f() { crate::store::tests::helper() }\n",
        ),
        (
            "store/store_tests.rs",
            "use self::super::task::Task;\npub fn helper() {}\n",
        ),
    ]);
    let found = file_circles(&c).join("\n");
    assert!(
        found.contains("c/src/store/ipv6.rs → c/src/store/store_tests.rs → c/src/store/task.rs → c/src/store/ipv6.rs"),
        "{found}"
    );
}

#[test]
fn every_crate_is_read() {
    let crates = workspace_crates(&super::root());
    let names: Vec<&str> = crates.iter().map(|c| c.name.as_str()).collect();
    for want in ["src", "bench/src", "crates/cni/src", "mocks/vpclab/src"] {
        assert!(names.contains(&want), "{names:?}");
    }
    // Each crate's tree reaches every file but stray ones (none today).
    for c in &crates {
        let reached: BTreeSet<String> = c
            .roots()
            .into_iter()
            .flat_map(|r| module_tree(c, r).into_keys())
            .collect();
        let missed: Vec<&String> = c.files.keys().filter(|f| !reached.contains(*f)).collect();
        assert!(
            missed.is_empty(),
            "{}: files in no module tree: {missed:?}",
            c.name
        );
    }
}
