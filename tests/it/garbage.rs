//! Thousands of random byte lines (control bytes, invalid UTF-8, huge lines, empty
//! lines, near-valid requests) sent to a real daemon over its socket: exactly one reply
//! per line, in order, each the one the protocol prescribes, and the daemon still
//! serving afterwards.

use crate::common;

use common::*;
use rand::rngs::SmallRng;
use rand::{Rng as _, RngCore, SeedableRng};
use ratelimitd::protocol::{parse, Request};

const MAX_LINE: usize = 512;

const CONFIG: &str = r#"
[server]
max_line_bytes = 512

[redis]
mode = "none"

[[rule]]
name = "api"
algorithm = "token_bucket"
capacity = 1000000
refill_rate = 1000000.0
"#;

/// rand's seeded `SmallRng` (deterministic runs) with the helpers the lines need.
struct Rng(SmallRng);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0.next_u64()
    }
    fn below(&mut self, n: usize) -> usize {
        self.0.gen_range(0..n)
    }
    fn bytes(&mut self, len: usize, pick: impl Fn(u64) -> u8) -> Vec<u8> {
        (0..len)
            .map(|_| pick(self.next()))
            .filter(|&b| b != b'\n')
            .collect()
    }
}

/// One random line (without its `\n`).
fn random_line(rng: &mut Rng, i: usize) -> Vec<u8> {
    match rng.below(11) {
        0 => Vec::new(),
        1 => {
            let n = 1 + rng.below(120);
            rng.bytes(n, |r| r as u8)
        }
        2 => {
            let n = 1 + rng.below(40);
            rng.bytes(n, |r| (r % 32) as u8)
        }
        3 => {
            let n = 1 + rng.below(60);
            rng.bytes(n, |r| 0x80 | r as u8)
        }
        4 => {
            let n = MAX_LINE + 1 + rng.below(20_000);
            rng.bytes(n, |r| b'a' + (r % 26) as u8)
        }
        5 => format!("CHECK api k{i} {}", rng.below(3)).into_bytes(),
        6 => ["PING", "ping", " PiNg \t", "PING\r", "PING x"][rng.below(5)]
            .as_bytes()
            .to_vec(),
        7 => {
            let n = 1 + rng.below(300);
            let mut l = b"CHECK api ".to_vec();
            l.extend(rng.bytes(n, |r| 0x1f + (r % 0x62) as u8));
            l
        }
        8 => {
            let mut l = format!("check\tapi  k{i}").into_bytes();
            l.extend(std::iter::repeat_n(b'\r', rng.below(3)));
            l
        }
        9 => {
            // Around the limit: 511..=514 bytes of content.
            let n = MAX_LINE - 1 + rng.below(4);
            rng.bytes(n, |r| b'A' + (r % 26) as u8)
        }
        _ => {
            // A valid request with garbage spliced in.
            let mut l = format!("CHECK api k{i} 1").into_bytes();
            let at = rng.below(l.len());
            l.insert(at, rng.next() as u8);
            l.retain(|&b| b != b'\n');
            l
        }
    }
}

/// The reply the protocol prescribes for `line` (sent with a `\n`), as a prefix.
fn expected(line: &[u8]) -> String {
    let content = line.strip_suffix(b"\r").unwrap_or(line);
    if content.len() > MAX_LINE {
        return "ERR TOO_LONG ".into();
    }
    match parse(content) {
        Err(e) => format!("ERR {} ", e.code.as_str()),
        Ok(Request::Ping) => "PONG".into(),
        Ok(Request::Quit) => unreachable!("filtered out"),
        Ok(Request::Check { rule, .. }) if rule != b"api" => "ERR RULE ".into(),
        Ok(Request::Check { .. }) => "ALLOW ".into(),
        Ok(Request::CheckAll(t)) if t.as_slice().iter().any(|t| t.rule != b"api") => {
            "ERR RULE ".into()
        }
        Ok(Request::CheckAll(_)) => "ALLOW ".into(),
        Ok(Request::Refund { rule, .. }) if rule != b"api" => "ERR RULE ".into(),
        Ok(Request::Refund { .. }) => "ALLOW ".into(),
        // `api` is no concurrency rule, and no other rule exists.
        Ok(Request::Acquire { .. } | Request::Release { .. }) => "ERR RULE ".into(),
        // An operator verb: answered or refused by who runs the test (any one line).
        Ok(_) => String::new(),
    }
}

