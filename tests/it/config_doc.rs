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

use ratelimitd::config::{diff, Config, ConfigError};
use std::collections::{BTreeMap, BTreeSet};

const DOC: &str = include_str!("../../docs/CONFIGURATION.md");
const MAN: &str = include_str!("../../debian/man/ratelimitd.toml.5");

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

/// The fields of `section` set to their examples: its required fields, then `extra`
/// (replacing a required one of the same name).
fn table(section: &Section, extra: &[(&str, &str)]) -> String {
    let mut fields: Vec<(String, String)> = section
        .rows
        .iter()
        .filter(|r| r.default == "required")
        .map(|r| (r.field.clone(), r.example.clone()))
        .collect();
    for (k, v) in extra {
        match fields.iter_mut().find(|(f, _)| f == k) {
            Some(slot) => slot.1 = v.to_string(),
            None => fields.push((k.to_string(), v.to_string())),
        }
    }
    let (open, close) = if section.array {
        ("[[", "]]")
    } else {
        ("[", "]")
    };
    let mut out = format!("{open}{}{close}\n", section.path);
    for (k, v) in fields {
        out.push_str(&format!("{k} = {v}\n"));
    }
    out
}

/// The documented rule: the `[[rule]]` examples, with its algorithm's documented
/// parameters at their examples, then `extra`.
fn documented_rule(doc: &[Section], algorithm: Option<&str>, extra: &[(&str, &str)]) -> String {
    let rule = doc
        .iter()
        .find(|s| s.path == "rule")
        .expect("[[rule]] section");
    let example = |f: &str| {
        rule.rows
            .iter()
            .find(|r| r.field == f)
            .unwrap_or_else(|| panic!("[[rule]] documents no '{f}'"))
            .example
            .clone()
    };
    let algorithm = algorithm.map_or_else(|| example("algorithm"), |a| format!("\"{a}\""));
    let params = &doc_algorithms()[algorithm.trim_matches('"')];
    let mut fields = vec![("algorithm".to_owned(), algorithm)];
    fields.extend(params.iter().map(|p| (p.clone(), example(p))));
    let mut all: Vec<(&str, &str)> = fields
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    all.extend_from_slice(extra);
    table(rule, &all)
}

/// `[envoy]` with the front end on, the base of its other fields' examples.
const ENVOY_ON: &str = "[envoy]\nlisten = \"unix:/run/ratelimitd/rls.sock\"\n";

/// A file setting `row` of `section` to its example: on top of the section's required
/// fields; a rule's on top of the documented rule; a descriptor's after it; another
/// `[envoy]` field's beside `listen`.
fn example_file(doc: &[Section], section: &Section, row: &Row) -> String {
    let field = [(row.field.as_str(), row.example.as_str())];
    match section.path.as_str() {
        "envoy" if row.field != "listen" => {
            let listen = ("listen", "\"unix:/run/ratelimitd/rls.sock\"");
            table(section, &[listen, field[0]])
        }
        "rule" => documented_rule(doc, None, &field),
        "envoy.descriptor" => format!(
            "{}\n{ENVOY_ON}{}",
            documented_rule(doc, None, &[]),
            table(section, &field)
        ),
        _ => table(section, &field),
    }
}

