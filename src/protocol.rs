//! The line protocol of CONTRACT §1: framing, request parsing and reply encoding.
//!
//! Everything here is pure (no I/O, no clock, no config beyond the line limit), so it
//! can be unit-, property- and fuzz-tested on its own.
//!
//! * [`LineDecoder`] splits a byte stream into lines, turning an over-long line into a
//!   single [`Frame::TooLong`] item and skipping to the next `\n` (tokio-util's
//!   `LinesCodec` would end the stream instead).
//! * [`parse`] turns one line into a [`Request`] or a [`ProtoError`].
//! * [`Reply`] is what goes back; [`Reply::encode`] appends its wire form.

use bytes::{Buf, BufMut, BytesMut};
use std::fmt;
use tokio_util::codec::Decoder;

/// Largest `cost` a request may carry (CONTRACT §1).
pub const MAX_COST: u64 = 1_000_000;
/// Longest key, in bytes (CONTRACT §1).
pub const MAX_KEY_LEN: usize = 256;

/// One item out of the [`LineDecoder`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// A complete line without its `\n` and without a `\r` just before it.
    Line(BytesMut),
    /// A line longer than the limit; its bytes were discarded up to the next `\n`.
    TooLong,
}

/// Splits a byte stream into [`Frame`]s of at most `max_line_bytes` bytes of content.
///
/// The limit counts the line's content, not its `\r\n`/`\n` terminator. When a line
/// exceeds it, the decoder yields [`Frame::TooLong`] as soon as that is known and then
/// discards input up to and including the next `\n`, so the connection stays usable.
#[derive(Debug)]
pub struct LineDecoder {
    max_line_bytes: usize,
    /// True while skipping the rest of an over-long line (its `TooLong` already yielded).
    discarding: bool,
    /// How far the buffer has already been searched for `\n` (avoids rescanning).
    scanned: usize,
}

impl LineDecoder {
    /// A decoder for lines of at most `max_line_bytes` bytes (terminator excluded).
    pub fn new(max_line_bytes: usize) -> Self {
        LineDecoder {
            max_line_bytes,
            discarding: false,
            scanned: 0,
        }
    }

    /// The line limit this decoder enforces, in bytes.
    pub fn max_line_bytes(&self) -> usize {
        self.max_line_bytes
    }
}

fn strip_cr(mut line: BytesMut) -> BytesMut {
    if line.last() == Some(&b'\r') {
        line.truncate(line.len() - 1);
    }
    line
}

impl Decoder for LineDecoder {
    type Item = Frame;
    type Error = std::io::Error;

    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, std::io::Error> {
        loop {
            let newline = buf[self.scanned..]
                .iter()
                .position(|&b| b == b'\n')
                .map(|i| i + self.scanned);
            if self.discarding {
                match newline {
                    Some(i) => {
                        buf.advance(i + 1);
                        self.discarding = false;
                        self.scanned = 0;
                        continue;
                    }
                    None => {
                        buf.clear();
                        self.scanned = 0;
                        return Ok(None);
                    }
                }
            }
            return Ok(match newline {
                Some(i) => {
                    self.scanned = 0;
                    let mut line = buf.split_to(i + 1);
                    line.truncate(i);
                    let line = strip_cr(line);
                    if line.len() > self.max_line_bytes {
                        Some(Frame::TooLong)
                    } else {
                        Some(Frame::Line(line))
                    }
                }
                // Without a `\n` yet: `max + 1` bytes could still be content plus `\r`,
                // anything beyond is certainly too long.
                None if buf.len() > self.max_line_bytes + 1 => {
                    buf.clear();
                    self.scanned = 0;
                    self.discarding = true;
                    Some(Frame::TooLong)
                }
                None => {
                    self.scanned = buf.len();
                    None
                }
            });
        }
    }

