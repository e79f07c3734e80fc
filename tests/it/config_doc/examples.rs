//! Each documented field set to its documented example, and each algorithm's documented
//! parameters, loaded by the daemon's own loader; each field's "reload" / "restart"
//! column checked against `config::diff::needs_restart`; the page's complete example
//! loaded.

use super::{all_ticked, doc_algorithms, doc_sections, Row, Section, DOC};
use ratelimitd::config::{diff, Config, ConfigError};
use std::collections::BTreeSet;

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
