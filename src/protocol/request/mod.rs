//! Request parsing: one line into a typed [`Request`], or the [`ProtoError`] saying why
//! not.
//!
//! Pure: no I/O, no clock, no configuration; the rule name is returned unresolved (the
//! limiter knows the rules, the parser does not).
//!
//! The grammar of each verb is [`verbs`] (the table of verbs, one small function each);
//! the fields the verbs share (key, cost, token, `TOP`'s count) are checked here.

#[cfg(test)]
mod tests;
mod verbs;

use super::error::{printable, ErrorCode, ProtoError};
use verbs::{unknown_verb, Args, VERBS};

/// Largest `cost` a request may carry (docs/PROTOCOL.md).
pub const MAX_COST: u64 = 1_000_000;
/// Longest key, in bytes (docs/PROTOCOL.md).
pub const MAX_KEY_LEN: usize = 256;
/// Longest slot token a `RELEASE` may name, in bytes (docs/PROTOCOL.md): the daemon's
/// tokens are at most about 60.
pub const MAX_TOKEN_LEN: usize = 128;

/// Most triples one `CHECKALL` may carry (docs/PROTOCOL.md).
pub const MAX_TRIPLES: usize = 8;

/// One `<rule> <key> <cost>` of a `CHECKALL`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Triple<'a> {
    /// The rule name as sent.
    pub rule: &'a [u8],
    /// A valid key.
    pub key: &'a [u8],
    /// 0..=1,000,000.
    pub cost: u32,
}

/// The 1 to [`MAX_TRIPLES`] triples of a `CHECKALL`, in request order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Triples<'a> {
    items: [Triple<'a>; MAX_TRIPLES],
    len: usize,
}

impl<'a> Triples<'a> {
    /// The triples, in request order.
    pub fn as_slice(&self) -> &[Triple<'a>] {
        &self.items[..self.len]
    }
}

/// Largest `<n>` of `TOP <rule> [<n>]` (the daemon returns at most as many keys as its
/// summary can vouch for, docs/PROTOCOL.md).
pub const MAX_TOP_N: u32 = 1000;
/// `TOP <rule>` without `<n>`: this many keys.
pub const DEFAULT_TOP_N: u32 = 10;

/// A parsed request line. Borrowed from the line; the rule is not resolved yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request<'a> {
    /// `CHECK <rule> <key> [<cost>]`: `key` is valid per docs/PROTOCOL.md, `cost` ≤ [`MAX_COST`].
    Check {
        /// The rule name as sent (looked up by the caller; unknown → `ERR RULE`).
        rule: &'a [u8],
        /// 1..=256 bytes in 0x21..=0x7E.
        key: &'a [u8],
        /// Units to take, 0..=1,000,000 (default 1).
        cost: u32,
    },
    /// `CHECKALL <rule> <key> <cost> [...]`: 1 to 8 triples, all or nothing (boxed: the
    /// other requests stay small).
    CheckAll(Box<Triples<'a>>),
    /// `REFUND <rule> <key> <units>`: give back up to `units` (0..=1,000,000).
    Refund {
        /// The rule name as sent.
        rule: &'a [u8],
        /// A valid key.
        key: &'a [u8],
        /// Units to give back.
        units: u32,
    },
    /// `ACQUIRE <rule> <key>`: take one of a concurrency rule's slots.
    Acquire {
        /// The rule name as sent.
        rule: &'a [u8],
        /// As in `CHECK`.
        key: &'a [u8],
    },
    /// `RELEASE <rule> <key> <token>`: give back the slot `token` names.
    Release {
        /// The rule name as sent.
        rule: &'a [u8],
        /// As in `CHECK`.
        key: &'a [u8],
        /// 1..=[`MAX_TOKEN_LEN`] bytes in 0x21..=0x7E.
        token: &'a [u8],
    },
    /// `PING` → `PONG`.
    Ping,
    /// `INSPECT <rule> <key>` (operators only): the key's state, one line of `name=value`.
    Inspect {
        /// The rule name as sent.
        rule: &'a [u8],
        /// A valid key.
        key: &'a [u8],
    },
    /// `RESET <rule> <key>` (operators only): the key's state deleted → `OK`.
    Reset {
        /// The rule name as sent.
        rule: &'a [u8],
        /// A valid key.
        key: &'a [u8],
    },
    /// `OVERRIDE <rule> <key> <param>=<value>... [ttl=<duration>]` or `OVERRIDE <rule>
    /// <key> clear` (operators only): a run-time override of the key's parameters →
    /// `OK` (boxed: the other requests stay small).
    Override(Box<super::overrides::OverrideRequest<'a>>),
    /// `RULES` (operators only): every rule and its parameters, one line of JSON.
    Rules,
    /// `TOP <rule> [<n>]` (operators only): the rule's hottest keys, one line of JSON.
    Top {
        /// The rule name as sent.
        rule: &'a [u8],
        /// Keys wanted, 1..=[`MAX_TOP_N`] (default [`DEFAULT_TOP_N`]).
        n: u32,
    },
    /// `QUIT` → `BYE`, then the connection closes.
    Quit,
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
    match VERBS
        .iter()
        .find(|v| verb.eq_ignore_ascii_case(v.name.as_bytes()))
    {
        Some(v) => (v.parse)(&Args::collect(fields)),
        None => Err(unknown_verb(verb)),
    }
}

/// A decimal integer from 1 to [`MAX_TOP_N`].
fn parse_count(field: &[u8]) -> Option<u32> {
    if field.is_empty() || field.len() > 10 || !field.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n = field
        .iter()
        .fold(0u64, |acc, &d| acc * 10 + u64::from(d - b'0'));
    (1..=u64::from(MAX_TOP_N)).contains(&n).then_some(n as u32)
}

pub(super) fn check_key(key: &[u8]) -> Result<(), ProtoError> {
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

/// A `RELEASE` token: what [`check_key`] accepts, at most [`MAX_TOKEN_LEN`] bytes.
fn check_token(token: &[u8]) -> Result<(), ProtoError> {
    if token.len() > MAX_TOKEN_LEN || token.iter().any(|b| !(0x21..=0x7e).contains(b)) {
        return Err(ProtoError::new(
            ErrorCode::Token,
            format!(
                "token '{}' is not one this daemon hands out (1 to {MAX_TOKEN_LEN} printable bytes)",
                printable(token, 40)
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
