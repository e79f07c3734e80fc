//! The Prometheus endpoint (`[metrics] listen`, the older name of `[http] listen`) of a real daemon, scraped over HTTP:
//! decisions by rule × verdict × source, error replies by code, Redis call latency and
//! errors, the circuit gauge and transitions, cache and local sizes, open connections,
//! reloads.

use crate::common;

use common::metric_value as value;
use common::*;
use std::time::Duration;

fn wait_for(port: u16, name: &str, labels: &[(&str, &str)], ok: impl Fn(f64) -> bool) -> String {
    let mut body = String::new();
    let found = wait_until(Duration::from_secs(5), || {
        body = scrape(port);
        value(&body, name, labels).is_some_and(&ok)
    });
    assert!(found, "{name} {labels:?} not as expected in:\n{body}");
    body
}

const RULES: &str = r#"
[[rule]]
name = "r1"
algorithm = "token_bucket"
capacity = 3
refill_rate = 0.001

[[rule]]
name = "w1"
algorithm = "fixed_window"
limit = 100
window = "1m"
"#;

#[test]
fn decisions_errors_and_sizes_in_local_mode() {
    let port = free_port();
    let d = Daemon::start(&format!(
        "[redis]\nmode = \"none\"\n[metrics]\nlisten = \"127.0.0.1:{port}\"\n{RULES}"
    ));
    let mut c = d.connect();
    let lines: Vec<String> = (0..5).map(|_| "CHECK r1 k".to_string()).collect();
    c.pipeline(&lines);
    c.request("CHECK nope k");
    c.request("CHECK w1 a");
    c.request("BOGUS");

    let body = scrape(port);
    let dec = |rule, verdict, source| {
        value(
            &body,
            "ratelimitd_decisions_total",
            &[("rule", rule), ("verdict", verdict), ("source", source)],
        )
    };
    assert_eq!(dec("r1", "allow", "local"), Some(3.0), "{body}");
    assert_eq!(dec("r1", "deny", "local"), Some(2.0), "{body}");
    assert_eq!(dec("w1", "allow", "local"), Some(1.0), "{body}");
    assert_eq!(
        value(&body, "ratelimitd_errors_total", &[("code", "RULE")]),
        Some(1.0)
    );
    assert_eq!(
        value(&body, "ratelimitd_errors_total", &[("code", "PROTO")]),
        Some(1.0)
    );
    // Sizes are sampled every second.
    wait_for(port, "ratelimitd_local_keys", &[], |v| v == 2.0);
    wait_for(port, "ratelimitd_connections", &[], |v| v == 1.0);
    drop(c);
    wait_for(port, "ratelimitd_connections", &[], |v| v == 0.0);

    // A reload is counted by result.
    d.signal(libc::SIGHUP);
    wait_for(port, "ratelimitd_reloads_total", &[("result", "ok")], |v| {
        v == 1.0
    });
    d.write_config("this is not toml");
    d.signal(libc::SIGHUP);
    wait_for(
        port,
        "ratelimitd_reloads_total",
        &[("result", "rejected")],
        |v| v == 1.0,
    );
}

#[test]
fn redis_latency_errors_and_circuit() {
    let mut redis = RedisStandalone::start();
    let port = free_port();
    let d = Daemon::start(&format!(
        "[redis]\nmode = \"standalone\"\nnodes = [\"{}\"]\ntimeout_ms = 25\n[cache]\nttl_ms = 60000\n[metrics]\nlisten = \"127.0.0.1:{port}\"\n{RULES}",
        redis.addr()
    ));
    let mut c = d.connect();
    for i in 0..10 {
        assert_eq!(
            parse_reply(&c.request(&format!("CHECK w1 k{i}"))).source,
            "redis"
        );
    }
    let body = scrape(port);
    assert_eq!(
        value(&body, "ratelimitd_circuit_open", &[]),
        Some(0.0),
        "{body}"
    );
    assert_eq!(
        value(&body, "ratelimitd_redis_call_seconds_count", &[]),
        Some(10.0),
        "{body}"
    );
    assert!(
        body.contains("ratelimitd_redis_call_seconds_bucket{le=\"0.025\"}"),
        "{body}"
    );
    assert_eq!(
        value(
            &body,
            "ratelimitd_decisions_total",
            &[("rule", "w1"), ("verdict", "allow"), ("source", "redis")]
        ),
        Some(10.0)
    );
    // A hot denied key is then answered by the cache.
    for _ in 0..6 {
        c.request("CHECK r1 hot");
    }
    let body = scrape(port);
    assert_eq!(
        value(
            &body,
            "ratelimitd_decisions_total",
            &[("rule", "r1"), ("verdict", "deny"), ("source", "cache")]
        ),
        Some(2.0),
        "{body}"
    );
    wait_for(port, "ratelimitd_cache_entries", &[], |v| v == 1.0);

    // Redis gone: an error by kind, the circuit opens, decisions go local.
    redis.kill();
    let r = c.request("CHECK w1 after");
    assert_eq!(parse_reply(&r).source, "local", "{r}");
    let body = wait_for(port, "ratelimitd_circuit_open", &[], |v| v == 1.0);
    assert_eq!(
        value(
            &body,
            "ratelimitd_circuit_transitions_total",
            &[("to", "open")]
        ),
        Some(1.0)
    );
    let errors: f64 = body
        .lines()
        .filter(|l| l.starts_with("ratelimitd_redis_errors_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(errors >= 1.0, "{body}");
    // And back.
    redis.restart();
    wait_for(port, "ratelimitd_circuit_open", &[], |v| v == 0.0);
}

/// Sends `request` on a new connection to the endpoint and reads until it is closed:
/// the whole answer and how long the endpoint took to close the connection.
fn exchange(port: u16, request: &[u8]) -> (String, Duration) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("metrics listener");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let start = std::time::Instant::now();
    s.write_all(request).unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out)
        .expect("the endpoint closes the connection");
    (String::from_utf8_lossy(&out).into_owned(), start.elapsed())
}

