//! Just enough PromQL for the dashboard test: the `ratelimitd_*` selectors of a query
//! (their label matchers) and the labels it groups by; and a scrape's series with their
//! label names and values. Not a PromQL parser: functions, operators and ranges are
//! skipped, which is all the check needs.

use std::collections::{BTreeMap, BTreeSet};

/// Labels Prometheus adds to every scraped series (or the dashboard's variables select
/// on): never in the daemon's own output.
pub const TARGET_LABELS: [&str; 2] = ["instance", "job"];

/// One selector of a query: `name{label op "value", ...}`; `exact` holds the labels
/// matched with `=` to a literal value (no template variable), and each value of an
/// `=~` alternation of plain values (`"local|fail_open"`).
#[derive(Debug, Default)]
pub struct Selector {
    pub name: String,
    pub labels: Vec<String>,
    pub exact: Vec<(String, String)>,
}

/// One query: its selectors of `ratelimitd_*` series and the labels its aggregations
/// group by (`by (...)`).
#[derive(Debug, Default)]
pub struct Query {
    pub expr: String,
    pub selectors: Vec<Selector>,
    pub by: Vec<String>,
}

fn ident_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b':'
}

fn ident_at(b: &[u8], mut i: usize) -> (String, usize) {
    let start = i;
    while i < b.len() && ident_char(b[i]) {
        i += 1;
    }
    (String::from_utf8_lossy(&b[start..i]).into_owned(), i)
}

fn skip_space(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && b[i].is_ascii_whitespace() {
        i += 1;
    }
    i
}

/// The matchers of a `{...}` starting at `b[i] == '{'`: (label, op, value) and the
/// index after the `}`. Values are PromQL strings in double quotes.
fn matchers(b: &[u8], mut i: usize, expr: &str) -> (Vec<(String, String, String)>, usize) {
    let mut out = Vec::new();
    i += 1;
    loop {
        i = skip_space(b, i);
        match b.get(i) {
            Some(b'}') => return (out, i + 1),
            Some(b',') => i += 1,
            Some(_) => {
                let (label, j) = ident_at(b, i);
                assert!(!label.is_empty(), "a matcher without a label in: {expr}");
                let j = skip_space(b, j);
                let op_len = if b[j..].starts_with(b"=~")
                    || b[j..].starts_with(b"!~")
                    || b[j..].starts_with(b"!=")
                {
                    2
                } else {
                    1
                };
                let op = String::from_utf8_lossy(&b[j..j + op_len]).into_owned();
                let mut k = skip_space(b, j + op_len);
                assert_eq!(
                    b.get(k),
                    Some(&b'"'),
                    "a matcher's value not in double quotes in: {expr}"
                );
                k += 1;
                let v_start = k;
                while k < b.len() && b[k] != b'"' {
                    k += if b[k] == b'\\' { 2 } else { 1 };
                }
                let value = String::from_utf8_lossy(&b[v_start..k]).into_owned();
                out.push((label, op, value));
                i = k + 1;
            }
            None => panic!("an unclosed {{ in: {expr}"),
        }
    }
}

/// The `ratelimitd_*` selectors and grouping labels of a PromQL expression (or of a
/// Grafana `label_values(<selector>, <label>)` query).
pub fn parse_query(expr: &str) -> Query {
    let b = expr.as_bytes();
    let mut q = Query {
        expr: expr.to_owned(),
        ..Query::default()
    };
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'"' {
            // A string outside a selector (a label_replace argument): skip it.
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            continue;
        }
        if !ident_char(b[i]) || (i > 0 && ident_char(b[i - 1])) {
            i += 1;
            continue;
        }
        let (word, j) = ident_at(b, i);
        let k = skip_space(b, j);
        if word.starts_with("ratelimitd_") {
            let mut s = Selector {
                name: word,
                ..Selector::default()
            };
            i = j;
            if b.get(k) == Some(&b'{') {
                let (ms, end) = matchers(b, k, expr);
                for (label, op, value) in ms {
                    let literal = |v: &str| {
                        !v.is_empty() && v.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_')
                    };
                    if op == "=" && !value.contains('$') {
                        s.exact.push((label.clone(), value));
                    } else if op == "=~" && value.split('|').all(literal) {
                        // An alternation of plain values: each must exist.
                        s.exact
                            .extend(value.split('|').map(|v| (label.clone(), v.to_owned())));
                    }
                    s.labels.push(label);
                }
                i = end;
            }
            q.selectors.push(s);
        } else if (word == "by" || word == "without") && b.get(k) == Some(&b'(') {
            let end = k + expr[k..].find(')').expect("a closed by (...)");
            if word == "by" {
                q.by.extend(
                    expr[k + 1..end]
                        .split(',')
                        .map(str::trim)
                        .filter(|l| !l.is_empty())
                        .map(str::to_owned),
                );
            }
            i = end + 1;
        } else if b.get(k) == Some(&b'{') {
            // Another metric's selector: its matchers are not ours.
            i = matchers(b, k, expr).1;
        } else {
            i = j;
        }
    }
    q
}

