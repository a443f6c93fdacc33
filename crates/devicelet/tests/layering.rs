//! Keeps the architecture of docs/architecture.md true (issue 20):
//! - no import cycle between the files (modules) of any crate: module `a` depends on module
//!   `b` when `a`'s code (not its comments, strings or `#[cfg(test)]` part) names a path into
//!   `b` (`crate::b::..`, `super::..`, or a child's relative `b::..`); the graph must be
//!   acyclic. `mod b;` and re-exports (`pub use b::X;`) are the module tree, not a dependency.
//! - the node core carries no wire: the transitive dependencies of `devicelet-node` (from
//!   Cargo.lock) hold no tonic, prost, axum or hyper, and neither do the managers', the
//!   machine reader's or the pure crates'.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Module path of a file under `src` (`a/b.rs` and `a/b/mod.rs` → `["a", "b"]`; `lib.rs`
/// and `main.rs` → `[]`).
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap();
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap();
    let stem = last.trim_end_matches(".rs");
    let root_file = parts.is_empty() && matches!(stem, "lib" | "main");
    if stem != "mod" && !root_file {
        parts.push(stem.to_owned());
    }
    parts
}

/// Source without comments and string literals (paths in docs are not dependencies).
fn code_only(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    for line in source.lines() {
        let line = line.trim_start();
        if line.starts_with("//") {
            continue;
        }
        let mut in_str = false;
        let mut prev = ' ';
        for c in line.chars() {
            if c == '"' && prev != '\\' && prev != '\'' {
                in_str = !in_str;
                prev = c;
                continue;
            }
            if !in_str {
                out.push(c);
            }
            prev = c;
        }
        out.push('\n');
    }
    // A test module is a child of its file, compiled only for tests; its imports are the
    // file's own.
    match out.find("#[cfg(test)]") {
        Some(i) => out[..i].to_owned(),
        None => out,
    }
}

/// Paths written in `code` that start at `crate::` or `super::` (the `use` groups expanded
/// one level: `crate::a::{b, c}` gives `crate::a::b` and `crate::a::c`).
fn referenced_paths(code: &str) -> Vec<String> {
    let mut paths = Vec::new();
    let bytes = code.as_bytes();
    for start in ["crate::", "super::"] {
        let mut from = 0;
        while let Some(i) = code[from..].find(start) {
            let at = from + i;
            from = at + start.len();
            // Not part of a longer identifier (`devicelet_crate::`).
            if at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_') {
                continue;
            }
            let mut end = at;
            while end < bytes.len()
                && (bytes[end].is_ascii_alphanumeric() || matches!(bytes[end], b'_' | b':'))
            {
                end += 1;
            }
            let head = code[at..end].trim_end_matches(':').to_owned();
            if code[..end].ends_with("::") && bytes.get(end) == Some(&b'{') {
                let close = code[end..].find('}').map_or(code.len(), |c| end + c);
                for item in code[end + 1..close].split(',') {
                    let item = item.split_whitespace().next().unwrap_or("");
                    let item = item.split("::").next().unwrap_or("");
                    if !item.is_empty() && item != "self" {
                        paths.push(format!("{head}::{item}"));
                    }
                }
            }
            // `crate::{a, b}` names `a` and `b`, not the crate root.
            if head != "crate" && head != "super" {
                paths.push(head);
            }
        }
    }
    paths
}

/// Module the `path` (relative to `module`) lands in: the longest prefix that is a module.
fn target_module(
    module: &[String],
    path: &str,
    modules: &BTreeSet<Vec<String>>,
) -> Option<Vec<String>> {
    let mut segments = path.split("::");
    let mut base: Vec<String> = match segments.next()? {
        "crate" => Vec::new(),
        "super" => {
            let mut m = module.to_vec();
            m.pop()?;
            m
        }
        _ => return None,
    };
    let mut found = modules.contains(&base).then(|| base.clone());
    for segment in segments {
        if segment == "super" {
            base.pop();
            found = Some(base.clone());
            continue;
        }
        base.push(segment.to_owned());
        if modules.contains(&base) {
            found = Some(base.clone());
        } else {
            break;
        }
    }
    found
}