/// The value of header `name` (case-insensitive) in an HTTP answer's head.
fn header<'a>(answer: &'a str, name: &str) -> Option<&'a str> {
    let head = answer.split("\r\n\r\n").next()?;
    head.lines().skip(1).find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

#[test]
fn http_get_head_other_methods_and_oversized_heads() {
    let port = free_port();
    let _d = Daemon::start(&format!(
        "[redis]\nmode = \"none\"\n[metrics]\nlisten = \"127.0.0.1:{port}\"\n{RULES}"
    ));
    // GET /metrics: the metrics, then the connection is closed.
    {
        let path = "/metrics";
        let (a, _) = exchange(
            port,
            format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes(),
        );
        assert!(a.starts_with("HTTP/1.1 200 OK\r\n"), "{path}: {a}");
        assert_eq!(
            header(&a, "content-type"),
            Some("text/plain; version=0.0.4; charset=utf-8")
        );
        assert_eq!(header(&a, "connection"), Some("close"), "{a}");
        let body = a.split_once("\r\n\r\n").unwrap().1;
        assert_eq!(
            header(&a, "content-length"),
            Some(body.len().to_string().as_str())
        );
        assert!(body.contains("ratelimitd_circuit_open 0"), "{a}");
    }
    // `/` is the dashboard ([metrics] listen is the older name of [http] listen); an
    // unknown path, and the lab without `[http] lab = true`, are 404.
    let (a, _) = exchange(port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(a.starts_with("HTTP/1.1 200 OK\r\n"), "{a}");
    assert_eq!(header(&a, "content-type"), Some("text/html; charset=utf-8"));
    for path in ["/anything", "/lab"] {
        let (a, _) = exchange(
            port,
            format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes(),
        );
        assert!(a.starts_with("HTTP/1.1 404 "), "{path}: {a}");
    }
    // HEAD: the head alone.
    let (a, _) = exchange(port, b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(a.starts_with("HTTP/1.1 200 OK\r\n"), "{a}");
    assert_eq!(a.split_once("\r\n\r\n").unwrap().1, "", "{a}");
    // Another method: 405, no body.
    let (a, _) = exchange(
        port,
        b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
    );
    assert!(a.starts_with("HTTP/1.1 405 "), "{a}");
    assert_eq!(header(&a, "content-length"), Some("0"), "{a}");
    // A head over 8 KiB: 431, at once.
    let big = format!(
        "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Pad: {}\r\n\r\n",
        "a".repeat(9000)
    );
    let (a, took) = exchange(port, big.as_bytes());
    assert!(a.starts_with("HTTP/1.1 431 "), "{a}");
    assert!(took < Duration::from_secs(2), "{took:?}");
    // A request an HTTP/1.1 parser refuses: 400, closed.
    let (a, _) = exchange(port, b"NOT HTTP\r\n\r\n");
    assert!(a.starts_with("HTTP/1.1 400 "), "{a}");
}

#[test]
fn a_silent_scraper_holds_the_only_slot_for_the_request_timeout_at_most() {
    use std::io::{Read, Write};
    let port = free_port();
    let _d = Daemon::start(&format!(
        "[redis]\nmode = \"none\"\n[metrics]\nlisten = \"127.0.0.1:{port}\"\nmax_connections = 1\n{RULES}"
    ));
    scrape(port);
    // One client sends half a head and then nothing: it holds the only slot.
    let mut silent = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    silent
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let start = std::time::Instant::now();
    silent.write_all(b"GET /metrics HTTP/1.1\r\n").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    // A scraper behind it waits in the listen queue until the silent one is closed,
    // 5 s (REQUEST_TIMEOUT) after it was accepted.
    let (a, _) = exchange(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    let waited = start.elapsed();
    assert!(a.starts_with("HTTP/1.1 200"), "{a}");
    assert!(
        waited >= Duration::from_millis(4500) && waited < Duration::from_secs(8),
        "the second scraper was answered after {waited:?}"
    );
    let mut rest = Vec::new();
    let closed = silent.read_to_end(&mut rest);
    assert!(
        closed.is_ok(),
        "the silent connection was not closed: {closed:?}"
    );
    assert!(start.elapsed() < Duration::from_secs(8));
}
