//! The error replies of the protocol: a code and a one-line message.
//!
//! Every layer that refuses a request on the wire (the parser, the dispatcher, the
//! listener) speaks through [`ProtoError`]; messages are rendered printable here, once.

use std::fmt;

/// The error codes of docs/PROTOCOL.md, plus `PERM` (refused peer).
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
    /// `RELEASE` of a token the key does not hold (never handed out, already given
    /// back, or lapsed).
    Token,
    /// A parameter of `OVERRIDE` that the rule does not take, or a bad value.
    Param,
    /// The peer's credentials are not in `server.allow_uids` / `server.allow_gids`; sent
    /// once at connect, then the connection closes.
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
            ErrorCode::Token => "TOKEN",
            ErrorCode::Param => "PARAM",
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