/// Dependencies between the modules of the crate at `src`.
fn module_graph(src: &Path) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let modules: BTreeSet<Vec<String>> = files.iter().map(|f| module_of(src, f)).collect();
    let mut graph = BTreeMap::new();
    for file in &files {
        let module = module_of(src, file);
        let code = code_only(&std::fs::read_to_string(file).unwrap());
        let mut deps = BTreeSet::new();
        for path in referenced_paths(&code) {
            if let Some(target) = target_module(&module, &path, &modules)
                && target != module
            {
                deps.insert(target);
            }
        }
        // A parent naming its child by a relative path (`child::Item`) depends on it, except
        // where it only declares or re-exports it (`mod child;`, `pub use child::Item;`).
        for child in modules
            .iter()
            .filter(|m| m.len() == module.len() + 1 && m.starts_with(&module))
        {
            let name = format!("{}::", child[module.len()]);
            let uses = code
                .lines()
                .map(str::trim_start)
                .filter(|l| !l.starts_with("pub use ") && !l.starts_with("pub(crate) use "))
                .any(|l| names_relative(l, &name));
            if uses {
                deps.insert(child.clone());
            }
        }
        graph.insert(module, deps);
    }
    graph
}

/// Whether `line` contains `name` (`child::`) as the start of a relative path.
fn names_relative(line: &str, name: &str) -> bool {
    line.match_indices(name).any(|(at, _)| {
        let before = line[..at].chars().next_back();
        !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    })
}

/// A cycle of `graph`, if any, as module names.
fn find_cycle(graph: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit(
        node: &Vec<String>,
        graph: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        marks: &mut BTreeMap<Vec<String>, Mark>,
        stack: &mut Vec<Vec<String>>,
    ) -> Option<Vec<String>> {
        match marks.get(node) {
            Some(Mark::Done) => return None,
            Some(Mark::Open) => {
                let from = stack.iter().position(|n| n == node).unwrap_or(0);
                let mut cycle: Vec<String> = stack[from..].iter().map(|m| m.join("::")).collect();
                cycle.push(node.join("::"));
                return Some(cycle);
            }
            None => {}
        }
        marks.insert(node.clone(), Mark::Open);
        stack.push(node.clone());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, marks, stack) {
                return Some(cycle);
            }
        }
        stack.pop();
        marks.insert(node.clone(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for node in graph.keys() {
        if let Some(cycle) = visit(node, graph, &mut marks, &mut Vec::new()) {
            return Some(cycle);
        }
    }
    None
}

#[test]
fn no_crate_has_an_import_cycle_between_its_files() {
    let crates = repo_root().join("crates");
    let mut cycles = Vec::new();
    let mut checked = 0;
    for entry in std::fs::read_dir(&crates).unwrap() {
        let src = entry.unwrap().path().join("src");
        if !src.is_dir() {
            continue;
        }
        let mut graph = module_graph(&src);
        checked += graph.len();
        // Every cycle, not only the first: report one, cut its last edge, look again.
        while let Some(cycle) = find_cycle(&graph) {
            cycles.push(format!("{}: {}", src.display(), cycle.join(" -> ")));
            let split = |m: &String| -> Vec<String> {
                if m.is_empty() {
                    Vec::new()
                } else {
                    m.split("::").map(str::to_owned).collect()
                }
            };
            let (from, to) = (&cycle[cycle.len() - 2], &cycle[cycle.len() - 1]);
            if let Some(deps) = graph.get_mut(&split(from)) {
                deps.remove(&split(to));
            }
        }
    }
    assert!(checked > 50, "only {checked} modules found");
    assert!(cycles.is_empty(), "import cycles:\n{}", cycles.join("\n"));
}

#[test]
fn the_checker_sees_a_cycle() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir_all(src.join("b")).unwrap();
    std::fs::write(src.join("lib.rs"), "mod a;\nmod b;\n").unwrap();
    std::fs::write(src.join("a.rs"), "use crate::b::{c::X, Y};\n").unwrap();
    std::fs::write(src.join("b/mod.rs"), "pub mod c;\npub use c::X;\n").unwrap();
    std::fs::write(
        src.join("b/c.rs"),
        "// crate::a in a comment is not an edge\nfn f() { super::super::a::g() }\n",
    )
    .unwrap();
    let graph = module_graph(src);
    let cycle = find_cycle(&graph).expect("a -> b::c -> a");
    assert!(cycle.contains(&"a".to_owned()), "{cycle:?}");
    // Without the back edge there is none.
    std::fs::write(src.join("b/c.rs"), "fn f() {}\n").unwrap();
    assert_eq!(find_cycle(&module_graph(src)), None);
}

