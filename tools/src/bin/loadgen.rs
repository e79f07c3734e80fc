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

mod common;

use std::io::{self, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use common::splitmix64;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};

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

// ---------------------------------------------------------------------------
// Request template

/// Interpret `\r`, `\n`, `\t`, `\\` escapes.
fn unescape(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 1 < b.len() {
            let c = match b[i + 1] {
                b'r' => Some(b'\r'),
                b'n' => Some(b'\n'),
                b't' => Some(b'\t'),
                b'\\' => Some(b'\\'),
                _ => None,
            };
            if let Some(c) = c {
                out.push(c);
                i += 2;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    out
}

/// A request template split on `{n}`: `parts[0] n parts[1] n ... parts[k]`.
struct Template {
    parts: Vec<Vec<u8>>,
    /// Minimum digits of `n` (zero-padded).
    width: usize,
    /// What `{n}` stands for, by `n mod len` (`--values`); empty: `n` itself.
    values: Vec<Vec<u8>>,
}

impl Template {
    fn parse(s: &str, width: usize) -> Result<Self, String> {
        let bytes = unescape(s);
        if bytes.last() != Some(&b'\n') {
            return Err("--request must end with a newline: write it as '\\n' or '\\r\\n'".into());
        }
        let mut parts = Vec::new();
        let mut rest: &[u8] = &bytes;
        while let Some(pos) = rest.windows(3).position(|w| w == b"{n}") {
            parts.push(rest[..pos].to_vec());
            rest = &rest[pos + 3..];
        }
        parts.push(rest.to_vec());
        Ok(Template {
            parts,
            width,
            values: Vec::new(),
        })
    }

    fn has_counter(&self) -> bool {
        self.parts.len() > 1
    }

    /// Append one request with counter value `n` to `buf`.
    #[inline]
    fn expand_into(&self, buf: &mut Vec<u8>, n: u64, num: &mut itoa::Buffer) {
        let (last, init) = self.parts.split_last().expect("at least one part");
        if init.is_empty() {
            buf.extend_from_slice(last);
            return;
        }
        let digits = match self.values.len() {
            0 => num.format(n).as_bytes(),
            len => &self.values[(n % len as u64) as usize],
        };
        let pad = self.width.saturating_sub(digits.len());
        for p in init {
            buf.extend_from_slice(p);
            buf.resize(buf.len() + pad, b'0');
            buf.extend_from_slice(digits);
        }
        buf.extend_from_slice(last);
    }
}

// ---------------------------------------------------------------------------
// Latency histogram: log-linear buckets over nanoseconds, 2^SUB_BITS
// sub-buckets per power of two (relative error < 1/128).

const SUB_BITS: u32 = 7;
const SUB: u64 = 1 << SUB_BITS;
const BUCKETS: usize = ((64 - SUB_BITS as usize) + 1) * SUB as usize;

struct Histogram {
    counts: Vec<u64>,
    total: u64,
    sum_ns: u128,
    max_ns: u64,
    min_ns: u64,
}

impl Histogram {
    fn new() -> Self {
        Histogram {
            counts: vec![0; BUCKETS],
            total: 0,
            sum_ns: 0,
            max_ns: 0,
            min_ns: u64::MAX,
        }
    }

    #[inline]
    fn index(v: u64) -> usize {
        if v < SUB {
            return v as usize;
        }
        let e = 63 - v.leading_zeros(); // >= SUB_BITS
        let shift = e - SUB_BITS;
        ((shift as u64 + 1) * SUB + ((v >> shift) - SUB)) as usize
    }

    /// Midpoint of the bucket at `idx`.
    fn value_at(idx: usize) -> u64 {
        let idx = idx as u64;
        if idx < SUB {
            return idx;
        }
        let shift = idx / SUB - 1;
        let lo = (SUB + idx % SUB) << shift;
        lo + ((1u64 << shift) >> 1)
    }

    #[inline]
    fn record(&mut self, ns: u64) {
        self.counts[Self::index(ns)] += 1;
        self.total += 1;
        self.sum_ns += ns as u128;
        self.max_ns = self.max_ns.max(ns);
        self.min_ns = self.min_ns.min(ns);
    }

    fn merge(&mut self, o: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&o.counts) {
            *a += *b;
        }
        self.total += o.total;
        self.sum_ns += o.sum_ns;
        self.max_ns = self.max_ns.max(o.max_ns);
        self.min_ns = self.min_ns.min(o.min_ns);
    }

    /// Value at quantile `q` in nanoseconds (0 if empty).
    fn quantile(&self, q: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let rank = ((q * self.total as f64).ceil() as u64).clamp(1, self.total);
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Self::value_at(i).clamp(self.min_ns, self.max_ns);
            }
        }
        self.max_ns
    }

    fn mean(&self) -> u64 {
        if self.total == 0 {
            0
        } else {
            (self.sum_ns / self.total as u128) as u64
        }
    }
}

