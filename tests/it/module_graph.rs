//! The module graph as docs/DESIGN.md states it ("Module map", the table "module | may
//! use") against the code: every `crate::<module>` path in `src/` (test code apart) is an
//! edge between top-level modules. The test fails on an edge the table does not list, on
//! an edge it lists that the code no longer has (the map drifted), and on a cycle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Graph = BTreeMap<String, BTreeSet<String>>;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The "module | may use" table of docs/DESIGN.md.
fn documented() -> Graph {
    let text = std::fs::read_to_string(root().join("docs/DESIGN.md")).expect("docs/DESIGN.md");
    let mut graph = Graph::new();
    let mut in_table = false;
    for line in text.lines() {
        if line.starts_with("| module | may use |") {
            in_table = true;
            continue;
        }
        if !in_table || line.starts_with("|---") {
            continue;
        }
        if !line.starts_with('|') {
            break;
        }
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        let module = cells[0].trim_matches('`').to_string();
        let uses = cells[1]
            .split(',')
            .map(|m| m.trim().trim_matches('`').to_string())
            .filter(|m| !m.is_empty())
            .collect();
        assert!(
            graph.insert(module.clone(), uses).is_none(),
            "DESIGN.md lists {module} twice"
        );
    }
    assert!(
        !graph.is_empty(),
        "no \"| module | may use |\" table in DESIGN.md"
    );
    graph
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src/ readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The edges the code has: `crate::x` (and, in `main.rs`, `ratelimitd::x`) in each
/// file's code before its first `#[cfg(test)]`, comments and `tests.rs` files apart.
fn in_code() -> Graph {
    let src = root().join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut graph = Graph::new();
    for file in files {
        let rel = file.strip_prefix(&src).expect("under src/");
        let first = rel.components().next().expect("a path");
        let module = first
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_string();
        if module == "lib" || rel.ends_with("tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("a source file");
        let code = text.split("#[cfg(test)]").next().unwrap_or("");
        let uses = graph.entry(module.clone()).or_default();
        for line in code.lines() {
            let line = line.trim_start();
            if line.starts_with("//") {
                continue;
            }
            for prefix in ["crate::", "ratelimitd::"] {
                for (at, _) in line.match_indices(prefix) {
                    let before = line[..at].chars().last();
                    if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                        continue;
                    }
                    let name: String = line[at + prefix.len()..]
                        .chars()
                        .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                        .collect();
                    if !name.is_empty() && name != module {
                        uses.insert(name);
                    }
                }
            }
        }
    }
    graph.retain(|_, uses| !uses.is_empty());
    graph
}

#[test]
fn the_code_uses_exactly_the_modules_design_md_allows() {
    let (doc, code) = (documented(), in_code());
    let mut problems = Vec::new();
    for (module, uses) in &code {
        let allowed = doc.get(module).cloned().unwrap_or_default();
        for used in uses.difference(&allowed) {
            problems.push(format!(
                "{module} uses {used}, which DESIGN.md does not allow"
            ));
        }
    }
    for (module, allowed) in &doc {
        let uses = code.get(module).cloned().unwrap_or_default();
        for stale in allowed.difference(&uses) {
            problems.push(format!(
                "DESIGN.md lets {module} use {stale}, which it no longer does"
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "the module map drifted:\n{}",
        problems.join("\n")
    );
    eprintln!(
        "{} modules with {} edges, as DESIGN.md states",
        code.len(),
        code.values().map(BTreeSet::len).sum::<usize>()
    );
}

#[test]
fn the_module_graph_has_no_cycle() {
    fn visit<'a>(
        m: &'a str,
        graph: &'a Graph,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) -> Option<String> {
        if let Some(i) = path.iter().position(|p| *p == m) {
            return Some(format!("{} -> {m}", path[i..].join(" -> ")));
        }
        if !done.insert(m) {
            return None;
        }
        path.push(m);
        for next in graph.get(m).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        None
    }
    let graph = in_code();
    let mut done = BTreeSet::new();
    for m in graph.keys() {
        let cycle = visit(m, &graph, &mut Vec::new(), &mut done);
        assert!(cycle.is_none(), "a cycle: {}", cycle.unwrap_or_default());
    }
}