/// Packages reachable from `root` in Cargo.lock (normal, build and dev edges of every package:
/// Cargo.lock does not tell them apart, so this over-approximates).
fn lock_closure(root: &str) -> BTreeSet<String> {
    let lock = std::fs::read_to_string(repo_root().join("Cargo.lock")).unwrap();
    let mut deps: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for package in lock.split("[[package]]").skip(1) {
        let name = package
            .lines()
            .find_map(|l| l.strip_prefix("name = "))
            .unwrap()
            .trim_matches('"')
            .to_owned();
        let list = package
            .split("dependencies = [")
            .nth(1)
            .map(|d| d.split(']').next().unwrap_or(""))
            .unwrap_or("");
        let names = list
            .split(',')
            .filter_map(|d| d.trim().trim_matches('"').split(' ').next())
            .filter(|d| !d.is_empty())
            .map(str::to_owned)
            .collect();
        deps.entry(name).or_default().extend::<Vec<String>>(names);
    }
    let mut seen = BTreeSet::new();
    let mut todo = vec![root.to_owned()];
    while let Some(p) = todo.pop() {
        if seen.insert(p.clone()) {
            todo.extend(deps.get(&p).cloned().unwrap_or_default());
        }
    }
    seen
}

#[test]
fn the_node_core_and_the_managers_carry_no_wire() {
    let wire = ["tonic", "prost", "axum", "hyper"];
    for package in [
        "devicelet-node",
        "devicelet-devicemanager",
        "devicelet-cpumanager",
        "devicelet-memorymanager",
        "devicelet-dra",
        "devicelet-checkpoint",
        "devicelet-topology",
        "devicelet-machine",
        "devicelet-allocator",
    ] {
        let closure = lock_closure(package);
        assert!(closure.len() > 1, "{package} not in Cargo.lock");
        let carried: Vec<&&str> = wire.iter().filter(|w| closure.contains(**w)).collect();
        assert!(
            carried.is_empty(),
            "{package} depends on {carried:?} (Cargo.lock)"
        );
    }
    // The check itself sees the wire where it is.
    assert!(lock_closure("devicelet-rpc").contains("tonic"));
}

/// `devicelet-*` crates in the `[dependencies]` section of `manifest`, short names (`-node`).
fn manifest_uses(manifest: &str) -> BTreeSet<String> {
    let section = manifest
        .split("[dependencies]")
        .nth(1)
        .map(|s| s.split("\n[").next().unwrap_or(""))
        .unwrap_or("");
    section
        .lines()
        .filter_map(|l| l.trim().strip_prefix("devicelet-"))
        .filter_map(|l| l.split(|c: char| !c.is_ascii_alphanumeric()).next())
        .map(|name| format!("-{name}"))
        .collect()
}

#[test]
fn the_architecture_table_matches_the_manifests() {
    let doc = std::fs::read_to_string(repo_root().join("docs/architecture.md")).unwrap();
    let mut table: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in doc.lines() {
        let Some(rest) = line.strip_prefix("| `devicelet") else {
            continue;
        };
        let mut cells = rest.split('|');
        let name = format!(
            "devicelet{}",
            cells.next().unwrap().trim().trim_end_matches('`')
        );
        let uses = cells
            .next()
            .unwrap_or("")
            .split_whitespace()
            .map(str::to_owned)
            .collect();
        table.insert(name, uses);
    }
    let mut actual = BTreeMap::new();
    for entry in std::fs::read_dir(repo_root().join("crates")).unwrap() {
        let dir = entry.unwrap().path();
        let Ok(manifest) = std::fs::read_to_string(dir.join("Cargo.toml")) else {
            continue;
        };
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        actual.insert(name, manifest_uses(&manifest));
    }
    assert!(actual.len() > 10, "{actual:?}");
    assert_eq!(
        table, actual,
        "docs/architecture.md's crate table (left) differs from the Cargo.toml files (right)"
    );
}
