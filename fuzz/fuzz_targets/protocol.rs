//! Fuzz target for what untrusted bytes reach first: the daemon's own `LineDecoder`
//! (`ratelimitd::protocol::frame`), then, for each line, the daemon's own dispatch
//! (`ratelimitd::server::dispatch::handle`: the request parser, the rule lookup, the cost
//! check and a local decision in `redis.mode = "none"`), exactly as a connection calls
//! them. Only the socket I/O around them is left out (tests/it/socket/ and
//! tests/it/garbage.rs drive that over a real socket).
//!
//! Input layout: byte 0 picks `max_line_bytes` (8..=263, small so that over-long lines
//! are common), byte 1 picks where the stream is cut into two reads; the rest is the
//! byte stream a client sends before closing its write side.
//!
//! Asserts: nothing panics; every input line (each `\n`-terminated line, plus a last
//! unterminated non-empty one) yields exactly one reply; every reply is one line.

#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use ratelimitd::config::Config;
use ratelimitd::limiter::Limiter;
use ratelimitd::protocol::{ErrorCode, Frame, LineDecoder, ProtoError, Reply};
use ratelimitd::server::dispatch::{handle, Pending};
use ratelimitd::store::health::Circuit;
use std::sync::{Arc, OnceLock};
use tokio_util::codec::Decoder;

const CONFIG: &str = r#"
[redis]
mode = "none"
[fallback]
max_keys = 1000
[[rule]]
name = "api"
algorithm = "token_bucket"
capacity = 10
refill_rate = 1.0
"#;

fn limiter() -> &'static Arc<Limiter> {
    static LIMITER: OnceLock<Arc<Limiter>> = OnceLock::new();
    LIMITER.get_or_init(|| {
        let config = Config::parse(CONFIG, "fuzz").expect("fuzz config");
        Arc::new(Limiter::new(&config, None, Arc::new(Circuit::new(true))))
    })
}

/// The reply the server sends for one frame: `ERR TOO_LONG` for an over-long one (the
/// connection writes that itself, with this message), else what the real dispatch
/// answers (mode none: always ready).
fn reply_for(frame: Frame, max: usize) -> Reply {
    match frame {
        Frame::TooLong => Reply::Error(ProtoError::new(
            ErrorCode::TooLong,
            format!("line longer than server.max_line_bytes = {max}"),
        )),
        Frame::Line(line) => {
            assert!(
                line.len() <= max,
                "a line longer than the limit got through"
            );
            match handle(limiter(), &line).0 {
                Pending::Ready(Some(reply)) => reply,
                _ => panic!("mode none must answer at once"),
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let max = 8 + usize::from(data[0]);
    let stream = &data[2..];
    let cut = usize::from(data[1]).min(stream.len());

    let mut decoder = LineDecoder::new(max);
    let mut buf = BytesMut::new();
    let mut out = BytesMut::new();
    let mut replies = 0usize;
    for chunk in [&stream[..cut], &stream[cut..]] {
        buf.extend_from_slice(chunk);
        while let Some(frame) = decoder.decode(&mut buf).expect("decode never fails") {
            reply_for(frame, max).encode(&mut out);
            replies += 1;
        }
    }
    while let Some(frame) = decoder.decode_eof(&mut buf).expect("decode never fails") {
        reply_for(frame, max).encode(&mut out);
        replies += 1;
    }

    let newlines = stream.iter().filter(|&&b| b == b'\n').count();
    let tail = stream.len()
        - stream
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |i| i + 1);
    let lines = newlines + usize::from(tail > 0);
    assert_eq!(replies, lines, "one reply per input line");
    // Every reply is exactly one line.
    assert_eq!(out.iter().filter(|&&b| b == b'\n').count(), replies);
    assert!(out.is_empty() || out.last() == Some(&b'\n'));
});