// ---------------------------------------------------------------------------
// Reply scanning

#[inline]
fn count_newlines(b: &[u8]) -> usize {
    // Branch-free; LLVM vectorises this.
    b.iter().fold(0usize, |n, &c| n + (c == b'\n') as usize)
}

const KEEP_BAD_LINE: usize = 200;

/// Checks that every reply line starts with a prefix; lines may be split
/// across reads.
struct LineCheck {
    prefix: Vec<u8>,
    contains: Vec<u8>,
    /// Start of the current (incomplete) line, at most `keep` bytes.
    cur: Vec<u8>,
    /// Length of the current line so far (may exceed `cur.len()`).
    cur_len: usize,
    keep: usize,
    /// Only the first line of each `reply_lines`-line reply is checked.
    reply_lines: usize,
    /// Check every line, not only each reply's first.
    every: bool,
    line_no: usize,
    errors: u64,
    first_bad: Option<Vec<u8>>,
}

impl LineCheck {
    fn new(prefix: Vec<u8>, contains: Vec<u8>, reply_lines: usize, every: bool) -> Self {
        let keep = prefix.len().max(contains.len()).max(KEEP_BAD_LINE);
        LineCheck {
            prefix,
            contains,
            cur: Vec::with_capacity(keep),
            cur_len: 0,
            keep,
            reply_lines,
            every,
            line_no: 0,
            errors: 0,
            first_bad: None,
        }
    }

    fn check_line(&mut self, line: &[u8]) {
        let first = self.every || self.line_no == 0;
        self.line_no += 1;
        if self.line_no == self.reply_lines {
            self.line_no = 0;
        }
        if first
            && !(line.starts_with(&self.prefix)
                && (self.contains.is_empty()
                    || line
                        .windows(self.contains.len())
                        .any(|w| w == self.contains.as_slice())))
        {
            self.errors += 1;
            if self.first_bad.is_none() {
                let mut l = line[..line.len().min(KEEP_BAD_LINE)].to_vec();
                if l.last() == Some(&b'\r') {
                    l.pop();
                }
                self.first_bad = Some(l);
            }
        }
    }

    /// Feed received bytes; returns the number of complete lines.
    fn feed(&mut self, mut data: &[u8]) -> usize {
        let mut lines = 0;
        while let Some(pos) = data.iter().position(|&b| b == b'\n') {
            let piece = &data[..pos];
            if self.cur_len == 0 {
                self.check_line(piece);
            } else {
                let room = self.keep - self.cur.len();
                self.cur.extend_from_slice(&piece[..piece.len().min(room)]);
                let line = std::mem::take(&mut self.cur);
                self.check_line(&line);
                self.cur = line;
                self.cur.clear();
                self.cur_len = 0;
            }
            lines += 1;
            data = &data[pos + 1..];
        }
        if !data.is_empty() {
            let room = self.keep - self.cur.len();
            self.cur.extend_from_slice(&data[..data.len().min(room)]);
            self.cur_len += data.len();
        }
        lines
    }
}

