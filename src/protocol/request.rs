//! Request parsing: one line into a typed [`Request`], or the [`ProtoError`] saying why
//! not.
//!
//! Pure: no I/O, no clock, no configuration; the rule name is returned unresolved (the
//! limiter knows the rules, the parser does not).

use super::error::{printable, ErrorCode, ProtoError};

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

/// One verb of the protocol: its name (matched case-insensitively), whether only operators
/// send it (for the unknown-verb message), and the function that reads its fields.
struct Verb {
    name: &'static str,
    operator: bool,
    parse: ParseFn,
}

/// Reads a verb's fields into its [`Request`].
type ParseFn = for<'a> fn(&Args<'a>) -> Result<Request<'a>, ProtoError>;

impl Verb {
    /// A verb any allowed peer may send.
    const fn client(name: &'static str, parse: ParseFn) -> Verb {
        Verb {
            name,
            operator: false,
            parse,
        }
    }

    /// A verb only operators may send.
    const fn operator(name: &'static str, parse: ParseFn) -> Verb {
        Verb {
            name,
            operator: true,
            parse,
        }
    }
}

/// Every verb, in the order the unknown-verb message lists them. A new verb is one line
/// here and one small function below.
const VERBS: &[Verb] = &[
    Verb::client("CHECK", check),
    Verb::client("CHECKALL", check_all),
    Verb::client("REFUND", refund),
    Verb::client("ACQUIRE", acquire),
    Verb::client("RELEASE", release),
    Verb::client("PING", |args| args.none("PING", Request::Ping)),
    Verb::client("QUIT", |args| args.none("QUIT", Request::Quit)),
    Verb::operator("INSPECT", inspect),
    Verb::operator("RESET", reset),
    Verb::operator("OVERRIDE", override_),
    Verb::operator("RULES", |args| args.none("RULES", Request::Rules)),
    Verb::operator("TOP", top),
];

/// Most fields after the verb that are kept (a full `CHECKALL`); more are only counted.
const MAX_FIELDS: usize = 3 * MAX_TRIPLES;

/// The fields after the verb: the first [`MAX_FIELDS`] of them, and how many there were
/// (one more than [`MAX_FIELDS`] when there were more).
struct Args<'a> {
    fields: [&'a [u8]; MAX_FIELDS],
    count: usize,
}

impl<'a> Args<'a> {
    fn collect(fields: impl Iterator<Item = &'a [u8]>) -> Self {
        let mut args = Args {
            fields: [&[]; MAX_FIELDS],
            count: 0,
        };
        for field in fields {
            if args.count == MAX_FIELDS {
                args.count += 1;
                break;
            }
            args.fields[args.count] = field;
            args.count += 1;
        }
        args
    }

    /// The `i`th field; only called once the count says it is there.
    fn get(&self, i: usize) -> &'a [u8] {
        self.fields[i]
    }

    /// `PROTO` with `usage` unless the field count is in `arity`.
    fn arity(&self, arity: std::ops::RangeInclusive<usize>, usage: &str) -> Result<(), ProtoError> {
        if arity.contains(&self.count) {
            Ok(())
        } else {
            Err(ProtoError::new(ErrorCode::Proto, usage))
        }
    }

    /// The first two fields, `<rule> <key>`, the key checked.
    fn rule_key(&self) -> Result<(&'a [u8], &'a [u8]), ProtoError> {
        check_key(self.get(1))?;
        Ok((self.get(0), self.get(1)))
    }

    /// `request` when there are no fields, else `PROTO`.
    fn none(&self, verb: &str, request: Request<'a>) -> Result<Request<'a>, ProtoError> {
        if self.count == 0 {
            Ok(request)
        } else {
            Err(ProtoError::new(
                ErrorCode::Proto,
                format!("{verb} takes no arguments"),
            ))
        }
    }
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

/// `OVERRIDE <rule> <key> <param>=<value>... [ttl=<duration>]` or `OVERRIDE <rule> <key>
/// clear`: the fields are read by [`super::overrides::parse`].
fn override_<'a>(args: &Args<'a>) -> Result<Request<'a>, ProtoError> {
    if args.count > MAX_FIELDS {
        return Err(ProtoError::new(
            ErrorCode::Proto,
            "OVERRIDE takes <rule> <key> <param>=<value>... [ttl=<duration>], or <rule> <key> clear",
        ));
    }
    super::overrides::parse(args.fields[..args.count].iter().copied())
        .map(|o| Request::Override(Box::new(o)))
}

