//! The operator verbs on the wire: `INSPECT`, `RESET`, `OVERRIDE`, `RULES`, `TOP` (docs/PROTOCOL.md
//! "Operator verbs"), for peers in `server.admin_uids` / `admin_gids` only; any other
//! peer gets `ERR PERM` and its connection stays open.
//!
//! The limiter answers ([`Limiter::inspect`], [`Limiter::reset`], [`Limiter::rules`],
//! [`Limiter::top_keys`]); this module checks the peer and turns the answers into one
//! line each: `name=value` fields for `INSPECT`, JSON (serde_json) for `RULES` and
//! `TOP`. Keys appear in these replies only, never in a log line or a metrics label.

use super::dispatch::Answer;
use crate::admission::Peer;
use crate::algorithm::Family;
use crate::config::{OnRedisFailure, Rule};
use crate::hot_keys::HotKey;
use crate::limiter::{CheckError, Inspection, Limiter};
use crate::metrics;
use crate::protocol::{self, ErrorCode, ProtoError, Reply, Request};
use serde_json::{json, Map, Value};
use std::sync::Arc;

/// Answers an operator verb for `peer`, or `None` if `request` is not one.
pub fn handle(limiter: &Arc<Limiter>, request: &Request<'_>, peer: &Peer) -> Option<Answer> {
    let verb = match request {
        Request::Inspect { .. } => "INSPECT",
        Request::Reset { .. } => "RESET",
        Request::Override(_) => "OVERRIDE",
        Request::Rules => "RULES",
        Request::Top { .. } => "TOP",
        _ => return None,
    };
    if !peer.is_admin() {
        return Some(error(ProtoError::new(
            ErrorCode::Perm,
            format!(
                "{verb} is an operator verb: peer uid {} gid {} is not in server.admin_uids / server.admin_gids",
                peer.uid, peer.gid
            ),
        )));
    }
    Some(match *request {
        Request::Inspect { rule, key } => match limiter.inspect(rule, key, peer) {
            Ok(pending) => {
                let key = String::from_utf8_lossy(key).into_owned();
                Answer::Pending(Box::pin(async move {
                    Reply::Text(inspect_line(&key, &pending.await))
                }))
            }
            Err(e) => refused(e, rule),
        },
        Request::Reset { rule, key } => match limiter.reset(rule, key, peer) {
            Ok(pending) => Answer::Pending(Box::pin(async move {
                match pending.await {
                    Ok(()) => Reply::Ok,
                    Err(why) => {
                        metrics::error_reply(ErrorCode::Internal);
                        ProtoError::new(ErrorCode::Internal, why).into()
                    }
                }
            })),
            Err(e) => refused(e, rule),
        },
        Request::Override(ref o) => {
            match limiter.set_override(o.rule, o.key, &o.params, o.ttl_ms, peer) {
                Ok(pending) => Answer::Pending(Box::pin(async move {
                    match pending.await {
                        Ok(()) => Reply::Ok,
                        Err(why) => {
                            metrics::error_reply(ErrorCode::Internal);
                            ProtoError::new(ErrorCode::Internal, why).into()
                        }
                    }
                })),
                Err(e) => refused(e, o.rule),
            }
        }
        Request::Rules => {
            let rules: Vec<Value> = limiter.rules().iter().map(|r| rule_json(r)).collect();
            ready(Reply::Text(json!({ "rules": rules }).to_string()))
        }
        Request::Top { rule, n } => {
            let name = std::str::from_utf8(rule).unwrap_or("");
            match limiter.top_keys(name, n as usize) {
                Some(keys) => ready(Reply::Text(top_json(name, &keys))),
                None => refused(CheckError::UnknownRule, rule),
            }
        }
        _ => return None,
    })
}

fn ready(reply: Reply) -> Answer {
    Answer::Ready(Some(reply))
}

fn error(e: ProtoError) -> Answer {
    metrics::error_reply(e.code);
    ready(e.into())
}

/// The `ERR` reply of an operator verb the limiter refused.
fn refused(e: CheckError, rule: &[u8]) -> Answer {
    error(match e {
        CheckError::UnknownRule => ProtoError::new(
            ErrorCode::Rule,
            format!("unknown rule '{}'", protocol::printable(rule, 64)),
        ),
        CheckError::KeyTooLong => ProtoError::new(ErrorCode::Key, e.to_string()),
        CheckError::Busy { .. } => ProtoError::new(ErrorCode::Busy, e.to_string()),
        CheckError::Override { .. } => ProtoError::new(ErrorCode::Param, e.to_string()),
        other => ProtoError::new(ErrorCode::Internal, other.to_string()),
    })
}

