//! Closed-loop load generator for one-reply-per-line protocols.
//!
//! Works for the ratelimitd line protocol and for Redis inline commands
//! (`PING\r\n` -> `+PONG\r\n`, `EVALSHA ...\r\n` -> `:1\r\n` or a one-line
//! error): every request must produce exactly one reply line.
//!
//! Each connection writes `--depth` requests in one `write`, reads until as many
//! reply lines (`\n`) have arrived, records the batch latency (write -> last
//! reply), and repeats. Batches that start during `--warmup` or finish after
//! the end of the measured window are not counted.
//!
//! ```text
//! cargo build --release -p ratelimitd-tools     # target/release/loadgen
//! target/release/loadgen --socket /tmp/redis.sock --conns 50 --depth 16 \
//!     --request 'PING\r\n' --expect +PONG --label redis-ping
//! target/release/loadgen --socket /run/rl.sock --request 'CHECK api k{n}\n' \
//!     --expect ALLOW
//! ```
//!
//! Output: one human-readable line, then one JSON line (starts with `{`), on
//! stdout. Exit status 1 if a connection failed or stalled, else 0 (replies not
//! matching `--expect` are only counted, in `errors`).
//!
//! The parts: the request template ([`template`]), the connections' loop ([`conn`]),
//! the reply lines' check ([`reply`]), the latency histogram ([`histogram`]) and the
//! output lines ([`output`]); here the command line, the run and the self-test.

#[path = "../common/mod.rs"]
mod common;
mod conn;
mod histogram;
mod output;
mod reply;
mod template;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use conn::{connect, run_conn, Conn, Shared};
use histogram::Histogram;
use output::Summary;
use reply::{count_newlines, LineCheck};
use template::{unescape, Template};

#[derive(Parser, Debug)]
#[command(
    name = "loadgen",
    about = "Closed-loop load generator for line protocols (Unix socket or TCP)"
)]
struct Args {
    /// Unix socket to connect to.
    #[arg(long, required_unless_present_any = ["tcp", "self_test"], conflicts_with = "tcp")]
    socket: Option<PathBuf>,
    /// TCP address (host:port) to connect to instead of a Unix socket.
    #[arg(long)]
    tcp: Option<String>,
    /// Number of concurrent connections.
    #[arg(long, default_value_t = 50)]
    conns: usize,
    /// Pipeline depth: requests written per batch on each connection.
    #[arg(long, default_value_t = 1)]
    depth: usize,
    /// Measured duration (5s, 500ms, 1.5s, 2m; a bare number is seconds).
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    duration: Duration,
    /// Warm-up before measuring (traffic is sent but not counted).
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    warmup: Duration,
    /// Stop once this many requests have been measured (rounded up to a whole
    /// batch per connection); the run also stops at --duration.
    #[arg(long)]
    max_requests: Option<u64>,
    /// Request template: bytes sent per request, ending in a newline. `\r`,
    /// `\n`, `\t`, `\\` are interpreted; `{ n }` (written without the spaces)
    /// becomes a counter unique across all connections.
    #[arg(long, default_value = "PING\\r\\n")]
    request: String,
    /// First value of the `{ n }` counter (use distinct ranges across runs to
    /// keep keys fresh).
    #[arg(long, default_value_t = 0)]
    n_start: u64,
    /// Draw `{ n }` uniformly from `0..KEYS` (a realistic key population: keys
    /// repeat) instead of counting up (a new key per request). Each request's value is
    /// a SplitMix64 hash of the counter, so runs are reproducible.
    #[arg(long)]
    keys: Option<u64>,
    /// Replace `{ n }` with line `n mod lines` of this file instead of `n` itself
    /// (e.g. keys chosen for their hash slots: tools/src/bin/same_slot_keys.rs).
    #[arg(long)]
    values: Option<PathBuf>,
    /// Zero-pad the counter to this many digits (fixed-length requests, e.g.
    /// RESP bulk strings whose `$<len>` must stay right).
    #[arg(long, default_value_t = 0)]
    n_width: usize,
    /// Lines per reply: 1 for line protocols and simple Redis replies (`+PONG`);
    /// e.g. 5 for a Redis script returning a 4-integer array (`*4`, `:1`, ...).
    #[arg(long, default_value_t = 1)]
    reply_lines: usize,
    /// Count replies whose first line does not start with this prefix as errors.
    #[arg(long)]
    expect: Option<String>,
    /// Check every reply line against `--expect` and `--expect-contains`, not only the
    /// first of each `--reply-lines` (a template of several requests, e.g. two pipelined
    /// `CHECK`s with `--reply-lines 2`).
    #[arg(long)]
    check_every_line: bool,
    /// Count replies whose first line does not contain this text as errors
    /// (e.g. " redis" to check the reply's source field).
    #[arg(long)]
    expect_contains: Option<String>,
    /// Tokio worker threads (1 = current-thread runtime).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Free text copied into the output.
    #[arg(long, default_value = "")]
    label: String,
    /// Passed by `cargo bench` (where this tool used to live); ignored.
    #[arg(long, hide = true)]
    bench: bool,
    /// Run the built-in unit checks and exit (as a run with no arguments does).
    #[arg(long, hide = true)]
    self_test: bool,
}

