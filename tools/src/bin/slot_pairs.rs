//! `ACQUIRE` + `RELEASE` pairs per second against two `CHECK`s per iteration, on the same
//! daemon in the same run (docs/PERFORMANCE.md, "Concurrency slots"): each of `conns`
//! connections runs closed-loop iterations of two round trips for `secs` seconds, first
//! the baseline (`CHECK <check_rule> k<i>` twice), then the pairs (`ACQUIRE
//! <slot_rule> k<i>`, then `RELEASE` of its token). Standard library only.
//!
//! `slot_pairs SOCKET CHECK_RULE SLOT_RULE [CONNS] [SECS]`; run bare, it checks its own
//! reply parsing.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

/// The token of an `ACQUIRE` reply (`ALLOW … <token>`), or `None` for a DENY or an error.
fn token(reply: &str) -> Option<&str> {
    let mut f = reply.split(' ');
    (f.next()? == "ALLOW").then_some(())?;
    f.nth(6)
}

/// Iterations of `step` (two round trips each) completed by `conns` connections in `secs`.
fn run(socket: &str, conns: usize, secs: u64, step: fn(&mut Conn, usize) -> bool) -> (u64, u64) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    let threads: Vec<_> = (0..conns)
        .map(|i| {
            let socket = socket.to_owned();
            std::thread::spawn(move || {
                let mut c = Conn::new(&socket);
                let (mut ok, mut failed) = (0u64, 0u64);
                // Bounded in time and in count.
                while Instant::now() < deadline && ok + failed < 50_000_000 {
                    if step(&mut c, i) {
                        ok += 1;
                    } else {
                        failed += 1;
                    }
                }
                (ok, failed)
            })
        })
        .collect();
    threads
        .into_iter()
        .map(|t| t.join().expect("a load thread"))
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
}

/// One connection and its reader.
struct Conn {
    w: UnixStream,
    r: BufReader<UnixStream>,
    line: String,
    check_rule: String,
    slot_rule: String,
}

impl Conn {
    fn new(socket: &str) -> Conn {
        let w = UnixStream::connect(socket).expect("connect to the daemon");
        let r = BufReader::new(w.try_clone().expect("clone the socket"));
        let mut args = std::env::args().skip(2);
        Conn {
            w,
            r,
            line: String::new(),
            check_rule: args.next().unwrap_or_default(),
            slot_rule: args.next().unwrap_or_default(),
        }
    }

    fn ask(&mut self, request: &str) -> &str {
        self.w.write_all(request.as_bytes()).expect("write");
        self.line.clear();
        self.r.read_line(&mut self.line).expect("read");
        self.line.trim_end()
    }
}

fn two_checks(c: &mut Conn, i: usize) -> bool {
    let req = format!("CHECK {} k{i}\n", c.check_rule);
    let a = c.ask(&req).starts_with("ALLOW");
    a & c.ask(&req).starts_with("ALLOW")
}

fn acquire_release(c: &mut Conn, i: usize) -> bool {
    let rule = c.slot_rule.clone();
    let Some(t) = token(c.ask(&format!("ACQUIRE {rule} k{i}\n"))).map(str::to_owned) else {
        return false;
    };
    c.ask(&format!("RELEASE {rule} k{i} {t}\n")) == "OK"
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 3 {
        assert_eq!(token("ALLOW 20 19 0 0 redis 0 17-a.1"), Some("17-a.1"));
        assert_eq!(token("DENY 20 0 5 5 redis 0"), None);
        println!(
            "usage: slot_pairs SOCKET CHECK_RULE SLOT_RULE [CONNS] [SECS] (self-check passed)"
        );
        return;
    }
    let conns = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(4);
    let secs = args.get(4).and_then(|a| a.parse().ok()).unwrap_or(5);
    let (checks, failed_checks) = run(&args[0], conns, secs, two_checks);
    let (pairs, failed_pairs) = run(&args[0], conns, secs, acquire_release);
    let per_s = |n: u64| n as f64 / secs as f64;
    println!(
        "{conns} connections, {secs} s each: two CHECKs {:.0}/s ({failed_checks} not both allowed), ACQUIRE+RELEASE {:.0}/s ({failed_pairs} denied or not released); ratio {:.2}",
        per_s(checks),
        per_s(pairs),
        per_s(pairs) / per_s(checks).max(1.0)
    );
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_the_token() {
        assert_eq!(super::token("ALLOW 2 1 0 0 local 0 9-x.3"), Some("9-x.3"));
        assert_eq!(super::token("ERR TOKEN x"), None);
    }
}