/// `PROTO` naming the verb sent and every verb of [`VERBS`].
fn unknown_verb(verb: &[u8]) -> ProtoError {
    let names = |operator: bool| {
        VERBS
            .iter()
            .filter(|v| v.operator == operator)
            .map(|v| v.name)
            .collect::<Vec<_>>()
            .join(", ")
    };
    ProtoError::new(
        ErrorCode::Proto,
        format!(
            "unknown verb '{}' (expected {}, or an operator's {})",
            printable(verb, 32),
            names(false),
            names(true)
        ),
    )
}

/// `CHECK <rule> <key> [<cost>]`.
fn check<'a>(args: &Args<'a>) -> Result<Request<'a>, ProtoError> {
    args.arity(2..=3, "CHECK takes <rule> <key> [<cost>]")?;
    let (rule, key) = args.rule_key()?;
    let cost = if args.count == 3 {
        parse_cost(args.get(2))?
    } else {
        1
    };
    Ok(Request::Check { rule, key, cost })
}

/// `CHECKALL`: 1 to [`MAX_TRIPLES`] whole triples; the field count is checked before any
/// key or cost.
fn check_all<'a>(args: &Args<'a>) -> Result<Request<'a>, ProtoError> {
    let count = args.count;
    if count == 0 || !count.is_multiple_of(3) || count > MAX_FIELDS {
        return Err(ProtoError::new(
            ErrorCode::Proto,
            format!(
                "CHECKALL takes 1 to {MAX_TRIPLES} triples <rule> <key> <cost> (got {} fields)",
                if count > MAX_FIELDS {
                    format!("more than {MAX_FIELDS}")
                } else {
                    count.to_string()
                }
            ),
        ));
    }
    let mut triples = Triples {
        items: [Triple::default(); MAX_TRIPLES],
        len: count / 3,
    };
    for (i, t) in args.fields[..count].chunks(3).enumerate() {
        check_key(t[1])?;
        triples.items[i] = Triple {
            rule: t[0],
            key: t[1],
            cost: parse_cost(t[2])?,
        };
    }
    Ok(Request::CheckAll(Box::new(triples)))
}

/// `REFUND <rule> <key> <units>`.
fn refund<'a>(args: &Args<'a>) -> Result<Request<'a>, ProtoError> {
    args.arity(3..=3, "REFUND takes <rule> <key> <units>")?;
    let (rule, key) = args.rule_key()?;
    let units = parse_cost(args.get(2))?;
    Ok(Request::Refund { rule, key, units })
}

/// `ACQUIRE <rule> <key>`.
fn acquire<'a>(args: &Args<'a>) -> Result<Request<'a>, ProtoError> {
    args.arity(2..=2, "ACQUIRE takes <rule> <key>")?;
    let (rule, key) = args.rule_key()?;
    Ok(Request::Acquire { rule, key })
}

/// `RELEASE <rule> <key> <token>`.
fn release<'a>(args: &Args<'a>) -> Result<Request<'a>, ProtoError> {
    args.arity(3..=3, "RELEASE takes <rule> <key> <token>")?;
    let (rule, key) = args.rule_key()?;
    let token = args.get(2);
    check_token(token)?;
    Ok(Request::Release { rule, key, token })
}

/// `INSPECT <rule> <key>` (operators only).
fn inspect<'a>(args: &Args<'a>) -> Result<Request<'a>, ProtoError> {
    args.arity(2..=2, "INSPECT takes <rule> <key>")?;
    let (rule, key) = args.rule_key()?;
    Ok(Request::Inspect { rule, key })
}

/// `RESET <rule> <key>` (operators only).
fn reset<'a>(args: &Args<'a>) -> Result<Request<'a>, ProtoError> {
    args.arity(2..=2, "RESET takes <rule> <key>")?;
    let (rule, key) = args.rule_key()?;
    Ok(Request::Reset { rule, key })
}