/// Parse `500ms`, `5s`, `1.5s`, `2m`, `250us`, or a bare number of seconds.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let v: f64 = num
        .parse()
        .map_err(|_| format!("bad duration {s:?} (e.g. 5s, 500ms, 2m)"))?;
    let secs = match unit.trim() {
        "" | "s" | "sec" | "secs" => v,
        "ms" => v / 1e3,
        "us" | "µs" => v / 1e6,
        "m" | "min" | "mins" => v * 60.0,
        "h" => v * 3600.0,
        u => {
            return Err(format!(
                "bad duration unit {u:?} in {s:?} (use us, ms, s, m, h)"
            ))
        }
    };
    Duration::try_from_secs_f64(secs).map_err(|e| format!("bad duration {s:?}: {e}"))
}

async fn run(args: Args) -> Result<bool, String> {
    let mut template = Template::parse(&args.request, args.n_width)?;
    if let Some(path) = &args.values {
        let text = std::fs::read(path).map_err(|e| format!("--values {}: {e}", path.display()))?;
        template.values = text
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .map(<[u8]>::to_vec)
            .collect();
        if template.values.is_empty() {
            return Err(format!("--values {}: no lines", path.display()));
        }
    }
    let target = match (&args.tcp, &args.socket) {
        (Some(t), _) => format!("tcp:{t}"),
        (None, Some(p)) => format!("unix:{}", p.display()),
        (None, None) => unreachable!("clap requires one"),
    };

    // Connect everything before the clock starts.
    let mut conns = Vec::with_capacity(args.conns);
    for i in 0..args.conns {
        let c = connect(&args)
            .await
            .map_err(|e| format!("connect {target} (connection {}): {e}", i + 1))?;
        conns.push(c);
    }

    let start = Instant::now();
    let measure_start = start + args.warmup;
    let end = measure_start + args.duration;
    let sh = Arc::new(Shared {
        template,
        depth: args.depth,
        reply_lines: args.reply_lines,
        measure_start,
        end,
        max_requests: args.max_requests,
        counter: AtomicU64::new(args.n_start),
        keys: args.keys.filter(|&k| k > 0),
        reserved: AtomicU64::new(0),
        expect: match (&args.expect, &args.expect_contains) {
            (None, None) => None,
            (p, c) => Some((
                p.as_deref().map(unescape).unwrap_or_default(),
                c.as_deref().map(unescape).unwrap_or_default(),
            )),
        },
        every: args.check_every_line,
    });

    let handles: Vec<_> = conns
        .into_iter()
        .map(|c| {
            let sh = sh.clone();
            match c {
                Conn::Unix(s) => tokio::spawn(run_conn(s, sh)),
                Conn::Tcp(s) => tokio::spawn(run_conn(s, sh)),
            }
        })
        .collect();

    // A connection whose server stops answering would block forever.
    let grace = tokio::time::Instant::from_std(end + Duration::from_secs(5));
    let mut sum = Summary {
        args: &args,
        target,
        hist: Histogram::new(),
        requests: 0,
        seconds: 0.0,
        errors: 0,
        first_bad: None,
        extra_lines: 0,
        io_errors: 0,
        first_io_error: None,
    };
    let mut last_finish: Option<Instant> = None;
    for mut h in handles {
        let r = match tokio::time::timeout_at(grace, &mut h).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                sum.io_errors += 1;
                sum.first_io_error
                    .get_or_insert(format!("task failed: {e}"));
                continue;
            }
            Err(_) => {
                h.abort();
                sum.io_errors += 1;
                sum.first_io_error
                    .get_or_insert("stalled: no reply 5 s after the end of the run".into());
                continue;
            }
        };
        sum.hist.merge(&r.hist);
        sum.requests += r.requests;
        sum.errors += r.errors;
        sum.extra_lines += r.extra_lines;
        if sum.first_bad.is_none() {
            sum.first_bad = r
                .first_bad
                .map(|b| String::from_utf8_lossy(&b).into_owned());
        }
        if let Some(e) = r.io_error {
            sum.io_errors += 1;
            sum.first_io_error.get_or_insert(e);
        }
        if let Some(t) = r.last_finish {
            last_finish = Some(last_finish.map_or(t, |l| l.max(t)));
        }
    }

    let hit_max = args
        .max_requests
        .is_some_and(|m| sh.reserved.load(Ordering::Relaxed) >= m);
    sum.seconds = match (hit_max || sum.io_errors > 0, last_finish) {
        // Stopped early: measure up to the last completed batch.
        (true, Some(t)) => t.saturating_duration_since(measure_start).as_secs_f64(),
        _ => args.duration.as_secs_f64(),
    };
    let ok = sum.io_errors == 0;
    sum.print();
    Ok(ok)
}

