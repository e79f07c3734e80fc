//! The line-protocol client of the tests and the parsed CHECK reply.

use std::io;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::thread;
use std::time::Duration;

/// Read/write timeout of a [`Client`].
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);

/// A connection to the daemon: std `UnixStream` + `BufReader`, 5 s read and
/// write timeouts. Reading methods panic on timeout or I/O error.
pub struct Client {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Client {
    pub fn connect(path: &Path) -> Client {
        let stream = UnixStream::connect(path)
            .unwrap_or_else(|e| panic!("connecting to {}: {e}", path.display()));
        stream
            .set_read_timeout(Some(CLIENT_TIMEOUT))
            .expect("set_read_timeout");
        stream
            .set_write_timeout(Some(CLIENT_TIMEOUT))
            .expect("set_write_timeout");
        let writer = stream.try_clone().expect("cloning UnixStream");
        Client {
            reader: BufReader::new(stream),
            writer,
        }
    }

    /// Write `line` + "\n", read one reply line (without "\n").
    pub fn request(&mut self, line: &str) -> String {
        let mut buf = Vec::with_capacity(line.len() + 1);
        buf.extend_from_slice(line.as_bytes());
        buf.push(b'\n');
        self.send_raw(&buf);
        self.read_line()
    }

    /// Write bytes as they are.
    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.writer
            .write_all(bytes)
            .unwrap_or_else(|e| panic!("writing {} bytes to the daemon: {e}", bytes.len()));
    }

    /// One reply line without its "\n"; "" on EOF. Panics on timeout.
    pub fn read_line(&mut self) -> String {
        self.try_read_line()
            .unwrap_or_else(|e| panic!("reading a reply line from the daemon: {e}"))
    }

    /// As [`Self::read_line`] but returns the I/O error (e.g. timeout).
    pub fn try_read_line(&mut self) -> io::Result<String> {
        read_reply_line(&mut self.reader)
    }

    /// Write all `lines` (each + "\n") in one write, then read
    /// `lines.len()` replies. The write runs on a helper thread so a large
    /// pipeline cannot deadlock against the daemon's output buffer.
    pub fn pipeline(&mut self, lines: &[String]) -> Vec<String> {
        let mut buf = Vec::with_capacity(lines.iter().map(|l| l.len() + 1).sum());
        for l in lines {
            buf.extend_from_slice(l.as_bytes());
            buf.push(b'\n');
        }
        let writer = &self.writer;
        let reader = &mut self.reader;
        thread::scope(|s| {
            let w = s.spawn(move || {
                let mut w: &UnixStream = writer;
                w.write_all(&buf)
            });
            let replies: Vec<String> = (0..lines.len())
                .map(|i| {
                    read_reply_line(reader).unwrap_or_else(|e| {
                        panic!("reading pipelined reply {i} of {}: {e}", lines.len())
                    })
                })
                .collect();
            w.join()
                .expect("pipeline writer thread panicked")
                .unwrap_or_else(|e| panic!("writing the pipeline: {e}"));
            replies
        })
    }

    /// Change the read timeout (default 5 s).
    pub fn set_read_timeout(&mut self, timeout: Duration) {
        self.reader
            .get_ref()
            .set_read_timeout(Some(timeout))
            .expect("set_read_timeout");
    }

    /// Half-close: shut down the writing side (the daemon sees EOF).
    pub fn shutdown_write(&mut self) {
        let _ = self.writer.shutdown(std::net::Shutdown::Write);
    }
}

fn read_reply_line(reader: &mut BufReader<UnixStream>) -> io::Result<String> {
    let mut buf = Vec::new();
    reader.read_until(b'\n', &mut buf)?;
    if buf.last() == Some(&b'\n') {
        buf.pop();
    }
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// A parsed CHECK reply.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    pub verdict: String,
    pub limit: u64,
    pub remaining: u64,
    pub reset_ms: u64,
    pub wait_ms: u64,
    pub source: String,
}

impl Reply {
    pub fn allowed(&self) -> bool {
        self.verdict == "ALLOW"
    }
}

/// The sources a CHECK reply may name (docs/PROTOCOL.md).
pub const SOURCES: [&str; 6] = [
    "redis",
    "cache",
    "local",
    "fail_open",
    "fail_closed",
    "lease",
];

/// Parse `ALLOW|DENY <limit> <remaining> <reset_ms> <wait_ms> <source> [extra…]`
/// (single spaces, as the daemon writes them; extra fields ignored).
pub fn try_parse_reply(line: &str) -> Option<Reply> {
    let f: Vec<&str> = line.split(' ').collect();
    if f.len() < 6 || !matches!(f[0], "ALLOW" | "DENY") || !SOURCES.contains(&f[5]) {
        return None;
    }
    let num = |s: &str| -> Option<u64> {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        s.parse().ok()
    };
    Some(Reply {
        verdict: f[0].to_string(),
        limit: num(f[1])?,
        remaining: num(f[2])?,
        reset_ms: num(f[3])?,
        wait_ms: num(f[4])?,
        source: f[5].to_string(),
    })
}

/// As [`try_parse_reply`], panicking with the line if it is not a CHECK reply.
pub fn parse_reply(line: &str) -> Reply {
    try_parse_reply(line).unwrap_or_else(|| {
        panic!("not a CHECK reply (`ALLOW|DENY n n n n source [extra...]`): {line:?}")
    })
}