// ---------------------------------------------------------------------------
// Connections

struct Shared {
    template: Template,
    depth: usize,
    reply_lines: usize,
    measure_start: Instant,
    end: Instant,
    max_requests: Option<u64>,
    /// Next `{n}` value.
    counter: AtomicU64,
    /// `{n}` drawn from `0..keys` (`--keys`) instead of the counter itself.
    keys: Option<u64>,
    /// Measured requests reserved so far (for --max-requests).
    reserved: AtomicU64,
    /// (prefix, substring) the first line of each reply must match.
    expect: Option<(Vec<u8>, Vec<u8>)>,
    /// `--check-every-line`.
    every: bool,
}

struct ConnResult {
    hist: Histogram,
    requests: u64,
    errors: u64,
    first_bad: Option<Vec<u8>>,
    /// More reply lines than requests in a batch.
    extra_lines: u64,
    io_error: Option<String>,
    last_finish: Option<Instant>,
}

enum Conn {
    Unix(UnixStream),
    Tcp(TcpStream),
}

async fn connect(args: &Args) -> io::Result<Conn> {
    if let Some(addr) = &args.tcp {
        let s = TcpStream::connect(addr).await?;
        s.set_nodelay(true)?;
        Ok(Conn::Tcp(s))
    } else {
        let path = args
            .socket
            .as_ref()
            .expect("clap requires --socket or --tcp");
        Ok(Conn::Unix(UnixStream::connect(path).await?))
    }
}

async fn run_conn<S: AsyncRead + AsyncWrite + Unpin>(mut s: S, sh: Arc<Shared>) -> ConnResult {
    let d = sh.depth;
    // Reply lines expected per batch.
    let want = d * sh.reply_lines;
    let mut res = ConnResult {
        hist: Histogram::new(),
        requests: 0,
        errors: 0,
        first_bad: None,
        extra_lines: 0,
        io_error: None,
        last_finish: None,
    };
    let mut check = sh
        .expect
        .clone()
        .map(|(p, c)| LineCheck::new(p, c, sh.reply_lines, sh.every));
    let mut num = itoa::Buffer::new();
    let mut wbuf: Vec<u8> = Vec::with_capacity(d * 128);
    let dynamic = sh.template.has_counter();
    if !dynamic {
        for _ in 0..d {
            sh.template.expand_into(&mut wbuf, 0, &mut num);
        }
    }
    let mut rbuf = vec![0u8; (want * 256).clamp(16 * 1024, 1 << 20)];

    let mut t0 = Instant::now();
    'run: loop {
        if t0 >= sh.end {
            break;
        }
        let measuring = t0 >= sh.measure_start;
        if measuring {
            if let Some(max) = sh.max_requests {
                if sh.reserved.fetch_add(d as u64, Ordering::Relaxed) >= max {
                    break;
                }
            }
        }
        if dynamic {
            wbuf.clear();
            let base = sh.counter.fetch_add(d as u64, Ordering::Relaxed);
            for i in 0..d as u64 {
                let n = match sh.keys {
                    Some(k) => splitmix64(base + i) % k,
                    None => base + i,
                };
                sh.template.expand_into(&mut wbuf, n, &mut num);
            }
        }
        if let Err(e) = s.write_all(&wbuf).await {
            res.io_error = Some(format!("write: {e}"));
            break;
        }
        let mut got = 0usize;
        while got < want {
            let n = match s.read(&mut rbuf).await {
                Ok(0) => {
                    res.io_error = Some(format!(
                        "server closed the connection ({got} of {want} reply lines of a batch received)"
                    ));
                    break 'run;
                }
                Ok(n) => n,
                Err(e) => {
                    res.io_error = Some(format!("read: {e}"));
                    break 'run;
                }
            };
            got += match check.as_mut() {
                Some(c) => c.feed(&rbuf[..n]),
                None => count_newlines(&rbuf[..n]),
            };
        }
        if got > want {
            res.extra_lines += (got - want) as u64;
        }
        let t1 = Instant::now();
        if measuring && t1 <= sh.end {
            res.hist.record((t1 - t0).as_nanos() as u64);
            res.requests += d as u64;
            res.last_finish = Some(t1);
        }
        t0 = t1;
    }
    if let Some(c) = check {
        res.errors = c.errors;
        res.first_bad = c.first_bad;
    }
    res
}