/// A rule's parameters as configured, by their config names, in a fixed order:
/// `algorithm`, `capacity` and its rate or `limit` and `window`, `window_ms` (the
/// policy window), `on_redis_failure`, `fallback_hosts`, `lease`, `shadow`, `allow_uids`,
/// `allow_gids`.
pub fn parameters(rule: &Rule) -> Vec<(&'static str, Value)> {
    let a = &rule.algorithm;
    let mut out = vec![("algorithm", json!(a.kind.as_str()))];
    match a.kind.spec().family {
        Family::Bucket { rate } => {
            out.push(("capacity", json!(a.limit)));
            out.push((rate, json!(a.per.rate())));
        }
        Family::Window { .. } => {
            let window = std::time::Duration::from_millis(a.per.window_ms());
            out.push(("limit", json!(a.limit)));
            out.push((
                "window",
                json!(humantime::format_duration(window).to_string()),
            ));
        }
        Family::Slots => {
            let hold = std::time::Duration::from_millis(a.per.window_ms());
            out.push(("limit", json!(a.limit)));
            out.push((
                "max_hold",
                json!(humantime::format_duration(hold).to_string()),
            ));
        }
    }
    out.push(("window_ms", json!(rule.window_ms)));
    let on_failure = match rule.on_redis_failure {
        OnRedisFailure::Local => "local",
        OnRedisFailure::Allow => "allow",
        OnRedisFailure::Deny => "deny",
    };
    out.push(("on_redis_failure", json!(on_failure)));
    out.push((
        "fallback_hosts",
        if rule.fallback_auto {
            json!("auto")
        } else {
            json!(rule.fallback_hosts)
        },
    ));
    out.push(("lease", json!(if rule.lease { "auto" } else { "off" })));
    out.push(("shadow", json!(rule.shadow)));
    out.push(("allow_uids", json!(rule.access.uids)));
    out.push(("allow_gids", json!(rule.access.gids)));
    out
}

/// One rule of `RULES`: `{"name": …, <parameters>}`.
fn rule_json(rule: &Rule) -> Value {
    let mut m = Map::new();
    m.insert("name".into(), json!(rule.name));
    for (name, value) in parameters(rule) {
        m.insert(name.into(), value);
    }
    Value::Object(m)
}

/// `TOP`'s line: the rule, the error bound, the keys most decided first.
fn top_json(rule: &str, keys: &[HotKey]) -> String {
    let max_error = keys.first().map_or(0, |k| k.max_error);
    let keys: Vec<Value> = keys
        .iter()
        .map(|k| json!({ "key": k.key, "decisions": k.decisions, "denies": k.denies }))
        .collect();
    json!({
        "rule": rule,
        "window_s": crate::hot_keys::EPOCH_MS * crate::hot_keys::EPOCHS as u64 / 1000,
        "max_error": max_error,
        "keys": keys,
    })
    .to_string()
}

/// `INSPECT`'s line: `rule=… key=…`, the CHECK fields of cost 0, the parameters
/// (`param.<name>`), then what this daemon holds for the key and where it lives; for a
/// `concurrency` rule, then its slots held (all hosts, this daemon's) and `max_hold`.
fn inspect_line(key: &str, i: &Inspection) -> String {
    let d = &i.decision;
    let mut f: Vec<(String, String)> = vec![
        ("rule".into(), i.rule.name.clone()),
        ("key".into(), key.to_owned()),
        (
            "verdict".into(),
            if d.allowed { "ALLOW" } else { "DENY" }.into(),
        ),
        ("limit".into(), d.limit.to_string()),
        ("remaining".into(), d.remaining.to_string()),
        ("reset_ms".into(), d.reset_ms.to_string()),
        ("wait_ms".into(), d.wait_ms.to_string()),
        ("source".into(), d.source.as_str().into()),
        ("window_ms".into(), i.window_ms.to_string()),
    ];
    for (name, value) in parameters(&i.rule) {
        let value = match value {
            Value::String(s) => s,
            Value::Array(ids) => ids
                .iter()
                .map(Value::to_string)
                .collect::<Vec<_>>()
                .join(","),
            other => other.to_string(),
        };
        f.push((format!("param.{name}"), value));
    }
    let yes = |b: bool| if b { "yes" } else { "no" }.to_string();
    let or_none = |v: Option<String>| v.unwrap_or_else(|| "none".into());
    f.extend([
        ("lease_grants".into(), i.lease_grants.to_string()),
        ("lease_units".into(), i.lease_units.to_string()),
        ("slot".into(), or_none(i.slot.map(|s| s.to_string()))),
        ("primary".into(), or_none(i.primary.clone())),
        ("cached_deny".into(), yes(i.cached_deny)),
        ("local_bucket".into(), yes(i.local_bucket)),
    ]);
    if let Some(s) = &i.slots {
        f.extend([
            (
                "slots_held".into(),
                s.held.map_or_else(|| "unknown".into(), |n| n.to_string()),
            ),
            ("slots_held_here".into(), s.held_here.to_string()),
            ("max_hold_ms".into(), s.max_hold_ms.to_string()),
        ]);
    }
    f.push((
        "override".into(),
        i.override_text
            .as_deref()
            .map_or_else(|| "none".into(), |t| t.replace(' ', ",")),
    ));
    if i.override_text.is_some() {
        f.push((
            "override_ttl_ms".into(),
            or_none(i.override_ttl_ms.map(|ms| ms.to_string())),
        ));
    }
    if let Some(e) = &i.store_error {
        // One field: spaces would split it.
        f.push(("store_error".into(), e.replace(char::is_whitespace, "_")));
    }
    f.iter()
        .map(|(n, v)| format!("{n}={}", if v.is_empty() { "-" } else { v }))
        .collect::<Vec<_>>()
        .join(" ")
}