    fn decode_eof(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, std::io::Error> {
        if let Some(frame) = self.decode(buf)? {
            return Ok(Some(frame));
        }
        // A last line without `\n` is still a request; bytes of a discarded line are not.
        self.scanned = 0;
        if buf.is_empty() || self.discarding {
            buf.clear();
            self.discarding = false;
            return Ok(None);
        }
        let line = strip_cr(buf.split());
        Ok(Some(if line.len() > self.max_line_bytes {
            Frame::TooLong
        } else {
            Frame::Line(line)
        }))
    }
}

/// A parsed request line. Borrowed from the line; the rule is not resolved yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request<'a> {
    /// `CHECK <rule> <key> [<cost>]`: `key` is valid per CONTRACT §1, `cost` ≤ [`MAX_COST`].
    Check {
        /// The rule name as sent (looked up by the caller; unknown → `ERR RULE`).
        rule: &'a [u8],
        /// 1..=256 bytes in 0x21..=0x7E.
        key: &'a [u8],
        /// Units to take, 0..=1,000,000 (default 1).
        cost: u32,
    },
    /// `PING` → `PONG`.
    Ping,
    /// `QUIT` → `BYE`, then the connection closes.
    Quit,
}

/// The error codes of CONTRACT §1, plus `PERM` (refused peer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    /// Unknown verb, wrong field count, empty line.
    Proto,
    /// Unknown rule.
    Rule,
    /// Bad key.
    Key,
    /// Bad or impossible cost.
    Cost,
    /// Line longer than `server.max_line_bytes`.
    TooLong,
    /// Overloaded; retry.
    Busy,
    /// A bug or an unexpected state; retry.
    Internal,
    /// The peer's credentials are not in `server.allow_uids` / `server.allow_gids`; sent
    /// once at connect, then the connection closes. (Beyond CONTRACT §1's list.)
    Perm,
}

impl ErrorCode {
    /// The code as written on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::Proto => "PROTO",
            ErrorCode::Rule => "RULE",
            ErrorCode::Key => "KEY",
            ErrorCode::Cost => "COST",
            ErrorCode::TooLong => "TOO_LONG",
            ErrorCode::Busy => "BUSY",
            ErrorCode::Internal => "INTERNAL",
            ErrorCode::Perm => "PERM",
        }
    }
}

/// A request that cannot be served: its code and a one-line message for the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtoError {
    /// The wire code.
    pub code: ErrorCode,
    /// Human-readable, printable ASCII, no newline (see [`printable`]).
    pub message: String,
}

impl ProtoError {
    /// An error with `code` and `message` (the message is made printable).
    pub fn new(code: ErrorCode, message: impl AsRef<[u8]>) -> Self {
        ProtoError {
            code,
            message: printable(message.as_ref(), 200),
        }
    }
}

impl fmt::Display for ProtoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ERR {} {}", self.code.as_str(), self.message)
    }
}

