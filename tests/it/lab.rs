//! The rule lab (`[http] lab = true`) of a real daemon over a real Redis Cluster: a run
//! is decided in Redis, through the daemon's own scripts, under `<prefix>:lab:` only, and
//! every decision streams back; the admitted counts are bounded from the rule on both
//! sides. (The pages themselves are tested in a browser: tests/browser/.)

use crate::common;

use common::*;
use std::io::{Read, Write};
use std::time::Duration;

/// The whole answer to `GET path` (the lab's stream ends with its run).
fn get(port: u16, path: &str) -> String {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("http listener");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out)
        .expect("the stream ends with the run");
    String::from_utf8_lossy(&out).into_owned()
}

#[test]
fn a_lab_run_is_decided_in_redis_under_the_lab_prefix_and_streams_every_decision() {
    let cluster = RedisCluster::start();
    let port = free_port();
    let _d = Daemon::start(&format!(
        "[redis]\nmode = \"cluster\"\nnodes = {}\nprefix = \"rl\"\n[http]\nlisten = {port}\nlab = true\n\
         [[rule]]\nname = \"configured\"\nalgorithm = \"token_bucket\"\ncapacity = 5\nrefill_rate = 1.0\n",
        toml_str_array(&cluster.addrs())
    ));
    // 4 clients, steady 20/s each for 2 s, against capacity c = 10, refill R = 5/s.
    let (c, r, clients, rate, seconds) = (10.0, 5.0, 4usize, 20.0, 2.0);
    let text = get(
        port,
        "/lab/events?algorithm=token_bucket&capacity=10&refill_rate=5&profile=steady&rate=20&seconds=2&clients=4",
    );
    let keys = cluster.all_keys();
    assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
    let mut rows = Vec::new();
    for line in text.lines() {
        if let Some(json) = line.strip_prefix("data: [") {
            let batch: Vec<serde_json::Value> = serde_json::from_str(&format!("[{json}")).unwrap();
            rows.extend(batch);
        }
    }
    let arrivals = (rate * seconds) as usize * clients;
    assert_eq!(rows.len(), arrivals, "every decision streamed");
    assert!(text.contains(&format!("\"decided\":{arrivals}")), "{text}");
    let mut sources = std::collections::BTreeMap::<String, usize>::new();
    for client in 0..clients {
        let mine: Vec<&serde_json::Value> = rows.iter().filter(|r| r[1] == client).collect();
        let first = mine.first().unwrap()[0].as_f64().unwrap();
        let last = mine.last().unwrap()[0].as_f64().unwrap();
        let span_s = (last - first) / 1000.0;
        let allowed = mine.iter().filter(|r| r[2] == 1).count() as f64;
        for row in &mine {
            *sources
                .entry(row[5].as_str().unwrap().to_owned())
                .or_default() += 1;
        }
        // At most the burst plus the refill over the arrivals' span (plus one for the
        // decisions' own spread); at least the burst plus most of that refill.
        let most = c + r * (span_s + 0.2) + 1.0;
        let least = c + r * span_s - 3.0;
        println!("client c{client}: {allowed} of {} allowed over {span_s:.2} s (bounds {least:.1}..{most:.1})", mine.len());
        assert!(
            allowed <= most && allowed >= least,
            "c{client}: {allowed} not in {least}..{most}"
        );
    }
    println!("sources: {sources:?}");
    assert!(
        sources.get("redis").copied().unwrap_or(0) >= clients * 10,
        "{sources:?}"
    );
    let run: Vec<&String> = keys.iter().filter(|k| k.contains("{run")).collect();
    println!("lab keys: {run:?}");
    assert_eq!(run.len(), clients, "one key per client: {keys:?}");
    assert!(run.iter().all(|k| k.starts_with("rl:lab:{run")), "{keys:?}");
    assert!(!keys.iter().any(|k| k.contains("configured")), "{keys:?}");
}

#[test]
fn a_dashboard_stream_outlives_the_request_timeout_and_leaves_a_slot_for_scrapes() {
    let port = free_port();
    let _d = Daemon::start(&format!(
        "[redis]\nmode = \"none\"\n[http]\nlisten = {port}\nmax_connections = 2\n\
         [[rule]]\nname = \"r\"\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = \"1s\"\n"
    ));
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    write!(stream, "GET /events HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    // Two connections, so one stream at most: a second one is refused at once, and a
    // scrape still finds the other slot.
    std::thread::sleep(Duration::from_millis(300));
    let second = get(port, "/events");
    assert!(second.starts_with("HTTP/1.1 503 "), "{second}");
    assert!(get(port, "/metrics").starts_with("HTTP/1.1 200 OK"));
    // The stream goes on past the 5 s a request gets: one event a second.
    let start = std::time::Instant::now();
    let mut text = Vec::new();
    let mut buf = [0u8; 4096];
    while start.elapsed() < Duration::from_millis(7500) {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => text.extend_from_slice(&buf[..n]),
            Err(e) => panic!("the stream stopped after {:?}: {e}", start.elapsed()),
        }
    }
    let text = String::from_utf8_lossy(&text);
    let events = text.matches("data: {").count();
    println!("{events} events in {:?}", start.elapsed());
    assert!(text.contains("content-type: text/event-stream"), "{text}");
    // One a second from the stream's start, 0.3 s before the 7.5 s read (a late tick is
    // sent when it comes: a few more at most).
    assert!(
        (5..=12).contains(&events),
        "{events} events in 7.5 s: {text}"
    );
    assert!(text.contains("\"name\":\"r\""), "{text}");
}