// ---------------------------------------------------------------------------
// Output

fn json_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

fn us(ns: u64) -> f64 {
    (ns as f64 / 100.0).round() / 10.0
}

struct Summary<'a> {
    args: &'a Args,
    target: String,
    hist: Histogram,
    requests: u64,
    seconds: f64,
    errors: u64,
    first_bad: Option<String>,
    extra_lines: u64,
    io_errors: u64,
    first_io_error: Option<String>,
}

impl Summary<'_> {
    fn print(&self) {
        let a = self.args;
        let rps = if self.seconds > 0.0 {
            self.requests as f64 / self.seconds
        } else {
            0.0
        };
        let h = &self.hist;
        let (p50, p90, p99, p999, max, mean) = (
            us(h.quantile(0.50)),
            us(h.quantile(0.90)),
            us(h.quantile(0.99)),
            us(h.quantile(0.999)),
            us(h.max_ns),
            us(h.mean()),
        );
        let label = if a.label.is_empty() {
            "loadgen"
        } else {
            &a.label
        };
        let mut human = format!(
            "{label}: {} conns={} depth={} requests={} in {:.2}s = {:.0} req/s; \
             batch latency us: p50={p50} p90={p90} p99={p99} p99.9={p999} max={max} mean={mean}; \
             errors={}",
            self.target, a.conns, a.depth, self.requests, self.seconds, rps, self.errors
        );
        if let Some(b) = &self.first_bad {
            human.push_str(&format!(" (first bad reply: {b:?})"));
        }
        if self.extra_lines > 0 {
            human.push_str(&format!(" extra_lines={}", self.extra_lines));
        }
        if self.io_errors > 0 {
            human.push_str(&format!(
                " io_errors={} (first: {})",
                self.io_errors,
                self.first_io_error.as_deref().unwrap_or("")
            ));
        }
        // Ignore EPIPE (`loadgen ... | head -n 1`).
        let mut out = io::stdout().lock();
        let _ = writeln!(out, "{human}");

        let mut j = String::with_capacity(512);
        j.push_str("{\"label\":");
        json_str(&mut j, &a.label);
        j.push_str(",\"target\":");
        json_str(&mut j, &self.target);
        j.push_str(",\"request\":");
        json_str(&mut j, &a.request);
        j.push_str(&format!(
            ",\"conns\":{},\"depth\":{},\"reply_lines\":{},\"threads\":{},\"requests\":{},\"seconds\":{:.3},\
             \"rps\":{:.1},\"p50_us\":{p50},\"p90_us\":{p90},\"p99_us\":{p99},\
             \"p999_us\":{p999},\"max_us\":{max},\"mean_us\":{mean},\"errors\":{},\
             \"extra_lines\":{},\"io_errors\":{}",
            a.conns,
            a.depth,
            a.reply_lines,
            a.threads,
            self.requests,
            self.seconds,
            rps,
            self.errors,
            self.extra_lines,
            self.io_errors
        ));
        j.push_str(",\"first_bad\":");
        match &self.first_bad {
            Some(b) => json_str(&mut j, b),
            None => j.push_str("null"),
        }
        j.push_str(",\"first_io_error\":");
        match &self.first_io_error {
            Some(e) => json_str(&mut j, e),
            None => j.push_str("null"),
        }
        j.push('}');
        let _ = writeln!(out, "{j}");
        let _ = out.flush();
    }
}

// ---------------------------------------------------------------------------

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