/// Renders untrusted bytes for a message: printable ASCII kept, anything else as `\xNN`,
/// cut to about `max` bytes with `...`. The result never contains a newline.
pub fn printable(bytes: &[u8], max: usize) -> String {
    let mut out = String::with_capacity(bytes.len().min(max) + 8);
    for &b in bytes {
        if out.len() >= max {
            out.push_str("...");
            break;
        }
        if (0x20..0x7f).contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

fn is_field_separator(b: &u8) -> bool {
    *b == b' ' || *b == b'\t'
}

/// Parses one line (without its terminator) into a [`Request`].
///
/// Fields are separated by runs of spaces or tabs; verbs are case-insensitive. Checks, in
/// order: empty line, verb, field count, key, cost. The rule name is returned unresolved.
///
/// # Errors
/// `PROTO` for an empty line, unknown verb or wrong field count; `KEY` for a key that is
/// empty, longer than 256 bytes or has a byte outside 0x21..=0x7E; `COST` for a cost
/// that is not a decimal integer in 0..=1,000,000.
pub fn parse(line: &[u8]) -> Result<Request<'_>, ProtoError> {
    let mut fields = line
        .split(is_field_separator)
        .filter(|field| !field.is_empty());
    let Some(verb) = fields.next() else {
        return Err(ProtoError::new(ErrorCode::Proto, "empty line"));
    };
    let mut args: [&[u8]; 3] = [&[]; 3];
    let mut count = 0;
    for field in fields {
        if count == args.len() {
            count += 1;
            break;
        }
        args[count] = field;
        count += 1;
    }
    if verb.eq_ignore_ascii_case(b"CHECK") {
        if !(2..=3).contains(&count) {
            return Err(ProtoError::new(
                ErrorCode::Proto,
                "CHECK takes <rule> <key> [<cost>]",
            ));
        }
        let key = args[1];
        check_key(key)?;
        let cost = if count == 3 { parse_cost(args[2])? } else { 1 };
        Ok(Request::Check {
            rule: args[0],
            key,
            cost,
        })
    } else if verb.eq_ignore_ascii_case(b"PING") {
        no_args("PING", count, Request::Ping)
    } else if verb.eq_ignore_ascii_case(b"QUIT") {
        no_args("QUIT", count, Request::Quit)
    } else {
        Err(ProtoError::new(
            ErrorCode::Proto,
            format!(
                "unknown verb '{}' (expected CHECK, PING or QUIT)",
                printable(verb, 32)
            ),
        ))
    }
}

fn no_args<'a>(verb: &str, count: usize, request: Request<'a>) -> Result<Request<'a>, ProtoError> {
    if count == 0 {
        Ok(request)
    } else {
        Err(ProtoError::new(
            ErrorCode::Proto,
            format!("{verb} takes no arguments"),
        ))
    }
}

fn check_key(key: &[u8]) -> Result<(), ProtoError> {
    if key.len() > MAX_KEY_LEN {
        return Err(ProtoError::new(
            ErrorCode::Key,
            format!("key is {} bytes, the limit is {MAX_KEY_LEN}", key.len()),
        ));
    }
    if let Some(pos) = key.iter().position(|b| !(0x21..=0x7e).contains(b)) {
        return Err(ProtoError::new(
            ErrorCode::Key,
            format!(
                "key has byte 0x{:02x} at offset {pos}; keys are printable ASCII without spaces (percent-encode the rest)",
                key[pos]
            ),
        ));
    }
    Ok(())
}

fn parse_cost(field: &[u8]) -> Result<u32, ProtoError> {
    let bad = || {
        ProtoError::new(
            ErrorCode::Cost,
            format!(
                "cost '{}' is not an integer from 0 to {MAX_COST}",
                printable(field, 32)
            ),
        )
    };
    if field.is_empty() || !field.iter().all(u8::is_ascii_digit) {
        return Err(bad());
    }
    // Leading zeros are fine; saturate so a huge number cannot overflow.
    let cost = field.iter().fold(0u64, |acc, &d| {
        (acc * 10 + u64::from(d - b'0')).min(MAX_COST + 1)
    });
    if cost > MAX_COST {
        return Err(bad());
    }
    Ok(cost as u32)
}

/// Who made a decision (the `source` field of CONTRACT §1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// Decided by the Lua script in Redis.
    Redis,
    /// A recent DENY from Redis remembered by this daemon.
    Cache,
    /// A local bucket (Redis unreachable, or `redis.mode = "none"`).
    Local,
    /// Redis unreachable and the rule says `on_redis_failure = "allow"`.
    FailOpen,
    /// Redis unreachable and the rule says `on_redis_failure = "deny"`.
    FailClosed,
}

impl Source {
    /// The name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Redis => "redis",
            Source::Cache => "cache",
            Source::Local => "local",
            Source::FailOpen => "fail_open",
            Source::FailClosed => "fail_closed",
        }
    }
}

/// The answer to a `CHECK`: the six fields of CONTRACT §1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// `ALLOW` when true, `DENY` when false.
    pub allowed: bool,
    /// The capacity (buckets) or limit (windows) enforced for this decision.
    pub limit: u64,
    /// Units the key could still take now (floor).
    pub remaining: u64,
    /// ms until the key is back to fully unused (ceil).
    pub reset_ms: u64,
    /// On DENY, ms until the same request could be allowed (ceil); on ALLOW, 0 except
    /// for traffic-shaping algorithms.
    pub wait_ms: u64,
    /// Who decided.
    pub source: Source,
}

