//! The operating artefacts against the daemon they watch: the Grafana dashboard
//! (`conf/grafana/ratelimitd.json`) keeps to the panel JSON Grafana imports, and every
//! series a panel or an alert rule (`conf/prometheus/ratelimitd-rules.yml`) queries is
//! exported by a live daemon deciding in a real Redis Cluster, with the labels the query
//! matches or groups by and the label values it matches exactly. A dashboard whose
//! queries name a series the daemon does not export shows "No data" and never says
//! why; an alert on such a series never fires.

mod promql;

use crate::common;

use common::*;
use promql::{parse_query, problems, scraped, Query};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn repo_file(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo_file(rel)).unwrap_or_else(|e| panic!("reading {rel}: {e}"))
}

const DASHBOARD: &str = "conf/grafana/ratelimitd.json";
const RULES: &str = "conf/prometheus/ratelimitd-rules.yml";

/// The dashboard's panels, rows' nested panels included.
fn panels(dash: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for p in dash["panels"]
        .as_array()
        .expect("dashboard.panels is an array")
    {
        out.push(p);
        if let Some(inner) = p.get("panels").and_then(Value::as_array) {
            out.extend(inner);
        }
    }
    out
}

/// Every query of the dashboard: the panels' targets and the query variables.
fn dashboard_queries(dash: &Value) -> Vec<(String, Query)> {
    let mut out = Vec::new();
    for p in panels(dash) {
        for t in p["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"]
                .as_str()
                .unwrap_or_else(|| panic!("panel {:?}: a target without expr", p["title"]));
            out.push((format!("panel {}", p["title"]), parse_query(expr)));
        }
    }
    for v in dash["templating"]["list"]
        .as_array()
        .expect("templating.list")
    {
        if v["type"] == "query" {
            let q = v["query"]["query"]
                .as_str()
                .or(v["query"].as_str())
                .expect("a query variable's query");
            out.push((format!("variable {}", v["name"]), parse_query(q)));
        }
    }
    out
}

/// Every `expr` of the alert (and recording) rules file.
fn rule_queries() -> Vec<(String, Query)> {
    let docs = yaml_rust2::YamlLoader::load_from_str(&read(RULES)).expect("the rules file is YAML");
    let mut out = Vec::new();
    for group in docs[0]["groups"].as_vec().expect("groups") {
        for rule in group["rules"].as_vec().expect("rules") {
            let name = rule["alert"]
                .as_str()
                .or(rule["record"].as_str())
                .expect("alert or record");
            let expr = rule["expr"].as_str().expect("expr");
            out.push((format!("rule {name}"), parse_query(expr)));
        }
    }
    out
}

fn load_dashboard() -> Value {
    serde_json::from_str(&read(DASHBOARD)).expect("the dashboard is JSON")
}

