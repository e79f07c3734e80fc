//! The request grammar: every verb of the protocol (its name, whether only operators
//! send it) and the function that reads its fields into a [`Request`]. A new verb is one
//! line of [`VERBS`] and one small function here.

use super::{
    check_key, check_token, parse_cost, parse_count, Request, Triple, Triples, DEFAULT_TOP_N,
    MAX_TOP_N, MAX_TRIPLES,
};
use crate::protocol::error::{printable, ErrorCode, ProtoError};

/// One verb of the protocol: its name (matched case-insensitively), whether only operators
/// send it (for the unknown-verb message), and the function that reads its fields.
pub(super) struct Verb {
    pub(super) name: &'static str,
    operator: bool,
    pub(super) parse: ParseFn,
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
pub(super) const VERBS: &[Verb] = &[
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
pub(super) struct Args<'a> {
    fields: [&'a [u8]; MAX_FIELDS],
    count: usize,
}

impl<'a> Args<'a> {
    pub(super) fn collect(fields: impl Iterator<Item = &'a [u8]>) -> Self {
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

/// `OVERRIDE <rule> <key> <param>=<value>... [ttl=<duration>]` or `OVERRIDE <rule> <key>
/// clear`: the fields are read by [`crate::protocol::overrides::parse`].
fn override_<'a>(args: &Args<'a>) -> Result<Request<'a>, ProtoError> {
    if args.count > MAX_FIELDS {
        return Err(ProtoError::new(
            ErrorCode::Proto,
            "OVERRIDE takes <rule> <key> <param>=<value>... [ttl=<duration>], or <rule> <key> clear",
        ));
    }
    crate::protocol::overrides::parse(args.fields[..args.count].iter().copied())
        .map(|o| Request::Override(Box::new(o)))
}

/// `PROTO` naming the verb sent and every verb of [`VERBS`].
pub(super) fn unknown_verb(verb: &[u8]) -> ProtoError {
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
