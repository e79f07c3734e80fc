//! Serde helpers of the configuration: range checks that name the field, and spans
//! turned into "file:line: field: message".
//!
//! Single values are checked while deserializing (`deserialize_with = "de_…"`), so the
//! `toml` error carries the value's line and column; checks across fields use a
//! [`toml::Spanned`] position and [`super::Locator`].

use serde::{de, Deserialize, Deserializer};
use std::fmt;

use super::settings::Hosts;

/// 1-based line number of byte `offset` in `text`.
pub(super) fn line_of(text: &str, offset: usize) -> usize {
    text.as_bytes()[..offset.min(text.len())]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

pub(super) fn ranged<'de, D: Deserializer<'de>>(
    d: D,
    field: &str,
    min: u64,
    max: u64,
) -> Result<u64, D::Error> {
    let v = i64::deserialize(d)?;
    if v < 0 || (v as u64) < min || (v as u64) > max {
        return Err(de::Error::custom(format!(
            "{field} must be an integer from {min} to {max} (got {v})"
        )));
    }
    Ok(v as u64)
}

pub(super) fn de_max_line<'de, D: Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    ranged(d, "server.max_line_bytes", 512, 1 << 20).map(|v| v as usize)
}

pub(super) fn de_worker_threads<'de, D: Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    ranged(d, "server.worker_threads", 0, 256).map(|v| v as usize)
}

pub(super) fn de_in_flight<'de, D: Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    ranged(d, "server.max_in_flight", 1, 65536).map(|v| v as usize)
}

pub(super) fn de_redis_in_flight<'de, D: Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    ranged(d, "server.redis_max_in_flight", 1, 1_000_000).map(|v| v as usize)
}

pub(super) fn de_redis_in_flight_per_uid<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<usize, D::Error> {
    ranged(d, "server.redis_max_in_flight_per_uid", 1, 1_000_000).map(|v| v as usize)
}

pub(super) fn de_metrics_connections<'de, D: Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    ranged(d, "metrics.max_connections", 1, 1024).map(|v| v as usize)
}

/// `metrics.listen`: `"ip:port"`, or a port alone (integer or string) meaning
/// `127.0.0.1:<port>`: loopback unless an address says otherwise.
pub(super) fn de_listen<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<std::net::SocketAddr>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Listen {
        Port(i64),
        Text(String),
    }
    let loopback = |port: u16| std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let bad = |got: &dyn fmt::Display| {
        de::Error::custom(format!(
            "metrics.listen must be \"ip:port\" (e.g. \"127.0.0.1:9090\") or a port from 1 to 65535 for 127.0.0.1 (got {got})"
        ))
    };
    let listen = Listen::deserialize(d).map_err(|_: D::Error| bad(&"a value of another type"))?;
    match listen {
        Listen::Port(p) => u16::try_from(p)
            .ok()
            .filter(|&p| p > 0)
            .map(|p| Some(loopback(p)))
            .ok_or_else(|| bad(&p)),
        Listen::Text(t) => {
            if let Ok(p) = t.parse::<u16>() {
                return if p > 0 {
                    Ok(Some(loopback(p)))
                } else {
                    Err(bad(&t))
                };
            }
            t.parse().map(Some).map_err(|_| bad(&format!("\"{t}\"")))
        }
    }
}

pub(super) fn de_ids<'de, D: Deserializer<'de>>(d: D, field: &str) -> Result<Vec<u32>, D::Error> {
    let ids = Vec::<i64>::deserialize(d)?;
    // u32::MAX is (uid_t)-1, "no id"; never a real peer.
    match ids
        .iter()
        .find(|&&v| !(0..i64::from(u32::MAX)).contains(&v))
    {
        Some(v) => Err(de::Error::custom(format!(
            "{field} entries must be integers from 0 to {} (got {v})",
            u32::MAX - 1
        ))),
        None => Ok(ids.into_iter().map(|v| v as u32).collect()),
    }
}

pub(super) fn de_uids<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u32>, D::Error> {
    de_ids(d, "server.allow_uids")
}

pub(super) fn de_gids<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u32>, D::Error> {
    de_ids(d, "server.allow_gids")
}

pub(super) fn de_admin_uids<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u32>, D::Error> {
    de_ids(d, "server.admin_uids")
}

pub(super) fn de_admin_gids<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u32>, D::Error> {
    de_ids(d, "server.admin_gids")
}

pub(super) fn de_max_connections<'de, D: Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    ranged(d, "server.max_connections", 1, 1_000_000).map(|v| v as usize)
}

pub(super) fn de_max_connections_per_uid<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<toml::Spanned<usize>>, D::Error> {
    let v = toml::Spanned::<i64>::deserialize(d)?;
    let n = *v.get_ref();
    if !(1..=1_000_000).contains(&n) {
        return Err(de::Error::custom(format!(
            "server.max_connections_per_uid must be an integer from 1 to server.max_connections (got {n})"
        )));
    }
    Ok(Some(toml::Spanned::new(v.span(), n as usize)))
}

pub(super) fn de_idle_timeout<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    ranged(d, "server.idle_timeout_ms", 0, 86_400_000)
}

pub(super) fn de_timeout<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    ranged(d, "redis.timeout_ms", 1, 60_000)
}

pub(super) fn de_ttl<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    ranged(d, "cache.ttl_ms", 0, 3_600_000)
}

pub(super) fn de_hosts<'de, D: Deserializer<'de>>(d: D) -> Result<Hosts, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Number(i64),
        Text(String),
    }
    let invalid = |got: &dyn fmt::Display| {
        de::Error::custom(format!(
            "fallback.hosts must be \"auto\" or an integer from 1 to 10000 (got {got})"
        ))
    };
    match Raw::deserialize(d)? {
        Raw::Text(t) if t == "auto" => Ok(Hosts::Auto),
        Raw::Text(t) => Err(invalid(&format_args!("{t:?}"))),
        Raw::Number(n) if (1..=10_000).contains(&n) => Ok(Hosts::Fixed(n as u32)),
        Raw::Number(n) => Err(invalid(&n)),
    }
}

pub(super) fn de_max_keys<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    ranged(d, "fallback.max_keys", 1, 1 << 40)
}

pub(super) fn de_min_hosts<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    ranged(d, "fallback.min_hosts", 1, 10_000).map(|v| v as u32)
}

pub(super) fn de_mode<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    struct ModeVisitor;
    impl de::Visitor<'_> for ModeVisitor {
        type Value = u32;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("server.socket_mode as an octal string such as \"0660\"")
        }
        fn visit_str<E: de::Error>(self, s: &str) -> Result<u32, E> {
            match u32::from_str_radix(s, 8) {
                Ok(m) if !s.is_empty() && m <= 0o777 => Ok(m),
                _ => Err(E::custom(format!(
                    "server.socket_mode must be an octal string from \"0000\" to \"0777\" (got \"{s}\")"
                ))),
            }
        }
    }
    d.deserialize_str(ModeVisitor)
}

pub(super) fn de_prefix<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let s = String::deserialize(d)?;
    if s.is_empty()
        || s.len() > 64
        || !s
            .bytes()
            .all(|b| (0x21..=0x7e).contains(&b) && b != b'{' && b != b'}')
    {
        return Err(de::Error::custom(format!(
            "redis.prefix must be 1 to 64 printable characters without spaces or braces (got \"{s}\")"
        )));
    }
    Ok(s)
}
