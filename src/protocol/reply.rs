//! Reply encoding: what goes back on the wire for each request, one line each.
//!
//! Pure: appends bytes to a buffer; the connection writes them.

use super::error::ProtoError;
use crate::decision::Decision;
use bytes::{BufMut, BytesMut};

/// One reply line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// The reply to `CHECK`: the decision, then the rule's policy window in ms (see
    /// [`crate::config::Algorithm::window_ms`]), sent as a seventh field so that clients
    /// can state the quota policy (`RateLimit-Policy: …;w=`) without knowing the rule.
    Decision(Decision, u64),
    /// The reply to `CHECKALL` (and to `CHECK` of a composite rule): the binding
    /// decision and its policy window, as [`Reply::Decision`], then the binding rule's
    /// name as one more field.
    Bound(Decision, u64, String),
    /// The reply to an `ACQUIRE` that took a slot: the decision's fields with
    /// `reset_ms`, `wait_ms` and the window 0, then the slot's token.
    Acquired(Decision, String),
    /// `OK`: a `RELEASE` that gave a slot back, a `RESET`.
    Ok,
    /// The reply to `PING`.
    Pong,
    /// The reply to `QUIT` (the connection closes after it).
    Bye,
    /// `ERR <CODE> <message>`.
    Error(ProtoError),
    /// One line of text: `INSPECT`'s `name=value` fields, `RULES`' and `TOP`'s JSON. A
    /// line break inside it is sent as a space (one reply is one line, whatever it holds).
    Text(String),
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
                // Built on the stack and appended at once: one bounds check and one copy
                // instead of one per field (a reply is at most 6 + 4 × 21 + 12 + 20 bytes).
                let mut line = Line::default();
                line.push(if d.allowed { b"ALLOW " } else { b"DENY " });
                for n in [d.limit, d.remaining, d.reset_ms, d.wait_ms] {
                    line.number(n);
                    line.push(b" ");
                }
                line.push(d.source.as_str().as_bytes());
                line.push(b" ");
                line.number(*window_ms);
                line.push(b"\n");
                out.extend_from_slice(line.as_bytes());
                return;
            }
            Reply::Bound(d, window_ms, rule) => {
                Reply::Decision(*d, *window_ms).encode(out);
                // Replace the newline with " <rule>\n" (rule names are ASCII without
                // spaces, checked by the configuration).
                out.truncate(out.len() - 1);
                out.put_u8(b' ');
                out.put_slice(rule.as_bytes());
            }
            Reply::Acquired(d, token) => {
                out.put_slice(b"ALLOW ");
                for n in [d.limit, d.remaining, 0, 0] {
                    out.put_slice(itoa::Buffer::new().format(n).as_bytes());
                    out.put_u8(b' ');
                }
                out.put_slice(d.source.as_str().as_bytes());
                out.put_slice(b" 0 ");
                out.put_slice(token.as_bytes());
            }
            Reply::Ok => out.put_slice(b"OK"),
            Reply::Pong => out.put_slice(b"PONG"),
            Reply::Bye => out.put_slice(b"BYE"),
            Reply::Text(text) => {
                let start = out.len();
                out.put_slice(text.as_bytes());
                for b in &mut out[start..] {
                    if *b == b'\n' || *b == b'\r' {
                        *b = b' ';
                    }
                }
            }
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

/// A reply line assembled on the stack (longer input is cut, never a panic: no reply
/// comes near the size).
struct Line {
    buf: [u8; 160],
    len: usize,
}

impl Default for Line {
    fn default() -> Self {
        Line {
            buf: [0; 160],
            len: 0,
        }
    }
}

impl Line {
    fn push(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if let Some(slot) = self.buf.get_mut(self.len) {
                *slot = b;
                self.len += 1;
            }
        }
    }

    fn number(&mut self, n: u64) {
        self.push(itoa::Buffer::new().format(n).as_bytes());
    }

    fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::Source;
    use crate::protocol::ErrorCode;

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
        Reply::Acquired(
            Decision {
                allowed: true,
                limit: 20,
                remaining: 19,
                reset_ms: 0,
                wait_ms: 0,
                source: Source::Redis,
            },
            "1700000000000000-a.1".into(),
        )
        .encode(&mut out);
        Reply::Ok.encode(&mut out);
        Reply::Pong.encode(&mut out);
        Reply::Bound(
            Decision {
                allowed: false,
                limit: 60,
                remaining: 0,
                reset_ms: 5,
                wait_ms: 7,
                source: Source::Redis,
            },
            1000,
            "y".into(),
        )
        .encode(&mut out);
        Reply::Error(ProtoError::new(ErrorCode::Rule, "unknown rule 'x\n'")).encode(&mut out);
        assert_eq!(
            &out[..],
            b"ALLOW 20 19 100 0 redis 2000\nALLOW 20 19 0 0 redis 0 1700000000000000-a.1\nOK\nPONG\nDENY 60 0 5 7 redis 1000 y\nERR RULE unknown rule 'x\\x0a'\n"
        );
        out.clear();
        Reply::Ok.encode(&mut out);
        Reply::Text("{\"a\":1}\nx\r".into()).encode(&mut out);
        assert_eq!(&out[..], b"OK\n{\"a\":1} x \n");
    }
}