#[test]
fn each_example_loads_and_its_reload_column_matches_diff() {
    let doc = doc_sections();
    let empty = Config::parse("", "empty.toml").unwrap();
    // The front end's other fields are compared with it on (`listen` set on both
    // sides): without `listen`, a `config_dir` turns it on, which needs a restart.
    let envoy_on = Config::parse(ENVOY_ON, "envoy.toml").unwrap();
    let mut checked_reload = 0;
    let mut rows = 0;
    for section in &doc {
        for row in &section.rows {
            rows += 1;
            let text = example_file(&doc, section, row);
            let at = format!("[{}] {} = {}", section.path, row.field, row.example);
            match Config::parse(&text, "doc.toml") {
                Err(ConfigError::Parse { message, .. }) => {
                    panic!("{at}: the documented example does not load:\n{text}\n{message}")
                }
                Err(ConfigError::Invalid { .. }) => {} // needs other fields: parsed, not applied
                Err(e) => panic!("{at}: {e}"),
                Ok(config) => {
                    assert!(
                        ["reload", "restart"].contains(&row.reload.as_str()),
                        "{at}: the reload column says '{}', not reload or restart",
                        row.reload
                    );
                    let base = match section.path.as_str() {
                        "envoy" if row.field != "listen" => &envoy_on,
                        "envoy.descriptor" => &envoy_on,
                        _ => &empty,
                    };
                    if config == *base {
                        panic!("{at}: the example is the default; give one that differs");
                    }
                    let restart = diff::needs_restart(base, &config);
                    assert_eq!(
                        row.reload == "restart",
                        !restart.is_empty(),
                        "{at}: CONFIGURATION.md says '{}', a reload says {restart:?}",
                        row.reload
                    );
                    checked_reload += 1;
                }
            }
        }
    }
    // Every field of [server], [cache], [fallback], [metrics] loads alone, so this
    // cannot quietly check nothing.
    assert!(rows >= 50, "only {rows} documented fields");
    assert!(
        checked_reload >= 30,
        "only {checked_reload} reload columns checked"
    );
}

#[test]
fn each_algorithm_loads_with_its_documented_parameters() {
    let doc = doc_sections();
    let algorithms = doc_algorithms();
    let e = Config::parse(
        "[[rule]]\nname = \"r\"\nalgorithm = \"zzz_probe\"\n",
        "probe.toml",
    )
    .unwrap_err()
    .to_string();
    let real: BTreeSet<String> = all_ticked(e.split_once("`zzz_probe`").unwrap().1)
        .into_iter()
        .map(String::from)
        .collect();
    let documented: BTreeSet<String> = algorithms.keys().cloned().collect();
    assert_eq!(
        documented, real,
        "the algorithm table of docs/CONFIGURATION.md"
    );
    for algorithm in &real {
        let text = documented_rule(&doc, Some(algorithm), &[]);
        let config = Config::parse(&text, "doc.toml")
            .unwrap_or_else(|e| panic!("{algorithm} with its documented parameters:\n{text}\n{e}"));
        assert_eq!(config.rules.len(), 1);
    }
}

#[test]
fn the_complete_example_loads() {
    let start = DOC.find("```toml\n").expect("a toml example") + "```toml\n".len();
    let end = start + DOC[start..].find("```").unwrap();
    let config = Config::parse(&DOC[start..end], "CONFIGURATION.md").unwrap();
    assert!(config.rules.len() >= 2);
}

/// The man page's sections (`.SH [server]`) and the names of each `.TP` tag line
/// (`.B socket`, `.BR tls_cert_file ", " tls_key_file`).
fn man_sections() -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut section: Option<String> = None;
    let mut tag_next = false;
    for line in MAN.lines() {
        if let Some(name) = line.strip_prefix(".SH ") {
            let name = name.trim().trim_matches('"');
            section = name
                .starts_with('[')
                .then(|| name.trim_matches(['[', ']']).to_owned());
            if let Some(s) = &section {
                out.entry(s.clone()).or_default();
            }
            continue;
        }
        if line == ".TP" {
            tag_next = true;
            continue;
        }
        if std::mem::take(&mut tag_next) {
            if let (Some(s), Some((_, names))) = (&section, line.split_once(' ')) {
                let words = names
                    .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .filter(|w| w.starts_with(|c: char| c.is_ascii_lowercase()));
                out.get_mut(s).unwrap().extend(words.map(String::from));
            }
        }
    }
    out
}

#[test]
fn the_man_page_names_the_same_fields() {
    let doc = doc_sections();
    let man = man_sections();
    for section in &doc {
        let documented: BTreeSet<String> = section.rows.iter().map(|r| r.field.clone()).collect();
        let in_man = man.get(&section.path).unwrap_or_else(|| {
            panic!("debian/man/ratelimitd.toml.5 has no .SH [{}]", section.path)
        });
        assert_eq!(
            in_man, &documented,
            "debian/man/ratelimitd.toml.5 [{}] (left) against docs/CONFIGURATION.md (right)",
            section.path
        );
    }
    let documented: BTreeSet<&String> = doc.iter().map(|s| &s.path).collect();
    for path in man.keys() {
        assert!(
            documented.contains(path),
            "the man page has [{path}], the page does not"
        );
    }
}