/// `TOP <rule> [<n>]` (operators only).
fn top<'a>(args: &Args<'a>) -> Result<Request<'a>, ProtoError> {
    args.arity(1..=2, "TOP takes <rule> [<n>]")?;
    let n = if args.count == 1 {
        DEFAULT_TOP_N
    } else {
        let field = args.get(1);
        parse_count(field).ok_or_else(|| {
            ProtoError::new(
                ErrorCode::Proto,
                format!(
                    "TOP <n> '{}' is not an integer from 1 to {MAX_TOP_N}",
                    printable(field, 32)
                ),
            )
        })?
    };
    Ok(Request::Top {
        rule: args.get(0),
        n,
    })
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
#[cfg(test)]
mod tests {
    use super::*;

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
            parse(b"acquire jobs user:1"),
            Ok(Request::Acquire {
                rule: b"jobs",
                key: b"user:1"
            })
        );
        assert_eq!(
            parse(b"RELEASE jobs user:1 17-a.1"),
            Ok(Request::Release {
                rule: b"jobs",
                key: b"user:1",
                token: b"17-a.1"
            })
        );
        assert_eq!(
            parse(b"CHECK a b 000000000007"),
            Ok(Request::Check {
                rule: b"a",
                key: b"b",
                cost: 7
            })
        );
        let eight = "CHECKALL".to_owned() + &" r k 2".repeat(8);
        match parse(eight.as_bytes()) {
            Ok(Request::CheckAll(t)) => {
                assert_eq!(t.as_slice().len(), 8);
                assert_eq!(
                    t.as_slice()[7],
                    Triple {
                        rule: b"r",
                        key: b"k",
                        cost: 2
                    }
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            parse(b"refund r k 3"),
            Ok(Request::Refund {
                rule: b"r",
                key: b"k",
                units: 3
            })
        );
        let max = format!("CHECK a b {MAX_COST}");
        assert!(parse(max.as_bytes()).is_ok());
    }

    #[test]
    fn parses_operator_verbs() {
        assert_eq!(
            parse(b"inspect api user:1"),
            Ok(Request::Inspect {
                rule: b"api",
                key: b"user:1"
            })
        );
        assert_eq!(
            parse(b"RESET api user:1"),
            Ok(Request::Reset {
                rule: b"api",
                key: b"user:1"
            })
        );
        assert_eq!(parse(b"RULES"), Ok(Request::Rules));
        assert_eq!(
            parse(b"TOP api"),
            Ok(Request::Top {
                rule: b"api",
                n: DEFAULT_TOP_N
            })
        );
        assert_eq!(parse(b"TOP api 3"), Ok(Request::Top { rule: b"api", n: 3 }));
        for bad in [
            "INSPECT api",
            "INSPECT api k x",
            "RESET api",
            "RULES x",
            "TOP",
            "TOP api 0",
            "TOP api 1001",
            "TOP api x",
            "TOP api 1 2",
            "TOP api 99999999999999999999",
        ] {
            assert_eq!(code(bad.as_bytes()), ErrorCode::Proto, "{bad}");
        }
        assert_eq!(code(b"INSPECT api k\x01"), ErrorCode::Key);
        assert_eq!(code(b"RESET api \x01"), ErrorCode::Key);
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
        assert_eq!(code(b"CHECKALL"), ErrorCode::Proto);
        assert_eq!(code(b"CHECKALL a b"), ErrorCode::Proto);
        assert_eq!(code(b"CHECKALL a b 1 c"), ErrorCode::Proto);
        assert_eq!(code(b"CHECKALL a b x c d 1"), ErrorCode::Cost);
        assert_eq!(code(b"CHECKALL a b\x01 1"), ErrorCode::Key);
        let nine = "CHECKALL".to_owned() + &" r k 1".repeat(9);
        assert_eq!(code(nine.as_bytes()), ErrorCode::Proto);
        assert_eq!(code(b"REFUND a b"), ErrorCode::Proto);
        assert_eq!(code(b"REFUND a b 1 2"), ErrorCode::Proto);
        assert_eq!(code(b"REFUND a b -1"), ErrorCode::Cost);
        assert_eq!(code(b"ACQUIRE a"), ErrorCode::Proto);
        assert_eq!(code(b"ACQUIRE a b 1"), ErrorCode::Proto);
        assert_eq!(code(b"RELEASE a b"), ErrorCode::Proto);
        assert_eq!(
            code(&[b"RELEASE a b ".as_slice(), &[b't'; 129]].concat()),
            ErrorCode::Token
        );
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
}
