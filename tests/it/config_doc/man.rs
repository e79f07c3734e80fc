//! The man page ratelimitd.toml(5) against docs/CONFIGURATION.md: the same sections,
//! and in each the same fields (the page is checked against the real configuration in
//! `mod.rs`, so the man page is too).

use super::doc_sections;
use std::collections::{BTreeMap, BTreeSet};

const MAN: &str = include_str!("../../../debian/man/ratelimitd.toml.5");

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