/// The series of a scrape: name → the label names seen on it, and (name, label) → the
/// values seen.
pub struct Scraped {
    labels: BTreeMap<String, BTreeSet<String>>,
    values: BTreeMap<(String, String), BTreeSet<String>>,
}

pub fn scraped(body: &str) -> Scraped {
    let mut s = Scraped {
        labels: BTreeMap::new(),
        values: BTreeMap::new(),
    };
    let body = body.split_once("\r\n\r\n").map_or(body, |(_, b)| b);
    for line in body
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let b = line.as_bytes();
        let (name, i) = ident_at(b, 0);
        let set = s.labels.entry(name.clone()).or_default();
        if b.get(i) == Some(&b'{') {
            for (label, _, value) in matchers(b, i, line).0 {
                set.insert(label.clone());
                s.values
                    .entry((name.clone(), label))
                    .or_default()
                    .insert(value);
            }
        }
    }
    s
}

/// What is wrong with `q` against the scrape: series absent, labels absent, values never
/// seen.
pub fn problems(what: &str, q: &Query, s: &Scraped) -> Vec<String> {
    let mut out = Vec::new();
    for sel in &q.selectors {
        let Some(labels) = s.labels.get(&sel.name) else {
            out.push(format!("{what}: series {} not exported", sel.name));
            continue;
        };
        for l in sel
            .labels
            .iter()
            .filter(|l| !TARGET_LABELS.contains(&l.as_str()))
        {
            if !labels.contains(l) {
                out.push(format!("{what}: {} has no label {l}", sel.name));
            }
        }
        for (l, v) in &sel.exact {
            if !s
                .values
                .get(&(sel.name.clone(), l.clone()))
                .is_some_and(|vs| vs.contains(v))
            {
                out.push(format!("{what}: {} never has {l}=\"{v}\"", sel.name));
            }
        }
    }
    for l in q.by.iter().filter(|l| !TARGET_LABELS.contains(&l.as_str())) {
        if !q
            .selectors
            .iter()
            .any(|sel| s.labels.get(&sel.name).is_some_and(|ls| ls.contains(l)))
        {
            out.push(format!(
                "{what}: groups by {l}, a label none of its series has: {}",
                q.expr
            ));
        }
    }
    out
}

#[test]
fn the_query_parser_finds_selectors_labels_and_groupings() {
    let q = parse_query(
        "sum by (rule, source) (rate(ratelimitd_decisions_total{instance=~\"$instance\", verdict=\"deny\", source=~\"local|fail_open\"}[5m]))\n/ ignoring (source) group_left () sum(up{job=\"x\"}) + ratelimitd_connections",
    );
    let names: Vec<_> = q.selectors.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names,
        ["ratelimitd_decisions_total", "ratelimitd_connections"]
    );
    assert_eq!(q.selectors[0].labels, ["instance", "verdict", "source"]);
    let exact: Vec<_> = q.selectors[0]
        .exact
        .iter()
        .map(|(l, v)| format!("{l}={v}"))
        .collect();
    assert_eq!(exact, ["verdict=deny", "source=local", "source=fail_open"]);
    assert_eq!(q.by, ["rule", "source"]);
}
