//! The connections: each writes `--depth` requests at once, reads until as many reply
//! lines are in, records the batch's latency while measuring, and repeats until the end
//! of the run (or `--max-requests`).

use crate::common::splitmix64;
use crate::histogram::Histogram;
use crate::reply::{count_newlines, LineCheck};
use crate::template::Template;
use crate::Args;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};

pub(crate) struct Shared {
    pub(crate) template: Template,
    pub(crate) depth: usize,
    pub(crate) reply_lines: usize,
    pub(crate) measure_start: Instant,
    pub(crate) end: Instant,
    pub(crate) max_requests: Option<u64>,
    /// Next `{n}` value.
    pub(crate) counter: AtomicU64,
    /// `{n}` drawn from `0..keys` (`--keys`) instead of the counter itself.
    pub(crate) keys: Option<u64>,
    /// Measured requests reserved so far (for --max-requests).
    pub(crate) reserved: AtomicU64,
    /// (prefix, substring) the first line of each reply must match.
    pub(crate) expect: Option<(Vec<u8>, Vec<u8>)>,
    /// `--check-every-line`.
    pub(crate) every: bool,
}

pub(crate) struct ConnResult {
    pub(crate) hist: Histogram,
    pub(crate) requests: u64,
    pub(crate) errors: u64,
    pub(crate) first_bad: Option<Vec<u8>>,
    /// More reply lines than requests in a batch.
    pub(crate) extra_lines: u64,
    pub(crate) io_error: Option<String>,
    pub(crate) last_finish: Option<Instant>,
}

pub(crate) enum Conn {
    Unix(UnixStream),
    Tcp(TcpStream),
}

pub(crate) async fn connect(args: &Args) -> io::Result<Conn> {
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

pub(crate) async fn run_conn<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    sh: Arc<Shared>,
) -> ConnResult {
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
