//! docs/CONFIGURATION.md and the man page ratelimitd.toml(5) against the configuration
//! the daemon really reads, so neither can drift from it. No Redis: everything goes
//! through the crate's own loader, `Config::parse`.
//!
//! * The real fields are not a hand-kept list: every table is `deny_unknown_fields`, so
//!   loading a table with an unknown field makes serde list the fields it expects.
//! * Each documented field is set to its documented example (on top of its section's
//!   required fields) and loaded: it must not be a parse error (unknown field, wrong
//!   type, value out of range). A value refused only in relation to other fields
//!   (`tls_ca_file` without `tls = true`) is accepted here.
//! * Where that one-field file loads, its "reload" / "restart" column is checked against
//!   `config::diff::needs_restart`.
//! * Each algorithm's documented parameters, at their examples, make a rule that loads,
//!   and the page's complete example file loads.
//!
//! Here: the page read (its sections, their tables, each algorithm's parameters) and
//! the fields compared; the examples loaded in `examples.rs`; the man page in `man.rs`.

mod examples;
mod man;

use ratelimitd::config::Config;
use std::collections::{BTreeMap, BTreeSet};

const DOC: &str = include_str!("../../../docs/CONFIGURATION.md");

/// One row of a section's table.
#[derive(Debug, Clone)]
struct Row {
    field: String,
    default: String,
    reload: String,
    example: String,
}

/// A section as the page documents it: `server`, `rule`, `envoy.descriptor`; `array`
/// for `[[…]]`.
#[derive(Debug)]
struct Section {
    path: String,
    array: bool,
    rows: Vec<Row>,
}

/// The text between the first pair of backticks of `cell`, or `None`.
fn ticked(cell: &str) -> Option<&str> {
    let start = cell.find('`')? + 1;
    let len = cell[start..].find('`')?;
    Some(&cell[start..start + len])
}

/// Every text between backticks in `text`.
fn all_ticked(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

fn cells(line: &str) -> Vec<&str> {
    let line = line.trim().trim_start_matches('|').trim_end_matches('|');
    line.split('|').map(str::trim).collect()
}

/// The sections of CONFIGURATION.md: a `## ` heading naming `[x]` or `[[x]]` in
/// backticks, then the first table whose header starts `| field |`.
fn doc_sections() -> Vec<Section> {
    let mut sections: Vec<Section> = Vec::new();
    let mut header: Option<Vec<String>> = None;
    for line in DOC.lines() {
        if let Some(heading) = line.strip_prefix("## ") {
            header = None;
            if let Some(name) = ticked(heading).filter(|n| n.starts_with('[')) {
                let array = name.starts_with("[[");
                let path = name.trim_matches(['[', ']']).to_owned();
                sections.push(Section {
                    path,
                    array,
                    rows: Vec::new(),
                });
            }
            continue;
        }
        let Some(section) = sections.last_mut() else {
            continue;
        };
        if !line.starts_with('|') {
            if header.is_some() && !section.rows.is_empty() {
                header = Some(Vec::new()); // the field table is over
            }
            continue;
        }
        let row = cells(line);
        match &header {
            None if row[0] == "field" => {
                header = Some(row.iter().map(|c| c.to_string()).collect());
            }
            Some(h) if !h.is_empty() && !row[0].starts_with("---") => {
                assert_eq!(row.len(), h.len(), "a row of [{}]: {line}", section.path);
                let col = |name: &str| {
                    let i = h.iter().position(|c| c == name).unwrap_or_else(|| {
                        panic!("the [{}] table has no '{name}' column", section.path)
                    });
                    row[i].to_owned()
                };
                let field = ticked(row[0])
                    .unwrap_or_else(|| panic!("[{}]: no `field` in {line}", section.path));
                let example = col("example");
                section.rows.push(Row {
                    field: field.to_owned(),
                    default: col("default"),
                    reload: col("reload"),
                    example: ticked(&example)
                        .unwrap_or_else(|| panic!("{field}: the example is not in backticks"))
                        .to_owned(),
                });
            }
            _ => {}
        }
    }
    sections
}

/// The page's algorithm table: algorithm → its two parameters.
fn doc_algorithms() -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    let mut inside = false;
    for line in DOC.lines() {
        if line.starts_with("| algorithm | parameters |") {
            inside = true;
            continue;
        }
        if inside && !line.starts_with('|') {
            break;
        }
        let row = cells(line);
        if inside && !row[0].starts_with("---") {
            let params = all_ticked(row[1]).into_iter().map(String::from).collect();
            out.insert(
                ticked(row[0]).expect("algorithm in backticks").to_owned(),
                params,
            );
        }
    }
    assert!(
        !out.is_empty(),
        "CONFIGURATION.md has no '| algorithm | parameters |' table"
    );
    out
}