#[test]
fn a_listen_address_off_loopback_is_warned_about_and_both_names_at_once_are_refused() {
    let port = free_port();
    let d = Daemon::start(&format!(
        "[redis]\nmode = \"none\"\n[http]\nlisten = \"0.0.0.0:{port}\"\nlab = true\n\
         [[rule]]\nname = \"r\"\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = \"1s\"\n"
    ));
    assert!(
        wait_until(Duration::from_secs(5), || d
            .log()
            .contains("http.listen is not a loopback address")),
        "{}",
        d.log_tail(20)
    );
    assert!(
        d.log().contains("dashboard, lab) has no authentication"),
        "{}",
        d.log_tail(20)
    );
    let (status, out) = Daemon::run_to_exit(
        &format!(
            "[redis]\nmode = \"none\"\n[http]\nlisten = {}\n[metrics]\nlisten = {}\n",
            free_port(),
            free_port()
        ),
        Duration::from_secs(10),
    );
    assert!(!status.success(), "{out}");
    assert!(
        out.contains("metrics.listen") && out.contains("[http] listen"),
        "{out}"
    );
}

/// The decision rows of a lab stream.
fn rows_of(text: &str) -> Vec<serde_json::Value> {
    let mut rows = Vec::new();
    for line in text.lines() {
        if let Some(json) = line.strip_prefix("data: [") {
            let batch: Vec<serde_json::Value> = serde_json::from_str(&format!("[{json}")).unwrap();
            rows.extend(batch);
        }
    }
    rows
}

/// The lab's concurrency keys (`…:cc`) still in the cluster: a key whose slots were all
/// given back is gone (Redis drops an empty sorted set).
fn slot_keys(cluster: &RedisCluster) -> Vec<String> {
    cluster
        .all_keys()
        .into_iter()
        .filter(|k| k.starts_with("rl:lab:") && k.ends_with(":cc"))
        .collect()
}

#[test]
fn a_lab_concurrency_run_holds_each_slot_for_its_hold_time_and_gives_every_slot_back() {
    let cluster = RedisCluster::start();
    let port = free_port();
    let _d = Daemon::start(&format!(
        "[redis]\nmode = \"cluster\"\nnodes = {}\nprefix = \"rl\"\n[http]\nlisten = {port}\nlab = true\n",
        toml_str_array(&cluster.addrs())
    ));
    // 2 clients, steady 40/s each for 3 s, each request holding its slot h = 0.2 s,
    // against limit L = 3: offered concurrency 40 × 0.2 = 8 per key, so the accepted
    // rate is about L ÷ h = 15/s per key.
    let (limit, hold_s, clients, rate, seconds) = (3.0, 0.2, 2usize, 40.0, 3.0);
    let text = get(
        port,
        "/lab/events?algorithm=concurrency&limit=3&max_hold=30s&hold_ms=200&profile=steady&rate=40&seconds=3&clients=2",
    );
    assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
    assert!(text.contains("\"hold_ms\":200"), "{text}");
    let rows = rows_of(&text);
    let arrivals = (rate * seconds) as usize * clients;
    assert_eq!(rows.len(), arrivals, "every decision streamed: {text}");
    let mut total_allowed = 0;
    for client in 0..clients {
        let mine: Vec<&serde_json::Value> = rows.iter().filter(|r| r[1] == client).collect();
        let first = mine.first().unwrap()[0].as_f64().unwrap();
        let last = mine.last().unwrap()[0].as_f64().unwrap();
        let span_s = (last - first) / 1000.0;
        let allowed = mine.iter().filter(|r| r[2] == 1).count() as f64;
        total_allowed += allowed as usize;
        assert!(
            mine.iter()
                .all(|r| r[3].as_f64().unwrap() <= limit && r[4] == 3 && r[5] == "redis"),
            "remaining within the limit, decided in Redis: {mine:?}"
        );
        // Each slot is held at least h from its ALLOW, so it serves at most span ÷ h + 1
        // requests; and it is free again within h plus a release's round trip and the
        // next arrival (0.1 s allowed for both), so it serves at least
        // span ÷ (h + 0.1) − 1.
        let most = limit * (span_s / hold_s + 1.0);
        let least = limit * (span_s / (hold_s + 0.1) - 1.0);
        println!(
            "client c{client}: {allowed} of {} allowed over {span_s:.2} s (bounds {least:.1}..{most:.1})",
            mine.len()
        );
        assert!(
            allowed <= most && allowed >= least,
            "c{client}: {allowed} not in {least}..{most}"
        );
    }
    assert!(
        text.contains(&format!("\"lapsed\":0,\"released\":{total_allowed}")),
        "every slot released by its RELEASE: {text}"
    );
    assert_eq!(
        slot_keys(&cluster),
        Vec::<String>::new(),
        "no slot left held"
    );

    // A run the page leaves early: its slots (each held 8 s, and renewed for 10 s, far
    // longer than the wait below) are given back when the run stops.
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET /lab/events?algorithm=concurrency&limit=5&max_hold=30s&hold_ms=8000&rate=10&seconds=10&clients=2 HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    .unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("data: [") {
        let n = s.read(&mut buf).expect("the run's first decisions");
        assert!(n > 0, "{}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    assert!(
        wait_until(Duration::from_secs(3), || !slot_keys(&cluster).is_empty()),
        "the run holds slots"
    );
    drop(s);
    let gone = wait_until(Duration::from_secs(4), || slot_keys(&cluster).is_empty());
    assert!(
        gone,
        "slots still held 4 s after the page left: {:?}",
        slot_keys(&cluster)
    );
}