/// What Grafana (10 and 11) imports without a conversion step or a question: schema
/// version 39 or near it, a Prometheus data source chosen by a variable (so the
/// dashboard names no data source of anyone's installation), no link leaving the
/// dashboard, ids unique, panels on the 24-column grid, every panel with a query.
#[test]
fn the_dashboard_keeps_to_the_panel_json_grafana_imports() {
    let text = read(DASHBOARD);
    let dash = load_dashboard();
    let schema = dash["schemaVersion"].as_u64().expect("schemaVersion");
    assert!((36..=41).contains(&schema), "schemaVersion {schema}");
    assert!(dash["uid"]
        .as_str()
        .is_some_and(|u| !u.is_empty() && u.len() <= 40));
    assert!(dash["title"].as_str().is_some_and(|t| !t.is_empty()));
    assert!(
        !text.contains("http://") && !text.contains("https://"),
        "no external links"
    );
    assert_eq!(dash["links"], Value::Array(vec![]), "no dashboard links");
    assert!(
        dash.get("__inputs").is_none(),
        "no import-time inputs: the data source is a variable"
    );

    let vars = dash["templating"]["list"]
        .as_array()
        .expect("templating.list");
    let ds = vars
        .iter()
        .find(|v| v["type"] == "datasource")
        .expect("a data source variable");
    assert_eq!(ds["query"], "prometheus");
    let ds_ref = serde_json::json!({"type": "prometheus", "uid": format!("${{{}}}", ds["name"].as_str().unwrap())});
    for v in vars.iter().filter(|v| v["type"] == "query") {
        assert_eq!(v["datasource"], ds_ref, "variable {}", v["name"]);
    }

    let mut ids = BTreeSet::new();
    for p in panels(&dash) {
        let title = &p["title"];
        assert!(
            ids.insert(p["id"].as_u64().expect("a panel id")),
            "panel id repeated: {title}"
        );
        let g = &p["gridPos"];
        let (x, w, h) = (
            g["x"].as_u64().unwrap(),
            g["w"].as_u64().unwrap(),
            g["h"].as_u64().unwrap(),
        );
        assert!(
            x + w <= 24 && w > 0 && h > 0 && g["y"].is_u64(),
            "panel {title}: gridPos {g}"
        );
        if p["type"] == "row" {
            continue;
        }
        assert!(p["title"].as_str().is_some_and(|t| !t.is_empty()));
        assert!(
            [
                "timeseries",
                "state-timeline",
                "stat",
                "table",
                "gauge",
                "bargauge"
            ]
            .contains(&p["type"].as_str().unwrap()),
            "panel {title}: type {}",
            p["type"]
        );
        assert_eq!(p["datasource"], ds_ref, "panel {title}");
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "panel {title} has no query");
        let mut ref_ids = BTreeSet::new();
        for t in targets {
            assert_eq!(t["datasource"], ds_ref, "panel {title}");
            assert!(
                ref_ids.insert(t["refId"].as_str().expect("refId")),
                "panel {title}: refId repeated"
            );
            assert!(
                t["expr"].as_str().is_some_and(|e| !e.trim().is_empty()),
                "panel {title}: empty expr"
            );
        }
    }

    // The subjects the dashboard is for, each in some panel's query.
    let used: BTreeSet<String> = dashboard_queries(&dash)
        .iter()
        .flat_map(|(_, q)| q.selectors.iter().map(|s| s.name.clone()))
        .collect();
    for name in [
        "ratelimitd_decisions_total",
        "ratelimitd_redis_call_seconds_bucket",
        "ratelimitd_primary_up",
        "ratelimitd_lease_units_out",
        "ratelimitd_connections",
    ] {
        assert!(used.contains(name), "no panel queries {name}");
    }
    for needle in [
        "verdict=\"deny\"",
        "verdict=\"shadow_deny\"",
        "source=~\"local|fail_open|fail_closed\"",
    ] {
        assert!(
            text.contains(&needle.replace('"', "\\\"")),
            "no panel selects {needle}"
        );
    }
}

/// How long a primary stays frozen at most, waiting for the daemon to bypass it: the
/// breaker opens on failures that span `redis.timeout_ms`, not counting those the
/// daemon's own lateness caused (a busy machine), so allow for many of the latter.
const FREEZE: Duration = Duration::from_secs(20);

/// The value of the first series `name` of `body` with `label` (any, if `None`).
fn value(body: &str, name: &str, label: Option<(&str, &str)>) -> Option<f64> {
    metric_value(body, name, label.as_slice())
}