fn main() {
    // With no arguments: the self-test (also a #[test] below, for `cargo test`).
    if std::env::args().len() == 1 {
        self_test();
        println!("loadgen self-test ok");
        return;
    }
    let args = Args::parse();
    if args.self_test {
        self_test();
        println!("loadgen self-test ok");
        return;
    }
    if args.conns == 0 || args.depth == 0 || args.threads == 0 || args.reply_lines == 0 {
        eprintln!("loadgen: --conns, --depth, --threads and --reply-lines must be at least 1");
        std::process::exit(2);
    }
    let rt = common::runtime(args.threads);
    match rt.block_on(run(args)) {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("loadgen: {e}");
            std::process::exit(1);
        }
    }
}

/// Unit checks, run with `--self-test`, with no arguments, or by `cargo test`.
fn self_test() {
    {
        let t = Template::parse("CHECK api k{n} {n}\\n", 0).unwrap();
        let mut b = Vec::new();
        let mut num = itoa::Buffer::new();
        t.expand_into(&mut b, 42, &mut num);
        assert_eq!(b, b"CHECK api k42 42\n");
        let t = Template::parse("$5\\r\\n{n}\\r\\n", 5).unwrap();
        b.clear();
        t.expand_into(&mut b, 42, &mut num);
        assert_eq!(b, b"$5\r\n00042\r\n");
        let mut t = Template::parse("CHECK api {n}\\n", 0).unwrap();
        t.values = vec![b"a".to_vec(), b"bc".to_vec()];
        b.clear();
        t.expand_into(&mut b, 3, &mut num);
        assert_eq!(b, b"CHECK api bc\n");
        assert!(Template::parse("PING", 0).is_err());
        assert!(!Template::parse("PING\\r\\n", 0).unwrap().has_counter());
    }
    {
        for v in [0u64, 1, 127, 128, 129, 1000, 12_345, 1 << 40, u64::MAX / 3] {
            let m = Histogram::value_at(Histogram::index(v));
            let err = (m as f64 - v as f64).abs() / (v.max(1) as f64);
            assert!(err <= 1.0 / 128.0, "v={v} m={m}");
        }
        let mut h = Histogram::new();
        for v in 1..=1000u64 {
            h.record(v * 1000);
        }
        let p50 = h.quantile(0.5) as f64;
        assert!((p50 - 500_000.0).abs() / 500_000.0 < 0.01, "{p50}");
        assert_eq!(h.quantile(1.0), 1_000_000);
    }
    {
        let mut c = LineCheck::new(b"+PONG".to_vec(), Vec::new(), 1, false);
        assert_eq!(c.feed(b"+PO"), 0);
        assert_eq!(c.feed(b"NG\r\n+PONG\r\n-ERR x"), 2);
        assert_eq!(c.feed(b"\r\n"), 1);
        assert_eq!(c.errors, 1);
        assert_eq!(c.first_bad.as_deref(), Some(&b"-ERR x"[..]));
        assert_eq!(count_newlines(b"a\nb\n\n"), 3);
        let mut c = LineCheck::new(b"*4".to_vec(), Vec::new(), 3, false);
        assert_eq!(c.feed(b"*4\r\n:1\r\n:2\r\n*4\r\n:1\r\n"), 5);
        assert_eq!(c.feed(b":2\r\n-ERR no\r\n"), 2);
        assert_eq!(c.errors, 1);
        assert_eq!(c.first_bad.as_deref(), Some(&b"-ERR no"[..]));
        let mut c = LineCheck::new(b"ALLOW".to_vec(), Vec::new(), 2, true);
        assert_eq!(c.feed(b"ALLOW 1\nDENY 1\nALLOW 1\nALLOW 1\n"), 4);
        assert_eq!(c.errors, 1);
        let mut c = LineCheck::new(b"DENY".to_vec(), b" cache".to_vec(), 1, false);
        assert_eq!(
            c.feed(b"DENY 1 0 5 5 cache\nDENY 1 0 5 5 redis\nALLOW 1 0 5 0 cache\n"),
            3
        );
        assert_eq!(c.errors, 2);
    }
    {
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("5x").is_err());
        assert!(parse_duration("s").is_err());
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn self_test() {
        super::self_test();
    }
}