/// The names serde expects where `probe` (a TOML text with the unknown field
/// `zzz_probe`) has it, read from its "unknown field" error.
fn expected(probe: &str) -> BTreeSet<String> {
    let e = Config::parse(probe, "probe.toml").unwrap_err().to_string();
    let after = e
        .split_once("unknown field `zzz_probe`")
        .unwrap_or_else(|| panic!("no unknown-field error for {probe:?}: {e}"))
        .1;
    let names: BTreeSet<String> = all_ticked(after).into_iter().map(String::from).collect();
    assert!(!names.is_empty(), "no expected fields in: {e}");
    names
}

/// The real fields of the section at `path` (`[[x]]` when `array`).
fn real_fields(path: &str, array: bool) -> BTreeSet<String> {
    let (open, close) = if array { ("[[", "]]") } else { ("[", "]") };
    expected(&format!("{open}{path}{close}\nzzz_probe = 1\n"))
}

/// The real sections: top-level tables, and the tables inside them (`envoy.descriptor`),
/// with `[[…]]` when the page says so.
fn real_sections(doc: &[Section]) -> BTreeMap<String, BTreeSet<String>> {
    let mut out = BTreeMap::new();
    let mut todo: Vec<String> = expected("zzz_probe = 1\n").into_iter().collect();
    while let Some(path) = todo.pop() {
        let array = doc.iter().find(|s| s.path == path).is_some_and(|s| s.array);
        let fields = real_fields(&path, array);
        for f in &fields {
            let nested = format!("{path}.{f}");
            if doc.iter().any(|s| s.path == nested) {
                todo.push(nested);
            }
        }
        out.insert(path, fields);
    }
    out
}

#[test]
fn every_field_is_documented_and_every_documented_field_exists() {
    let doc = doc_sections();
    let real = real_sections(&doc);
    for (path, fields) in &real {
        let section = doc
            .iter()
            .find(|s| &s.path == path)
            .unwrap_or_else(|| panic!("docs/CONFIGURATION.md has no section for [{path}]"));
        let documented: BTreeSet<String> = section.rows.iter().map(|r| r.field.clone()).collect();
        // A field that is itself a table is documented by its own section.
        let tables: BTreeSet<String> = fields
            .iter()
            .filter(|f| doc.iter().any(|s| s.path == format!("{path}.{f}")))
            .cloned()
            .collect();
        let missing: Vec<_> = fields
            .difference(&documented)
            .filter(|f| !tables.contains(*f))
            .collect();
        let unknown: Vec<_> = documented.difference(fields).collect();
        assert!(
            missing.is_empty(),
            "[{path}]: fields not in docs/CONFIGURATION.md: {missing:?}"
        );
        assert!(
            unknown.is_empty(),
            "[{path}]: docs/CONFIGURATION.md names fields that do not exist: {unknown:?}"
        );
    }
    for s in &doc {
        assert!(
            real.contains_key(&s.path),
            "docs/CONFIGURATION.md documents [{}], which does not exist",
            s.path
        );
    }
    for top in [
        "server",
        "redis",
        "cache",
        "fallback",
        "metrics",
        "rule",
        "envoy",
        "envoy.descriptor",
    ] {
        assert!(
            real.contains_key(top),
            "[{top}] was not probed: {:?}",
            real.keys()
        );
    }
}