/// A daemon on a real Redis Cluster, driven through what the dashboard and the alerts
/// show: decisions allowed, denied and shadow-denied; an error reply; a reload accepted
/// and one rejected; a primary frozen until the daemon bypasses it, then resumed until
/// it is used again (per-primary health, transitions, Redis errors, the fallback's
/// decisions). Then every series, label and exactly matched value that a panel or an
/// alert queries must be in the scrape.
#[test]
fn every_series_the_dashboard_and_the_alerts_query_is_exported() {
    // No failover while a primary is frozen (at most FREEZE): the daemon must bypass it.
    let cluster = RedisCluster::start_with_node_timeout(60_000);
    let port = free_port();
    let config = format!(
        r#"
[server]
max_connections = 64

[redis]
mode = "cluster"
nodes = {}
timeout_ms = 25

[metrics]
listen = "127.0.0.1:{port}"

[[rule]]
name = "tb"
algorithm = "token_bucket"
capacity = 2
refill_rate = 0.001

[[rule]]
name = "shadowed"
algorithm = "fixed_window"
limit = 1
window = "1h"
shadow = true
"#,
        toml_str_array(&cluster.primary_addrs())
    );
    let d = Daemon::start(&config);
    let mut c = d.connect();
    // 30 keys over the three primaries, each allowed twice then denied.
    let lines: Vec<String> = (0..90).map(|i| format!("CHECK tb k{}", i % 30)).collect();
    let replies = c.pipeline(&lines);
    assert!(replies.iter().any(|r| r.starts_with("DENY")), "{replies:?}");
    // Limit 1: the second and third would be DENY; a shadow rule answers ALLOW.
    for _ in 0..3 {
        let r = parse_reply(&c.request("CHECK shadowed s"));
        assert!(r.allowed(), "a shadow rule answers ALLOW");
    }
    assert!(c.request("BOGUS").starts_with("ERR PROTO"));

    // A reload accepted, then one rejected (the old configuration stays).
    d.signal(libc::SIGHUP);
    let mut body = String::new();
    assert!(
        wait_until(Duration::from_secs(10), || {
            body = scrape(port);
            body.contains("ratelimitd_reloads_total{result=\"ok\"}")
        }),
        "no accepted reload counted:\n{body}"
    );
    d.write_config("[redis]\nmode = \"no such mode\"\n");
    d.signal(libc::SIGHUP);
    assert!(
        wait_until(Duration::from_secs(10), || {
            body = scrape(port);
            body.contains("ratelimitd_reloads_total{result=\"rejected\"}")
        }),
        "no rejected reload counted:\n{body}"
    );
    d.write_config(&config);

    // One primary frozen until the daemon bypasses it: requests for keys over all three
    // primaries (bounded: at most FREEZE of them), each answered within redis.timeout_ms
    // plus a little.
    let primary = cluster.primary_addrs()[0].clone();
    {
        let _frozen = cluster.freeze(&primary);
        let mut n = 0u32;
        let bypassed = wait_until(FREEZE, || {
            for _ in 0..30 {
                n += 1;
                c.request(&format!("CHECK tb f{n}"));
            }
            body = scrape(port);
            value(
                &body,
                "ratelimitd_circuit_transitions_total",
                Some(("to", "open")),
            )
            .is_some()
                && value(&body, "ratelimitd_primary_up", Some(("primary", &primary))) == Some(0.0)
        });
        assert!(
            bypassed,
            "{primary} frozen but not bypassed:\n{body}\n{}",
            d.log_tail(30)
        );
    }
    // Resumed: its prober brings it back within a second or so.
    let back = wait_until(Duration::from_secs(10), || {
        c.request("CHECK tb back");
        body = scrape(port);
        value(&body, "ratelimitd_circuit_open", None) == Some(0.0)
            && value(&body, "ratelimitd_primary_up", Some(("primary", &primary))) == Some(1.0)
    });
    assert!(
        back,
        "{primary} resumed but still bypassed:\n{body}\n{}",
        d.log_tail(30)
    );
    // The sizes (leases, cache, local keys) are sampled once a second.
    std::thread::sleep(Duration::from_millis(1100));
    let body = scrape(port);
    let s = scraped(&body);
    let shadow_denied: f64 = body
        .lines()
        .filter(|l| {
            l.starts_with("ratelimitd_decisions_total{")
                && l.contains("rule=\"shadowed\"")
                && l.contains("verdict=\"shadow_deny\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(
        shadow_denied, 2.0,
        "the shadow rule's would-be DENYs:\n{body}"
    );
    assert_eq!(
        value(&body, "ratelimitd_connections_max", None),
        Some(64.0),
        "server.max_connections, for the connections alert"
    );

    let dash = load_dashboard();
    let mut all = dashboard_queries(&dash);
    all.extend(rule_queries());
    assert!(all.len() > 10, "queries found: {}", all.len());
    let wrong: Vec<String> = all
        .iter()
        .flat_map(|(what, q)| problems(what, q, &s))
        .collect();
    assert!(wrong.is_empty(), "{}\n\nscrape:\n{body}", wrong.join("\n"));
}
