//! Talking to a running Redis: a minimal RESP2 client (faster than spawning `redis-cli`
//! for polling), `redis-cli` itself (cluster redirects followed with `-c`), and the calls
//! of a command a server has run (`INFO commandstats`).

use std::io;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;

use super::*;

/// A RESP2 reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resp {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Resp>>),
}

impl Resp {
    /// Simple/bulk string or integer as text; an error reply becomes `Err`;
    /// nil becomes "". Arrays are rejected.
    pub fn into_text(self) -> io::Result<String> {
        match self {
            Resp::Simple(s) => Ok(s),
            Resp::Int(i) => Ok(i.to_string()),
            Resp::Bulk(Some(b)) => Ok(String::from_utf8_lossy(&b).into_owned()),
            Resp::Bulk(None) | Resp::Array(None) => Ok(String::new()),
            Resp::Error(e) => Err(io::Error::other(format!("redis error: {e}"))),
            Resp::Array(Some(_)) => Err(io::Error::other("unexpected array reply")),
        }
    }

    /// An array of integers (a script's decision); panics on any other reply.
    pub fn into_ints(self) -> Vec<i64> {
        match self {
            Resp::Array(Some(items)) => items
                .into_iter()
                .map(|i| match i {
                    Resp::Int(n) => n,
                    other => panic!("expected an integer, got {other:?}"),
                })
                .collect(),
            other => panic!("expected an array, got {other:?}"),
        }
    }

    /// An array of strings (e.g. the reply to KEYS).
    pub fn into_strings(self) -> io::Result<Vec<String>> {
        match self {
            Resp::Array(Some(items)) => items.into_iter().map(Resp::into_text).collect(),
            Resp::Array(None) => Ok(Vec::new()),
            Resp::Error(e) => Err(io::Error::other(format!("redis error: {e}"))),
            other => Err(io::Error::other(format!(
                "expected an array, got {other:?}"
            ))),
        }
    }
}

/// Send one command to `addr` ("127.0.0.1:PORT") on a fresh connection and
/// read the reply. Connect timeout 1 s, read/write timeout 3 s.
pub fn redis_command(addr: &str, args: &[&str]) -> io::Result<Resp> {
    let sa: SocketAddr = addr
        .parse()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{addr}: {e}")))?;
    let stream = TcpStream::connect_timeout(&sa, Duration::from_secs(1))?;
    stream.set_read_timeout(Some(Duration::from_secs(3)))?;
    stream.set_write_timeout(Some(Duration::from_secs(3)))?;
    stream.set_nodelay(true)?;
    let mut buf = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        buf.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        buf.extend_from_slice(a.as_bytes());
        buf.extend_from_slice(b"\r\n");
    }
    (&stream).write_all(&buf)?;
    read_resp(&mut BufReader::new(&stream))
}

/// `redis_command(..)?.into_text()`.
pub fn redis_text(addr: &str, args: &[&str]) -> io::Result<String> {
    redis_command(addr, args)?.into_text()
}

fn read_resp(r: &mut impl BufRead) -> io::Result<Resp> {
    let mut line = Vec::new();
    r.read_until(b'\n', &mut line)?;
    if line.len() < 3 || !line.ends_with(b"\r\n") {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "truncated RESP reply",
        ));
    }
    line.truncate(line.len() - 2);
    let rest = String::from_utf8_lossy(&line[1..]).into_owned();
    let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, format!("bad {what}"));
    match line[0] {
        b'+' => Ok(Resp::Simple(rest)),
        b'-' => Ok(Resp::Error(rest)),
        b':' => rest.parse().map(Resp::Int).map_err(|_| bad("RESP integer")),
        b'$' => {
            let n: i64 = rest.parse().map_err(|_| bad("RESP bulk length"))?;
            if n < 0 {
                return Ok(Resp::Bulk(None));
            }
            let mut data = vec![0u8; n as usize + 2];
            r.read_exact(&mut data)?;
            data.truncate(n as usize);
            Ok(Resp::Bulk(Some(data)))
        }
        b'*' => {
            let n: i64 = rest.parse().map_err(|_| bad("RESP array length"))?;
            if n < 0 {
                return Ok(Resp::Array(None));
            }
            let items = (0..n).map(|_| read_resp(r)).collect::<io::Result<_>>()?;
            Ok(Resp::Array(Some(items)))
        }
        _ => Err(bad("RESP type byte")),
    }
}

/// Run `redis-cli -h 127.0.0.1 -p PORT args...` and return its stdout, trimmed.
/// (Errors from redis-cli itself, e.g. "connection refused", go to stderr and
/// are not returned.) Pass `-c` as the first arg to follow cluster redirects.
pub fn redis_cli(addr: &str, args: &[&str]) -> String {
    let port = port_of(addr).to_string();
    let out = Command::new(redis_cli_bin())
        .args(["-h", "127.0.0.1", "-p", &port])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running {} (is it installed?): {e}", redis_cli_bin()));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// EVALSHA calls the Redis at `addr` has served so far (`INFO commandstats`; 0 when it
/// does not answer).
pub fn evalsha_calls(addr: &str) -> u64 {
    command_calls(addr, "evalsha")
}

/// Calls of `command` (lower case) the Redis at `addr` has run so far, a script's
/// included (`INFO commandstats`; 0 when it does not answer). `hgetall`: the lease
/// calls it ran (lua/lease.lua reads a key's hash with it, once per call; no other
/// script does).
pub fn command_calls(addr: &str, command: &str) -> u64 {
    let info = redis_text(addr, &["INFO", "commandstats"]).unwrap_or_default();
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|r| r.split(',').next())
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or(0)
}