#[test]
fn random_byte_lines_get_one_reply_each_and_the_daemon_keeps_serving() {
    let d = Daemon::start(CONFIG);
    let mut rng = Rng(SmallRng::seed_from_u64(0x9E37_79B9_7F4A_7C15));
    let mut lines: Vec<Vec<u8>> = Vec::new();
    while lines.len() < 5000 {
        let i = lines.len();
        let line = random_line(&mut rng, i);
        if matches!(
            parse(line.strip_suffix(b"\r").unwrap_or(&line)),
            Ok(Request::Quit)
        ) {
            continue; // QUIT would end the connection
        }
        lines.push(line);
    }
    let kinds_seen = (
        lines.iter().filter(|l| l.is_empty()).count(),
        lines.iter().filter(|l| l.len() > MAX_LINE).count(),
        lines
            .iter()
            .filter(|l| std::str::from_utf8(l).is_err())
            .count(),
        lines
            .iter()
            .filter(|l| l.iter().any(|&b| b < 0x20 && b != b'\t'))
            .count(),
    );
    assert!(
        kinds_seen.0 > 100 && kinds_seen.1 > 100 && kinds_seen.2 > 100 && kinds_seen.3 > 100,
        "generator covers empty, huge, invalid UTF-8 and control-byte lines: {kinds_seen:?}"
    );

    // Another connection, open throughout, must keep working.
    let mut c = d.connect();
    assert_eq!(c.request("PING"), "PONG");
    let mut wire = Vec::new();
    for l in &lines {
        wire.extend_from_slice(l);
        wire.push(b'\n');
    }
    // One connection, raw bytes: write everything from a thread, read replies here.
    let stream = std::os::unix::net::UnixStream::connect(&d.socket).unwrap();
    stream
        .set_read_timeout(Some(CLIENT_TIMEOUT))
        .expect("set_read_timeout");
    let w = stream.try_clone().unwrap();
    let total = lines.len();
    let sender = std::thread::spawn(move || {
        use std::io::Write;
        let mut w = w;
        w.write_all(&wire)
    });
    let mut r = std::io::BufReader::new(stream);
    for (i, l) in lines.iter().enumerate() {
        let mut buf = Vec::new();
        std::io::BufRead::read_until(&mut r, b'\n', &mut buf)
            .unwrap_or_else(|e| panic!("reply {i} of {total}: {e}"));
        assert_eq!(
            buf.last(),
            Some(&b'\n'),
            "reply {i}: connection ended early"
        );
        let got = String::from_utf8(buf).expect("replies are ASCII");
        let want = expected(l);
        assert!(
            got.starts_with(&want),
            "line {i} {:?} -> {got:?}, want {want:?}",
            ratelimitd::protocol::printable(l, 80)
        );
    }
    sender.join().unwrap().expect("writing the lines");

    // Nothing more than one reply per line: the next request gets its own reply.
    let mut s = r.into_inner();
    {
        use std::io::Write;
        s.write_all(b"PING\n").unwrap();
    }
    let mut r = std::io::BufReader::new(s);
    let mut buf = String::new();
    std::io::BufRead::read_line(&mut r, &mut buf).unwrap();
    assert_eq!(buf, "PONG\n");

    // And the daemon still serves others.
    assert_eq!(c.request("PING"), "PONG");
    assert!(d.connect().request("CHECK api after").starts_with("ALLOW "));
}

/// The fuzz target's property (fuzz/fuzz_targets/protocol.rs) as a short proptest:
/// random byte streams, cut into random reads, through the decoder and the decision
/// path (mode none): no panic, exactly one reply per input line, each one line.
mod stream_property {
    use bytes::BytesMut;
    use proptest::prelude::*;
    use ratelimitd::config::Config;
    use ratelimitd::limiter::Limiter;
    use ratelimitd::protocol::{ErrorCode, Frame, LineDecoder, ProtoError, Reply};
    use ratelimitd::server::dispatch::{handle, Answer};
    use std::sync::Arc;
    use tokio_util::codec::Decoder;

    fn limiter() -> &'static Arc<Limiter> {
        static LIMITER: std::sync::OnceLock<Arc<Limiter>> = std::sync::OnceLock::new();
        LIMITER.get_or_init(|| {
            let config = Config::parse(super::CONFIG, "test").unwrap();
            Arc::new(Limiter::local(&config))
        })
    }

    fn bytes_with_lines() -> impl Strategy<Value = Vec<u8>> {
        // Biased towards the protocol's own bytes so that valid requests occur too.
        let byte = prop_oneof![
            3 => any::<u8>(),
            2 => Just(b'\n'),
            1 => Just(b'\r'),
            1 => Just(b' '),
            2 => proptest::sample::select(b"CHECKPINGQUITapik0123456789".to_vec()),
        ];
        proptest::collection::vec(byte, 0..3000)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]
        #[test]
        fn one_reply_per_line(data in bytes_with_lines(),
                              cuts in proptest::collection::vec(0usize..3000, 0..6),
                              max in 1usize..600) {
            let limiter = limiter();
            let mut dec = LineDecoder::new(max);
            let mut buf = BytesMut::new();
            let mut out = BytesMut::new();
            let mut replies = 0usize;
            let mut bounds: Vec<usize> = cuts.iter().map(|&c| c.min(data.len())).collect();
            bounds.push(data.len());
            bounds.sort_unstable();
            let answer = |frame: Frame, out: &mut BytesMut| {
                let reply = match frame {
                    Frame::TooLong => Reply::Error(ProtoError::new(ErrorCode::TooLong, "too long")),
                    Frame::Line(l) => match handle(limiter, &l).0 {
                        Answer::Ready(Some(r)) => r,
                        _ => panic!("mode none answers at once"),
                    },
                };
                reply.encode(out);
            };
            let mut from = 0;
            for to in bounds {
                buf.extend_from_slice(&data[from..to]);
                from = to;
                while let Some(f) = dec.decode(&mut buf).unwrap() {
                    answer(f, &mut out);
                    replies += 1;
                }
            }
            while let Some(f) = dec.decode_eof(&mut buf).unwrap() {
                answer(f, &mut out);
                replies += 1;
            }
            let newlines = data.iter().filter(|&&b| b == b'\n').count();
            let tail = data.len() - data.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
            prop_assert_eq!(replies, newlines + usize::from(tail > 0));
            prop_assert_eq!(out.iter().filter(|&&b| b == b'\n').count(), replies);
        }
    }
}