/// One reply line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// The reply to `CHECK`: the decision, then the rule's policy window in ms (see
    /// [`crate::config::Algorithm::window_ms`]), sent as a seventh field so that clients
    /// can state the quota policy (`RateLimit-Policy: …;w=`) without knowing the rule.
    Decision(Decision, u64),
    /// The reply to `PING`.
    Pong,
    /// The reply to `QUIT` (the connection closes after it).
    Bye,
    /// `ERR <CODE> <message>`.
    Error(ProtoError),
}

impl From<ProtoError> for Reply {
    fn from(e: ProtoError) -> Self {
        Reply::Error(e)
    }
}

impl Reply {
    /// Appends the reply's wire form, `\n` included, to `out`.
    pub fn encode(&self, out: &mut BytesMut) {
        match self {
            Reply::Decision(d, window_ms) => {
                let mut num = itoa::Buffer::new();
                out.reserve(72);
                out.put_slice(if d.allowed { b"ALLOW " } else { b"DENY " });
                for n in [d.limit, d.remaining, d.reset_ms, d.wait_ms] {
                    out.put_slice(num.format(n).as_bytes());
                    out.put_u8(b' ');
                }
                out.put_slice(d.source.as_str().as_bytes());
                out.put_u8(b' ');
                out.put_slice(num.format(*window_ms).as_bytes());
            }
            Reply::Pong => out.put_slice(b"PONG"),
            Reply::Bye => out.put_slice(b"BYE"),
            Reply::Error(e) => {
                out.put_slice(b"ERR ");
                out.put_slice(e.code.as_str().as_bytes());
                out.put_u8(b' ');
                out.put_slice(e.message.as_bytes());
            }
        }
        out.put_u8(b'\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn frames(max: usize, chunks: &[&[u8]], eof: bool) -> Vec<Frame> {
        let mut dec = LineDecoder::new(max);
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for chunk in chunks {
            buf.extend_from_slice(chunk);
            while let Some(f) = dec.decode(&mut buf).unwrap() {
                out.push(f);
            }
        }
        if eof {
            while let Some(f) = dec.decode_eof(&mut buf).unwrap() {
                out.push(f);
            }
        }
        out
    }

    fn line(s: &str) -> Frame {
        Frame::Line(BytesMut::from(s))
    }

    #[test]
    fn splits_lines_and_strips_cr() {
        assert_eq!(
            frames(16, &[b"PING\r\nQU", b"IT\n\n"], false),
            vec![line("PING"), line("QUIT"), line("")]
        );
    }

    #[test]
    fn too_long_is_one_frame_and_the_next_line_survives() {
        // Known too long before the newline arrives.
        let got = frames(8, &[b"0123456789abc", b"defgh", b"ij\nPING\n"], false);
        assert_eq!(got, vec![Frame::TooLong, line("PING")]);
        // Known too long only when the newline arrives.
        let got = frames(8, &[b"012345678\nPING\n"], false);
        assert_eq!(got, vec![Frame::TooLong, line("PING")]);
        // Exactly the limit, with \r\n, is fine.
        let got = frames(8, &[b"01234567\r\n"], false);
        assert_eq!(got, vec![line("01234567")]);
    }

    #[test]
    fn last_line_without_newline_is_served_at_eof() {
        assert_eq!(frames(8, &[b"PING"], true), vec![line("PING")]);
        assert_eq!(frames(8, &[b"0123456789xyz"], true), vec![Frame::TooLong]);
        assert_eq!(frames(8, &[b""], true), vec![]);
    }

    #[test]
    fn parses_requests() {
        assert_eq!(
            parse(b"CHECK rides_request user:42"),
            Ok(Request::Check {
                rule: b"rides_request",
                key: b"user:42",
                cost: 1
            })
        );
        assert_eq!(
            parse(b" \tcheck\t a  b 0 "),
            Ok(Request::Check {
                rule: b"a",
                key: b"b",
                cost: 0
            })
        );
        assert_eq!(parse(b"ping"), Ok(Request::Ping));
        assert_eq!(parse(b"Quit"), Ok(Request::Quit));
        assert_eq!(
            parse(b"CHECK a b 000000000007"),
            Ok(Request::Check {
                rule: b"a",
                key: b"b",
                cost: 7
            })
        );
        let max = format!("CHECK a b {MAX_COST}");
        assert!(parse(max.as_bytes()).is_ok());
    }

    fn code(line: &[u8]) -> ErrorCode {
        parse(line).unwrap_err().code
    }

    #[test]
    fn rejects_bad_requests_with_their_code() {
        assert_eq!(code(b""), ErrorCode::Proto);
        assert_eq!(code(b"  \t "), ErrorCode::Proto);
        assert_eq!(code(b"FETCH a b"), ErrorCode::Proto);
        assert_eq!(code(b"CHECK a"), ErrorCode::Proto);
        assert_eq!(code(b"CHECK a b 1 2"), ErrorCode::Proto);
        assert_eq!(code(b"PING x"), ErrorCode::Proto);
        assert_eq!(code(b"CHECK a b\x01c"), ErrorCode::Key);
        assert_eq!(code("CHECK a bé".as_bytes()), ErrorCode::Key);
        assert_eq!(
            code(&[b"CHECK a ".as_slice(), &[b'k'; 257]].concat()),
            ErrorCode::Key
        );
        for cost in ["-1", "+1", "1.5", "x", "1000001", "99999999999999999999"] {
            assert_eq!(
                code(format!("CHECK a b {cost}").as_bytes()),
                ErrorCode::Cost,
                "{cost}"
            );
        }
    }

    #[test]
    fn encodes_replies() {
        let mut out = BytesMut::new();
        Reply::Decision(
            Decision {
                allowed: true,
                limit: 20,
                remaining: 19,
                reset_ms: 100,
                wait_ms: 0,
                source: Source::Redis,
            },
            2000,
        )
        .encode(&mut out);
        Reply::Pong.encode(&mut out);
        Reply::Error(ProtoError::new(ErrorCode::Rule, "unknown rule 'x\n'")).encode(&mut out);
        assert_eq!(
            &out[..],
            b"ALLOW 20 19 100 0 redis 2000\nPONG\nERR RULE unknown rule 'x\\x0a'\n"
        );
    }

    proptest! {
        /// Any byte soup, cut anywhere: every `\n`-terminated line yields exactly one frame,
        /// and every frame parses or errors without panicking; error messages are one line.
        #[test]
        fn one_frame_per_line(data in proptest::collection::vec(any::<u8>(), 0..2048),
                              cut in 0usize..2048, max in 1usize..64) {
            let cut = cut.min(data.len());
            let got = frames(max, &[&data[..cut], &data[cut..]], false);
            let lines = data.iter().filter(|&&b| b == b'\n').count();
            // An unterminated last line already known to be too long is answered early.
            let tail = data.len() - data.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
            prop_assert_eq!(got.len(), lines + usize::from(tail > max + 1));
            for f in got {
                if let Frame::Line(l) = f {
                    prop_assert!(l.len() <= max);
                    let mut out = BytesMut::new();
                    match parse(&l) {
                        Ok(_) => {}
                        Err(e) => Reply::Error(e).encode(&mut out),
                    }
                    prop_assert!(out.iter().filter(|&&b| b == b'\n').count() <= 1);
                }
            }
        }

        #[test]
        fn valid_checks_roundtrip(rule in "[a-z_]{1,20}", key in "[!-~]{1,256}", cost in 0u32..=1_000_000) {
            let l = format!("CHECK {rule} {key} {cost}");
            prop_assert_eq!(parse(l.as_bytes()), Ok(Request::Check { rule: rule.as_bytes(), key: key.as_bytes(), cost }));
        }
    }
}
