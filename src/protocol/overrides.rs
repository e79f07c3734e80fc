//! `OVERRIDE <rule> <key> <param>=<value>... [ttl=<duration>]` and `OVERRIDE <rule>
//! <key> clear` on the wire: the fields split into pairs and a ttl, before any rule is
//! looked up (which parameters a rule takes is the limiter's to say, as for
//! `[[rule.override]]`).

use super::error::{printable, ErrorCode, ProtoError};
use super::request::check_key;

/// An `OVERRIDE` request: the key's new parameters, or `clear`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverrideRequest<'a> {
    /// The rule name as sent.
    pub rule: &'a [u8],
    /// A valid key.
    pub key: &'a [u8],
    /// `(param, value)` pairs, at most [`MAX_OVERRIDE_PARAMS`], unchecked (the rule's
    /// algorithm says which it takes); empty for `clear`.
    pub params: Vec<(&'a str, &'a str)>,
    /// `ttl=`: how long the override lasts, ms; `None` until cleared.
    pub ttl_ms: Option<u64>,
}

/// Most `param=value` pairs an `OVERRIDE` names (an algorithm takes two).
pub const MAX_OVERRIDE_PARAMS: usize = 4;

/// Longest `ttl=` of an `OVERRIDE`: a year, ms.
pub const MAX_OVERRIDE_TTL_MS: u64 = 366 * 24 * 3600 * 1000;

/// The fields after `OVERRIDE`: `<rule> <key>`, then `clear`, or 1 to
/// [`MAX_OVERRIDE_PARAMS`] `param=value` pairs and an optional `ttl=<duration>` (a whole
/// number of ms from 1 ms to [`MAX_OVERRIDE_TTL_MS`]).
pub(super) fn parse<'a>(
    mut fields: impl Iterator<Item = &'a [u8]>,
) -> Result<OverrideRequest<'a>, ProtoError> {
    const USAGE: &str =
        "OVERRIDE takes <rule> <key> <param>=<value>... [ttl=<duration>], or <rule> <key> clear";
    let proto = || ProtoError::new(ErrorCode::Proto, USAGE);
    let (Some(rule), Some(key)) = (fields.next(), fields.next()) else {
        return Err(proto());
    };
    check_key(key)?;
    let rest: Vec<&[u8]> = fields.take(MAX_OVERRIDE_PARAMS + 2).collect();
    let mut request = OverrideRequest {
        rule,
        key,
        params: Vec::new(),
        ttl_ms: None,
    };
    if let [clear] = rest[..] {
        if clear.eq_ignore_ascii_case(b"clear") {
            return Ok(request);
        }
    }
    if rest.is_empty() || rest.len() > MAX_OVERRIDE_PARAMS + 1 {
        return Err(proto());
    }
    for field in rest {
        let pair = std::str::from_utf8(field)
            .ok()
            .and_then(|f| f.split_once('='))
            .filter(|(p, v)| !p.is_empty() && !v.is_empty());
        let Some((param, value)) = pair else {
            return Err(ProtoError::new(
                ErrorCode::Param,
                format!("'{}' is not <param>=<value>", printable(field, 64)),
            ));
        };
        if param == "ttl" {
            request.ttl_ms = Some(parse_ttl(value)?);
        } else {
            request.params.push((param, value));
        }
    }
    if request.params.is_empty() || request.params.len() > MAX_OVERRIDE_PARAMS {
        return Err(proto());
    }
    Ok(request)
}

/// `ttl=`'s value: a duration such as `90s` or `1h`, a whole number of ms from 1 ms to
/// [`MAX_OVERRIDE_TTL_MS`].
fn parse_ttl(value: &str) -> Result<u64, ProtoError> {
    let bad = || {
        ProtoError::new(
            ErrorCode::Param,
            format!(
                "ttl: '{}' is not a duration of 1ms to 366d such as \"90s\" or \"1h\"",
                printable(value.as_bytes(), 32)
            ),
        )
    };
    let d = humantime::parse_duration(value).map_err(|_| bad())?;
    let ms = u64::try_from(d.as_millis()).map_err(|_| bad())?;
    if d.subsec_nanos() % 1_000_000 != 0 || !(1..=MAX_OVERRIDE_TTL_MS).contains(&ms) {
        return Err(bad());
    }
    Ok(ms)
}

#[cfg(test)]
mod tests {
    use super::super::{parse as line, Request};
    use super::*;

    fn of(text: &str) -> Result<OverrideRequest<'_>, ProtoError> {
        match line(text.as_bytes())? {
            Request::Override(o) => Ok(*o),
            other => panic!("{text}: {other:?}"),
        }
    }

    #[test]
    fn parses_pairs_a_ttl_and_clear() {
        let o = of("OVERRIDE api t:1 capacity=200 refill_rate=50 ttl=90s").unwrap();
        assert_eq!((o.rule, o.key), (&b"api"[..], &b"t:1"[..]));
        assert_eq!(o.params, vec![("capacity", "200"), ("refill_rate", "50")]);
        assert_eq!(o.ttl_ms, Some(90_000));
        let o = of("override api t:1 CLEAR").unwrap();
        assert!(o.params.is_empty() && o.ttl_ms.is_none());
    }

    #[test]
    fn refuses_bad_fields() {
        for (text, code) in [
            ("OVERRIDE api", ErrorCode::Proto),
            ("OVERRIDE api k", ErrorCode::Proto),
            ("OVERRIDE api k ttl=1s", ErrorCode::Proto),
            ("OVERRIDE api k a=1 b=2 c=3 d=4 e=5", ErrorCode::Proto),
            ("OVERRIDE api k capacity", ErrorCode::Param),
            ("OVERRIDE api k =5", ErrorCode::Param),
            ("OVERRIDE api k capacity=5 ttl=soon", ErrorCode::Param),
            ("OVERRIDE api k capacity=5 ttl=0s", ErrorCode::Param),
            ("OVERRIDE api k capacity=5 ttl=400d", ErrorCode::Param),
            ("OVERRIDE api k\x01 capacity=5", ErrorCode::Key),
        ] {
            assert_eq!(of(text).map(|_| ()).unwrap_err().code, code, "{text}");
        }
    }
}
